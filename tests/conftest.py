"""Fixtures: a real PostgreSQL every time (embedded by default, LABKIT_DSN if set)."""

import _thread
import gc
import os
import re
import signal
from pathlib import Path

import pytest

import labkit
from labkit import Lab

# The interrupt tests press Ctrl-C (SIGINT) on purpose.  A shell that starts the suite in
# the background without job control (`( make test & )` in a script) hands it SIGINT *ignored*,
# and an ignored signal stays ignored through exec: neither this process nor the children
# the tests start would feel the key, and those tests would fail for a reason that is not
# labkit's.  Take Python's usual handler back for the run; children then start with the
# default disposition and install theirs.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# What the server cannot change -- decks, handouts and student copies, an installed copy's
# packaging, JupyterLab in a browser -- is checked once, on the default path (the embedded
# server: CI's first leg).  A run against LABKIT_DSN leaves those tests out, saying so: their
# result does not depend on which server answers, and CI's time budget is spent on what does.
def pytest_configure(config):
    config.addinivalue_line("markers", "default_leg: checked without LABKIT_DSN only (nothing in "
                                       "it depends on which server answers)")
    config.addinivalue_line("markers", "server: needs a database server (the embedded PostgreSQL "
                                       "or LABKIT_DSN; a MySQL for needs_mysql); `-m 'not server'` "
                                       "runs the rest with none reachable")


# The suite in layers: `pytest -m "not server" tests` (make test-fast) runs the tests that need
# no database server at all -- text, parsing, the timing model, lint, the data files' validators
# -- and `pytest -m server tests` the rest.  A test is `server` when it uses a fixture that
# reaches a server (directly or through another fixture: item.fixturenames holds them all), is
# marked needs_mysql, or sits in a module marked `pytestmark = pytest.mark.server` (its tests
# reach one another way: labkit.connect(), a `labkit` command, a notebook executed).
SERVER_FIXTURES = frozenset({
    "db", "lab",                                   # the session's server, a lab schema on it
    "scratch_server", "replica_server",            # an embedded cluster of the test's own
    "logical_server", "password_server",           # test_cdc, test_exercises_cdc; test_classroom
    "server", "mylab",                             # the appendix's MySQL (test_mysql, ...)
    "quick",                                       # test_bench: `labkit bench --quick` run
    "jupyterlab",                                  # test_live_widgets: its kernels' schemas are
                                                   # dropped on the server at the end
    "trainers_lab",                                # test_workcopy: `make lab` starts the server
})


# Tests that reach a server another way, in modules whose other tests need none: a `labkit`
# command run in the test (cli.main, spec_command, an installed copy's commands), labkit.connect()
# called in its body, or notebooks executed by a kernel.  (tests/test_layers.py checks that
# each name is still a test of its module.)
SERVER_TESTS = {
    "test_bench.py": {"test_durable_cost_measures_both_commit_modes_again"},
    "test_claims.py": {"test_bench_history_command_prints_figures"},
    "test_drain.py": {"test_cli_trace_drain_and_zombie_json", "test_cli_trace_drain_freeze_after"},
    "test_foundation.py": {"test_connect_says_which_server_in_one_line",
                           "test_backend_follows_the_environment"},
    "test_grade.py": {"test_the_command_prints_json_and_exits_by_verdict"},
    "test_install.py": {"test_grade_a_shipped_sample_from_an_installed_copy",
                        "test_spec_run_of_a_shipped_spec_from_an_installed_copy",
                        "test_bench_quick_json_from_an_installed_copy"},
    "test_mysql.py": {"test_doctor_names_the_appendix_skip_without_calling_it_a_problem"},
    "test_spec.py": {"test_cli_prints_the_output", "test_cli_diff_passes_and_fails",
                     "test_cli_refuses_files_that_are_not_spec_text"},
    "test_spec_security.py": {"test_trusted_is_refused_where_labkit_classroom_is_set"},
    "test_torture.py": {"test_the_unfenced_drain_breaks_the_zero_stale_writes_invariant",
                        "test_command_line_prints_the_json_report"},
    "test_training.py": {"test_book_executes_notebooks_and_pages_open_without_errors"},
}


