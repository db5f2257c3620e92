"""A throw-away role for SQL that comes from a file: a graded claim, an isolation spec.

Such SQL is somebody's homework, and it runs on a server other trainees share.  The
connection labkit itself uses may be a superuser (it is on the embedded server), and a
superuser session may ``RESET ROLE`` whatever role it was set to: so the learner's SQL
does not run on that connection at all.  For each run, :class:`Sandbox` creates a role
of its own that may log in and do nothing else::

    with Sandbox(lab) as box:
        box.lab.execute(...)                 # as labkit_sbx_..., inside lab.schema only

* the role is ``NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION NOBYPASSRLS``,
  with a connection limit, and a random password that is never printed nor put on a
  command line (it travels as a connect keyword, or pickled to a worker process);
* it may use and create in the lab's throw-away schema, and owns everything made in it
  (labkit makes the lab's tables through it too), and it has no right on anything else:
  not on other schemas, not to create schemas, not to signal other sessions, not to run
  programs on the server.  The schema itself stays labkit's user's, so the role cannot
  drop, rename or relabel it;
* ``box.lab`` is the same lab seen through that role: every connection it opens logs in
  as the role, keeps the usual ``labkit:<schema>:<role>`` application_name, and runs with
  a ``statement_timeout``;
* ``box.deadline(seconds)`` cancels whatever the role's connections in this process are
  running once the time is up (the learner's SQL may ``SET statement_timeout = 0``);
* memory: the role's sessions start with ``work_mem``, ``hash_mem_multiplier``,
  ``maintenance_work_mem`` and ``temp_buffers`` at the bounds in :data:`MEMORY` (``ALTER
  ROLE ... SET``), so a sort or hash that needs more spills to disk, where a superuser's
  ``temp_file_limit`` caps it.  These settings are the user's to change (``SET``,
  ``set_config()``, even ``ALTER ROLE`` on itself): a role default is only a default.  So
  :func:`memory_refusal` reads the SQL before it runs and refuses any that raises them
  or that could change a setting out of its sight (``set_config()``, SQL built at run
  time);
* at the end (also on an error or Ctrl-C) the role's sessions are ended, everything it
  owns is dropped, and the role is dropped.  A run that was killed before that leaves a
  role behind: the next run drops it once its schema is gone and it has no session.

A spec runs in a database made for the run (:mod:`labkit.tools.spec`): there the "lab" is
that database's ``public`` schema, and the role's mark names the database instead.

Where labkit's user may not create roles (a trainee's account on a shared server), the
SQL runs as that user, with that user's own rights, and :attr:`Sandbox.note` says so.
"""

from __future__ import annotations

import math
import os
import re
import secrets
import stat
import threading
import time
import weakref
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import psycopg
from psycopg import sql

from .checked import one_row
from .db import Guards, Scoped, open_connection, scram_verifier, unreachable
from .errors import LabkitError
from .lab import Lab

ROLE_PREFIX = "labkit_sbx_"
# What one of the role's sessions may use in memory, per sort or hash (work_mem, times
# hash_mem_multiplier for a hash), per maintenance command, and for temporary tables.
MEMORY = {"work_mem": "4MB", "hash_mem_multiplier": "1", "maintenance_work_mem": "64MB",
          "temp_buffers": "8MB"}
_COMMENT = "labkit sandbox for schema "
_DB_COMMENT = "labkit sandbox for database "     # a run with a database of its own (a spec)


# -- input files --------------------------------------------------------------------------------

