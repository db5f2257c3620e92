-- How the relay's labs look at the systems (labkit.labs.relay reads the sections by
-- name): every number a trace reports is read back with one of these queries, from the
-- outbox, the inbox, the orders, pg_locks and pg_stat_activity -- never counted by the script.

-- name: relay_backends
-- The relays' server processes, and the transaction id each one holds (NULL: none).
SELECT pid, backend_xid::text
  FROM pg_stat_activity
 WHERE pid = ANY(%(pids)s);

-- name: relay_locks
-- The locks the relays' backends hold, as pg_locks lists them:
-- on the outbox table, and each one's own transaction id.
SELECT CASE WHEN l.locktype = 'relation' THEN c.relname || ' ' || l.mode
            ELSE 'own ' || l.locktype || ' ' || l.mode END
  FROM pg_locks l
  LEFT JOIN pg_class c ON c.oid = l.relation
 WHERE l.pid = ANY(%(pids)s) AND l.granted
   AND (l.locktype = 'transactionid' OR (l.locktype = 'relation' AND c.relname = 'outbox'))
 ORDER BY 1;

-- name: locked_rows
-- Outbox rows locked by a live relay transaction: a row lock
-- writes the locker's transaction id into the row's xmax.
SELECT count(*)
  FROM outbox
 WHERE xmax::text = ANY(%(xids)s);

-- name: outbox_rows
-- Outbox rows waiting to be published, and rows marked published.
SELECT count(*) FILTER (WHERE published_at IS NULL),
       count(*) FILTER (WHERE published_at IS NOT NULL)
  FROM outbox;

-- name: lost_events
-- Lost events: marked published, yet never received by the consumer.
SELECT o.event_id
  FROM outbox o
 WHERE o.published_at IS NOT NULL
   AND NOT EXISTS (SELECT 1 FROM inbox i WHERE i.event_id = o.event_id)
 ORDER BY o.event_id;

-- name: labels_printed
-- The consumer's effect: shipping labels printed in all, and orders that got more than one.
SELECT coalesce(sum(labels_printed), 0),
       count(*) FILTER (WHERE labels_printed > 1)
  FROM shop_order;

-- name: backend_state
-- One backend as the server sees it: its state, its transaction
-- id, and for how many seconds it has been in that state.
SELECT state, backend_xid::text,
       extract(epoch FROM clock_timestamp() - state_change)::float8
  FROM pg_stat_activity
 WHERE pid = %(pid)s;

-- name: freeze_bounds
-- The settings that may end a backend whose client froze
-- inside a transaction: value (0 = off), unit, server default.
SELECT name, setting, coalesce(unit, ''), boot_val
  FROM pg_settings
 WHERE name IN ('idle_in_transaction_session_timeout', 'transaction_timeout',
                'tcp_keepalives_idle', 'tcp_keepalives_interval', 'tcp_keepalives_count',
                'tcp_user_timeout', 'client_connection_check_interval')
 ORDER BY name;

-- name: arrive
-- A batch of events arrives in the outbox; the ids of its first and its last row.
WITH arrived AS (
    INSERT INTO outbox (event_id, aggregate, payload)
    SELECT 'evt-arrived-' || g, 'shop_order:' || g, jsonb_build_object('order_id', g)
      FROM generate_series(1, %(n)s) AS g
    RETURNING id
)
SELECT min(id), max(id) FROM arrived;

-- name: older_snapshots
-- Other sessions whose snapshot or transaction is as old as
-- transaction x or older: VACUUM keeps what they may still see.
SELECT pid, application_name
  FROM pg_stat_activity
 WHERE datname = current_database() AND pid <> pg_backend_pid()
   AND ((backend_xmin IS NOT NULL AND age(backend_xmin) >= age(%(x)s::xid))
     OR (backend_xid IS NOT NULL AND age(backend_xid) >= age(%(x)s::xid)));

-- name: state_since
-- When backend pid entered its present state, by the server's clock
-- (for a frozen relay: when it went idle in its transaction).
SELECT state_change
  FROM pg_stat_activity
 WHERE pid = %(pid)s;

-- name: lock_granted_at
-- Wait for the row lock on one outbox row, then read the
-- server's clock: the moment the lock's holder let it go.
SELECT clock_timestamp()
  FROM (SELECT id FROM outbox WHERE id = %(id)s FOR UPDATE) AS locked;
