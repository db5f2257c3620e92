"""A real PgBouncer in transaction pooling in front of the lab's server: what breaks (a plain
SET, session advisory locks, LISTEN, automatic prepared statements) and what does not
(claim-mark-commit); its files private, no TCP port; nothing left behind, even on Ctrl-C;
a missing PgBouncer named with its fix before any lab is opened."""

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import psycopg
import pytest
from conftest import backends_gone, backends_of, press_ctrl_c

from labkit import Lab
from labkit.core.errors import LabkitError
from labkit.labs import pooler

# Skipped where PgBouncer is not installed, unless LABKIT_REQUIRE_PGBOUNCER is set (CI sets it
# after installing it): then these tests run and fail with the error that names the fix.
needs_pgbouncer = pytest.mark.skipif(
    pooler.find_pgbouncer() is None and not os.environ.get("LABKIT_REQUIRE_PGBOUNCER"),
    reason="PgBouncer is not installed (apt-get install pgbouncer / brew install pgbouncer)")


def running(config_path) -> list[str]:
    """Processes whose command line names this config file."""
    out = subprocess.run(["pgrep", "-f", str(config_path)], capture_output=True, text=True)
    return out.stdout.split()


@pytest.fixture
def launched(monkeypatch):
    """The config file of every PgBouncer the test starts."""
    paths = []
    launch = pooler.PgBouncer._launch

    def spy(self):
        paths.append(self.config_path)
        return launch(self)

    monkeypatch.setattr(pooler.PgBouncer, "_launch", spy)
    return paths


@needs_pgbouncer
def test_transaction_pooling_breaks_session_state_but_not_claim_mark_commit(lab, db, launched):
    t = time.monotonic()
    r = pooler.pooler_trace(lab, jobs=12, listen_wait_s=0.5)
    assert time.monotonic() - t < 12
    assert r.claim_mark_commit_ok is True
    assert r.session_set_leaked is True
    assert r.advisory_lock_misbehaved is True
    assert r.listen_broken is True
    assert r.pgbouncer_version == pooler.PgBouncer().version
    # One server connection: every statement of A and B ran on the same backend.
    assert r.same_backend is True and len(r.backend_pids) == 1
    pid = r.backend_pids[0]

    c = r.claims
    assert c.claims == c.distinct_jobs == c.done == c.claimed_once == 12
    assert c.by_client["A"] >= 5 and c.by_client["B"] >= 5     # both ran past psycopg's
    assert c.backend_pids == [pid]                                  # prepare threshold
    assert c.b_waited_in_pooler is True
    assert c.pool_while_a_open.cl_waiting == 1 and c.pool_while_a_open.sv_active == 1
    assert c.pool_while_a_open.server_lock_waits == 0           # queued in PgBouncer, not the server

    s = r.session_set
    assert s.a_backend_pid == s.b_backend_pid == pid
    assert s.b_sees == "4321ms" != s.server_default
    assert s.set_local_inside == "4321ms" and s.set_local_leaked is False
    assert s.b_sees_after_set_local == s.server_default
    tz = s.tracked                       # a parameter PgBouncer tracks follows its client
    assert tz.leaked is False and tz.b_sees == tz.server_default != tz.a_set
    assert tz.kept_for_a is True and tz.a_sees_after_b == tz.a_set

    a = r.advisory_lock
    assert a.a_backend_pid == a.b_backend_pid == pid
    assert a.held_by_after_a == [pid] and a.other_session_try is False
    assert a.b_try_lock is True and a.b_unlocks == [True, True]
    assert a.held_by_after_b_unlocks == [] and a.other_session_takes_it_after is True
    x = a.xact
    assert x.misbehaved is False and x.held_by_during_a == [pid]
    assert x.other_session_try_during_a is False and x.held_by_after_a_commit == []

    li = r.listen
    assert li.a_received == 0 and li.direct_listener_received == 1
    assert 0.45 <= li.a_waited_s < 2
    assert li.b_session_listens_on == [li.channel]              # B's session listens for A
    assert li.a_backend_pid == li.b_backend_pid == pid

    p = r.prepared_statements
    if pooler.version_tuple(r.pgbouncer_version) < (1, 21):
        assert p.broke is True and p.sqlstate == "42P05" and p.failed_on_run == 6
    assert lab.execute("SELECT count(*) FROM pg_prepared_statements") == [(0,)]

    assert len(launched) == 1 and running(launched[0]) == []
    assert not launched[0].parent.exists()
    assert not pooler._live
    assert backends_gone(db, f"labkit:{lab.schema}:pooler%") == []


