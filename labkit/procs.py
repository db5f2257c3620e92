"""Worker processes that can really crash.

A lab that needs "the relay dies after publishing 40 messages" runs the relay as
its own OS process (``multiprocessing`` with the *spawn* start method, so nothing
is shared with the kernel), waits until the process reports its 40th publish,
and sends it SIGKILL.  The server sees the connection die; nothing in the child
gets a chance to clean up — exactly like a crash.

The child gets a :class:`Context`: ``ctx.emit(kind, **data)`` reports an event to
the parent, and ``ctx.pause(tag)`` stops the child at a scripted point until the
parent says ``resume()`` (or kills it there).  Every live worker is killed when the
parent exits or the ``with`` block ends, including on KeyboardInterrupt.
"""

from __future__ import annotations

import atexit
import importlib
import multiprocessing as mp
import os
import signal
import time
import weakref
from typing import Any, Callable

from .errors import LabkitError

_live: "weakref.WeakSet[Worker]" = weakref.WeakSet()


class Context:
    """What a child process sees of its parent."""

    def __init__(self, events, commands, name: str):
        self._events = events
        self._commands = commands
        self.name = name

    def emit(self, kind: str, **data: Any) -> None:
        self._events.send({"kind": kind, "t": time.monotonic(), **data})

    def pause(self, tag: str) -> Any:
        """Report ``paused:<tag>`` and block until the parent resumes (or kills) us."""
        self.emit("paused", tag=tag)
        return self._commands.recv()


def _child_main(target: str, kwargs: dict, events, commands, name: str) -> None:
    # Die with the parent's SIGINT handling out of the way: the parent decides.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    module, func = target.split(":")
    fn = getattr(importlib.import_module(module), func)
    ctx = Context(events, commands, name)
    try:
        result = fn(ctx, **kwargs)
        ctx.emit("done", result=result)
    except Exception as exc:  # report, then exit non-zero
        ctx.emit("failed", error=f"{type(exc).__name__}: {exc}")
        raise SystemExit(1)


class Worker:
    """``Worker("labkit.relay:relay_main", name="relay 1", dsn=..., batch=100)``"""

    def __init__(self, target: str | Callable, *, name: str = "worker", **kwargs: Any):
        if callable(target):
            target = f"{target.__module__}:{target.__name__}"
        self.target = target
        self.name = name
        self.kwargs = kwargs
        self.events: list[dict] = []
        self._proc: mp.Process | None = None
        self._ev_parent = self._cmd_parent = None

    # -- life cycle -----------------------------------------------------------------
    def start(self) -> "Worker":
        ctx = mp.get_context("spawn")
        self._ev_parent, ev_child = ctx.Pipe(duplex=False)
        cmd_child, self._cmd_parent = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=_child_main, name=self.name, daemon=True,
                                 args=(self.target, self.kwargs, ev_child, cmd_child, self.name))
        self._proc.start()
        ev_child.close()
        cmd_child.close()
        _live.add(self)
        return self

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    @property
    def exitcode(self) -> int | None:
        return self._proc.exitcode if self._proc else None

    def kill(self) -> None:
        """SIGKILL: no cleanup code runs in the child, as in a real crash."""
        if self._proc is not None and self._proc.is_alive():
            os.kill(self._proc.pid, signal.SIGKILL)
            self._proc.join(10)
        self._drain()

    def resume(self, value: Any = None) -> None:
        self._cmd_parent.send(value)

    def join(self, timeout: float = 60) -> dict | None:
        """Wait for the child to finish; return its ``done`` event (or raise its failure)."""
        self.wait_exit(timeout)
        for ev in reversed(self.events):
            if ev["kind"] == "failed":
                raise LabkitError(f"Worker {self.name!r} failed: {ev['error']}",
                                  "read the error above; the worker's SQL or parameters are wrong.")
            if ev["kind"] == "done":
                return ev
        return None

    def __enter__(self) -> "Worker":
        return self.start() if self._proc is None else self

    def __exit__(self, *exc) -> None:
        self.kill()

    def wait_exit(self, timeout: float = 60) -> int | None:
        """Wait for a child that is expected to end on its own (finish, or crash on a
        poison job); its exit code.  Still running after ``timeout``: killed, and an error."""
        deadline = time.monotonic() + timeout
        while self.alive and time.monotonic() < deadline:
            self._drain(0.05)
        self._drain()
        if self.alive:
            self.kill()
            raise LabkitError(f"Worker {self.name!r} was still running after {timeout:.0f} s and was killed.",
                              "check that what should end it (its work, or the job it crashes on) is there.")
        return self.exitcode

    # -- events -----------------------------------------------------------------------
    def poll(self, timeout: float = 0.0) -> list[dict]:
        """Collect the events the child has sent (waiting up to ``timeout`` s for the first);
        returns the new ones.  They are also kept in ``events``."""
        before = len(self.events)
        self._drain(timeout)
        return self.events[before:]

    def _drain(self, timeout: float = 0.0) -> None:
        if self._ev_parent is None:
            return
        try:
            while self._ev_parent.poll(timeout):
                self.events.append(self._ev_parent.recv())
                timeout = 0.0
        except (EOFError, OSError):
            pass

    def wait_for(self, kind: str, *, count: int = 1, timeout: float = 60, **match: Any) -> dict:
        """Block until the child has emitted ``count`` events of ``kind`` (matching ``match``)."""
        deadline = time.monotonic() + timeout

        def seen() -> list[dict]:
            return [e for e in self.events if e["kind"] == kind
                    and all(e.get(k) == v for k, v in match.items())]

        while len(seen()) < count:
            if time.monotonic() > deadline:
                self.kill()
                raise LabkitError(f"Worker {self.name!r} did not report {count} × {kind!r} within "
                                  f"{timeout:.0f} s (it reported {len(seen())}).",
                                  "check the lab's parameters; the worker was killed.")
            if not self.alive:
                self._drain()
                if len(seen()) >= count:
                    break
                failed = [e for e in self.events if e["kind"] == "failed"]
                why = failed[-1]["error"] if failed else f"exit code {self.exitcode}"
                raise LabkitError(f"Worker {self.name!r} stopped before reporting {kind!r} ({why}).",
                                  "read the error; the worker's code or parameters are wrong.")
            self._drain(0.02)
        return seen()[count - 1]


def kill_all() -> None:
    for w in list(_live):
        try:
            w.kill()
        except Exception:
            pass


atexit.register(kill_all)
