"""The isolation-spec runner: PostgreSQL's own expected output, reproduced on a real server."""

import io
import os
import re
from pathlib import Path

import psycopg
import pytest
from conftest import backends_of, login_role
from psycopg.conninfo import make_conninfo

from labkit import Lab, cli
from labkit.core.errors import LabkitError, SpecError
from labkit.core.files import data_file
from labkit.core.sessions import MAX_SESSIONS
from labkit.tools import spec as specmod

ROOT = Path(__file__).resolve().parents[1]
SPECS = data_file("specs")
# PostgreSQL's reference specs live next to the project, not in it (see their README).
PG_ISOLATION = Path(os.environ.get("LABKIT_PG_ISOLATION", ROOT.parent / "shared" / "pg-isolation"))

needs_reference = pytest.mark.skipif(
    not PG_ISOLATION.is_dir(),
    reason=f"PostgreSQL's reference specs are not at {PG_ISOLATION} "
           "(set LABKIT_PG_ISOLATION to the folder holding nowait.spec and skip-locked.spec)")


@pytest.fixture(scope="module")
def spec_lab(db):
    lab = Lab.open(db, f"t_spec_{os.getpid()}")
    yield lab
    lab.drop()


def _diff_hint(expected: str, got: str) -> str:
    import difflib

    return "".join(difflib.unified_diff(expected.splitlines(True), got.splitlines(True),
                                        "expected", "got"))


def assert_same(expected: str, got: str) -> None:
    assert got == expected, "output differs:\n" + _diff_hint(expected, got)


# -- PostgreSQL's own expected output ---------------------------------------------------------

@needs_reference
@pytest.mark.parametrize("name", ["nowait", "skip-locked"])
def test_postgres_reference_output_is_reproduced_exactly(spec_lab, name):
    expected = (PG_ISOLATION / f"{name}.out").read_text()
    got = specmod.run(PG_ISOLATION / f"{name}.spec", spec_lab)
    assert_same(expected, got)


# -- the workbook's own specs -------------------------------------------------------------------

WORKBOOK_SPECS = sorted(SPECS.glob("*.spec"))


def test_the_workbook_ships_its_four_specs_each_with_expected_output():
    names = {p.stem for p in WORKBOOK_SPECS}
    assert {"wait", "nowait", "skip_locked", "lock_timeout"} <= names
    for path in WORKBOOK_SPECS:
        assert path.with_suffix(".out").is_file(), f"{path.name} has no .out file"
        text = path.read_text()
        assert text.startswith("#"), f"{path.name} should open with a comment explaining the lesson"
        spec = specmod.parse(text, path.name)
        assert spec.permutations, f"{path.name} should list its permutations explicitly"
        assert not spec.warnings, f"{path.name}: {spec.warnings}"


@pytest.mark.parametrize("path", WORKBOOK_SPECS, ids=lambda p: p.stem)
def test_workbook_spec_reproduces_its_expected_output(spec_lab, path):
    assert_same(path.with_suffix(".out").read_text(), specmod.run(path, spec_lab))


def test_the_lessons_show_in_the_expected_output():
    wait = (SPECS / "wait.out").read_text()
    assert "<waiting ...>" in wait and "step s2lock: <... completed>" in wait
    nowait = (SPECS / "nowait.out").read_text()
    assert 'ERROR:  could not obtain lock on row in relation "job"' in nowait
    assert "<waiting" not in nowait
    skip = (SPECS / "skip_locked.out").read_text()
    assert "<waiting" not in skip and "ERROR" not in skip
    for worker, job in (("s1", 1), ("s2", 2), ("s3", 3)):
        assert f" {job}|{worker}       \n" in skip
    timeout = (SPECS / "lock_timeout.out").read_text()
    assert "ERROR:  canceling statement due to lock timeout" in timeout


# -- every interleaving --------------------------------------------------------------------------

TWO_BY_THREE = """
session s1
step s1a { SELECT 1; }
step s1b { SELECT 2; }
step s1c { SELECT 3; }
session s2
step s2a { SELECT 4; }
step s2b { SELECT 5; }
step s2c { SELECT 6; }
"""


def test_two_sessions_of_three_steps_make_twenty_interleavings_in_the_testers_order():
    perms = [p.names for p in specmod.parse(TWO_BY_THREE).permutations_to_run()]
    assert len(perms) == 20 and len({tuple(p) for p in perms}) == 20
    for p in perms:
        assert [s for s in p if s.startswith("s1")] == ["s1a", "s1b", "s1c"]
        assert [s for s in p if s.startswith("s2")] == ["s2a", "s2b", "s2c"]
    # depth first, first session first: all of s1, then s1 s1 s2 s1 ..., ending with all of s2
    assert perms[0] == ["s1a", "s1b", "s1c", "s2a", "s2b", "s2c"]
    assert perms[1] == ["s1a", "s1b", "s2a", "s1c", "s2b", "s2c"]
    assert perms[-1] == ["s2a", "s2b", "s2c", "s1a", "s1b", "s1c"]


