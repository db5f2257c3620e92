-- Record one send's outcome, FENCED: the write carries the claim version the worker
-- was given and matches only while that claim is still the row's latest one.
-- 0 rows updated = another worker re-claimed the row: this worker lost its lease.
UPDATE delivery
   SET status = CASE
                    WHEN %(outcome)s::text = 'sent' THEN 'sent'
                    WHEN %(outcome)s::text = 'retry' AND attempts < %(max_attempts)s
                         THEN 'pending'
                    ELSE 'failed'
                END,
       next_attempt_at = CASE WHEN %(outcome)s::text = 'retry'
                              THEN lab_now() + drain_backoff(attempts)
                              ELSE next_attempt_at END,
       last_error = %(error)s::text,
       sent_at    = CASE WHEN %(outcome)s::text = 'sent' THEN lab_now() END,
       outcomes   = outcomes + 1,         -- attempts - outcomes: attempts with no outcome
       reported_version = claim_version   -- the claim whose outcome this is
 WHERE id = %(id)s
   AND claim_version = %(claim_version)s
