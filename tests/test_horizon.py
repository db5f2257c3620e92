"""The xmin horizon lab on a real server: a REPEATABLE READ report idle in transaction
makes every claim walk the jobs done since it began, and VACUUM remove none of them."""

import dataclasses
import json
import math
import os
import time

import matplotlib
import pytest
from conftest import backends_gone, child_pids, interrupt_when, returns_a_row

from labkit.core.errors import LabkitError
from labkit.core.queries import query, strip_comments
from labkit.labs import horizon as hz

matplotlib.use("Agg")


def _superuser(lab) -> bool:
    return lab.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")[0][0]


def _lab_sessions_gone(db, lab) -> None:
    assert backends_gone(db, f"labkit:{lab.schema}:{hz.WORKER_ROLE}%") == []
    assert backends_gone(db, f"labkit:{lab.schema}:{hz.REPORT_ROLE}") == []


def _never(*_a, **_k):
    raise AssertionError("the lab was opened before the parameters were checked")


@pytest.mark.parametrize("kw", [
    {"seconds": 0}, {"seconds": 0.5}, {"seconds": 601}, {"seconds": math.nan}, {"seconds": "4"},
    {"workers": 0}, {"workers": 17}, {"workers": 1.5}, {"workers": True},
])
def test_bad_parameters_are_refused_before_any_lab_is_opened(kw):
    args = {"seconds": 4, "workers": 2, **kw}
    with pytest.raises(LabkitError) as err:
        hz.horizon_command(open_lab=_never, json=False, **args)
    name = next(iter(kw))
    assert name in str(err.value) and "Fix:" in str(err.value)


def test_the_measured_select_is_the_claims_own():
    inner = " ".join(query("horizon.sql", "claim_select").sql.split())
    claim = " ".join(strip_comments(query("production.sql", "claim").text).split())
    assert inner in claim


def test_a_held_horizon_makes_every_claim_walk_the_jobs_done_since(lab, db):
    before = child_pids()
    r = hz.horizon_trace(lab, seconds=2, workers=2)
    # the report held the horizon, as the server shows it
    assert r.horizon_held_by == f"labkit:{lab.schema}:report (idle in transaction)"
    holder = r.holder
    assert holder.application_name == f"labkit:{lab.schema}:report"
    assert holder.xmin_age >= 2 * r.claims_with          # a claim and a complete each
    assert r.durability.as_dict().keys() == {"fsync", "synchronous_commit"}
    assert r.jobs >= hz.MIN_JOBS and r.with_.ran_dry == r.without.ran_dry == 0
    # both runs did real work
    assert r.claims_without > 100 and r.claims_with > 100
    # without it, a claim reads a few dozen buffers; with it, it visits every job done since
    # (on a two-core machine: ~35 against ~3,000; with both cores kept busy by other
    # processes, ~7 against ~270)
    assert r.buffers_per_claim_with > 10 * r.buffers_per_claim_without
    later = [p.buffers for p in r.with_.series]
    assert later[-1] > later[0]                                   # it grows with the churn
    # (the walk also costs the server time, ~0.05 ms against ~0.35 ms per claim's SELECT on an
    # idle two-core machine; that is a timing, asserted as a shape in notebook 10, not here:
    # the buffers above are the measure that does not depend on the load)
    assert r.select_ms_with > 0 and r.select_ms_without > 0
    # every version the run replaced is dead (a claim and a complete each); with the report open
    # VACUUM removes none of them.  n_dead_tup is a statistic each backend reports when it ends
    # or idles, so on a loaded machine a late report of earlier sessions can add to it
    assert r.unremovable_with == 2 * r.claims_with
    assert r.dead_tuples_with >= r.unremovable_with
    assert r.unremovable_without < r.unremovable_with / 10
    # the horizons, as 32-bit xids: the report's snapshot holds this database's horizon
    # (VACUUM's cutoff on the job table) and, where the role may vacuum it, a shared
    # catalog's; with no transaction id, not the xmin of a new snapshot, which is the oldest
    # transaction running anywhere
    assert r.holder_xid == int(holder.backend_xmin) and holder.backend_xid is None
    assert not hz.xid_newer(r.vacuum_cutoff_with, r.holder_xid)
    assert hz.xid_newer(r.claim_xmin_with, r.holder_xid)
    assert r.shared_cutoff_with is None or not hz.xid_newer(r.shared_cutoff_with, r.holder_xid)
    if _superuser(lab):
        assert r.shared_cutoff_with is not None
    assert r.shared_cutoff_without is None                    # measured with a holder only
    assert r.horizon_age_with >= r.claims_with
    for run in (r.without, r.with_):
        series = run.series
        assert len(series) >= 2
        assert [p.t for p in series] == sorted(p.t for p in series)
        assert set(series[0].as_dict()) == {"t", "claim_ms", "claims", "buffers", "select_ms", "dead",
                                            "horizon_age", "horizon_holder"}
    # with the report open, the samples name it as the session that held the horizon
    assert r.with_.series[-1].horizon_holder.startswith(f"labkit:{lab.schema}:report (pid ")
    fig = hz.plot(r)
    assert len(fig.axes) == 2 and "fsync=" in fig._suptitle.get_text()
    # the growth is the point: the buffers are drawn on a linear axis from 0, and the line
    # with the report open ends higher than it starts
    buffers = fig.axes[1]
    assert buffers.get_yscale() == "linear" and buffers.get_ylim()[0] == 0
    drawn = buffers.get_lines()[1].get_ydata()
    assert list(drawn) == later and drawn[-1] > drawn[0]
    matplotlib.pyplot.close(fig)
    _lab_sessions_gone(db, lab)
    assert child_pids() - before == set()


