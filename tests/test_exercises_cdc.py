"""Notebook 14's server-checked exercise, the alert on replication slots, on real servers.

The reference answer passes; each typical wrong answer fails with the finding that names its
mistake (confirmed_flush_lsn instead of restart_lsn, pg_size_pretty's text, a WHERE that
hides a slot, logical slots only, active_pid for active, temporary for active, a missing
column, SQL that fails), and no finding says `ok` of a slot the result left out; the hint says what to look at, never the query; bad input
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
# a boolean column that is not whether a session reads the slot: the slot the checker's
# session streams from is a permanent one
TEMPORARY = ("SELECT slot_name, temporary, pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn) "
             "FROM pg_replication_slots")
# logical slots only: a physical slot (a standby's) keeps WAL too
LOGICAL_ONLY = REFERENCE + " WHERE slot_type = 'logical'"
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


def test_the_reference_passes_and_each_wrong_answer_fails_for_its_reason(logical_server,
                                                                           monkeypatch):
    db = logical_server
    lab = Lab.open(db, "ex_cdc")
    try:
        # a slot a killed run left behind is dropped first, not an error
        lab.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')",
                    (alert.slot_names(lab)[0],))
        # the three slots, as the checker makes them: seen from inside the check, the
        # connected one permanent and active, the physical one unread and keeping WAL
        scene = {}

        real_truth = alert._truth

        def truth(s, slots):                # the checker's own measure, and a look beside it
            rows = real_truth(s, slots)
            scene["rows"] = s.execute(
                "SELECT slot_name::text, slot_type, temporary, active, "
                "pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint "
                "FROM pg_replication_slots WHERE slot_name = ANY(%s)", (list(slots),))
            return rows

        with monkeypatch.context() as m:
            m.setattr(alert, "_truth", truth)
            first = alert.check_slot_alert(lab, REFERENCE)
        assert first.passed, str(first)
        seen = {r[0]: r[1:] for r in scene["rows"]}
        lagging_slot, connected_slot, physical_slot = alert.slot_names(lab)
        assert seen[connected_slot][:3] == ("logical", False, True)
        assert seen[lagging_slot][:3] == ("logical", False, False)
        assert seen[physical_slot][:3] == ("physical", False, False)
        assert seen[physical_slot][3] >= alert.CONNECTED_BYTES
        assert _left(db, lab) == ([], [])
        results = {}
        for name, sql in [("reference", REFERENCE), ("start", START), ("confirmed", CONFIRMED),
                          ("pretty", PRETTY), ("only_active", ONLY_ACTIVE), ("not_active", NOT_ACTIVE),
                          ("active_pid", ACTIVE_PID), ("temporary", TEMPORARY),
                          ("logical_only", LOGICAL_ONLY),
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
    assert len(_wrong(start)) == 3
    assert "is text" in _wrong(start)[0] and "confirmed_flush_lsn" in _wrong(start)[1]
    # a physical slot has no confirmed_flush_lsn: NULL, said of that slot
    assert "physical slot" in _wrong(start)[2] and "NULL" in _wrong(start)[2]
    # what is right about it is said too
    assert [t for good, t in start.findings if good][0].startswith("every slot is listed once")

    confirmed, null = _wrong(results["confirmed"])
    # what it measured and why that is short, not the column to use instead
    assert "confirmed_flush_lsn" in confirmed and "held back" in confirmed
    assert "the physical slot nobody reads" in null and "NULL" in null
    assert all("restart_lsn" not in t for t in (confirmed, null))
    [pretty] = _wrong(results["pretty"])
    assert "is text" in pretty and "pg_size_pretty" in pretty
    # a slot the WHERE hid: said missing, and no `ok` line speaks for it
    lagging, reading, physical = ("the logical slot nobody reads", "the logical slot a session reads",
                                  "the physical slot nobody reads")
    for name, hidden_slots, shown_slots, listed in [
            ("only_active", [lagging, physical], [reading], "the one slot listed"),
            ("not_active", [reading], [lagging, physical], "the slots listed"),
            ("logical_only", [physical], [lagging, reading], "the slots listed")]:
        c = results[name]
        assert not c.passed, name
        [hidden] = _wrong(c)
        assert f"missing ({' and '.join(hidden_slots)})" in hidden and "WHERE" in hidden, name
        oks = [t for good, t in c.findings if good]
        assert len(oks) == 2, (name, str(c))
        assert all(h not in t and "each slot" not in t for t in oks for h in hidden_slots), \
            (name, str(c))
        assert all(shown in t and listed in t for t in oks for shown in shown_slots), (name, str(c))
    # logical slots only: the physical one is missing, and the finding says it counts
    assert "logical or physical" in _wrong(results["logical_only"])[0]
    # temporary for active: a boolean column whose values are wrong for the slot a session
    # reads (a permanent one); the finding names that slot, and not the column to use
    temporary = results["temporary"]
    assert not temporary.passed and "FAIL" in str(temporary)
    [flag] = _wrong(temporary)
    assert flag.startswith("the connected column is false for the logical slot a session reads")
    assert "permanent" in flag and "active" not in flag
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


def test_every_slot_is_dropped_when_the_check_breaks_off_half_way(logical_server, monkeypatch):
    """An error once all three slots exist and a session streams from one (here raised where
    the checker waits for that session): nothing of the checker is left on the server."""
    db = logical_server
    lab = Lab.open(db, "ex_cdc_break")
    made = {}
    real_wait = alert._wait_active

    def wait_then_break(s, slots, connected, *a, **kw):
        real_wait(s, slots, connected, *a, **kw)
        made["slots"] = s.execute("SELECT slot_name::text, active FROM pg_replication_slots "
                                  "WHERE slot_name = ANY(%s) ORDER BY 1", (list(slots),))
        raise RuntimeError("broken off")

    try:
        monkeypatch.setattr(alert, "_wait_active", wait_then_break)
        with pytest.raises(RuntimeError, match="broken off"):
            alert.check_slot_alert(lab, REFERENCE)
        assert len(made["slots"]) == 3 and sum(active for _, active in made["slots"]) == 1
        assert _left(db, lab) == ([], [])
    finally:
        lab.drop()
