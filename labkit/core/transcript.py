"""A run of sessions, rendered: text (one row per event, one column per session),
HTML (the same table, coloured) and a swimlane chart (holding vs waiting).

``Sessions.transcript()`` builds one from a run; this module needs only the run's names, its
steps and whether it tracked locks (:class:`Run`), so it never imports the session engine.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Protocol

from .plots import PALETTE, legend_beside
from .steps import Step
from .text import TEXT_WIDTH
from .text import table as text_table


@dataclass
class Row:
    n: str                 # "1", "2", ... ; a completion row reuses its step's number + "'"
    session: str
    text: str              # what goes in the session's column
    note: str
    locks: str
    kind: str              # ok, error, waiting, completed


class Run(Protocol):
    """What a transcript reads from a run of sessions."""

    names: list[str]
    steps: list[Step]
    track_locks: bool


class Transcript:
    def __init__(self, names: list[str], rows: list[Row], steps: list[Step], show_locks: bool):
        self.names = names
        self.rows = rows
        self.steps = steps
        self.show_locks = show_locks

    @classmethod
    def from_run(cls, run: Run, *, show_locks: bool | None = None,
                 lock_detail: bool = False) -> Transcript:
        """``lock_detail``: after "waits for A", the lock the step asked for, as the server
        names it (InnoDB's ``RECORD X,GAP on PRIMARY: 5``)."""
        rows: list[Row] = []
        locks_known = run.track_locks if show_locks is None else show_locks
        for step in run.steps:
            if step.waited:
                blockers = ", ".join(step.blocked_by) or "?"
                if lock_detail and step.wait_event:
                    blockers += f"; asked for {step.wait_event}"
                rows.append(Row(str(step.index + 1), step.session, _cell(step.label, "<waiting ...>"),
                                f"BLOCKS (waits for {blockers})", _locks(step, run.names), "waiting"))
            else:
                rows.append(Row(str(step.index + 1), step.session,
                                _cell(step.label, "→ " + step.outcome(brief=True)),
                                _note(step), _locks(step, run.names), "error" if step.error else "ok"))
            own = rows[-1]      # this step's row: what it caused is noted there
            # waiting steps that moved on to wait behind someone else after this step
            for other in run.steps:
                for after, new_blockers in other.rewaits:
                    if after == step.index:
                        own.note = _join(own.note, f"{other.session} now waits for {', '.join(new_blockers)}")
            rows += _completions(run, step, own)
        return cls(run.names, rows, run.steps, locks_known)

    # -- text ------------------------------------------------------------------------
    def to_text(self, width: int = TEXT_WIDTH) -> str:
        """One row per event, one column per session, within ``width`` characters: the columns
        share it, and a long cell wraps inside its own column."""
        cols = ["#"] + self.names + ["note"] + (["locked rows"] if self.show_locks else [])
        table = []
        for r in self.rows:
            cells = [r.n] + [r.text if r.session == s else "" for s in self.names] + [r.note]
            if self.show_locks:
                cells.append(r.locks)
            table.append(cells)
        return text_table(cols, table, width)

    def to_lines(self, width: int = TEXT_WIDTH) -> str:
        """The same steps one row each -- number, session, what it ran and got, the note, the
        rows locked after it: narrower than :meth:`to_text` when there are many sessions."""
        cols = ["#", "session", "step → result", "note"] + (["rows locked"] if self.show_locks else [])
        table = [[r.n, r.session, r.text, r.note] + ([r.locks] if self.show_locks else [])
                 for r in self.rows]
        return text_table(cols, table, width, rule=False)

    def __str__(self) -> str:
        return self.to_text()

    def print(self) -> None:
        print(self.to_text())

    # -- HTML ------------------------------------------------------------------------
    def to_html(self) -> str:
        colours = {"waiting": "#f6e3a1", "error": "#f4b6b6", "completed": "#cfe8cf", "ok": "#ffffff"}
        head = "".join(f"<th>{html.escape(c)}</th>" for c in
                       ["#"] + self.names + ["note"] + (["locked rows"] if self.show_locks else []))
        body = []
        for r in self.rows:
            cells = [f"<td>{html.escape(r.n)}</td>"]
            for s in self.names:
                if s == r.session:
                    cells.append(f'<td style="background:{colours[r.kind]};color:#000;font-family:monospace">'
                                 f"{html.escape(r.text)}</td>")
                else:
                    cells.append("<td></td>")
            cells.append(f"<td>{html.escape(r.note)}</td>")
            if self.show_locks:
                cells.append(f'<td style="font-family:monospace">{html.escape(r.locks)}</td>')
            body.append("<tr>" + "".join(cells) + "</tr>")
        return ('<table class="labkit-transcript" style="border-collapse:collapse">'
                f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")

    def _repr_html_(self) -> str:
        return self.to_html()

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(self.to_text())

    # -- swimlane ----------------------------------------------------------------------
    def swimlane(self, ax=None, title: str = "Who holds, who waits"):
        """Per session: spans where it holds row locks (solid) and waits (hatched), by step."""
        import matplotlib.pyplot as plt


        if ax is None:
            _, ax = plt.subplots(figsize=(11, min(6.4, 1.6 + 0.7 * len(self.names))))
        n = len(self.steps)
        for lane, name in enumerate(self.names):
            y = len(self.names) - 1 - lane
            holds = [bool(st.locks_after.get(name)) for st in self.steps]
            spans = _spans(holds)
            ax.broken_barh([(a + 0.5, b - a) for a, b in spans], (y - 0.3, 0.6),
                           facecolors=PALETTE[0], label="holds row locks" if lane == 0 else None)
            for st in self.steps:
                if st.session == name and st.waited:
                    # from its own step's column up to the step that let it through
                    end = st.completed_after if st.completed_after is not None else n
                    ax.broken_barh([(st.index + 0.5, max(end - st.index, 1))], (y - 0.3, 0.6),
                                   facecolors="none", edgecolors=PALETTE[1], hatch="///",
                                   label="waits for a lock" if not ax.get_legend_handles_labels()[1].count(
                                       "waits for a lock") else None)
                if st.session == name and st.error:
                    ax.plot(st.index + 1, y, marker="x", color=PALETTE[2], markersize=10,
                            label="error" if not ax.get_legend_handles_labels()[1].count("error") else None)
        ax.set_yticks(range(len(self.names)))
        ax.set_yticklabels(list(reversed(self.names)))
        ax.set_xlim(0.5, n + 0.5)
        ax.set_xticks(range(1, n + 1))
        ax.set_xlabel("step of the script")
        ax.set_title(title)
        legend_beside(ax)
        return ax


def _spans(flags: list[bool]) -> list[tuple[int, int]]:
    spans, start = [], None
    for i, f in enumerate(flags + [False]):
        if f and start is None:
            start = i
        elif not f and start is not None:
            spans.append((start, i))
            start = None
    return spans


def _note(step: Step) -> str:
    if step.error:
        if step.error.engine == "mysql":          # MySQL / MariaDB: see labkit.core.mysessions
            return {"nowait": "NOWAIT: fails at once; the transaction goes on",
                    "lock_timeout": "lock wait timeout; the transaction goes on",
                    "statement_timeout": "statement timeout",
                    "deadlock": "deadlock: the transaction is rolled back"}.get(step.error.kind, "")
        if step.error.sqlstate == "25P02":
            return "transaction already failed: every statement errors until ROLLBACK"
        return {"nowait": "NOWAIT: fails at once", "lock_timeout": "lock_timeout expired",
                "statement_timeout": "statement_timeout expired",
                "deadlock": "deadlock detected"}.get(step.error.kind, "error: the transaction is aborted")
    if step.done and step.results and step.results[-1].command == "ROLLBACK" and \
            step.sql.strip().rstrip(";").upper() in ("COMMIT", "END", "COMMIT TRANSACTION"):
        return "the transaction had failed: COMMIT rolled it back"
    return ""


LABEL_WIDTH = 30
OUTCOME_WIDTH = 50


def _cell(label: str, outcome: str) -> str:
    """A session's cell: the step's label (shortened first) and what it got."""
    return f"{_clip(label, LABEL_WIDTH)}  {_clip(outcome, OUTCOME_WIDTH)}"


def _locks(step: Step, names: list[str]) -> str:
    parts = []
    for name in names:
        held = step.locks_after.get(name)
        if held:
            parts.append(f"{name}:{','.join(str(k) for k in held)}")
    return " ".join(parts)


def _completions(run: Run, step: Step, own: Row) -> list[Row]:
    """The rows of the steps that ``step`` let through (or that finished while the script
    waited), noting "unblocks" on ``own``, the step's row; a step that waited behind another
    waiting step is let through by that step's completion, and the note goes on its row."""
    rows: list[Row] = []
    let_through = {step.session: own}
    for other in run.steps:
        if not (other.waited and other.completed_after == step.index
                and (other is not step or other.script_waited)):
            continue
        if other.script_waited:
            note = _join(_note(other), "the script waited for it")
        else:
            behind = other.rewaits[-1][1] if other.rewaits else other.blocked_by
            by = next((let_through[b] for b in behind if b in let_through), own)
            by.note = _join(by.note, f"unblocks {other.session}")
            note = _note(other)
        rows.append(Row(f"{other.index + 1}'", other.session,
                        f"<... completed> → {other.outcome(brief=True)}", note, "",
                        "error" if other.error else "completed"))
        let_through[other.session] = rows[-1]
    return rows


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a else b


def _clip(text: str, width: int) -> str:
    """``text`` shortened to ``width`` characters with "…", at a space when one falls in the
    second half, so that no word is cut."""
    if len(text) <= width:
        return text
    cut = text[: width - 1]
    space = cut.rfind(" ") if text[width - 1] != " " else len(cut)
    return (cut[:space].rstrip() if space >= width // 2 else cut) + "…"
