"""Session plans: the 60- and 90-minute sessions of the presenter's guide, as data, timed
from their slides, and a deck per plan.

    labkit slides --plan 60|90 [--out build/slides] [--check]

:func:`load_plans` reads ``labkit/data/plans.yaml`` and validates it: every section an item
names is a ``## `` section of its notebook (by its number, ``1`` or ``"2b"``, or by its whole
heading), the introduction, the items, the room's questions and the buffer add up to the
plan's minutes exactly, the buffer is at least :data:`MIN_BUFFER` minutes, and every live item
says what to show when its live run misbehaves.

:func:`estimate` times a section from what its deck slides hold (the slides ``labkit slides``
builds, :func:`labkit.tools.training.deck_notebook`), with this model:

* 20 s for every slide (:data:`SLIDE_S`): it comes up, the room finds the heading, the
  presenter points at what matters;
* every word of the slide's text (markdown; an answer hidden in ``<details>`` counts in the
  notes) and every word of its speaker notes that the slide does not show already (in its
  text, code or output), spoken at 130 words a minute (:data:`WORDS_PER_MIN`);
* 2 s for every line of code shown (:data:`CODE_LINE_S`), 1 s for every line of output
  (:data:`OUTPUT_LINE_S`; a table's row is a line) but at most 60 s for one cell's output
  (:data:`OUTPUT_MAX_S`: a long transcript is read in part), 30 s for every figure
  (:data:`FIGURE_S`);
* for an item run live, 8 s for every code cell (:data:`LIVE_CELL_S`: switch to the notebook,
  run it, wait for the room to look), plus the cells' own run time where it was measured: the
  section's seconds in ``run_seconds`` of plans.yaml, from the notebook run once from a fresh
  kernel with nbclient's cell timing (:func:`section_run_seconds` reads them);
* 60 s for every item (:data:`ASK_S`): the question to the room and its answers.

An item's estimate is the sum over its sections plus :data:`ASK_S`; a test keeps every item's
minutes at or above it.
"""

from __future__ import annotations

import copy
import re
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.errors import LabkitError
from ..core.files import data_file
from . import training
from .nbtools import NOTEBOOKS

if TYPE_CHECKING:
    from nbformat import NotebookNode

PLANS_FILE = data_file("plans.yaml")
MODES = ("live", "shown")
MIN_BUFFER = 5
OWN_SLIDES = 3          # a plan's deck adds a title, a question and a closing slide to its items'

# The timing model (see the module's docstring).
SLIDE_S = 20
WORDS_PER_MIN = 130
CODE_LINE_S = 2.0
OUTPUT_LINE_S = 1.0
OUTPUT_MAX_S = 60
FIGURE_S = 30
LIVE_CELL_S = 8
ASK_S = 60

FIX = "edit labkit/data/plans.yaml (its header says what each field holds)."
SECTION_RE = re.compile(r"^## (.+)$", re.M)
NUMBER_RE = re.compile(r"^(\d+[a-z]?) · ")
WORD_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9'’_-]*")


@dataclass(frozen=True)
class Item:
    notebook: str                   # its file name without .ipynb
    sections: tuple[str, ...]       # the headings of its ``## `` sections, in the notebook's order
    minutes: int
    mode: str                       # live or shown
    about: str                      # what it shows, in a few words
    ask: str                        # the question for the room
    fallback: str                   # what to show if the live run misbehaves

    def label(self) -> str:
        """``01 §1, §2`` (a section without a number by its heading)."""
        names = [f"§{m.group(1)}" if (m := NUMBER_RE.match(h)) else f"“{h}”" for h in self.sections]
        return f"{self.notebook[:2]} {', '.join(names)}"


@dataclass(frozen=True)
class Plan:
    name: str                       # "60", "90"
    title: str
    minutes: int
    introduction: int               # minutes
    welcome: str                    # what the introduction says
    items: tuple[Item, ...]
    questions: int                  # minutes for the room's questions
    buffer: int                     # minutes nothing is planned for

    @property
    def deck_name(self) -> str:
        return f"plan-{self.name}.slides.html"


# -- the notebooks' sections ----------------------------------------------------------------------
def _read_notebook(stem: str, where: str = "plans.yaml") -> NotebookNode:
    import nbformat

    path = NOTEBOOKS / f"{stem}.ipynb"
    if not path.exists():
        raise LabkitError(f"{where}: there is no notebook {stem} in {NOTEBOOKS}.",
                          "give a notebook's file name without .ipynb, like 01_one_lock_three_policies. " + FIX)
    return nbformat.read(path, as_version=4)


