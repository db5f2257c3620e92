-- Change data capture (notebook 14): the outbox read from the write-ahead log through a
-- logical replication slot, instead of polled from its table.
--
-- A logical slot remembers how far its one consumer has confirmed the change stream, and
-- keeps every WAL file from its restart_lsn on until the consumer moves it: that is what
-- makes the stream complete after a pause, and what fills the disk when nobody reads.
-- The output plugin test_decoding turns each committed change into a line of text:
--   BEGIN 1234
--   table lab_x.outbox: INSERT: id[bigint]:3 event_id[text]:'evt-0003' ... published_at[...]:
--     null
--   COMMIT 1234
-- A transaction's lines come out when it commits, one transaction after another, in the
-- order the transactions committed -- unless the reader asks for streaming of in-progress
-- transactions (PostgreSQL 14 and later; peek_streaming below).

-- name: prerequisites
-- What a logical slot needs, checked before anything is created: wal_level (and, from
-- PostgreSQL 19, the level in effect), a free slot, and a user that may create one.
SELECT current_setting('wal_level'),
       current_setting('effective_wal_level', true),          -- NULL before PostgreSQL 19
       current_setting('max_replication_slots')::int,
       (SELECT count(*) FROM pg_replication_slots WHERE slot_name <> %(slot)s)::int,
       (SELECT rolsuper OR rolreplication FROM pg_roles WHERE rolname = current_user),
       current_user::text;

-- name: create_slot
-- The consumer's slot: it starts at the first consistent point after every transaction
-- that was running at this moment has ended (the call waits for them).
SELECT lsn::text
  FROM pg_create_logical_replication_slot(%(slot)s, 'test_decoding');

-- name: writers
-- Sessions holding a transaction id: creating a slot waits until each of these has ended.
SELECT pid, coalesce(nullif(application_name, ''), usename::text),
       extract(epoch FROM clock_timestamp() - xact_start)::int
  FROM pg_stat_activity
 WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()
 ORDER BY xact_start;

-- name: peek
-- The consumer reads what the slot holds WITHOUT consuming it: the changes of every
-- transaction that inserted into the lab's outbox (%(prefix)s is "table <schema>.outbox:
-- INSERT:"), with their BEGIN and COMMIT lines, in the order the plugin returned them (n).
WITH stream AS MATERIALIZED (
    SELECT n, lsn, xid, data
      FROM pg_logical_slot_peek_changes(%(slot)s, NULL, NULL,
                                        'include-xids', '1', 'skip-empty-xacts', '1')
           WITH ORDINALITY AS c(lsn, xid, data, n)
)
SELECT lsn::text, xid::text, data
  FROM stream
 WHERE xid IN (SELECT xid FROM stream WHERE starts_with(data, %(prefix)s))
   AND (starts_with(data, %(prefix)s) OR starts_with(data, 'BEGIN')
        OR starts_with(data, 'COMMIT'))
 ORDER BY n;

-- name: get
-- The same read, CONSUMING: the slot counts everything returned (and everything it skipped)
-- as confirmed the moment the call returns -- before the caller has published a thing.
WITH stream AS MATERIALIZED (
    SELECT n, lsn, xid, data
      FROM pg_logical_slot_get_changes(%(slot)s, NULL, NULL,
                                       'include-xids', '1', 'skip-empty-xacts', '1')
           WITH ORDINALITY AS c(lsn, xid, data, n)
)
SELECT lsn::text, xid::text, data
  FROM stream
 WHERE xid IN (SELECT xid FROM stream WHERE starts_with(data, %(prefix)s))
   AND (starts_with(data, %(prefix)s) OR starts_with(data, 'BEGIN')
        OR starts_with(data, 'COMMIT'))
 ORDER BY n;

-- name: confirm
-- After publishing: confirm up to the end of the last transaction published. The slot
-- never hands those transactions out again, and may let go of the WAL before them.
SELECT end_lsn::text
  FROM pg_replication_slot_advance(%(slot)s, %(upto)s::pg_lsn);

-- name: slot_state
-- The slot as pg_replication_slots shows it: how much WAL it keeps on disk (from its
-- restart_lsn to now), how far its consumer is behind (from confirmed_flush_lsn to now),
-- and whether the WAL it needs is still guaranteed (wal_status; safe_wal_size is how many
-- more bytes may be written before it is not: NULL when max_slot_wal_keep_size = -1).
SELECT restart_lsn::text,
       confirmed_flush_lsn::text,
       pg_current_wal_lsn()::text,
       pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint         AS retained_bytes,
       pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint AS behind_bytes,
       wal_status,
       safe_wal_size,
       active_pid
  FROM pg_replication_slots
 WHERE slot_name = %(slot)s;

-- name: current_lsn
-- Where the server is writing WAL now.
SELECT pg_current_wal_lsn()::text;

-- name: wal_since
-- Bytes of WAL written since %(lsn)s.
SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %(lsn)s::pg_lsn)::bigint;

