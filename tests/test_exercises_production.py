"""The heartbeat exercise's checker, on the real server: the workbook's fenced heartbeat
passes, and each typical wrong one fails with the finding that names what broke."""

import pytest

from labkit.core.errors import LabkitError
from labkit.core.queries import query
from labkit.tools.exercises import production as ex

RIGHT = """
UPDATE job
   SET lease_until = now() + %(lease)s::interval
 WHERE id = %(id)s AND claim_version = %(claim_version)s AND status = 'RUNNING'
"""

# The notebook's starting point: the heartbeat fenced by nothing but the job's id.
UNFENCED = "UPDATE job SET lease_until = now() + %(lease)s::interval WHERE id = %(id)s"
VERSION_ONLY = ("UPDATE job SET lease_until = now() + %(lease)s::interval "
                "WHERE id = %(id)s AND claim_version = %(claim_version)s")
STATUS_ONLY = ("UPDATE job SET lease_until = now() + %(lease)s::interval "
               "WHERE id = %(id)s AND status = 'RUNNING'")
FROM_OLD_LEASE = RIGHT.replace("now() + %(lease)s", "lease_until + %(lease)s")
# Fenced by the worker's name: right until the same worker claims the job again.
OWNER_NAME = ("UPDATE job SET lease_until = now() + %(lease)s::interval "
              "WHERE id = %(id)s AND claimed_by = %(worker)s AND status = 'RUNNING'")


def _verdicts(check) -> list[bool]:
    return [ok for ok, _ in check.findings]


def _wrong(check) -> str:
    return "\n".join(text for ok, text in check.findings if not ok)


