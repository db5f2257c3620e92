-- The counts `labkit torture queue` checks its invariants with, read from the job table
-- and the log of every job run (effect_log). Every query returns one number; %(max)s is
-- the reaper's attempt limit.

-- name: jobs
-- Every job.
SELECT count(*) FROM job;

-- name: done
-- Jobs that ran and were marked DONE.
SELECT count(*) FROM job WHERE status = 'DONE';

-- name: dead
-- Jobs dead-lettered by the reaper.
SELECT count(*) FROM job WHERE status = 'DEAD';

-- name: unfinished
-- Jobs that ended neither DONE nor DEAD.
SELECT count(*) FROM job WHERE status NOT IN ('DONE', 'DEAD');

-- name: done_never_ran
-- DONE although its handler never ran: a lost job.
SELECT count(*)
  FROM job j
 WHERE j.status = 'DONE'
   AND NOT EXISTS (SELECT 1 FROM effect_log e WHERE e.job_id = j.id);

-- name: max_attempts_seen
-- The most attempts any job used.
SELECT coalesce(max(attempts), 0) FROM job;

-- name: dead_not_at_max
-- DEAD jobs whose attempts are not exactly the limit.
SELECT count(*) FROM job WHERE status = 'DEAD' AND attempts <> %(max)s;

-- name: done_at_max
-- DONE jobs that had used up their attempts (they should have been dead-lettered).
SELECT count(*) FROM job WHERE status = 'DONE' AND attempts >= %(max)s;

-- name: reaped
-- The reaper's take-backs, in all.
SELECT coalesce(sum(attempts), 0) FROM job;

-- name: duplicate_runs
-- Runs beyond the first of each job.
SELECT coalesce(sum(n - 1), 0)
  FROM (SELECT job_id, count(*) AS n FROM effect_log GROUP BY job_id) AS per;

-- name: reruns_never_reaped
-- A job run twice although the reaper never took it back.
SELECT count(*)
  FROM (SELECT job_id FROM effect_log GROUP BY job_id HAVING count(*) > 1) d
  JOIN job j ON j.id = d.job_id
 WHERE j.attempts = 0;