def read_input(path: str | os.PathLike, *, what: str, fix: str, max_bytes: int) -> str:
    """The text of a file the user named (a claim, a spec, a notebook), or a one-paragraph
    error: missing, a folder, not a regular file, unreadable, too large, not UTF-8 text."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise LabkitError(f"No {what} {p}.", fix) from None
    except PermissionError:
        raise LabkitError(f"The {what} {p} is not readable by this user (a folder on its path "
                          "may not be opened).",
                          "make it readable (chmod u+r, and u+x on its folders), or copy it "
                          "somewhere you can read it.") from None
    except OSError as exc:
        raise LabkitError(f"Cannot open the {what} {p}: {exc.strerror or exc}.", fix) from None
    if stat.S_ISDIR(st.st_mode):
        raise LabkitError(f"{p} is a folder, not a {what}.", fix)
    if not stat.S_ISREG(st.st_mode):
        raise LabkitError(f"{p} is not a regular file (a pipe or a device?), so it is not a {what}.",
                          fix)
    if st.st_size > max_bytes:
        raise LabkitError(f"The {what} {p} is {_size(st.st_size)}; labkit reads at most "
                          f"{_size(max_bytes)} from one.",
                          f"give the right file (a {what} is far smaller than that).")
    try:
        with open(p, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except PermissionError:
        raise LabkitError(f"The {what} {p} is not readable by this user.",
                          "make it readable (chmod u+r), or copy it somewhere you can read it.") from None
    except OSError as exc:
        raise LabkitError(f"Cannot read the {what} {p}: {exc.strerror or exc}.", fix) from None
    if len(data) > max_bytes:
        raise LabkitError(f"The {what} {p} is over {_size(max_bytes)}; labkit reads at most that much.",
                          f"give the right file (a {what} is far smaller than that).")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LabkitError(f"The {what} {p} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                          f"{exc.start}): it looks like a binary file.",
                          f"give the {what} itself, saved as UTF-8 text.") from None
    if "\x00" in text:
        raise LabkitError(f"The {what} {p} holds a NUL byte (at offset {text.index(chr(0))}): it is "
                          "a binary file, not text.",
                          f"give the {what} itself, saved as UTF-8 text.")
    return text


def _size(n: int) -> str:
    return f"{n / 1_000_000:.1f} MB" if n >= 100_000 else f"{n:,} bytes"


def check_number(name: str, value: Any, *, low: float, high: float, fix: str,
                 integer: bool = False) -> None:
    """A finite number within [low, high], or a one-paragraph error naming the range."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and isinstance(value, float) and not math.isfinite(value):
        ok = False
    if ok and integer and value != int(value):
        ok = False
    if not ok or not low <= value <= high:
        raise LabkitError(f"{name} must be a{'' if integer else ' finite'} number from "
                          f"{low:g} to {high:,g}, not {value!r}.", fix)


# -- what the SQL may not change --------------------------------------------------------------------

_BOUNDED = re.compile(r"\b(" + "|".join(MEMORY) + r")\b", re.I)
_SET = re.compile(r"^\s*SET\s+(?:SESSION\s+|LOCAL\s+)?(\w+)\s*(?:=|\bTO\b)\s*'?([\w.]+)'?\s*$", re.I)
_CHANGES = re.compile(r"^\s*(SET|RESET|ALTER|CREATE|COMMENT)\b", re.I)
_RUNTIME_SQL = re.compile(r"\bset_config\s*\(|\bEXECUTE\b|\bALTER\s+(ROLE|USER|DATABASE|SYSTEM)\b"
                          r"|\bCREATE\s+(OR\s+REPLACE\s+)?(FUNCTION|PROCEDURE|RULE)\b|^\s*DO\b"
                          r"|\bpg_settings\b(?=.*\bUPDATE\b)|\bUPDATE\b(?=.*\bpg_settings\b)", re.I | re.S)
_UNITS = {"": 1, "kb": 1, "mb": 1024, "gb": 1024 ** 2, "tb": 1024 ** 3}


