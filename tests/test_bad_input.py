"""Bad input: each case gets a clear error (what happened, and a fix) and leaves nothing
behind -- no worker process, no session, no lock, no half-marked row.

Covered elsewhere, not repeated here:
* a malformed isolation spec, reported with file, line and column:
  tests/test_spec.py::test_malformed_specs_are_reported_with_file_line_and_column (16 cases)
  and ::test_cli_reports_a_malformed_spec;
* grader SQL with a syntax error, a runtime error, or a statement that is not a claim:
  tests/test_grade.py::test_runtime_errors_empty_files_and_bad_parameters_are_reported and
  ::test_the_command_prints_json_and_exits_by_verdict (wrong_syntax.sql).
"""

import sys
import threading
import time

import pytest
from conftest import child_processes

import labkit
from labkit import Lab
from labkit.core.errors import LabkitError, ServerError
from labkit.labs import broker as brokers
from labkit.labs import claims as cl
from labkit.labs import convoy, fencing
from labkit.labs import drain as dr
from labkit.labs import relay as rl
from labkit.tools import grade
from labkit.tools import torture as tt


def _sessions_but_admin(lab) -> list[tuple]:
    deadline = time.monotonic() + 10
    while True:
        rows = lab.execute(
            "SELECT application_name, state FROM pg_stat_activity "
            "WHERE application_name LIKE %s AND application_name NOT LIKE '%%:admin' "
            "AND pid <> pg_backend_pid()", (f"labkit:{lab.schema}:%".replace("_", r"\_"),))
        if not rows or time.monotonic() > deadline:
            return rows
        time.sleep(0.05)


# -- impossible parameters, across the APIs -------------------------------------------------------

IMPOSSIBLE = {
    "convoy: 0 workers": (lambda lab: convoy.run(lab, "skip", 0, 20, 1.0), "workers"),
    "convoy: negative job duration": (lambda lab: convoy.run(lab, "skip", 2, -5, 1.0), "job duration"),
    "convoy: negative run time": (lambda lab: convoy.run(lab, "skip", 2, 20, -1.0), "positive duration"),
    "relay: batch 0": (lambda lab: rl.crash_trace(lab, batch=0), "batch"),
    "relay: crash point past the batch": (lambda lab: rl.crash_trace(lab, batch=10, crash_after=30),
                                          "outside the batch"),
    "relay: negative backoff": (lambda lab: rl.broker_down_trace(lab, batch=10, down_after=2, backoff_s=-1),
                                "backoff_s"),
    "relay lag: negative rate": (lambda lab: rl.measure_lag(lab, rate_per_s=-1), "positive"),
    "drain: batch 0": (lambda lab: dr.crash_trace(lab, batch=0), "batch"),
    "drain: negative lease": (lambda lab: dr.crash_trace(lab, lease_s=-120), "lease"),
    "drain: crash point past the batch": (lambda lab: dr.crash_trace(lab, batch=5, crash_after=9),
                                          "outside the batch"),
    "drain: negative ticks": (lambda lab: dr.run_ticks(lab, dr.Clock(lab), ticks=-1, every_s=1), "ticks"),
    "drain: clock backwards": (lambda lab: dr.Clock(lab).advance(-5), "cannot go back"),
    "fencing: negative overrun": (lambda lab: fencing.zombie_trace(lab, fence=True, overrun_s=-1), "overrun_s"),
    "claims: 0 workers": (lambda lab: cl.run_workers(lab, 0), "workers"),
    "claims: negative job duration": (lambda lab: cl.drain(lab, jobs=5, job_ms=-3), "job_ms"),
    "claims: 0 jobs": (lambda lab: cl.drain(lab, jobs=0), "jobs"),
    "claims: batch 0": (lambda lab: cl.drain(lab, jobs=5, batch=0), "batch"),
    "grade: more workers than jobs": (lambda lab: grade.grade_claim("SELECT 1", workers=4, jobs=2), "jobs"),
    "torture: 0 workers": (lambda lab: tt.torture(lab, "queue", workers=0), "workers"),
    "torture: negative kills": (lambda lab: tt.torture(lab, "relay", kills=-3), "kills"),
    "torture: batch larger than the table": (lambda lab: tt.torture(lab, "drain", batch=100, items=20),
                                             "larger than the table"),
    "torture: negative duration": (lambda lab: tt.torture(lab, "queue", max_seconds=-1), "max_seconds"),
    "torture: endless duration": (lambda lab: tt.torture(lab, "queue", max_seconds=float("inf")), "max_seconds"),
    "torture: nan job duration": (lambda lab: tt.torture(lab, "queue", job_ms=float("nan")), "job_ms"),
    "convoy: endless run time": (lambda lab: convoy.run(lab, "skip", 2, 20, float("inf")), "seconds"),
    "convoy: nan backoff": (lambda lab: convoy.run(lab, "nowait", 2, 20, 1.0, backoff_base_ms=float("nan")),
                            "backoff_base_ms"),
    "relay: nan backoff": (lambda lab: rl.broker_down_trace(lab, batch=10, down_after=2, backoff_s=float("nan")),
                           "backoff_s"),
    "relay lag: endless run": (lambda lab: rl.measure_lag(lab, run_s=float("inf")), "run_s"),
    "relay lag: burst while frozen": (lambda lab: rl.measure_lag(lab, burst=(1.5, 100)), "inside the pause"),
    "relay lag: empty burst": (lambda lab: rl.measure_lag(lab, burst=(0.5, 0)), "burst size"),
    "drain: nan lease": (lambda lab: dr.crash_trace(lab, lease_s=float("nan")), "lease_s"),
    "drain: clock to infinity": (lambda lab: dr.Clock(lab).advance(float("inf")), "seconds"),
    "fencing: nan overrun": (lambda lab: fencing.zombie_trace(lab, fence=True, overrun_s=float("nan")),
                             "overrun_s"),
    "claims: absurd job count": (lambda lab: cl.drain(lab, jobs=10**12), "jobs"),
}


