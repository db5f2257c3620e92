"""The inbox exercise's checker, on the real server: the workbook's record step passes, and
each typical wrong one fails with the finding that names what broke."""

import json
import os
import re
from pathlib import Path

import pytest
from conftest import backends_gone

from labkit.core.errors import LabkitError
from labkit.core.queries import query
from labkit.tools.exercises import inbox as ex

RIGHT = query("inbox.sql", "record").text
NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "15_outbox_size_and_inbox.ipynb"

# The notebook's starting point: it inserts the id when a check finds it missing from the
# inbox -- a check that sees only what had committed when the statement began.
STARTING_POINT = """
INSERT INTO inbox (event_id)
SELECT %(event_id)s
 WHERE NOT EXISTS (SELECT 1 FROM inbox WHERE event_id = %(event_id)s)
RETURNING event_id
"""

# The same check deciding only what to return, the insert beside it never failing.
CHECK_THEN_INSERT = """
WITH recorded AS (
    INSERT INTO inbox (event_id) VALUES (%(event_id)s)
    ON CONFLICT (event_id) DO NOTHING
)
SELECT %(event_id)s AS event_id
 WHERE NOT EXISTS (SELECT 1 FROM inbox WHERE event_id = %(event_id)s)
"""

# A try-lock instead of a wait: B takes the id held by A's open transaction for a copy at
# once. Right while A commits; when A rolls back, the event is recorded by nobody.
TRY_LOCK = """
INSERT INTO inbox (event_id)
SELECT %(event_id)s
 WHERE pg_try_advisory_xact_lock(hashtext(%(event_id)s))
   AND NOT EXISTS (SELECT 1 FROM inbox WHERE event_id = %(event_id)s)
RETURNING event_id
"""


def _wrong(check) -> str:
    return "\n".join(text for ok, text in check.findings if not ok)


def test_the_workbooks_record_step_passes(lab):
    result = ex.check_record(lab, RIGHT)
    assert result.passed, str(result)
    said = "\n".join(text for _, text in result.findings)
    assert "B's waited for A's transaction, then came back empty" in said
    assert ("evt-0005 at the same moment, A's rolled back after your statement: B's waited for "
            "A's transaction, then came back as new") in said
    assert "labels printed per order: 1, 1, 1, 1, 1" in said and "hint" not in str(result)
    assert "the inbox holds all 5 event ids" in said


def test_the_same_statement_in_one_line_passes(lab):
    assert ex.check_record(lab, "insert into inbox values (%(event_id)s) on conflict do nothing "
                                "returning 1").passed


def test_the_starting_point_fails_only_on_the_simultaneous_copy_and_the_hint_says_why(lab):
    result = ex.check_record(lab, STARTING_POINT)
    assert not result.passed
    wrong = _wrong(result)
    assert "later copy" not in wrong and "first delivery" not in wrong and "labels" not in wrong
    assert "evt-0004 in session B: ERROR 23505" in wrong
    assert "B's (after waiting for A's COMMIT) with an error" in wrong
    assert "rolled back" not in wrong
    # unchanged, it gets the verdict and an invitation to change it, not the hint
    assert result.hint == ex.STARTER_HINT and "change it and run the cell again" in str(result)
    assert ex.HINT_RACE_FAILED not in str(result)
    # changed (here a clause added to its check), the hint says what went wrong and where to
    # look, never the statement
    changed = ex.check_record(lab, STARTING_POINT.replace("event_id = %(event_id)s)",
                                                          "event_id = %(event_id)s LIMIT 1)"))
    assert not changed.passed and changed.hint == ex.HINT_RACE_FAILED
    assert "ON CONFLICT" not in changed.hint and "RETURNING" not in changed.hint
    # with the insert's own outcome deciding, the same statement passes
    assert ex.check_record(lab, STARTING_POINT.replace(
        "RETURNING", "ON CONFLICT (event_id) DO NOTHING\nRETURNING")).passed


def test_the_checker_knows_the_notebooks_starting_point():
    cell = next("".join(c["source"]) for c in json.loads(NOTEBOOK.read_text())["cells"]
                if "".join(c["source"]).startswith("MY_RECORD = "))
    starter = re.match(r'MY_RECORD = """(.*?)"""', cell, re.S).group(1)
    assert ex.is_starter(starter) and ex.is_starter(STARTING_POINT)
    # comments, spacing, case and a closing semicolon aside; any other change is an attempt
    assert ex.is_starter(" ".join(STARTING_POINT.split()).upper() + ";  -- mine")
    assert not ex.is_starter(STARTING_POINT.replace("RETURNING", "ON CONFLICT DO NOTHING RETURNING"))
    assert not ex.is_starter(RIGHT) and not ex.is_starter(None)


