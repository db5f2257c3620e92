"""A lab: one schema of its own on the server, rebuilt from scratch on reset().

Every connection a lab opens carries ``application_name = labkit:<schema>``.
That lets reset() end the sessions an interrupted run left behind (they may
hold row locks on the lab's tables) without touching anyone else's, and lets
``labkit doctor`` find leftovers.  Ending a backend of one's own role needs no
superuser.
"""

from __future__ import annotations

import hashlib
import re
import weakref
from typing import Any

import psycopg
from psycopg import sql

from .checked import one_row
from .db import Database, Guards, current_user_tag, session_name
from .errors import LabkitError, ServerError
from .files import read_sql
from .queries import query

SCHEMA_PREFIX = "lab_"

# A lab's jobs: the first created at this time, the next ones step_s seconds apart.
FIRST_JOB_START = "2026-01-01 09:00:00+00"
FIRST_JOB_STEP_S = 1
FIRST_JOB: dict[str, Any] = {"start": FIRST_JOB_START, "step_s": FIRST_JOB_STEP_S}


# Every connection of a lab is named ``labkit:<schema>:<role>``, and PostgreSQL keeps only
# 63 characters of an application_name: a schema name of at most 41 characters leaves room
# for a role of up to 14 ("admin", "monitor", "convoy-w31", "bench-pgbench"...), so the
# role is never cut off (tests and `labkit doctor` tell sessions apart by it).
MAX_SCHEMA = 41


def schema_name(name: str, user: str | None = None) -> str:
    """``lab_<name>_<user>``, lower case, at most 41 characters (a longer one keeps its
    start and ends in a short hash of the whole, so it stays unique)."""
    user = user or current_user_tag()
    base = re.sub(r"[^a-z0-9]+", "_", f"{name}_{user}".lower()).strip("_")
    full = SCHEMA_PREFIX + base
    if len(full) <= MAX_SCHEMA:
        return full
    digest = hashlib.sha1(full.encode()).hexdigest()[:8]
    return f"{full[:MAX_SCHEMA - 9].rstrip('_')}_{digest}"


def advisory_key(schema: str, purpose: str = "") -> int:
    """A bigint advisory-lock key of the lab ``schema``'s own, one per ``purpose``.  Advisory
    locks are database-wide, not per schema: two labs (two trainees on one server) that took
    the same key would wait for each other.  48 bits of a hash of the schema's name (and the
    purpose), so always positive: its high half is the lock's ``classid`` in ``pg_locks``,
    its low half ``objid`` (``objsubid`` 1)."""
    text = schema if not purpose else f"{schema}:{purpose}"
    return int(hashlib.sha1(text.encode()).hexdigest()[:12], 16)



def own_lab_schemas(conn: psycopg.Connection, *, tag: str | None = None,
                    like: str = r"lab\_%") -> list[str]:
    """The lab schemas of user ``tag`` (or of any user, with labkit's mark) that this role
    owns and whose name matches the LIKE pattern ``like``."""
    return [r[0] for r in conn.execute(query("engine.sql", "own_lab_schemas").sql, {"like": like, "tag": tag}).fetchall()]


def drop_schemas(conn: psycopg.Connection, like: str = r"lab\_%", *, tag: str | None = None) -> list[str]:
    """Drop the lab schemas that ``own_lab_schemas`` names, with what is in them; returns
    the names dropped.  Schemas of other users, of other roles, or not made by labkit are
    never touched."""
    names = own_lab_schemas(conn, tag=tag, like=like)
    for name in names:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
    return names


