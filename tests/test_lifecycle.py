"""Heartbeats, zombies and graceful shutdown, with real worker processes on the real server."""

import json
import math
import time

import pytest

from conftest import backends_gone, child_pids, interrupt_when, returns_a_row
from labkit.core import procs
from labkit.core.errors import LabkitError
from labkit.core.lab import Lab, schema_name
from labkit.core.text import TEXT_WIDTH
from labkit.labs import lifecycle as lc


def _nothing_left(db, schema: str, before: set[int]) -> None:
    assert [w.name for w in procs._live if w.alive] == []
    assert child_pids() - before == set()
    assert backends_gone(db, f"labkit:{schema}:{lc.ROLE}%") == []


def _runs(lab) -> list[tuple]:
    return lab.execute("SELECT worker, claim_version FROM job_run ORDER BY id")


def _never():
    raise AssertionError("the lab was opened before the parameters were checked")


# -- heartbeats -------------------------------------------------------------------------------------


def test_without_a_heartbeat_the_second_worker_runs_the_job_again(lab, db):
    before = child_pids()
    t0 = time.monotonic()
    r = lc.heartbeat_trace(lab, heartbeat=False)
    assert time.monotonic() - t0 < 12
    assert (r.runs, r.claims) == (2, 2)
    assert _runs(lab) == [("worker 1", 1), ("worker 2", 2)]
    assert (r.completes_landed, r.completes_refused, r.heartbeats) == (1, 1, 0)
    assert r.final_status == "DONE" and r.exit_codes == {"worker 1": 0, "worker 2": 0}
    assert [(w, v) for w, _, v in r.events] == [
        ("worker 1", 1), ("worker 1", 1),                   # claims, starts
        ("worker 2", 1), ("worker 2", 2), ("worker 2", 2),  # reaps the expired lease, claims, starts
        ("worker 1", 1), ("worker 2", 2)]                   # the first complete is fenced, the second lands
    assert "lease ran out" in r.events[2][1] and "matches 0 rows" in r.events[5][1]
    _nothing_left(db, lab.schema, before)


def test_with_a_heartbeat_the_job_runs_once(lab, db):
    before = child_pids()
    r = lc.heartbeat_trace(lab, heartbeat=True)
    assert (r.runs, r.claims) == (1, 1)
    assert _runs(lab) == [("worker 1", 1)]
    assert (r.completes_landed, r.completes_refused) == (1, 0)
    # one every lease_s / 3 of a 2.5 s job: about 7 (more if a loaded machine stretches the
    # handler, never one per 20 ms slice: that would be 125)
    assert 4 <= r.heartbeats <= 15
    assert r.final_status == "DONE" and r.exit_codes == {"worker 1": 0, "worker 2": 0}
    assert [(w, v) for w, _, v in r.events] == [
        ("worker 1", 1), ("worker 1", 1), ("worker 1", 1), ("worker 1", 1),   # claim, start, beats, complete
        ("worker 2", None)]                                 # found nothing to claim; the lab stops it
    assert "heartbeat" in r.events[2][1] and "matches 1 row" in r.events[3][1]
    assert "found nothing to claim" in r.events[4][1]
    _nothing_left(db, lab.schema, before)


def test_a_frozen_zombie_s_heartbeat_matches_no_row_and_it_stops_its_handler(lab, db):
    before = child_pids()
    r = lc.zombie_trace(lab)
    assert (r.zombie_heartbeat_rows, r.zombie_stopped, r.zombie_completes) == (0, True, 0)
    assert (r.zombie_claim_version, r.owner_claim_version) == (1, 2)
    assert r.runs == 2 and r.final_status == "DONE"
    assert r.exit_codes == {"worker 1": 0, "worker 2": 0}
    assert lab.execute("SELECT attempts, claimed_by FROM job WHERE id = 1") == [(2, None)]
    texts = [t for _, t, _ in r.events]
    order = [texts.index(next(t for t in texts if t.startswith(p))) for p in
             ("SIGSTOP", "reaper", "SIGCONT", "heartbeat matches 0 rows", "stops its handler")]
    assert order == sorted(order)
    assert r.events[-1] == ("worker 2", "handler done; complete matches 1 row", 2)
    _nothing_left(db, lab.schema, before)


