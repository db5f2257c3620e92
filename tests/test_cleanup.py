"""Cleanup and isolation, provoked for real.

* An interrupted experiment (KeyboardInterrupt in this process, or SIGINT to a Python
  process running a convoy, a crash trace or a torture run) leaves no worker thread or
  process, no session, no open transaction and no lock on the server.
* Twenty lab schemas running the convoy at once on one server all finish right.
* A trainee with nothing but CREATE on the database runs a lab, a transcript, a relay
  trace, a convoy and a torture run.
"""

import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest
from conftest import child_processes, press_ctrl_c
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import labkit
from labkit import Lab
from labkit.labs import convoy
from labkit.labs import relay as rl
from labkit.tools import torture as tt

LEFT_IN_LAB = """
SELECT count(*) FILTER (WHERE a.xact_start IS NOT NULL)                  AS open_transactions,
       (SELECT count(*) FROM pg_locks l
         WHERE l.pid IN (SELECT pid FROM pg_stat_activity
                          WHERE application_name LIKE %(app)s AND pid <> pg_backend_pid())) AS locks,
       count(*)                                                            AS sessions
  FROM pg_stat_activity a
 WHERE a.application_name LIKE %(app)s AND a.pid <> pg_backend_pid()
"""


def _left_on_server(db, schema: str, *, but_admin: bool = False, timeout: float = 10) -> dict:
    app = f"labkit:{schema}%".replace("_", r"\_")
    if but_admin:
        app = f"labkit:{schema}:%".replace("_", r"\_")
    deadline = time.monotonic() + timeout
    while True:
        with db.connect() as conn:
            rows = conn.execute(LEFT_IN_LAB, {"app": app}).fetchone()
            if but_admin:
                rows = conn.execute(
                    LEFT_IN_LAB.replace("LIKE %(app)s", "LIKE %(app)s AND application_name NOT LIKE '%%:admin'"),
                    {"app": app}).fetchone()
        left = dict(zip(("open_transactions", "locks", "sessions"), rows))
        if not any(left.values()) or time.monotonic() > deadline:
            if any(left.values()):      # say who is left, for the failure message
                with db.connect() as conn:
                    left["who"] = conn.execute(
                        "SELECT application_name, state, left(query, 60) FROM pg_stat_activity "
                        "WHERE application_name LIKE %s AND pid <> pg_backend_pid()", (app,)).fetchall()
            return left


# -- KeyboardInterrupt in this process ------------------------------------------------------------


def _interrupt_once_running(lab, sent: list, settle_s: float = 1.0, timeout: float = 60) -> threading.Thread:
    """Ctrl-C for the main thread once the run has built its tables (and so is under way),
    not after a fixed delay that a slow server may not have reached."""
    def watch():
        with lab.connect(role="watch") as conn:
            deadline = time.monotonic() + timeout
            # the outbox: built by every run (the broker's switch table only by the recording
            # broker, not when LABKIT_AMQP_URL picks RabbitMQ)
            while time.monotonic() < deadline and not conn.execute(
                    "SELECT to_regclass('outbox') IS NOT NULL").fetchone()[0]:
                time.sleep(0.05)
        time.sleep(settle_s)
        sent.append(time.monotonic())
        press_ctrl_c()

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


@pytest.mark.usefixtures("gc_paused")
def test_keyboard_interrupt_mid_torture_leaves_no_process_session_or_lock(lab, db):
    before = {p.pid for p in child_processes(psutil.Process())}
    sent: list = []
    watcher = _interrupt_once_running(lab, sent)
    with pytest.raises(KeyboardInterrupt):
        tt.torture(lab, "relay", kills=200, seed=11)
    watcher.join(5)
    assert sent and time.monotonic() - sent[0] < 20   # it stopped soon after Ctrl-C
    assert [p for p in child_processes(psutil.Process()) if p.pid not in before] == []
    # everything but the lab's own admin connection is gone; nothing holds a lock
    assert _left_on_server(db, lab.schema, but_admin=True) == {
        "open_transactions": 0, "locks": 0, "sessions": 0}
    # the broker was switched back on, and every outbox row can be locked at once
    # (the run's clean-up may also have dropped the recording broker's tables: then nothing
    # is left switched off either)
    if lab.execute("SELECT to_regclass('broker_switch') IS NOT NULL") == [(True,)]:
        assert lab.execute("SELECT up FROM broker_switch") == [(True,)]
    n = lab.execute("SELECT count(*) FROM outbox")[0][0]
    assert len(lab.execute("SELECT id FROM outbox FOR UPDATE NOWAIT")) == n


# -- SIGINT to a child process running an experiment ---------------------------------------------

CHILD = """
import sys, labkit
from labkit.labs import convoy
from labkit.labs import relay
from labkit.tools import torture
from labkit import Lab
db = labkit.connect(quiet=True)
lab = Lab.open(db, sys.argv[1])
print(lab.schema, flush=True)
what = sys.argv[2]
if what == "convoy":
    convoy.run(lab, "wait", 4, 50, 60.0)
elif what == "trace":
    while True:
        relay.crash_trace(lab, batch=50, crash_after=20)
else:
    torture.torture(lab, "drain", kills=500, seed=2)
"""


