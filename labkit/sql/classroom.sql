-- labkit classroom: one login role per trainee on a shared PostgreSQL, and what the
-- presenter asks about them. Every role is marked by its comment, so that status, clean
-- and drop touch the classroom's roles and nothing else.

-- name: roles
-- The classroom's roles on this server, oldest first.
SELECT r.rolname
  FROM pg_catalog.pg_roles AS r
 WHERE r.rolname LIKE %(like)s
   AND pg_catalog.shobj_description(r.oid, 'pg_authid') = %(mark)s
 ORDER BY r.rolname;

-- name: create_role
-- A trainee: may log in, and nothing else of its own (no superuser, no new databases or
-- roles, no replication, no row-level-security bypass), with a share of the server's
-- connections. The password is given as its SCRAM verifier, so the statement's text (in a
-- server log, or pg_stat_statements) does not hold the password.
CREATE ROLE {role} LOGIN PASSWORD {verifier}
  NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION NOBYPASSRLS
  CONNECTION LIMIT {connections};

-- name: connection_budget
-- The connections left for trainees: the server's max_connections less those reserved for
-- superusers (and, from PostgreSQL 16, for pg_use_reserved_connections) and ten for the
-- administrator and other users; and whether this role is a superuser.
SELECT greatest(0, current_setting('max_connections')::int
                   - current_setting('superuser_reserved_connections')::int
                   - coalesce(current_setting('reserved_connections', true)::int, 0)
                   - 10),
       (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user);

-- name: grant
-- What the labs need: connect, and create schemas of their own (lab_<notebook>_<user>),
-- and temporary tables. Nothing on any other trainee's schema: a schema is its owner's.
GRANT CONNECT, CREATE, TEMPORARY ON DATABASE {database} TO {role};

-- name: progress
-- Per trainee: the lab schemas they own, the one rebuilt last (its catalogue row is the
-- youngest: a notebook's setup cell drops and re-creates its schema), their sessions and
-- those idle inside a transaction.
SELECT r.rolname,
       (SELECT count(*) FROM pg_catalog.pg_namespace n
         WHERE n.nspowner = r.oid AND n.nspname LIKE 'lab\_%%') AS schemas,
       (SELECT n.nspname FROM pg_catalog.pg_namespace n
         WHERE n.nspowner = r.oid AND n.nspname LIKE 'lab\_%%'
         ORDER BY pg_catalog.age(n.xmin) ASC LIMIT 1) AS last_schema,
       (SELECT pg_catalog.left(pg_catalog.obj_description(n.oid, 'pg_namespace'), 100)
          FROM pg_catalog.pg_namespace n
         WHERE n.nspowner = r.oid AND n.nspname LIKE 'lab\_%%'
         ORDER BY pg_catalog.age(n.xmin) ASC LIMIT 1) AS last_schema_mark,
       (SELECT count(*) FROM pg_catalog.pg_stat_activity a
         WHERE a.usename = r.rolname AND a.backend_type = 'client backend') AS sessions,
       (SELECT count(*) FROM pg_catalog.pg_stat_activity a
         WHERE a.usename = r.rolname AND a.state LIKE 'idle in transaction%%')
         AS idle_in_transaction
  FROM pg_catalog.pg_roles r
 WHERE r.rolname = ANY(%(roles)s)
 ORDER BY r.rolname;

-- name: end_sessions
-- End the trainees' sessions: those idle inside a transaction (holding their locks for
-- nothing) for at least idle_s seconds, or with every_one, all of them. A notebook holds a
-- transaction open on purpose for a few seconds (the lock demonstrations), hence the
-- threshold. Only the classroom's roles are ever named.
SELECT a.pid, a.usename, a.state, pg_catalog.pg_terminate_backend(a.pid)
  FROM pg_catalog.pg_stat_activity a
 WHERE a.usename = ANY(%(roles)s)
   AND a.pid <> pg_catalog.pg_backend_pid()
   AND (%(every_one)s
        OR (a.state LIKE 'idle in transaction%%'
            AND a.state_change <= pg_catalog.now()
                                  - pg_catalog.make_interval(secs => %(idle_s)s)));

-- name: backends
-- Each trainee's server processes (one per session): whose they are and their process ids,
-- for the room's load test to weigh their memory.
SELECT a.usename, a.pid
  FROM pg_catalog.pg_stat_activity a
 WHERE a.usename = ANY(%(roles)s);

-- name: other_databases
-- The server's other databases a role may connect to (through PUBLIC's CONNECT, unless the
-- database's owner revoked it).
SELECT d.datname
  FROM pg_catalog.pg_database d
 WHERE d.datallowconn AND d.datname <> %(here)s
   AND pg_catalog.has_database_privilege(%(role)s, d.oid, 'CONNECT')
 ORDER BY d.datname;

-- name: dependants_outside
-- Objects owned by someone outside the classroom that depend on an object a trainee owns
-- (an administrator's view over a trainee's table): DROP OWNED ... CASCADE would drop them.
SELECT DISTINCT pg_catalog.pg_describe_object(d.classid, d.objid, 0),
       pg_catalog.pg_get_userbyid(c.relowner),
       pg_catalog.pg_describe_object(d.refclassid, d.refobjid, 0)
  FROM pg_catalog.pg_depend d
  JOIN pg_catalog.pg_rewrite w
    ON d.classid = 'pg_catalog.pg_rewrite'::regclass AND w.oid = d.objid
  JOIN pg_catalog.pg_class c ON c.oid = w.ev_class
  JOIN pg_catalog.pg_class t
    ON d.refclassid = 'pg_catalog.pg_class'::regclass AND t.oid = d.refobjid
 WHERE t.relowner IN (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = ANY(%(roles)s))
   AND c.relowner NOT IN (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = ANY(%(roles)s))
   AND c.oid <> t.oid
 ORDER BY 1;

-- name: database_search_path
-- The search_path this database sets for every role (ALTER DATABASE ... SET), if any.
SELECT c
  FROM pg_catalog.pg_db_role_setting s, unnest(s.setconfig) AS c
 WHERE s.setdatabase = (SELECT oid FROM pg_catalog.pg_database
                         WHERE datname = current_database())
   AND s.setrole = 0
   AND c LIKE 'search\_path=%%';
