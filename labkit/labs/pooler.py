"""The queue behind a connection pooler: a real PgBouncer in transaction pooling mode.

In transaction pooling, PgBouncer lends a server connection to a client for one transaction
and takes it back at COMMIT; the next transaction, of any client, may run on it.  What a
transaction does inside the server is fine.  What a *session* keeps after its transaction
ends is not the client's any more: it stays on the server connection, and the next client
that borrows the connection inherits it.  :func:`pooler_trace` shows it on a real PgBouncer
with a pool of one server connection (``pool_size=1``), so that the sharing happens every
time, in a scripted order (with a bigger pool the same things happen, just not every time):

* claim-mark-commit works: two clients claim with ``FOR UPDATE SKIP LOCKED`` and mark done
  in one transaction; every job is done exactly once.  While A's transaction is open, B's
  waits *in PgBouncer* (``cl_waiting`` in ``SHOW POOLS``), not in the server;
* a plain ``SET`` leaks to the next client (``SET LOCAL`` does not), unless PgBouncer
  tracks the parameter: it keeps ``client_encoding``, ``DateStyle``, ``TimeZone``,
  ``standard_conforming_strings`` and ``application_name`` per client (and, with
  ``track_extra_parameters``, others the server reports to the client) and sets the
  client's own value on the server connection whenever the client becomes active.
  ``statement_timeout`` is not one of them: A's leaks to B, A's ``TimeZone`` does not;
* a session-level advisory lock stays on the server connection: another client takes it
  again and can release it (``pg_advisory_xact_lock`` does not misbehave);
* ``LISTEN`` lands on a server connection that goes back to the pool: the notification
  never reaches the client that listened;
* psycopg's automatic prepared statements (a query's sixth run is prepared as ``_pg3_0``)
  collide on the shared connection; the pooler's clients here connect with
  ``prepare_threshold=None``.

:func:`transcripts` runs the same stories as transcripts (:class:`Clients`): what each client
sent, and what the other client then saw, side by side.

The fixes, for the notebook's prose: ``SET LOCAL`` (or ``set_config(..., true)``) inside the
transaction, or ``ALTER ROLE ... SET`` / ``ALTER DATABASE ... SET`` for a setting every
session should have; ``pg_advisory_xact_lock`` (released at COMMIT); a direct (or
session-pooled) connection for the listener; for prepared statements, ``prepare_threshold=None``
on PgBouncer older than 1.21, or on 1.21 to 1.23 with ``max_prepared_statements`` at their
default of 0; with it above 0 (from 1.21), or from 1.24, whose default is 200, PgBouncer tracks
protocol-level prepared statements itself.  SQL ``PREPARE``
and ``DEALLOCATE`` never work in transaction pooling.

:class:`PgBouncer` runs one pooler for a lab: its own config, in a private folder, listening
on a Unix socket there only.
"""

from __future__ import annotations

import atexit
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from ..core.db import Database, session_name
from ..core.errors import LabkitError
from ..core.lab import Lab
from ..core.limits import number
from ..core.procs import signals_deferred
from ..core.queries import query
from ..core.results import Result, not_json
from ..core.server import PG_SYSTEM_USER, socket_answers
from ..core.steps import Result as StepResult
from ..core.steps import Step, StepError, classify
from ..core.text import fill
from ..core.transcript import Transcript
from ._checked import one_row
from .production import fresh_table

SEARCH_DIRS = ("/usr/sbin", "/usr/local/bin", "/usr/local/sbin", "/opt/homebrew/bin", "/usr/bin")
INSTALL_FIX = ("install it (`sudo apt-get install pgbouncer` on Debian or Ubuntu, "
               "`brew install pgbouncer` on macOS), then run this again.")
DB_ENTRY = "labkit"          # the [databases] entry clients name as their dbname
# The socket is .s.PGSQL.<port> in a folder of this run's own, that nobody else can list or
# write: no other pooler or server can hold that name there, so any port number is free.
PORT = 6432
SETTING = "4321ms"           # what client A sets; what client B must not see
TRACKED_SETTING = "Pacific/Chatham"   # A's TimeZone: a parameter PgBouncer tracks per client
LEASE_S = 30
MAX_JOBS = 1000
MAX_WAIT_S = 10.0
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0

_live: set[PgBouncer] = set()


def _q(name: str) -> str:
    return query("pooler.sql", name).sql


# -- finding PgBouncer -----------------------------------------------------------------------


def find_pgbouncer() -> str | None:
    """The pgbouncer binary: on PATH, else in /usr/sbin (Debian installs it there, off a normal
    user's PATH), /usr/local/bin or Homebrew's /opt/homebrew/bin; None when there is none."""
    found = shutil.which("pgbouncer")
    if found:
        return found
    for folder in SEARCH_DIRS:
        path = os.path.join(folder, "pgbouncer")
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def missing_error() -> LabkitError:
    where = ", ".join(SEARCH_DIRS)
    return LabkitError(f"PgBouncer is not installed: no pgbouncer on PATH nor in {where}.",
                       INSTALL_FIX)


