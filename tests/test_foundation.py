"""Finding a server, and every way of getting it wrong, provoked for real."""

import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import psycopg
import pytest

import labkit
from labkit import Lab
from labkit.core import db as dbmod
from labkit.core.errors import BackendError, ServerError


def test_connect_says_which_server_in_one_line(capsys):
    db = labkit.connect()
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    assert out.startswith(f"PostgreSQL {db.version} · {db.backend}")
    assert db.version_num >= 120000


def test_backend_follows_the_environment(monkeypatch):
    db = labkit.connect(quiet=True)
    assert db.backend == ("dsn" if os.environ.get("LABKIT_DSN") else "embedded")


def test_a_server_older_than_the_minimum_is_refused(db):
    # No PostgreSQL 11 is at hand, so raise the bar above the real server instead.
    with pytest.raises(ServerError, match=r"labkit needs 99 or newer") as err:
        dbmod._check_version(dbmod.Database(db.dsn, db.backend, db.where), minimum=990000)
    assert "LABKIT_DSN" in str(err.value)


def test_unreachable_dsn_names_the_fix_and_hides_the_password(monkeypatch):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("LABKIT_DSN", f"postgresql://alice:s3cret-pw@127.0.0.1:{port}/nowhere")
    monkeypatch.delenv("LABKIT_BACKEND", raising=False)
    with pytest.raises(ServerError) as err:
        labkit.connect(quiet=True)
    msg = str(err.value)
    assert "s3cret-pw" not in msg
    assert "Fix:" in msg and "LABKIT_DSN" in msg


def test_mistyped_dsn_is_reported_without_the_password(monkeypatch):
    monkeypatch.setenv("LABKIT_DSN", "host=127.0.0.1 password=s3cret-pw dbname")
    with pytest.raises(BackendError, match="not a valid connection string") as err:
        labkit.connect(quiet=True)
    assert "s3cret-pw" not in str(err.value)


def test_unknown_backend_and_dsn_backend_without_dsn(monkeypatch):
    monkeypatch.setenv("LABKIT_BACKEND", "oracle")
    with pytest.raises(BackendError, match="not a backend"):
        labkit.connect(quiet=True)
    monkeypatch.setenv("LABKIT_BACKEND", "dsn")
    monkeypatch.delenv("LABKIT_DSN", raising=False)
    with pytest.raises(BackendError, match="LABKIT_DSN is not set"):
        labkit.connect(quiet=True)


def test_docker_backend_without_an_engine_says_so(monkeypatch):
    monkeypatch.setenv("LABKIT_BACKEND", "docker")
    ok, _ = dbmod.docker_available()
    if ok:  # a machine with Docker: the backend must then really work
        db = labkit.connect(quiet=True, fresh=True)
        assert db.backend == "docker" and db.version_num >= 120000
        return
    with pytest.raises(BackendError) as err:
        labkit.connect(quiet=True)
    assert "needs a running Docker engine" in str(err.value)
    assert "unset LABKIT_BACKEND" in str(err.value)


def test_two_labs_never_see_each_others_rows_or_locks(db):
    a, b = Lab.open(db, "iso_one"), Lab.open(db, "iso_two")
    try:
        a.create_jobs(3)
        b.create_jobs(1)
        assert a.schema != b.schema
        assert len(a.jobs()) == 3 and len(b.jobs()) == 1
        with a.connect() as ca:
            ca.execute("BEGIN")
            ca.execute("SELECT id FROM job WHERE id = 1 FOR UPDATE")
            # the same-named row in the other lab is free
            assert b.execute("SELECT id FROM job WHERE id = 1 FOR UPDATE NOWAIT") == [(1,)]
    finally:
        a.drop()
        b.drop()


def test_reset_ends_sessions_left_holding_locks(db):
    lab = Lab.open(db, "reset_me")
    lab.create_jobs(1)
    stray = lab.connect(role="stray")
    stray.execute("BEGIN")
    stray.execute("SELECT * FROM job FOR UPDATE")
    lab.reset()  # would block on the stray lock without ending that session
    assert lab.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", (lab.schema,)) == [(1,)]
    assert stray.closed or stray.broken or _is_dead(stray)
    lab.drop()


def _running(proc) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _is_dead(conn) -> bool:
    try:
        conn.execute("SELECT 1")
    except psycopg.OperationalError:
        return True
    return False


