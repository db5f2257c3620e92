-- Correct, as a short script: an explicit transaction around one UPDATE whose
-- subquery locks the oldest pending job with SKIP LOCKED; COMMIT before any work.
BEGIN;
UPDATE job
   SET status = 'IN_PROGRESS', worker_id = %(worker_id)s, claimed_at = now()
 WHERE id = (SELECT id
               FROM job
              WHERE status = 'PENDING'
              ORDER BY created_at
              LIMIT 1
                FOR UPDATE SKIP LOCKED)
RETURNING id;
COMMIT;