def test_three_sessions_interleave_as_a_multinomial():
    spec = specmod.parse("session a step a1 {x} step a2 {x} session b step b1 {x} "
                         "session c step c1 {x} step c2 {x}")
    assert len(list(spec.all_permutations())) == 5 * 4 * 3 * 2 // (2 * 2)   # 5!/(2!1!2!) = 30


@needs_reference
def test_interleaving_order_matches_skip_locked_out():
    out = (PG_ISOLATION / "skip-locked.out").read_text()
    expected = re.findall(r"^starting permutation: (.*)$", out, re.M)
    spec = specmod.parse_file(PG_ISOLATION / "skip-locked.spec")
    assert [" ".join(p.names) for p in spec.permutations_to_run()] == expected
    assert len(expected) == 20


# -- parsing ----------------------------------------------------------------------------------

MALFORMED = [
    # (spec text, line, column, words the message must hold)
    ("session s1\nstep s1a { SELECT 1;\n", 2, 10, "unterminated SQL block"),
    ("setup { CREATE TABLE t ();\n\nsession s1\nstep s1a { SELECT 1; }\n", 1, 7,
     "unterminated SQL block"),
    ("setup { SELECT 1; }\nsesion s1\nstep s1a { SELECT 1; }\n", 2, 1, "unknown keyword 'sesion'"),
    ("session s1\nstep s1a { SELECT 1; }\n  stpe s1b { SELECT 2; }\n", 3, 3, "unknown keyword 'stpe'"),
    ("session s1\nstep s1a { SELECT 1; }\npermutation s1a s1x\n", 3, 17, "undefined step 's1x'"),
    ("session s1\nstep a { SELECT 1; }\nsession s2\n    step a { SELECT 2; }\n", 4, 10,
     "duplicate step name 'a'"),
    ("# only a comment\nsetup { SELECT 1; }\n", 3, 1, "no session"),
    ("", 1, 1, "no session"),
    ("session s1\nsession s2\nstep a { SELECT 1; }\n", 2, 1, "needs at least one step"),
    ("session s1\nstep a { SELECT 1; } ;\n", 2, 22, "unexpected character ';'"),
    ('session "s1\nstep a { SELECT 1; }\n', 1, 9, "quoted name"),
    ("session s1\nstep a { SELECT 1; }\nsession s2\nstep b { SELECT 2; }\npermutation a(c) b\n",
     5, 15, "undefined blocking step 'c'"),
    ("session s1\nstep a { SELECT 1; }\nstep c { SELECT 1; }\nsession s2\nstep b { SELECT 2; }\n"
     "permutation a(c) b c\n", 6, 15, "cannot block on its own session"),
    ("session s1\nstep a { SELECT 1; }\nsetup { SELECT 2; }\n", 3, 1, "found the keyword 'setup'"),
    ("session s1\nstep a { SELECT 1; }\nsession s1\nstep b { SELECT 2; }\n", 3, 1,
     "duplicate session name 's1'"),
    ("session s1\nstep a { SELECT 1; }\nsession s2\nstep b { SELECT 2; }\npermutation a(b b\n",
     5, 17, "',' or ')'"),
]


@pytest.mark.parametrize("text,line,column,words", MALFORMED,
                         ids=[m[3].split("'")[0].strip() + f"@{m[1]}:{m[2]}" for m in MALFORMED])
def test_malformed_specs_are_reported_with_file_line_and_column(text, line, column, words):
    with pytest.raises(SpecError) as info:
        specmod.parse(text, "broken.spec")
    err = info.value
    assert (err.filename, err.line, err.column) == ("broken.spec", line, column)
    assert f"broken.spec:{line}:{column}:" in str(err)
    assert words in str(err)
    assert "Fix:" in str(err)


def test_a_misspelt_keyword_gets_a_suggestion():
    with pytest.raises(SpecError, match="did you mean 'permutation'"):
        specmod.parse("session s1\nstep a { SELECT 1; }\npermutaton a\n")


