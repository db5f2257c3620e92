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
    guide = presenters_guide()
    for path in _notebooks(paths):
        nb = nbformat.read(path, as_version=4)
        body, _ = exporter.from_notebook_node(deck_notebook(nb, guide.get(path.stem, {})))
        dest = out / (path.stem + ".slides.html")
        dest.write_text(body)
        written.append(dest)
        if not quiet:
            print(f"slides: {dest}")
    _index(out, [(p, p.stem + ".slides.html") for p in _notebooks(paths)],
           "Claim Lab — slide decks", "Arrow keys move; press S for the speaker's notes window.")
    return written


# -- what a deck adds to its notebook: speaker notes, and slides that fit --------------------------
# The deck is made for a 1280×720 canvas (templates/claimlab_slides): these are the CSS's sizes,
# in pixels, used to estimate how tall a cell is so that a slide too full for the canvas continues
# on a slide below it. `labkit slides --check` measures the real thing in Chromium.
SLIDE_BUDGET_PX = 600           # 720 less the slide's padding, less a margin for the estimate
TEXT_PX, TEXT_CHARS = 29, 100   # markdown: a line's height, characters per line
CODE_PX, CODE_CHARS, CODE_MAX_PX = 21, 115, 262   # code input: scrolls beyond CODE_MAX_PX
CODE_FIGURE_MAX_PX = 152                          # ... and beyond this above a figure
OUT_PX, OUT_CHARS, OUT_MAX_PX = 20, 125, 272      # all of a cell's output: the same
IMG_MAX_PX, SLIDE_WIDTH_PX = 422, 1224
TABLE_PX, TABLE_CHARS = 23, 110
HEADING_PX = {1: 66, 2: 54, 3: 46}
DETAILS_RE = re.compile(r"<details>.*?</details>", re.S | re.I)
INTERVIEW_RE = re.compile(r"^> \*\*Say it in an interview\.?\*\*\s*(.*?)(?:\n(?!>)|\Z)", re.S | re.M)
GUIDE_ROW_RE = re.compile(r"^\| \d+ \| (\d\d_[a-z0-9_]+) \| (\d+) \| ([^|]*) \| ([^|]*) \|", re.M)


def presenters_guide(path: Path = NOTEBOOKS / "README.md") -> dict[str, dict]:
    """The running-order table of notebooks/README.md: per notebook, what to run live and what
    to ask the room (empty when the guide has no such table)."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    return {m.group(1): {"minutes": int(m.group(2)), "live": m.group(3).strip(), "ask": m.group(4).strip()}
            for m in GUIDE_ROW_RE.finditer(text)}


def _kind(cell) -> str:
    return cell.metadata.get("slideshow", {}).get("slide_type", "-")


def _note(text: str):
    import nbformat

    cell = nbformat.v4.new_markdown_cell(text)
    cell.metadata["slideshow"] = {"slide_type": "notes"}
    return cell


def _weight(cell) -> int:
    """How much there is to say about a cell, for spreading a notebook's minutes."""
    lines = cell.source.count("\n") + 1
    for out in cell.get("outputs", []):
        data = out.get("data", {})
        lines += 12 if "image/png" in data else str(out.get("text", data.get("text/plain", ""))).count("\n")
    return lines


def spread_minutes(total: int, weights: list[int]) -> list[int]:
    """``total`` minutes over sections in proportion to their weights (largest remainder), at
    least one minute each where there are enough."""
    if not weights:
        return []
    floor = 1 if total >= len(weights) else 0
    rest = total - floor * len(weights)
    share = [rest * w / (sum(weights) or 1) for w in weights]
    minutes = [floor + int(x) for x in share]
    for i in sorted(range(len(share)), key=lambda i: share[i] - int(share[i]), reverse=True)[:total - sum(minutes)]:
        minutes[i] += 1
    return minutes


def _answer_text(block: str) -> str:
    inner = re.sub(r"</?details>|<summary>.*?</summary>", "", block, flags=re.S | re.I)
    return inner.strip()


