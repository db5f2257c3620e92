-- The physics of a queue run (labkit.tools.physics): counters read from the server's statistics
-- before and after a run, and the sessions' wait events sampled while it runs.

-- name: wal_position
-- Where the server's WAL ends now, counting what is inserted and not yet written out (with
-- synchronous_commit = off a commit's WAL can wait in memory): the difference of two readings
-- is the WAL the run generated.
SELECT pg_current_wal_insert_lsn()::text;

-- name: wal_counters_18
-- WAL records, and the WAL writes and syncs (PostgreSQL 18 and later keep the I/O counts in
-- pg_stat_io, object 'wal').
SELECT (SELECT wal_records FROM pg_stat_wal),
       (SELECT coalesce(sum(writes), 0) FROM pg_stat_io WHERE object = 'wal'),
       (SELECT coalesce(sum(fsyncs), 0) FROM pg_stat_io WHERE object = 'wal');

-- name: wal_counters
-- The same before PostgreSQL 18 (14 to 17), where pg_stat_wal keeps the I/O counts.
SELECT wal_records, wal_write, wal_sync FROM pg_stat_wal;

-- name: buffer_counters
-- Buffers found in shared memory and read from outside it, this database.
SELECT blks_hit, blks_read FROM pg_stat_database WHERE datname = current_database();

-- name: session_pids
-- The backends serving the sessions of these application_names.
SELECT pid FROM pg_stat_activity WHERE application_name = ANY(%(names)s) ORDER BY pid;

-- name: wait_sample
-- One look at what those sessions are doing: a wait event, running (on a CPU), or idle, waiting
-- for their client's next statement.
SELECT CASE WHEN state = 'active' AND wait_event IS NULL THEN 'CPU'
            WHEN state LIKE 'idle%%' THEN 'idle: waiting for the client'
            ELSE coalesce(wait_event_type || ':' || wait_event, state) END AS what
  FROM pg_stat_activity
 WHERE application_name = ANY(%(names)s) AND pid <> pg_backend_pid();

-- name: group_commit_scene
-- The group-commit probe's table: one row per commit.
CREATE TABLE IF NOT EXISTS commit_probe (n bigint);

-- name: group_commit_insert
-- One durable commit (autocommit: the statement is its own transaction).
INSERT INTO commit_probe VALUES (1);

-- name: may_set_commit_delay
-- Whether this role may set commit_delay: a superuser, or (PostgreSQL 15 and later) a role
-- granted SET on it.
SELECT rolsuper OR (current_setting('server_version_num')::int >= 150000
                    AND has_parameter_privilege('commit_delay', 'SET'))
  FROM pg_roles WHERE rolname = current_user;