def test_parse_keeps_the_testers_shape_of_a_spec():
    spec = specmod.parse("""
        # two setup blocks, run in order
        setup { CREATE TABLE t (); }
        setup	{  SELECT 1;   }
        teardown { DROP TABLE t; }
        session "s 1"
        setup { BEGIN; }
        step a {
          SELECT 1;
        }
        teardown { COMMIT; }
        session s2
        step b { SELECT 2; }
        step c { SELECT 3; }
        permutation a b(a) c
        permutation "a" c(*) b(a, a notices 2)
        """, "shape.spec")
    assert spec.setup == ["CREATE TABLE t ();", "SELECT 1;"]
    assert spec.teardown == "DROP TABLE t;"
    assert [s.name for s in spec.sessions] == ["s 1", "s2"]
    s1 = spec.sessions[0]
    assert (s1.setup, s1.teardown) == ("BEGIN;", "COMMIT;")
    # like specscanner.l: spaces and tabs next to the braces go, newlines stay
    assert spec.step("a").sql == "\n          SELECT 1;\n"
    assert spec.step("c").session == "s2"
    p1, p2 = spec.permutations
    assert p1.names == ["a", "b", "c"] and str(p1.steps[1]) == "b(a)"
    assert [b.kind for b in p2.steps[2].blockers] == ["step", "notices"]
    assert p2.steps[2].blockers[1].notices == 2
    assert p2.steps[1].blockers[0].kind == "once"
    assert spec.warnings == []


def test_unused_steps_are_a_warning_not_an_error():
    spec = specmod.parse("session s1\nstep a { SELECT 1; }\nstep b { SELECT 2; }\npermutation a\n")
    assert spec.warnings == ["unused step name: b"]


# -- PQprint's layout -----------------------------------------------------------------------------

def test_result_layout_follows_pqprint():
    text = specmod.format_result(
        ["id", "data", "n", "e", "ee", "dot", "neg"],
        [("1", "x", None, "1e5", "E1", "1.", "-3"), ("22", "yy", None, "2", "3", "4", "5")])
    assert text == ("id|data|n|  e|ee|dot|neg\n"
                    "--+----+-+---+--+---+---\n"
                    " 1|x   | |1e5|E1|1. | -3\n"
                    "22|yy  | |  2|3 |4  |  5\n"
                    "(2 rows)\n\n")


def test_result_layout_pads_in_bytes_and_counts_rows():
    # printf's %-*s pads by bytes: 'żółw' is 4 letters but 7 bytes of UTF-8
    assert specmod.format_result(["name", "k"], [("żółw", "7")]) == \
        "name   |k\n-------+-\nżółw|7\n(1 row)\n\n"
    assert specmod.format_result(["x"], []) == "x\n-\n(0 rows)\n\n"
    assert specmod.format_result([], []) == ""


# -- running features beyond the two references ---------------------------------------------

FEATURES = """
setup { CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1); }
teardown { DROP TABLE t; }

session s0
setup { BEGIN; }
step s0lock { LOCK TABLE t; }
step s0commit { COMMIT; }

session s1
step s1a { SELECT 1 AS x; }
step s1w { SELECT count(*) AS c1 FROM t; }
step s1n { DO $$ BEGIN RAISE NOTICE 'hello' USING DETAIL = 'some detail', HINT = 'a hint'; END $$; }

session s2
step s2a { SELECT 2 AS y; }
step s2w { SELECT count(*) AS c2 FROM t; }
teardown { SELECT 'bye' AS s2_teardown; }

permutation s1a(*) s2a s1n
permutation s0lock s1w(s2w) s2w s0commit
permutation s0lock s1w s2w(s1w, s1n notices 1) s0commit s1n
"""

BYE = "s2_teardown\n-----------\nbye        \n(1 row)\n\n"
C1 = "c1\n--\n 1\n(1 row)\n\n"
C2 = "c2\n--\n 1\n(1 row)\n\n"
HELLO = ("s1: NOTICE:  hello\nDETAIL:  some detail\nHINT:  a hint\n"
         "step s1n: DO $$ BEGIN RAISE NOTICE 'hello' USING DETAIL = 'some detail', "
         "HINT = 'a hint'; END $$;\n")
