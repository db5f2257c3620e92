"""The grader: a correct claim passes; each known-wrong claim fails for its own reason."""

import json
import os
import re
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
    "wrong_skip_locked_for_the_probe.sql": ("convoy", {"nowait_error_storm", "no_order_by"}),
    "wrong_skip_locked_in_a_transaction.sql": ("convoy", {"nowait_error_storm", "no_order_by"}),
    "wrong_order_by_elsewhere.sql": ("no_order_by", {"convoy", "no_limit", "scans_history"}),
    "wrong_limit_only_for_the_probe.sql": ("no_limit", {"convoy", "no_order_by"}),
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
    assert re.match(r"w[0-9a-f]{8} \(SIGKILL", r.killed), r.killed
    assert r.claim_waits == 0 and r.out_of_order == 0
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
    assert nowait.lock_errors > 0               # and the run's own claims failed the same way
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
    # Only the EXPLAIN runs over a long history of finished jobs.
    hang = CORRECT.replace("WHERE status = 'PENDING'",
                           "WHERE status = 'PENDING' AND ((SELECT count(*) FROM job) < 1000 "
                           "OR (SELECT true FROM pg_sleep(3600)))")
    t0 = time.monotonic()
    r = grade.grade_claim(hang, db=db)
    assert time.monotonic() - t0 < 30
    assert r.verdict == "fail" and "too_slow" in r.codes, r.to_text()
    assert "EXPLAIN" in r.problems[0].evidence


