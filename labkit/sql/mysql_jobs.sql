-- The job table of the cross-engine appendix, on MySQL and MariaDB (InnoDB): the same
-- columns as job_table.sql. InnoDB has no partial index, so the claim's index is on
-- (status, created_at): the claim reads it from the first PENDING entry, oldest first,
-- and locks only what it reads. Without it, the claim sorts the whole table and, under
-- REPEATABLE READ, locks every row it sorted (notebook 21 shows it).

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

-- name: index_entries
-- The claim's index in key order: (status, created_at), and the id every entry carries.
SELECT id, status, created_at FROM job FORCE INDEX (job_pending) ORDER BY status, created_at, id;

-- name: probe_entry
-- A probe of one index entry: a locking read of that entry alone. It waits only if
-- another transaction holds a lock on the entry itself.
SELECT id FROM job FORCE INDEX (job_pending)
 WHERE status = %(status)s AND created_at = %(created_at)s FOR UPDATE;

-- name: probe_gap
-- A probe of one gap: a new row whose index entry sorts into it. Before inserting, InnoDB
-- asks for an insert intention lock on the gap, which waits for anyone's gap lock there.
INSERT INTO job (id, status, created_at) VALUES (%(id)s, %(status)s, %(created_at)s);
