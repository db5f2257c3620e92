-- A half-open connection: the network between a worker and the server goes silent, and
-- what bounds the worker's wait and the server's row lock (labkit.labs.halfopen reads the
-- sections by name). The lab runs on a throw-away server of its own; its workers reach it
-- over TCP inside a private network namespace, the lab watches it through its Unix socket.

-- name: jobs
-- The job table, one pending job per worker of the trace.
CREATE TABLE jobs (
    id      int PRIMARY KEY,
    payload text NOT NULL,
    done_at timestamptz
);
INSERT INTO jobs (id, payload)
SELECT n, 'job ' || n FROM generate_series(1, %(jobs)s) AS n;

-- name: claim
-- A worker claims the oldest pending job (inside its open transaction): the row stays
-- locked until that transaction ends, and another worker's claim skips it.
SELECT id
  FROM jobs
 WHERE done_at IS NULL
 ORDER BY id
 LIMIT 1
   FOR UPDATE SKIP LOCKED;

-- name: finish
-- The worker's next statement, the one sent into the silence: mark its job done.
UPDATE jobs SET done_at = clock_timestamp() WHERE id = %(id)s;

-- name: keepalive_settings
-- The server's own TCP settings for this session's socket, as the server reads them back
-- (for a TCP connection: 0 for the idle time, interval and count shows the kernel's value).
SELECT current_setting('tcp_keepalives_idle'),
       current_setting('tcp_keepalives_interval'),
       current_setting('tcp_keepalives_count'),
       current_setting('tcp_user_timeout');

-- name: conf_loaded
-- When the server last read its configuration files (pg_hba.conf among them).
SELECT pg_conf_load_time();

-- name: reload
-- Ask the server to read its configuration files again (it does so a moment later).
SELECT pg_reload_conf();

-- name: sessions
-- The workers' sessions as the server sees them: a pid missing here has ended.
SELECT pid, state
  FROM pg_stat_activity
 WHERE pid = ANY(%(pids)s);

-- name: free_jobs
-- Which of these jobs another worker's claim would get now (run in a transaction that is
-- rolled back): a row still locked by a worker's open transaction is skipped.
SELECT id
  FROM jobs
 WHERE id = ANY(%(ids)s)
   FOR UPDATE SKIP LOCKED;
