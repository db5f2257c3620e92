-- The scheduler's seat (labkit.labs.puzzles): small programs of two or three sessions, and
-- the learner chooses the order their steps run in. Each puzzle has a scene (`<scene>_scene`),
-- the steps its sessions run (`<puzzle>_<step>`, or a step shared by several puzzles), and
-- the check that reads the invariant back from the server (`<puzzle>_check`, or a shared
-- one): one row whose first column, `broken`, says whether the promise is broken now.
--
-- A step names its own session as %(me)s, and reads what its session's last step returned
-- as %(<column>)s: a worker that read `id = 1` then marks `WHERE id = %(id)s`, as a
-- program that keeps the id in a variable would.

-- name: jobs_scene
-- Two pending jobs, and the record of the claims that committed.
CREATE TABLE job (
    id      bigint PRIMARY KEY,
    status  text NOT NULL DEFAULT 'pending',
    owner   text
);
CREATE TABLE claim_log (
    worker  text   NOT NULL,
    job_id  bigint NOT NULL
);
CREATE TABLE asked (                 -- every claim's answer, a job or none (NULL)
    worker  text NOT NULL,
    job_id  bigint
);
INSERT INTO job (id) VALUES (1), (2);

-- name: read
-- Read the oldest pending job, taking no lock.
BEGIN;
SELECT id FROM job WHERE status = 'pending' ORDER BY id LIMIT 1;

-- name: read_then_mark_mark
-- Mark the job that was read, and log the claim; return the job marked.
WITH marked AS (
    UPDATE job SET status = 'running', owner = %(me)s WHERE id = %(id)s
 RETURNING id
)
INSERT INTO claim_log SELECT %(me)s, id FROM marked RETURNING job_id AS marked;

-- name: mark_if_still_pending_mark
-- Mark the job that was read only if it is still pending; log the claim only if so; return
-- the job marked (no row: none was).
WITH marked AS (
    UPDATE job SET status = 'running', owner = %(me)s
     WHERE id = %(id)s AND status = 'pending'
 RETURNING id
)
INSERT INTO claim_log SELECT %(me)s, id FROM marked RETURNING job_id AS marked;

-- name: commit
COMMIT;

-- name: claimed_twice_check
-- Broken when one job has two committed claims.
SELECT count(*) > 0 AS broken,
       count(*) AS jobs_claimed_twice
  FROM (SELECT job_id FROM claim_log GROUP BY job_id HAVING count(*) > 1) AS twice;

-- name: claim_for_update
-- Lock the oldest pending job, waiting for it if another transaction holds it.
BEGIN;
SELECT id FROM job WHERE status = 'pending' ORDER BY id LIMIT 1 FOR UPDATE;

-- name: claim_skip_locked
-- Lock the oldest pending job that no other transaction holds.
BEGIN;
SELECT id FROM job WHERE status = 'pending' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED;

-- name: mark_locked
-- Mark the job this transaction holds, and log the claim; return the job marked.
WITH marked AS (
    UPDATE job SET status = 'running', owner = %(me)s WHERE id = %(id)s
 RETURNING id
)
INSERT INTO claim_log SELECT %(me)s, id FROM marked RETURNING job_id AS marked;

-- name: wait_check
-- Broken when a session of the puzzle waits for a lock, or one job has two committed claims.
SELECT (SELECT count(*) FROM pg_catalog.pg_locks
         WHERE NOT granted AND pid = ANY(%(pids)s)) > 0
       OR (SELECT count(*) FROM (SELECT job_id FROM claim_log GROUP BY job_id
                                  HAVING count(*) > 1) AS twice) > 0 AS broken,
       (SELECT count(*) FROM pg_catalog.pg_locks
         WHERE NOT granted AND pid = ANY(%(pids)s)) AS sessions_waiting,
       (SELECT count(*) FROM (SELECT job_id FROM claim_log GROUP BY job_id
                               HAVING count(*) > 1) AS twice) AS jobs_claimed_twice;

-- name: empty_handed_claim
-- Pick the oldest pending job (a subquery, no lock), then mark it if it is still pending, in
-- one statement; record the answer: the job's id, or NULL when the claim marked none.
BEGIN;
WITH marked AS (
    UPDATE job SET status = 'running', owner = %(me)s
     WHERE id = (SELECT id FROM job WHERE status = 'pending' ORDER BY id LIMIT 1)
       AND status = 'pending'
 RETURNING id
)
INSERT INTO asked SELECT %(me)s, (SELECT id FROM marked) RETURNING job_id AS id;

-- name: empty_handed_check
-- Broken when a committed claim came back with no job while a job is still pending (a job
-- only goes from pending to running, so it was pending when that claim asked).
SELECT (SELECT count(*) FROM asked WHERE job_id IS NULL) > 0
       AND (SELECT count(*) FROM job WHERE status = 'pending') > 0 AS broken,
       (SELECT count(*) FROM asked WHERE job_id IS NULL) AS claims_with_no_job,
       (SELECT count(*) FROM job WHERE status = 'pending') AS jobs_pending;

