-- The recording broker: a stand-in for RabbitMQ that keeps its messages in a table.
-- It is written ONLY over the broker's own autocommit connection, never inside a
-- relay's transaction: a publish is durable the moment it returns, a relay's
-- rollback cannot undo it, and a killed relay cannot take it back -- as with a
-- real broker. `up` is the broker's power switch for the "broker down" lab.
CREATE TABLE broker_message (
    seq        bigserial   PRIMARY KEY,              -- arrival order = delivery order
    event_id   text        NOT NULL,                 -- the message id (not unique!)
    body       jsonb       NOT NULL,
    delivered  boolean     NOT NULL DEFAULT false
);
CREATE TABLE broker_switch (up boolean NOT NULL);
INSERT INTO broker_switch VALUES (true);
