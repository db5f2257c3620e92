-- Correct: claim + mark + commit in one statement.
-- The CTE locks up to 10 of the oldest pending jobs, skipping rows other workers
-- hold; the UPDATE marks them ours with who and when; autocommit ends the
-- transaction at once, so the jobs run with no lock held.
WITH picked AS (
    SELECT id
      FROM job
     WHERE status = 'PENDING'
     ORDER BY created_at
     LIMIT 10
       FOR UPDATE SKIP LOCKED
)
UPDATE job
   SET status = 'IN_PROGRESS',
       worker_id = %(worker_id)s,
       claimed_at = now()
  FROM picked
 WHERE job.id = picked.id
RETURNING job.id;