-- name: lease_scene
-- One job; a claim gives a lease of 30 s on the lab's clock and a new token. A trigger writes
-- down every completion: who wrote it, and who owned the job at that moment.
CREATE TABLE job (
    id          bigint PRIMARY KEY,
    status      text   NOT NULL DEFAULT 'pending',
    owner       text,
    token       bigint NOT NULL DEFAULT 0,
    lease_until timestamptz,
    done_by     text
);
CREATE TABLE completion_log (
    writer      text NOT NULL,
    owner_then  text
);
CREATE FUNCTION log_completion() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO completion_log VALUES (NEW.done_by, OLD.owner);
    RETURN NEW;
END $$;
CREATE TRIGGER job_completed BEFORE UPDATE OF done_by ON job
   FOR EACH ROW WHEN (NEW.done_by IS NOT NULL) EXECUTE FUNCTION log_completion();
INSERT INTO job (id) VALUES (1);

-- name: lease_claim
-- Claim a job that is pending or whose lease has run out: a lease of 30 s, token + 1.
UPDATE job SET status = 'running', owner = %(me)s, token = token + 1,
               lease_until = lab_now() + interval '30 s'
 WHERE id = (SELECT id FROM job
              WHERE status = 'pending' OR (status = 'running' AND lease_until < lab_now())
              ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id, token;

-- name: unfenced_zombie_finish
-- Write the result: the job's id is all the write checks.
UPDATE job SET status = 'done', done_by = %(me)s WHERE id = %(id)s;

-- name: fenced_completion_finish
-- Write the result only while the job still carries this claim's token.
UPDATE job SET status = 'done', done_by = %(me)s WHERE id = %(id)s AND token = %(token)s;

-- name: clock_advance
-- The lab's clock moves on 60 s (a worker's long pause, or a long job).
UPDATE lab_clock SET shift = shift + interval '60 s';

-- name: zombie_check
-- Broken when a completion was written by a worker that did not own the job then.
SELECT count(*) FILTER (WHERE writer IS DISTINCT FROM owner_then) > 0 AS broken,
       count(*) AS completions,
       count(*) FILTER (WHERE writer IS DISTINCT FROM owner_then) AS by_a_worker_not_owning_it
  FROM completion_log;

-- name: relay_scene
-- An outbox, the relay's high-water mark (the last id it passed, or the last transaction and
-- id), and what it sent.
CREATE TABLE outbox (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tx      xid8   NOT NULL DEFAULT pg_current_xact_id(),
    payload text   NOT NULL
);
CREATE TABLE relay_mark (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    last_tx  xid8    NOT NULL DEFAULT '0',
    last_id  bigint  NOT NULL DEFAULT 0
);
INSERT INTO relay_mark DEFAULT VALUES;
CREATE TABLE relayed (
    event_id bigint NOT NULL
);

-- name: relay_write
-- A writer's transaction adds its event to the outbox (the id is taken now).
BEGIN;
INSERT INTO outbox (payload) VALUES (%(me)s) RETURNING id;

-- name: high_water_relay_pass
-- The relay sends every event past its mark, and moves the mark to the highest id it sent.
WITH batch AS (
    SELECT id FROM outbox WHERE id > (SELECT last_id FROM relay_mark) ORDER BY id
), sent AS (
    INSERT INTO relayed SELECT id FROM batch RETURNING event_id
)
UPDATE relay_mark SET last_id = (SELECT max(event_id) FROM sent)
 WHERE EXISTS (SELECT FROM sent)
RETURNING last_id;

-- name: snapshot_relay_pass
-- The relay sends the events past its mark whose transactions are older than every
-- transaction still running (pg_snapshot_xmin), in (transaction, id) order, and moves the
-- mark to the last one sent.
WITH batch AS (
    SELECT tx, id FROM outbox
     WHERE (tx, id) > (SELECT last_tx, last_id FROM relay_mark)
       AND tx < pg_snapshot_xmin(pg_current_snapshot())
     ORDER BY tx, id
), sent AS (
    INSERT INTO relayed SELECT id FROM batch RETURNING event_id
)
UPDATE relay_mark SET (last_tx, last_id) = (SELECT tx, id FROM batch ORDER BY tx DESC, id DESC LIMIT 1)
 WHERE EXISTS (SELECT FROM sent)
RETURNING last_id;

-- name: high_water_relay_check
-- Broken when a committed event is at or below the mark and was never sent: no later pass
-- will look at it again.
SELECT count(*) > 0 AS broken, count(*) AS events_lost
  FROM outbox o
 WHERE o.id <= (SELECT last_id FROM relay_mark)
   AND NOT EXISTS (SELECT FROM relayed r WHERE r.event_id = o.id);

