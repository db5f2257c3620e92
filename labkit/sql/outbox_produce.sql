-- The producer: the business row and its outbox row in ONE transaction
-- (labkit runs these two statements between BEGIN and COMMIT).
-- If the transaction rolls back, neither row exists; if it commits, both do.
-- No broker is called here: publishing is the relay's job, later.
INSERT INTO shop_order (id, item) VALUES (%(order_id)s, %(item)s);
INSERT INTO outbox (event_id, aggregate, payload)
VALUES (%(event_id)s, 'shop_order:' || %(order_id)s,
        jsonb_build_object('type', 'order_placed', 'order_id', %(order_id)s::bigint,
                           'item', %(item)s::text));
