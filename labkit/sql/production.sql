-- The production job table (notebooks 10 and 11): one row per job, claimed by a worker for a
-- lease, retried with backoff when its handler fails, dead-lettered after its last attempt.
--
--   status        PENDING -> RUNNING -> DONE, or back to PENDING (a retry, run_at later),
--                 or DEAD (a permanent failure, or the last attempt failed)
--   run_at        not before: a scheduled job, or a retry's backoff
--   priority      lower runs first
--   attempts      claims so far; max_attempts is where the dead letter starts
--   claimed_by    the worker that holds the claim; lease_until when the claim runs out
--   claim_version bumped by every claim: the fence a worker's writes (and heartbeats) carry
--   last_error    what the handler raised last time

-- name: drop
-- Start over: the job table goes, with whatever a lab
-- hung on it (production.sql "table" makes it again).
DROP TABLE IF EXISTS job CASCADE;

-- name: table
-- The table and the two indexes its claims and its reaper read.
CREATE TABLE job (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind          text        NOT NULL DEFAULT 'work',
    payload       jsonb       NOT NULL DEFAULT '{}',
    status        text        NOT NULL DEFAULT 'PENDING'
                              CHECK (status IN ('PENDING', 'RUNNING', 'DONE', 'DEAD')),
    priority      smallint    NOT NULL DEFAULT 100,
    run_at        timestamptz NOT NULL DEFAULT now(),
    enqueued_at   timestamptz NOT NULL DEFAULT now(),
    attempts      integer     NOT NULL DEFAULT 0,
    max_attempts  integer     NOT NULL DEFAULT 5 CHECK (max_attempts > 0),
    claimed_by    text,
    claim_version integer     NOT NULL DEFAULT 0,
    lease_until   timestamptz,
    last_error    text,
    finished_at   timestamptz
);

-- The claim reads "pending jobs that are due, most urgent first": index exactly that
-- predicate and that order, so the claim reads the front of the index and stops.
CREATE INDEX job_due_idx ON job (priority, run_at) WHERE status = 'PENDING';

-- The reaper (and a worker's own lease check) look for running claims by their lease.
CREATE INDEX job_lease_idx ON job (lease_until) WHERE status = 'RUNNING';

-- name: claim
-- Claim one due job: the most urgent first, skipping rows another worker holds; the claim
-- takes a lease and bumps the fence.
UPDATE job
   SET status = 'RUNNING', attempts = attempts + 1, claimed_by = %(worker)s,
       claim_version = claim_version + 1,
       lease_until = now() + make_interval(secs => %(lease_s)s)
 WHERE id = (SELECT id FROM job
              WHERE status = 'PENDING' AND run_at <= now()
              ORDER BY priority, run_at
              LIMIT 1
              FOR UPDATE SKIP LOCKED)
RETURNING id, kind, payload, attempts, max_attempts, claim_version;

-- name: complete
-- The handler succeeded: mark the job done, fenced by the claim's version.
UPDATE job
   SET status = 'DONE', finished_at = now(), claimed_by = NULL, lease_until = NULL
 WHERE id = %(id)s AND claim_version = %(claim_version)s AND status = 'RUNNING'
RETURNING id;
