"""Safe on a shared machine and a shared server: each test attacks one door, for real.

The tests that act as a second OS user (``nobody``), as the server's own system user, or
mount a small disk need root; the suite runs as root in CI.  As a normal user those parts
check what a normal user can (the socket folder's mode, no TCP listener), never nothing.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import psycopg
import pytest

import labkit
from labkit import Lab
from labkit.core import db as dbmod
from labkit.core.errors import BackendError, ServerError
from labkit.core.lab import own_lab_schemas
from labkit.core.server import PG_SYSTEM_USER

ROOT = os.geteuid() == 0


def _cli(*args, env=None, **kw):
    return subprocess.run([sys.executable, "-m", "labkit", *args], capture_output=True,
                          text=True, env=env or os.environ.copy(), timeout=120, **kw)


def _stat_chain(path: Path) -> dict:
    """Owner and mode of a path and every folder above it."""
    out = {}
    for p in [path, *path.parents]:
        if os.path.lexists(p):
            st = os.lstat(p)
            out[str(p)] = (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode))
    return out


# -- 1 · only the owner reaches the embedded server ---------------------------------------------

ATTACK = r"""
import socket, sys
path, port = sys.argv[1], int(sys.argv[2])
results = []
try:
    s = socket.socket(socket.AF_UNIX); s.settimeout(2); s.connect(path); results.append("unix:OPEN")
except OSError as e:
    results.append(f"unix:{type(e).__name__}")
for host in ("127.0.0.1", "::1"):
    try:
        s = socket.create_connection((host, port), timeout=2); results.append(f"tcp {host}:OPEN")
    except OSError as e:
        results.append(f"tcp {host}:{type(e).__name__}")
