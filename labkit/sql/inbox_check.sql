-- The scene of the inbox exercise's checker (labkit.tools.exercises.inbox). Its tables are the
-- outbox lab's (outbox_tables.sql): shop_order, whose labels_printed is the effect, and inbox.
-- The checker reads what happened from them, never from the SQL it was given.

-- name: labels
-- The effect, read back after every delivery: the labels printed for each order.
SELECT id, labels_printed FROM shop_order ORDER BY id;

-- name: recorded
-- What the record step left in the inbox: the event ids recorded.
SELECT event_id FROM inbox ORDER BY event_id;
