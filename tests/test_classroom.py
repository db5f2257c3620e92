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
from labkit.tools import classroom


@pytest.fixture
def room(db, tmp_path):
    out = tmp_path / "room.json"
    trainees = classroom.create(db.dsn, 2, out=out)
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
                                     "last_notebook": None, "sessions": 0, "idle_in_transaction": 0}
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
        (a,) = classroom.create(db.dsn, 1)
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
        classroom.create(db.dsn, 1)
    with pytest.raises(LabkitError, match="may not create roles.*Fix: connect as a superuser"):
        classroom.status(a.dsn)


def test_the_command_line_prints_the_json_the_hub_reads(db, tmp_path):
    out = tmp_path / "dsns.json"
    try:
        done = labkit_cmd("classroom", "create", "--trainees", "2", "--dsn", db.dsn, "--json",
                          "--out", str(out))
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


def test_a_server_that_trusts_the_trainees_connections_is_named(db, tmp_path):
    """A role's password keeps trainees apart only where the server asks for it: on a server
    whose pg_hba.conf trusts every connection, `create` says so."""
    out = tmp_path / "dsns.json"
    try:
        done = labkit_cmd("classroom", "create", "--trainees", "1", "--dsn", db.dsn, "--out", str(out))
        assert done.returncode == 0, done.stderr
        made = [classroom.Trainee(t["name"], "claimlab_" + t["name"], t["dsn"])
                for t in json.loads(out.read_text())["trainees"]]
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            methods = {r[0] for r in conn.execute("SELECT auth_method FROM pg_catalog.pg_hba_file_rules")}
        if methods == {"trust"}:           # both of CI's servers: labkit's embedded one, and PostgreSQL 15 here
            assert classroom.asks_for_passwords(made[0]) is False
            assert classroom.TRUST_WARNING in done.stderr
        elif "trust" not in methods:
            assert classroom.asks_for_passwords(made[0]) is True
            assert classroom.TRUST_WARNING not in done.stderr
        else:                              # some rules trust, some ask: the connection tells
            trusted = classroom.asks_for_passwords(made[0]) is False
            assert (classroom.TRUST_WARNING in done.stderr) == trusted
    finally:
        labkit_cmd("classroom", "drop", "--dsn", db.dsn)


def test_status_names_the_lab_even_when_a_long_user_name_cut_the_schema_name(db, room):
    """On a hub a trainee's user tag is long (login claimlab-trainee01 plus the role): the
    schema's name is cut to fit and ends in a hash, and status still names the lab."""
    (a, _), _ = room
    long_user = "claimlab_trainee01_claimlab_trainee01"
    lab = Lab.open(Database(a.dsn, "dsn", a.name, db.version_num, db.version), "13_production",
                   user=long_user)
    try:
        assert lab.schema != f"lab_13_production_{long_user}"       # it was cut
        rows = {r["trainee"]: r for r in classroom.status(db.dsn)}
        assert rows["trainee01"]["last_notebook"] == "13_production"
    finally:
        lab.drop()
