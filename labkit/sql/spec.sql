-- What `labkit spec run` asks the server before it runs a spec. Each query runs with
-- parameters, so a literal % is written %%.

-- name: classroom_login
-- The classroom trainee role this session logged in as (or has become), if it is one: a
-- role named claimlab_* that labkit classroom marked with its comment.
SELECT r.rolname
  FROM pg_catalog.pg_roles AS r
 WHERE r.rolname IN (session_user, current_user)
   AND r.rolname LIKE %(like)s
   AND pg_catalog.shobj_description(r.oid, 'pg_authid') = %(mark)s
 LIMIT 1;
