"""labkit hub: the room's configuration, its users and the checks its load test makes.

The whole room under load (a hub, eight trainees, three notebooks each, in both modes) is
`make test-hub`, which CI runs after the suite; these tests hold the pieces it is made of.
"""

from __future__ import annotations

import json
import os
import pwd
import stat
import subprocess
import time
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from traitlets.config import Config

from labkit.core.errors import LabkitError
from labkit.core.lab import Lab
from labkit.labs import puzzles
from labkit.tools import classroom, hub, roomload

ROOT_USER = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT_USER, reason="makes system users; the hub runs as root")


def make_room(folder: Path, mode: str = "embedded", trainees: int = 3) -> hub.Room:
    folder.mkdir(mode=0o700, exist_ok=True)
    room = hub.Room(mode=mode, trainees=trainees, port=8123, bin="/opt/claimlab/bin")
    passwords = {"presenter": "p" * 24, **{n: f"pw-{n}" for n in room.names}}
    (folder / "passwords.json").write_text(json.dumps(passwords))
    proxy = folder / "node_modules" / ".bin" / "configurable-http-proxy"
    proxy.parent.mkdir(parents=True)
    proxy.write_text("#!/bin/sh\n")
    if mode == "shared":
        (folder / "trainees.json").write_text(json.dumps({"trainees": [
            {"name": n, "dsn": f"postgresql://claimlab_{n}:pw{n}@db/training"} for n in room.names]}))
    room.save(folder)
    return room


def test_room_round_trips_and_names_its_trainees(tmp_path):
    room = make_room(tmp_path / "room")
    again = hub.Room.load(tmp_path / "room")
    assert again == room
    assert again.names == ["trainee01", "trainee02", "trainee03"]
    assert hub.system_user("trainee02") == "claimlab-trainee02"
    for bad in ("root", "trainee1", "trainee01; rm -rf /", "../trainee01"):
        with pytest.raises(LabkitError):
            hub.system_user(bad)


def test_no_room_names_its_fix(tmp_path):
    with pytest.raises(LabkitError) as err:
        hub.Room.load(tmp_path)
    assert "make hub" in str(err.value)


def test_configure_sets_the_log_in_the_spawner_and_the_proxy(tmp_path):
    folder = tmp_path / "room"
    make_room(folder)
    c = Config()
    hub.configure(c, folder)
    assert c.JupyterHub.authenticator_class.__name__ == "RoomAuthenticator"
    assert c.Authenticator.allowed_users == {"trainee01", "trainee02", "trainee03"}
    assert c.Authenticator.admin_users == {"presenter"}
    assert c.JupyterHub.bind_url == "http://:8123"
    assert c.ConfigurableHTTPProxy.command == [str(folder / "node_modules/.bin/configurable-http-proxy")]
    assert c.Spawner.cmd == ["/opt/claimlab/bin/jupyterhub-singleuser"]
    assert c.Spawner.default_url.endswith("claimlab/notebooks/00_start_here.ipynb")
    assert "services" not in c.JupyterHub          # no API token unless a load test asks


def test_each_name_logs_in_with_its_own_password_only(tmp_path):
    import asyncio
    folder = tmp_path / "room"
    make_room(folder)
    c = Config()
    hub.configure(c, folder)
    auth = c.JupyterHub.authenticator_class()

    def log_in(name, password):
        return asyncio.run(auth.authenticate(None, {"username": name, "password": password}))

    assert log_in("trainee02", "pw-trainee02") == "trainee02"
    assert log_in("presenter", "p" * 24) == "presenter"
    assert log_in("trainee02", "pw-trainee01") is None          # a neighbour's password
    assert log_in("trainee02", "") is None
    assert log_in("trainee09", "pw-trainee02") is None          # not in the room
    assert log_in("root", "p" * 24) is None
    landing = c.JupyterHub.default_url
    assert landing(SimpleNamespace(current_user=SimpleNamespace(admin=True))) == "/hub/admin"
    assert landing(SimpleNamespace(current_user=SimpleNamespace(admin=False))) is None


