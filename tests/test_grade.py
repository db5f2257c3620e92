"""The grader: a correct claim passes; each known-wrong claim fails for its own reason."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from labkit import cli
from labkit.core.errors import LabkitError
from labkit.core.files import data_file
from labkit.tools import grade

ANSWERS = data_file("grader")

# file -> (the diagnosis it must get, diagnoses it must not get)
EXPECTED = {
    "wrong_plain_for_update.sql": ("convoy", {"nowait_error_storm", "no_status_update"}),
    "wrong_nowait.sql": ("nowait_error_storm", {"convoy"}),
    "wrong_no_order_by.sql": ("no_order_by", {"convoy", "no_limit", "scans_history"}),
    "wrong_no_status_update.sql": ("no_status_update", {"convoy", "work_inside_claim"}),
    "wrong_no_limit.sql": ("no_limit", {"no_order_by", "convoy"}),
    "wrong_no_index.sql": ("scans_history", {"no_order_by", "convoy", "no_limit"}),
    "wrong_held_open.sql": ("work_inside_claim", {"convoy", "no_limit"}),
    "wrong_syntax.sql": ("syntax_error", {"not_a_claim"}),
    "wrong_not_a_claim.sql": ("not_a_claim", {"syntax_error"}),
}


@pytest.fixture(scope="module")
def graded(db):
    """Each sample answer graded once (3 workers, 90 jobs), shared by the tests below."""
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = grade.grade_claim(ANSWERS / name, db=db, workers=3, jobs=90)
        return cache[name]
    return get


def test_every_sample_answer_is_covered():
    assert {p.name for p in ANSWERS.glob("wrong_*.sql")} == set(EXPECTED)


@pytest.mark.parametrize("name", ["correct.sql", "correct_script.sql"])
def test_a_correct_claim_passes_and_its_crash_leaves_a_recoverable_claim(graded, name):
    r = graded(name)
    assert r.verdict == "pass" and r.problems == [], r.to_text()
    assert r.double_claims == 0 and r.duplicate_runs == 0 and r.lost_jobs == 0
    assert r.uses_index and r.work_inside_claim is False
    assert r.killed.startswith("g")
    # The killed worker's claim stays IN_PROGRESS with owner and time: a reaper's work.
    assert r.stuck_jobs >= 1 and r.stuck_recoverable == r.stuck_jobs
    assert r.unclaimed_jobs == 0


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_wrong_claim_gets_its_own_diagnosis(graded, name):
    want, not_wanted = EXPECTED[name]
    r = graded(name)
    assert r.verdict == "fail"
    assert want in r.codes, r.to_text()
    assert not (not_wanted & set(r.codes)), r.to_text()
    assert all(p.explain == grade.EXPLAIN[p.code] for p in r.problems)


def test_measured_harm_matches_the_diagnosis(graded):
    no_update = graded("wrong_no_status_update.sql")
    assert no_update.double_claims > 0          # the same job handed to several workers
    held = graded("wrong_held_open.sql")
    assert held.work_inside_claim is True
    assert held.duplicate_runs == 1             # the killed worker's job ran again elsewhere
    assert held.stuck_jobs == 0                 # the rollback put it back: no trace of the claim
    hoard = graded("wrong_no_limit.sql")
    # a claim with LIMIT 1 strands at most one job; this one strands its share of the whole queue
    # (how big a share depends on how the workers' first claims overlapped)
    assert hoard.stuck_jobs > 1
    nowait = graded("wrong_nowait.sql")
    assert nowait.probe.startswith("B failed at once: ERROR 55P03")
    noidx = graded("wrong_no_index.sql")
    assert noidx.uses_index is False and "Seq Scan" in noidx.plan
    assert noidx.plan_buffers > grade.HISTORY_PAGES


def test_runtime_errors_empty_files_and_bad_parameters_are_reported(db):
    r = grade.grade_claim("SELECT nope FROM job FOR UPDATE SKIP LOCKED", db=db)
    assert r.codes == ["sql_error"] and "nope" in r.problems[0].evidence
    assert grade.grade_claim("-- nothing here\n", db=db).codes == ["empty"]
    bad = grade.grade_claim("UPDATE job SET worker_id = %(me)s WHERE id = 1 RETURNING id", db=db)
    assert bad.codes == ["bad_parameter"]
    pct = grade.grade_claim("SELECT id % 2 FROM job FOR UPDATE", db=db)
    assert pct.codes == ["bad_parameter"]
    other = grade.grade_claim("SELECT 'x' AS id", db=db)
    assert other.codes == ["not_a_claim"]


def test_bad_grader_settings_name_the_fix():
    with pytest.raises(LabkitError, match="workers=2"):
        grade.grade_claim("SELECT 1", workers=1)
    with pytest.raises(LabkitError, match="jobs="):
        grade.grade_claim("SELECT 1", workers=4, jobs=5)
    with pytest.raises(LabkitError, match="No SQL file"):
        grade.grade_claim(Path("/nonexistent/claim.sql"))


def test_statements_are_split_outside_quotes_comments_and_dollar_quotes():
    text = """-- a comment; with a semicolon
    BEGIN;
    SELECT 'a;b', "odd;name", $$x;y$$ /* c; d */ FROM job;
    COMMIT"""
    assert grade.split_statements(text) == [
        "BEGIN", "SELECT 'a;b', \"odd;name\", $$x;y$$   FROM job", "COMMIT"]
    assert grade.bind("SELECT %(worker_id)s, 1 %% 2", "o'k") == "SELECT 'o''k', 1 % 2"


def test_the_command_prints_json_and_exits_by_verdict():
    env = dict(os.environ)
    ok = subprocess.run([sys.executable, "-m", "labkit", "grade", "claim", str(ANSWERS / "correct.sql"),
                         "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert ok.returncode == 0, ok.stderr
    doc = json.loads(ok.stdout)
    assert doc["verdict"] == "pass" and doc["problems"] == []
    for key in ("double_claims", "lost_jobs", "blocked_ms", "stuck_jobs", "uses_index"):
        assert key in doc
    bad = subprocess.run([sys.executable, "-m", "labkit", "grade", "claim", str(ANSWERS / "wrong_syntax.sql"),
                          "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 1
    assert [p["code"] for p in json.loads(bad.stdout)["problems"]] == ["syntax_error"]
    missing = subprocess.run([sys.executable, "-m", "labkit", "grade", "claim", "/nonexistent.sql"],
                             capture_output=True, text=True, env=env, timeout=60)
    assert missing.returncode == 2 and "No SQL file" in missing.stderr


# -- bounds, time boxes and hostile input --------------------------------------------------------

CORRECT = (ANSWERS / "correct.sql").read_text()


@pytest.mark.parametrize("kw, words", [
    ({"jobs": 10 ** 20}, "jobs must be"),
    ({"jobs": 100_001}, "100,000"),
    ({"workers": 65, "jobs": 1000}, "workers must be"),
    ({"job_ms": float("inf")}, "job_ms must be a finite number"),
    ({"job_ms": float("nan")}, "job_ms must be a finite number"),
    ({"job_ms": -1}, "job_ms must be"),
    ({"job_ms": 10 ** 9}, "1,000"),
    ({"workers": 2.5}, "workers must be"),
])
def test_numbers_out_of_range_are_refused_before_anything_runs(kw, words):
    with pytest.raises(LabkitError, match=words) as err:
        grade.grade_claim("SELECT 1", **kw)
    assert "Fix:" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("args, words", [
    (["--jobs", "1e20"], "jobs must be"),
    (["--job-ms", "inf"], "finite"),
    (["--job-ms", "nan"], "finite"),
    (["--job-ms", "-1"], "job_ms must be"),
    (["--workers", "1000"], "workers must be"),
])
def test_the_command_refuses_them_with_one_paragraph_and_exit_2(args, words, capsys):
    assert cli.main(["grade", "claim", str(ANSWERS / "correct.sql"), *args]) == 2
    err = capsys.readouterr().err
    assert words in err and "Fix:" in err and len(err.strip().splitlines()) == 1, err


def test_files_that_are_not_sql_text_are_refused(tmp_path, capsys):
    binary = tmp_path / "claim.sql"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    nul = tmp_path / "nul.sql"
    nul.write_bytes(b"SELECT 1;\x00")
    big = tmp_path / "big.sql"
    big.write_text("-- padding\n" * 100_000 + CORRECT)
    for path, words in [(binary, "not UTF-8"), (nul, "NUL byte"), (big, "at most"),
                        (tmp_path, "is a folder")]:
        assert cli.main(["grade", "claim", str(path)]) == 2, path
        err = capsys.readouterr().err
        assert words in err and "Fix:" in err and len(err.strip().splitlines()) == 1, err
    with pytest.raises(LabkitError, match="at most"):
        grade.grade_claim("SELECT 1; " * 200_000)


def test_a_claim_that_turns_its_timeout_off_and_sleeps_is_cancelled(db, monkeypatch):
    import time

    monkeypatch.setattr(grade, "STEP_TIMEOUT_S", 2.0)
    t0 = time.monotonic()
    r = grade.grade_claim("SET statement_timeout = 0; SELECT pg_sleep(3600)", db=db)
    assert time.monotonic() - t0 < 20
    assert r.verdict == "fail" and r.codes == ["too_slow"], r.to_text()
    with db.connect() as c:     # and nothing of it still runs on the server
        assert not c.execute("SELECT 1 FROM pg_stat_activity WHERE query LIKE '%%pg_sleep(3600)%%' "
                             "AND pid <> pg_backend_pid()").fetchone()


def test_a_claim_whose_explain_hangs_is_cancelled(db, monkeypatch):
    import time

    monkeypatch.setattr(grade, "STEP_TIMEOUT_S", 2.0)
    hang = CORRECT.replace("WHERE status = 'PENDING'",
                           "WHERE status = 'PENDING' AND (current_setting('application_name') "
                           "NOT LIKE '%%:explain' OR (SELECT true FROM pg_sleep(3600)))")
    t0 = time.monotonic()
    r = grade.grade_claim(hang, db=db)
    assert time.monotonic() - t0 < 30
    assert r.verdict == "fail" and "too_slow" in r.codes, r.to_text()
    assert "EXPLAIN" in r.problems[0].evidence


def test_a_claim_that_hangs_only_in_the_workers_is_stopped(db, monkeypatch):
    import time

    monkeypatch.setattr(grade, "RUN_TIMEOUT_S", 4.0)
    hang = "SET statement_timeout = 0; " + CORRECT.replace(
        "WHERE status = 'PENDING'",
        "WHERE status = 'PENDING' AND (current_setting('application_name') NOT LIKE '%%:g2' "
        "OR (SELECT true FROM pg_sleep(3600)))")
    t0 = time.monotonic()
    r = grade.grade_claim(hang, db=db, workers=2, jobs=8)
    assert time.monotonic() - t0 < 40
    assert r.verdict == "fail" and "too_slow" in r.codes, r.to_text()


def test_a_run_in_which_nobody_was_killed_is_not_a_pass(db, monkeypatch):
    # Each worker claims at most two jobs in all: none reaches the crash point (3 jobs),
    # and the jobs left over wait until the run is stopped.
    monkeypatch.setattr(grade, "RUN_TIMEOUT_S", 4.0)
    shy = CORRECT.replace("LIMIT 10", "LIMIT 1").replace(
        "WHERE status = 'PENDING'",
        "WHERE status = 'PENDING' AND (SELECT count(*) FROM job WHERE worker_id = %(worker_id)s) < 2")
    r = grade.grade_claim(shy, db=db, workers=2, jobs=8)
    assert r.verdict == "fail" and "crash_not_tested" in r.codes, r.to_text()
    assert r.killed.startswith("nobody")