print(" ".join(results))
"""


def test_another_os_user_cannot_reach_the_embedded_server(scratch_server):
    st = scratch_server.start()
    sock = scratch_server.socket_path()
    # the owner can (the positive control: the attack below would succeed if the door were open)
    with psycopg.connect(scratch_server.conninfo()) as conn:
        assert conn.execute("SELECT current_setting('listen_addresses')").fetchone() == ("",)
        # durable commits, whatever an older cluster's configuration said
        assert [conn.execute(f"SHOW {n}").fetchone()[0] for n in ("fsync", "synchronous_commit")] \
            == ["on", "on"]
    # no TCP listener at all on the postmaster
    assert [c for c in psutil.Process(st.pid).net_connections(kind="inet")] == []
    run = os.stat(scratch_server.run_dir)
    assert stat.S_IMODE(run.st_mode) == 0o700
    if not ROOT:
        assert run.st_uid == os.geteuid()
        return
    python = shutil.which("python3", path="/usr/bin:/bin:/usr/local/bin") or sys.executable
    out = subprocess.run([python, "-c", ATTACK, str(sock), str(st.port)], user="nobody",
                         capture_output=True, text=True, timeout=30, cwd="/")
    assert out.returncode == 0, out.stderr
    assert "OPEN" not in out.stdout, out.stdout
    assert "unix:PermissionError" in out.stdout
    # and the server's own system user, which owns the socket folder, is not the attacker:
    assert pwd.getpwuid(run.st_uid).pw_name == PG_SYSTEM_USER


# -- 2, 3 · root follows no link, changes no owner; the server gets a bare environment --------

@pytest.mark.skipif(not ROOT, reason="attacks root's own start-up; needs root")
def test_root_follows_no_link_planted_by_the_server_user(scratch_server, scratch_root):
    victim = scratch_root / "root-only.txt"
    victim.write_text("root's secret\n")
    os.chmod(victim, 0o600)
    before = (victim.read_text(), _stat_chain(victim)[str(victim)])
    scratch_server.start()
    scratch_server.stop()
    pg = pwd.getpwnam(PG_SYSTEM_USER)

    def as_pg(*cmd):
        return subprocess.run(list(cmd), user=pg.pw_uid, group=pg.pw_gid, extra_groups=[],
                              capture_output=True, text=True, cwd="/")
    # the server's user cannot write where root keeps its files ...
    assert as_pg("touch", str(scratch_server.data_dir / "planted")).returncode != 0
    # ... and every link it can plant where it may write points at root's file
    for place in (scratch_server.run_dir / "server.log", scratch_server.pgdata / "postmaster.pid",
                  scratch_server.run_dir / ".s.PGSQL.54329.lock", scratch_server.pgdata / "server.log"):
        as_pg("rm", "-f", str(place))
        assert as_pg("ln", "-s", str(victim), str(place)).returncode == 0
    for action in ("status", "start", "stop", "url", "start", "stop", "reset"):
        getattr(scratch_server, action)()  # links removed, never followed
        assert (victim.read_text(), _stat_chain(victim)[str(victim)]) == before, action
    assert not scratch_server.pgdata.exists()


def test_a_link_planted_as_the_lock_file_is_refused_never_followed(scratch_server, scratch_root):
    """The lock file sits beside the data folder: a link planted there would make labkit
    (root, say) create or truncate the file it points to."""
    victim = scratch_root / "victim.txt"
    victim.write_text("someone's file\n")
    lock = Path(str(scratch_server.data_dir) + ".lock")
    lock.symlink_to(victim)
    with pytest.raises(ServerError, match="is a link: labkit does not follow it"):
        scratch_server.start()
    assert victim.read_text() == "someone's file\n" and lock.is_symlink()
    lock.unlink()
    assert scratch_server.start().running                   # a real lock file: fine


def test_a_fifo_planted_as_postmaster_pid_does_not_hang_status(scratch_server):
    scratch_server.start()
    scratch_server.stop()
    pidfile = scratch_server.pgdata / "postmaster.pid"
    if pidfile.exists():
        pidfile.unlink()
    os.mkfifo(pidfile)
    try:
        started = time.monotonic()
        out = _cli("server", "status")
        assert time.monotonic() - started < 20
        assert out.returncode == 3 and "stopped" in out.stdout.lower(), out.stdout + out.stderr
    finally:
        pidfile.unlink()


def test_a_server_that_will_not_stop_fast_is_stopped_immediately(scratch_server, monkeypatch):
    """A backend frozen by SIGSTOP never answers a fast shutdown: stop gives up on it after
    FAST_STOP_S and stops the server immediately, instead of waiting a minute for a traceback."""
    import signal

    scratch_server.start()
    conn = psycopg.connect(scratch_server.url(), autocommit=True)
    backend = conn.info.backend_pid
    os.kill(backend, signal.SIGSTOP)
    monkeypatch.setattr(type(scratch_server), "FAST_STOP_S", 2)
    try:
        started = time.monotonic()
        status = scratch_server.stop()
        took = time.monotonic() - started
        assert not status.running and scratch_server._pid() is None
        assert took < 40, took
        assert not psutil.pid_exists(backend) or psutil.Process(backend).status() == psutil.STATUS_ZOMBIE
    finally:
        try:
            os.kill(backend, signal.SIGCONT)
        except ProcessLookupError:
            pass
        conn.close()


def test_the_state_file_is_replaced_never_written_through(scratch_server, scratch_root):
    victim = scratch_root / "victim.txt"
    victim.write_text("keep me")
    scratch_server.data_dir.mkdir()
    scratch_server.state_file.symlink_to(victim)
    scratch_server._write_state(port=1234)
    assert victim.read_text() == "keep me"
    assert not scratch_server.state_file.is_symlink()
    assert scratch_server._read_state() == {"port": 1234}


def test_the_server_gets_a_bare_environment_and_no_extra_groups(scratch_server, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "cloud-key-do-not-leak")
    monkeypatch.setenv("PGPASSWORD", "pg-pw-do-not-leak")
    st = scratch_server.start()
    environ = Path(f"/proc/{st.pid}/environ").read_bytes().split(b"\0")
    names = {e.split(b"=", 1)[0].decode() for e in environ if e}
    assert b"cloud-key-do-not-leak" not in b"".join(environ)
    assert b"pg-pw-do-not-leak" not in b"".join(environ)
    assert names <= {"PATH", "PWD", "LC_ALL", "LANG", "TZ", "PGDATA", "PG_GRANDPARENT_PID", "PGSYSCONFDIR",
                     "PGLOCALEDIR", "LC_COLLATE", "LC_CTYPE", "LC_MONETARY", "LC_NUMERIC",
                     "LC_TIME", "LC_MESSAGES"}, names
    groups = [line for line in Path(f"/proc/{st.pid}/status").read_text().splitlines()
              if line.startswith("Groups:")][0]
    if ROOT:
        assert groups.split(":", 1)[1].strip() == "", groups


# -- 5 · reset deletes only what labkit made; no folder above changes --------------------------

def test_reset_keeps_other_files_and_no_parent_changes(scratch_root, monkeypatch):
    from labkit.core.server import EmbeddedServer

    home = scratch_root / "shared" / "mine"
    home.mkdir(parents=True)
    (home / "notes.txt").write_text("my notes")
    (home / "project").mkdir()
    (home / "project" / "keep.sql").write_text("SELECT 1;")
    monkeypatch.setenv("LABKIT_DATA_DIR", str(home))
    chain = _stat_chain(scratch_root / "shared")
    server = EmbeddedServer()
    try:
        assert server.start().running
    finally:
        server.reset()
    assert (home / "notes.txt").read_text() == "my notes"
    assert (home / "project" / "keep.sql").exists()
    assert not server.pgdata.exists() and not server.run_dir.exists()
    assert _stat_chain(scratch_root / "shared") == chain


def test_reset_will_not_delete_a_data_folder_labkit_did_not_make(scratch_server):
    scratch_server.data_dir.mkdir()
    scratch_server.pgdata.mkdir()
    (scratch_server.pgdata / "thesis.tex").write_text("years of work")
    with pytest.raises(ServerError, match="not a cluster labkit created"):
        scratch_server.start()
    with pytest.raises(ServerError, match="will not delete it"):
        scratch_server.reset()
    assert (scratch_server.pgdata / "thesis.tex").read_text() == "years of work"


@pytest.mark.skipif(not ROOT, reason="the server runs as another user only under root")
def test_a_closed_parent_is_named_and_left_closed(scratch_root, monkeypatch):
    from labkit.core.server import EmbeddedServer

    closed = scratch_root / "closed"
    closed.mkdir(mode=0o700)
    os.chmod(closed, 0o700)
    monkeypatch.setenv("LABKIT_DATA_DIR", str(closed / "pg"))
    with pytest.raises(ServerError, match="closed to other users") as err:
        EmbeddedServer().start()
    assert "LABKIT_DATA_DIR" in str(err.value) and str(closed) in str(err.value)
    assert stat.S_IMODE(os.stat(closed).st_mode) == 0o700


def test_data_dir_that_is_a_file_is_one_paragraph(scratch_root):
    f = scratch_root / "a-file"
    f.write_text("x")
    env = {**os.environ, "LABKIT_DATA_DIR": str(f)}
    env.pop("LABKIT_DSN", None)
    env.pop("LABKIT_BACKEND", None)
    for args in (("server", "start"), ("server", "status"), ("doctor",)):
        out = _cli(*args, env=env)
        assert out.returncode in (1, 2) and "Traceback" not in out.stderr + out.stdout
        assert "is a file, not a folder" in out.stderr + out.stdout
    assert f.read_text() == "x"


# -- 8 · a stale postmaster.pid is never trusted ----------------------------------------------------

def test_a_reused_pid_is_not_killed_and_a_zombie_does_not_block_start(scratch_server):
    st = scratch_server.start()
    scratch_server.stop()
    pidfile = scratch_server.pgdata / "postmaster.pid"
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        pidfile.write_text(f"{bystander.pid}\n{scratch_server.pgdata}\n")
        assert scratch_server._pid() is None
        out = _cli("server", "stop")
        assert out.returncode == 0, out.stderr
        time.sleep(0.2)
        assert bystander.poll() is None, "labkit server stop killed an unrelated process"
        zombie = subprocess.Popen(["true"])
        deadline = time.monotonic() + 10
        while psutil.Process(zombie.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        for lock in (pidfile, scratch_server.run_dir / f".s.PGSQL.{st.port}.lock"):
            lock.write_text(f"{zombie.pid}\n{scratch_server.pgdata}\n")
        restarted = scratch_server.start()
        assert restarted.running and restarted.pid not in (zombie.pid, bystander.pid)
        zombie.wait()
    finally:
        bystander.kill()
        bystander.wait()


# -- 9 · no password in any output or repr ----------------------------------------------------------

SECRET = "Sup3rS3cret"


@pytest.mark.parametrize("dsn", [
    f"postgresql://alice:{SECRET}@[::1/db",
    f"postgresql://alice:{SECRET}%@127.0.0.1/db",
    f"postgresql://alice:{SECRET}%zz@127.0.0.1:5/db",
    f"postgresql://alice:{SECRET[:5]}@{SECRET[5:]}@127.0.0.1:1/db",
    f"host=127.0.0.1 password={SECRET} dbname",
    f"host=127.0.0.1 password='{SECRET}",
    f"postgresql://alice@127.0.0.1:1/db?password={SECRET}",
    f"[::1 password={SECRET}",
])
def test_no_password_in_errors_for_malformed_dsns(monkeypatch, dsn):
    monkeypatch.setenv("LABKIT_DSN", dsn)
    monkeypatch.delenv("LABKIT_BACKEND", raising=False)
    with pytest.raises((BackendError, ServerError)) as err:
        labkit.connect(quiet=True)
    text = str(err.value)
    for piece in (SECRET, SECRET[:5], SECRET[5:]):
        assert piece not in text, text
    out = _cli("doctor", env={**os.environ, "LABKIT_DSN": dsn})
    for piece in (SECRET, SECRET[:5], SECRET[5:]):
        assert piece not in out.stdout + out.stderr


def test_a_database_object_never_shows_its_dsn(db):
    with_pw = dbmod.Database(psycopg.conninfo.make_conninfo(db.dsn, password=SECRET), db.backend,
                             db.where)
    assert SECRET not in repr(with_pw) and SECRET not in with_pw.describe()


# -- 6, 7 · clean-up and names: exactly mine, nobody else's ---------------------------------------------

@pytest.mark.parametrize("names", [
    ("José", "Jos", "jos"),
    ("李雷", "韩梅梅", "user", "u"),
    ("Bob.Smith", "bob-smith", "bob_smith", "Bob_Smith"),
])
def test_user_tags_keep_different_people_apart(monkeypatch, names):
    tags = []
    for name in names:
        monkeypatch.setenv("LABKIT_USER", name)
        tags.append(labkit.schema_name("01_one_lock"))
    assert len(set(tags)) == len(names), tags
    for t in tags:
        assert t.isascii() and len(t) <= 41


def test_two_database_roles_of_one_login_get_schemas_of_their_own(monkeypatch):
    monkeypatch.delenv("LABKIT_USER", raising=False)
    monkeypatch.delenv("LABKIT_BACKEND", raising=False)
    schemas = set()
    for role in ("alice", "reporting"):
        monkeypatch.setenv("LABKIT_DSN", f"postgresql://{role}@127.0.0.1:5432/test")
        schemas.add(labkit.schema_name("01_one_lock"))
    assert len(schemas) == 2


def test_clean_never_ends_another_roles_sessions_even_as_a_superuser(db):
    """`labkit clean` run by a superuser ends its own leftovers only: another role's session
    idle in a transaction (its name says labkit) is that role's business."""
    other = f"labkit_bystander_{os.getpid()}"
    with db.connect() as conn:
        conn.execute(f"CREATE ROLE {other} LOGIN")
    mine = bystander = None
    try:
        bystander = psycopg.connect(psycopg.conninfo.make_conninfo(db.dsn, user=other),
                                    application_name="labkit:lab_x_bystander:worker")
        bystander.execute("SELECT 1")                         # idle in a transaction from now
        mine = psycopg.connect(db.dsn, application_name="labkit:lab_x_mine:worker")
        mine.execute("SELECT 1")
        time.sleep(1.2)
        out = _cli("clean", "--idle-seconds", "1")
        assert out.returncode == 0 and "ended 1 labkit session(s)" in out.stdout, out.stdout + out.stderr
        assert bystander.execute("SELECT 2").fetchone() == (2,)      # untouched
        with pytest.raises(psycopg.OperationalError):
            mine.execute("SELECT 2")
    finally:
        for conn in (mine, bystander):
            if conn is not None:
                conn.close()
        with db.connect() as conn:
            conn.execute(f"DROP ROLE IF EXISTS {other}")