FEATURES_OUT = (
    "Parsed test spec with 3 sessions\n"
    "\nstarting permutation: s1a s2a s1n\n"
    "step s1a: SELECT 1 AS x; <waiting ...>\n"            # (*): reported as waiting once
    "step s2a: SELECT 2 AS y;\ny\n-\n2\n(1 row)\n\n"
    "step s1a: <... completed>\nx\n-\n1\n(1 row)\n\n"
    + HELLO + BYE +
    "\nstarting permutation: s0lock s1w s2w s0commit\n"
    "step s0lock: LOCK TABLE t;\n"
    "step s1w: SELECT count(*) AS c1 FROM t; <waiting ...>\n"
    "step s2w: SELECT count(*) AS c2 FROM t; <waiting ...>\n"
    "step s0commit: COMMIT;\n"
    "step s2w: <... completed>\n" + C2 +                  # s1w(s2w): s1w is reported after s2w
    "step s1w: <... completed>\n" + C1 + BYE +
    "\nstarting permutation: s0lock s1w s2w s0commit s1n\n"
    "step s0lock: LOCK TABLE t;\n"
    "step s1w: SELECT count(*) AS c1 FROM t; <waiting ...>\n"
    "step s2w: SELECT count(*) AS c2 FROM t; <waiting ...>\n"
    "step s0commit: COMMIT;\n"
    "step s1w: <... completed>\n" + C1 +
    HELLO +                                               # s2w waits for s1's notice
    "step s2w: <... completed>\n" + C2 + BYE)


def test_blocker_annotations_notices_and_session_teardown(spec_lab):
    assert_same(FEATURES_OUT, specmod.run(specmod.parse(FEATURES, "features.spec"), spec_lab))


def test_notify_is_reported_by_the_receiving_session(spec_lab):
    text = """
        session listener
        step listen { LISTEN jobs; }
        step check { SELECT 1 AS x; }
        teardown { UNLISTEN *; }
        session worker
        step notify { NOTIFY jobs, 'job 7 is ready'; }
        permutation listen notify check
        """
    out = specmod.run(specmod.parse(text), spec_lab)
    assert out.endswith('step check: SELECT 1 AS x;\nx\n-\n1\n(1 row)\n\n'
                        'listener: NOTIFY "jobs" with payload "job 7 is ready" from worker\n')


def databases(db, like: str = r"labkit\_spec\_%") -> list[str]:
    with db.connect() as c:
        return [r[0] for r in c.execute("SELECT datname FROM pg_database WHERE datname LIKE %s",
                                        (like,)).fetchall()]


def test_run_makes_and_drops_a_database_of_its_own_when_given_no_lab(db):
    name = specmod.spec_database_name()
    text = ("session s1\nstep a { SELECT 41 + 1 AS answer; }\n"
            "step where { SELECT current_database() AS db, current_schema() AS schema; }\n")
    out = specmod.run(specmod.parse(text))
    assert out == ("Parsed test spec with 1 sessions\n\nstarting permutation: a where\n"
                   "step a: SELECT 41 + 1 AS answer;\nanswer\n------\n    42\n(1 row)\n\n"
                   "step where: SELECT current_database() AS db, current_schema() AS schema;\n"
                   + specmod.format_result(["db", "schema"], [(name, "public")]))
    assert name not in databases(db)
    with db.connect() as c:       # and no lab schema was made for it either
        assert not c.execute("SELECT 1 FROM pg_namespace WHERE nspname LIKE %s",
                             (f"lab\\_spec\\_{os.getpid()}\\_%",)).fetchone()


EXPLAIN = """
setup { CREATE TABLE t (id int PRIMARY KEY, payload text); }
teardown { DROP TABLE t; }
session s1
step plan { EXPLAIN (VERBOSE, COSTS OFF) SELECT * FROM t WHERE id = 1; }
"""


def test_explain_verbose_names_public_t_as_postgres_does_and_every_run_alike(spec_lab):
    spec = specmod.parse(EXPLAIN, "explain.spec")
    first, second = specmod.run(spec, spec_lab), specmod.run(spec, spec_lab)
    assert first == second == (
        "Parsed test spec with 1 sessions\n"
        "\n"
        "starting permutation: plan\n"
        "step plan: EXPLAIN (VERBOSE, COSTS OFF) SELECT * FROM t WHERE id = 1;\n"
        "QUERY PLAN                         \n"
        "-----------------------------------\n"
        "Index Scan using t_pkey on public.t\n"
        "  Output: id, payload              \n"
        "  Index Cond: (t.id = 1)           \n"
        "(3 rows)\n"
        "\n")


def test_the_database_is_dropped_after_an_error_and_after_an_interrupt(spec_lab, db, monkeypatch):
    name = specmod.spec_database_name()
    with pytest.raises(SpecError, match="setup failed"):
        specmod.run(specmod.parse("setup { SELECT * FROM no_such_table; }\n"
                                  "session s1\nstep a { SELECT 1; }\n"), spec_lab)
    assert name not in databases(db)

    seen = {}

    def interrupt(runner, perm):
        seen["db"] = runner.control.execute("SELECT current_database()").fetchone()[0]
        raise KeyboardInterrupt

    monkeypatch.setattr(specmod._Runner, "run_permutation", interrupt)
    with pytest.raises(KeyboardInterrupt):
        specmod.run(specmod.parse("session s1\nstep a { SELECT 1; }\n"), spec_lab)
    assert seen["db"] == name and name not in databases(db)
    assert not backends_of(db, f"labkit:{name}%")


