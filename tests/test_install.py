"""The workbook's data lives in data/ at the top of the checkout; the package build carries it
into the wheel as labkit/data/.

* The wheel, built from a copy of the checkout, holds every file of data/ under labkit/data/,
  byte for byte, beside every module of labkit.
* That wheel, installed (not editable) into a fresh virtual environment, runs its commands from
  another, empty folder: the drill, the grader on a shipped sample, a shipped spec, the
  benchmark. None of what they read is looked up in the checkout.
* A checkout (what ``pip install -e .`` installs) reads data/ in place: an edit of
  data/questions.yaml shows in ``labkit drill`` without reinstalling."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import yaml

import labkit
from labkit.core.files import data_file

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data"

# Packaging: what ships in the wheel does not depend on which server answers.
pytestmark = pytest.mark.default_leg

# What the build does not need: the repository's own folders, caches, earlier builds, the
# notebooks (the package never reads them: only `labkit student` and `labkit slides` do, from
# a checkout).
NOT_BUILT_FROM = shutil.ignore_patterns(".*", "__pycache__", "*.egg-info", "build", "dist", "work",
                                        "notebooks", "student")


def copy_of_checkout(to: Path) -> Path:
    shutil.copytree(ROOT, to, ignore=NOT_BUILT_FROM)
    return to


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> tuple[Path, str]:
    """The wheel `pip wheel` builds from a copy of the checkout (a copy, so that no build/ left in
    the checkout by an earlier build can slip a file in), and what the build printed."""
    base = tmp_path_factory.mktemp("wheel")
    src = copy_of_checkout(base / "src")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(base / "wheels"), str(src)],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    [built] = sorted((base / "wheels").glob("labkit-*.whl"))
    return built, build.stdout + build.stderr


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> tuple[Path, Path, dict, Path]:
    """The wheel installed, not editable, into a fresh virtual environment, and an empty folder
    to run its commands from. The environment borrows labkit's dependencies from the one
    running the tests (a .pth file naming its site-packages, after the environment's own),
    not labkit itself: that comes from the wheel alone."""
    base = tmp_path_factory.mktemp("plain_install")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    deps = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (site / "zz_labkit_dependencies.pth").write_text("".join(f"{d}\n" for d in deps))
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                              "--no-index", "--ignore-installed", str(wheel[0])],
                             capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stdout + install.stderr
    elsewhere = base / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    return venv, site, env, elsewhere


def run(installed, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    venv, _, env, elsewhere = installed
    return subprocess.run([str(venv / "bin" / "labkit"), *args], cwd=elsewhere, env=env,
                          capture_output=True, text=True, timeout=timeout)


# -- the wheel ------------------------------------------------------------------------------------

def data_files() -> dict[str, Path]:
    return {p.relative_to(DATA).as_posix(): p for p in sorted(DATA.rglob("*")) if p.is_file()}


def test_the_checkout_keeps_its_data_beside_the_package_not_in_it() -> None:
    assert {"questions.yaml", "capstone.yaml", "plans.yaml", "costly_answers.yaml",
            "bench_reference.json", "convoy_reference.csv", "grader/correct.sql",
            "specs/nowait.spec", "specs/mariadb/wait.spec"} <= set(data_files())
    assert not (ROOT / "labkit" / "data").exists(), "the workbook's data lives in data/, not labkit/data/"


def test_the_wheel_carries_data_as_labkit_data_byte_for_byte(wheel) -> None:
    with zipfile.ZipFile(wheel[0]) as whl:
        names = set(whl.namelist())
        shipped = {n.removeprefix("labkit/data/") for n in names if n.startswith("labkit/data/")}
        assert shipped == set(data_files()), (f"in data/ only: {sorted(set(data_files()) - shipped)}; "
                                              f"in the wheel only: {sorted(shipped - set(data_files()))}")
        for rel, path in data_files().items():
            assert whl.read(f"labkit/data/{rel}") == path.read_bytes(), rel
    assert not [n for n in names if n.startswith("data/")], "data/ ships inside the package, not beside it"


def test_the_wheel_carries_every_module_and_the_sql(wheel) -> None:
    """pyproject.toml lists labkit's packages by name (data/ is mapped onto labkit.data): a new
    subpackage left out of that list would be missing from every install."""
    with zipfile.ZipFile(wheel[0]) as whl:
        names = set(whl.namelist())
    package = ROOT / "labkit"
    wanted = {p.relative_to(ROOT).as_posix() for pattern in ("*.py", "*.sql", "*.j2", "*.css", "*.json")
              for p in package.rglob(pattern) if "__pycache__" not in p.parts}
    assert not wanted - names, (f"missing from the wheel: {sorted(wanted - names)}; "
                                "add its package to [tool.setuptools] packages in pyproject.toml")


def test_the_build_is_free_of_deprecations_and_states_the_license(wheel) -> None:
    """pip shows what the build backend warns; the license is an SPDX expression (PEP 639)."""
    built, log = wheel
    assert "deprecat" not in log.lower(), log
    with zipfile.ZipFile(built) as whl:
        metadata = whl.read(next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: MIT" in metadata.splitlines()


# -- the installed copy, from another folder ------------------------------------------------------

def test_the_commands_run_the_installed_copy_not_the_checkout(installed) -> None:
    venv, site, env, elsewhere = installed
    where = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import labkit, labkit.core.files as f; print(labkit.__file__); "
                            "print(f.data_file('questions.yaml'))"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, check=True).stdout.split("\n")
    assert Path(where[0]).is_relative_to(site), where
    assert Path(where[1]) == site / "labkit" / "data" / "questions.yaml", where
    assert (site / "labkit" / "sql" / "claim_skip_locked.sql").is_file()


def test_drill_from_an_installed_copy(installed) -> None:
    out = run(installed, "drill", "sheet", "--level", "senior")
    assert out.returncode == 0, out.stderr
    assert "senior" in out.stdout.lower() and len(out.stdout.splitlines()) > 10
    check = run(installed, "drill", "check")
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.count("— ok") == 3, check.stdout     # the bank, the costly answers, the capstone


def test_grade_a_shipped_sample_from_an_installed_copy(installed) -> None:
    samples = installed[1] / "labkit" / "data" / "grader"
    good = run(installed, "grade", "claim", str(samples / "correct.sql"))
    assert good.returncode == 0, good.stdout + good.stderr
    bad = run(installed, "grade", "claim", str(samples / "wrong_nowait.sql"))
    assert bad.returncode == 1, bad.stdout + bad.stderr      # the grader really grades


def test_spec_run_of_a_shipped_spec_from_an_installed_copy(installed) -> None:
    specs = installed[1] / "labkit" / "data" / "specs"
    out = run(installed, "spec", "run", str(specs / "nowait.spec"))
    assert out.returncode == 0, out.stderr
    assert out.stdout == (specs / "nowait.out").read_text()      # the tester's own format, exactly


def test_bench_quick_json_from_an_installed_copy(installed) -> None:
    # the figures that read the package's data (the claim SQL, the reference's keys) and the
    # workbook's absence; the rest measure the same code the checkout's bench test runs
    out = run(installed, "bench", "--quick", "--seconds", "0.3", "--json",
              "--figures", "ceiling", "durability", "notebooks", timeout=600)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["durability"] and result["goals"]
    assert all(v > 0 for v in result["claim_jobs_per_s"].values())     # it measured, from the installed copy
    # no workbook beside an installed copy: the notebook timings are skipped, and say why
    assert "from a checkout" in result["notebooks_skipped"] and result["notebook_seconds"] == {}


# -- a checkout reads data/ in place --------------------------------------------------------------

def test_this_checkout_reads_its_data_folder_in_place() -> None:
    if not Path(labkit.__file__).resolve().is_relative_to(ROOT):
        pytest.skip(f"labkit is imported from {labkit.__file__}, not from this checkout")
    assert data_file("questions.yaml").resolve() == DATA / "questions.yaml"
    assert data_file("specs", "mariadb").resolve() == DATA / "specs" / "mariadb"


def test_an_edit_of_data_shows_in_the_drill_without_reinstalling(tmp_path) -> None:
    """A copy of the checkout, its labkit imported from the copy as an editable install would:
    the drill shows what data/questions.yaml says now."""
    copy = copy_of_checkout(tmp_path / "checkout")
    bank_file = copy / "data" / "questions.yaml"
    bank = yaml.safe_load(bank_file.read_text(encoding="utf-8"))
    first = bank["questions"][0]
    first["question"] = "Edited in place: which row does a waiting claim lock?"
    bank_file.write_text(yaml.safe_dump(bank, sort_keys=False, allow_unicode=True, width=1000),
                         encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME",)}
    env["PYTHONPATH"] = str(copy)
    out = subprocess.run([sys.executable, "-m", "labkit", "drill", "sheet", "--level", first["level"]],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Edited in place: which row does a waiting claim lock?" in out.stdout, out.stdout[:2000]
