-- When the server goes away (labkit.labs.failover): a restart, and a failover to a standby.
-- Every query runs on the lab's own throw-away servers (labkit.core.replica), never on the
-- workbook's shared one.

-- name: scene
-- Jobs with a lease and a fence (version: bumped by every claim; epoch: the timeline the
-- claim was made on), the outbox the completions write into, and a record of every run.
CREATE TABLE job (
    id          int PRIMARY KEY,
    status      text NOT NULL DEFAULT 'PENDING',
    worker      text,
    lease_until timestamptz,
    version     int NOT NULL DEFAULT 0,
    epoch       int NOT NULL DEFAULT 0
);
CREATE TABLE outbox (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event     text NOT NULL,
    published boolean NOT NULL DEFAULT false
);
CREATE TABLE job_run (
    job_id int NOT NULL,
    worker text NOT NULL,
    claim  text NOT NULL
);

-- name: enqueue
-- Jobs 1..n, all pending.
INSERT INTO job (id) SELECT g FROM generate_series(1, %(n)s) AS g;

-- name: advisory_claim
-- The advisory claim (the way some queues hold a job): the job's row is left as it is, and a
-- session-level advisory lock on its id says "taken" for as long as this session lives.
SELECT pg_try_advisory_lock(%(id)s) AS got;

-- name: advisory_candidates
-- The advisory claimer's candidates: pending jobs that nobody has recorded a run of yet.
SELECT id FROM job WHERE status = 'PENDING' ORDER BY id;

-- name: lease_claim
-- The row claim with a lease: the claim is a committed row, so it outlives any session.  A
-- job is claimable while pending, or once its lease has run out.  The fence's token: version
-- (one more at every claim) and epoch (the timeline the claim was made on, read from the name
-- of the WAL file being written: a promotion starts a new timeline).
UPDATE job
   SET status = 'RUNNING', worker = %(worker)s, lease_until = now() + %(lease)s::interval,
       version = version + 1,
       epoch = ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int
 WHERE id = (SELECT id FROM job
              WHERE id = ANY(%(ids)s)
                AND (status = 'PENDING' OR (status = 'RUNNING' AND lease_until < now()))
              ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id, version, epoch;

-- name: record_run
-- The worker ran the job: one row per run, whoever ran it and how it had claimed it.
INSERT INTO job_run (job_id, worker, claim) VALUES (%(id)s, %(worker)s, %(claim)s);

-- name: complete
-- The completion and its event, in one transaction (the outbox pattern).  Fenced: only the
-- holder of the job's current version may complete it.
WITH done AS (
    UPDATE job SET status = 'DONE', lease_until = NULL
     WHERE id = %(id)s AND version = %(version)s
    RETURNING id
)
INSERT INTO outbox (event) SELECT 'job ' || id || ' done' FROM done RETURNING id;

-- name: fenced_write
-- A worker's write that carries its fencing token: the job's version it claimed.
UPDATE job SET status = 'DONE', worker = %(worker)s
 WHERE id = %(id)s AND version = %(version)s;

-- name: fenced_write_epoch
-- The same write fenced by (epoch, version): a token from an older timeline never matches.
UPDATE job SET status = 'DONE', worker = %(worker)s
 WHERE id = %(id)s AND (epoch, version) = (%(epoch)s, %(version)s);

-- name: relay_claim
-- The relay: claim a batch of unpublished events (published, then marked, in one transaction).
SELECT id, event FROM outbox WHERE NOT published ORDER BY id
 LIMIT %(batch)s FOR UPDATE SKIP LOCKED;

-- name: relay_mark
-- ...and mark them published once the broker has confirmed each.
UPDATE outbox SET published = true WHERE id = ANY(%(ids)s);

-- name: job_state
-- One job as the server holds it.
SELECT status, worker, version, epoch FROM job WHERE id = %(id)s;

-- name: runs_per_job
-- How many times each job was run, and by which kind of claim.
SELECT job_id, claim, count(*) AS runs FROM job_run GROUP BY job_id, claim ORDER BY job_id;

-- name: commit_probe_scene
-- One small table the commit-cost probe inserts into, a row per commit.
CREATE TABLE commit_probe (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, at timestamptz DEFAULT now());

-- name: commit_probe
-- One commit: a row inserted (autocommit: the statement is its own transaction).
INSERT INTO commit_probe DEFAULT VALUES;

-- name: restart_claim_starter
-- The claim as it stands: the first pending job, held by a session-level advisory lock.
SELECT id FROM job
 WHERE id = (SELECT min(id) FROM job WHERE status = 'PENDING')
   AND pg_try_advisory_lock(id);

-- name: restart_claim_answer
-- A claim the server keeps across a restart: a committed row with a lease, claimable again
-- only once the lease has run out.
UPDATE job
   SET status = 'RUNNING', worker = %(worker)s, lease_until = now() + interval '30 seconds'
 WHERE id = (SELECT id FROM job
              WHERE status = 'PENDING' OR (status = 'RUNNING' AND lease_until < now())
              ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id;

-- name: lease_runs_out
-- Scripted: the claimed job's lease has run out (the checker does not wait 30 seconds).
UPDATE job SET lease_until = now() - interval '1 second' WHERE id = %(id)s;

-- name: fence_starter
-- The fenced completion as notebook 08 wrote it: the token is the job's version.
UPDATE job SET status = 'DONE'
 WHERE id = %(id)s AND version = %(version)s;

-- name: advisory_locks_held
-- Advisory locks granted on the server, to any session but this one.
SELECT count(*) FROM pg_locks
 WHERE locktype = 'advisory' AND granted AND pid <> pg_backend_pid();

-- name: sessions_named
-- The sessions of one application_name.
SELECT count(*) FROM pg_stat_activity WHERE application_name = %(name)s;

-- name: runs_by_worker
-- Who ran each job.
SELECT job_id, string_agg(worker, ',' ORDER BY worker) AS workers
  FROM job_run GROUP BY job_id ORDER BY job_id;

-- name: unmarked
-- Of these events, how many are not marked published.
SELECT count(*) FROM outbox WHERE id = ANY(%(ids)s) AND NOT published;

-- name: sync_waiters
-- Sessions whose commit waits for the synchronous standby.
SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep';

-- name: stream_scene
-- The unarranged run's table: one row per commit, numbered by the writer.
CREATE TABLE stream (n int PRIMARY KEY);

-- name: stream_commit
-- One commit of the writer (autocommit: the statement is its own transaction).
INSERT INTO stream (n) VALUES (%(n)s);

-- name: stream_kept
-- The commits the promoted standby has.
SELECT n FROM stream ORDER BY n;

-- name: run_recorded
-- Whether the worker's run of a job is on record.
SELECT count(*) FROM job_run WHERE job_id = %(id)s AND worker = %(worker)s;

-- name: done_jobs
-- The jobs the server holds as done.
SELECT id FROM job WHERE status = 'DONE' ORDER BY id;
