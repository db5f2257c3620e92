"""What one step of a run gave back: its results or its error, and whether it waited.

:mod:`labkit.core.sessions` runs the steps; :mod:`labkit.core.transcript` renders them.
Both import these classes from here, so neither needs the other's module to name them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

NOWAIT = "nowait"
LOCK_TIMEOUT = "lock_timeout"
STATEMENT_TIMEOUT = "statement_timeout"
DEADLOCK = "deadlock"


@dataclass
class StepError:
    sqlstate: str      # PostgreSQL's SQLSTATE, or MySQL's error number
    message: str
    kind: str  # nowait, lock_timeout, statement_timeout, deadlock, other
    engine: str = "postgresql"   # or "mysql" (MySQL and MariaDB: labkit.core.mysessions)

    def short(self) -> str:
        return f"ERROR {self.sqlstate} {self.message}"

    def brief(self) -> str:
        """A transcript-sized form: the known lock errors in a few words.  (A MySQL error
        keeps the server's own words up to the first semicolon.)"""
        if self.engine == "mysql":
            return f"ERROR {self.sqlstate} {self.message.split(';')[0]}"
        known = {NOWAIT: "could not obtain lock", LOCK_TIMEOUT: "lock timeout",
                 STATEMENT_TIMEOUT: "statement timeout", DEADLOCK: "deadlock detected"}
        return f"ERROR {self.sqlstate} {known.get(self.kind, self.message)}"


def classify(sqlstate: str, message: str) -> str:
    if sqlstate == "55P03":
        # NOWAIT and lock_timeout share the SQLSTATE; only the message differs.
        return LOCK_TIMEOUT if "lock timeout" in message else NOWAIT
    if sqlstate == "57014" and "statement timeout" in message:
        return STATEMENT_TIMEOUT
    if sqlstate == "40P01":
        return DEADLOCK
    return "other"


class Blockers(NamedTuple):
    """What the server says a running step waits for."""

    sessions: list[str]          # the sessions of the run it waits behind
    wait_event: str | None       # "Lock:transactionid", "Lock:relation", ...


@dataclass
class Result:
    """One statement's outcome inside a step (a step may hold several statements)."""

    columns: list[str]
    rows: list[tuple]          # typed values
    text_rows: list[tuple]     # the server's text, as psql shows it
    numeric: list[bool]        # per column: right-align like PQprint
    command: str


@dataclass
class Step:
    index: int
    session: str
    sql: str
    label: str
    results: list[Result] = field(default_factory=list)
    error: StepError | None = None
    notices: list[str] = field(default_factory=list)
    waited: bool = False            # was it ever blocked?
    blocked_by: list[str] = field(default_factory=list)
    wait_event: str | None = None
    started: float = 0.0
    finished: float | None = None
    completed_after: int | None = None   # index of the step after which it completed (if it waited)
    script_waited: bool = False          # completed while the script waited for it (no unblocking step)
    rewaits: list[tuple[int, list[str]]] = field(default_factory=list)  # (after step, new blockers)
    locks_after: dict[str, list] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.finished is not None

    @property
    def elapsed_ms(self) -> float | None:
        return None if self.finished is None else (self.finished - self.started) * 1000

    @property
    def rows(self) -> list[tuple]:
        """Rows of the last statement that returned any."""
        for r in reversed(self.results):
            if r.columns:
                return r.rows
        return []

    def outcome(self, brief: bool = False) -> str:
        if self.error:
            return self.error.brief() if brief else self.error.short()
        if not self.done:
            return "<waiting ...>"
        shown = [r for r in self.results if r.columns]
        if shown:
            r = shown[-1]
            if not r.text_rows:
                return "(no rows)"
            if len(r.columns) == 1:
                vals = ", ".join("NULL" if v[0] is None else v[0] for v in r.text_rows)
                return f"{r.columns[0]}={vals}"
            return "; ".join("(" + ", ".join("NULL" if v is None else v for v in row) + ")"
                             for row in r.text_rows)
        return self.results[-1].command if self.results else "ok"