def speaker_notes(nb: NotebookNode, guide: dict | None = None) -> NotebookNode:
    """A copy of ``nb`` with speaker notes (reveal.js: press S): the minutes for the notebook
    and for each ``## `` section (the notebook's ``claimlab.minutes`` spread over its sections
    by their length), what the presenter's guide says to run live and ask the room, and the
    expected answer after every exercise and interview box."""
    from .nbtools import add_slide_metadata

    nb = copy.deepcopy(nb)
    add_slide_metadata(nb)
    guide = guide or {}
    total = nb.metadata.get("claimlab", {}).get("minutes") or guide.get("minutes") or 0
    starts = [i for i, c in enumerate(nb.cells)
              if c.cell_type == "markdown" and c.source.lstrip().startswith(("# ", "## "))]
    if not starts or starts[0] != 0:
        starts = [0, *starts]
    bounds = [*starts, len(nb.cells)]
    weights = [sum(_weight(c) for c in nb.cells[a:b]) for a, b in zip(bounds, bounds[1:])]
    minutes = dict(zip(starts, spread_minutes(int(total), weights)))
    cells = []
    for i, cell in enumerate(nb.cells):
        cells.append(cell)
        notes = []
        if i == 0 and total:
            plan = " · ".join(f"{m} min" for m in minutes.values())
            notes.append(f"**{total} minutes in all** (sections: {plan}).")
            if guide.get("live"):
                notes.append(f"**Run live:** {guide['live']}")
            if guide.get("ask"):
                notes.append(f"**Ask the room:** {guide['ask']}")
        elif i in minutes and total:
            notes.append(f"**About {minutes[i]} min** for this section (of {total}).")
        if cell.cell_type == "markdown":
            box = INTERVIEW_RE.search(cell.source)
            if box:
                said = re.sub(r"^>\s?", "", box.group(0), flags=re.M).replace("**Say it in an interview.**", "").strip()
                notes.append("**Ask first:** someone says it in their own words, then show the box. "
                             f"**Expected:** {said}")
            answers = [_answer_text(m.group(0)) for m in ANSWER_RE.finditer(cell.source)]
            for answer in answers:
                notes.append(f"**Expected answer:**\n\n{answer}")
        if notes:
            cells.append(_note("\n\n".join(notes)))
    nb.cells = cells
    return nb


