-- WRONG: the per-key claim as it is often written. "No job of my customer is
-- IN_PROGRESS" reads committed statuses only. While another worker's claim of
-- this customer's older job is not yet committed, that job still looks PENDING
-- here, so the NOT EXISTS finds nothing; SKIP LOCKED then skips the locked older
-- job and takes the customer's next one: two jobs of one customer in flight.
WITH picked AS (
    SELECT id
      FROM job
     WHERE status = 'PENDING'
       AND NOT EXISTS (SELECT 1
                         FROM job AS busy
                        WHERE busy.customer = job.customer
                          AND busy.status = 'IN_PROGRESS')
     ORDER BY created_at
     LIMIT 1
       FOR UPDATE SKIP LOCKED
)
UPDATE job
   SET status = 'IN_PROGRESS',
       worker_id = %(worker_id)s,
       claimed_at = now()
  FROM picked
 WHERE job.id = picked.id
RETURNING job.id;
