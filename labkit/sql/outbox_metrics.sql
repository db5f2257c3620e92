-- Relay lag, from the partial index alone: how many events wait to be published,
-- and how long the oldest of them has waited. Published rows are not in the index,
-- so this stays cheap however large the outbox grows.
SELECT count(*)                                                    AS depth,
       coalesce(extract(epoch FROM clock_timestamp() - min(created_at)), 0)::float8
                                                                   AS oldest_age_s
  FROM outbox
 WHERE published_at IS NULL;