def test_who_holds_the_horizon_names_the_idle_report(lab):
    hz.create_queue(lab, 100)
    report = hz.open_report(lab, lasts_s=30)
    try:
        lab.execute("SELECT pg_current_xact_id()")      # one transaction after its snapshot
        rows = hz.who_holds_the_horizon(lab, limit=100)
        mine = [r for r in rows if r.pid == report.info.backend_pid]
        assert len(mine) == 1
        assert mine[0].application_name == f"labkit:{lab.schema}:report"
        assert mine[0].state == "idle in transaction"
        assert mine[0].xmin_age >= 1 and mine[0].last_query.startswith("SELECT count(*)")
        ages = [max(r.xmin_age or 0, r.xid_age or 0) for r in rows]
        assert ages == sorted(ages, reverse=True)
    finally:
        report.close()
    # the client's close returns at once; the server's backend leaves a moment later
    assert backends_gone(lab.db, f"labkit:{lab.schema}:{hz.REPORT_ROLE}") == []
    assert all(r.application_name != f"labkit:{lab.schema}:report"
               for r in hz.who_holds_the_horizon(lab, limit=100))
    assert isinstance(hz.other_horizon_holders(lab), list)


def test_vacuum_removes_nothing_while_the_report_is_open_and_everything_after(lab, db):
    r = hz.vacuum_removable(lab, jobs=500)
    assert r.dead_versions == 1000
    assert r.holder.state == "idle in transaction"
    held = (r.removed_while_held, r.not_removable_while_held, r.n_dead_tup_while_held)
    assert held == (0, 1000, 1000)
    assert "1000 are dead but not yet removable" in r.line_while_held
    assert (r.removed_after, r.not_removable_after, r.n_dead_tup_after) == (1000, 0, 0)
    # "remain": every job's live version, and the dead versions VACUUM had to keep
    assert (r.remain_while_held, r.remain_after) == (500 + 1000, 500)
    assert f"{r.remain_while_held} remain" in r.line_while_held
    assert r.ended_by == "idle_in_transaction_session_timeout = 1s"
    assert 0.9 <= r.ended_after_s < 10
    _lab_sessions_gone(db, lab)


def test_command_prints_json_and_drops_its_lab(db, capsys):
    from labkit import Lab

    opened = []

    def open_lab():
        opened.append(Lab.open(db, f"t_horizon_cmd_{id(opened)}"))
        return opened[-1]

    assert hz.horizon_command(open_lab=open_lab, seconds=1, workers=1, json=True) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("claim_ms_p50_without", "claim_ms_p50_with", "claim_ms_p99_without", "claim_ms_p99_with",
                "buffers_per_claim_without", "buffers_per_claim_with", "dead_tuples_with",
                "horizon_held_by", "durability"):
        assert key in out
    assert out["horizon_held_by"].endswith(":report (idle in transaction)")
    assert list(out)[-2:] == ["without", "with"] and out["with"]["series"]     # the runs' JSON keys
    schema = opened[0].schema
    with db.connect() as conn:
        assert conn.execute("SELECT to_regnamespace(%s)", (schema,)).fetchone()[0] is None
    assert backends_gone(db, f"labkit:{schema}:%") == []


