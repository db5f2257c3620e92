"""labkit torture: seeded crash runs whose invariants are read back from the database.

The property tests draw seeds with hypothesis (few examples: each is a real run of
worker processes that are killed).  The other tests show that the checks are not
vacuous: a relay that commits before publishing loses events and the torture says so;
a stale completion is counted without the fence and refused with it; a corrupted
job table is caught.
"""

import json

import pytest
from conftest import child_processes
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from labkit import cli
from labkit.core.errors import LabkitError
from labkit.labs import drain as dr
from labkit.tools import torture as tt

SEEDS = st.integers(min_value=0, max_value=2**31 - 1)
FEW = settings(max_examples=2, deadline=None, derandomize=True, phases=[Phase.generate],
               suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _assert_report_shape(rep: tt.TortureReport, kills: int):
    doc = json.loads(rep.to_json())
    for key in ("kills", "lost", "duplicates", "duplicate_bound", "stale_writes", "invariants_hold"):
        assert key in doc
    assert "events" in doc or "jobs" in doc
    assert doc["kills"] == kills and sum(doc["kill_kinds"].values()) == kills
    assert not rep.stopped_early
    assert rep.invariants_hold, rep.verdicts() + "\n" + rep.figures()
    assert rep.lost == 0 and rep.duplicates <= rep.duplicate_bound
    assert child_processes(zombies=False) == []


@FEW
@given(seed=SEEDS)
def test_relay_loses_nothing_and_duplicates_only_what_was_in_flight(lab, seed):
    rep = tt.torture(lab, "relay", kills=4, seed=seed, items=60)
    _assert_report_shape(rep, 4)
    assert rep.details["distinct_events"] == rep.items


@FEW
@given(seed=SEEDS)
def test_fenced_drain_never_pushes_after_terminal_and_writes_nothing_stale(lab, seed):
    rep = tt.torture(lab, "drain", kills=4, seed=seed, items=60)
    _assert_report_shape(rep, 4)
    assert rep.stale_writes == 0 and rep.fence is True
    assert rep.details["terminal_overwritten"] == 0
    doc = rep.to_dict()                      # the poison rows (ids 11, 37) died at their limit
    assert doc["poison_rows"] == len(tt.DRAIN_POISON) and doc["poison_dead_lettered"] == doc["poison_rows"]
    assert rep.details["poison_pushed"] == 0 and rep.crashes_on_their_own > 0


def test_the_unfenced_drain_breaks_the_zero_stale_writes_invariant(capsys):
    # seed 1 plans stalls: each stalled drain wakes up as a zombie and writes by id only
    assert "stall" in {k.kind for k in tt.plan("drain", 8, 1, 2, 5)}
    assert cli.main(["torture", "drain", "--no-fence", "--kills", "8", "--seed", "1", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["invariants_hold"] is False and doc["fence"] is False and doc["stale_writes"] > 0
    assert doc["invariants"]["zero stale writes (the fence's promise)"] is False
    assert doc["lost"] == 0 and doc["poison_dead_lettered"] == doc["poison_rows"] > 0


@FEW
@given(seed=SEEDS)
def test_queue_with_reaper_completes_or_dead_letters_every_job(lab, seed):
    rep = tt.torture(lab, "queue", kills=4, seed=seed, items=60, max_attempts=3)
    _assert_report_shape(rep, 4)
    assert rep.details["max_attempts_seen"] <= 3
    assert rep.details["poison_job"]["status"] == "DEAD"


def test_the_kill_plan_is_fixed_by_the_seed():
    a = tt.plan("drain", 30, 7, 2, 5)
    assert a == tt.plan("drain", 30, 7, 2, 5)
    assert a != tt.plan("drain", 30, 8, 2, 5)
    assert {k.kind for k in a} == set(tt.KINDS["drain"])
    assert all(0 <= k.victim < 2 and 1 <= k.after <= 10 for k in a)


def test_the_dual_write_relay_is_caught_losing_events(lab):
    # seed 1 plans four SIGKILLs; each lands mid-publish of a batch committed already
    kinds = [k.kind for k in tt.plan("relay", 6, 1, 2, 10)]
    assert kinds.count("sigkill") >= 4
    rep = tt.torture(lab, "relay", kills=6, seed=1, items=60, relay_order="commit-first")
    assert rep.lost > 0
    assert not rep.invariants["every event reached the broker (none lost)"]
    assert not rep.invariants_hold and "BROKEN" in rep.verdicts()


def _zombie_write(lab, fence: bool) -> dict:
    """One stale completion, scripted: the checks must count it (or the fence refuse it)."""
    clock = dr.create_ledger(lab, 0)
    lab.execute(tt.DRAIN_AUDIT)
    lab.execute(tt.DRAIN_FILL, {"first": 1, "last": 1, "poison": []})
    zombie = dr.make_drain(lab, "zombie", batch=1, fence=fence)
    live = dr.make_drain(lab, "live", batch=1, fence=fence)
    try:
        for d in (zombie, live):
            d.conn.execute("SELECT set_config('torture.worker', %s, false)", (d.name,))
        (old,) = zombie.claim()
        clock.advance(dr.LEASE_S + 1)
        (new,) = live.claim()
        live.complete(new, live.sender.send(new))
        zombie.complete(old, dr.Outcome("retry", "timeout"))
    finally:
        dr.close_drain(zombie)
        dr.close_drain(live)
    return tt.drain_counts(lab)


def test_a_stale_completion_is_counted_without_the_fence_and_refused_with_it(lab):
    unfenced = _zombie_write(lab, fence=False)
    assert unfenced["stale_writes"] == 1 and unfenced["terminal_overwritten"] == 1
    fenced = _zombie_write(lab, fence=True)
    assert fenced["stale_writes"] == 0 and fenced["terminal_overwritten"] == 0


def test_queue_checks_catch_a_corrupted_table(lab):
    rep = tt.torture(lab, "queue", kills=1, seed=5, items=40)
    assert rep.invariants_hold
    clean = tt.queue_counts(lab, 5)
    lab.execute("INSERT INTO job (id, status, created_at, attempts) VALUES (999999, 'DONE', now(), 0)")
    lab.execute("UPDATE job SET attempts = 9 WHERE id = 1")
    bad = tt.queue_counts(lab, 5)
    assert bad["done_never_ran"] == clean["done_never_ran"] + 1
    assert bad["max_attempts_seen"] == 9


def test_command_line_prints_the_json_report(capsys):
    assert cli.main(["torture", "queue", "--kills", "2", "--seed", "4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kills"] == 2 and doc["jobs"] > 0 and doc["invariants_hold"] is True
    assert cli.main(["torture", "relay", "--kills", "1", "--workers", "0"]) == 2
    assert "Fix:" in capsys.readouterr().err


def test_bad_torture_parameters_name_the_fix(lab):
    for kw, word in [({"kills": -1}, "kills"), ({"workers": 0}, "workers"),
                     ({"batch": 0}, "batch"), ({"batch": 50, "items": 10}, "larger than the table"),
                     ({"max_seconds": -5}, "max_seconds"), ({"job_ms": -1}, "negative"),
                     ({"seed": "x"}, "seed")]:
        with pytest.raises(LabkitError, match=word) as err:
            tt.torture(lab, "queue", **kw)
        assert "Fix:" in str(err.value)
    with pytest.raises(LabkitError, match="No torture dialect"):
        tt.torture(lab, "mailbox")
