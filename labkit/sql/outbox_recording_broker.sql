-- The recording broker: a stand-in for RabbitMQ that keeps its messages in a table.
-- It is written ONLY over the broker's own autocommit connection, never inside a
-- relay's transaction: a publish is durable the moment it returns, a relay's
-- rollback cannot undo it, and a killed relay cannot take it back -- as with a
-- real broker. `up` is the broker's power switch for the "broker down" lab.

-- name: create
-- The broker's two tables: its messages, and its switch, on.
CREATE TABLE broker_message (
    seq        bigserial   PRIMARY KEY,              -- arrival order = delivery order
    event_id   text        NOT NULL,                 -- the message id (not unique!)
    body       jsonb       NOT NULL,
    delivered  boolean     NOT NULL DEFAULT false
);
CREATE TABLE broker_switch (up boolean NOT NULL);
INSERT INTO broker_switch VALUES (true);

-- name: publish
-- Keep one message, but only while the broker is on: no row written is a refusal.
INSERT INTO broker_message (event_id, body)
SELECT %(event_id)s, %(body)s
 WHERE (SELECT up FROM broker_switch);

-- name: depth
-- The messages the broker holds that no consumer has taken yet.
SELECT count(*) FROM broker_message WHERE NOT delivered;

-- name: take_all
-- Deliver every held message once (the caller sorts them by seq: arrival order).
UPDATE broker_message
   SET delivered = true
 WHERE NOT delivered
RETURNING seq, event_id, body;

-- name: switch
-- The power switch: %(up)s is true (on) or false (off: every publish is refused).
UPDATE broker_switch SET up = %(up)s;
