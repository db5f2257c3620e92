-- Wrong on a long history: "not yet claimed" written as worker_id IS NULL.
-- Same rows today, but no index serves that predicate, so every claim reads
-- every finished job too.
WITH picked AS (SELECT id FROM job WHERE worker_id IS NULL
                 ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED)
UPDATE job SET status = 'IN_PROGRESS', worker_id = %(worker_id)s, claimed_at = now()
  FROM picked WHERE job.id = picked.id
RETURNING job.id;
