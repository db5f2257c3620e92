"""A MySQL-compatible server for the cross-engine appendix (notebook 21), and a lab on it.

Where the server comes from, first match wins:

1. ``LABKIT_MYSQL_DSN``: any MySQL 8.0.1+ or MariaDB 10.6+, as
   ``mysql://USER[:PASSWORD]@HOST[:PORT]/DATABASE`` (``mariadb://`` reads the same);
   ``LABKIT_MYSQL_DSN=off`` says there is none, even if one answers on 3306;
2. a server answering on ``127.0.0.1:3306`` as ``root`` without a password, database ``test``
   (what a developer machine or a CI service container often has);
3. with ``LABKIT_BACKEND=docker``, a throw-away ``mariadb:10.11`` container (testcontainers).

The driver is PyMySQL: pure Python (nothing to compile, one wheel for every platform),
maintained, and the same code talks to MySQL and MariaDB.  Nothing else in the workbook needs
any of this: without a server, :func:`find` raises :class:`NoServer`, whose one line says how
to get one, and notebook 21 and its tests are skipped with that line.

A lab here is a database of its own, ``labkit_<lab>_<user>`` (MySQL's schemas *are*
databases), made afresh on open and dropped by ``drop()``.  Its connections are plain
PyMySQL connections wrapped in :class:`MyConn`, which gives them the few methods the
engine-neutral code calls (``execute``, ``commit``, ``rollback``, ``cancel_safe``).
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import socket
import weakref
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import unquote, urlsplit

from .db import Scoped, _slug, current_user_tag, redact
from .errors import LabkitError, ServerError
from .queries import query

ENV = "LABKIT_MYSQL_DSN"
LOCAL = ("127.0.0.1", 3306, "root", "test")
DOCKER_IMAGE = "mariadb:10.11"
# The first release of each with both NOWAIT and SKIP LOCKED.
MINIMUM = {"MariaDB": (10, 6, 0), "MySQL": (8, 0, 1)}
DB_PREFIX = "labkit_"
SQL = "mysql_engine.sql"

# MySQL error numbers the labs meet (the same in MariaDB unless said).
LOCK_WAIT_TIMEOUT = 1205   # a lock wait timed out; MariaDB also for NOWAIT and SKIP LOCKED's cousins
LOCK_NOWAIT = 3572         # MySQL 8 only: NOWAIT found the row locked
DEADLOCK = 1213
QUERY_INTERRUPTED = 1317   # KILL QUERY
STATEMENT_TIMEOUT = (1969, 3024)   # MariaDB max_statement_time, MySQL max_execution_time
GONE = (2006, 2013, 2055, 1927, 1053)   # server gone away / lost connection / killed / shutdown
CANNOT_CONNECT = (2002, 2003, 2005)
ACCESS_DENIED = (1044, 1045, 1698)
UNKNOWN_DATABASE = 1049


class NoServer(LabkitError):
    """No MySQL-compatible server is configured or answering: the appendix is skipped."""


class LockNotAvailable(Exception):
    """A NOWAIT claim found its row locked (MySQL 8: error 3572; MariaDB: error 1205 on a
    statement that said NOWAIT): the counterpart of psycopg's LockNotAvailable."""


class Deadlock(Exception):
    """InnoDB chose this transaction as a deadlock's victim and rolled it back (error 1213)."""


