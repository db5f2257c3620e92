"""The notification drain and fencing tokens, against the real server."""

import json

import pytest

from labkit import cli, read_sql
from labkit.core.errors import LabkitError
from labkit.labs import drain as dr
from labkit.labs import fencing


@pytest.fixture
def ledger(lab):
    clock = dr.create_ledger(lab, 10, bad=(2,), flaky=(3,))
    return lab, clock


def one_drain(lab, name="d", **kw):
    return dr.make_drain(lab, name, **kw)


def row(lab, i):
    return lab.execute("SELECT status, attempts, claim_version, "
                       "extract(epoch FROM next_attempt_at - (SELECT frozen_at FROM lab_clock)), "
                       "last_error FROM delivery WHERE id = %s", (i,))[0]


# -- the clock -----------------------------------------------------------------------------


def test_clock_is_frozen_moves_on_at_once_and_can_be_the_real_one(ledger):
    lab, clock = ledger
    start = clock.now()
    assert clock.now() == start                      # frozen: no time passes by itself
    clock.advance(120)
    assert (clock.now() - start).total_seconds() == 120
    assert clock.rel(clock.now()) == "T+120 s" and clock.elapsed() == 120
    with pytest.raises(LabkitError, match="cannot go back"):
        clock.advance(-1)
    clock.real()
    server_now = lab.execute("SELECT now()")[0][0]   # autocommit: a fresh transaction
    assert abs((clock.now() - server_now).total_seconds()) < 5
    assert not clock.frozen


# -- the claim -----------------------------------------------------------------------------


def test_claim_grants_the_lease_in_the_same_statement_and_holds_no_lock(ledger):
    lab, clock = ledger
    d = one_drain(lab, batch=4)
    got = d.claim()
    assert [c.id for c in got] == [1, 2, 3, 4]
    assert {(c.attempts, c.claim_version) for c in got} == {(1, 1)}
    assert got[0].device_token == "dev-0001" and got[0].coalesce_key == "notif-1001"
    assert row(lab, 1)[:4] == ("pending", 1, 1, 120)
    # the claim committed: the rows are not locked, yet a second drain does not get them
    assert dr.locked_among(lab, [1, 2, 3, 4]) == 0
    assert [c.id for c in one_drain(lab, "e", batch=10).claim()] == list(range(5, 11))
    assert d.claim() == []
    dr.close_drain(d)


def test_lease_expiry_makes_rows_due_again_exactly_at_the_lease(ledger):
    lab, clock = ledger
    d = one_drain(lab, batch=3, lease_s=120)
    assert len(d.claim()) == 3
    clock.advance(119)
    rest = one_drain(lab, "e", batch=10, lease_s=600)
    assert [c.id for c in rest.claim()] == list(range(4, 11))   # never-claimed rows only
    assert rest.claim() == []                        # T+119: rows 1..3 still leased
    clock.advance(1)                                 # T+120: their leases end
    again = rest.claim()
    assert [c.id for c in again] == [1, 2, 3]
    assert {(c.attempts, c.claim_version) for c in again} == {(2, 2)}


def test_in_and_cte_forms_claim_the_same_rows_and_skip_each_others(lab):
    dr.create_ledger(lab, 6)
    a = lab.connect(autocommit=False, role="a")
    b = lab.connect(autocommit=False, role="b")
    try:
        # both in open transactions: B's subselect must skip A's locked rows, not wait
        a.execute("SET lock_timeout = '2s'")
        b.execute("SET lock_timeout = '2s'")
        params = {"batch": 3, "lease_s": 120, "max_attempts": 5}
        ra = a.execute(read_sql("drain_claim.sql"), params).fetchall()
        rb = b.execute(read_sql("drain_claim_cte.sql"), params).fetchall()
        assert sorted(r[0] for r in ra) == [1, 2, 3] and sorted(r[0] for r in rb) == [4, 5, 6]
    finally:
        a.rollback(), b.rollback(), a.close(), b.close()


def test_terminal_rows_are_never_claimed_again(ledger):
    lab, clock = ledger
    d = one_drain(lab, batch=10)
    res = d.tick()
    assert res.outcomes[2] == dr.Outcome("failed", "BadDeviceToken")
    assert res.outcomes[1].outcome == "sent"
    statuses = dict(lab.execute("SELECT id, status FROM delivery"))
    assert statuses[2] == "failed" and statuses[1] == "sent" and statuses[3] == "pending"
    clock.advance(3600 * 24)
    again = d.tick()
    assert [c.id for c in again.claimed] == [3]      # only the transient failure comes back
    assert lab.execute("SELECT count(*) FROM device_push WHERE delivery_id = 1") == [(1,)]