def _schemas(lab) -> set[str]:
    return {r[0] for r in lab.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'drill_check%%'")}


def test_the_fenced_heartbeat_passes_and_leaves_no_scratch_schema(lab):
    before = _schemas(lab)
    result = ex.check_heartbeat(lab, RIGHT)
    assert result.passed, str(result)
    assert _verdicts(result) == [True] * 5
    assert "matched 1 row and moved the lease to now + 30 s" in result.findings[0][1]
    assert all("matched 0 rows and changed nothing" in t for _, t in result.findings[1:])
    assert "hint" not in str(result)
    assert _schemas(lab) - before == set()


def test_the_workers_own_heartbeat_passes_with_the_lease_in_seconds(lab):
    result = ex.check_heartbeat(lab, query("lifecycle.sql", "heartbeat").text, lease="45 seconds")
    assert result.passed, str(result)
    assert "now + 45 s" in result.findings[0][1]


def test_the_unfenced_heartbeat_extends_the_zombies_and_the_finished_jobs_lease(lab):
    result = ex.check_heartbeat(lab, UNFENCED)
    assert not result.passed
    assert _verdicts(result) == [True, False, False, False, False]
    wrong = _wrong(result)
    assert "job 2: worker 2 claimed it again" in wrong and "matched 1 row and changed lease_until" in wrong
    assert "the zombie kept worker 2's claim alive" in wrong
    assert "the next claim runs it again" in wrong and "a finished job was given a lease" in wrong
    # the hint says where to look, never the clause
    assert "hint" in str(result) and "Compare each WRONG job with job 1" in result.hint
    assert not any(word in result.hint for word in ("claim_version", "RUNNING", "status", "="))


def test_a_version_fence_alone_lets_the_heartbeat_reach_a_job_that_is_no_longer_running(lab):
    result = ex.check_heartbeat(lab, VERSION_ONLY)
    assert _verdicts(result) == [True, True, True, False, False]
    assert "job 4: the reaper handed it back" in _wrong(result)


def test_a_status_fence_alone_lets_the_zombie_keep_the_new_owners_claim_alive(lab):
    result = ex.check_heartbeat(lab, STATUS_ONLY)
    assert _verdicts(result) == [True, False, False, True, True]
    assert "the zombie kept worker 2's claim alive" in _wrong(result)


@pytest.mark.parametrize("sql", [OWNER_NAME, OWNER_NAME.replace("%(worker)s", "'worker 1'")])
def test_a_fence_on_the_workers_name_fails_once_the_same_worker_claims_the_job_again(lab, sql):
    result = ex.check_heartbeat(lab, sql)
    assert _verdicts(result) == [True, True, False, True, True]
    assert "job 3: worker 1 claimed it again itself (version 2)" in _wrong(result)
    assert "two handlers of one job" in _wrong(result)


def test_a_lease_extended_from_its_old_end_is_refused(lab):
    result = ex.check_heartbeat(lab, FROM_OLD_LEASE)
    assert _verdicts(result) == [False, True, True, True, True]
    assert "the lease now ends 35 s from now" in _wrong(result)


def test_a_heartbeat_that_forgets_the_id_or_changes_more_than_the_lease_is_refused(lab):
    no_id = ex.check_heartbeat(lab, "UPDATE job SET lease_until = now() + %(lease)s::interval "
                                    "WHERE claim_version = %(claim_version)s AND status = 'RUNNING'")
    # worker 1's only RUNNING claim at version 1 is job 1: every other heartbeat moves its lease
    assert _verdicts(no_id) == [True, False, False, False, False]
    assert _wrong(no_id).count("changed job 1's lease_until instead") == 4
    bumped = ex.check_heartbeat(lab, RIGHT.replace("SET lease_until", "SET claim_version = claim_version + 1, "
                                                                      "lease_until"))
    assert _verdicts(bumped) == [False, True, True, True, True]
    assert "changed claim_version as well as the lease" in _wrong(bumped)
    nothing = ex.check_heartbeat(lab, "SELECT id FROM job WHERE id = %(id)s AND claim_version = %(claim_version)s "
                                      "AND status = 'RUNNING' AND %(lease)s IS NOT NULL")
    assert not nothing.passed and "the lease now ends 5 s from now" in nothing.findings[0][1]


def test_more_than_one_statement_is_refused_by_the_server(lab):
    # a harmless statement after the right one: still refused, before any row changes
    result = ex.check_heartbeat(lab, RIGHT + "; UPDATE job SET lease_until = now() WHERE id = %(id)s AND false")
    assert not result.passed and len(result.findings) == 1
    assert "more than one statement, and the server refused it" in result.findings[0][1]
    assert ex.check_heartbeat(lab, RIGHT + ";").passed           # one statement, with its semicolon


def test_a_statement_that_reports_no_rows_but_changes_them_is_named_for_what_it_did(lab):
    hidden = ("WITH x AS (UPDATE job SET lease_until = now() + %(lease)s::interval WHERE id = %(id)s "
              "RETURNING id) SELECT id FROM x WHERE false")
    result = ex.check_heartbeat(lab, hidden)
    assert _verdicts(result) == [False, False, False, False, False]
    assert _wrong(result).count("reported 0 rows, yet it changed lease_until") == 4


def test_sql_that_fails_on_the_server_is_a_finding(lab):
    result = ex.check_heartbeat(lab, RIGHT.replace("WHERE", "WHER"))
    assert not result.passed and len(result.findings) == 1
    assert "the heartbeat for job 1 failed: SyntaxError" in result.findings[0][1]


@pytest.mark.parametrize("sql, fix", [
    ("", "write your statement"),
    ("   ", "write your statement"),
    ("UPDATE job SET claimed_by = %(owner)s",
     "use only %(id)s, %(claim_version)s, %(lease)s, %(lease_s)s, %(worker)s"),
    (None, "write your statement")])
def test_bad_sql_is_refused_with_the_fix(lab, sql, fix):
    with pytest.raises(LabkitError, match="Fix:") as err:
        ex.check_heartbeat(lab, sql)
    assert fix in str(err.value)


@pytest.mark.parametrize("lease", ["5 seconds", "2 hours", "banana", "-30 seconds", 30, ""])
def test_a_bad_lease_is_refused_with_the_fix(lab, lease):
    with pytest.raises(LabkitError, match="lease='30 seconds'"):
        ex.check_heartbeat(lab, RIGHT, lease=lease)
