"""A half-open connection: the network between a worker and the server goes silent.

A worker claims a job (``BEGIN``, ``SELECT ... FOR UPDATE SKIP LOCKED``) and sends its next
statement, and at that moment the network between it and the server stops carrying packets:
a NAT or a load balancer forgot the connection, a cable or a host is gone.  Nothing says so.
No FIN and no RST arrive, since nothing arrives at all: each side's kernel still holds the
connection as ESTABLISHED.  The worker waits for an answer that cannot come; the server's
session sits "idle in transaction", holding the job's row lock, waiting for a statement that
cannot come either.  :func:`half_open_trace` makes such a connection for real and measures
what bounds each side's wait.

**Making the silence honestly.**  A TCP proxy in user space that merely stops forwarding does
*not* make a half-open connection: the proxy's kernel still acknowledges what the worker
sends and answers its keepalive probes, so the worker's TCP sees a healthy peer and none of
its timeouts fire.  The packets have to vanish.  So the lab runs in a network namespace of
its own (Linux): a child process leaves the machine's network (``unshare``: a new network
namespace, inside a new user namespace when not run as root, so that no privilege is needed)
and brings that namespace's loopback interface up.  In it, a throw-away PostgreSQL of the
lab's own (:class:`~labkit.core.replica.ReplicaPair`, primary only) listens on 127.0.0.1, and
the workers, threads of that child, connect to it over TCP.  Its ``pg_hba.conf`` gains one
line that lets TCP from 127.0.0.1 in: inside the namespace, nothing but the lab is there to
use it.  The lab itself watches the server from outside, through its Unix socket: a Unix
socket is a file, reached by its path from any network namespace.  Since the server's own TCP
sockets are in the silence too, what ends its side of a connection is its own settings
(``tcp_keepalives_*``, ``tcp_user_timeout``), not a stand-in for them.

The cut is the loopback going **down**.  From then on every packet either side sends is
discarded inside the sending kernel, silently, and nothing arrives anywhere.  The sockets stay
ESTABLISHED, ``send()`` still succeeds, and TCP counts the discarded packets as sent and lost:
the worker's socket holds its statement unacknowledged under the retransmission timer,
retransmitting again and again (``/proc/<pid>/net/tcp`` shows it; the tests check it), exactly
as when the network loses them on the way.  No error comes back at once, and when one comes
it is a timeout (``ETIMEDOUT``, not "no route to host"), as a standalone experiment showed on
Linux 6.18 before this lab was written.

**Three workers**, each with one job, cut at the same moment, each sending its ``UPDATE``
right after the cut; ``cap_s`` is how long the lab watches before it gives up.

* **without keepalive** (libpq ``keepalives=0``; its server session with the server's
  defaults, which still turn keepalives on with the kernel's timers: ``tcp_keepalives_idle``
  reads back 7200).  Its statement is data the kernel must deliver: the kernel keeps it and tries
  again and again, backing off, and gives up only after ``net.ipv4.tcp_retries2`` attempts
  (15 by default, which the kernel's documentation puts at about 15 minutes).  Measured: no
  answer and no error, still waiting at the cap.  Its session, as the server sees it: "idle
  in transaction" at the cap, the job's row still locked (another worker's claim skips it).
  The server's side would end only by its TCP keepalives, which default to the kernel's
  ``net.ipv4.tcp_keepalive_time``: two hours of silence before the first probe.
* **with keepalive** (libpq ``keepalives=1 keepalives_idle=1 keepalives_interval=1
  keepalives_count=2 tcp_user_timeout=<ms>``; its server session with the server's own
  ``tcp_keepalives_idle=1``, ``tcp_keepalives_interval=1``, ``tcp_keepalives_count=2`` and
  ``tcp_user_timeout=<ms>``, given as ``options='-c ...'`` and read back by the session).
  ``tcp_user_timeout`` bounds how long data sent may stay unacknowledged: past it, the
  kernel ends the connection and the worker's statement fails, "could not receive data from
  server: Connection timed out" (measured: a little past the timeout, the kernel's
  retransmission timer deciding the exact moment).  The server's session is idle (it has
  sent everything and waits to read), so *its* keepalives do probe; unanswered, the kernel
  ends the connection, the server logs "could not receive data from client: Connection
  timed out", ends the session and rolls its transaction back: the row is free.
* **keepalive only** (the same keepalives on both sides, no ``tcp_user_timeout``).  The
  trap: a TCP keepalive probe is sent only while the connection is idle, with nothing
  unacknowledged and nothing waiting to be sent.  A worker waiting for the answer to a
  statement it has sent is not idle, so its keepalives never fire: measured, still waiting
  at the cap, like the worker without keepalive.  The server's side *is* idle: its
  keepalives end the session after the idle time and the probes, and free the row, while
  the worker still believes it holds the job.

The server's clocks count from the last packet it received, which came before the cut, so
its side may end sooner after the cut than the worker's own timeout.  In either keepalive
variant, then, the job can be claimable again before its first worker knows it lost it; that
worker's later statements fail (the session is gone), which is why a worker that did
something outside the database for a job must check that its claim still holds (a lease, a
fencing token) before it reports the job done.  The server's
``client_connection_check_interval`` does not help here: it checks only while a query runs,
and it notices only a connection the kernel already knows is closed.

PostgreSQL's ``tcp_keepalives_*`` and ``tcp_user_timeout`` settings apply to TCP connections
only; over a Unix socket there is no network to go silent, and they read back as 0.

**Nothing is left behind.**  The child asks the kernel for SIGTERM when the lab's process
dies (``PR_SET_PDEATHSIG``); on SIGTERM, or when the lab stops it, it closes the pair (an
immediate shutdown: the server's processes quit at once; its folder deleted) and exits.  The
postmaster has its own death signal tied to the child, so even a child killed outright takes
the server with it.  The namespace ends with its last process.  The lab's ``finally`` stops
the child on any way out, Ctrl-C included.

:func:`available` says whether this machine lets labkit make such a namespace, and why not;
``labkit trace half-open`` prints the result (:func:`trace_command`).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json as jsonlib
import os
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from ..core.errors import LabkitError, ServerError
from ..core.limits import number
from ..core.procs import signals_deferred
from ..core.queries import query
from ..core.replica import ReplicaPair
from ..core.results import Result, not_json
from ..core.text import table as text_table

VARIANTS = ("without_keepalive", "with_keepalive", "keepalive_only")
LABELS = {"without_keepalive": "without keepalive", "with_keepalive": "with keepalive",
          "keepalive_only": "keepalive only"}
KEEPALIVE_IDLE_S = 1          # both sides: first probe after 1 s of idle connection
KEEPALIVE_INTERVAL_S = 1      # then one probe a second
KEEPALIVE_COUNT = 2           # and the connection ends after 2 unanswered probes
CAP_S = 6.0
USER_TIMEOUT_MS = 2000
MIN_CAP_S = 4.0               # the server's keepalive-only side needs idle + count x interval (3 s)
MAX_CAP_S = 30.0
CAP_MARGIN_S = 1.5            # the kernel's timer fires a little past tcp_user_timeout
SAMPLE_S = 0.05               # how often the lab looks at the server while the network is silent
SETTLE_S = 0.2                # before the cut: the kernel's delayed acknowledgements go out
START_S = 90                  # the child's server up (initdb and start)
STEP_S = 30                   # any other step of the child
STOP_S = 30                   # the child's clean stop, before it is killed
AVAILABLE_S = 30

CLONE_NEWUSER = 0x10000000    # linux/sched.h
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS = 0x8913         # linux/sockios.h
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1                  # linux/if.h
IFREQ = "16sh22x"             # struct ifreq: the name, then the flags in a 24-byte union
PR_SET_PDEATHSIG = 1          # linux/prctl.h

NAMESPACE_FIX = ("run the lab on Linux with unprivileged user namespaces enabled (sudo sysctl "
                 "kernel.unprivileged_userns_clone=1; on Ubuntu 23.10 and later also sudo sysctl "
                 "kernel.apparmor_restrict_unprivileged_userns=0; user.max_user_namespaces above 0), "
                 "or run it as root.")

# The child is started as `python -I -c _BOOT SPEC`: the parent's sys.path, then the child's
# entry point.  Nothing else runs before it (no thread: a new user namespace needs a process
# with one thread).
_BOOT = ("import json, sys; spec = json.loads(sys.argv[1]); sys.path[:0] = spec['path']; "
         "from labkit.labs.halfopen import _child_main; _child_main(spec)")


def _sql(name: str) -> str:
    return query("halfopen.sql", name).sql


def _import_path() -> list[str]:
    """Where this process imports from, for the child (started with -I, which ignores the
    environment's PYTHONPATH and the current folder): the same folders, "" as the folder it
    stands for here."""
    return [p or os.getcwd() for p in sys.path if isinstance(p, str)]


# -- the namespace (run in the child) -----------------------------------------------------------


class _NoNamespace(Exception):
    """This machine would not give the child a network namespace of its own."""


def _sysctl(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _why_refused(step: str, err: int) -> str:
    """Why ``step`` failed with ``err``, naming the kernel setting that forbids it where one does."""
    text = f"{step} failed: {os.strerror(err)}"
    if os.geteuid() == 0:
        return (f"This machine does not let labkit make a network namespace of its own ({text}), "
                "even as root: a container without CAP_SYS_ADMIN is the usual cause.")
    causes = []
    if _sysctl("/proc/sys/kernel/unprivileged_userns_clone") == "0":
        causes.append("kernel.unprivileged_userns_clone is 0")
    if _sysctl("/proc/sys/user/max_user_namespaces") == "0":
        causes.append("user.max_user_namespaces is 0")
    if _sysctl("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1":
        causes.append("kernel.apparmor_restrict_unprivileged_userns is 1: AppArmor takes the new "
                      "namespace's rights away")
    return (f"This machine does not let an unprivileged user make a network namespace "
            f"({'; '.join([text, *causes])}). The half-open lab needs one to make packets vanish.")


def _write_proc(path: str, text: str, step: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as exc:
        raise _NoNamespace(_why_refused(step, exc.errno or errno.EPERM)) from None


def _set_loopback(up: bool) -> None:
    """The namespace's loopback interface up or down (SIOCSIFFLAGS, as ``ip link set lo up``
    does).  Down, every packet sent to or from its addresses is discarded where it is sent,
    silently; the sockets that use them stay as they were."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        got = fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack(IFREQ, b"lo", 0))
        flags = struct.unpack(IFREQ, got)[1]
        flags = flags | IFF_UP if up else flags & ~IFF_UP
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack(IFREQ, b"lo", flags))