def test_backoff_grows_with_attempts_and_gives_up_at_max_attempts(lab):
    clock = dr.create_ledger(lab, 1, flaky=(1,))
    d = dr.make_drain(lab, "d", batch=1, max_attempts=3, flaky_failures=10)
    delays = []
    for attempt in (1, 2, 3):
        got = d.tick()
        assert [c.attempts for c in got.claimed] == [attempt]
        status, attempts, _, due, err = row(lab, 1)
        assert attempts == attempt and err == "ServiceUnavailable"
        if attempt < 3:
            assert status == "pending"
            delays.append(float(due) - clock.elapsed())
            clock.advance(delays[-1] - 1)
            assert d.claim() == []                   # not before the backoff is over
            clock.advance(1)
        else:
            assert status == "failed"                # gave up: terminal
    assert delays == [10, 20]
    clock.advance(3600)
    assert d.claim() == []


def test_flaky_token_is_delivered_once_it_recovers(lab):
    clock = dr.create_ledger(lab, 1, flaky=(1,))
    d = dr.make_drain(lab, "d", batch=1, flaky_failures=1)
    assert d.tick().outcomes[1].outcome == "retry"
    clock.advance(10)
    assert d.tick().outcomes[1].outcome == "sent"
    assert row(lab, 1)[0] == "sent"


# -- the dead letter and the suspects -------------------------------------------------------


@pytest.mark.parametrize("form", ["in", "cte"])
def test_the_claim_dead_letters_a_row_whose_attempts_are_used_up(lab, form):
    clock = dr.create_ledger(lab, 3)
    d = dr.make_drain(lab, "d", batch=3, max_attempts=2, form=form)
    try:
        for _ in range(2):                       # two claims, no outcome: two crashed attempts
            assert [c.id for c in d.claim()] == [1, 2, 3]
            clock.advance(dr.LEASE_S)
        lab.execute("UPDATE delivery SET outcomes = 1 WHERE id = 3")   # row 3 reported once
        assert d.claim() == []                   # nothing handed to the sender ...
        # rows 1 and 2 are suspects (two attempts without an outcome): one per claim
        assert [r[0] for r in lab.execute("SELECT status FROM delivery ORDER BY id")] == [
            "failed", "pending", "failed"]
        assert d.claim() == []
        rows = lab.execute("SELECT id, status, attempts, last_error FROM delivery ORDER BY id")
        assert [r[1] for r in rows] == ["failed"] * 3 and [r[2] for r in rows] == [2, 2, 2]
        assert rows[0][3] == "abandoned after 2 attempts, 2 of them without an outcome"
        assert rows[2][3] == "abandoned after 2 attempts, 1 of them without an outcome"
        clock.advance(86_400)
        assert d.claim() == []                   # ... and a dead letter is never due again
    finally:
        dr.close_drain(d)


def test_a_suspect_is_claimed_alone_among_suspects_and_sent_last(lab):
    dr.create_ledger(lab, 6)
    lab.execute("UPDATE delivery SET attempts = 2 WHERE id IN (1, 2)")   # two attempts, no outcome
    d = dr.make_drain(lab, "d", batch=4)
    try:
        got = d.claim()
        assert [(c.id, c.suspect) for c in got] == [(1, True), (3, False), (4, False), (5, False)]
        assert [c.id for c in dr.send_order(got)] == [3, 4, 5, 1]
        res = d.tick()                           # row 2: the next suspect, with row 6
        assert [(c.id, c.suspect) for c in res.claimed] == [(2, True), (6, False)]
        assert lab.execute("SELECT outcomes, reported_version = claim_version FROM delivery "
                           "WHERE id = 2") == [(1, True)]
    finally:
        dr.close_drain(d)


