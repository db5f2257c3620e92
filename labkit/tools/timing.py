"""How long a notebook takes a learner, computed from the notebook instead of typed by hand.

Every notebook carries ``metadata.claimlab.minutes``, the time the workbook's map and the
session plans show.  Typed by hand, those labels drifted far below the truth; this module
computes them, and ``labkit minutes --check`` (and tests/test_timing.py) keeps them honest.

The model adds up what a learner does, in order:

* **reading**: the notebook's prose at :data:`WORDS_PER_MINUTE`.  Prose is the markdown
  cells' text outside code fences, with HTML tags, HTML comments and link targets dropped
  (nobody reads a URL).  The answers folded in ``<details>`` are not counted: a learner tries
  the exercise first, and one who opens the answer at once has skipped the exercise's time.
* **code cells**: :data:`CODE_CELL_MINUTES` for each code cell with code in it: reading it,
  running it, reading what it printed.
* **exercises**: :data:`EXERCISE_MINUTES` for each markdown cell that starts ``**Exercise``,
  and :data:`CHECKED_EXERCISE_MINUTES` more when the server checks the answer: when a code
  cell right after the exercise (before the next markdown cell) calls a function whose name
  starts with ``check_`` (``drill.check_claim(lab, MY_CLAIM)``), the learner writes, runs,
  reads the verdict and tries again.
* **waiting**: the notebook's recorded run time (``metadata.claimlab.run_seconds``, which
  ``labkit execute`` records; none recorded counts as 0), in minutes.

The sum is rounded up to a multiple of :data:`ROUND_TO_MINUTES`.

The rates come from cold readings: a learner reading a notebook alone, running every cell
and doing the exercises, timed section by section (:data:`COLD_READS` holds each reading with
what the notebook held when it was read). Readers differ: notebook 12, unchanged, took one
reader 49 minutes and another 88, so one reading says little about a notebook on its own.
What a label promises is the typical learner's time: for each notebook read, the model's
minutes are within a third of the mean of its readings (the rates below come within a quarter),
which tests/test_timing.py keeps. The readings put prose at about 70 words a minute, not the
120 an earlier, smaller set of readings suggested: a learner weighs each sentence against the
cell after it, and the transcripts and SQL comments the word count leaves out are read too.

``labkit minutes [NOTEBOOK ...]`` prints the estimate of each notebook and writes it into
its label; ``--check`` writes nothing and exits 1 naming each label that differs.
"""

from __future__ import annotations

import ast
import json
import math
import re
import sys
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from ..core.errors import LabkitError
from ..core.text import fill, table
from .nbtools import NOTEBOOKS, PAUSE, is_pause, jupyter_text  # noqa: F401 (tests read timing.PAUSE)

# Under a third of the pace of reading a novel (about 250): each claim is weighed against the
# cell after it, and the transcripts and SQL comments around the prose are read as well.
WORDS_PER_MINUTE = 70
# Reading a code cell, running it and reading what it printed (a transcript, a table, a figure).
CODE_CELL_MINUTES = Fraction(5, 4)
# Thinking an exercise through and writing an answer before opening the folded one.
EXERCISE_MINUTES = 4
# An answer the server checks is written, run, read and usually tried again at least once.
CHECKED_EXERCISE_MINUTES = 4
# The cold readings the rates follow: (notebook, prose words, code cells, exercises, checked
# ones, run seconds) as the notebook stood when it was read, and the reader's minutes.
COLD_READS = (
    ("10_the_mvcc_horizon", 3208, 14, 2, 1, 30, 95),
    ("10_the_mvcc_horizon", 2715, 15, 2, 1, 40, 96),
    ("10_the_mvcc_horizon", 2927, 15, 2, 1, 40, 100),
    ("10_the_mvcc_horizon", 2927, 15, 2, 1, 40, 109),
    ("11_failures_heartbeats_schedules", 3106, 19, 4, 1, 40, 75),
    ("12_wakeups_and_poolers", 2738, 18, 2, 1, 40, 49),
    ("12_wakeups_and_poolers", 2738, 18, 2, 1, 40, 88),
    ("13_outbox_cursors_and_order", 2910, 22, 3, 2, 20, 75),
    ("13_outbox_cursors_and_order", 2946, 22, 3, 2, 40, 105),
    ("14_change_data_capture", 3653, 17, 3, 1, 10, 90),
    ("14_change_data_capture", 3863, 21, 3, 1, 20, 123),
    ("15_outbox_size_and_inbox", 3456, 16, 2, 1, 20, 77),
    ("15_outbox_size_and_inbox", 3506, 16, 2, 1, 10, 103),
    ("16_how_fast", 1464, 14, 3, 0, 40, 58),
    ("21_other_engines", 2849, 28, 3, 1, 60, 77),
)
# A label finer than five minutes claims a precision that two learners never share.
ROUND_TO_MINUTES = 5
# Longer than any notebook's run: a larger recorded run time is a mistake, not a measurement.
MAX_RUN_SECONDS = 24 * 3600

