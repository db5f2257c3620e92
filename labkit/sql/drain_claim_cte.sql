-- The same claim in the CTE form most queue libraries use: a locking CTE is
-- never inlined by PostgreSQL, so it runs exactly once, and the UPDATE joins to it.
WITH due AS (
    SELECT id
      FROM delivery
     WHERE status = 'pending'
       AND next_attempt_at <= lab_now()
     ORDER BY next_attempt_at, id
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED
)
UPDATE delivery AS d
   SET attempts        = d.attempts + 1,
       next_attempt_at = lab_now() + make_interval(secs => %(lease_s)s),
       claim_version   = d.claim_version + 1
  FROM due
 WHERE d.id = due.id
RETURNING d.id, d.notification_id, d.device_token, d.coalesce_key, d.attempts, d.claim_version;