def test_a_database_left_by_a_killed_run_is_dropped_by_drop_spec_databases(db):
    tag = f"t_{os.getpid()}"
    left, busy, foreign = (specmod.spec_database_name(tag, pid) for pid in (1, 2, 3))
    with db.connect() as c:
        for name in (left, busy, foreign):
            c.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
        c.execute(f"COMMENT ON DATABASE \"{left}\" IS 'labkit:{tag}'")
        c.execute(f"COMMENT ON DATABASE \"{busy}\" IS 'labkit:{tag}'")      # a run still in it
    inside = psycopg.connect(make_conninfo(db.dsn, dbname=busy), autocommit=True)
    try:
        with db.connect() as c:
            assert specmod.spec_databases(c, tag=tag) == [left]
            assert specmod.drop_spec_databases(c, tag=tag) == [left]
            assert specmod.drop_spec_databases(c, tag="someone_else") == []
        assert set(databases(db, f"labkit\\_spec\\_{tag}\\_%")) == {busy, foreign}
    finally:
        inside.close()
        with db.connect() as c:
            for name in (left, busy, foreign):
                c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_a_leftover_of_this_pid_is_replaced_and_one_in_use_is_left_alone(spec_lab, db):
    name = specmod.spec_database_name()
    one = specmod.parse("session s1\nstep a { SELECT 1 AS one; }\n")
    with db.connect() as c:
        c.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')     # a killed run's
    assert "one\n---\n  1\n" in specmod.run(one, spec_lab)
    assert name not in databases(db)
    with db.connect() as c:
        c.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
    inside = psycopg.connect(make_conninfo(db.dsn, dbname=name), autocommit=True)
    try:
        with pytest.raises(LabkitError, match=f"{name} is in use by another spec run"):
            specmod.run(one, spec_lab)
        assert inside.execute("SELECT 1").fetchone() == (1,) and name in databases(db)
    finally:
        inside.close()
        with db.connect() as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_the_database_name_is_recognisable_and_fits_postgres_names():
    assert specmod.spec_database_name("bob", 4242) == "labkit_spec_bob_4242"
    long_a = specmod.spec_database_name("a" * 80, 4242)
    long_b = specmod.spec_database_name("a" * 79 + "b", 4242)
    assert len(long_a) <= 63 and long_a.startswith("labkit_spec_aaa") and long_a.endswith("_4242")
    assert long_a != long_b


def test_sandbox_roles_of_a_dropped_spec_database_are_swept(db):
    from labkit.core.sandbox import sweep

    gone, alive = f"labkit_sbx_0000d0{os.getpid() % 100:02d}ne", f"labkit_sbx_0000a1{os.getpid() % 100:02d}ve"
    with db.connect() as c:
        dbname = c.info.dbname
        c.execute(f"CREATE ROLE {gone} LOGIN")
        c.execute(f"COMMENT ON ROLE {gone} IS 'labkit sandbox for database labkit_spec_gone_1'")
        c.execute(f"CREATE ROLE {alive} LOGIN")
        c.execute(f"COMMENT ON ROLE {alive} IS 'labkit sandbox for database {dbname}'")
        try:
            dropped = sweep(c)
            assert gone in dropped and alive not in dropped
        finally:
            c.execute(f"DROP ROLE IF EXISTS {gone}")
            c.execute(f"DROP ROLE IF EXISTS {alive}")


@pytest.fixture
def trainee(db, request):
    """A login that is no superuser: by default one that may not create databases (nor
    roles), as on a shared server; the rights to give it otherwise as the param."""
    rights = getattr(request, "param", "NOCREATEDB NOCREATEROLE")
    yield from login_role(db, f"labkit_t_nocreatedb_{os.getpid()}", rights)


def test_without_createdb_the_spec_runs_in_a_lab_schema_and_a_note_says_why(trainee, db):
    lab = Lab.open(trainee, f"t_spec_nodb_{os.getpid()}")
    try:
        err = io.StringIO()
        out = specmod.run(specmod.parse(EXPLAIN, "explain.spec"), lab, stderr=err)
        assert f"Index Scan using t_pkey on {lab.schema}.t" in out
        notes = [line for line in err.getvalue().splitlines() if "database of its own" in line]
        assert notes == [f"labkit spec: ran in schema {lab.schema}, not in a database of its own as "
                         f"PostgreSQL's tester does, because the database user "
                         f"labkit_t_nocreatedb_{os.getpid()} may not create databases (it has no "
                         f"CREATEDB); names that PostgreSQL prints as public.t read {lab.schema}.t "
                         "here."], err.getvalue()
        assert not databases(db, f"labkit\\_spec\\_%\\_{os.getpid()}")
    finally:
        lab.drop()


