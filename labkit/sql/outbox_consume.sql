-- The consumer, per message, in ONE transaction (labkit wraps it in BEGIN/COMMIT):
-- record the event id in the inbox; only if that row is new, apply the effect
-- (print the order's shipping label). A duplicate inserts nothing, so its effect is
-- skipped -- and a crash between the two halves cannot happen: they commit together.
WITH first_time AS (
    INSERT INTO inbox (event_id) VALUES (%(event_id)s)
    ON CONFLICT (event_id) DO NOTHING
    RETURNING event_id
)
UPDATE shop_order
   SET labels_printed = labels_printed + 1
 WHERE id = %(order_id)s
   AND EXISTS (SELECT 1 FROM first_time);
