"""A plain, non-editable install works from any folder: everything a command reads ships
inside the package (labkit/sql, labkit/data), none of it is looked up in the checkout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Packaging: what ships in the wheel does not depend on which server answers.
pytestmark = pytest.mark.default_leg


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, dict, Path]:
    """labkit built and installed (not editable) into a folder of its own; the commands run
    from another, empty folder, with that copy first on the path."""
    base = tmp_path_factory.mktemp("plain_install")
    site = base / "site"
    build = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site),
                            str(ROOT)], check=True, capture_output=True, text=True, timeout=300)
    (base / "pip.log").write_text(build.stdout + build.stderr)
    elsewhere = base / "elsewhere"
    elsewhere.mkdir()
    env = dict(os.environ, PYTHONPATH=str(site))
    return site, env, elsewhere


def run(installed, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    site, env, elsewhere = installed
    return subprocess.run([sys.executable, "-m", "labkit", *args], cwd=elsewhere, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_the_commands_run_the_installed_copy_not_the_checkout(installed) -> None:
    site, env, elsewhere = installed
    where = subprocess.run([sys.executable, "-c", "import labkit; print(labkit.__file__)"], cwd=elsewhere,
                           env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).is_relative_to(site), where
    assert (site / "labkit" / "data" / "questions.yaml").is_file()
    assert (site / "labkit" / "sql" / "claim_skip_locked.sql").is_file()


def test_drill_sheet_from_an_installed_copy(installed) -> None:
    out = run(installed, "drill", "sheet", "--level", "senior")
    assert out.returncode == 0, out.stderr
    assert "senior" in out.stdout.lower() and len(out.stdout.splitlines()) > 10


def test_grade_a_shipped_sample_from_an_installed_copy(installed) -> None:
    site = installed[0]
    good = run(installed, "grade", "claim", str(site / "labkit" / "data" / "grader" / "correct.sql"))
    assert good.returncode == 0, good.stdout + good.stderr
    bad = run(installed, "grade", "claim", str(site / "labkit" / "data" / "grader" / "wrong_nowait.sql"))
    assert bad.returncode == 1, bad.stdout + bad.stderr      # the grader really grades


def test_spec_run_of_a_shipped_spec_from_an_installed_copy(installed) -> None:
    specs = installed[0] / "labkit" / "data" / "specs"
    out = run(installed, "spec", "run", str(specs / "nowait.spec"))
    assert out.returncode == 0, out.stderr
    assert out.stdout == (specs / "nowait.out").read_text()      # the tester's own format, exactly


def test_bench_quick_json_from_an_installed_copy(installed) -> None:
    out = run(installed, "bench", "--quick", "--seconds", "0.3", "--json", timeout=600)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["durability"] and result["goals"]
    assert all(v > 0 for v in result["claim_jobs_per_s"].values())     # it measured, from the installed copy
    # no workbook beside an installed copy: the notebook timings are skipped, and say why
    assert "from a checkout" in result["notebooks_skipped"] and result["notebook_seconds"] == {}


def test_the_build_is_free_of_deprecations_and_states_the_license(installed) -> None:
    """pip shows what the build backend warns; the license is an SPDX expression (PEP 639)."""
    site, _, _ = installed
    log = (site.parent / "pip.log").read_text()
    assert "deprecat" not in log.lower(), log
    metadata = next(site.glob("labkit-*.dist-info")) / "METADATA"
    assert "License-Expression: MIT" in metadata.read_text().splitlines()
