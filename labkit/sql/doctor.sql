-- What `labkit doctor` and `labkit clean` look for on the server. Each query runs with
-- parameters, so a literal % is written %%. Every labkit session is named
-- labkit:<schema>:<role> (its application_name).

-- name: leftovers
-- labkit sessions idle in a transaction for over %(idle)s seconds: a kernel that was
-- interrupted, or a cell that forgot COMMIT. They hold their locks for nothing (a session
-- of a notebook that is running right now is idle in a transaction only for moments).
SELECT pid, application_name, state,
       date_trunc('second', clock_timestamp() - state_change) AS idle_for,
       (SELECT count(*) FROM pg_locks l WHERE l.pid = a.pid AND l.granted) AS locks
  FROM pg_stat_activity a
 WHERE application_name LIKE 'labkit:%%'
   AND pid <> pg_backend_pid()
   AND state IN ('idle in transaction', 'idle in transaction (aborted)')
   AND state_change < clock_timestamp() - make_interval(secs => %(idle)s)
 ORDER BY pid;

-- name: my_leftovers
-- The same, of this database user only: `labkit clean` ends its own leftovers, and a
-- superuser's never ends another role's sessions.
SELECT pid
  FROM pg_stat_activity a
 WHERE application_name LIKE 'labkit:%%'
   AND pid <> pg_backend_pid()
   AND usename = current_user
   AND state IN ('idle in transaction', 'idle in transaction (aborted)')
   AND state_change < clock_timestamp() - make_interval(secs => %(idle)s)
 ORDER BY pid;

-- name: schemas_in_use
-- Which of these lab schemas a session is working in right now: one of the lab's sessions
-- (application_name labkit:<schema>:<role>) running a statement or inside a transaction, or
-- any session holding locks on the schema's tables. A run in another terminal is; a
-- notebook left open between cells (its connections idle) is not.
SELECT DISTINCT n.nspname
  FROM pg_namespace n
 WHERE n.nspname = ANY(%(schemas)s)
   AND (EXISTS (SELECT 1 FROM pg_stat_activity a
                 WHERE a.pid <> pg_backend_pid()
                   AND a.state IS DISTINCT FROM 'idle'
                   AND (a.application_name = left('labkit:' || n.nspname, 63)
                        OR left(a.application_name, least(63, 8 + length(n.nspname)))
                           = left('labkit:' || n.nspname || ':', 63)))
        OR EXISTS (SELECT 1 FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
                    WHERE c.relnamespace = n.oid AND l.pid <> pg_backend_pid()));

-- name: my_sessions
-- Every labkit session of this database user but this one (`labkit clean --all`).
SELECT pid
  FROM pg_stat_activity
 WHERE application_name LIKE 'labkit:%%'
   AND pid <> pg_backend_pid()
   AND usename = current_user;

-- name: lab_schemas
-- Every lab schema on the server, whoever made it.
SELECT nspname FROM pg_namespace WHERE nspname LIKE 'lab\_%%' ORDER BY 1;

-- name: idle_sandbox_roles
-- Throw-away roles (grading and spec runs log in as them) that no session uses.
SELECT rolname
  FROM pg_roles r
 WHERE rolname LIKE 'labkit\_sbx\_%%'
   AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.usename = r.rolname)
 ORDER BY 1;

-- name: spec_databases
-- Databases that interrupted `labkit spec run`s left behind and that this role may drop:
-- named labkit_spec_*, marked labkit:<user tag>, owned by this role, nobody connected.
SELECT d.datname
  FROM pg_catalog.pg_database d
 WHERE d.datname LIKE 'labkit\_spec\_%%'
   AND d.datdba = (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = current_user)
   AND (%(tag)s::text IS NULL AND shobj_description(d.oid, 'pg_database') LIKE 'labkit:%%'
        OR shobj_description(d.oid, 'pg_database') = 'labkit:' || %(tag)s)
   AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity a WHERE a.datid = d.oid)
 ORDER BY 1;

-- name: lab_slots
-- Logical replication slots the change-data-capture lab made (named <lab schema>_cdc): a run
-- drops its slot at the end, so one still here belongs to a run that is going on or was
-- killed. An inactive slot keeps every byte of WAL written since its restart_lsn.
SELECT s.slot_name, s.active,
       coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn), 0)::bigint AS retained,
       EXISTS (SELECT 1 FROM pg_namespace n WHERE n.nspname = left(s.slot_name, -4))
         AS schema_exists
  FROM pg_replication_slots s
 WHERE s.slot_name LIKE 'lab\_%%\_cdc'
 ORDER BY 1;