def test_the_handout_names_every_trainee_with_their_password():
    room = hub.Room(mode="embedded", trainees=2, port=8123, bin="/opt/claimlab/bin")
    text = hub.handout(room, {"presenter": "P" * 24, "trainee01": "abc", "trainee02": "def"})
    assert ":8123/" in text.splitlines()[0]
    assert "trainee01  password abc" in text and "trainee02  password def" in text
    assert "presenter  password " + "P" * 24 in text
    assert all(ch not in hub._typable(200) for ch in "0O1lI")


def test_the_shipped_config_file_is_the_same_configuration(tmp_path, monkeypatch):
    folder = tmp_path / "room"
    make_room(folder)
    monkeypatch.setenv("LABKIT_HUB_DIR", str(folder))
    c = Config()
    exec(compile(hub.CONFIG.read_text(), str(hub.CONFIG), "exec"), {"c": c})
    assert c.Authenticator.allowed_users == {"trainee01", "trainee02", "trainee03"}
    assert c.JupyterHub.spawner_class.__name__ == "RoomSpawner"


def test_the_load_test_token_is_a_service_with_only_what_it_needs(tmp_path, monkeypatch):
    folder = tmp_path / "room"
    make_room(folder)
    monkeypatch.setenv("LABKIT_HUB_SERVICE_TOKEN", "t" * 48)
    c = Config()
    hub.configure(c, folder)
    (service,) = c.JupyterHub.services
    assert service == {"name": "claimlab-loadtest", "api_token": "t" * 48}
    (role,) = c.JupyterHub.load_roles
    assert set(role["scopes"]) == {"admin:users", "admin:servers", "access:servers"}


def test_a_closed_folder_on_the_way_to_python_is_found():
    import shutil
    import tempfile
    base = Path(tempfile.mkdtemp(prefix="claimlab-hub-", dir="/tmp"))   # /tmp: open to all
    try:
        closed = base / "closed"
        (closed / "bin").mkdir(parents=True)
        python = closed / "bin" / "python"
        python.write_text("")
        for p in (base, closed, closed / "bin", python):
            p.chmod(0o755)
        assert hub._reachable_by_others(python) is None
        closed.chmod(0o700)
        assert hub._reachable_by_others(python) == closed
        closed.chmod(0o755)
        python.chmod(0o750)                    # the file itself: not runnable by others
        assert hub._reachable_by_others(python) == python
        python.chmod(0o644)                    # readable is enough for a file that is read
        assert hub._reachable_by_others(python, read=True) is None
        python.chmod(0o640)
        assert hub._reachable_by_others(python, read=True) == python
    finally:
        shutil.rmtree(base)