@pytest.mark.parametrize("what", ["convoy", "trace", "torture"])
def test_sigint_to_a_process_mid_experiment_leaves_nothing_behind(db, what):
    name = f"sigint_{what}_{os.getpid()}"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, name, what], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        schema = proc.stdout.readline().strip()
        assert schema.startswith("lab_sigint_"), proc.stderr.read()
        ps = psutil.Process(proc.pid)
        # mid-experiment: worker threads are busy, or worker processes are up
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            kids = child_processes(ps)
            if (what == "convoy" and len(ps.threads()) > 4) or kids:
                break
            time.sleep(0.05)
        time.sleep(1.0)
        # strike while worker processes are up (a trace starts and ends them in turn)
        deadline = time.monotonic() + 15
        kids = child_processes(ps)
        while what != "convoy" and not kids and time.monotonic() < deadline:
            time.sleep(0.01)
            kids = child_processes(ps)
        if what != "convoy":
            assert kids, "the experiment never started its worker processes"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert "KeyboardInterrupt" in err
        assert not [k for k in kids if k.is_running() and k.status() != psutil.STATUS_ZOMBIE]
        assert _left_on_server(db, schema) == {"open_transactions": 0, "locks": 0, "sessions": 0}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        Lab.open(db, name, reset=False).drop()


# -- twenty labs at once ------------------------------------------------------------------------


def test_twenty_lab_schemas_run_the_convoy_at_once_with_correct_results(db):
    labs = [Lab.open(db, f"twenty_{i}_{os.getpid()}") for i in range(20)]
    runs: dict[int, object] = {}
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            runs[i] = convoy.run(labs[i], "skip", workers=2, job_ms=5, seconds=None, backlog=25)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(20)]
    t0 = time.monotonic()
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors[0]
        assert time.monotonic() - t0 < 45
        for i, lab in enumerate(labs):
            claims = runs[i].claims
            ids = sorted(c.job for c in claims)
            # every job claimed exactly once, and the lab's table agrees with the events
            assert ids == list(range(1, 26))
            done = lab.execute("SELECT id, worker_id FROM job WHERE status = 'DONE' ORDER BY id")
            assert done == sorted((c.job, f"w{c.worker}") for c in claims)
            assert lab.execute("SELECT count(*) FROM job") == [(25,)]
    finally:
        for lab in labs:
            lab.drop()


# -- a trainee without superuser ------------------------------------------------------------------


@pytest.fixture
def trainee(db, monkeypatch):
    role = f"labkit_trainee_{os.getpid()}"
    with db.connect() as admin:
        dbname = admin.execute("SELECT current_database()").fetchone()[0]
        admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        admin.execute(sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
            sql.Identifier(dbname), sql.Identifier(role)))
    info = conninfo_to_dict(db.dsn)
    info["user"] = role
    info.pop("password", None)
    monkeypatch.setenv("LABKIT_DSN", make_conninfo(**info))
    monkeypatch.setenv("LABKIT_BACKEND", "dsn")
    try:
        yield role
    finally:
        with db.connect() as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))
            deadline = time.monotonic() + 10
            while admin.execute("SELECT 1 FROM pg_stat_activity WHERE usename = %s", (role,)).fetchall():
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_trainee_needs_only_the_right_to_create_a_schema(trainee):
    tdb = labkit.connect(quiet=True)
    with tdb.connect() as conn:
        who, superuser = conn.execute(
            "SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
    assert who == trainee and superuser is False
    lab = Lab.open(tdb, "trainee")
    try:
        lab.create_jobs(3)
        with labkit.Sessions(lab, "A", "B", watch={"job": "id"}) as s:
            s.A("BEGIN")
            s.A("SELECT id FROM job ORDER BY id LIMIT 1 FOR UPDATE")
            b = s.B("SELECT id FROM job ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED")
            assert b.rows == [(2,)]
            s.A("COMMIT")
            assert "id=2" in s.transcript().to_text()
        tr = rl.crash_trace(lab, batch=10, crash_after=4)
        assert tr.summary["lost_events"] == [] and tr.summary["duplicates"] == 4
        run = convoy.run(lab, "skip", workers=2, job_ms=5, seconds=None, backlog=10)
        assert sorted(c.job for c in run.claims) == list(range(1, 11))
        rep = tt.torture(lab, "queue", kills=2, seed=1, items=40)
        assert rep.invariants_hold and rep.kinds.get("terminate", 0) + rep.kinds.get("sigkill", 0) == 2
    finally:
        lab.drop()


def test_a_lab_interrupted_mid_statement_still_cleans_up(db):
    """A signal can land while the admin connection is between sending a statement and
    reading its result; the connection then refuses the next one ("another command is
    already in progress").  Dropping the lab must still work: it opens a fresh connection
    and ends the busy one's backend.  The busy state is made here the way it arises: a
    statement sent and its result never read."""
    lab = Lab.open(db, f"mid_statement_{os.getpid()}")
    lab.create_jobs(1)
    busy = lab.admin
    busy.pgconn.send_query(b"SELECT pg_sleep(30)")
    busy_pid = busy.info.backend_pid
    t0 = time.monotonic()
    lab.drop()
    assert time.monotonic() - t0 < 10
    with db.connect() as conn:
        assert conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (lab.schema,)).fetchone() is None
        deadline = time.monotonic() + 10
        while conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (busy_pid,)).fetchone():
            assert time.monotonic() < deadline, "the busy session was left running"
            time.sleep(0.05)
