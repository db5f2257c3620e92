"""Claim-mark-commit, the held-open mistake, the reaper, idempotent effects, ordering:
all against the real server, crashes by SIGKILL."""

import subprocess
import sys

import pytest

from labkit import claims
from labkit.errors import LabkitError


def test_claim_mark_commit_hands_out_disjoint_jobs_and_holds_no_lock(lab):
    lab.create_jobs(5)
    with lab.connect(role="a") as a, lab.connect(role="b") as b:
        got_a = claims.claim(a, "a", batch=2)
        got_b = claims.claim(b, "b", batch=2)
        assert got_a == [1, 2] and got_b == [3, 4]
        # committed: no row lock is left, yet the rows say who claimed them and when
        assert lab.execute("SELECT id FROM job WHERE id IN (1, 2) FOR UPDATE NOWAIT") == [(1,), (2,)]
        assert lab.execute("SELECT DISTINCT status, worker_id, claimed_at IS NOT NULL FROM job "
                           "WHERE id IN (1, 2)") == [("IN_PROGRESS", "a", True)]
        # only the owner can record the terminal state
        assert claims.finish(b, "b", got_a) == []
        assert claims.finish(a, "a", got_a) == [1, 2]
    assert lab.execute("SELECT count(*) FROM job WHERE status = 'DONE'") == [(2,)]


def test_reaper_requeues_expired_claims_and_dead_letters_repeat_offenders(lab):
    lab.create_jobs(3)
    claims.add_leases(lab)
    with lab.connect(role="w") as w:
        claims.claim(w, "w", batch=2)                      # jobs 1 and 2, claimed now
        assert claims.reap(lab, lease="1 minute") == []    # within the lease: untouched
        later = lab.execute("SELECT now() + interval '2 minutes'")[0][0]
        assert sorted(claims.reap(lab, lease="1 minute", as_of=later)) == [
            (1, "PENDING", 1), (2, "PENDING", 1)]
        assert claims.job_row(lab, 1) == {"status": "PENDING", "worker": None,
                                          "claimed_at set": False, "attempts": 1}
        # job 1 keeps dying: the third expired claim sends it to DEAD
        for attempt in (2, 3):
            lab.execute("UPDATE job SET status = 'PENDING' WHERE id <> 1")
            assert claims.claim(w, "w", batch=1) == [1]
            lab.execute("UPDATE job SET status = 'DONE' WHERE id <> 1")
            later = lab.execute("SELECT now() + interval '2 minutes'")[0][0]
            assert claims.reap(lab, lease="1 minute", max_attempts=3, as_of=later) == [
                (1, "DEAD" if attempt == 3 else "PENDING", attempt)]
        assert claims.claim(w, "w", batch=5) == []         # a DEAD job is never claimed again


def test_held_open_crash_reruns_the_job_claim_mark_commit_keeps_the_claim(lab):
    lab.create_jobs(3)
    claims.add_effects(lab)
    # The mistake: the worker dies holding its transaction, after the job's effect.
    w = claims.start_worker(lab, "held", style="hold_open", effects=("log",), pause_after=1)
    try:
        w.wait_for("paused", timeout=60)
        assert claims.job_row(lab, 1)["status"] == "PENDING"   # nothing durable says "claimed"
    finally:
        w.kill()
    claims.backend_gone(lab, w)
    again = claims.start_worker(lab, "next", effects=("log",), max_claims=1)
    again.join(60)
    assert claims.effect_counts(lab)[1]["log"] == 2           # the job ran twice
    # The durable claim: the dead worker's job stays IN_PROGRESS, owned and dated.
    w = claims.start_worker(lab, "cmc", effects=("log",), pause_after=1)
    try:
        w.wait_for("paused", timeout=60)
    finally:
        w.kill()
    claims.backend_gone(lab, w)
    assert claims.job_row(lab, 2) == {"status": "IN_PROGRESS", "worker": "cmc", "claimed_at set": True}
    nxt = claims.start_worker(lab, "next2", effects=("log",), max_claims=1)
    nxt.join(60)
    assert claims.job_row(lab, 3)["worker"] == "next2"          # the next worker skips job 2
    assert claims.effect_counts(lab)[2]["log"] == 1