def test_not_root_is_one_paragraph_naming_sudo(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(LabkitError) as err:
        hub.preflight()
    assert "sudo make hub" in str(err.value)


def test_the_report_counts_failures_and_names_them():
    runs = [roomload.TraineeRun("trainee01", login_s=0.1, spawn_s=3, notebooks_s={"00": 2.0}, cells=5),
            roomload.TraineeRun("trainee02", login_s=0.2, spawn_s=5, error="RuntimeError: log-in refused")]
    runs[0].cpu_s = {"spawn": 1.5, "00": 2.5}
    sampler = SimpleNamespace(peak={"trainee01": 300.0, "trainee02": 120.0},
                              peak_backends={"trainee01": 0.0, "trainee02": 0.0}, peak_hub=170.0,
                              backends_local=False, peak_working_set={"trainee01": 310.0, "trainee02": 100.0},
                              cpu_seconds=lambda: {"trainee01": 4.25, "trainee02": 0.5},
                              cpu_counted_by=lambda: "cgroup v1 (cpuacct.usage)")
    report = roomload._report("embedded", runs, 12.3, 0.5, sampler, 3.2, ["00"])
    assert report["failures"] == 1 and report["errors"] == {"trainee02": "RuntimeError: log-in refused"}
    assert report["memory_mb_per_trainee_max"] == 300
    assert (report["cpu_s_per_trainee_max"], report["working_set_mb_per_trainee_max"]) == (4.2, 310)
    assert report["cpu_s_median_by_step"] == {"spawn": 1.5, "00": 2.5}
    text = roomload.text(report)
    assert "FAILED trainee02: RuntimeError: log-in refused" in text
    assert "CPU time per trainee" in text and "at most 4.2 s over 12.3 s" in text


# -- as root: the room's system users -----------------------------------------------------

@pytest.fixture
def room_users(tmp_path, monkeypatch):
    """Trainee users made for a test, removed after it (with their homes).  The workbook they
    copy is a copy of this one in a folder every user may read, wherever this clone lives
    (`mktemp -d` makes a folder only its owner may enter)."""
    import shutil
    import tempfile
    if hub.room_users():
        pytest.fail("a room's trainee users are on this machine: run `labkit hub clean` first")
    workbook = Path(tempfile.mkdtemp(prefix="claimlab-workbook-", dir="/tmp"))
    shutil.copytree(hub.ROOT / "notebooks", workbook / "notebooks")
    for folder, dirs, files in os.walk(workbook):
        os.chmod(folder, 0o755)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644)
    monkeypatch.setattr(hub, "ROOT", workbook)
    yield workbook
    hub.clean(tmp_path / "no-room", out=lambda line: None)
    shutil.rmtree(workbook)
    assert hub.room_users() == []


@needs_root
def test_a_room_is_set_up_with_private_passwords_and_cleaned_away(room_users, tmp_path, monkeypatch):
    folder = tmp_path / "hubstate"
    monkeypatch.setattr(hub, "proxy_command", lambda f: ["configurable-http-proxy"])
    monkeypatch.setattr(hub, "preflight", lambda: Path("/opt/claimlab/bin"))
    room, folder = hub.prepare(trainees=2, mode="embedded", port=8123, folder=folder, quiet=True)
    for name in ("passwords.json", "handout.txt"):
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    passwords = room.passwords(folder)
    assert set(passwords) == {"presenter", "trainee01", "trainee02"}
    assert len(set(passwords.values())) == 3
    assert [p.pw_name for p in hub.room_users()] == ["claimlab-trainee01", "claimlab-trainee02"]
    hub.clean(folder, out=lambda line: None)
    assert hub.room_users() == []
    assert not (folder / "passwords.json").exists() and not (folder / "handout.txt").exists()


@needs_root
def test_a_workbook_the_trainee_cannot_read_is_said_not_copied_empty(room_users):
    room_users.chmod(0o700)                     # as a clone in a mktemp folder
    with pytest.raises(LabkitError) as err:
        hub.ensure_user("trainee01", "/opt/claimlab/.hubenv/bin")
    assert "closed to this user" in str(err.value) and "every user may read" in str(err.value)


@needs_root
def test_a_trainee_user_has_a_private_home_with_the_workbook(room_users):
    entry = hub.ensure_user("trainee01", "/opt/claimlab/.hubenv/bin")
    assert entry.pw_name == "claimlab-trainee01" and entry.pw_gecos == hub.MARK
    home = Path(entry.pw_dir)
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    notebook = home / "claimlab" / "notebooks" / "00_start_here.ipynb"
    assert notebook.stat().st_uid == entry.pw_uid
    profile = (home / ".profile").read_text()     # their terminal's login shell finds labkit
    assert profile.count('export PATH="/opt/claimlab/.hubenv/bin:$PATH"') == 1
    assert hub.ensure_user("trainee01", "/opt/claimlab/.hubenv/bin") == entry   # a second start reuses it
    assert (home / ".profile").read_text() == profile                            # and adds nothing


