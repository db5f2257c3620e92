-- The fix for a long history: finished jobs leave the hot table.
-- One statement moves them, so a job is never in both tables or in neither.
-- The DELETE leaves dead rows behind. VACUUM makes their space reusable, and gives
-- back to the disk only the empty pages at the end of the table; empty pages
-- before the last live row stay until the table is rewritten.
CREATE TABLE IF NOT EXISTS job_archive (LIKE job INCLUDING DEFAULTS);

WITH moved AS (
    DELETE FROM job
     WHERE status = 'DONE'
    RETURNING *
)
INSERT INTO job_archive
SELECT * FROM moved;