@dataclass
class MyServer:
    """A reachable MySQL or MariaDB server and how labkit found it."""

    params: dict = field(repr=False)     # host, port, user, password, database
    backend: str                          # dsn, local, docker
    where: str
    flavour: str = ""                     # MySQL or MariaDB
    version: str = ""
    version_tuple: tuple = ()
    _keep: object = field(default=None, repr=False)

    def describe(self) -> str:
        return f"{self.flavour} {self.version} · {self.backend}: {self.where}"

    @property
    def engine(self) -> str:
        return self.flavour.lower()

    def connect(self, *, database: str | None = None, autocommit: bool = True,
                role: str = "", lock_wait_timeout_s: int | None = 5,
                statement_timeout_s: float | None = 30) -> MyConn:
        """A new connection; errors name the server and the fix.  Unless told otherwise a
        lock wait gives up after 5 s and a statement after 30 s, so that a mistyped script
        ends with an error, never a hung kernel."""
        raw = _open(self.params, database=database, autocommit=autocommit, where=self.where)
        conn = MyConn(raw, self, role)
        inits = []
        if lock_wait_timeout_s is not None:
            inits.append(f"SET SESSION innodb_lock_wait_timeout = {int(lock_wait_timeout_s)}")
        if statement_timeout_s is not None:
            inits.append(f"SET SESSION max_statement_time = {float(statement_timeout_s):g}"
                         if self.flavour == "MariaDB" else
                         f"SET SESSION max_execution_time = {int(statement_timeout_s * 1000)}")
        for stmt in inits:
            conn.execute(stmt)
        return conn


def parse_dsn(dsn: str) -> dict:
    """``mysql://user:password@host:port/database`` as connection parameters."""
    text = dsn.strip()
    if not re.match(r"^(mysql|mariadb)://", text, re.I):
        raise ServerError(f"{ENV} must be a URL such as mysql://root@127.0.0.1:3306/test, not "
                          f"{redact(text)!r}.",
                          f"set {ENV}=mysql://USER[:PASSWORD]@HOST[:PORT]/DATABASE (mariadb:// "
                          f"works too), or {ENV}=off to skip the appendix.")
    try:
        parts = urlsplit(text)
        port = parts.port or 3306
    except ValueError as exc:
        raise ServerError(f"{ENV} could not be read ({exc}).",
                          "write it as mysql://USER[:PASSWORD]@HOST[:PORT]/DATABASE; a password "
                          "with @, : or / in it must be percent-encoded.") from None
    database = parts.path.lstrip("/")
    if not parts.hostname or not database:
        raise ServerError(f"{ENV} needs a host and a database ({redact(text)!r} lacks "
                          f"{'a host' if not parts.hostname else 'the database'}).",
                          "write it as mysql://USER[:PASSWORD]@HOST[:PORT]/DATABASE.")
    return {"host": parts.hostname, "port": port, "user": unquote(parts.username or "root"),
            "password": unquote(parts.password or ""), "database": unquote(database)}


def _open(params: dict, *, database: str | None, autocommit: bool, where: str,
          connect_timeout: float = 5):
    import pymysql

    try:
        return pymysql.connect(host=params["host"], port=params["port"], user=params["user"],
                               password=params["password"],
                               database=params["database"] if database is None else database,
                               autocommit=autocommit, connect_timeout=connect_timeout,
                               charset="utf8mb4")
    except pymysql.err.MySQLError as exc:
        raise _connect_error(exc, where) from None


def _connect_error(exc, where: str) -> ServerError:
    code = exc.args[0] if exc.args else 0
    text = str(exc.args[1]) if len(exc.args) > 1 else str(exc)
    if code in CANNOT_CONNECT:
        return ServerError(f"No MySQL or MariaDB server answered at {where} ({text}).",
                           f"start the server, or point {ENV} at one that runs "
                           f"(mysql://USER@HOST:PORT/DATABASE), or set {ENV}=off to skip the appendix.")
    if code in ACCESS_DENIED:
        return ServerError(f"The server at {where} refused the login ({code}: {text}).",
                           f"put a user and password that may log in into {ENV} "
                           "(mysql://USER:PASSWORD@HOST:PORT/DATABASE).")
    if code == UNKNOWN_DATABASE:
        return ServerError(f"The database named in {ENV} does not exist on {where}.",
                           "create it (CREATE DATABASE test) or name one that exists.")
    return ServerError(f"Could not connect to the MySQL-compatible server at {where} ({code}: {text}).",
                       f"check {ENV} and that the server runs.")


