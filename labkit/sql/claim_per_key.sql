-- Claim the oldest pending job whose customer has nothing older still unfinished.
-- Statuses only move forward, so "an older job of mine is not DONE" stays true
-- until that job's DONE is committed: at most one job per customer is in flight,
-- and a customer's jobs start in creation order.
WITH picked AS (
    SELECT id
      FROM job
     WHERE status = 'PENDING'
       AND NOT EXISTS (SELECT 1
                         FROM job AS older
                        WHERE older.customer = job.customer
                          AND older.created_at < job.created_at
                          AND older.status <> 'DONE')
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