def _enter_namespace() -> None:
    """This process into a new network namespace, with its loopback up.

    As root, a network namespace alone (root may).  Otherwise a user namespace first, in
    which this process holds every capability (so it may make the network namespace and set
    its interfaces), with its own user and group mapped to themselves: files it makes are
    still its own, and the server it starts does not run as root.  ``setgroups`` is denied
    first, as the kernel requires before an unprivileged process writes its group map."""
    if not sys.platform.startswith("linux"):
        raise _NoNamespace(f"The half-open lab needs Linux network namespaces; this machine runs "
                           f"{sys.platform}.")
    uid, gid = os.geteuid(), os.getegid()
    flags = CLONE_NEWNET if uid == 0 else CLONE_NEWUSER | CLONE_NEWNET
    threads = len(os.listdir("/proc/self/task"))
    if uid != 0 and threads != 1:
        raise _NoNamespace(f"The lab's child process runs {threads} threads; a new user namespace "
                           "needs a process with one.")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(flags) != 0:
        raise _NoNamespace(_why_refused("unshare", ctypes.get_errno()))
    if uid != 0:
        _write_proc("/proc/self/setgroups", "deny", "denying setgroups")
        _write_proc("/proc/self/uid_map", f"{uid} {uid} 1", "writing the user map")
        _write_proc("/proc/self/gid_map", f"{gid} {gid} 1", "writing the group map")
    try:
        _set_loopback(True)
    except OSError as exc:
        raise _NoNamespace(_why_refused("bringing the loopback up", exc.errno or errno.EPERM)) from None


