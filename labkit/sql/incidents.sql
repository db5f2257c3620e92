-- The incident file (labkit.labs.incidents): ten outages that users of PostgreSQL job
-- queues reported, each rebuilt small. Every incident has its scene (`<incident>_scene`),
-- the SQL that broke (`<incident>_broken...`) and the SQL that fixed it (`<incident>_fixed...`);
-- the lab plays them in named sessions and reads the outcome back from the server.

-- name: unique_enqueue_scene
-- A job table whose jobs may carry a key: "one report per customer at a time".
CREATE TABLE job (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    unique_key text,
    status     text NOT NULL DEFAULT 'PENDING'
);

-- name: unique_enqueue_check
-- The check before the insert: is a live job with this key there already?
SELECT count(*) AS live FROM job
 WHERE unique_key = 'report:42' AND status IN ('PENDING', 'RUNNING');

-- name: unique_enqueue_insert
-- ...and, when the check said 0, the insert.
INSERT INTO job (unique_key) VALUES ('report:42');

-- name: unique_enqueue_index
-- The fix, part one: the server keeps the rule, one live job per key.
CREATE UNIQUE INDEX job_live_key ON job (unique_key)
 WHERE status IN ('PENDING', 'RUNNING');

-- name: unique_enqueue_upsert
-- The fix, part two: insert, and let a live duplicate be a no-op.
INSERT INTO job (unique_key) VALUES ('report:42')
ON CONFLICT (unique_key) WHERE status IN ('PENDING', 'RUNNING') DO NOTHING;

