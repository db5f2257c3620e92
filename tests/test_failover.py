"""The restart and failover traces (labkit.labs.failover) on the lab's own primary and standby
(labkit.core.replica): what each promises, and that nothing of theirs is left running."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labkit.core import replica
from labkit.core.errors import LabkitError, ServerError
from labkit.labs import failover

pytestmark = pytest.mark.usefixtures("scratch_server")


def pair_processes(root: Path) -> list[int]:
    """Processes whose working folder is under ``root`` (a pair's servers run in theirs)."""
    found = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            if os.readlink(f"/proc/{pid}/cwd").startswith(str(root)):
                found.append(int(pid))
        except OSError:
            continue
    return found


def test_a_pair_streams_and_a_promoted_standby_takes_writes():
    with replica.ReplicaPair(replication="sync") as pair:
        assert pair.primary.one("SELECT pg_is_in_recovery()") is False
        assert pair.standby.one("SELECT pg_is_in_recovery()") is True
        assert pair.primary.one("SELECT sync_state FROM pg_stat_replication") == "sync"
        with pair.primary.connect() as conn:
            conn.execute("CREATE TABLE t (id int)")
            conn.execute("INSERT INTO t VALUES (1)")
        pair.wait_caught_up()
        assert pair.standby.one("SELECT count(*) FROM t") == 1
        with pytest.raises(Exception, match="read-only"):
            pair.standby.one("INSERT INTO t VALUES (2) RETURNING id")
        pair.primary.crash()
        pair.promote()
        assert pair.timeline(pair.standby) == 2
        assert pair.standby.one("INSERT INTO t VALUES (2) RETURNING id") == 2
        folder = pair.folder
    assert not folder.exists()
    assert pair_processes(replica.pairs_root()) == []
    assert not replica._live


def test_a_restart_runs_the_advisory_claim_twice_and_the_leased_one_once():
    run = failover.restart_trace()
    assert run.advisory_claims_run_twice == 1
    assert run.row_claims_run_twice == 0
    assert run.runs == {1: ["w1", "w2"], 2: ["w1"]}
    assert run.kept == ["job 2's committed claim: RUNNING, worker w1, version 1"]
    assert any("job 3 is PENDING" in text for text in run.lost)
    assert ("w1's connection", "the connection is gone") in run.rows
    assert pair_processes(replica.pairs_root()) == []


def test_an_asynchronous_failover_loses_acknowledged_commits_and_reissues_the_fence():
    run = failover.failover_trace(replication="async")
    assert run.acknowledged > 0 and run.lost_commits == run.acknowledged
    assert run.jobs_run_again > 0
    assert run.marks_lost > 0 and run.events_published_twice >= run.marks_lost
    assert run.events_missing == 0               # at least once: nothing done goes unpublished
    assert run.acknowledged == 3 * 5 + 1 + 1      # five jobs' claim, run and completion; a mark; B's claim
    assert run.in_flight == 0
    assert run.fence_version_reissued and run.zombie_write_accepted
    assert not run.zombie_write_accepted_with_epoch
    assert run.timelines == (1, 2)
    assert run.commit_ms_p50 > 0


def test_a_synchronous_failover_loses_nothing_acknowledged_and_the_fence_holds():
    run = failover.failover_trace(replication="sync")
    assert run.acknowledged == 0 and run.lost_commits == 0
    assert run.in_flight == 3                     # w1, the relay and B waited for the standby
    assert run.jobs_run_again == 0
    assert not run.fence_version_reissued
    assert not run.zombie_write_accepted and not run.zombie_write_accepted_with_epoch
    # The relay's batch in flight was published, its mark never acknowledged: published again.
    assert run.events_published_twice > 0 and run.marks_lost == 0 and run.events_missing == 0


def test_a_crash_at_no_arranged_moment_loses_only_the_newest_commits():
    stream = failover.crash_mid_stream(seconds=0.5)
    assert stream.acknowledged > 0 and stream.lost_are_the_newest
    assert 0 <= stream.lost <= stream.acknowledged and stream.kept_unacknowledged in (0, 1)
    with pytest.raises(LabkitError, match="0 < seconds <= 30"):
        failover.crash_mid_stream(seconds=0)


def test_commit_cost_times_every_level_in_one_pair():
    cost = failover.commit_cost(commits=60, rounds=3)
    assert set(cost.ms_p50) == set(failover.COMMIT_LEVELS)
    assert cost.commits == 60 and all(ms > 0 for ms in cost.ms_p50.values())


def test_bad_settings_are_refused_with_the_fix():
    with pytest.raises(LabkitError, match="--replication async or --replication sync"):
        failover.failover_trace(replication="semi")
    with pytest.raises(ServerError, match="use one of async, sync"):
        replica.ReplicaPair(replication="semi")
    with pytest.raises(LabkitError, match="jobs >= 40"):
        failover.failover_trace(jobs=10)


def test_the_pair_comes_from_the_embedded_binaries_whatever_labkit_dsn_says(monkeypatch):
    monkeypatch.setenv("LABKIT_DSN", "postgresql://nobody@127.0.0.1:1/none")
    assert failover.restart_trace().advisory_claims_run_twice == 1


def _run_until_standby(code: str) -> tuple[subprocess.Popen, Path]:
    """``code`` in a new Python process; returns once its pair's standby is running."""
    proc = subprocess.Popen([sys.executable, "-c", code], env=os.environ.copy())
    folder = replica.pairs_root() / f"{proc.pid}-1"
    deadline = time.monotonic() + 60
    while not (folder / "standby" / "data" / "postmaster.pid").exists():
        assert proc.poll() is None, "the trace ended before its standby started"
        assert time.monotonic() < deadline, "the standby never started"
        time.sleep(0.02)
    return proc, folder


TRACE = "from labkit.labs import failover; failover.failover_trace(replication='sync', jobs=4000)"


def test_ctrl_c_mid_failover_leaves_nothing_running():
    proc, folder = _run_until_standby(TRACE)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) != 0
    assert pair_processes(folder) == []
    assert not folder.exists()


