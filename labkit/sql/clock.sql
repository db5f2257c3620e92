-- name: install
-- A clock the lab can move, for every lab that waits on time (leases, retries, backoff):
-- lab_now() is frozen_at + shift, and a NULL frozen_at means the server's real clock. A lab
-- freezes it at a fixed instant and moves it on ("+120 s") at once, so its traces reproduce
-- exactly. Safe to rerun: an existing clock is kept (a lab then freezes or frees it).
CREATE TABLE IF NOT EXISTS lab_clock (
    only_row   boolean     PRIMARY KEY DEFAULT true CHECK (only_row),
    frozen_at  timestamptz,
    shift      interval    NOT NULL DEFAULT '0 s'
);
INSERT INTO lab_clock DEFAULT VALUES ON CONFLICT DO NOTHING;
CREATE OR REPLACE FUNCTION lab_now() RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT coalesce(frozen_at, now()) + shift FROM lab_clock
$$;

-- name: freeze
-- Stop the clock at an instant (shift back to zero).
UPDATE lab_clock SET frozen_at = %(at)s, shift = '0 s';

-- name: real
-- Back to the server's clock.
UPDATE lab_clock SET frozen_at = NULL, shift = '0 s';

-- name: advance
-- Move the clock on by a number of seconds, at once.
UPDATE lab_clock SET shift = shift + make_interval(secs => %(seconds)s);

-- name: now
-- The lab's time.
SELECT lab_now();

-- name: frozen
-- Whether the clock is stopped.
SELECT frozen_at IS NOT NULL FROM lab_clock;

-- name: elapsed
-- Seconds the clock has been moved on since it was frozen.
SELECT extract(epoch FROM shift) FROM lab_clock;

-- name: since_frozen
-- Seconds from the frozen instant to a timestamp (NULL on the real clock).
SELECT extract(epoch FROM %(ts)s::timestamptz - frozen_at) FROM lab_clock;
