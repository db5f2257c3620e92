-- Wrong: NOWAIT. A worker that finds the oldest row locked gets ERROR 55P03.
WITH picked AS (SELECT id FROM job WHERE status = 'PENDING'
                 ORDER BY created_at LIMIT 1 FOR UPDATE NOWAIT)
UPDATE job SET status = 'IN_PROGRESS', worker_id = %(worker_id)s, claimed_at = now()
  FROM picked WHERE job.id = picked.id
RETURNING job.id;