def test_a_poison_row_kills_real_drains_until_the_claim_dead_letters_it(lab):
    tr = dr.poison_trace(lab, rows=3, poison=3, max_attempts=4)
    s = tr.summary
    assert s["poison_status"] == "failed" and s["poison_attempts"] == 4
    assert s["poison_outcomes"] == 0 and s["crashes"] == 4 and s["poison_pushed"] == 0
    assert s["poison_last_error"] == "abandoned after 4 attempts, 4 of them without an outcome"
    assert s["others_sent"] == s["others"] == 2          # its batch-mates were delivered
    assert sum(st.kind == "crash" for st in tr.steps) == 4
    with pytest.raises(LabkitError, match="poison row"):   # never in the kernel
        dr.create_ledger(lab, 1, poison=(1,))
        dr.make_drain(lab, "k", batch=1).tick()


def test_crashed_twice_counts_crashes_not_attempts(lab):
    kills = dr.crash_histories(lab)
    truth = sorted(i for i, n in kills.items() if n >= 2)
    assert kills == {1: 2, 2: 2, 3: 1}
    assert [r[0] for r in lab.execute(read_sql("drain_crashed_twice.sql"))] == truth == [1, 2]
    assert [r[0] for r in lab.execute(dr.OLD_CRASHED_TWICE)] != truth     # the old answer: [2, 3]


# -- the phone --------------------------------------------------------------------------------


def test_device_collapses_by_collapse_id_and_drops_repeated_keys():
    pushes = [("t1", 1, "c1", 10), ("t1", 1, "c1", 10), ("t1", 2, None, 11), ("t1", 2, None, 11),
              ("t2", 3, "c3", 12), ("t1", 4, "c1", 13)]
    phone = dr.Device("t1")
    shown = phone.show(pushes)
    assert [(b.notification_id, b.collapse_id, b.pushes) for b in shown] == [(4, "c1", 3), (2, None, 1),
                                                                            (2, None, 1)]
    assert phone.received == 5 and phone.replaced == 2 and phone.visible_duplicates == 1
    c = dr.Device.count(pushes)
    assert c.as_dict() == {"pushes": 6, "banners": 4, "notifications": 3, "duplicate_pushes": 2,
                           "visible_duplicates": 1, "hidden_by_collapse_id": 2, "dropped_by_key": 0}
    keyed = dr.Device.count(pushes, dedup_on="delivery_id")
    assert keyed.dropped_by_key == 2 and keyed.visible_duplicates == 0
    with pytest.raises(LabkitError, match="not a push"):
        dr.Device().receive(42)
    with pytest.raises(LabkitError, match="deduplicate"):
        dr.Device(dedup_on="delivery_id").receive({"device_token": "t", "notification_id": 1,
                                                   "collapse_id": None})


# -- a frozen drain ---------------------------------------------------------------------------


@pytest.mark.parametrize("fence", [True, False])
def test_a_frozen_drain_holds_no_lock_and_the_lease_frees_its_rows(lab, fence):
    s = dr.freeze_summary(lab, batch=10, freeze_after=4, lease_s=3, fence=fence)
    assert s.process_state_while_frozen == "stopped" and s.sessions_while_frozen == "idle"
    assert s.locks_held_while_frozen == 0 and s.rows_locked_while_frozen == 0
    assert s.claimed_by_others_before_lease_end == 0
    assert s.claimed_by_others_while_frozen == 10
    assert s.released_after_s == 3 and s.released_by == "lease expiry"
    assert s.duplicates_after_wake == 6                  # the 6 it had not sent yet
    if fence:
        assert s.stale_writes_after_wake == 0 and s.late_writes_rejected == 10
    else:
        assert s.stale_writes_after_wake == 10 and s.late_writes_rejected == 0
    with pytest.raises(LabkitError, match="freeze_after"):
        dr.freeze_summary(lab, batch=5, freeze_after=5)


# -- trace 1: the crash ---------------------------------------------------------------------


def test_crash_mid_send_is_recovered_by_the_lease_with_bounded_duplicates(lab):
    tr = dr.crash_trace(lab, batch=20, crash_after=5, warmup=10, others=4)
    s = tr.summary
    assert s["claimed"] == 20 and s["sent_before_crash"] == 5
    assert s["locks_held_after_crash"] == 0
    assert s["claimed_by_second_drain_at_once"] == 4 and s["due_before_lease_end"] == 0
    assert s["reclaimed_after_lease"] == 20
    assert s["terminal_rows_reclaimed"] == 0
    # ids 11..15 were pushed twice; every 4th delivery (12) has no collapse id
    assert s["duplicate_pushes"] == 5 and s["visible_duplicates"] == 1
    assert lab.execute("SELECT count(*) FROM delivery WHERE status = 'pending'") == [(0,)]
    assert any(st.kind == "crash" for st in tr.steps)