@pytest.mark.usefixtures("gc_paused")
def test_ctrl_c_mid_run_leaves_no_worker_report_or_session(lab, db):
    before = child_pids()
    sent: list[float] = []

    # Ctrl-C once the report holds the horizon
    watcher = interrupt_when(db.connect, returns_a_row(
        "SELECT 1 FROM pg_stat_activity WHERE application_name = %s AND state = 'idle in transaction'",
        (f"labkit:{lab.schema}:report",)), sent, poll_s=0.05)
    with pytest.raises(KeyboardInterrupt):
        hz.churn(lab, seconds=60, workers=2, hold_horizon=True)
    watcher.join(5)
    assert sent and time.monotonic() - sent[0] < 20
    assert child_pids() - before == set()
    _lab_sessions_gone(db, lab)


# -- a writer in another database of the same server --------------------------------------------


def _databases(db) -> set[str]:
    with db.connect() as conn:
        return {r[0] for r in conn.execute("SELECT datname FROM pg_database")}


def test_the_who_holds_query_names_the_reports_snapshot_and_its_database(lab):
    hz.create_queue(lab, 100)
    report = hz.open_report(lab, lasts_s=30)
    try:
        xmin = hz.snapshot_xmin(report)                     # the report's own snapshot
        lab.execute("SELECT pg_current_xact_id()")
        mine = [h for h in hz.who_holds_the_horizon(lab, limit=100) if h.pid == report.info.backend_pid]
        here = lab.execute("SELECT current_database()")[0][0]
        assert len(mine) == 1 and mine[0].backend_xmin == xmin and mine[0].backend_xid is None
        assert (mine[0].datname, mine[0].holds_back) == (here, "this database")
    finally:
        report.close()


def test_trace_horizon_other_database_json(db, capsys):
    """``labkit trace horizon --other-database --json``: a writer idle in a transaction in a
    throw-away database slows every claim of the lab's database as much as a report in it
    would, VACUUM VERBOSE reports nothing unremovable, and the who-holds query names the
    writer and its database; the database, the lab and every session are gone after."""
    from labkit import Lab

    before = child_pids()
    opened = []

    def open_lab():
        opened.append(Lab.open(db, f"t_horizon_other_{id(opened)}"))
        return opened[-1]

    assert hz.horizon_command(open_lab=open_lab, seconds=2, workers=2, other_database=True, json=True) == 0
    r = json.loads(capsys.readouterr().out)
    schema = opened[0].schema
    with db.connect() as conn:
        here = conn.execute("SELECT current_database()").fetchone()[0]
    assert r["holder_database"] == f"{schema[:57]}_other" != here and r["other_database_created"] is True
    assert r["claims_without"] > 100 and r["claims_with"] > 100
    # the claim walks every job done since the writer's transaction began ...
    assert r["buffers_per_claim_with"] > 10 * r["buffers_per_claim_without"]
    assert r["horizon_age_with"] >= r["claims_with"]
    # ... yet VACUUM in the lab's database ignores the writer and removes every dead version
    assert r["vacuum_unremovable_with"] == 0
    assert f"{r['dead_tuples_with']} removed" in r["vacuum_line_with"]
    assert r["dead_tuples_with"] == 2 * r["claims_with"]
    # the who-holds query names the writer, its database, and that every snapshot counts it
    [h] = r["holders"]
    assert (h["datname"], h["application_name"], h["state"], h["holds_back"]) == (
        r["holder_database"], f"labkit:{schema}:writer", "idle in transaction",
        "every snapshot on the server")
    # two horizons: a new snapshot here has the writer's id (or older) as its xmin, so the
    # claims walk; VACUUM's cutoff on the job table counts this database's sessions only and
    # is newer than the writer; on a shared catalog, every database's: the writer's again
    assert r["holder_xid"] == int(h["backend_xid"])
    assert not hz.xid_newer(r["claim_xmin_with"], r["holder_xid"])
    assert hz.xid_newer(r["vacuum_cutoff_with"], r["holder_xid"])
    assert r["shared_cutoff_with"] is None or not hz.xid_newer(r["shared_cutoff_with"], r["holder_xid"])
    assert h["backend_xid"] is not None and h["last_query"].startswith("INSERT INTO ledger")
    assert r["horizon_held_by"] == (f"labkit:{schema}:writer (idle in transaction) "
                                    f"in database {r['holder_database']}")
    # nothing left behind
    assert r["holder_database"] not in _databases(db)
    assert backends_gone(db, f"labkit:{schema}:%") == []
    with db.connect() as conn:
        assert conn.execute("SELECT to_regnamespace(%s)", (schema,)).fetchone()[0] is None
    assert child_pids() - before == set()