def test_the_lease_timeline_is_drawn_from_the_runs_own_events(lab):
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from labkit.tools.training import IMG_MAX_PX, SLIDE_WIDTH_PX

    without = lc.heartbeat_trace(lab, lease_s=0.5, job_s=1.2, heartbeat=False)
    beating = lc.heartbeat_trace(lab, lease_s=0.5, job_s=1.2, heartbeat=True)
    # the first claim outlives its lease: a reaper takes the job back, worker 2 claims v2,
    # and worker 1's complete is refused; with a heartbeat the one lease never runs out
    first, second = lc.lease_spans(without)
    assert (first.worker, first.claim_version, first.outcome, first.expired) == \
        ("worker 1", 1, "refused", True)
    assert first.lease_end == pytest.approx(0.5, abs=0.01)
    assert first.lease_end <= first.reaped <= second.claimed < first.ended
    assert (second.worker, second.claim_version, second.outcome) == ("worker 2", 2, "landed")
    [only] = lc.lease_spans(beating)
    assert (only.outcome, only.expired, len(only.heartbeats)) == ("landed", False, beating.heartbeats)
    assert only.lease_end > only.ended
    fig = lc.plot_leases(without, beating)
    top, bottom = fig.axes
    marks = lambda ax, m: [x for line in ax.get_lines() if line.get_marker() == m for x in line.get_xdata()]
    assert marks(top, "X") == [first.ended] and marks(top, "o") == [second.ended]
    assert marks(top, "v") == [first.reaped] and marks(top, "|") == []
    assert marks(bottom, "|") == only.heartbeats and marks(bottom, "X") == []
    assert "ran twice" in top.get_title(loc="left") and "ran once" in bottom.get_title(loc="left")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    plt.close(fig)
    width, height = (int.from_bytes(buf.getvalue()[16:20], "big"), int.from_bytes(buf.getvalue()[20:24], "big"))
    assert width <= SLIDE_WIDTH_PX and height <= IMG_MAX_PX
    with pytest.raises(LabkitError, match="Fix:"):
        lc.plot_leases({"runs": 2})
    with pytest.raises(LabkitError, match="Fix:"):
        lc.plot_leases(without, beating, without)


def test_the_heartbeat_is_fenced_by_claim_version(lab):
    """The SQL on its own: an older claim's heartbeat (and release) touch nothing."""
    lc._setup(lab, 1)
    claim = lc.query("production.sql", "claim").sql
    lab.execute(claim, {"worker": "a", "lease_s": 0.01})
    time.sleep(0.05)
    assert lab.execute(lc._sql("reap")) == [(1, 1, "PENDING")]
    assert lab.execute(claim, {"worker": "b", "lease_s": 30})[0][5] == 2
    beat = {"id": 1, "lease_s": 30}
    assert lab.execute(lc._sql("heartbeat"), {**beat, "claim_version": 1}) == []
    assert len(lab.execute(lc._sql("heartbeat"), {**beat, "claim_version": 2})) == 1
    release = {"ids": [1], "claim_versions": [1], "started": False}
    assert lab.execute(lc._sql("release"), release) == []
    assert lab.execute(lc._sql("release"), {**release, "claim_versions": [2]}) == [(1,)]
    assert lab.execute("SELECT status, attempts, claimed_by FROM job") == [("PENDING", 1, None)]


# -- graceful shutdown ------------------------------------------------------------------------------


def test_a_kill_leaves_claims_waiting_for_their_lease_a_sigterm_leaves_none(lab, db):
    before = child_pids()
    t0 = time.monotonic()
    r = lc.shutdown_trace(lab)
    assert time.monotonic() - t0 < 12
    assert r.waiting_lease_after_kill == lc.BATCH == r.claimed_by_worker_1
    assert 20 < r.lease_left_s <= lc.SHUTDOWN_LEASE_S
    assert r.waiting_lease_after_graceful == 0
    assert (r.exit_code_kill, r.exit_code_graceful) == (-9, 0)
    assert (r.released, r.stopped_mid_run, r.finished_in_deadline) == (lc.BATCH - 1, 0, True)
    assert r.stop_s < lc.DEADLINE_S
    # the others ran everything, each job once, and a hand-back cost no attempt
    assert r.done_after_graceful == r.runs_after_graceful == lc.JOBS
    assert r.max_attempts_after_graceful == 1
    assert [t.split(":")[0] for w, t, _ in r.events_kill if w == "worker 1"][-1] == "SIGKILL"
    assert [w for w, _, _ in r.events_graceful] == ["worker 1"] * 7 + ["server"]
    assert "hands back jobs 2, 3" in r.events_graceful[4][1]
    assert "matches 1 row" in r.events_graceful[5][1]
    _nothing_left(db, lab.schema, before)


def test_past_the_deadline_the_job_in_hand_is_handed_back_with_its_attempt_kept(lab, db):
    before = child_pids()
    r = lc.shutdown_trace(lab, workers=3, jobs=4, per_worker_batch=2, job_s=0.8, deadline_s=0.2)
    assert r.waiting_lease_after_graceful == 0 and r.exit_code_graceful == 0
    assert (r.released, r.stopped_mid_run, r.finished_in_deadline) == (1, 1, False)
    assert 0.2 <= r.stop_s < 0.8
    assert r.done_after_graceful == 4 and r.runs_after_graceful == 5   # job 1 started twice
    assert lab.execute("SELECT attempts, last_error LIKE 'stopped at shutdown%' FROM job WHERE id = 1") \
        == [(2, True)]
    assert lab.execute("SELECT attempts FROM job WHERE id = 2") == [(1,)]    # given back
    _nothing_left(db, lab.schema, before)


