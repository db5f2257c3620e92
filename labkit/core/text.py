"""Printed text that fits the page: the width budget, prose wrapped to it, and tables whose
columns share it, a long cell wrapping inside its own column.

Transcripts, traces and the tables the labs print all keep to :data:`TEXT_WIDTH`.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

# The widest line that still shows whole where the workbook is read: JupyterLab on a 1280×720
# projector with the file browser open (105 characters fit), a reveal.js slide's 20-px
# monospace (about 100) and an A4 handout (96 at 8 pt).  A longer line wraps mid-word there,
# and a table's columns fall apart.  (JupyterLab at 150 % zoom holds 83: a zoomed screen
# wraps the widest lines; tests/test_live_widgets.py measures the 1280×720 case.)
TEXT_WIDTH = 96

GAP = "  "


def wrap(text: str, width: int = TEXT_WIDTH, indent: str = "", first: str = "") -> list[str]:
    """``text`` as lines of at most ``width`` characters, broken between words only (a word
    longer than the line stays whole); ``first`` starts the first line, ``indent`` the others."""
    return textwrap.wrap(text, width, initial_indent=first, subsequent_indent=indent,
                         break_long_words=False, break_on_hyphens=False) or [first.rstrip()]


def fill(text: str, width: int = TEXT_WIDTH, indent: str = "", first: str = "") -> str:
    """:func:`wrap`, joined; a text of several lines is wrapped line by line."""
    return "\n".join(line for part in text.split("\n") for line in wrap(part, width, indent, first))


def and_list(items: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``: items named in a sentence (one at least)."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def column_widths(natural: Sequence[int], least: Sequence[int], room: int) -> list[int]:
    """Widths for columns that share ``room`` characters: each keeps its ``natural`` width if
    all fit; otherwise the widest are narrowed to one common cap, never below ``least`` (the
    column's longest word), so the narrow columns stay as they are."""
    if sum(natural) <= room:
        return list(natural)

    def at(cap: int) -> list[int]:
        return [min(n, max(cap, m)) for n, m in zip(natural, least)]

    cap = max(natural)
    while cap > 1 and sum(at(cap)) > room:
        cap -= 1
    return at(cap)


def fit_widths(header: Sequence[str] | None, rows: Sequence[Sequence[str]],
               width: int = TEXT_WIDTH) -> list[int]:
    """The columns' widths for :func:`table`: every column as wide as its longest cell if they
    all fit in ``width``; otherwise the headers wrap first (down to their data's width), then
    the widest data, never below a column's longest word."""
    header = list(header) if header is not None else [""] * len(rows[0])
    ncols = len(header)
    room = width - len(GAP) * (ncols - 1)
    data = [max((len(r[i]) for r in rows), default=0) for i in range(ncols)]
    natural = [max(d, len(h)) for d, h in zip(data, header)]
    soft = [max([d] + [len(w) for w in h.split()]) for d, h in zip(data, header)]
    least = [max([len(w) for r in [header, *rows] for w in r[i].split()], default=0) for i in range(ncols)]
    return column_widths(natural, soft, room) if sum(soft) <= room else column_widths(soft, least, room)


def table(header: Sequence[str] | None, rows: Sequence[Sequence[str]], width: int = TEXT_WIDTH,
          rule: bool = True, right: Sequence[int] = ()) -> str:
    """A text table within ``width``: the header, a rule of dashes, then the rows (no header, no
    rule: ``header=None``).  A cell longer than its column wraps inside it between words; its
    row's other cells stay blank on the continuation lines, so every column keeps its place.
    ``right``: columns aligned right."""
    widths = fit_widths(header, rows, width)
    lines = row_lines(header, widths, right) if header is not None else []
    if rule and header is not None:
        lines.append(GAP.join("-" * w for w in widths))
    for r in rows:
        lines += row_lines(r, widths, right)
    return "\n".join(lines)


def row_lines(cells: Sequence[str], widths: Sequence[int], right: Sequence[int] = ()) -> list[str]:
    """One table row as lines: each cell wrapped to its column's width."""
    parts = [wrap(c, w) if len(c) > w else [c] for c, w in zip(cells, widths)]
    out = []
    for k in range(max(len(p) for p in parts)):
        line = [(p[k] if k < len(p) else "") for p in parts]
        out.append(GAP.join(c.rjust(w) if i in right else c.ljust(w)
                            for i, (c, w) in enumerate(zip(line, widths))).rstrip())
    return out