def _needs_server(item) -> bool:
    name = getattr(item, "originalname", item.name)
    return bool(SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ()))
                or item.get_closest_marker("needs_mysql")
                or name in SERVER_TESTS.get(item.path.name, ()))


@pytest.hookimpl(tryfirst=True)         # before `-m` selects on the marks added here
def pytest_collection_modifyitems(config, items):
    for item in items:
        if _needs_server(item) and not item.get_closest_marker("server"):
            item.add_marker(pytest.mark.server)
    if not os.environ.get("LABKIT_DSN"):
        return
    skip = pytest.mark.skip(reason="does not depend on the server: checked without LABKIT_DSN, "
                                   "on the embedded server")
    for item in items:
        if item.get_closest_marker("default_leg"):
            item.add_marker(skip)


def pytest_collection_finish(session):
    # test_layers.py collects the whole suite once and reads each test's layer from here
    if os.environ.get("LABKIT_PRINT_LAYERS"):
        for item in session.items:
            print("LAYER", "server" if item.get_closest_marker("server") else "fast", item.nodeid)


@pytest.fixture(scope="session")
def db():
    return labkit.connect(quiet=True)


@pytest.fixture
def lab(db, request):
    # One schema per test, named after it, so tests never see each other's rows.
    name = "t_" + re.sub(r"[^a-z0-9]+", "_", request.node.name.lower())[:40] + f"_{os.getpid()}"
    lab = Lab.open(db, name)
    yield lab
    lab.drop()


def backends_of(db, pattern: str) -> list[tuple]:
    """(pid, application_name, state) of live backends whose application_name matches."""
    with db.connect() as conn:
        return conn.execute(
            "SELECT pid, application_name, state FROM pg_stat_activity "
            "WHERE application_name LIKE %s AND pid <> pg_backend_pid()", (pattern,)).fetchall()


def backends_gone(db, pattern: str, timeout: float = 10.0) -> list[tuple]:
    """Backends matching ``pattern`` still alive after waiting up to ``timeout`` s.

    A client closing its connection returns at once; the server process exits a moment
    later, so a test that checks for leftovers allows it that moment."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        left = backends_of(db, pattern)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def login_role(db, name: str, rights: str = "NOCREATEDB NOCREATEROLE", comment: str | None = None):
    """A generator for a fixture: a throw-away login ``name`` with ``rights`` and CREATE on the
    database (marked with ``comment`` if given); yields ``db`` logged in as it, then drops its
    schemas, what it owns and the role."""
    import dataclasses

    from psycopg.conninfo import make_conninfo

    with db.connect() as c:
        c.execute(f"CREATE ROLE {name} LOGIN {rights}")
        if comment is not None:
            c.execute(f"COMMENT ON ROLE {name} IS '{comment}'")
        c.execute(f'GRANT CREATE ON DATABASE "{c.info.dbname}" TO {name}')
    yield dataclasses.replace(db, dsn=make_conninfo(db.dsn, user=name))
    with db.connect() as c:
        for (schema,) in c.execute("SELECT nspname FROM pg_namespace n JOIN pg_roles r "
                                   "ON r.oid = nspowner WHERE rolname = %s", (name,)).fetchall():
            c.execute(f'DROP SCHEMA "{schema}" CASCADE')
        c.execute(f"DROP OWNED BY {name}")
        c.execute(f"DROP ROLE {name}")


def child_processes(proc=None, *, zombies: bool = True) -> list:
    """The descendants of ``proc`` (this test process by default), but multiprocessing's
    resource tracker (started once, on first use of spawn, and kept for the life of the
    process); without zombies when ``zombies`` is False.  What the leftover checks compare
    before and after a run."""
    import psutil

    out = []
    for p in (proc or psutil.Process()).children(recursive=True):
        try:
            if "resource_tracker" not in " ".join(p.cmdline()) and (
                    zombies or p.status() != psutil.STATUS_ZOMBIE):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def child_pids() -> set[int]:
    """The pids of :func:`child_processes` of this test process."""
    return {p.pid for p in child_processes()}


_PRESSED_WHILE_GC_RAN: list[bool] = []


def press_ctrl_c(*, as_signal: bool = False) -> None:
    """Ctrl-C for the main thread, from another thread: a KeyboardInterrupt (or a real SIGINT to
    this process, ``as_signal``).  The test asks for the ``gc_paused`` fixture: Python ignores an
    exception raised in a gc callback (hypothesis registers one), so an interrupt that lands
    while the collector runs is lost, and with it the interrupt the test waits for."""
    if gc.isenabled():
        _PRESSED_WHILE_GC_RAN.append(True)
    if as_signal:
        os.kill(os.getpid(), signal.SIGINT)
    else:
        _thread.interrupt_main()


@pytest.fixture
def gc_paused():
    """No automatic garbage collection for the test, so no gc callback is running when
    :func:`press_ctrl_c` presses (one already running when it pressed would swallow it)."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.fixture(autouse=True)