@pytest.mark.parametrize("trainee", ["CREATEDB CREATEROLE"], indirect=True)
def test_a_user_with_createdb_and_createrole_gets_a_database_and_a_sandbox(trainee, db):
    err = io.StringIO()
    text = EXPLAIN + ("step who { SELECT current_user LIKE 'labkit\\_sbx\\_%' AS sandboxed, "
                      "pg_get_userbyid(datdba) AS owner FROM pg_database "
                      "WHERE datname = current_database(); }\n")
    on_its_server = Lab(trainee, f"t_spec_cr_{os.getpid()}")    # its schema is never made
    out = specmod.run(specmod.parse(text, "explain.spec"), on_its_server, stderr=err)
    owner = f"labkit_t_nocreatedb_{os.getpid()}"
    assert "on public.t\n" in out, out
    assert specmod.format_result(["sandboxed", "owner"], [("t", owner)]) in out, out
    assert err.getvalue() == ""
    assert not databases(db, f"labkit\\_spec\\_%\\_{os.getpid()}")
    with db.connect() as c:
        assert not c.execute("SELECT 1 FROM pg_roles WHERE rolname LIKE 'labkit\\_sbx\\_%%' AND "
                             "shobj_description(oid, 'pg_authid') LIKE %s",
                             (f"%labkit\\_spec\\_%\\_{os.getpid()}",)).fetchone()


@pytest.mark.parametrize("trainee", ["CREATEDB CREATEROLE"], indirect=True)
def test_a_setting_the_throw_away_role_may_not_set_points_to_trusted(trainee, db):
    # A role that may create roles but is no superuser cannot grant SET on deadlock_timeout,
    # so the throw-away role it makes may not set it: the error says what to do.
    text = ("session s1\nsetup { BEGIN; SET deadlock_timeout = '10ms'; }\n"
            "step a { SELECT 1 AS one; }\n")
    with pytest.raises(SpecError) as caught:
        specmod.run(specmod.parse(text, "timeout.spec"), Lab(trainee, f"t_spec_set_{os.getpid()}"))
    assert caught.value.what == ('timeout.spec: setup of session s1 failed: ERROR:  permission '
                                 'denied to set parameter "deadlock_timeout"')
    assert "run a spec you trust with --trusted" in caught.value.fix
    assert not databases(db, f"labkit\\_spec\\_%\\_{os.getpid()}")


def test_a_failing_setup_is_an_error_that_names_it(spec_lab):
    with pytest.raises(SpecError, match="setup failed: .*no_such_table"):
        specmod.run(specmod.parse("setup { SELECT * FROM no_such_table; }\n"
                                  "session s1\nstep a { SELECT 1; }\n"), spec_lab)


def test_a_step_that_never_unblocks_is_cancelled_like_the_tester_does(spec_lab):
    text = """
        setup { CREATE TABLE t (); }
        teardown { DROP TABLE t; }
        session s1
        setup { BEGIN; }
        step lock { LOCK TABLE t; }
        session s2
        step read { SELECT count(*) FROM t; }
        permutation lock read
        """
    # Like the tester: cancel the step after the timeout, say so, and carry on.
    out = specmod.run(specmod.parse(text), spec_lab, timeout=1)
    assert out.endswith("step read: SELECT count(*) FROM t; <waiting ...>\n"
                        "isolationtester: canceling step read after 1 seconds\n"
                        "step read: <... completed>\n"
                        "ERROR:  canceling statement due to user request\n")
    # the lab is usable again afterwards
    assert specmod.run(specmod.parse("session s1\nstep a { SELECT 1 AS one; }\n"), spec_lab)


def test_a_step_of_a_session_that_is_still_waiting_waits_for_it_first(spec_lab):
    # s2's second step cannot be sent while its first one waits: the runner waits for the
    # first (here until its lock_timeout fires) and reports it before the next step.
    text = """
        setup { CREATE TABLE t (); }
        teardown { DROP TABLE t; }
        session s1
        setup { BEGIN; }
        step lock { LOCK TABLE t; }
        step done { COMMIT; }
        session s2
        setup { SET lock_timeout = '500ms'; }
        step read { SELECT count(*) FROM t; }
        step again { SELECT 'again' AS s2; }
        permutation lock read again done
        """
    out = specmod.run(specmod.parse(text), spec_lab)
    assert out.endswith("step read: SELECT count(*) FROM t; <waiting ...>\n"
                        "step read: <... completed>\n"
                        "ERROR:  canceling statement due to lock timeout\n"
                        "step again: SELECT 'again' AS s2;\ns2   \n-----\nagain\n(1 row)\n\n"
                        "step done: COMMIT;\n")