@cache
def _version_of(binary: str) -> str:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10,
                             env={"PATH": os.defpath, "LC_ALL": "C"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LabkitError(f"{binary} --version did not answer ({exc}).",
                          "check the PgBouncer installation, or " + INSTALL_FIX) from None
    m = re.search(r"PgBouncer\s+(\d+\.\d+(?:\.\d+)?)", out.stdout + out.stderr, re.I)
    if not m:
        raise LabkitError(f"{binary} does not say it is PgBouncer ({(out.stdout or out.stderr).strip()[:80]!r}).",
                          "remove that file from PATH, or " + INSTALL_FIX)
    return m.group(1)


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def pgbouncer_available() -> tuple[bool, str]:
    """(True, "PgBouncer 1.18.0 (/usr/sbin/pgbouncer)"), or (False, the sentence a notebook
    prints instead of running its pooler cells)."""
    binary = find_pgbouncer()
    if binary is None:
        return False, ("PgBouncer not installed: apt-get install pgbouncer (Debian, Ubuntu) or "
                       "brew install pgbouncer (macOS); this section's cells report instead of "
                       "running.")
    try:
        return True, f"PgBouncer {_version_of(binary)} ({binary})"
    except LabkitError as exc:
        return False, f"{exc}; this section's cells report instead of running."


# -- who runs it ---------------------------------------------------------------------------


def _runner(host: str | None) -> pwd.struct_passwd | None:
    """As root, the user PgBouncer runs as (it refuses to run as root); None otherwise.

    The owner of the server's socket folder when the server is reached through one (the
    embedded server's folder is 0700 and its owner's: nobody else could reach the socket),
    else labkit's own system user for the embedded server, else ``nobody``."""
    if os.name != "posix" or os.geteuid() != 0:
        return None
    if host and host.startswith("/"):
        try:
            st = os.stat(host)
        except OSError:
            st = None
        if st is not None and st.st_uid != 0:
            try:
                return pwd.getpwuid(st.st_uid)
            except KeyError:
                pass
    for name in (PG_SYSTEM_USER, "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise LabkitError("PgBouncer will not run as root, and neither the user "
                      f"{PG_SYSTEM_USER!r} nor 'nobody' exists to run it as.",
                      "run labkit as a normal user, or start the embedded server once "
                      "(`labkit server start` creates that user).")


# The process between us and PgBouncer (it drops root, asks the kernel to end it when we die,
# then becomes PgBouncer): labkit.core's launcher, a file of its own, run by path as
# `python -I -S FILE`, so that it imports nothing but the standard library.
_LAUNCH = Path(__file__).resolve().parent.parent / "core" / "_launch.py"


def _quote(value: str) -> str:
    """A value of a [databases] entry, quoted the way PgBouncer reads it ('' is a quote)."""
    if any(c in value for c in "\n\r\0"):
        raise LabkitError("The server's connection settings hold a line break.",
                          "fix LABKIT_DSN (or unset it to use the embedded server).")
    return "'" + value.replace("'", "''") + "'"


# -- the pooler ------------------------------------------------------------------------------


class PgBouncer:
    """One PgBouncer for one lab run.

    ``start(db)`` writes a config into a private folder (mode 0700, files 0600, owned by the
    user PgBouncer runs as), pointing one database entry (``labkit``) at ``db``'s server, and
    listens on a Unix socket in that folder only: no TCP port.  Authentication is
    ``auth_type = any`` (no password asked, every client logs into the server as the entry's
    ``user=``): safe here because only the folder's owner (and root) can reach the socket;
    the same setting on a TCP port would hand the database to anyone who can connect.

    ``stop()`` (also at interpreter exit, on Ctrl-C through the ``with`` block, and by the
    kernel if this process dies on Linux) ends it and removes the folder."""

    def __init__(self, binary: str | None = None):
        found = binary or find_pgbouncer()
        if found is None:
            raise missing_error()
        self.binary: str = found
        self.version = _version_of(self.binary)
        self.dir: Path | None = None
        self.port = PORT
        self.pool_mode = ""
        self.pool_size = 0
        self.user: str | None = None        # the OS user it runs as
        self.server_user = ""               # the database role its server connections use
        self._proc: subprocess.Popen | None = None
        self._uid_gid = (-1, -1)             # as root: who it runs as

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.running else "stopped"
        return f"PgBouncer({self.version}, {self.pool_mode or '-'}, {state})"

    # -- where clients connect --------------------------------------------------------------
    @property
    def dsn(self) -> str:
        """``host=<folder> port=<port> dbname=labkit``.  Connect with ``prepare_threshold=None``
        (see :meth:`connect`) and without ``options``: PgBouncer refuses startup parameters it
        does not track ("unsupported startup parameter: options"); psycopg sends none of its
        own, so ``ignore_startup_parameters`` is not needed."""
        if self.dir is None:
            raise LabkitError("This PgBouncer is not started.", "call start(db) first.")
        return f"host={self.dir} port={self.port} dbname={DB_ENTRY}"

    @property
    def config_path(self) -> Path | None:
        return self.dir / "pgbouncer.ini" if self.dir else None

    @property
    def log_path(self) -> Path | None:
        return self.dir / "pgbouncer.log" if self.dir else None

    def _file(self, path: Path | None) -> Path:
        """:attr:`config_path` or :attr:`log_path`, which exist once :meth:`start` made the folder."""
        if path is None:
            raise LabkitError("This PgBouncer is not started.", "call start(db) first.")
        return path

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def connect(self, *, application_name: str = "labkit:pooler", autocommit: bool = True,
                prepare_threshold: int | None = None, **kw) -> psycopg.Connection:
        """A client connection through the pooler.  ``prepare_threshold=None``: psycopg's
        automatic prepared statements (a query run a sixth time is prepared as ``_pg3_0`` on the
        server session) break in transaction pooling when PgBouncer does not track them (older
        than 1.21; 1.21 to 1.23 with ``max_prepared_statements`` at their default of 0): the
        statement lives on one server connection, and another client's ``_pg3_0`` collides
        with it there, or the next transaction runs on a connection that lacks it."""
        if "options" in kw:
            raise LabkitError("A client of PgBouncer cannot pass startup options.",
                              "set what you need inside each transaction (SET LOCAL), or on "
                              "the role (ALTER ROLE ... SET).")
        kw.setdefault("connect_timeout", 10)
        return psycopg.connect(self.dsn, autocommit=autocommit, application_name=application_name,
                               prepare_threshold=prepare_threshold, **kw)

    def pools(self) -> list[dict]:
        """``SHOW POOLS`` on PgBouncer's admin console (any client may use it here, see
        auth_type above): a dict per pool (cl_active, cl_waiting, sv_active, sv_idle...)."""
        with psycopg.connect(f"host={self.dir} port={self.port} dbname=pgbouncer",
                             autocommit=True, connect_timeout=10,
                             cursor_factory=psycopg.ClientCursor) as console:
            cur = console.execute("SHOW POOLS")     # the console speaks the simple protocol only
            if cur.description is None:
                raise LabkitError(f"PgBouncer {self.version} answered SHOW POOLS without columns.",
                                  "read its log (log_tail()): its admin console did not answer.")
            cols = [c.name for c in cur.description]
            return [dict(zip(cols, row)) for row in cur.fetchall()]

    def log_problems(self, lines: int = 6) -> str:
        """The log's last warnings and errors (its last lines when it has none)."""
        tail = self.log_tail(200).splitlines()
        bad = [line for line in tail if re.search(r"\b(WARNING|ERROR|FATAL)\b", line)]
        return "\n".join((bad or tail)[-lines:])

    def log_tail(self, lines: int = 12) -> str:
        if self.log_path is None:
            return ""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    # -- life cycle ----------------------------------------------------------------------------
    def start(self, db: Database, *, pool_mode: str = "transaction", pool_size: int = 1,
              timeout: float = START_TIMEOUT_S) -> PgBouncer:
        """Start PgBouncer in front of ``db``'s server and wait until it accepts clients."""
        if self._proc is not None:
            raise LabkitError("This PgBouncer is already started.", "stop() it first, or make another.")
        if pool_mode not in ("session", "transaction", "statement"):
            raise LabkitError(f"pool_mode={pool_mode!r} is not a PgBouncer pool mode.",
                              "pass session, transaction or statement.")
        number("pool_size", pool_size, low=1, high=100, whole=True, example=1)
        entry = self._server_entry(db)
        self.pool_mode, self.pool_size = pool_mode, pool_size
        sweep_stale_folders()
        try:
            self._write_files(entry, host=entry["host"])
            self._launch()
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        # PgBouncer has read its configuration, the server's password with it, and keeps it in
        # memory: the file goes, so that a kernel killed outright leaves no password on disk.
        self._file(self.config_path).unlink(missing_ok=True)
        return self

    def _server_entry(self, db: Database) -> dict[str, str]:
        """Where the server is: what ``db.dsn`` says (conninfo_to_dict), with what libpq
        filled in from its defaults and environment where it says nothing (read from a live
        connection: the host and port it reached, its user and database)."""
        try:
            given = conninfo_to_dict(db.dsn)
        except psycopg.ProgrammingError:
            given = {}
        with db.connect() as conn:
            info = conn.info
            reached = {"host": info.host, "port": str(info.port), "dbname": info.dbname,
                       "user": info.user}
            password = str(given.get("password") or info.password or "")
        def pick(key: str) -> str:
            # A host list (h1,h2) means "the first that answers" to libpq but "round robin"
            # to PgBouncer: give it the one libpq reached.
            value = str(given.get(key) or "")
            return value if value and "," not in value else reached[key]

        entry = {k: pick(k) for k in ("host", "port", "dbname", "user")}
        if password:
            entry["password"] = password
        sslmode = given.get("sslmode")
        if sslmode:
            entry["_sslmode"] = str(sslmode)
        self.server_user = entry["user"]
        return entry

    def _config(self, entry: dict[str, str]) -> str:
        pairs = " ".join(f"{k}={_quote(v)}" for k, v in entry.items() if not k.startswith("_"))
        lines = [
            ";; Written by labkit for one lab run; removed when the run ends.",
            "[databases]",
            f"{DB_ENTRY} = {pairs}",
            "",
            "[pgbouncer]",
            ";; No listen_addr: no TCP port at all. Only this Unix socket, in a folder of mode",
            ";; 0700 that the user PgBouncer runs as owns: nobody else can reach it.",
            f"listen_port = {self.port}",
            f"unix_socket_dir = {self.dir}",
            "unix_socket_mode = 0600",
            ";; Every client logs into the server as the entry's user=, with no password asked:",
            ";; safe only because no one but the folder's owner (and root) reaches the socket.",
            "auth_type = any",
            f"pool_mode = {self.pool_mode}",
            f"default_pool_size = {self.pool_size}",
            "min_pool_size = 0",
            "reserve_pool_size = 0",
            "max_client_conn = 100",
            ";; Fail fast when the server cannot be reached, instead of retrying for minutes.",
            "server_connect_timeout = 5",
            "server_login_retry = 1",
            "query_wait_timeout = 30",
            ";; Run only in session pooling (the default): transaction pooling resets nothing.",
            "server_reset_query = DISCARD ALL",
            "server_reset_query_always = 0",
        ]
        if "_sslmode" in entry:
            lines.append(f"server_tls_sslmode = {entry['_sslmode']}")
        return "\n".join(lines) + "\n"

    def _write_files(self, entry: dict[str, str], *, host: str) -> None:
        user = _runner(host)
        self.user = user.pw_name if user else pwd.getpwuid(os.geteuid()).pw_name
        # As root, in /tmp: the folder must be reachable by the user PgBouncer runs as, and
        # a TMPDIR under root's home is not.
        parent = "/tmp" if user is not None and os.path.isdir("/tmp") else None
        self.dir = Path(tempfile.mkdtemp(prefix="lk-pgb-", dir=parent))     # 0700, ours
        if len(str(self.dir / f".s.PGSQL.{self.port}")) > 100:
            raise LabkitError(f"The temporary folder {self.dir.parent} has too long a path for a "
                              "Unix socket.", "set TMPDIR to a short path such as /tmp.")
        self.config_text = self._config(entry)      # the file goes once PgBouncer has read it
        files = {self._file(self.config_path): self.config_text, self._file(self.log_path): ""}
        for path, text in files.items():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                os.write(fd, text.encode())
                if user is not None:
                    os.fchown(fd, user.pw_uid, user.pw_gid)
            finally:
                os.close(fd)
        fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            if user is not None:
                os.fchown(fd, user.pw_uid, user.pw_gid)
            os.fchmod(fd, 0o700)
        finally:
            os.close(fd)
        self._uid_gid = (user.pw_uid, user.pw_gid) if user is not None else (-1, -1)

    def _launch(self) -> None:
        uid, gid = self._uid_gid
        # The kernel's "end with the parent" follows the thread that started the child: ask
        # for it only from the main thread (atexit and stop() cover the rest).
        parent = os.getpid() if threading.current_thread() is threading.main_thread() else 0
        env = {"PATH": os.defpath, "LC_ALL": "C", "LANG": "C"}
        log = open(self._file(self.log_path), "ab")
        try:
            # Ctrl-C in the middle of the spawn would leave a PgBouncer nothing knows of.
            with signals_deferred():
                self._proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", str(_LAUNCH), str(parent), str(uid), str(gid),
                     str(int(signal.SIGTERM)), self.binary, str(self._file(self.config_path))],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, cwd=str(self.dir),
                    start_new_session=True)   # a Ctrl-C at the terminal is ours to act on, not its
                _live.add(self)
        finally:
            log.close()

    def _wait_ready(self, timeout: float) -> None:
        proc = self._proc
        if proc is None:
            raise LabkitError("This PgBouncer is not started.", "call start(db) first.")
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            if proc.poll() is not None:
                raise LabkitError(
                    f"PgBouncer {self.version} exited at start (code {proc.returncode}). "
                    f"Its log:\n{self.log_problems()}",
                    "read the log above: a setting it refuses, or a server it cannot reach.")
            try:
                with self.connect(application_name="labkit:pooler-probe", connect_timeout=3) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError as exc:
                last = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
                # PgBouncer is up and answered with the server's refusal: no use waiting.
                refused = "FATAL" in str(exc) and "pgbouncer cannot connect" not in str(exc)
            if refused or time.monotonic() > deadline:
                what = "was refused by the server" if refused else \
                    f"did not accept a client within {timeout:g} s"
                raise LabkitError(
                    f"PgBouncer {self.version} {what} ({last}). Its log:\n{self.log_problems()}",
                    "read the log above: most often the server refused PgBouncer's login (its "
                    "user or password) or cannot be reached from PgBouncer's user.")
            time.sleep(0.05)

    def stop(self) -> None:
        """End PgBouncer (SIGTERM, then SIGKILL after 5 s) and remove its folder."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(STOP_TIMEOUT_S)
                except ProcessLookupError:
                    pass
        _live.discard(self)
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PgBouncer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def sweep_stale_folders() -> list[Path]:
    """Remove the folders of PgBouncers that are gone (a kernel killed outright leaves its
    folder behind): ``lk-pgb-*`` in the temporary folders, owned by this user or by the user
    PgBouncer runs as for it, whose socket no longer answers."""
    uids = {os.geteuid()}
    for name in (PG_SYSTEM_USER, "nobody"):         # whom _runner hands PgBouncer to, as root
        try:
            uids.add(pwd.getpwnam(name).pw_uid)
        except KeyError:
            pass
    live = {b.dir for b in _live if b.dir is not None}
    removed = []
    for parent in {Path(tempfile.gettempdir()), Path("/tmp")}:
        for folder in parent.glob("lk-pgb-*"):
            try:
                st = os.lstat(folder)
            except OSError:
                continue
            if not stat.S_ISDIR(st.st_mode) or st.st_uid not in uids or folder in live:
                continue
            if any(socket_answers(sock) for sock in folder.glob(".s.PGSQL.*")):
                continue                      # another kernel's PgBouncer, running
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def stop_all() -> None:
    """Stop every PgBouncer this process started (at interpreter exit)."""
    for bouncer in list(_live):
        try:
            bouncer.stop()
        except Exception:
            pass


atexit.register(stop_all)


# -- the lab ---------------------------------------------------------------------------------


def check_params(*, jobs: Any = 20, listen_wait_s: Any = 1.0) -> None:
    number("jobs", jobs, low=2, high=MAX_JOBS, whole=True, example=20)
    number("listen_wait_s", listen_wait_s, low=0.1, high=MAX_WAIT_S, unit=" s", example=1)


def _one(conn: psycopg.Connection, name: str, params: dict | None = None) -> Any:
    row = conn.execute(_q(name), params).fetchone()
    return row[0] if row else None


def _pid(conn: psycopg.Connection) -> int:
    return _one(conn, "backend_pid")


def _holders(direct: psycopg.Connection, key: int) -> list[int]:
    return [pid for pid, _mode, granted in direct.execute(_q("lock_holders"), {"key": key}) if granted]


class _Queued(NamedTuple):
    """What the pool and the server showed once client B queued behind A's open transaction."""

    pool: dict          # the pool's row of SHOW POOLS
    lock_waits: Any     # the lab's sessions waiting for a lock in the server
    b_running: bool     # B's claim had not ended (read after the two above)