def test_a_killed_process_takes_its_servers_with_it_and_the_next_pair_sweeps_its_folder():
    proc, folder = _run_until_standby(TRACE)
    proc.kill()
    proc.wait(30)
    deadline = time.monotonic() + 20
    while pair_processes(folder) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pair_processes(folder) == []           # the kernel sent each postmaster SIGQUIT
    assert folder.exists()
    mine = replica._new_folder()
    try:
        assert not folder.exists()
    finally:
        mine.rmdir()


# -- the notebook's exercises -------------------------------------------------------------------

from labkit.tools.exercises import failover as exercises  # noqa: E402

RESTART_ANSWER = failover.query(failover.SQL, "restart_claim_answer").text
FENCE_ANSWER = """UPDATE job SET status = 'DONE'
 WHERE id = %(id)s AND (epoch, version) = (%(epoch)s, %(version)s)"""


def test_the_advisory_claim_fails_the_restart_exercise_and_the_leased_claim_passes():
    starter = exercises.check_restart_claim(exercises.RESTART_STARTER)
    assert not starter.passed
    assert "w2 claimed job 1: w1's job again" in str(starter)
    assert "advisory claim as it stands" in starter.hint
    assert exercises.check_restart_claim(RESTART_ANSWER).passed
    # A claim with no lease never gives the job back.
    no_lease = exercises.check_restart_claim(
        "UPDATE job SET status = 'RUNNING', worker = %(worker)s WHERE id = (SELECT id FROM job "
        "WHERE status = 'PENDING' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id")
    assert not no_lease.passed and "lease_until is past" in no_lease.hint


def test_the_version_fence_fails_the_failover_exercise_and_the_epoch_fence_passes():
    starter = exercises.check_fenced_write(exercises.FENCE_STARTER)
    assert not starter.passed
    assert "zombie B (version 2, epoch 1): 1 row changed" in str(starter)
    assert exercises.check_fenced_write(FENCE_ANSWER).passed


