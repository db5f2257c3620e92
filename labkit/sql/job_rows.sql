-- Rows for the job table of job_table.sql, written in bulk: the queues the
-- measuring labs start from.

-- name: pending
-- %(n)s pending jobs, ids 1..%(n)s, one every %(step_s)s seconds from %(start)s.
INSERT INTO job (id, created_at, payload)
SELECT g, %(start)s::timestamptz + (g - 1) * make_interval(secs => %(step_s)s), 'job ' || g
  FROM generate_series(1, %(n)s) AS g;

-- name: history
-- %(n)s finished jobs created in 2025, before every pending one; ids from %(first_id)s on.
INSERT INTO job (id, status, created_at, worker_id, claimed_at, payload)
SELECT %(first_id)s + g, 'DONE', timestamptz '2025-01-01 00:00:00+00' + g * interval '10 ms',
       'old', timestamptz '2025-01-01 00:00:00+00' + g * interval '10 ms', 'done ' || g
  FROM generate_series(0, %(n)s - 1) AS g;