def test_bad_parameters_name_the_fix(lab):
    with pytest.raises(LabkitError, match="batch >= 1"):
        dr.crash_trace(lab, batch=0)
    with pytest.raises(LabkitError, match="crash_after <= batch"):
        dr.crash_trace(lab, batch=5, crash_after=6)
    with pytest.raises(LabkitError, match="lease_s > 0"):
        dr.check_params(lease_s=-1)
    with pytest.raises(LabkitError, match="drains >= 1"):
        dr.compare_claim_scopes(lab, drains=0)
    with pytest.raises(LabkitError, match="send_ms >= 0"):
        dr.compare_claim_scopes(lab, send_ms=-5)
    with pytest.raises(LabkitError, match="rows >= 1"):
        dr.compare_claim_scopes(lab, rows=0)
    with pytest.raises(LabkitError, match="lease_s >= 2"):
        dr.crash_trace(lab, lease_s=1)
    with pytest.raises(LabkitError, match="timeout_s larger"):
        fencing.zombie_trace(lab, fence=True, timeout_s=1)
    with pytest.raises(LabkitError, match="latency_s >= 0"):
        dr.PushSender(lab.admin, latency_s=-2)


# -- trace 2: holding the lock across the send ----------------------------------------------------


def test_holding_for_update_across_sends_serialises_drains(lab):
    df = dr.compare_claim_scopes(lab, drains=3, rows=12, batch=2, send_ms=30)
    lease, skip, wait = (df.loc[m] for m in dr.MODES)
    assert (df["sent"] == 12).all() and (df["duplicates"] == 0).all()
    assert wait.max_parallel_sends == 1              # one drain at a time
    assert lease.max_parallel_sends >= 2 and skip.max_parallel_sends >= 2
    # the lease drain's connections are in a transaction only for the claim and the writes
    assert lease.in_transaction_s < skip.in_transaction_s / 2
    assert lease.in_transaction_s < wait.in_transaction_s / 2
    assert wait.wall_s > lease.wall_s


# -- traces 3 and 4: the zombie -------------------------------------------------------------------


def test_zombie_without_fence_clobbers_the_status(lab):
    s = fencing.zombie_trace(lab, fence=False).summary
    assert s["zombie_write_rows"] == 1 and s["final_status"] == "pending"
    assert s["correct_status"] == "sent" and s["clobbered"] is True
    assert s["reclaimed_after_zombie"] == 1 and s["pushes_to_device"] == 2


def test_zombie_with_fence_is_told_it_lost_the_lease(lab):
    s = fencing.zombie_trace(lab, fence=True).summary
    assert s["zombie_write_rows"] == 0 and s["final_status"] == "sent"
    assert s["clobbered"] is False
    assert s["reclaimed_after_zombie"] == 0 and s["pushes_to_device"] == 1


@pytest.mark.parametrize("fence", [True, False])
def test_a_zombie_push_that_was_delivered_reaches_the_device_twice_fence_or_not(lab, fence):
    s = fencing.zombie_trace(lab, fence=fence, zombie_push="delivered").summary
    assert s["zombie_push"] == "delivered" and s["clobbered"] is (not fence)
    assert s["pushes_to_device"] == (2 if fence else 3)  # the fence protects the row, not the device
    assert s["banners_shown"] == s["pushes_to_device"]   # no collapse id: every push is a banner
    assert s["banners_with_delivery_id_key"] == 1        # a receiver keyed on the delivery id: once
    pushes = dr.read_pushes(lab)
    assert len(dr.Device(dedup_on="claim_version").show(pushes)) == len(pushes)   # a per-claim key: no dedup
    with pytest.raises(LabkitError, match="lost or delivered"):
        fencing.zombie_trace(lab, fence=True, zombie_push="maybe")


def test_fenced_drain_reports_lost_leases(lab):
    clock = dr.create_ledger(lab, 2)
    zombie = dr.make_drain(lab, "z", batch=2, fence=True)
    live = dr.make_drain(lab, "l", batch=2, fence=True)
    old = zombie.claim()
    clock.advance(121)
    live.tick()
    lost = zombie.complete_all([(r, dr.Outcome("retry", "timeout")) for r in old])
    assert lost == [1, 2]
    assert lab.execute("SELECT DISTINCT status FROM delivery") == [("sent",)]


