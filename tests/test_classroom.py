"""labkit classroom on a real server: a role per trainee that reaches its own labs and no one
else's, the presenter's view, and clean-up that touches the classroom and nothing else."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import psycopg
import pytest

from labkit.core.db import Database
from labkit.core.errors import LabkitError
from labkit.core.lab import Lab
from labkit.labs import puzzles
from labkit.tools import classroom


# CI's servers (labkit's embedded one, and PostgreSQL 15 here) trust every connection from this
# host, which `create` refuses for a real room; the tests of what a role may do pass the flag a
# presenter would, and the tests of the refusal itself, and of a server that asks for passwords,
# are below.
@pytest.fixture
def room(db, tmp_path):
    out = tmp_path / "room.json"
    trainees = classroom.create(db.dsn, 2, out=out, trust_ok=True)
    try:
        yield trainees, out
    finally:
        classroom.drop(db.dsn)


def as_trainee(trainee: classroom.Trainee, db: Database, name: str) -> Lab:
    # each trainee runs with LABKIT_DSN set to their own DSN; in this one process, name the user
    return Lab.open(Database(trainee.dsn, "dsn", trainee.name, db.version_num, db.version), name,
                    user=trainee.name)


def labkit_cmd(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "labkit", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120)


def test_each_trainee_reaches_its_own_lab_and_no_one_elses(db, room):
    (a, b), _ = room
    lab_a = as_trainee(a, db, "classroom_t")
    lab_b = as_trainee(b, db, "classroom_t")
    try:
        lab_a.create_jobs(3)
        lab_b.create_jobs(2)                          # B's own lab works
        assert lab_b.execute("SELECT count(*) FROM job") == [(2,)]
        theirs = f"{lab_a.schema}.job"
        with psycopg.connect(b.dsn, autocommit=True) as conn:
            for statement in (f"SELECT * FROM {theirs}", f"UPDATE {theirs} SET status = 'DONE'",
                              f"DELETE FROM {theirs}", f"DROP SCHEMA {lab_a.schema} CASCADE",
                              f"DROP TABLE {theirs}"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(statement)
            # nor end A's sessions
            holder = lab_a.connect(role="holder")
            holder.execute("BEGIN")
            holder.execute("SELECT id FROM job LIMIT 1 FOR UPDATE")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("SELECT pg_terminate_backend(%s)", (holder.info.backend_pid,))
            # and the query text of A's sessions is not B's to read
            seen = conn.execute("SELECT query FROM pg_stat_activity WHERE pid = %s",
                                (holder.info.backend_pid,)).fetchone()
            assert seen == ("<insufficient privilege>",)
            holder.rollback()
            holder.close()
        assert lab_a.execute("SELECT count(*) FROM job WHERE status = 'PENDING'") == [(3,)]
    finally:
        lab_a.drop()
        lab_b.drop()


def test_the_roles_get_only_what_the_labs_need(db, room):
    trainees, out = room
    with psycopg.connect(db.dsn) as conn:
        rows = conn.execute("SELECT rolname, rolsuper, rolcreatedb, rolcreaterole, rolreplication, "
                            "rolbypassrls, rolcanlogin FROM pg_roles WHERE rolname = ANY(%s) ORDER BY 1",
                            ([t.role for t in trainees],)).fetchall()
    assert rows == [(t.role, False, False, False, False, False, True) for t in trainees]
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    written = json.loads(out.read_text())
    assert [t["name"] for t in written["trainees"]] == ["trainee01", "trainee02"]
    assert [t["dsn"] for t in written["trainees"]] == [t.dsn for t in trainees]


def test_status_shows_progress_and_clean_ends_only_trainee_sessions_idle_in_a_transaction(db, room):
    (a, b), _ = room
    lab_a = as_trainee(a, db, "02_the_convoy")
    stuck = lab_a.connect(role="stuck")
    admin = psycopg.connect(db.dsn)              # the presenter's own session, also idle in a transaction
    try:
        lab_a.create_jobs(1)
        stuck.execute("BEGIN")
        stuck.execute("SELECT id FROM job FOR UPDATE")
        admin.execute("SELECT 1")
        rows = {r["trainee"]: r for r in classroom.status(db.dsn)}
        assert rows["trainee01"]["schemas"] == 1 and rows["trainee01"]["last_notebook"] == "02_the_convoy"
        assert rows["trainee01"]["idle_in_transaction"] == 1 and rows["trainee01"]["sessions"] >= 2
        assert rows["trainee02"] == {"trainee": "trainee02", "role": b.role, "schemas": 0,
                                     "last_notebook": None, "sessions": 0, "idle_in_transaction": 0,
                                     "puzzles": {}}
        # A puzzle trainee02 played shows on the presenter's status, from the catalogue.
        lab_b = as_trainee(b, db, "play")
        try:
            puzzles.record(lab_b.admin, puzzles.play(lab_b, "wait_convoy", ["A", "B"]))
        finally:
            lab_b.drop()
        rows = {r["trainee"]: r for r in classroom.status(db.dsn)}
        assert rows["trainee02"]["puzzles"] == {"wait_convoy": {"plays": 1, "fewest_moves": 2}}
        assert rows["trainee01"]["puzzles"] == {}
        assert classroom.clean(db.dsn) == []        # a demo's transaction, seconds old: left alone
        ended = classroom.clean(db.dsn, idle_s=0)
        assert [(pid, user) for pid, user, _ in ended] == [(stuck.info.backend_pid, a.role)]
        assert admin.execute("SELECT 2").fetchone() == (2,)          # untouched
        with pytest.raises(psycopg.OperationalError):
            stuck.execute("SELECT 1")
    finally:
        admin.close()
        stuck.close()
        lab_a.drop()


def test_drop_removes_the_classroom_and_what_it_owns_and_nothing_else(db):
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS claimlab_bystander")
        conn.execute("CREATE ROLE claimlab_bystander")     # the prefix, without the classroom's mark
    try:
        (a,) = classroom.create(db.dsn, 1, trust_ok=True)
        lab_a = as_trainee(a, db, "classroom_drop")
        lab_a.create_jobs(1)
        schema = lab_a.schema
        lab_a.close()
        assert classroom.drop(db.dsn) == [a.role]
        with psycopg.connect(db.dsn) as conn:
            left = conn.execute("SELECT rolname FROM pg_roles WHERE rolname LIKE 'claimlab%' ORDER BY 1").fetchall()
            gone = conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
        assert left == [("claimlab_bystander",)] and gone == (0,)
    finally:
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            conn.execute("DROP ROLE IF EXISTS claimlab_bystander")


def test_a_second_classroom_and_a_role_that_may_not_create_roles_are_refused(db, room):
    (a, _), _ = room
    with pytest.raises(LabkitError, match="already has a classroom"):
        classroom.create(db.dsn, 1, trust_ok=True)
    with pytest.raises(LabkitError, match="may not create roles.*Fix: connect as a superuser"):
        classroom.status(a.dsn)


def test_the_command_line_prints_the_json_the_hub_reads(db, tmp_path):
    out = tmp_path / "dsns.json"
    try:
        done = labkit_cmd("classroom", "create", "--trainees", "2", "--dsn", db.dsn, "--json",
                          "--out", str(out), "--unsafe-trusting-server")
        assert done.returncode == 0, done.stderr
        printed = json.loads(done.stdout)
        assert printed == json.loads(out.read_text())
        assert [t["name"] for t in printed["trainees"]] == ["trainee01", "trainee02"]
        assert "mode 0600" in done.stderr
        status = labkit_cmd("classroom", "status", "--dsn", db.dsn)
        assert status.returncode == 0 and "trainee02" in status.stdout
    finally:
        dropped = labkit_cmd("classroom", "drop", "--dsn", db.dsn)
    assert dropped.returncode == 0 and "dropped 2 trainee role(s)" in dropped.stdout


def _trusts(dsn: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return bool(classroom.who_gets_in_without_a_password(conn, dsn))


def _classroom_roles(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute("SELECT rolname FROM pg_roles WHERE rolname LIKE 'claimlab%' "
                                           "ORDER BY 1").fetchall()]


def test_a_server_that_trusts_this_host_is_refused_unless_told(db, tmp_path):
    """On a server whose pg_hba.conf trusts the connections from here, any trainee could log in
    as any role, a superuser included: `create` refuses, exit 2, naming the pg_hba.conf fix,
    before any role is made; --unsafe-trusting-server makes the room and says what it means."""
    out = tmp_path / "dsns.json"
    assert _classroom_roles(db.dsn) == []
    refused = labkit_cmd("classroom", "create", "--trainees", "1", "--dsn", db.dsn, "--out", str(out))
    if not _trusts(db.dsn):                # a server of your own that asks for passwords: accepted
        labkit_cmd("classroom", "drop", "--dsn", db.dsn)
        assert refused.returncode == 0, refused.stderr
        return
    assert refused.returncode == 2, refused.stderr
    assert "log in from here with a wrong password" in refused.stderr
    assert "pg_hba_file_rules" in refused.stderr and "scram-sha-256" in refused.stderr
    assert "--unsafe-trusting-server" in refused.stderr
    assert _classroom_roles(db.dsn) == [] and not out.exists()       # nothing made, the probe gone
    try:
        done = labkit_cmd("classroom", "create", "--trainees", "1", "--dsn", db.dsn, "--out", str(out),
                          "--unsafe-trusting-server")
        assert done.returncode == 0, done.stderr
        assert classroom.TRUST_WARNING in done.stderr
    finally:
        labkit_cmd("classroom", "drop", "--dsn", db.dsn)


@pytest.fixture
def password_server(scratch_server):
    """A cluster of the test's own whose pg_hba.conf asks every role for its password, and
    logs every statement: the administrator is ``postgres`` with a password."""
    scratch_server.start()
    secret = "admin-" + os.urandom(6).hex()
    with psycopg.connect(scratch_server.url(), autocommit=True) as conn:
        conn.execute(f"ALTER ROLE postgres PASSWORD '{classroom.scram_verifier(secret)}'")
        conn.execute("ALTER SYSTEM SET log_statement = 'all'")
        scratch_server.hba_file.write_text("local all all scram-sha-256\n")
        conn.execute("SELECT pg_reload_conf()")
    from psycopg.conninfo import make_conninfo
    yield scratch_server, make_conninfo(scratch_server.url(), password=secret)


def test_a_server_that_asks_for_passwords_gets_a_room_with_limits_and_no_password_in_its_log(password_server, tmp_path):
    server, admin = password_server
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(make_wrong(admin)).close()            # the server really asks
    out = tmp_path / "dsns.json"
    try:
        done = labkit_cmd("classroom", "create", "--trainees", "2", "--dsn", admin, "--out", str(out),
                          env={"LABKIT_DSN": ""})
        assert done.returncode == 0, done.stderr
        assert classroom.TRUST_WARNING not in done.stderr
        assert "each trainee: at most" in done.stderr
        trainees = json.loads(out.read_text())["trainees"]
        for t in trainees:
            with psycopg.connect(t["dsn"]) as conn:                    # in with its own password
                assert conn.execute("SELECT current_user").fetchone() == ("claimlab_" + t["name"],)
            with pytest.raises(psycopg.OperationalError):
                psycopg.connect(make_wrong(t["dsn"])).close()          # not with another
        with psycopg.connect(admin) as conn:
            stored = conn.execute("SELECT a.rolpassword, r.rolconnlimit, r.rolconfig FROM pg_authid a "
                                  "JOIN pg_roles r ON r.oid = a.oid WHERE a.rolname = 'claimlab_trainee01'").fetchone()
            budget = conn.execute(classroom.query(classroom.SQL, "connection_budget").sql).fetchone()[0]
        assert stored[0].startswith("SCRAM-SHA-256$")
        assert stored[1] == min(classroom.CONNECTIONS_NEEDED + 4, budget // 2)
        assert set(stored[2]) == {f"{k}={v}" for k, v in classroom.TRAINEE_SETTINGS.items()}
        log = server.log_file.read_text(errors="replace")
        assert "CREATE ROLE" in log                                     # the statements were logged ...
        for t in trainees:                                              # ... without the passwords
            password = psycopg.conninfo.conninfo_to_dict(t["dsn"])["password"]
            assert password not in log
        with psycopg.connect(trainees[0]["dsn"], autocommit=True) as conn:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("SET temp_file_limit = -1")              # the administrator's limit stays
            assert conn.execute("SHOW statement_timeout").fetchone() == ("5min",)
    finally:
        classroom.drop(admin)


def make_wrong(dsn: str) -> str:
    from psycopg.conninfo import make_conninfo
    return make_conninfo(dsn, password="not-" + os.urandom(4).hex())


def test_the_file_of_passwords_is_new_private_and_never_written_through_a_link(tmp_path, monkeypatch):
    made = [classroom.Trainee("trainee01", "claimlab_trainee01", "postgresql://x:secret@h/db")]
    target = tmp_path / "room.json"
    classroom.write_dsns(target, made)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    with pytest.raises(LabkitError, match="already exists"):
        classroom.check_private_target(target)                       # never over a file
    victim = tmp_path / "victim"
    victim.write_text("root's own file")
    link = tmp_path / "link.json"
    link.symlink_to(victim)
    with pytest.raises(LabkitError, match="already exists"):
        classroom.check_private_target(link)                         # nor through a planted link
    classroom.write_private(link, "handout")                         # the hub's files: the link replaced
    assert victim.read_text() == "root's own file" and not link.is_symlink()
    assert link.read_text() == "handout" and stat.S_IMODE(link.stat().st_mode) == 0o600
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)                                             # /tmp's kind of folder
    with pytest.raises(LabkitError, match="only you may write"):
        classroom.check_private_target(shared / "room.json")
    from labkit.tools.nbtools import NOTEBOOKS
    with pytest.raises(LabkitError, match="inside the workbook's folder"):
        classroom.check_private_target(NOTEBOOKS.parent / "classroom-test.json")
    with pytest.raises(LabkitError, match="inside the workbook's folder"):
        classroom.check_private_target(NOTEBOOKS / "classroom-test.json")
    hubs = NOTEBOOKS.parent / ".hub"                                  # the hub's own, git-ignored
    made_hubs = not hubs.exists()
    private = hubs / f"test-{os.getpid()}"
    private.mkdir(mode=0o700, parents=True)
    try:
        classroom.check_private_target(private / "trainees.json")    # the hub's own place: fine
    finally:
        private.rmdir()
        if made_hubs:
            hubs.rmdir()
    monkeypatch.setenv("LABKIT_STATE_DIR", str(tmp_path / "state"))
    default = classroom.default_out("training")
    assert default.parent == tmp_path / "state" and stat.S_IMODE(default.parent.stat().st_mode) == 0o700
    classroom.check_private_target(default)                          # the default place is fine


def test_other_databases_a_trainee_may_reach_are_named_and_closed_by_the_revoke_shown(db, room):
    (a, _), _ = room
    other = "claimlab_other_" + os.urandom(3).hex()
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{other}"')
    try:
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            assert other in classroom.other_databases(conn, a.role)
        lines = classroom.describe_room(db.dsn, [a])
        revoke = f'REVOKE CONNECT, TEMPORARY ON DATABASE "{other}" FROM PUBLIC;'
        assert any(revoke in line for line in lines)
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            conn.execute(revoke)
            assert other not in classroom.other_databases(conn, a.role)
        from psycopg.conninfo import make_conninfo
        with pytest.raises(psycopg.OperationalError, match="permission denied for database"):
            psycopg.connect(make_conninfo(a.dsn, dbname=other)).close()
    finally:
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{other}" WITH (FORCE)')


def test_drop_refuses_to_take_an_administrators_view_with_the_room(db, room):
    (a, _), _ = room
    lab_a = as_trainee(a, db, "classroom_view")
    lab_a.create_jobs(1)
    schema = lab_a.schema
    lab_a.close()                                         # drop ends the trainees' sessions
    view = f"public.claimlab_watch_{os.urandom(3).hex()}"
    try:
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            conn.execute(f"CREATE VIEW {view} AS SELECT id FROM {schema}.job")
        with pytest.raises(LabkitError, match="depend on what trainees own.*claimlab_watch"):
            classroom.drop(db.dsn)
        with psycopg.connect(db.dsn) as conn:              # the view, the roles: all still there
            assert conn.execute(f"SELECT count(*) FROM {view}").fetchone() == (1,)
        assert len(_classroom_roles(db.dsn)) == 2
    finally:
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            conn.execute(f"DROP VIEW IF EXISTS {view}")
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def test_a_schema_made_in_a_trainees_name_by_another_is_named_not_misreported(db, room):
    (a, b), _ = room
    lab_a = Lab.open(Database(a.dsn, "dsn", a.name, db.version_num, db.version), "classroom_squat",
                     user=a.name, reset=False)
    squatted = lab_a.schema
    with psycopg.connect(b.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{squatted}"')              # B makes A's lab schema first
    try:
        with pytest.raises(LabkitError, match=f"made by the role '{b.role}', not by you"):
            lab_a.reset()
    finally:
        lab_a.close()
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{squatted}" CASCADE')


def test_status_names_the_lab_even_when_a_long_user_name_cut_the_schema_name(db, room):
    """On a hub a trainee's user tag is long (login claimlab-trainee01 plus the role): the
    schema's name is cut to fit and ends in a hash, and status still names the lab."""
    (a, _), _ = room
    long_user = "claimlab_trainee01_claimlab_trainee01"
    lab = Lab.open(Database(a.dsn, "dsn", a.name, db.version_num, db.version), "11_production",
                   user=long_user)
    try:
        assert lab.schema != f"lab_11_production_{long_user}"       # it was cut
        rows = {r["trainee"]: r for r in classroom.status(db.dsn)}
        assert rows["trainee01"]["last_notebook"] == "11_production"
    finally:
        lab.drop()