def _heading(cell) -> str | None:
    """The ``## `` heading a markdown cell starts with, if any."""
    found = SECTION_RE.match(cell.source.lstrip()) if cell.cell_type == "markdown" else None
    return found.group(1).strip() if found else None


def section_headings(nb: NotebookNode) -> list[str]:
    """The ``## `` headings of ``nb``, in order (a cell starts with its heading)."""
    return [h for h in map(_heading, nb.cells) if h]


def section_cells(nb: NotebookNode, heading: str) -> list:
    """The cells of the section ``## heading``: its heading cell up to the next ``# `` or ``## ``."""
    cells, inside = [], False
    for cell in nb.cells:
        if cell.cell_type == "markdown" and cell.source.lstrip().startswith(("# ", "## ")):
            inside = _heading(cell) == heading
        if inside:
            cells.append(cell)
    return cells


def _resolve(stem: str, wanted, headings: list[str], where: str) -> str:
    """The heading that ``wanted`` (a section's number or its whole heading) names."""
    for heading in headings:
        number = NUMBER_RE.match(heading)
        if str(wanted) == heading or (number and str(wanted) == number.group(1)):
            return heading
    listed = "; ".join(headings)
    raise LabkitError(f"{where}: {stem} has no section {wanted!r}. Its sections: {listed}.",
                      "name a section by its number (1, \"2b\") or by its whole heading. " + FIX)


def _sub_notebook(nb: NotebookNode, cells: list) -> NotebookNode:
    """A notebook of ``cells`` with ``nb``'s metadata, without its minutes (no minute notes)."""
    sub = copy.deepcopy(nb)
    sub.cells = copy.deepcopy(cells)
    sub.metadata.get("claimlab", {}).pop("minutes", None)
    return sub


# -- loading and validating -------------------------------------------------------------------------
def _read_yaml(path: Path) -> dict:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise LabkitError(f"Cannot read the session plans {path} ({exc.strerror}).",
                          "reinstall labkit: the file ships in labkit/data/plans.yaml.") from None
    except yaml.YAMLError as exc:
        raise LabkitError(f"{path.name} is not valid YAML ({exc}).", "fix the line the parser names.") from None
    if not isinstance(data, dict) or not isinstance(data.get("plans"), dict):
        raise LabkitError(f"{path.name} has no `plans:` mapping (plan name: plan).", FIX)
    return data


def _field(entry: dict, key: str, kind: type, where: str):
    value = entry.get(key) if isinstance(entry, dict) else None
    if not isinstance(value, kind) or isinstance(value, bool) or (kind is str and not value.strip()) \
            or (kind is int and value <= 0):
        wanted = {int: "a whole number of minutes above 0", str: "some text", list: "a list"}[kind]
        raise LabkitError(f"{where}: `{key}` must be {wanted}, not {value!r}.", FIX)
    return value.strip() if kind is str else value


def _item(raw: dict, where: str) -> Item:
    stem = _field(raw, "notebook", str, where)
    headings = section_headings(_read_notebook(stem, where))
    wanted = _field(raw, "sections", list, where)
    chosen = [_resolve(stem, w, headings, where) for w in wanted]
    if len(set(chosen)) != len(chosen):
        raise LabkitError(f"{where}: a section of {stem} is named twice.", "name each section once. " + FIX)
    mode = _field(raw, "mode", str, where)
    if mode not in MODES:
        raise LabkitError(f"{where}: `mode` is {mode!r}.", f"write one of: {', '.join(MODES)}. " + FIX)
    fallback = raw.get("fallback") or ""
    if mode == "live" and not str(fallback).strip():
        raise LabkitError(f"{where}: a live demo has no `fallback`.",
                          "say which slide of the plan's deck, or which stored output, to show if the live "
                          "run misbehaves. " + FIX)
    return Item(stem, tuple(sorted(chosen, key=headings.index)), _field(raw, "minutes", int, where), mode,
                _field(raw, "about", str, where), _field(raw, "ask", str, where), str(fallback).strip())