def test_schema_names_are_quoted_identifiers(db):
    lab = Lab.open(db, 'Weird "name"; DROP')
    try:
        assert lab.schema.startswith("lab_weird_name_drop")
        lab.create_jobs(1)
        assert len(lab.jobs()) == 1
    finally:
        lab.drop()


# -- the embedded server, each test in a data directory of its own -----------------------


def test_embedded_server_starts_cold_and_is_shared(scratch_server):
    t0 = time.monotonic()
    st = scratch_server.start()
    cold = time.monotonic() - t0
    assert st.running and st.port and st.pid
    # A second process finds the same server, it does not start another.
    out = subprocess.run([sys.executable, "-m", "labkit", "server", "status"],
                         capture_output=True, text=True, env=os.environ.copy())
    assert out.returncode == 0 and f"pid {st.pid}" in out.stdout
    assert scratch_server.start().pid == st.pid
    assert cold < 60
    assert not scratch_server.stop().running


def test_cli_server_start_stop_status_url(scratch_server):
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "labkit", "server", *args],
                              capture_output=True, text=True, env=os.environ.copy())
    assert "running" in cli("start").stdout
    url = cli("url").stdout.strip()
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert cli("stop").returncode == 0
    st = cli("status")
    assert st.returncode == 3 and "stopped" in st.stdout


def test_damaged_data_directory_names_reset(scratch_server):
    scratch_server.start()
    scratch_server.stop()
    (scratch_server.pgdata / "PG_VERSION").unlink()  # a cluster labkit made, now damaged
    with pytest.raises(ServerError, match="labkit server reset"):
        scratch_server.start()
    scratch_server.reset()
    assert scratch_server.start().running


@pytest.mark.parametrize("port", ["70000", "-1", "0", "port", "5432.5"])
def test_a_bad_port_names_the_fix_and_starts_nothing(scratch_server, monkeypatch, port):
    monkeypatch.setenv("LABKIT_PG_PORT", port)
    with pytest.raises(ServerError, match="LABKIT_PG_PORT") as err:
        scratch_server.start()
    assert "1 to 65535" in str(err.value)
    assert not scratch_server.status().running
    out = subprocess.run([sys.executable, "-m", "labkit", "server", "start"],
                         capture_output=True, text=True, env=os.environ.copy())
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "LABKIT_PG_PORT" in out.stderr and out.stderr.count("\n") == 1


def test_data_directory_in_use_by_another_server(scratch_server):
    st = scratch_server.start()
    # Make labkit believe its server listens elsewhere: the running postmaster then
    # looks like somebody else's server holding the data directory.
    scratch_server._write_state(port=st.port + 1 if st.port < 65535 else st.port - 1)
    with pytest.raises(ServerError, match="in use by another PostgreSQL server") as err:
        scratch_server.start()
    assert f"pid {st.pid}" in str(err.value)
    scratch_server._write_state(port=st.port)


def test_killed_server_is_reported_and_start_recovers(scratch_server, monkeypatch):
    st = scratch_server.start()
    db = labkit.connect(quiet=True)
    assert db.backend == "embedded" and str(st.port) in db.where
    # The server line every notebook prints first names no folder of the machine that ran it.
    assert db.describe().endswith(f"embedded: owner-only Unix socket, port {st.port}")
    assert "/" not in db.describe()
    lab = Lab.open(db, "killed")
    lab.create_jobs(2)
    backend = psutil.Process(lab.admin.info.backend_pid)
    os.kill(st.pid, signal.SIGKILL)
    # The postmaster is gone at once; its backends notice and exit a moment later.  Wait for
    # the lab's own backend too, or its next statement may still be answered.
    deadline = time.monotonic() + 10
    while (scratch_server._pid() is not None or _running(backend)) and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(ServerError) as err:
        lab.execute("SELECT count(*) FROM job")
        lab.execute("SELECT count(*) FROM job")
    assert "labkit server start" in str(err.value)
    # the next connect() starts the server again; the lab's rows survived the crash
    db = labkit.connect(quiet=True)
    lab = Lab.open(db, "killed", reset=False)
    assert lab.execute("SELECT count(*) FROM job") == [(2,)]
    lab.drop()



