-- What the pooler lab (notebook 12) sends through PgBouncer in transaction pooling mode.
--
-- A client of the pooler cannot set search_path when it connects (PgBouncer refuses the
-- startup parameter "options"), so every table here is named with its schema: {job} is
-- written in as "<the lab's schema>".job, the table of production.sql "table".

-- name: enqueue
-- n pending jobs, due now.
INSERT INTO {job} (payload)
SELECT jsonb_build_object('n', n) FROM generate_series(1, %(n)s) AS n;

-- name: claim
-- production.sql's claim, schema-qualified: the most urgent due job, skipping rows another
-- worker holds; also says which server backend ran it.
UPDATE {job}
   SET status = 'RUNNING', attempts = attempts + 1, claimed_by = %(worker)s,
       claim_version = claim_version + 1,
       lease_until = now() + make_interval(secs => %(lease_s)s)
 WHERE id = (SELECT id FROM {job}
              WHERE status = 'PENDING' AND run_at <= now()
              ORDER BY priority, run_at
              LIMIT 1
              FOR UPDATE SKIP LOCKED)
RETURNING id, claim_version, pg_backend_pid() AS backend_pid;

-- name: complete
-- production.sql's complete, schema-qualified: done, fenced by the claim's version.
UPDATE {job}
   SET status = 'DONE', finished_at = now(), claimed_by = NULL, lease_until = NULL
 WHERE id = %(id)s AND claim_version = %(claim_version)s AND status = 'RUNNING'
RETURNING id;

-- name: tally
-- Every job done, each claimed once?
SELECT count(*) AS jobs,
       count(*) FILTER (WHERE status = 'DONE') AS done,
       count(*) FILTER (WHERE attempts = 1) AS claimed_once
  FROM {job};

-- name: backend_pid
-- The server backend this client's statement ran on.
SELECT pg_backend_pid();

-- name: lock_waits
-- Sessions of this lab waiting for a lock inside the server (a client queued in the pooler
-- is not one: it has no server backend yet).
SELECT count(*)
  FROM pg_stat_activity
 WHERE starts_with(application_name, %(app)s) AND wait_event_type = 'Lock';

-- name: session_set
-- A plain SET, outside a transaction: it lasts as long as the server session.
SET statement_timeout = '4321ms';

-- name: show
-- The setting as this client's session sees it.
SHOW statement_timeout;

-- name: reset
-- Back to the server's default.
RESET statement_timeout;

-- name: session_set_tracked
-- A plain SET of a parameter PgBouncer tracks per client (one the server reports back to
-- the client: client_encoding, DateStyle, TimeZone, standard_conforming_strings,
-- application_name).
SET TimeZone = 'Pacific/Chatham';

-- name: show_tracked
-- The tracked parameter as this client's session sees it.
SHOW TimeZone;

-- name: reset_tracked
-- The tracked parameter back to the server's default.
RESET TimeZone;

-- name: set_local
-- SET LOCAL: it lasts until the end of the transaction.
SET LOCAL statement_timeout = '4321ms';

-- name: lock
-- A session-level advisory lock: held until unlocked or the server session ends.
SELECT pg_advisory_lock(%(key)s);

-- name: try_lock
-- Take the session-level lock if no other session holds it.
SELECT pg_try_advisory_lock(%(key)s);

-- name: unlock
-- Release one hold of the session-level lock (true if this session held it).
SELECT pg_advisory_unlock(%(key)s);

-- name: xact_lock
-- A transaction-level advisory lock: released when the transaction ends.
SELECT pg_advisory_xact_lock(%(key)s);

-- name: try_xact_lock
-- Take the transaction-level lock if no other session holds it.
SELECT pg_try_advisory_xact_lock(%(key)s);

-- name: lock_holders
-- Who holds the advisory lock on a bigint key (the key's high half is classid, its low half
-- objid, objsubid 1), in this database.
SELECT pid, mode, granted
  FROM pg_locks
 WHERE locktype = 'advisory' AND objsubid = 1
   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND classid::bigint = (%(key)s::bigint >> 32)
   AND objid::bigint = (%(key)s::bigint & 4294967295)
 ORDER BY pid;

-- name: listen
-- Listen on the lab's channel (session state of the server backend that runs it).
LISTEN {channel};

-- name: notify
-- Send a notification (delivered when this transaction commits).
SELECT pg_notify(%(channel)s, %(payload)s);

-- name: listening
-- The channels this client's server session listens on.
SELECT pg_listening_channels() AS channel, pg_backend_pid() AS backend_pid;

-- name: unlisten
-- Stop listening on every channel.
UNLISTEN *;

-- name: prepared_a
-- A query a client runs again and again (psycopg prepares it after its fifth run).
SELECT %(n)s::int AS a;

-- name: prepared_b
-- Another client's query, run again and again.
SELECT %(n)s::int * 2 AS b;

-- name: prepared_names
-- The prepared statements of this client's server session, by name.
SELECT name FROM pg_prepared_statements ORDER BY name;

-- name: deallocate
-- Drop every prepared statement of the server session.
DEALLOCATE ALL;
