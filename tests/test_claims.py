"""Claim-mark-commit, the held-open mistake, the reaper, idempotent effects, ordering:
all against the real server, crashes by SIGKILL."""

import subprocess
import sys

import pytest

import labkit as lk
from labkit.core.errors import LabkitError
from labkit.labs import claims


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
        assert claims.job_row(lab, 1).as_dict() == {"status": "PENDING", "worker": None,
                                                    "claimed_at_set": False, "attempts": 1}
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
        assert claims.job_row(lab, 1).status == "PENDING"   # nothing durable says "claimed"
    finally:
        w.kill()
    claims.backend_gone(lab, w)
    again = claims.start_worker(lab, "next", effects=("log",), max_claims=1)
    again.join(60)
    assert claims.effect_counts(lab)[1].log == 2           # the job ran twice
    # The durable claim: the dead worker's job stays IN_PROGRESS, owned and dated.
    w = claims.start_worker(lab, "cmc", effects=("log",), pause_after=1)
    try:
        w.wait_for("paused", timeout=60)
    finally:
        w.kill()
    claims.backend_gone(lab, w)
    assert claims.job_row(lab, 2) == claims.JobRow("IN_PROGRESS", "cmc", claimed_at_set=True)
    nxt = claims.start_worker(lab, "next2", effects=("log",), max_claims=1)
    nxt.join(60)
    assert claims.job_row(lab, 3).worker == "next2"          # the next worker skips job 2
    assert claims.effect_counts(lab)[2].log == 1


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
    assert claims.effect_counts(lab) == {1: claims.JobEffects(log=2, once=1)}
    assert claims.effect_counts(lab)[1].as_dict() == {"log": 2, "once": 1}
    assert claims.job_row(lab, 1).status == "DONE"


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
    assert out.jobs == 60 and sorted(out.order) == list(range(1, 61))
    assert out.key_inversions == 0 and out.in_flight_max == 1
    # the same jobs with the plain claim: one customer's jobs run side by side
    # (jobs long enough that the three workers' first claims surely overlap)
    plain = claims.ordering_run(lab, jobs=30, workers=3, customers=2, job_ms=20, per_key=False)
    assert plain.in_flight_max is not None and plain.in_flight_max > 1


