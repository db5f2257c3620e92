"""The listener that died: two LISTEN workers across a real server restart.

Every test runs on a throw-away server of the trace's own (labkit.core.replica), restarted for
real; nothing is mocked.  One run with the defaults is shared by the tests that read it; a
shorter run through the command, and a run interrupted by Ctrl-C, are their own.
"""

import json
import os
import threading
import time

import pytest
from conftest import press_ctrl_c

from labkit.core import replica
from labkit.core.errors import LabkitError
from labkit.labs import relisten

pytestmark = pytest.mark.server      # every test here makes and restarts a server of its own


def _rows(jobs: int) -> list[tuple[str, str]]:
    """What a run that behaves as the lab says reads, for ``jobs`` jobs after the restart."""
    return [
        ("both workers start, each LISTENing on its own channel",
         "naive listener: LISTEN naive_jobs; ListenWorker: LISTEN worker_jobs, then a sweep"),
        ("a job to each queue, with its NOTIFY",
         "naive listener: woken, claimed it; ListenWorker: woken, claimed it"),
        ("a probe session LISTENs on both channels",
         "its pg_listening_channels(): naive_jobs, worker_jobs"),
        ("the server restarts (an immediate shutdown, then a start)",
         "naive listener: its wait failed; it logged that and waited again on the same connection, "
         "failing every time; it never LISTENed again; ListenWorker: connection lost; a new "
         "connection, LISTEN on it and a sweep of its queue"),
        (f"{jobs} jobs to each queue, one at a time, each with its NOTIFY",
         f"naive listener: claimed none; ListenWorker: claimed all {jobs}"),
        ("the watch ends", f"naive listener: {jobs} jobs waiting; ListenWorker: 0 jobs waiting"),
        ("the probe connects again (a new session)",
         "its pg_listening_channels(): none; the sessions that listened before the restart: gone "
         "from pg_stat_activity; naive listener: no session, ListenWorker: 1 session"),
    ]


def _nothing_left() -> dict:
    """Threads of the trace still alive, pair servers this process still runs, and processes
    whose working folder is under the pairs' folder (a postmaster or a backend of a pair)."""
    root = str(replica.pairs_root())
    cwd_under = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if cwd == root or cwd.startswith(root + "/"):
            cwd_under.append((int(pid), cwd))
    return {"threads": [t.name for t in threading.enumerate() if t.name.startswith("relisten-")],
            "servers": list(replica._live), "processes": cwd_under}


@pytest.fixture(scope="module")
def run():
    started = time.monotonic()
    r = relisten.listener_trace()
    return r, time.monotonic() - started


def test_the_naive_listener_claims_nothing_after_the_restart_and_stalls_to_the_cap(run):
    r, _ = run
    assert r.cap_s == 6.0 and r.jobs == 5
    assert r.jobs_waiting_without_reconnect == r.jobs
    assert r.stalled_s_without_reconnect == r.cap_s
    # it worked before the restart: one claim, on its notification, and never one after
    claims = [what for _, what in r.naive_log if "claimed" in what]
    assert len(claims) == 1
    assert r.naive_log[0][1] == "LISTEN naive_jobs" and r.naive_listens == 1
    # its waits failed on the dead connection, again and again, and it never reconnected
    failed = [what for t, what in r.naive_log if what.startswith("wait failed") and t >= r.restarted_at_s]
    assert len(failed) == r.naive_wait_failures >= 2
    assert "server closed the connection unexpectedly" in failed[0]
    assert all(f == "wait failed: the connection is lost" for f in failed[1:])
    assert r.naive_connection_closed
    assert r.naive_log[-1][1] == "stopped"


