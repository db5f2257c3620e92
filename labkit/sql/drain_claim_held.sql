-- name: claim
-- The ANTI-PATTERN: the relay's dialect applied to slow sends. This SELECT runs inside
-- a transaction that stays open while every push of the batch goes out, then the
-- outcomes are written and only then COMMIT: the row locks (and the connection)
-- are held across the network calls. {policy} is FOR UPDATE or FOR UPDATE SKIP LOCKED.
SELECT id, notification_id, device_token, coalesce_key, attempts + 1 AS attempts,
       claim_version + 1 AS claim_version
  FROM delivery
 WHERE status = 'pending'
   AND next_attempt_at <= lab_now()
 ORDER BY next_attempt_at, id
 LIMIT %(batch)s
   {policy};

-- name: count_attempt
-- After the sends, still in that transaction: count the attempt
-- as the lease claim does, so the outcomes are written alike.
UPDATE delivery
   SET attempts = attempts + 1,
       claim_version = claim_version + 1,
       next_attempt_at = lab_now() + make_interval(secs => %(lease_s)s)
 WHERE id = ANY(%(ids)s);
