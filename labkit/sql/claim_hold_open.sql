-- The common mistake: lock the jobs and keep the transaction open while they run.
-- Nothing is written until the job is done, so the row lock IS the claim, and it
-- lasts as long as the job: the worker commits only after the work.
SELECT id
  FROM job
 WHERE status = 'PENDING'
 ORDER BY created_at
 LIMIT %(batch)s
   FOR UPDATE SKIP LOCKED;
