-- The notification drain's tables: the delivery ledger, and what the push service
-- delivered to each device. Time is the lab's clock, lab_now() (clock.sql).
-- Re-running this file starts over.
DROP TABLE IF EXISTS device_push, delivery CASCADE;
DROP FUNCTION IF EXISTS drain_backoff(integer);

-- Retry delay after a transient failure: 10 s, 20 s, 40 s ... capped at one hour.
CREATE FUNCTION drain_backoff(attempts integer) RETURNS interval
LANGUAGE sql IMMUTABLE AS $$
    SELECT least(interval '10 s' * power(2, greatest(attempts, 1) - 1), interval '1 hour')
$$;

-- One row per (notification, device). pending rows are claimable once
-- next_attempt_at has passed; sent and failed are terminal and never claimed again.
-- attempts counts claims (so a crashed attempt counts), outcomes counts outcome writes:
-- attempts - outcomes is how many attempts never reported (the drain died or hung).
CREATE TABLE delivery (
    id               bigint      PRIMARY KEY,
    notification_id  bigint      NOT NULL,
    device_token     text        NOT NULL,
    status           text        NOT NULL DEFAULT 'pending'
                                 CHECK (status IN ('pending', 'sent', 'failed')),
    attempts         integer     NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL,
    coalesce_key     text,                 -- sent as the push's collapse id
    claim_version    bigint      NOT NULL DEFAULT 0, -- +1 on every claim: the fence
    outcomes         integer     NOT NULL DEFAULT 0, -- +1 on every outcome write
    reported_version bigint      NOT NULL DEFAULT 0, -- the claim the last outcome write was for
    last_error       text,
    sent_at          timestamptz
);

-- The due-rows predicate, indexed exactly: only pending rows, in due order.
CREATE INDEX delivery_due_idx ON delivery (next_attempt_at, id) WHERE status = 'pending';

-- The push service's own record: every push a device received, kept outside any
-- drain transaction (the service keeps it whether or not the drain survives).
CREATE TABLE device_push (
    seq              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    delivery_id      bigint      NOT NULL,     -- sent with the push: a key a receiver can check
    claim_version    bigint      NOT NULL,     -- the claim the push was sent under
    device_token     text        NOT NULL,
    notification_id  bigint      NOT NULL,
    collapse_id      text,
    pushed_by        text        NOT NULL,
    pushed_at        timestamptz NOT NULL
);
