"""Notebook 10's self-check on a real server: "who holds the horizon" passes the reference
answer and fails each typical wrong one with the finding that names its mistake; bad input
is refused before any scene is built; the scene's sessions and database are gone after."""

import json
import os
import re
from pathlib import Path

import pytest
from conftest import backends_gone

from labkit.core.errors import LabkitError
from labkit.tools.exercises import horizon as ex

REFERENCE = """
SELECT pid
  FROM pg_stat_activity
 WHERE (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
   AND pid <> pg_backend_pid()
 ORDER BY greatest(age(backend_xmin), age(backend_xid)) DESC
"""
# the notebook's starting point: the symptom, not the cause, and in this database only
STARTING = """
SELECT pid
  FROM pg_stat_activity
 WHERE state = 'idle in transaction'
   AND datname = current_database()
"""
NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "10_the_mvcc_horizon.ipynb"


def _wrong(check) -> list[str]:
    return [text for ok, text in check.findings if not ok]


def _databases(db) -> set[str]:
    with db.connect() as conn:
        return {r[0] for r in conn.execute("SELECT datname FROM pg_database")}


def test_the_reference_answer_passes_and_leaves_nothing_behind(lab, db):
    before = _databases(db)
    check = ex.check_holders(lab, REFERENCE)
    assert check.passed, str(check)
    assert [ok for ok, _ in check.findings] == [True] * 5
    assert "oldest first" in check.findings[-1][1]
    assert "in another database" in check.findings[1][1]          # postgres, or a throw-away one
    assert str(check).startswith("PASS: who holds the horizon")
    assert _databases(db) == before                                # a throw-away database is gone
    # every session of the scene is closed
    assert backends_gone(db, f"labkit:lab_drill_check_{os.getpid()}_%") == []


def test_the_writer_sits_in_a_database_of_the_checks_own_dropped_after(lab, db, monkeypatch):
    # another run's throw-away database may be dropped by its owner while the writer sits in
    # it: the check makes its own, named after its scratch schema, and drops it at the end
    with db.connect() as conn:
        may_create = conn.execute("SELECT rolcreatedb OR rolsuper FROM pg_roles "
                                  "WHERE rolname = current_user").fetchone()[0]
    if not may_create:
        pytest.skip("this role may not create a database: the check falls back to an existing one")
    seen = []
    real = ex._writer_elsewhere

    def spy(work, dbname):
        seen.append((work.schema, dbname, dbname in _databases(db)))
        return real(work, dbname)

    monkeypatch.setattr(ex, "_writer_elsewhere", spy)
    check = ex.check_holders(lab, REFERENCE)
    assert check.passed, str(check)
    [(schema, dbname, existed)] = seen
    assert (dbname, existed) == (f"{schema}_other", True)
    assert dbname not in _databases(db)


def test_the_checker_knows_the_notebooks_starting_query():
    cell = next("".join(c["source"]) for c in json.loads(NOTEBOOK.read_text())["cells"]
                if "".join(c["source"]).startswith("MY_HOLDERS = "))
    starter = re.match(r'MY_HOLDERS = """(.*?)"""', cell, re.S).group(1)
    assert ex.is_starter(starter) and ex.is_starter(STARTING)
    # spacing, case and a closing semicolon aside; any other change is an attempt
    assert ex.is_starter(" ".join(STARTING.split()).lower() + ";")
    assert not ex.is_starter(STARTING + " ORDER BY pid")
    assert not ex.is_starter(STARTING.replace("datname = current_database()", "true"))


def test_the_starting_point_misses_the_writer_and_names_an_innocent(lab):
    check = ex.check_holders(lab, STARTING)
    assert not check.passed
    wrong = _wrong(check)
    assert len(wrong) == 2, str(check)
    assert wrong[0].startswith("the writer idle in a transaction in another database did not come back")
    assert wrong[1].startswith("the session idle in a READ COMMITTED transaction came back")
    assert check.findings[0] == (True, "the REPEATABLE READ report idle in its transaction came "
                                       "back (it held a snapshot)")
    # the untouched starter is told what is wrong and asked for an attempt, without the hint
    assert check.hint == ex.STARTER_HINT and "change it and run the cell again" in str(check)
    assert ex.HOLDERS_HINT not in str(check) and "pg_stat_activity" not in str(check)
    # what went wrong on the server, never the query to write: no column, no function
    for text in [*wrong, check.hint, ex.HOLDERS_HINT]:
        assert "backend_xid" not in text and "pg_backend_pid" not in text and "age(" not in text