EXERCISE_START = "**Exercise"


@dataclass(frozen=True)
class Estimate:
    """What a notebook holds, and the minutes a learner needs for it (see the module's text)."""

    prose_words: int
    code_cells: int
    exercises: int
    checked_exercises: int
    run_seconds: float
    minutes: int

    def parts(self) -> list[tuple[str, float]]:
        """Each term of the sum, as (what it counts, its minutes unrounded)."""
        return [
            (f"{self.prose_words:,} words at {WORDS_PER_MINUTE} a minute",
             self.prose_words / WORDS_PER_MINUTE),
            (f"{self.code_cells} code cells at {float(CODE_CELL_MINUTES):g}",
             float(self.code_cells * CODE_CELL_MINUTES)),
            (f"{self.exercises} exercises at {EXERCISE_MINUTES}", self.exercises * EXERCISE_MINUTES),
            (f"{self.checked_exercises} checked at {CHECKED_EXERCISE_MINUTES} more",
             self.checked_exercises * CHECKED_EXERCISE_MINUTES),
            (f"a run of {self.run_seconds:g} s", self.run_seconds / 60),
        ]

    def __str__(self) -> str:
        terms = " + ".join(f"{m:.1f} ({what})" for what, m in self.parts())
        total = sum(m for _, m in self.parts())
        return fill(f"{terms} = {total:.1f}, rounded up to {self.minutes} min", indent="    ")


# -- what a notebook holds ----------------------------------------------------------------------

FENCE = re.compile(r"^(`{3,}|~{3,})")
DETAILS = re.compile(r"(<details\b[^>]*>|</details\s*>)", re.I)
COMMENT = re.compile(r"<!--.*?-->", re.S)
TAG = re.compile(r"</?[A-Za-z][^>]*>")
LINK_TARGET = re.compile(r"\]\([^)]*\)")
WORD = re.compile(r"\S*\w\S*")


def _outside_fences(source: str) -> str:
    """``source`` without its fenced code blocks (a fence in a quote counts too)."""
    kept, fence = [], None
    for line in source.split("\n"):
        bare = line.lstrip(" \t>").lstrip()
        opening = FENCE.match(bare)
        if fence is None:
            if opening:
                fence = opening.group(1)
            else:
                kept.append(line)
        elif opening and opening.group(1)[0] == fence[0] and len(opening.group(1)) >= len(fence) \
                and not bare[len(opening.group(1)):].strip():
            fence = None
    return "\n".join(kept)


def _outside_details(text: str) -> str:
    """``text`` without what ``<details>`` folds away (nested ones too; one left open folds
    everything after it, as a browser shows it)."""
    kept, depth = [], 0
    for piece in DETAILS.split(text):
        if DETAILS.fullmatch(piece):
            depth = depth + 1 if not piece.startswith("</") else max(depth - 1, 0)
        elif depth == 0:
            kept.append(piece)
    return "".join(kept)


