-- A tempting layout that backfires: the job table partitioned by status.
-- Every claim and every completion changes status, so every one of them deletes
-- the row from one partition and inserts it into another. A session that was
-- waiting to lock that row (FOR UPDATE) cannot follow it there: instead of
-- re-checking the row's new version it fails with SQLSTATE 40001.
CREATE TABLE job (
    id          bigint      NOT NULL,
    status      text        NOT NULL DEFAULT 'PENDING',
    created_at  timestamptz NOT NULL,
    worker_id   text,
    claimed_at  timestamptz,
    payload     text
) PARTITION BY LIST (status);

CREATE TABLE job_pending     PARTITION OF job FOR VALUES IN ('PENDING');
CREATE TABLE job_in_progress PARTITION OF job FOR VALUES IN ('IN_PROGRESS');
CREATE TABLE job_done        PARTITION OF job FOR VALUES IN ('DONE');