@needs_pgbouncer
def test_the_command_prints_json_and_drops_its_lab(db, capsys, launched):
    made = []

    def open_lab():
        made.append(Lab.open(db, f"t_pooler_cmd_{os.getpid()}"))
        return made[0]

    assert pooler.pooler_command(open_lab=open_lab, jobs=4, listen_wait_s=0.2, json=True) == 0
    r = json.loads(capsys.readouterr().out)
    assert list(r) == ["pgbouncer_version", "pool_mode", "pool_size", "claim_mark_commit_ok",
                       "session_set_leaked", "advisory_lock_misbehaved", "listen_broken",
                       "same_backend", "backend_pids", "claims", "session_set", "advisory_lock",
                       "listen", "prepared_statements", "seconds"]
    assert list(r["claims"]["first"][0]) == ["client", "job", "backend_pid", "marked"]
    assert list(r["session_set"]["tracked"])[:2] == ["parameter", "server_default"]
    assert all(r[k] is True for k in ("claim_mark_commit_ok", "session_set_leaked",
                                      "advisory_lock_misbehaved", "listen_broken"))
    with db.connect() as conn:
        assert conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s",
                            (made[0].schema,)).fetchone() == (0,)
    assert running(launched[0]) == [] and backends_gone(db, f"labkit:{made[0].schema}:%") == []
    assert pooler.pooler_command(open_lab=open_lab, jobs=4, listen_wait_s=0.2, json=False) == 0
    text = capsys.readouterr().out
    assert "plain SET leaked:            yes" in text and "4321ms" in text


@needs_pgbouncer
def test_its_files_are_private_and_it_listens_on_no_tcp_port(db):
    with pooler.PgBouncer().start(db) as pgb:
        folder = pgb.dir
        st = os.stat(folder)
        assert stat.S_IMODE(st.st_mode) == 0o700
        fst = os.lstat(pgb.log_path)
        assert stat.S_ISREG(fst.st_mode) and stat.S_IMODE(fst.st_mode) == 0o600
        assert fst.st_uid == st.st_uid
        assert not pgb.config_path.exists()      # read at start, then removed: no password on disk
        assert (folder / f".s.PGSQL.{pgb.port}").is_socket()
        conf = pgb.config_text
        assert "auth_type = any" in conf
        assert not any(line.startswith("listen_addr") for line in conf.splitlines())
        runs_as = pwd.getpwuid(st.st_uid).pw_name
        assert pgb.user == runs_as
        owner = subprocess.run(["ps", "-o", "user=", "-p", str(pgb.pid)], capture_output=True,
                               text=True).stdout.strip()
        assert owner in (runs_as, str(st.st_uid))
        if os.geteuid() == 0:
            assert runs_as != "root"
            # Another OS user cannot even reach the folder that holds the socket.
            nobody = pwd.getpwnam("nobody")
            probe = subprocess.run(["test", "-x", str(folder)], user=nobody.pw_uid,
                                   group=nobody.pw_gid, extra_groups=[])
            assert probe.returncode != 0
        # No TCP port: the process holds no inet socket at all, only its Unix sockets.
        proc = psutil.Process(pgb.pid)
        inet = proc.net_connections("inet") if hasattr(proc, "net_connections") else proc.connections("inet")
        assert [c for c in inet if c.status == psutil.CONN_LISTEN] == []
        assert pgb.dsn == f"host={folder} port={pgb.port} dbname=labkit"
        with pgb.connect() as conn:        # psycopg sends no startup parameter PgBouncer refuses
            assert conn.execute("SELECT 1").fetchone() == (1,)
        with pytest.raises(psycopg.OperationalError, match="unsupported startup parameter: options"):
            psycopg.connect(pgb.dsn, options="-c search_path=x", connect_timeout=5)
    assert not folder.exists() and running(folder / "pgbouncer.ini") == []


@needs_pgbouncer
def test_a_server_that_refuses_it_is_reported_with_its_log(db, monkeypatch, launched):
    entry = pooler.PgBouncer._server_entry

    def wrong_role(self, db):
        found = entry(self, db)
        return {**found, "user": "labkit_no_such_role"}

    monkeypatch.setattr(pooler.PgBouncer, "_server_entry", wrong_role)
    with pytest.raises(LabkitError, match="labkit_no_such_role") as err:
        pooler.PgBouncer().start(db, timeout=2)
    assert "Its log:" in str(err.value) and "Fix:" in str(err.value)
    assert running(launched[0]) == [] and not launched[0].parent.exists()
    assert not pooler._live


