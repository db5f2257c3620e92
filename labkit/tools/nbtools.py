"""Keeping the committed notebooks honest: executed, with outputs, no widget state, saved
byte for byte as JupyterLab saves them (so that opening and saving one changes nothing).

``labkit execute [NOTEBOOK ...]`` executes notebooks in place (from the notebooks/ folder,
with the current Python) and strips what must not be committed.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.errors import LabkitError
from ..core.text import fit_widths, row_lines, wrap

if TYPE_CHECKING:
    from nbformat import NotebookNode

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
# A notebook longer than one sitting says where to stop: a markdown cell that starts with this
# (labkit.tools.timing counts each sitting's minutes; the map says how many sittings).
PAUSE = "**A good place to pause.**"


def is_pause(cell: dict) -> bool:
    """Whether ``cell`` (a notebook's cell, as nbformat or json reads it) is a pause cell: a
    markdown cell whose text starts with :data:`PAUSE`."""
    if cell.get("cell_type") != "markdown":
        return False
    source = cell.get("source", "")
    return ("".join(source) if isinstance(source, list) else str(source)).lstrip().startswith(PAUSE)


def slide_type(cell: NotebookNode) -> str:
    """Where a cell goes in the slide deck: headings start slides, the interview box and
    exercises get a slide of their own, everything else follows on the current slide."""
    first = cell.source.lstrip().split("\n", 1)[0] if cell.source.strip() else ""
    if cell.cell_type == "markdown":
        if first.startswith(("# ", "## ")):
            return "slide"
        if first.startswith("### ") or first.startswith("> **Say it in an interview"):
            return "subslide"
        if first.startswith("**Exercise"):
            return "subslide"
    return "-"


# Where a markdown cell is split so that each part can start a slide of its own: a `## ` or
# `### ` heading, the interview box and an exercise, when other text comes before them.
SPLIT_AT = re.compile(r"(?:#{2,3} |> \*\*Say it in an interview|\*\*Exercise)")


def split_points(source: str) -> list[int]:
    """Line numbers in ``source`` where a new slide must start (outside code fences and
    ``<details>``, and never at the first line with text)."""
    points, fenced, details, seen_text = [], False, 0, False
    for i, line in enumerate(source.split("\n")):
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
        elif not fenced:
            details += stripped.count("<details") - stripped.count("</details>")
            if (seen_text and details == 0 and SPLIT_AT.match(line)
                    and (i == 0 or not source.split("\n")[i - 1].strip().startswith(">"))):
                points.append(i)
        seen_text = seen_text or bool(stripped)
    return points


def split_markdown_at_headings(nb: NotebookNode) -> int:
    """Split markdown cells at every section heading, interview box and exercise that comes
    after other text, so each starts a slide (code cells and outputs are untouched). The new
    cells get their slide type by ``slide_type``; returns how many cells were added."""
    import nbformat

    cells, added = [], 0
    for cell in nb.cells:
        points = split_points(cell.source) if cell.cell_type == "markdown" else []
        if not points:
            cells.append(cell)
            continue
        lines = cell.source.split("\n")
        bounds = [0, *points, len(lines)]
        for n, (a, b) in enumerate(zip(bounds, bounds[1:])):
            text = "\n".join(lines[a:b]).strip("\n")
            if n == 0:
                cell.source = text
                cells.append(cell)
                continue
            part = nbformat.v4.new_markdown_cell(text)
            part.metadata = {k: copy.deepcopy(v) for k, v in cell.metadata.items() if k != "slideshow"}
            part.metadata["slideshow"] = {"slide_type": slide_type(part)}
            cells.append(part)
            added += 1
    nb.cells = cells
    return added


def add_slide_metadata(nb: NotebookNode) -> None:
    """Give every cell slideshow metadata (an author's own choice is kept)."""
    for cell in nb.cells:
        cell.metadata.setdefault("slideshow", {"slide_type": slide_type(cell)})


def clean(nb: NotebookNode) -> None:
    """Drop widget state and per-cell execution timing (both change on every run), split
    markdown cells at headings that come after other text, and make sure every cell carries
    slide metadata."""
    split_markdown_at_headings(nb)
    add_slide_metadata(nb)
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        cell.metadata.pop("ExecuteTime", None)
        if cell.cell_type == "code":
            cell.outputs = merge_streams(cell.get("outputs", []))
            for out in cell.outputs:
                # widget views cannot render without the stripped state
                data = out.get("data", {})
                data.pop("application/vnd.jupyter.widget-view+json", None)


def merge_streams(outputs: list) -> list:
    """Adjacent chunks of one stream as one output: how a print is split into chunks depends
    on the kernel's timing, and a committed notebook should not change with it."""
    merged: list = []
    for out in outputs:
        last = merged[-1] if merged else None
        if (out.get("output_type") == "stream" and last is not None
                and last.get("output_type") == "stream" and last.get("name") == out.get("name")):
            last["text"] = "".join(last["text"]) + "".join(out["text"])
        else:
            merged.append(out)
    return merged


# An author's home folder in a committed output names the author and means nothing to a reader.
HOME_PATH = re.compile(r"(?<![\w.~])(/root/|/home/[^/\s\\\"]+/|/Users/[^/\s\\\"]+/)")


# A widget without a static view prints as its repr in every reader that has no widget front end.
WIDGET_REPR = re.compile(r"\b[HV]Box\(children=")


KERNEL_DISPLAY_NAME = "Python 3 (ipykernel)"     # what JupyterLab writes for ipykernel's kernel


def jupyter_text(nb: NotebookNode) -> str:
    """The file JupyterLab saves for ``nb``: jupyter_server's contents manager writes it with
    ``nbformat.write`` (one-space indent, sorted keys, non-ASCII as it is, a final newline)."""
    import io

    import nbformat

    out = io.StringIO()
    nbformat.write(nb, out, version=nbformat.NO_CONVERT)
    return out.getvalue()


def _file_problems(nb: NotebookNode, text: str | None) -> list[str]:
    """What JupyterLab would change in the file on opening and saving it, and widget state."""
    found = []
    if text is not None and text != jupyter_text(nb):
        found.append("not saved as Jupyter saves it (one-space indent, sorted keys, non-ASCII as it is, "
                     "a final newline): opening and saving it in JupyterLab would change the file")
    if "widgets" in nb.metadata:
        found.append("carries widget state metadata")
    shown = nb.metadata.get("kernelspec", {}).get("display_name")
    if shown not in (None, KERNEL_DISPLAY_NAME):
        found.append(f"kernelspec display name {shown!r} is not {KERNEL_DISPLAY_NAME!r}, which JupyterLab "
                     "writes: opening the notebook would change the file")
    return found


def _cell_problems(i: int, cell) -> list[str]:
    """What is wrong with code cell ``i``: never run, timing kept, and its outputs' problems."""
    found = []
    if cell.get("execution_count") is None:
        found.append(f"cell {i} was never executed")
    if "execution" in cell.metadata:
        found.append(f"cell {i} carries execution timing metadata")
    for out in cell.get("outputs", []):
        found += _output_problems(i, out)
    return found


def _output_problems(i: int, out) -> list[str]:
    """What is wrong with an output of cell ``i``: an error, a widget's repr, a home folder."""
    found = []
    if out.get("output_type") == "error":
        found.append(f"cell {i} ends in an error ({out.get('ename')})")
    text = json.dumps(out)
    if WIDGET_REPR.search(text):
        found.append(f"cell {i} shows a widget's repr instead of a static view")
    home = HOME_PATH.search(text)
    if home:
        found.append(f"cell {i} shows a home folder path ({home.group(0)}…)")
    return found


def problems(nb: NotebookNode, text: str | None = None) -> list[str]:
    """What would make a committed notebook untrustworthy; given the file's ``text`` (which
    ``nb`` was read from), also a file JupyterLab would rewrite on opening and saving it."""
    found = _file_problems(nb, text)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and cell.source.strip():
            found += _cell_problems(i, cell)
    if any("slideshow" not in c.metadata for c in nb.cells):
        found.append("cells without slide metadata (run labkit.nbtools on it)")
    counts = [c.execution_count for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    if counts and counts != list(range(1, len(counts) + 1)):
        found.append("cells were not run top to bottom in one fresh kernel")
    return found


def run_notebook(nb: NotebookNode, folder: Path, timeout: int = 600) -> None:
    """Run ``nb`` top to bottom in a fresh python3 kernel started in ``folder``.  The kernel
    talks to this process over Unix sockets in a folder of its own that only this user can
    open, not over TCP, where everything (code and outputs) would travel as plain text."""
    import tempfile

    from nbclient import NotebookClient
    from traitlets.config import Config

    with tempfile.TemporaryDirectory(prefix="labkit-kernel-") as sockets:
        config = Config({"KernelManager": {"transport": "ipc", "ip": str(Path(sockets) / "kernel")}})
        NotebookClient(nb, timeout=timeout, kernel_name="python3", config=config,
                       resources={"metadata": {"path": str(folder)}}).execute()


# A run's wall time is recorded to a multiple of this: finer than that is noise between runs.
RUN_STEP_S = 10
# A new run time this close to the recorded one (as a share of it) keeps the file unchanged.
RUN_KEEP_WITHIN = 0.25


def recorded_run_seconds(wall_s: float, old: object = None) -> int | float:
    """What ``metadata.claimlab.run_seconds`` holds after a run of ``wall_s`` seconds: the
    time rounded up to a multiple of RUN_STEP_S, or the ``old`` value when the new one is
    within RUN_KEEP_WITHIN of it (so that re-running a notebook does not churn its file)."""
    import math

    if isinstance(wall_s, bool) or not isinstance(wall_s, (int, float)) or not math.isfinite(wall_s) \
            or wall_s < 0:
        raise LabkitError(f"A run time of {wall_s!r} seconds is not a time.",
                          "pass the run's wall time in seconds, 0 or more (time.monotonic() differences).")
    new = math.ceil(wall_s / RUN_STEP_S) * RUN_STEP_S
    if (not isinstance(old, bool) and isinstance(old, (int, float)) and math.isfinite(old) and old > 0
            and abs(new - old) <= RUN_KEEP_WITHIN * old):
        return old
    return new


def execute(path: Path, timeout: int = 600) -> None:
    """Run the notebook at ``path`` in place, record its wall time in
    ``metadata.claimlab.run_seconds`` (:func:`recorded_run_seconds`) and clean it."""
    import time

    import nbformat

    nb = nbformat.read(path, as_version=4)
    started = time.monotonic()
    run_notebook(nb, path.parent, timeout)
    meta = nb.metadata.setdefault("claimlab", {})
    meta["run_seconds"] = recorded_run_seconds(time.monotonic() - started, meta.get("run_seconds"))
    clean(nb)
    path.write_text(jupyter_text(nb), encoding="utf-8")


def execute_command(*, notebooks: list[str]) -> int:
    """``labkit execute [NOTEBOOK ...]``: run the notebooks in place (all of them by default)."""
    paths = [Path(p) for p in notebooks] or sorted(NOTEBOOKS.glob("[0-9]*.ipynb"))
    for p in paths:
        print(f"executing {p} ...", flush=True)
        execute(p)
    return 0


def workbook_map(folder: Path = NOTEBOOKS) -> str:
    """The notebooks in order, with their title, time and topic, from their metadata."""
    import json

    rows = []
    for p in sorted(folder.glob("[0-9]*.ipynb")):
        nb = json.loads(p.read_text())
        meta = nb.get("metadata", {}).get("claimlab", {})
        pauses = sum(1 for c in nb.get("cells", []) if is_pause(c))
        teaches = meta.get("teaches", "")
        if pauses:
            teaches = f"({pauses + 1} sittings) {teaches}"
        rows.append((p.name, meta.get("title", ""), f"{meta.get('minutes', '?')} min", teaches))
    total = sum(int(r[2].split()[0]) for r in rows if r[2].split()[0].isdigit())
    rows.append(("", "in all", f"{total} min", ""))
    # what a notebook teaches goes under its name, title and time, indented
    widths = fit_widths(None, [r[:3] for r in rows])
    lines = []
    for *head, teaches in rows:
        lines += row_lines(head, widths, right=[2])
        if teaches:
            lines += wrap(teaches, indent="    ", first="    ")
    return "\n".join(lines)
