"""The convoy experiment, on the real server: short runs, shapes with honest tolerances.

Throughput bounds are loose on purpose (2 cores, other test runs at the same time);
the benchmark (`labkit convoy --check`) holds the tight goals.
"""

import json
import os
import random
import threading
import time

import pytest
from conftest import backends_gone, press_ctrl_c

from labkit import cli
from labkit.core import load
from labkit.core.errors import LabkitError
from labkit.core.lab import schema_name
from labkit.core.text import TEXT_WIDTH
from labkit.labs import convoy

D_MS = 20


def _done_by_worker(lab):
    return lab.execute("SELECT worker_id, count(*) FROM job WHERE status = 'DONE' GROUP BY 1 ORDER BY 1")


@pytest.mark.parametrize("kwargs, word", [
    ({"workers": 0}, "workers"),
    ({"workers": -3}, "workers"),
    ({"job_ms": -5}, "job duration"),
    ({"job_ms": 0}, "job duration"),
    ({"seconds": 0}, "positive duration"),
    ({"policy": "maybe"}, "policy"),
    ({"seconds": None, "backlog": 0}, "backlog"),
])
def test_bad_parameters_name_the_fix(lab, kwargs, word):
    args = {"policy": "skip", "workers": 2, "job_ms": D_MS, "seconds": 0.2, **kwargs}
    with pytest.raises(LabkitError, match=word) as info:
        convoy.run(lab, args.pop("policy"), **args)
    assert "Fix:" in str(info.value)


def test_the_model():
    assert convoy.model_jobs_per_s("wait", 16, 20) == pytest.approx(50)
    assert convoy.model_jobs_per_s("nowait", 16, 20) == pytest.approx(50)
    assert convoy.model_jobs_per_s("skip", 16, 20) == pytest.approx(800)
    assert convoy.model_jobs_per_s("wait", 16, 20, hold=False) == pytest.approx(800)
    assert convoy.model_makespan_s("wait", 4, 10, 40) == pytest.approx(0.4)
    assert convoy.model_makespan_s("skip", 4, 10, 41) == pytest.approx(0.11)


def test_the_claim_is_the_policy_clause_on_one_query(lab):
    texts = {p: convoy.claim_sql(p).as_string(lab.admin) for p in convoy.POLICIES}
    assert texts["wait"].rstrip().endswith("FOR UPDATE")
    assert texts["nowait"].endswith("FOR UPDATE NOWAIT")
    assert texts["skip"].endswith("FOR UPDATE SKIP LOCKED")
    assert len({t.replace("NOWAIT", "").replace("SKIP LOCKED", "").strip() for t in texts.values()}) == 1


def test_skip_locked_runs_workers_in_parallel_and_claims_each_job_once(lab, db):
    r = convoy.run(lab, "skip", 4, D_MS, 0.6)
    row = r.row()
    # every claimed job was claimed by exactly one worker, and the table agrees with the events
    jobs = [c.job for c in r.claims]
    assert len(jobs) == len(set(jobs))
    in_db = dict(_done_by_worker(lab))
    assert sum(in_db.values()) == len(jobs)
    assert set(in_db) == {f"w{w}" for w in range(4)}
    # four workers really worked at once, and nobody waited for a lock
    assert row["busy_workers"] > 2.8
    assert row["efficiency"] > 0.6
    assert row["claim_wait_p50_ms"] < D_MS / 2
    assert row["errors"] == 0
    # the workers' connections are closed after the run
    assert backends_gone(db, f"labkit:{lab.schema}:convoy-w%") == []


def test_wait_is_a_convoy_one_lock_holder_at_a_time(lab):
    r = convoy.run(lab, "wait", 4, D_MS, 0.6)
    row = r.row()
    assert 0.5 < row["efficiency"] < 1.2
    assert row["busy_workers"] < 1.2
    # lock-holding intervals follow one another. The times are the clients' (a thread may
    # note its commit a little late on a loaded machine), so allow a small overlap in all;
    # with SKIP LOCKED, 4 workers would overlap for about three quarters of the time.
    holds = sorted((c.claimed, c.released) for c in r.claims)
    overlap = sum(max(0.0, a_end - b_start) for (_, a_end), (b_start, _) in zip(holds, holds[1:]))
    held = sum(end - start for start, end in holds)
    assert overlap < 0.10 * held
    # somebody waited for a whole job at least
    assert row["claim_wait_max_ms"] > D_MS