def test_the_listen_worker_reconnects_and_claims_every_job_well_within_the_cap(run):
    r, _ = run
    assert r.jobs_waiting_with_reconnect == 0
    assert 0 <= r.stalled_s_with_reconnect < r.cap_s
    after = [(t, what, job) for t, what, job in r.worker_log if t >= r.restarted_at_s]
    # (on a loaded machine the server may still be starting when it first tries: "connect
    # failed", and it tries again after retry_s)
    assert [what for _, what, _ in after if what != "connect failed"][:2] == ["connection lost", "LISTEN"]
    assert len([job for _, _, job in after if job is not None]) == r.jobs
    assert r.worker_listens == 2
    # its new LISTEN came after its pause (retry_s), and before the watch ended
    assert r.worker_listening_again_s is not None
    assert r.retry_s - 0.002 <= r.worker_listening_again_s < r.cap_s
    # the stall is the reconnect: its sweep, right after the new LISTEN, ends it (the stall
    # is read on the server's clock, the LISTEN on this machine's: a second of room for load)
    assert r.stalled_s_with_reconnect <= r.worker_listening_again_s + 1.0


def test_the_listen_registration_went_with_the_session(run):
    r, _ = run
    assert r.server_restarted
    assert r.channels_before_restart == ["naive_jobs", "worker_jobs"]
    assert r.channels_after_restart == []
    assert r.old_sessions_left == 0
    assert r.naive_sessions_after == 0
    assert r.worker_sessions_after == 1


def test_the_rows_are_the_story_in_words_with_no_timings(run):
    r, took_s = run
    assert r.rows == _rows(5)
    assert r.table.splitlines()[0].split() == ["what", "happened", "what", "each", "worker", "did"]
    assert took_s < 20          # the brief's ~12 s, with room for a loaded machine


def test_the_json_holds_every_figure_and_the_report_says_them(run):
    r, _ = run
    data = json.loads(r.to_json())
    assert data["stalled_s_without_reconnect"] == r.cap_s
    assert data["jobs_waiting_with_reconnect"] == 0
    assert data["rows"] == [list(row) for row in _rows(5)]
    text = relisten.report(r)
    assert "5 jobs waiting, stalled 6 s (the whole watch)" in text
    assert f"0 jobs waiting, stalled {r.stalled_s_with_reconnect:g} s" in text


def test_nothing_is_left_running_after_a_run(run):
    assert _nothing_left() == {"threads": [], "servers": [], "processes": []}


def test_the_command_prints_json_for_a_shorter_run(capsys):
    assert relisten.trace_command(cap_s=3.0, jobs=2, json=True) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["jobs"] == 2 and data["cap_s"] == 3.0
    assert data["jobs_waiting_without_reconnect"] == 2 and data["stalled_s_without_reconnect"] == 3.0
    assert data["jobs_waiting_with_reconnect"] == 0 and 0 <= data["stalled_s_with_reconnect"] < 3.0
    assert data["rows"] == [list(row) for row in _rows(2)]
    assert _nothing_left() == {"threads": [], "servers": [], "processes": []}


@pytest.mark.usefixtures("gc_paused")
def test_ctrl_c_mid_run_stops_the_workers_and_the_server():
    def press_once_watching() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(
                t.name == "relisten-naive" for t in threading.enumerate()):
            time.sleep(0.01)
        time.sleep(1.5)                  # past the restart: the watch is under way
        press_ctrl_c()

    presser = threading.Thread(target=press_once_watching, daemon=True)
    presser.start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        relisten.listener_trace(cap_s=20.0)
    assert time.monotonic() - started < 15
    presser.join(5)
    assert _nothing_left() == {"threads": [], "servers": [], "processes": []}


@pytest.mark.parametrize("kw, says", [
    ({"cap_s": 1}, "cap_s=1 is too small"),
    ({"cap_s": 2, "retry_s": 1.5}, "leaves no time to watch"),
    ({"jobs": 0}, "jobs=0 is too small"),
    ({"jobs": 2.5}, "is not a whole number"),
    ({"safety_poll_s": float("nan")}, "not a finite number"),
])
def test_bad_parameters_are_refused_before_a_server_is_made(kw, says):
    with pytest.raises(LabkitError, match=says):
        relisten.listener_trace(**kw)
    assert _nothing_left()["servers"] == []
