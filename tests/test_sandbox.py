"""SQL from a file (a graded claim, an isolation spec) runs as a throw-away role that
may use its own lab schema and nothing else: each attack below fails, the victim
survives, and the role is gone afterwards.  Also: hostile input files."""

import dataclasses
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from labkit import Lab
from labkit.core.errors import LabkitError, SpecError
from labkit.core.files import data_file
from labkit.core.sandbox import MEMORY, Sandbox, memory_refusal
from labkit.tools import grade
from labkit.tools import spec as specmod

ANSWERS = data_file("grader")
CORRECT = (ANSWERS / "correct.sql").read_text()
MARKER = Path(f"/tmp/labkit_sandbox_pwned_{os.getpid()}")
DENIED = re.compile(r"permission denied|must be (owner|superuser|a superuser|a member)", re.I)

# Each attack: SQL with {schema} (the victim's lab schema) and {pid} (the victim's session).
ATTACKS = {
    "drop_schema": "DROP SCHEMA {schema} CASCADE",
    "read_table": "SELECT secret FROM {schema}.secret",
    "alter_table": "ALTER TABLE {schema}.secret ADD COLUMN pwned int",
    "copy_to_program": f"COPY (SELECT 1) TO PROGRAM 'touch {MARKER}'",
    "terminate_backend": "SELECT pg_terminate_backend({pid})",
    "create_schema": "CREATE SCHEMA labkit_pwned_" + str(os.getpid()),
    "create_in_public": f"CREATE TABLE public.labkit_pwned_{os.getpid()} (x int)",
}


@pytest.fixture
def victim(db):
    """Another trainee: a lab schema with a table, and a session of its own."""
    lab = Lab.open(db, f"t_victim_{os.getpid()}")
    lab.execute("CREATE TABLE secret (secret text)")
    lab.execute("INSERT INTO secret VALUES ('hunter2')")
    conn = db.connect(application_name="labkit-test-victim")
    MARKER.unlink(missing_ok=True)
    yield lab, conn
    conn.close()
    lab.drop()
    with db.connect() as c:
        c.execute(f"DROP SCHEMA IF EXISTS labkit_pwned_{os.getpid()} CASCADE")
        c.execute(f"DROP TABLE IF EXISTS public.labkit_pwned_{os.getpid()}")
    MARKER.unlink(missing_ok=True)


def attack_sql(name, victim):
    lab, conn = victim
    return ATTACKS[name].format(schema=lab.schema, pid=conn.info.backend_pid)


def assert_victim_survived(db, victim):
    lab, conn = victim
    assert conn.execute("SELECT 1").fetchone() == (1,), "the victim's session was ended"
    with db.connect() as c:
        assert c.execute(sql.SQL("SELECT secret FROM {}.secret").format(sql.Identifier(lab.schema))
                         ).fetchall() == [("hunter2",)]
        cols = [r[0] for r in c.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0",
            (f"{lab.schema}.secret",)).fetchall()]
        assert cols == ["secret"]
        assert not c.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s",
                             (f"labkit_pwned_{os.getpid()}",)).fetchone()
        assert c.execute("SELECT to_regclass(%s)", (f"public.labkit_pwned_{os.getpid()}",)).fetchone() == (None,)
    assert not MARKER.exists(), "COPY ... TO PROGRAM ran a command on the server"


def assert_role_gone(db, role):
    with db.connect() as c:
        assert not c.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
        assert not c.execute("SELECT 1 FROM pg_stat_activity WHERE usename = %s", (role,)).fetchone()


def role_of(text):
    m = re.search(r"(labkit_sbx_[0-9a-f]+)", text)
    assert m, text
    return m.group(1)


# -- the grader ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_a_graded_claim_cannot_reach_outside_its_lab(db, victim, name):
    report = grade.grade_claim(f"{attack_sql(name, victim)};\n{CORRECT}", db=db, workers=2, jobs=8)
    assert report.verdict == "fail", report.to_text()
    assert "sql_error" in report.codes and DENIED.search(report.problems[0].evidence), report.to_text()
    assert_victim_survived(db, victim)
    assert "throw-away role" in report.sandbox
    assert_role_gone(db, role_of(report.sandbox))


