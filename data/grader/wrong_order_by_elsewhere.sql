-- Wrong: the ORDER BY is in a statement that locks nothing; the claim itself takes
-- any pending row, in whatever order the plan returns them.
SELECT count(*) AS waiting, min(created_at) AS oldest FROM job
 WHERE status = 'PENDING' GROUP BY status ORDER BY 1;
WITH picked AS (SELECT id FROM job WHERE status = 'PENDING'
                 LIMIT 1 FOR UPDATE SKIP LOCKED)
UPDATE job SET status = 'IN_PROGRESS', worker_id = %(worker_id)s, claimed_at = now()
  FROM picked WHERE job.id = picked.id
RETURNING job.id;
