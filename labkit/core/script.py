"""What every session engine shares: named sessions, one ordered script.

:class:`labkit.core.sessions.Sessions` (PostgreSQL, libpq's asynchronous API) and
:class:`labkit.core.mysessions.MySessions` (MySQL and MariaDB, a thread per session) differ
in how they send a step and how they ask the server whether it waits.  The script around
that is this class: checking the names, ``run.A("SQL")``, a step (send it, settle it, then
look at the steps still waiting), waiting for a step on purpose, and the transcript.

An engine provides ``sessions`` (name -> an object with ``send(step)`` and ``pending``),
``settle(name, until_done=...)`` and ``close()``; it may override :meth:`_look_again` (how
a waiting step is looked at after another session's step) and :meth:`_record_locks`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .errors import LabkitError
from .steps import Blockers, Step
from .transcript import Transcript

# One run, one connection per session: PostgreSQL's own isolation specs use up to 8.
MAX_SESSIONS = 16


class ScriptRun:
    """Named sessions driven through one ordered script (see the module's docstring)."""

    track_locks = False
    sessions: dict
    steps: list[Step]
    names: list[str]
    _closed: bool

    # -- set-up -----------------------------------------------------------------------------
    def _check_names(self, names: tuple[str, ...]) -> None:
        kind = type(self).__name__
        if not 1 <= len(names) <= MAX_SESSIONS:
            raise LabkitError(f"A run takes 1 to {MAX_SESSIONS} sessions, not {len(names)}.",
                              f"name the sessions, for example {kind}(lab, 'A', 'B')." if not names
                              else f"use at most {MAX_SESSIONS} (each session is a connection of "
                              "its own to the server).")
        if len(set(names)) != len(names):
            raise LabkitError(f"Session names must differ: {names}.", "give each session its own name.")
        for name in names:
            if not name.isidentifier() or hasattr(type(self), name):
                raise LabkitError(f"{name!r} cannot name a session (it must be a Python name and not "
                                  "one of the run's own methods).", "use names such as 'A', 'B', 'worker1'.")

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:  # pragma: no cover - every engine has its own
        raise NotImplementedError

    def __getattr__(self, name: str) -> Callable[..., Step]:
        sessions = self.__dict__.get("sessions", {})
        if name in sessions:
            return lambda sql_text, label=None: self.step(name, sql_text, label=label)
        if name.startswith("_") or not sessions:
            raise AttributeError(name)
        raise LabkitError(f"No session named {name!r} in this run (have {self.names}).",
                          f"use one of the names given to {type(self).__name__}(...); they are "
                          "case-sensitive.")

    def _check_name(self, session: str) -> None:
        if session not in self.sessions:
            raise LabkitError(f"No session named {session!r} in this run (have {self.names}).",
                              f"use one of the names given to {type(self).__name__}(...); they are "
                              "case-sensitive.")

    # -- the script ---------------------------------------------------------------------------
    def step(self, session: str, sql_text: str, *, label: str | None = None) -> Step:
        """Run one step in ``session``; return it (done, failed or waiting)."""
        step = self.send(session, sql_text, label=label)
        blockers = self.settle(session)
        if blockers is not None:
            step.waited = True
            step.blocked_by, step.wait_event = blockers
        self._check_waiters(exclude=session)
        self._record_locks(step)
        return step

    def send(self, session: str, sql_text: str, *, label: str | None = None) -> Step:
        """Send one step to ``session`` and return it at once, still running: :meth:`settle`
        waits for it.  (:meth:`step` is send, settle, then a look at the other sessions'
        waiting steps.)"""
        if self._closed:
            raise LabkitError("This run is closed.", f"start a new {type(self).__name__}(...) run.")
        self._check_name(session)
        s = self.sessions[session]
        self._collect(s)
        if s.pending is not None:
            waiting = s.pending
            raise LabkitError(
                f"Session {session} is still waiting (step {waiting.index + 1}, {waiting.label!r}, "
                f"blocked by {', '.join(waiting.blocked_by) or 'another session'}); it cannot run "
                f"another statement until that step ends.",
                f"end the blocker's transaction first (COMMIT or ROLLBACK in "
                f"{', '.join(waiting.blocked_by) or 'the blocking session'}), or call "
                f"run.wait({session!r}) to wait for it on purpose.")
        step = Step(len(self.steps), session, sql_text.strip(), label or _label(sql_text))
        self.steps.append(step)
        s.send(step)
        return step

    def settle(self, session: str, *, until_done: bool = False, watchdog=None) -> Blockers | None:
        raise NotImplementedError  # pragma: no cover - every engine has its own

    def wait(self, session: str) -> Step | None:
        """Let a waiting step of ``session`` run to its end (its blocker going away, or a
        timeout firing); the script does nothing else meanwhile.  Returns that step."""
        self._check_name(session)
        s = self.sessions[session]
        if s.pending is None:
            return None
        step = s.pending
        self.settle(session, until_done=True)
        for earlier in reversed(self.steps):
            if earlier.session == session and earlier.waited and earlier.completed_after is None:
                earlier.completed_after = self.steps[-1].index
                earlier.script_waited = True
                break
        self._record_locks(self.steps[-1])
        return step

    def script(self, steps: Iterable[tuple]):
        """Run a list of ``(session, sql)`` or ``(session, sql, label)`` tuples in order."""
        for item in steps:
            self.step(*item[:2], label=item[2] if len(item) > 2 else None)
        return self

    def _check_waiters(self, exclude: str) -> None:
        """After a step, see which waiting steps it let through (asking the server)."""
        after = self.steps[-1]
        for s in self.sessions.values():
            if s.name == exclude or s.pending is None:
                continue
            waiting_step = s.pending
            blockers = self._look_again(s.name)
            if blockers is None:
                waiting_step.completed_after = after.index
                continue
            # Still waiting; maybe now behind another session (its row moved on).
            current = waiting_step.rewaits[-1][1] if waiting_step.rewaits else waiting_step.blocked_by
            if blockers.sessions != current:
                waiting_step.rewaits.append((after.index, blockers.sessions))

    # -- what an engine may change --------------------------------------------------------------
    def _look_again(self, session: str) -> Blockers | None:
        """A waiting step, after another session's step: finished (None) or still waiting."""
        return self.settle(session)

    def _collect(self, s) -> None:
        """Before a new step: collect a step that has finished unseen (engines that run
        steps on their own threads)."""

    def _record_locks(self, step: Step) -> None:
        """After a step: record the rows each session holds, where the engine can tell."""

    # -- rendering --------------------------------------------------------------------------------
    def transcript(self, **kw) -> Transcript:
        return Transcript.from_run(self, **kw)

    def result(self, index: int) -> Step:
        return self.steps[index]


def _label(sql_text: str, width: int = 48) -> str:
    one = " ".join(sql_text.split())
    return one if len(one) <= width else one[: width - 1] + "…"


def close_all(conns) -> None:
    """Close every connection, whatever state it is in (a run's finalizer)."""
    for c in conns:
        try:
            c.close()
        except Exception:
            pass