def _wrapped(text: str, chars: int) -> int:
    return sum(max(1, -(-len(line) // chars)) for line in text.split("\n"))


def _png_height(b64: str) -> int:
    import base64
    import struct

    head = base64.b64decode(b64[:64])
    width, height = struct.unpack(">II", head[16:24])
    return int(height * min(1.0, SLIDE_WIDTH_PX / max(width, 1)))


def estimated_height(cell) -> int:
    """The cell's height on the slide, in CSS pixels, from its source and outputs."""
    kind = _kind(cell)
    if kind in ("notes", "skip"):
        return 0
    if cell.cell_type == "markdown":
        text = DETAILS_RE.sub("<details>", cell.source)
        px, blank = 8, False
        for line in text.split("\n"):
            level = len(line) - len(line.lstrip("#")) if line.startswith("#") else 0
            if level and line[level:level + 1] == " ":
                px += HEADING_PX.get(level, TEXT_PX)
            elif not line.strip():
                px += 0 if blank else 8
            elif line.lstrip().startswith("|"):     # a table row: its cells wrap
                px += 0 if set(line.strip()) <= set("|-: ") else 6 + TABLE_PX * max(1, -(-len(line) // TABLE_CHARS))
            else:
                px += TEXT_PX * max(1, -(-len(line) // TEXT_CHARS))
            blank = not line.strip()
        return px
    if cell.cell_type != "code":
        return 0
    outputs, figures = 0, 0
    for out in cell.get("outputs", []):
        data = out.get("data", {})
        if out.get("output_type") == "stream":
            outputs += 12 + OUT_PX * _wrapped("".join(out.get("text", "")).rstrip("\n"), OUT_CHARS)
        elif "image/png" in data:
            figures += min(IMG_MAX_PX, _png_height(data["image/png"])) + 10
        elif "text/html" in data:
            outputs += 12 + 31 * "".join(data["text/html"]).count("<tr")
        elif "text/plain" in data:
            outputs += 12 + OUT_PX * _wrapped("".join(data["text/plain"]).rstrip("\n"), OUT_CHARS)
        elif out.get("output_type") == "error":
            outputs += OUT_MAX_PX
    code = 12 + CODE_PX * _wrapped(cell.source.rstrip("\n"), CODE_CHARS)
    if figures:                 # the CSS shows a figure whole, and its code in a smaller box
        return min(CODE_FIGURE_MAX_PX, code) + 10 + outputs + figures
    return min(CODE_MAX_PX, code) + 10 + min(OUT_MAX_PX, outputs) + (6 if outputs else 0)


def _markdown_blocks(source: str) -> list[str]:
    """``source`` cut at blank lines outside code fences, tables and ``<details>``."""
    blocks, current, fenced, details = [], [], False, 0
    for line in source.split("\n"):
        s = line.strip()
        if s.startswith("```"):
            fenced = not fenced
        details += s.count("<details") - s.count("</details>")
        if not s and not fenced and not details and current:
            blocks.append("\n".join(current))
            current = []
        elif s or current:
            current.append(line)
    if current:
        blocks.append("\n".join(current))
    return blocks


def _split_tables(blocks: list[str], budget: int) -> list[str]:
    """Blocks, with a table taller than ``budget`` cut into tables that each repeat its header."""
    import nbformat

    result = []
    for block in blocks:
        lines = block.split("\n")
        is_table = len(lines) > 2 and all(line.lstrip().startswith("|") for line in lines)
        if not is_table or estimated_height(nbformat.v4.new_markdown_cell(block)) <= budget:
            result.append(block)
            continue
        head, rows, current = lines[:2], lines[2:], []
        for row in rows:
            trial = nbformat.v4.new_markdown_cell("\n".join([*head, *current, row]))
            if current and estimated_height(trial) > budget:
                result.append("\n".join([*head, *current]))
                current = []
            current.append(row)
        result.append("\n".join([*head, *current]))
    return result


def _figures_apart(cell) -> list:
    """A code cell with figures, as two cells: the code with its text output, and its figures
    alone (``transient.remove_source``: nbconvert shows no code for it)."""
    figures = [o for o in cell.get("outputs", []) if "image/png" in o.get("data", {})]
    if not figures:
        return [cell]
    text = copy.deepcopy(cell)
    text.outputs = [o for o in cell.outputs if "image/png" not in o.get("data", {})]
    figure = copy.deepcopy(cell)
    figure["id"] = f"{cell.get('id', 'cell')}-figure"
    figure.outputs = figures
    figure.metadata["transient"] = {"remove_source": True}
    figure.metadata["slideshow"] = {"slide_type": "subslide"}
    return [text, figure]


def fit_slides(nb: NotebookNode, budget: int = SLIDE_BUDGET_PX) -> NotebookNode:
    """A copy of ``nb`` in which a slide whose cells would not fit the canvas goes on as a
    slide below it (reveal.js: a vertical subslide), and a markdown cell taller than a slide is
    cut at paragraph breaks."""
    import nbformat

    nb = copy.deepcopy(nb)
    cells = []
    for cell in nb.cells:
        if cell.cell_type == "markdown" and _kind(cell) not in ("notes", "skip") and estimated_height(cell) > budget:
            parts, current = [], []
            for block in _split_tables(_markdown_blocks(cell.source), budget - 120):
                trial = nbformat.v4.new_markdown_cell("\n\n".join([*current, block]))
                if current and estimated_height(trial) > budget:
                    parts.append(current)
                    current = []
                current.append(block)
            parts.append(current)
            for n, blocks in enumerate(parts):
                part = copy.deepcopy(cell)
                part.source = "\n\n".join(blocks)
                if n:
                    part.metadata["slideshow"] = {"slide_type": "subslide"}
                    part["id"] = f"{cell.get('id', 'cell')}-{n}"
                cells.append(part)
        elif cell.cell_type == "code" and estimated_height(cell) > budget:
            cells.extend(_figures_apart(cell))
        else:
            cells.append(cell)
    used = 0
    for cell in cells:
        height = estimated_height(cell)
        if _kind(cell) in ("slide", "subslide"):
            used = height
        elif used and used + height > budget and height:
            cell.metadata["slideshow"] = {"slide_type": "subslide"}
            used = height
        else:
            used += height
    nb.cells = cells
    return nb


def deck_notebook(nb: NotebookNode, guide: dict | None = None) -> NotebookNode:
    """What ``labkit slides`` renders: the notebook with speaker notes, its slides fitted."""
    return fit_slides(speaker_notes(nb, guide))


# -- the decks in a real browser -------------------------------------------------------------------
CHECK_WIDTH, CHECK_HEIGHT = 1280, 720

# Run in the deck: visit every slide through Reveal's API and measure it where it is shown.
_MEASURE_JS = """
(() => {
  Reveal.configure({transition: 'none', backgroundTransition: 'none'});
  const view = Reveal.getComputedSlideSize().height;
  const heading = (s) => { const h = s.querySelector('h1, h2, h3, h4'); return h ? h.textContent.replace(/\\u00b6/g, '').trim() : ''; };
  const found = [];
  let lastHeading = '', n = 0;
  Reveal.getHorizontalSlides().forEach((top, h) => {
    const stack = top.querySelectorAll(':scope > section');
    const count = stack.length || 1;
    for (let v = 0; v < count; v++) {
      Reveal.slide(h, v);
      const s = Reveal.getCurrentSlide();
      n += 1;
      const own = heading(s);
      const fixed = s.style.height;           // the content's own height, not the slide box's
      s.style.height = 'auto';
      const content = Math.max(s.scrollHeight, s.offsetHeight);
      s.style.height = fixed;
      if (own) lastHeading = own;
      found.push({n: n, h: h, v: v, heading: own || (lastHeading ? lastHeading + ' (continued)' : ''),
                  height: content, view: view,
                  notes: !!s.querySelector('aside.notes')});
    }
  });
  Reveal.slide(0, 0);
  return found;
})()
"""


class DeckReport:
    """What ``check_decks`` saw: per deck its slides, and every problem in one line."""

    def __init__(self):
        self.slides: dict[str, list[dict]] = {}
        self.problems: list[str] = []
        self.seconds = 0.0

    def summary(self) -> str:
        total = sum(len(s) for s in self.slides.values())
        tallest = max(((d, s) for d, ss in self.slides.items() for s in ss), key=lambda x: x[1]["height"],
                      default=None)
        line = (f"slides --check: {len(self.slides)} decks, {total} slides at {CHECK_WIDTH}×{CHECK_HEIGHT}, "
                f"{len(self.problems)} problem(s), {self.seconds:.0f} s")
        if tallest:
            d, s = tallest
            line += f"; tallest: {d} slide {s['n']} ({s['height']} of {s['view']} px)"
        return line


def check_decks(decks: list[Path], width: int = CHECK_WIDTH, height: int = CHECK_HEIGHT) -> DeckReport:
    """Open every slide of every deck in headless Chromium at ``width``×``height``; a problem
    for each slide taller than the view (code and output boxes that scroll count at their
    shown size) and for each console error."""
    import time

    from .browser import Browser

    report = DeckReport()
    started = time.monotonic()
    with Browser(width, height) as browser:
        for deck in decks:
            errors, _ = browser.open(deck.resolve().as_uri(), settle_s=0.3)
            ready = browser.evaluate("typeof Reveal !== 'undefined' && Reveal.isReady()")
            if not ready:
                report.problems.append(f"{deck.name}: reveal.js did not start")
                report.slides[deck.name] = []
                continue
            found = browser.evaluate(_MEASURE_JS)
            report.slides[deck.name] = found
            for s in found:
                if s["height"] > s["view"]:
                    report.problems.append(
                        f"{deck.name}: slide {s['n']} (#/{s['h']}/{s['v']}, \"{s['heading'][:60]}\") does not "
                        f"fit: {s['height']} px of content in a {s['view']} px slide")
            for error in errors + [e for e in browser.errors() if e not in errors]:
                report.problems.append(f"{deck.name}: {error}")
    report.seconds = time.monotonic() - started
    return report


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
def slides_command(*, notebooks: list[str], out: Path, check: bool = False) -> int:
    """``labkit slides [NOTEBOOK ...] [--out DIR] [--check]``: with ``check``, open every slide
    of every deck in headless Chromium at 1280×720; exit 1 naming each slide that does not fit
    and each console error, 2 when no Chromium is installed."""
    if check:
        import importlib.util

        from .browser import find_chromium

        if importlib.util.find_spec("websocket") is None:
            raise LabkitError("`labkit slides --check` needs websocket-client, which is not installed.",
                              "pip install 'labkit[slides]' (a checkout: pip install -e '.[slides]').")
        find_chromium()             # no browser: say so (exit 2) before building anything
    decks = slides(notebooks, out, quiet=check)
    if not check:
        print(f"open {out / 'index.html'}")
        return 0
    report = check_decks(decks)
    for line in report.problems:
        print(line, file=sys.stderr)
    print(report.summary())
    return 1 if report.problems else 0


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
