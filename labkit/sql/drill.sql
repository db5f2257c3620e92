-- The scenes the drill's self-checks (notebook 20) set up in a scratch schema before they
-- run the reader's SQL there (labkit.tools.drill reads the sections by name).

-- name: jobs_newest_first
-- Pending jobs 1..%(n)s numbered newest first (job %(n)s is the oldest): without the index,
-- rows come back in storage order, newest first, unless the claim says ORDER BY created_at.
INSERT INTO job (id, created_at, payload)
SELECT g, timestamptz '2026-01-01 09:00:00+00' - g * interval '1 minute', 'job ' || g
  FROM generate_series(1, %(n)s) AS g;

-- name: reaper_scene
-- Six jobs for a reaper: job 1 DONE, jobs 2 and 5 claimed 10 minutes and an hour ago (stale),
-- job 3 claimed 10 seconds ago (its worker is still on it), jobs 4 and 6 pending.
UPDATE job
   SET status = v.status, worker_id = v.worker, claimed_at = now() - v.age::interval
  FROM (VALUES (1, 'DONE', 'w1', '2 hours'), (2, 'IN_PROGRESS', 'w2', '10 minutes'),
               (3, 'IN_PROGRESS', 'w3', '10 seconds'), (5, 'IN_PROGRESS', 'w5', '1 hour'))
       AS v(id, status, worker, age)
 WHERE job.id = v.id;
