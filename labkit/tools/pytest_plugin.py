"""labkit's pytest plugin: what pytest needs to know about tests/ and notebooks/ alike.

pyproject.toml loads it for every run in the repository (``-p labkit.tools.pytest_plugin``),
so ``pytest tests``, ``pytest notebooks`` and ``make test`` all see it.  (A conftest.py at
the top of the repository would do the same, but the tests import their helpers with
``from conftest import ...``, which a second conftest module would shadow.)

The cross-engine appendix -- notebook 21 and the tests marked ``needs_mysql`` -- runs on a
MySQL-compatible server (labkit.core.mysql.find).  Without one, they are reported as ONE
skip line that says why and how to run them, and nothing else in the workbook changes.  The
same holds for notebook 19's half-open cells and the tests marked ``needs_netns``, on a machine
where no network namespace can be made.

A run that executes notebooks ends with one line counting the timed shapes that were not
checked because the machine was loaded (labkit.core.load.shape), and names each.

``make test`` runs the suite on four processes (pytest-xdist, ``-n 4 --dist loadfile
--no-loadscope-reorder``: a notebook's cells stay in order on one of them, and
:data:`LONG_FIRST` starts the longest files first).  On the default path each process gets an embedded server of its own
(``LABKIT_DATA_DIR`` beside the default one, ``...-gw0`` to ``...-gw3``), stopped when the
process ends: some tests end sessions or drop schemas across the server they run on, which
must not be another process's.  On a server given by
``LABKIT_DSN`` the Makefile runs them on one process.
"""

from __future__ import annotations

import pytest

APPENDIX = "21_other_engines.ipynb"


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "needs_mysql: runs on the cross-engine appendix's MySQL-compatible "
                                       "server; skipped, in one line, without one")
    config.addinivalue_line("markers", "needs_netns: makes a network namespace of its own (Linux); "
                                       "skipped, in one line, where none can be made")
    _server_per_worker(config)
    _shape_log_setup(config)


def _server_per_worker(config) -> None:
    """In a pytest-xdist worker on the default path, an embedded server of the worker's own."""
    import os

    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker or os.environ.get("LABKIT_DSN") or os.environ.get("LABKIT_BACKEND"):
        return
    from ..core.server import data_root

    own = data_root().with_name(f"{data_root().name}-{worker}")
    os.environ["LABKIT_DATA_DIR"] = str(own)       # inherited by the kernels and commands it starts
    config._labkit_worker_server = own


def _stop_worker_server(config) -> None:
    own = getattr(config, "_labkit_worker_server", None)
    if own is None:
        return
    from ..core.server import EmbeddedServer

    try:
        EmbeddedServer(own).stop()
    except Exception as exc:                        # the run's result stands; say what is left
        print(f"labkit: the test server in {own} was not stopped ({exc}); "
              f"run `LABKIT_DATA_DIR={own} labkit server stop`")


def _wants_mysql(item) -> bool:
    return item.get_closest_marker("needs_mysql") is not None or item.path.name == APPENDIX


# Notebook 19's half-open section makes a network namespace of its own (Linux): on a machine
# that cannot (macOS, a kernel that forbids unprivileged user namespaces) its cells and the
# tests marked needs_netns are left out with one line that says why and counts them.
SERVER_GOES_AWAY = "19_when_the_server_goes_away.ipynb"


def _wants_netns(item) -> bool:
    if item.get_closest_marker("needs_netns") is not None:
        return True
    if item.path.name != SERVER_GOES_AWAY:
        return False
    cell = getattr(item, "cell", None)
    source = cell.get("source", "") if isinstance(cell, dict) else ""
    source = "".join(source) if isinstance(source, list) else source
    return "halfopen." in source or "half." in source


def _leave_out(config, items, wanting: list, reason: str, notebook: str, number: str) -> None:
    """Skip the first of ``wanting`` with one line (``reason`` and what is not run), and
    deselect the rest."""
    cells = sum(1 for item in wanting if item.path.name == notebook)
    tests = len(wanting) - cells
    what = " and ".join(part for part in (f"{tests} test(s)" if tests else "",
                                          f"notebook {number}'s {cells} cell(s)" if cells else "") if part)
    wanting[0].add_marker(pytest.mark.skip(reason=f"{reason} (not run: {what})"))
    rest = set(wanting[1:])
    if rest:
        config.hook.pytest_deselected(items=list(rest))
        items[:] = [item for item in items if item not in rest]


