-- The drain's claim: ONE statement, committed on its own.
-- The subselect picks up to %(batch)s due rows and locks them, skipping rows another
-- drain is claiming at this very moment; the UPDATE grants the lease on them.
-- When the statement commits, the row locks are gone: the claim is now a time,
-- next_attempt_at, not a lock. Nothing is held while the pushes go out.
UPDATE delivery
   SET attempts        = attempts + 1,                                   -- counted once per attempt
       next_attempt_at = lab_now() + make_interval(secs => %(lease_s)s), -- the lease (120 s)
       claim_version   = claim_version + 1                               -- the fencing token
 WHERE id IN (
        SELECT id
          FROM delivery
         WHERE status = 'pending'                -- terminal rows are never due
           AND next_attempt_at <= lab_now()      -- due, or a lease that ran out
         ORDER BY next_attempt_at, id
         LIMIT %(batch)s
           FOR UPDATE SKIP LOCKED)
RETURNING id, notification_id, device_token, coalesce_key, attempts, claim_version;