def prose_text(source: str) -> str:
    """The words a learner reads in one markdown cell's ``source``: outside code fences and
    ``<details>``, without HTML tags, comments and link targets."""
    text = _outside_details(_outside_fences(COMMENT.sub(" ", source)))
    return TAG.sub(" ", LINK_TARGET.sub("] ", text))


def prose_words(nb: Any) -> int:
    """The words of prose in ``nb``'s markdown cells (see :func:`prose_text`); a word is a run
    of non-space characters with a letter or digit in it, so markup (``|---|``, ``#``, ``>``)
    is no word."""
    return sum(len(WORD.findall(prose_text(_source(c))))
               for c in _cells(nb) if c.get("cell_type") == "markdown")


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def _cells(nb: Any) -> list[dict]:
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise LabkitError(f"Not a notebook: {type(nb).__name__} without a list of cells.",
                          "pass a notebook read with nbformat.read(path, as_version=4) (or its path).")
    return nb["cells"]


CHECK_CALL = re.compile(r"(?<![\w])check_\w*\s*\(")
DEF_LINE = re.compile(r"^\s*(?:async\s+)?def\s", re.M)


def calls_a_check(code: str) -> bool:
    """Whether ``code`` calls a function whose name starts with ``check_`` (a definition of
    one is no call)."""
    lines = code.split("\n")
    magics = [line for line in lines if line.lstrip().startswith(("%", "!"))]    # IPython's own syntax
    if any(CHECK_CALL.search(line) for line in magics):
        return True
    python = "\n".join("" if line in magics else line for line in lines)
    try:
        tree = ast.parse(python)
    except SyntaxError:
        return bool(CHECK_CALL.search(DEF_LINE.sub("", python)))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name.startswith("check_"):
                return True
    return False


def exercises(nb: Any) -> tuple[int, int]:
    """(exercises, checked ones): markdown cells that start ``**Exercise``, and those among
    them whose code cells that follow (up to the next markdown cell) call a ``check_``."""
    cells = _cells(nb)
    found = checked = 0
    for i, cell in enumerate(cells):
        if cell.get("cell_type") != "markdown" or not _source(cell).lstrip().startswith(EXERCISE_START):
            continue
        found += 1
        after = []
        for nxt in cells[i + 1:]:
            if nxt.get("cell_type") == "markdown":
                break
            if nxt.get("cell_type") == "code":
                after.append(_source(nxt))
        checked += any(calls_a_check(code) for code in after)
    return found, checked


def code_cells(nb: Any) -> int:
    """Code cells with code in them (an empty one is neither read nor run)."""
    return sum(1 for c in _cells(nb) if c.get("cell_type") == "code" and _source(c).strip())