def test_the_claim_runs_as_the_sandbox_role_in_every_stage(db):
    # A claim that claims nothing unless it runs as a sandbox role that is no superuser:
    # it passes only if the probe, the EXPLAIN and every worker ran it that way.
    picky = CORRECT.replace("WHERE status = 'PENDING'",
                            "WHERE status = 'PENDING' AND current_user LIKE 'labkit\\_sbx\\_%%' "
                            "AND NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) "
                            "AND current_setting('temp_file_limit') = '1GB' "
                            "AND current_setting('work_mem') = '4MB' "
                            "AND current_setting('hash_mem_multiplier') = '1'")
    report = grade.grade_claim(picky, db=db, workers=2, jobs=8)
    assert report.verdict == "pass", report.to_text()
    assert re.match(r"w[0-9a-f]{8} ", report.killed), report.killed
    assert_role_gone(db, role_of(report.sandbox))


def test_leftover_sandbox_roles_of_interrupted_runs_are_swept(db):
    with db.connect() as c:
        c.execute("CREATE ROLE labkit_sbx_0000dead0000 LOGIN")
        c.execute("COMMENT ON ROLE labkit_sbx_0000dead0000 IS 'labkit sandbox for schema lab_gone_x'")
        c.execute("CREATE ROLE labkit_sbx_0000a11e0000 LOGIN")       # its schema is still there
        c.execute("COMMENT ON ROLE labkit_sbx_0000a11e0000 IS 'labkit sandbox for schema public'")
    try:
        grade.grade_claim(CORRECT, db=db, run=False)
        with db.connect() as c:
            left = {r[0] for r in c.execute("SELECT rolname FROM pg_roles WHERE rolname LIKE "
                                            "'labkit\\_sbx\\_0000%'").fetchall()}
        assert left == {"labkit_sbx_0000a11e0000"}
    finally:
        with db.connect() as c:
            c.execute("DROP ROLE IF EXISTS labkit_sbx_0000dead0000")
            c.execute("DROP ROLE IF EXISTS labkit_sbx_0000a11e0000")


def test_an_interrupted_grade_leaves_no_role_and_no_session(db, monkeypatch):
    seen = {}

    def interrupt(report, lab, box, *args):
        seen["role"] = box.role
        with box.lab.connect(role="held") as conn:
            conn.execute("BEGIN")
            conn.execute("SELECT 1")
            seen["conn"] = conn
            raise KeyboardInterrupt

    monkeypatch.setattr(grade, "_plan", interrupt)
    with pytest.raises(KeyboardInterrupt):
        grade.grade_claim(CORRECT, db=db)
    assert seen["role"].startswith("labkit_sbx_")
    assert_role_gone(db, seen["role"])


# -- memory ------------------------------------------------------------------------------------------

def _plan_nodes(conn, query: str) -> list[dict]:
    doc = conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {query}").fetchone()[0]
    nodes, todo = [], [doc[0]["Plan"]]
    while todo:
        node = todo.pop()
        nodes.append(node)
        todo += node.get("Plans", [])
    return nodes


SORT = "SELECT g FROM generate_series(1, 300000) g ORDER BY g DESC"
HASH = ("SELECT count(*) FROM generate_series(1, 300000) a "
        "JOIN generate_series(1, 300000) b ON a = b")


