-- The job table every claiming lab starts from.
-- status moves PENDING -> IN_PROGRESS -> DONE; worker_id and claimed_at say who
-- claimed a job and when, so a reaper can find claims that outlived their lease.
CREATE TABLE job (
    id          bigint      PRIMARY KEY,
    status      text        NOT NULL DEFAULT 'PENDING'
                            CHECK (status IN ('PENDING', 'IN_PROGRESS', 'DONE')),
    created_at  timestamptz NOT NULL,
    worker_id   text,
    claimed_at  timestamptz,
    payload     text
);

-- The claim reads "the oldest pending jobs": index exactly that predicate.
CREATE INDEX job_pending_created_idx ON job (created_at) WHERE status = 'PENDING';