def _b_queues_behind_a(lab: Lab, bouncer: PgBouncer, a: psycopg.Connection,
                       direct: psycopg.Connection, b_claims: Callable[[], Any],
                       a_finishes: Callable[[_Queued], Any]) -> tuple[_Queued, Any, Any]:
    """While A's transaction is open, ``b_claims()`` (client B's claim-mark-commit) runs on a
    thread of its own and waits for the pool's one server connection, in PgBouncer -- not in
    the server.  Once SHOW POOLS shows B queued (or B has ended), ``a_finishes(queued)`` ends
    A's transaction.  A's transaction is rolled back if an error left it open, B's thread is
    joined and an error of B's raised.  Returns ``queued``, what ``a_finishes`` returned and
    what ``b_claims`` returned (None if it had not ended)."""
    outcome: dict = {}

    def b_thread() -> None:
        try:
            outcome["b"] = b_claims()
        except BaseException as exc:          # reported to the main thread
            outcome["error"] = exc

    thread = threading.Thread(target=b_thread, name="pooler-client-B", daemon=True)
    try:
        thread.start()
        deadline = time.monotonic() + 10
        while True:
            pool = next((p for p in bouncer.pools() if p["database"] == DB_ENTRY), {})
            if pool.get("cl_waiting", 0) >= 1 or not thread.is_alive():
                break
            if time.monotonic() > deadline:
                raise LabkitError("Client B never queued for the pool's server connection.",
                                  "read PgBouncer's log; the pool may be bigger than one.")
            time.sleep(0.01)
        lock_waits = _one(direct, "lock_waits", {"app": lab.app_name})
        queued = _Queued(pool, lock_waits, thread.is_alive())
        a_done = a_finishes(queued)
    finally:
        if a.info.transaction_status != psycopg.pq.TransactionStatus.IDLE and not a.closed:
            try:
                a.execute("ROLLBACK")
            except psycopg.Error:
                pass
        thread.join(30)
    if "error" in outcome:
        raise outcome["error"]
    return queued, a_done, outcome.get("b")


def _take_turns(a: psycopg.Connection, b: psycopg.Connection,
                one: Callable[[psycopg.Connection, str], bool]) -> None:
    """A and B take turns, ``one(conn, client)`` claim-mark-commit transaction each, until
    the queue is empty (two turns in a row claim nothing)."""
    turn, empty = 0, 0
    while empty < 2:
        who, conn = (("A", a), ("B", b))[turn % 2]
        empty = 0 if one(conn, who) else empty + 1
        turn += 1


@dataclass(frozen=True)
class PooledClaim(Result):
    """One claim-mark-commit transaction of a client of the pooler.

    client: the client that ran it: "A" or "B"
    job: the job it claimed
    backend_pid: the server backend the transaction ran on
    marked: whether marking the job done updated it
    """

    client: str
    job: int
    backend_pid: int
    marked: bool


@dataclass(frozen=True)
class PoolWhileAOpen(Result):
    """The pool while client A's transaction was open and client B's waited for the pool's one
    server connection.

    cl_waiting: clients waiting for a server connection (SHOW POOLS): 1, B
    sv_active: server connections lent to a client (SHOW POOLS): 1, A's
    server_lock_waits: the lab's sessions waiting for a lock in the server (0: B waits in PgBouncer)
    b_done_before_a_commit: whether B's transaction had ended before A committed (False)
    """

    cl_waiting: int | None
    sv_active: int | None
    server_lock_waits: int
    b_done_before_a_commit: bool


@dataclass(frozen=True)
class PooledClaims(Result):
    """Claim-mark-commit through transaction pooling: what works.

    ok: every job claimed once, marked and done, each transaction's mark applied
    jobs: jobs enqueued
    claims: claim-mark-commit transactions that claimed a job
    distinct_jobs: distinct jobs those claimed
    done: jobs done in the table afterwards
    claimed_once: jobs done whose attempts are 1, in the table
    by_client: {client: claims it made}, for "A" and "B"
    backend_pids: the server backends the claims ran on
    b_waited_in_pooler: whether B's transaction waited in PgBouncer (not in the server) while A's was open
    pool_while_a_open: the pool at that moment (a :class:`PoolWhileAOpen`)
    first: the first four claims, in order (a :class:`PooledClaim` each)
    """

    ok: bool
    jobs: int
    claims: int
    distinct_jobs: int
    done: int
    claimed_once: int
    by_client: dict[str, int]
    backend_pids: list[int]
    b_waited_in_pooler: bool
    pool_while_a_open: PoolWhileAOpen
    first: list[PooledClaim]


