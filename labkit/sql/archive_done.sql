-- The fix for a long history: finished jobs leave the hot table.
-- One statement moves them, so a job is never in both tables or in neither.
CREATE TABLE IF NOT EXISTS job_archive (LIKE job INCLUDING DEFAULTS);

WITH moved AS (
    DELETE FROM job
     WHERE status = 'DONE'
    RETURNING *
)
INSERT INTO job_archive
SELECT * FROM moved;