def test_clean_schemas_keeps_a_schema_a_run_is_using_and_doctor_names_a_killed_runs(db, monkeypatch):
    """`labkit clean --schemas` in one terminal does not drop the schema of a run going on in
    another; `labkit doctor` names the schema a killed run left (its process is gone)."""
    monkeypatch.setenv("LABKIT_USER", f"runner{os.getpid()}")
    busy = Lab.open(db, "trace_busy_1")
    dead_pid = subprocess.Popen(["true"])
    dead_pid.wait()
    killed = Lab.open(db, f"trace_killed_{dead_pid.pid}")
    killed.create_jobs(1)
    killed.close()
    worker = busy.connect(role="worker")
    try:
        busy.create_jobs(2)
        worker.execute("BEGIN")
        worker.execute("SELECT id FROM job FOR UPDATE")                    # a run mid-claim
        doctor = _cli("doctor")
        assert killed.schema in doctor.stdout and "left by runs that were killed" in doctor.stdout
        assert busy.schema not in doctor.stdout.split("left by runs that were killed")[1].split("\n")[0]
        out = _cli("clean", "--schemas")
        assert out.returncode == 0, out.stderr
        assert f"kept 1 lab schema(s) a running notebook or command is using ({busy.schema})" in out.stdout
        with db.connect() as conn:
            left = {r[0] for r in conn.execute("SELECT nspname FROM pg_namespace WHERE nspname = ANY(%s)",
                                               ([busy.schema, killed.schema],)).fetchall()}
        assert left == {busy.schema}
        worker.rollback()
    finally:
        worker.close()
        busy.drop()


