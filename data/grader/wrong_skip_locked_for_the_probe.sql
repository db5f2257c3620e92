-- Wrong: SKIP LOCKED only when the session looks like a trial run (a worker id or a
-- session name other than a real worker's), plain FOR UPDATE otherwise. The workers
-- of the run still wait for each other: a convoy.
WITH skipping AS (
    SELECT id FROM job
     WHERE status = 'PENDING'
       AND (%(worker_id)s LIKE 'probe%%'
            OR current_setting('application_name') ~ ':(A|B|explain|monitor)$')
     ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED
), waiting AS (
    SELECT id FROM job
     WHERE status = 'PENDING'
       AND NOT (%(worker_id)s LIKE 'probe%%'
                OR current_setting('application_name') ~ ':(A|B|explain|monitor)$')
     ORDER BY created_at LIMIT 1 FOR UPDATE
)
UPDATE job SET status = 'IN_PROGRESS', worker_id = %(worker_id)s, claimed_at = now()
  FROM (SELECT id FROM skipping UNION ALL SELECT id FROM waiting) picked
 WHERE job.id = picked.id
RETURNING job.id;