def test_a_claim_that_hangs_only_in_the_workers_is_stopped(db, monkeypatch):
    import time

    monkeypatch.setattr(grade, "RUN_TIMEOUT_S", 4.0)
    # Only the run has as few jobs as this.
    hang = "SET statement_timeout = 0; " + CORRECT.replace(
        "WHERE status = 'PENDING'",
        "WHERE status = 'PENDING' AND ((SELECT count(*) FROM job) > 20 "
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


# -- what the SQL cannot tell apart, and what the run measures ---------------------------------------

SELF = """
SELECT current_setting('application_name'),
       (SELECT string_agg(name || '=' || setting || '/' || source || '/' || coalesce(reset_val, ''),
                          ',' ORDER BY name)
          FROM pg_settings WHERE name IN ('lock_timeout', 'statement_timeout', 'work_mem',
                                          'hash_mem_multiplier', 'client_connection_check_interval'))
"""


def test_every_session_that_runs_the_claim_looks_the_same_to_it(db, monkeypatch):
    # What a session can see of itself: its worker id, its application_name, its settings
    # and where they came from.  The run's workers write it down from inside the claim; the
    # probe's two sessions are asked on their own connections.  One shape for all.
    from labkit.labs import claims

    fresh = claims.fresh_jobs

    def fresh_jobs(lab, n):
        fresh(lab, n)
        lab.execute("CREATE TABLE IF NOT EXISTS seen (worker_id text, app text, settings text)")

    monkeypatch.setattr(claims, "fresh_jobs", fresh_jobs)
    probe = []

    class Watched(grade.Sessions):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            for name, s in self.sessions.items():
                probe.append((name, *s.conn.execute(SELF).fetchone()))

    monkeypatch.setattr(grade, "Sessions", Watched)
    run = []
    tally = grade._tally

    def spy(report, lab, *args):
        run.extend(lab.execute("SELECT * FROM seen"))
        return tally(report, lab, *args)

    monkeypatch.setattr(grade, "_tally", spy)
    claim = f"INSERT INTO seen SELECT %(worker_id)s, s.* FROM ({SELF}) s;\n" + CORRECT
    r = grade.grade_claim(claim, db=db, workers=2, jobs=8)
    assert r.verdict == "pass", r.to_text()
    assert len(probe) == 2 and len({w for w, _, _ in run}) == 2, (probe, run)
    rows = probe + run
    assert all(re.fullmatch(r"w[0-9a-f]{8}", w) and app.endswith(":" + w) for w, app, _ in rows), rows
    assert len({app.rsplit(":", 1)[0] for _, app, _ in rows}) == 1, rows
    assert len({s for _, _, s in rows}) == 1, rows
    assert "work_mem=4096/user/4096" in rows[0][2], rows[0][2]      # the role's bound, as its default
    assert not {w for w, _, _ in probe} & {w for w, _, _ in run}


def test_worker_ids_are_drawn_at_random_in_one_shape():
    a, b = grade.worker_ids(50), grade.worker_ids(50)
    assert all(re.fullmatch(r"w[0-9a-f]{8}", i) for i in a + b)
    assert len(set(a)) == 50 and set(a) != set(b)


def test_a_claim_that_waits_only_outside_the_probe_is_caught_by_the_run(graded):
    # Inside the probe's explicit transactions this claim skips locked rows, so the probe
    # sees B take another job; the run's workers commit each claim on its own, wait for
    # locks, and the run measures it.
    r = graded("wrong_skip_locked_in_a_transaction.sql")
    assert r.probe.startswith("B claimed"), r.to_text()
    assert r.claim_waits > 0 and r.blocked_ms > 0, r.to_text()
    convoy = next(p for p in r.problems if p.code == "convoy")
    assert "of the run waited for a row lock" in convoy.evidence, r.to_text()


def test_a_correct_claim_never_waits_in_the_run(graded):
    for name in ("correct.sql", "correct_script.sql"):
        r = graded(name)
        assert r.claim_waits == 0 and r.blocked_ms == 0.0, r.to_text()


@pytest.mark.parametrize("name", ["wrong_no_order_by.sql", "wrong_order_by_elsewhere.sql"])
def test_a_claim_without_order_takes_jobs_out_of_creation_order_in_the_run(graded, name):
    r = graded(name)
    assert r.out_of_order > 0, r.to_text()
    assert "ORDER BY of its own" in next(p for p in r.problems if p.code == "no_order_by").evidence


def test_out_of_order_counts_jobs_claimed_before_an_older_one():
    created = {1: 1, 2: 2, 3: 3}
    assert grade.out_of_order({1: (0, 1), 2: (1, 2), 3: (2, 3)}, created) == 0
    assert grade.out_of_order({1: (0, 2), 2: (1, 3), 3: (0, 1)}, created) == 0    # overlapping
    assert grade.out_of_order({1: (5, 6), 2: (0, 1), 3: (2, 3)}, created) == 2    # 1 came last


@pytest.mark.parametrize("text, lacking", [
    (CORRECT, None),
    ((ANSWERS / "correct_script.sql").read_text(), None),
    # the ORDER BY of another statement, of a subquery, of a CTE the lock is not in
    ("SELECT 1 FROM job ORDER BY created_at; " + CORRECT.replace("ORDER BY created_at", ""), "no ORDER BY"),
    ("SELECT id FROM job WHERE id IN (SELECT id FROM job ORDER BY created_at LIMIT 5) "
     "FOR UPDATE SKIP LOCKED", "no ORDER BY"),
    ("WITH o AS (SELECT id FROM job ORDER BY created_at), p AS (SELECT id FROM job "
     "WHERE status = 'PENDING' LIMIT 1 FOR UPDATE SKIP LOCKED) SELECT id FROM p", "no ORDER BY"),
    # ORDER BY in a string or a comment orders nothing
    ("SELECT id FROM job WHERE status <> 'ORDER BY' LIMIT 1 FOR UPDATE SKIP LOCKED -- ORDER BY x",
     "no ORDER BY"),
    # no lock clause: the last statement that reads the job table is the claim
    ("SELECT 1 ORDER BY 1; UPDATE job SET status = 'IN_PROGRESS' WHERE id = (SELECT min(id) FROM job) "
     "RETURNING id", "no ORDER BY"),
    ("UPDATE job SET status = 'IN_PROGRESS' WHERE id = (SELECT id FROM job ORDER BY created_at LIMIT 1) "
     "RETURNING id", None),
])
def test_the_order_check_reads_the_statement_that_takes_the_lock(text, lacking):
    found = grade.unordered_claim(grade.split_statements(text))
    assert (found is None) if lacking is None else (found is not None and lacking in found), found


def test_a_claim_that_ends_every_other_session_of_its_role_still_gets_a_grade(db, monkeypatch):
    # The claim may end sessions of its own role (the probe's other session, the workers):
    # the grader's watching sessions log in as labkit's own role, so they survive, and a
    # grade is produced that says what happened.
    killer = ("SELECT count(pg_terminate_backend(pid)) AS ended FROM pg_stat_activity "
              "WHERE usename = current_user AND pid <> pg_backend_pid();\n" + CORRECT)
    monitors = []
    orig = grade._AsWorkers.connect

    def connect(self, **kw):
        conn = orig(self, **kw)
        if kw.get("role") == "monitor":
            monitors.append(conn.info.user)
        return conn

    monkeypatch.setattr(grade._AsWorkers, "connect", connect)
    r = grade.grade_claim(killer, db=db, workers=2, jobs=8)
    assert r.verdict == "fail" and "sql_error" in r.codes, r.to_text()
    assert "ended" in r.problems[r.codes.index("sql_error")].evidence, r.to_text()
    with db.connect() as own:
        me = own.info.user
    assert monitors and all(user == me for user in monitors), monitors


def test_the_run_is_watched_from_labkits_own_role(db, monkeypatch):
    # The sampler that sees the workers wait logs in as labkit's own role; a claim that ends
    # every other session of its role, in the run only, does not end it.
    users = []
    orig = grade._LockSampler.__init__

    def init(self, lab, *a, **kw):
        orig(self, lab, *a, **kw)
        users.append(self.conn.info.user)

    monkeypatch.setattr(grade._LockSampler, "__init__", init)
    killer = ("SELECT count(pg_terminate_backend(pid)) AS ended FROM pg_stat_activity "
              "WHERE usename = current_user AND pid <> pg_backend_pid() "
              "AND (SELECT count(*) FROM job) < 20;\n" + CORRECT)
    r = grade.grade_claim(killer, db=db, workers=2, jobs=8)
    assert r.verdict == "fail", r.to_text()
    with db.connect() as own:
        assert users == [own.info.user]
    assert r.blocked_ms is not None and r.double_claims is not None, r.to_text()


@pytest.mark.parametrize("text", [
    "SET work_mem = '2GB'; " + CORRECT,
    "SET LOCAL hash_mem_multiplier = 1000; " + CORRECT,
    "SELECT set_config('work' || '_mem', '2GB', false); " + CORRECT,
    "DO $$ BEGIN EXECUTE 'SET maintenance_work_mem = ''2GB'''; END $$; " + CORRECT,
    "ALTER ROLE CURRENT_USER RESET ALL; " + CORRECT,
    "WITH s AS (UPDATE pg_settings SET setting = '2GB' WHERE name = 'work' || '_mem' RETURNING 1) "
    "SELECT 1; " + CORRECT,
])
def test_sql_that_changes_a_memory_setting_is_refused_before_it_runs(db, text):
    r = grade.grade_claim(text, db=db, workers=2, jobs=8)
    assert r.codes == ["memory_setting"], r.to_text()
    assert r.sandbox == ""                  # refused before any session was opened


def test_a_memory_setting_within_its_bound_may_be_set_and_read(db):
    r = grade.grade_claim("SET work_mem = '1MB'; SET hash_mem_multiplier = 1;\n" + CORRECT.replace(
        "WHERE status = 'PENDING'", "WHERE status = 'PENDING' AND current_setting('work_mem') = '1MB'"),
        db=db, workers=2, jobs=8)
    assert r.verdict == "pass", r.to_text()