def test_one_users_reset_never_ends_anothers_sessions(db):
    tag = f"bob{os.getpid()}"
    bob = Lab.open(db, "shared_name", user=tag)
    bob_smith = Lab.open(db, "shared_name", user=f"{tag}_smith")
    try:
        victim = bob_smith.connect(role="worker")
        victim.execute("BEGIN")
        victim.execute("SELECT 1")
        bob.reset()
        bob.drop()
        assert victim.execute("SELECT 2").fetchone() == (2,), "bob's reset ended bob_smith's session"
        victim.close()
    finally:
        bob_smith.drop()


def test_clean_schemas_drops_only_this_users_own_schemas(db, monkeypatch):
    tag = f"cl{os.getpid()}"
    monkeypatch.setenv("LABKIT_USER", tag)
    mine = [Lab.open(db, n) for n in ("one", "two")]
    prefix_neighbour = Lab.open(db, "one", user=f"{tag}_smith")
    role = f"labkit_other_{os.getpid()}"
    with db.connect() as conn:
        # a schema labkit never made, named like a lab schema of this user
        conn.execute(f"CREATE SCHEMA lab_handmade_{tag}")
        # a lab schema of this user's tag that another role owns
        conn.execute(f"CREATE ROLE {role}")
        conn.execute(f"CREATE SCHEMA lab_theirs_{tag} AUTHORIZATION {role}")
        conn.execute(f"COMMENT ON SCHEMA lab_theirs_{tag} IS 'labkit:{tag}'")
        # a killed change-data-capture run's slots: one of a schema of mine, one of the
        # neighbour's (physical slots, so a server at wal_level replica can hold them too)
        slots = [f"{mine[0].schema}_cdc", f"{prefix_neighbour.schema}_cdc"]
        for slot in slots:
            conn.execute("SELECT pg_create_physical_replication_slot(%s)", (slot,))
    try:
        out = _cli("clean", "--schemas")
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
        listed = out.stdout.split("owned by", 1)[1].splitlines()[0]
        assert all(lab.schema in listed for lab in mine)
        with db.connect() as conn:
            left = {r[0] for r in conn.execute("SELECT nspname FROM pg_namespace").fetchall()}
        assert not {lab.schema for lab in mine} & left
        assert {prefix_neighbour.schema, f"lab_handmade_{tag}", f"lab_theirs_{tag}"} <= left
        assert "left" in out.stdout
        with db.connect() as conn:
            kept = {r[0] for r in conn.execute("SELECT slot_name FROM pg_replication_slots").fetchall()}
        assert slots[0] not in kept and slots[1] in kept
        assert "dropped 1 replication slot(s)" in out.stdout
    finally:
        prefix_neighbour.drop()
        with db.connect() as conn:
            for slot in slots:
                conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                             "WHERE slot_name = %s", (slot,))
            conn.execute(f"DROP SCHEMA IF EXISTS lab_handmade_{tag}")
            conn.execute(f"DROP SCHEMA IF EXISTS lab_theirs_{tag}")
            conn.execute(f"DROP ROLE IF EXISTS {role}")
            for lab in mine:
                conn.execute(f"DROP SCHEMA IF EXISTS {lab.schema} CASCADE")