def test_nowait_tight_loop_makes_an_error_storm_that_backoff_calms(lab):
    tight = convoy.run(lab, "nowait", 4, D_MS, 0.6).row()
    calm = convoy.run(lab, "nowait", 4, D_MS, 0.6, backoff=True).row()
    assert tight["busy_workers"] < 1.2 and 0.4 < tight["efficiency"] < 1.2
    assert tight["errors_per_job"] > 5                       # many errors for each job done
    assert calm["errors_per_job"] < tight["errors_per_job"] / 3
    assert tight["variant"] == "hold, tight" and calm["variant"] == "hold, backoff"


def test_a_backoff_pause_doubles_its_ceiling_up_to_the_cap():
    """After the k-th NOWAIT error in a row a worker sleeps a random time up to
    min(cap, base·2^k): 1 ms after the first, never more than the cap."""
    pause = convoy._Backoff(True, base_ms=1.0, cap_ms=20.0)
    rng = random.Random(2026)
    first = [pause.pause_s(rng, 0) for _ in range(500)]
    fourth = [pause.pause_s(rng, 3) for _ in range(500)]
    late = [pause.pause_s(rng, 12) for _ in range(500)]
    assert all(0 <= s <= 0.001 for s in first)
    assert 0.004 < max(fourth) <= 0.008
    assert all(0 <= s <= 0.020 for s in late) and max(late) > 0.015


def test_claim_mark_commit_lets_even_the_wait_policy_scale(lab):
    def both():
        held = convoy.run(lab, "wait", 4, D_MS, 0.5).row()
        short = convoy.run(lab, "wait", 4, D_MS, 0.5, hold=False)
        return held, short

    def scales(held, short):
        row = short.row()
        return (row["jobs_per_s"] > 2 * held["jobs_per_s"] and row["busy_workers"] > 2.5,
                f"{held['jobs_per_s']:.0f} jobs/s holding the lock, {row['jobs_per_s']:.0f} not, "
                f"{row['busy_workers']:.1f} workers busy")

    held, short = both()
    holds, seen = scales(held, short)
    load.shape(holds, "4 workers that release the lock before the job do over twice the jobs, "
               "with over 2.5 of them busy", measured=seen, again=lambda: scales(*both()))
    # the lock was released before the job ran: the whole of d lies after each release (how
    # short the hold is depends on the commit's flush, which a slow disk stretches)
    assert short.claims and all(c.done - c.released >= D_MS / 1e3 for c in short.claims)
    assert all(c.released >= c.claimed for c in short.claims)
    assert lab.execute("SELECT count(*) FROM job WHERE status = 'IN_PROGRESS'")[0][0] == 0


def test_draining_a_backlog(lab):
    skip = convoy.run(lab, "skip", 4, 10, None, backlog=24)
    assert lab.execute("SELECT count(*) FROM job WHERE status <> 'DONE'") == [(0,)]
    assert sorted(c.job for c in skip.claims) == list(range(1, 25))
    wait = convoy.run(lab, "wait", 4, 10, None, backlog=24)
    assert lab.execute("SELECT count(*) FROM job WHERE status <> 'DONE'") == [(0,)]
    s, w = skip.row(), wait.row()
    assert s["model_makespan_s"] == pytest.approx(0.06) and w["model_makespan_s"] == pytest.approx(0.24)
    assert w["makespan_s"] >= 0.24 * 0.95          # one job at a time: never faster than M·d
    assert s["makespan_s"] < w["makespan_s"] / 2


