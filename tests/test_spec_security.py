"""What a spec's SQL may do: a throw-away role (PostgreSQL) or user (MariaDB) limited to the
run's own database, the settings that role may still set, and the trusted mode."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
from conftest import login_role

from labkit import Lab
from labkit.core import mysql
from labkit.core.errors import SpecError
from labkit.tools import spec as specmod
from labkit.tools.classroom import MARK, PREFIX

# -- PostgreSQL: settings the throw-away role may set ----------------------------------------

# A two-session deadlock whose sessions set the deadlock detector's wait in their setup, as
# PostgreSQL's own deadlock specs do: s2 checks after 10 ms and is the one rolled back (s1
# would check after 10 s).  s2b(*) is reported waiting whether or not the detector has
# already answered, and s1b(s2b) completes after s2b: the output does not hang on timing.
DEADLOCK = """
setup { CREATE TABLE acct (id int PRIMARY KEY, balance int); INSERT INTO acct VALUES (1, 0), (2, 0); }
teardown { DROP TABLE acct; }
session s1
setup { BEGIN; SET deadlock_timeout = '10s'; }
step s1a { UPDATE acct SET balance = balance + 1 WHERE id = 1; }
step s1b { UPDATE acct SET balance = balance + 1 WHERE id = 2; }
step s1c { COMMIT; }
session s2
setup { BEGIN; SET deadlock_timeout = '10ms'; }
step s2wait { SELECT current_setting('deadlock_timeout') AS wait, current_user LIKE 'labkit\\_sbx\\_%' AS sandboxed; }
step s2a { UPDATE acct SET balance = balance + 1 WHERE id = 2; }
step s2b { UPDATE acct SET balance = balance + 1 WHERE id = 1; }
step s2c { COMMIT; }
permutation s2wait s1a s2a s1b(s2b) s2b(*) s1c s2c
"""

DEADLOCK_OUT = """Parsed test spec with 2 sessions

starting permutation: s2wait s1a s2a s1b s2b s1c s2c
step s2wait: SELECT current_setting('deadlock_timeout') AS wait, current_user LIKE 'labkit\\_sbx\\_%' AS sandboxed;
wait|sandboxed
----+---------
10ms|t        
(1 row)

step s1a: UPDATE acct SET balance = balance + 1 WHERE id = 1;
step s2a: UPDATE acct SET balance = balance + 1 WHERE id = 2;
step s1b: UPDATE acct SET balance = balance + 1 WHERE id = 2; <waiting ...>
step s2b: UPDATE acct SET balance = balance + 1 WHERE id = 1; <waiting ...>
step s2b: <... completed>
ERROR:  deadlock detected
step s1b: <... completed>
step s1c: COMMIT;
step s2c: COMMIT;
"""


def may_grant_set(db) -> bool:
    """Whether labkit's role may grant SET on deadlock_timeout (PostgreSQL 15+, a superuser
    or a holder of that right WITH GRANT OPTION)."""
    with db.connect() as c:
        if c.info.server_version < 150000:
            return False
        return c.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()[0] \
            or c.execute("SELECT has_parameter_privilege(current_user, 'deadlock_timeout', "
                         "'SET WITH GRANT OPTION')").fetchone()[0]


def test_a_deadlock_spec_that_sets_deadlock_timeout_runs_as_the_throw_away_role(db):
    err = io.StringIO()
    if not may_grant_set(db):
        with pytest.raises(SpecError) as caught:
            specmod.run(specmod.parse(DEADLOCK, "deadlock.spec"), stderr=err)
        assert 'permission denied to set parameter "deadlock_timeout"' in caught.value.what
        assert "--trusted" in caught.value.fix
        return
    out = specmod.run(specmod.parse(DEADLOCK, "deadlock.spec"), stderr=err)
    assert out == DEADLOCK_OUT, out
    assert err.getvalue() == ""


def test_the_right_to_set_the_parameter_goes_with_the_role(db):
    with db.connect() as c:
        v15 = c.info.server_version >= 150000
    may_set = "has_parameter_privilege('deadlock_timeout', 'SET')" if v15 else "false"
    text = f"session s1\nstep who {{ SELECT current_user AS role, {may_set} AS may_set; }}\n"
    row = specmod.run(specmod.parse(text, "who.spec")).split("\n")[6].split("|")
    role = row[0].strip()
    assert role.startswith("labkit_sbx_")
    assert row[1].strip() == ("t" if may_grant_set(db) else "f")
    with db.connect() as c:       # dropping the role took its right with it
        assert not c.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
        if v15:
            assert not c.execute("SELECT parname FROM pg_parameter_acl WHERE paracl::text LIKE %s",
                                 (f"%{role}%",)).fetchall()


# -- PostgreSQL: --trusted ---------------------------------------------------------------------

# A catalog row locked by one session and updated by another, as PostgreSQL's EvalPlanQual
# spec does with pg_class: only a role with rights on the catalog may run it.
CATALOG = """
setup { CREATE TABLE t (id int); }
teardown { DROP TABLE t; }
session s1
setup { BEGIN; }
step s1u { UPDATE pg_class SET reltuples = 10 WHERE oid = 't'::regclass; }
step s1c { COMMIT; }
session s2
setup { BEGIN; }
step s2u { UPDATE pg_class SET reltuples = reltuples * 3 WHERE oid = 't'::regclass; }
step s2r { SELECT reltuples FROM pg_class WHERE oid = 't'::regclass; }
step s2c { COMMIT; }
permutation s1u s2u s1c s2r s2c
"""

CATALOG_STEPS = """step s1u: UPDATE pg_class SET reltuples = 10 WHERE oid = 't'::regclass;
step s2u: UPDATE pg_class SET reltuples = reltuples * 3 WHERE oid = 't'::regclass; <waiting ...>
step s1c: COMMIT;
step s2u: <... completed>
step s2r: SELECT reltuples FROM pg_class WHERE oid = 't'::regclass;
reltuples
---------
       30
