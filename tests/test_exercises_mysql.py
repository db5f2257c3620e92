"""Notebook 21's exercise the server checks: the claim-and-mark on MySQL / MariaDB, without
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
    assert check.hint == checks.HINTS["failed"] and "where the server's parser stopped" in str(check)


@pytest.mark.needs_mysql
def test_plain_for_update_fails_because_the_workers_wait(mylab):
    check = checks.check_claim_mark(mylab, ANSWER.replace(" SKIP LOCKED", ""))
    [text] = wrong(check)
    assert text.startswith("worker(s) waited for another one's lock: B for A (at statement 2)")
    assert check.hint == checks.HINTS["waited"]


@pytest.mark.needs_mysql
def test_the_right_statements_under_repeatable_read_wait_in_the_gaps_and_say_so(mylab):
    check = checks.check_claim_mark(mylab, ANSWER, isolation="REPEATABLE READ")
    [text] = wrong(check)
    assert text == ("worker(s) waited for another one's lock: B for A (at statement 3); C for A "
                    "(at statement 3)")
    assert check.hint == checks.GAP_HINT


@pytest.mark.needs_mysql
def test_a_wait_that_ends_late_on_a_loaded_machine_is_still_a_wait_not_a_timeout(mylab, monkeypatch):
    # Under load the holder's way to its COMMIT (its last statements, then the NOWAIT probe of
    # every job) has taken seconds: the waiting workers must still be waiting when it commits,
    # and the verdict the same as on an idle machine.
    import time

    probe = checks._locked_jobs

    def slow_probe(*args, **kwargs):
        time.sleep(2.5)
        return probe(*args, **kwargs)

    monkeypatch.setattr(checks, "_locked_jobs", slow_probe)
    check = checks.check_claim_mark(mylab, ANSWER, isolation="REPEATABLE READ")
    [text] = wrong(check)
    assert text.startswith("worker(s) waited for another one's lock: B for A")
    assert check.hint == checks.GAP_HINT


@pytest.mark.needs_mysql
def test_a_claim_that_never_marks_fails_on_the_table_after_commit(mylab):
    claim_only = "SELECT id FROM job WHERE status = 'PENDING' ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED"
    check = checks.check_claim_mark(mylab, claim_only)
    [text] = wrong(check)
    assert text == ("after COMMIT A's job 6, B's job 5, C's job 4 are still PENDING: the next claim "
                    "takes them again")
    assert check.hint == checks.HINTS["marked"]


@pytest.mark.needs_mysql
def test_a_mark_without_the_worker_says_the_jobs_are_in_progress_under_no_one(mylab):
    anonymous = ANSWER.replace("worker_id = %(worker_id)s, ", "")
    [text] = wrong(checks.check_claim_mark(mylab, anonymous))
    assert text.startswith("after COMMIT A's job 6, B's job 5, C's job 4 read IN_PROGRESS under "
                           "no worker_id")
    assert "takes them again" not in text


@pytest.mark.needs_mysql
def test_a_commit_between_claim_and_mark_is_found_by_a_nowait_probe(mylab):
    early = ANSWER.replace("SKIP LOCKED;", "SKIP LOCKED; COMMIT;")
    check = checks.check_claim_mark(mylab, early)
    [text] = wrong(check)
    assert text.startswith("just before its COMMIT, A, B, C held no lock on the job it took (6, 5, 4)")
    assert check.hint == checks.HINTS["released"]


@pytest.mark.needs_mysql
def test_a_claim_in_id_order_says_who_took_what_and_that_one_worker_locked_every_job(mylab):
    by_id = ANSWER.replace("ORDER BY created_at", "ORDER BY id")
    check = checks.check_claim_mark(mylab, by_id)
    texts = wrong(check)
    assert texts[0] == ("B, C read back no job (no row, or NULL) although 5 jobs were still "
                        "PENDING after every commit")
    assert texts[1].startswith("the workers took: A job 1 (B, C: none); the oldest, jobs 4, 5, 6")
    assert texts[2].startswith("A held the locks of jobs 1, 2, 3, 4, 5, 6 until its COMMIT, though "
                               "it took only job 1")
    assert len(texts) == 3 and check.hint == checks.HINTS["no_job"]


@pytest.mark.needs_mysql
def test_a_mark_that_reads_back_nothing_or_marks_every_row_fails(mylab):
    silent = ANSWER.replace("SELECT @job AS id;", "")
    check = checks.check_claim_mark(mylab, silent)
    # one finding, and no others falling with it: the jobs are judged on the rows each marked
    assert wrong(check) == ["no statement of A, B, C returned rows, so that worker cannot tell "
                            "which job it holds"]
    assert check.hint == checks.HINTS["read_back"]
    everything = ANSWER.replace(" WHERE id = @job", "")
    texts = wrong(checks.check_claim_mark(mylab, everything))
    assert texts[0].startswith("worker(s) waited for another one's lock")   # every row: a convoy


def test_no_hint_gives_the_answer_away():
    for hint in [*checks.HINTS.values(), checks.GAP_HINT]:
        for piece in ("@job", "SELECT id INTO", "SET @", "SKIP LOCKED", "WHERE id ="):
            assert piece not in hint, (piece, hint)


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
