-- Keeping the outbox small (labkit.labs.outbox_size). Every event the relay publishes
-- stays in the outbox as a published row. The relay's claim never reads those rows (its
-- partial index holds only unpublished ones), but the table, its other indexes and
-- VACUUM's passes over them grow with the history. Two ways to shed it: delete old
-- published rows in small batches, or keep the outbox in time partitions and drop
-- whole old partitions.

-- name: history
-- %(n)s published events, ids from %(first)s on, created %(step_s)s seconds apart from
-- %(start)s and published the moment they were created (the lab's shortcut for a
-- history the relay has worked through). Being already published, they get no entry
-- in the partial index.
INSERT INTO outbox (event_id, aggregate, payload, created_at, published_at)
SELECT 'evt-h-' || g, 'shop_order:' || g,
       jsonb_build_object('type', 'order_placed', 'order_id', g, 'item', 'mug'), t, t
  FROM generate_series(%(first)s::bigint, %(first)s::bigint + %(n)s - 1) AS g,
       LATERAL (SELECT %(start)s::timestamptz
                       + (g - %(first)s) * %(step_s)s * interval '1 second') AS at(t);

-- name: arrive
-- %(n)s new events, not yet published, created now (ids from %(first)s on).
INSERT INTO outbox (event_id, aggregate, payload)
SELECT 'evt-new-' || g, 'shop_order:' || g,
       jsonb_build_object('type', 'order_placed', 'order_id', g, 'item', 'lamp')
  FROM generate_series(%(first)s::bigint, %(first)s::bigint + %(n)s - 1) AS g;

-- name: sizes
-- The outbox on disk: its table (heap), its indexes, the partial index alone, all
-- together; summed over the partitions when it is partitioned.
WITH leaves AS (
    SELECT c.oid AS relid FROM pg_class c WHERE c.oid = 'outbox'::regclass AND c.relkind = 'r'
    UNION ALL
    SELECT t.relid FROM pg_partition_tree('outbox') AS t WHERE t.isleaf
)
SELECT coalesce(sum(pg_relation_size(l.relid)), 0)::bigint        AS table_bytes,
       coalesce(sum(pg_indexes_size(l.relid)), 0)::bigint         AS index_bytes,
       coalesce(sum(p.bytes), 0)::bigint                          AS partial_index_bytes,
       coalesce(sum(pg_total_relation_size(l.relid)), 0)::bigint  AS total_bytes
  FROM leaves AS l
 CROSS JOIN LATERAL (SELECT coalesce(sum(pg_relation_size(i.indexrelid)), 0) AS bytes
                       FROM pg_index i
                      WHERE i.indrelid = l.relid AND i.indpred IS NOT NULL) AS p;

-- name: now_xid
-- The first transaction id not yet given out: every transaction and snapshot that began
-- before now is older than it. Read without taking a transaction id.
SELECT pg_snapshot_xmax(pg_current_snapshot())::text;

-- name: older_snapshots
-- What keeps VACUUM from removing the row versions that died before transaction %(x)s:
-- other sessions of this database whose snapshot or transaction began before it; and, in
-- any database, a transaction id older than it (a session's, or a prepared transaction's)
-- or a replication slot's xmin -- a snapshot taken here meanwhile counts such a
-- transaction as running, and so keeps what it may see.
SELECT pid, application_name
  FROM pg_stat_activity
 WHERE pid <> pg_backend_pid()
   AND ((datname = current_database() AND age(backend_xmin) > age(xid(%(x)s::xid8)))
        OR age(backend_xid) > age(xid(%(x)s::xid8)))
UNION ALL
SELECT NULL, 'prepared transaction ' || gid
  FROM pg_prepared_xacts
 WHERE age(transaction) > age(xid(%(x)s::xid8))
UNION ALL
SELECT active_pid, 'replication slot ' || slot_name
  FROM pg_replication_slots
 WHERE age(xmin) > age(xid(%(x)s::xid8));

