-- Claim + mark + commit: one short transaction.
-- The SELECT locks up to %(batch)s of the oldest pending jobs, skipping any row
-- another worker has locked; the UPDATE marks them as ours; COMMIT makes the
-- claim durable and releases the row locks. The job itself runs afterwards,
-- outside any transaction.
WITH picked AS (
    SELECT id
      FROM job
     WHERE status = 'PENDING'
     ORDER BY created_at
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED
)
UPDATE job
   SET status = 'IN_PROGRESS',
       worker_id = %(worker_id)s,
       claimed_at = now()
  FROM picked
 WHERE job.id = picked.id
RETURNING job.id;
