"""Scheduled and prioritised jobs on the production job table (notebook 11), on a real server."""

import json
import os
import re

import pytest

from labkit import Lab
from labkit.core.errors import LabkitError
from labkit.core.queries import query
from labkit.labs import schedule as sc


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _has_job_table(lab) -> bool:
    return lab.execute("SELECT to_regclass('job') IS NOT NULL")[0][0]


def test_the_lab_claims_with_production_claim_on_its_own_clock():
    claim = _flat(query("production.sql", "claim").sql)
    assert _flat(query("schedule.sql", "claim_search").sql) in claim
    assert _flat(query("schedule.sql", "claim_at").sql) == claim.replace("now()", "%(now)s")
    assert _flat(query("schedule.sql", "claim_search_read").sql) + " FOR UPDATE SKIP LOCKED" == \
        _flat(query("schedule.sql", "claim_search").sql).rstrip(";").replace(" ;", "")
    oldest = _flat(query("schedule.sql", "claim_oldest").sql)
    assert oldest == _flat(query("schedule.sql", "claim_at").sql).replace(
        "ORDER BY priority, run_at", "ORDER BY run_at, id")


def test_with_the_index_the_claim_reads_its_front_without_it_the_whole_table(lab):
    p = sc.plans(lab)                       # the notebook's sizes: 200,000 finished, 1,000 pending
    w, wo = p.with_index, p.without_index
    assert w.nodes[-1] == "Index Scan" and w.index == "job_due_idx"
    assert "LockRows" in w.nodes and "Sort" not in w.nodes
    assert "Seq Scan" in wo.nodes and "Sort" in wo.nodes and wo.index is None
    assert wo.buffers >= p.table_pages > 1000           # every page, history included
    assert wo.rows_removed >= p.history
    assert wo.buffers >= 10 * w.buffers and p.buffer_ratio >= 10
    assert p.due == 800                                    # one pending job in five is scheduled
    assert "Index Scan using job_due_idx on job" in w.text and "Seq Scan on job" in wo.text
    # FOR UPDATE keeps the partial index's predicate as a Filter; the plain search has none
    r = p.without_lock
    assert "Filter: (status = 'PENDING'::text)" in w.text
    assert r.index == "job_due_idx" and "LockRows" not in r.nodes and "Filter" not in r.text
    # the rolled-back DROP INDEX left the index in place
    assert lab.execute("SELECT to_regclass('job_due_idx') IS NOT NULL")[0][0]
    assert sc.explain_claim(lab).index == "job_due_idx"


def test_future_jobs_at_more_urgent_priorities_are_walked_past(lab):
    a = sc.scheduled_ahead(lab, future=50_000, levels=(1, 1_000))
    one, many = a.ahead
    for row in (one, many):
        assert row.index == "job_due_idx" and row.nodes[-1] == "Index Scan"
    # spread over many priority levels, the future rows are read even by a skip scan
    assert many.buffers >= 10 * a.baseline.buffers and many.walk_ratio >= 10
    assert many.buffers >= many.index_pages // 2
    if a.skip_scan:
        # PostgreSQL 18: one level of future rows is jumped over with a second descent
        assert one.index_searches >= 2 and one.buffers * 5 < many.buffers
    else:
        assert one.index_searches is None and one.walk_ratio >= 10


def test_strict_priority_never_claims_the_low_job(lab):
    s = sc.starvation(lab, ticks=60, high_per_tick=3, claims_per_tick=3, remedy=None)
    assert s.waited_ticks is None and s.starved and s.low_claim is None
    assert s.claims == 60 * 3 and s.claimed_by_kind == {"high": 179, "low": 0, "scheduled": 1}
    assert s.bound_ticks is None and s.aged_turns == 0 and s.backlog_at_end >= 1
    assert [c.kind for c in s.claimed_sample] == ["high"] * 12
    assert [c.job for c in s.claimed_sample[:3]] == [1, 2, 3]
    assert "ORDER BY priority, run_at" in s.claim_sql and s.index_sql is None


@pytest.mark.parametrize("high, claims, every", [(3, 3, 4), (5, 3, 4), (1, 1, 4), (3, 3, 10)])
def test_the_aged_turn_claims_the_low_job_within_its_bound(lab, high, claims, every):
    s = sc.starvation(lab, ticks=60, high_per_tick=high, claims_per_tick=claims, remedy="aging",
                      every=every)
    assert s.older_due == high                 # tick 0's urgent jobs arrived before it
    assert s.bound_claims == every * (high + 1)
    assert s.waited_ticks is not None and 0 <= s.waited_ticks <= s.bound_ticks
    assert s.low_claim.turn == "aged" and s.low_claim.claim <= s.bound_claims
    assert s.claimed_by_kind["low"] == 1
    assert s.aged_turns == s.claims // every
    assert "ORDER BY run_at, id" in s.claim_sql and "job_oldest_idx" in s.index_sql