def test_a_schema_a_trainee_names_after_another_role_is_never_searched_by_it(db, room):
    """With the default search_path, "$user", public, a schema named after a role comes first
    in that role's sessions: a trainee could plant tables and functions there for the
    administrator or another trainee to run. The room sets the database's search_path to
    public, and drop gives the default back."""
    (a, b), _ = room
    with psycopg.connect(a.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{b.role}"')
        conn.execute(f'GRANT USAGE, CREATE ON SCHEMA "{b.role}" TO "{b.role}"')
        conn.execute(f'CREATE TABLE "{b.role}".notes (x text)')
        conn.execute(f'GRANT ALL ON "{b.role}".notes TO "{b.role}"')
    try:
        with psycopg.connect(b.dsn, autocommit=True) as conn:
            assert conn.execute("SHOW search_path").fetchone() == ("public",)
            with pytest.raises(psycopg.errors.UndefinedTable):
                conn.execute("INSERT INTO notes VALUES ('a private note')")
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            assert conn.execute("SHOW search_path").fetchone() == ("public",)
    finally:
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{b.role}" CASCADE')


def test_drop_gives_the_database_its_search_path_back(db, tmp_path):
    classroom.create(db.dsn, 1, trust_ok=True)
    with psycopg.connect(db.dsn) as conn:
        assert conn.execute(classroom.query(classroom.SQL, "database_search_path").sql).fetchone() \
            == ("search_path=public",)
    classroom.drop(db.dsn)
    with psycopg.connect(db.dsn) as conn:
        assert conn.execute(classroom.query(classroom.SQL, "database_search_path").sql).fetchone() is None


def test_drop_names_any_outside_dependant_and_ends_no_session_first(db, room):
    """A foreign key from an administrator's table to a trainee's is refused by name, with no
    traceback, before any trainee session is ended."""
    (a, _), _ = room
    lab_a = as_trainee(a, db, "classroom_fk")
    lab_a.create_jobs(1)
    table = f"public.claimlab_fk_{os.urandom(3).hex()}"
    try:
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {table} (job_id bigint REFERENCES {lab_a.schema}.job (id))")
        session = lab_a.connect(role="still-here")
        with pytest.raises(LabkitError, match="depend on theirs.*Fix: drop or change the objects named"):
            classroom.drop(db.dsn)
        assert session.execute("SELECT 1").fetchone() == (1,)        # not ended
        assert len(_classroom_roles(db.dsn)) == 2
        session.close()
    finally:
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
        lab_a.drop()


def test_a_trainees_dsn_keeps_where_the_server_is_and_none_of_the_admins_options():
    dsn = classroom.trainee_dsn("postgresql://admin:secret@db.example:6543/training?sslmode=require"
                                "&options=-c%20log_statement%3Dall&application_name=presenter",
                                "claimlab_trainee01", "pw")
    parts = psycopg.conninfo.conninfo_to_dict(dsn)
    assert parts == {"host": "db.example", "port": "6543", "dbname": "training", "sslmode": "require",
                     "user": "claimlab_trainee01", "password": "pw"}