def test_a_try_lock_loses_the_event_when_the_first_copy_rolls_back(lab):
    result = ex.check_record(lab, TRY_LOCK)
    assert not result.passed
    wrong = _wrong(result)
    # it passes every act where A commits: B's copy is skipped at once, without waiting ...
    assert "later copy" not in wrong and "first delivery" not in wrong
    assert "evt-0004" not in wrong and "not fail" not in wrong
    # ... and when A rolls back, B's acknowledged copy leaves the event to nobody
    assert ("A's rolled back after your statement: B's came back empty without waiting for A, "
            "and B's delivery was acknowledged: the event ended recorded by nobody") in wrong
    assert "1, 1, 1, 1, 0 (evt-0005 never)" in wrong
    assert "the inbox holds 4 of the 5 event ids" in wrong
    assert result.hint == ex.HINT_ROLLBACK_LOST
    assert "ON CONFLICT" not in result.hint and "INSERT" not in result.hint


def test_check_then_insert_lets_the_simultaneous_copies_both_through(lab):
    result = ex.check_record(lab, CHECK_THEN_INSERT)
    assert not result.passed
    wrong = _wrong(result)
    # it passes everything that does not run two copies at once ...
    assert "later copy" not in wrong and "first delivery" not in wrong and "inbox holds" not in wrong
    # ... and B's check, made before A committed, said "new" even though B then waited for A
    assert "B's (after waiting for A's COMMIT) with a row, so both were applied" in wrong
    assert "1, 1, 1, 2, 1 (evt-0004 twice)" in wrong
    assert str(result).startswith("FAIL") and "hint" in str(result)
    assert result.hint == ex.HINT_RACE_BOTH


@pytest.mark.parametrize("sql_text, findings, hint", [
    # a copy raises instead of coming back empty: the effect stays once, the consumer fails
    ("INSERT INTO inbox (event_id) VALUES (%(event_id)s) RETURNING event_id",
     ["not fail", "23505", "later copy of evt-0001 came back with an error"], "HINT_KEY_FAILED"),
    # never a row: nothing applied
    ("INSERT INTO inbox (event_id) VALUES (%(event_id)s) ON CONFLICT DO NOTHING",
     ["never applied", "0, 0, 0, 0", "neither was applied"], "HINT_NEVER_A_ROW"),
    # a check that records nothing: every copy is new
    ("SELECT %(event_id)s WHERE NOT EXISTS (SELECT 1 FROM inbox WHERE event_id = %(event_id)s)",
     ["label was printed again", "nothing was recorded", "2, 1, 1, 2"], "HINT_NOTHING_RECORDED"),
    # a row for every copy
    ("INSERT INTO inbox (event_id) VALUES (%(event_id)s) "
     "ON CONFLICT (event_id) DO UPDATE SET applied_at = now() RETURNING event_id",
     ["label was printed again", "both were applied", "2, 1, 1, 2"], "HINT_COPY_ROW"),
    ("INSRT INTO inbox VALUES (%(event_id)s)", ["failed on the first delivery", "42601"],
     "HINT_FIRST_FAILED"),
])
def test_wrong_record_steps_fail_with_their_finding_and_hint(lab, sql_text, findings, hint):
    result = ex.check_record(lab, sql_text)
    assert not result.passed
    wrong = _wrong(result)
    for finding in findings:
        assert finding in wrong, str(result)
    assert result.hint == getattr(ex, hint), result.hint
    assert "INSERT INTO" not in result.hint and "RETURNING" not in result.hint


def test_the_checker_leaves_nothing_behind(lab, db):
    ex.check_record(lab, CHECK_THEN_INSERT)
    ex.check_record(lab, "INSERT INTO inbox (event_id) VALUES (%(event_id)s) RETURNING event_id")
    mine = f"lab_drill_check_{os.getpid()}_%"
    assert backends_gone(db, f"labkit:{mine}") == []
    with db.connect() as conn:
        assert conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname LIKE %s",
                            (mine,)).fetchone()[0] == 0


@pytest.mark.parametrize("sql_text, match", [
    ("", "empty"), ("   \n", "empty"), (None, "string"), (42, "string"),
    ("INSERT INTO inbox VALUES (%(order_id)s) RETURNING 1", r"%\(event_id\)s"),
    ("SELECT 1 WHERE 'evt' LIKE 'e%' AND %(event_id)s IS NOT NULL", "%%"),
    # the same statement for every event: the checker would learn nothing about copies
    ("INSERT INTO inbox VALUES ('evt-0001') ON CONFLICT DO NOTHING RETURNING 1",
     r"does not use %\(event_id\)s"),
    # two statements: the brief asks for one (the server's extended protocol refuses two)
    ("INSERT INTO inbox VALUES (%(event_id)s) ON CONFLICT DO NOTHING; SELECT %(event_id)s",
     "one statement"),
])
def test_bad_input_is_refused_with_the_fix(lab, sql_text, match):
    with pytest.raises(LabkitError, match=match) as err:
        ex.check_record(lab, sql_text)
    assert "Fix:" in str(err.value)