-- name: visible_pages
-- The outbox's pages, and how many of them the visibility map marks all-visible (as the
-- last VACUUM left them; summed over the partitions): VACUUM skips those pages.
SELECT coalesce(sum(c.relpages), 0)::bigint, coalesce(sum(c.relallvisible), 0)::bigint
  FROM pg_class c
 WHERE c.oid = 'outbox'::regclass AND c.relkind = 'r'
    OR c.oid IN (SELECT relid FROM pg_partition_tree('outbox') WHERE isleaf);

-- name: autovacuum_after
-- How many dead row versions the outbox collects before autovacuum vacuums it:
-- autovacuum_vacuum_threshold + autovacuum_vacuum_scale_factor x the table's rows
-- (pg_class.reltuples, as the last VACUUM or ANALYZE counted them). Every event the
-- relay marks leaves one dead version, and one dead entry in the partial index.
-- (PostgreSQL 18 caps it at autovacuum_vacuum_max_threshold, 100 million by default.)
SELECT (current_setting('autovacuum_vacuum_threshold')::float8
        + current_setting('autovacuum_vacuum_scale_factor')::float8
          * greatest(reltuples, 0))::bigint
  FROM pg_class
 WHERE oid = 'outbox'::regclass;

-- name: cleanup_batch
-- Way out A, one batch: delete up to %(n)s published rows older than %(older_than)s
-- (now() - the retention, 7 days say), oldest first. SKIP LOCKED: a row another session
-- holds locked -- an overlapping run of the same cleanup, say -- is left for the next
-- batch instead of waited for. Run it in a loop until it deletes nothing; each batch is
-- a short transaction of its own.
DELETE FROM outbox
 WHERE id IN (SELECT id
                FROM outbox
               WHERE published_at < %(older_than)s
               ORDER BY id
               LIMIT %(n)s
                 FOR UPDATE SKIP LOCKED);

-- name: cleanup_batch_waiting
-- The same batch without SKIP LOCKED: it waits for every row of its batch that another
-- session holds locked, and while it waits it holds the rows it has already locked.
DELETE FROM outbox
 WHERE id IN (SELECT id
                FROM outbox
               WHERE published_at < %(older_than)s
               ORDER BY id
               LIMIT %(n)s
                 FOR UPDATE);

-- name: partitioned_outbox
-- Way out B: the same outbox, partitioned by created_at (one partition an hour in the
-- lab; a day or a week in production). A primary key or unique constraint on a
-- partitioned table must include the partition key: PRIMARY KEY (id, created_at). A
-- UNIQUE (event_id) is refused, and UNIQUE (event_id, created_at) would not stop the
-- same event written twice at two instants. So event_id's uniqueness lives elsewhere:
-- the producer writes one event per business row in that row's transaction (its
-- primary key makes it once), and the consumer's inbox deduplicates whatever arrives
-- twice. The relay's claim and the lag query are unchanged; the partial index is
-- created on every partition.
CREATE TABLE outbox (
    id            bigserial   NOT NULL,
    event_id      text        NOT NULL,
    aggregate     text        NOT NULL,
    payload       jsonb       NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    published_at  timestamptz,
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);
CREATE INDEX outbox_unpublished_idx ON outbox (created_at, id) WHERE published_at IS NULL;

-- name: unique_event_id
-- The constraint the plain outbox has, asked of the partitioned one: the server refuses it.
ALTER TABLE outbox ADD CONSTRAINT outbox_event_id_key UNIQUE (event_id);

-- name: partition
-- One partition: the events created in [{start}, {stop}). A job creates the next ones
-- ahead of time: an event with no partition for its created_at fails to insert, and
-- with it the producer's business transaction. (A DEFAULT partition would catch such
-- rows, but DETACH ... CONCURRENTLY refuses a table that has one: see default_partition.)
CREATE TABLE {partition} PARTITION OF outbox
    FOR VALUES FROM ({start}) TO ({stop})
    WITH (autovacuum_enabled = off);

