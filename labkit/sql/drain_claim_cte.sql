-- The same claim in the CTE form most queue libraries use: a locking CTE is
-- never inlined by PostgreSQL, so it runs exactly once, and the UPDATE joins to it.
-- (At most one suspect per claim, and the dead letter, as in drain_claim.sql.)
WITH due AS (
    SELECT id FROM (SELECT id FROM delivery
                     WHERE status = 'pending' AND next_attempt_at <= lab_now()
                       AND attempts - outcomes >= 2
                     ORDER BY next_attempt_at, id
                     LIMIT 1
                       FOR UPDATE SKIP LOCKED) AS suspect
    UNION ALL
    SELECT id FROM (SELECT id FROM delivery
                     WHERE status = 'pending' AND next_attempt_at <= lab_now()
                       AND attempts - outcomes < 2
                     ORDER BY next_attempt_at, id
                     LIMIT %(batch)s
                       FOR UPDATE SKIP LOCKED) AS rest
     LIMIT %(batch)s
), claimed AS (
    UPDATE delivery AS d
       SET attempts        = CASE WHEN d.attempts < %(max_attempts)s
                                  THEN d.attempts + 1 ELSE d.attempts END,
           status          = CASE WHEN d.attempts < %(max_attempts)s
                                  THEN 'pending' ELSE 'failed' END,
           last_error      = CASE WHEN d.attempts < %(max_attempts)s THEN d.last_error
                                  ELSE 'abandoned after ' || d.attempts || ' attempts, '
                                       || (d.attempts - d.outcomes)
                                       || ' of them without an outcome'
                             END,
           next_attempt_at = lab_now() + make_interval(secs => %(lease_s)s),
           claim_version   = d.claim_version + 1
      FROM due
     WHERE d.id = due.id
    RETURNING d.id, d.notification_id, d.device_token, d.coalesce_key, d.attempts,
              d.claim_version, d.attempts - 1 - d.outcomes >= 2 AS suspect, d.status)
SELECT id, notification_id, device_token, coalesce_key, attempts, claim_version, suspect
  FROM claimed
 WHERE status = 'pending';
