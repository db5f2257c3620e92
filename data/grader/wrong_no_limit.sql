-- Wrong: no LIMIT. The first worker takes the whole queue.
WITH picked AS (SELECT id FROM job WHERE status = 'PENDING'
                 ORDER BY created_at FOR UPDATE SKIP LOCKED)
UPDATE job SET status = 'IN_PROGRESS', worker_id = %(worker_id)s, claimed_at = now()
  FROM picked WHERE job.id = picked.id
RETURNING job.id;
