-- A broker that stops answering, and the relay's transaction that must end anyway
-- (labkit.labs.hang reads the sections by name). The relay's own bounds are client-side:
-- a publish timeout and a deadline for the whole tick, after which it rolls back. The
-- queries below are the server-side backstop that ends the transaction if the relay
-- itself cannot, the recording broker's scripted hang, and what the lab reads meanwhile.

-- name: backstop
-- The bounded relay's server-side backstop, for this transaction only (set_config(..., true)
-- is SET LOCAL): a statement that runs longer than %(ms)s is cancelled (the transaction can
-- then only roll back), and a transaction that sits idle between statements longer than
-- %(ms)s has its session ended by the server, and its row locks with it.
SELECT set_config('statement_timeout', %(ms)s, true),
       set_config('idle_in_transaction_session_timeout', %(ms)s, true);

-- name: backstop_whole
-- PostgreSQL 17 and later: a bound on the transaction as a whole, statements and idle gaps
-- together (transaction_timeout; set inside the transaction, it counts from here). Past it,
-- the server ends the session, and its row locks with it.
SELECT set_config('transaction_timeout', %(ms)s, true);

-- name: backstop_in_force
-- The bounds the server applies to this transaction, read
-- back ('0' = off; NULL: the server has no such setting).
SELECT current_setting('statement_timeout'),
       current_setting('idle_in_transaction_session_timeout'),
       current_setting('transaction_timeout', true);

-- name: hang
-- The recording broker hangs (scripted): the lab takes the lock that the
-- broker's confirm waits for, and holds it as long as the hang lasts.
SELECT pg_advisory_lock(%(key)s);

-- name: answer
-- The recording broker answers again: the lab lets the lock go; every waiting confirm returns.
SELECT pg_advisory_unlock(%(key)s);

-- name: confirm_within
-- How long the recording broker's confirm may wait, for its transaction only: the relay's
-- publish timeout (as the broker session's statement_timeout), with no separate lock_timeout.
SELECT set_config('statement_timeout', %(ms)s, true),
       set_config('lock_timeout', '0', true);

-- name: confirm
-- The recording broker's confirm, sent after it has stored a message:
-- returns at once while the broker is healthy, and waits while the
-- lab holds the hang lock. The message is stored either way.
SELECT pg_advisory_xact_lock_shared(%(key)s);

-- name: hang_locks
-- Sessions holding or waiting for the lab's hang lock (nothing once the lab has ended): a
-- bigint key's high half is classid, its low half objid.
SELECT count(*)
  FROM pg_locks
 WHERE locktype = 'advisory' AND objsubid = 1
   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND classid::bigint = (%(key)s::bigint >> 32)
   AND objid::bigint = (%(key)s::bigint & 4294967295);

-- name: relay_transactions
-- Each relay backend as the server sees it: its state, how long its transaction
-- has been open (NULL: none open), and how many outbox rows that transaction holds
-- locked (a row lock writes the locker's transaction id into the row's xmax).
SELECT a.pid,
       a.state,
       extract(epoch FROM clock_timestamp() - a.xact_start)::float8,
       (SELECT count(*) FROM outbox o
         WHERE a.backend_xid IS NOT NULL AND o.xmax::text = a.backend_xid::text)
  FROM pg_stat_activity a
 WHERE a.pid = ANY(%(pids)s);