(1 row)

step s2c: COMMIT;
"""


def is_superuser(db) -> bool:
    with db.connect() as c:
        return c.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()[0]


def test_a_spec_that_updates_a_catalog_needs_trusted(db, monkeypatch):
    monkeypatch.delenv(specmod.CLASSROOM_ENV, raising=False)
    sandboxed = specmod.run(specmod.parse(CATALOG, "catalog.spec"))
    assert "step s1u: UPDATE pg_class SET reltuples = 10 WHERE oid = 't'::regclass;\n" \
           "ERROR:  permission denied for table pg_class\n" in sandboxed, sandboxed
    if not is_superuser(db):
        return          # (trusted, labkit's own role could not update pg_class either)
    err = io.StringIO()
    trusted = specmod.run(specmod.parse(CATALOG, "catalog.spec"), trusted=True, stderr=err)
    assert trusted.endswith(CATALOG_STEPS), trusted
    assert err.getvalue().startswith("labkit spec: --trusted: ran the spec's SQL with your own "
                                     "role's rights")


def test_trusted_runs_in_a_database_of_its_own_that_is_dropped(db, monkeypatch):
    monkeypatch.delenv(specmod.CLASSROOM_ENV, raising=False)
    name = specmod.spec_database_name()
    text = "session s1\nstep where { SELECT current_database() AS db, current_user = session_user AS own; }\n"
    out = specmod.run(specmod.parse(text), trusted=True, stderr=io.StringIO())
    assert specmod.format_result(["db", "own"], [(name, "t")]) in out, out
    with db.connect() as c:
        assert not c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()


@pytest.fixture
def classroom_role(db, request):
    """A login named like a classroom trainee, marked as one (param True) or not."""
    marked = getattr(request, "param", True)
    yield from login_role(db, f"{PREFIX}t_spec_{os.getpid()}", comment=MARK if marked else None)


def test_trusted_is_refused_to_a_classroom_trainee_role(classroom_role, monkeypatch, capsys):
    monkeypatch.delenv(specmod.CLASSROOM_ENV, raising=False)
    lab = Lab(classroom_role, f"t_spec_trust_{os.getpid()}")       # its schema is never made
    with pytest.raises(specmod.TrustRefused) as caught:
        specmod.run(specmod.parse(CATALOG, "catalog.spec"), lab, trusted=True)
    assert f"the role {PREFIX}t_spec_{os.getpid()} is a classroom trainee's" in caught.value.what
    with classroom_role.connect() as c:
        assert not c.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (lab.schema,)).fetchone()
    # the command: exit 2 and the reason, on one line
    monkeypatch.setattr(specmod, "connect", lambda quiet=True: classroom_role)
    path = specmod.data_file("specs", "nowait.spec")
    assert specmod.spec_command(what="run", specs=[str(path)], trusted=True) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("labkit spec: --trusted is refused here: the role "
                                   f"{PREFIX}t_spec_{os.getpid()} is a classroom trainee's")


@pytest.mark.parametrize("classroom_role", [False], indirect=True)
def test_the_same_name_without_the_classroom_mark_may_run_trusted(classroom_role, monkeypatch):
    monkeypatch.delenv(specmod.CLASSROOM_ENV, raising=False)
    lab = Lab.open(classroom_role, f"t_spec_trust_{os.getpid()}")
    try:
        text = "session s1\nstep who { SELECT current_user AS role; }\n"
        out = specmod.run(specmod.parse(text), lab, trusted=True, stderr=io.StringIO())
        assert specmod.format_result(["role"], [(f"{PREFIX}t_spec_{os.getpid()}",)]) in out, out
    finally:
        lab.drop()


@pytest.mark.parametrize("engine", ["postgresql", "mariadb"])
def test_trusted_is_refused_where_labkit_classroom_is_set(engine, monkeypatch, capsys):
    monkeypatch.setenv(specmod.CLASSROOM_ENV, "1")
    if engine == "mariadb" and mysql.skip_reason() is not None:
        pytest.skip(mysql.skip_reason())
    path = specmod.data_file("specs", "nowait.spec") if engine == "postgresql" else \
        specmod.data_file("specs", "mariadb", "nowait.spec")
    assert specmod.spec_command(what="run", specs=[str(path)], engine=engine, trusted=True) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("labkit spec: --trusted is refused here: LABKIT_CLASSROOM is "
                                   "set: this is a classroom's machine"), captured.err
    # without --trusted the same spec runs (as a throw-away role or user)
    assert specmod.spec_command(what="run", specs=[str(path)], engine=engine,
                                diff=[str(path.with_suffix(".out"))]) == 0


def test_help_says_what_trusted_means():
    done = subprocess.run([sys.executable, "-m", "labkit", "spec", "run", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    flat = " ".join(done.stdout.split())
    assert "--trusted runs the spec's SQL with your own role's rights: only for specs you trust" in flat


# -- MariaDB: a throw-away user --------------------------------------------------------------

def test_long_user_names_get_distinct_mysql_lab_databases():
    a = mysql.database_name("engines", "a" * 70 + "_one")
    b = mysql.database_name("engines", "a" * 70 + "_two")
    assert a != b
    assert len(a) == len(b) == mysql.MAX_NAME
    assert a.startswith("labkit_engines_aaaa") and b.startswith("labkit_engines_aaaa")
    # a name that fits is left as it is
    assert mysql.database_name("engines", "bob") == "labkit_engines_bob"
    # and the cut keeps a hash of the whole name, so one that differs only past 64 differs
    assert mysql.database_name("engines", "x" * 60) != mysql.database_name("engines", "x" * 61)


@pytest.fixture
def server():
    reason = mysql.skip_reason()
    if reason is not None:
        pytest.skip(reason)
    return mysql.find()


def sandbox_users(server) -> set[str]:
    conn = server.connect(database=None)
    try:
        return {r[0] for r in conn.execute("SELECT User FROM mysql.user WHERE User LIKE "
                                           "'labkit\\\\_sbx\\\\_%%'", ()).fetchall()}
    finally:
        conn.close()


def attack_spec(server) -> str:
    database = mysql.database_name(f"spec_{os.getpid()}")
    # In a GRANT's database name _ matches any character: the run's name with X for its first
    # _ would fall under a careless grant.
    twin = database.replace("_", "X", 1)
    return f"""
