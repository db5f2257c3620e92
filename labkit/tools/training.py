"""Training mode: slide decks, a handout book, and student copies without solutions.

    labkit slides [NOTEBOOK ...] [--out build/slides]
    labkit book   [NOTEBOOK ...] [--out build/book] [--execute]
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
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nbformat import NotebookNode

from ..core.db import current_user_tag, lab_user
from ..core.errors import LabkitError
from ..core.sandbox import read_input
from .nbtools import NOTEBOOKS, clean, jupyter_text

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
    spec = resources.files("sphinx_revealjs") / "_static" / "revealjs"
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
# in pixels, used to estimate how tall a cell is so that what does not fit goes on in a slide
# below it. `labkit slides --check` measures the real thing in Chromium.
SLIDE_BUDGET_PX = 650           # 720 less the slide's padding (36), less a margin for the estimate
TEXT_PX, TEXT_CHARS = 29, 100   # markdown: a line's height (22 px × 1.3), characters per line
PARA_PX, CELL_PX = 8, 4         # a paragraph's margin below it; a cell's padding
LINE_PX, LINE_CHARS = 26, 100   # code and output: 20 px monospace on a 1224 px slide
BOX_PX = 11                     # a code or output box's own padding and gap
IMG_MAX_PX, SLIDE_WIDTH_PX = 664, 1224
TABLE_PX, TABLE_CHARS = 29, 100
HEADING_PX = {1: 92, 2: 72, 3: 59}   # h1, h2, h3 with their margins
QUOTE_PX = 20                   # a blockquote's margin and padding
MIN_PIECE_LINES = 5             # no piece of a cut cell is shorter than this
MIN_CUT_OUTPUT = 8              # an output shorter than this is never cut
PREDICT_RE = re.compile(r"\bPredict\b|\bWhat do you expect\b", re.I)
NEXT_ASK_NOTE = "**Next:** ask the room to say it in their own words before you move on."
DETAILS_RE = re.compile(r"<details>.*?</details>", re.S | re.I)
INTERVIEW_RE = re.compile(r"^> \*\*Say it in an interview\.?\*\*\s*(.*?)(?:\n(?!>)|\Z)", re.S | re.M)
GUIDE_ROW_RE = re.compile(r"^\| \d+ \| (\d\d_[a-z0-9_]+) \| (\d+) \| ([^|]*) \| ([^|]*) \|", re.M)
NBVAL_RE = re.compile(r"^[ \t]*# NBVAL_\w+[^\n]*(?:\n|\Z)", re.M)
SETUP_LINE_RE = re.compile(r"\s*(?:import \S.*|from \S+ import \S.*|\w+ = lk\.setup\(.*\)|#.*)?\s*")
SERVER_LINE_RE = re.compile(r"\S+ [\d.]+\S* · ")
COLUMNS_RE = re.compile(r"\S {2,}\S|│")
ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
RULE_RE = re.compile(r"[\s=\-─━]{3,}")
HEADING_ONLY_RE = re.compile(r"#{1,4} [^\n]*")
LIST_ITEM_RE = re.compile(r" {0,3}(?:[*-]|\d+\.) ")


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


def _section_minutes(nb: NotebookNode, total: int) -> dict[int, int]:
    """The index of the cell that starts each ``# ``/``## `` section (and 0) -> its minutes,
    ``total`` spread over the sections by their length."""
    starts = [i for i, c in enumerate(nb.cells)
              if c.cell_type == "markdown" and c.source.lstrip().startswith(("# ", "## "))]
    if not starts or starts[0] != 0:
        starts = [0, *starts]
    bounds = [*starts, len(nb.cells)]
    weights = [sum(_weight(c) for c in nb.cells[a:b]) for a, b in zip(bounds, bounds[1:])]
    return dict(zip(starts, spread_minutes(total, weights)))


def _timing_notes(i: int, total, minutes: dict[int, int], guide: dict) -> list[str]:
    """The notes on cell ``i``'s timing: the whole plan (and what to run live and ask) on the
    first cell, a section's minutes on its first cell."""
    if i == 0:
        plan = " · ".join(f"{m} min" for m in minutes.values())
        notes = [f"**{total} minutes in all** (sections: {plan})."]
        if guide.get("live"):
            notes.append(f"**Run live:** {guide['live']}")
        if guide.get("ask"):
            notes.append(f"**Ask the room:** {guide['ask']}")
        return notes
    return [f"**About {minutes[i]} min** for this section (of {total})."] if i in minutes else []


def _expected_notes(cell) -> list[str]:
    """The expected answers of a markdown cell's interview box and exercises; the exercises'
    answers leave the slide for the notes (opening one would spill past the slide)."""
    notes = []
    box = INTERVIEW_RE.search(cell.source)
    if box:
        said = re.sub(r"^>\s?", "", box.group(0), flags=re.M).replace("**Say it in an interview.**", "").strip()
        notes.append("**Ask first:** someone says it in their own words, then show the box. "
                     f"**Expected:** {said}")
    answers = [_answer_text(m.group(0)) for m in ANSWER_RE.finditer(cell.source)]
    for answer in answers:
        notes.append(f"**Expected answer:**\n\n{answer}")
    if answers:
        cell.source = ANSWER_RE.sub("*(The answer is in the speaker notes: ask the room first.)*", cell.source)
    return notes


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
    minutes = _section_minutes(nb, int(total))
    cells = []
    for i, cell in enumerate(nb.cells):
        cells.append(cell)
        notes = _timing_notes(i, total, minutes, guide) if total else []
        if cell.cell_type == "markdown":
            notes += _expected_notes(cell)
        if notes:
            cells.append(_note("\n\n".join(notes)))
            if (i == 0 or i in minutes) and total:    # the timing: on the section's first slide
                cells[-1].metadata["claimlab"] = {"note": "first slide"}
    nb.cells = cells
    return nb



# -- the deck's copy of a cell: what it leaves out, and what the presenter points at --------------
def deck_source(source: str) -> str:
    """Code as its slide shows it: without ``# NBVAL_*`` marker lines, its lines broken to fit
    the slide where Python allows (``deck_code``)."""
    return deck_code(NBVAL_RE.sub("", source).strip("\n"))


def is_setup_cell(cell) -> bool:
    """``import labkit as lk`` / ``lab = lk.setup(...)``: imports and the setup call only, with
    nothing but the server line(s) as output."""
    if cell.cell_type != "code" or "lk.setup(" not in cell.source:
        return False
    outputs = cell.get("outputs", [])
    lines = "".join("".join(o.get("text", "")) for o in outputs).splitlines()
    return (all(SETUP_LINE_RE.fullmatch(line) for line in cell.source.split("\n"))
            and all(o.get("output_type") == "stream" for o in outputs)
            and all(SERVER_LINE_RE.match(line) for line in lines))


def _parse(source: str):
    import ast

    try:
        return ast.parse(source)
    except SyntaxError:
        return None


def _comments(source: str) -> dict[int, str]:
    """Line number (from 1) -> the text of the comment on that line."""
    import io
    import tokenize

    found = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                found[tok.start[0]] = tok.string.lstrip("#").strip()
    except (tokenize.TokenError, SyntaxError):
        pass
    return found


def is_assert_only(cell) -> bool:
    """A cell of asserts (and comments) without output: it checks, and shows nothing."""
    import ast

    tree = _parse(deck_source(cell.source)) if cell.cell_type == "code" else None
    return (tree is not None and not cell.get("outputs") and bool(tree.body)
            and all(isinstance(s, ast.Assert) for s in tree.body))


def _short(text: str, chars: int) -> str:
    """``text`` within ``chars``: cut after its last whole sentence that fits, else after its
    last whole word (with "…"), never inside a word."""
    if len(text) <= chars:
        return text
    sentences = [m.end() for m in re.finditer(r"[.!?](?=\s)", text[:chars])]
    if sentences and sentences[-1] > chars // 2:
        return text[:sentences[-1]]
    cut = text[:chars].rfind(" ")
    return (text[:cut] if cut > 0 else text[:chars]).rstrip(" ,;:—-") + "…"


def assert_checks(source: str) -> list[str]:
    """What a cell's asserts check, one item each: the comment on the assert's line or its
    message, else its condition quoted."""
    import ast

    source = deck_source(source)
    tree = _parse(source)
    if tree is None:
        return []
    comments = _comments(source)
    checks = []
    for node in sorted((n for n in ast.walk(tree) if isinstance(n, ast.Assert)), key=lambda n: n.lineno):
        said = comments.get(node.end_lineno or node.lineno) or comments.get(node.lineno)
        if not said and isinstance(node.msg, ast.Constant) and isinstance(node.msg.value, str):
            said = node.msg.value
        condition = ast.get_source_segment(source, node.test) or ast.unparse(node.test)
        checks.append(said or f"`{_short(' '.join(condition.split()), 90)}`")
    return list(dict.fromkeys(checks))


