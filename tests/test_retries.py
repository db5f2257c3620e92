"""A handler that fails: retries with backoff, the dead letter, and the fence on the failure write."""

import json

import pytest
from conftest import backends_gone
from test_text import words_by_column

from labkit.core.errors import LabkitError
from labkit.core.queries import query
from labkit.core.text import TEXT_WIDTH
from labkit.labs import retries as rt

REAP = ("UPDATE job SET status = 'PENDING', claimed_by = NULL, lease_until = NULL "
        "WHERE status = 'RUNNING' AND lease_until < lab_now() RETURNING id")


def expected_life(script, *, max_attempts, base_s, cap_s):
    """What the rules say, worked out without the database: (job, attempt, claimed at,
    error_is, status, wait) for every attempt, in the order the worker takes them."""
    due = {j: 0.0 for j in script}
    attempts = {j: 0 for j in script}
    out = []
    while due:
        now = min(due.values())
        for j in sorted(k for k, t in due.items() if t == now):
            attempts[j] += 1
            n = attempts[j]
            outcome = rt.outcome_of(script[j], n)
            make = rt.OUTCOMES[outcome]
            if make is None:
                out.append((j, n, now, None, "DONE", None))
                del due[j]
                continue
            kind = rt.classify(make())
            if kind == "transient" and n < max_attempts:
                wait = min(cap_s, base_s * 2 ** (n - 1))
                out.append((j, n, now, kind, "PENDING", wait))
                due[j] = now + wait
            else:
                out.append((j, n, now, kind, "DEAD", None))
                del due[j]
    return out


def seen(life):
    return [(a.job, a.attempt, float(a.claimed_at[2:-2]), a.error_is and a.error_is.split()[0],
             a.status, a.wait_s) for a in life.attempts]


def test_the_life_table_is_what_the_rules_say(lab):
    life = rt.job_life(lab)
    assert seen(life) == expected_life(rt.DEFAULT_SCRIPT, max_attempts=4, base_s=2, cap_s=6)
    # the story in the notebook's words: offsets 2, 4, then 6 (8 capped) for the job that dies
    job3 = [(a.claimed_at, a.next) for a in life.attempts if a.job == 3]
    assert job3 == [("T+0 s", "+2 s"), ("T+2 s", "+4 s"), ("T+6 s", "+6 s"), ("T+12 s", "DEAD")]
    assert [a.next for a in life.attempts if a.job == 1] == ["+2 s", "+4 s", "DONE"]
    assert [a.error_is for a in life.attempts if a.job == 4] == ["transient (unclassified)", None]
    final = {j.job: (j.status, j.attempts, j.claim_version, j.effects) for j in life.jobs}
    assert final == {1: ("DONE", 3, 3, 1), 2: ("DEAD", 1, 1, 0), 3: ("DEAD", 4, 4, 0), 4: ("DONE", 2, 2, 1)}
    # the failed attempts' effects were rolled back with the handler's transaction
    assert lab.execute("SELECT job_id, attempt FROM job_effect ORDER BY job_id") == [(1, 3), (4, 2)]
    assert life.summary().dead == [2, 3] and life.trace.summary["clock_at_end"] == "T+12 s"
    assert sum(1 for s in life.trace.steps if s.actor == "worker 1") == len(life.attempts) == 10


def test_the_same_run_prints_the_same_text(lab):
    life = rt.job_life(lab)
    first = life.to_text()
    assert rt.job_life(lab).to_text() == first
    # the tables fit the page: a long error wraps inside its own column, every word in order
    assert max(map(len, first.splitlines())) <= TEXT_WIDTH
    errors = words_by_column(first.split("\n\n")[1])[rt.Life.ATTEMPT_COLUMNS.index("error")]
    assert errors == " ".join(a.error or "-" for a in life.attempts).split()
    a = rt.job_life(lab, jitter="full", seed=5)
    assert rt.job_life(lab, jitter="full", seed=5).to_text() == a.to_text()
    assert rt.job_life(lab, jitter="full", seed=6).to_text() != a.to_text()


def test_full_jitter_waits_within_the_exponential_window(lab):
    life = rt.job_life(lab, jitter="full", seed=1, max_attempts=6, base_s=1, cap_s=30)
    waits = [(a.attempt, a.wait_s) for a in life.attempts if a.status == "PENDING"]
    assert waits and all(0 <= w < min(30, 2 ** (n - 1)) for n, w in waits)
    assert {j.job: j.status for j in life.jobs} == {1: "DONE", 2: "DEAD", 3: "DEAD", 4: "DONE"}


def test_the_claim_is_production_claim_on_the_lab_clock():
    ours = query("retries.sql", "claim").sql
    theirs = query("production.sql", "claim").sql
    assert "now()" in theirs and ours == theirs.replace("now()", "lab_now()")


def test_permanent_goes_dead_after_one_attempt_whatever_max_attempts(lab):
    life = rt.job_life(lab, script={1: ["invalid", "ok"], 2: ["rejected", "ok"]}, max_attempts=10)
    assert [(a.job, a.attempt, a.status, a.next) for a in life.attempts] == [
        (1, 1, "DEAD", "DEAD"), (2, 1, "DEAD", "DEAD")]
    rows = lab.execute("SELECT id, status, attempts, run_at = enqueued_at, finished_at IS NOT NULL, "
                       "last_error FROM job ORDER BY id")
    assert rows == [(1, "DEAD", 1, True, True, "ValidationError: amount must be > 0, got -5"),
                    (2, "DEAD", 1, True, True, "PermanentError: card declined: account closed")]


