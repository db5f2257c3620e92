-- What `labkit torture` writes and reads while it hurts the workers (labkit.tools.torture
-- reads the sections by name). The invariants it checks at the end are in
-- torture_drain_checks.sql and torture_queue_checks.sql.

-- name: relay_in_flight
-- Rows a relay's open transaction holds: FOR UPDATE wrote its xid into the tuple's xmax.
SELECT o.event_id
  FROM outbox o
 WHERE o.xmax::text = ANY (SELECT backend_xid::text FROM pg_stat_activity
                            WHERE pid = ANY(%(pids)s) AND backend_xid IS NOT NULL);

-- name: relay_state
-- The outbox's rows, and how many of them are not marked published yet.
SELECT count(*), count(*) FILTER (WHERE published_at IS NULL) FROM outbox;

-- name: drain_audit
-- An audit of every write to the drain's ledger, kept by a trigger in the same transaction:
-- a write that rolls back leaves no audit row. `worker` is the writer's torture.worker
-- setting (each worker process sets its own name).
DROP TABLE IF EXISTS torture_audit;
DROP FUNCTION IF EXISTS torture_audit_row() CASCADE;
CREATE TABLE torture_audit (
    seq          bigserial PRIMARY KEY,
    delivery_id  bigint    NOT NULL,
    op           text      NOT NULL,          -- claim (claim_version moved) or complete
    worker       text      NOT NULL,
    old_status   text      NOT NULL,
    new_status   text      NOT NULL,
    old_version  bigint    NOT NULL,
    new_version  bigint    NOT NULL
);
CREATE FUNCTION torture_audit_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO torture_audit (delivery_id, op, worker, old_status, new_status,
                               old_version, new_version)
    VALUES (NEW.id,
            CASE WHEN NEW.claim_version > OLD.claim_version THEN 'claim' ELSE 'complete' END,
            coalesce(nullif(current_setting('torture.worker', true), ''), 'admin'),
            OLD.status, NEW.status, OLD.claim_version, NEW.claim_version);
    RETURN NEW;
END $$;
CREATE INDEX torture_audit_row_idx ON torture_audit (delivery_id, seq);
CREATE TRIGGER torture_audit AFTER UPDATE ON delivery
    FOR EACH ROW EXECUTE FUNCTION torture_audit_row();

-- name: drain_fill
-- Deliveries %(first)s..%(last)s, due now: every 13th has a dead token (terminal failure),
-- every 7th one that fails transiently on its first attempts, and the ids in %(poison)s a
-- payload that kills the drain process sending it (a real SIGKILL, every time).
INSERT INTO delivery (id, notification_id, device_token, next_attempt_at, coalesce_key)
SELECT g, 1000 + g,
       CASE WHEN g = ANY(%(poison)s) THEN 'poison-'
            WHEN g %% 13 = 0 THEN 'bad-' WHEN g %% 7 = 0 THEN 'flaky-' ELSE 'dev-' END
           || lpad(g::text, 6, '0'),
       lab_now(), 'notif-' || (1000 + g)
  FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g;

-- name: drain_in_flight
-- Leased and unfinished: the latest write to the row was a claim, and it is pending.
SELECT d.id
  FROM delivery d
 WHERE d.status = 'pending'
   AND (SELECT a.op FROM torture_audit a WHERE a.delivery_id = d.id
         ORDER BY a.seq DESC LIMIT 1) = 'claim';

-- name: drain_held_by
-- Rows whose latest claim is %(worker)s's and that it has not completed yet.
SELECT d.id
  FROM delivery d
 WHERE d.status = 'pending'
   AND (SELECT a.op || ':' || a.worker FROM torture_audit a WHERE a.delivery_id = d.id
         ORDER BY a.seq DESC LIMIT 1) = 'claim:' || %(worker)s;

-- name: drain_duplicated
-- Deliveries pushed to a device more than once.
SELECT delivery_id FROM device_push GROUP BY delivery_id HAVING count(*) > 1;

-- name: queue_fill
-- Pending jobs %(first)s..%(last)s, one a second
-- from 2026-01-01 09:00 UTC (job 1 is the oldest).
INSERT INTO job (id, created_at, payload)
SELECT g, timestamptz '2026-01-01 09:00:00+00' + (g - 1) * interval '1 second', 'job ' || g
  FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g;