def gone_error(where: str, exc: BaseException) -> ServerError:
    """The error for a server that went away in the middle of a run."""
    return ServerError(f"The MySQL-compatible server at {where} went away in the middle of the run "
                       f"({exc.args[0] if exc.args else ''}: "
                       f"{exc.args[1] if len(exc.args) > 1 else exc}); "
                       "what the run had not committed is gone with it.",
                       "start the server again (or check that nothing killed labkit's sessions), "
                       "then re-run the cell: each run starts from a fresh lab database.")


def is_gone(exc: BaseException) -> bool:
    import pymysql

    return (isinstance(exc, (pymysql.err.OperationalError, pymysql.err.InterfaceError))
            and bool(exc.args) and (exc.args[0] in GONE or exc.args[0] == 0))


def _answers(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def check_version(flavour: str, version: tuple, where: str) -> None:
    """Refuse a server without SKIP LOCKED (MariaDB before 10.6, MySQL before 8.0.1)."""
    need = MINIMUM[flavour]
    if version < need:
        raise ServerError(
            f"{flavour} {'.'.join(map(str, version))} at {where} is too old for the appendix: "
            f"SKIP LOCKED arrived in {flavour} {'.'.join(map(str, need))}.",
            f"point {ENV} at {flavour} {'.'.join(map(str, need))} or newer (or MySQL 8 / MariaDB "
            f"10.11), or set {ENV}=off to skip the appendix.")


def _identify(server: MyServer) -> MyServer:
    conn = _open(server.params, database=None, autocommit=True, where=server.where)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT VERSION()")
            text = cur.fetchone()[0]
    finally:
        conn.close()
    server.flavour = "MariaDB" if "mariadb" in text.lower() else "MySQL"
    numbers = re.match(r"(\d+)\.(\d+)\.(\d+)", text)
    server.version_tuple = tuple(int(x) for x in numbers.groups()) if numbers else (0, 0, 0)
    server.version = ".".join(map(str, server.version_tuple))
    check_version(server.flavour, server.version_tuple, server.where)
    return server


_cached: MyServer | None = None


def find(*, quiet: bool = True, fresh: bool = False) -> MyServer:
    """The MySQL-compatible server to use (see the module's docstring), or :class:`NoServer`."""
    global _cached
    if _cached is not None and not fresh:
        return _cached
    try:
        import pymysql  # noqa: F401
    except ImportError:
        raise NoServer("The cross-engine appendix needs the PyMySQL driver, which is not installed.",
                       "pip install 'labkit[mysql]' (make setup installs it).") from None
    dsn = os.environ.get(ENV, "").strip()
    if dsn.lower() in ("off", "none", "0"):
        raise NoServer(f"{ENV}={dsn} turns the cross-engine appendix off.",
                       f"unset {ENV}, or set it to mysql://USER@HOST:PORT/DATABASE.")
    if dsn:
        params = parse_dsn(dsn)
        server = MyServer(params, "dsn", f"{ENV} {params['host']}:{params['port']}/{params['database']}")
    elif _answers(LOCAL[0], LOCAL[1]):
        host, port, user, database = LOCAL
        server = MyServer({"host": host, "port": port, "user": user, "password": "", "database": database},
                          "local", f"{host}:{port}/{database}")
    elif os.environ.get("LABKIT_BACKEND", "").strip().lower() == "docker":
        server = _from_docker()
    else:
        raise NoServer(f"No MySQL or MariaDB server: {ENV} is not set and nothing answers "
                       f"on {LOCAL[0]}:{LOCAL[1]}.",
                       f"set {ENV}=mysql://USER@HOST:PORT/DATABASE (MySQL 8+ or MariaDB 10.6+), or "
                       f"start one on {LOCAL[0]}:{LOCAL[1]}, or set LABKIT_BACKEND=docker for a container.")
    _identify(server)
    _cached = server
    if not quiet:
        print(server.describe())
    return server


def _from_docker() -> MyServer:
    from .db import docker_available

    ok, why = docker_available()
    if not ok:
        raise NoServer(f"LABKIT_BACKEND=docker needs a running Docker engine for the appendix's "
                       f"MariaDB, and none answered ({why}).",
                       f"start Docker, or set {ENV} to a MySQL 8 or MariaDB 10.6+ server.")
    from testcontainers.core.container import DockerContainer

    container = (DockerContainer(DOCKER_IMAGE).with_env("MARIADB_ALLOW_EMPTY_ROOT_PASSWORD", "1")
                 .with_env("MARIADB_DATABASE", "test").with_exposed_ports(3306))
    container.start()
    host, port = container.get_container_host_ip(), int(container.get_exposed_port(3306))
    params = {"host": host, "port": port, "user": "root", "password": "", "database": "test"}
    import time

    deadline = time.monotonic() + 90
    while True:                      # the image starts its server twice (init, then for real)
        try:
            _open(params, database=None, autocommit=True, where="container").close()
            break
        except ServerError:
            if time.monotonic() > deadline:
                container.stop()
                raise
            time.sleep(1)
    return MyServer(params, "docker", f"container {DOCKER_IMAGE}", _keep=container)


# What a command's --engine may name: the labs' PostgreSQL, or this module's server.
ENGINES = ("postgresql", "mariadb", "mysql")


def find_engine(engine: str) -> MyServer:
    """:func:`find`, for a command told ``--engine mariadb`` or ``--engine mysql``: the server
    found must be that one."""
    server = find()
    if server.engine != engine:
        raise LabkitError(f"--engine {engine}, but the server found is {server.describe()}.",
                          f"pass --engine {server.engine}, or point {ENV} at a {engine} server.")
    return server


def find_or_stop(*, quiet: bool = False) -> MyServer:
    """:func:`find`, for notebook 21's first cell: without a server, stop the notebook with
    the one line of :func:`skip_reason` instead of a traceback."""
    try:
        return find(quiet=quiet)
    except NoServer as exc:
        raise SystemExit(f"cross-engine appendix skipped: {exc.what} To run it: {exc.fix}") from None


def skip_reason() -> str | None:
    """None when a MySQL-compatible server is there; else the one line saying why the appendix is
    skipped and how to run it."""
    try:
        find()
    except NoServer as exc:
        return f"cross-engine appendix skipped: {exc.what} To run it: {exc.fix}"
    return None


# ----------------------------------------------------------------------------------------
# Connections
# ----------------------------------------------------------------------------------------

class _Info:
    def __init__(self, thread_id: int) -> None:
        self.backend_pid = thread_id


class MyConn:
    """A PyMySQL connection with the few methods labkit's engine-neutral code calls."""

    def __init__(self, raw, server: MyServer, role: str = "") -> None:
        self.raw = raw
        self.server = server
        self.role = role
        self.thread_id = raw.thread_id()
        self.info = _Info(self.thread_id)
        self._closed = False

    def execute(self, statement: str, params: Any = None):
        """Run one statement and return its cursor.  A NOWAIT claim that finds its row locked
        raises :class:`LockNotAvailable`; a server gone away raises :class:`ServerError`."""
        import pymysql

        cur = self.raw.cursor()
        try:
            cur.execute(statement, params)
        except pymysql.err.MySQLError as exc:
            code = exc.args[0] if exc.args else 0
            if code == LOCK_NOWAIT or (code == LOCK_WAIT_TIMEOUT and "NOWAIT" in statement.upper()):
                raise LockNotAvailable(str(exc.args[1] if len(exc.args) > 1 else exc)) from exc
            if code == DEADLOCK:
                raise Deadlock(str(exc.args[1] if len(exc.args) > 1 else exc)) from exc
            if is_gone(exc):
                self._closed = True
                raise gone_error(self.server.where, exc) from None
            raise
        return cur

    def commit(self) -> None:
        self.raw.commit()

    def rollback(self) -> None:
        self.raw.rollback()

    @property
    def closed(self) -> bool:
        return self._closed or not self.raw.open

    broken = closed

    def cancel_safe(self, timeout: float = 2) -> None:
        """Stop the statement this connection runs (KILL QUERY, from a second connection)."""
        kill(self.server, self.thread_id, query_only=True)

    def close(self) -> None:
        self._closed = True
        try:
            self.raw.close()
        except Exception:
            pass


def kill(server: MyServer, thread_id: int, *, query_only: bool) -> None:
    """KILL QUERY (the statement) or KILL (the connection) ``thread_id``; quiet if it is gone."""
    try:
        conn = _open(server.params, database=None, autocommit=True, where=server.where)
    except ServerError:
        return
    try:
        with conn.cursor() as cur:
            cur.execute(f"KILL {'QUERY ' if query_only else ''}{int(thread_id)}")
    except Exception:
        pass
    finally:
        conn.close()


# ----------------------------------------------------------------------------------------
# A lab: a database of its own
# ----------------------------------------------------------------------------------------

MAX_NAME = 64        # MySQL's and MariaDB's limit on a database name


def database_name(name: str, user: str | None = None) -> str:
    """``labkit_<name>_<user>``, at most 64 characters (MySQL's limit).  A longer one keeps
    its start and ends in a short hash of the whole, so that two long user names never
    share (and so never drop) each other's lab."""
    full = f"{DB_PREFIX}{_slug(name)}_{user or current_user_tag()}"
    if len(full) <= MAX_NAME:
        return full
    digest = hashlib.sha1(full.encode()).hexdigest()[:8]
    return f"{full[:MAX_NAME - 9].rstrip('_')}_{digest}"


class MyLab:
    """A lab database on a MySQL-compatible server: made afresh on open, dropped by drop()."""

    def __init__(self, server: MyServer, name: str, *, user: str | None = None) -> None:
        self.server = server
        self.db = server           # what engine-neutral code reads a lab's server from
        self.name = name
        self.database = database_name(name, user)
        self.schema = self.database
        self._conns: weakref.WeakSet = weakref.WeakSet()
        self._admin: MyConn | None = None
        # the isolation level of the lab's connections; None keeps InnoDB's REPEATABLE READ
        self.isolation: str | None = None

    @classmethod
    def open(cls, server: MyServer | None = None, name: str = "engines", *,
             user: str | None = None) -> MyLab:
        lab = cls(server or find(), name, user=user)
        lab.reset()
        return lab

    def __repr__(self) -> str:
        return f"MyLab({self.database!r} on {self.server.flavour} {self.server.version})"

    def __enter__(self) -> MyLab:
        return self

    def __exit__(self, *exc) -> None:
        self.drop()

    @property
    def engine(self) -> str:
        return self.server.engine

    def isolation_level(self) -> str:
        """The isolation level the lab's connections run: the one set, else the server's default."""
        if self.isolation:
            return self.isolation
        for variable in ("@@GLOBAL.transaction_isolation", "@@GLOBAL.tx_isolation"):   # MySQL 8, MariaDB
            try:
                return str(self.admin.execute(f"SELECT {variable}").fetchone()[0]).replace("-", " ")
            except Exception as exc:
                if is_gone(exc):
                    raise
        return "unknown"

    def describe(self) -> str:
        return f"{self.server.describe()} · {self.isolation_level()}"

    def _logs_in_as(self) -> MyServer:
        """Whom the lab's connections log in as: labkit's own user (a spec's sandbox: its
        throw-away user)."""
        return self.server

    def connect(self, *, autocommit: bool = True, role: str = "", guards: Any = None,
                lock_wait_timeout_s: int | None = 5, statement_timeout_s: float | None = 30) -> MyConn:
        """A connection into the lab's database.  (``guards`` is accepted so that code written
        for a PostgreSQL lab runs unchanged; the timeouts here are InnoDB's and the server's.)"""
        conn = self._logs_in_as().connect(database=self.database, autocommit=autocommit, role=role,
                                          lock_wait_timeout_s=lock_wait_timeout_s,
                                          statement_timeout_s=statement_timeout_s)
        if self.isolation:
            conn.execute(f"SET SESSION TRANSACTION ISOLATION LEVEL {self.isolation}")
        self._conns.add(conn)
        return conn

    @property
    def admin(self) -> MyConn:
        if self._admin is None or self._admin.closed:
            self._admin = self.server.connect(database=None, role="admin", lock_wait_timeout_s=10)
        return self._admin

    def execute(self, statement: str, params: Any = None) -> list[tuple]:
        """Run SQL in the lab's database; the rows of the statement, if any."""
        self.admin.raw.select_db(self.database)
        cur = self.admin.execute(statement, params)
        return list(cur.fetchall()) if cur.description else []

    def run_script(self, text: str, params: Any = None) -> None:
        """Run each statement of ``text`` (split the way labkit splits SQL files)."""
        from .queries import statements

        for stmt in statements(text):
            self.execute(stmt, params if "%(" in stmt else None)

    def end_sessions(self) -> int:
        """KILL this login's other sessions in the lab's database (an interrupted run's)."""
        rows = self.admin.execute(query(SQL, "lab_sessions").sql, {"db": self.database}).fetchall()
        for (thread,) in rows:
            kill(self.server, thread, query_only=False)
        return len(rows)

    def reset(self) -> MyLab:
        self.close_connections()
        self.end_sessions()
        name = _quote(self.database)
        try:
            self.admin.execute(f"DROP DATABASE IF EXISTS {name}")
            self.admin.execute(f"CREATE DATABASE {name} CHARACTER SET utf8mb4")
        except Exception as exc:
            if getattr(exc, "args", (0,))[0] in ACCESS_DENIED:
                raise LabkitError(f"The MySQL user may not create the database {self.database}.",
                                  f"GRANT ALL ON `{DB_PREFIX}%`.* TO that user, or use another "
                                  f"user in {ENV}.") from None
            raise
        return self

    def close_connections(self) -> None:
        for conn in list(self._conns):
            conn.close()

    def drop(self) -> None:
        self.close_connections()
        try:
            self.end_sessions()
            self.admin.execute(f"DROP DATABASE IF EXISTS {_quote(self.database)}")
        finally:
            if self._admin is not None:
                self._admin.close()
                self._admin = None

    def discard(self) -> None:
        try:
            self.drop()
        except Exception:
            pass


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


# ----------------------------------------------------------------------------------------
# A throw-away user for SQL from a file (an isolation spec)
# ----------------------------------------------------------------------------------------

SANDBOX_PREFIX = "labkit_sbx_"


def _literal(text: str) -> str:
    """``text`` as a quoted SQL string (for account names, which take no parameters)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "''") + "'"


def _grant_pattern(database: str) -> str:
    """``database`` as the name a GRANT gives rights on: in a grant's database name ``_`` and
    ``%`` are wildcards, so that a plain ``labkit_spec_1`` would also cover ``labkitXspecY1``."""
    return _quote(database.replace("\\", "\\\\").replace("_", "\\_").replace("%", "\\%"))


def _native_hash(password: str) -> str:
    """What MariaDB stores for a mysql_native_password: sending it instead of the password
    keeps the password itself out of the server's logs."""
    return "*" + hashlib.sha1(hashlib.sha1(password.encode()).digest()).hexdigest().upper()


def sweep_users(admin: MyConn) -> list[str]:
    """Drop the throw-away users that killed runs left: named ``labkit_sbx_*``, with no
    session, whose one database is gone.  Returns the accounts dropped (none where labkit's
    user may not read ``mysql.user`` or drop users)."""
    import pymysql

    try:
        rows = admin.execute(query(SQL, "sandbox_leftovers").sql,
                             {"like": SANDBOX_PREFIX.replace("_", "\\_") + "%"}).fetchall()
    except pymysql.err.MySQLError:
        return []
    dropped = []
    for user, host in rows:
        try:
            admin.execute(f"DROP USER IF EXISTS {_literal(user)}@{_literal(host)}")
            dropped.append(f"{user}@{host}")
        except pymysql.err.MySQLError:
            pass
    return dropped


class _UserLab(MyLab):
    """A lab seen through the throw-away user: its connections log in as that user.  The
    lab's server (and so the lock monitor and KILL QUERY) stays labkit's own user."""

    def __init__(self, base: MyLab, as_user: MyServer) -> None:
        self.__dict__.update(base.__dict__)
        self._conns = weakref.WeakSet()
        self._admin = None
        self._as_user = as_user

    def _logs_in_as(self) -> MyServer:
        return self._as_user


class SandboxUser(Scoped):
    """A user of its own for SQL from a file, for the life of one ``with`` block::

        with SandboxUser(lab) as box:
            box.lab.connect()        # as labkit_sbx_...@<this host>, in lab.database only

    The user has a random password (sent to MariaDB as its hash), may log in only from the
    host labkit connects from, at most ``connections`` times at once, and has every right
    on the lab's database and none anywhere else: no FILE (so no LOAD_FILE, LOAD DATA
    INFILE or SELECT ... INTO OUTFILE), no SUPER, no PROCESS, no other database, not the
    ``mysql`` schema.  At the end (on an error or an interrupt too) its sessions are
    KILLed and it is dropped; one that a killed run left is dropped by the next run once
    its database is gone (:func:`sweep_users`).

    Where labkit's user may not create users, the SQL runs as that user and :attr:`note`
    says so."""

    def __init__(self, lab: MyLab, *, connections: int = 16) -> None:
        self.base = lab
        self.connections = connections
        self.user: str | None = None
        self.host: str | None = None
        self.password: str | None = None
        self.note = ""
        self._lab: MyLab | None = None

    @property
    def account(self) -> str:
        return f"{_literal(self.user or '')}@{_literal(self.host or '')}"

    def open(self) -> None:
        import pymysql

        admin = self.base.admin
        sweep_users(admin)
        me = str(admin.execute("SELECT USER()").fetchone()[0])
        self.host = me.rsplit("@", 1)[1] if "@" in me else "localhost"
        self.user = SANDBOX_PREFIX + secrets.token_hex(6)
        self.password = secrets.token_urlsafe(24)
        server = self.base.server
        secret = (f"BY PASSWORD {_literal(_native_hash(self.password))}" if server.flavour == "MariaDB"
                  else f"BY {_literal(self.password)}")
        try:
            admin.execute(f"CREATE USER {self.account} IDENTIFIED {secret} "
                          f"WITH MAX_USER_CONNECTIONS {int(self.connections)}")
        except pymysql.err.MySQLError as exc:
            self.user = self.password = None
            self.note = (f"ran as your own user {me} (it may not create users: {exc.args[-1]}): the "
                         "SQL had your rights on this server, as anything you run here does")
            return
        admin.execute(f"GRANT ALL PRIVILEGES ON {_grant_pattern(self.base.database)}.* TO {self.account}")
        try:
            self.lab.connect(role="sandbox", lock_wait_timeout_s=None).close()
        except ServerError as exc:
            raise LabkitError(f"The throw-away user {self.user} that runs the file's SQL could not "
                              f"log in: {exc.what}",
                              f"let users log in from {self.host} with a password, then run it "
                              "again.") from None
        self.note = (f"ran as the throw-away user {self.user}, which may use the database "
                     f"{self.base.database} and nothing else")

    @property
    def lab(self) -> MyLab:
        """The lab, seen through the throw-away user (the lab itself, where there is none)."""
        if self.user is None:
            return self.base
        if self._lab is None:
            as_user = replace(self.base.server, params={
                **self.base.server.params, "user": self.user, "password": self.password})
            self._lab = _UserLab(self.base, as_user)
        return self._lab

    def close(self) -> None:
        """End the user's sessions and drop it."""
        if self._lab is not None:
            self._lab.close_connections()
        if self.user is None:
            return
        admin = self.base.admin
        for (thread,) in admin.execute(query(SQL, "user_sessions").sql, {"user": self.user}).fetchall():
            kill(self.base.server, thread, query_only=False)
        admin.execute(f"DROP USER IF EXISTS {self.account}")
        self.user = self.password = None
