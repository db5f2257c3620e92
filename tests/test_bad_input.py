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

import threading
import time

import psutil
import pytest

import labkit
from labkit import broker as brokers
from labkit import claims as cl
from labkit import convoy
from labkit import drain as dr
from labkit import fencing
from labkit import grade
from labkit import relay as rl
from labkit import torture as tt
from labkit.errors import LabkitError, ServerError


def _workers() -> list[psutil.Process]:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "resource_tracker" not in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


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
    "relay: batch 0": (lambda lab: rl.trace_relay_crash(lab, batch=0), "batch"),
    "relay: crash point past the batch": (lambda lab: rl.trace_relay_crash(lab, batch=10, crash_after=30),
                                          "outside the batch"),
    "relay: negative backoff": (lambda lab: rl.trace_broker_down(lab, batch=10, down_after=2, backoff_s=-1),
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
}


@pytest.mark.parametrize("case", list(IMPOSSIBLE), ids=list(IMPOSSIBLE))
def test_impossible_parameters_name_the_fix_and_leave_nothing_behind(lab, case):
    call, word = IMPOSSIBLE[case]
    if case.startswith(("drain: negative ticks", "drain: clock")):
        dr.create_ledger(lab, 1)
    before = {p.pid for p in _workers()}
    with pytest.raises(LabkitError) as err:
        call(lab)
    assert word in str(err.value)
    assert "Fix:" in str(err.value)
    assert [p for p in _workers() if p.pid not in before] == []
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
    lab = labkit.connect(quiet=True).lab("down")
    before = {p.pid for p in _workers()}
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
    assert [p for p in _workers() if p.pid not in before] == []
    # start it again: the same run goes through, on a fresh copy of its tables
    scratch_server.start()
    lab = labkit.connect(quiet=True).lab("down")
    rep = tt.torture(lab, "queue", kills=3, seed=3, items=40)
    assert rep.invariants_hold and rep.kills == 3
    assert _sessions_but_admin(lab) == []
    lab.drop()
