"""Signals, provoked for real on real processes.

* SIGTERM or SIGHUP to a running ``labkit torture`` or ``labkit trace relay`` takes the
  Ctrl-C clean-up path: it exits 128 + the signal and leaves no worker process (a frozen
  one included), no session, no transaction, no lock and no lab schema of the run.
* Ctrl-C while the workers are still starting leaves nothing behind either.
* A worker whose parent is killed outright (SIGKILL: no clean-up at all) exits by itself
  within seconds -- started from the main thread or another one, running or frozen --
  and its sessions go with it.
* Two ``labkit trace relay`` runs at once each get their own schema and both come out right.
"""

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from conftest import child_processes
from test_cleanup import _left_on_server

from labkit.core.lab import Lab, schema_name

LABKIT = [sys.executable, "-m", "labkit"]


def _schema_exists(db, schema: str) -> bool:
    with db.connect() as conn:
        return conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone() is not None


def _start(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(LABKIT + argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=os.environ.copy())


def _stopped(p: psutil.Process) -> bool:
    try:
        return p.status() == psutil.STATUS_STOPPED
    except psutil.NoSuchProcess:
        return False


def _wait_for_workers(ps: psutil.Process, timeout: float = 40, stopped: bool = False) -> list:
    """The command's worker processes once there are some (with ``stopped``: once one of
    them has stayed frozen by SIGSTOP for a while -- a stall, not a blink)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        kids = child_processes(ps)
        if kids and not stopped:
            return kids
        frozen = [k for k in kids if _stopped(k)]
        if frozen:
            time.sleep(0.1)
            if any(_stopped(k) for k in frozen):
                return kids
        time.sleep(0.005)
    return []


def _alive(procs: list) -> list:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def _nothing_left(db, proc, kids, schema, signum, err) -> None:
    assert proc.returncode == 128 + signum, err
    assert "Traceback" not in err and signal.Signals(signum).name in err, err
    assert _alive(kids) == []
    assert _left_on_server(db, schema) == {"open_transactions": 0, "locks": 0, "sessions": 0}
    assert not _schema_exists(db, schema)


def _tidy(db, proc, lab_name: str) -> None:
    """After a failure: what the command under test left, removed (so one failure does
    not leave processes, sessions or schemas for the next test)."""
    if proc.poll() is None:
        for k in child_processes(psutil.Process(proc.pid)):
            k.kill()
        proc.kill()
        proc.wait(10)
    Lab.open(db, lab_name, reset=False).drop()


RUNS = {
    # a drain torture freezes workers (SIGSTOP) at its "stall" kills: strike while one is frozen
    "torture": (["torture", "drain", "--kills", "400", "--seed", "2"], "torture_drain_{pid}", True),
    # a relay trace frozen with no idle timeout stays under way until the lab's watch runs out
    # (a relay that merely crashes can finish before the test strikes): strike while it is frozen
    "trace relay": (["trace", "relay", "--batch", "30", "--freeze-after", "10", "--idle-timeout", "0",
                     "--watch", "30", "--broker", "recording"], "trace_relay_{pid}", True),
}


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
@pytest.mark.parametrize("what", list(RUNS))
def test_sigterm_and_sighup_clean_up_like_ctrl_c(db, what, signum):
    argv, name, frozen = RUNS[what]
    proc = _start(argv)
    schema = schema_name(name.format(pid=proc.pid))
    try:
        ps = psutil.Process(proc.pid)
        kids = _wait_for_workers(ps, stopped=frozen)
        assert kids, f"{what} never started its workers{' (or froze one)' if frozen else ''}"
        assert _schema_exists(db, schema)          # the run's own schema, under way
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
        _nothing_left(db, proc, kids, schema, signum, err)
    finally:
        _tidy(db, proc, name.format(pid=proc.pid))


@pytest.mark.parametrize("delay", [0.0, 0.3])
def test_ctrl_c_while_workers_are_starting_leaves_nothing_behind(db, delay):
    proc = _start(["torture", "queue", "--workers", "4", "--kills", "50", "--seed", "5"])
    schema = schema_name(f"torture_queue_{proc.pid}")
    try:
        ps = psutil.Process(proc.pid)
        kids = _wait_for_workers(ps)
        assert kids
        time.sleep(delay)
        kids = child_processes(ps) or kids
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        _nothing_left(db, proc, kids, schema, signal.SIGINT, err.replace("interrupted", "SIGINT"))
    finally:
        _tidy(db, proc, f"torture_queue_{proc.pid}")


# -- the parent killed outright ----------------------------------------------------------------------

PARENT = """
import sys, threading, time
from labkit.core.procs import Worker
dsn, schema = sys.argv[1], sys.argv[2]
ws = [Worker("test_signals:hold_row_then_pause", name=f"w{i}", dsn=dsn, schema=schema, row=i + 1)
      for i in range(3)]
ws[0].start(); ws[1].start()
t = threading.Thread(target=ws[2].start)        # started from another thread
t.start(); t.join()
for w in ws:
    pid = w.wait_for("locked", timeout=60)["pid"]
    w.wait_for("paused", timeout=60)
    print(w.pid, pid, flush=True)
time.sleep(600)
"""


def hold_row_then_pause(ctx, dsn, schema, row):
    import psycopg

    conn = psycopg.connect(dsn, options=f"-c search_path={schema}",
                           application_name=f"labkit:{schema}:child")
    conn.execute("SELECT id FROM job WHERE id = %s FOR UPDATE", (row,))   # in a transaction
    ctx.emit("locked", pid=conn.info.backend_pid)
    ctx.pause("holding")


def test_workers_die_with_a_parent_killed_outright(lab, db):
    lab.create_jobs(3)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-c", PARENT, lab.db.dsn, lab.schema],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    pairs: list = []
    try:
        pairs += [tuple(map(int, proc.stdout.readline().split() or [0])) for _ in range(3)]
        assert all(len(p) == 2 for p in pairs), proc.stderr.read() if proc.poll() is not None else pairs
        workers = [psutil.Process(pid) for pid, _ in pairs]
        os.kill(workers[1].pid, signal.SIGSTOP)      # one of them frozen, as a torture run does
        proc.kill()                                  # no clean-up code runs in the parent
        proc.wait(10)
        deadline = time.monotonic() + 5
        while _alive(workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _alive(workers) == []
        # and their sessions, with the row locks they held, are gone
        backends = [b for _, b in pairs]
        deadline = time.monotonic() + 10
        while lab.execute("SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s)", (backends,)):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert len(lab.execute("SELECT id FROM job FOR UPDATE NOWAIT")) == 3
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for pair in pairs:
            try:
                if pair[0]:
                    os.kill(pair[0], signal.SIGKILL)
            except OSError:
                pass


# -- two relay traces at once --------------------------------------------------------------------------


def test_two_relay_traces_at_once_each_run_in_their_own_schema(db):
    argv = ["trace", "relay", "--batch", "40", "--crash-after", "15", "--broker", "recording", "--json"]
    procs = [_start(argv) for _ in range(2)]
    schemas = [schema_name(f"trace_relay_{p.pid}") for p in procs]
    try:
        outs = [p.communicate(timeout=120) for p in procs]
        for p, (out, err) in zip(procs, outs):
            assert p.returncode == 0, err
            summary = json.loads(out)
            assert summary["outbox_rows"] == 40
            assert summary["lost_events"] == [] and summary["duplicates"] == 15
            assert summary["consumer_applied"] == 40 and summary["orders_applied_twice"] == 0
        assert schemas[0] != schemas[1]
        assert not any(_schema_exists(db, s) for s in schemas)
    finally:
        for p in procs:
            _tidy(db, p, f"trace_relay_{p.pid}")
