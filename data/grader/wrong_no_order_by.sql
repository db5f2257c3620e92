-- Wrong: no ORDER BY. Any pending rows will do, so the oldest can wait forever.
WITH picked AS (SELECT id FROM job WHERE status = 'PENDING'
                 LIMIT 1 FOR UPDATE SKIP LOCKED)
UPDATE job SET status = 'IN_PROGRESS', worker_id = %(worker_id)s, claimed_at = now()
  FROM picked WHERE job.id = picked.id
RETURNING job.id;