def test_the_dead_letter_keeps_the_last_error(lab):
    life = rt.job_life(lab, script={1: ["timeout", "bug", "throttled"]}, max_attempts=3, base_s=1, cap_s=10)
    assert [(a.status, a.next) for a in life.attempts] == [
        ("PENDING", "+1 s"), ("PENDING", "+2 s"), ("DEAD", "DEAD")]
    assert life.jobs[0].last_error == "TransientError: 429 Too Many Requests"
    assert lab.execute("SELECT status, attempts, last_error, claimed_by, lease_until FROM job") == [
        ("DEAD", 3, "TransientError: 429 Too Many Requests", None, None)]


def test_a_failure_write_with_a_stale_claim_version_matches_no_row(lab):
    clock = rt.install(lab)
    (jid,) = rt.enqueue(lab, 1)
    c1, c2 = lab.connect(role="retry-w1"), lab.connect(role="retry-w2")
    w1 = rt.RetryWorker(c1, "worker 1", lease_s=10)
    w2 = rt.RetryWorker(c2, "worker 2", lease_s=10)
    zombie = w1.claim()
    assert (zombie.id, zombie.claim_version) == (jid, 1)
    clock.advance(11)                              # worker 1's lease runs out...
    assert lab.execute(REAP) == [(jid,)]           # ...the reaper hands the job back
    owner = w2.claim()
    assert owner.claim_version == 2
    late = w1.fail(zombie, TimeoutError("no answer in 5 s"))
    assert late == rt.Failed(jid, False, delay_s=2.0)
    assert lab.execute("SELECT status, claimed_by, claim_version, last_error FROM job") == [
        ("RUNNING", "worker 2", 2, None)]
    assert not w1.complete(zombie)                  # the stale complete is fenced off too
    got = w2.fail(owner, TimeoutError("no answer in 5 s"))
    assert (got.matched, got.status, got.attempts, got.wait_s, got.delay_s) == (True, "PENDING", 2, 4.0, 4.0)
    # a stale attempt's handler writes roll back with its lost complete
    assert w1.run(zombie, rt.scripted_handler({jid: ["ok"]})).status == "LOST"
    assert lab.execute("SELECT count(*) FROM job_effect") == [(0,)]


def test_a_retry_is_not_claimed_before_its_run_at(lab):
    s = rt.retry_waits(lab, base_s=4, early_s=1).summary
    assert s == {"backoff_s": 4.0, "first_advance_s": 3, "claimed_early": None, "due_in_s_then": 1.0,
                 "claimed_at_run_at": 1, "attempt_then": 2}
    assert lab.execute("SELECT status, attempts FROM job") == [("DONE", 2)]


def test_without_jitter_every_wave_of_retries_arrives_at_once(lab):
    rows = rt.retry_herd(lab, jobs=20, failures=3, base_s=2, cap_s=60, seed=0)
    flat = {(r.jitter, r.attempt): r for r in rows}
    for n, at in ((1, 0), (2, 2), (3, 6), (4, 14)):
        r = flat[("none", n)]
        assert (r.claims, r.first_at, r.spread_s, r.busiest_second) == (20, at, 0, 20)
    assert flat[("full", 1)].busiest_second == 20              # the outage itself hits at once
    for n in (2, 3, 4):
        r = flat[("full", n)]
        assert r.claims == 20 and r.busiest_second < 20 and r.spread_s > 0
    assert flat[("full", 4)].busiest_second < flat[("full", 2)].busiest_second


def test_classify_maps_the_handlers_exceptions():
    assert rt.classify(TimeoutError()) == "transient"
    assert rt.classify(ConnectionResetError()) == "transient"
    assert rt.classify(rt.ValidationError("x")) == "permanent"
    assert rt.classify(rt.PermanentError("x")) == "permanent"
    assert rt.classify(KeyError("x")) == "transient" and not rt.classified(KeyError("x"))

    class Odd(rt.PermanentError, TimeoutError):
        pass

    assert rt.classify(Odd()) == "permanent"     # the explicit class wins
    assert rt.backoff(1) == 2 and rt.backoff(3) == 6 and rt.backoff(3, cap_s=100) == 8
    assert rt.describe(["timeout", "timeout", "ok"]) == "timeout ×2, then ok"


@pytest.mark.parametrize("kw, words", [
    ({"max_attempts": 0}, "max_attempts >= 1"),
    ({"max_attempts": 2.5}, "max_attempts="),
    ({"base_s": -1}, "base_s > 0"),
    ({"base_s": 0}, "base_s > 0"),
    ({"base_s": 4, "cap_s": 2}, "cap_s >= base_s"),
    ({"cap_s": float("inf")}, "cap_s="),
    ({"jitter": "equal"}, "jitter='none'"),
    ({"seed": -1}, "seed="),
    ({"script": {1: []}}, "script="),
    ({"script": {2: ["ok"]}}, "script="),
    ({"script": {1: ["explode"]}}, "script="),
    ({"script": ["ok"]}, "script="),
])
def test_bad_parameters_name_the_fix_before_any_table_is_made(lab, kw, words):
    with pytest.raises(LabkitError) as err:
        rt.job_life(lab, **kw)
    assert "Fix:" in str(err.value) and words in err.value.fix
    assert lab.execute("SELECT to_regclass('job')") == [(None,)]


def test_the_command_checks_first_prints_and_drops_its_lab(db, lab, capsys):
    opened = []

    def open_lab():
        opened.append(lab)
        return lab

    with pytest.raises(LabkitError):
        rt.life_command(open_lab=open_lab, cap_s=1)
    assert opened == []
    assert rt.life_command(open_lab=open_lab, json=True) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["summary"]["dead"] == [2, 3] and len(out["attempts"]) == 10
    with db.connect() as conn:
        assert conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s",
                            (lab.schema,)).fetchone() == (0,)
    assert backends_gone(db, f"labkit:{lab.schema}:retry-%") == []
