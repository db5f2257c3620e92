-- What each convoy worker sends, one statement per section (labkit.convoy reads the
-- sections by name). {policy} is '', 'NOWAIT' or 'SKIP LOCKED'.

-- name: claim
-- Every worker asks for the same thing: the oldest pending job. This opens the
-- worker's transaction; the row lock lasts until that transaction ends.
SELECT id
  FROM job
 WHERE status = 'PENDING'
 ORDER BY created_at
 LIMIT 1
   FOR UPDATE {policy};

-- name: finish_holding
-- Lock held for the whole job (the anti-pattern): the job ran while the row was
-- locked; record the result, then COMMIT ends the transaction and frees the row.
UPDATE job
   SET status = 'DONE', worker_id = %(worker)s, claimed_at = now()
 WHERE id = %(id)s;

-- name: mark
-- Claim + mark + commit: mark the row as ours, then COMMIT at once. The lock is
-- gone before the job starts; status = 'IN_PROGRESS' keeps other workers off it.
UPDATE job
   SET status = 'IN_PROGRESS', worker_id = %(worker)s, claimed_at = now()
 WHERE id = %(id)s;

-- name: finish
-- After the job, outside the claim's transaction: a second short transaction.
UPDATE job
   SET status = 'DONE'
 WHERE id = %(id)s AND worker_id = %(worker)s;

-- name: refill
-- A fresh queue for each measured point: %(n)s pending jobs, oldest first by id.
TRUNCATE job;
INSERT INTO job (id, created_at, payload)
SELECT g, timestamptz '2026-01-01 09:00:00+00' + (g - 1) * interval '1 second', 'job ' || g
  FROM generate_series(1, %(n)s) AS g;
ANALYZE job;