def test_an_exercise_with_unknown_parameters_or_two_statements_says_what_is_allowed():
    with pytest.raises(LabkitError, match=r"use only %\(id\)s, %\(version\)s, %\(epoch\)s"):
        exercises.check_fenced_write("UPDATE job SET status = 'DONE' WHERE id = %(job)s")
    with pytest.raises(LabkitError, match="one statement, not 2"):
        exercises.check_restart_claim("SELECT 1; SELECT 2")
    with pytest.raises(LabkitError, match="empty"):
        exercises.check_restart_claim("  ")


def test_a_kernel_interrupted_mid_failover_leaves_nothing_running(tmp_path):
    """The notebook's case: the learner presses Interrupt while a failover runs in the kernel."""
    from jupyter_client.manager import start_new_kernel

    before = set(replica.pairs_root().iterdir()) if replica.pairs_root().exists() else set()
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(tmp_path))
    try:
        msg_id = kc.execute("from labkit.labs import failover\n"
                            "failover.failover_trace(replication='sync', jobs=4000)")
        deadline = time.monotonic() + 90
        folder = None
        while folder is None:
            assert time.monotonic() < deadline, "the kernel's pair never started its standby"
            new = set(replica.pairs_root().iterdir()) - before if replica.pairs_root().exists() else set()
            folder = next((f for f in new if (f / "standby" / "data" / "postmaster.pid").exists()), None)
            time.sleep(0.02)
        km.interrupt_kernel()
        reply = kc.get_shell_msg(timeout=60)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = kc.get_shell_msg(timeout=60)
        assert reply["content"]["status"] == "error"
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        assert pair_processes(folder) == []
        assert not folder.exists()
        # ...and the kernel goes on: the next cell runs.  (For a moment after an error the
        # kernel aborts what was already queued behind it, as Jupyter does after a failed cell:
        # a cell sent in that moment comes back "aborted", and runs when sent again.)
        for _ in range(10):
            again = kc.execute_interactive("print('still here')", timeout=30)
            if again["content"]["status"] != "aborted":
                break
            time.sleep(0.5)
        assert again["content"]["status"] == "ok"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def _labkit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "labkit", *args], capture_output=True, text=True,
                          env=os.environ.copy(), timeout=180)


def test_the_trace_commands_print_the_figures_as_json():
    import json

    restart = json.loads(_labkit("trace", "restart", "--json").stdout)
    assert restart["advisory_claims_run_twice"] == 1 and restart["row_claims_run_twice"] == 0
    done = _labkit("trace", "failover", "--replication", "sync", "--json")
    sync = json.loads(done.stdout)
    assert {"lost_commits", "jobs_run_again", "events_published_twice", "fence_version_reissued",
            "zombie_write_accepted", "commit_ms_p50"} <= set(sync)
    assert sync["lost_commits"] == 0 and not sync["zombie_write_accepted"]
    table = _labkit("trace", "restart")
    assert "what the server said" in table.stdout and "advisory_claims_run_twice: 1" in table.stdout
    wrong = _labkit("trace", "failover", "--replication", "semi")
    assert wrong.returncode == 2 and "invalid choice: 'semi'" in wrong.stderr


def test_without_a_network_namespace_the_half_open_cells_and_tests_are_one_skip_line():
    """Where no namespace can be made (macOS, a kernel that forbids it), notebook 19's
    half-open cells and the namespace tests are left out, counted, in one line."""
    code = ("import sys, pytest, labkit.labs.halfopen as h\n"
            "h.available = lambda: (False, 'forced for this test')\n"
            "sys.exit(pytest.main(['-p', 'no:xdist', '-p', 'no:cacheprovider', '--collect-only', '-q', "
            "'--nbval', '--nbval-current-env', 'notebooks/19_when_the_server_goes_away.ipynb', "
            "'tests/test_halfopen.py']))")
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root,
                          env=os.environ.copy(), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    kept = [line for line in done.stdout.splitlines() if "::" in line]
    assert not [line for line in kept if "test_halfopen" in line]    # all deselected...
    # ...but for the notebook's first half-open cell, which carries the one skip line
    left_out = re.search(r"\((\d+) deselected\)", done.stdout)
    assert left_out and int(left_out.group(1)) > 15, done.stdout[-600:]   # the 15 tests and cells