def test_an_existing_database_is_used_when_none_is_created_and_left_as_it_was(lab, db):
    existing = lab.execute(query("horizon.sql", "other_databases").sql)
    r = hz.horizon_trace(lab, seconds=1, workers=1, other_database=True, create_database=False)
    here = lab.execute("SELECT current_database()")[0][0]
    if not existing:        # the embedded server has no database but the lab's (and templates)
        assert r.holder_database is None and r.note.startswith("no other database")
        assert r.buffers_per_claim_with is None and r.claims_without > 0
        return
    assert r.holder_database == existing[0][0]
    assert r.other_database_created is False and r.holder_database not in (None, here)
    assert r.holder_database in _databases(db)             # an existing one: not dropped
    assert r.writer_statement == "SELECT pg_current_xact_id()"
    assert r.buffers_per_claim_with > 10 * r.buffers_per_claim_without
    assert r.vacuum_unremovable_with == 0
    [h] = r.holders
    assert (h.datname, h.holds_back) == (r.holder_database, "every snapshot on the server")
    assert hz.xid_newer(r.vacuum_cutoff_with, r.holder_xid)
    assert not hz.xid_newer(r.claim_xmin_with, r.holder_xid)
    _lab_sessions_gone(db, lab)
    assert backends_gone(db, f"labkit:{lab.schema}:{hz.WRITER_ROLE}") == []


def test_with_no_other_database_the_result_says_so(lab, monkeypatch):
    real = hz.query

    class NoDatabase:
        sql = "SELECT datname FROM pg_database WHERE false"

    monkeypatch.setattr(hz, "query", lambda f, n: NoDatabase() if n == "other_databases" else real(f, n))
    r = hz.horizon_trace(lab, seconds=1, workers=1, other_database=True, create_database=False)
    assert r.holder_database is None and r.note.startswith("no other database")
    assert r.buffers_per_claim_with is None and r.vacuum_unremovable_with is None
    assert r.with_ is None and r.as_dict()["with"] is None
    assert r.claims_without > 0                             # the run without still ran


def test_a_snapshot_in_another_database_holds_only_its_own(lab, db):
    """A reader's snapshot alone (no transaction id) in another database does not stop the
    claim's scan from marking entries dead; a transaction id there does."""
    claim = query("production.sql", "claim").sql
    complete = query("production.sql", "complete").sql
    readings = {}
    with hz.another_database(lab) as other:
        for kind in ("reader", "writer"):
            hz.create_queue(lab, 2000)
            lab.execute("VACUUM job")
            with db.connect(dbname=other.name) as conn:
                conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                conn.execute("SELECT count(*) FROM pg_class" if kind == "reader" else "SELECT pg_current_xact_id()")
                with lab.connect(role="churn") as w:
                    for _ in range(1000):
                        row = w.execute(claim, {"worker": "t", "lease_s": 60}).fetchone()
                        w.execute(complete, {"id": row[0], "claim_version": row[5]})
                readings[kind] = hz.claim_buffers(lab)
        name = other.name
    assert readings["writer"] > 10 * readings["reader"]
    assert name not in _databases(db)


