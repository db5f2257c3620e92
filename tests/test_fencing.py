"""The zombie interleaving written out with Sessions (notebook 08), and its checker."""

import pytest

import labkit as lk
from labkit.core.errors import LabkitError
from labkit.core.text import TEXT_WIDTH
from labkit.labs import drain as dr
from labkit.labs import fencing

SENT = dr.Outcome("sent")
TIMEOUT = dr.Outcome("retry", "timeout: no answer from APNs")
PAST_LEASE = f"UPDATE lab_clock SET shift = shift + interval '{dr.LEASE_S + 1} s'"
UNTIL_DUE = ("UPDATE lab_clock SET shift = shift + "
             "(SELECT next_attempt_at - lab_now() FROM delivery WHERE id = 1)")


def claim_sql(lab):
    return fencing.bind(lab, lk.read_sql("drain_claim.sql"), batch=1, lease_s=dr.LEASE_S,
                        max_attempts=dr.MAX_ATTEMPTS)


def zombie_run(lab, complete_file: str):
    """W1 claims; the clock passes its lease; W2 re-claims and records 'sent'; W1's late
    'retry' follows; the clock moves on until row 1 is due and W2 claims again."""
    write_sql, claim = lk.read_sql(complete_file), claim_sql(lab)
    dr.create_ledger(lab, 1, no_collapse_every=1)
    with lk.Sessions(lab, "W1", "W2", "clock") as run:
        w1 = dr.Claimed(*run.W1(claim, label="claim").rows[0])
        run.clock(PAST_LEASE)
        w2 = dr.Claimed(*run.W2(claim, label="claim").rows[0])
        live = run.W2(fencing.write_text(lab, write_sql, w2, SENT))
        late = run.W1(fencing.write_text(lab, write_sql, w1, TIMEOUT))
        row = run.W2("SELECT status, claim_version, last_error FROM delivery WHERE id = 1")
        run.clock(UNTIL_DUE)
        again = run.W2(claim, label="claim")
    return run, w1, w2, live, late, row, again


def test_without_a_fence_the_late_write_lands_and_the_row_is_due_again(lab):
    run, w1, w2, live, late, row, again = zombie_run(lab, "drain_complete.sql")
    assert (w1.claim_version, w2.claim_version) == (1, 2)
    assert live.outcome() == "UPDATE 1" and late.outcome() == "UPDATE 1"
    assert row.rows == [("pending", 2, "timeout: no answer from APNs")]
    assert [dr.Claimed(*r).claim_version for r in again.rows] == [3]
    assert not any(st.waited or st.error for st in run.steps)    # a lease is a time, not a lock
    verdict = fencing.check_late_write(lab, late, zombie=w1, owner=w2)
    assert verdict.lost_update and not verdict.fenced and verdict.clobbered
    assert (verdict.matched, verdict.carried, verdict.owner_version) == (1, 1, 2)
    assert (verdict.status, verdict.outcomes) == ("pending", 2)
    assert verdict.report().startswith("LOST UPDATE on delivery 1")


def test_with_the_fence_the_late_write_touches_no_row(lab):
    run, w1, w2, live, late, row, again = zombie_run(lab, "drain_complete_fenced.sql")
    assert live.outcome() == "UPDATE 1" and late.outcome() == "UPDATE 0"
    assert row.rows == [("sent", 2, None)] and again.rows == []
    verdict = fencing.check_late_write(lab, late, zombie=w1, owner=w2)
    assert verdict.fenced and not verdict.lost_update and not verdict.clobbered
    assert (verdict.matched, verdict.status, verdict.outcomes) == (0, "sent", 1)
    assert str(verdict).startswith("FENCED on delivery 1")


def test_the_sessions_run_and_the_drain_code_agree(lab):
    for complete_file, fence in (("drain_complete.sql", False), ("drain_complete_fenced.sql", True)):
        _, w1, w2, _, late, _, again = zombie_run(lab, complete_file)
        verdict = fencing.check_late_write(lab, late, zombie=w1, owner=w2)
        s = fencing.zombie_trace(lab, fence=fence).summary
        assert s["zombie_write_rows"] == verdict.matched
        assert s["final_status"] == verdict.status and s["clobbered"] is verdict.clobbered
        assert s["reclaimed_after_zombie"] == len(again.rows)


