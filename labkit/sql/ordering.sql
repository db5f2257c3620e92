-- Ordering with more than one relay (labkit.labs.ordering reads the sections by name).
-- The outbox of outbox_tables.sql, with a version per aggregate: the producer bumps the
-- aggregate's version in the same transaction that writes the event, so the versions of
-- one aggregate are 1, 2, 3... in the order its events were committed.

-- name: tables
-- The aggregates' current versions (the producer's
-- business rows), and the outbox's version column.
CREATE TABLE aggregate_state (
    aggregate  text PRIMARY KEY,
    version    int  NOT NULL                  -- the version of the aggregate's last event
);
ALTER TABLE outbox ADD COLUMN version int;
ALTER TABLE outbox ADD CONSTRAINT outbox_aggregate_version_key UNIQUE (aggregate, version);
-- The per-aggregate claim asks "is an older event of this aggregate still unpublished?"
CREATE INDEX outbox_unpublished_aggregate_idx ON outbox (aggregate, created_at, id)
 WHERE published_at IS NULL;

-- name: produce
-- One event, in ONE transaction: bump its aggregate's version
-- (the row lock orders its writers), write the event.
WITH bumped AS (
    INSERT INTO aggregate_state AS a (aggregate, version)
    VALUES (%(aggregate)s, 1)
    ON CONFLICT (aggregate) DO UPDATE SET version = a.version + 1
    RETURNING aggregate, version
)
INSERT INTO outbox (event_id, aggregate, version, payload)
SELECT 'evt-' || aggregate || '-v' || version, aggregate, version,
       jsonb_build_object('type', 'order_changed', 'aggregate', aggregate, 'version', version)
  FROM bumped
RETURNING event_id;

-- name: claim_per_aggregate
-- The per-aggregate claim: an event only when no older event of its aggregate is unpublished.

-- A claimed event stays unpublished until its relay COMMITs the mark. So while a relay
-- holds an aggregate's oldest event, that event is locked (skipped) and every later event
-- of the aggregate has an older one unpublished (excluded): one claimer per aggregate at a
-- time, at most one event per aggregate in a batch. As in notebook 05's claim_per_key.sql,
-- the test is "an older one is not done", never "an older one is claimed": another
-- relay's claim is invisible until it commits.
-- "Older" is (created_at, id), the version order only because created_at defaults to
-- clock_timestamp(), read after "produce" took the version lock. With DEFAULT now() (the
-- transaction's start) a writer that began first but got the lock second would write v2
-- with an earlier created_at than v1. older.version < o.version holds whatever the clock
-- does (index the probe on (aggregate, version) then).
SELECT id, event_id, payload
  FROM outbox o
 WHERE published_at IS NULL
   AND NOT EXISTS (SELECT 1
                     FROM outbox older
                    WHERE older.aggregate = o.aggregate
                      AND older.published_at IS NULL
                      AND (older.created_at, older.id) < (o.created_at, o.id))
 ORDER BY created_at, id
 LIMIT %(batch)s
   FOR UPDATE SKIP LOCKED;

-- name: claim_partition
-- The partitioned claim: relay %(partition)s of
-- %(relays)s claims the aggregates whose hash maps to it.

-- The hash: the first byte of md5(aggregate), modulo the number of relays.
-- Every event of one aggregate goes to the same relay, which publishes them in claim order.
-- It holds while every relay agrees on %(relays)s.
SELECT id, event_id, payload
  FROM outbox
 WHERE published_at IS NULL
   AND mod(get_byte(decode(md5(aggregate), 'hex'), 0), %(relays)s) = %(partition)s
 ORDER BY created_at, id
 LIMIT %(batch)s
   FOR UPDATE SKIP LOCKED;

-- name: unpublished
-- Events still unpublished (claimed ones included): all of them, or those of one partition.
SELECT count(*)
  FROM outbox
 WHERE published_at IS NULL
   AND (%(partition)s::int IS NULL
        OR mod(get_byte(decode(md5(aggregate), 'hex'), 0), %(relays)s) = %(partition)s);

-- name: consumer_tables
-- The consumer's side: last version applied per
-- aggregate, events parked behind a gap, effects applied.
CREATE TABLE applied_version (
    aggregate  text PRIMARY KEY,
    version    int  NOT NULL                  -- 0: nothing applied yet
);
CREATE TABLE parked_event (
    aggregate  text  NOT NULL,
    version    int   NOT NULL,
    event_id   text  NOT NULL,
    PRIMARY KEY (aggregate, version)
);
CREATE TABLE applied_event (
    seq        bigserial PRIMARY KEY,         -- the order the effects were applied in
    aggregate  text NOT NULL,
    version    int  NOT NULL,
    event_id   text NOT NULL
);

-- name: last_applied
-- The consumer reads, and locks until its COMMIT,
-- the last version it applied to this aggregate.
INSERT INTO applied_version (aggregate, version) VALUES (%(aggregate)s, 0)
ON CONFLICT (aggregate) DO NOTHING;
SELECT version FROM applied_version WHERE aggregate = %(aggregate)s FOR UPDATE;

-- name: apply
-- The effect, and the aggregate's new last applied version, in the consumer's transaction.
WITH effect AS (
    INSERT INTO applied_event (aggregate, version, event_id)
    VALUES (%(aggregate)s, %(version)s, %(event_id)s)
)
UPDATE applied_version SET version = %(version)s WHERE aggregate = %(aggregate)s;

-- name: park
-- A gap before this event: keep it until the missing versions have been applied.
INSERT INTO parked_event (aggregate, version, event_id)
VALUES (%(aggregate)s, %(version)s, %(event_id)s)
ON CONFLICT (aggregate, version) DO NOTHING;

-- name: unpark
-- The parked event that comes next for this aggregate,
-- taken out of the parking lot (none: no row).
DELETE FROM parked_event
 WHERE aggregate = %(aggregate)s AND version = %(version)s
RETURNING event_id;

-- name: consumer_outcome
-- What a consumer did: applied, applied late, applied
-- twice, never applied, still parked, aggregates behind.
SELECT (SELECT count(*) FROM applied_event),
       (SELECT count(*)
          FROM (SELECT version < max(version) OVER (PARTITION BY aggregate ORDER BY seq
                                                    ROWS BETWEEN UNBOUNDED PRECEDING
                                                             AND 1 PRECEDING) AS late
                  FROM applied_event) s
         WHERE late),
       (SELECT count(*) - count(DISTINCT (aggregate, version)) FROM applied_event),
       (SELECT count(*)
          FROM outbox o
         WHERE NOT EXISTS (SELECT 1 FROM applied_event e
                            WHERE e.aggregate = o.aggregate AND e.version = o.version)),
       (SELECT count(*) FROM parked_event),
       (SELECT count(*)
          FROM aggregate_state s
          LEFT JOIN applied_version v USING (aggregate)
         WHERE v.version IS DISTINCT FROM s.version);
