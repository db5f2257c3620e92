-- The drain's labs besides the drain's own claim and outcome writes (labkit.labs.drain
-- reads the sections by name): filling the ledger, the push service's record of what it
-- delivered, and what the traces read back from the ledger, pg_locks and pg_stat_activity.

-- name: fill_ledger
-- Deliveries 1..n, all due, oldest first; ids in bad, flaky or
-- poison get such a token, and every so often no coalesce key.
INSERT INTO delivery (id, notification_id, device_token, next_attempt_at, coalesce_key)
SELECT g, 1000 + g,
       CASE WHEN g = ANY(%(bad)s) THEN 'bad-' WHEN g = ANY(%(flaky)s) THEN 'flaky-'
            WHEN g = ANY(%(poison)s) THEN 'poison-' ELSE 'dev-' END || lpad(g::text, 4, '0'),
       lab_now() - make_interval(secs => %(n)s - g + 1),
       CASE WHEN g %% %(every)s = 0 THEN NULL ELSE 'notif-' || (1000 + g) END
  FROM generate_series(1, %(n)s) AS g;

-- name: record_push
-- The push service's record of one delivered push, with
-- the delivery and the claim version it was sent under.
INSERT INTO device_push (delivery_id, claim_version, device_token, notification_id, collapse_id,
                         pushed_by, pushed_at)
VALUES (%(id)s, %(claim_version)s, %(device_token)s, %(notification_id)s, %(coalesce_key)s,
        %(by)s, lab_now());

-- name: read_pushes
-- Every push the push service delivered, in the order it delivered them.
SELECT seq, delivery_id, claim_version, device_token, notification_id, collapse_id, pushed_by
  FROM device_push
 ORDER BY seq;

-- name: push_counts
-- Pushes delivered, and how many of them repeat a device's
-- notification (what the user sees of them: drain.Device).
SELECT count(*)                                                   AS pushes,
       count(*) - count(DISTINCT (device_token, notification_id)) AS duplicates
  FROM device_push;

-- name: due_count
-- Deliveries due now: pending, and the time of their next attempt has come.
SELECT count(*)
  FROM delivery
 WHERE status = 'pending' AND next_attempt_at <= lab_now();

-- name: locked_among
-- How many of the rows ids another session holds a row lock
-- on: lock the free ones, skip the others, count the skipped.
SELECT %(n)s - count(*)
  FROM (SELECT id FROM delivery WHERE id = ANY(%(ids)s) FOR UPDATE SKIP LOCKED) AS free;

-- name: sessions_state
-- The states of the backends pids, together; 'gone' when none of them is left.
SELECT coalesce(string_agg(DISTINCT state, ', '), 'gone')
  FROM pg_stat_activity
 WHERE pid = ANY(%(pids)s);

-- name: still_leased
-- Rows among ids still as their first claim left
-- them: pending, claimed once, their lease not over.
SELECT count(*)
  FROM delivery
 WHERE id = ANY(%(ids)s) AND status = 'pending'
   AND claim_version = 1 AND next_attempt_at > lab_now();

-- name: suspects
-- Suspects: pending rows with two attempts or more
-- that never reported an outcome (their drain died).
SELECT count(*)
  FROM delivery
 WHERE status = 'pending' AND attempts - outcomes >= 2;

-- name: poison_row
-- One delivery's way to the dead letter: status, attempts,
-- outcomes, the attempts that never reported, last error.
SELECT status, attempts, outcomes, attempts - outcomes AS never_reported, last_error
  FROM delivery
 WHERE id = %(id)s;

-- name: crashed_twice_guess
-- A first guess at "crashed its drain at least twice"
-- that is wrong (drain_crashed_twice.sql is right).
SELECT id
  FROM delivery
 WHERE status = 'pending' AND attempts >= 2 AND last_error IS NULL
 ORDER BY id;

-- name: state_since
-- When backend pid entered its present state, by the server's clock
-- (a frozen drain in a transaction: when it went idle in it).
SELECT state_change
  FROM pg_stat_activity
 WHERE pid = %(pid)s;

-- name: lock_granted_at
-- Wait for the row lock on one delivery, then read the
-- server's clock: the moment the lock's holder let it go.
SELECT clock_timestamp()
  FROM (SELECT id FROM delivery WHERE id = %(id)s FOR UPDATE) AS locked;