def _claims(lab: Lab, bouncer: PgBouncer, a: psycopg.Connection, b: psycopg.Connection,
            direct: psycopg.Connection, jobs: int) -> PooledClaims:
    job = sql.Identifier(lab.schema, "job")
    claim = sql.SQL(_q("claim")).format(job=job)
    complete = sql.SQL(_q("complete")).format(job=job)
    lab.execute(sql.SQL(_q("enqueue")).format(job=job), {"n": jobs})
    ran: list[PooledClaim] = []

    def one(conn: psycopg.Connection, who: str) -> bool:
        with conn.transaction():
            row = conn.execute(claim, {"worker": who, "lease_s": LEASE_S}).fetchone()
            if row is None:
                return False
            job_id, version, pid = row
            done = conn.execute(complete, {"id": job_id, "claim_version": version}).fetchone()
        ran.append(PooledClaim(client=who, job=job_id, backend_pid=pid, marked=done is not None))
        return True

    # 1. A's transaction is open (a job claimed, not yet marked): B's transaction waits for
    #    the pool's one server connection, in PgBouncer -- not in the server.
    a.execute("BEGIN")
    row = one_row(a.execute(claim, {"worker": "A", "lease_s": LEASE_S}), "A's claim of a job")

    def a_finishes(queued: _Queued) -> None:
        job_id, version, pid = row
        done = a.execute(complete, {"id": job_id, "claim_version": version}).fetchone()
        a.execute("COMMIT")
        ran.insert(0, PooledClaim(client="A", job=job_id, backend_pid=pid, marked=done is not None))

    queued, _, _ = _b_queues_behind_a(lab, bouncer, a, direct, lambda: one(b, "B"), a_finishes)
    pool = queued.pool
    waited = PoolWhileAOpen(cl_waiting=pool.get("cl_waiting"), sv_active=pool.get("sv_active"),
                            server_lock_waits=queued.lock_waits,
                            b_done_before_a_commit=not queued.b_running)

    # 2. Then A and B take turns, one claim-mark-commit transaction each, until the queue is empty.
    _take_turns(a, b, one)
    total, done, once = lab.execute(sql.SQL(_q("tally")).format(job=job))[0]
    ids = [r.job for r in ran]
    pids = sorted({r.backend_pid for r in ran})
    ok = (total == jobs and done == jobs and once == jobs and len(ids) == jobs
          and len(set(ids)) == jobs and all(r.marked for r in ran))
    return PooledClaims(
        ok=ok, jobs=jobs, claims=len(ids), distinct_jobs=len(set(ids)), done=done,
        claimed_once=once,
        by_client={c: sum(1 for r in ran if r.client == c) for c in ("A", "B")},
        backend_pids=pids,
        b_waited_in_pooler=(waited.cl_waiting or 0) >= 1 and not waited.b_done_before_a_commit
        and waited.server_lock_waits == 0,
        pool_while_a_open=waited, first=ran[:4])


@dataclass(frozen=True)
class TrackedSet(Result):
    """Client A's SET of a parameter PgBouncer tracks per client (TimeZone), and what B then
    saw: it does not leak.

    parameter: the parameter ("TimeZone")
    server_default: its value before A set it (what B saw first)
    a_set: the value A set
    b_sees: what B's SHOW gave after A's SET (PgBouncer set B's own value back first)
    a_sees_after_b: what A's SHOW gave after B's turn
    leaked: whether B saw A's value
    kept_for_a: whether A still saw its own value after B's turn
    """

    parameter: str
    server_default: str
    a_set: str
    b_sees: str
    a_sees_after_b: str
    leaked: bool
    kept_for_a: bool


@dataclass(frozen=True)
class SessionSet(Result):
    """Client A's plain SET of statement_timeout and its SET LOCAL, and what client B then saw
    on the shared server connection.

    leaked: whether B saw A's plain SET
    server_default: statement_timeout before A's SET
    a_set: the value A set (:data:`SETTING`)
    b_sees: what B's SHOW gave after A's SET
    a_backend_pid: the server backend A's statements ran on
    b_backend_pid: the server backend B's ran on
    set_local_inside: what A's SHOW gave inside the transaction of its SET LOCAL
    b_sees_after_set_local: what B's SHOW gave after that transaction
    set_local_leaked: whether B saw A's SET LOCAL
    set_local_backend_pid: the server backend A's SET LOCAL ran on
    tracked: the same with a parameter PgBouncer tracks (a :class:`TrackedSet`)
    """

    leaked: bool
    server_default: str
    a_set: str
    b_sees: str
    a_backend_pid: int
    b_backend_pid: int
    set_local_inside: str
    b_sees_after_set_local: str
    set_local_leaked: bool
    set_local_backend_pid: int
    tracked: TrackedSet


def _session_set(a: psycopg.Connection, b: psycopg.Connection) -> SessionSet:
    default = _one(b, "show")
    tracked_default = _one(b, "show_tracked")
    a.execute(_q("session_set"))                    # autocommit: outside any transaction
    a.execute(_q("session_set_tracked"))            # the server reports it; PgBouncer notes it as A's
    a_pid, b_pid = _pid(a), _pid(b)
    b_sees = _one(b, "show")
    b_sees_tracked = _one(b, "show_tracked")        # PgBouncer set B's own value back first
    a_sees_tracked = _one(a, "show_tracked")        # and A's again when A came back
    a.execute(_q("reset_tracked"))
    b.execute(_q("reset"))                          # B "repairs" it -- for everyone
    with a.transaction():
        a.execute(_q("set_local"))
        inside = _one(a, "show")
        local_pid = _pid(a)
    b_after_local = _one(b, "show")
    return SessionSet(leaked=b_sees == SETTING, server_default=default, a_set=SETTING,
                      b_sees=b_sees, a_backend_pid=a_pid, b_backend_pid=b_pid,
                      set_local_inside=inside, b_sees_after_set_local=b_after_local,
                      set_local_leaked=b_after_local == SETTING, set_local_backend_pid=local_pid,
                      tracked=TrackedSet(parameter="TimeZone", server_default=tracked_default,
                                         a_set=TRACKED_SETTING, b_sees=b_sees_tracked,
                                         a_sees_after_b=a_sees_tracked,
                                         leaked=b_sees_tracked == TRACKED_SETTING,
                                         kept_for_a=a_sees_tracked == TRACKED_SETTING))


@dataclass(frozen=True)
class XactLock(Result):
    """Client A's transaction-level advisory lock (pg_advisory_xact_lock): it behaves.

    key: the lock's key (the session lock's key plus one)
    held_by_during_a: backends holding it while A's transaction was open (A's)
    a_backend_pid: the server backend A's transaction ran on
    other_session_try_during_a: a direct session's pg_try_advisory_lock meanwhile (False)
    held_by_after_a_commit: backends holding it after A's COMMIT (none)
    b_try_after_a_commit: B's pg_try_advisory_xact_lock after that (True)
    misbehaved: whether it did anything but live exactly as long as A's transaction
    """

    key: int
    held_by_during_a: list[int]
    a_backend_pid: int
    other_session_try_during_a: bool
    held_by_after_a_commit: list[int]
    b_try_after_a_commit: bool
    misbehaved: bool


@dataclass(frozen=True)
class AdvisoryLock(Result):
    """Client A's session-level advisory lock, left on the shared server connection: B takes
    it again and releases it.

    misbehaved: whether B took A's lock and its two unlocks left nobody holding it
    key: the lock's key (the lab's own: advisory locks are database-wide)
    a_backend_pid: the server backend A's pg_advisory_lock ran on
    b_backend_pid: the server backend B's statements ran on
    held_by_after_a: backends holding it after A's statement ended (A's, now the pool's)
    other_session_try: a direct session's pg_try_advisory_lock then (False)
    b_try_lock: B's pg_try_advisory_lock (True: the same server session)
    b_unlocks: B's two pg_advisory_unlock calls ([True, True])
    held_by_after_b_unlocks: backends holding it afterwards (none)
    other_session_takes_it_after: a direct session's pg_try_advisory_lock then (True)
    xact: the transaction-level lock, for contrast (an :class:`XactLock`)
    """

    misbehaved: bool
    key: int
    a_backend_pid: int
    b_backend_pid: int
    held_by_after_a: list[int]
    other_session_try: bool
    b_try_lock: bool
    b_unlocks: list[bool]
    held_by_after_b_unlocks: list[int]
    other_session_takes_it_after: bool
    xact: XactLock


def _advisory(a: psycopg.Connection, b: psycopg.Connection, direct: psycopg.Connection,
              key: int) -> AdvisoryLock:
    a.execute(_q("lock"), {"key": key})             # A's statement, and its transaction, end
    a_pid = _pid(a)
    held_by = _holders(direct, key)
    other_session_try = _one(direct, "try_lock", {"key": key})
    b_try = _one(b, "try_lock", {"key": key})       # A "holds" it; B gets it all the same
    b_pid = _pid(b)
    b_unlocks = [_one(b, "unlock", {"key": key}), _one(b, "unlock", {"key": key})]
    after = _holders(direct, key)                   # B released A's lock too: nobody holds it
    other_takes_it = _one(direct, "try_lock", {"key": key})
    if other_takes_it:
        direct.execute(_q("unlock"), {"key": key})
    # The transaction-level lock lives exactly as long as A's transaction, and during it the
    # server connection is A's alone.
    xkey = key + 1
    with a.transaction():
        a.execute(_q("xact_lock"), {"key": xkey})
        x_held_by = _holders(direct, xkey)
        x_other_try = _one(direct, "try_lock", {"key": xkey})
        x_pid = _pid(a)
    x_after_commit = _holders(direct, xkey)
    with b.transaction():
        x_b_try = _one(b, "try_xact_lock", {"key": xkey})
    return AdvisoryLock(
        misbehaved=bool(b_try) and after == [] and b_unlocks == [True, True],
        key=key, a_backend_pid=a_pid, b_backend_pid=b_pid,
        held_by_after_a=held_by, other_session_try=other_session_try,
        b_try_lock=b_try, b_unlocks=b_unlocks, held_by_after_b_unlocks=after,
        other_session_takes_it_after=other_takes_it,
        xact=XactLock(key=xkey, held_by_during_a=x_held_by, a_backend_pid=x_pid,
                      other_session_try_during_a=x_other_try,
                      held_by_after_a_commit=x_after_commit, b_try_after_a_commit=x_b_try,
                      misbehaved=not (x_held_by == [x_pid] and x_other_try is False
                                      and x_after_commit == [])))