def test_poison_job_kills_its_workers_until_it_is_dead_lettered(lab):
    lab.create_jobs(1)
    claims.add_leases(lab)
    statuses = []
    for i in range(3):
        w = claims.start_worker(lab, f"p{i}", poison=(1,))
        assert claims.wait_exit(w) == -9                                 # it really crashed
        claims.backend_gone(lab, w)
        later = lab.execute("SELECT now() + interval '1 hour'")[0][0]
        statuses.append(claims.reap(lab, lease="5 minutes", max_attempts=3, as_of=later))
    assert statuses == [[(1, "PENDING", 1)], [(1, "PENDING", 2)], [(1, "DEAD", 3)]]


def test_idempotent_effect_absorbs_the_rerun_a_plain_one_doubles(lab):
    lab.create_jobs(1)
    claims.add_leases(lab)
    claims.add_effects(lab)
    w = claims.start_worker(lab, "first", effects=("log", "once"), pause_after=1)
    try:
        w.wait_for("paused", timeout=60)
    finally:
        w.kill()
    claims.backend_gone(lab, w)
    later = lab.execute("SELECT now() + interval '1 hour'")[0][0]
    assert claims.reap(lab, as_of=later) == [(1, "PENDING", 1)]
    claims.start_worker(lab, "second", effects=("log", "once")).join(60)
    assert claims.effect_counts(lab) == {1: {"log": 2, "once": 1}}
    assert claims.job_row(lab, 1)["status"] == "DONE"


def test_batches_amortise_round_trips(lab):
    one = claims.drain(lab, jobs=400, workers=2, batch=1)
    hundred = claims.drain(lab, jobs=400, workers=2, batch=100)
    assert one.jobs == hundred.jobs == 400
    # Honest bound on a busy 2-core machine: batching must help, by any margin.
    assert hundred.jobs_per_s > one.jobs_per_s


def test_inversions_count_pairs_out_of_order():
    assert claims.inversions([1, 2, 3]) == 0
    assert claims.inversions([3, 2, 1]) == 3
    assert claims.inversions([2, 1, 4, 3], key={1: "a", 2: "b", 3: "a", 4: "a"}) == 1


def test_per_key_claims_keep_each_customers_order(lab):
    out = claims.ordering_run(lab, jobs=60, workers=3, customers=4, job_ms=3)
    assert out["jobs"] == 60
    assert out["key_inversions"] == 0 and out["in_flight_max"] == 1
    # the same jobs with the plain claim: one customer's jobs run side by side
    # (jobs long enough that the three workers' first claims surely overlap)
    plain = claims.ordering_run(lab, jobs=30, workers=3, customers=2, job_ms=20, per_key=False)
    assert plain["in_flight_max"] > 1


def test_partial_index_keeps_the_search_short_over_history(lab):
    claims.make_queue(lab, pending=20, done=20_000, index=True)
    with_idx = claims.plan_of(lab, claims.CLAIM_SQL, {"batch": 1, "worker_id": "x"}, analyze=True)
    claims.make_queue(lab, pending=20, done=20_000, index=False)
    without = claims.plan_of(lab, claims.CLAIM_SQL, {"batch": 1, "worker_id": "x"}, analyze=True)
    assert "job_pending_created_idx" in with_idx["indexes"] and "Seq Scan" in without["nodes"]
    assert with_idx["search_buffers"] * 10 < without["search_buffers"]
    # archiving the history makes even the index-less claim short again
    assert claims.archive_done(lab) <= 2
    archived = claims.plan_of(lab, claims.CLAIM_SQL, {"batch": 1, "worker_id": "x"}, analyze=True)
    assert archived["search_buffers"] * 10 < without["search_buffers"]
    assert lab.execute("SELECT count(*) FROM job_archive") == [(20_000,)]


def test_bad_parameters_name_the_fix(lab):
    lab.create_jobs(1)
    with pytest.raises(LabkitError, match="workers"):
        claims.run_workers(lab, 0)
    with pytest.raises(LabkitError, match="batch"):
        claims.start_worker(lab, "x", batch=0)
    with pytest.raises(LabkitError, match="job_ms"):
        claims.start_worker(lab, "x", job_ms=-5)
    with pytest.raises(LabkitError, match="claim style"):
        claims.start_worker(lab, "x", style="yolo")
    with pytest.raises(LabkitError, match="effect"):
        claims.start_worker(lab, "x", effects=("email",))
    with pytest.raises(LabkitError, match="max_attempts"):
        claims.reap(lab, max_attempts=0)


def test_bench_history_command_prints_figures():
    out = subprocess.run([sys.executable, "-m", "labkit.claims", "--ladder", "0,2000", "--claims", "40",
                          "--claims-without-index", "20"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "claims/s" in out.stdout and "after archiving" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "labkit.claims", "--ladder", "x"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
