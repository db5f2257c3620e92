-- A handler that fails (labkit.labs.retries): the production job table (production.sql), the
-- lab's clock (clock.sql), and the one write a failed attempt makes. The claim here is
-- production.sql's claim with lab_now() in place of now(), and nothing else changed; the
-- success write is production.sql's complete, unchanged.

-- name: drop
-- Start over: drop the handler's own table (production.sql "drop" takes the job table).
DROP TABLE IF EXISTS job_effect CASCADE;

-- name: effects
-- What a handler writes when it succeeds, in the same transaction as the complete.
CREATE TABLE job_effect (
    job_id   bigint  PRIMARY KEY,
    attempt  integer NOT NULL
);

-- name: enqueue
-- One job, due now on the lab's clock.
INSERT INTO job (kind, max_attempts, run_at, enqueued_at)
VALUES (%(kind)s, %(max_attempts)s, lab_now(), lab_now())
RETURNING id;

-- name: claim
-- production.sql's claim with lab_now() in place of now(), and nothing else changed.
UPDATE job
   SET status = 'RUNNING', attempts = attempts + 1, claimed_by = %(worker)s,
       claim_version = claim_version + 1,
       lease_until = lab_now() + make_interval(secs => %(lease_s)s)
 WHERE id = (SELECT id FROM job
              WHERE status = 'PENDING' AND run_at <= lab_now()
              ORDER BY priority, run_at
              LIMIT 1
              FOR UPDATE SKIP LOCKED)
RETURNING id, kind, payload, attempts, max_attempts, claim_version;

-- name: effect
-- The handler's own write (it commits only if the complete, in the same transaction, matches).
INSERT INTO job_effect (job_id, attempt) VALUES (%(id)s, %(attempt)s);

-- name: fail
-- The handler raised: keep its error, fenced; transient
-- with attempts left: PENDING after delay_s, else DEAD.
UPDATE job
   SET status      = CASE WHEN %(transient)s::boolean AND attempts < max_attempts
                          THEN 'PENDING' ELSE 'DEAD' END,             -- the row decides
       run_at      = CASE WHEN %(transient)s::boolean AND attempts < max_attempts
                          THEN lab_now() + make_interval(secs => %(delay_s)s)
                          ELSE run_at END,                            -- the worker's backoff
       finished_at = CASE WHEN %(transient)s::boolean AND attempts < max_attempts
                          THEN NULL ELSE lab_now() END,
       last_error  = %(error)s::text,
       claimed_by  = NULL, lease_until = NULL
 WHERE id = %(id)s AND claim_version = %(claim_version)s  -- 0 rows: a stale claim
   AND status = 'RUNNING'
RETURNING id, status, attempts, max_attempts,
          extract(epoch FROM run_at - lab_now())::float8 AS wait_s;

-- name: advance_to_next_due
-- Nothing is due: move the lab's clock on to the earliest
-- pending run_at (no row if nothing is pending).
UPDATE lab_clock
   SET shift = shift + greatest((SELECT min(run_at) FROM job WHERE status = 'PENDING')
                                - lab_now(),
                                interval '0 s')
 WHERE EXISTS (SELECT 1 FROM job WHERE status = 'PENDING')
RETURNING extract(epoch FROM shift)::float8 AS elapsed_s;

-- name: jobs
-- The job table as the story ends: status, attempts,
-- the error kept, and what each handler left behind.
SELECT j.id, j.kind, j.status, j.attempts, j.max_attempts, j.claim_version, j.last_error,
       (SELECT count(*) FROM job_effect e WHERE e.job_id = j.id) AS effects
  FROM job j
 ORDER BY j.id;

-- name: row
-- One job: status, attempts, claim_version and how
-- far its run_at is from the lab's now (seconds).
SELECT status, attempts, claim_version,
       extract(epoch FROM run_at - lab_now())::float8 AS due_in_s, last_error
  FROM job
 WHERE id = %(id)s;
