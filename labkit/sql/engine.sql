-- The questions the engine asks the server. Sessions and labs never guess what
-- PostgreSQL is doing: they ask it with these queries.

-- name: blockers
-- Whom a session's running step waits for, as PostgreSQL's isolation tester asks it: the
-- sessions holding or queued ahead for a heavyweight lock it wants (pg_blocking_pids), or
-- the transactions a SERIALIZABLE READ ONLY DEFERRABLE one waits out for a safe snapshot
-- (pg_safe_snapshot_blocking_pids); with the wait event the server reports for it.
SELECT pg_blocking_pids(%(pid)s) || pg_safe_snapshot_blocking_pids(%(pid)s),
       wait_event_type, wait_event
  FROM pg_stat_activity
 WHERE pid = %(pid)s;

-- name: transaction_ids
-- The transaction id each of these backends holds (only those that wrote or locked a row
-- have one): a row locked by a transaction carries its id in xmax.
SELECT pid, backend_xid::text
  FROM pg_stat_activity
 WHERE pid = ANY(%(pids)s) AND backend_xid IS NOT NULL;

-- name: statement_ms
-- How long a session's last statement ran by the server's clock, in ms: from when it
-- started (query_start) to when the session stopped running it (state_change). NULL while
-- it still runs. Read from another connection, so no client's clock is in it.
SELECT extract(epoch FROM state_change - query_start) * 1000
  FROM pg_stat_activity
 WHERE pid = %(pid)s AND state <> 'active';

-- name: column_exists
-- Whether a table of the lab has this column (for the rows a run watches).
SELECT 1
  FROM pg_attribute
 WHERE attrelid = to_regclass(%(table)s) AND attname = %(column)s AND NOT attisdropped;

-- name: own_lab_schemas
-- The lab schemas of one user that this role may drop: labkit made them (its mark is the
-- schema's comment, labkit:<user tag>), this role owns them, and the tag is the user's
-- exactly (bob is not bob_smith). A NULL tag: every user's, still with labkit's mark.
SELECT n.nspname
  FROM pg_namespace n
 WHERE n.nspname LIKE %(like)s
   AND n.nspowner = (SELECT oid FROM pg_roles WHERE rolname = current_user)
   AND (%(tag)s::text IS NULL AND obj_description(n.oid, 'pg_namespace') LIKE 'labkit:%%'
        OR obj_description(n.oid, 'pg_namespace') = 'labkit:' || %(tag)s)
 ORDER BY 1;

-- name: other_lab_schemas
-- How many lab schemas there are besides these (other users', other roles').
SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'lab\_%%' AND NOT nspname = ANY(%(mine)s);

-- name: end_lab_sessions
-- End this lab's other sessions (an interrupted run's, which may hold row locks on its
-- tables): those named labkit:<schema> or labkit:<schema>:<role>, of this database user.
SELECT pg_terminate_backend(pid)
  FROM pg_stat_activity
 WHERE (application_name = %(app)s OR starts_with(application_name, %(app)s || ':'))
   AND pid <> pg_backend_pid()
   AND usename = current_user;