def test_bind_writes_the_parameters_in_and_drops_comment_lines(lab):
    row = dr.Claimed(7, 1007, "dev-0007", None, 2, 4)
    text = fencing.write_text(lab, lk.read_sql("drain_complete_fenced.sql"), row, TIMEOUT)
    assert "%(" not in text and "\n--" not in text and not text.startswith("--")
    assert text.rstrip().endswith("WHERE id = 7\n   AND claim_version = 4")
    assert "'timeout: no answer from APNs'::text" in text
    with pytest.raises(LabkitError, match="claim_version"):
        fencing.bind(lab, "UPDATE delivery SET status = 'x' WHERE claim_version = %(claim_version)s")
    with pytest.raises(LabkitError, match="empty"):
        fencing.bind(lab, "  ")


def test_the_checker_refuses_what_is_not_a_late_write(lab):
    dr.create_ledger(lab, 1, no_collapse_every=1)
    old, new = dr.Claimed(1, 1001, "dev-0001", None, 1, 1), dr.Claimed(1, 1001, "dev-0001", None, 2, 2)
    with lk.Sessions(lab, "W1") as run:
        read = run.W1("SELECT status FROM delivery WHERE id = 1")
        broken = run.W1("UPDATE delivery SET nope = 1 WHERE id = 1")
    with pytest.raises(LabkitError, match="not a write"):
        fencing.check_late_write(lab, read, zombie=old, owner=new)
    with pytest.raises(LabkitError, match="failed"):
        fencing.check_late_write(lab, broken, zombie=old, owner=new)
    with pytest.raises(LabkitError, match="older claim of the same row"):
        fencing.check_late_write(lab, read, zombie=new, owner=old)


def test_story_shows_scripted_events_in_their_column_the_answers_columns_and_notes(lab):
    run, *_ = zombie_run(lab, "drain_complete.sql")
    text = fencing.story(run, scripted={1: ("W1", "calls APNs (scripted)")},
                         notes={"2, 6": "a note", 7: "another\nand its second line"})
    lines = text.splitlines()
    assert max(map(len, lines)) <= TEXT_WIDTH
    header = lines[0]
    event = next(line for line in lines if line.startswith("·"))
    step1 = next(i for i, line in enumerate(lines) if line.startswith("1 "))
    # right after step 1's row (and the lines it wraps onto)
    assert next(line for line in lines[step1 + 1:] if line[:1] != " ") == event
    assert event.index("calls APNs (scripted)") == header.index("W1")
    flat = " ".join(text.split())                            # wrapped lines read as one text
    assert "answers" in text and "claim → (id, notification_id, device_token, coalesce_key, " \
        "attempts, claim_version, suspect)" in flat
    assert "→ (status, claim_version, last_error)" in flat     # the read's columns, as named
    assert flat.count("attempts, claim_version, suspect)") == 1   # one line for the three claims
    assert any(line.startswith("step 2, 6") and line.endswith("a note") for line in lines)
    at = next(i for i, line in enumerate(lines) if line.startswith("step 7"))
    assert lines[at].endswith("another") and lines[at + 1].strip() == "and its second line"
    assert lines[at + 1].index("and") == lines[at].index("another")
    with pytest.raises(LabkitError, match="steps 1 to"):
        fencing.story(run, scripted={99: ("W1", "x")})
    with pytest.raises(LabkitError, match="session, text"):
        fencing.story(run, scripted={1: ("W9", "x")})


def test_the_zombie_trace_reports_the_lost_lease_and_every_clock_move(lab):
    fenced = fencing.zombie_trace(lab, fence=True)
    assert fenced.summary["lease_lost"] == [1]
    assert fencing.zombie_trace(lab, fence=False).summary["lease_lost"] == []
    moves = [st for st in fenced.steps if "clock +" in st.action or st.action.startswith("+")]
    assert [st.action.split(" s", 1)[0].split("+")[-1] for st in moves] == ["121", "4", "20"]
    assert [st.state["at"] for st in moves] == ["T+121 s", "T+125 s", "T+145 s"]
    assert "drain_backoff(2)" in moves[-1].action and "would have fallen due" in moves[-1].action


