"""The grader: a correct claim passes; each known-wrong claim fails for its own reason."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from labkit import grade
from labkit.errors import LabkitError

ANSWERS = Path(__file__).parent.parent / "data" / "grader"

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
    assert hoard.stuck_jobs > hoard.jobs // 2   # the crash stranded (nearly) the whole queue
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
    ok = subprocess.run([sys.executable, "-m", "labkit.grade", "claim", str(ANSWERS / "correct.sql"),
                         "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert ok.returncode == 0, ok.stderr
    doc = json.loads(ok.stdout)
    assert doc["verdict"] == "pass" and doc["problems"] == []
    for key in ("double_claims", "lost_jobs", "blocked_ms", "stuck_jobs", "uses_index"):
        assert key in doc
    bad = subprocess.run([sys.executable, "-m", "labkit.grade", "claim", str(ANSWERS / "wrong_syntax.sql"),
                          "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 1
    assert [p["code"] for p in json.loads(bad.stdout)["problems"]] == ["syntax_error"]
    missing = subprocess.run([sys.executable, "-m", "labkit.grade", "claim", "/nonexistent.sql"],
                             capture_output=True, text=True, env=env, timeout=60)
    assert missing.returncode == 2 and "No SQL file" in missing.stderr
