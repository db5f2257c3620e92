"""Notebook 19's exercise the server checks: the claim-and-mark on MySQL / MariaDB, without
UPDATE ... RETURNING (labkit.tools.exercises.mysql).

The reference answer passes; each typical wrong answer fails with the finding that names
its mistake, read from the server.  The tests that need a server are marked needs_mysql
(one skip line without one); bad input and the missing server need none.
"""

from __future__ import annotations

import pytest

from labkit.core import mysql
from labkit.core.errors import LabkitError
from labkit.tools.exercises import mysql as checks

ANSWER = """
SET @job = NULL;
SELECT id INTO @job FROM job WHERE status = 'PENDING' ORDER BY created_at LIMIT 1
   FOR UPDATE SKIP LOCKED;
UPDATE job SET status = 'IN_PROGRESS', worker_id = %(worker_id)s, claimed_at = NOW(6)
 WHERE id = @job;
SELECT @job AS id;
"""
# the workbook's PostgreSQL claim, as the notebook's exercise starts
POSTGRES = """
WITH picked AS (
    SELECT id FROM job WHERE status = 'PENDING' ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED
)
UPDATE job SET status = 'IN_PROGRESS', worker_id = %(worker_id)s, claimed_at = now()
  FROM picked WHERE job.id = picked.id
RETURNING job.id;
"""


@pytest.fixture
def mylab():
    reason = mysql.skip_reason()
    if reason is not None:
        pytest.skip(reason)
    lab = mysql.MyLab.open(mysql.find(), "pytest_ex_mysql")
    try:
        yield lab
    finally:
        lab.drop()


def findings(check) -> dict[str, bool]:
    return {text: ok for ok, text in check.findings}


def wrong(check) -> list[str]:
    return [text for ok, text in check.findings if not ok]


def no_scratch_left(lab) -> bool:
    rows = lab.execute("SELECT SCHEMA_NAME FROM information_schema.SCHEMATA WHERE SCHEMA_NAME LIKE %s",
                       ("labkit\\_check\\_%",))
    return rows == []


@pytest.mark.needs_mysql
def test_the_reference_answer_passes_and_leaves_no_scratch_database(mylab):
    check = checks.check_claim_mark(mylab, ANSWER)
    assert check.passed, str(check)
    assert "read back: A 6, B 5, C 4" in str(check)
    assert "PASS: 3 workers claim and mark at once (READ COMMITTED)" in str(check)
    assert no_scratch_left(mylab)


@pytest.mark.needs_mysql
def test_a_list_of_statements_and_the_mariadb_sub_select_pass_too(mylab):
    assert checks.check_claim_mark(mylab, [s for s in ANSWER.split(";") if s.strip()]).passed
    if mylab.server.flavour == "MariaDB":     # MySQL refuses an UPDATE reading its own table (1093)
        sub_select = """
        UPDATE job SET status = 'IN_PROGRESS', worker_id = %(worker_id)s, claimed_at = NOW(6)
         WHERE id = (SELECT id FROM job WHERE status = 'PENDING' ORDER BY created_at LIMIT 1
                       FOR UPDATE SKIP LOCKED);
        SELECT id FROM job WHERE worker_id = %(worker_id)s AND status = 'IN_PROGRESS';
        """
        assert checks.check_claim_mark(mylab, sub_select).passed


@pytest.mark.needs_mysql
def test_the_postgresql_claim_fails_with_the_servers_syntax_error(mylab):
    check = checks.check_claim_mark(mylab, POSTGRES)
    [text] = wrong(check)
    assert text.startswith("the statements failed on the server: A: ERROR 1064")
    assert "(and the same for B, C)" in text and "\n" not in text
    assert "no UPDATE ... RETURNING" in check.hint and "hint" in str(check)


@pytest.mark.needs_mysql
def test_plain_for_update_fails_because_the_workers_wait(mylab):
    check = checks.check_claim_mark(mylab, ANSWER.replace(" SKIP LOCKED", ""))
    [text] = wrong(check)
    assert text.startswith("worker(s) waited for another one's lock: B for A")


@pytest.mark.needs_mysql
def test_the_right_statements_under_repeatable_read_wait_in_the_gaps_and_say_so(mylab):
    check = checks.check_claim_mark(mylab, ANSWER, isolation="REPEATABLE READ")
    [text] = wrong(check)
    assert text == "worker(s) waited for another one's lock: B for A; C for A"
    assert check.hint == checks.GAP_HINT


@pytest.mark.needs_mysql
def test_a_claim_that_never_marks_fails_on_the_table_after_commit(mylab):
    claim_only = "SELECT id FROM job WHERE status = 'PENDING' ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED"
    [text] = wrong(checks.check_claim_mark(mylab, claim_only))
    assert text.startswith("after COMMIT the jobs are not marked IN_PROGRESS by their workers")
    assert "A's job 6 reads PENDING/-" in text


@pytest.mark.needs_mysql
def test_a_commit_between_claim_and_mark_is_found_by_a_nowait_probe(mylab):
    early = ANSWER.replace("SKIP LOCKED;", "SKIP LOCKED; COMMIT;")
    [text] = wrong(checks.check_claim_mark(mylab, early))
    assert text.startswith("before COMMIT the job of A, B, C was not locked any more")


@pytest.mark.needs_mysql
def test_a_mark_that_reads_back_nothing_or_marks_every_row_fails(mylab):
    silent = ANSWER.replace("SELECT @job AS id;", "")
    assert "each worker read back the id of its job (read back: A -, B -, C -)" in wrong(
        checks.check_claim_mark(mylab, silent))
    everything = ANSWER.replace(" WHERE id = @job", "")
    texts = wrong(checks.check_claim_mark(mylab, everything))
    assert texts[0].startswith("worker(s) waited for another one's lock")   # every row: a convoy


@pytest.mark.needs_mysql
@pytest.mark.parametrize("answer, words", [
    ("", "The SQL to check is empty"),
    ("  ;  -- nothing\n", "The SQL to check is empty"),
    ([], "The SQL to check is empty"),
    (42, "must be SQL text"),
    ("SELECT %(worker)s", "could not be filled in"),
    ("SELECT id FROM job WHERE payload LIKE 'a%'", "write a literal % as %%"),
    (";".join(["SELECT 1"] * 9), "at most 8 statements"),
])
def test_bad_input_names_the_fix(mylab, answer, words):
    with pytest.raises(LabkitError) as err:
        checks.check_claim_mark(mylab, answer)
    assert words in str(err.value) and "Fix:" in str(err.value)
    assert no_scratch_left(mylab)


@pytest.mark.needs_mysql
def test_bad_arguments_name_the_fix(mylab):
    with pytest.raises(LabkitError, match="2 to 5 workers"):
        checks.check_claim_mark(mylab, ANSWER, workers=9)
    with pytest.raises(LabkitError, match="not one of the levels"):
        checks.check_claim_mark(mylab, ANSWER, isolation="SERIALIZABLE")
    with pytest.raises(LabkitError, match="runs on the MySQL-compatible server"):
        checks.check_claim_mark(object(), ANSWER)


def test_without_a_server_the_checker_says_so_and_how_to_get_one(monkeypatch):
    monkeypatch.setenv(mysql.ENV, "off")
    monkeypatch.setattr(mysql, "_cached", None)
    with pytest.raises(mysql.NoServer) as err:
        checks.check_claim_mark(None, ANSWER)
    assert "turns the cross-engine appendix off" in str(err.value)
    assert "Fix: unset LABKIT_MYSQL_DSN" in str(err.value)