def test_own_lab_schemas_needs_the_exact_tag(db):
    tag = f"ex{os.getpid()}"
    a, b = Lab.open(db, "x", user=tag), Lab.open(db, "x", user=tag + "_2")
    try:
        with db.connect() as conn:
            assert own_lab_schemas(conn, tag=tag) == [a.schema]
    finally:
        a.drop()
        b.drop()


# -- 13 · a full disk is named, and the data is kept ----------------------------------------------------

@pytest.mark.skipif(not ROOT, reason="mounts a small disk of its own; needs root")
def test_a_full_disk_is_named_and_never_answered_with_reset(scratch_root, monkeypatch):
    from labkit.core.server import EmbeddedServer

    disk = scratch_root / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=160m,mode=0755", "tmpfs", str(disk)],
                      capture_output=True).returncode != 0:
        pytest.fail("could not mount a small tmpfs to fill (root without mount rights?)")
    try:
        monkeypatch.setenv("LABKIT_DATA_DIR", str(disk / "pg"))
        monkeypatch.delenv("LABKIT_DSN", raising=False)
        monkeypatch.delenv("LABKIT_BACKEND", raising=False)
        server = EmbeddedServer()
        server.start()
        with psycopg.connect(server.conninfo(), autocommit=True) as conn:
            conn.execute("CREATE TABLE kept AS SELECT 42 AS answer")
        server.stop()
        filler = disk / "filler"
        with open(filler, "wb") as f:
            try:
                while True:
                    f.write(b"\0" * (1 << 20))
            except OSError:
                pass
        with pytest.raises(ServerError, match="full") as err:
            server.start()
        assert "labkit server reset" not in str(err.value).split("Fix:")[1].replace(
            "Do not reset", "")
        doctor = _cli("doctor")
        assert doctor.returncode == 1 and "free some space" in doctor.stdout
        filler.unlink()
        server.start()
        with psycopg.connect(server.conninfo()) as conn:
            assert conn.execute("SELECT answer FROM kept").fetchone() == (42,)
        server.stop()
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_clean_drops_throw_away_roles_whose_run_is_over(db):
    from labkit.core.sandbox import _COMMENT, ROLE_PREFIX

    gone, live = f"{ROLE_PREFIX}t{os.getpid()}a", f"{ROLE_PREFIX}t{os.getpid()}b"
    victim = Lab.open(db, "sandbox_still_running")
    with db.connect() as conn:
        conn.execute(f"CREATE ROLE {gone}")
        conn.execute(f"COMMENT ON ROLE {gone} IS '{_COMMENT}lab_no_such_schema_{os.getpid()}'")
        conn.execute(f"CREATE ROLE {live}")
        conn.execute(f"COMMENT ON ROLE {live} IS '{_COMMENT}{victim.schema}'")
    try:
        doctor = _cli("doctor")
        assert gone in doctor.stdout and "throw-away role" in doctor.stdout
        out = _cli("clean")
        assert out.returncode == 0 and "throw-away role" in out.stdout, out.stdout + out.stderr
        with db.connect() as conn:
            names = {r[0] for r in conn.execute("SELECT rolname FROM pg_roles").fetchall()}
        assert gone not in names and live in names  # a run whose schema is still there keeps its role
    finally:
        victim.drop()
        with db.connect() as conn:
            conn.execute(f"DROP ROLE IF EXISTS {gone}")
            conn.execute(f"DROP ROLE IF EXISTS {live}")


