-- Claim the oldest pending job whose customer has nothing older still unfinished.
-- "Unfinished" is status <> 'DONE', not status = 'IN_PROGRESS': another worker's
-- claim is invisible here until it commits, but the job it is claiming stays
-- visible as PENDING until then, so "an older job of mine is not DONE" holds
-- whatever the other claim has got to. It stays true until that job's DONE is
-- committed (the reaper moves a job back to PENDING or on to DEAD, never to DONE):
-- at most one job per customer is in flight, and a customer's jobs start in
-- creation order. A DEAD job is not DONE either: it holds its customer's later
-- jobs until someone re-queues it or removes it.
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