# The files that take longest (measured with --junitxml in a fresh clone's make test on two
# cores: every file of 20 s or more), longest first.  Under
# ``--dist loadfile --no-loadscope-reorder`` (make test) each file goes whole to one process, in
# collection order, so a long file collected last leaves the other processes idle while it runs;
# collected first, the short files fill in around it.  (Without --no-loadscope-reorder xdist
# hands out the files with the most tests first, whatever this order.)  A file missing from
# this list only runs in its usual place.
LONG_FIRST = (
    "tests/test_live_widgets.py", "tests/test_training.py", "notebooks/17_prove_it.ipynb",
    "tests/test_relay.py", "tests/test_torture.py", "tests/test_horizon.py", "tests/test_grade.py",
    "tests/test_lifecycle.py", "tests/test_failover.py", "notebooks/19_when_the_server_goes_away.ipynb",
    "notebooks/21_other_engines.ipynb", "tests/test_mysql.py", "tests/test_physics.py",
    "tests/test_security.py", "tests/test_install.py", "tests/test_drill.py",
    "notebooks/06_outbox_relay.ipynb", "tests/test_bench.py", "tests/test_load.py",
    "notebooks/20_interview_drill.ipynb",
    "tests/test_layers.py", "tests/test_lint.py", "notebooks/02_the_convoy.ipynb",
    "notebooks/16_how_fast.ipynb", "notebooks/11_failures_heartbeats_schedules.ipynb",
    "tests/test_signals.py", "tests/test_ordering.py", "tests/test_foundation.py",
    "tests/test_inbox.py", "notebooks/12_wakeups_and_poolers.ipynb", "tests/test_wakeup.py",
    "notebooks/10_the_mvcc_horizon.ipynb", "notebooks/09_relay_vs_drain.ipynb",
    "notebooks/05_indexes_ordering_batches.ipynb", "notebooks/08_fencing_tokens.ipynb",
)


def _long_files_first(config, items) -> None:
    """Reorder ``items`` so that the files in :data:`LONG_FIRST` come first, in that order; the
    tests within a file (a notebook's cells) and every other file keep their order."""
    root = config.rootpath
    rank = {name: i for i, name in enumerate(LONG_FIRST)}

    def key(item) -> int:
        try:
            name = item.path.relative_to(root).as_posix()
        except ValueError:
            return len(rank)
        return rank.get(name, len(rank))

    items.sort(key=key)                         # stable: every file's own order stays


def pytest_collection_modifyitems(config, items) -> None:
    _long_files_first(config, items)
    wanting = [item for item in items if _wants_mysql(item)]
    if wanting:
        from ..core.mysql import skip_reason

        reason = skip_reason()
        if reason is not None:
            _leave_out(config, items, wanting, reason, APPENDIX, "21")
    wanting = [item for item in items if _wants_netns(item)]
    if wanting:
        from ..labs.halfopen import available

        ok, why = available()
        if not ok:
            _leave_out(config, items, wanting, f"no network namespace on this machine: {why}",
                       SERVER_GOES_AWAY, "19")


# ---------------------------------------------------------------------------------------------
# Timed shapes not checked.  A notebook's timed cell asserts a shape with lk.shape; on a loaded
# machine a shape that does not hold after its measurements is said ("Not checked here") instead
# of failed.  Every such line is also written to the file named by LABKIT_SHAPE_LOG, which this
# plugin sets for the kernels nbval starts, so the run ends with one line that counts them.

def _shape_log_setup(config) -> None:
    import os
    import tempfile

    from ..core import load

    config._labkit_shapes_seen = 0
    config._labkit_shapes_not_checked = []
    # an xdist worker keeps a log of its own: the controller's, inherited, is shared by both
    if os.environ.get(load.LOG_ENV) and not os.environ.get("PYTEST_XDIST_WORKER"):
        config._labkit_shape_log = (os.environ[load.LOG_ENV], False)
        return
    fd, path = tempfile.mkstemp(prefix="labkit-shapes-", suffix=".jsonl")
    os.close(fd)
    os.environ[load.LOG_ENV] = path          # inherited by every kernel nbval starts from here
    config._labkit_shape_log = (path, True)


def _read_shape_log(config) -> list[dict]:
    import json

    path, _ = config._labkit_shape_log
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    new = lines[config._labkit_shapes_seen:]
    config._labkit_shapes_seen = len(lines)
    out = []
    for line in new:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def pytest_sessionstart(session) -> None:
    _CONFIG["config"] = session.config
    _read_shape_log(session.config)       # lines already in a log given from outside: another run's


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    config = item.config
    if call.when == "teardown" and hasattr(config, "_labkit_shape_log"):
        report = outcome.get_result()
        for entry in _read_shape_log(config):
            report.user_properties.append(("labkit_shape_not_checked", entry))


def pytest_runtest_logreport(report) -> None:
    """Runs where the report arrives: in this process, or in xdist's controlling one."""
    config = _CONFIG.get("config")
    if config is None or not hasattr(config, "_labkit_shapes_not_checked"):
        return
    for name, entry in getattr(report, "user_properties", ()):
        if name == "labkit_shape_not_checked":
            config._labkit_shapes_not_checked.append((report.nodeid, entry))


_CONFIG: dict = {}


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not hasattr(config, "_labkit_shape_log"):
        return
    from ..core import load

    ran_notebooks = any(str(getattr(r, "nodeid", "")).split("::")[0].endswith(".ipynb")
                        for reports in terminalreporter.stats.values() for r in reports
                        if hasattr(r, "nodeid"))
    missed = config._labkit_shapes_not_checked
    if not ran_notebooks and not missed:
        return
    mode = f" ({load.STRICT_ENV}=1: none may be)" if load.strict() else ""
    terminalreporter.write_line(f"labkit: {len(missed)} timed shape(s) not checked on a loaded "
                                f"machine{mode}")
    for nodeid, entry in missed:
        terminalreporter.write_line(f"  {nodeid}: {entry.get('claim')} "
                                    f"(measured: {entry.get('measured') or '-'}; {entry.get('reading')})")


def pytest_unconfigure(config) -> None:
    import os

    _stop_worker_server(config)

    log = getattr(config, "_labkit_shape_log", None)
    if log and log[1]:
        try:
            os.unlink(log[0])
        except OSError:
            pass
