-- The reaper: a claim older than the lease belongs to a worker that died (or hung).
-- Give the job back to the queue and count the attempt; a job that has used up
-- %(max_attempts)s attempts goes to DEAD instead of crashing another worker.
-- %(as_of)s is "now" (NULL means the server's clock), so a lab can move time on.
WITH expired AS (
    SELECT id
      FROM job
     WHERE status = 'IN_PROGRESS'
       AND claimed_at < coalesce(%(as_of)s::timestamptz, now()) - %(lease)s::interval
     ORDER BY claimed_at
       FOR UPDATE SKIP LOCKED
)
UPDATE job
   SET attempts   = job.attempts + 1,
       status     = CASE WHEN job.attempts + 1 >= %(max_attempts)s
                         THEN 'DEAD' ELSE 'PENDING' END,
       worker_id  = NULL,
       claimed_at = NULL
  FROM expired
 WHERE job.id = expired.id
RETURNING job.id, job.status, job.attempts;