-- name: detach
-- Take an old partition out of the outbox while the relays claim (PostgreSQL 14 and
-- later; it cannot run inside a transaction block).
ALTER TABLE outbox DETACH PARTITION {partition} CONCURRENTLY;

-- name: unpublished_in
-- The check before the drop: a detached partition that still holds an unpublished event
-- must not be dropped (that event would be lost). Re-attach it, or publish it first.
SELECT count(*) FROM {partition} WHERE published_at IS NULL;

-- name: drop
-- The drop itself, of the detached table, once the check found nothing unpublished.
DROP TABLE {partition};

-- name: wal_position
-- Where the server's write-ahead log is now: the difference of two readings is the WAL
-- written in between (by every session of the server, not only this one).
SELECT pg_current_wal_lsn()::text;

-- name: wal_bytes
-- Bytes of WAL between two readings of wal_position.
SELECT pg_wal_lsn_diff(%(after)s::pg_lsn, %(before)s::pg_lsn)::bigint;

-- name: flush_own_stats
-- Have this session's pending statistics (its WAL counts among them) flushed as soon as
-- this statement's transaction ends, so that own_wal_bytes, next, includes everything it
-- has run so far (PostgreSQL 15 and later).
SELECT pg_stat_force_next_flush();

-- name: own_wal_bytes
-- The bytes of WAL this session has written since it began (PostgreSQL 18 and later): the
-- difference of two readings is this session's own WAL, whatever other sessions write.
SELECT wal_bytes FROM pg_stat_get_backend_wal(pg_backend_pid());

-- name: own_locks
-- The table and index locks this session holds on the outbox and its partitions.
SELECT c.relname, c.relkind::text, l.mode
  FROM pg_locks l
  JOIN pg_class c ON c.oid = l.relation
 WHERE l.pid = pg_backend_pid() AND l.locktype = 'relation' AND l.granted
   AND left(c.relname, 6) = 'outbox'
 ORDER BY c.relname, l.mode;

-- name: outbox_relations
-- The outbox's tables and indexes in this schema (the partitioned table, its partitions,
-- their indexes), by oid: a relation dropped in this transaction is no longer in pg_class
-- for it, but its lock is still in pg_locks under that oid.
SELECT c.oid::bigint, c.relname, c.relkind::text
  FROM pg_class c
 WHERE c.relnamespace = current_schema()::regnamespace AND left(c.relname, 6) = 'outbox';

-- name: default_partition
-- A DEFAULT partition: it takes every row no other partition's bounds take.
CREATE TABLE {partition} PARTITION OF outbox DEFAULT;

-- name: detach_pending
-- Whether a partition is marked as being detached (the first of DETACH ... CONCURRENTLY's
-- two transactions has committed, the second has not).
SELECT i.inhdetachpending FROM pg_inherits i WHERE i.inhrelid = %(partition)s::regclass;

-- name: table_locks_of
-- The table and index locks a session holds or waits for on the outbox and its partitions
-- (read from another session): name, mode, granted.
SELECT c.relname, l.mode, l.granted
  FROM pg_locks l
  JOIN pg_class c ON c.oid = l.relation
 WHERE l.pid = %(pid)s AND l.locktype = 'relation'
   AND c.relnamespace = current_schema()::regnamespace AND left(c.relname, 6) = 'outbox'
 ORDER BY c.relname, l.mode;

-- name: waits_for
-- What a session waits for, if anything, and whose: the lock it has asked for and not yet
-- been granted (a transaction's own virtualxid lock is how one waits for it to end).
SELECT l.locktype, l.mode, pg_blocking_pids(l.pid)
  FROM pg_locks l
 WHERE l.pid = %(pid)s AND NOT l.granted;

-- name: own_locks_on
-- The locks this session holds on the relations with these oids.
SELECT l.relation::bigint, l.mode
  FROM pg_locks l
 WHERE l.pid = pg_backend_pid() AND l.locktype = 'relation' AND l.granted
   AND l.relation::bigint = ANY(%(oids)s);
