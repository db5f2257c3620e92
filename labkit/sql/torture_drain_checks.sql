-- The counts `labkit torture drain` checks its invariants with, read from the ledger
-- (delivery), the pushes devices received (device_push) and the audit of every write to
-- the ledger (torture_audit, see torture.sql: drain_audit). Every query returns one number.

-- name: deliveries
-- Every delivery in the ledger.
SELECT count(*) FROM delivery;

-- name: pending
-- Deliveries not yet sent or failed.
SELECT count(*) FROM delivery WHERE status = 'pending';

-- name: sent_never_pushed
-- A delivery the ledger calls sent that no device ever received: a lost push.
SELECT count(*)
  FROM delivery d
 WHERE d.status = 'sent'
   AND NOT EXISTS (SELECT 1 FROM device_push p WHERE p.delivery_id = d.id);

-- name: good_token_failed
-- A good token that ended failed: given up on.
SELECT count(*)
  FROM delivery
 WHERE status = 'failed'
   AND device_token NOT LIKE 'bad-%%' AND device_token NOT LIKE 'poison-%%';

-- name: poison_rows
-- The poison rows (sending one kills the drain process).
SELECT count(*) FROM delivery WHERE device_token LIKE 'poison-%%';

-- name: poison_dead_lettered
-- Poison rows dead-lettered by the claim: failed, attempts used up, none of them reported.
SELECT count(*)
  FROM delivery
 WHERE device_token LIKE 'poison-%%' AND status = 'failed'
   AND attempts = %(max)s AND outcomes = 0 AND last_error LIKE 'abandoned after %%';

-- name: poison_pushed
-- Pushes of a poison row.
SELECT count(*) FROM device_push WHERE device_token LIKE 'poison-%%';

-- name: bad_token_pushed
-- Pushes to a dead token.
SELECT count(*) FROM device_push WHERE device_token LIKE 'bad-%%';

-- name: terminal_overwritten
-- A terminal status written over by a later write (a clobber).
SELECT count(*)
  FROM torture_audit
 WHERE old_status IN ('sent', 'failed') AND new_status <> old_status;

-- name: pushes_after_terminal
-- Pushes made by the claims of a delivery after it first became terminal.
WITH first_terminal AS (
    SELECT delivery_id, min(seq) AS seq
      FROM torture_audit
     WHERE new_status IN ('sent', 'failed')
     GROUP BY delivery_id
), late AS (
    SELECT DISTINCT a.delivery_id, a.worker
      FROM torture_audit a
      JOIN first_terminal f USING (delivery_id)
     WHERE a.op = 'claim' AND a.seq > f.seq
)
SELECT count(*)
  FROM device_push p
  JOIN late l ON l.delivery_id = p.delivery_id AND l.worker = p.pushed_by;

-- name: claims_after_terminal
-- Claims of a delivery after it first became terminal.
WITH first_terminal AS (
    SELECT delivery_id, min(seq) AS seq
      FROM torture_audit
     WHERE new_status IN ('sent', 'failed')
     GROUP BY delivery_id
)
SELECT count(*)
  FROM torture_audit a
  JOIN first_terminal f USING (delivery_id)
 WHERE a.op = 'claim' AND a.seq > f.seq;

-- name: stale_writes
-- A completion that landed although another worker had claimed the row since: the
-- claim it completes (its old version) was not the writer's own.
SELECT count(*) FROM torture_audit c
          LEFT JOIN torture_audit k
            ON k.op = 'claim' AND k.delivery_id = c.delivery_id
           AND k.new_version = c.old_version
         WHERE c.op = 'complete' AND k.worker IS DISTINCT FROM c.worker;

-- name: duplicate_pushes
-- Pushes beyond the first of each delivery.
SELECT coalesce(sum(n - 1), 0)
  FROM (SELECT delivery_id, count(*) AS n FROM device_push GROUP BY delivery_id) AS per;