@pytest.mark.parametrize("case", list(IMPOSSIBLE), ids=list(IMPOSSIBLE))
def test_impossible_parameters_name_the_fix_and_leave_nothing_behind(lab, case):
    call, word = IMPOSSIBLE[case]
    if case.startswith(("drain: negative ticks", "drain: clock")):
        dr.create_ledger(lab, 1)
    before = {p.pid for p in child_processes(zombies=False)}
    with pytest.raises(LabkitError) as err:
        call(lab)
    assert word in str(err.value)
    assert "Fix:" in str(err.value)
    assert [p for p in child_processes(zombies=False) if p.pid not in before] == []
    assert _sessions_but_admin(lab) == []


# -- the broker down ------------------------------------------------------------------------------


def test_broker_down_marks_nothing_retries_then_catches_up(lab):
    rl.create_outbox(lab)
    rl.place_orders(lab, 12)
    bk = brokers.for_lab(lab, "recording")
    conn = lab.connect(role="relay")
    try:
        bk.set_up(False)
        failures = []
        relay = rl.Relay(conn, bk, batch=5,
                         hook=lambda kind, **d: failures.append(d["attempt"]) if kind == "publish_failed" else None)
        with pytest.raises(LabkitError) as err:
            relay.run(backoff_s=0.001, max_attempts=4, sleep=lambda s: None)
        assert "refused 4 attempts" in str(err.value) and "Fix:" in str(err.value)
        assert failures == [1, 2, 3]                    # it retried, backing off
        # nothing marked published, nothing in the broker, no row left locked
        assert lab.execute("SELECT count(*) FROM outbox WHERE published_at IS NOT NULL") == [(0,)]
        assert bk.depth() == 0
        assert len(lab.execute("SELECT id FROM outbox FOR UPDATE NOWAIT")) == 12
        bk.set_up(True)
        assert relay.run(backoff_s=0.001, sleep=lambda s: None) == 12
        assert lab.execute("SELECT count(*) FROM outbox WHERE published_at IS NULL") == [(0,)]
        assert sorted(e for e, _ in bk.take_all()) == [rl.event_id(i) for i in range(1, 13)]
    finally:
        conn.close()
        bk.close()


# -- the server down in the middle of a run -------------------------------------------------------


def test_server_down_mid_run_stops_it_says_so_and_it_can_be_repeated(scratch_server):
    scratch_server.start()
    lab = Lab.open(labkit.connect(quiet=True), "down")
    before = {p.pid for p in child_processes(zombies=False)}
    stopper = threading.Timer(2.0, scratch_server.stop)
    stopper.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(ServerError) as err:
            tt.torture(lab, "queue", kills=300, seed=3)
    finally:
        stopper.join()
    assert time.monotonic() - t0 < 60
    assert "server went away" in str(err.value) and "labkit server start" in str(err.value)
    assert [p for p in child_processes(zombies=False) if p.pid not in before] == []
    # start it again: the same run goes through, on a fresh copy of its tables
    scratch_server.start()
    lab = Lab.open(labkit.connect(quiet=True), "down")
    rep = tt.torture(lab, "queue", kills=3, seed=3, items=40)
    assert rep.invariants_hold and rep.kills == 3
    assert _sessions_but_admin(lab) == []
    lab.drop()