# -- parameters, commands, interruptions -------------------------------------------------------------


@pytest.mark.parametrize("kw", [
    {"lease_s": 0.1}, {"lease_s": 61}, {"lease_s": math.nan}, {"lease_s": "1"},
    {"job_s": 1.0}, {"job_s": 0.5}, {"job_s": 301}, {"job_s": math.inf}])
def test_bad_heartbeat_parameters_are_refused_before_any_lab_opens(kw):
    with pytest.raises(LabkitError, match="Fix:"):
        lc.heartbeat_command(open_lab=_never, json=True, **kw)
    with pytest.raises(LabkitError):
        lc.heartbeat_trace(None, heartbeat=True, **kw)
    with pytest.raises(LabkitError):
        lc.zombie_trace(None, **kw)


@pytest.mark.parametrize("kw", [
    {"workers": 1}, {"workers": 5}, {"workers": True}, {"lease_s": 5}, {"deadline_s": 0},
    {"deadline_s": 30}, {"deadline_s": 61}, {"per_worker_batch": 1}, {"jobs": 2}, {"jobs": 2.5},
    {"job_s": 0}, {"job_s": 5}, {"lease_s": math.nan}])
def test_bad_shutdown_parameters_are_refused_before_any_lab_opens(kw):
    with pytest.raises(LabkitError, match="Fix:"):
        lc.shutdown_command(open_lab=_never, json=True, **kw)
    with pytest.raises(LabkitError):
        lc.shutdown_trace(None, **kw)


def test_the_commands_print_their_summaries_and_drop_their_labs(db, capsys):
    made = []

    def open_lab():
        made.append(Lab.open(db, f"lifecycle_cli_{len(made)}"))
        return made[-1]

    assert lc.heartbeat_command(open_lab=open_lab, lease_s=0.5, job_s=1.2, json=True) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {"runs_without_heartbeat": 2, "runs_with_heartbeat": 1,
                   "zombie_heartbeat_rows": 0, "zombie_stopped": True}
    assert lc.shutdown_command(open_lab=open_lab, json=False) == 0
    text = capsys.readouterr().out
    assert "SIGKILL: dies at once" in text and "hands back jobs 2, 3" in text
    assert "waiting_lease_after_kill      3" in text and "waiting_lease_after_graceful  0" in text
    with db.connect() as conn:
        left = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname = ANY(%s)",
                            ([lab.schema for lab in made],)).fetchall()
    assert left == []


@pytest.mark.usefixtures("gc_paused")
def test_ctrl_c_while_a_worker_is_frozen_leaves_no_process_or_session(lab, db):
    before, sent = child_pids(), []
    # worker 2 has re-claimed the job: worker 1 is frozen (SIGSTOP) right now
    watcher = interrupt_when(db.connect, returns_a_row(f"SELECT 1 FROM {lab.schema}.job WHERE claim_version = 2",
                                                       missing_ok=True), sent, timeout=30)
    with pytest.raises(KeyboardInterrupt):
        lc.zombie_trace(lab)
    watcher.join(5)
    assert sent and time.monotonic() - sent[0] < 10
    _nothing_left(db, lab.schema, before)


@pytest.mark.usefixtures("gc_paused")
def test_ctrl_c_mid_shutdown_command_drops_its_lab(db):
    before, sent = child_pids(), []
    name = f"lifecycle_ctrl_c_{id(sent)}"
    schema = schema_name(name)
    # worker 1 holds its batch of claims
    watcher = interrupt_when(db.connect, returns_a_row(f"SELECT 1 FROM {schema}.job WHERE status = 'RUNNING'",
                                                       missing_ok=True), sent, timeout=30)
    with pytest.raises(KeyboardInterrupt):
        lc.shutdown_command(open_lab=lambda: Lab.open(db, name), json=True)
    watcher.join(5)
    assert sent
    _nothing_left(db, schema, before)
    with db.connect() as conn:
        assert conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchall() == []


def test_the_event_list_wraps_a_long_event_under_its_own_column():
    long = "3 of worker 1's claims still RUNNING: they wait out the lease while the other workers sit idle"
    text = lc.format_events([("server", long, None), ("worker 1", "claims 3", 2)])
    lines = text.splitlines()
    assert max(map(len, lines)) <= TEXT_WIDTH and len(lines) == 3
    assert lines[0].split()[:2] == ["server", "-"] and lines[2].split()[:3] == ["worker", "1", "v2"]
    column = lines[0].index(long.split()[0])
    assert lines[1][:column].strip() == ""                      # the continuation keeps its column
    assert " ".join(lines[0][column:].split() + lines[1].split()) == long
