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