def run_seconds(nb: Any) -> float:
    """The run time ``labkit execute`` recorded in ``metadata.claimlab.run_seconds`` (0 when
    none is recorded)."""
    value = ((nb.get("metadata") or {}).get("claimlab") or {}).get("run_seconds", 0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_RUN_SECONDS:
        raise LabkitError(f"The notebook's metadata.claimlab.run_seconds is {value!r}, not a number of "
                          f"seconds from 0 to {MAX_RUN_SECONDS:,}.",
                          "run `labkit execute NOTEBOOK` to record it again, or delete the field.")
    return value


def estimate(nb: Any) -> Estimate:
    """The minutes a learner needs for ``nb`` (a notebook as nbformat reads it, or a path to
    one), and what they are made of."""
    if isinstance(nb, (str, Path)):
        nb = read(Path(nb))
    words, code = prose_words(nb), code_cells(nb)
    found, checked = exercises(nb)
    seconds = run_seconds(nb)
    total = (Fraction(words, WORDS_PER_MINUTE) + code * CODE_CELL_MINUTES + found * EXERCISE_MINUTES
             + checked * CHECKED_EXERCISE_MINUTES + Fraction(seconds) / 60)
    minutes = math.ceil(total / ROUND_TO_MINUTES) * ROUND_TO_MINUTES
    return Estimate(words, code, found, checked, seconds, minutes)


# -- sittings ----------------------------------------------------------------------------------
# A sitting longer than this is one a learner rarely finishes (about an hour).
MAX_SITTING_MINUTES = 60


def sittings(nb: Any) -> list[Estimate]:
    """``nb``'s estimate per sitting: the notebook cut at each markdown cell that starts with
    :data:`PAUSE` (the pause cell opens the next sitting). The recorded run time is shared
    out by each sitting's share of the code cells. One notebook without a pause is one sitting."""
    if isinstance(nb, (str, Path)):
        nb = read(Path(nb))
    cells = _cells(nb)
    cuts = [i for i, c in enumerate(cells) if i and is_pause(c)]
    total_code = code_cells(nb) or 1
    seconds = run_seconds(nb)
    parts = []
    for lo, hi in zip([0, *cuts], [*cuts, len(cells)]):
        part: dict[str, Any] = {"cells": cells[lo:hi], "metadata": {}}
        share = Fraction(code_cells(part), total_code) * Fraction(seconds)
        part["metadata"] = {"claimlab": {"run_seconds": float(share)}}
        parts.append(estimate(part))
    return parts


# -- the command --------------------------------------------------------------------------------

def read(path: Path):
    """The notebook at ``path``, or a LabkitError naming what to pass instead."""
    import nbformat

    fix = "pass notebook files (notebooks/NN_name.ipynb), or none for every numbered notebook."
    if not path.is_file():
        raise LabkitError(f"No notebook at {str(path)!r}.", fix)
    try:
        return nbformat.read(path, as_version=4)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, nbformat.reader.NotJSONError,
            nbformat.validator.ValidationError) as exc:
        raise LabkitError(f"{str(path)!r} cannot be read as a notebook ({str(exc).splitlines()[0]}).",
                          fix) from None


def label(nb: Any) -> Any:
    """The time label ``nb`` carries now (``metadata.claimlab.minutes``), or None."""
    return ((nb.get("metadata") or {}).get("claimlab") or {}).get("minutes")


def minutes_command(*, notebooks: list[str], check: bool, out=print) -> int:
    """``labkit minutes [NOTEBOOK ...] [--check]``: the estimate of each notebook (every
    numbered one by default) as a table; written into each label that differs, or, with
    ``check``, nothing written and exit 1 naming each label that differs."""
    paths = [Path(p) for p in notebooks] or sorted(NOTEBOOKS.glob("[0-9]*.ipynb"))
    read_in = [(p, read(p)) for p in paths]           # every file checked before one is written
    rows, wrong = [], []
    for path, nb in read_in:
        est, now = estimate(nb), label(nb)
        rows.append((path.name, f"{est.prose_words:,}", str(est.code_cells),
                     f"{est.exercises} ({est.checked_exercises})",
                     f"{est.run_seconds:g} s" if est.run_seconds else "-", str(est.minutes),
                     "-" if now is None else str(now)))
        if now != est.minutes:
            wrong.append((path, nb, now, est.minutes))
    out(table(("notebook", "words", "code", "exercises (checked)", "run", "minutes", "label"),
              rows, right=[1, 2, 4, 5, 6]))
    if check:
        for path, _, now, minutes in wrong:
            print(f"{path.name}: labelled {now if now is not None else 'nothing'}, estimated {minutes} "
                  "minutes", file=sys.stderr)
        if wrong:
            print("Fix: `labkit minutes` writes the estimates into the labels (name notebooks for only "
                  "those).", file=sys.stderr)
        return 1 if wrong else 0
    for path, nb, _, minutes in wrong:
        nb.metadata.setdefault("claimlab", {})["minutes"] = minutes
        path.write_text(jupyter_text(nb), encoding="utf-8")
    out(f"relabelled {len(wrong)} of {len(read_in)} notebook(s)")
    return 0