# -- the child process ----------------------------------------------------------------------------


class _Events:
    """The child's reports to the lab: one JSON line each on a pipe, written whole."""

    def __init__(self, fd: int):
        self.fd = fd
        self.lock = threading.Lock()

    def emit(self, kind: str, **data: Any) -> None:
        line = (jsonlib.dumps({"kind": kind, "t": time.monotonic(), **data}) + "\n").encode()
        with self.lock:
            while line:
                line = line[os.write(self.fd, line):]


def _tie_to_parent(parent: int) -> None:
    """SIGTERM when the lab's process dies, however it dies (Linux); at once if it already has."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(70)


def _on_term(signum, frame) -> None:
    # Once: a second SIGTERM must not cut the clean-up the first one started.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(128 + signum)


def _child_main(spec: dict) -> None:
    """The child's life: into the namespace, the server and the workers, the lab's commands,
    and out, the server closed, whatever ends it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # Ctrl-C is the lab's to handle
    _tie_to_parent(spec["parent"])
    code = 0
    try:
        if spec.get("probe"):
            code = _probe()
            return
        signal.signal(signal.SIGTERM, _on_term)
        events = _Events(spec["events_fd"])
        try:
            _enter_namespace()
        except _NoNamespace as exc:
            events.emit("refused", why=str(exc))
            return
        try:
            _serve(spec, events)
        except Exception as exc:
            events.emit("failed", error=f"{type(exc).__name__}: {exc}")
            raise
    except SystemExit:
        pass                           # SIGTERM: the lab stops us (the pair is closed by now)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = code or 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)                 # the workers' threads may still wait on the silent network


def _probe() -> int:
    """:func:`available`'s question, asked in a child: a namespace, its loopback up."""
    try:
        _enter_namespace()
    except _NoNamespace as exc:
        print(jsonlib.dumps({"ok": False, "why": str(exc)}))
        return 0
    print(jsonlib.dumps({"ok": True, "why": "a network namespace of its own, its loopback up"}))
    return 0


def _int_sysctl(path: str) -> int:
    value = _sysctl(path)
    return int(value) if value is not None and value.isdigit() else -1


def _let_tcp_in(pair: ReplicaPair) -> None:
    """The pair's server takes TCP from 127.0.0.1 too: one line added to its pg_hba.conf and
    the configuration read again (waited for: a new session sees a newer load time)."""
    node = pair.primary
    assert node is not None
    with node.connect(name="labkit:halfopen-setup") as conn:
        before = conn.execute(_sql("conf_loaded")).fetchone()
    with open(node.hba_file, "a") as f:
        f.write("# labkit halfopen: the lab's own network namespace, nothing else in it\n"
                "host all all 127.0.0.1/32 trust\n")
    node.one(_sql("reload"))
    deadline = time.monotonic() + STEP_S
    while node.one(_sql("conf_loaded")) == (before[0] if before else None):
        if time.monotonic() > deadline:
            raise ServerError("The lab's server did not read its pg_hba.conf again.",
                              "the machine may be overloaded: run the trace again.")
        time.sleep(0.02)


def _make_jobs(pair: ReplicaPair) -> int:
    """The job table, one job per worker; the server's version number."""
    node = pair.primary
    assert node is not None
    with node.connect(name="labkit:halfopen-setup") as conn:
        for statement in query("halfopen.sql", "jobs").statements:
            conn.execute(statement, {"jobs": len(VARIANTS)} if "%(" in statement else None)
        return conn.info.server_version