setup {{ CREATE TABLE t (id int PRIMARY KEY, body text); }}
session s1
step who {{ SELECT CURRENT_USER() LIKE 'labkit\\\\_sbx\\\\_%' AS sandboxed, DATABASE() = '{database}' AS own; }}
step readfile {{ SELECT LOAD_FILE('/etc/hostname') IS NULL AS unread; }}
step loaddata {{ LOAD DATA INFILE '/etc/hostname' INTO TABLE t; }}
step outfile {{ SELECT 'x' INTO OUTFILE '/tmp/labkit_spec_{os.getpid()}.txt'; }}
step mkdb {{ CREATE DATABASE labkit_spec_other_{os.getpid()}; }}
step mktwin {{ CREATE DATABASE {twin}; }}
step dropdb {{ DROP DATABASE {server.params['database']}; }}
step users {{ SELECT User FROM mysql.user; }}
step global {{ SET GLOBAL max_connections = 1000; }}
"""


@pytest.mark.needs_mysql
def test_a_mariadb_spec_has_no_right_outside_its_own_database(server):
    before = sandbox_users(server)
    out = specmod.run_mysql(specmod.parse(attack_spec(server), "attack.spec"), engine=server.engine)
    steps = {}
    for block in out.split("\nstep ")[1:]:
        name, _, rest = block.partition(":")
        steps[name] = rest + "\n"      # (the split took the line break before "step")
    assert specmod.format_result(["sandboxed", "own"], [("1", "1")]) in steps["who"], out
    assert specmod.format_result(["unread"], [("1",)]) in steps["readfile"], out
    denied = {"loaddata": "(1045) Access denied", "outfile": "(1227) Access denied; you need",
              "mkdb": "(1044) Access denied", "mktwin": "(1044) Access denied",
              "dropdb": "(1044) Access denied", "users": "(1142) SELECT command denied",
              "global": "(1227) Access denied; you need"}
    for step, error in denied.items():
        assert f"ERROR:  {error}" in steps[step], f"step {step}:\n{out}"
    conn = server.connect(database=None)
    try:
        names = {r[0] for r in conn.execute("SHOW DATABASES").fetchall()}
    finally:
        conn.close()
    assert server.params["database"] in names
    assert not {n for n in names if n.startswith(("labkit_spec_other", "labkitXspec"))}
    assert sandbox_users(server) == before          # the throw-away user is gone


@pytest.mark.needs_mysql
def test_the_mariadb_user_is_dropped_after_an_error_and_an_interrupt(server, monkeypatch):
    before = sandbox_users(server)
    database = mysql.database_name(f"spec_{os.getpid()}")
    bad = "setup { CREATE TABLE t (id int PRIMARY KEY); INSERT INTO nowhere VALUES (1); }\n" \
          "session s1\nstep a { SELECT 1; }\n"
    with pytest.raises(SpecError):
        specmod.run_mysql(specmod.parse(bad, "bad.spec"), engine=server.engine)
    assert sandbox_users(server) == before

    seen = {}

    def interrupted(self, perm):
        seen["users"] = sandbox_users(server) - before
        raise KeyboardInterrupt

    monkeypatch.setattr(specmod._MyRunner, "run_steps", interrupted)
    with pytest.raises(KeyboardInterrupt):
        specmod.run_mysql(specmod.parse("session s1\nstep a { SELECT 1; }\n"), engine=server.engine)
    assert len(seen["users"]) == 1          # it was there while the spec ran
    assert sandbox_users(server) == before
    conn = server.connect(database=None)
    try:
        assert not conn.execute("SHOW DATABASES LIKE %s", (database,)).fetchall()
    finally:
        conn.close()


@pytest.mark.needs_mysql
def test_a_mariadb_user_left_by_a_killed_run_is_swept(server):
    gone, alive = f"labkit_sbx_gone{os.getpid()}", f"labkit_sbx_live{os.getpid()}"
    lab = mysql.MyLab.open(server, f"t_sweep_{os.getpid()}")
    admin = lab.admin
    try:
        admin.execute(f"CREATE USER '{gone}'@'127.0.0.1'")
        admin.execute(f"GRANT ALL ON `labkit\\_spec\\_gone\\_{os.getpid()}`.* TO '{gone}'@'127.0.0.1'")
        admin.execute(f"CREATE USER '{alive}'@'127.0.0.1'")
        pattern = lab.database.replace("_", "\\_")
        admin.execute(f"GRANT ALL ON `{pattern}`.* TO '{alive}'@'127.0.0.1'")
        dropped = mysql.sweep_users(admin)
        assert f"{gone}@127.0.0.1" in dropped and f"{alive}@127.0.0.1" not in dropped
        assert alive in sandbox_users(server) and gone not in sandbox_users(server)
    finally:
        admin.execute(f"DROP USER IF EXISTS '{gone}'@'127.0.0.1'")
        admin.execute(f"DROP USER IF EXISTS '{alive}'@'127.0.0.1'")
        lab.drop()


@pytest.mark.needs_mysql
def test_the_workbooks_mariadb_specs_pass_check_as_the_throw_away_user(server, capsys):
    if server.engine != "mariadb":
        pytest.skip(f"the shipped outputs are MariaDB's; this server is {server.describe()}")
    before = sandbox_users(server)
    assert specmod.spec_command(what="run", specs=[], engine="mariadb", check=True) == 0
    captured = capsys.readouterr()
    assert captured.out.count("ok: ") == len(specmod.own_specs("mariadb"))
    assert "ran as your own user" not in captured.err       # no fallback: the sandbox ran them
    assert sandbox_users(server) == before


@pytest.mark.needs_mysql
def test_trusted_runs_a_mariadb_spec_as_the_configured_user(server, monkeypatch):
    monkeypatch.delenv(specmod.CLASSROOM_ENV, raising=False)
    text = "session s1\nstep who { SELECT CURRENT_USER() LIKE 'labkit\\\\_sbx\\\\_%' AS sandboxed; }\n"
    err = io.StringIO()
    out = specmod.run_mysql(specmod.parse(text), engine=server.engine, trusted=True, stderr=err)
    assert specmod.format_result(["sandboxed"], [("0",)]) in out, out
    assert "--trusted: ran the spec's SQL with your own role's rights" in err.getvalue()