-- name: unique_enqueue_existing
-- (Notebook 18's Exercise 1, its later scenes) A job with the key already there, in the
-- state given: RUNNING (the report is being built) or DONE (it was built).
INSERT INTO job (unique_key, status) VALUES ('report:42', %(status)s);

-- name: unique_enqueue_live
-- The live jobs with the key, and whether the one that was RUNNING still is.
SELECT count(*) FILTER (WHERE status IN ('PENDING', 'RUNNING')) AS live,
       count(*) FILTER (WHERE status = 'RUNNING') AS running
  FROM job WHERE unique_key = 'report:42';

-- name: frozen_now_scene
-- Jobs with the moment they are due.
CREATE TABLE job (
    id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_at timestamptz NOT NULL,
    status text NOT NULL DEFAULT 'PENDING'
);

-- name: frozen_now_enqueue
-- A job due at once: due the moment it is inserted.
INSERT INTO job (run_at) VALUES (clock_timestamp());

-- name: frozen_now_poll_broken
-- The poller's question, inside its long transaction: what is due now()?
SELECT count(*) AS due FROM job WHERE status = 'PENDING' AND run_at <= now();

-- name: frozen_now_poll_fixed
-- The same question against the start of this statement, not of the transaction.
SELECT count(*) AS due FROM job WHERE status = 'PENDING' AND run_at <= statement_timestamp();

-- name: key_share_scene
-- Jobs, and log lines that point at their job by a foreign key.
CREATE TABLE job (
    id     bigint PRIMARY KEY,
    status text NOT NULL DEFAULT 'PENDING'
);
CREATE TABLE job_log (
    id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id bigint NOT NULL REFERENCES job (id),
    line   text NOT NULL
);
INSERT INTO job (id) VALUES (1);

-- name: key_share_log
-- A log line for job 1: the foreign key's check locks job 1 FOR KEY SHARE.
INSERT INTO job_log (job_id, line) VALUES (1, 'queued by the web app');

-- name: key_share_claim_broken
-- The claim, locking the job row FOR UPDATE.
SELECT id FROM job WHERE id = 1 AND status = 'PENDING' FOR UPDATE NOWAIT;

-- name: key_share_claim_fixed
-- The claim, locking the job row FOR NO KEY UPDATE: its key is not changed.
SELECT id FROM job WHERE id = 1 AND status = 'PENDING' FOR NO KEY UPDATE NOWAIT;

-- name: repeatable_read_scene
-- Three pending jobs.
CREATE TABLE job (
    id     bigint PRIMARY KEY,
    status text NOT NULL DEFAULT 'PENDING'
);
INSERT INTO job (id) SELECT g FROM generate_series(1, 3) g;

-- name: repeatable_read_claim
-- The claim: the oldest pending job no one holds, marked RUNNING.
UPDATE job SET status = 'RUNNING'
 WHERE id = (SELECT id FROM job WHERE status = 'PENDING'
              ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id;

-- name: try_lock_scene
-- Five pending jobs, and no index on run_at: the claim sorts them.
CREATE TABLE job (
    id     bigint PRIMARY KEY,
    run_at timestamptz NOT NULL,
    status text NOT NULL DEFAULT 'PENDING'
);
INSERT INTO job (id, run_at)
SELECT g, '2026-01-01 09:00+00'::timestamptz + g * interval '1 second'
  FROM generate_series(1, 5) g;
ANALYZE job;

-- name: try_lock_claim_broken
-- The claim by session advisory lock, in the WHERE clause.
SELECT id FROM job
 WHERE status = 'PENDING' AND pg_try_advisory_lock(id)
 ORDER BY run_at LIMIT 1;

-- name: try_lock_claim_fixed
-- The claim by row lock: SKIP LOCKED locks only the row it returns.
SELECT id FROM job
 WHERE status = 'PENDING'
 ORDER BY run_at LIMIT 1 FOR UPDATE SKIP LOCKED;

-- name: try_lock_held
-- The advisory locks this session holds.
SELECT count(*) AS advisory_locks FROM pg_locks
 WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted;

-- name: history_scene
-- A job table that keeps its finished jobs.
CREATE TABLE job (
    id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    status text NOT NULL,
    body   text NOT NULL
);

-- name: history_add
-- Finished jobs (history) and a few pending ones.
INSERT INTO job (status, body)
SELECT CASE WHEN g <= %(pending)s THEN 'PENDING' ELSE 'DONE' END, repeat('x', 60)
  FROM generate_series(1, %(pending)s + %(done)s) g;

-- name: history_monitor
-- The dashboard's question, asked every few seconds.
SELECT count(*) FROM job WHERE status = 'PENDING';

-- name: history_index
-- The fix: a partial index over the pending jobs only.
CREATE INDEX job_pending ON job (id) WHERE status = 'PENDING';

-- name: hot_row_scene
-- Jobs, the one row of queue statistics every worker writes,
-- and (the fix) one row per worker.
CREATE TABLE job (
    id     bigint PRIMARY KEY,
    status text NOT NULL DEFAULT 'PENDING'
);
INSERT INTO job (id) SELECT g FROM generate_series(1, 4) g;
CREATE TABLE queue_stats (
    queue      text PRIMARY KEY,
    running    int NOT NULL DEFAULT 0,
    last_seen  timestamptz
);
INSERT INTO queue_stats (queue) VALUES ('default');
CREATE TABLE worker_seen (
    worker    text PRIMARY KEY,
    running   int NOT NULL DEFAULT 0,
    last_seen timestamptz
);
INSERT INTO worker_seen (worker) VALUES ('A'), ('B');

-- name: hot_row_claim
-- A worker's claim (its transaction stays open while the job runs).
UPDATE job SET status = 'RUNNING'
 WHERE id = (SELECT id FROM job WHERE status = 'PENDING'
              ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id;

-- name: hot_row_bookkeeping_broken
-- The bookkeeping in the same transaction: the queue's one row.
UPDATE queue_stats SET running = running + 1, last_seen = now()
 WHERE queue = 'default';

-- name: hot_row_bookkeeping_fixed
-- The bookkeeping in the same transaction: the worker's own row.
UPDATE worker_seen SET running = running + 1, last_seen = now()
 WHERE worker = %(worker)s;

-- name: enqueue_scene
-- Orders, and jobs that ship an order.
CREATE TABLE shop_order (
    id    bigint PRIMARY KEY,
    total numeric NOT NULL
);
CREATE TABLE job (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id bigint NOT NULL,
    status   text NOT NULL DEFAULT 'PENDING'
);

-- name: enqueue_order
-- The web app's transaction writes the order...
INSERT INTO shop_order (id, total) VALUES (7, 42.00);

-- name: enqueue_job
-- ...and enqueues the job that ships it.
INSERT INTO job (order_id) VALUES (7);

-- name: enqueue_work
-- The worker claims a job and reads the order it ships.
WITH claimed AS (
    UPDATE job SET status = 'RUNNING'
     WHERE id = (SELECT id FROM job WHERE status = 'PENDING'
                  ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
    RETURNING id, order_id)
SELECT format('job %s, order %s: %s', c.id, c.order_id,
              coalesce('total ' || o.total, 'no such order')) AS claimed
  FROM claimed c LEFT JOIN shop_order o ON o.id = c.order_id;

-- name: enqueue_left
-- What the queue holds afterwards.
SELECT format('job %s, order %s: %s', id, order_id, status) AS left FROM job ORDER BY id;

-- name: batch_scene
-- A batch of two jobs, the log of its "all done" callback,
-- and (the fix) a counter of the jobs the batch still waits for.
CREATE TABLE job (
    id       bigint PRIMARY KEY,
    batch_id bigint NOT NULL,
    status   text NOT NULL DEFAULT 'RUNNING'
);
INSERT INTO job (id, batch_id) VALUES (1, 1), (2, 1);
CREATE TABLE batch (
    id        bigint PRIMARY KEY,
    remaining int NOT NULL
);
INSERT INTO batch (id, remaining) VALUES (1, 2);
CREATE TABLE callback_log (
    batch_id bigint NOT NULL,
    fired_by text NOT NULL
);

-- name: batch_scene_three
-- (Notebook 18's Exercise 2, its second scene) A batch of three jobs, finished
-- one after another.
CREATE TABLE job (
    id       bigint PRIMARY KEY,
    batch_id bigint NOT NULL,
    status   text NOT NULL DEFAULT 'RUNNING'
);
INSERT INTO job (id, batch_id) VALUES (1, 1), (2, 1), (3, 1);
CREATE TABLE batch (
    id        bigint PRIMARY KEY,
    remaining int NOT NULL
);
INSERT INTO batch (id, remaining) VALUES (1, 3);
CREATE TABLE callback_log (
    batch_id bigint NOT NULL,
    fired_by text NOT NULL
);

-- name: batch_finish
-- A worker finishes its job.
UPDATE job SET status = 'DONE' WHERE id = %(job)s;

-- name: batch_check_broken
-- After its commit, the worker asks: is the batch all done? If so, fire.
INSERT INTO callback_log (batch_id, fired_by)
SELECT 1, %(worker)s
 WHERE NOT EXISTS (SELECT 1 FROM job WHERE batch_id = 1 AND status <> 'DONE');

-- name: batch_count_fixed
-- In the job's own transaction: one job fewer to wait for (the row lock
-- makes the two workers take turns), and fire when it reaches 0.
WITH left_over AS (
    UPDATE batch SET remaining = remaining - 1 WHERE id = 1 RETURNING remaining)
INSERT INTO callback_log (batch_id, fired_by)
SELECT 1, %(worker)s FROM left_over WHERE remaining = 0;

-- name: reaper_scene
-- Workers and their heartbeats, and jobs that say which worker runs them
-- and (the fix) until when their claim holds.
CREATE TABLE worker (
    worker_id      text PRIMARY KEY,
    last_heartbeat timestamptz NOT NULL
);
CREATE TABLE job (
    id          bigint PRIMARY KEY,
    status      text NOT NULL DEFAULT 'PENDING',
    worker_id   text,
    lease_until timestamptz
);
INSERT INTO job (id) VALUES (1);

-- name: reaper_claim
-- The pod "pod-a" claims job 1 for 30 seconds and heartbeats.
UPDATE job SET status = 'RUNNING', worker_id = 'pod-a',
               lease_until = %(at)s::timestamptz + interval '30 seconds'
 WHERE id = 1;
INSERT INTO worker (worker_id, last_heartbeat) VALUES ('pod-a', %(at)s)
ON CONFLICT (worker_id) DO UPDATE SET last_heartbeat = EXCLUDED.last_heartbeat;

-- name: reaper_heartbeat
-- The restarted pod, under the same name, heartbeats (it knows of no job).
INSERT INTO worker (worker_id, last_heartbeat) VALUES ('pod-a', %(at)s)
ON CONFLICT (worker_id) DO UPDATE SET last_heartbeat = EXCLUDED.last_heartbeat;

-- name: reaper_broken
-- The reaper: jobs of workers that stopped heartbeating go back to PENDING.
UPDATE job SET status = 'PENDING', worker_id = NULL
 WHERE status = 'RUNNING'
   AND worker_id IN (SELECT worker_id FROM worker
                      WHERE last_heartbeat < %(at)s::timestamptz - interval '30 seconds')
RETURNING id;

-- name: reaper_fixed
-- The reaper: jobs whose claim ran out go back to PENDING, whoever held them.
UPDATE job SET status = 'PENDING', worker_id = NULL, lease_until = NULL
 WHERE status = 'RUNNING' AND lease_until < %(at)s
RETURNING id;
