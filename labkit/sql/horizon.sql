-- The xmin horizon and the queue (notebook 10): a long transaction keeps every row version
-- that died after it started, so the claim's index scan walks the entries of every job done
-- since. A snapshot holds back its own database. A transaction that has written (it has a
-- transaction id) counts as running in every snapshot taken on the server, so it holds back
-- the claim's scan in every database; VACUUM of a table in another database computes its
-- cutoff from that database's sessions only, and removes the versions all the same.

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
-- Who holds the xmin horizon back, oldest first, in every database of the server: every
-- session with a snapshot (backend_xmin) or a transaction id (backend_xid, a writer idle
-- between statements), and walsenders, whose xmin is a standby's (hot_standby_feedback).
-- holds_back: where the hold counts: a snapshot, in its own database; a transaction id,
-- in every snapshot taken on the server while it runs; a physical standby's xmin, in every
-- database; a logical walsender's (it has a database), the catalogs only. xmin_age and
-- xid_age: how many transactions old each hold is. xact_age_s and in_state_s: seconds
-- since the transaction began and since the session entered its state. last_query: the
-- start of the statement it ran last (for an idle session, the one before it went idle).
SELECT pid, datname, application_name, backend_type, state,
       CASE WHEN backend_xid IS NOT NULL THEN 'every snapshot on the server'
            WHEN backend_type = 'walsender' AND datname IS NULL THEN 'every database'
            WHEN backend_type = 'walsender' THEN 'the catalogs (a logical slot)'
            WHEN datname = current_database() THEN 'this database'
            ELSE 'its own database' END        AS holds_back,
       backend_xmin::text                      AS backend_xmin,
       backend_xid::text                       AS backend_xid,
       age(backend_xmin)                       AS xmin_age,
       age(backend_xid)                        AS xid_age,
       round(extract(epoch FROM now() - xact_start)::numeric, 1) AS xact_age_s,
       round(extract(epoch FROM now() - state_change)::numeric, 1) AS in_state_s,
       left(query, 60)                         AS last_query
  FROM pg_stat_activity
 WHERE (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
   AND pid <> pg_backend_pid()
 ORDER BY greatest(age(backend_xmin), age(backend_xid)) DESC
 LIMIT %(limit)s;

-- name: other_horizon_holders
-- What else holds the horizon, with no session to show for it: prepared transactions of
-- every database (PREPARE TRANSACTION, waiting for their COMMIT PREPARED; each keeps its
-- transaction id until then, as a writer idle in its transaction does) and replication
-- slots, even while their consumer is disconnected. xmin_age: how many transactions old
-- the xid each holds is; age_s: seconds since the transaction was prepared. A slot's xmin
-- (a standby's feedback through a physical slot) holds every table of every database back;
-- a logical slot's catalog_xmin holds back only the system catalogs' cleanup (and its
-- restart_lsn holds WAL).
SELECT 'prepared transaction' AS kind, gid AS name, database, age(transaction) AS xmin_age,
       round(extract(epoch FROM now() - prepared)::numeric, 1) AS age_s
  FROM pg_prepared_xacts
UNION ALL
SELECT 'replication slot: xmin (every table)', slot_name, database, age(xmin), NULL
  FROM pg_replication_slots
 WHERE xmin IS NOT NULL
UNION ALL
SELECT 'replication slot: catalog_xmin (system catalogs only)', slot_name, database,
       age(catalog_xmin), NULL
  FROM pg_replication_slots
 WHERE catalog_xmin IS NOT NULL
 ORDER BY xmin_age DESC;

-- name: snapshot_xmin
-- The xmin of this transaction's snapshot: the oldest transaction it still sees as running.
-- pg_stat_activity shows the same xid as this session's backend_xmin.
SELECT xid(pg_snapshot_xmin(pg_current_snapshot()))::text;

-- name: holder
-- The holder as the server sees it: its database, its state, its snapshot's xmin and its
-- transaction id, and how many transactions old each is.
SELECT pid, datname, application_name, state,
       age(backend_xmin) AS xmin_age, age(backend_xid) AS xid_age,
       backend_xmin::text AS backend_xmin, backend_xid::text AS backend_xid
  FROM pg_stat_activity
 WHERE pid = %(pid)s;

-- name: other_databases
-- Databases of this server, other than this one, that this role may connect to: where the
-- lab opens its writer when it may not create a database of its own.
SELECT datname
  FROM pg_database
 WHERE datallowconn AND NOT datistemplate
   AND datname <> current_database()
   AND has_database_privilege(datname, 'CONNECT')
 ORDER BY datname <> 'postgres', datname;

-- name: writer_table
-- In the lab's throw-away database: a table for the writer to write to (kept if a run that
-- was cut off before the database was dropped left it).
CREATE TABLE IF NOT EXISTS ledger (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, note text);

-- name: writer
-- The writer: a transaction that inserts one row and then sits idle, never committing. Its
-- first write gave it a transaction id (backend_xid), and it keeps it until it ends.
BEGIN;
INSERT INTO ledger (note) VALUES ('a migration, left open');

-- name: writer_no_table
-- The writer, in a database that is not the lab's own: a transaction that takes a
-- transaction id as its first write would (pg_current_xact_id assigns one) and sits idle.
BEGIN;
SELECT pg_current_xact_id();

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
-- Who holds the claim's horizon furthest back, other than the lab's own workers (sessions
-- whose application_name starts with %(workers)s) and this session, and how many
-- transactions old that hold is: the oldest snapshot of a client session of this database,
-- or the oldest transaction id of a client session of any database. No row when none has
-- one.
SELECT greatest(CASE WHEN datname = current_database() THEN age(backend_xmin) END,
                age(backend_xid)) AS age,
       pid, datname, application_name, state
  FROM pg_stat_activity
 WHERE backend_type = 'client backend'
   AND pid <> pg_backend_pid()
   AND NOT starts_with(coalesce(application_name, ''), %(workers)s)
   AND (backend_xid IS NOT NULL
        OR (datname = current_database() AND backend_xmin IS NOT NULL))
 ORDER BY 1 DESC
 LIMIT 1;

-- name: durability
-- What each commit waits for on this server.
SELECT current_setting('fsync') AS fsync,
       current_setting('synchronous_commit') AS synchronous_commit;

-- name: xact_id
-- The transaction id of this transaction (assigned now if it has none yet), as a 64-bit
-- number that only grows: what its row versions carry as xmin, and as xmax on the versions
-- it replaced.
SELECT pg_current_xact_id()::text;

-- name: snapshot_horizon
-- The xmin of this transaction's snapshot, as a 64-bit number: every transaction from this
-- one on counts as still running for it, so no version one of them replaced may go.
SELECT pg_snapshot_xmin(pg_current_snapshot())::text;

-- name: older_than
-- Who still sees the versions transaction %(x)s replaced: a transaction id older than it,
-- in any database of the server, a snapshot taken before it ended, in this database, or a
-- replication slot's xmin (a standby's feedback) older than it.
SELECT pid, datname, xact_start
  FROM pg_stat_activity
 WHERE pid <> pg_backend_pid()
   AND (age(backend_xid) >= age(xid(%(x)s::xid8))
        OR (datname = current_database() AND age(backend_xmin) >= age(xid(%(x)s::xid8))))