def _serve(spec: dict, events: _Events) -> None:
    """In the namespace: the server, the jobs, the workers; then the lab's commands until it
    says no more (its pipe closed) or stops us (SIGTERM).  Leaving closes the server."""
    with ReplicaPair(standby=False, settings={"listen_addresses": "127.0.0.1"}) as pair:
        assert pair.primary is not None and pair.folder is not None
        _let_tcp_in(pair)
        version = _make_jobs(pair)
        events.emit("ready", conninfo=pair.primary.conninfo(), folder=str(pair.folder),
                    netns=os.readlink("/proc/self/ns/net"), server_version_num=version,
                    keepalive_time_s=_int_sysctl("/proc/sys/net/ipv4/tcp_keepalive_time"),
                    tcp_retries2=_int_sysctl("/proc/sys/net/ipv4/tcp_retries2"))
        go = threading.Event()
        for variant in VARIANTS:
            threading.Thread(target=_worker, name=f"halfopen-{variant}", daemon=True,
                             args=(variant, pair.primary.port_number, spec["user_timeout_ms"],
                                   go, events)).start()
        for line in sys.stdin:
            command, _, arg = line.strip().partition(" ")
            if command == "cut":
                time.sleep(SETTLE_S)
                _set_loopback(False)
                events.emit("cut")
                go.set()
            elif command == "log":
                events.emit("log", said=_server_words(pair.primary.log_file, jsonlib.loads(arg)))
        # The lab's pipe closed (it stopped, or died: its death signal comes too): from here
        # on the pair closes, and a SIGTERM must not cut that short.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _connection_options(variant: str, user_timeout_ms: int) -> dict[str, Any]:
    """libpq's options for a worker of ``variant``: its own side (keepalives*,
    tcp_user_timeout) and, in ``options``, its server session's side (the server's
    tcp_keepalives_* and tcp_user_timeout, for this session)."""
    if variant == "without_keepalive":
        return {"keepalives": 0}
    client: dict[str, Any] = {"keepalives": 1, "keepalives_idle": KEEPALIVE_IDLE_S,
                              "keepalives_interval": KEEPALIVE_INTERVAL_S,
                              "keepalives_count": KEEPALIVE_COUNT}
    server: dict[str, Any] = {"tcp_keepalives_idle": KEEPALIVE_IDLE_S,
                              "tcp_keepalives_interval": KEEPALIVE_INTERVAL_S,
                              "tcp_keepalives_count": KEEPALIVE_COUNT}
    if variant == "with_keepalive":
        client["tcp_user_timeout"] = server["tcp_user_timeout"] = user_timeout_ms
    client["options"] = " ".join(f"-c {k}={v}" for k, v in server.items())
    return client


def _client_error(exc: BaseException) -> str:
    """The first line of the client's error, without psycopg's own "<step> failed: " in
    front of libpq's words (its wording of the step may change; libpq's does not)."""
    lines = str(exc).strip().splitlines()
    return re.sub(r"^[a-z ]+ failed: ", "", lines[0]) if lines else type(exc).__name__


def _worker(variant: str, port: int, user_timeout_ms: int, go: threading.Event, events: _Events) -> None:
    """One worker (a thread of the child): connect over TCP, claim a job, report; at the
    lab's word (after the cut), send the next statement and report how it ended."""
    try:
        conn = psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres",
                               autocommit=True, connect_timeout=10,
                               application_name=f"labkit:halfopen-{variant}",
                               **_connection_options(variant, user_timeout_ms))
        conn.execute("BEGIN")
        claimed = conn.execute(_sql("claim")).fetchone()
        settings = conn.execute(_sql("keepalive_settings")).fetchone()
        if claimed is None or settings is None:
            raise LabkitError(f"The {LABELS[variant]} worker found no job to claim.",
                              "run the trace again: each run makes its own jobs.")
        events.emit("claimed", variant=variant, job=claimed[0], pid=conn.info.backend_pid,
                    settings=list(settings))
    except Exception as exc:
        events.emit("failed", error=f"the {LABELS[variant]} worker: {type(exc).__name__}: {exc}")
        return
    go.wait()
    events.emit("sent", variant=variant)
    try:
        conn.execute(_sql("finish"), {"id": claimed[0]})
    except psycopg.Error as exc:
        events.emit("ended", variant=variant, error=_client_error(exc))
        return
    events.emit("ended", variant=variant, error="")


def _server_words(log_file: Path, pids: list[int]) -> dict[str, list[str]]:
    """What the server's log says of each of these backends (its messages, without the time
    and the pid in front)."""
    try:
        text = log_file.read_text(errors="replace")
    except OSError:
        return {}
    said: dict[str, list[str]] = {}
    for pid in pids:
        pattern = re.compile(rf"\[{pid}\] (?:LOG|FATAL|ERROR|WARNING):\s+(.*)$")
        said[str(pid)] = [m.group(1).strip() for m in map(pattern.search, text.splitlines()) if m]
    return said


# -- the lab's side --------------------------------------------------------------------------------


