-- Leases and a dead letter on top of job_table.sql.
-- attempts counts the claims that expired (the worker died or hung);
-- DEAD is where a job goes when it has used up its attempts.
ALTER TABLE job
    ADD COLUMN attempts integer NOT NULL DEFAULT 0,
    DROP CONSTRAINT job_status_check,
    ADD CONSTRAINT job_status_check
        CHECK (status IN ('PENDING', 'IN_PROGRESS', 'DONE', 'DEAD'));

-- The reaper looks for old claims: index exactly that predicate too.
CREATE INDEX job_claimed_idx ON job (claimed_at) WHERE status = 'IN_PROGRESS';
