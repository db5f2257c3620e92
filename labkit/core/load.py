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


def shape(holds, claim: str, *, measured: str = "", check=reading) -> bool:
    """Assert a timed shape, unless the machine is too loaded for it to mean anything.

    ``claim`` says what should hold; ``measured`` what was seen.  Returns whether it held.
    Raises AssertionError when it does not hold and the machine is idle."""
    if bool(holds):
        return True
    now = check()
    seen = f" (measured: {measured})" if measured else ""
    if not now.busy:
        raise AssertionError(f"{claim}: did not hold{seen}, on a machine that is not loaded "
                             f"({now.line()}).")
    print(f"Not checked here: {claim}{seen}. This machine is loaded ({now.line()}): "
          "the wait for a CPU, not the server, ate the margin. Run the cell again when the "
          "machine is quiet to see the shape hold.")
    return False
