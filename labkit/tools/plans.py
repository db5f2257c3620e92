"""Session plans: the 60- and 90-minute sessions of the presenter's guide, as data, timed
from their slides, and a deck per plan.

    labkit slides --plan 60|90 [--out build/slides] [--check]

:func:`load_plans` reads ``data/plans.yaml`` and validates it: every section an item
names is a ``## `` section of its notebook (by its number, ``1`` or ``"2b"``, or by its whole
heading) or ``introduction`` (the notebook's text before its first ``## `` section), every
``### `` sub-heading it leaves out (``skip``) is in one of them, every quiz statement it names
(``quiz``) is in ``costly_answers.yaml``, the introduction, the items, the room's questions and
the buffer add up to the plan's minutes exactly, the buffer is at least :data:`MIN_BUFFER`
minutes, every item says the answer it expects to its question, and every live item says what
to show when its live run misbehaves.

An item with ``quiz`` shows, instead of its section's cells, one slide per statement, with its
choices in the order of ``costly_answers.yaml`` (the order ``labkit drill quiz`` prints; the
notebook's widget shuffles them), and its answer and why in the speaker notes.

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
* the talk around the slides: 60 s for every interview box (:data:`INTERVIEW_S`: a volunteer says
  it before the box is shown), 45 s for every prompt to predict or vote (:data:`PREDICT_S`:
  text that says "predict" or "vote"), 3 s for every row of a session transcript
  (:data:`TRANSCRIPT_ROW_S`, a numbered step of a ``#``/``--`` table: read row by row, without
  the cap of other output), and for a live item 20 s for every slide whose code is run
  (:data:`SWITCH_S`: from the deck to JupyterLab and back);
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
from typing import TYPE_CHECKING, Any

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
INTERVIEW_S = 60
PREDICT_S = 45
TRANSCRIPT_ROW_S = 3
SWITCH_S = 20

FIX = "edit data/plans.yaml (its header says what each field holds)."
SECTION_RE = re.compile(r"^## (.+)$", re.M)
NUMBER_RE = re.compile(r"^(\d+[a-z]?) · ")
SUBSECTION_RE = re.compile(r"^### (.+)$", re.M)
INTRO = "introduction"          # an item's name for its notebook's text before the first ``## ``
PREDICT_RE = re.compile(r"\b(?:predict|vote)\b", re.I)
TRANSCRIPT_RE = re.compile(r"\A#  .*\n--  -")
STEP_RE = re.compile(r"^\d+'? ", re.M)
WORD_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9'’_-]*")


@dataclass(frozen=True)
class Item:
    notebook: str                   # its file name without .ipynb
    sections: tuple[str, ...]       # the headings of its ``## `` sections, in the notebook's order
    minutes: int
    mode: str                       # live or shown
    about: str                      # what it shows, in a few words
    ask: str                        # the question for the room
    expect: str                     # the answer the presenter listens for
    fallback: str                   # what to show if the live run misbehaves
    skip: tuple[str, ...] = ()      # ``### `` sub-headings of its sections left out
    quiz: tuple[str, ...] = ()      # statement ids of costly_answers.yaml shown instead of its cells
    ask_before: str = ""            # the section whose first slide answers the question: it is asked before

    def label(self) -> str:
        """``01 §1, §2`` (a section without a number by its heading)."""
        return f"{self.notebook[:2]} {', '.join(map(section_label, self.sections))}"


def section_label(heading: str) -> str:
    """``§2``, ``“The job table and the claim”`` or ``introduction``."""
    return heading if heading == INTRO else f"§{m.group(1)}" if (m := NUMBER_RE.match(heading)) else f"“{heading}”"


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


def section_cells(nb: NotebookNode, heading: str, skip: tuple[str, ...] = ()) -> list:
    """The cells of the section ``## heading``: its heading cell up to the next ``# `` or ``## ``
    (:data:`INTRO`: the cells before the first ``## ``, its setup code left out), without the
    ``### `` sub-sections named in ``skip`` (a sub-section ends at the next heading)."""
    cells, inside, skipping = [], heading == INTRO, False
    for cell in nb.cells:
        text = cell.source.lstrip() if cell.cell_type == "markdown" else ""
        if text.startswith("## ") or (text.startswith("# ") and heading != INTRO):
            inside = _heading(cell) == heading
        if text.startswith(("# ", "## ", "### ")):
            skipping = (m := SUBSECTION_RE.match(text)) is not None and m.group(1).strip() in skip
        if inside and not skipping and not (heading == INTRO and cell.cell_type == "code"):
            cells.append(cell)
    return cells


def _subheadings(cells: list) -> list[str]:
    return [m.group(1).strip() for c in cells if c.cell_type == "markdown"
            and (m := SUBSECTION_RE.match(c.source.lstrip()))]


def _resolve(stem: str, wanted, headings: list[str], where: str) -> str:
    """The heading that ``wanted`` (a section's number or its whole heading) names."""
    if wanted == INTRO:
        return INTRO
    for heading in headings:
        number = NUMBER_RE.match(heading)
        if str(wanted) == heading or (number and str(wanted) == number.group(1)):
            return heading
    listed = "; ".join(headings)
    raise LabkitError(f"{where}: {stem} has no section {wanted!r}. Its sections: {listed}.",
                      f"name a section by its number (1, \"2b\"), by its whole heading or as {INTRO}. " + FIX)


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
        # libyaml's safe loader where PyYAML was built with it (ten times faster), else PyYAML's own
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except OSError as exc:
        raise LabkitError(f"Cannot read the session plans {path} ({exc.strerror}).",
                          "restore data/plans.yaml, or reinstall labkit (it ships in labkit/data/).") from None
    except yaml.YAMLError as exc:
        raise LabkitError(f"{path.name} is not valid YAML ({exc}).", "fix the line the parser names.") from None
    if not isinstance(data, dict) or not isinstance(data.get("plans"), dict):
        raise LabkitError(f"{path.name} has no `plans:` mapping (plan name: plan).", FIX)
    return data


def _field(entry: object, key: str, kind: type, where: str) -> Any:
    """``entry[key]``, checked to be a ``kind`` (str, int or list): its type is the caller's."""
    value = entry.get(key) if isinstance(entry, dict) else None
    if kind is list and value is None and key in ("skip", "quiz"):
        return []
    if not isinstance(value, kind) or isinstance(value, bool) or (isinstance(value, str) and not value.strip()) \
            or (isinstance(value, int) and value <= 0):
        wanted = {int: "a whole number of minutes above 0", str: "some text", list: "a list"}[kind]
        raise LabkitError(f"{where}: `{key}` must be {wanted}, not {value!r}.", FIX)
    return value.strip() if isinstance(value, str) else value


def _item(raw: dict, where: str) -> Item:
    """One item of a plan, each field checked in turn (the first problem raises, naming it)."""
    stem = _field(raw, "notebook", str, where)
    nb = _read_notebook(stem, where)
    headings = section_headings(nb)
    chosen = _chosen_sections(raw, stem, headings, where)
    mode, fallback = _mode_and_fallback(raw, where)
    sections = tuple(sorted(chosen, key=lambda h: -1 if h == INTRO else headings.index(h)))
    skip = _skipped(raw, nb, sections, where)
    quiz = _quiz(raw, sections, where)
    ask_before = _ask_before(raw, stem, headings, sections, where)
    return Item(stem, sections, _field(raw, "minutes", int, where), mode,
                _field(raw, "about", str, where), _field(raw, "ask", str, where),
                _field(raw, "expect", str, where), fallback, skip, quiz, ask_before)


def _chosen_sections(raw: dict, stem: str, headings: list[str], where: str) -> list[str]:
    """The headings of the sections the item names, each named once."""
    wanted = _field(raw, "sections", list, where)
    chosen = [_resolve(stem, w, headings, where) for w in wanted]
    if len(set(chosen)) != len(chosen):
        raise LabkitError(f"{where}: a section of {stem} is named twice.", "name each section once. " + FIX)
    return chosen


def _mode_and_fallback(raw: dict, where: str) -> tuple[str, str]:
    """The item's mode, one of ``MODES``, and its fallback, which a live demo must have."""
    mode = _field(raw, "mode", str, where)
    if mode not in MODES:
        raise LabkitError(f"{where}: `mode` is {mode!r}.", f"write one of: {', '.join(MODES)}. " + FIX)
    fallback = raw.get("fallback") or ""
    if mode == "live" and not str(fallback).strip():
        raise LabkitError(f"{where}: a live demo has no `fallback`.",
                          "say which slide of the plan's deck, or which stored output, to show if the live "
                          "run misbehaves. " + FIX)
    return mode, str(fallback).strip()


def _skipped(raw: dict, nb: NotebookNode, sections: tuple[str, ...], where: str) -> tuple[str, ...]:
    """The ``### `` sub-headings the item skips, each one of its sections' sub-headings."""
    subs = [s for h in sections for s in _subheadings(section_cells(nb, h))]
    skip = tuple(str(s).strip() for s in _field(raw, "skip", list, where))
    if unknown := [s for s in skip if s not in subs]:
        raise LabkitError(f"{where}: its sections have no sub-heading {unknown[0]!r}. "
                          f"Their sub-headings: {'; '.join(subs) or 'none'}.",
                          "name a `### ` sub-heading of the item's sections, without the ###. " + FIX)
    return skip


def _quiz(raw: dict, sections: tuple[str, ...], where: str) -> tuple[str, ...]:
    """The ids of the costly-answer statements the item quizzes: known ids, on one section."""
    quiz = tuple(str(q) for q in _field(raw, "quiz", list, where))
    if quiz:
        from .drill import load_costly

        known = {c.id for c in load_costly()}
        if unknown := [q for q in quiz if q not in known]:
            raise LabkitError(f"{where}: there is no quiz statement {unknown[0]!r}.",
                              "name ids of data/costly_answers.yaml, like c01. " + FIX)
        if len(sections) != 1:
            raise LabkitError(f"{where}: a quiz item names {len(sections)} sections.",
                              "name the one section whose cells the quiz's slides replace. " + FIX)
    return quiz


def _ask_before(raw: dict, stem: str, headings: list[str], sections: tuple[str, ...], where: str) -> str:
    """The section whose first slide answers the item's question (one of its sections), or ""."""
    ask_before = _resolve(stem, raw["ask_before"], headings, where) if raw.get("ask_before") else ""
    if ask_before and ask_before not in sections:
        raise LabkitError(f"{where}: `ask_before` names {ask_before!r}, not one of the item's sections.",
                          "name the section of the item whose first slide answers the question. "
                          + FIX)
    return ask_before


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


def _output(cell) -> tuple[int, int, int, str]:
    """A code cell's output: its lines of text (a table's rows), its figures, the steps of its
    session transcripts (counted apart from the lines), and its text."""
    lines, figures, steps, texts = 0, 0, 0, []
    for out in cell.get("outputs", []):
        data = out.get("data", {})
        if "image/png" in data:
            figures += 1
        elif "text/html" in data:
            lines += "".join(data["text/html"]).count("<tr")
            texts.append("".join(data["text/html"]))
        else:
            texts.append("".join(out.get("text", data.get("text/plain", ""))).strip("\n"))
            if TRANSCRIPT_RE.match(texts[-1]):
                steps += len(STEP_RE.findall(texts[-1]))
            else:
                lines += texts[-1].count("\n") + 1
    return lines, figures, steps, "\n".join(texts)


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
    slides, words, seconds, code_cells, switches = 0, 0, 0.0, 0, 0
    shown: Counter[str] = Counter()                          # the current slide's words
    said: Counter[str] = Counter()
    notes: Counter[str] = Counter()
    ran = False                                              # the current slide has code run
    for cell in deck.cells:
        kind = cell.metadata.get("slideshow", {}).get("slide_type", "-")
        if kind == "skip":
            continue
        if kind in ("slide", "subslide"):
            slides += 1
            words += _spoken(shown, said, notes)
            shown, said, notes, ran = Counter(), Counter(), Counter(), False
        if cell.cell_type == "markdown":
            text = _words(cell.source)
            if kind == "notes":
                notes += text
            else:
                said += text
                shown += text
                visible = training.DETAILS_RE.sub(" ", cell.source)
                seconds += INTERVIEW_S * ("**Say it in an interview" in visible) \
                    + PREDICT_S * bool(PREDICT_RE.search(visible))
        elif cell.cell_type == "code":
            if not cell.metadata.get("transient", {}).get("remove_source"):
                code_cells += 1
                switches += not ran
                ran = True
                seconds += CODE_LINE_S * sum(1 for line in cell.source.split("\n") if line.strip())
                shown += _words(cell.source)
            lines, figures, steps, printed = _output(cell)
            seconds += min(OUTPUT_MAX_S, OUTPUT_LINE_S * lines) + FIGURE_S * figures + TRANSCRIPT_ROW_S * steps
            shown += _words(printed)
    words += _spoken(shown, said, notes)
    seconds += SLIDE_S * slides + 60 * words / WORDS_PER_MIN
    if live:
        seconds += LIVE_CELL_S * code_cells + SWITCH_S * switches + run_s
    return Estimate(slides, seconds)


def quiz_cells(item: Item) -> list:
    """The slides of a quiz item: its section's heading, then one slide per statement with its
    choices in the order of costly_answers.yaml, its answer and why in the speaker notes."""
    from .drill import LETTERS, load_costly

    by_id = {c.id: c for c in load_costly()}
    cells = [_cell(f"## {item.sections[0]}\n\n{len(item.quiz)} things a candidate might say about what we "
                   "saw today. Something is wrong with each: which letter says what?", "slide", "quiz")]
    for quiz_id in item.quiz:
        c = by_id.get(quiz_id)
        if c is None:
            raise LabkitError(f"The quiz of {item.notebook} names {quiz_id!r}, a statement costly_answers.yaml "
                              "does not hold.", FIX)
        letters = LETTERS[:len(c.choices)]
        choices = "\n\n".join(f"**{letter})** {choice}" for letter, choice in zip(letters, c.choices))
        cells += [_cell(f"### {c.id} · what is wrong?\n\n> “{c.statement}”\n\n{choices}\n\n"
                        f"**Vote:** {', '.join(letters[:-1])} or {letters[-1]}?", "slide", f"quiz-{c.id}"),
                  _cell(f"**Answer: {c.answer})** {c.why}\n\nThe room votes on this slide's letters first; "
                        f"then the answer. Notebook {c.notebook[:2]} shows why.", "notes", f"quiz-{c.id}-notes")]
    return cells


def item_cells(item: Item, nb: NotebookNode, heading: str) -> list:
    """The cells ``item`` shows of its section ``heading``: the section's, without the skipped
    sub-sections, or for a quiz item its statements' slides; before the section ``ask_before``
    names, a slide with the item's question."""
    cells = quiz_cells(item) if item.quiz else section_cells(nb, heading, item.skip)
    if heading == item.ask_before:
        cells = [_cell(f"**Before we look:** {item.ask}", "slide", "ask"),
                 _cell("Take two or three answers from the room now: the next slide answers the question. "
                       f"**Expected:** {item.expect}", "notes", "ask-notes"), *cells]
    return cells


def item_estimates(item: Item, measured: dict[str, dict[str, float]] | None = None) -> list[Estimate]:
    """Per section of ``item``, its estimate (the item's question is not included)."""
    measured = run_seconds() if measured is None else measured
    nb = _read_notebook(item.notebook)
    return [estimate(training.deck_notebook(_sub_notebook(nb, item_cells(item, nb, h))), item.mode == "live",
                     measured.get(item.notebook, {}).get(h, 0.0))
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


def clock(minutes: int) -> str:
    """``0:31``: a start time, in hours and minutes from the session's start."""
    return f"{minutes // 60}:{minutes % 60:02d}"


def starts(plan: Plan) -> list[int]:
    """The minute each item starts at, then the room's questions and the buffer."""
    at = [plan.introduction]
    for minutes in [i.minutes for i in plan.items] + [plan.questions]:
        at.append(at[-1] + minutes)
    return at


def _agenda(plan: Plan) -> str:
    rows = [(0, plan.introduction, "introduction"),
            *((at, i.minutes, f"{i.label()}: {i.about} ({i.mode})") for at, i in zip(starts(plan), plan.items)),
            (starts(plan)[-2], plan.questions, "your questions")]
    return "\n".join(f"- **{clock(at)}** · {what} · {m} min" for at, m, what in rows)


def _run_note(item: Item) -> str:
    if item.quiz:
        return ("**Show:** one slide per statement. The room votes on this deck's letters: the choices are "
                "in the order `labkit drill quiz` prints, while the notebook's quiz widget shuffles them, so "
                "do not open the widget for the vote.")
    if item.mode == "shown":
        return "**Show:** the stored outputs on these slides; run nothing."
    first = item.sections[0] in (INTRO, section_headings(_read_notebook(item.notebook))[0])
    skip = f" Stop before {', '.join(f'“{s}”' for s in item.skip)}: they are not in this plan." if item.skip else ""
    return (f"**Run live** in your working copy, `work/notebooks/{item.notebook}.ipynb` (the one `make lab` opens)"
            + (", from the top: the setup cell, then every cell down to the end of these sections, in order."
               if first else ": its setup cell, then the cells of these sections, in order.") + skip)


def _item_notes(plan: Plan, n: int, item: Item, estimates: list[Estimate], minutes: list[int]) -> str:
    notes = [f"**At {clock(starts(plan)[n - 1])} · {n} of {len(plan.items)} · {item.minutes} min · {item.mode}** · "
             f"{item.label()}: {item.about} (sections: {' · '.join(f'{m} min' for m in minutes)}; "
             f"estimated {_with_question(estimates).minutes:.1f} min with the question).",
             _run_note(item), f"**Ask the room:** {item.ask}"
             + (f" (on the question slide before {section_label(item.ask_before)}"
                ": the slide after it answers the question)" if item.ask_before else ""),
             f"**Expected:** {item.expect}"]
    if item.fallback:
        notes.append(f"**If the live run misbehaves:** {item.fallback}")
    return "\n\n".join(notes)


def _named_heading(source: str, name: str) -> str:
    """``source`` with ``name`` after the ``#`` marks of its first heading."""
    return re.sub(r"^(#{1,3}) ", lambda m: f"{m.group(1)} {name} — ", source, count=1, flags=re.M)


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
            part = copy.deepcopy(item_cells(item, source, heading))
            for cell in part:
                cell["id"] = f"p{n}-{cell.get('id', k)}"
            headed = [c for c in part if c.cell_type == "markdown" and re.search(r"^#{1,3} ", c.source, re.M)]
            if k == 0 and headed:           # the room sees which notebook this is
                name = training.short_name(source)
                headed[0].source = _named_heading(headed[0].source, name)
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

    at = starts(plan)
    rows = [f"| {plan.introduction} | 0:00 | introduction: the question of the session, the agenda | — | — | — |"]
    rows += [f"| {i.minutes} | {clock(a)} | {i.label()}: {cell(i.about)} | {i.mode} | {cell(i.ask)} | "
             f"{cell(i.fallback) or '—'} |" for a, i in zip(at, plan.items)]
    rows += [f"| {plan.questions} | {clock(at[-2])} | the room's questions | — | — | — |",
             f"| {plan.buffer} | {clock(at[-1])} | buffer | — | — | — |"]
    return (f"**{plan.minutes} minutes: {plan.title}**\n\n"
            "| minutes | starts | notebook, sections | live or shown | ask the room | if the live run misbehaves |\n"
            "|---|---|---|---|---|---|\n" + "\n".join(rows))
