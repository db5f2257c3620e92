-- The drain's claim: ONE statement, committed on its own.
-- The subselect picks up to %(batch)s due rows and locks them, skipping rows another
-- drain is claiming at this very moment; the UPDATE grants the lease on them.
-- attempts - outcomes counts a row's attempts that never reported an outcome: its drain
-- died or hung holding it. A row with two of them is a suspect (maybe a poison row that
-- kills whichever drain sends it): a claim takes at most one suspect, and the drain sends
-- it last, after the rest of its batch is recorded.
-- A due row whose %(max_attempts)s attempts are used up got there without an outcome (an
-- outcome write ends a row at the limit). The claim tries it no more: it dead-letters
-- the row (status 'failed', last_error says why) and does not hand it to the sender.
-- When the statement commits, the row locks are gone: the claim is now a time,
-- next_attempt_at, not a lock. Nothing is held while the pushes go out.
WITH claimed AS (
  UPDATE delivery
     SET attempts        = CASE WHEN attempts < %(max_attempts)s
                                THEN attempts + 1 ELSE attempts END,    -- once per attempt
         status          = CASE WHEN attempts < %(max_attempts)s
                                THEN 'pending' ELSE 'failed' END,       -- the dead letter
         last_error      = CASE WHEN attempts < %(max_attempts)s THEN last_error
                                ELSE 'abandoned after ' || attempts || ' attempts, '
                                     || (attempts - outcomes) || ' of them without an outcome'
                           END,
         next_attempt_at = lab_now() + make_interval(secs => %(lease_s)s), -- the lease (120 s)
         claim_version   = claim_version + 1                               -- the fencing token
   WHERE id IN (
          SELECT id FROM (SELECT id                     -- at most one suspect, first
                            FROM delivery
                           WHERE status = 'pending'             -- terminal rows are never due
                             AND next_attempt_at <= lab_now()   -- due, or a lease that ran out
                             AND attempts - outcomes >= 2
                           ORDER BY next_attempt_at, id
                           LIMIT 1
                             FOR UPDATE SKIP LOCKED) AS suspect
          UNION ALL
          SELECT id FROM (SELECT id                     -- then the rest of the batch
                            FROM delivery
                           WHERE status = 'pending'
                             AND next_attempt_at <= lab_now()
                             AND attempts - outcomes < 2
                           ORDER BY next_attempt_at, id
                           LIMIT %(batch)s
                             FOR UPDATE SKIP LOCKED) AS rest
           LIMIT %(batch)s)
  RETURNING id, notification_id, device_token, coalesce_key, attempts, claim_version,
            attempts - 1 - outcomes >= 2 AS suspect, status)
SELECT id, notification_id, device_token, coalesce_key, attempts, claim_version, suspect
  FROM claimed
 WHERE status = 'pending';                           -- dead-lettered rows are not sent