@pytest.mark.usefixtures("gc_paused")
def test_ctrl_c_with_the_writer_open_drops_the_other_database(lab, db):
    before = child_pids()
    sent: list[float] = []
    watcher = interrupt_when(db.connect, returns_a_row(
        "SELECT 1 FROM pg_stat_activity WHERE application_name = %s AND state = 'idle in transaction'",
        (f"labkit:{lab.schema}:{hz.WRITER_ROLE}",)), sent, poll_s=0.05)
    with pytest.raises(KeyboardInterrupt):
        hz.horizon_trace(lab, seconds=3, workers=1, other_database=True)
    watcher.join(5)
    assert sent and time.monotonic() - sent[0] < 20
    assert hz.throwaway_name(lab) not in _databases(db)
    assert backends_gone(db, f"labkit:{lab.schema}:{hz.WRITER_ROLE}") == []
    assert child_pids() - before == set()
    _lab_sessions_gone(db, lab)


# -- the mechanism, drawn from a run: versions, entries and the horizon -------------------------


@pytest.mark.parametrize("kw, name", [
    ({"jobs": 2}, "jobs"), ({"jobs": 21}, "jobs"), ({"before": 0}, "before"), ({"after": 1.5}, "after"),
    ({"before": 5, "after": 5}, "before"), ({"timeout_s": 0}, "timeout_s"),
])
def test_the_scene_refuses_bad_parameters_before_touching_the_table(lab, kw, name):
    with pytest.raises(LabkitError) as err:
        hz.versions_scene(lab, **kw)
    assert name in str(err.value) and "Fix:" in str(err.value)
    assert lab.execute("SELECT to_regclass('job')")[0][0] is None


def test_the_versions_scene_counts_what_its_drawing_shows(lab, db):
    s = hz.versions_scene(lab, jobs=10, before=3, after=4)
    phases = [j.phase for j in s.jobs]
    assert phases == ["before"] * 3 + ["after"] * 4 + ["pending"] * 3      # the claim's order
    done = [j for j in s.jobs if j.phase != "pending"]
    assert all(s.fill_xid < j.claim_xid < j.complete_xid for j in done)
    # the horizon sits between the two phases: the report's snapshot came after the first
    assert max(j.complete_xid for j in done if j.phase == "before") < s.horizon
    assert s.horizon <= min(j.claim_xid for j in done if j.phase == "after")
    # two dead versions a job, split by the horizon exactly as VACUUM splits them
    assert (s.removable, s.kept) == (6, 8)
    assert (s.vacuum_held.removed, s.vacuum_held.not_yet_removable) == (6, 8)
    assert (s.vacuum_after.removed, s.vacuum_after.not_yet_removable) == (8, 0)
    # a claim reads one entry when every dead one is marked; with the report open, also each
    # entry whose version died after the horizon; the first claim after it ends marks them
    assert (s.skipped, s.walked_past) == (3, 4)
    assert s.read_clean == 1
    assert s.read_held == s.walked_past + 1 == 5
    assert (s.read_released, s.read_after) == (5, 1)
    assert backends_gone(db, f"labkit:{lab.schema}:{hz.SCENE_ROLE}") == []
    _lab_sessions_gone(db, lab)
    fig = hz.plot_versions(s)
    left, right = fig.axes
    assert [t.get_text() for t in left.get_yticklabels()] == [f"job {j.id}" for j in s.jobs]
    # the transactions evenly spaced, one tick each: the fill, then a claim and a completion
    # per done job; the dashed horizon between the last one before the report and the first
    # after it, its xid in the legend
    steps = 1 + 2 * 7
    assert list(right.get_xticks()) == list(range(steps))
    assert [t.get_text() for t in right.get_xticklabels()] == [str(i + 1) for i in range(steps)]
    [line] = [ln for ln in right.get_lines() if ln.get_linestyle() == "--"]
    assert list(line.get_xdata()) == [1 + 2 * 3 - 0.5] * 2
    # the report opens at the horizon and ends after the scene's last transaction: both marked
    [ended] = [ln for ln in right.get_lines() if ln.get_linestyle() == ":"]
    assert list(ended.get_xdata()) == [steps - 0.5] * 2
    marks = [t.get_text() for t in right.texts]
    assert marks == ["report opens: the horizon", "report ends"]
    # three versions a done job, one a pending one: each a line of its own
    assert len(right.get_lines()) == 3 * 7 + 3 + 2              # and the report's two marks
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "VACUUM may remove (6)" in labels[1] and "VACUUM must keep (8)" in labels[2]
    assert f"xid {s.horizon:,}" in labels[3] and labels[4].startswith("the report ends")
    assert "(4 a claim)" in labels[6]
    matplotlib.pyplot.close(fig)