@needs_root
def test_a_user_the_hub_did_not_make_is_refused_and_left_alone(room_users, tmp_path):
    name = "claimlab-trainee09"
    subprocess.run(["useradd", "--no-create-home", "--comment", "someone else", name], check=True)
    try:
        with pytest.raises(LabkitError) as err:
            hub.ensure_user("trainee09")
        assert "did not make it" in str(err.value)
        hub.clean(tmp_path / "no-room", out=lambda line: None)
        assert pwd.getpwnam(name).pw_gecos == "someone else"   # clean leaves it
    finally:
        subprocess.run(["userdel", name], check=False)


@needs_root
def test_the_spawner_hands_each_trainee_their_own_dsn_only(room_users, tmp_path):
    folder = tmp_path / "room"
    room = make_room(folder, mode="shared", trainees=2)
    for name in room.names:                  # what the spawner's start() does first
        hub.ensure_user(name, room.bin)
    spawner_class = hub.make_spawner_class(room, folder)
    spawner = spawner_class(user=SimpleNamespace(name="trainee02", url="/user/trainee02/",
                                                 escaped_name="trainee02"))
    env = spawner.user_env({})
    assert env["LABKIT_DSN"] == "postgresql://claimlab_trainee02:pwtrainee02@db/training"
    assert env["HOME"] == str(hub.HOMES / "claimlab-trainee02") and env["USER"] == "claimlab-trainee02"
    assert env["LABKIT_MYSQL_DSN"] == "off"
    assert env["LABKIT_CLASSROOM"] == "1"        # what labkit keeps for trusted users refuses a trainee
    embedded = hub.make_spawner_class(hub.Room("embedded", 2, 8123, "/opt/claimlab/bin"), folder)
    assert "LABKIT_DSN" not in embedded(user=SimpleNamespace(name="trainee01", url="/user/trainee01/",
                                                             escaped_name="trainee01")).user_env({})


