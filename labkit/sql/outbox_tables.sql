-- The business table and its outbox.
-- A shop order is the business row. Placing it must also announce it to the rest of
-- the system ("order placed"), so the same transaction writes one outbox row: the
-- order and its announcement exist together or not at all.
CREATE TABLE shop_order (
    id              bigint      PRIMARY KEY,
    item            text        NOT NULL,
    placed_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    labels_printed  int         NOT NULL DEFAULT 0   -- the consumer's effect (see inbox)
);

CREATE TABLE outbox (
    id            bigserial   PRIMARY KEY,
    event_id      text        NOT NULL UNIQUE,       -- what consumers deduplicate on
    aggregate     text        NOT NULL,              -- which business row it is about
    payload       jsonb       NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    published_at  timestamptz                         -- NULL until the relay commits
);

-- The relay and the lag metrics read only unpublished rows: index exactly those.
-- A row inserted already published would get no entry. A row the relay marks
-- published gets no entry for its new version, but the entry of its old version
-- stays, pointing at a dead row version, until VACUUM removes it (or a scan finds
-- the row version dead and marks the entry so). Until then a scan still reads it.
CREATE INDEX outbox_unpublished_idx ON outbox (created_at, id) WHERE published_at IS NULL;

-- The consumer's inbox: one row per event it has applied. The primary key is the
-- deduplication: a second copy of an event cannot insert its row again.
CREATE TABLE inbox (
    event_id    text        PRIMARY KEY,
    applied_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