def test_the_aged_turn_bound_is_met_exactly_when_the_turn_comes_last(lab):
    # one claim a tick, an aged turn every 4th: the 4th claim (tick 3) is the first aged turn,
    # and by then the one older urgent job is gone: the low job goes then, not before
    s = sc.starvation(lab, ticks=20, high_per_tick=1, claims_per_tick=1, remedy="aging", every=4)
    assert s.waited_ticks == 3 and s.low_claim.claim == 4


def test_a_scheduled_job_is_not_claimed_before_its_time(lab):
    for remedy in (None, "aging"):
        s = sc.starvation(lab, ticks=30, remedy=remedy, scheduled_tick=12)
        sched = s.scheduled
        assert sched.claimed_tick == sched.due_tick == 12    # the top priority: at once, not before
        assert sched.claimed_s >= sched.due_s
    # the claim itself, one second before run_at and at run_at
    sc.fresh_table(lab)
    run_at = sc._at(5)
    lab.execute(query("schedule.sql", "enqueue_at").sql,
                {"kind": "scheduled", "priority": 0, "n": 1, "tick": 0, "at": sc._at(0), "run_at": run_at})
    claim = query("schedule.sql", "claim_at").sql
    args = {"worker": "w1", "lease_s": 60}
    assert lab.execute(claim, {**args, "now": sc._at(4, 59)}) == []
    (row,) = lab.execute(claim, {**args, "now": run_at})
    assert row[1] == "scheduled"


def test_the_aged_turn_reads_its_own_index(lab):
    sc.fresh_table(lab)
    lab.execute(query("schedule.sql", "oldest_index").sql)
    lab.execute(query("schedule.sql", "fill_history").sql, {"n": 20_000})
    lab.execute(query("schedule.sql", "fill_pending").sql, {"n": 1_000})
    lab.execute("VACUUM ANALYZE job")
    conn = lab.admin
    now = lab.execute("SELECT now()")[0][0]
    with conn.transaction(force_rollback=True):
        doc = conn.execute("EXPLAIN (FORMAT JSON) " + query("schedule.sql", "claim_oldest").sql,
                           {"worker": "w1", "now": now, "lease_s": 60}).fetchone()[0]
    plan = json.dumps(doc)
    assert '"Index Name": "job_oldest_idx"' in plan and "Seq Scan" not in plan


@pytest.mark.parametrize("call, name", [
    (lambda lab: sc.plans(lab, history=-1), "history"),
    (lambda lab: sc.plans(lab, pending=0), "pending"),
    (lambda lab: sc.plans(lab, history=1.5), "history"),
    (lambda lab: sc.scheduled_ahead(lab, future=0), "future"),
    (lambda lab: sc.scheduled_ahead(lab, levels=()), "levels"),
    (lambda lab: sc.scheduled_ahead(lab, levels=(1, 100_000)), "levels"),
    (lambda lab: sc.starvation(lab, remedy="fifo"), "remedy"),
    (lambda lab: sc.starvation(lab, ticks=1), "ticks"),
    (lambda lab: sc.starvation(lab, claims_per_tick=0), "claims_per_tick"),
    (lambda lab: sc.starvation(lab, high_per_tick=51), "high_per_tick"),
    (lambda lab: sc.starvation(lab, remedy="aging", every=1), "every"),
    (lambda lab: sc.starvation(lab, ticks=10, scheduled_tick=10), "scheduled_tick"),
    (lambda lab: sc.starvation(lab, ticks=10_000, claims_per_tick=50), "claims_per_tick"),
])
def test_bad_parameters_are_refused_before_any_work(lab, call, name):
    with pytest.raises(LabkitError) as err:
        call(lab)
    assert name in str(err.value) and err.value.fix and "pass " in err.value.fix
    assert not _has_job_table(lab)


def test_the_command_prints_json_and_drops_its_lab(db, capsys):
    made = []

    def open_lab():
        made.append(Lab.open(db, f"t_schedule_cmd_{os.getpid()}"))
        return made[-1]

    assert sc.schedule_command(open_lab=open_lab, history=20_000, pending=500, future=5_000, ticks=20,
                               json=True) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["plans"]["with_index"]["index"] == "job_due_idx"
    strict, aged = out["starvation"]
    assert strict["starved"] and aged["waited_ticks"] <= aged["bound_ticks"]
    with db.connect() as conn:
        assert conn.execute("SELECT to_regnamespace(%s) IS NULL", (made[0].schema,)).fetchone()[0]
    assert sc.schedule_command(open_lab=open_lab, history=20_000, pending=500, future=5_000,
                               ticks=20) == 0
    text = capsys.readouterr().out
    assert "strict priority" in text and "never claimed (starved)" in text


def test_the_command_checks_its_parameters_before_opening_a_lab():
    def open_lab():
        raise AssertionError("the lab was opened before the parameters were checked")

    for kw in ({"history": -5}, {"future": 0}, {"ticks": 1}, {"every": 0}, {"claims_per_tick": 99}):
        with pytest.raises(LabkitError):
            sc.schedule_command(open_lab=open_lab, **kw)