class Lab:
    """A schema on a server, with helpers to open connections into it."""

    def __init__(self, db: Database, name: str, *, user: str | None = None):
        self.db = db
        self.name = name
        self.user_tag = user or current_user_tag()
        self.schema = schema_name(name, self.user_tag)
        self.app_name = session_name(self.schema)    # its sessions are named app_name[:role]
        self._conns: weakref.WeakSet = weakref.WeakSet()
        self._admin: psycopg.Connection | None = None

    @classmethod
    def open(cls, db: Database, name: str, *, user: str | None = None, reset: bool = True) -> Lab:
        """The lab ``name`` on ``db``: its schema made afresh (``reset=False`` keeps what is there)."""
        lab = cls(db, name, user=user)
        if reset:
            lab.reset()
        return lab

    def __repr__(self) -> str:
        return f"Lab({self.schema!r} on {self.db.backend})"

    def advisory_key(self, purpose: str = "") -> int:
        """An advisory-lock key of this lab's own, for ``purpose`` (:func:`advisory_key`)."""
        return advisory_key(self.schema, purpose)

    # A lab used as a context manager is a scratch lab: dropped when the block ends.
    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc) -> None:
        self.drop()

    # -- connections --------------------------------------------------------------
    def connect(self, *, autocommit: bool = True, role: str = "",
                guards: Guards | None = None) -> psycopg.Connection:
        """A connection into the lab's schema, named ``labkit:<schema>:<role>``."""
        conn = self.db.connect(autocommit=autocommit, schema=self.schema, role=role, guards=guards)
        self._conns.add(conn)
        return conn

    @property
    def admin(self) -> psycopg.Connection:
        """A long-lived autocommit connection for set-up and inspection."""
        a = self._admin
        if a is not None and not a.closed and not a.broken and \
                a.info.transaction_status == psycopg.pq.TransactionStatus.ACTIVE:
            # Interrupted mid-statement (Ctrl-C, SIGTERM): the connection still waits for
            # that statement's result and would refuse the next one.  Clean-up needs a
            # connection that works; this one is dropped (reset() and drop() end its backend).
            a.close()
        if self._admin is None or self._admin.closed or self._admin.broken:
            self._admin = self.connect(role="admin")
        return self._admin

    def execute(self, query, params=None) -> list[tuple]:
        """Run SQL on the admin connection; return the rows of the last statement, if any."""
        try:
            cur = self.admin.execute(query, params)
        except psycopg.OperationalError as exc:
            if not (self._admin is None or self._admin.broken or self._admin.closed):
                raise  # a lock or timeout error (55P03, 57014, 40P01...): the server is fine
            self._admin = None
            raise ServerError(
                f"The server stopped answering while running SQL for {self.schema} ({exc}).",
                "if you use the embedded server, run `labkit server start` (or call "
                "labkit.connect() again) and re-run the notebook from the top.",
            ) from None
        return cur.fetchall() if cur.description else []

    def query_df(self, query, params=None):
        import pandas as pd

        cur = self.admin.execute(query, params)
        cols = [c.name for c in cur.description]
        return pd.DataFrame(cur.fetchall(), columns=cols)

    def run_file(self, name: str) -> None:
        """Run one of labkit's .sql files in this lab's schema."""
        self.execute(read_sql(name))

    # -- life cycle -----------------------------------------------------------------
    def end_sessions(self) -> int:
        """Terminate this lab's other backends (left over from an earlier run)."""
        rows = self.admin.execute(query("engine.sql", "end_lab_sessions").sql,
                                  {"app": self.app_name}).fetchall()
        return len(rows)

    def reset(self) -> Lab:
        """Drop and re-create the lab's schema (and end sessions left over in it)."""
        self.close_connections()
        self.end_sessions()
        ident = sql.Identifier(self.schema)
        try:
            with self.admin.transaction():
                self.admin.execute("SET LOCAL lock_timeout = '10s'")
                self.admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(ident))
                self.admin.execute(sql.SQL("CREATE SCHEMA {}").format(ident))
                self.admin.execute(sql.SQL("COMMENT ON SCHEMA {} IS {}").format(
                    ident, sql.Literal(f"labkit:{self.user_tag}")))
        except psycopg.errors.LockNotAvailable:
            raise LabkitError(
                f"Could not rebuild schema {self.schema}: another session holds a lock in it.",
                "run `labkit doctor` to find it, end it, and run the cell again.",
            ) from None
        except psycopg.errors.InsufficientPrivilege:
            owner = self._foreign_owner()
            if owner is not None:
                raise LabkitError(
                    f"The schema {self.schema} carries your name but was made by the role "
                    f"{owner!r}, not by you ({self.admin.info.user!r}): on a shared server, "
                    "someone made it before you did.",
                    f"ask the presenter to drop it (`DROP SCHEMA {self.schema} CASCADE`, as the "
                    "server's administrator); meanwhile set LABKIT_USER to another name to work "
                    "in a schema of another name.",
                ) from None
            raise LabkitError(
                f"The database user may not create the schema {self.schema}.",
                "ask the server's owner for `GRANT CREATE ON DATABASE <db> TO <you>`.",
            ) from None
        return self

    def _foreign_owner(self) -> str | None:
        """The role that owns this lab's schema when it is not ours (nor one we belong to)."""
        try:
            row = self.admin.execute(
                "SELECT pg_catalog.pg_get_userbyid(n.nspowner), "
                "       pg_catalog.pg_has_role(n.nspowner, 'USAGE') "
                "  FROM pg_catalog.pg_namespace n WHERE n.nspname = %s", (self.schema,)).fetchone()
        except psycopg.Error:
            return None
        return row[0] if row and not row[1] else None

    def drop(self) -> None:
        self.close_connections()
        self.end_sessions()
        self.admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(self.schema)))
        self.close()

    def discard(self) -> None:
        """Drop the lab on a clean-up path: a failure here (the server gone, say) is
        swallowed, so that the error that sent us here is the one reported."""
        try:
            self.drop()
        except Exception:
            pass

    def when_lock_granted(self, statement: str, params: dict, wait_s: float) -> tuple[Any, list]:
        """Start a thread that runs ``statement`` (a query that waits for a row lock, then
        reads ``clock_timestamp()``) in a session of the lab, waiting at most ``wait_s``.
        Returns the thread and a list that receives the server's clock at the moment the
        lock was granted (it stays empty when the wait failed)."""
        import threading

        granted: list = []

        def wait() -> None:
            try:
                with self.connect(role="waiter", guards=Guards(lock_timeout=f"{int(wait_s * 1000)}ms")) as conn:
                    granted.append(one_row(conn.execute(statement, params), "the waiter's statement")[0])
            except psycopg.Error:
                pass
        thread = threading.Thread(target=wait, daemon=True)
        thread.start()
        return thread, granted

    def close_connections(self) -> None:
        for conn in list(self._conns):
            if conn is not self._admin and not conn.closed:
                conn.close()

    def close(self) -> None:
        self.close_connections()
        if self._admin is not None and not self._admin.closed:
            self._admin.close()
        self._admin = None

    # -- the job table ------------------------------------------------------------------
    def create_jobs(self, n: int, *, start: str = FIRST_JOB_START, step_s: int = FIRST_JOB_STEP_S) -> None:
        """Create the job table with ``n`` pending jobs, one a second, ids 1..n."""
        if n < 0:
            raise ValueError("n must be 0 or more")
        self.run_file("job_table.sql")
        self.execute(query("job_rows.sql", "pending").sql, {"n": n, "start": start, "step_s": step_s})

    def jobs(self):
        """The job table as a DataFrame (id, status, worker_id)."""
        return self.query_df("SELECT id, status, worker_id FROM job ORDER BY id")
