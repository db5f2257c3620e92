-- The listener that died: two workers woken by NOTIFY, and a server restart between them and
-- their next job.  Everything here runs on a throw-away server of the lab's own
-- (labkit.core.replica), never on the workbook's: the restart is real.
--
-- Each worker has its own queue and its own channel, so they never compete for a job.  The
-- clock is the server's: enqueued_at and claimed_at both read clock_timestamp(), so how long a
-- queue stalled needs no agreement between the server's clock and this machine's.

-- name: schema
-- One table for both queues: a job waits as 'available' until a worker claims it.
CREATE TABLE job (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue       text NOT NULL,
    state       text NOT NULL DEFAULT 'available' CHECK (state IN ('available', 'claimed')),
    enqueued_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    claimed_at  timestamptz,
    claimed_by  text
);
CREATE INDEX job_available ON job (queue, id) WHERE state = 'available';

-- name: listen
-- The worker's session subscribes to its channel (an identifier, written in by labkit).  The
-- subscription belongs to the session: it ends when the session ends, however it ends.
LISTEN {channel};

-- name: enqueue_and_notify
-- A producer adds one job to a queue and wakes that queue's channel: one statement, one
-- transaction, so the job and its NOTIFY commit together.
WITH j AS (
    INSERT INTO job (queue) VALUES (%(queue)s)
    RETURNING id
)
SELECT id, pg_notify(%(channel)s, id::text) FROM j;

-- name: claim
-- A worker claims the oldest available job of its queue, skipping one another session holds,
-- and stamps the claim with the server's clock.  No row: nothing is waiting.
UPDATE job
   SET state = 'claimed', claimed_at = clock_timestamp(), claimed_by = %(worker)s
 WHERE id = (SELECT id FROM job
              WHERE queue = %(queue)s AND state = 'available'
              ORDER BY id
              LIMIT 1
              FOR UPDATE SKIP LOCKED)
RETURNING id;

-- name: listening
-- The channels this session listens on (pg_listening_channels() sees only its own session).
SELECT coalesce(array_agg(c ORDER BY c), '{}') AS channels
  FROM pg_listening_channels() AS c;

-- name: sessions
-- The server's sessions of the given application names: which backends the workers have now.
SELECT application_name, pid
  FROM pg_stat_activity
 WHERE application_name = ANY(%(apps)s)
 ORDER BY application_name, pid;

-- name: started
-- When the postmaster started: a restart gives it a new value.
SELECT pg_postmaster_start_time();

-- name: queue_after
-- One queue's jobs from id first_id on (the ones enqueued after the restart): how many are
-- still waiting, and seconds on the server's clock from the first enqueue to the first claim
-- (NULL while none is claimed).
SELECT count(*) FILTER (WHERE state = 'available') AS waiting,
       extract(epoch FROM min(claimed_at) - min(enqueued_at))::float8 AS stalled_s
  FROM job
 WHERE queue = %(queue)s AND id >= %(first_id)s;
