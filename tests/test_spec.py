"""The isolation-spec runner: PostgreSQL's own expected output, reproduced on a real server."""

import os
import re
from pathlib import Path

import pytest

from labkit.core.files import data_file
from labkit.tools import spec as specmod
from labkit.core.errors import LabkitError, SpecError
from labkit import Lab

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


def test_run_makes_and_drops_its_own_lab_when_given_none(db):
    out = specmod.run(specmod.parse("session s1\nstep a { SELECT 41 + 1 AS answer; }\n"))
    assert out == ("Parsed test spec with 1 sessions\n\nstarting permutation: a\n"
                   "step a: SELECT 41 + 1 AS answer;\nanswer\n------\n    42\n(1 row)\n\n")


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


def test_more_sessions_than_the_engine_takes_is_a_clear_error(spec_lab):
    text = "".join(f"session s{i}\nstep a{i} {{ SELECT {i}; }}\n" for i in range(7))
    with pytest.raises(LabkitError, match="1 to 6 sessions"):
        specmod.run(specmod.parse(text), spec_lab)


# -- command line ------------------------------------------------------------------------------

def test_cli_prints_the_output(capsys):
    assert specmod.main(["run", str(SPECS / "nowait.spec")]) == 0
    assert capsys.readouterr().out == (SPECS / "nowait.out").read_text()


def test_cli_diff_passes_and_fails(tmp_path, capsys):
    spec, out = SPECS / "lock_timeout.spec", SPECS / "lock_timeout.out"
    assert specmod.main(["spec", "run", str(spec), "--diff", str(out)]) == 0
    assert "ok:" in capsys.readouterr().out
    wrong = tmp_path / "wrong.out"
    wrong.write_text(out.read_text().replace("lock timeout", "lock tiemout"))
    assert specmod.main(["run", str(spec), "--diff", str(wrong)]) == 1
    shown = capsys.readouterr().out
    assert "-ERROR:  canceling statement due to lock tiemout" in shown
    assert "+ERROR:  canceling statement due to lock timeout" in shown


def test_cli_reports_a_malformed_spec(tmp_path, capsys):
    bad = tmp_path / "bad.spec"
    bad.write_text("session s1\nstep a { SELECT 1;\n")
    assert specmod.main(["run", str(bad)]) == 2
    assert f"{bad}:2:8: unterminated SQL block" in capsys.readouterr().err


def test_cli_lists_permutations_with_annotations(capsys):
    assert specmod.main(["permutations", str(SPECS / "lock_timeout.spec")]) == 0
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
        assert specmod.main([cmd, str(path)]) == 2
        err = capsys.readouterr().err
        assert "63,063,000 ways" in err and "permutation" in err and "Fix:" in err, err


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0"])
def test_cli_refuses_a_timeout_that_is_not_a_positive_number(value, capsys):
    assert specmod.main(["run", str(SPECS / "nowait.spec"), "--timeout", value]) == 2
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
        assert specmod.main(["run", str(path)]) == 2, path
        err = capsys.readouterr().err
        assert words in err and "Fix:" in err and len(err.strip().splitlines()) == 1, err
    # and an expected-output file that is not text
    assert specmod.main(["run", str(SPECS / "nowait.spec"), "--diff", str(binary)]) == 2
    assert "not UTF-8" in capsys.readouterr().err


def test_a_setup_block_that_turns_its_timeout_off_and_sleeps_is_cancelled(spec_lab):
    import time

    t0 = time.monotonic()
    with pytest.raises(SpecError, match="setup did not finish within 2 s"):
        specmod.run(specmod.parse("setup { SET statement_timeout = 0; SELECT pg_sleep(3600); }\n"
                                  "session s1\nstep a { SELECT 1; }\n"), spec_lab, timeout=1)
    assert time.monotonic() - t0 < 15