def test_more_sessions_than_the_engine_takes_is_a_clear_error_naming_the_bound(spec_lab):
    assert MAX_SESSIONS >= 8                  # PostgreSQL's own deadlock-hard has 8
    n = MAX_SESSIONS + 1
    text = "".join(f"session s{i}\nstep a{i} {{ SELECT {i}; }}\n" for i in range(n)) + \
        "permutation " + " ".join(f"a{i}" for i in range(n)) + "\n"
    with pytest.raises(SpecError, match=rf"has {n} sessions; labkit runs at most {MAX_SESSIONS}"):
        specmod.run(specmod.parse(text, "many.spec"), spec_lab)


# Modelled on PostgreSQL's deadlock-hard: 8 sessions in a lock cycle.  PostgreSQL's spec gives
# s8 a short deadlock_timeout so that s8 is the one to find the deadlock; only a superuser may
# set it, and a spec's SQL runs as a role that is none.  Here every session keeps the server's
# deadlock_timeout, so the first session to wait (s1) is the first to look for a deadlock,
# finds the cycle, and is the one rolled back.  s8a1(*): reported as waiting, as in
# PostgreSQL's spec, however slow the machine.
DEADLOCK_HARD = "".join(
    ["# 8 sessions, each holding one table and waiting for the next one's\n"
     "setup\n{\n" + "".join(f"  CREATE TABLE a{i} ();\n" for i in range(1, 9)) + "}\n\n"
     "teardown\n{\n  DROP TABLE a1, a2, a3, a4, a5, a6, a7, a8;\n}\n\n"]
    + [f"session s{i}\n"
       "setup\t\t{ BEGIN; }\n"
       f"step s{i}a{i}\t{{ LOCK TABLE a{i}; }}\n"
       f"step s{i}a{i % 8 + 1}\t{{ LOCK TABLE a{i % 8 + 1}; }}\n"
       f"step s{i}c\t{{ COMMIT; }}\n\n" for i in range(1, 9)]
    + ["permutation s1a1 s2a2 s3a3 s4a4 s5a5 s6a6 s7a7 s8a8 s1a2 s2a3 s3a4 s4a5 s5a6 s6a7 "
       "s7a8 s8a1(*) s8c s7c s6c s5c s4c s3c s2c s1c\n"])

DEADLOCK_HARD_OUT = (
    "Parsed test spec with 8 sessions\n\n"
    "starting permutation: s1a1 s2a2 s3a3 s4a4 s5a5 s6a6 s7a7 s8a8 s1a2 s2a3 s3a4 s4a5 s5a6 "
    "s6a7 s7a8 s8a1 s8c s7c s6c s5c s4c s3c s2c s1c\n"
    + "".join(f"step s{i}a{i}: LOCK TABLE a{i};\n" for i in range(1, 9))
    + "".join(f"step s{i}a{i + 1}: LOCK TABLE a{i + 1}; <waiting ...>\n" for i in range(1, 8))
    + "step s8a1: LOCK TABLE a1; <waiting ...>\n"
      "step s8a1: <... completed>\n"         # s8 runs next: the tester waits for s8a1 first,
      "step s1a2: <... completed>\n"         # then reports s1's failure, which let s8a1 through
      "ERROR:  deadlock detected\n"
    + "".join(f"step s{i + 1}c: COMMIT;\nstep s{i}a{i + 1}: <... completed>\n" for i in range(7, 1, -1))
    + "step s2c: COMMIT;\n"
      "step s1c: COMMIT;\n")


def test_eight_sessions_in_a_lock_cycle_like_postgres_deadlock_hard(spec_lab):
    spec = specmod.parse(DEADLOCK_HARD, "deadlock-hard.spec")
    assert len(spec.sessions) == 8 and not spec.warnings
    assert_same(DEADLOCK_HARD_OUT, specmod.run(spec, spec_lab))


# -- command line ------------------------------------------------------------------------------

def test_cli_prints_the_output(capsys):
    assert cli.main(["spec", "run", str(SPECS / "nowait.spec")]) == 0
    assert capsys.readouterr().out == (SPECS / "nowait.out").read_text()


