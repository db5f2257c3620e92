-- Deliveries whose drain died (or hung past its lease) at least twice while holding them.
-- attempts counts claims, outcomes counts outcome writes: the difference is the attempts
-- that never reported. The latest attempt is not a crash while it may still be running:
-- pending, lease not over yet, and no outcome for the latest claim (reported_version).
-- A transient error in between (last_error set) changes nothing: it was an outcome.
SELECT id, status, attempts, outcomes, last_error, crashed
  FROM (SELECT d.*,
               attempts - outcomes
               - (status = 'pending' AND next_attempt_at > lab_now()
                  AND reported_version < claim_version)::int AS crashed
          FROM delivery d) AS per_row
 WHERE crashed >= 2
 ORDER BY id;
