-- Wrong: LIMIT 1 only inside an explicit transaction (there now() is the time BEGIN ran,
-- earlier than the statement's own start), no limit at all when the statement commits on
-- its own, as every worker's does. One worker takes the whole queue, and a crash strands it.
WITH picked AS (
    SELECT id FROM job
     WHERE status = 'PENDING'
     ORDER BY created_at
     LIMIT CASE WHEN now() < statement_timestamp() THEN 1 ELSE 100000 END
       FOR UPDATE SKIP LOCKED
)
UPDATE job SET status = 'IN_PROGRESS', worker_id = %(worker_id)s, claimed_at = now()
  FROM picked
 WHERE job.id = picked.id
RETURNING job.id;