def test_partial_index_keeps_the_search_short_over_history(lab):
    claims.make_queue(lab, pending=20, done=20_000, index=True)
    with_idx = claims.plan_of(lab, claims.CLAIM_SQL, {"batch": 1, "worker_id": "x"}, analyze=True)
    claims.make_queue(lab, pending=20, done=20_000, index=False)
    without = claims.plan_of(lab, claims.CLAIM_SQL, {"batch": 1, "worker_id": "x"}, analyze=True)
    assert "job_pending_created_idx" in with_idx.indexes and "Seq Scan" in without.nodes
    assert with_idx.search_buffers * 10 < without.search_buffers
    assert with_idx.ms is not None and with_idx.buffers >= with_idx.search_buffers
    # archiving the history makes even the index-less claim short again
    assert claims.archive_done(lab) <= 2
    archived = claims.plan_of(lab, claims.CLAIM_SQL, {"batch": 1, "worker_id": "x"}, analyze=True)
    assert archived.search_buffers * 10 < without.search_buffers
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
    out = subprocess.run([sys.executable, "-m", "labkit", "bench-history", "--ladder", "0,2000", "--claims", "40",
                          "--claims-without-index", "20"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "claims/s" in out.stdout and "after archiving" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "labkit", "bench-history", "--ladder", "x"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2


# -- what the partial index, per-key claims, partitions and VACUUM really do -------------------

def test_mass_update_leaves_dead_entries_in_the_partial_index_until_vacuum(lab):
    r = claims.churn_readings(lab, pending=20_000, done=19_900)
    # the first claim visits every dead version, the next only walks the entries the
    # first one marked dead, and VACUUM removes them
    assert r.buffers_after_update > 2 * r.buffers_at_next_claim, r
    assert r.buffers_at_next_claim > 3 * r.buffers_after_vacuum, r
    assert r.buffers_after_vacuum < 30, r
    assert r.index_pages_after_update >= r.index_pages_before   # no entry went away


def _two_claimers(lab, sql_text):
    """A claims in a transaction it keeps open; B claims twice meanwhile."""
    with lk.Sessions(lab, "A", "B") as run:
        a = run.A("BEGIN; " + claims.inline(sql_text, worker_id="A"))
        b1 = run.B(claims.inline(sql_text, worker_id="B"))
        b2 = run.B(claims.inline(sql_text, worker_id="B"))
        run.A("COMMIT")
    return a.rows, b1.rows, b2.rows


def test_racy_per_key_recipe_runs_two_jobs_of_one_customer_the_right_one_does_not(lab):
    claims.keyed_queue(lab, ["c1", "c1", "c2", "c2"])
    a, b1, b2 = _two_claimers(lab, claims.PER_KEY_RACY_SQL)
    assert (a, b1) == ([(1,)], [(2,)])          # jobs 1 and 2 of c1 at once
    assert b2 == [(3,)]
    claims.keyed_queue(lab, ["c1", "c1", "c2", "c2"])
    a, b1, b2 = _two_claimers(lab, claims.PER_KEY_SQL)
    assert (a, b1, b2) == ([(1,)], [(3,)], [])  # c1's job 2 waits for job 1's DONE


def test_a_dead_job_holds_its_customer_until_someone_handles_it(lab):
    claims.keyed_queue(lab, ["c1", "c1", "c2", "c2"], leases=True)
    with lab.connect(role="w") as w:
        assert claims.claim_per_key(w, "w") == [1]
        later = lab.execute("SELECT now() + interval '1 hour'")[0][0]
        assert claims.reap(lab, lease="1 minute", max_attempts=1, as_of=later) == [(1, "DEAD", 1)]
        assert claims.claim_per_key(w, "w") == [3]
        claims.finish(w, "w", [3])
        assert claims.claim_per_key(w, "w") == [4]
        claims.finish(w, "w", [4])
        assert claims.claim_per_key(w, "w") == []          # job 2 waits behind DEAD job 1
        lab.execute("UPDATE job SET status = 'PENDING', attempts = 0 WHERE id = 1")   # re-queued
        assert claims.claim_per_key(w, "w") == [1]
        claims.finish(w, "w", [1])
        assert claims.claim_per_key(w, "w") == [2]


def _wait_then_commit(lab):
    with lk.Sessions(lab, "A", "B") as run:
        a = run.A("BEGIN; SELECT id FROM job WHERE status = 'PENDING' ORDER BY created_at "
                  "LIMIT 1 FOR UPDATE")
        run.A("UPDATE job SET status = 'IN_PROGRESS' WHERE id = 1")
        b = run.B("BEGIN; SELECT id FROM job WHERE status = 'PENDING' ORDER BY created_at "
                  "LIMIT 1 FOR UPDATE")
        waited = b.waited
        run.A("COMMIT")
    return a, b, waited


def test_status_partitions_fail_a_waiting_claim_month_partitions_recheck(lab):
    claims.partitioned_queue(lab, "status")
    a, b, waited = _wait_then_commit(lab)
    assert a.rows == [(1,)] and waited
    assert b.error is not None and b.error.sqlstate == "40001"
    assert "moved to another partition" in b.error.message
    claims.partitioned_queue(lab, "month")
    a, b, waited = _wait_then_commit(lab)
    assert a.rows == [(1,)] and waited and b.error is None and b.rows == [(2,)]
    with pytest.raises(LabkitError, match="partition layout"):
        claims.partitioned_queue(lab, "day")


def test_plain_vacuum_gives_back_an_empty_tail_not_empty_pages_in_the_middle(lab):
    tail = claims.vacuum_truncation(lab, rows=8_000, where="tail")
    assert tail.pages_after_delete == tail.pages_before
    assert tail.pages_after_vacuum <= tail.pages_before // 2 + 2
    middle = claims.vacuum_truncation(lab, rows=8_000, where="middle")
    assert middle.pages_after_vacuum == middle.pages_before
    with pytest.raises(LabkitError, match="tail"):
        claims.vacuum_truncation(lab, where="head")


def test_serial_per_key_order_interleaves_each_customers_running_sum():
    # equal jobs: customers finish their k-th jobs together, in id order
    assert claims.serial_per_key_order(6, 2, job_ms=10, jitter=0) == [1, 2, 3, 4, 5, 6]
    order = claims.serial_per_key_order(120, 3, job_ms=20, jitter=0.8)
    assert sorted(order) == list(range(1, 121))
    assert claims.inversions(order) > 0
    key = {i: (i - 1) % 3 for i in range(1, 121)}
    assert claims.inversions(order, key) == 0        # each customer stays in order


def test_inline_quotes_values_and_names_missing_ones():
    assert claims.inline("SELECT %(w)s, 100%%", w="it's") == "SELECT 'it''s', 100%"
    with pytest.raises(LabkitError, match="no parameter"):
        claims.inline("SELECT 1", w="x")
    with pytest.raises(LabkitError, match="no value"):
        claims.inline("SELECT %(a)s, %(b)s", a=1)


def test_history_ladder_reports_a_flat_search_with_the_index(lab):
    rows = claims.history_ladder(lab, (0, 5_000), claims=20, claims_without_index=10, rounds=2)
    pages = {(r.done_rows, r.partial_index): r.search_pages for r in rows}
    assert pages[(5_000, True)] <= pages[(0, True)] + 2
    work = {(r.done_rows, r.partial_index): r.claim_buffers for r in rows}
    assert work[(5_000, True)] <= work[(0, True)] + 5 < work[(5_000, False)]
    assert pages[(5_000, False)] > 10 * pages[(5_000, True)]
    assert all(r.claims_per_s > 0 for r in rows)
    # as a table, each field under its label, in order
    assert list(rows[0].as_dict()) == ["done rows", "partial index", "claims/s", "search pages",
                                       "claim buffers", "table pages", "pkey pages"]
    assert rows[0].as_dict(only=["claims/s", "done_rows"]) == {"claims/s": rows[0].claims_per_s,
                                                              "done rows": 0}


def test_wait_for_horizon_names_an_older_transaction_and_returns_once_it_ends(lab):
    lab.create_jobs(1)
    with lab.connect(role="old", autocommit=False) as old:
        old.execute("UPDATE job SET payload = 'x' WHERE id = 1")   # holds a transaction id
        pid = old.info.backend_pid
        with pytest.raises(LabkitError, match=rf"pid {pid}\b"):
            claims.wait_for_horizon(lab, timeout=0.3)
        old.rollback()
        claims.wait_for_horizon(lab, timeout=10)