@dataclass(frozen=True)
class PreparedStatements(Result):
    """Two clients with psycopg's automatic prepared statements (its default threshold) on the
    one server connection.

    broke: whether the second client's statement failed
    error: the server's message (None when nothing broke)
    sqlstate: its SQLSTATE (42P05 before PgBouncer tracks prepared statements; None when nothing broke)
    failed_on_run: the second client's run that failed (6: the run psycopg prepares; None when nothing broke)
    prepare_threshold: psycopg's prepare_threshold the two clients had (5)
    """

    broke: bool
    error: str | None
    sqlstate: str | None
    failed_on_run: int | None
    prepare_threshold: int


def _prepared(bouncer: PgBouncer, lab: Lab, a: psycopg.Connection) -> PreparedStatements:
    """Two clients with psycopg's default prepare_threshold (5) on the one server connection."""
    name = session_name(lab.schema, "pooler-prep")
    p1 = bouncer.connect(application_name=name, prepare_threshold=5)
    p2 = bouncer.connect(application_name=name, prepare_threshold=5)
    error, sqlstate, failed_run = None, None, None
    try:
        for n in range(1, 8):
            p1.execute(_q("prepared_a"), {"n": n})
        for n in range(1, 8):
            try:
                p2.execute(_q("prepared_b"), {"n": n})
            except psycopg.Error as exc:
                error = (exc.diag.message_primary or str(exc)).strip()
                sqlstate, failed_run = exc.sqlstate, n
                break
    finally:
        p1.close()
        p2.close()
        a.execute(_q("deallocate"))          # what p1 left on the shared server session
    return PreparedStatements(broke=error is not None, error=error, sqlstate=sqlstate,
                              failed_on_run=failed_run, prepare_threshold=5)


@dataclass(frozen=True)
class PooledListen(Result):
    """Client A's LISTEN through the pooler, against a direct listener on the same channel.

    broken: whether A received nothing while the direct listener received the notification
    channel: the channel (the lab's own)
    a_received: notifications A received
    a_waited_s: how long A waited for them, seconds
    direct_listener_received: notifications the direct listener received (1)
    a_backend_pid: the server backend A's LISTEN ran on
    b_backend_pid: the server backend B's statements ran on
    b_session_listens_on: the channels B's session listens on (A's: it is the same server session)
    pgbouncer_log: PgBouncer's last log line about a notification from a server connection no
        client was linked to (None if it logged none)
    """

    broken: bool
    channel: str
    a_received: int
    a_waited_s: float
    direct_listener_received: int
    a_backend_pid: int
    b_backend_pid: int
    b_session_listens_on: list[str]
    pgbouncer_log: str | None


def _listen(bouncer: PgBouncer, lab: Lab, a: psycopg.Connection, b: psycopg.Connection,
            direct: psycopg.Connection, wait_s: float) -> PooledListen:
    channel = f"{lab.schema}_pooler"
    listen = sql.SQL(_q("listen")).format(channel=sql.Identifier(channel))
    a.execute(listen)
    a_pid = _pid(a)
    control = lab.connect(role="pooler-listen")         # a direct connection listens too
    try:
        control.execute(listen)
        direct.execute(_q("notify"), {"channel": channel, "payload": "wake up"})
        control_got = [n.payload for n in control.notifies(timeout=wait_s, stop_after=1)]
        t0 = time.monotonic()
        a_got = [n.payload for n in a.notifies(timeout=wait_s)]
        waited = time.monotonic() - t0
    finally:
        control.close()
    b_listens = [(ch, pid) for ch, pid in b.execute(_q("listening")).fetchall()]
    b_pid = _pid(b)
    b.execute(_q("unlisten"))
    # PgBouncer's word for it: the server sent a NotificationResponse ('A') on a connection
    # no client was linked to, and PgBouncer dropped it.
    logged = [re.sub(r"^.*?(WARNING|LOG)\s+S-0x[0-9a-f]+:\s*", r"\1 ", line)
              for line in bouncer.log_tail(200).splitlines() if "from server when not linked" in line]
    return PooledListen(broken=a_got == [] and control_got == ["wake up"], channel=channel,
                        a_received=len(a_got), a_waited_s=round(waited, 2),
                        direct_listener_received=len(control_got), a_backend_pid=a_pid,
                        b_backend_pid=b_pid, b_session_listens_on=[ch for ch, _ in b_listens],
                        pgbouncer_log=logged[-1] if logged else None)


@dataclass(frozen=True)
class PoolerTrace(Result):
    """Two clients, A and B, through a real PgBouncer in transaction pooling with one server
    connection (:func:`pooler_trace`; what ``labkit trace pooler --json`` prints).

    pgbouncer_version: the PgBouncer that ran ("1.18.0")
    pool_mode: its pool mode ("transaction")
    pool_size: server connections in its pool (1)
    claim_mark_commit_ok: every job claimed and done exactly once
    session_set_leaked: B saw A's plain SET
    advisory_lock_misbehaved: B took and released A's session-level advisory lock
    listen_broken: A's LISTEN received nothing
    same_backend: every statement of A and B ran on one server backend
    backend_pids: the server backends they ran on
    claims: claim-mark-commit's evidence (a :class:`PooledClaims`)
    session_set: the plain SET's (a :class:`SessionSet`)
    advisory_lock: the advisory lock's (an :class:`AdvisoryLock`)
    listen: LISTEN's (a :class:`PooledListen`)
    prepared_statements: psycopg's automatic prepared statements' (a :class:`PreparedStatements`)
    seconds: the run's duration, seconds
    """

    pgbouncer_version: str
    pool_mode: str
    pool_size: int
    claim_mark_commit_ok: bool
    session_set_leaked: bool
    advisory_lock_misbehaved: bool
    listen_broken: bool
    same_backend: bool
    backend_pids: list[int]
    claims: PooledClaims
    session_set: SessionSet
    advisory_lock: AdvisoryLock
    listen: PooledListen
    prepared_statements: PreparedStatements
    seconds: float


def pooler_trace(lab: Lab, *, jobs: int = 20, listen_wait_s: float = 1.0) -> PoolerTrace:
    """Two clients, A and B, through a real PgBouncer in transaction pooling with one server
    connection (``pool_size=1``: the sharing happens every time; with a bigger pool the same
    bugs happen, just not every time).  About ``listen_wait_s`` plus a second.  A
    :class:`PoolerTrace`: the four verdicts (claim-mark-commit works; a plain SET, a session
    advisory lock and LISTEN do not) and the evidence of each, with psycopg's automatic
    prepared statements at their default threshold."""
    check_params(jobs=jobs, listen_wait_s=listen_wait_s)
    bouncer = PgBouncer()
    fresh_table(lab)
    t0 = time.monotonic()
    with bouncer.start(lab.db, pool_mode="transaction", pool_size=1):
        a = bouncer.connect(application_name=session_name(lab.schema, "pooler-a"))
        b = bouncer.connect(application_name=session_name(lab.schema, "pooler-b"))
        direct = lab.connect(role="pooler-direct")
        try:
            claims = _claims(lab, bouncer, a, b, direct, jobs)
            session = _session_set(a, b)
            advisory = _advisory(a, b, direct, lab.advisory_key())
            prepared = _prepared(bouncer, lab, a)
            listen = _listen(bouncer, lab, a, b, direct, listen_wait_s)
        finally:
            for conn in (a, b, direct):
                conn.close()
    pids = sorted(set(claims.backend_pids) | {
        session.a_backend_pid, session.b_backend_pid, session.set_local_backend_pid,
        advisory.a_backend_pid, advisory.b_backend_pid, advisory.xact.a_backend_pid,
        listen.a_backend_pid, listen.b_backend_pid})
    return PoolerTrace(pgbouncer_version=bouncer.version, pool_mode="transaction", pool_size=1,
                       claim_mark_commit_ok=claims.ok, session_set_leaked=session.leaked,
                       advisory_lock_misbehaved=advisory.misbehaved, listen_broken=listen.broken,
                       same_backend=len(pids) == 1, backend_pids=pids,
                       claims=claims, session_set=session, advisory_lock=advisory,
                       listen=listen, prepared_statements=prepared,
                       seconds=round(time.monotonic() - t0, 2))


def report(r: PoolerTrace) -> str:
    """The trace as a few lines of text."""
    c, s, a, li, p = r.claims, r.session_set, r.advisory_lock, r.listen, r.prepared_statements
    w = c.pool_while_a_open
    yes = {True: "yes", False: "no"}
    lines = [
        f"PgBouncer {r.pgbouncer_version}, {r.pool_mode} pooling, pool_size {r.pool_size}: "
        f"every statement of A and B ran on server backend(s) {', '.join(map(str, r.backend_pids))}",
        f"  claim-mark-commit ok:        {yes[r.claim_mark_commit_ok]:3}  {c.jobs} jobs, "
        f"A {c.by_client['A']} / B {c.by_client['B']} claims, each done once; while A's "
        f"transaction was open B waited in PgBouncer (cl_waiting {w.cl_waiting}, "
        f"lock waits in the server {w.server_lock_waits})",
        f"  plain SET leaked:            {yes[r.session_set_leaked]:3}  A: SET statement_timeout = "
        f"'{s.a_set}'; B: SHOW statement_timeout -> {s.b_sees} (SET LOCAL leaked: "
        f"{yes[s.set_local_leaked]}, B saw {s.b_sees_after_set_local})",
        f"  tracked SET leaked:          {yes[s.tracked.leaked]:3}  A: SET TimeZone = "
        f"'{s.tracked.a_set}'; B: SHOW TimeZone -> {s.tracked.b_sees}; "
        f"A again -> {s.tracked.a_sees_after_b}",
        f"  session advisory lock broke: {yes[r.advisory_lock_misbehaved]:3}  A locked {a.key} "
        f"(held by pid {a.held_by_after_a}); B: pg_try_advisory_lock -> {a.b_try_lock}, "
        f"two unlocks -> {a.b_unlocks}, now held by {a.held_by_after_b_unlocks or 'nobody'} "
        f"(xact lock misbehaved: {yes[a.xact.misbehaved]})",
        f"  LISTEN broken:               {yes[r.listen_broken]:3}  A received {li.a_received} in "
        f"{li.a_waited_s:g} s, a direct listener {li.direct_listener_received}; B's session "
        f"listens on {li.b_session_listens_on or 'nothing'}",
        f"  prepared statements broke:   {yes[p.broke]:3}  "
        + (f"prepare_threshold 5: the second client's run {p.failed_on_run} failed: "
           f"{p.error} ({p.sqlstate})" if p.broke else
           "prepare_threshold 5: no collision (PgBouncer tracks prepared statements)"),
    ]
    # what each row found goes on under itself, in its own column
    return "\n".join([fill(lines[0], indent="    ")] + [fill(line, indent=" " * 36) for line in lines[1:]])