def _ctrl_c_only_with_gc_paused():
    """A test that pressed Ctrl-C without ``gc_paused`` fails, even when the press landed."""
    _PRESSED_WHILE_GC_RAN.clear()
    yield
    pressed, _PRESSED_WHILE_GC_RAN[:] = list(_PRESSED_WHILE_GC_RAN), []
    assert not pressed, ("this test pressed Ctrl-C with garbage collection on: mark it "
                         "@pytest.mark.usefixtures(\"gc_paused\")")


def interrupt_when(connect, ready, sent: list, *, timeout: float = 60, poll_s: float = 0.02):
    """Ctrl-C for the main thread (a KeyboardInterrupt, as the key gives a reader) once
    ``ready(conn)`` is true on a connection from ``connect()`` -- a state read from the server,
    never a fixed delay a slow machine may not have reached -- or after ``timeout`` seconds.
    The moment is appended to ``sent``.  Returns the watcher thread, started.  The test asks
    for the ``gc_paused`` fixture (see :func:`press_ctrl_c`)."""
    import threading
    import time

    def watch():
        with connect() as conn:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and not ready(conn):
                time.sleep(poll_s)
        sent.append(time.monotonic())
        press_ctrl_c()

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def returns_a_row(sql: str, params: tuple = (), *, missing_ok: bool = False):
    """A ``ready`` for :func:`interrupt_when`: ``sql`` returns a row.  With ``missing_ok``, a
    statement that fails (its table not created yet) counts as not yet."""
    def ready(conn) -> bool:
        try:
            return conn.execute(sql, params).fetchone() is not None
        except Exception:
            if missing_ok:
                return False
            raise
    return ready


@pytest.fixture
def scratch_root():
    """A short-named folder of the test's own that every user may pass through (as root the
    server runs as another user, who must reach its data directory; pytest's tmp_path
    is closed to other users).  Removed at the end."""
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix="lk-")
    os.chmod(path, 0o755)
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def scratch_server(scratch_root, monkeypatch):
    """An embedded cluster of this test's own (never the user's default server), stopped
    at the end."""
    from labkit.core.errors import LabkitError
    from labkit.core.server import EmbeddedServer

    monkeypatch.setenv("LABKIT_DATA_DIR", str(scratch_root / "pg"))
    monkeypatch.delenv("LABKIT_DSN", raising=False)
    monkeypatch.delenv("LABKIT_BACKEND", raising=False)
    monkeypatch.delenv("LABKIT_PG_PORT", raising=False)
    server = EmbeddedServer()
    assert server.data_dir == scratch_root / "pg"
    yield server
    try:
        server.stop()
    except LabkitError:
        pass


@pytest.fixture
def replica_server(scratch_server, monkeypatch):
    """A scratch embedded cluster started as labkit starts it, but at wal_level = replica."""
    from labkit.core.server import EmbeddedServer

    options = EmbeddedServer._options
    monkeypatch.setattr(EmbeddedServer, "_options",
                        lambda self, port: options(self, port).replace("wal_level=logical",
                                                                       "wal_level=replica"))
    scratch_server.start()
    return labkit.connect(quiet=True)


# A widget's repr where its static view should be (a deck, a handout page, a notebook's page).
WIDGET_REPR = re.compile(r"\b[VH]Box\(children=")


def reprs_in(pages) -> list[str]:
    """The names of the pages (HTML files) that show a widget's repr."""
    import html

    return [p.name for p in pages if WIDGET_REPR.search(html.unescape(p.read_text()))]
