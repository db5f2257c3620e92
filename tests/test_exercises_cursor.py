"""Notebook 13's exercises the server checks, on a real server: the reference answers pass,
and each typical wrong answer fails with the finding that names what it breaks."""

import os

import pytest
from conftest import backends_gone

import labkit as lk
from labkit.core.errors import LabkitError
from labkit.core.queries import query
from labkit.tools.exercises import cursor as ex

HIGH_WATER = "SELECT id, event_id FROM outbox WHERE id > %(last_id)s ORDER BY id"
# the xid filter with the id alone as the cursor: ids and xids come in different orders
XID_FILTER_ID_CURSOR = ("SELECT id FROM outbox WHERE xid < pg_snapshot_xmin(pg_current_snapshot()) "
                        "AND id > %(last_id)s ORDER BY id")
# (xid, id) without the bound: P1's row, committed late, sorts below a cursor already past it
NO_BOUND = "SELECT id FROM outbox WHERE (xid, id) > (%(last_xid)s::xid8, %(last_id)s) ORDER BY xid, id"
# the bound and the xid alone as the cursor: one transaction's rows beyond a batch are passed
XID_ONLY = ("SELECT id, event_id FROM outbox WHERE xid > %(last_xid)s::xid8 "
            "AND xid < pg_snapshot_xmin(pg_current_snapshot()) ORDER BY xid, id LIMIT %(batch)s")
INCLUSIVE = ex.SAFE_READ.replace("(xid, id) >", "(xid, id) >=")
# the bound and the (xid, id) cursor, but not read in the cursor's order
BY_ID = ex.SAFE_READ.replace("ORDER BY xid, id", "ORDER BY id")
UNORDERED = ex.SAFE_READ.replace(" ORDER BY xid, id\n", "")
BY_ID_NO_LIMIT = BY_ID.replace(" LIMIT %(batch)s\n", "")
assert BY_ID != ex.SAFE_READ and "ORDER" not in UNORDERED and "LIMIT" not in BY_ID_NO_LIMIT

PLAIN_CLAIM = lk.read_sql("outbox_claim.sql")
PER_AGGREGATE = query("ordering.sql", "claim_per_aggregate").text
NO_LOCK = "SELECT id FROM outbox WHERE published_at IS NULL ORDER BY created_at, id LIMIT %(batch)s"
# "no older event at all", published or not: only every order's first event is ever claimable
ANY_OLDER = ("SELECT id FROM outbox o WHERE published_at IS NULL AND NOT EXISTS (SELECT 1 FROM outbox "
             "older WHERE older.aggregate = o.aggregate AND older.version < o.version) "
             "ORDER BY created_at, id LIMIT %(batch)s FOR UPDATE SKIP LOCKED")
# a lock both relays can hold at once: the second relay's mark waits for the first one
SHARED = PLAIN_CLAIM.replace("FOR UPDATE SKIP LOCKED", "FOR SHARE SKIP LOCKED")


def _failures(result) -> str:
    return " ".join(text for ok, text in result.findings if not ok)


def test_the_safe_read_passes_and_shows_what_each_read_returned(lab):
    result = ex.check_safe_read(lab, ex.SAFE_READ)
    assert result.passed, str(result)
    assert "the reads, in turn: none; 1, 2; 4; 3; 7, 5; 6; 8, 9; 10, 11; none" in result.findings[0][1]
    assert "act 4: the rows of P1's one transaction, 8, 9, 10" in result.findings[1][1]
    assert str(result).startswith("PASS") and "hint" not in str(result)


def test_the_lab_safe_read_with_its_cursor_as_parameters_passes(lab):
    lab_read = query("cursor.sql", "safe_read").text
    as_params = (lab_read.replace("FROM outbox o, relay_cursor c", "FROM outbox o")
                 .replace(" WHERE c.relay = 'safe'\n   AND", " WHERE")
                 .replace("(c.last_xid, c.last_id)", "(%(last_xid)s::xid8, %(last_id)s)"))
    assert "relay_cursor" not in as_params
    assert ex.check_safe_read(lab, as_params).passed


@pytest.mark.parametrize("sql, lost, wrong", [
    (HIGH_WATER, [1, 3], ["Row 1 (P1's", "row 3 (P2's second"]),
    (XID_FILTER_ID_CURSOR, [3], ["Row 3 (P2's second: a lower id than P3's row, a newer xid"]),
    (NO_BOUND, [1], ["Row 1 (P1's: inserted first"]),
    (BY_ID, [7], ["Row 7 (P1's second: its transaction wrote before rows 5 and 6", "5, 6; none"]),
    (UNORDERED, [7], ["Row 7 (P1's second"]),
])
def test_a_read_that_passes_a_row_behind_its_cursor_loses_it(lab, sql, lost, wrong):
    result = ex.check_safe_read(lab, sql)
    assert not result.passed and "\n  hint  Which rows can still commit behind" in str(result)
    failed = _failures(result)
    for k in range(1, 12):
        assert (f"ow {k} (" in failed) == (k in lost), str(result)
    for text in wrong:
        assert text in failed, str(result)
    assert "never returned" in failed
    assert [ok for ok, _ in result.findings] == [False, True, True, True]