def test_the_sandbox_role_sorts_and_hashes_within_its_memory_bound(lab):
    bound_kb = {"work_mem": 4096, "hash_mem_multiplier": 1}
    with Sandbox(lab) as box:
        with box.lab.connect(role="memory") as conn:
            got = dict(conn.execute("SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
                                    (list(MEMORY),)).fetchall())
            assert float(got["work_mem"]) == bound_kb["work_mem"]
            assert float(got["hash_mem_multiplier"]) == bound_kb["hash_mem_multiplier"]
            sort = next(n for n in _plan_nodes(conn, SORT) if n["Node Type"] == "Sort")
            conn.execute("SET enable_mergejoin = off")      # a hash join, whatever it costs
            hash_ = next(n for n in _plan_nodes(conn, HASH) if n["Node Type"] == "Hash")
            # ... and the bound is only the session's default: the role may raise it itself,
            # which is why the SQL is read, and refused, before it runs.
            context = conn.execute("SELECT context FROM pg_settings WHERE name = 'work_mem'").fetchone()[0]
            conn.execute("SET work_mem = '256MB'")
            raised = conn.execute("SELECT current_setting('work_mem')").fetchone()[0]
    # The same statements, given memory, would use more than the bound.
    with lab.db.connect() as free:
        free.execute("SET work_mem = '256MB'")
        free.execute("SET hash_mem_multiplier = 2")
        free.execute("SET enable_mergejoin = off")
        sort_free = next(n for n in _plan_nodes(free, SORT) if n["Node Type"] == "Sort")
        hash_free = next(n for n in _plan_nodes(free, HASH) if n["Node Type"] == "Hash")
    assert sort_free["Sort Space Type"] == "Memory" and sort_free["Sort Space Used"] > bound_kb["work_mem"]
    assert hash_free["Hash Batches"] == 1 and hash_free["Peak Memory Usage"] > bound_kb["work_mem"]
    # In the sandbox they spill to disk instead.
    assert sort["Sort Space Type"] == "Disk" and sort["Sort Method"] == "external merge", sort
    assert hash_["Hash Batches"] > 1 and hash_["Peak Memory Usage"] <= bound_kb["work_mem"], hash_
    assert context == "user" and raised == "256MB"


@pytest.mark.parametrize("spelt", ['SELECT "set_config"(\'work_mem\', \'4GB\', false)',
                                   'SET U&"work\\005fmem" = \'4GB\'',
                                   'SET U&"work!005fmem" UESCAPE \'!\' = \'4GB\'',
                                   'SET "work_mem" = \'4GB\''])
def test_a_memory_setting_spelt_as_a_quoted_identifier_is_still_refused(spelt):
    assert memory_refusal([spelt]), spelt


def test_the_memory_check_refuses_raising_a_bound_and_allows_reading_one():
    assert memory_refusal(["SET work_mem = '4MB'", "SET LOCAL hash_mem_multiplier TO 1",
                           "SELECT current_setting('work_mem')", "RESET ALL"]) is None
    for text in ["SET work_mem = '5MB'", "SET work_mem = 4097", "SET hash_mem_multiplier = 1.5",
                 "SET temp_buffers = 1025", "SET maintenance_work_mem = '1GB'",
                 "ALTER ROLE CURRENT_USER SET work_mem = '1GB'",
                 "CREATE FUNCTION f() RETURNS int LANGUAGE sql SET work_mem = '1GB' AS 'SELECT 1'",
                 "SELECT set_config('work' || '_mem', '1GB', false)",
                 "UPDATE pg_settings SET setting = '1GB' WHERE name = 'work_mem'",
                 "DO $$ BEGIN EXECUTE 'SET work' || '_mem = 1000000'; END $$",
                 "PREPARE p AS SELECT 1; EXECUTE p"]:
        assert memory_refusal(grade.split_statements(text)), text


# -- a role that is no superuser ---------------------------------------------------------------------

@pytest.fixture
def trainee_db(db, request):
    """A database login that is no superuser: with CREATEROLE, or without (param)."""
    name = f"labkit_t_trainee_{os.getpid()}"
    with db.connect() as c:
        dbname = c.info.dbname
        c.execute(sql.SQL("CREATE ROLE {} LOGIN " + request.param).format(sql.Identifier(name)))
        c.execute(sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(sql.Identifier(dbname),
                                                                       sql.Identifier(name)))
    yield dataclasses.replace(db, dsn=make_conninfo(db.dsn, user=name))
    with db.connect() as c:
        for (schema,) in c.execute("SELECT nspname FROM pg_namespace n JOIN pg_roles r ON r.oid = nspowner "
                                   "WHERE rolname = %s", (name,)).fetchall():
            c.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
        c.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
        c.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