def test_sweep_is_tidy(lab):
    df = convoy.sweep(lab, workers=[1, 2], policies=["wait", "skip"], job_ms=D_MS, seconds=0.3)
    assert list(df.columns) == convoy.COLUMNS
    assert list(zip(df.policy, df.workers)) == [("wait", 1), ("wait", 2), ("skip", 1), ("skip", 2)]
    assert (df.model_jobs_per_s.tolist() == [50, 50, 50, 100])
    assert (df.jobs > 0).all() and df.efficiency.between(0.3, 1.2).all()
    lines = convoy.table(df).splitlines()
    rule = next(i for i, line in enumerate(lines) if set(line) <= set("- "))
    assert lines[0].split()[:2] == ["policy", "workers"] and max(map(len, lines)) <= TEXT_WIDTH
    assert [line.split()[:2] for line in lines[rule + 1:]] == [["wait", "1"], ["wait", "2"],
                                                               ["skip", "1"], ["skip", "2"]]


def test_command_line_json_csv_and_plot(tmp_path, capsys, db):
    png = tmp_path / "convoy.png"
    rc = cli.main(["convoy", "--workers", "1,3", "--policies", "nowait,skip", "--seconds", "0.3", "--format", "json",
                      "--no-progress", "--plot", str(png)])
    out = capsys.readouterr()
    assert rc == 0, out.err
    rows = json.loads(out.out)
    assert [(r["policy"], r["workers"]) for r in rows] == [("nowait", 1), ("nowait", 3), ("skip", 1), ("skip", 3)]
    for key in ["policy", "workers", "jobs_per_s", "model_jobs_per_s", "efficiency", "claim_wait_p50_ms",
                "claim_wait_p99_ms", "errors_per_s"]:
        assert all(key in r for r in rows)
    assert rows[1]["errors_per_s"] > 0 and rows[0]["errors_per_s"] == 0
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    # the CLI's lab schema is gone afterwards
    with db.connect() as conn:
        left = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname = %s",
                            (schema_name(f"convoy_cli_{os.getpid()}"),)).fetchall()
    assert left == []

    rc = cli.main(["convoy", "--workers", "2", "--policies", "skip", "--seconds", "0.2", "--format", "csv", "--no-progress"])
    out = capsys.readouterr().out.splitlines()
    assert rc == 0 and out[0].startswith("policy,workers,variant") and len(out) == 2


def test_command_line_rejects_bad_input(capsys):
    with pytest.raises(SystemExit):
        cli.main(["convoy", "--policies", "wait,sometimes"])
    assert cli.main(["convoy", "--workers", "0", "--seconds", "0.2", "--no-progress"]) == 2
    assert "Fix:" in capsys.readouterr().err


@pytest.mark.usefixtures("gc_paused")
def test_keyboard_interrupt_stops_and_joins_every_worker(lab, db):
    before = {t.name for t in threading.enumerate()}
    timer = threading.Timer(0.4, press_ctrl_c)
    timer.start()
    t0 = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        convoy.run(lab, "wait", 6, 50, 30.0)
    assert time.perf_counter() - t0 < 10              # not the 30 s the run asked for
    timer.join()
    assert not [t for t in threading.enumerate() if t.name.startswith("convoy-w") and t.name not in before]
    assert backends_gone(db, f"labkit:{lab.schema}:convoy-w%") == []
    # no row lock is left behind
    head = lab.execute("SELECT min(id) FROM job WHERE status = 'PENDING'")
    assert lab.execute("SELECT id FROM job WHERE status = 'PENDING' ORDER BY id LIMIT 1 FOR UPDATE NOWAIT") == head


def test_reference_sweep_is_recorded_with_the_model_columns():
    ref = convoy.load_reference()
    assert {"policy", "workers", "jobs_per_s", "model_jobs_per_s", "efficiency"} <= set(ref.columns)
    assert set(ref.policy) == {"wait", "nowait", "skip"}
    assert sorted(set(ref.workers)) == [1, 2, 4, 8, 16, 32]


def test_check_goals_passes_and_fails():
    import pandas as pd

    good = pd.DataFrame({"policy": ["skip", "wait"], "workers": [4, 4], "efficiency": [0.9, 1.05]})
    assert all(ok for _, ok in convoy.check_goals(good, 30.0))
    bad = pd.DataFrame({"policy": ["skip", "nowait"], "workers": [16, 32], "efficiency": [0.8, 0.7]})
    assert [ok for _, ok in convoy.check_goals(bad, 50.0)] == [False, False, False]