def _plain(markdown: str) -> str:
    """Markdown as one line of plain words: no emphasis, links, HTML or headings."""
    text = DETAILS_RE.sub("", markdown)
    text = re.sub(r"<[^>]+>|^\s*#{1,6} .*$", "", text, flags=re.M)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"^\s*(?:>|[-*]|\d+\.)\s+", "", text, flags=re.M)
    return " ".join(re.sub(r"\*\*?|__", "", text).split())


def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z`(\"“])", text) if s.strip()]


def key_sentence(markdown: str) -> str:
    """A markdown cell's key sentence: the one holding its first bold phrase, else its first
    (with the next one when it is only a few words, such as "Exercise 1.")."""
    sentences = _sentences(_plain(markdown))
    if not sentences:
        return ""
    bold = re.search(r"\*\*(.+?)\*\*", DETAILS_RE.sub("", markdown))
    mark = _plain(bold.group(1)) if bold else ""
    i = next((i for i, s in enumerate(sentences) if mark and mark in s), 0)
    return _short(" ".join(sentences[i:i + (2 if len(sentences[i]) < 40 else 1)]), 220)


def last_sentence(markdown: str) -> str:
    sentences = _sentences(_plain(markdown))
    return _short(sentences[-1], 220) if sentences else ""


def _is_definition(node) -> bool:
    """A ``def``, ``async def`` or ``class`` statement."""
    import ast

    return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))


def _names_defined(node) -> list[str]:
    """The names a top-level statement defines, quoted: a function or class (with the first
    sentence of its docstring), or the targets of an assignment."""
    import ast

    defined = []
    if _is_definition(node):
        doc = ast.get_docstring(node)
        defined.append(f"`{node.name}`" + (f" ({_short(_sentences(' '.join(doc.split()))[0], 90)})" if doc else ""))
    for target in getattr(node, "targets", []) + [t for t in [getattr(node, "target", None)] if t]:
        defined += [f"`{n.id}`" for n in ast.walk(target) if isinstance(n, ast.Name) and n.id != "_"]
    return defined


def code_note(lines: list[str], header: Sequence[str] = ()) -> str:
    """What to point at in code: its comment header, else its first comment, else what its
    statements do (the names they define, the calls they make)."""
    import ast

    said = " ".join(line.lstrip("# ").strip() for line in header).strip()
    if said:
        return said
    comments = _comments("\n".join(lines))
    if comments:
        first = comments[min(comments)]
        first = first[:1].upper() + first[1:]
        return first if first.endswith((".", "!", "?", ":")) else first + "."
    tree = _parse(deck_source("\n".join(lines)).strip("\n"))
    if tree is None or not tree.body:
        return ""
    defined, calls = [], []
    for node in tree.body:
        defined += _names_defined(node)
        if not _is_definition(node):
            calls += [ast.unparse(n.func) for n in ast.walk(node) if isinstance(n, ast.Call)]
    calls = [f"`{c}`" for c in dict.fromkeys(calls) if len(c) <= 40][:3]
    parts = ([f"defines {', '.join(list(dict.fromkeys(defined))[:3])}"] if defined else []) + \
            ([f"calls {', '.join(calls)}"] if calls else [])
    said = " and ".join(parts) + "." if parts else ""
    return said[:1].upper() + said[1:]


TRANSCRIPT_POINT_RE = re.compile(r"wait|block|error|fail|timeout|skip", re.I)


def transcript_rows(lines: list[str]) -> tuple[list[str], list[tuple[str, dict[str, str]]]]:
    """A transcript's column names and its rows: (row label, column -> text), a row's
    wrapped lines joined."""
    head = output_header(lines)
    if not head:
        return [], []
    spans = [m.start() for m in re.finditer(r"\S+", head[-1])]
    bounds = list(zip(spans, [*spans[1:], None]))

    def cells(line: str) -> list[str]:
        return [line[a:b].strip() for a, b in bounds]
    names = [" ".join(x for x in col if x) for col in zip(*(cells(line) for line in head[:-1]))]
    rows: list[tuple[str, dict[str, str]]] = []
    for line in lines[len(head):]:
        if not line.strip():
            continue
        found = cells(line)
        if line[:1] not in (" ", "\t") or not rows:
            rows.append((found[0], dict(zip(names[1:], found[1:]))))
        else:
            for name, text in zip(names[1:], found[1:]):
                rows[-1][1][name] = " ".join(x for x in (rows[-1][1].get(name, ""), text) if x)
    return names, rows


def transcript_note(lines: list[str], first: bool = True) -> str:
    """For a transcript: the rows a continuation shows, and the first row to point at (one
    that waits, blocks or errors: its session and what the transcript says there)."""
    names, rows = transcript_rows(lines)
    if not rows:
        return ""
    said = [] if first else [f"Continued: rows {rows[0][0]}–{rows[-1][0]} of the transcript."]
    for label, row in rows:
        texts = [(name, text) for name, text in row.items() if text]
        if any(TRANSCRIPT_POINT_RE.search(text) for _, text in texts):
            who = next((name for name, _ in texts), "")
            what = "; ".join(text for _, text in texts[1:] if not re.fullmatch(r"[A-Z]:[\d,]+", text)) \
                or texts[0][1]
            action = texts[0][1] if texts[0][1] != what else ""
            said.append(f"Point at row {label}: {who} {action}".rstrip() + f" — {_short(what, 80)}.")
            break
    return " ".join(said)


def output_note(checks: list[str], intro: str, code: str, lines: Sequence[str] = (), first: bool = True) -> str:
    """What to point at in output: the row of a transcript that waits or errors, what the cell
    checks in it, what its introduction says, else its first line."""
    said = [transcript_note(list(lines), first)] if lines else []
    if not first and not said[0]:
        said = [f"Continued: the output goes on with `{_short(_first_line(lines), 60)}`."]
    if first:
        said.append(_first_output_note(checks, intro, code, lines, any(said)))
    return " ".join(s for s in said if s)


def _first_line(lines: Sequence[str]) -> str:
    """The first line of output that is not blank, stripped ("" when there is none)."""
    return next((x.strip() for x in lines if x.strip()), "")


def _intro_points(intro: str) -> bool:
    """An introduction worth pointing at under the output: a sentence of more than four words
    that neither asks to predict, says to run, nor leads into what follows (a colon)."""
    return (bool(intro) and len(intro.split()) > 4 and not PREDICT_RE.search(intro)
            and not re.match(r"(?:Then )?run\b", intro, re.I) and not intro.endswith(":"))


def _first_output_note(checks: list[str], intro: str, code: str, lines: Sequence[str], said: bool) -> str:
    """What to point at in the first piece of output, after what its transcript says (``said``):
    what the cell checks, else its introduction, its first line or what its code does."""
    if checks:
        return "Point at what the cell checks: " + "; ".join(checks) + "."
    if said:
        return ""
    if _intro_points(intro):
        return f"Point at: {intro}"
    if lines:
        return f"The output opens with `{_short(_first_line(lines), 70)}`."
    return code_note(code.split("\n")) if code else ""


# -- cutting a cell into pieces that fit, and packing them into slides ----------------------------
def _markdown_px(text: str) -> int:
    """The height of markdown on a slide: its paragraphs' lines joined and wrapped as the
    browser does (at ``TEXT_CHARS``), headings, table rows and blockquotes at their CSS sizes."""
    text = DETAILS_RE.sub("<details>", text)
    px, para, quoted, fenced = CELL_PX, 0, False, False

    def end_paragraph() -> int:
        return TEXT_PX * -(-para // TEXT_CHARS) + PARA_PX if para else 0
    for line in text.split("\n"):
        level = len(line) - len(line.lstrip("#")) if line.startswith("#") else 0
        quote = line.startswith(">")
        body = line.lstrip("> ").strip() if quote else line.strip()
        if quote and not quoted:
            px += QUOTE_PX
        quoted = quote
        if line.strip().startswith("```"):
            px, para, fenced = px + end_paragraph(), 0, not fenced
            px += PARA_PX if fenced else 0
        elif fenced:
            px += LINE_PX
        elif level and line[level:level + 1] == " ":
            px, para = px + end_paragraph() + HEADING_PX.get(level, TEXT_PX), 0
        elif not body:
            px, para = px + end_paragraph(), 0
        elif body.startswith("|"):              # a table row: its cells wrap
            px, para = px + end_paragraph(), 0
            px += 0 if set(body) <= set("|-: ") else 6 + TABLE_PX * max(1, -(-len(body) // TABLE_CHARS))
        elif LIST_ITEM_RE.match(line) or body.startswith("<"):
            px, para = px + end_paragraph(), len(body)
        else:
            para += len(body) + (1 if para else 0)
    return px + end_paragraph()


def _lines_px(lines: list[str]) -> int:
    return LINE_PX * sum(max(1, -(-len(line) // LINE_CHARS)) for line in lines)


def _png_size(b64: str) -> tuple[int, int]:
    import base64
    import struct

    return struct.unpack(">II", base64.b64decode(b64[:64])[16:24])


def estimated_height(cell) -> int:
    """The cell's height on the slide, in CSS pixels, from its source and outputs."""
    if _kind(cell) in ("notes", "skip"):
        return 0
    if cell.cell_type == "markdown":
        return _markdown_px(cell.source)
    if cell.cell_type != "code":
        return 0
    atoms = _code_atoms(cell, SLIDE_BUDGET_PX)
    boxes = len({a["box"] for a in atoms})
    return sum(a["px"] for a in atoms) + BOX_PX * boxes


def _ranges(n: int, levels: list[set[int]], most: int) -> list[tuple[int, int]]:
    """Lines 0..n as [a, b) ranges: cut at every point of the first level, and a range longer
    than ``most`` lines again at the next level's points, down to single lines."""
    def cut(a: int, b: int, level: int) -> list[tuple[int, int]]:
        if level == len(levels):
            return [(i, i + 1) for i in range(a, b)]
        points = [a, *sorted(p for p in levels[level] if a < p < b), b]
        return [r for x, y in zip(points, points[1:]) for r in ([(x, y)] if y - x <= most else cut(x, y, level + 1))]
    return cut(0, n, 0)


def _code_cuts(lines: list[str]) -> list[set[int]]:
    """Where code may be cut, coarse to fine: blank lines before a statement, statements, any
    statement inside a block (indices of the line a piece starts at; comments go with the code
    under them)."""
    import ast

    tree = _parse("\n".join(lines))
    if tree is None:
        return [{i for i, line in enumerate(lines) if i and not lines[i - 1].strip()}]

    def start(node) -> int:
        i = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))]) - 1
        while i and lines[i - 1].lstrip().startswith("#"):
            i -= 1
        return i
    top = {start(n) for n in tree.body}
    inner = {start(n) for n in ast.walk(tree) if isinstance(n, ast.stmt)}
    return [{i for i in top if i and not lines[i - 1].strip()}, top, inner]


def deck_output_lines(text: str, chars: int = LINE_CHARS) -> list[str]:
    """Output text as the deck shows it: a line longer than ``chars`` that reads as prose (no
    columns: no run of two spaces inside it, no │) re-wrapped at word boundaries, with its
    indent (and a ``--`` or ``#`` comment mark) on every part."""
    import textwrap

    lines = []
    for line in ANSI_RE.sub("", text).rstrip("\n").split("\n"):
        line = line.rstrip()
        body = line.lstrip()
        if len(line) > chars and RULE_RE.fullmatch(line) and " " not in body:
            line = line[:chars]                 # a rule under a title: as wide as the slide
        if len(line) <= chars or COLUMNS_RE.search(body):
            lines.append(line)
            continue
        indent = line[:len(line) - len(body)]
        mark = re.match(r"(?:--|#) ", body)
        follow = indent + (mark.group(0) if mark else "    ")
        lines += textwrap.wrap(body, chars, initial_indent=indent, subsequent_indent=follow,
                               break_long_words=False, break_on_hyphens=False)
    return lines


def _break_points(source: str) -> tuple[dict[int, list[tuple[int, int]]], dict[int, int],
                                        dict[int, list[tuple[int, int, int]]]]:
    """Per line (from 1), where it may break inside brackets: the column after a comma, or
    before ``and``/``or``/``for``/``if``/``else`` or ``+`` and comparisons, with the column its
    rest lines up under; the column its comment starts at; and its one-line string literals."""
    import io
    import tokenize

    points: dict[int, list[tuple[int, int]]] = {}
    comments: dict[int, int] = {}
    strings: dict[int, list[tuple[int, int, int]]] = {}
    opened: list[int] = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                comments[tok.start[0]] = tok.start[1]
            elif tok.type == tokenize.STRING and opened and tok.start[0] == tok.end[0]:
                strings.setdefault(tok.start[0], []).append((tok.start[1], tok.end[1], opened[-1]))
            elif tok.type == tokenize.OP and tok.string in "([{":
                opened.append(tok.end[1])
            elif tok.type == tokenize.OP and tok.string in ")]}" and opened:
                opened.pop()
            elif opened and tok.type == tokenize.OP and tok.string == ",":
                points.setdefault(tok.end[0], []).append((tok.end[1], opened[-1]))
            elif opened and (tok.type == tokenize.NAME and tok.string in ("and", "or", "for", "if", "else")
                             or tok.type == tokenize.OP and tok.string in ("+", "==", "<", "<=", ">", ">=")):
                points.setdefault(tok.start[0], []).append((tok.start[1], opened[-1]))
    except (tokenize.TokenError, SyntaxError):
        return {}, {}, {}
    return points, comments, strings


def _split_string(line: str, chars: int, strings: list[tuple[int, int, int]]) -> list[str]:
    """``line`` as two lines, a string literal in brackets that crosses ``chars`` cut in two
    at a space (outside an f-string's braces), or [] when there is no such place."""
    for start, end, _ in strings:
        text = line[start:end]
        letters = re.match(r"[A-Za-z]*", text)         # a string's prefix: f, rb, ...
        prefix = letters.group(0) if letters else ""
        quote = text[len(prefix)]
        if start + len(prefix) + 12 >= chars or text[len(prefix):len(prefix) + 3] == quote * 3:
            continue
        depth, best = 0, None
        for i in range(start + len(prefix) + 1, min(end - 1, chars - 1)):
            depth += {"{": 1, "}": -1}.get(line[i], 0) if "f" in prefix.lower() else 0
            if line[i] == " " and depth == 0 and line[i - 1] != "\\" and i > start + len(prefix) + 10:
                best = i + 1
        if best:
            rest, align = prefix + quote + line[best:], start      # lined up under the string
            if align + len(rest) > chars:
                align = len(line) - len(line.lstrip()) + 4
            return [line[:best] + quote, " " * align + rest]
    return []


def deck_code(source: str, chars: int = LINE_CHARS) -> str:
    """Code as the deck shows it, every line within ``chars`` where Python allows: a comment
    that makes a line too long goes on its own line above it, and a line too long is broken
    inside its brackets (after a comma, before ``and``/``or``/``for``/``if`` or an operator,
    or in a string literal, which Python joins again), an ``assert``, ``return`` or assignment
    put in brackets to be broken so. Nothing else changes: each step must leave the code
    parsing to the same statements, or it is not taken."""
    import ast
    import textwrap

    tree = _parse(source)
    if tree is None:
        return source
    same = ast.dump(tree)
    stuck: set[str] = set()
    for _ in range(300):
        lines = source.split("\n")
        points, comments, strings = _break_points(source)
        for n, line in enumerate(lines, 1):
            if len(line) <= chars or line in stuck:
                continue
            indent = line[:len(line) - len(line.lstrip())]
            fits = [(col, align) for col, align in points.get(n, []) if len(indent) + 8 < col <= chars]
            split = _split_string(line, chars, strings.get(n, []))
            wrap = re.match(r"(\s*(?:assert |return |[\w.]+(?:, [\w.]+)* = ))(?![(\[{]).*\S", line)
            if n in comments:
                code, comment = line[:comments[n]].rstrip(), line[comments[n]:].lstrip("# ")
                above = textwrap.wrap(comment, chars - len(indent) - 2, initial_indent=indent + "# ",
                                      subsequent_indent=indent + "# ", break_long_words=False)
                lines[n - 1:n] = [*above, code] if code.strip() else above
            elif fits:
                col, align = max(fits)
                rest = line[col:].lstrip()
                align = align if align + len(rest) <= chars else len(indent) + 4
                lines[n - 1:n] = [line[:col].rstrip(), " " * align + rest]
            elif split:
                lines[n - 1:n] = split
            elif wrap and n not in points:
                lines[n - 1] = f"{wrap.group(1)}({line[len(wrap.group(1)):]})"
            else:
                stuck.add(line)
                continue
            candidate = "\n".join(lines)
            if _parse(candidate) is None or ast.dump(_parse(candidate)) != same:
                stuck.add(line)
                continue
            source = candidate
            break
        else:
            return source
    return source


def _output_text(out) -> str | None:
    """An output's text when it is shown as preformatted text, else None (a figure, a table)."""
    data = out.get("data", {})
    if out.get("output_type") == "stream":
        return "".join(out.get("text", ""))
    if out.get("output_type") == "error":
        return "\n".join(out.get("traceback", []))
    if not ({"image/png", "text/html", "image/svg+xml"} & set(data)) and "text/plain" in data:
        return "".join(data["text/plain"])
    return None


def _code_atoms(cell, budget: int, header: int = 0) -> list[dict]:
    """A code cell as pieces that may go on different slides: groups of code lines (from line
    ``header`` on), groups of output lines (rows kept whole: a line that starts with a space
    goes with the line above it), and figures and tables whole. ``box`` names the box a piece
    is shown in."""
    most = max(1, (budget - 2 * BOX_PX - HEADING_PX[2]) // LINE_PX)
    lines = deck_source(cell.source).split("\n")[header:]
    atoms = [{"box": "code", "lines": lines[a:b], "px": _lines_px(lines[a:b])}
             for a, b in (_ranges(len(lines), _code_cuts(lines), most) if "".join(lines).strip() else [])]
    for k, out in enumerate(cell.get("outputs", [])):
        text = _output_text(out)
        data = out.get("data", {})
        if text is None:
            if "image/png" in data:
                width, height = _png_size(data["image/png"])
                px = min(IMG_MAX_PX, int(height * min(1.0, SLIDE_WIDTH_PX / max(width, 1))))
            else:
                px = 12 + 33 * "".join(data.get("text/html", "")).count("<tr")
            atoms.append({"box": k, "out": out, "px": px})
            continue
        shown = deck_output_lines(text)
        head = output_header(shown)
        rows = {i for i, line in enumerate(shown) if i > len(head) and line[:1] not in (" ", "\t")}
        whole = len(shown) < MIN_CUT_OUTPUT or (head and len(shown) <= most)
        pieces = _ranges(len(shown), [rows], most - len(head))
        for a, b in [(0, len(shown))] if whole else _balanced(pieces, most - len(head)) if head else pieces:
            atoms.append({"box": k, "out": out, "lines": shown[a:b], "hdr": head, "first": a == 0,
                          "whole": whole or bool(head), "px": _lines_px(shown[a:b])})
    return atoms


def output_header(lines: list[str]) -> list[str]:
    """The header of a table or transcript in output: its first lines (one to three, none
    blank) down to the dashed or double rule under them; [] when there is none."""
    for i, line in enumerate(lines[1:4], 1):
        if line.strip() and RULE_RE.fullmatch(line) and len(lines) > i + 1:
            return lines[:i + 1] if all(x.strip() for x in lines[:i]) else []
    return []


def _balanced(ranges: list[tuple[int, int]], most: int) -> list[tuple[int, int]]:
    """Consecutive ``ranges`` of lines joined into as few pieces of at most ``most`` lines as
    they need, each about as long as the others."""
    total = ranges[-1][1] - ranges[0][0] if ranges else 0
    target = -(-total // max(1, -(-total // max(1, most))))
    while True:
        pieces: list[list[int]] = []
        for a, b in ranges:
            if pieces and b - pieces[-1][0] <= target:
                pieces[-1][1] = b
            else:
                pieces.append([a, b])
        if target >= most or len(pieces) <= -(-total // max(1, most)):
            return [(a, b) for a, b in pieces]
        target += 1


def _markdown_atoms(cell, budget: int) -> list[dict]:
    blocks = _split_lists(_split_tables(_markdown_blocks(cell.source), budget - 120), budget - 120)
    return [{"box": "md", "text": block, "px": _markdown_px(block)} for block in blocks]


def _markdown_blocks(source: str) -> list[str]:
    """``source`` cut at blank lines outside code fences, tables and ``<details>``."""
    blocks: list[str] = []
    current: list[str] = []
    fenced, details = False, 0
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
    result = []
    for block in blocks:
        lines = block.split("\n")
        is_table = len(lines) > 2 and all(line.lstrip().startswith("|") for line in lines)
        if not is_table or _markdown_px(block) <= budget:
            result.append(block)
            continue
        head = lines[:2]
        current: list[str] = []
        for row in lines[2:]:
            if current and _markdown_px("\n".join([*head, *current, row])) > budget:
                result.append("\n".join([*head, *current]))
                current = []
            current.append(row)
        result.append("\n".join([*head, *current]))
    return result


def _split_lists(blocks: list[str], budget: int) -> list[str]:
    """Blocks, with a list taller than ``budget`` cut between its items."""
    result = []
    for block in blocks:
        lines = block.split("\n")
        items = [i for i, line in enumerate(lines) if LIST_ITEM_RE.match(line)]
        if _markdown_px(block) <= budget or not items or items[0] != 0:
            result.append(block)
            continue
        current: list[str] = []
        for a, b in zip(items, [*items[1:], len(lines)]):
            if current and _markdown_px("\n".join([*current, *lines[a:b]])) > budget:
                result.append("\n".join(current))
                current = []
            current += lines[a:b]
        result.append("\n".join(current))
    return result


def _opens(part: list[dict], atom: dict) -> int:
    """What an atom adds to a part besides its own lines: a new box's padding, and the header
    of an output that goes on from the slide before."""
    if part and part[-1]["box"] == atom["box"]:
        return 0
    return BOX_PX + (0 if atom.get("first", True) else _lines_px(atom.get("hdr", [])))


def _part_px(part: list[dict]) -> int:
    return sum(a["px"] + _opens(part[:k], a) for k, a in enumerate(part))


def _part_cell(cell, atoms: list[dict], n: int, starts: bool):
    """One slide's share of ``cell``: the atoms' markdown, or code and outputs (an output that
    goes on from the slide before repeats its header)."""
    part = copy.deepcopy(cell)
    if cell.cell_type == "markdown":
        part.source = "\n\n".join(a["text"] for a in atoms)
    else:
        part.source = "\n".join(line for a in atoms if a["box"] == "code" for line in a["lines"])
        groups: list[list[dict]] = []
        for a in atoms:
            if a["box"] != "code":
                if groups and groups[-1][0]["box"] == a["box"]:
                    groups[-1].append(a)
                else:
                    groups.append([a])
        part.outputs = [g[0]["out"] if "lines" not in g[0] else
                        _text_output(g[0]["out"], ([] if g[0]["first"] else g[0].get("hdr", []))
                                     + [line for a in g for line in a["lines"]]) for g in groups]
        if not part.source.strip():
            part.metadata["transient"] = {"remove_source": True}
    if starts and _kind(cell) != "slide":
        part.metadata["slideshow"] = {"slide_type": "subslide"}
    if n:
        part["id"] = f"{cell.get('id', 'cell')}-{n}"
    return part


def _text_output(out, lines: list[str]):
    """``out`` showing ``lines`` as its text."""
    import nbformat

    text = "\n".join(lines) + "\n"
    if out.get("output_type") == "stream":
        return nbformat.v4.new_output("stream", name=out.get("name", "stdout"), text=text)
    return nbformat.v4.new_output("display_data", data={"text/plain": text})


def _is_heading_only(cell) -> bool:
    return cell.cell_type == "markdown" and bool(HEADING_ONLY_RE.fullmatch(cell.source.strip()))


def deck_cells(nb: NotebookNode) -> NotebookNode:
    """A copy of ``nb`` as the deck shows it: setup cells and cells of asserts without output
    left out (their asserts become a note on the slide before: "The cell under this asserts:
    ..."), ``# NBVAL_*`` lines taken out of the code, and a heading alone on its slide joined to
    the slide after it."""
    from .nbtools import add_slide_metadata

    nb = copy.deepcopy(nb)
    add_slide_metadata(nb)
    cells = []
    for cell in nb.cells:
        if cell.cell_type == "code" and _kind(cell) != "skip" and (is_setup_cell(cell) or is_assert_only(cell)):
            if is_assert_only(cell):
                cells.append(_note("The cell under this asserts: " + "; ".join(assert_checks(cell.source)) + "."))
            cell.metadata.setdefault("slideshow", {})["slide_type"] = "skip"
        elif cell.cell_type == "code":
            cell.source = deck_source(cell.source)
        cells.append(cell)
    shown = [c for c in cells if _kind(c) not in ("notes", "skip")]
    for cell, after in zip(shown, shown[1:]):
        if _is_heading_only(cell) and _kind(after) == "subslide":
            after.metadata["slideshow"] = {"slide_type": "-"}
    nb.cells = cells
    return nb


def _part_note(cell, part: list[dict], n: int, header: int, checks: list[str], intro: str,
               on_slide: list[str]) -> str:
    """The note for piece ``n`` (from 0) of ``cell``, made of the atoms ``part``: what to point
    at in it.  ``header``: the lines of the cell's comment header; ``checks``: what its asserts
    check; ``intro``: the introduction to it; ``on_slide``: the notes of its slide so far."""
    if cell.cell_type == "markdown":
        return key_sentence("\n\n".join(a["text"] for a in part))
    code = [line for a in part if a["box"] == "code" for line in a["lines"]]
    shown = [a for a in part if a["box"] != "code"]
    said = [code_note(code, cell.source.split("\n")[:header] if n == 0 else []) if code else ""]
    here = " ".join([*on_slide, said[0]])
    told = "" if intro and intro in here else intro     # said on this slide already
    said.append(_shown_note(cell, shown, header, checks, told, bool(code)) if shown else "")
    if n and code and not said[0]:
        said[0] = f"Continued: the code goes on with `{_short(code[0].strip(), 60)}`."
    return " ".join(s for s in said if s)


def _shown_note(cell, shown: list[dict], header: int, checks: list[str], intro: str, code: bool) -> str:
    """What to point at in the output atoms ``shown`` of a piece (see :func:`output_note`); a
    figure or table on a slide after its code says what the code makes it for."""
    text = [line for a in shown if "lines" in a for line in a["hdr"] * (not a["first"]) + a["lines"]]
    said = output_note(checks, intro, "", text, shown[0].get("first", True))
    if not said and not code:
        said = _made_before_note(cell, shown, header)
    return said


def _made_before_note(cell, shown: list[dict], header: int) -> str:
    """The note for a figure or table on a slide after its code: what the code makes it for."""
    what = "figure" if "image/png" in shown[0]["out"].get("data", {}) else "table"
    purpose = code_note(cell.source.split("\n")[header:])
    return f"The {what} the code on the slide before makes" + (f": {purpose}" if purpose else ".")


def _box_lines(atoms: list[dict], box) -> int:
    """The non-blank lines the atoms of ``box`` (code, output, text) hold; an atom without
    lines (a figure) counts as a piece long enough."""
    return sum(sum(1 for x in a["lines"] if x.strip()) if "lines" in a else MIN_PIECE_LINES
               for a in atoms if a["box"] == box)


def _comment_header(cell, budget: int) -> int:
    """How many lines of a code cell's leading comment go to the speaker notes: three or more,
    or any at all when the cell is too tall for a slide; 0 when the cell is nothing else."""
    lines = cell.source.split("\n")
    header = 0
    while header < len(lines) and lines[header].startswith("#"):
        header += 1
    if header == len(lines) or not (header >= 3 or header and estimated_height(cell) > budget):
        header = 0
    return header


def _checks_of(cells: list, k: int) -> list[str]:
    """What the asserts of code cell ``k`` check, with those of the assert-only cell left out
    of the deck after it (they check this cell's output)."""
    checks = assert_checks(cells[k].source)
    later = next((c for c in cells[k + 1:] if _kind(c) != "notes"), None)
    if later is not None and _kind(later) == "skip" and is_assert_only(later):
        checks += assert_checks(later.source)
    return checks


def _split_atom(atom: dict, room: int) -> tuple[dict, dict]:
    """``atom`` cut after ``room`` lines: the piece that fills the room, and the rest."""
    rest = dict(atom, lines=atom["lines"][room:], first=False)
    head = dict(atom, lines=atom["lines"][:room])
    rest["px"], head["px"] = _lines_px(rest["lines"]), _lines_px(head["lines"])
    return head, rest


@dataclass
class _Cut:
    """One cell on its way into the deck: the piece being filled and the atoms still to place."""

    cell: Any
    header: int             # the lines of its comment header (in the speaker notes)
    checks: list[str]       # what its asserts check
    filled: int             # the height of the slide so far, with this piece
    queue: list[dict]       # the atoms not placed yet
    part: list[dict] = field(default_factory=list)      # the atoms of the piece being filled
    n: int = 0              # which piece of the cell it is (from 0)
    starts: bool = False    # the piece starts a slide


class _SlideFit:
    """The deck :func:`fit_slides` builds, cell by cell: its cells, their heights and what to
    point at in each, and the slide being filled."""

    def __init__(self, cells: list, budget: int):
        self.cells, self.budget = cells, budget
        self.out: list = []          # the deck's cells ...
        self.px: list[int] = []      # ... their heights ...
        self.notes: list[str] = []   # ... and what to point at in each
        self.start = self.used = 0   # where the current slide starts in ``out``, and its height so far
        self.intro = ""              # the last sentence of the text before, which introduces code
        self.first_at = 0            # where the last cell's first part is in ``out``
        self.own_slide: set[int] = set()    # cells that start a slide of their own on purpose
        self.break_next = False      # the next cell starts a new slide (after a prompt to predict, a box)

    def place(self, cell, height: int, note: str = "") -> None:
        """Add ``cell`` to the deck, on a new slide if it starts one."""
        if _kind(cell) in ("slide", "subslide"):
            self.start, self.used = len(self.out), 0
        self.out.append(cell)
        self.px.append(height)
        self.notes.append(note)
        self.used += height

    def pull_back(self, code: bool) -> list[int] | None:
        """What goes along to a new slide with the next cell: a heading alone and, before code,
        the introduction to it; None when only a heading would stay behind."""
        out, i, took_intro = self.out, len(self.out), False
        while i > self.start:
            prev = out[i - 1]
            if _kind(prev) in ("notes", "skip") or _is_heading_only(prev):
                i -= 1
            elif code and not took_intro and prev.cell_type == "markdown" and self.px[i - 1] <= self.budget // 3:
                i, took_intro = i - 1, True
            else:
                break
        while i < len(out) and _kind(out[i]) in ("notes", "skip"):
            i += 1
        stays = [c for c in out[self.start:i] if _kind(c) not in ("notes", "skip")]
        if i < len(out) and (not stays or all(_is_heading_only(c) for c in stays)):
            return None
        return list(range(i, len(out)))

    def add(self, k: int, cell) -> None:
        """Place cell ``k``: whole, or cut into pieces that go on in slides below."""
        if cell.metadata.get("claimlab", {}).get("note") == "first slide" and self.first_at < len(self.out) - 1:
            self._insert_after_first(cell)
            return
        if _kind(cell) in ("notes", "skip") or cell.cell_type not in ("markdown", "code"):
            self.place(cell, 0)
            return
        self._open_own_slide(cell)
        self.first_at = len(self.out)
        header, checks = 0, []
        if cell.cell_type == "code":
            header = _comment_header(cell, self.budget)
            atoms = _code_atoms(cell, self.budget, header)
            checks = _checks_of(self.cells, k)
        else:
            atoms = _markdown_atoms(cell, self.budget)
        if _kind(cell) in ("slide", "subslide"):
            self.start, self.used = len(self.out), 0
        cut = _Cut(cell, header, checks, self.used, list(atoms))
        self._cut(cut)
        if cut.part:
            self._place_piece(cut)
        elif not atoms:
            self.place(cell, 0)
        self._remember_intro(cell)

    def _insert_after_first(self, cell) -> None:
        """A note meant for the first slide of the cell before: put it after that cell's first part."""
        at = self.first_at + 1
        self.out.insert(at, cell)
        self.px.insert(at, 0)
        self.notes.insert(at, "")
        self.start += self.start > self.first_at

    def _open_own_slide(self, cell) -> None:
        """An interview box, and the cell after a box or a prompt to predict, start a slide of
        their own; the slide before a box says to ask the room first."""
        box = cell.cell_type == "markdown" and bool(INTERVIEW_RE.match(cell.source.lstrip()))
        if box and any(_kind(c) not in ("notes", "skip") for c in self.out):
            self.place(_note(NEXT_ASK_NOTE), 0)      # the slide before the box: ask before showing it
        if (box or self.break_next) and self.out:
            self.own_slide.add(id(cell))
            if _kind(cell) == "-":
                cell.metadata["slideshow"] = {"slide_type": "subslide"}
        self.break_next = box or (cell.cell_type == "markdown" and bool(PREDICT_RE.search(_plain(cell.source))))

    def _remember_intro(self, cell) -> None:
        """Text introduces the code after it (its last sentence); code ends the introduction."""
        if cell.cell_type == "markdown" and not _is_heading_only(cell):
            self.intro = last_sentence(cell.source)
        elif cell.cell_type == "code":
            self.intro = ""

    def _place_piece(self, cut: _Cut) -> None:
        """Put the piece being filled into the deck, with its note."""
        self.place(_part_cell(cut.cell, cut.part, cut.n, cut.starts), _part_px(cut.part),
                   _part_note(cut.cell, cut.part, cut.n, cut.header, cut.checks, self.intro,
                              self.notes[self.start:]))

    def _cut(self, cut: _Cut) -> None:
        """Fill pieces of the cell with its atoms, a piece a slide, until every atom is placed
        (the last piece is left for the caller to place)."""
        while cut.queue:
            atom = cut.queue.pop(0)
            if cut.filled + atom["px"] + _opens(cut.part, atom) > self.budget and (cut.part or cut.filled):
                atom = self._overflow(cut, atom)
            cut.filled += atom["px"] + _opens(cut.part, atom)
            cut.part.append(atom)

    def _overflow(self, cut: _Cut, atom: dict) -> dict:
        """``atom`` does not fit on the slide: end the piece there, or make room; the atom that
        goes next."""
        atom = self._restart_below(cut, atom)
        atom = self._leave_no_short_piece(cut, atom)
        if cut.part:                    # the cell goes on in a slide below
            self._place_piece(cut)
            cut.n, cut.part, cut.starts, cut.filled = cut.n + 1, [], True, 0
            return atom
        return self._make_room(cut, atom)

    def _restart_below(self, cut: _Cut, atom: dict) -> dict:
        """The whole cell (or its start) goes on a slide below rather than be cut here, when it
        would fit there or its first piece would be short."""
        part, queue = cut.part, cut.queue
        if part and cut.n == 0 and cut.filled > _part_px(part) and (
                _part_px([*part, atom, *queue]) <= self.budget or _box_lines(part, atom["box"]) < MIN_PIECE_LINES):
            queue[:0] = [*part, atom]
            cut.filled, cut.part = self.used, []
            atom = queue.pop(0)
        return atom

    @staticmethod
    def _leave_no_short_piece(cut: _Cut, atom: dict) -> dict:
        """Move atoms from the piece to the next while what would go on below is too short."""
        part, queue = cut.part, cut.queue
        while (part and part[-1]["box"] == atom["box"] and "lines" in atom
               and _box_lines([atom, *queue], atom["box"]) < MIN_PIECE_LINES
               and _box_lines(part[:-1], atom["box"]) >= MIN_PIECE_LINES):
            queue.insert(0, atom)
            atom = part.pop()
        return atom

    def _make_room(self, cut: _Cut, atom: dict) -> dict:
        """The cell's first atom does not fit what is left of the slide: fill the room under a
        heading alone, take the introduction along to a new slide, or start one."""
        tail = self.pull_back(cut.cell.cell_type == "code")
        room = (self.budget - cut.filled - _opens(cut.part, atom)) // LINE_PX
        if tail is None and "lines" in atom and not atom.get("whole") and \
                MIN_PIECE_LINES <= room <= len(atom["lines"]) - MIN_PIECE_LINES:
            atom, rest = _split_atom(atom, room)        # a heading alone: fill the room
            cut.queue.insert(0, rest)
        elif tail:                      # the introduction goes along to a new slide
            self._move_to_new_slide(tail)
            cut.filled = self.used
        else:                           # a new slide starts with this cell
            cut.starts, cut.filled = True, 0
        return atom

    def _move_to_new_slide(self, tail: list[int]) -> None:
        """The deck's cells at ``tail`` start a new slide."""
        out, px, notes = self.out, self.px, self.notes
        moved = [(out[j], px[j], notes[j]) for j in tail]
        del out[tail[0]:], px[tail[0]:], notes[tail[0]:]
        shown = next(c for c, _, _ in moved if _kind(c) not in ("notes", "skip"))
        shown.metadata["slideshow"] = {"slide_type": "subslide"}
        for moved_cell, height, note in moved:
            self.place(moved_cell, height, note)


def fit_slides(nb: NotebookNode, budget: int = SLIDE_BUDGET_PX) -> NotebookNode:
    """A copy of ``nb`` in which whatever does not fit its slide goes on in a slide below it
    (reveal.js: a vertical subslide): markdown cut at paragraphs, code at blank lines and
    statements (a long comment header goes to the speaker notes instead), output at whole rows
    repeating its header; an introduction goes along with the code it introduces, and a figure
    too tall for the room left gets a slide of its own. A cell that fits a slide of its own
    (a transcript, code with its figure) moves there whole rather than be cut, an output under
    ``MIN_CUT_OUTPUT`` lines is never cut, and no piece of a cut cell is shorter than
    ``MIN_PIECE_LINES``. An interview box gets a slide of its own (the slide before it says to
    ask the room first), and a prompt to predict ends its slide. Every slide with content gets
    a note saying what to point at, not a copy of the slide before's."""
    nb = copy.deepcopy(nb)
    fit = _SlideFit(nb.cells, budget)
    for k, cell in enumerate(nb.cells):
        fit.add(k, cell)
    return _with_notes(nb, *_join_short_slides(fit.out, fit.px, fit.notes, fit.own_slide, budget))


def _slides(out: list, items: list) -> list[list]:
    """``items`` (one per cell of ``out``) grouped by the slide their cell is on."""
    slides: list[list] = []
    for cell, item in zip(out, items):
        if not slides or _kind(cell) in ("slide", "subslide"):
            slides.append([])
        slides[-1].append(item)
    return slides


def _join_short_slides(out: list, px: list[int], notes: list[str], own_slide: set[int], budget: int):
    """A slide that holds only a short paragraph (three lines at most) joins the slide before
    when it fits there, unless it starts a section or a slide of its own on purpose."""
    heights, slides = [sum(h) for h in _slides(out, px)], _slides(out, out)
    for cells, height, before, last in zip(slides[1:], heights[1:], heights, slides):
        shown = [c for c in cells if _kind(c) not in ("notes", "skip")]
        boxed = any(c.cell_type == "markdown" and INTERVIEW_RE.match(c.source.lstrip()) for c in last)
        if (len(shown) == 1 and not boxed and shown[0].cell_type == "markdown" and _kind(shown[0]) == "subslide"
                and id(shown[0]) not in own_slide and not INTERVIEW_RE.match(shown[0].source.lstrip())
                and height <= CELL_PX + 3 * TEXT_PX + PARA_PX and before + height <= budget):
            cells[0].metadata["slideshow"] = {"slide_type": "-"}
    return out, notes


def _with_notes(nb: NotebookNode, out: list, notes: list[str]) -> NotebookNode:
    """``nb`` with the cells of ``out``, and on every slide with content a note on what to
    point at: its cells' notes, without those the slide before said already."""
    cells_out, before = [], set()
    for cells, said in zip(_slides(out, out), _slides(out, notes)):
        said = [s for s in dict.fromkeys(s for s in said if s) if s not in before][:3]
        cells_out += cells
        if said:
            cells_out.append(_note(" ".join(said)))
        before = set(said)
    nb.cells = cells_out
    return nb


def short_name(nb: NotebookNode) -> str:
    """The notebook's name as its decks show it: its ``# `` title ("01 · One lock, three
    conflict policies"), else its ``claimlab.title``."""
    for cell in nb.cells:
        found = re.match(r"# (.+)", cell.source.lstrip()) if cell.cell_type == "markdown" else None
        if found:
            return _plain(found.group(1))
    return nb.metadata.get("claimlab", {}).get("title", "")


def deck_notebook(nb: NotebookNode, guide: dict | None = None) -> NotebookNode:
    """What ``labkit slides`` renders: the notebook as its deck shows it, with speaker notes,
    its slides fitted to the canvas, and its short name as the page's title."""
    deck = fit_slides(speaker_notes(deck_cells(nb), guide))
    if short_name(nb):
        deck.metadata["title"] = short_name(nb)
    return deck


# -- the decks in a real browser -------------------------------------------------------------------
CHECK_WIDTH, CHECK_HEIGHT = 1280, 720
MIN_TEXT_PX = 20
# What the check measures on every slide, in the order it reports them.
KINDS = {"hidden": "content hidden (scrolls, or the slide is too tall)",
         "wrapped": "preformatted text wrapped (a line wider than its box)",
         "small text": f"text under {MIN_TEXT_PX} px",
         "shrunk figure": "a figure shown smaller than it could be",
         "no notes": "a slide with content and no speaker notes"}

# JavaScript both browser checks share: a <pre>'s widest line, when kept on one line, is wider
# than its box (null when it fits); with the widths in px.
_WIDE_LINE_JS = r"""
const wideLine = (pre) => {
  const was = pre.style.whiteSpace;
  pre.style.whiteSpace = 'pre';
  const need = pre.scrollWidth, have = pre.clientWidth;
  pre.style.whiteSpace = was;
  if (need <= have + 1) return null;
  const line = pre.textContent.split('\n').reduce((a, b) => (b.length > a.length ? b : a), '');
  return {need: need, have: have, line: line};
};
"""

# Run in the deck: visit every slide through Reveal's API and measure what is shown there.
_MEASURE_JS = "\n(() => {\n" + _WIDE_LINE_JS + """  Reveal.configure({transition: 'none', backgroundTransition: 'none'});
  const view = Reveal.getComputedSlideSize().height;
  const MIN_PX = """ + str(MIN_TEXT_PX) + """;
  const clean = (t) => t.replace(/\\u00b6/g, '').replace(/\\s+/g, ' ').trim();
  const heading = (s) => { const h = s.querySelector('h1, h2, h3, h4'); return h ? clean(h.textContent) : ''; };
  const shown = (el) => !el.closest('aside.notes');
  const name = (el) => {
    const box = el.closest('.jp-InputArea-editor, .jp-OutputArea-output, .jp-RenderedHTMLCommon, table, pre');
    const what = !box ? el.tagName.toLowerCase() : box.closest('.jp-InputArea-editor') ? 'code'
               : box.closest('.jp-OutputArea-output') ? 'output' : box.tagName === 'TABLE' ? 'table' : 'text';
    return what + ' "' + clean(el.textContent).slice(0, 50) + '"';
  };
  const found = [];
  let lastHeading = '', n = 0, chars = 0, small = 0;
  Reveal.getHorizontalSlides().forEach((top, h) => {
    const stack = top.querySelectorAll(':scope > section');
    const count = stack.length || 1;
    for (let v = 0; v < count; v++) {
      Reveal.slide(h, v);
      const s = Reveal.getCurrentSlide();
      n += 1;
      const own = heading(s);
      if (own) lastHeading = own;
      const problems = [];
      const add = (kind, what, more) => {
        const p = problems.find((q) => q.kind === kind);
        if (p) p.more += 1; else problems.push({kind: kind, what: what, more: 0});
      };
      const fixed = s.style.height;            // the content's own height, not the slide box's
      s.style.height = 'auto';
      const content = Math.max(s.scrollHeight, s.offsetHeight);
      s.style.height = fixed;
      if (content > view) add('hidden', `${content} px of content in a ${view} px slide`);
      const els = Array.from(s.querySelectorAll('*')).filter(shown);
      for (const el of els) {
        const cs = getComputedStyle(el);
        const clips = (o) => /auto|scroll|hidden/.test(o);
        if (clips(cs.overflowY) && el.scrollHeight > el.clientHeight + 1)
          add('hidden', `${name(el)} shows ${el.clientHeight} of ${el.scrollHeight} px (it scrolls)`);
        else if (clips(cs.overflowX) && el.scrollWidth > el.clientWidth + 1)
          add('hidden', `${name(el)} shows ${el.clientWidth} of ${el.scrollWidth} px wide (it scrolls)`);
      }
      for (const pre of els.filter((el) => el.tagName === 'PRE')) {
        const w = wideLine(pre);
        if (w) add('wrapped', `${name(pre)}: a line of ${w.line.length} characters needs ${w.need} of ${w.have} px ("${clean(w.line).slice(0, 40)}")`);
      }
      const walk = document.createTreeWalker(s, NodeFilter.SHOW_TEXT);
      for (let t = walk.nextNode(); t; t = walk.nextNode()) {
        const text = t.textContent.trim();
        if (!text || !shown(t.parentElement)) continue;
        const range = document.createRange();
        range.selectNodeContents(t);
        if (!range.getClientRects().length) continue;      // not rendered (a closed <details>)
        const px = parseFloat(getComputedStyle(t.parentElement).fontSize);
        chars += text.length;
        if (px < MIN_PX) {
          small += text.length;
          add('small text', `${px} px: ${name(t.parentElement)}`);
        }
      }
      for (const img of els.filter((el) => el.tagName === 'IMG' && el.naturalWidth)) {
        const r = img.getBoundingClientRect();
        const room = view - content;
        const fits = Math.min(img.naturalWidth, img.parentElement.clientWidth,
                              (r.height + room) * img.naturalWidth / img.naturalHeight);
        if (r.width < img.naturalWidth - 1 && fits > r.width + Math.max(2, r.width / 100))
          add('shrunk figure', `a ${img.naturalWidth}×${img.naturalHeight} figure shown at ${Math.round(r.width)}×${Math.round(r.height)} with ${room} px free below it`);
      }
      const content_ = els.some((el) => /^(P|LI|PRE|IMG|TABLE|BLOCKQUOTE|DETAILS)$/.test(el.tagName));
      if (content_ && !s.querySelector('aside.notes'))
        add('no notes', 'a slide with content and no speaker notes');
      found.push({n: n, h: h, v: v, heading: own || (lastHeading ? lastHeading + ' (continued)' : ''),
                  height: content, view: view, problems: problems});
    }
  });
  Reveal.slide(0, 0);
  return {slides: found, chars: chars, small: small};
})()
"""


class DeckReport:
    """What ``check_decks`` saw: per deck its slides, and every problem in one line."""

    def __init__(self) -> None:
        self.slides: dict[str, list[dict]] = {}
        self.problems: list[str] = []
        self.counts: dict[str, dict[str, int]] = {}
        self.chars = self.small_chars = 0
        self.seconds = 0.0

    def add(self, deck: str, found: dict) -> None:
        self.slides[deck] = found["slides"]
        self.chars += found["chars"]
        self.small_chars += found["small"]
        counts = self.counts.setdefault(deck, dict.fromkeys(KINDS, 0))
        for s in found["slides"]:
            for p in s["problems"]:
                counts[p["kind"]] += 1
                more = f" (and {p['more']} more)" if p["more"] else ""
                self.problems.append(f"{deck}: slide {s['n']} (#/{s['h']}/{s['v']}, \"{s['heading'][:60]}\") "
                                     f"{p['kind']}: {p['what']}{more}")

    def deck_lines(self) -> list[str]:
        """Per deck, how many slides it has and how many of them show each kind of problem."""
        return [f"{deck}: {len(self.slides[deck])} slides · "
                + " · ".join(f"{kind} {n}" for kind, n in counts.items()) for deck, counts in self.counts.items()]

    def totals(self) -> dict[str, int]:
        return {kind: sum(c[kind] for c in self.counts.values()) for kind in KINDS}

    def summary(self) -> str:
        total = sum(len(s) for s in self.slides.values())
        kinds = " · ".join(f"{kind} {n}" for kind, n in self.totals().items())
        share = 100 * self.small_chars / (self.chars or 1)
        return (f"slides --check: {len(self.slides)} decks, {total} slides at {CHECK_WIDTH}×{CHECK_HEIGHT}, "
                f"{len(self.problems)} problem(s) ({kinds}; {share:.0f} % of the text under {MIN_TEXT_PX} px), "
                f"{self.seconds:.0f} s")


def check_decks(decks: list[Path], width: int = CHECK_WIDTH, height: int = CHECK_HEIGHT) -> DeckReport:
    """Open every slide of every deck in headless Chromium at ``width``×``height`` and measure
    what a person sees there: a problem for each slide with content hidden (a box that scrolls,
    or content taller than the slide), preformatted text wrapped, text under 20 px, a figure
    shown smaller than the slide has room for, or content without speaker notes; and for each
    console error."""
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
            report.add(deck.name, browser.evaluate(_MEASURE_JS))
            for error in errors + [e for e in browser.errors() if e not in errors]:
                report.problems.append(f"{deck.name}: {error}")
    report.seconds = time.monotonic() - started
    return report


# -- book -----------------------------------------------------------------------------------
# Where an exercise starts: its bold label, or a section heading that names it.
EXERCISE_RE = re.compile(r"\*\*Exercise\b|#{2,3} .*\bExercise\b")


def book(paths: list[str] | None = None, out: Path = ROOT / "build" / "book", execute: bool = False,
         quiet: bool = False) -> list[Path]:
    """The handouts in ``out``: per notebook the full page (``NN.html``) and a one-page
    summary beside it (``NN.summary.html``), and an index of both; returns the full pages.
    They are made from the committed outputs, a full run that nbval checks, which needs no
    server and no kernel; with ``execute``, each notebook is first run afresh."""
    needs_slides_extra("book")
    import contextlib

    import nbformat
    from nbconvert import HTMLExporter
    from tqdm.auto import tqdm

    from .nbtools import run_notebook

    notebooks = _notebooks(paths)   # every input checked before anything is written
    out.mkdir(parents=True, exist_ok=True)
    exporter = HTMLExporter(template_name="claimlab_book", extra_template_basedirs=[str(TEMPLATES)])
    written = []
    # The kernels get their own lab schemas (LABKIT_USER), so building the handouts never
    # resets the schemas of the notebooks you have open.
    bar = tqdm(notebooks, desc="book", unit="notebook", disable=quiet)
    with lab_user(f"{current_user_tag()}_book") if execute else contextlib.nullcontext():
        for path in bar:
            bar.set_postfix_str(path.stem)
            nb = nbformat.read(path, as_version=4)
            if execute:
                run_notebook(nb, path.parent)
                clean(nb)
            title = nb.metadata.get("claimlab", {}).get("title") or path.stem
            for page, suffix, name in ((nb, ".html", title),
                                       (summary_notebook(nb, path.stem), ".summary.html", f"{title} — summary")):
                body, _ = exporter.from_notebook_node(page, resources={"metadata": {"name": name}})
                (out / (path.stem + suffix)).write_text(body)
            written.append(out / (path.stem + ".html"))
    _index(out, [(p, p.stem + ".html") for p in notebooks], "Claim Lab — handouts",
           "Each page is a notebook run from top to bottom on a real PostgreSQL server. Beside it, "
           "one page to hand out: the sections, the interview boxes and the exercises, without "
           "their answers.", summaries=True)
    return written


def _markdown_parts(nb: NotebookNode) -> list[str]:
    """The notebook's markdown, cut where a heading, an interview box or an exercise starts."""
    from .nbtools import split_points

    parts = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            lines = cell.source.split("\n")
            bounds = [0, *split_points(cell.source), len(lines)]
            parts += ["\n".join(lines[a:b]).strip() for a, b in zip(bounds, bounds[1:])]
    return parts


# The handout printed on A4: 210 mm less two 15 mm margins (templates/claimlab_book), in CSS px.
A4_TEXT_PX = round(180 / 25.4 * 96)

# Run in a handout page shown as print media: every visible <pre> (code or output) whose lines,
# kept each on one line, are wider than its box; with its widest line.
_PRINT_WRAPS_JS = "\n(() => {\n" + _WIDE_LINE_JS + """
  const found = [];
  document.querySelectorAll('pre').forEach((pre) => {
    const w = pre.offsetParent && wideLine(pre);
    if (w) found.push({need: w.need, have: w.have, line: w.line.slice(0, 80), chars: w.line.length});
  });
  return found;
})()
"""


def check_handouts(pages: list[Path], browser=None) -> list[str]:
    """Each handout page as Chromium prints it on A4 (print media, the page's text width): one
    line per preformatted block, code or output, whose lines would wrap there."""
    from .browser import Browser

    problems = []
    own = browser is None
    browser = browser or Browser(A4_TEXT_PX, 1000)
    try:
        for page in pages:
            browser.open(page.resolve().as_uri(), settle_s=0.2)
            browser.call("Emulation.setEmulatedMedia", media="print")
            browser.call("Emulation.setDeviceMetricsOverride", width=A4_TEXT_PX, height=1000,
                         deviceScaleFactor=1, mobile=False)
            for f in browser.evaluate(_PRINT_WRAPS_JS):
                problems.append(f"{page.name}: a {f['chars']}-character line wraps on A4 "
                                f"({f['need']} px in {f['have']} px): {f['line']!r}")
            browser.call("Emulation.clearDeviceMetricsOverride")
            browser.call("Emulation.setEmulatedMedia", media="")
    finally:
        if own:
            browser.close()
    return problems


def summary_notebook(nb: NotebookNode, stem: str) -> NotebookNode:
    """One page for the notebook ``stem``: its title, what it teaches, its minutes, its
    section headings, every "Say it in an interview" box and every exercise's prompt. No
    answer: a prompt ends where its ``<details>`` answer begins."""
    import nbformat

    meta = nb.metadata.get("claimlab", {})
    sections, boxes, prompts = [], [], []
    for part in _markdown_parts(nb):
        first, _, rest = part.partition("\n")
        if first.startswith("## "):
            sections.append(f"- {first[3:].strip()}")
        if first.startswith("> **Say it in an interview"):
            lines = part.split("\n")
            quoted = next((i for i, line in enumerate(lines) if not line.startswith(">")), len(lines))
            boxes.append("\n".join(lines[:quoted]))
        elif EXERCISE_RE.match(first):
            heading = first.lstrip("#").strip() if first.startswith("#") else ""
            prompt = re.split(r"<details", rest if heading else part, maxsplit=1, flags=re.I)[0].strip()
            prompts.append(f"**{heading}.** {prompt}" if heading else prompt)
    about = [meta.get("teaches", ""), f"{meta['minutes']} minutes" if meta.get("minutes") else "",
             f"[the full handout]({stem}.html)"]
    text = [f"# {meta.get('title') or stem}\n\n" + " · ".join(filter(None, about))]
    if sections:
        text.append("## Sections\n\n" + "\n".join(sections))
    if boxes:
        text.append("## Say it in an interview\n\n" + "\n\n".join(boxes))
    if prompts:
        text.append("## Exercises\n\nThe answers are in the full handout.\n\n" + "\n\n".join(prompts))
    page = nbformat.v4.new_notebook(metadata=copy.deepcopy(nb.metadata))
    page.cells = [nbformat.v4.new_markdown_cell(t) for t in text]
    return page


def _index(out: Path, entries: list[tuple[Path, str]], title: str, blurb: str,
           summaries: bool = False) -> Path:
    """``out/index.html``: a row per page; with ``summaries``, a link to each one-page summary."""
    rows = []
    total = 0
    for path, href in entries:
        meta = _meta(path)
        minutes = meta.get("minutes", "")
        total += minutes if isinstance(minutes, int) else 0
        summary = (f"<td><a href=\"{html.escape(path.stem)}.summary.html\">one page</a></td>"
                   if summaries else "")
        rows.append(f"<tr><td><a href=\"{html.escape(href)}\">{html.escape(path.stem)}</a></td>{summary}"
                    f"<td>{html.escape(meta.get('title', ''))}</td><td>{minutes} min</td>"
                    f"<td>{html.escape(meta.get('teaches', ''))}</td></tr>")
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em}}
td,th{{padding:4px 10px;text-align:left;vertical-align:top}} tr:nth-child(even){{background:#f4f4f4}}</style>
</head><body><h1>{html.escape(title)}</h1><p>{html.escape(blurb)}</p>
<table><thead><tr><th>notebook</th>{'<th>summary</th>' if summaries else ''}<th>title</th><th>time</th><th>what it teaches</th></tr></thead>
<tbody>{''.join(rows)}</tbody></table><p>In all: {total} minutes.</p></body></html>
"""
    dest = out / "index.html"
    dest.write_text(page)
    return dest


# -- student copies ------------------------------------------------------------------------------
# What a student copy runs instead of a code cell with one of these tags: ``solution``, the
# code the learner is to write; ``answer``, a cell that gives an exercise's answer away (it
# prints the answer's file, asserts the expected result, or holds the solution). Both
# placeholders are comments: running them does nothing, so the cells after them still run.
BLANKED = {"solution": "# Your answer here\n",
           "answer": "# Answer: in the instructor's copy, notebooks/{name}.\n"}


def is_exercise_notebook(nb: NotebookNode) -> bool:
    return any(ANSWER_RE.search(c.source) for c in nb.cells if c.cell_type == "markdown") or any(
        BLANKED.keys() & set(c.metadata.get("tags", [])) for c in nb.cells)


# A cell tagged ``recorded`` needs a service a learner may lack (PgBouncer, a MySQL-compatible
# server, RabbitMQ): its student copy keeps the output recorded when the notebook was run,
# under this line, so the evidence is there without the service. Running the cell replaces it.
RECORDED = ("[recorded when this notebook was last run in full, with {needs}; run the cell to "
            "see your own]\n")


def recorded_label(cell: NotebookNode) -> str:
    """The line above a recorded output: what the cell needs, from ``claimlab.needs``."""
    needs = cell.metadata.get("claimlab", {}).get("needs") or "the services it uses"
    return RECORDED.format(needs=needs)


def student_copy(nb: NotebookNode, name: str) -> NotebookNode:
    """The notebook without solutions or outputs: hidden answers and code cells tagged
    ``solution`` or ``answer`` are replaced by placeholders (:data:`BLANKED`). A cell tagged
    ``recorded`` (and not ``answer``) keeps its outputs, labelled as recorded (:data:`RECORDED`)."""
    import nbformat

    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = ANSWER_RE.sub(ANSWER_PLACEHOLDER.format(name=name), cell.source)
        elif cell.cell_type == "code":
            tags = cell.metadata.get("tags", [])
            tag = next((t for t in BLANKED if t in tags), None)
            if tag:
                cell.source = BLANKED[tag].format(name=name)
            if "recorded" in tags and not tag and cell.outputs:
                label = nbformat.v4.new_output("stream", name="stdout", text=recorded_label(cell))
                cell.outputs = [label, *cell.outputs]
            else:
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
        text = jupyter_text(student_copy(nb, path.name))      # as Jupyter saves it
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
def slides_command(*, notebooks: list[str], out: Path, check: bool = False, plan_deck=None) -> int:
    """``labkit slides [NOTEBOOK ...] [--out DIR] [--check]``: with ``check``, open every slide
    of every deck in headless Chromium at 1280×720 (``check_decks``); print per deck how many
    slides show each kind of problem, and exit 1 naming each problem (deck, slide, heading,
    what), 2 when no Chromium is installed. ``--plan``: ``plan_deck(out, quiet)`` builds the
    plan's one deck instead (``labkit.tools.plans.plan_builder``)."""
    if plan_deck and notebooks:
        raise LabkitError("`labkit slides --plan` builds the plan's own deck and takes no notebooks.",
                          "drop the notebook names, or --plan.")
    if check:
        import importlib.util

        from .browser import find_chromium

        if importlib.util.find_spec("websocket") is None:
            raise LabkitError("`labkit slides --check` needs websocket-client, which is not installed.",
                              "pip install 'labkit[slides]' (a checkout: pip install -e '.[slides]').")
        find_chromium()             # no browser: say so (exit 2) before building anything
    decks = plan_deck(out, check) if plan_deck else slides(notebooks, out, quiet=check)
    if not check:
        print(f"open {decks[0] if plan_deck else out / 'index.html'}")
        return 0
    report = check_decks(decks)
    for line in report.problems:
        print(line, file=sys.stderr)
    print("\n".join(report.deck_lines()))
    print(report.summary())
    return 1 if report.problems else 0


def book_command(*, notebooks: list[str], out: Path, execute: bool) -> int:
    """``labkit book [NOTEBOOK ...] [--out DIR] [--execute]``: the handouts from the committed
    outputs; with ``execute``, from a fresh run of each notebook."""
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
