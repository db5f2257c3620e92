-- Wrong: plain FOR UPDATE. Every worker wants the same oldest row and waits for
-- whoever holds it: a convoy.
WITH picked AS (SELECT id FROM job WHERE status = 'PENDING'
                 ORDER BY created_at LIMIT 1 FOR UPDATE)
UPDATE job SET status = 'IN_PROGRESS', worker_id = %(worker_id)s, claimed_at = now()
  FROM picked WHERE job.id = picked.id
RETURNING job.id;