# -- the same, as transcripts: what each client sent, and what the other one then saw ----------


def _text(value: Any) -> str | None:
    """A value as psql shows it (booleans as t and f)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "t" if value else "f"
    return str(value)


class Clients:
    """Named connections (clients of the pooler, or direct ones) and one ordered script.
    Every step is recorded as a :class:`~labkit.core.steps.Step`, so that
    :meth:`transcript` shows the clients side by side as the workbook's other transcripts
    do.  ``shown`` replaces a step's answer in the transcript, ``note`` fills its note."""

    track_locks = False

    def __init__(self, **conns: psycopg.Connection):
        self.conns = conns
        self.names = list(conns)
        self.steps: list[Step] = []
        self._shown: dict[str, str] = {}
        self._notes: dict[str, str] = {}

    def __call__(self, session: str, sql_text: str | sql.SQL | sql.Composed, params: dict | None = None, *,
                 label: str | None = None, runs: list[dict] | None = None,
                 shown: str | None = None, note: str = "") -> Step:
        """Send ``sql_text`` from ``session`` (once per dict of ``runs``, if given: the
        last run's answer is kept, and the first error ends the runs)."""
        step = self._new(session, sql_text, label, shown, note)
        conn = self.conns[session]
        batches: list[dict | None] = list(runs) if runs else [params]
        try:
            for p in batches:
                cur = conn.execute(sql_text, p)
            step.results = _results(cur)
        except psycopg.Error as exc:
            msg = (exc.diag.message_primary or str(exc)).strip()
            step.error = StepError(exc.sqlstate or "", msg, classify(exc.sqlstate or "", msg))
        step.finished = time.perf_counter()
        return step

    def did(self, session: str, label: str, shown: str, note: str = "") -> Step:
        """A step that is not a statement (a wait for notifications), and what it gave."""
        step = self._new(session, label, label, shown, note)
        step.finished = time.perf_counter()
        return step

    def _new(self, session: str, sql_text: str | sql.SQL | sql.Composed, label: str | None,
             shown: str | None, note: str) -> Step:
        if session not in self.conns:
            raise LabkitError(f"No client named {session!r} (have {self.names}).",
                              "use one of the names given to Clients(...).")
        if not isinstance(sql_text, str):
            sql_text = sql_text.as_string(self.conns[session])
        step = Step(len(self.steps), session, sql_text, label or sql_text)
        step.started = time.perf_counter()
        self.steps.append(step)
        n = str(step.index + 1)
        if shown is not None:
            self._shown[n] = shown
        if note:
            self._notes[n] = note
        return step

    def say(self, row: str, *, shown: str | None = None, note: str | None = None) -> None:
        """What a row of the transcript says (``row``: "3", or "3'" for a completion)."""
        if shown is not None:
            self._shown[row] = shown
        if note is not None:
            self._notes[row] = note

    def transcript(self) -> Transcript:
        """The clients side by side: each step's label (what was sent) and its answer."""
        t = Transcript.from_run(self, show_locks=False)
        steps = {str(s.index + 1): s for s in self.steps}
        for row in t.rows:
            step = steps[row.n.rstrip("'")]
            answer = self._shown.get(row.n, _answer(step))
            if row.kind == "waiting":
                row.text = f"{step.label}  <waiting ...>"
            elif row.n.endswith("'"):
                row.text = f"<... completed>  → {answer}"
            else:
                row.text = f"{step.label}  → {answer}"
            if row.n in self._notes:
                row.note = self._notes[row.n]
        return t


def _answer(step: Step) -> str:
    """A step's answer, short: its one value, its rows, or the server's command tag."""
    if step.error:
        return step.error.brief()
    shown = [r for r in step.results if r.columns]
    if not shown:
        return step.results[-1].command if step.results else "ok"
    rows = shown[-1].text_rows
    if not rows:
        return "(no rows)"
    return "; ".join(", ".join("NULL" if v is None else v for v in row) for row in rows)


def _results(cur: psycopg.Cursor) -> list[StepResult]:
    out = []
    while True:
        if cur.description:
            rows = cur.fetchall()
            out.append(StepResult([c.name for c in cur.description], rows,
                                  [tuple(_text(v) for v in r) for r in rows],
                                  [False] * len(cur.description), cur.statusmessage or ""))
        else:
            out.append(StepResult([], [], [], [], cur.statusmessage or ""))
        if not cur.nextset():
            return out


@dataclass(frozen=True)
class ClaimsTurns(Result):
    """Claim-mark-commit through the pooler, as a transcript (``transcripts(lab).claims``).

    ok: every job claimed once and done, and A's mark applied
    jobs: jobs enqueued
    done: jobs done in the table afterwards
    claimed_once: jobs done whose attempts are 1
    by_client: {client: claims it made}, for "A" and "B"
    b_waited_in_pooler: whether B's transaction waited in PgBouncer (not in the server) while A's was open
    cl_waiting: clients waiting for a server connection then (SHOW POOLS)
    server_lock_waits: the lab's sessions waiting for a lock in the server then (0)
    backend_pids: the server backends the claims ran on
    transcript: what each client sent and saw (not in JSON)
    """

    ok: bool
    jobs: int
    done: int
    claimed_once: int
    by_client: dict[str, int]
    b_waited_in_pooler: bool
    cl_waiting: int | None
    server_lock_waits: int
    backend_pids: list[int]
    transcript: Transcript = not_json()


def _claims_run(lab: Lab, bouncer: PgBouncer, a: psycopg.Connection, b: psycopg.Connection,
                direct: psycopg.Connection, jobs: int) -> ClaimsTurns:
    """A claims a job in an open transaction; B's claim-mark-commit waits for the pool's one
    server connection, in PgBouncer; A marks it and commits, B goes on.  Then A and B take
    turns until the queue is empty."""
    job = sql.Identifier(lab.schema, "job")
    claim = sql.SQL(_q("claim")).format(job=job)
    complete = sql.SQL(_q("complete")).format(job=job)
    lab.execute(sql.SQL(_q("enqueue")).format(job=job), {"n": jobs})
    run = Clients(A=a, B=b)
    ran: list[tuple[str, int, int]] = []          # (client, job, backend)

    def one(conn: psycopg.Connection, who: str) -> int | None:
        with conn.transaction():
            row = conn.execute(claim, {"worker": who, "lease_s": LEASE_S}).fetchone()
            if row is None:
                return None
            conn.execute(complete, {"id": row[0], "claim_version": row[1]})
        ran.append((who, row[0], row[2]))
        return row[0]

    run("A", "BEGIN")
    a_claim = run("A", claim, {"worker": "A", "lease_s": LEASE_S}, label="claim (SKIP LOCKED)")
    a_job, a_version, a_pid = a_claim.rows[0]
    run.say("2", shown=f"job {a_job}", note="A's open transaction holds the server connection")
    b_step = run.did("B", "BEGIN; claim; mark; COMMIT", "")
    b_step.finished = None

    def a_finishes(queued: _Queued) -> Step:
        b_step.waited = queued.pool.get("cl_waiting", 0) >= 1 and queued.b_running
        run.say("3", note=f"waits in PgBouncer, not in the server (SHOW POOLS: cl_waiting "
                          f"{queued.pool.get('cl_waiting')}; lock waits in the server: "
                          f"{queued.lock_waits})")
        done = run("A", complete, {"id": a_job, "claim_version": a_version}, label="mark done",
                   shown=f"job {a_job} done")
        run("A", "COMMIT")
        ran.insert(0, ("A", a_job, a_pid))
        return done

    queued, done, b_job = _b_queues_behind_a(lab, bouncer, a, direct, lambda: one(b, "B"),
                                             a_finishes)
    pool, lock_waits, b_waited = queued.pool, queued.lock_waits, b_step.waited
    b_step.finished = time.perf_counter()
    b_step.completed_after = len(run.steps) - 1
    run.say("3'", shown=f"job {b_job}, done")
    _take_turns(a, b, lambda conn, who: one(conn, who) is not None)   # until the queue is empty
    total, finished, once = lab.execute(sql.SQL(_q("tally")).format(job=job))[0]
    ids = [j for _, j, _ in ran]
    ok = (total == finished == once == jobs == len(ids) == len(set(ids))
          and done.rows != [])
    return ClaimsTurns(ok=ok, jobs=jobs, done=finished, claimed_once=once,
                       by_client={c: sum(1 for w, _, _ in ran if w == c) for c in ("A", "B")},
                       b_waited_in_pooler=bool(b_waited) and lock_waits == 0,
                       cl_waiting=pool.get("cl_waiting"), server_lock_waits=lock_waits,
                       backend_pids=sorted({p for _, _, p in ran}), transcript=run.transcript())