def _plan(name: str, raw: dict) -> Plan:
    where = f"plan {name}"
    intro = raw.get("introduction") if isinstance(raw, dict) else None
    items = _field(raw, "items", list, where)
    plan = Plan(name, _field(raw, "title", str, where), _field(raw, "minutes", int, where),
                _field(intro, "minutes", int, f"{where}, introduction"),
                _field(intro, "say", str, f"{where}, introduction"),
                tuple(_item(it, f"{where}, item {n}") for n, it in enumerate(items, 1)),
                _field(raw, "questions", int, where), _field(raw, "buffer", int, where))
    if plan.buffer < MIN_BUFFER:
        raise LabkitError(f"{where}: the buffer is {plan.buffer} minutes.",
                          f"keep at least {MIN_BUFFER} minutes unplanned: trim a section. " + FIX)
    parts = [plan.introduction, *(i.minutes for i in plan.items), plan.questions, plan.buffer]
    if sum(parts) != plan.minutes:
        raise LabkitError(f"{where}: the introduction, items, questions and buffer add up to {sum(parts)} "
                          f"minutes ({' + '.join(map(str, parts))}), not the plan's {plan.minutes}.",
                          "make them add up exactly: change an item's minutes or the buffer. " + FIX)
    return plan


def load_plans(path: Path | None = None) -> dict[str, Plan]:
    """The session plans, by name, validated (a LabkitError names the problem and the fix)."""
    data = _read_yaml(Path(path) if path else PLANS_FILE)
    return {str(name): _plan(str(name), raw) for name, raw in data["plans"].items()}


def load_plan(name: str, path: Path | None = None) -> Plan:
    plans = load_plans(path)
    if str(name) not in plans:
        raise LabkitError(f"There is no session plan {name!r}.", f"choose one of: {', '.join(plans)}.")
    return plans[str(name)]


def run_seconds(path: Path | None = None) -> dict[str, dict[str, float]]:
    """Measured run seconds per notebook and section heading (``run_seconds`` of plans.yaml)."""
    measured = _read_yaml(Path(path) if path else PLANS_FILE).get("run_seconds") or {}
    result = {}
    for stem, sections in measured.items():
        headings = section_headings(_read_notebook(stem, "run_seconds"))
        result[stem] = {_resolve(stem, k, headings, "run_seconds"): float(v) for k, v in sections.items()}
    return result


def section_run_seconds(nb: NotebookNode) -> dict[str, float]:
    """Per ``## `` section of an executed ``nb``, the seconds its code cells ran, from the cell
    timing nbclient records (``metadata.execution``); sections without timing are left out."""
    seconds: dict[str, float] = {}
    for heading in section_headings(nb):
        total = 0.0
        for cell in section_cells(nb, heading):
            timing = cell.metadata.get("execution", {})
            if "iopub.execute_input" in timing and "shell.execute_reply" in timing:
                start, end = (datetime.fromisoformat(timing[k].replace("Z", "+00:00"))
                              for k in ("iopub.execute_input", "shell.execute_reply"))
                total += (end - start).total_seconds()
        if total:
            seconds[heading] = round(total, 1)
    return seconds


# -- the timing model -----------------------------------------------------------------------------
def _words(text: str) -> Counter:
    """The words of markdown or code, lower-cased and counted (hidden ``<details>`` left out)."""
    text = re.sub(r"<[^>]+>|\]\([^)]*\)", " ", training.DETAILS_RE.sub(" ", text))
    return Counter(w.lower() for w in WORD_RE.findall(text))


def _spoken(shown: Counter, said: Counter, notes: Counter) -> int:
    """A slide's spoken words: its text, and the words of its notes it does not show already."""
    return sum(said.values()) + max(0, sum(notes.values()) - sum((notes & shown).values()))


def _output(cell) -> tuple[int, int, str]:
    """A code cell's output: its lines of text (a table's rows), its figures, and its text."""
    lines, figures, texts = 0, 0, []
    for out in cell.get("outputs", []):
        data = out.get("data", {})
        if "image/png" in data:
            figures += 1
        elif "text/html" in data:
            lines += "".join(data["text/html"]).count("<tr")
            texts.append("".join(data["text/html"]))
        else:
            texts.append("".join(out.get("text", data.get("text/plain", ""))).strip("\n"))
            lines += texts[-1].count("\n") + 1
    return lines, figures, "\n".join(texts)


@dataclass(frozen=True)
class Estimate:
    slides: int
    seconds: float

    @property
    def minutes(self) -> float:
        return self.seconds / 60