@needs_root
def test_the_isolation_probe_fails_when_a_home_is_open(room_users, tmp_path):
    import sys
    # the probe needs only the standard library, from a Python the trainees may run
    python = next((p for p in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3")
                   if Path(p).exists() and hub._reachable_by_others(Path(p)) is None), None)
    assert python, "no Python on this machine that other users may run: the hub could not run either"
    room = hub.Room(mode="embedded", trainees=2, port=8123, bin=str(Path(python).parent))
    for name in room.names:
        hub.ensure_user(name)
    entries = [pwd.getpwnam(hub.system_user(n)) for n in room.names]

    def reach(who, other, *environ: str) -> str:
        done = subprocess.run(roomload.probe_argv(python, other.pw_dir, *(environ or ("/proc/1/environ",))),
                              env=hub.user_env(who, room.bin), preexec_fn=hub.as_user(who),
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr          # the trainee ran the probe itself
        return done.stdout.strip()

    assert reach(entries[0], entries[1]) == ""
    # a process of the neighbour's that ended before the probe read it is passed over, and
    # the next one is read; with none left, the probe says it checked nothing
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert reach(entries[0], entries[1], f"/proc/{gone.pid}/environ", "/proc/1/environ") == ""
    assert "checked no process's environment" in reach(entries[0], entries[1], f"/proc/{gone.pid}/environ")
    os.chmod(entries[1].pw_dir, 0o755)
    assert "reached home of another trainee" in reach(entries[0], entries[1])


def test_the_progress_module_prints_one_line_of_json_from_the_users_own_embedded_server(db):
    """What `labkit hub status` runs as each trainee (`python -m labkit.tools._hub_progress`):
    one JSON line, from the embedded server of whoever runs it, which it never starts."""
    env = {k: v for k, v in os.environ.items() if k != "LABKIT_DSN"}
    if db.backend == "embedded":            # a puzzle played, for the presenter's screen
        with Lab.open(db, f"progress_play_{os.getpid()}") as lab:
            puzzles.record(lab.admin, puzzles.play(lab, "wait_convoy", ["A", "B"]))
    done = subprocess.run([sys.executable, "-m", hub.PROGRESS], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    if db.backend != "embedded":            # that server may be stopped: it says so, and no more
        assert got["postgres"] in ("running", "stopped")
        return
    assert got["postgres"] == "running"
    assert set(got) == {"postgres", "schemas", "last_schema", "mark", "sessions", "idle_in_transaction",
                        "puzzles"}
    assert got["schemas"] >= 0 and got["sessions"] >= 0 and got["idle_in_transaction"] >= 0
    assert got["puzzles"]["wait_convoy"]["fewest_moves"] == 2
    with db.connect() as conn:
        conn.execute(f'DROP SCHEMA "{puzzles.record_schema()}" CASCADE')


def test_a_shared_room_on_a_server_that_trusts_this_host_is_refused(db, tmp_path, monkeypatch):
    """`make hub MODE=shared` on a server that lets roles in without their password: refused,
    naming the fix, before a role or a user is made (CI's servers trust this host)."""
    from labkit.tools import classroom
    import psycopg

    with psycopg.connect(db.dsn, autocommit=True) as conn:
        trusted = classroom.who_gets_in_without_a_password(conn, db.dsn)
    monkeypatch.setattr(hub, "preflight", lambda: Path(sys.executable).parent)
    monkeypatch.setattr(hub, "proxy_command", lambda folder: ["true"])
    made_users = []
    monkeypatch.setattr(hub, "ensure_user", lambda name, bin_dir=None: made_users.append(name))
    if not trusted:                      # a server of your own that asks for passwords: the room is made
        try:
            hub.prepare(trainees=2, mode="shared", port=8124, dsn=db.dsn, folder=tmp_path / "room", quiet=True)
            assert made_users == ["trainee01", "trainee02"]
        finally:
            classroom.drop(db.dsn)
        return
    with pytest.raises(LabkitError, match="--unsafe-trusting-server"):
        hub.prepare(trainees=2, mode="shared", port=8124, dsn=db.dsn, folder=tmp_path / "room", quiet=True)
    assert made_users == []
    with psycopg.connect(db.dsn) as conn:
        assert classroom.roles(conn) == []


@needs_root
def test_an_empty_hub_folder_given_is_closed_then_given_back_and_a_full_one_is_refused(tmp_path):
    given = tmp_path / "given"
    given.mkdir(mode=0o755)
    os.chown(given, 65534, 65534)
    hub.room_folder(given)
    st = os.stat(given)
    assert stat.S_IMODE(st.st_mode) == 0o700
    hub.give_back(given)
    st = os.stat(given)
    assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o755, 65534)
    assert not (given / hub.HUB_MARK).exists()
    full = tmp_path / "full"
    full.mkdir(mode=0o755)
    (full / "notes.txt").write_text("someone's")
    with pytest.raises(LabkitError, match="holds files the hub did not put there"):
        hub.room_folder(full)
    assert stat.S_IMODE(os.stat(full).st_mode) == 0o755          # never closed up
    made = hub.room_folder(tmp_path / "new")
    hub.give_back(made)                                          # made by the hub: stays private
    assert stat.S_IMODE(os.stat(made).st_mode) == 0o700


@needs_root
def test_a_removed_trainees_files_in_shared_folders_go_and_no_one_elses(tmp_path):
    shared = tmp_path / "tmp"
    shared.mkdir(mode=0o1777)
    theirs, folder, link = shared / "kernel.tmp", shared / "lk-pgb-x", shared / "planted"
    mine = shared / "roots.txt"
    mine.write_text("root's")
    theirs.write_text("a trainee's")
    folder.mkdir()
    (folder / "pgbouncer.log").write_text("log")
    link.symlink_to(mine)
    for path in (theirs, folder, folder / "pgbouncer.log", link):
        os.chown(path, 65534, 65534, follow_symlinks=False)
    removed = hub.remove_files_of(65534, folders=(shared,))
    assert sorted(removed) == sorted([theirs, folder, link])
    assert mine.read_text() == "root's" and sorted(os.listdir(shared)) == ["roots.txt"]


@needs_root
def test_a_trainees_server_starts_inside_its_limits(tmp_path):
    from labkit.tools import oslimits

    name = f"lktest{os.getpid()}"
    where = oslimits.prepare(name)
    try:
        child = subprocess.Popen(["sleep", "30"], preexec_fn=lambda: oslimits.join(where))
        try:
            limits = Path(f"/proc/{child.pid}/limits").read_text()
            assert any(line.startswith("Max processes") and f" {oslimits.PIDS} " in f" {line} "
                       for line in limits.splitlines())
            if where.limited:                    # this machine's control groups can be written
                assert child.pid in oslimits.members(where)
                groups = Path(f"/proc/{child.pid}/cgroup").read_text()
                assert f"/{oslimits.GROUP}/{name}" in groups
                memory = where.folders.get("memory", where.folders.get("all"))
                limit_file = "memory.limit_in_bytes" if where.layout == "v1" else "memory.max"
                assert int((memory / limit_file).read_text()) == oslimits.MEMORY_BYTES
                assert "MB of memory" in oslimits.describe(where)
            else:
                assert "memory and CPU are not limited here" in oslimits.describe(where)
        finally:
            child.kill()
            child.wait()
    finally:
        time.sleep(0.2)
        oslimits.remove(name)
    assert all(not folder.exists() for folder in where.folders.values())


def test_a_trainees_progress_report_is_taken_only_in_its_shape():
    # `hub status` runs the progress module as each trainee, who chooses what it prints (their
    # own server, their own home): a report of another shape is "unreadable", never a crash of
    # the whole table or a row that names something else.
    good = {"postgres": "running", "schemas": 2, "last_schema": "lab_02_the_convoy_x", "mark": "labkit:x",
            "sessions": 1, "idle_in_transaction": 0, "puzzles": {"wait_convoy": {"plays": 1, "fewest_moves": 2}}}
    row = hub.checked_report(good)
    assert row["schemas"] == 2 and row["puzzles"] == {"wait_convoy": {"plays": 1, "fewest_moves": 2}}
    assert hub.checked_report({"postgres": "stopped"}) == {"postgres": "stopped"}
    for odd in ([], "x", {}, {"postgres": "running\x1b[2J"}, {**good, "sessions": "1\ntrainee02"},
                {**good, "schemas": [1]}, {**good, "schemas": 10**9}, {**good, "last_schema": 3},
                {**good, "mark": "labkit:x\x1b]0;owned\x07"}, {**good, "last_schema": "l" * 5000}):
        assert hub.checked_report(odd) == {"postgres": "unreadable"}, odd
    assert hub.checked_report({**good, "puzzles": "6/6"})["puzzles"] == {}


def test_a_progress_report_that_prints_without_end_or_never_ends_is_cut_off(monkeypatch):
    env = dict(os.environ)
    flood = [sys.executable, "-c", "import sys\nwhile True: sys.stdout.write('x' * 65536)"]
    assert hub._bounded_output(flood, env=env, preexec_fn=None) == ""
    monkeypatch.setattr(hub, "PROGRESS_TIMEOUT_S", 1)
    start = time.monotonic()
    assert hub._bounded_output([sys.executable, "-c", "import time; time.sleep(30)"], env=env,
                               preexec_fn=None) == ""
    assert time.monotonic() - start < 10
    said = hub._bounded_output([sys.executable, "-c", "print('a'); print('{}')"], env=env, preexec_fn=None)
    assert said.splitlines() == ["a", "{}"]


def test_the_presenters_tables_show_no_control_character_a_trainee_wrote():
    assert classroom.printable("lab_\ntrainee02  6/6\x1b[2J") == "lab_?trainee02  6/6?[2J"
    assert classroom.printable(3) == 3 and classroom.printable(None) is None
