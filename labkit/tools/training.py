"""Training mode: slide decks, a handout book, and student copies without solutions.

    labkit slides [NOTEBOOK ...] [--out build/slides]
    labkit book   [NOTEBOOK ...] [--out build/book] [--no-execute]
    labkit student [--check]

Everything written works offline: reveal.js is copied beside the decks, and no
page loads anything from the network.
"""

from __future__ import annotations

import copy
import html
import json
import re
import shutil
import sys
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nbformat import NotebookNode

from ..core.db import current_user_tag, lab_user
from ..core.errors import LabkitError
from ..core.sandbox import read_input
from .nbtools import NOTEBOOKS, clean

ROOT = NOTEBOOKS.parent
STUDENT = ROOT / "student"
TEMPLATES = Path(str(resources.files("labkit").joinpath("templates")))
ANSWER_RE = re.compile(r"<details>\s*<summary>\s*Answer\s*</summary>.*?</details>", re.S | re.I)
REMOTE_RE = re.compile(r"""<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)\s*=\s*["']?(?:https?:)?//""", re.I)
ANSWER_PLACEHOLDER = "*(Answer: in the instructor's copy, `notebooks/{name}`.)*"


MAX_NOTEBOOK_BYTES = 50_000_000


def _notebooks(paths: list[str] | None) -> list[Path]:
    found = [Path(p) for p in paths] if paths else sorted(NOTEBOOKS.glob("[0-9]*.ipynb"))
    missing = [p for p in found if not p.exists()]
    if missing:
        raise LabkitError(f"No such notebook: {', '.join(map(str, missing))}.",
                          "give paths like notebooks/01_one_lock_three_policies.ipynb, or none for all.")
    for path in found:
        _check_notebook(path)
    return found


def _check_notebook(path: Path) -> None:
    """A one-paragraph error unless ``path`` is a readable Jupyter notebook of sane size."""

    fix = "give paths like notebooks/01_one_lock_three_policies.ipynb, or none for all."
    text = read_input(path, what="notebook", fix=fix, max_bytes=MAX_NOTEBOOK_BYTES)
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise LabkitError(f"{path} is not a Jupyter notebook: it is not JSON ({exc}).", fix) from None
    cells = doc.get("cells") if isinstance(doc, dict) else None
    if (not isinstance(doc, dict) or doc.get("nbformat") != 4 or not isinstance(cells, list)
            or not all(isinstance(c, dict) and isinstance(c.get("cell_type"), str) for c in cells)):
        raise LabkitError(f"{path} is not a Jupyter notebook in format 4 (JSON with a list of "
                          "cells).", fix + " An older notebook can be upgraded with "
                          "`jupyter nbconvert --to notebook --inplace`.")


def _meta(path: Path) -> dict:
    return json.loads(path.read_text()).get("metadata", {}).get("claimlab", {})


def remote_references(text: str) -> list[str]:
    """Tags that would load something from the network (an offline page has none)."""
    return [m.group(0) for m in REMOTE_RE.finditer(text)]


# -- slides -------------------------------------------------------------------------------
def needs_slides_extra(what: str) -> None:
    """Slides and handouts need nbconvert, nbclient and sphinx-revealjs: the ``slides`` extra."""
    import importlib.util

    missing = [m for m in ("nbconvert", "nbclient", "sphinx_revealjs") if importlib.util.find_spec(m) is None]
    if missing:
        raise LabkitError(f"`labkit {what}` needs {', '.join(missing)}, which is not installed.",
                          "pip install 'labkit[slides]' (a checkout: pip install -e '.[slides]').")


def reveal_dir() -> Path:
    needs_slides_extra("slides")
    spec = resources.files("sphinx_revealjs").joinpath("_static", "revealjs")
    return Path(str(spec))


def slides(paths: list[str] | None = None, out: Path = ROOT / "build" / "slides", quiet: bool = False) -> list[Path]:
    needs_slides_extra("slides")
    import nbformat
    from nbconvert import SlidesExporter

    _notebooks(paths)               # every input checked before anything is written
    out.mkdir(parents=True, exist_ok=True)
    target = out / "reveal.js"
    if target.exists():
        shutil.rmtree(target)
    src = reveal_dir()
    for part in ("dist", "plugin"):
        shutil.copytree(src / part, target / part)
    written = []
    exporter = SlidesExporter(template_name="claimlab_slides", extra_template_basedirs=[str(TEMPLATES)],
                              reveal_url_prefix="reveal.js", reveal_theme="white")
    for path in _notebooks(paths):
        nb = nbformat.read(path, as_version=4)
        body, _ = exporter.from_notebook_node(nb)
        dest = out / (path.stem + ".slides.html")
        dest.write_text(body)
        written.append(dest)
        if not quiet:
            print(f"slides: {dest}")
    _index(out, [(p, p.stem + ".slides.html") for p in _notebooks(paths)],
           "Claim Lab — slide decks", "Arrow keys move; press S for the speaker's notes window.")
    return written