@pytest.mark.parametrize("trainee_db", ["NOCREATEROLE"], indirect=True)
def test_a_trainee_who_may_not_create_roles_runs_as_itself_and_is_told_so(trainee_db, db, victim):
    report = grade.grade_claim(CORRECT, db=trainee_db, workers=2, jobs=8)
    assert report.verdict == "pass", report.to_text()
    assert "your own role labkit_t_trainee" in report.sandbox and "may not create roles" in report.sandbox
    assert "your own role" in report.to_text()
    bad = grade.grade_claim(f"{attack_sql('drop_schema', victim)};\n{CORRECT}", db=trainee_db, run=False)
    assert bad.verdict == "fail" and DENIED.search(bad.problems[0].evidence)
    assert_victim_survived(db, victim)


@pytest.mark.parametrize("trainee_db", ["CREATEROLE"], indirect=True)
def test_a_trainee_who_may_create_roles_still_gets_a_sandbox(trainee_db, db, victim):
    report = grade.grade_claim(CORRECT, db=trainee_db, workers=2, jobs=8)
    assert report.verdict == "pass", report.to_text()
    assert_role_gone(db, role_of(report.sandbox))
    bad = grade.grade_claim(f"{attack_sql('terminate_backend', victim)};\n{CORRECT}", db=trainee_db,
                            run=False)
    assert bad.verdict == "fail" and DENIED.search(bad.problems[0].evidence), bad.to_text()
    assert_victim_survived(db, victim)
    assert_role_gone(db, role_of(bad.sandbox))


# -- the spec runner -----------------------------------------------------------------------------------

def attack_spec(attack: str, where: str) -> str:
    blocks = {"setup": "SELECT 1", "step": "SELECT 1", "session_setup": "SELECT 1",
              "teardown": "SELECT 1"}
    blocks[where] = attack
    return (f"setup {{ CREATE TABLE t (x int); {blocks['setup']}; }}\n"
            f"teardown {{ DROP TABLE t; {blocks['teardown']}; }}\n"
            f"session s1\nsetup {{ {blocks['session_setup']}; }}\n"
            "step who { SELECT current_user AS r; }\n"
            f"step attack {{ {blocks['step']}; }}\n"
            "permutation who attack\n")


# A spec runs in a database made for the run (as PostgreSQL's tester does): the victim's lab, in
# the shared database, is out of its sight, so an attack that names it finds nothing there; the
# attacks that need a right the role lacks are refused.  (CREATE in public is the spec's own
# right there: see the test after these.)
SPEC_ATTACKS = sorted(set(ATTACKS) - {"create_in_public"})
UNSEEN_OR_DENIED = r"(permission denied|must be|(schema|relation) \"[^\"]*\" does not exist)"


@pytest.mark.parametrize("name", SPEC_ATTACKS)
def test_a_spec_step_cannot_reach_outside_its_lab(db, victim, name):
    out = specmod.run(specmod.parse(attack_spec(attack_sql(name, victim), "step")))
    assert re.search(r"step attack: .*\nERROR:  " + UNSEEN_OR_DENIED, out), out
    assert_victim_survived(db, victim)
    assert_role_gone(db, role_of(out))


@pytest.mark.parametrize("name", SPEC_ATTACKS)
def test_a_spec_setup_cannot_reach_outside_its_lab(db, victim, name):
    with pytest.raises(SpecError, match="setup failed") as err:
        specmod.run(specmod.parse(attack_spec(attack_sql(name, victim), "setup")))
    assert re.search(UNSEEN_OR_DENIED, str(err.value)), err.value
    assert_victim_survived(db, victim)


@pytest.mark.parametrize("where", ["step", "setup"])
def test_a_spec_creating_in_public_creates_in_its_own_database_only(db, victim, where):
    out = specmod.run(specmod.parse(attack_spec(attack_sql("create_in_public", victim), where)))
    assert "step attack:" in out and "ERROR" not in out, out
    assert_victim_survived(db, victim)          # nothing in the shared database's public
    assert_role_gone(db, role_of(out))