@pytest.mark.parametrize("name, extra, passes", [
    ("as shipped", "", False),
    ("status guard only", " AND status = 'pending'", False),
    ("matches nothing", " AND false", False),
    ("fenced", " AND claim_version = %(claim_version)s", True),
])
def test_fence_checker(lab, name, extra, passes):
    check = fencing.check_fenced_write(lab, read_sql("drain_complete.sql") + extra)
    assert check.passed is passes, check.report()
    assert check.report().startswith("PASS" if passes else "FAIL")


def test_fence_checker_accepts_the_reference_answer_and_reports_sql_errors(lab):
    assert fencing.check_fenced_write(lab, read_sql("drain_complete_fenced.sql")).passed
    bad = fencing.check_fenced_write(lab, "UPDATE delivery SET nope = 1 WHERE id = %(id)s")
    assert not bad.passed and "UndefinedColumn" in bad.problem
    with pytest.raises(LabkitError, match="empty"):
        fencing.check_fenced_write(lab, "  ")


# -- command lines --------------------------------------------------------------------------------


def test_cli_trace_drain_and_zombie_json(capsys):
    assert cli.main(["trace", "drain", "--batch", "10", "--crash-after", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("claimed", "sent_before_crash", "locks_held_after_crash", "reclaimed_after_lease",
                "duplicate_pushes", "visible_duplicates", "terminal_rows_reclaimed"):
        assert key in out
    assert out["claimed"] == 10 and out["sent_before_crash"] == 3 and out["duplicate_pushes"] == 3
    assert cli.main(["trace", "zombie", "--no-fence", "--json"]) == 0
    z = json.loads(capsys.readouterr().out)
    assert z["clobbered"] is True and z["zombie_write_rows"] == 1 and z["correct_status"] == "sent"
    assert cli.main(["trace", "zombie", "--fence", "--json"]) == 0
    z = json.loads(capsys.readouterr().out)
    assert z["clobbered"] is False and z["final_status"] == "sent"
    assert cli.main(["trace", "zombie", "--fence", "--zombie-push", "delivered", "--json"]) == 0
    z = json.loads(capsys.readouterr().out)
    assert z["clobbered"] is False and z["pushes_to_device"] == 2 and z["banners_with_delivery_id_key"] == 1


def test_cli_trace_drain_freeze_after(capsys):
    assert cli.main(["trace", "drain", "--batch", "20", "--freeze-after", "5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("locks_held_while_frozen", "claimed_by_others_while_frozen", "released_after_s",
                "released_by", "duplicates_after_wake", "stale_writes_after_wake"):
        assert key in out
    assert out["locks_held_while_frozen"] == 0 and out["claimed_by_others_while_frozen"] == 20
    assert out["released_after_s"] == 5 and out["stale_writes_after_wake"] == 0
    assert out["duplicates_after_wake"] == 15


def test_traces_leave_no_session_or_worker_behind(lab, db):
    import time

    from conftest import backends_of

    dr.crash_trace(lab, batch=6, crash_after=2, warmup=0, others=0)
    dr.freeze_summary(lab, batch=6, freeze_after=2, lease_s=2)
    dr.poison_trace(lab, rows=2, poison=1, max_attempts=2)
    fencing.zombie_trace(lab, fence=True)
    deadline = time.monotonic() + 10  # a closed connection's server process exits a moment later
    while True:
        left = [b for b in backends_of(db, lab.app_name + ":%")
                if not b[1].endswith((":admin", ":probe"))]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert left == []


def test_a_frozen_drain_in_a_transaction_is_ended_by_its_idle_timeout_measured_on_the_server(lab):
    held = dr.frozen_held_drain(lab, batch=6, freeze_after=2, idle_timeout_s=1.0)
    assert held.session_while_frozen == "idle in transaction"
    assert held.locks_held_while_frozen == 6 and held.claimed_by_others_before_release == 0
    assert held.released_by == "idle_in_transaction_session_timeout"
    # the server's clock: never before the timeout, never after the lab's poll found the locks gone
    assert 1.0 <= held.released_after_server_s <= held.released_after_s + 1.0