# -- after the incident: the index keeps its size until REINDEX CONCURRENTLY ---------------------


@pytest.mark.parametrize("kw", [{"backlog": 0}, {"churn": -1}, {"batch": 0.5}, {"timeout_s": 601}])
def test_index_recovery_refuses_bad_parameters(lab, kw):
    with pytest.raises(LabkitError) as err:
        hz.index_recovery(lab, **kw)
    assert next(iter(kw)) in str(err.value) and "Fix:" in str(err.value)


def test_vacuum_keeps_the_index_size_and_reindex_concurrently_gives_it_back(lab, db):
    r = hz.index_recovery(lab, backlog=200, churn=10_000, batch=500)
    assert r.pages_held > 10 * r.pages_clean              # the incident grew the index
    assert r.buffers_held > 10 * r.buffers_clean
    assert r.vacuum.removed == 2 * 10_000 and r.vacuum.not_yet_removable == 0
    assert r.vacuum.remain == 200 + 10_000                # every job's live version, no dead one
    assert r.pages_vacuumed == r.pages_held               # VACUUM: the file keeps its size
    assert "newly deleted" in r.vacuum.index_line
    assert r.buffers_vacuumed < r.buffers_held / 10       # ... but the claim is quick again
    assert r.pages_reindexed <= r.pages_clean + 1         # REINDEX: the space comes back
    runs = r.reindex
    c = runs.concurrently_steps
    assert c["reindex"].waited and c["reindex"].blocked_by == ["W1"]   # it waits for the claim ...
    assert not c["W2 claim"].waited and c["W2 claim"].rows            # ... no claim waits for it
    p = runs.plain_steps
    assert p["W2 claim"].waited and p["W2 claim"].blocked_by == ["R"]  # a plain one blocks claims
    q = runs.plain_read_steps
    assert q["Q read"].waited and q["Q read"].blocked_by == ["R"]      # ... and a plain read
    # as pg_locks shows it: SHARE on the table (no writes), ACCESS EXCLUSIVE on the index; the
    # claim, an UPDATE, waits for the table's lock, the read for the index's (at planning)
    assert runs.plain_held == [("job", "ShareLock"), ("job_due_idx", "AccessExclusiveLock")]
    assert runs.plain_waits == {"W2 claim": [("job", "RowExclusiveLock")],
                                "Q read": [("job_due_idx", "AccessShareLock")]}
    # the rebuilt index's size is read after the concurrent rebuild, before the plain ones
    assert r.pages_reindexed == runs.pages_after_concurrently
    assert "REINDEX CONCURRENTLY" in str(runs.concurrently)
    assert backends_gone(db, f"labkit:{lab.schema}:W%") == []
    assert backends_gone(db, f"labkit:{lab.schema}:R") == []
    _lab_sessions_gone(db, lab)


def test_an_existing_database_comes_first_when_preferred(lab, db):
    existing = lab.execute(query("horizon.sql", "other_databases").sql)
    with hz.another_database(lab, prefer_existing=True) as other:
        name, created = other.name, other.created
    if existing:
        assert (name, created) == (existing[0][0], False)
        assert name in _databases(db)                      # left as it was
    else:                                                  # the embedded server: only the lab's
        assert (name, created) == (hz.throwaway_name(lab), True)
        assert name not in _databases(db)                  # dropped again


def test_a_run_someone_else_held_is_told_from_a_clean_one():
    def run(*ages):
        series = [_typed(hz.SeriesPoint, t=0.5 * (i + 1), horizon_age=a,
                         horizon_holder=None if a is None else f"someone (pid {i})")
                  for i, a in enumerate(ages)]
        return _typed(hz.HorizonRun, series=series)

    # None: no session but the workers held any; a few transactions: a statement in flight
    clean = run(3, 2, None, 4, None, 3, 2)
    assert hz.someone_else(clean) is None
    # someone held it early on only: its claims left entries no scan could mark, which the
    # claims after it read, so the run is not clean either
    early = run(1500, 1700, 3, 4, 2, 3, 2)
    assert hz.someone_else(early) == "someone (pid 1), 1,700 transactions back at 1 s"
    # ... nor one held late in the run
    assert hz.someone_else(run(3, 2, 3, 4, 2, 400, 650)) == "someone (pid 6), 650 transactions back at 3.5 s"