def estimate(deck: NotebookNode, live: bool = False, run_s: float = 0.0) -> Estimate:
    """The time to present ``deck`` (cells as ``deck_notebook`` returns them), by the model of the
    module's docstring; ``run_s``: its code cells' measured run time, for a live run."""
    slides, words, seconds, code_cells = 0, 0, 0.0, 0
    shown, said, notes = Counter(), Counter(), Counter()     # the current slide's words
    for cell in deck.cells:
        kind = cell.metadata.get("slideshow", {}).get("slide_type", "-")
        if kind == "skip":
            continue
        if kind in ("slide", "subslide"):
            slides += 1
            words += _spoken(shown, said, notes)
            shown, said, notes = Counter(), Counter(), Counter()
        if cell.cell_type == "markdown":
            text = _words(cell.source)
            if kind == "notes":
                notes += text
            else:
                said += text
                shown += text
        elif cell.cell_type == "code":
            if not cell.metadata.get("transient", {}).get("remove_source"):
                code_cells += 1
                seconds += CODE_LINE_S * sum(1 for line in cell.source.split("\n") if line.strip())
                shown += _words(cell.source)
            lines, figures, text = _output(cell)
            seconds += min(OUTPUT_MAX_S, OUTPUT_LINE_S * lines) + FIGURE_S * figures
            shown += _words(text)
    words += _spoken(shown, said, notes)
    seconds += SLIDE_S * slides + 60 * words / WORDS_PER_MIN
    if live:
        seconds += LIVE_CELL_S * code_cells + run_s
    return Estimate(slides, seconds)


def section_deck(nb: NotebookNode, heading: str) -> NotebookNode:
    """The deck slides of one section, as ``labkit slides`` builds them."""
    return training.deck_notebook(_sub_notebook(nb, section_cells(nb, heading)))


def item_estimates(item: Item, measured: dict[str, dict[str, float]] | None = None) -> list[Estimate]:
    """Per section of ``item``, its estimate (the item's question is not included)."""
    measured = run_seconds() if measured is None else measured
    nb = _read_notebook(item.notebook)
    return [estimate(section_deck(nb, h), item.mode == "live", measured.get(item.notebook, {}).get(h, 0.0))
            for h in item.sections]


def _with_question(parts: list[Estimate]) -> Estimate:
    return Estimate(sum(p.slides for p in parts), sum(p.seconds for p in parts) + ASK_S)


def item_estimate(item: Item, measured: dict[str, dict[str, float]] | None = None) -> Estimate:
    """The item's estimate: its sections' and its question's."""
    return _with_question(item_estimates(item, measured))


# -- the plan's deck ------------------------------------------------------------------------------
def _cell(text: str, kind: str, cell_id: str):
    import nbformat

    cell = nbformat.v4.new_markdown_cell(text)
    cell["id"] = cell_id
    cell.metadata["slideshow"] = {"slide_type": kind}
    return cell


def _agenda(plan: Plan) -> str:
    rows = [(plan.introduction, "introduction"), *((i.minutes, f"{i.label()}: {i.about} ({i.mode})") for i in plan.items),
            (plan.questions, "your questions")]
    return "\n".join(f"- **{m} min** · {what}" for m, what in rows)


def _item_notes(plan: Plan, n: int, item: Item, estimates: list[Estimate], minutes: list[int]) -> str:
    run = (f"**Run live:** its setup cell, then the cells of these sections, in `notebooks/{item.notebook}.ipynb`."
           if item.mode == "live" else "**Show:** the stored outputs on these slides; run nothing.")
    notes = [f"**{n} of {len(plan.items)} · {item.minutes} min · {item.mode}** · {item.label()}: {item.about} "
             f"(sections: {' · '.join(f'{m} min' for m in minutes)}; "
             f"estimated {_with_question(estimates).minutes:.1f} min with the question).",
             run, f"**Ask the room:** {item.ask}"]
    if item.fallback:
        notes.append(f"**If the live run misbehaves:** {item.fallback}")
    return "\n\n".join(notes)