def test_a_wait_still_open_at_the_end_is_counted_as_censored(lab):
    # Four workers want one row for 0.5 s and each holds it for 0.3 s: the first holds it from
    # the start, the second gets it at about 0.3 s (a finished wait of about 300 ms), and the
    # other two are still waiting when the window closes at 0.5 s, about 500 ms after they
    # asked.  The longest waits are cut off by the window, so the p99 is only a lower bound.
    # (With a job shorter than the window, a finished wait can be as long as a cut-off one,
    # and which is longer turns on scheduling: this shape leaves 200 ms between them.)
    row = convoy.run(lab, "wait", workers=4, job_ms=300, seconds=0.5).row()
    assert row["claim_wait_censored"] >= 1            # someone is left waiting
    assert row["claim_wait_p99_censored"]            # and its p99 is only a lower bound
    assert row["claim_wait_max_ms"] <= 500 + 1       # no wait can be measured past the run's end

    def free_run():
        # SKIP LOCKED waits for no lock, so the p99 is a finished wait; only a claim the machine
        # descheduled just as the window closed can be cut off there (a loaded machine: again)
        free = convoy.run(lab, "skip", workers=3, job_ms=20, seconds=0.3).row()
        return (not free["claim_wait_p99_censored"],
                f"{free['claim_wait_censored']} cut off, max {free['claim_wait_max_ms']:.0f} ms")

    holds, seen = free_run()
    load.shape(holds, "with SKIP LOCKED the p99 wait is a finished one", measured=seen, again=free_run)


def test_queue_positions_count_who_was_already_waiting(lab):
    r = convoy.run(lab, "wait", workers=5, job_ms=20, seconds=0.4)
    q = convoy.queue_positions(r)
    open_asks = sum(1 for log in r.logs if log.open_ask is not None and log.open_ask < r.seconds)
    assert len(q) == len(r.claims) + open_asks and q["censored"].sum() == open_asks
    assert q["position"].between(0, 4).all() and q["position"].max() >= 2   # a line formed
    assert (q["fifo_ms"] == (q["position"] + 0.5) * 20).all()
    assert (q["wait_ms"] >= 0).all()


def test_commit_delay_really_lengthens_the_commits_and_is_reset(lab):
    if lab.execute("SHOW fsync")[0][0] != "on" or not lab.execute(
            "SELECT rolsuper FROM pg_roles WHERE rolname = current_user")[0][0]:
        with pytest.raises(LabkitError):
            convoy.run(lab, "wait", workers=2, job_ms=5, seconds=0.2, hold=False, commit_delay_ms=5)
        return
    with convoy.WorkerPool(lab) as pool:
        slow = convoy.run(lab, "wait", workers=2, job_ms=5, seconds=0.4, hold=False, pool=pool,
                          commit_delay_ms=8)
        held = sorted((c.released - c.claimed) * 1e3 for c in slow.claims)
        # the row lock lasts through the delayed commit: a commit that has to flush its own WAL
        # sleeps first; one whose record another session's flush already covered does not
        # (that is the group commit the delay is for), so the median, not every claim, is over 8
        assert held and held[len(held) // 2] >= 8
        assert slow.row()["variant"] == "no-hold, commit_delay 8 ms"
        assert {c.execute("SHOW commit_delay").fetchone()[0] for c in pool.conns} == {"0"}
        fast = convoy.run(lab, "wait", workers=2, job_ms=5, seconds=0.4, hold=False, pool=pool)
        assert min((c.released - c.claimed) * 1e3 for c in fast.claims) < 8


def test_commit_cost_is_measured_both_ways_on_this_server(lab):
    cost = convoy.commit_cost_ms(lab, commits=50)
    assert cost.fsync == lab.execute("SHOW fsync")[0][0]
    assert cost.synchronous_commit_on_ms > 0 and cost.synchronous_commit_off_ms > 0
    assert cost.flush_ms == pytest.approx(cost.synchronous_commit_on_ms - cost.synchronous_commit_off_ms)
    assert list(cost.as_dict()) == ["fsync", "synchronous_commit", "synchronous_commit_on_ms",
                                    "synchronous_commit_off_ms", "flush_ms"]