def test_a_snapshot_someone_else_holds_early_in_the_run_without_a_holder_is_noticed(lab, db):
    """A real session that is none of the lab's holds a snapshot in the lab's database for the
    first third of the run with no long transaction, and ends long before its last third:
    the lab does not take that run as its baseline, runs it again, and names the session."""
    import threading

    from labkit.core.db import Guards

    seconds = 6
    name = f"someone else {os.getpid()}"
    other = db.connect(application_name=name, guards=Guards(idle_in_transaction="60s"))
    ended: list[float] = []

    def end_it_a_third_of_the_way_in():
        # the run has begun once a worker has run a claim: a state the server shows
        with db.connect() as watch:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not watch.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE application_name LIKE %s "
                    "AND query LIKE 'UPDATE job%%'",
                    (f"labkit:{lab.schema}:{hz.WORKER_ROLE}%",)).fetchone():
                time.sleep(0.005)
        time.sleep(seconds / 3)
        other.close()
        ended.append(time.monotonic())

    try:
        other.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        other.execute("SELECT 1")                   # its snapshot, held while it sits idle
        pid = other.info.backend_pid
        for _ in range(hz.FOREIGN_AGE + 50):        # older than FOREIGN_AGE from the start
            lab.execute("SELECT pg_current_xact_id()")
        closer = threading.Thread(target=end_it_a_third_of_the_way_in, daemon=True)
        closer.start()
        r = hz.horizon_trace(lab, seconds=seconds, workers=1)
        closer.join(10)
    finally:
        other.close()
    assert ended, "the other session was never ended"
    here = lab.execute("SELECT current_database()")[0][0]
    run = r.without
    # the first run was held and set aside, the session named as the lab saw it
    assert run.runs >= 2 and run.set_aside, hz.baseline_note(r)
    assert run.set_aside[0].startswith(f"{name} (pid {pid}, idle in transaction) in database {here}, ")
    # the run kept was clean, and the note says so, and what it took
    assert run.someone_else is None and r.baseline_held_by is None
    assert all(p.horizon_age is None or p.horizon_age <= hz.FOREIGN_AGE for p in run.series)
    note = hz.baseline_note(r)
    assert note.startswith("the run with no long transaction was clean") and name in note
    _lab_sessions_gone(db, lab)


def test_the_baseline_note_says_whether_the_run_without_a_holder_was_clean():
    def trace(runs, set_aside, held_by):
        without = _typed(hz.HorizonRun, runs=runs, set_aside=set_aside, someone_else=held_by,
                         series=[_typed(hz.SeriesPoint)] * 7)
        return _result(without=without, baseline_held_by=held_by)

    assert hz.baseline_note(trace(1, [], None)) == (
        "the run with no long transaction was clean: no other session held the claim's horizon "
        f"more than {hz.FOREIGN_AGE} transactions back in any of its 7 samples")
    again = hz.baseline_note(trace(2, ["x (pid 9, idle in transaction) in database d, 900 "
                                       "transactions back at 0.5 s"], None))
    assert again.endswith("(it took 2 runs: someone else held the horizon in the run before it, "
                          "x (pid 9, idle in transaction) in database d, 900 transactions back "
                          "at 0.5 s)")
    held = hz.baseline_note(trace(3, ["a", "b"], "c (pid 7, active) in database d, 300 "
                                                 "transactions back at 2 s"))
    assert held == ("the run with no long transaction is not a clean baseline: another session "
                    "held the claim's horizon back in each of its 3 runs, in the last c (pid 7, "
                    "active) in database d, 300 transactions back at 2 s; its figures include the "
                    "walk that hold caused")


# -- the printed tables ------------------------------------------------------------------------


