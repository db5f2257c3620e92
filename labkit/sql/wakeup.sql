-- Waking a worker (notebook 12): poll the job table, or LISTEN for a NOTIFY that says "look".
--
-- A notification is a wake-up, never the job: the worker always claims from the table
-- (production.sql "claim"), so a lost or folded notification costs latency, never a job.
-- The enqueue stamps enqueued_at with clock_timestamp() (the server's clock at the insert,
-- not the transaction's start), and the worker reads the same clock right after its claim:
-- one clock, so the latency needs no agreement between two machines' clocks.

-- name: listen
-- The worker's session subscribes to the lab's channel (an identifier, written in by labkit).
-- It takes effect when its transaction commits; it lasts as long as the session.
LISTEN {channel};

-- name: enqueue
-- A producer adds one job, stamped with the server's clock at the insert.
INSERT INTO job (enqueued_at) VALUES (clock_timestamp())
RETURNING id;

-- name: notify
-- "Look at the job table": sent now, delivered only if and when this transaction commits.
SELECT pg_notify(%(channel)s, %(payload)s);

-- name: enqueue_and_notify
-- One statement, one transaction: the job and its wake-up commit together (or neither does).
WITH j AS (
    INSERT INTO job (enqueued_at) VALUES (clock_timestamp())
    RETURNING id
)
SELECT id, pg_notify(%(channel)s, id::text) FROM j;

-- name: claimed_latency
-- Right after a claim, in the claim's transaction: how long the job waited, on the server's
-- clock (milliseconds from the enqueue to now).
SELECT (extract(epoch FROM clock_timestamp() - enqueued_at) * 1000)::float8 AS latency_ms
  FROM job
 WHERE id = %(id)s;

-- name: queue_usage
-- The share (0 to 1) of the notification queue's maximum size that holds notifications some
-- listening session has not read yet.
SELECT pg_notification_queue_usage();

-- name: queue_size
-- The notification queue's maximum size: max_notify_queue_pages (PostgreSQL 17 and later;
-- NULL before) pages of block_size bytes.
SELECT current_setting('max_notify_queue_pages', true)::bigint AS pages,
       current_setting('block_size')::int AS page_bytes;

-- name: notify_payload_of_length
-- A notification whose payload is n bytes long (run in a transaction that is rolled back:
-- nothing is delivered).  Too long a payload fails here, when pg_notify is called.
SELECT pg_notify(%(channel)s, repeat('x', %(n)s));

-- name: clock
-- The server's clock, in seconds since 1970: when a worker woke, on the same clock as the
-- jobs' enqueued_at.
SELECT extract(epoch FROM clock_timestamp())::float8 AS at;

-- name: enqueued_times
-- Each job's enqueue, on the server's clock (seconds since 1970), for the run's timeline.
SELECT id, extract(epoch FROM enqueued_at)::float8 AS enqueued
  FROM job
 ORDER BY id;

-- name: backends_of
-- The server backends of one application_name (a worker's connections).
SELECT pid
  FROM pg_stat_activity
 WHERE application_name = %(app)s;

-- name: terminate
-- End a worker's connection from outside, as a restart or a network cut would.
SELECT pg_terminate_backend(pid)
  FROM pg_stat_activity
 WHERE application_name = %(app)s;