def _amount(name: str, value: str) -> float | None:
    """A setting's value in the unit the bound is compared in (kB; a plain number for
    hash_mem_multiplier), or None when it cannot be read."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmgt]b)?", value.strip().lower())
    if not m:
        return None
    number = float(m.group(1))
    if name == "hash_mem_multiplier":
        return None if m.group(2) else number
    if name == "temp_buffers" and not m.group(2):
        return number * 8                           # a plain number counts 8 kB blocks
    return number * _UNITS[m.group(2) or ""]


_UNICODE_IDENT = re.compile(r'U&"((?:[^"]|"")*)"(?:\s*UESCAPE\s*\'(.)\')?', re.I)
_QUOTED_IDENT = re.compile(r'"((?:[^"]|"")*)"')


def _unquoted(stmt: str) -> str:
    """The statement with its quoted identifiers written plainly: ``"set_config"`` and
    ``U&"work\\005fmem"`` read as ``set_config`` and ``work_mem``, so that a check by name
    cannot be passed by spelling the name another way."""
    def unicode(m: re.Match) -> str:
        esc = re.escape(m.group(2) or "\\")
        body = m.group(1).replace('""', '"')
        body = re.sub(esc + r"\+([0-9A-Fa-f]{6})", lambda x: chr(int(x.group(1), 16)), body)
        body = re.sub(esc + r"([0-9A-Fa-f]{4})", lambda x: chr(int(x.group(1), 16)), body)
        return body.replace((m.group(2) or "\\") * 2, m.group(2) or "\\")
    stmt = _UNICODE_IDENT.sub(unicode, stmt)
    return _QUOTED_IDENT.sub(lambda m: m.group(1).replace('""', '"'), stmt)


def memory_refusal(statements: list[str]) -> str | None:
    """Why the statements may not run in the sandbox, or None.

    Refused: ``SET`` of a memory setting of :data:`MEMORY` above its bound; any other
    statement that changes one by name (``RESET``, ``ALTER ROLE ... SET``, a function's
    ``SET`` clause); and any that can change a setting whose name it builds at run time
    or run SQL built at run time: ``set_config()``, an ``UPDATE`` of ``pg_settings``,
    ``EXECUTE``, ``DO``, ``CREATE FUNCTION``, ``CREATE RULE``, ``ALTER ROLE``.  Reading a
    setting (``current_setting('work_mem')``) is allowed.  Quoted identifiers are read as
    the names they spell first."""
    for stmt in map(_unquoted, statements):
        if re.match(r"^\s*RESET\b", stmt, re.I):
            continue            # back to the session's default: the role's bound
        named = _BOUNDED.search(stmt)
        if named and _CHANGES.match(stmt):
            name = named.group(1).lower()
            m = _SET.match(stmt)
            if m and m.group(1).lower() == name:
                value, bound = _amount(name, m.group(2)), _amount(name, MEMORY[name])
                if value is not None and bound is not None and value <= bound:
                    continue
            return (f"it changes {name}, a memory setting held at {MEMORY[name]} (or less) for "
                    "SQL from a file")
        found = _RUNTIME_SQL.search(stmt)
        if found:
            what = " ".join(found.group(0).split()).rstrip("(").strip()
            if what.lower() in ("update", "pg_settings"):
                what = "an UPDATE of pg_settings"
            return (f"it uses {what}, which could change a memory setting out of sight "
                    "of this check")
    return None


# -- the role -----------------------------------------------------------------------------------

def sweep(conn: psycopg.Connection) -> list[str]:
    """Drop the sandbox roles that interrupted runs left: those whose schema (or, for a run
    with a database of its own, whose database) is gone and that have no session.  Returns
    the names dropped (a role this user may not drop, or that still has rights or objects
    in another database, is left alone)."""
    rows = conn.execute(
        "SELECT r.rolname, shobj_description(r.oid, 'pg_authid') FROM pg_catalog.pg_roles r "
        "WHERE r.rolname LIKE %s AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity a "
        "WHERE a.usename = r.rolname)", (ROLE_PREFIX.replace("_", r"\_") + "%",)).fetchall()
    dropped = []
    for name, comment in rows:
        comment = comment or ""
        if comment.startswith(_DB_COMMENT):
            if conn.execute("SELECT 1 FROM pg_catalog.pg_database WHERE datname = %s",
                            (comment[len(_DB_COMMENT):],)).fetchone():
                continue
        schema = comment[len(_COMMENT):] if comment.startswith(_COMMENT) else ""
        if schema and conn.execute("SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = %s",
                                   (schema,)).fetchone():
            continue
        try:
            with conn.transaction():
                conn.execute("SET LOCAL lock_timeout = '5s'")
                conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
                conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))
            dropped.append(name)
        except psycopg.Error:
            pass
    return dropped


class _Server:
    """The lab's Database, but every connection logs in as the sandbox role."""

    def __init__(self, db, box: Sandbox):
        self._db = db
        self._box = box

    def __getattr__(self, name):
        return getattr(self._db, name)

    def connect(self, *, autocommit: bool = True, schema: str | None = None, role: str = "",
                guards: Guards | None = None, **kw) -> psycopg.Connection:
        return self._box.connect(autocommit=autocommit, schema=schema, role=role, guards=guards, **kw)