class _Child:
    """The child process, seen from the lab: its events, its commands, its stop."""

    def __init__(self, *, user_timeout_ms: int):
        self.user_timeout_ms = user_timeout_ms
        self.proc: subprocess.Popen | None = None
        self.events: list[dict] = []
        self._fd: int | None = None
        self._buffer = b""
        self._log = tempfile.TemporaryFile()
        self.ready: dict = {}

    def start(self) -> None:
        read_fd, write_fd = os.pipe()
        self._fd = read_fd
        spec = {"path": _import_path(), "parent": os.getpid(),
                "events_fd": write_fd, "user_timeout_ms": self.user_timeout_ms}
        try:
            with signals_deferred():      # no Ctrl-C between the start and knowing the pid
                self.proc = subprocess.Popen(
                    [sys.executable, "-I", "-c", _BOOT, jsonlib.dumps(spec)],
                    stdin=subprocess.PIPE, stdout=self._log, stderr=self._log,
                    pass_fds=(write_fd,), start_new_session=True, text=True)
        finally:
            os.close(write_fd)

    def _tail(self, lines: int = 12) -> str:
        self._log.seek(0)
        return "\n".join(self._log.read().decode(errors="replace").splitlines()[-lines:])

    def poll(self, timeout: float = 0.0) -> list[dict]:
        """The events the child has sent, waiting up to ``timeout`` for the first."""
        before = len(self.events)
        while self._fd is not None and select.select([self._fd], [], [], timeout)[0]:
            chunk = os.read(self._fd, 65536)
            if not chunk:
                os.close(self._fd)
                self._fd = None
                break
            self._buffer += chunk
            *lines, self._buffer = self._buffer.split(b"\n")
            self.events += [jsonlib.loads(line) for line in lines if line]
            timeout = 0.0
        new = self.events[before:]
        for ev in new:
            self._raise_on(ev)
        return new

    def _raise_on(self, ev: dict) -> None:
        if ev["kind"] == "refused":
            raise LabkitError(ev["why"], NAMESPACE_FIX)
        if ev["kind"] == "failed":
            raise ServerError(f"The half-open lab's child process failed: {ev['error']}\n{self._tail()}",
                              "read the error above; run the trace again.")

    def wait_for(self, kind: str, *, count: int = 1, timeout: float = STEP_S) -> list[dict]:
        """The first ``count`` events of ``kind``, waiting up to ``timeout`` for them."""
        deadline = time.monotonic() + timeout
        while True:
            found = [ev for ev in self.events if ev["kind"] == kind]
            if len(found) >= count:
                return found[:count]
            if self._fd is None:
                raise ServerError(f"The half-open lab's child process ended before it reported "
                                  f"{kind!r}. What it said:\n{self._tail()}",
                                  "read the error above; run the trace again.")
            if time.monotonic() > deadline:
                raise ServerError(f"The half-open lab's child process did not report {kind!r} "
                                  f"within {timeout:.0f} s.",
                                  "the machine may be overloaded: run the trace again.")
            self.poll(0.05)

    def send(self, command: str) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        """End the child: SIGTERM (it closes its server and exits), SIGKILL if it has not
        within STOP_S; then, if it was killed, the folder its server leaves."""
        proc = self.proc
        with signals_deferred():
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(STOP_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
                    self._sweep()
            if proc is not None and proc.stdin is not None:
                try:
                    proc.stdin.close()
                except OSError:
                    pass
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            self._log.close()

    def _sweep(self) -> None:
        """After a child killed outright: wait until its namespace's processes (the server's,
        which its death signal ends) are gone, then delete the server's folder."""
        netns, folder = self.ready.get("netns"), self.ready.get("folder")
        deadline = time.monotonic() + STOP_S
        while netns and namespace_pids(netns) and time.monotonic() < deadline:
            time.sleep(0.05)
        if folder:
            shutil.rmtree(folder, ignore_errors=True)


def namespace_pids(netns: str) -> list[int]:
    """The processes in network namespace ``netns`` (as ``/proc/<pid>/ns/net`` names it, such
    as ``net:[4026532281]``) that this user may see."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.readlink(f"/proc/{name}/ns/net") == netns:
                    found.append(int(name))
            except OSError:
                pass
    return found


def available() -> tuple[bool, str]:
    """Whether this machine lets labkit make a network namespace of its own (asked of a
    short-lived child process, which tries), and what it found."""
    if not sys.platform.startswith("linux"):
        return False, f"The half-open lab needs Linux network namespaces; this machine runs {sys.platform}."
    spec = {"path": _import_path(), "parent": os.getpid(), "probe": True}
    try:
        done = subprocess.run([sys.executable, "-I", "-c", _BOOT, jsonlib.dumps(spec)],
                              capture_output=True, text=True, timeout=AVAILABLE_S)
    except subprocess.TimeoutExpired:
        return False, f"The namespace check did not answer within {AVAILABLE_S} s."
    lines = done.stdout.strip().splitlines()
    try:
        answer = jsonlib.loads(lines[-1])
    except (IndexError, ValueError):
        return False, f"The namespace check failed: {(done.stderr.strip().splitlines() or ['no output'])[-1]}"
    return bool(answer["ok"]), str(answer["why"])


# -- watching the server while the network is silent -----------------------------------------------


@dataclass
class _Seen:
    """One worker of the trace, as the lab saw it (times in s: the worker's from its send,
    the server's from the cut)."""

    job: int
    pid: int
    settings: list[str]
    sent_t: float = 0.0
    ended_s: float | None = None         # its statement answered or failed, this long after sending
    error: str = ""
    row_free_s: float | None = None      # the first look that found its job claimable again
    session_gone_s: float | None = None  # the first look that found its session gone
    state_at_cap: str | None = None      # its session's state at the cap (None: gone)
    locked_at_cap: bool = True
    said: list[str] = field(default_factory=list)


def _look(watch: psycopg.Connection, seen: dict[str, _Seen]) -> tuple[dict[int, str], set[int]]:
    """The workers' sessions (pid -> state) and the jobs another worker's claim would get now."""
    pids = [s.pid for s in seen.values()]
    states = {pid: state for pid, state in watch.execute(_sql("sessions"), {"pids": pids}).fetchall()}
    with watch.transaction(force_rollback=True):
        free = {row[0] for row in watch.execute(_sql("free_jobs"),
                                                {"ids": [s.job for s in seen.values()]}).fetchall()}
    return states, free


def _note_ends(events: list[dict], seen: dict[str, _Seen]) -> None:
    for ev in events:
        if ev["kind"] == "sent":
            seen[ev["variant"]].sent_t = ev["t"]
        elif ev["kind"] == "ended":
            s = seen[ev["variant"]]
            s.ended_s, s.error = ev["t"] - s.sent_t, ev["error"]


def _all_held(states: dict[int, str], free: set[int], seen: dict[str, _Seen]) -> bool:
    """Every worker's session idle in transaction, and no job of theirs claimable."""
    return not free and all(states.get(s.pid) == "idle in transaction" for s in seen.values())


def _note_look(states: dict[int, str], free: set[int], seen: dict[str, _Seen], at: float) -> None:
    """The first look that found a job claimable again, a session gone: ``at`` s after the cut."""
    for s in seen.values():
        if s.row_free_s is None and s.job in free:
            s.row_free_s = at
        if s.session_gone_s is None and s.pid not in states:
            s.session_gone_s = at


def _watch(child: _Child, watch: psycopg.Connection, seen: dict[str, _Seen], cap_s: float) -> bool:
    """Cut the network, then look at the server every SAMPLE_S until each worker's statement
    has waited ``cap_s``: when its job became claimable again, when its session ended, and,
    at the cap, its session's state and its row.  True if the first look after the cut found
    every session idle in transaction and every job locked."""
    states, free = _look(watch, seen)
    if not _all_held(states, free, seen):
        raise ServerError(f"Before the cut, the workers' sessions are not all idle in transaction "
                          f"holding their jobs (sessions {states}, jobs free {sorted(free)}).",
                          "run the trace again.")
    child.send("cut")
    cut_t = child.wait_for("cut")[0]["t"]
    _note_ends(child.wait_for("sent", count=len(seen)), seen)
    _note_ends([ev for ev in child.events if ev["kind"] == "ended"], seen)
    end = max(s.sent_t for s in seen.values()) + cap_s
    first_look: bool | None = None
    while True:
        last = time.monotonic() >= end
        states, free = _look(watch, seen)
        _note_look(states, free, seen, time.monotonic() - cut_t)
        if first_look is None:
            first_look = _all_held(states, free, seen)
        if last:
            break
        _note_ends([ev for ev in child.poll(max(0.0, min(SAMPLE_S, end - time.monotonic())))
                    if ev["kind"] == "ended"], seen)
    _note_cap(states, free, seen, cap_s)
    return bool(first_look)


def _note_cap(states: dict[int, str], free: set[int], seen: dict[str, _Seen], cap_s: float) -> None:
    """The last look, at the cap: each session's state and row.  What happened only at or
    after the cap counts as not happened by it (the lab had given up)."""
    for s in seen.values():
        s.state_at_cap, s.locked_at_cap = states.get(s.pid), s.job not in free
        if s.ended_s is not None and s.ended_s >= cap_s:
            s.ended_s, s.error = None, ""
        if s.row_free_s is not None and s.row_free_s >= cap_s:
            s.row_free_s = None
        if s.session_gone_s is not None and s.session_gone_s >= cap_s:
            s.session_gone_s = None


# -- the result ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HalfOpenRun(Result):
    """One half-open trace: three workers, each with one claimed job, cut off from the server
    at one moment (see the module's text).  Times in seconds; a worker's from the moment it
    sent its statement, the server's from the cut.  Variants: *without keepalive*, *with
    keepalive* (keepalives and tcp_user_timeout on both sides), *keepalive only*.

    * ``cap_s`` -- how long the lab waited for a worker's statement before it gave up.
    * ``tcp_user_timeout_ms`` -- the with-keepalive variant's tcp_user_timeout, both sides.
    * ``keepalive_idle_s``, ``keepalive_interval_s``, ``keepalive_count`` -- the keepalives of
      both keepalive variants, both sides.
    * ``hung_s_without_keepalive`` -- how long the worker without keepalive waited: ``cap_s``
      when it was still waiting when the lab gave up (``still_hanging_at_cap``).
    * ``detected_s_with_keepalive`` -- how long until the worker with keepalive got its error
      (``cap_s`` if it got none); ``error_with_keepalive`` -- that error's first line, libpq's
      words ("" if none).
    * ``hung_s_keepalive_only``, ``still_hanging_at_cap_keepalive_only`` -- the same for the
      worker with keepalives and no tcp_user_timeout.
    * ``row_locked_while_silent`` -- the job of the worker without keepalive stayed locked on
      the server at every look from the cut to the cap, its session "idle in transaction" at
      the cap: the server still held the row for a worker it could no longer hear.
    * ``row_locked_s_without_keepalive``, ``row_locked_s_with_keepalive``,
      ``row_locked_s_keepalive_only`` -- from the cut to the first look (every 50 ms) that
      found the job claimable again; ``cap_s`` if it was still locked at the cap.
    * ``server_said_with_keepalive``, ``server_said_keepalive_only`` -- what the server's log
      says of that worker's session ending ("" if nothing).
    * ``server_settings`` -- each variant's session's own tcp_keepalives_idle,
      tcp_keepalives_interval, tcp_keepalives_count and tcp_user_timeout, as the server read
      them back over the TCP connection (0 for the first three means the kernel's value,
      which the server then shows).
    * ``kernel_keepalive_time_s``, ``kernel_tcp_retries2`` -- the namespace's
      net.ipv4.tcp_keepalive_time and tcp_retries2: the kernel's defaults behind the variant
      without keepalive.
    * ``server_version_num`` -- the lab server's version.
    * ``rows`` -- what happened and what was seen, one line each, no timings (comparable as is).
    * ``child_pid``, ``netns``, ``pair_folder`` (not in the JSON) -- the run's child process,
      its network namespace (``net:[inode]``) and its server's folder: the clean-up checks'.
    """

    cap_s: float
    tcp_user_timeout_ms: int
    keepalive_idle_s: int
    keepalive_interval_s: int
    keepalive_count: int
    hung_s_without_keepalive: float
    still_hanging_at_cap: bool
    detected_s_with_keepalive: float
    error_with_keepalive: str
    hung_s_keepalive_only: float
    still_hanging_at_cap_keepalive_only: bool
    row_locked_while_silent: bool
    row_locked_s_without_keepalive: float
    row_locked_s_with_keepalive: float
    row_locked_s_keepalive_only: float
    server_said_with_keepalive: str
    server_said_keepalive_only: str
    server_settings: dict[str, list[str]]
    kernel_keepalive_time_s: int
    kernel_tcp_retries2: int
    server_version_num: int
    rows: list[tuple[str, str]]
    child_pid: int = not_json(default=0)
    netns: str = not_json(default="")
    pair_folder: str = not_json(default="")


def _worker_saw(s: _Seen) -> str:
    if s.ended_s is None:
        return "no answer and no error: still waiting at the cap"
    return f"error: {s.error}" if s.error else "answered"


def _server_saw(s: _Seen) -> str:
    if s.session_gone_s is None:
        session = f"its session {s.state_at_cap or 'ended'} at the cap"
    else:
        session = "its session ended" + (f" ({s.said[0]})" if s.said else "")
    row = "its job's row still locked" if s.row_free_s is None else "its job claimable again"
    return f"{session}, {row}"


def _rows(seen: dict[str, _Seen], first_look: bool) -> list[tuple[str, str]]:
    """The human table: what happened, what was seen; nothing in it is a time."""
    rows = [("each worker claims a job over TCP; then the network goes silent (no FIN, no RST)",
             "each session idle in transaction, each job's row locked" if first_look
             else "not every session idle in transaction holding its job")]
    what = {"without_keepalive": ("worker without keepalive sends its UPDATE",
                                  "the server, that session (server defaults)"),
            "with_keepalive": ("worker with keepalives and tcp_user_timeout sends its UPDATE",
                               "the server, that session (tcp_keepalives_* and tcp_user_timeout)"),
            "keepalive_only": ("worker with keepalives only sends its UPDATE",
                               "the server, that session (tcp_keepalives_* only)")}
    for variant in VARIANTS:
        worker, server = what[variant]
        rows += [(worker, _worker_saw(seen[variant])), (server, _server_saw(seen[variant]))]
    return rows


def _result(cap_s: float, user_timeout_ms: int, child: _Child, seen: dict[str, _Seen],
            first_look: bool) -> HalfOpenRun:
    def waited(v: str) -> float:
        ended = seen[v].ended_s
        return round(ended, 3) if ended is not None else cap_s

    def locked(v: str) -> float:
        free = seen[v].row_free_s
        return round(free, 3) if free is not None else cap_s

    plain = seen["without_keepalive"]
    ready = child.ready
    return HalfOpenRun(
        cap_s=cap_s, tcp_user_timeout_ms=user_timeout_ms, keepalive_idle_s=KEEPALIVE_IDLE_S,
        keepalive_interval_s=KEEPALIVE_INTERVAL_S, keepalive_count=KEEPALIVE_COUNT,
        hung_s_without_keepalive=waited("without_keepalive"), still_hanging_at_cap=plain.ended_s is None,
        detected_s_with_keepalive=waited("with_keepalive"), error_with_keepalive=seen["with_keepalive"].error,
        hung_s_keepalive_only=waited("keepalive_only"),
        still_hanging_at_cap_keepalive_only=seen["keepalive_only"].ended_s is None,
        row_locked_while_silent=(first_look and plain.row_free_s is None and plain.locked_at_cap
                                 and plain.state_at_cap == "idle in transaction"),
        row_locked_s_without_keepalive=locked("without_keepalive"),
        row_locked_s_with_keepalive=locked("with_keepalive"),
        row_locked_s_keepalive_only=locked("keepalive_only"),
        server_said_with_keepalive="; ".join(seen["with_keepalive"].said),
        server_said_keepalive_only="; ".join(seen["keepalive_only"].said),
        server_settings={v: [str(x) for x in seen[v].settings] for v in VARIANTS},
        kernel_keepalive_time_s=int(ready.get("keepalive_time_s", -1)),
        kernel_tcp_retries2=int(ready.get("tcp_retries2", -1)),
        server_version_num=int(ready.get("server_version_num", 0)),
        rows=_rows(seen, first_look),
        child_pid=child.proc.pid if child.proc is not None else 0,
        netns=str(ready.get("netns", "")), pair_folder=str(ready.get("folder", "")))


def check_params(*, cap_s: float, tcp_user_timeout_ms: int) -> None:
    """A LabkitError naming the fix for parameters the trace cannot run with."""
    number("tcp_user_timeout_ms", tcp_user_timeout_ms, low=100, high=10_000, whole=True, unit=" ms",
           example=USER_TIMEOUT_MS)
    number("cap_s", cap_s, low=MIN_CAP_S, high=MAX_CAP_S, unit=" s", example=CAP_S)
    if cap_s < tcp_user_timeout_ms / 1000 + CAP_MARGIN_S:
        raise LabkitError(f"cap_s={cap_s:g} leaves the worker with tcp_user_timeout="
                          f"{tcp_user_timeout_ms} ms no time to notice before the lab gives up.",
                          f"pass cap_s of at least {tcp_user_timeout_ms / 1000 + CAP_MARGIN_S:g} "
                          f"(tcp_user_timeout plus {CAP_MARGIN_S:g} s).")


def half_open_trace(*, cap_s: float = CAP_S, tcp_user_timeout_ms: int = USER_TIMEOUT_MS) -> HalfOpenRun:
    """Three workers claim a job each from a throw-away server over TCP in a network
    namespace of the lab's own; the network goes silent (loopback down); the lab watches,
    for ``cap_s`` after each worker sent its next statement, what each worker and the
    server do.  See the module's text; a :class:`HalfOpenRun`.  Takes ``cap_s`` plus a few
    seconds (the server's start).  A LabkitError where this machine gives no namespace."""
    check_params(cap_s=cap_s, tcp_user_timeout_ms=tcp_user_timeout_ms)
    cap_s = float(cap_s)
    if not sys.platform.startswith("linux"):
        raise LabkitError(f"The half-open lab needs Linux network namespaces; this machine runs "
                          f"{sys.platform}.", NAMESPACE_FIX)
    child = _Child(user_timeout_ms=tcp_user_timeout_ms)
    try:
        child.start()
        child.ready = child.wait_for("ready", timeout=START_S)[0]
        seen = {ev["variant"]: _Seen(job=ev["job"], pid=ev["pid"], settings=ev["settings"])
                for ev in child.wait_for("claimed", count=len(VARIANTS))}
        with psycopg.connect(child.ready["conninfo"], autocommit=True, connect_timeout=10,
                             application_name="labkit:halfopen-watch") as watch:
            first_look = _watch(child, watch, seen, cap_s)
        pids = [s.pid for s in seen.values()]
        child.send("log " + jsonlib.dumps(pids))
        said = child.wait_for("log")[0]["said"]
        for s in seen.values():
            s.said = said.get(str(s.pid), [])
    finally:
        child.stop()
    return _result(cap_s, tcp_user_timeout_ms, child, seen, first_look)


# -- command line ---------------------------------------------------------------------------------------


def report(r: HalfOpenRun) -> str:
    """The result as a few lines of text."""
    def waited(hung: float, still: bool, error: str = "") -> str:
        if still:
            return f"still waiting at {hung:.2f} s"
        return f"{'error' if error else 'ended'} after {hung:.2f} s"

    def locked(s: float) -> str:
        return f"still locked at {s:.2f} s" if s >= r.cap_s else f"free after {s:.2f} s"

    lines = [f"Half-open connection: the network goes silent under three workers (cap {r.cap_s:g} s; "
             f"keepalives {r.keepalive_idle_s} s idle, {r.keepalive_interval_s} s apart, "
             f"{r.keepalive_count} probes; tcp_user_timeout {r.tcp_user_timeout_ms} ms)",
             text_table(["worker", "its statement", "its job's row"], [
                 ["without keepalive", waited(r.hung_s_without_keepalive, r.still_hanging_at_cap),
                  locked(r.row_locked_s_without_keepalive)],
                 ["with keepalive", waited(r.detected_s_with_keepalive, r.detected_s_with_keepalive >= r.cap_s,
                                           r.error_with_keepalive),
                  locked(r.row_locked_s_with_keepalive)],
                 ["keepalive only", waited(r.hung_s_keepalive_only, r.still_hanging_at_cap_keepalive_only),
                  locked(r.row_locked_s_keepalive_only)]]),
             "",
             text_table(["what happened", "what was seen"], [list(row) for row in r.rows]),
             "",
             f"The kernel's defaults behind the worker without keepalive: tcp_keepalive_time "
             f"{r.kernel_keepalive_time_s} s, tcp_retries2 {r.kernel_tcp_retries2}."]
    return "\n".join(lines)


def trace_command(*, cap_s: float = CAP_S, tcp_user_timeout_ms: int = USER_TIMEOUT_MS, json: bool = False) -> int:
    """``labkit trace half-open [--cap-s 6] [--tcp-user-timeout-ms 2000] [--json]``:
    :func:`half_open_trace`, as text or JSON."""
    r = half_open_trace(cap_s=cap_s, tcp_user_timeout_ms=tcp_user_timeout_ms)
    print(r.to_json() if json else report(r))
    return 0
