-- The xmin horizon and the queue (notebook 13): one long transaction anywhere in the
-- database keeps every row version that died after it started, so the claim's index scan
-- walks the entries of every job done since, and VACUUM can remove none of them.

-- name: fill
-- %(n)s pending jobs, all due, enqueued one millisecond apart over the time before now. A
-- queue table that has run for a while stores each new job wherever VACUUM freed room, so
-- the order the claim takes jobs in is not the order of the table's pages: the rows are
-- written in a scrambled (but fixed) order of their run_at.
INSERT INTO job (run_at, enqueued_at)
SELECT t, t
  FROM generate_series(1, %(n)s) AS i,
       LATERAL (SELECT now() - (%(n)s + 1 - i) * interval '1 millisecond') AS at(t)
 ORDER BY hashint4(i), i;

-- name: top_up
-- %(n)s more pending jobs, due at once, queued behind every job already there (their run_at
-- follows %(after)s, the last one's, by a microsecond each).
INSERT INTO job (run_at, enqueued_at)
SELECT t, t
  FROM generate_series(1, %(n)s) AS i,
       LATERAL (SELECT %(after)s::timestamptz + i * interval '1 microsecond') AS at(t);

-- name: claim_select
-- The SELECT inside production.sql's claim, as it runs there: what EXPLAIN measures.
SELECT id FROM job
              WHERE status = 'PENDING' AND run_at <= now()
              ORDER BY priority, run_at
              LIMIT 1
              FOR UPDATE SKIP LOCKED;

-- name: report
-- The long report: a snapshot taken at its first statement and kept until it ends.
-- Between statements the session sits "idle in transaction", still holding it.
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT count(*) FROM job;

-- name: who_holds_the_horizon
-- Who holds the xmin horizon back in this database, oldest first: every session with a
-- snapshot (backend_xmin) or a transaction id (backend_xid, a writer idle between
-- statements), and walsenders, whose xmin is a standby's (hot_standby_feedback). VACUUM
-- can remove no row version that died after the oldest of these began.
SELECT pid, application_name, backend_type, state,
       age(backend_xmin)                       AS xmin_age,
       age(backend_xid)                        AS xid_age,
       round(extract(epoch FROM now() - xact_start)::numeric, 1) AS xact_age_s,
       round(extract(epoch FROM now() - state_change)::numeric, 1) AS in_state_s,
       left(query, 60)                         AS last_query
  FROM pg_stat_activity
 WHERE (datname = current_database() OR backend_type = 'walsender')
   AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
   AND pid <> pg_backend_pid()
 ORDER BY greatest(age(backend_xmin), age(backend_xid)) DESC
 LIMIT %(limit)s;

-- name: other_horizon_holders
-- What else holds the horizon, with no session to show for it: prepared transactions
-- (PREPARE TRANSACTION, waiting for their COMMIT PREPARED) and replication slots, even
-- while their consumer is disconnected. A slot's xmin (a standby's feedback through a
-- physical slot) holds every table back; a logical slot's catalog_xmin holds back only
-- the system catalogs' cleanup (and its restart_lsn holds WAL).
SELECT 'prepared transaction' AS kind, gid AS name, age(transaction) AS xmin_age,
       round(extract(epoch FROM now() - prepared)::numeric, 1) AS age_s
  FROM pg_prepared_xacts
 WHERE database = current_database()
UNION ALL
SELECT 'replication slot: xmin (every table)', slot_name, age(xmin), NULL
  FROM pg_replication_slots
 WHERE xmin IS NOT NULL
UNION ALL
SELECT 'replication slot: catalog_xmin (system catalogs only)', slot_name, age(catalog_xmin), NULL
  FROM pg_replication_slots
 WHERE catalog_xmin IS NOT NULL
 ORDER BY xmin_age DESC;

-- name: holder
-- The holder as the server sees it: its state and how many transactions old its snapshot is.
SELECT pid, application_name, state, age(backend_xmin) AS xmin_age
  FROM pg_stat_activity
 WHERE pid = %(pid)s;

-- name: work_off
-- Work the whole queue off at once: every job claimed, then completed. Each job leaves the
-- same two dead row versions as a worker's claim and complete (its PENDING and its RUNNING
-- version).
UPDATE job
   SET status = 'RUNNING', attempts = attempts + 1, claimed_by = 'lab',
       claim_version = claim_version + 1, lease_until = now() + interval '1 minute'
 WHERE status = 'PENDING';
UPDATE job
   SET status = 'DONE', finished_at = now(), claimed_by = NULL, lease_until = NULL
 WHERE status = 'RUNNING';

-- name: end_idle_reports
-- The fix, in the report's own session: a session idle in a transaction for longer than
-- this is ended by the server, its transaction rolled back and its snapshot gone. Set
-- for a role or a database (ALTER ROLE reporting SET idle_in_transaction_session_timeout
-- = '5min'), it guards every session that role or database opens from then on.
SELECT set_config('idle_in_transaction_session_timeout', %(timeout)s, false);

-- name: dead_tuples
-- The dead row versions the statistics count for the job table. Each backend sends its
-- counts at most once a second, so this lags the truth by about a second; VACUUM sets it
-- at its end to the dead versions it found but could not remove.
SELECT n_live_tup, n_dead_tup
  FROM pg_stat_user_tables
 WHERE relid = 'job'::regclass;

-- name: horizon_age
-- How many transactions old the oldest snapshot or transaction id of another client session
-- of this database is (NULL when none is open): the distance to the horizon.
SELECT max(greatest(age(backend_xmin), age(backend_xid)))
  FROM pg_stat_activity
 WHERE datname = current_database()
   AND backend_type = 'client backend'
   AND pid <> pg_backend_pid();

-- name: durability
-- What each commit waits for on this server.
SELECT current_setting('fsync') AS fsync,
       current_setting('synchronous_commit') AS synchronous_commit;