# -- numbers a command cannot use: one paragraph and exit 2, before any work -------------------------

BAD_NUMBERS = {
    "convoy --seconds inf": (["convoy", "--seconds", "inf"], "seconds"),
    "convoy --seconds nan": (["convoy", "--seconds", "nan"], "seconds"),
    "convoy --seconds 1e9": (["convoy", "--seconds", "1e9"], "seconds"),
    "convoy --job-ms -1": (["convoy", "--job-ms", "-1"], "job duration"),
    "convoy --job-ms inf": (["convoy", "--job-ms", "inf"], "job_ms"),
    "convoy --drain 10**9": (["convoy", "--drain", str(10**9)], "backlog"),
    "trace drain --lease nan": (["trace", "drain", "--lease", "nan"], "lease_s"),
    "trace drain --lease inf": (["trace", "drain", "--lease", "inf"], "lease_s"),
    "trace drain --lease -1": (["trace", "drain", "--lease", "-1"], "lease"),
    "trace drain --batch 10**9": (["trace", "drain", "--batch", str(10**9)], "batch"),
    "trace zombie --lease nan": (["trace", "zombie", "--fence", "--lease", "nan"], "lease_s"),
    "trace zombie --lease 1e300": (["trace", "zombie", "--no-fence", "--lease", "1e300"], "lease_s"),
    "trace relay --batch 10**11": (["trace", "relay", "--batch", str(10**11)], "batch"),
    "trace dual-write --crash-after -1": (["trace", "dual-write", "--crash-after", "-1"], "crash_after"),
    "trace broker-down --batch 0": (["trace", "broker-down", "--batch", "0"], "batch"),
    "torture --kills 10**20": (["torture", "relay", "--kills", str(10**20)], "kills"),
    "torture --max-seconds inf": (["torture", "queue", "--max-seconds", "inf"], "max_seconds"),
    "torture --max-seconds nan": (["torture", "drain", "--max-seconds", "nan"], "max_seconds"),
    "torture --batch 10**6": (["torture", "queue", "--batch", str(10**6)], "batch"),
    "bench --seconds inf": (["bench", "--seconds", "inf"], "seconds"),
    "bench --seconds nan": (["bench", "--seconds", "nan"], "seconds"),
    "bench --clients 1000": (["bench", "--clients", "1000"], "clients"),
    "bench-history --claims -1": (["bench-history", "--claims", "-1"], "claims"),
    "bench-history --claims 10**12": (["bench-history", "--claims", str(10**12)], "claims"),
    "bench-history --ladder 0,10**12": (["bench-history", "--ladder", f"0,{10**12}"], "ladder"),
    "drill mock --minutes 0": (["drill", "mock", "--minutes", "0"], "--minutes"),
    "drill mock --minutes nan": (["drill", "mock", "--minutes", "nan"], "--minutes"),
    "drill mock --minutes inf": (["drill", "mock", "--minutes", "inf"], "--minutes"),
    "doctor --idle-seconds nan": (["doctor", "--idle-seconds", "nan"], "--idle-seconds"),
    "clean --idle-seconds inf": (["clean", "--idle-seconds", "inf"], "--idle-seconds"),
    "clean --idle-seconds -1": (["clean", "--idle-seconds", "-1"], "--idle-seconds"),
    "classroom create --trainees 0": (["classroom", "create", "--trainees", "0"], "trainees"),
    "classroom create --trainees 10**6": (["classroom", "create", "--trainees", str(10**6)], "trainees"),
}


@pytest.mark.parametrize("case", list(BAD_NUMBERS), ids=list(BAD_NUMBERS))
def test_commands_refuse_unusable_numbers_at_once(case, capsys, db):
    from labkit.cli import main

    argv, word = BAD_NUMBERS[case]
    with db.connect() as conn:
        schemas = conn.execute("SELECT count(*) FROM pg_namespace").fetchone()[0]
    t0 = time.monotonic()
    assert main(argv) == 2
    assert time.monotonic() - t0 < 5                      # found before any work
    err = capsys.readouterr().err.strip()
    assert word in err and "Fix:" in err, err
    assert "Traceback" not in err and "\n" not in err     # one paragraph
    with db.connect() as conn:
        assert conn.execute("SELECT count(*) FROM pg_namespace").fetchone()[0] <= schemas


