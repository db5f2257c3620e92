-- The scene of the heartbeat exercise's checker (labkit.tools.exercises.production), on the
-- production job table (production.sql). Worker 1 sends a heartbeat for each of five jobs;
-- only the first is still its own. The checker reads what happened from the table, never
-- from the SQL it was given.

-- name: heartbeat_scene
-- Five jobs, each with the claim version worker 1 was handed:
--   1  RUNNING, worker 1's claim (version 1), 5 s of lease left: the owner's heartbeat
--   2  RUNNING, claimed again by worker 2 (version 2) after worker 1's lease ran out: a zombie
--   3  RUNNING, claimed again by worker 1 itself (version 2) after its first claim's lease ran
--      out; the heartbeat comes from the first run, still going
--   4  PENDING: the reaper handed it back and nobody has claimed it since (still version 1)
--   5  DONE: worker 1 completed it (version 1); a heartbeat that comes after the completion
INSERT INTO job (status, claimed_by, claim_version, attempts, lease_until, last_error, finished_at)
VALUES ('RUNNING', 'worker 1', 1, 1, now() + interval '5 seconds', NULL, NULL),
       ('RUNNING', 'worker 2', 2, 2, now() + interval '25 seconds',
        'lease expired while worker 1 held it', NULL),
       ('RUNNING', 'worker 1', 2, 2, now() + interval '25 seconds',
        'lease expired while worker 1 held it', NULL),
       ('PENDING', NULL, 1, 1, NULL, 'lease expired while worker 1 held it', NULL),
       ('DONE', NULL, 1, 1, NULL, NULL, now());

-- name: heartbeat_rows
-- Every job as it stands, and how long its lease has left (read after each heartbeat).
SELECT id, status, claimed_by, claim_version, attempts, lease_until, last_error, finished_at,
       run_at, priority, extract(epoch FROM lease_until - now())::float8 AS lease_left_s
  FROM job
 ORDER BY id;
