-- What a claiming worker (labkit.labs.claims.worker_main) sends besides the claim
-- itself (claim_skip_locked.sql, claim_hold_open.sql, claim_per_key.sql) and
-- finish_jobs.sql.

-- name: finish_held
-- The held-open worker's only write, after its jobs ran; its COMMIT then frees the rows.
UPDATE job
   SET status = 'DONE', worker_id = %(worker_id)s, claimed_at = now()
 WHERE id = ANY(%(ids)s);

-- name: effect_log
-- A job's plain side effect: every run appends a row (not idempotent).
INSERT INTO effect_log (job_id, worker_id)
VALUES (%(job_id)s, %(worker_id)s);

-- name: effect_once
-- A job's idempotent side effect: the job id is the key, so a rerun is absorbed.
INSERT INTO effect_once (job_id, worker_id)
VALUES (%(job_id)s, %(worker_id)s)
    ON CONFLICT (job_id) DO NOTHING;
