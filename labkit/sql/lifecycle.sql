-- A worker's life on the production job table (production.sql; labkit.labs.lifecycle): the
-- runs log, the reaper that makes an expired lease claimable again, the heartbeat that keeps a
-- live claim's lease from running out, and the release a stopping worker hands its claims
-- back with. Every write a worker makes about its own claim is fenced by claim_version.
--
-- Re-claiming an expired lease is a reaper, not a claim variant: production.sql's claim stays
-- as it is (it reads only PENDING rows, through job_due_idx) and the reaper reads RUNNING
-- rows by their lease (job_lease_idx). Each worker runs the reaper before it claims.

-- name: runs
-- One row per handler start: which job, which worker, under which claim. Counts the runs.
CREATE TABLE job_run (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id        bigint      NOT NULL REFERENCES job (id),
    worker        text        NOT NULL,
    claim_version integer     NOT NULL,
    started_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- name: drop
-- Start over: the runs log (production.sql "drop" then takes the job table).
DROP TABLE IF EXISTS job_run CASCADE;

-- name: enqueue
-- n jobs, due one second apart in the past, so the claim takes them in id order.
INSERT INTO job (kind, payload, run_at)
SELECT 'work', jsonb_build_object('n', i), now() - make_interval(secs => %(n)s - i)
  FROM generate_series(1, %(n)s) AS i
RETURNING id;

-- name: reap
-- Expired leases back to PENDING (the next claim takes
-- them and bumps claim_version); DEAD if out of attempts.
UPDATE job
   SET status      = CASE WHEN attempts >= max_attempts THEN 'DEAD' ELSE 'PENDING' END,
       finished_at = CASE WHEN attempts >= max_attempts THEN now() END,
       last_error  = 'lease expired while ' || claimed_by || ' held it',
       claimed_by  = NULL,
       lease_until = NULL
 WHERE id IN (SELECT id FROM job
               WHERE status = 'RUNNING' AND lease_until < now()
               ORDER BY lease_until
               LIMIT 100
               FOR UPDATE SKIP LOCKED)
RETURNING id, claim_version, status;

-- name: start
-- Log a handler start, only while the claim is still this worker's (fenced): no row, no run.
INSERT INTO job_run (job_id, worker, claim_version)
SELECT id, %(worker)s, claim_version
  FROM job
 WHERE id = %(id)s AND claim_version = %(claim_version)s AND status = 'RUNNING'
RETURNING id;

-- name: heartbeat
-- Extend a live claim's lease, fenced: a zombie's
-- heartbeat (an older claim_version) matches 0 rows.
UPDATE job
   SET lease_until = now() + make_interval(secs => %(lease_s)s)
 WHERE id = %(id)s AND claim_version = %(claim_version)s AND status = 'RUNNING'
RETURNING lease_until;

-- name: release
-- Hand claims back (fenced, each with its own claim_version):
-- PENDING at once; an unstarted claim gets its attempt back.
UPDATE job AS j
   SET status      = CASE WHEN %(started)s AND j.attempts >= j.max_attempts
                          THEN 'DEAD' ELSE 'PENDING' END,
       finished_at = CASE WHEN %(started)s AND j.attempts >= j.max_attempts THEN now() END,
       attempts    = j.attempts - CASE WHEN %(started)s THEN 0 ELSE 1 END,
       last_error  = CASE WHEN %(started)s THEN 'stopped at shutdown: ' || j.claimed_by
                          || ' handed it back mid-run' ELSE j.last_error END,
       claimed_by  = NULL,
       lease_until = NULL
  FROM unnest(%(ids)s::bigint[], %(claim_versions)s::integer[]) AS r (id, claim_version)
 WHERE j.id = r.id AND j.claim_version = r.claim_version AND j.status = 'RUNNING'
RETURNING j.id;

-- name: held
-- Claims still RUNNING for a worker, and how long their
-- leases have left (what a crash leaves waiting).
SELECT count(*)::int AS waiting,
       coalesce(extract(epoch FROM max(lease_until) - now()), 0)::float8 AS lease_left_s
  FROM job
 WHERE status = 'RUNNING' AND claimed_by = %(worker)s AND lease_until > now();

-- name: statuses
-- How many jobs are in each status, and how many handler runs the log counts.
SELECT count(*) FILTER (WHERE status = 'PENDING')::int AS pending,
       count(*) FILTER (WHERE status = 'RUNNING')::int AS running,
       count(*) FILTER (WHERE status = 'DONE')::int    AS done,
       count(*) FILTER (WHERE status = 'DEAD')::int    AS dead,
       (SELECT count(*) FROM job_run)::int             AS runs,
       coalesce(max(attempts), 0)::int                 AS max_attempts_used
  FROM job;
