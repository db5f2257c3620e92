-- The job table partitioned by time. created_at never changes, so a status
-- update stays inside its partition: a waiting FOR UPDATE re-checks the row as on
-- a plain table. A month whose jobs are all finished is detached or dropped at
-- once, with no DELETE, no dead rows and no VACUUM.
CREATE TABLE job (
    id          bigint      NOT NULL,
    status      text        NOT NULL DEFAULT 'PENDING'
                            CHECK (status IN ('PENDING', 'IN_PROGRESS', 'DONE')),
    created_at  timestamptz NOT NULL,
    worker_id   text,
    claimed_at  timestamptz,
    payload     text,
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);

CREATE TABLE job_2026_01 PARTITION OF job
    FOR VALUES FROM ('2026-01-01 00:00+00') TO ('2026-02-01 00:00+00');
CREATE TABLE job_2026_02 PARTITION OF job
    FOR VALUES FROM ('2026-02-01 00:00+00') TO ('2026-03-01 00:00+00');

-- The same partial index, created on every partition.
CREATE INDEX job_pending_created_idx ON job (created_at) WHERE status = 'PENDING';