def test_session_setup_and_teardown_run_as_the_sandbox_role_too(db, victim):
    # CREATE SCHEMA needs a right on the database that only the sandbox role lacks.
    with pytest.raises(SpecError, match="setup of session s1 failed.*(permission denied|must be)"):
        specmod.run(specmod.parse(attack_spec(attack_sql("create_schema", victim), "session_setup")))
    err = io.StringIO()
    out = specmod.run(specmod.parse(attack_spec(attack_sql("create_schema", victim), "teardown")), stderr=err)
    assert re.search("teardown failed: .*(permission denied|must be)", err.getvalue()), err.getvalue()
    assert_victim_survived(db, victim)
    assert_role_gone(db, role_of(out))
    with db.connect() as c:
        assert not c.execute("SELECT 1 FROM pg_roles WHERE rolname LIKE 'labkit\\_sbx\\_%%' AND "
                             "shobj_description(oid, 'pg_authid') LIKE %s",
                             (f"%labkit\\_spec\\_%\\_{os.getpid()}",)).fetchone()


# -- hostile input files: slides and book ------------------------------------------------------------

@pytest.mark.parametrize("command", ["slides", "book"])
def test_slides_and_book_refuse_files_that_are_not_notebooks(tmp_path, command, capsys):
    from labkit import cli

    binary = tmp_path / "binary.ipynb"
    binary.write_bytes(bytes(range(256)) * 8)
    not_nb = tmp_path / "plain.ipynb"
    not_nb.write_text('{"hello": "world"}')
    big = tmp_path / "big.ipynb"
    with open(big, "wb") as fh:
        fh.truncate(60_000_000)            # sparse: large without using the disk
    cases = {binary: "not UTF-8", not_nb: "not a Jupyter notebook", big: "at most",
             tmp_path: "is a folder"}
    out = tmp_path / "out"
    for path, words in cases.items():
        extra = ["--no-execute"] if command == "book" else []
        assert cli.main([command, str(path), "--out", str(out), *extra]) == 2, path
        err = capsys.readouterr().err
        assert words in err and "Fix:" in err, err
        assert len(err.strip().splitlines()) == 1, err
    assert not out.exists()                # nothing was written


def test_a_fifo_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "fifo.ipynb"
    os.mkfifo(fifo)                        # opening it would block until a writer comes
    r = subprocess.run([sys.executable, "-m", "labkit", "slides", str(fifo), "--out",
                        str(tmp_path / "out")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "not a regular file" in r.stderr and "Traceback" not in r.stderr


def test_an_unreadable_file_is_refused_with_the_fix(tmp_path):
    tmp_path.chmod(0o755)                  # the folders on the way may be opened...
    path = tmp_path / "claim.sql"
    path.write_text("SELECT 1")
    path.chmod(0)                          # ...but the file may not be read
    msg = as_unprivileged(lambda: grade.grade_claim(path))
    assert "not readable" in msg and "chmod u+r" in msg, msg
    hidden = tmp_path / "hidden"
    hidden.mkdir(mode=0o700)               # a file inside a folder that may not be opened
    (hidden / "x.spec").write_text("session s\nstep a { SELECT 1; }\n")
    msg = as_unprivileged(lambda: specmod.parse_file(hidden / "x.spec"))
    assert "not readable" in msg and "chmod" in msg, msg


def as_unprivileged(fn) -> str:
    """The LabkitError message ``fn`` raises, run by a user the file's mode applies to
    (root reads anything: as root, in a forked child that becomes nobody)."""
    if os.geteuid() != 0:
        with pytest.raises(LabkitError) as err:
            fn()
        return str(err.value)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                   # child: drop root, try, report, exit
        os.close(r)
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            try:
                fn()
                os.write(w, b"no error")
            except LabkitError as exc:
                os.write(w, str(exc).encode())
            except BaseException as exc:
                os.write(w, f"{type(exc).__name__}: {exc}".encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        text = fh.read().decode()
    os.waitpid(pid, 0)
    return text