@dataclass(frozen=True)
class SharedSessionStep(Result):
    """One of the first four steps of the ``set`` transcript, and the server session under it:
    what :func:`plot_shared_session` draws.

    client: who sent it: "A" or "B"
    sent: what it sent, short (as the picture shows it)
    statement_timeout: the server session's statement_timeout after the step
    backend_pid: the server backend that ran it
    """

    client: str
    sent: str
    statement_timeout: str
    backend_pid: int


@dataclass(frozen=True)
class TrackedTurns(Result):
    """Client A's SET of a parameter PgBouncer tracks (TimeZone) in the ``set`` transcript.

    parameter: the parameter ("TimeZone")
    a_set: the value A set
    b_sees: what B's SHOW gave next (its own value: PgBouncer set it back)
    a_sees_after_b: what A's SHOW gave after that
    leaked: whether B saw A's value
    kept_for_a: whether A still saw its own value
    """

    parameter: str
    a_set: str
    b_sees: str
    a_sees_after_b: str
    leaked: bool
    kept_for_a: bool


@dataclass(frozen=True)
class SetTurns(Result):
    """A plain SET through the pooler, as a transcript (``transcripts(lab).set``).

    server_default: statement_timeout before A's SET
    a_set: the value A set (:data:`SETTING`)
    b_sees: what B's SHOW gave next
    leaked: whether B saw A's value
    tracked: the same with a parameter PgBouncer tracks (a :class:`TrackedTurns`)
    story: the first four steps and the server session under each (a :class:`SharedSessionStep` each)
    transcript: what each client sent and saw (not in JSON)
    """

    server_default: str
    a_set: str
    b_sees: str
    leaked: bool
    tracked: TrackedTurns
    story: list[SharedSessionStep]
    transcript: Transcript = not_json()


def _set_run(a: psycopg.Connection, b: psycopg.Connection) -> SetTurns:
    """A plain SET leaks to B; a parameter PgBouncer tracks does not.  After each of the
    first four steps (A's SET and B's looks at it) the server backend that ran it is read,
    outside the transcript, for :func:`plot_shared_session`."""
    run = Clients(A=a, B=b)
    story: list[SharedSessionStep] = []

    def told(client: str, conn: psycopg.Connection, sent: str, value: str) -> None:
        story.append(SharedSessionStep(client=client, sent=sent, statement_timeout=value,
                                       backend_pid=_pid(conn)))

    default = run("B", _q("show"), note="the server's default").rows[0][0]
    told("B", b, f"SHOW → {default}", default)
    run("A", _q("session_set"))
    told("A", a, f"SET …\n= '{SETTING}'", SETTING)
    b_sees = run("B", _q("show"), note="A's setting, in B's session").rows[0][0]
    told("B", b, f"SHOW → {b_sees}", b_sees)
    run("B", _q("reset"), note="B puts it back: for every client")
    told("B", b, "RESET", _one(b, "show"))
    run("A", _q("session_set_tracked"), note="a parameter PgBouncer tracks")
    b_tz = run("B", _q("show_tracked"), note="PgBouncer set B's own value back").rows[0][0]
    a_tz = run("A", _q("show_tracked"), note="and A's, when A came back").rows[0][0]
    run("A", _q("reset_tracked"))
    return SetTurns(server_default=default, a_set=SETTING, b_sees=b_sees,
                    leaked=b_sees == SETTING,
                    tracked=TrackedTurns(parameter="TimeZone", a_set=TRACKED_SETTING, b_sees=b_tz,
                                         a_sees_after_b=a_tz, leaked=b_tz == TRACKED_SETTING,
                                         kept_for_a=a_tz == TRACKED_SETTING),
                    story=story, transcript=run.transcript())


