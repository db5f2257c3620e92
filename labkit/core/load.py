"""Is this machine loaded?  The check that lets a timed cell speak instead of fail.

A cell that measures asserts a *shape*: NOWAIT fails long before a lock timeout would, a
statement timeout fires within a margin of its setting.  On a laptop those shapes hold with
room to spare.  In a training room, where a dozen trainees run the same notebook on one
machine at the same moment, the operating system may not run a session for tens of
milliseconds, and a margin can be eaten by the wait for a CPU rather than by anything the
server did.

:func:`shape` keeps the assertion where it can mean something: when the shape holds it is
silent; when it does not hold on an idle machine it fails, as any assertion would; when it
does not hold on a loaded machine it says so, with the reading that shows the load, instead
of failing in front of the room.

The reading is taken when a shape fails, from two things: the 1-minute load average per
CPU (above 1: more runnable processes than CPUs) and how much longer than its own CPU time
a short piece of work takes by the wall clock (the time a ready process waits for a CPU,
which is what eats a timing margin).  A short *sleep* would not show it: the kernel's
scheduler favours a process that wakes from a sleep, so it wakes on time even on a
machine with four times more runnable work than CPUs.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass

from .text import fill

LOAD_PER_CPU = 1.0        # more runnable work than CPUs, averaged over a minute
STRETCH = 1.5             # 20 ms of work that takes 1.5x that by the wall clock waited for a CPU


@dataclass(frozen=True)
class Reading:
    cpus: int
    load_1m: float | None     # None where the system has no load average (Windows)
    stretch: float            # wall-clock time / CPU time of a short piece of work

    @property
    def busy(self) -> bool:
        per_cpu = (self.load_1m or 0.0) / self.cpus
        return per_cpu > LOAD_PER_CPU or self.stretch > STRETCH

    def line(self) -> str:
        load = "no load average" if self.load_1m is None else f"1-minute load {self.load_1m:.1f}"
        return (f"{load} on {self.cpus} CPU{'s' if self.cpus != 1 else ''}, "
                f"{WORK_MS} ms of work took {self.stretch:.1f}x that by the clock")


WORK_MS = 20


def _stretch() -> float:
    """Wall-clock time over this thread's CPU time for WORK_MS of arithmetic."""
    wall0, cpu0 = time.perf_counter(), time.thread_time()
    while time.thread_time() - cpu0 < WORK_MS / 1000:
        sum(range(1000))
    return (time.perf_counter() - wall0) / max(time.thread_time() - cpu0, 1e-9)


def reading(samples: int = 5) -> Reading:
    """Read the machine's load now (takes about 0.1 s on an idle machine)."""
    stretch = statistics.median(_stretch() for _ in range(samples))
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = None
    return Reading(cpus=os.cpu_count() or 1, load_1m=load, stretch=stretch)


STRICT_ENV = "LABKIT_STRICT_SHAPES"    # 1: a shape that does not hold fails, loaded or not
LOG_ENV = "LABKIT_SHAPE_LOG"          # a file: every shape not checked is written there, a line each
TRIES = 3                              # measurements of a shape before the load is blamed


def strict() -> bool:
    return os.environ.get(STRICT_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def shape(holds, claim: str, *, measured: str = "", again=None, tries: int = TRIES,
          check=reading) -> bool:
    """Assert a timed shape, unless the machine is too loaded for it to mean anything.

    ``claim`` says what should hold; ``measured`` what was seen.  ``again``, if given, measures
    once more and returns ``(holds, measured)``: a shape that does not hold is measured again,
    up to ``tries`` measurements in all, before the machine's load is read.  Returns whether it
    held.  Raises AssertionError when it does not hold and the machine is idle, or always
    with ``LABKIT_STRICT_SHAPES=1``; otherwise prints ``Not checked here`` and writes the
    claim to the file named by ``LABKIT_SHAPE_LOG``, where the test run counts it."""
    seen_all = [measured]
    held = bool(holds)
    while not held and again is not None and len(seen_all) < tries:
        holds, measured = again()
        held = bool(holds)
        seen_all.append(measured)
    if held:
        if len(seen_all) > 1:
            print(fill(f"{claim}: held on measurement {len(seen_all)} of {tries} "
                       f"(before: {'; '.join(m for m in seen_all[:-1] if m) or 'did not hold'}).",
                       indent="  "))
        return True
    now = check()
    times = f" in {len(seen_all)} measurements" if len(seen_all) > 1 else ""
    seen = f" (measured: {'; '.join(m for m in seen_all if m)})" if any(seen_all) else ""
    if strict():
        raise AssertionError(f"{claim}: did not hold{times}{seen}; {STRICT_ENV} is set, so the "
                             f"load is not blamed ({now.line()}).")
    if not now.busy:
        raise AssertionError(f"{claim}: did not hold{times}{seen}, on a machine that is not loaded "
                             f"({now.line()}).")
    print(fill(f"Not checked here: {claim}{seen}. This machine is loaded ({now.line()}): "
               "the wait for a CPU, not the server, ate the margin. Run the cell again when the "
               "machine is quiet to see the shape hold.", indent="  "))
    _log(claim, "; ".join(m for m in seen_all if m), now)
    return False


def _log(claim: str, measured: str, now: Reading) -> None:
    """One JSON line per shape not checked, for the test run's closing count."""
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    import json

    line = json.dumps({"claim": claim, "measured": measured, "reading": now.line()})
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
