"""labkit's shape: three rooms that import one way, and no import cycle.

Every import counts, at the top of a module or inside a function: a cycle hidden in a
function is still a cycle a reader has to untangle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import labkit

PKG = Path(labkit.__file__).parent
# Which rooms a module in each room may import from.
MAY_IMPORT = {
    "core": {"core"},
    "labs": {"core", "labs"},
    "tools": {"core", "labs", "tools"},
    "cli": {"core", "labs", "tools"},
    "__main__": {"cli"},                # python -m labkit: the command line, nothing else
    "facade": {"core", "labs", "tools"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PKG.rglob("*.py")}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The labkit modules ``name`` imports, anywhere in its text."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "labkit")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "labkit":
                continue
            for alias in node.names:           # `from . import db` imports the module labkit.db
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in known else target)
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(name, path, set(mods)) for name, path in mods.items()}


def room(name: str) -> str:
    parts = name.split(".")
    if name == "labkit":
        return "facade"
    if parts[1] in ("core", "labs", "tools"):
        return parts[1]
    return parts[1]                     # labkit.cli


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(g[n]):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (c := visit(m)):
                return c
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(g):
        if n not in state and (c := visit(n)):
            return c
    return None


def test_the_checker_sees_imports_inside_functions_and_finds_a_cycle() -> None:
    # positive control: the checker must see a function-level import and report the loop
    g = {"labkit.core.a": {"labkit.core.b"}, "labkit.core.b": {"labkit.core.a"}}
    assert find_cycle(g) == ["labkit.core.a", "labkit.core.b", "labkit.core.a"]
    # cli.py imports labkit.core.mysql only inside a function (doctor's appendix line)
    top = [line for line in (PKG / "cli.py").read_text().splitlines() if line.startswith(("from", "import"))]
    assert not any("mysql" in line for line in top)
    assert "labkit.core.mysql" in imports_of("labkit.cli", PKG / "cli.py", set(modules()))


def test_no_import_cycle_among_labkits_modules() -> None:
    assert find_cycle(graph()) is None


def test_imports_flow_one_way_tools_to_labs_to_core() -> None:
    wrong = []
    for name, deps in graph().items():
        mine = room(name)
        for dep in deps:
            theirs = room(dep)
            if theirs not in MAY_IMPORT.get(mine, set()):
                wrong.append(f"{name} ({mine}) imports {dep} ({theirs})")
    assert not wrong, "\n".join(sorted(wrong))


def test_every_module_lives_in_a_room() -> None:
    loose = sorted(n for n in modules() if room(n) not in MAY_IMPORT)
    assert not loose, f"modules outside core/labs/tools/cli: {loose}"


def notebook_imports(path: Path) -> set[str]:
    """The modules a notebook's code cells import (``import x`` and ``from x import y``)."""
    import json

    found: set[str] = set()
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] != "code":
            continue
        lines = [ln for ln in "".join(cell["source"]).splitlines() if not ln.lstrip().startswith(("%", "!"))]
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
    return found


def test_notebooks_import_the_facade_and_the_labs_never_the_engine() -> None:
    """A notebook reads ``import labkit as lk`` and ``from labkit.labs import ...``; what it
    needs from ``labkit.core`` the facade offers, so the engine's layout can change under it."""
    root = PKG.parent
    wrong = {p.name: sorted(m for m in notebook_imports(p) if m.startswith("labkit.core"))
             for folder in ("notebooks", "student") for p in sorted((root / folder).glob("*.ipynb"))}
    wrong = {name: mods for name, mods in wrong.items() if mods}
    assert not wrong, f"notebooks importing labkit.core (add the name to labkit/__init__.py): {wrong}"


def test_the_notebook_import_reader_sees_a_core_import(tmp_path) -> None:
    nb = tmp_path / "x.ipynb"
    nb.write_text('{"cells": [{"cell_type": "code", "source": ["%matplotlib inline\\n", '
                  '"def f():\\n", "    from labkit.core.text import fill\\n"]}]}')
    assert notebook_imports(nb) == {"labkit.core.text"}


ARCHITECTURE = PKG.parent / "ARCHITECTURE.md"


def _room_blocks() -> dict[str, str]:
    """ARCHITECTURE.md's picture of the rooms: the text beside each room's name."""
    text = ARCHITECTURE.read_text()
    picture = text.split("```")[1]
    blocks: dict[str, str] = {}
    room_name = None
    for line in picture.splitlines():
        head = line.split()[0] if line.strip() and not line.startswith(" ") else None
        if head in ("cli.py", "tools/", "labs/", "core/"):
            room_name = head.rstrip("/").removesuffix(".py")
        if room_name:
            blocks[room_name] = blocks.get(room_name, "") + " " + line
    return blocks


def test_architecture_names_every_module_in_its_room() -> None:
    """A contributor finds each module in the picture at the top of ARCHITECTURE.md, in the
    room it lives in; a module added or moved without it fails here."""
    import re

    blocks = _room_blocks()
    assert set(blocks) == {"cli", "tools", "labs", "core"}, blocks.keys()
    missing = []
    for name in modules():
        parts = name.split(".")
        if len(parts) < 3 or parts[-1].startswith("_") or parts[1] not in blocks:
            continue            # the facade, cli itself, a room's __init__, private helpers
        leaf = parts[2]         # tools.exercises.cdc is named as "exercises"
        if not re.search(rf"\b{leaf}\b", blocks[parts[1]]):
            missing.append(f"{name} (in {parts[1]}/)")
    assert not missing, "ARCHITECTURE.md does not name: " + ", ".join(sorted(missing))


def test_architecture_lists_the_facades_names_and_the_files_it_points_to_exist() -> None:
    import re

    text = ARCHITECTURE.read_text()
    facade = text[text.index("`labkit/__init__.py` is the facade"):]
    facade = facade[:facade.index("\n\n")]
    named = set(re.findall(r"`lk\.(\w+)`", facade))
    assert named == set(labkit.__all__) - {"__version__"}, (named ^ (set(labkit.__all__) - {"__version__"}))
    pointed = set(re.findall(r"`((?:core|labs|tools)/[\w/]+\.py)", text))
    gone = sorted(p for p in pointed if not (PKG / p).is_file())
    assert not gone, f"ARCHITECTURE.md points at files that do not exist: {gone}"
    for sql in set(re.findall(r"`(?:labkit/)?sql/(\w+\.sql)`", text)):
        assert (PKG / "sql" / sql).is_file(), sql