def plot_shared_session(s: SetTurns):
    """The first four steps of :func:`transcripts`' ``set`` run drawn: client A's and
    client B's statements, each going down through PgBouncer to the server backend that ran
    it (its pid, read after each step), and that backend's ``statement_timeout`` after the
    step.  One backend serves both clients in turn, so A's SET is still on it when B's
    transaction runs.  Returns the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import FancyBboxPatch

    from ..core.plots import PALETTE

    if not isinstance(s, SetTurns):
        raise LabkitError("plot_shared_session draws the 'set' run of pooler.transcripts.",
                          "pass pooler.transcripts(lab).set.")
    default = s.server_default
    steps = [(d.client, d.sent, d.statement_timeout, d.backend_pid) for d in s.story]
    if not steps:
        raise LabkitError("The run has no steps to draw.", "pass pooler.transcripts(lab).set.")
    colour = {"A": PALETTE[0], "B": PALETTE[4]}
    leaked_c, plain_c = PALETTE[1], "#eeeeee"
    lane = {"A": 2.0, "B": 1.0}
    server_y = 0.0
    fig, ax = plt.subplots(figsize=(12, 4.6))
    for x, (client, sent, value, _pid) in enumerate(steps, start=1):
        y = lane[client]
        ax.add_patch(FancyBboxPatch((x - 0.42, y - 0.3), 0.84, 0.6,
                                    boxstyle="round,pad=0.02", fc="white", ec=colour[client],
                                    lw=2.5))
        ax.text(x, y, sent, ha="center", va="center")
        ax.annotate("", (x, server_y + 0.32), (x, y - 0.32),
                    arrowprops=dict(arrowstyle="-|>", color=colour[client], lw=2))
        mine = client == "A" or value == default
        ax.add_patch(FancyBboxPatch((x - 0.42, server_y - 0.3), 0.84, 0.6,
                                    boxstyle="round,pad=0.02",
                                    fc=plain_c if mine else leaked_c, ec="#555555", lw=1))
        ax.text(x, server_y, value, ha="center", va="center")
    pids = sorted({p for *_, p in steps})
    who = "backend " + ", ".join(map(str, pids))
    ax.set_yticks([2, 1, server_y])
    ax.set_yticklabels(["client A", "client B",
                        f"the server session\n({who})\nstatement_timeout"])
    ax.set_xticks(range(1, len(steps) + 1))
    ax.set_xticklabels([f"step {i}" for i in range(1, len(steps) + 1)])
    ax.set_xlim(0.45, len(steps) + 0.55)
    ax.set_ylim(-0.45, 2.45)
    for side in ("left", "right", "top", "bottom"):
        ax.spines[side].set_visible(False)
    ax.tick_params(length=0)
    ax.set_title("Two clients of PgBouncer, one server session: A's SET stays on it")
    handles = [Line2D([], [], color=colour["A"], lw=3, label="A's statement"),
               Line2D([], [], color=colour["B"], lw=3, label="B's statement"),
               Line2D([], [], ls="none", marker="s", ms=14, mfc=leaked_c, mec="#555555",
                      label="what B's transaction ran with: A's value")]
    fig.legend(handles=handles, loc="outside lower center", ncol=3, frameon=False)
    return fig


@dataclass(frozen=True)
class XactTurns(Result):
    """Client A's transaction-level advisory lock in the ``advisory`` transcript.

    other_session_try_during_a: a direct session's pg_try_advisory_lock while A's transaction was open (False)
    free_after_a_commit: whether a direct session took it after A's COMMIT (True)
    misbehaved: whether it did anything but live exactly as long as A's transaction
    """

    other_session_try_during_a: bool
    free_after_a_commit: bool
    misbehaved: bool


@dataclass(frozen=True)
class AdvisoryTurns(Result):
    """A session advisory lock through the pooler, as a transcript (``transcripts(lab).advisory``).

    key: the lock's key (the lab's own)
    other_session_try: a direct session's pg_try_advisory_lock after A's transaction ended (False)
    b_try_lock: B's pg_try_advisory_lock (True: the same server session)
    b_unlocks: B's two pg_advisory_unlock calls ([True, True])
    other_session_takes_it_after: whether a direct session took it afterwards (True)
    misbehaved: whether B took A's lock and released it
    xact: the transaction-level lock, for contrast (an :class:`XactTurns`)
    transcript: what each client sent and saw (not in JSON)
    """

    key: int
    other_session_try: bool
    b_try_lock: bool
    b_unlocks: list[bool]
    other_session_takes_it_after: bool
    misbehaved: bool
    xact: XactTurns
    transcript: Transcript = not_json()


def _advisory_run(a: psycopg.Connection, b: psycopg.Connection, direct: psycopg.Connection,
                  key: int) -> AdvisoryTurns:
    """A's session advisory lock stays on the server connection: B takes it again and
    releases it; a transaction-level lock ends with A's transaction.  A direct session
    tries each lock after the step that its note names."""
    run = Clients(A=a, B=b)
    k, x = {"key": key}, {"key": key + 1}

    def direct_try(params: dict) -> bool:
        got = _one(direct, "try_lock", params)
        if got:
            direct.execute(_q("unlock"), params)
        return got

    run("A", _q("lock"), k, label="pg_advisory_lock(k)", shown="locked")
    other = direct_try(k)
    run.say("1", note=f"A's transaction is over; a direct session's try: {_text(other)}")
    b_try = run("B", _q("try_lock"), k, label="pg_try_advisory_lock(k)",
                note="B gets A's lock: the same server session").rows[0][0]
    b_unlocks = [run("B", _q("unlock"), k, label="pg_advisory_unlock(k)").rows[0][0],
                 run("B", _q("unlock"), k, label="pg_advisory_unlock(k)").rows[0][0]]
    free = direct_try(k)
    run.say("4", note=f"B released A's lock too; a direct session's try: {_text(free)}")
    run("A", "BEGIN")
    run("A", _q("xact_lock"), x, label="pg_advisory_xact_lock(k2)", shown="locked")
    x_other = direct_try(x)
    run.say("6", note=f"a direct session's try: {_text(x_other)}")
    run("A", "COMMIT")
    x_free = direct_try(x)
    run.say("7", note=f"the lock ends with the transaction; a direct session's try: "
                      f"{_text(x_free)}")
    return AdvisoryTurns(key=key, other_session_try=other, b_try_lock=b_try, b_unlocks=b_unlocks,
                         other_session_takes_it_after=free,
                         misbehaved=b_try is True and b_unlocks == [True, True] and free is True,
                         xact=XactTurns(other_session_try_during_a=x_other,
                                        free_after_a_commit=x_free,
                                        misbehaved=not (x_other is False and x_free is True)),
                         transcript=run.transcript())


@dataclass(frozen=True)
class ListenTurns(Result):
    """LISTEN through the pooler, as a transcript (``transcripts(lab).listen``).

    channel: the channel (the lab's own)
    a_received: notifications A received, at the wait and afterwards (0)
    b_session_listens_on: the channels B's session listens on (A's)
    b_received: the payloads B received, though it never listened (["two"])
    broken: whether A heard nothing and B heard what it never asked for
    transcript: what each client sent and saw (not in JSON)
    """

    channel: str
    a_received: int
    b_session_listens_on: list[str]
    b_received: list[str]
    broken: bool
    transcript: Transcript = not_json()


def _listen_run(a: psycopg.Connection, b: psycopg.Connection, direct: psycopg.Connection,
                channel: str, wait_s: float) -> ListenTurns:
    """A LISTENs; a direct session's NOTIFY reaches nobody; B's session turns out to be the
    one listening, and B receives a notification it never asked for."""
    run = Clients(A=a, B=b, direct=direct)
    ch = {"channel": channel}
    run("A", sql.SQL(_q("listen")).format(channel=sql.Identifier(channel)), label="LISTEN jobs")
    run("direct", _q("notify"), {**ch, "payload": "one"}, label="NOTIFY jobs, 'one'",
        shown="sent")
    a_got = [n.payload for n in a.notifies(timeout=wait_s)]
    run.did("A", f"wait {wait_s:g} s", ", ".join(a_got) or "nothing",
            note="PgBouncer dropped it: no client was on that server connection")
    b_listens = [r[0] for r in run("B", _q("listening"), label="pg_listening_channels()",
                                   shown="jobs", note="A's LISTEN is B's session's").rows]
    run("B", _q("notify"), {**ch, "payload": "two"}, label="NOTIFY jobs, 'two'", shown="sent")
    b_got = [n.payload for n in b.notifies(timeout=wait_s, stop_after=1)]
    run.did("B", "read notifications", ", ".join(f"'{p}'" for p in b_got) or "nothing",
            note="B never listened, and hears it")
    a_later = [n.payload for n in a.notifies(timeout=0.05)]
    run.did("A", "read notifications", ", ".join(a_later) or "nothing")
    run("B", _q("unlisten"))
    return ListenTurns(channel=channel, a_received=len(a_got) + len(a_later),
                       b_session_listens_on=[c for c in b_listens if c], b_received=b_got,
                       broken=not a_got and not a_later and b_got == ["two"],
                       transcript=run.transcript())


@dataclass(frozen=True)
class PreparedTurns(Result):
    """Automatic prepared statements through the pooler, as a transcript
    (``transcripts(lab).prepared``).

    broke: whether B's statement failed
    sqlstate: its SQLSTATE (42P05 before PgBouncer tracks prepared statements; None when nothing broke)
    error: the server's message (None when nothing broke)
    b_sees: the prepared statements B's session holds, as rows of pg_prepared_statements (A's)
    prepare_threshold: psycopg's prepare_threshold the two clients had (5)
    transcript: what each client sent and saw (not in JSON)
    """

    broke: bool
    sqlstate: str | None
    error: str | None
    b_sees: list[tuple[Any, ...]]
    prepare_threshold: int
    transcript: Transcript = not_json()


def _prepared_run(bouncer: PgBouncer, lab: Lab, a: psycopg.Connection) -> PreparedTurns:
    """Two clients with psycopg's default prepare_threshold (5) on the one server connection."""
    name = session_name(lab.schema, "pooler-prep")
    p1 = bouncer.connect(application_name=name, prepare_threshold=5)
    p2 = bouncer.connect(application_name=name, prepare_threshold=5)
    run = Clients(A=p1, B=p2)
    try:
        run("A", _q("prepared_a"), label="SELECT %(n)s::int AS a with n = 1, 2, 3, 4, 5",
            runs=[{"n": n} for n in range(1, 6)], note="five runs; the last one's answer")
        run("A", _q("prepared_a"), {"n": 6}, label="the same, n = 6",
            note="psycopg prepares it on the server session")
        seen = run("B", _q("prepared_names"), label="SELECT name FROM pg_prepared_statements",
                   note="A's prepared statement, in B's session").rows
        b_step = run("B", _q("prepared_b"), label="SELECT %(n)s::int * 2 AS b with n = 1 to 6",
                     runs=[{"n": n} for n in range(1, 7)])
    finally:
        p1.close()
        p2.close()
        a.execute(_q("deallocate"))          # what A left on the shared server session
    err = b_step.error
    if err is not None:
        run.say("4", note="on run 6, psycopg prepares B's query under the same name")
    return PreparedTurns(broke=err is not None, sqlstate=err.sqlstate if err else None,
                         error=err.message if err else None, b_sees=seen,
                         prepare_threshold=5, transcript=run.transcript())


@dataclass(frozen=True)
class PoolerTranscripts(Result):
    """What :func:`pooler_trace` shows, as transcripts (:func:`transcripts`): each story with
    its transcript and what it found.

    pgbouncer_version: the PgBouncer that ran ("1.18.0")
    backend_pids: the server backends A's and B's statements ran on
    same_backend: every statement of A and B ran on one server backend
    claims: claim-mark-commit (a :class:`ClaimsTurns`): it works
    set: a plain SET and a tracked one (a :class:`SetTurns`; its ``story`` is what
        :func:`plot_shared_session` draws)
    advisory: a session advisory lock (an :class:`AdvisoryTurns`)
    listen: LISTEN (a :class:`ListenTurns`): A hears nothing, B hears what it never asked for
    prepared: automatic prepared statements (a :class:`PreparedTurns`)
    """

    pgbouncer_version: str
    backend_pids: list[int]
    same_backend: bool
    claims: ClaimsTurns
    set: SetTurns
    advisory: AdvisoryTurns
    listen: ListenTurns
    prepared: PreparedTurns


def transcripts(lab: Lab, *, jobs: int = 20, listen_wait_s: float = 1.0) -> PoolerTranscripts:
    """What :func:`pooler_trace` shows, as transcripts: two clients, A and B, through a real
    PgBouncer in transaction pooling with one server connection, and a direct session.
    About ``listen_wait_s`` plus a second.  A :class:`PoolerTranscripts`."""
    check_params(jobs=jobs, listen_wait_s=listen_wait_s)
    bouncer = PgBouncer()
    fresh_table(lab)
    with bouncer.start(lab.db, pool_mode="transaction", pool_size=1):
        a = bouncer.connect(application_name=session_name(lab.schema, "pooler-a"))
        b = bouncer.connect(application_name=session_name(lab.schema, "pooler-b"))
        direct = lab.connect(role="pooler-direct")
        try:
            pids = {_pid(a), _pid(b)}
            claims = _claims_run(lab, bouncer, a, b, direct, jobs)
            setting = _set_run(a, b)
            advisory = _advisory_run(a, b, direct, lab.advisory_key())
            listen = _listen_run(a, b, direct, f"{lab.schema}_pooler", listen_wait_s)
            prepared = _prepared_run(bouncer, lab, a)
            pids |= ({_pid(a), _pid(b)} | set(claims.backend_pids)
                     | {d.backend_pid for d in setting.story})
        finally:
            for conn in (a, b, direct):
                conn.close()
    return PoolerTranscripts(pgbouncer_version=bouncer.version, backend_pids=sorted(pids),
                             same_backend=len(pids) == 1, claims=claims, set=setting,
                             advisory=advisory, listen=listen, prepared=prepared)


# -- command line: labkit pooler ---------------------------------------------------------------


def pooler_command(*, open_lab: Callable[[], Lab], jobs: int = 20, listen_wait_s: float = 1.0,
                   json: bool = False) -> int:
    """``labkit pooler [--jobs 20] [--listen-wait-s 1] [--json]``: what transaction pooling
    breaks, on a real PgBouncer.  Exits 2, before opening a lab, when PgBouncer is missing."""
    check_params(jobs=jobs, listen_wait_s=listen_wait_s)
    if find_pgbouncer() is None:
        print(str(missing_error()), file=sys.stderr)
        return 2
    with open_lab() as lab:
        r = pooler_trace(lab, jobs=jobs, listen_wait_s=listen_wait_s)
    print(r.to_json() if json else report(r))
    return 0
