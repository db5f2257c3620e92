-- Wrong: SKIP LOCKED only inside an explicit transaction (there now() is the time
-- BEGIN ran, earlier than the statement's own start), plain FOR UPDATE when the
-- statement commits on its own, as every worker's does. The workers wait for each
-- other: a convoy.
WITH skipping AS (
    SELECT id FROM job
     WHERE status = 'PENDING' AND now() < statement_timestamp()
     ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED
), waiting AS (
    SELECT id FROM job
     WHERE status = 'PENDING' AND now() = statement_timestamp()
     ORDER BY created_at LIMIT 1 FOR UPDATE
)
UPDATE job SET status = 'IN_PROGRESS', worker_id = %(worker_id)s, claimed_at = now()
  FROM (SELECT id FROM skipping UNION ALL SELECT id FROM waiting) picked
 WHERE job.id = picked.id
RETURNING job.id;