def test_a_snapshot_only_query_misses_the_writer_and_returns_itself(lab):
    check = ex.check_holders(lab, "SELECT pid FROM pg_stat_activity WHERE backend_xmin IS NOT NULL")
    wrong = _wrong(check)
    assert len(wrong) == 2, str(check)
    assert "writer" in wrong[0] and "did not come back" in wrong[0]
    assert wrong[1].startswith("the query's own session came back")


@pytest.mark.parametrize("order", ["age(backend_xmin) DESC",       # the writer has none: NULLs first
                                   "xact_start"])                   # the writer began first
def test_holders_in_the_wrong_order_fail_on_the_order_alone(lab, order):
    check = ex.check_holders(lab, f"""
        SELECT pid FROM pg_stat_activity
         WHERE (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL) AND pid <> pg_backend_pid()
         ORDER BY {order}""")
    wrong = _wrong(check)
    assert len(wrong) == 1, str(check)
    assert wrong[0].startswith("the holders came back youngest hold first: the writer's")
    assert "backend_" not in wrong[0] and "age(" not in wrong[0]


def test_every_idle_in_transaction_session_anywhere_names_the_innocent_one(lab):
    check = ex.check_holders(lab, "SELECT pid FROM pg_stat_activity WHERE state = 'idle in transaction' "
                                  "ORDER BY greatest(age(backend_xmin), age(backend_xid)) DESC")
    wrong = _wrong(check)
    assert len(wrong) == 1 and "READ COMMITTED" in wrong[0], str(check)
    # an attempt of the learner's own, still wrong: the hint comes with it
    assert check.hint == ex.HOLDERS_HINT and "hint" in str(check)


def test_every_session_names_the_idle_one_and_its_own(lab):
    check = ex.check_holders(lab, "SELECT pid FROM pg_stat_activity")
    wrong = " | ".join(_wrong(check))
    assert "the idle session came back: it sat outside any transaction, holding nothing" in wrong
    assert "the query's own session came back: the snapshot it showed was your query's own" in wrong
    assert "pg_backend_pid" not in wrong


def test_a_query_that_fails_or_returns_no_pids_says_so(lab):
    failed = ex.check_holders(lab, "SELECT pid FROM pg_stat_activity WHERE nothing_here")
    assert _wrong(failed)[0].startswith("the query failed: UndefinedColumn")
    names = ex.check_holders(lab, "SELECT application_name, pid FROM pg_stat_activity")
    assert _wrong(names)[0].startswith("the first column should hold pids")
    updated = ex.check_holders(lab, "SET application_name = 'x'")
    assert _wrong(updated)[0].startswith("the statement returned no rows at all")


@pytest.mark.parametrize("sql, fix", [
    ("", "write your statement"),
    ("   \n", "write your statement"),
    (None, "write your statement"),
    ("SELECT pid FROM pg_stat_activity WHERE pid = %(pid)s", "takes no parameters"),
    ("SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'labkit%'", "write a literal % as %%"),
])
def test_bad_input_is_refused_before_any_scene_is_built(lab, db, sql, fix):
    before = _databases(db)
    with pytest.raises(LabkitError) as err:
        ex.check_holders(lab, sql)
    assert fix in str(err.value) and "Fix:" in str(err.value)
    assert _databases(db) == before
    with db.connect() as conn:                    # no scratch schema was made either
        assert conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname LIKE %s",
                            (f"lab_drill_check_{os.getpid()}_%",)).fetchone()[0] == 0


def test_with_no_other_database_to_reach_the_writer_sits_in_this_one_and_the_title_says_so(
        lab, db, monkeypatch):
    # a server whose pg_hba.conf lets the role into no other database: the connection fails
    monkeypatch.setattr(ex, "_writer_elsewhere", lambda lab, dbname: None)
    before = _databases(db)
    check = ex.check_holders(lab, REFERENCE)
    assert check.passed, str(check)
    assert check.title.endswith("(the writer in this database: no other could be reached)")
    assert "the writer idle in a transaction in this database came back" in check.findings[1][1]
    assert _databases(db) == before
    assert backends_gone(db, f"labkit:lab_drill_check_{os.getpid()}_%") == []
