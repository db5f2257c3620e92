-- Relays that keep their place in the outbox with a cursor instead of a published flag
-- (labkit.labs.cursor reads the sections by name). The outbox is the one of
-- outbox_tables.sql; `tables` adds what the cursor relays need.

-- name: tables
-- Each outbox row's writer transaction, one cursor per relay, an unrelated
-- table, and the broker's stand-in: what each relay published, in order.
ALTER TABLE outbox
    ADD COLUMN xid xid8 NOT NULL DEFAULT pg_current_xact_id();  -- the writer's top-level xid
CREATE INDEX outbox_xid_idx ON outbox (xid, id);                -- the safe cursor's read order

CREATE TABLE relay_cursor (
    relay     text   PRIMARY KEY,
    last_xid  xid8   NOT NULL DEFAULT '0',    -- the safe cursor: (last_xid, last_id)
    last_id   bigint NOT NULL DEFAULT 0       -- the id cursors: last_id alone
);
INSERT INTO relay_cursor (relay) VALUES ('cursor'), ('safe'), ('bounded');

-- A scripted session sends only SQL: the broker is a table here, one row per message sent.
CREATE TABLE published (
    seq        bigserial PRIMARY KEY,         -- the order the broker received them in
    relay      text      NOT NULL,
    outbox_id  bigint    NOT NULL,
    event_id   text      NOT NULL
);

-- Work that has nothing to do with the outbox (a batch job's log).
CREATE TABLE batch_log (
    id    bigserial PRIMARY KEY,
    note  text      NOT NULL
);

-- name: placed
-- After the producer's two INSERTs (outbox_produce.sql), in the
-- same transaction: the id the sequence gave its outbox row.
SELECT id, event_id
  FROM outbox
 WHERE event_id = %(event_id)s;

-- name: cursor_read
-- The high-water-mark relay's read: every row past its cursor, in id order.
SELECT id, event_id
  FROM outbox
 WHERE id > (SELECT last_id FROM relay_cursor WHERE relay = 'cursor')
 ORDER BY id
 LIMIT %(batch)s;

-- name: cursor_advance
-- The high-water-mark relay, after publishing: every
-- id up to the last one it read counts as published.
UPDATE relay_cursor
   SET last_id = %(id)s
 WHERE relay = 'cursor';

-- name: cursor_position
-- Where a relay's cursor stands: the last id it has passed.
SELECT last_id
  FROM relay_cursor
 WHERE relay = %(relay)s;

-- name: safe_read
-- The transaction-id cursor's read: rows whose writer is older than the oldest open writer
-- (the oldest running transaction that has an xid), past the cursor, in (xid, id) order.
SELECT o.id, o.event_id
  FROM outbox o, relay_cursor c
 WHERE c.relay = 'safe'
   AND o.xid < pg_snapshot_xmin(pg_current_snapshot())   -- every writer below it has ended
   AND (o.xid, o.id) > (c.last_xid, c.last_id)
 ORDER BY o.xid, o.id
 LIMIT %(batch)s;

-- name: safe_advance
-- The transaction-id cursor, after publishing: (xid, id) of the last row it read.
UPDATE relay_cursor c
   SET last_xid = o.xid, last_id = o.id
  FROM outbox o
 WHERE c.relay = 'safe' AND o.id = %(id)s;

-- name: bounded_read
-- The bound with the id alone as the cursor: rows whose writer
-- is older than the oldest open writer, past the last id, in id order.
SELECT id, event_id
  FROM outbox
 WHERE xid < pg_snapshot_xmin(pg_current_snapshot())
   AND id > (SELECT last_id FROM relay_cursor WHERE relay = 'bounded')
 ORDER BY id
 LIMIT %(batch)s;

-- name: bounded_advance
-- The bounded id cursor, after publishing: the last id it read.
UPDATE relay_cursor
   SET last_id = %(id)s
 WHERE relay = 'bounded';

-- name: publish
-- The broker's stand-in: the relay sends the rows it read, in the order it read them.
INSERT INTO published (relay, outbox_id, event_id)
SELECT %(relay)s, id, event_id
  FROM outbox
 WHERE id = ANY(%(ids)s::bigint[])
 ORDER BY array_position(%(ids)s::bigint[], id);

-- name: oldest_writer
-- Who is the oldest open writer (its xid is
-- pg_snapshot_xmin): the role in its application_name.
SELECT split_part(application_name, ':', 3) AS writer
  FROM pg_stat_activity
 WHERE backend_xid = pg_snapshot_xmin(pg_current_snapshot())::xid;

-- name: unpublished
-- Committed outbox rows a relay has not published.
SELECT o.id
  FROM outbox o
 WHERE NOT EXISTS (SELECT 1 FROM published p
                    WHERE p.relay = %(relay)s AND p.outbox_id = o.id)
 ORDER BY o.id;

-- name: published_order
-- What a relay published, in the order the broker received it.
SELECT outbox_id
  FROM published
 WHERE relay = %(relay)s
 ORDER BY seq;

-- name: oldest_unpublished
-- The writer transaction id of the oldest committed row a relay has not published.
SELECT o.xid::text
  FROM outbox o
 WHERE NOT EXISTS (SELECT 1 FROM published p
                    WHERE p.relay = %(relay)s AND p.outbox_id = o.id)
 ORDER BY o.xid
 LIMIT 1;

-- name: newest_xid
-- The writer transaction id of the newest committed outbox row.
SELECT xid::text
  FROM outbox
 ORDER BY xid DESC
 LIMIT 1;

-- name: older_writers
-- Other sessions (not this one, none of the pids in mine), of any database on
-- the server, whose transaction has an id as old as x or older, and prepared
-- transactions: the safe cursor reads nothing they may still commit after.
SELECT pid::text, coalesce(datname, ''), coalesce(application_name, '')
  FROM pg_stat_activity
 WHERE pid <> pg_backend_pid()
   AND pid <> ALL(%(mine)s::int[])
   AND backend_xid IS NOT NULL
   AND age(backend_xid) >= age(%(x)s::xid8::xid)
UNION ALL
SELECT 'prepared', database, gid
  FROM pg_prepared_xacts
 WHERE age(transaction) >= age(%(x)s::xid8::xid);