def test_a_cursor_on_the_xid_alone_loses_the_rows_of_one_transaction_past_a_batch(lab):
    result = ex.check_safe_read(lab, XID_ONLY)
    assert not result.passed and "\n  hint  Which rows can still commit behind" in str(result)
    assert [ok for ok, _ in result.findings] == [True, False, True, True], str(result)
    assert "the reads, in turn: none; 1, 2; 4; 3; 7, 5; 6; 8, 9; 11; none" in result.findings[0][1]
    assert _failures(result) == ("act 4: one transaction of P1 wrote rows 8, 9, 10 (more rows than a "
                                 "batch) and committed, then P2 committed row 11, all before read 7; "
                                 "row 10 was never returned")
    # the same read on (xid, id), and the xid alone without a batch limit, lose nothing
    assert ex.check_safe_read(lab, XID_ONLY.replace(
        "xid > %(last_xid)s::xid8", "(xid, id) > (%(last_xid)s::xid8, %(last_id)s)")).passed
    assert ex.check_safe_read(lab, XID_ONLY.replace(" LIMIT %(batch)s", "")).passed


@pytest.mark.parametrize("sql, twice", [(INCLUSIVE, "2, 3, 4, 5, 6, 7, 8"), (BY_ID_NO_LIMIT, "5, 6")])
def test_a_read_that_does_not_move_past_its_cursor_returns_rows_twice(lab, sql, twice):
    result = ex.check_safe_read(lab, sql)
    assert not result.passed
    assert [ok for ok, _ in result.findings][2:] == [False, True]
    assert f"row(s) {twice} returned more than once: the cursor did not move past them" in _failures(result)


def test_a_read_in_the_cursors_order_passes_with_or_without_a_limit(lab):
    assert ex.check_safe_read(lab, ex.SAFE_READ.replace(" LIMIT %(batch)s\n", "")).passed


def test_the_hints_point_at_what_to_look_at_not_at_the_answer():
    for hint in (ex.SAFE_READ_HINT, ex.AGGREGATE_CLAIM_HINT):
        for answer in ("pg_snapshot_xmin", "ORDER BY", "NOT EXISTS", "published_at IS NULL", "xid8",
                       "SKIP LOCKED", "older.version"):
            assert answer not in hint


def test_a_read_that_returns_nothing_gets_one_finding_not_empty_oks(lab):
    result = ex.check_safe_read(lab, "SELECT id FROM outbox WHERE false AND id > %(last_id)s")
    assert [ok for ok, _ in result.findings] == [False]
    assert "the reads returned no row at all" in _failures(result) and "while 11 were committed" in str(result)


def test_a_broken_read_is_a_finding_not_a_crash(lab):
    broken = ex.check_safe_read(lab, "SELEC id FROM outbox")
    assert not broken.passed and "read 1 failed" in _failures(broken) and "42601" in _failures(broken)
    no_id = ex.check_safe_read(lab, "SELECT event_id FROM outbox WHERE id > %(last_id)s ORDER BY id")
    assert not no_id.passed and "first column should be the outbox id" in _failures(no_id)


def test_bad_input_to_the_safe_read_check_names_the_fix(lab):
    with pytest.raises(LabkitError, match="empty"):
        ex.check_safe_read(lab, "   ")
    with pytest.raises(LabkitError, match=r"%\(last_xid\)s, %\(last_id\)s, %\(batch\)s"):
        ex.check_safe_read(lab, "SELECT id FROM outbox WHERE id > %(cursor)s")
    with pytest.raises(LabkitError, match="wait_s"):
        ex.check_safe_read(lab, ex.SAFE_READ, wait_s=-1)


def test_the_checks_leave_no_schema_and_no_session_behind(lab, db):
    ex.check_safe_read(lab, HIGH_WATER)
    ex.check_aggregate_claim(lab, PLAIN_CLAIM)
    mine = f"lab_drill_check_{os.getpid()}_%"
    assert backends_gone(db, f"labkit:{mine}") == []
    with db.connect() as conn:
        left = conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname LIKE %s", (mine,)).fetchone()[0]
    assert left == 0


# -- two relays, one claim ----------------------------------------------------------------------

def test_the_per_aggregate_claim_passes(lab):
    result = ex.check_aggregate_claim(lab, PER_AGGREGATE)
    assert result.passed, str(result)
    assert "exactly once (10 messages)" in str(result)


def test_the_plain_skip_locked_claim_reorders_an_order(lab):
    result = ex.check_aggregate_claim(lab, PLAIN_CLAIM)
    assert not result.passed
    assert [ok for ok, _ in result.findings] == [True, False, False]
    assert "order-1: v3 reached the broker before v1" in _failures(result)
    assert "held by both relays at once" in _failures(result)


@pytest.mark.parametrize("sql, wrong", [
    (NO_LOCK, "10 of 10 events reached the broker more than once: both relays claimed 1, 2, 3"),
    (NO_LOCK, "in the same round: nothing kept the second claim from returning rows the first one held"),
    (ANY_OLDER, "7 of 10 events never reached the broker: both claims came back empty while no "
                "relay held anything, though in each order the oldest of them had no older event "
                "left unpublished"),
    (SHARED, "relay B's mark failed: it waited for the other relay's lock on rows both relays had"),
    ("SELECT id FROM outbx LIMIT %(batch)s", "relay A's claim failed"),
])
def test_wrong_claims_fail_with_their_finding(lab, sql, wrong):
    result = ex.check_aggregate_claim(lab, sql)
    assert not result.passed and wrong in _failures(result), str(result)


def test_bad_input_to_the_claim_check_names_the_fix(lab):
    with pytest.raises(LabkitError, match="batch"):
        ex.check_aggregate_claim(lab, PER_AGGREGATE, batch=0)
    with pytest.raises(LabkitError, match="empty"):
        ex.check_aggregate_claim(lab, "")
    with pytest.raises(LabkitError, match=r"%\(batch\)s"):
        ex.check_aggregate_claim(lab, "SELECT id FROM outbox LIMIT %(n)s")