# -- book -----------------------------------------------------------------------------------
def book(paths: list[str] | None = None, out: Path = ROOT / "build" / "book", execute: bool = True,
         quiet: bool = False) -> list[Path]:
    needs_slides_extra("book")
    import nbformat
    from nbconvert import HTMLExporter
    from tqdm.auto import tqdm


    notebooks = _notebooks(paths)   # every input checked before anything is written
    out.mkdir(parents=True, exist_ok=True)
    exporter = HTMLExporter(template_name="claimlab_book", extra_template_basedirs=[str(TEMPLATES)])
    written = []
    # The kernels get their own lab schemas (LABKIT_USER), so building the handouts never
    # resets the schemas of the notebooks you have open.
    bar = tqdm(notebooks, desc="book", unit="notebook", disable=quiet)
    with lab_user(f"{current_user_tag()}_book"):
        for path in bar:
            bar.set_postfix_str(path.stem)
            nb = nbformat.read(path, as_version=4)
            if execute:
                from nbclient import NotebookClient

                NotebookClient(nb, timeout=600, kernel_name="python3",
                               resources={"metadata": {"path": str(path.parent)}}).execute()
                clean(nb)
            body, _ = exporter.from_notebook_node(nb)
            dest = out / (path.stem + ".html")
            dest.write_text(body)
            written.append(dest)
    _index(out, [(p, p.stem + ".html") for p in notebooks], "Claim Lab — handouts",
           "Each page is a notebook run from top to bottom on a real PostgreSQL server.")
    return written


def _index(out: Path, entries: list[tuple[Path, str]], title: str, blurb: str) -> Path:
    rows = []
    total = 0
    for path, href in entries:
        meta = _meta(path)
        minutes = meta.get("minutes", "")
        total += minutes if isinstance(minutes, int) else 0
        rows.append(f"<tr><td><a href=\"{html.escape(href)}\">{html.escape(path.stem)}</a></td>"
                    f"<td>{html.escape(meta.get('title', ''))}</td><td>{minutes} min</td>"
                    f"<td>{html.escape(meta.get('teaches', ''))}</td></tr>")
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em}}
td,th{{padding:4px 10px;text-align:left;vertical-align:top}} tr:nth-child(even){{background:#f4f4f4}}</style>
</head><body><h1>{html.escape(title)}</h1><p>{html.escape(blurb)}</p>
<table><thead><tr><th>notebook</th><th>title</th><th>time</th><th>what it teaches</th></tr></thead>
<tbody>{''.join(rows)}</tbody></table><p>In all: {total} minutes.</p></body></html>
"""
    dest = out / "index.html"
    dest.write_text(page)
    return dest


# -- student copies ------------------------------------------------------------------------------
def is_exercise_notebook(nb: NotebookNode) -> bool:
    return any(ANSWER_RE.search(c.source) for c in nb.cells if c.cell_type == "markdown") or any(
        "solution" in c.metadata.get("tags", []) for c in nb.cells)


def student_copy(nb: NotebookNode, name: str) -> NotebookNode:
    """The notebook without solutions or outputs: hidden answers and cells tagged
    ``solution`` are replaced by placeholders."""
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = ANSWER_RE.sub(ANSWER_PLACEHOLDER.format(name=name), cell.source)
        elif cell.cell_type == "code":
            if "solution" in cell.metadata.get("tags", []):
                cell.source = "# Your answer here\n"
            cell.outputs = []
            cell.execution_count = None
    nb.metadata.setdefault("claimlab", {})["student_copy_of"] = name
    return nb


def student_copies(check: bool = False, quiet: bool = False) -> list[str]:
    """Write student/NN.ipynb for every exercise notebook; with check, write nothing and
    return the copies that are missing or out of date."""
    import nbformat

    stale = []
    expected = set()
    for path in sorted(NOTEBOOKS.glob("[0-9]*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        if not is_exercise_notebook(nb):
            continue
        dest = STUDENT / path.name
        expected.add(dest.name)
        text = nbformat.writes(student_copy(nb, path.name)) + "\n"
        if not dest.exists() or dest.read_text() != text:
            stale.append(dest.name)
            if not check:
                STUDENT.mkdir(exist_ok=True)
                dest.write_text(text)
                if not quiet:
                    print(f"student copy: {dest}")
    if STUDENT.exists():
        for extra in STUDENT.glob("*.ipynb"):
            if extra.name not in expected:
                stale.append(extra.name)
                if not check:
                    extra.unlink()
    return stale


# -- command line -------------------------------------------------------------------------------------
def slides_command(*, notebooks: list[str], out: Path) -> int:
    """``labkit slides [NOTEBOOK ...] [--out DIR]``"""
    slides(notebooks, out)
    print(f"open {out / 'index.html'}")
    return 0


def book_command(*, notebooks: list[str], out: Path, execute: bool) -> int:
    """``labkit book [NOTEBOOK ...] [--out DIR] [--no-execute]``"""
    book(notebooks, out, execute=execute)
    print(f"open {out / 'index.html'}")
    return 0


def student_command(*, check: bool) -> int:
    """``labkit student [--check]``: with ``check``, write nothing and exit 1 if a copy is
    out of date."""
    stale = student_copies(check=check)
    if check and stale:
        print("out of date: " + ", ".join(stale) + " — run `labkit student`", file=sys.stderr)
        return 1
    return 0