@needs_pgbouncer
@pytest.mark.usefixtures("gc_paused")
def test_ctrl_c_mid_run_leaves_no_pgbouncer_and_no_backend(lab, db, launched):
    seen: dict = {}

    def interrupt_while_listening():
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:     # polled on the server: the listen step began
            if backends_of(db, f"labkit:{lab.schema}:pooler-listen"):
                seen["pooled"] = backends_of(db, f"labkit:{lab.schema}:pooler-%")
                press_ctrl_c(as_signal=True)
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=interrupt_while_listening, daemon=True)
    watcher.start()
    with pytest.raises(KeyboardInterrupt):
        pooler.pooler_trace(lab, jobs=4, listen_wait_s=8)
    watcher.join(5)
    assert seen["pooled"]                       # the pooled backend was there when it was pressed
    assert len(launched) == 1 and running(launched[0]) == []
    assert not launched[0].parent.exists() and not pooler._live
    assert backends_gone(db, f"labkit:{lab.schema}:pooler%") == []


CHILD = """
import sys, time, labkit
from labkit.labs import pooler
bouncer = pooler.PgBouncer().start(labkit.connect(quiet=True))
client = bouncer.connect(application_name="labkit:" + sys.argv[1])
client.execute("SELECT 1")
print(bouncer.config_path, flush=True)
time.sleep(60)
"""


@needs_pgbouncer
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's parent-death signal")
def test_a_parent_killed_outright_takes_its_pgbouncer_along(db):
    name = f"t-pooler-orphan-{os.getpid()}"
    child = subprocess.Popen([sys.executable, "-c", CHILD, name], stdout=subprocess.PIPE, text=True)
    config = None
    try:
        config = Path(child.stdout.readline().strip())
        assert config.name == "pgbouncer.ini" and running(config)
        child.kill()                              # no clean-up of its own runs
        child.wait(10)
        deadline = time.monotonic() + 10
        while running(config) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert running(config) == []
        assert backends_gone(db, f"labkit:{name}") == []
        assert config.parent.exists() and not config.exists()     # its folder is left, its password is not
        assert config.parent in pooler.sweep_stale_folders()      # and the next start removes the folder
        assert not config.parent.exists()
    finally:
        child.kill()
        if config is not None and config.name == "pgbouncer.ini":
            shutil.rmtree(config.parent, ignore_errors=True)     # what its stop() did not remove