-- name: wal_between
-- Bytes of WAL from %(before)s to %(after)s (how far a slot's restart_lsn moved, say).
SELECT pg_wal_lsn_diff(%(after)s::pg_lsn, %(before)s::pg_lsn)::bigint;

-- name: lsn_reached
-- Whether %(a)s is at or past %(b)s.
SELECT %(a)s::pg_lsn >= %(b)s::pg_lsn;

-- name: log_running_xacts
-- Write a record of the running transactions to the WAL now (PostgreSQL 16 and later),
-- instead of waiting up to 15 s for the background writer's. Decoding moves a slot's
-- restart_lsn only at such a record.
SELECT pg_log_standby_snapshot()::text;

-- name: heartbeat
-- A heartbeat: a transaction that writes to the WAL (a logical decoding message, which the
-- consumer ignores), so its COMMIT waits until the WAL up to its commit record is flushed
-- (synchronous_commit). Only flushed WAL is decoded: the running-transactions record just
-- written becomes readable. CDC tools write heartbeats for the same reason: on a database
-- where nothing the slot decodes is written, the slot's position stands still.
SELECT pg_logical_emit_message(true, 'labkit-heartbeat', '')::text;

-- name: slot_holder
-- Whether the slot exists, and the session using it at this moment (NULL: none).
SELECT active_pid,
       (SELECT application_name FROM pg_stat_activity WHERE pid = active_pid)
  FROM pg_replication_slots
 WHERE slot_name = %(slot)s;

-- name: drop_slot
-- Drop the slot, and with it everything it kept: the WAL from its restart_lsn on, and
-- the catalog rows VACUUM could not remove because of it.
SELECT pg_drop_replication_slot(%(slot)s);

-- name: producer_position
-- Inside a producer's transaction, after its insert: the outbox id it got, and its
-- transaction id as logical decoding prints it (the 32-bit xid, without the epoch).
SELECT currval(pg_get_serial_sequence('outbox', 'id')),
       txid_current() % 4294967296;

-- name: committed_ids
-- What a poller sees: the committed outbox rows with an id above %(after)s.
SELECT id FROM outbox WHERE id > %(after)s ORDER BY id;

-- name: unrelated_table
-- A table of the lab that has nothing to do with the outbox: its rows are WAL the slot
-- keeps all the same (a slot keeps WAL files, not changes of one table).
DROP TABLE IF EXISTS unrelated;
CREATE TABLE unrelated (id bigserial PRIMARY KEY, pad text NOT NULL);

-- name: unrelated_rows
-- %(n)s rows of about 150 bytes into the unrelated table.
INSERT INTO unrelated (pad)
SELECT repeat(md5(g::text), 4) FROM generate_series(1, %(n)s) AS g;

-- name: outbox_activity
-- How the outbox has been read and written, as the statistics system counts it: scans
-- (sequential and index) and rows updated.
SELECT seq_scan + coalesce(idx_scan, 0), n_tup_upd
  FROM pg_stat_user_tables
 WHERE relid = 'outbox'::regclass;

-- name: flush_stats
-- This session's statistics reach the shared counters when it next goes idle
-- (PostgreSQL 15 and later; they are otherwise flushed at most once a second).
SELECT pg_stat_force_next_flush();

-- name: guards
-- What stops a forgotten slot from filling the disk: max_slot_wal_keep_size (-1, the
-- default, lets a slot keep any amount of WAL) and, from PostgreSQL 18,
-- idle_replication_slot_timeout (0, the default, never times a slot out).
SELECT current_setting('max_slot_wal_keep_size'),
       current_setting('idle_replication_slot_timeout', true),    -- NULL before 18
       current_setting('max_wal_size'),
       current_setting('max_replication_slots')::int;

-- name: bulk_events
-- One producer transaction that writes %(n)s events at once (a bulk import, a backfill):
-- their decoded changes outgrow a small logical_decoding_work_mem.
INSERT INTO outbox (event_id, aggregate, payload)
SELECT format('bulk-%%s', g), 'order-bulk',
       jsonb_build_object('line', g, 'note', repeat('x', 100))
  FROM generate_series(1, %(n)s) AS g;

-- name: producer_xid
-- The producer's transaction id, as the slot's xid column shows it, and where its last
-- change went into the WAL.
SELECT pg_current_xact_id()::xid::text, pg_current_wal_insert_lsn()::text;

-- name: flush_wal
-- A slot is decoded only up to the WAL flushed to disk, and an open transaction's changes
-- may wait in memory for a while. Another transaction's commit flushes the WAL up to its
-- commit record, theirs included: this one writes one record, a logical message (the slot
-- shows it under its own xid), and commits.
SELECT pg_logical_emit_message(true, 'labkit', 'flush')::text;

-- name: flushed
-- Whether the WAL is flushed up to %(lsn)s.
SELECT pg_current_wal_flush_lsn() >= %(lsn)s::pg_lsn;

-- name: decoding_work_mem
-- For this session's decoding only: the memory the changes of in-progress transactions may
-- take before the decoder spills them to disk -- or, if the reader asked for it, streams them.
SELECT set_config('logical_decoding_work_mem', %(mem)s, false);

-- name: peek_xid
-- The slot's lines for one transaction, read as every other read here: committed
-- transactions only, each when its COMMIT is decoded.
SELECT data
  FROM pg_logical_slot_peek_changes(%(slot)s, NULL, NULL,
                                    'include-xids', '1', 'skip-empty-xacts', '1')
 WHERE xid = %(xid)s::xid;

-- name: peek_streaming
-- The same, asking test_decoding to stream in-progress transactions ('stream-changes'):
-- once one transaction's decoded changes outgrow logical_decoding_work_mem, they are handed
-- out before its COMMIT, in blocks ("opening a streamed block ...", "streaming change ...",
-- "closing a streamed block ..."). pgoutput's option is 'streaming'.
SELECT data
  FROM pg_logical_slot_peek_changes(%(slot)s, NULL, NULL,
                                    'include-xids', '1', 'skip-empty-xacts', '1',
                                    'stream-changes', '1')
 WHERE xid = %(xid)s::xid;

-- name: xact_status
-- What became of the producer's transaction: committed, aborted or in progress.
SELECT pg_xact_status(%(xid)s::xid8);

-- name: subscription_probe
-- A subscription made only to read its defaults: WITH (connect = false) it connects to
-- nothing and creates no slot, and the caller rolls it back.
CREATE SUBSCRIPTION {name} CONNECTION 'dbname=labkit_none' PUBLICATION labkit_none
  WITH (connect = false);

-- name: subscription_streaming
-- Whether that subscription asks pgoutput to stream in-progress transactions
-- (pg_subscription.substream: f off, t on, p parallel; a boolean before PostgreSQL 16).
SELECT substream::text FROM pg_subscription WHERE subname = %(name)s;


-- name: drop_slot_if_there
-- Drop the slot %(slot)s if it exists and nobody uses it (a slot in use is left alone).
SELECT pg_drop_replication_slot(slot_name)
  FROM pg_replication_slots
 WHERE slot_name = %(slot)s AND NOT active;

-- name: create_failover_slot
-- PostgreSQL 17 and later: a logical slot enabled to be synced to the standbys
-- (failover => true), so that its consumer can go on reading from a promoted standby. A
-- standby copies it only if it runs sync_replication_slots = on (with primary_slot_name,
-- hot_standby_feedback = on and a dbname in primary_conninfo).
SELECT lsn::text
  FROM pg_create_logical_replication_slot(%(slot)s, 'test_decoding', failover => true);

-- name: failover_state
-- The slot as pg_replication_slots shows it: failover (this slot is to be copied to the
-- standbys) and synced (this slot IS such a copy: true only on a standby, or on a standby
-- that was promoted).
SELECT slot_name::text, failover, synced, temporary
  FROM pg_replication_slots
 WHERE slot_name = %(slot)s;

-- name: failover_settings
-- The two settings of slot synchronization: sync_replication_slots (read on a standby: copy
-- the primary's failover slots) and synchronized_standby_slots (read on the primary: the
-- standbys' physical slots that must have the WAL before a failover slot's consumer gets
-- it); and whether this server is a standby.
SELECT current_setting('sync_replication_slots'),
       current_setting('synchronized_standby_slots'),
       pg_is_in_recovery();

-- The alert exercise (labkit.tools.exercises.cdc): the checker's scene and its own measure.

-- name: alert_pin
-- A transaction that holds a transaction id (it writes a row) and stays open while a
-- consumer confirms: decoding may not move the slot's restart_lsn past its start.
INSERT INTO unrelated (pad) VALUES ('held open');

-- name: alert_create_physical
-- A physical slot, the kind a standby streams WAL through (primary_slot_name). With
-- immediately_reserve true it keeps WAL from now on, before any standby has connected.
SELECT lsn::text
  FROM pg_create_physical_replication_slot(%(slot)s, true);

-- name: alert_truth
-- The checker's own measure of each of its slots: whether a session holds it, and the WAL
-- from its restart_lsn (what it keeps) and from its confirmed_flush_lsn (how far its consumer
-- is behind) to the WAL written so far (pg_current_wal_lsn) and inserted so far
-- (pg_current_wal_insert_lsn, at or past it): a lower and an upper bound.
SELECT slot_name::text, active,
       pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint,
       pg_wal_lsn_diff(pg_current_wal_insert_lsn(), restart_lsn)::bigint,
       pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint,
       pg_wal_lsn_diff(pg_current_wal_insert_lsn(), confirmed_flush_lsn)::bigint
  FROM pg_replication_slots
 WHERE slot_name = ANY(%(slots)s);