def test_a_graded_claim_cannot_end_the_graders_own_sessions_nor_raise_its_memory(db):
    from labkit.core.files import data_file
    from labkit.tools import grade

    correct = (data_file("grader") / "correct.sql").read_text()
    mine = db.connect(application_name="labkit-test-own-session")
    try:
        # It ends every session it can see (its own role's: the probe's, the workers'); the
        # sessions of labkit's own login, this one and the grader's watchers, live on.
        killer = ("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                  "WHERE pid <> pg_backend_pid();\n" + correct)
        report = grade.grade_claim(killer, db=db, workers=2, jobs=8)
        assert report.verdict == "fail" and "sql_error" in report.codes, report.to_text()
        assert mine.execute("SELECT 1").fetchone() == (1,)
        # A claim that would raise its memory for itself is refused before it runs.
        big = grade.grade_claim("SET work_mem = '2GB';\n" + correct, db=db, workers=2, jobs=8)
        assert big.codes == ["memory_setting"], big.to_text()
    finally:
        mine.close()


def test_a_cluster_made_with_fsync_off_runs_durable(scratch_server):
    scratch_server.start()
    scratch_server.stop()
    with open(scratch_server.pgdata / "postgresql.auto.conf", "a") as f:  # as an older labkit wrote it
        f.write("fsync = off\nfull_page_writes = off\n")
    scratch_server.start()
    with psycopg.connect(scratch_server.conninfo()) as conn:
        assert [conn.execute(f"SHOW {n}").fetchone()[0] for n in ("fsync", "full_page_writes")] \
            == ["on", "on"]