def test_cli_diff_passes_and_fails(tmp_path, capsys):
    spec, out = SPECS / "lock_timeout.spec", SPECS / "lock_timeout.out"
    assert cli.main(["spec", "run", str(spec), "--diff", str(out)]) == 0
    assert "ok:" in capsys.readouterr().out
    wrong = tmp_path / "wrong.out"
    wrong.write_text(out.read_text().replace("lock timeout", "lock tiemout"))
    assert cli.main(["spec", "run", str(spec), "--diff", str(wrong)]) == 1
    shown = capsys.readouterr().out
    assert "-ERROR:  canceling statement due to lock tiemout" in shown
    assert "+ERROR:  canceling statement due to lock timeout" in shown


def test_cli_reports_a_malformed_spec(tmp_path, capsys):
    bad = tmp_path / "bad.spec"
    bad.write_text("session s1\nstep a { SELECT 1;\n")
    assert cli.main(["spec", "run", str(bad)]) == 2
    assert f"{bad}:2:8: unterminated SQL block" in capsys.readouterr().err


def test_cli_lists_permutations_with_annotations(capsys):
    assert cli.main(["spec", "permutations", str(SPECS / "lock_timeout.spec")]) == 0
    assert capsys.readouterr().out == "permutation s1claim s2timeout s2claim(*) s2abort s1commit\n"


# -- hostile input: files, timeouts, permutations -----------------------------------------------

def test_the_permutation_count_is_the_multinomial_without_listing(monkeypatch):
    spec = specmod.parse("session a step a1 {x} step a2 {x} session b step b1 {x} "
                         "session c step c1 {x} step c2 {x}")
    assert spec.permutation_count() == len(list(spec.all_permutations())) == 30
    # 6 sessions of 10 steps: 60!/(10!)^6, about 3.5e42; counted at once, never listed
    big = specmod.parse("".join(f"session s{i} " + "".join(f"step s{i}x{j} {{ SELECT 1; }} "
                                                            for j in range(10)) for i in range(6)))
    monkeypatch.setattr(specmod.Spec, "all_permutations",
                        lambda self: pytest.fail("the permutations were listed"))
    assert big.permutation_count() > 10 ** 42
    with pytest.raises(SpecError, match=r"interleave in about 10\^42 ways.*Fix: write the orders"):
        specmod.run(big)
    with_lines = specmod.parse("session a step a1 {x} session b step b1 {x} permutation a1 b1")
    assert with_lines.permutation_count() == 1


def test_cli_refuses_a_spec_with_too_many_permutations(tmp_path, capsys):
    path = tmp_path / "huge.spec"
    path.write_text("".join(f"session s{i}\n" + "".join(f"step s{i}x{j} {{ SELECT 1; }}\n"
                                                         for j in range(4)) for i in range(4)))
    for cmd in ("run", "permutations"):
        assert cli.main(["spec", cmd, str(path)]) == 2
        err = capsys.readouterr().err
        assert "63,063,000 ways" in err and "permutation" in err and "Fix:" in err, err


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0"])
def test_cli_refuses_a_timeout_that_is_not_a_positive_number(value, capsys):
    assert cli.main(["spec", "run", str(SPECS / "nowait.spec"), "--timeout", value]) == 2
    err = capsys.readouterr().err
    assert "timeout must be a finite number" in err and "Fix:" in err, err
    assert len(err.strip().splitlines()) == 1


def test_cli_refuses_files_that_are_not_spec_text(tmp_path, capsys):
    binary = tmp_path / "binary.spec"
    binary.write_bytes(bytes(range(256)) * 4)
    nul = tmp_path / "nul.spec"
    nul.write_bytes(b"session s\nstep a { SELECT 1; }\x00\n")
    big = tmp_path / "big.spec"
    big.write_text("# padding\n" * 110_000 + "session s\nstep a { SELECT 1; }\n")
    for path, words in [(binary, "not UTF-8"), (nul, "NUL byte"), (big, "at most"),
                        (tmp_path, "is a folder"), (tmp_path / "none.spec", "No spec file")]:
        assert cli.main(["spec", "run", str(path)]) == 2, path
        err = capsys.readouterr().err
        assert words in err and "Fix:" in err and len(err.strip().splitlines()) == 1, err
    # and an expected-output file that is not text
    assert cli.main(["spec", "run", str(SPECS / "nowait.spec"), "--diff", str(binary)]) == 2
    assert "not UTF-8" in capsys.readouterr().err


def test_a_setup_block_that_turns_its_timeout_off_and_sleeps_is_cancelled(spec_lab):
    import time

    t0 = time.monotonic()
    with pytest.raises(SpecError, match="setup did not finish within 2 s"):
        specmod.run(specmod.parse("setup { SET statement_timeout = 0; SELECT pg_sleep(3600); }\n"
                                  "session s1\nstep a { SELECT 1; }\n"), spec_lab, timeout=1)
    assert time.monotonic() - t0 < 15
