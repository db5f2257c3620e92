"""Notebook 12's exercise on the real server: a lock_timeout for one transaction behind a
transaction pooler.  The reference answers pass; each typical wrong answer fails with the
finding that names its mistake, read from the server; nothing is left behind."""

import os

import pytest
from conftest import backends_gone

from labkit.core.errors import LabkitError
from labkit.tools.exercises import wakeups


def wrong(check) -> list[str]:
    return [text for ok, text in check.findings if not ok]


def said(check) -> str:
    """Every finding, unwrapped."""
    return " | ".join(text for _, text in check.findings)


@pytest.mark.parametrize("answer", ["SET LOCAL lock_timeout = '2s'",
                                    "SELECT set_config('lock_timeout', '2s', true)",
                                    "SET LOCAL lock_timeout = 2000"])
def test_a_setting_that_ends_with_the_transaction_passes(lab, answer):
    check = wakeups.check_lock_timeout(lab, answer)
    assert check.passed, str(check)
    assert "gave up with a lock timeout after about 2 s" in said(check)
    assert "starts with lock_timeout 0, the connection's default" in said(check)
    assert "hint" not in str(check)


@pytest.mark.parametrize("leaky", ["SET lock_timeout = '2s'", "SET SESSION lock_timeout = '2s'",
                                   "SELECT set_config('lock_timeout', '2s', false)"])
def test_a_plain_set_works_inside_and_leaks_to_the_next_client(lab, leaky):
    check = wakeups.check_lock_timeout(lab, leaky)
    assert not check.passed
    [finding] = wrong(check)
    assert "starts with lock_timeout 2s: A's setting leaked to another client" in finding
    assert check.findings[0][0] is True and "gave up with a lock timeout" in check.findings[0][1]
    assert check.hint == wakeups.HINTS["leaked"] and "hint" in str(check)
    assert "LOCAL" not in str(check) and "set_config" not in str(check)   # the way, not the answer


@pytest.mark.parametrize("answer, why", [
    ("SET LOCAL statement_timeout = '2s'", "inside"),
    ("SET LOCAL lock_timeout = 'soon'", "failed"),
    ("SET LOCAL lock_timeout = '2s'; COMMIT", "ended"),
    ("SET LOCAL lock_timeout = '2s'; SET LOCAL statement_timeout = '1s'", "gave_up"),
])
def test_each_mistake_gets_the_hint_that_says_where_to_look(lab, answer, why):
    check = wakeups.check_lock_timeout(lab, answer)
    assert not check.passed and check.hint == wakeups.HINTS[why], str(check)
    for hint in wakeups.HINTS.values():
        assert "LOCAL" not in hint and "set_config" not in hint and "'2s'" not in hint


def test_another_setting_that_stops_the_update_first_is_wrong_not_a_crash(lab):
    check = wakeups.check_lock_timeout(
        lab, "SET LOCAL lock_timeout = '2s'; SET LOCAL statement_timeout = '1s'")
    [finding] = wrong(check)
    assert "ended with QueryCanceled" in finding and "after about 2 s" not in finding


def test_the_wrong_setting_never_applies_inside(lab):
    check = wakeups.check_lock_timeout(lab, "SET LOCAL statement_timeout = '2s'")
    [finding] = wrong(check)
    assert "lock_timeout is 0, not 2s" in finding and "wait for ever" in finding


def test_another_value_is_not_the_one_asked_for(lab):
    check = wakeups.check_lock_timeout(lab, "SET LOCAL lock_timeout = '5min'")
    [finding] = wrong(check)
    assert "lock_timeout is 5min, not 2s" in finding


def test_ending_the_transaction_is_found(lab):
    check = wakeups.check_lock_timeout(lab, "SET LOCAL lock_timeout = '2s'; COMMIT")
    found = wrong(check)
    assert any("ended client A's transaction" in f for f in found), str(check)


def test_a_role_setting_is_found_and_undone(lab, db):
    with db.connect() as conn:
        before = conn.execute("SELECT setdatabase, setrole, setconfig FROM pg_db_role_setting "
                              "ORDER BY 1, 2").fetchall()
    check = wakeups.check_lock_timeout(lab, "ALTER ROLE CURRENT_USER SET lock_timeout = '2s'")
    found = wrong(check)
    assert any("changed a role's or a database's settings" in f for f in found), str(check)
    with db.connect() as conn:
        after = conn.execute("SELECT setdatabase, setrole, setconfig FROM pg_db_role_setting "
                             "ORDER BY 1, 2").fetchall()
        assert conn.execute("SHOW lock_timeout").fetchone()[0] != "2s"
    assert after == before


def test_sql_that_fails_is_a_finding(lab):
    check = wakeups.check_lock_timeout(lab, "SET LOCAL lock_timeout = 'soon'")
    [finding] = wrong(check)
    assert finding.startswith("the SQL failed: InvalidParameterValue")


@pytest.mark.parametrize("bad, fix", [("", "empty"), ("   ", "empty"), (None, "empty"),
                                      ("SET LOCAL lock_timeout = %(t)s", "no parameters"),
                                      ("SET LOCAL lock_timeout = '2s' -- 100%", "%%")])
def test_bad_input_names_the_fix(lab, bad, fix):
    with pytest.raises(LabkitError, match=fix) as err:
        wakeups.check_lock_timeout(lab, bad)
    assert "Fix:" in str(err.value)


def test_nothing_is_left_behind(lab, db):
    wakeups.check_lock_timeout(lab, "SET lock_timeout = '2s'")
    wakeups.check_lock_timeout(lab, "SELECT 1/0")
    mine = f"lab_drill_check_{os.getpid()}_%"
    assert backends_gone(db, f"labkit:{mine}") == []
    with db.connect() as conn:
        left = conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname LIKE %s",
                            (mine,)).fetchone()[0]
    assert left == 0
