-- After every claimed row is in the broker: mark the batch, in the SAME transaction
-- as the claim, then COMMIT. A row is marked published only if its message was
-- published first, so a marked row can never be a lost event.
UPDATE outbox
   SET published_at = now()
 WHERE id = ANY(%(ids)s);
