-- The consumer side of the outbox, four ways (labkit.labs.inbox reads the sections by name).
-- Every consumer handles a message with the same two writes -- record its event id in the
-- inbox, apply its effect -- and the consumers differ only in where their COMMITs fall:
--   in memory       effect, COMMIT; then the id goes into a Python set (gone with the process)
--   inbox           BEGIN; record; effect; COMMIT                  (one transaction)
--   effect first    recorded?; effect, COMMIT; record, COMMIT      (two transactions)
--   record first    record, COMMIT; effect, COMMIT                 (two transactions)
-- The tables are the outbox lab's (outbox_tables.sql): shop_order, outbox, inbox.

-- name: record
-- Record the event id in the inbox: a row comes back
-- the first time only (a copy hits the primary key).
INSERT INTO inbox (event_id) VALUES (%(event_id)s)
ON CONFLICT (event_id) DO NOTHING
RETURNING event_id;

-- name: effect
-- The effect the event is for: print one more shipping label for its order.
UPDATE shop_order
   SET labels_printed = labels_printed + 1
 WHERE id = %(order_id)s;

-- name: recorded
-- Is the event id in the inbox already? (The effect-first consumer asks before its effect.)
SELECT EXISTS (SELECT 1 FROM inbox WHERE event_id = %(event_id)s);

-- name: fresh
-- Every consumer starts from the same state: no label printed, an empty inbox.
UPDATE shop_order SET labels_printed = 0;
TRUNCATE inbox;

-- name: at_kill
-- What another session sees of one event while its
-- consumer is stopped: effect committed? id recorded?
SELECT s.labels_printed > 0,
       EXISTS (SELECT 1 FROM inbox i WHERE i.event_id = %(event_id)s)
  FROM shop_order s
 WHERE s.id = %(order_id)s;

-- name: effects
-- Effects per event, read back after the run: the labels printed for each event's order.
SELECT o.event_id, s.labels_printed
  FROM outbox o
  JOIN shop_order s ON s.id = (o.payload ->> 'order_id')::bigint
 ORDER BY o.event_id;

-- name: primary_key
-- The inbox's deduplication is its primary key: the
-- index's name, access method, uniqueness and column.
SELECT c.relname, am.amname, i.indisunique, pg_get_indexdef(i.indexrelid, 1, true)
  FROM pg_index i
  JOIN pg_class c ON c.oid = i.indexrelid
  JOIN pg_am am ON am.oid = c.relam
 WHERE i.indrelid = 'inbox'::regclass AND i.indisprimary;

-- name: own_xid
-- This session's transaction id, or NULL while its
-- transaction has written nothing (none assigned yet).
SELECT pg_current_xact_id_if_assigned()::text;

-- name: server_clock
-- The server's clock now (a cutoff for pruning).
SELECT clock_timestamp();

-- name: prune
-- Pruning: forget the event ids applied before a cutoff. In production the cutoff is
-- now() - <window>, deleted in small batches; the window must be longer than the longest
-- delay after which a copy of an event can still arrive (the relay's redelivery, a broker's
-- requeue, a replay): a copy of a pruned event is applied again.
DELETE FROM inbox WHERE applied_at < %(cutoff)s;
