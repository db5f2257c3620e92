"""The package passes its linter and its type checker, as configured in pyproject.toml, and
no function of it is too tangled to read.

ruff finds errors, unused names, unsorted imports and spellings older than Python 3.10; mypy
checks the annotations the package carries; radon measures each function's cyclomatic
complexity (its independent paths), which stays at 20 or below: past that, a function is split
into named steps.  All three run over the whole of ``labkit/``, so a new lab lands linted, typed
and readable, and a failure prints what each tool said.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *command], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def test_ruff_finds_nothing_in_the_package():
    done = _run("ruff", "check", "--no-cache", "labkit")
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_finds_nothing_in_the_package():
    done = _run("mypy", "--cache-dir", str(ROOT / ".mypy_cache"), "labkit")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success" in done.stdout, done.stdout


def test_the_checks_would_fail_on_a_broken_module(tmp_path):
    """Both tools, with the project's configuration, report a module with an unused import
    and a wrong return type: the two tests above cannot pass by checking nothing."""
    bad = tmp_path / "broken.py"
    bad.write_text("import os\n\n\ndef half(n: int) -> str:\n    return n // 2\n")
    config = str(ROOT / "pyproject.toml")
    ruff = _run("ruff", "check", "--no-cache", "--config", config, str(bad))
    assert ruff.returncode == 1 and "F401" in ruff.stdout, ruff.stdout + ruff.stderr
    mypy = _run("mypy", "--config-file", config, "--no-incremental", str(bad))
    assert mypy.returncode == 1 and "Incompatible return value" in mypy.stdout, mypy.stdout


MAX_COMPLEXITY = 20


def _too_complex(paths: list[str]) -> list[str]:
    from radon.complexity import cc_visit

    found = []
    for path in paths:
        for block in cc_visit(Path(path).read_text()):
            for item in [block, *getattr(block, "methods", [])]:
                if item.complexity > MAX_COMPLEXITY:
                    found.append(f"{Path(path).relative_to(ROOT) if Path(path).is_relative_to(ROOT) else path}"
                                 f":{item.lineno} {item.fullname} ({item.complexity})")
    return found


def test_no_function_is_above_complexity_20():
    paths = sorted(str(p) for p in (ROOT / "labkit").rglob("*.py"))
    assert not _too_complex(paths), "split these into named steps:\n" + "\n".join(_too_complex(paths))


def test_the_complexity_check_finds_a_tangled_function(tmp_path):
    branches = "".join(f"    if n == {i}:\n        return {i}\n" for i in range(MAX_COMPLEXITY + 1))
    tangled = tmp_path / "tangled.py"
    tangled.write_text(f"def pick(n):\n{branches}    return -1\n")
    assert [line.split()[1] for line in _too_complex([str(tangled)])] == ["pick"]
