-- Relay lag, from the partial index: how many events wait to be published, and how
-- long the oldest of them has waited. Its cost follows the index's entries: one per
-- unpublished row, plus one per row published since the last VACUUM (marking a row
-- leaves its old entry behind until VACUUM removes it) -- not the whole history.
SELECT count(*)                                                    AS depth,
       coalesce(extract(epoch FROM clock_timestamp() - min(created_at)), 0)::float8
                                                                   AS oldest_age_s
  FROM outbox
 WHERE published_at IS NULL;
