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

A worker also dies with its parent when the parent is killed outright (SIGKILL, or
anything else that gives it no chance to clean up): on Linux the kernel sends it SIGKILL
(``prctl(PR_SET_PDEATHSIG)``); everywhere, a thread in the worker exits it once its
parent is gone.

SIGTERM and SIGHUP (a ``kill``, a closed terminal) take the same clean-up path as Ctrl-C
inside :func:`stop_signals_interrupt`: they raise :class:`Stopped`, a KeyboardInterrupt.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from .checked import started_pid
from .errors import LabkitError

_live: weakref.WeakSet[Worker] = weakref.WeakSet()


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


PR_SET_PDEATHSIG = 1          # linux/prctl.h
ORPHAN_POLL_S = 0.5


def die_with_parent(parent_pid: int, *, kernel: bool = True) -> None:
    """Make this process end when ``parent_pid`` does, however it ends.

    On Linux, ``prctl(PR_SET_PDEATHSIG, SIGKILL)``: the kernel kills us when the thread that
    started us exits (so only asked for when that was the parent's main thread, ``kernel``).
    The parent may have died before the call: getppid() then no longer names it, and we
    exit at once.  Everywhere, a daemon thread polls getppid() and exits the process when
    the parent is gone (a stopped process cannot poll: the kernel's way covers that)."""
    if kernel and sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:
        os._exit(70)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(ORPHAN_POLL_S)
        os._exit(70)

    threading.Thread(target=watch, name="labkit-orphan-watch", daemon=True).start()


def _child_main(target: str, kwargs: dict, events, commands, name: str,
                parent_pid: int | None = None, kernel_pdeathsig: bool = True) -> None:
    # First of all: never outlive the parent, whatever happens to it.
    if parent_pid is not None:
        die_with_parent(parent_pid, kernel=kernel_pdeathsig)
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
        raise SystemExit(1) from exc


class Worker:
    """``Worker("labkit.labs.relay:relay_main", name="relay 1", dsn=..., batch=100)``"""

    def __init__(self, target: str | Callable, *, name: str = "worker", **kwargs: Any):
        if callable(target):
            target = f"{target.__module__}:{target.__name__}"
        self.target = target
        self.name = name
        self.kwargs = kwargs
        self.events: list[dict] = []
        self._proc: BaseProcess | None = None
        self._ev_parent: Connection | None = None
        self._cmd_parent: Connection | None = None

    # -- life cycle -----------------------------------------------------------------
    def start(self) -> Worker:
        ctx = mp.get_context("spawn")
        self._ev_parent, ev_child = ctx.Pipe(duplex=False)
        cmd_child, self._cmd_parent = ctx.Pipe(duplex=False)
        # PR_SET_PDEATHSIG fires when the *thread* that started the child ends: ask for it
        # only from the main thread (the polling thread covers the others).
        from_main = threading.current_thread() is threading.main_thread()
        proc = self._proc = ctx.Process(target=_child_main, name=self.name, daemon=True,
                                        args=(self.target, self.kwargs, ev_child, cmd_child, self.name,
                                              os.getpid(), from_main))
        _live.add(self)
        # Ctrl-C, SIGTERM or SIGHUP in the middle of the spawn would leave a child that
        # nothing knows the pid of: they wait until the child is started (and known).
        with signals_deferred():
            proc.start()
            ev_child.close()
            cmd_child.close()
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
            try:
                os.kill(started_pid(self), signal.SIGKILL)   # ends a stopped (SIGSTOP) child too
            except ProcessLookupError:
                pass            # it exited between the check and the signal: nothing left to kill
            self._proc.join(10)
        self._drain()

    def resume(self, value: Any = None) -> None:
        if self._cmd_parent is None:
            raise LabkitError(f"Worker {self.name!r} has no process: it was never started.",
                              "call its start() (or use it in a with block) before resuming it.")
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

    def __enter__(self) -> Worker:
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


# -- SIGTERM and SIGHUP: the Ctrl-C clean-up path ------------------------------------------------

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised in the main thread like Ctrl-C's KeyboardInterrupt, so
    that every ``finally`` and ``except KeyboardInterrupt`` clean-up runs."""

    def __init__(self, signum: int):
        self.signum = int(signum)
        super().__init__(f"stopped by {signal.Signals(signum).name}")


def signal_exit_code(exc: BaseException) -> int:
    """What a command exits with after an interruption: 128 + the signal's number
    (130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP)."""
    return 128 + getattr(exc, "signum", signal.SIGINT)


def describe_interrupt(exc: BaseException) -> str:
    sig = getattr(exc, "signum", None)
    return f"stopped by {signal.Signals(sig).name}" if sig else "interrupted"


def _on_stop_signal(signum, frame) -> None:
    # Only the first one interrupts: later ones must not cut the clean-up it started short.
    for s in STOP_SIGNALS:
        if signal.getsignal(s) is _on_stop_signal:
            signal.signal(s, _again)
    raise Stopped(signum)


def _again(signum, frame) -> None:
    pass


@contextlib.contextmanager
def stop_signals_interrupt() -> Iterator[None]:
    """Inside: SIGTERM and SIGHUP raise :class:`Stopped` in the main thread.  A signal the
    process was told to ignore (``nohup``) stays ignored.  Nested uses are fine; only a
    use in the main thread does anything (Python runs signal handlers there only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {}
    for s in STOP_SIGNALS:
        current = signal.getsignal(s)
        if current in (signal.SIG_IGN, _on_stop_signal, _again):
            continue
        old[s] = signal.signal(s, _on_stop_signal)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Inside: Ctrl-C, SIGTERM and SIGHUP are noted, not acted on; the first one noted is
    raised again on the way out (through the handler in place then).  For the few
    statements that must not be cut in half, such as starting a process."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    old = {}
    for s in (signal.SIGINT,) + STOP_SIGNALS:
        current = signal.getsignal(s)
        if current in (signal.SIG_IGN, None):
            continue
        old[s] = signal.signal(s, lambda signum, frame: noted.append(signum))
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if noted:
            signal.raise_signal(noted[0])
