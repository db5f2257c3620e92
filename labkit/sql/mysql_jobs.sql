-- The job table of the cross-engine appendix, on MySQL and MariaDB (InnoDB): the same
-- columns as job_table.sql. InnoDB has no partial index, so the claim's index is on
-- (status, created_at): the claim reads it from the first PENDING entry, oldest first,
-- and locks only what it reads. Without it, the claim sorts the whole table and, under
-- REPEATABLE READ, locks every row it sorted (notebook 19 shows it).

-- name: job_table
CREATE TABLE job (
    id          BIGINT       PRIMARY KEY,
    status      VARCHAR(16)  NOT NULL DEFAULT 'PENDING'
                             CHECK (status IN ('PENDING', 'IN_PROGRESS', 'DONE')),
    created_at  DATETIME(6)  NOT NULL,
    worker_id   VARCHAR(32),
    claimed_at  DATETIME(6),
    payload     VARCHAR(200),
    KEY job_pending (status, created_at)
) ENGINE = InnoDB;

-- name: job_table_unindexed
-- The same table without the claim's index.
CREATE TABLE job (
    id          BIGINT       PRIMARY KEY,
    status      VARCHAR(16)  NOT NULL DEFAULT 'PENDING',
    created_at  DATETIME(6)  NOT NULL,
    worker_id   VARCHAR(32),
    claimed_at  DATETIME(6),
    payload     VARCHAR(200)
) ENGINE = InnoDB;

-- name: add_job
-- One job (executemany sends a batch of them as one multi-row INSERT).
INSERT INTO job (id, status, created_at, payload) VALUES (%s, %s, %s, %s);

-- name: empty
TRUNCATE TABLE job;