def test_a_plot_that_cannot_be_written_is_refused_before_the_sweep(tmp_path, capsys):
    from labkit.cli import main

    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    cases = {str(tmp_path / "no" / "such" / "folder.png"): "does not exist",
             str(a_file / "under_a_file.png"): "is a file, not a folder",
             str(tmp_path): "is a folder",
             "/proc/labkit_cannot_write_here.png": "cannot be written",
             str(tmp_path / "plot.nosuchformat"): "cannot write .nosuchformat"}
    for path, words in cases.items():
        t0 = time.monotonic()
        # a sweep that would take a minute: refused at once
        assert main(["convoy", "--workers", "1,2,4,8", "--seconds", "5", "--no-progress", "--plot", path]) == 2
        assert time.monotonic() - t0 < 5
        err = capsys.readouterr().err.strip()
        assert words in err and "Fix:" in err and "\n" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]     # the checks left nothing


# -- secrets never shown -------------------------------------------------------------------------------

AMQP_SECRET = "s3cr"
BAD_AMQP_URLS = [
    "amqp://guest:p@s3cr@127.0.0.1:5672/",          # unescaped @ in the password
    "amqp://guest:x/s3cr/y@127.0.0.1/",             # unescaped / (a parser reads a port 'x')
    "amqp://guest:s3cr:et@127.0.0.1/",              # unescaped :
    "amqp://guest:s3cret",                          # no host at all
    "amqp://guest:s3cret@127.0.0.1:notaport/",
    "amqp://guest:s3cret@[::1/",                    # broken IPv6 bracket
    "guest:s3cret@127.0.0.1",                       # no scheme
    "amqp://guest:s3cret@127.0.0.1:1/",             # well formed; nothing listens there
    "amqp://127.0.0.1:1/vhost?password=s3cret",
]


def test_the_rabbitmq_queue_name_owes_nothing_to_the_servers_password():
    from labkit.labs.broker import queue_name

    one = queue_name("lab_06_outbox_ann", f"postgresql://ann:{AMQP_SECRET}@db.example/training")
    two = queue_name("lab_06_outbox_ann", "postgresql://ann:another@db.example/training")
    elsewhere = queue_name("lab_06_outbox_ann", f"postgresql://ann:{AMQP_SECRET}@db2.example/training")
    assert one == two != elsewhere and one.startswith("labkit.lab_06_outbox_ann.")


@pytest.mark.parametrize("url", BAD_AMQP_URLS)
def test_a_broken_amqp_url_never_shows_its_password(url):
    redacted = brokers._redact_amqp(url)
    assert AMQP_SECRET not in redacted
    with pytest.raises(LabkitError) as err:
        brokers.RabbitBroker(url, "labkit.test.redaction")
    for text in (str(err.value), repr(err.value), err.value.what, err.value.fix, repr(err.value.args)):
        assert AMQP_SECRET not in text, text
    assert "Fix:" in str(err.value)


# -- bulk writes are bounded -----------------------------------------------------------------------------


def test_a_bulk_insert_runs_under_a_statement_timeout(lab, monkeypatch):
    from labkit.core import limits

    lab.execute("CREATE TABLE filled (n int)")
    monkeypatch.setattr(limits, "BULK_BASE_S", 0.3)
    t0 = time.monotonic()
    with pytest.raises(LabkitError, match="was cancelled"):
        limits.bulk(lab, "INSERT INTO filled SELECT g FROM generate_series(1, 3) g, pg_sleep(1)", rows=3)
    assert time.monotonic() - t0 < 2.5
    # rolled back, and the timeout was the statement's own: the connection is as it was
    assert lab.execute("SELECT count(*) FROM filled") == [(0,)]
    assert lab.execute("SHOW statement_timeout") == [("0",)]
    monkeypatch.setattr(limits, "BULK_BASE_S", 60)
    limits.bulk(lab, "INSERT INTO filled SELECT g FROM generate_series(1, %s) g", (1000,), rows=1000)
    assert lab.execute("SELECT count(*) FROM filled") == [(1000,)]


def test_a_huge_kill_plan_is_refused_and_plans_are_drawn_lazily(lab):
    t0 = time.monotonic()
    with pytest.raises(LabkitError, match="kills"):
        tt.torture(lab, "relay", kills=10**20)
    with pytest.raises(LabkitError, match="kills"):
        tt.plan("relay", 10**20, 1, 2, 10)
    # the run draws its kills one at a time: the largest plan starts at once
    first = next(tt.iter_plan("drain", tt.MAX_KILLS, 7, 2, 5))
    assert time.monotonic() - t0 < 2
    assert first == tt.plan("drain", 1, 7, 2, 5)[0]


def test_a_missing_rabbitmq_client_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "pika", None)        # import pika now raises ImportError
    with pytest.raises(LabkitError, match=r"labkit\[rabbitmq\]"):
        brokers.RabbitBroker("amqp://guest:guest@127.0.0.1:5672/", "labkit.test.no_pika")