def test_the_fence_checker_runs_the_last_attempt_where_a_status_guard_ends_a_delivered_row_failed(lab):
    guard = fencing.check_fenced_write(lab, lk.read_sql("drain_complete.sql") + "   AND status = 'pending'")
    by = {(s.scenario, s.attempt): s for s in guard.scenarios}
    last = dr.MAX_ATTEMPTS
    assert set(by) == {(w, a) for w in (fencing.AFTER, fencing.WHILE) for a in (2, last)}
    assert by[fencing.WHILE, last].final_status == "failed"      # the live 'sent' is refused
    assert (by[fencing.WHILE, last].zombie_rows, by[fencing.WHILE, last].live_rows) == (1, 0)
    assert by[fencing.WHILE, 2].final_status == "sent" and not by[fencing.WHILE, 2].ok
    assert by[fencing.AFTER, 2].ok and by[fencing.AFTER, last].ok
    unfenced = fencing.check_fenced_write(lab, lk.read_sql("drain_complete.sql"))
    finals = {(s.scenario, s.attempt): s.final_status for s in unfenced.scenarios}
    assert finals[fencing.AFTER, 2] == "pending" and finals[fencing.AFTER, last] == "failed"
    report = guard.report()
    assert "WRONG" in report and "ok: the zombie's late 'retry' matches 0 rows" in report
    # the verdict's sentence wraps within the width, every word kept
    told = unfenced.report()
    assert unfenced.problem.startswith("the zombie's write still lands")
    assert max(map(len, told.splitlines())) <= TEXT_WIDTH
    assert " ".join(unfenced.problem.split()) in " ".join(told.split())


def test_raising_concurrency_counts_duplicates_and_stale_writes_from_the_server(lab):
    for fence in (False, True):
        r = fencing.raise_concurrency(lab, drains=2, batch=4, fence=fence, rows=20, send_ms=1)
        assert r.zombie_state == "stopped" and r.rows_locked_mid_batch == 0
        assert r.duplicate_pushes == 2 + 4                  # half the crashed batch, all the zombie's
        assert r.pushes == 20 + r.duplicate_pushes and r.sent == 20
        assert r.reclaimed_after_lease == 8 and r.backlog_rows == 12
        assert r.shown_twice_with_delivery_id_key == 0
        assert r.stale_writes_landed == (0 if fence else 4)
        assert r.zombie_writes_refused == (4 if fence else 0)
        assert r.jobs_per_s > 0 and r.longest_lock_ms >= 0


def test_raising_concurrency_refuses_a_backlog_the_scripted_drains_would_empty(lab):
    with pytest.raises(LabkitError):
        fencing.raise_concurrency(lab, drains=2, batch=10, fence=True, rows=20)
    with pytest.raises(LabkitError):
        fencing.raise_concurrency(lab, drains=0, batch=2, fence=True)


def test_a_batch_longer_than_its_lease_is_taken_while_it_is_still_sending(lab):
    fits = fencing.batch_outlives_lease(lab, batch=4, lease_s=10, latency_s=2)
    assert (fits.taken_by_drain_2, fits.duplicate_pushes, fits.drain_1_writes_landed) == (0, 0, 4)
    equal = fencing.batch_outlives_lease(lab, batch=5, lease_s=10, latency_s=2)
    assert equal.taken_by_drain_2 == 5 and equal.taken_after_push == 5    # due at the lease's end
    over = fencing.batch_outlives_lease(lab, batch=8, lease_s=10, latency_s=2, fence=True)
    assert over.taken_by_drain_2 == 8 and over.taken_after_push == 5
    assert over.duplicate_pushes == 8 and over.drain_1_writes_landed == 0
    bare = fencing.batch_outlives_lease(lab, batch=8, lease_s=10, latency_s=2, fence=False)
    assert bare.drain_1_writes_landed == 8