class Cancels(Protocol):
    """What a :class:`Deadline` needs of a sandbox (or of a trusted run's stand-in)."""

    def cancel_all(self) -> None: ...


class Deadline:
    """Cancels what the sandbox's connections run once ``seconds`` have passed (and
    again every second after that, until the block ends)."""

    def __init__(self, box: Cancels, seconds: float):
        self.box = box
        self.seconds = seconds
        self.fired = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        if self._stop.wait(self.seconds):
            return
        self.fired = True
        while True:
            self.box.cancel_all()
            if self._stop.wait(1.0):
                return

    def __enter__(self) -> Deadline:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)


class Sandbox(Scoped):
    """A role of its own for SQL from a file, for the life of one ``with`` block.

    ``connections`` caps the role's sessions; ``statement_timeout_s`` is the
    statement_timeout of every connection :meth:`connect` opens.  ``own_database`` says
    that ``lab`` is the ``public`` schema of a database made for this run alone (a spec
    run's): the role's mark then names that database, so that a later :func:`sweep`
    drops the role once the database is gone.
    """

    def __init__(self, lab: Lab, *, connections: int = 16, statement_timeout_s: float = 30.0,
                 own_database: bool = False) -> None:
        self.base = lab
        self.own_database = own_database
        self.connections = connections
        self.statement_timeout_ms = max(1, int(statement_timeout_s * 1000))
        self.role: str | None = None
        self.password: str | None = None
        self.note = ""
        self._conns: weakref.WeakSet[psycopg.Connection] = weakref.WeakSet()
        self._lab = None

    # -- life cycle -----------------------------------------------------------------------
    def open(self) -> None:
        admin = self.base.admin
        sweep(admin)
        user, superuser, createrole = one_row(admin.execute(
            "SELECT rolname, rolsuper, rolcreaterole FROM pg_catalog.pg_roles "
            "WHERE rolname = current_user"), "the current role's row of pg_roles")
        if not (superuser or createrole):
            self._fallback(user, "it may not create roles")
            return
        role = ROLE_PREFIX + secrets.token_hex(6)
        password = secrets.token_urlsafe(24)
        schema = sql.Identifier(self.base.schema)
        ident = sql.Identifier(role)
        try:
            with admin.transaction():
                admin.execute("SET LOCAL lock_timeout = '10s'")
                admin.execute(sql.SQL(
                    "CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION "
                    "NOBYPASSRLS CONNECTION LIMIT {} PASSWORD {}").format(
                        ident, sql.Literal(self.connections), sql.Literal(scram_verifier(password))))
                mark = (_DB_COMMENT + admin.info.dbname if self.own_database
                        else _COMMENT + self.base.schema)
                admin.execute(sql.SQL("COMMENT ON ROLE {} IS {}").format(ident, sql.Literal(mark)))
                if superuser:
                    # Only a superuser may set (and so only one may lift) this limit: a
                    # statement that sorts or hashes more spills no more than this to disk.
                    admin.execute(sql.SQL("ALTER ROLE {} SET temp_file_limit = '1GB'").format(ident))
                else:
                    # A role that may create roles but is no superuser joins the sandbox role,
                    # so that it can end its sessions and drop what it made.
                    admin.execute(sql.SQL("GRANT {} TO current_user").format(ident))
                for name, value in MEMORY.items():
                    admin.execute(sql.SQL("ALTER ROLE {} SET {} = {}").format(
                        ident, sql.Identifier(name), sql.Literal(value)))
                admin.execute(sql.SQL("GRANT USAGE, CREATE ON SCHEMA {} TO {}").format(schema, ident))
                if not one_row(admin.execute("SELECT has_database_privilege(%s, current_database(), 'CONNECT')",
                                             (role,)), "has_database_privilege()")[0]:
                    admin.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(
                        sql.Identifier(admin.info.dbname), ident))
        except psycopg.Error as exc:
            if superuser:
                raise LabkitError(f"Could not create the throw-away role that runs the SQL of the "
                                  f"file: {_first_line(exc)}.",
                                  "run `labkit clean` and try again; if it persists, check that the "
                                  "server is healthy (`labkit doctor`).") from None
            self._fallback(user, f"creating a role failed: {_first_line(exc)}")
            return
        self.role, self.password = role, password
        try:
            self.connect(schema=self.base.schema, role="sandbox").close()
        except psycopg.OperationalError as exc:
            if superuser:
                raise LabkitError(
                    f"The throw-away role {role} that runs the file's SQL could not log in: "
                    f"{_first_line(exc)}.",
                    "let roles named labkit_sbx_* log in with a password from this host "
                    "(pg_hba.conf), then run it again.") from None
            self.close()
            self._fallback(user, f"its throw-away role could not log in: {_first_line(exc)}")
            return
        where = (f"schema public of the database {admin.info.dbname} made for this run"
                 if self.own_database else f"schema {self.base.schema}")
        self.note = f"ran as the throw-away role {role}, which may use {where} and nothing else"

    def _fallback(self, user: str, why: str) -> None:
        self.role = self.password = None
        self.note = (f"ran as your own role {user} ({why}): the SQL had your rights on this "
                     "server, as anything you run here does")

    def close(self) -> None:
        """End the role's sessions, drop what it owns, drop it."""
        for conn in list(self._conns):
            try:
                conn.close()
            except Exception:
                pass
        if self._lab is not None:
            self._lab.close()
        role = self.role
        if role is None:
            return
        admin = self.base.admin
        ident = sql.Identifier(role)
        # No new logins, then end the sessions that are there (a killed worker's backend
        # may still be running the learner's statement).
        admin.execute(sql.SQL("ALTER ROLE {} NOLOGIN").format(ident))
        deadline = time.monotonic() + 15
        while one_row(admin.execute("SELECT count(pg_catalog.pg_terminate_backend(pid)) FROM "
                                    "pg_catalog.pg_stat_activity WHERE usename = %s", (role,)),
                      "SELECT count(pg_terminate_backend(...))")[0]:
            if time.monotonic() > deadline:
                raise LabkitError(f"The sessions of the throw-away role {role} did not end.",
                                  "run `labkit clean --all`; the next run drops the role.")
            time.sleep(0.02)
        with admin.transaction():
            admin.execute("SET LOCAL lock_timeout = '10s'")
            # Its tables in the lab's schema, anything it made elsewhere (large objects,
            # say), and the rights it was given.
            admin.execute(sql.SQL("DROP OWNED BY {}").format(ident))
            admin.execute(sql.SQL("DROP ROLE {}").format(ident))
        self.role = self.password = None

    # -- connections --------------------------------------------------------------------------
    def connect(self, *, autocommit: bool = True, schema: str | None = None, role: str = "",
                guards: Guards | None = None, **kw) -> psycopg.Connection:
        """A connection as the sandbox role (as labkit's user, where there is none), with the
        run's statement_timeout whatever the caller's guards say."""
        db = self.base.db
        guards = replace(guards or Guards(), statement_timeout=f"{self.statement_timeout_ms}ms")
        if self.role is not None:
            kw.update(user=self.role, password=self.password)
        try:
            conn = open_connection(db.dsn, schema=schema, role=role, guards=guards, autocommit=autocommit,
                                   check_client_ms=db.check_client_ms, **kw)
        except psycopg.OperationalError as exc:
            if self.role is None:
                raise unreachable(db, exc) from None
            raise
        self._conns.add(conn)
        return conn

    def worker_kwargs(self) -> dict:
        """What a worker process needs to log in as the role (passed pickled, never printed)."""
        if self.role is None:
            return {}
        return {"user": self.role, "password": self.password}

    @property
    def lab(self):
        """The lab, seen through the sandbox role."""
        if self._lab is None:
            import copy

            twin = copy.copy(self.base)
            twin.db = _Server(self.base.db, self)
            twin._conns = weakref.WeakSet()
            twin._admin = None
            self._lab = twin
        return self._lab

    def cancel_all(self) -> None:
        cancel_every(self._conns)

    def deadline(self, seconds: float) -> Deadline:
        return Deadline(self, seconds)


def cancel_every(conns) -> None:
    """Cancel what each open connection of ``conns`` is running (a run's deadline)."""
    for conn in list(conns):
        try:
            if not conn.closed:
                conn.cancel()
        except Exception:
            pass


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0].rstrip(".") if text else type(exc).__name__
