-- Scheduled and prioritised jobs on the production job table (production.sql "table"), for
-- notebook 11: what the claim's index (job_due_idx ON job (priority, run_at) WHERE status =
-- 'PENDING') does for it and what it cannot do, and a low-priority job starved by a steady
-- stream of urgent ones -- and the remedy, an aged turn (every k-th claim takes the oldest due
-- job, whatever its priority).  labkit.labs.schedule reads the sections by name.

-- name: fill_history
-- %(n)s finished jobs, one a second up to a day ago:
-- the history a queue table keeps until it is archived.
INSERT INTO job (status, priority, run_at, enqueued_at, attempts, finished_at)
SELECT 'DONE', mod(g, 10), ts, ts, 1, ts + interval '2 s'
  FROM generate_series(1, %(n)s) AS g,
       LATERAL (SELECT now() - interval '1 day' - make_interval(secs => %(n)s - g)) AS t(ts);

-- name: fill_pending
-- %(n)s pending jobs at priorities 0 to 9; one in five (ten
-- in every fifty) is scheduled, due up to a day from now.
INSERT INTO job (priority, run_at, enqueued_at)
SELECT mod(g, 10),
       CASE WHEN mod(g / 10, 5) = 4 THEN now() + make_interval(secs => 60 + mod(g * 37, 86400))
            ELSE now() - make_interval(secs => g) END,
       now() - make_interval(secs => g)
  FROM generate_series(1, %(n)s) AS g;

-- name: fill_ahead
-- %(n)s jobs scheduled an hour or more from now, spread over %(levels)s
-- priority levels all more urgent than any due job (-1, -2, ...).
INSERT INTO job (kind, priority, run_at)
SELECT 'scheduled', -1 - mod(g, %(levels)s),
       now() + interval '1 hour' + make_interval(secs => g)
  FROM generate_series(1, %(n)s) AS g;

-- name: claim_search
-- The search of production.sql's claim, the statement EXPLAIN is asked
-- about: the most urgent due job, skipping rows another worker holds.
SELECT id FROM job
              WHERE status = 'PENDING' AND run_at <= now()
              ORDER BY priority, run_at
              LIMIT 1
              FOR UPDATE SKIP LOCKED;

-- name: claim_search_read
-- The same search without FOR UPDATE SKIP LOCKED: it reads and locks nothing
-- (its plan shows what the lock adds to the claim's).
SELECT id FROM job
              WHERE status = 'PENDING' AND run_at <= now()
              ORDER BY priority, run_at
              LIMIT 1;

-- name: enqueue_at
-- %(n)s jobs of one kind and priority, arriving one a second from %(at)s;
-- due at arrival, or at %(run_at)s when it is given (a scheduled job).
INSERT INTO job (kind, priority, run_at, enqueued_at, payload)
SELECT %(kind)s, %(priority)s, coalesce(%(run_at)s, arrived), arrived,
       jsonb_build_object('tick', %(tick)s, 'n', g)
  FROM generate_series(1, %(n)s) AS g,
       LATERAL (SELECT %(at)s::timestamptz + make_interval(secs => g - 1)) AS a(arrived)
RETURNING id;

-- name: claim_at
-- production.sql's claim on the lab's clock: the same statement,
-- with the instant %(now)s passed in where it reads now().
UPDATE job
   SET status = 'RUNNING', attempts = attempts + 1, claimed_by = %(worker)s,
       claim_version = claim_version + 1,
       lease_until = %(now)s + make_interval(secs => %(lease_s)s)
 WHERE id = (SELECT id FROM job
              WHERE status = 'PENDING' AND run_at <= %(now)s
              ORDER BY priority, run_at
              LIMIT 1
              FOR UPDATE SKIP LOCKED)
RETURNING id, kind, payload, attempts, max_attempts, claim_version;

-- name: oldest_index
-- The aged turn's index: pending jobs in the order they fell due
-- (id breaks ties), so the turn reads the front of it and stops.
CREATE INDEX job_oldest_idx ON job (run_at, id) WHERE status = 'PENDING';

-- name: claim_oldest
-- The aged turn (every k-th claim): the job that has been due
-- longest, whatever its priority; otherwise the same claim.
UPDATE job
   SET status = 'RUNNING', attempts = attempts + 1, claimed_by = %(worker)s,
       claim_version = claim_version + 1,
       lease_until = %(now)s + make_interval(secs => %(lease_s)s)
 WHERE id = (SELECT id FROM job
              WHERE status = 'PENDING' AND run_at <= %(now)s
              ORDER BY run_at, id
              LIMIT 1
              FOR UPDATE SKIP LOCKED)
RETURNING id, kind, payload, attempts, max_attempts, claim_version;

-- name: older_due
-- Due pending jobs ahead of job %(id)s in the aged turn's order
-- (fell due before it): how many aged turns it may have to wait for.
SELECT count(*)
  FROM job AS j, job AS me
 WHERE me.id = %(id)s
   AND j.status = 'PENDING' AND j.run_at <= %(now)s
   AND (j.run_at, j.id) < (me.run_at, me.id);

-- name: due_count
-- Jobs due and waiting at %(now)s: the backlog.
SELECT count(*) FROM job WHERE status = 'PENDING' AND run_at <= %(now)s;

-- name: due_now
-- Jobs due and waiting now, on the server's clock (what the production claim sees).
SELECT count(*) FROM job WHERE status = 'PENDING' AND run_at <= now();

-- name: relation_pages
-- The size of a table or an index, in pages.
SELECT pg_relation_size(%(relation)s::regclass) / current_setting('block_size')::int;