def _typed(cls, **kw):
    """A ``cls`` with the fields given, and None in every other."""
    return cls(**{**{f.name: None for f in dataclasses.fields(cls)}, **kw})


def _result(**kw):
    return _typed(hz.HorizonTrace, **kw)


def test_the_runs_table_prints_counts_as_whole_numbers():
    r = _result(claims_without=8323, claims_with=4657, claim_ms_p50_without=0.497,
                claim_ms_p50_with=0.874, claim_ms_p99_with=11.9996, buffers_per_claim_without=40.0,
                buffers_per_claim_with=4049.5, select_ms_without=0.0895, select_ms_with=1.0325,
                unremovable_without=0, unremovable_with=9314)
    t = hz.runs_table(r, "report idle in transaction")
    assert list(t.columns) == ["no long transaction", "report idle in transaction"]
    assert list(t.index) == list(hz.FIGURES)
    assert t.loc["claims"].tolist() == ["8,323", "4,657"]
    assert t.loc["unremovable"].tolist() == ["0", "9,314"]
    assert t.loc["buffers_per_claim"].tolist() == ["40", "4,050"]       # a median: whole buffers
    assert t.loc["claim_ms_p50"].tolist() == ["0.497", "0.874"]
    assert t.loc["claim_ms_p99"].tolist() == ["-", "12.000"]      # "-": a figure a run has not
    assert t.loc["select_ms"].tolist() == ["0.089", "1.032"]
    assert all(len(ln) <= 96 for ln in t.to_string().splitlines())


def test_the_two_horizons_table_puts_the_report_and_the_writer_side_by_side():
    report = _result(holder_xid=1000, claim_xmin_with=1787, vacuum_cutoff_with=1000,
                     shared_cutoff_with=1000, buffers_per_claim_with=4049.5, unremovable_with=9314)
    writer = _result(holder_xid=12000, claim_xmin_with=12000, vacuum_cutoff_with=20107,
                     shared_cutoff_with=None, buffers_per_claim_with=3551, unremovable_with=0)
    t = hz.two_horizons(report, writer)
    assert list(t.columns) == ["report here", "writer elsewhere"]
    assert list(t.index) == [label for _, label in hz.HORIZONS + hz.HELD + hz.HORIZON_COSTS]
    assert t.loc["the holder's xmin or xid"].tolist() == ["1,000", "12,000"]
    assert t.loc["removable cutoff: job"].tolist() == ["1,000", "20,107"]
    assert t.loc["a new snapshot's xmin here"].tolist() == ["1,787", "12,000"]
    assert t.loc["removable cutoff: pg_database"].tolist() == ["1,000", "-"]
    # whether the holder held each horizon, said in words: nobody compares the xids by eye
    assert t.loc["the holder holds a new snapshot's xmin"].tolist() == ["no", "yes"]
    assert t.loc["the holder holds job's cutoff"].tolist() == ["yes", "no"]
    assert t.loc["the holder holds pg_database's cutoff"].tolist() == ["yes", "-"]
    assert hz.horizons_held(report) == hz.HorizonsHeld(snapshot_xmin=False, job_cutoff=True,
                                                       shared_cutoff=True)
    assert hz.horizons_held(writer).as_dict() == {"snapshot_xmin": True, "job_cutoff": False,
                                                  "shared_cutoff": None}
    # past the wrap, a cutoff that is numerically smaller is still newer: it is not held
    wrapped = _result(holder_xid=2**32 - 10, claim_xmin_with=5, vacuum_cutoff_with=2**32 - 10,
                      shared_cutoff_with=None)
    assert hz.horizons_held(wrapped) == hz.HorizonsHeld(False, True, None)
    assert t.loc["buffers one claim reads, median"].tolist() == ["4,050", "3,551"]
    assert t.loc["VACUUM kept on job"].tolist() == ["9,314", "0"]
    assert all(len(ln) <= 96 for ln in t.to_string().splitlines())


def test_xids_compare_as_the_server_compares_them():
    assert hz.xid_newer(5, 4) and not hz.xid_newer(4, 5) and not hz.xid_newer(7, 7)
    assert hz.xid_newer(3, 2**32 - 10)                  # past the wrap, still newer
    assert not hz.xid_newer(2**32 - 10, 3)
