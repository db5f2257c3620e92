"""The package passes its linter and its type checker, as configured in pyproject.toml.

ruff finds errors, unused names, unsorted imports and spellings older than Python 3.10; mypy
checks the annotations the package carries.  Both run over the whole of ``labkit/``, so a new
lab lands linted and typed, and a failure prints what each tool said.
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
