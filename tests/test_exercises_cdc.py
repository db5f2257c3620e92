"""Notebook 14's server-checked exercise, the alert on replication slots, on real servers.

The reference answer passes; each typical wrong answer fails with the finding that names its
mistake (confirmed_flush_lsn instead of restart_lsn, pg_size_pretty's text, a WHERE that
hides a slot, active_pid for active, a missing column, SQL that fails), and no finding says
`ok` of a slot the result left out; the hint says what to look at, never the query; bad input
is refused
with a LabkitError naming the fix; a server that cannot decode is refused before anything
is created.  After every check, failed or passed, no slot of the checker is left, nor its
scratch schema -- also when a killed run left a slot behind.
"""

import os

import pytest

import labkit
from labkit import Lab
from labkit.core.errors import LabkitError
from labkit.tools.exercises import cdc as alert

REFERENCE = """
SELECT slot_name,
       active,
       pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn) AS retained_bytes
  FROM pg_replication_slots
"""
# the notebook's starting point: how far the consumer is behind, made pretty
START = """
SELECT slot_name,
       active,
       pg_size_pretty(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)) AS wal
  FROM pg_replication_slots
"""
CONFIRMED = ("SELECT slot_name, active, pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn) "
             "FROM pg_replication_slots")
PRETTY = ("SELECT slot_name, active, pg_size_pretty(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)) "
          "FROM pg_replication_slots")
ONLY_ACTIVE = REFERENCE + " WHERE active"
NOT_ACTIVE = REFERENCE + " WHERE NOT active"
ACTIVE_PID = ("SELECT slot_name, active_pid, pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn) "
              "FROM pg_replication_slots")
TWO_COLUMNS = "SELECT slot_name, active FROM pg_replication_slots"
FAILS = "SELECT slot_name, active, retained FROM pg_replication_slots"
REORDERED = ("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint, slot_name, active "
             "FROM pg_replication_slots")


def _left(db, lab: Lab) -> tuple[list[str], list[str]]:
    """The checker's slots and scratch schemas still on the server."""
    with db.connect() as conn:
        slots = [r[0] for r in conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE slot_name = ANY(%s)",
            (list(alert.slot_names(lab)),)).fetchall()]
        schemas = [r[0] for r in conn.execute(              # this process's scratch schemas
            "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s)",
            (f"lab_drill_check_{os.getpid()}_",)).fetchall()]
    return slots, schemas


def _wrong(check) -> list[str]:
    return [text for ok, text in check.findings if not ok]


@pytest.fixture
def logical_server(scratch_server):
    """An embedded cluster of the test's own, as labkit starts it (wal_level = logical): no
    other session's open transaction can make a slot wait."""
    scratch_server.start()
    return labkit.connect(quiet=True)


def test_the_reference_passes_and_each_wrong_answer_fails_for_its_reason(logical_server):
    db = logical_server
    lab = Lab.open(db, "ex_cdc")
    try:
        # a slot a killed run left behind is dropped first, not an error
        lab.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')",
                    (alert.slot_names(lab)[0],))
        results = {}
        for name, sql in [("reference", REFERENCE), ("start", START), ("confirmed", CONFIRMED),
                          ("pretty", PRETTY), ("only_active", ONLY_ACTIVE), ("not_active", NOT_ACTIVE),
                          ("active_pid", ACTIVE_PID),
                          ("two_columns", TWO_COLUMNS), ("fails", FAILS), ("reordered", REORDERED)]:
            results[name] = alert.check_slot_alert(lab, sql)
            assert _left(db, lab) == ([], []), name
    finally:
        lab.drop()

    ok = results["reference"]
    assert ok.passed, str(ok)
    assert len(ok.findings) == 3 and "PASS" in str(ok) and "hint" not in str(ok)
    assert results["reordered"].passed, str(results["reordered"])      # columns found by what they hold

    start = results["start"]
    assert not start.passed and "FAIL" in str(start) and "hint" in str(start)
    assert len(_wrong(start)) == 2
    assert "is text" in _wrong(start)[0] and "confirmed_flush_lsn" in _wrong(start)[1]
    # what is right about it is said too
    assert [t for good, t in start.findings if good][0].startswith("every slot is listed once")

    [confirmed] = _wrong(results["confirmed"])
    # what it measured and why that is short, not the column to use instead
    assert "confirmed_flush_lsn" in confirmed and "held back" in confirmed
    assert "restart_lsn" not in confirmed
    [pretty] = _wrong(results["pretty"])
    assert "is text" in pretty and "pg_size_pretty" in pretty
    # a slot the WHERE hid: said missing, and no `ok` line speaks for it
    for name, hidden_slot, shown_slot in [("only_active", "the slot nobody reads",
                                           "the slot a session reads"),
                                          ("not_active", "the slot a session reads",
                                           "the slot nobody reads")]:
        c = results[name]
        [hidden] = _wrong(c)
        assert f"missing ({hidden_slot})" in hidden and "WHERE" in hidden, name
        oks = [t for good, t in c.findings if good]
        assert len(oks) == 2, (name, str(c))
        assert all(hidden_slot not in t and "each slot" not in t for t in oks), (name, str(c))
        assert all(shown_slot in t and "the one slot listed" in t for t in oks), (name, str(c))
    [pid] = _wrong(results["active_pid"])
    assert "true or false" in pid and "active" in pid
    [two] = _wrong(results["two_columns"])
    assert "2 column(s)" in two and "three" in two
    [fails] = _wrong(results["fails"])
    assert fails.startswith("the query failed: UndefinedColumn")
    # the hint says where to look, and gives no SQL: not the columns, the function or a query
    assert all(word not in alert.ALERT_HINT
               for word in ("restart_lsn", "confirmed_flush_lsn", "pg_wal_lsn_diff", "SELECT",
                            "active,", "pg_current_wal_lsn"))
    assert "pg_replication_slots" in alert.ALERT_HINT
    # every output line fits the notebook's width
    assert all(len(line) <= 96 for c in results.values() for line in str(c).splitlines())


@pytest.mark.parametrize("sql, match", [
    ("", "empty"),
    ("   \n ", "empty"),
    (None, "empty"),
    ("SELECT slot_name, active, %(lsn)s FROM pg_replication_slots", "takes no parameters"),
])
def test_bad_input_is_refused_with_the_fix_before_anything_is_created(db, sql, match):
    lab = Lab.open(db, "ex_cdc_bad")
    try:
        with pytest.raises(LabkitError, match=match) as err:
            alert.check_slot_alert(lab, sql)
        assert "Fix:" in str(err.value)
        assert _left(db, lab) == ([], [])
    finally:
        lab.drop()


def test_a_server_that_cannot_decode_is_refused_with_what_to_do(replica_server):
    db = replica_server
    lab = Lab.open(db, "ex_cdc_replica")
    try:
        with pytest.raises(LabkitError, match="wal_level") as err:
            alert.check_slot_alert(lab, REFERENCE)
        assert "labkit server stop && labkit server start" in str(err.value)
        assert _left(db, lab) == ([], [])
    finally:
        lab.drop()
