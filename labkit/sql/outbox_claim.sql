-- The relay's claim: the oldest unpublished rows, locked, skipping rows that another
-- relay has locked. The locks ARE the claim: they last until this transaction ends,
-- and the relay publishes every row before it ends it (see outbox_mark.sql).
--   crash before COMMIT -> once the server learns the connection is gone (a process
--                          killed on a live host closes its socket at once), it rolls
--                          back: nothing marked, locks gone, the next tick claims the
--                          same rows again;
--   frozen before COMMIT -> (host freeze, paused VM, network partition) the server sees
--                          an open session "idle in transaction" and keeps the locks
--                          until something ends that session: idle_in_transaction_
--                          session_timeout, TCP keepalives, or the relay coming back;
--   two relays at once  -> the second one skips the first one's rows: disjoint batches.
SELECT id, event_id, payload
  FROM outbox
 WHERE published_at IS NULL          -- the partial index's predicate
 ORDER BY created_at, id             -- the partial index's order
 LIMIT %(batch)s
   FOR UPDATE SKIP LOCKED;
