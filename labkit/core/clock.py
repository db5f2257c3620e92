"""The lab's clock: time, for the labs that wait on it, as one SQL function the lab can move.

Leases run out, retries back off and schedules come due by ``lab_now()`` (``sql/clock.sql``:
``install``), never ``now()``.  On the server's real clock it is ``now()``; a lab freezes it at
:data:`T0` and moves it on -- ``clock.advance(120)`` is "+120 s" at once -- so a trace that
waits two minutes for a lease to end runs in milliseconds and prints the same every time.
The notification drain (``labs/drain.py``) and the failing handler's retries
(``labs/retries.py``) both read it.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from .errors import LabkitError
from .limits import number
from .queries import query

if TYPE_CHECKING:
    from .lab import Lab

T0 = "2026-03-02 09:00:00+00"   # the instant a lab's clock is frozen at
SQL = "clock.sql"
MAX_ADVANCE_S = 100 * 365 * 86_400


class Clock:
    """The lab's clock: ``lab_now()`` in SQL. Frozen in labs, the server's clock otherwise."""

    def __init__(self, lab: Lab):
        self.lab = lab

    @classmethod
    def install(cls, lab: Lab) -> Clock:
        """Create the clock in ``lab``'s schema if it is not there; the clock."""
        for statement in query(SQL, "install").statements:
            lab.execute(statement)
        return cls(lab)

    def _one(self, name: str, params: dict | None = None):
        return self.lab.execute(query(SQL, name).sql, params)[0][0]

    def freeze(self, at: str = T0) -> Clock:
        self.lab.execute(query(SQL, "freeze").sql, {"at": at})
        return self

    def real(self) -> Clock:
        self.lab.execute(query(SQL, "real").sql)
        return self

    def advance(self, seconds: float) -> Clock:
        """Move the clock on at once: ``clock.advance(120)`` is "+120 s"."""
        if seconds < 0:
            raise LabkitError(f"The clock cannot go back ({seconds} s).",
                              "pass a positive number of seconds; use freeze() to start over.")
        number("seconds", seconds, high=MAX_ADVANCE_S, unit=" s", example=120)
        self.lab.execute(query(SQL, "advance").sql, {"seconds": seconds})
        return self

    def now(self) -> datetime:
        """``lab_now()``: the lab's time."""
        return self._one("now")

    @property
    def frozen(self) -> bool:
        return bool(self._one("frozen"))

    def elapsed(self) -> float:
        """Seconds the clock has been moved on since it was frozen."""
        return float(self._one("elapsed"))

    def rel(self, ts: datetime) -> str:
        """``ts`` as "T+120 s", relative to the instant the clock was frozen at."""
        secs = self._one("since_frozen", {"ts": ts})
        return "T" if secs is None else f"T{float(secs):+.0f} s"