def test_the_launcher_imports_only_the_standard_library_and_becomes_the_program_it_names():
    """The file run as `python -I -S FILE` between labkit and PgBouncer (and a replica pair's
    servers): nothing a user could
    plant is imported; it execs the program (same pid), or exits 70 when its parent is gone."""
    import ast

    tree = ast.parse(pooler._LAUNCH.read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported and imported <= set(sys.stdlib_module_names) | {"__future__"}, imported
    launch = [sys.executable, "-I", "-S", str(pooler._LAUNCH)]
    child = subprocess.Popen(launch + ["0", "-1", "-1", "15", "/bin/sh", "-c", "echo $$"], stdout=subprocess.PIPE,
                             text=True, cwd="/")
    out, _ = child.communicate(timeout=30)
    assert (child.returncode, out.strip()) == (0, str(child.pid))
    orphan = subprocess.run(launch + ["1", "-1", "-1", "15", "/bin/echo", "not reached"], capture_output=True,
                            text=True, timeout=30)
    assert (orphan.returncode, orphan.stdout) == (70, "")


def test_no_pgbouncer_exits_2_naming_the_fix_before_any_lab(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(pooler, "SEARCH_DIRS", ())

    def open_lab():
        raise AssertionError("no lab may be opened without PgBouncer")

    assert pooler.find_pgbouncer() is None
    assert pooler.pooler_command(open_lab=open_lab, json=True) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "PgBouncer is not installed" in err and "apt-get install pgbouncer" in err
    assert "brew install pgbouncer" in err and len(err.strip().splitlines()) == 1
    ok, why = pooler.pgbouncer_available()
    assert ok is False and "apt-get install pgbouncer" in why and "report instead of running" in why
    with pytest.raises(LabkitError, match="apt-get install pgbouncer"):
        pooler.PgBouncer()


@pytest.mark.parametrize("bad", [dict(jobs=1), dict(jobs=1001), dict(jobs=2.5), dict(jobs=True),
                                 dict(listen_wait_s=0), dict(listen_wait_s=float("nan")),
                                 dict(listen_wait_s=11), dict(listen_wait_s="1")])
def test_bad_parameters_are_refused_before_any_lab(bad):
    def open_lab():
        raise AssertionError("opened a lab")

    with pytest.raises(LabkitError):
        pooler.pooler_command(open_lab=open_lab, json=False, **bad)


@needs_pgbouncer
def test_bad_pool_settings_start_nothing(db, launched):
    for kw in (dict(pool_size=0), dict(pool_mode="sometimes")):
        with pytest.raises(LabkitError):
            pooler.PgBouncer().start(db, **kw)
    assert launched == []


@needs_pgbouncer
def test_the_transcripts_show_what_each_client_sent_and_what_the_other_saw(lab, db, launched):
    r = pooler.transcripts(lab, jobs=8, listen_wait_s=0.3)
    assert r.same_backend is True and len(r.backend_pids) == 1
    texts = {k: getattr(r, k).transcript.to_text() for k in ("claims", "set", "advisory", "listen",
                                                        "prepared")}
    assert all(max(len(line) for line in t.splitlines()) <= 96 for t in texts.values())

    c = r.claims
    assert c.ok and c.done == c.claimed_once == 8 and c.b_waited_in_pooler
    assert (c.cl_waiting, c.server_lock_waits) == (1, 0)
    rows = {row.n: row for row in r.claims.transcript.rows}
    assert rows["3"].kind == "waiting" and "waits in PgBouncer" in rows["3"].note
    assert rows["5"].note == "unblocks B" and rows["3'"].text.startswith("<... completed>")

    s = r.set
    assert s.leaked and s.b_sees == "4321ms" != s.server_default
    assert not s.tracked.leaked and s.tracked.kept_for_a
    b_rows = [row.text for row in r.set.transcript.rows if row.session == "B"]
    assert "SHOW statement_timeout  → 4321ms" in b_rows
    story = s.story                      # what the picture draws: one backend, A's value on it
    assert [(d.client, d.statement_timeout) for d in story] == [
        ("B", s.server_default), ("A", "4321ms"), ("B", "4321ms"), ("B", s.server_default)]
    assert {d.backend_pid for d in story} == set(r.backend_pids)

    a = r.advisory
    assert a.misbehaved and a.other_session_try is False and a.b_unlocks == [True, True]
    assert not a.xact.misbehaved

    li = r.listen
    assert li.broken and li.a_received == 0 and li.b_received == ["two"]
    assert li.b_session_listens_on == [li.channel]

    p = r.prepared
    if pooler.version_tuple(r.pgbouncer_version) < (1, 21):
        assert p.broke and p.sqlstate == "42P05" and p.b_sees == [("_pg3_0",)]
    first = r.prepared.transcript.rows[0]
    assert "n = 1, 2, 3, 4, 5" in first.text and "five runs" in first.note
    assert lab.execute("SELECT count(*) FROM pg_prepared_statements") == [(0,)]
    _shared_session_picture(s, r.backend_pids)
    with db.connect() as conn:                      # no advisory lock of the lab is left held
        key = lab.advisory_key()
        assert conn.execute("SELECT pg_try_advisory_lock(%s), pg_try_advisory_lock(%s)",
                            (key, key + 1)).fetchone() == (True, True)
    assert len(launched) == 1 and running(launched[0]) == [] and not pooler._live
    assert backends_gone(db, f"labkit:{lab.schema}:pooler%") == []


def _shared_session_picture(s: pooler.SetTurns, pids: list[int]) -> None:
    """The set run's picture: every step drawn, the backend named, and it fits a slide."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from labkit.core.plots import setup_matplotlib
    from labkit.tools.training import IMG_MAX_PX, SLIDE_WIDTH_PX

    setup_matplotlib()
    fig = pooler.plot_shared_session(s)
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts if t.get_text()]      # the arrows have none
    assert [d.sent for d in s.story] == texts[0::2]
    assert [d.statement_timeout for d in s.story] == texts[1::2]
    assert f"backend {pids[0]}" in ax.get_yticklabels()[2].get_text()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    plt.close(fig)
    png = buf.getvalue()
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert width <= SLIDE_WIDTH_PX and height <= IMG_MAX_PX
    with pytest.raises(LabkitError, match="transcripts"):
        pooler.plot_shared_session({"leaked": True})


def test_clients_refuse_a_name_they_do_not_have():
    run = pooler.Clients()
    with pytest.raises(LabkitError, match="No client named 'C'"):
        run.did("C", "wait", "nothing")
