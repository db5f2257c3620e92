-- What labkit asks a MySQL-compatible server (MySQL 8, MariaDB 10.6 and later) about its
-- own sessions: the cross-engine appendix's counterpart of engine.sql. labkit.core.mysql
-- and labkit.core.mysessions read the sections by name.

-- name: blockers_mariadb
-- MariaDB: which sessions the session %(thread)s waits for, and the lock it asked for.
-- InnoDB lists a transaction's lock requests that wait (INNODB_LOCK_WAITS) and the locks
-- involved in a wait (INNODB_LOCKS): a gap lock reads 'X,GAP', a record lock 'X'.
SELECT b.trx_mysql_thread_id AS blocking_thread,
       l.lock_type, l.lock_mode, l.lock_index, l.lock_data
  FROM information_schema.INNODB_LOCK_WAITS AS w
  JOIN information_schema.INNODB_TRX AS r ON r.trx_id = w.requesting_trx_id
  JOIN information_schema.INNODB_TRX AS b ON b.trx_id = w.blocking_trx_id
  LEFT JOIN information_schema.INNODB_LOCKS AS l ON l.lock_id = w.requested_lock_id
 WHERE r.trx_mysql_thread_id = %(thread)s;

-- name: blockers_mysql
-- MySQL 8: the same question, through performance_schema.data_lock_waits and data_locks.
SELECT b.trx_mysql_thread_id AS blocking_thread,
       l.LOCK_TYPE, l.LOCK_MODE, l.INDEX_NAME, l.LOCK_DATA
  FROM performance_schema.data_lock_waits AS w
  JOIN information_schema.INNODB_TRX AS r ON r.trx_id = w.REQUESTING_ENGINE_TRANSACTION_ID
  JOIN information_schema.INNODB_TRX AS b ON b.trx_id = w.BLOCKING_ENGINE_TRANSACTION_ID
  LEFT JOIN performance_schema.data_locks AS l ON l.ENGINE_LOCK_ID = w.REQUESTING_ENGINE_LOCK_ID
 WHERE r.trx_mysql_thread_id = %(thread)s;

-- name: lab_sessions
-- The sessions of this login connected to a lab's database, but for the asking one: an
-- interrupted run's leftovers, which would keep DROP DATABASE waiting on their locks.
SELECT id
  FROM information_schema.PROCESSLIST
 WHERE db = %(db)s AND user = SUBSTRING_INDEX(CURRENT_USER(), '@', 1) AND id <> CONNECTION_ID();

-- name: user_sessions
-- The sessions of one user (a throw-away user that ran a spec), to be KILLed before it is
-- dropped.
SELECT id
  FROM information_schema.PROCESSLIST
 WHERE user = %(user)s;

-- name: sandbox_leftovers
-- Throw-away users that killed runs left behind: no session, and rights on one database
-- only, which is gone. (In a grant's database name _ is written \_; '\\_' reads it back.)
SELECT u.User, u.Host
  FROM mysql.user AS u
 WHERE u.User LIKE %(like)s
   AND NOT EXISTS (SELECT 1 FROM information_schema.PROCESSLIST AS p WHERE p.USER = u.User)
   AND EXISTS (SELECT 1 FROM mysql.db AS d WHERE d.User = u.User AND d.Host = u.Host)
   AND NOT EXISTS (SELECT 1
                     FROM mysql.db AS d
                     JOIN information_schema.SCHEMATA AS s
                       ON s.SCHEMA_NAME = REPLACE(d.Db, '\\_', '_')
                    WHERE d.User = u.User AND d.Host = u.Host);