-- name: snapshot_relay_check
-- The same promise for the mark by transaction and id.
SELECT count(*) > 0 AS broken, count(*) AS events_lost
  FROM outbox o
 WHERE (o.tx, o.id) <= (SELECT last_tx, last_id FROM relay_mark)
   AND NOT EXISTS (SELECT FROM relayed r WHERE r.event_id = o.id);

-- name: drain_scene
-- One push to deliver, at most two attempts; the push service's record of what it received
-- (written by the sender's own connection, so a crash of the drain cannot take it back).
CREATE TABLE delivery (
    id          bigint PRIMARY KEY,
    status      text NOT NULL DEFAULT 'pending',
    attempts    int  NOT NULL DEFAULT 0,
    lease_until timestamptz
);
CREATE TABLE push_received (
    delivery_id bigint NOT NULL,
    from_drain  text   NOT NULL
);
INSERT INTO delivery (id) VALUES (1);

-- name: held_lock_drain_claim
-- Claim the delivery and count the attempt, in a transaction held open across the push.
BEGIN;
UPDATE delivery SET attempts = attempts + 1
 WHERE id = (SELECT id FROM delivery WHERE status = 'pending' AND attempts < 2
              ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id;

-- name: committed_lease_drain_claim
-- Claim the delivery, count the attempt and take a lease of 120 s, in one statement that
-- commits at once: no lock outlives it.
UPDATE delivery SET attempts = attempts + 1, lease_until = lab_now() + interval '120 s'
 WHERE id = (SELECT id FROM delivery
              WHERE status = 'pending' AND attempts < 2
                AND (lease_until IS NULL OR lease_until < lab_now())
              ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id;

-- name: push
-- The push goes out: the push service writes it down (over the sender's own connection).
INSERT INTO push_received VALUES (%(id)s, %(me)s);

-- name: drain_done
-- The drain records the delivery as delivered.
UPDATE delivery SET status = 'delivered' WHERE id = %(id)s;

-- name: drain_clock_advance
-- The lab's clock moves on 150 s: a lease of 120 s taken before it has run out.
UPDATE lab_clock SET shift = shift + interval '150 s';

-- name: drain_check
-- Broken when a delivery that no drain holds has had more pushes received than attempts
-- counted. A delivery locked by a drain's open transaction is skipped (SKIP LOCKED): its
-- count may still commit.
SELECT count(*) > 0 AS broken, coalesce(sum(pushes - attempts), 0)::int AS pushes_not_counted
  FROM (SELECT d.id, d.attempts,
               (SELECT count(*) FROM push_received p WHERE p.delivery_id = d.id) AS pushes
          FROM delivery d
           FOR SHARE SKIP LOCKED) AS looked
 WHERE pushes > attempts;

-- name: record_install
-- The learner's record of plays, in a schema of their own that outlives the labs' resets
-- (`labkit clean` and a notebook's set-up drop lab_ schemas; this one stays).
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {schema}.puzzle_play (
    puzzle  text        NOT NULL,
    steps   text[]      NOT NULL,
    moves   int         NOT NULL,
    broken  boolean     NOT NULL,
    at      timestamptz NOT NULL DEFAULT now()
);

-- name: record_owner
-- Whether the record schema is the current role's own, and whose it is.
SELECT n.nspowner = (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = current_user),
       pg_catalog.pg_get_userbyid(n.nspowner)
  FROM pg_catalog.pg_namespace n
 WHERE n.nspname = %(schema)s;

-- name: record_insert
-- One play.
INSERT INTO {schema}.puzzle_play (puzzle, steps, moves, broken)
VALUES (%(puzzle)s, %(steps)s, %(moves)s, %(broken)s);

-- name: record_summary
-- Per puzzle: the plays, and the fewest moves of those that broke its promise.
SELECT puzzle, count(*) AS plays, min(moves) FILTER (WHERE broken) AS fewest_moves
  FROM {schema}.puzzle_play
 GROUP BY puzzle
 ORDER BY puzzle;

-- name: record_comment
-- The summary, as the schema's comment: what a presenter reads. It is read from the
-- catalogue alone, so reading it runs nothing a trainee wrote.
COMMENT ON SCHEMA {schema} IS {summary};

-- name: record_read
-- The summaries of the record schemas a role owns (one per LABKIT_USER it played as); a
-- comment longer than a summary is is left on the server, not read.
SELECT d.description
  FROM pg_catalog.pg_namespace n
  JOIN pg_catalog.pg_roles r ON r.oid = n.nspowner
  JOIN pg_catalog.pg_description d
    ON d.objoid = n.oid AND d.classoid = 'pg_catalog.pg_namespace'::pg_catalog.regclass
 WHERE r.rolname = %(role)s
   AND n.nspname LIKE 'claimlab\_record\_%%'
   AND pg_catalog.length(d.description) <= %(longest)s
   AND (%(schema)s::text IS NULL OR n.nspname = %(schema)s)
 ORDER BY n.nspname
 LIMIT 20;
