-- The transactions that hold back VACUUM (labkit.labs.claims.wait_for_horizon): a
-- snapshot (backend_xmin) or a transaction id (backend_xid: a writing transaction idle
-- between statements has no snapshot, but its id still counts) older than ours.

-- name: older_transactions
-- Other sessions of this database that still see rows older than transaction %(x)s.
SELECT pid, xact_start
  FROM pg_stat_activity
 WHERE datname = current_database()
   AND pid <> pg_backend_pid()
   AND (age(backend_xmin) >= age(xid(%(x)s::xid8))
        OR age(backend_xid) >= age(xid(%(x)s::xid8)))
 ORDER BY xact_start;