UNION ALL
SELECT active_pid, 'slot ' || slot_name, NULL
  FROM pg_replication_slots
 WHERE age(xmin) >= age(xid(%(x)s::xid8))
 ORDER BY xact_start;

-- name: entries_read
-- How many entries scans of the index %(index)s have returned in this transaction so far
-- (one for each entry a scan read, live or dead; an entry already marked dead is skipped
-- without being returned).
SELECT pg_stat_get_xact_tuples_returned(%(index)s::regclass);

-- name: claim_order
-- The jobs in the order the claim takes them (the partial index's order, due jobs first).
SELECT id, status FROM job ORDER BY priority, run_at, id;

-- name: churn_round
-- One round of a busy queue: %(n)s new jobs arrive behind the others, and workers claim and
-- complete as many of the oldest pending ones (set-based: the same dead versions and dead
-- index entries as one claim and one completion per job).
INSERT INTO job (run_at, enqueued_at)
SELECT t, t
  FROM generate_series(1, %(n)s) AS i,
       LATERAL (SELECT clock_timestamp() + i * interval '1 microsecond') AS at(t);
UPDATE job
   SET status = 'RUNNING', attempts = attempts + 1, claimed_by = 'churn',
       claim_version = claim_version + 1, lease_until = now() + interval '1 minute'
 WHERE id IN (SELECT id FROM job WHERE status = 'PENDING'
               ORDER BY priority, run_at LIMIT %(n)s);
UPDATE job
   SET status = 'DONE', finished_at = now(), claimed_by = NULL, lease_until = NULL
 WHERE status = 'RUNNING';

-- name: index_pages
-- The claim's index on disk: its size in 8 kB pages (pg_relation_size), the file VACUUM
-- leaves as it is and REINDEX writes anew.
SELECT pg_relation_size('job_due_idx') / current_setting('block_size')::int;

-- name: reindex_concurrently
-- Build the index again beside the old one, then swap them: SHARE UPDATE EXCLUSIVE on the
-- table and the index (claims go on), but it waits for every transaction that could use the
-- index. PostgreSQL 12 and later; not inside a transaction block.
REINDEX INDEX CONCURRENTLY job_due_idx;

-- name: reindex
-- Build the index again in place: it locks out writes to the table and takes ACCESS
-- EXCLUSIVE on the index, which every query that plans against the table waits for, until
-- its transaction ends.
REINDEX INDEX job_due_idx;

-- name: read_jobs
-- A plain read of the job table (a dashboard's count), for the plain REINDEX to block.
SELECT count(*) FROM job;

-- name: relation_locks
-- The locks session %(pid)s holds (%(granted)s true) or waits for (false) on the job table
-- and the claim's index: each relation and the mode, as pg_locks names it (ShareLock for
-- SHARE, RowExclusiveLock for ROW EXCLUSIVE, ...).
SELECT relation::regclass::text, mode
  FROM pg_locks
 WHERE pid = %(pid)s AND locktype = 'relation' AND granted = %(granted)s
   AND relation IN ('job'::regclass, 'job_due_idx'::regclass)
 ORDER BY 1, 2;

-- name: idle_reader
-- The checker's innocent reader: a READ COMMITTED transaction that ran one query and sits
-- idle in it. Its snapshot ended with the statement, and it has written nothing.
BEGIN ISOLATION LEVEL READ COMMITTED;
SELECT count(*) FROM job;

-- name: scene_holds
-- The checker's sessions as the server shows them: whether each holds a snapshot or a
-- transaction id, and how many transactions old the older of the two is.
SELECT pid, backend_xmin IS NOT NULL OR backend_xid IS NOT NULL AS holds,
       greatest(age(backend_xmin), age(backend_xid)) AS age
  FROM pg_stat_activity
 WHERE pid = ANY(%(pids)s);

-- name: sessions_left
-- Which of these sessions the server still shows (a closed session leaves a moment later).
SELECT pid FROM pg_stat_activity WHERE pid = ANY(%(pids)s);