def plan_notebook(plan: Plan, measured: dict[str, dict[str, float]] | None = None) -> NotebookNode:
    """The plan as one notebook: a title slide, each item's sections with the item's minutes,
    mode, question and fallback in the speaker notes of its first slide, a question slide and
    a closing slide. ``labkit slides`` renders it like any notebook."""
    import nbformat

    measured = run_seconds() if measured is None else measured
    nb = nbformat.v4.new_notebook()
    nb.metadata["claimlab"] = {"title": f"Session plan: {plan.minutes} minutes"}
    cells = [_cell(f"# Claim Lab in {plan.minutes} minutes\n\n**{plan.title}**\n\n{_agenda(plan)}", "slide", "title"),
             _cell(f"**{plan.minutes} minutes in all:** introduction {plan.introduction}, "
                   f"{len(plan.items)} items ({sum(i.minutes for i in plan.items)}), questions {plan.questions}, "
                   f"buffer {plan.buffer}.\n\n**Introduction ({plan.introduction} min):** {plan.welcome}\n\n"
                   "Keep this deck open beside the notebooks: every live demo's notes say what to show "
                   "here if the live run misbehaves.", "notes", "title-notes")]
    for n, item in enumerate(plan.items, 1):
        source = _read_notebook(item.notebook)
        estimates = item_estimates(item, measured)
        minutes = training.spread_minutes(item.minutes, [round(e.seconds) for e in estimates])
        for k, heading in enumerate(item.sections):
            part = copy.deepcopy(section_cells(source, heading))
            for cell in part:
                cell["id"] = f"p{n}-{cell.get('id', k)}"
            note = (_item_notes(plan, n, item, estimates, minutes) if k == 0
                    else f"**About {minutes[k]} min** for this section (of the item's {item.minutes}).")
            cells += [part[0], _cell(note, "notes", f"p{n}-notes-{k}"), *part[1:]]
    cells += [_cell("# Your questions\n\nWhat would an interviewer ask next? What would you ask?", "slide",
                    "questions"),
              _cell(f"**{plan.questions} min** for the room's questions. If the room is quiet, ask again the "
                    f"question that got the fewest answers. After it, {plan.buffer} min are unplanned: "
                    "the buffer for a late start or a demo that misbehaved.", "notes", "questions-notes"),
              _cell("# What we saw\n\n" + "\n".join(f"- {i.about}" for i in plan.items)
                    + "\n\nOn your own: `make study`, then `labkit drill`.", "slide", "closing"),
              _cell("Close on the question the session started with: how do workers claim jobs from one "
                    "table without waiting for each other, and without losing a job when one dies?",
                    "notes", "closing-notes")]
    nb.cells = cells
    return nb


def plan_slides(name: str, out: Path = training.ROOT / "build" / "slides", quiet: bool = False) -> Path:
    """Write ``out/plan-NAME.slides.html`` (reveal.js beside it, as ``labkit slides`` does)."""
    import nbformat

    plan = load_plan(name)
    measured = run_seconds()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / plan.deck_name.replace(".slides.html", ".ipynb")
        nbformat.write(plan_notebook(plan, measured), src)
        deck, = training.slides([str(src)], Path(tmp) / "out", quiet=True)
        out.mkdir(parents=True, exist_ok=True)
        shutil.copytree(deck.parent / "reveal.js", out / "reveal.js", dirs_exist_ok=True)
        dest = out / plan.deck_name
        shutil.copyfile(deck, dest)
    if not quiet:
        print(summary(plan, measured))
        print(f"slides: {dest}")
    return dest


def plan_builder(name: str):
    """For ``labkit slides --plan NAME``: the plan checked now, its deck built when called."""
    load_plan(name)
    return lambda out, quiet: [plan_slides(name, out, quiet)]


def summary(plan: Plan, measured: dict[str, dict[str, float]] | None = None) -> str:
    """One line: the plan's parts, its items' estimate and its deck's slides."""
    measured = run_seconds() if measured is None else measured
    items = [item_estimate(i, measured) for i in plan.items]
    estimated, slides = sum(e.minutes for e in items), OWN_SLIDES + sum(e.slides for e in items)
    return (f"plan {plan.name}: {len(plan.items)} items, {plan.minutes} min = introduction {plan.introduction} "
            f"+ items {sum(i.minutes for i in plan.items)} (estimated {estimated:.1f}) + questions "
            f"{plan.questions} + buffer {plan.buffer}; {slides} slides")


# -- the presenter's guide's tables ------------------------------------------------------------------
def readme_table(plan: Plan) -> str:
    """The plan's title and table in notebooks/README.md, "Session plans" (a test keeps them equal)."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    rows = [f"| {plan.introduction} | introduction: the question of the session, the agenda | — | — | — |"]
    rows += [f"| {i.minutes} | {i.label()}: {cell(i.about)} | {i.mode} | {cell(i.ask)} | {cell(i.fallback) or '—'} |"
             for i in plan.items]
    rows += [f"| {plan.questions} | the room's questions | — | — | — |", f"| {plan.buffer} | buffer | — | — | — |"]
    return (f"**{plan.minutes} minutes: {plan.title}**\n\n"
            "| minutes | notebook, sections | live or shown | ask the room | if the live run misbehaves |\n"
            "|---|---|---|---|---|\n" + "\n".join(rows))
