-- The exercise of notebook 12 (labkit.tools.exercises.wakeups): a lock_timeout for one
-- transaction, behind a transaction pooler that hands the same server connection to the
-- next client once the transaction ends.  The scene is the job table of job_table.sql.

-- name: hold
-- Another session (a reaper, say) holds job 1's row lock in its open transaction.
SELECT id FROM job WHERE id = 1 FOR UPDATE;

-- name: mark_done
-- Client A's statement that needs job 1's row: it waits for the row lock, for as long as
-- lock_timeout allows (0: for ever).
UPDATE job SET status = 'DONE' WHERE id = 1;

-- name: lock_timeout
-- lock_timeout as this session (and its transaction) sees it.
SELECT current_setting('lock_timeout');

-- name: stored_settings
-- Settings stored on roles and databases (ALTER ROLE / ALTER DATABASE ... SET): every new
-- session of that role or database starts with them.
SELECT setdatabase, setrole, setconfig::text
  FROM pg_db_role_setting
 ORDER BY 1, 2;