@pytest.mark.parametrize("change, says", [
    ({"user": "nobody_at_all"}, "user name in LABKIT_DSN does not exist"),
    ({"dbname": "no_such_database_x"}, "database name in LABKIT_DSN does not exist"),
])
def test_a_wrong_user_or_database_is_named_not_blamed_on_the_server(db, monkeypatch, change, says):
    dsn = psycopg.conninfo.make_conninfo(db.dsn, **change)
    monkeypatch.setenv("LABKIT_DSN", dsn)
    monkeypatch.delenv("LABKIT_BACKEND", raising=False)
    with pytest.raises(ServerError, match="refused the connection") as err:
        labkit.connect(quiet=True)
    assert says in str(err.value)


def test_lock_errors_from_lab_execute_are_not_reported_as_a_dead_server(lab):
    lab.create_jobs(1)
    with lab.connect(role="holder") as holder:
        holder.execute("BEGIN")
        holder.execute("SELECT id FROM job FOR UPDATE")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            lab.execute("SELECT id FROM job FOR UPDATE NOWAIT")
    assert lab.execute("SELECT 1") == [(1,)]


def test_labkit_user_separates_trainees_who_log_in_alike(db, monkeypatch):
    monkeypatch.setenv("LABKIT_USER", "trainee_7")
    assert labkit.schema_name("01_one_lock").endswith("_trainee_7")
    monkeypatch.setenv("LABKIT_USER", "Trainee 7")  # changed to fit, so a hash keeps it apart
    assert "_trainee_7_" in labkit.schema_name("01_one_lock")
    assert labkit.schema_name("01_one_lock") != labkit.schema_name("01_one_lock", "trainee_7")


def test_long_lab_names_leave_room_for_the_role_in_application_name(db):
    long_a = labkit.schema_name("t_test_closing_a_run_releases_every_lock_and_connection_784")
    long_b = labkit.schema_name("t_test_closing_a_run_releases_every_lock_and_connection_785")
    assert len(long_a) <= 41 and long_a != long_b and long_a.startswith("lab_t_test_closing")
    lab = Lab.open(db, "t_test_closing_a_run_releases_every_lock_and_connection_784")
    try:
        with lab.connect(role="bench-pgbench") as conn:
            name = conn.execute("SHOW application_name").fetchone()[0]
        assert name == f"labkit:{lab.schema}:bench-pgbench"
    finally:
        lab.drop()


def test_lab_user_sets_labkit_user_and_puts_it_back(monkeypatch):
    from labkit.core.db import current_user_tag, lab_user

    monkeypatch.delenv("LABKIT_USER", raising=False)
    with lab_user("book_reader"):
        assert current_user_tag() == "book_reader"
    assert "LABKIT_USER" not in os.environ
    monkeypatch.setenv("LABKIT_USER", "trainee7")
    with pytest.raises(RuntimeError), lab_user("bench1"):
        assert os.environ["LABKIT_USER"] == "bench1"
        raise RuntimeError("a failure inside the block")
    assert os.environ["LABKIT_USER"] == "trainee7"


def test_drop_schemas_drops_what_the_pattern_names_and_nothing_else(db):
    from labkit.core.lab import drop_schemas

    tag = f"dropme{os.getpid()}"
    mine = [Lab.open(db, n, user=tag) for n in ("one", "two")]
    mine[0].execute("CREATE TABLE kept_until_dropped (id int)")
    other = Lab.open(db, "neighbour", user=f"keep{os.getpid()}")
    try:
        with db.connect() as conn:
            dropped = drop_schemas(conn, "lab\\_%\\_" + tag)
            left = {r[0] for r in conn.execute("SELECT nspname FROM pg_namespace").fetchall()}
        assert dropped == sorted(lab.schema for lab in mine)
        assert not left & set(dropped) and other.schema in left
    finally:
        for lab in (*mine, other):
            lab.drop()


def test_a_labs_advisory_keys_are_its_own_and_fit_the_lock_table():
    """Advisory locks are database-wide: each lab, and each purpose within a lab, has its own
    key, positive and within 48 bits (pg_locks shows it as classid and objid)."""
    from labkit.core.lab import advisory_key

    keys = {advisory_key(s, p) for s in ("lab_a_u", "lab_b_u") for p in ("", "hang", "leader")}
    assert len(keys) == 6 and all(0 < k < 2 ** 48 for k in keys)
    assert advisory_key("lab_a_u", "hang") == advisory_key("lab_a_u", "hang")
