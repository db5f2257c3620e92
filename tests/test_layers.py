"""The suite in layers: `pytest -m "not server" tests` (make test-fast) selects the tests that need
no database server, `pytest -m server tests` the rest, and together they are the whole.

The marking itself is in conftest.py: a test using a fixture that reaches a server (``db``,
``lab``, ``scratch_server`` ...) is ``server``, and so is one named in ``SERVER_TESTS`` or in a
module marked ``pytestmark = pytest.mark.server``.  The fast layer is collected here as a
contributor collects it, and the whole suite once more with each test's layer printed, each by
pytest in a process of its own; nothing is run and no server is asked for anything.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SERVER_FIXTURES, SERVER_TESTS

ROOT = Path(__file__).resolve().parent.parent

# Pure tests, one from each kind the fast layer is for.
PURE = [
    "tests/test_architecture.py::test_no_import_cycle_among_labkits_modules",
    "tests/test_lint.py::",
    "tests/test_timing.py::",
    "tests/test_text.py::",
    "tests/test_drill.py::test_the_state_folder_and_its_override",
    # a pure test beside tests that need a server, in the same module
    "tests/test_foundation.py::test_unreachable_dsn_names_the_fix_and_hides_the_password",
    "tests/test_drain.py::test_device_collapses_by_collapse_id_and_drops_repeated_keys",
]
# Server tests, one for each way a test is found to need a server.
SERVER = [
    # the `lab` fixture
    "tests/test_sessions.py::test_blocked_step_is_detected_from_the_server_and_completes_after_commit",
    # a fixture of the module's own that starts a cluster of the test's own
    "tests/test_classroom.py::"
    "test_a_server_that_asks_for_passwords_gets_a_room_with_limits_and_no_password_in_its_log",
    # named in conftest.SERVER_TESTS: labkit.connect() in the test's body
    "tests/test_foundation.py::test_connect_says_which_server_in_one_line",
    # a module marked by hand
    "tests/test_make_lab.py::test_make_lab_serves_the_notebooks",
    "tests/test_relay.py::",
]


def _collect(mark: str, *, print_layers: bool = False) -> subprocess.Popen:
    """Collect the suite as a contributor does (``-m mark``; "" collects it with no -m at all),
    in a process of its own; ``print_layers``: conftest prints each test's layer too."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT_TEST", "LABKIT_PRINT_LAYERS"))}
    if print_layers:
        env["LABKIT_PRINT_LAYERS"] = "1"
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", *(["-m", mark] if mark else []), "--collect-only", "-q",
         "-p", "no:cacheprovider", "-p", "no:xdist", "tests"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _ids(proc: subprocess.Popen) -> tuple[set[str], str]:
    text, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, text[-3000:]
    ids = {line for line in text.splitlines() if "::" in line and not line.startswith((" ", "LAYER "))}
    summary = re.search(r"(\d+)(?:/\d+)? tests? collected", text)
    assert summary, text[-2000:]
    assert int(summary.group(1)) == len(ids), text[-2000:]
    return ids, text


@pytest.fixture(scope="module")
def layers() -> dict[str, tuple[set[str], int]]:
    """For each layer, and for the whole suite ("" - no -m), the node ids it selects and how
    many.  The fast layer is collected as `make test-fast` does (-m "not server"); the whole
    suite is what a plain `pytest tests` runs, collected once more with each test's layer
    printed (a test the plugin deselects on this machine, the cross-engine appendix with
    LABKIT_MYSQL_DSN=off, is in neither layer and not in the whole either); the server layer
    is the whole's tests printed as server, which is what `-m server` selects."""
    fast_proc, whole_proc = _collect("not server"), _collect("", print_layers=True)
    fast, _ = _ids(fast_proc)
    whole, text = _ids(whole_proc)
    server = {line.split(" ", 2)[2] for line in text.splitlines() if line.startswith("LAYER server ")}
    assert server <= whole
    return {"not server": (fast, len(fast)), "server": (server, len(server)), "": (whole, len(whole))}


def _has(ids: set[str], prefix: str) -> bool:
    return any(i == prefix or i.startswith(prefix + "[") or (prefix.endswith("::") and i.startswith(prefix))
               for i in ids)


def test_the_fast_layer_holds_the_pure_tests_and_no_server_test(layers):
    fast, _ = layers["not server"]
    assert [p for p in PURE if not _has(fast, p)] == []
    assert [s for s in SERVER if _has(fast, s)] == []


def test_the_server_layer_holds_the_tests_that_need_one(layers):
    server, _ = layers["server"]
    assert [s for s in SERVER if not _has(server, s)] == []
    assert [p for p in PURE if _has(server, p)] == []


def test_the_two_layers_are_the_whole_suite_once(layers):
    (fast, _), (server, _), (whole, _) = layers["not server"], layers["server"], layers[""]
    assert fast & server == set()
    assert fast | server == whole


def test_every_test_named_as_a_server_test_still_exists(layers):
    # a test renamed would silently fall back into the fast layer and fail there without a server
    server, _ = layers["server"]
    names = {(Path(i.split("::")[0]).name, i.split("::")[-1].split("[")[0]) for i in server}
    missing = [(module, name) for module, tests in SERVER_TESTS.items() for name in sorted(tests)
               if (module, name) not in names]
    assert missing == []


def test_the_server_fixtures_are_fixtures_the_suite_defines():
    defined = set()
    for path in (ROOT / "tests").glob("*.py"):
        defined |= set(re.findall(r"@pytest\.fixture[^\n]*\n(?:@[^\n]*\n)*def (\w+)", path.read_text()))
    assert sorted(SERVER_FIXTURES - defined) == []


def test_the_long_files_are_collected_first_and_every_files_order_is_kept():
    from types import SimpleNamespace

    from labkit.tools import pytest_plugin

    # a file renamed would silently fall back to its usual place and lengthen the run's tail
    assert [name for name in pytest_plugin.LONG_FIRST if not (ROOT / name).is_file()] == []
    config = SimpleNamespace(rootpath=ROOT)
    items = [SimpleNamespace(path=ROOT / name, n=n) for n, name in enumerate(
        ["tests/test_text.py", "notebooks/17_prove_it.ipynb", "tests/test_text.py",
         "tests/test_training.py", "notebooks/17_prove_it.ipynb", "tests/test_lint.py"])]
    pytest_plugin._long_files_first(config, items)
    assert [(item.path.relative_to(ROOT).as_posix(), item.n) for item in items] == [
        ("tests/test_training.py", 3), ("notebooks/17_prove_it.ipynb", 1),
        ("notebooks/17_prove_it.ipynb", 4), ("tests/test_lint.py", 5), ("tests/test_text.py", 0),
        ("tests/test_text.py", 2)]
