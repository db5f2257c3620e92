"""The scheduler's seat: the learner chooses the order in which sessions run their steps.

Every other lab in the workbook plays an interleaving someone wrote down.  Here the learner
writes it: a puzzle is two or three small programs (a worker's claim, a writer and a relay, a
drain and its push service) that run on a real server, and a promise (no job claimed twice,
no event lost, no write from a worker that lost its lease, no worker kept waiting).  A move
runs the next step of one session (``"A"``), or ends one session's process
(``"A!"``, a crash: its connection is cut, and the server rolls its transaction back).
After every move the puzzle's check, one query in ``labkit/sql/puzzles.sql``, reads the
promise back from the server: whether it is broken is the database's answer, never the
script's.

Some puzzles can be broken, and each has its shortest known solution; :func:`search` plays
every ordering of the programs on the server and so shows that no shorter one exists.  Some
cannot: the lesson there is to see why, and :func:`search` plays every ordering to show it.

A step is a named query; it names its own session as ``%(me)s`` and reads what its
session's last step returned as ``%(<column>)s`` (a worker that read ``id = 1`` then marks
``WHERE id = %(id)s``).  A step whose values are missing (the claim came back empty) ends
its program: the worker found no work and stops.  A step marked ``aside`` runs on a
connection of the session's own beside its transaction (the push service's record).
"""

from __future__ import annotations

import hashlib
import json as _json
import os
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from ..core.clock import T0, Clock
from ..core.db import current_user_tag
from ..core.errors import LabkitError
from ..core.lab import Lab
from ..core.queries import query
from ..core.results import Result, not_json
from ..core.sessions import Sessions
from ..core.steps import Result as StepResult
from ..core.steps import Step
from ..core.text import fill
from ..core.transcript import Transcript

SQL_FILE = "puzzles.sql"
LEVELS = ("junior", "middle", "senior", "principal")
CRASH = "!"
CRASH_WAIT_S = 5.0


def q(name: str) -> str:
    """The SQL of the named query ``name`` of puzzles.sql, comments kept."""
    return query(SQL_FILE, name).text


@dataclass(frozen=True)
class Move:
    """One step of a session's program: what it is called, and the query it runs."""

    label: str
    query: str
    aside: bool = False          # run on the session's own second connection, autocommit


@dataclass(frozen=True)
class Puzzle:
    """One puzzle of the scheduler's seat.

    name: ``labkit play NAME``
    level: junior, middle, senior or principal
    title: the puzzle in a line
    goal: what the learner is asked to do
    invariant: the promise, as the check reads it
    scene: the query that builds its tables
    programs: each session's steps, in the order that session runs them
    check: the query that reads the promise back (first column ``broken``)
    crashable: sessions whose process the learner may kill (``A!``)
    shortest: the shortest known ordering that breaks the promise (None: it cannot be broken)
    why: why no shorter ordering exists, or why no ordering breaks it
    notebook: where the story is told
    """

    name: str
    level: str
    title: str
    goal: str
    invariant: str
    scene: str
    programs: dict[str, tuple[Move, ...]]
    check: str
    crashable: tuple[str, ...] = ()
    shortest: tuple[str, ...] | None = None
    why: str = ""
    notebook: str = ""
    clock: bool = False

    @property
    def breakable(self) -> bool:
        return self.shortest is not None

    @property
    def sessions(self) -> tuple[str, ...]:
        return tuple(self.programs)


@dataclass(frozen=True)
class Play(Result):
    """A puzzle played in the order given (:func:`play`).

    puzzle: its name
    steps: the moves, as given (``A`` runs A's next step, ``A!`` kills A's process)
    moves: how many were played
    invariant: the promise
    invariant_broken: whether the check found it broken after one of the moves (a promise
        broken once stays broken: a job claimed twice was claimed twice, whatever follows)
    broken_after: the first move after which the check found it broken (1-based), or None
    observed: what the check read after that move (or after the last move, when it held)
    broken_now: whether the check finds it broken after the last move too (a wait ends, a
        second drain locks the row the check would read)
    shortest: the length of the shortest known solution (None: the puzzle cannot be broken)
    transcript: the sessions' steps, in order
    """

    puzzle: str
    steps: list[str]
    moves: int
    invariant: str
    invariant_broken: bool
    broken_after: int | None
    observed: dict[str, Any]
    broken_now: bool
    shortest: int | None
    transcript: Transcript | None = not_json()


@dataclass(frozen=True)
class Search(Result):
    """Every ordering of a puzzle's programs, played on the server (:func:`search`).

    puzzle: its name
    orderings_played: how many orderings were played to their end, or to the move that broke
        the promise (each is checked after every move, so each shorter ordering it begins
        with is checked too)
    moves_played: the moves those orderings took, in all
    broken_by: how many of the played orderings broke the promise
    shortest: the shortest ordering found that breaks it (None: none does)
    took_s: wall-clock seconds
    """

    puzzle: str
    orderings_played: int
    moves_played: int
    broken_by: int
    shortest: list[str] | None
    took_s: float


# -- the puzzles ------------------------------------------------------------------------------------
def _worker(claim: str, mark: str) -> tuple[Move, ...]:
    return (Move("claim", claim), Move("mark", mark), Move("commit", "commit"))


def _puzzles() -> list[Puzzle]:
    read_mark = (Move("read", "read"), Move("mark", "read_then_mark_mark"), Move("commit", "commit"))
    cas = (Move("read", "read"), Move("mark if pending", "mark_if_still_pending_mark"),
           Move("commit", "commit"))
    empty = (Move("claim + mark", "empty_handed_claim"), Move("commit", "commit"))
    lease_w = (Move("claim (id, token)", "lease_claim"), Move("finish", "unfenced_zombie_finish"))
    fenced_w = (Move("claim (id, token)", "lease_claim"), Move("finish", "fenced_completion_finish"))
    clock = (Move("+60 s", "clock_advance"),)
    writer = (Move("write", "relay_write"), Move("commit", "commit"))
    held = (Move("claim", "held_lock_drain_claim"), Move("push", "push", aside=True),
            Move("done", "drain_done"), Move("commit", "commit"))
    leased = (Move("claim", "committed_lease_drain_claim"), Move("push", "push", aside=True),
              Move("done", "drain_done"))
    drain_clock = (Move("+150 s", "drain_clock_advance"),)
    return [
        Puzzle("read_then_mark", "junior", "A claim that reads, then marks",
               "Make two workers both claim the same job.",
               "no job has two committed claims", "jobs_scene",
               {"A": read_mark, "B": read_mark}, "claimed_twice_check",
               shortest=("A", "B", "A", "A", "B", "B"),
               why="A claim is on record once its worker commits, and each worker's program is "
                   "three steps: two claims take all six. B must read before A commits (A's mark, "
                   "not yet committed, is invisible to B's read), and the mark checks only the "
                   "id, so B's goes through.",
               notebook="03_claim_mark_commit"),
        Puzzle("mark_if_still_pending", "junior", "Read, then mark only if still pending",
               "Make two workers both claim the same job.",
               "no job has two committed claims", "jobs_scene",
               {"A": cas, "B": cas}, "claimed_twice_check",
               why="The mark re-checks the status on the row it updates: a worker that marks "
                   "after the other committed finds it running and marks nothing, and one that "
                   "marks while the other holds the row waits, then re-checks the committed "
                   "row (READ COMMITTED re-evaluates the WHERE clause on the new version). The "
                   "loser claims nothing and must read again: safe, but a wasted round trip.",
               notebook="03_claim_mark_commit"),
        Puzzle("wait_convoy", "junior", "FOR UPDATE without SKIP LOCKED",
               "Make one worker wait for another.",
               "no worker waits for another's lock, and no job has two committed claims",
               "jobs_scene", {"A": _worker("claim_for_update", "mark_locked"),
                              "B": _worker("claim_for_update", "mark_locked")}, "wait_check",
               shortest=("A", "B"),
               why="A wait needs a holder and a waiter: one move each. Every worker asks for "
                   "the oldest pending job, so the second one queues behind the first.",
               notebook="01_one_lock_three_policies"),
        Puzzle("skip_locked", "middle", "FOR UPDATE SKIP LOCKED",
               "Make one worker wait for another, or two workers claim the same job.",
               "no worker waits for another's lock, and no job has two committed claims",
               "jobs_scene", {"A": _worker("claim_skip_locked", "mark_locked"),
                              "B": _worker("claim_skip_locked", "mark_locked")}, "wait_check",
               why="A claim passes over a row another transaction holds instead of waiting for "
                   "it, and it locks what it returns, so the mark only ever touches a row its "
                   "own transaction holds; once that commits, the row is no longer pending.",
               notebook="01_one_lock_three_policies"),
        Puzzle("empty_handed", "middle", "A claim that picks without a lock, then waits",
               "Make a worker commit a claim that came back with no job while a job is pending.",
               "a claim made while a job is pending gets a job", "jobs_scene",
               {"A": empty, "B": empty}, "empty_handed_check",
               shortest=("A", "B", "A", "B"),
               why="B must claim while A holds job 1 (after A's claim, before A's commit), A's "
                   "commit is what makes job 1 running, and B's empty answer is on record only "
                   "once B commits: four moves. B's subquery picked job 1 from its snapshot; "
                   "its UPDATE waited for A, then re-checked the WHERE clause on the committed "
                   "row, found it running and marked nothing. The subquery is not run again, so "
                   "job 2 is never looked at. (A SELECT ... LIMIT 1 FOR UPDATE that waits does "
                   "go on to the next row: the server locks before it applies the LIMIT.)",
               notebook="03_claim_mark_commit"),
        Puzzle("unfenced_zombie", "principal", "A worker that lost its lease writes anyway",
               "Make a worker write a result for a job another worker owns.",
               "every completion is written by the job's owner at that moment", "lease_scene",
               {"A": lease_w, "B": lease_w, "T": clock}, "zombie_check", clock=True,
               shortest=("A", "T", "B", "A"),
               why="The write must come from a worker (its claim, its finish: two moves) after "
                   "another worker owns the job (a claim), which it can only take once the "
                   "first lease has run out (the clock). A finish before B's claim is late but "
                   "written by the owner.",
               notebook="08_fencing_tokens"),
        Puzzle("fenced_completion", "senior", "The same write, fenced by the claim's token",
               "Make a worker write a result for a job another worker owns.",
               "every completion is written by the job's owner at that moment", "lease_scene",
               {"A": fenced_w, "B": fenced_w, "T": clock}, "zombie_check", clock=True,
               why="Every claim raises the token, and the owner changes only with it; a finish "
                   "that carries an old token matches no row, so the only write that lands is "
                   "the current owner's.",
               notebook="08_fencing_tokens"),
        Puzzle("high_water_relay", "principal", "The outbox relay with a high-water mark",
               "Make the relay lose an event for good.",
               "every committed event at or below the relay's mark was sent", "relay_scene",
               {"W1": writer, "W2": writer, "R": (Move("pass", "high_water_relay_pass"),
                                                 Move("pass", "high_water_relay_pass"))},
               "high_water_relay_check",
               shortest=("W1", "W2", "W2", "R", "W1"),
               why="An event is lost when its id is below the mark when it commits. W1 must "
                   "take its id first and commit last (two moves); the mark moves past it only "
                   "if a later id committed first (W2's two moves) and a pass saw that (R).",
               notebook="13_outbox_cursors_and_order"),
        Puzzle("snapshot_relay", "principal", "The relay that waits for older transactions",
               "Make the relay lose an event for good.",
               "every committed event at or below the relay's mark was sent", "relay_scene",
               {"W1": writer, "W2": writer, "R": (Move("pass", "snapshot_relay_pass"),
                                                 Move("pass", "snapshot_relay_pass"))},
               "snapshot_relay_check",
               why="A pass only sends events whose transaction is older than every transaction "
                   "still running, so no event can commit below the mark afterwards. The price: "
                   "W2's event waits while W1's transaction is open -- and while any transaction on "
                   "the server, in any database, that took its transaction id (at its first "
                   "write) before W2's is still open.",
               notebook="13_outbox_cursors_and_order"),
        Puzzle("held_lock_drain", "principal", "A drain that holds its claim across the push",
               "Make a push go out that no attempt counts.",
               "every push received is counted in its delivery's attempts, once no drain holds "
               "the delivery", "drain_scene", {"D1": held, "D2": held}, "drain_check",
               crashable=("D1", "D2"), shortest=("D1", "D1", "D1!"),
               why="The push must go out (claim, push) and its count must be taken back, which "
                   "only the end of the transaction without a commit does: the drain's crash. "
                   "The attempt is never counted, so a push that kills its drain every time is "
                   "sent for ever and never reaches the dead letters.",
               notebook="07_notification_drain"),
        Puzzle("committed_lease_drain", "senior", "A drain whose claim commits first",
               "Make a push go out that no attempt counts.",
               "every push received is counted in its delivery's attempts, once no drain holds "
               "the delivery", "drain_scene", {"D1": leased, "D2": leased,
                                               "T": drain_clock},
               "drain_check", crashable=("D1",), clock=True,
               why="The attempt is counted and committed before the push goes out, so no crash "
                   "can take it back; another drain can push again only after the lease ran out "
                   "and it counted an attempt of its own.",
               notebook="07_notification_drain"),
    ]


PUZZLES: dict[str, Puzzle] = {p.name: p for p in _puzzles()}
NAMES = tuple(PUZZLES)


def puzzles() -> list[Puzzle]:
    return list(PUZZLES.values())


def puzzle(name: str) -> Puzzle:
    """The puzzle called ``name`` (a LabkitError listing the names if there is none)."""
    if name not in PUZZLES:
        raise LabkitError(f"No puzzle is called {name!r}.",
                          f"use one of: {', '.join(NAMES)} (`labkit play --list`).")
    return PUZZLES[name]


# -- the board: a puzzle being played -------------------------------------------------------------
class Board:
    """One puzzle on the server, played a move at a time (:meth:`move`).  Use it in a ``with``
    block, or call :meth:`close`: its sessions' connections end, and with them every lock."""

    def __init__(self, lab: Lab, name: str) -> None:
        self.puzzle = puzzle(name)
        self.lab = lab
        lab.reset()
        if self.puzzle.clock:
            Clock.install(lab).freeze(T0)
        for statement in query(SQL_FILE, self.puzzle.scene).statements:
            lab.execute(statement)
        self.run = Sessions(lab, *self.puzzle.sessions, track_locks=False)
        self._pids = [s.pid for s in self.run.sessions.values()]
        self.position = {s: 0 for s in self.puzzle.sessions}
        self.memory: dict[str, dict[str, Any]] = {s: {} for s in self.puzzle.sessions}
        self.ended: dict[str, str] = {}              # session -> "finished", "crashed", "found no work"
        self.moves: list[str] = []
        self.broken_after: int | None = None
        self.at_break: dict[str, Any] | None = None          # what the check read then
        self._aside: dict[str, psycopg.Connection] = {}
        self.observed: dict[str, Any] = self._check()

    # -- what may move ---------------------------------------------------------------------
    def waiting(self, session: str) -> bool:
        return self.run.sessions[session].pending is not None

    def legal(self) -> list[str]:
        """The moves that can be played now."""
        out = []
        for s in self.puzzle.sessions:
            if s in self.ended or self.waiting(s):
                continue
            out.append(s)
            if s in self.puzzle.crashable and self.position[s] > 0:
                out.append(s + CRASH)
        return out

    def next_step(self, session: str) -> Move | None:
        program = self.puzzle.programs[session]
        return program[self.position[session]] if self.position[session] < len(program) else None

    def _not_a_move(self, token: str) -> LabkitError:
        return LabkitError(f"Move {len(self.moves) + 1}: {token!r} is not a move.",
                           f"a move is a session's name ({', '.join(self.puzzle.sessions)}), with one "
                           f"{CRASH} after it to kill its process where the puzzle allows.")

    def _refuse(self, token: str) -> None:
        session = token.rstrip(CRASH)
        if token.count(CRASH) > 1 or (CRASH in token and not token.endswith(CRASH)):
            raise self._not_a_move(token)
        if not session:
            raise LabkitError(f"Move {len(self.moves) + 1}: {token!r} names no session.",
                              f"write {CRASH} right after the session's name, with no space: "
                              f"{self.puzzle.sessions[0]}{CRASH}.")
        if session not in self.puzzle.programs:
            raise LabkitError(f"{self.puzzle.name} has no session {session!r} (move {len(self.moves) + 1}).",
                              f"name one of {', '.join(self.puzzle.sessions)}; add {CRASH} to kill its "
                              f"process where that is allowed ({', '.join(self.puzzle.crashable) or 'nowhere here'}).")
        if session in self.ended:
            raise LabkitError(f"Move {len(self.moves) + 1}: {session} has no step left ({self.ended[session]}).",
                              f"move one of {', '.join(self.legal())}." if self.legal() else
                              "none has: every session has finished, and the play is over.")
        if self.waiting(session):
            blocked = self.run.sessions[session].pending
            by = ", ".join(blocked.blocked_by) if blocked else "another session"
            raise LabkitError(f"Move {len(self.moves) + 1}: {session} is waiting for a lock {by} holds "
                              "and cannot take another step yet.",
                              f"move {by} on until it commits; legal now: {', '.join(self.legal())}.")
        if token.endswith(CRASH) and session not in self.puzzle.crashable:
            raise LabkitError(f"Move {len(self.moves) + 1}: {session}'s process cannot be killed in this puzzle.",
                              f"kill one of {', '.join(self.puzzle.crashable)}, or move {session} on."
                              if self.puzzle.crashable else
                              f"no process can be killed here: move {session} on.")
        if token.endswith(CRASH) and self.position[session] == 0:
            raise LabkitError(f"Move {len(self.moves) + 1}: {session} has not started; killing it changes nothing.",
                              f"move {session} first.")
        raise self._not_a_move(token)

    # -- a move ---------------------------------------------------------------------------------
    def move(self, token: str) -> dict[str, Any]:
        """Play one move (``"A"`` or ``"A!"``); return what the check reads after it."""
        token = token.strip()
        if token not in self.legal():
            self._refuse(token)
        session = token.rstrip(CRASH)
        if token.endswith(CRASH):
            self._crash(session)
        else:
            self._step(session)
        self.moves.append(token)
        self._stop_the_idle()
        self.observed = self._check()
        if self.observed["broken"] and self.broken_after is None:
            self.broken_after = len(self.moves)
            self.at_break = self.observed
        return self.observed

    def _values(self, session: str) -> dict[str, Any]:
        """What the session's last step that returned a row handed back, by column, with
        ``me``: the values its next step may use."""
        for step in reversed(self.run.steps):
            if step.session != session or not step.done:
                continue
            shown = [r for r in step.results if r.columns]
            if shown:
                last = shown[-1]
                return {"me": session, **(dict(zip(last.columns, last.rows[0])) if last.rows else {})}
        return {"me": session}

    def _step(self, session: str) -> None:
        move = self.next_step(session)
        assert move is not None
        text = q(move.query)
        values = self._values(session)
        needed = _placeholders(text)
        bound = psycopg.ClientCursor(self.lab.admin).mogrify(text, values) if needed else text
        if move.aside:
            self._aside_step(session, move, bound)
        else:
            self.run.step(session, bound, label=move.label)
        self.position[session] += 1
        if self.position[session] == len(self.puzzle.programs[session]):
            self.ended[session] = "finished"

    def _stop_the_idle(self) -> None:
        """A worker whose next step needs a value its claim did not return (the claim came
        back with no row) has nothing to go on with: it stops, as its program would."""
        for session in self.puzzle.sessions:
            if session in self.ended or self.waiting(session):
                continue
            move = self.next_step(session)
            if move is not None and not _placeholders(q(move.query)) <= set(self._values(session)):
                self.ended[session] = "found no work"
                self._record(session, "stops", "-- its claim returned no row: nothing to do",
                             "found no work")

    def _aside_step(self, session: str, move: Move, text: str) -> None:
        conn = self._aside.get(session)
        if conn is None:
            conn = self._aside[session] = self.lab.connect(role=f"{session}-aside")
        cur = conn.execute(text)
        self._record(session, move.label, text, cur.statusmessage or "ok")

    def _record(self, session: str, label: str, text: str, command: str) -> None:
        now = time.perf_counter()
        step = Step(len(self.run.steps), session, text, label,
                    results=[StepResult([], [], [], [], command)], started=now, finished=now)
        self.run.steps.append(step)

    def _crash(self, session: str) -> None:
        """Cut the session's connection as its process's death would (no goodbye to the
        server), and wait until the server has ended its backend: its transaction is rolled
        back and its locks are gone before the next move."""
        s = self.run.sessions[session]
        for conn in (s.conn, self._aside.pop(session, None)):
            if conn is None:
                continue
            cut = socket.socket(fileno=os.dup(conn.pgconn.socket))
            try:
                cut.shutdown(socket.SHUT_RDWR)
            finally:
                cut.close()
        deadline = time.monotonic() + CRASH_WAIT_S
        while self.lab.execute("SELECT 1 FROM pg_catalog.pg_stat_activity WHERE pid = %s", (s.pid,)):
            if time.monotonic() > deadline:
                raise LabkitError(f"The server did not end {session}'s backend within {CRASH_WAIT_S:.0f} s "
                                  "after its connection was cut.", "run `labkit clean`, then play again.")
            time.sleep(0.005)
        self.ended[session] = "crashed"
        self._record(session, "crash", "-- the process dies: its connection is cut",
                     "connection lost: rolled back")

    def _check(self) -> dict[str, Any]:
        text = q(self.puzzle.check)
        params = {"pids": self._pids} if "%(pids)s" in text else None
        conn = self.lab.admin
        with conn.transaction(force_rollback=True):
            cur = conn.execute(text, params)
            row = cur.fetchone()
            cols = [c.name for c in cur.description or []]
        assert row is not None
        return {c: (int(v) if isinstance(v, int) and not isinstance(v, bool) else v) for c, v in zip(cols, row)}

    # -- the end ----------------------------------------------------------------------------------
    def transcript(self) -> Transcript:
        return self.run.transcript()

    @property
    def read_at_verdict(self) -> dict[str, Any]:
        """What the check read for the verdict, by column: after the move that broke the promise,
        or after the last move while it holds."""
        seen = self.at_break if self.at_break is not None else self.observed
        return {k: v for k, v in seen.items() if k != "broken"}

    def result(self) -> Play:
        p = self.puzzle
        return Play(puzzle=p.name, steps=list(self.moves), moves=len(self.moves), invariant=p.invariant,
                    invariant_broken=self.broken_after is not None, broken_after=self.broken_after,
                    observed=self.read_at_verdict,
                    broken_now=bool(self.observed["broken"]),
                    shortest=len(p.shortest) if p.shortest else None, transcript=self.transcript())

    def close(self) -> None:
        for conn in self._aside.values():
            try:
                conn.close()
            except Exception:
                pass
        self._aside.clear()
        self.run.close()

    def __enter__(self) -> Board:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _placeholders(text: str) -> set[str]:
    return set(re.findall(r"%\((\w+)\)s", text))


def parse_steps(text: str) -> list[str]:
    """``"A,B,A!"`` -> ``["A", "B", "A!"]`` (spaces allowed)."""
    steps = [t.strip() for t in text.replace(" ", ",").split(",") if t.strip()]
    return steps


def play(lab: Lab, name: str, steps: list[str]) -> Play:
    """Play ``steps`` on puzzle ``name`` in ``lab`` (its schema is rebuilt)."""
    with Board(lab, name) as board:
        for token in steps:
            board.move(token)
        return board.result()


# -- every ordering -------------------------------------------------------------------------------------
def search(lab: Lab, name: str) -> Search:
    """Play every ordering of puzzle ``name`` that the server lets happen, checking the promise
    after every move; the shortest that breaks it, if any.

    The orderings are a tree: after each move, the moves that may follow are those the board
    allows then (a session waiting for a lock cannot move; a worker whose claim found nothing
    has stopped).  Each branch is played on a fresh board from the start -- the server's state
    cannot be copied -- and followed to its end, or to the move that breaks the promise."""
    puzzle(name)
    start = time.monotonic()
    played = moves = broken = 0
    best: list[str] | None = None
    todo: list[list[str]] = [[]]
    while todo:
        path = todo.pop()
        with Board(lab, name) as board:
            for token in path:
                board.move(token)
            while board.broken_after is None:
                nexts = board.legal()
                if not nexts:
                    break
                todo.extend(path + [m] for m in reversed(nexts[1:]))
                board.move(nexts[0])
                path = path + [nexts[0]]
            played += 1
            moves += len(board.moves)
            if board.broken_after is not None:
                broken += 1
                if best is None or len(board.moves) < len(best):
                    best = list(board.moves)
    return Search(puzzle=name, orderings_played=played, moves_played=moves, broken_by=broken,
                  shortest=best, took_s=round(time.monotonic() - start, 2))


# -- the learner's record -----------------------------------------------------------------------------
RECORD_PREFIX = "claimlab_record_"


def record_schema() -> str:
    """The learner's record schema: ``claimlab_record_<user>`` (the user as in lab schemas); a
    name past PostgreSQL's 63 characters keeps its start and ends in a short hash of the whole,
    so two long names stay apart."""
    full = RECORD_PREFIX + current_user_tag()
    if len(full) <= 63:
        return full
    return f"{full[:54].rstrip('_')}_{hashlib.sha1(full.encode()).hexdigest()[:8]}"


class RecordTaken(LabkitError):
    """The learner's record schema exists and belongs to another role."""


def record(conn: psycopg.Connection, r: Play) -> None:
    """Write one play into the learner's record (made on first use), and its summary -- per
    puzzle, the plays and the fewest moves that broke it -- as the record schema's comment,
    which is what a presenter reads (:func:`progress`)."""
    name = record_schema()
    schema = sql.Identifier(name)
    install = query(SQL_FILE, "record_install").statements
    conn.execute(sql.SQL(install[0]).format(schema=schema))
    # The name is predictable: another role could have made the schema first, with a table
    # whose trigger would run as this role on the insert below.  Only a schema of this role's
    # own is written into (ownership itself: a superuser "has" every role).
    owner = conn.execute(query(SQL_FILE, "record_owner").sql, {"schema": name}).fetchone()
    if owner is None or not owner[0]:
        raise RecordTaken(f"The schema {name}, where your puzzle plays are recorded, belongs to "
                          f"{owner[1] if owner else 'nobody'}, not to you: nothing was written into it.",
                          "ask the presenter to drop it (DROP SCHEMA ... CASCADE as its owner), or "
                          "set LABKIT_USER to another name for your record.")
    for statement in install[1:]:
        conn.execute(sql.SQL(statement).format(schema=schema))
    conn.execute(sql.SQL(query(SQL_FILE, "record_insert").sql).format(schema=schema),
                 {"puzzle": r.puzzle, "steps": r.steps, "broken": r.invariant_broken,
                  "moves": r.broken_after if r.broken_after is not None else r.moves})
    rows = conn.execute(sql.SQL(query(SQL_FILE, "record_summary").sql).format(schema=schema)).fetchall()
    summary = _json.dumps({name: [n, fewest] for name, n, fewest in rows}, separators=(",", ":"))
    conn.execute(sql.SQL(query(SQL_FILE, "record_comment").sql).format(
        schema=schema, summary=sql.Literal(summary)))


def progress(conn: psycopg.Connection, role: str, *, schema: str | None = None) -> dict[str, dict[str, Any]]:
    """What ``role`` has played, as the presenter's screen shows it: per puzzle its plays and
    the fewest moves that broke it.  It reads the record schemas' comments from the catalogue
    only (no table of the trainee's is opened, so nothing a trainee wrote runs as the
    presenter); a comment that is not a summary, or names no puzzle, is passed over.  A role
    that played under several names (LABKIT_USER) has a record for each, and they add up;
    ``schema`` reads one of them alone."""
    plays: dict[str, dict[str, Any]] = {}
    for (comment,) in conn.execute(query(SQL_FILE, "record_read").sql,
                                   {"role": role, "longest": MAX_SUMMARY_CHARS, "schema": schema}).fetchall():
        for name, (n, fewest) in _summary(comment).items():
            got = plays.setdefault(name, {"plays": 0, "fewest_moves": None})
            got["plays"] += n
            if fewest is not None and (got["fewest_moves"] is None or fewest < got["fewest_moves"]):
                got["fewest_moves"] = fewest
    return plays


MAX_SUMMARY_CHARS = 4096        # a summary of every puzzle is a few hundred characters
MAX_PLAYS = 10**6
MAX_MOVES = 10**3


def _counts_ok(plays: object, fewest: object) -> bool:
    """Whether a summary's counts are what a play records: a whole number of plays, and the
    fewest moves that broke the promise, a whole number or None, both within bounds."""
    return type(plays) is int and 0 <= plays <= MAX_PLAYS and \
        (fewest is None or (type(fewest) is int and 0 <= fewest <= MAX_MOVES))


def _summary(comment: str | None) -> dict[str, tuple[int, int | None]]:
    if not comment or len(comment) > MAX_SUMMARY_CHARS:
        return {}
    try:
        data = _json.loads(comment)
    except (ValueError, RecursionError):
        return {}
    if not isinstance(data, dict):
        return {}
    out = {}
    for name, value in data.items():
        if name in PUZZLES and isinstance(value, list) and len(value) == 2 and _counts_ok(*value):
            out[name] = (value[0], value[1])
    return out


def checked_progress(value: Any) -> dict[str, dict[str, Any]]:
    """``value`` as :func:`progress` gives it, keeping only what has that shape: known puzzles,
    a whole number of plays and of fewest moves (or None).  What a trainee's own process
    reported (``labkit hub status`` reads it from the trainee's side) is taken through this,
    so an odd value cannot break the presenter's table or name a puzzle that is not there."""
    if not isinstance(value, dict):
        return {}
    out = {}
    for name, got in value.items():
        if name in PUZZLES and isinstance(got, dict):
            plays, fewest = got.get("plays"), got.get("fewest_moves")
            if _counts_ok(plays, fewest):
                out[name] = {"plays": plays, "fewest_moves": fewest}
    return out


def progress_line(plays: dict[str, Any]) -> str:
    """One cell of the presenter's table: ``3/6 broken (2 at shortest), 4 plays``."""
    plays = checked_progress(plays)
    if not plays:
        return "-"
    breakable = [p for p in puzzles() if p.breakable]
    done = [p for p in breakable if (plays.get(p.name) or {}).get("fewest_moves") is not None]
    best = [p for p in done if plays[p.name]["fewest_moves"] <= len(p.shortest or ())]
    total = sum(v["plays"] for v in plays.values())
    return f"{len(done)}/{len(breakable)} broken ({len(best)} at shortest), {total} plays"


# -- text ---------------------------------------------------------------------------------------------
def describe(p: Puzzle) -> str:
    """The puzzle as a reader meets it: the goal, the promise, each session's program."""
    lines = [f"{p.name} ({p.level}): {p.title}", fill(f"Goal: {p.goal}", indent="  ", first="  "),
             fill(f"The promise: {p.invariant}.", indent="  ", first="  ")]
    for s, program in p.programs.items():
        steps = ", ".join(m.label for m in program)
        extra = f" (may be killed: {s}{CRASH})" if s in p.crashable else ""
        lines.append(f"  {s}: {steps}{extra}")
    return "\n".join(lines)


def format_play(r: Play) -> str:
    lines = []
    if r.transcript is not None:
        lines += [r.transcript.to_lines(), ""]
    if r.invariant_broken:
        lines.append(f"after move {r.broken_after}, the check read:")
    lines += [f"    {k}: {v}" for k, v in r.observed.items()]
    lines.append(fill(f"The promise: \"{r.invariant}\"", indent="    "))
    if r.broken_after is None:
        lines.append(f"    holds after {r.moves} moves")
        return "\n".join(lines)
    lines.append(f"    BROKEN after move {r.broken_after} of {r.moves}"
                 + ("" if r.broken_now else " (the check no longer sees it after the last move)"))
    if r.shortest is not None:
        lines.append(f"    in {r.broken_after} moves: the shortest known solution takes {r.shortest}"
                     if r.broken_after <= r.shortest else
                     f"    in {r.broken_after} moves; it can be done in {r.shortest}")
    return "\n".join(lines)


def overview() -> str:
    """One line per puzzle, in the order `labkit play --list` gives: its level, name, title
    and sessions (not whether it can be broken: that is for the learner to find).  A design
    and its fix stand together."""
    rows = [(p.level, p.name, p.title, " ".join(p.sessions)) for p in puzzles()]
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    return "\n".join(f"{lv:<{widths[0]}}  {n:<{widths[1]}}  {t}  [{ss}]" for lv, n, t, ss in rows)


def listing() -> str:
    return "\n\n".join(describe(p) for p in puzzles())


def as_listing_json() -> list[dict[str, Any]]:
    return [{"name": p.name, "level": p.level, "title": p.title, "goal": p.goal,
             "invariant": p.invariant, "breakable": p.breakable,
             "sessions": {s: [m.label for m in prog] for s, prog in p.programs.items()},
             "crashable": list(p.crashable),
             "shortest": len(p.shortest) if p.shortest else None, "notebook": p.notebook}
            for p in puzzles()]


# -- the seat: a widget ----------------------------------------------------------------------------------
class Seat:
    """A puzzle on the server with a button per move: the learner plays the scheduler.

    After every click the transcript so far and what the check read are shown, and the
    verdict.  ``start again`` sets the scene up anew.  A play is written into the learner's
    record when its promise breaks or when no move is left.  ``.box`` is the widget; its text
    form (GitHub, nbval, a handout) is one line, and :meth:`text` the puzzle and the play so
    far (:func:`seat` prints it above the buttons)."""

    def __init__(self, lab: Lab, name: str, *, record_plays: bool = True) -> None:
        import ipywidgets as w

        from ..core.plots import static_box

        self.lab = lab
        self.puzzle = puzzle(name)
        self.record_plays = record_plays
        self.board: Board | None = None
        self.recorded = False
        self.buttons: dict[str, w.Button] = {}
        for s in self.puzzle.sessions:
            self.buttons[s] = w.Button(description=s, layout={"width": "auto"})
            self.buttons[s].on_click(lambda _, token=s: self.click(token))
            if s in self.puzzle.crashable:
                token = s + CRASH
                self.buttons[token] = w.Button(description=f"kill {s}", button_style="danger",
                                               layout={"width": "auto"})
                self.buttons[token].on_click(lambda _, token=token: self.click(token))
        self.again = w.Button(description="start again", layout={"width": "auto"})
        self.again.on_click(lambda _: self.start())
        self.out = w.Output(layout={"border": "1px solid #ccc", "padding": "4px"})
        self.box = static_box([w.HTML(f"<b>{self.puzzle.title}</b> &mdash; {self.puzzle.goal}"),
                               w.HBox([*self.buttons.values(), self.again], layout={"flex_flow": "row wrap"}),
                               self.out], self.describe)
        self.box.add_class("labkit-seat")
        self.start()

    def start(self) -> None:
        if self.board is not None:
            self.board.close()
        self.board = Board(self.lab, self.puzzle.name)
        self.recorded = False
        self._render()

    def click(self, token: str) -> None:
        """What a click on the button for ``token`` does (a test calls it through the button)."""
        board = self.board
        assert board is not None
        try:
            board.move(token)
        except LabkitError as exc:
            self._render(str(exc))
            return
        note = ""
        if self.record_plays and not self.recorded and (board.broken_after is not None or not board.legal()):
            self.recorded = True
            try:
                record(self.lab.admin, board.result())
            except LabkitError as exc:
                note = f"Not recorded: {exc}"
        self._render(note)

    def text(self, note: str = "") -> str:
        board = self.board
        assert board is not None
        lines = [describe(self.puzzle), ""]
        if board.moves:
            lines += [board.transcript().to_lines(), ""]
        if board.broken_after is not None:
            lines.append(f"after move {board.broken_after}, the check read:")
        lines += [f"    {k}: {v}" for k, v in board.read_at_verdict.items()]
        if board.broken_after is not None:
            lines.append(f"BROKEN after move {board.broken_after}: {','.join(board.moves[:board.broken_after])}"
                         + (f" (the shortest known takes {len(self.puzzle.shortest)})"
                            if self.puzzle.shortest else ""))
        else:
            lines.append(f"holds after {len(board.moves)} moves" + ("" if board.legal() else "; no move left"))
        if note:
            lines.append(note)
        return "\n".join(lines)

    def describe(self) -> str:
        """The widget's text form, one short line (a front end cuts a widget's text at 110
        characters): :meth:`text` has the play so far."""
        board = self.board
        done = len(board.moves) if board is not None else 0
        state = "broken" if board is not None and board.broken_after is not None else "holds"
        return f"The scheduler's seat: {self.puzzle.name}, {done} moves played, the promise {state}"

    def _render(self, note: str = "") -> None:
        board = self.board
        assert board is not None
        legal = set(board.legal())
        for token, button in self.buttons.items():
            button.disabled = token not in legal
            session = token.rstrip(CRASH)
            nxt = board.next_step(session)
            if not token.endswith(CRASH):
                state = board.ended.get(session, "finished")     # "crashed" and "found no work" as said
                button.description = (f"{session}: {nxt.label}" if nxt and session not in board.ended
                                      else f"{session}: {'done' if state == 'finished' else state}")
        # Written into the widget's own model, not printed (see Trace.replay).
        self.out.outputs = ()
        self.out.append_stdout(self.text(note) + "\n")

    def close(self) -> None:
        if self.board is not None:
            self.board.close()
            self.board = None


def seat(lab: Lab, name: str) -> Seat:
    """Show puzzle ``name`` as buttons on the server (notebook 20); returns the :class:`Seat`."""
    from IPython.display import display

    s = Seat(lab, name)
    print(s.text())
    print("No buttons below? puzzles.play(lab, name, moves) plays the moves; seat.text() shows them.")
    display(s.box)
    return s


# -- the command ---------------------------------------------------------------------------------------
def list_command(*, json: bool = False) -> int:
    """``labkit play --list [--json]``."""
    if json:
        print(_json.dumps(as_listing_json(), indent=2))
    else:
        print(listing())
    return 0


def play_command(*, open_lab: Callable[[], Lab], name: str, steps: str | None, search_all: bool = False,
                 json: bool = False) -> int:
    """``labkit play PUZZLE [--steps A,B,...] [--search] [--json]``: without --steps, the
    puzzle and its first moves; with them, the play, written into the learner's record; with
    --search, every ordering.  Exit 0 whether or not the promise broke (the output says)."""
    p = puzzle(name)
    if steps is not None and search_all:
        raise LabkitError("--steps and --search ask for two different things.",
                          "give --steps to play your ordering, or --search to play every one.")
    if steps is None and not search_all:
        if json:
            print(_json.dumps(next(d for d in as_listing_json() if d["name"] == p.name), indent=2))
        else:
            first = ",".join(p.sessions[:2])
            print(describe(p))
            print(fill(f"Play it: labkit play {p.name} --steps {first},... (a session's name runs "
                       f"its next step{'; ' + CRASH + ' after it kills its process' if p.crashable else ''}).",
                       indent="  ", first=""))
        return 0
    moves = parse_steps(steps or "")
    if steps is not None and not moves:
        raise LabkitError("--steps names no move.",
                          f"give the sessions' names in the order to run them, e.g. --steps {','.join(p.sessions)}.")
    with open_lab() as lab:
        if search_all:
            found = search(lab, name)
            print(found.to_json() if json else format_search(found))
            return 0
        with Board(lab, name) as board:
            try:
                for token in moves:
                    board.move(token)
            except LabkitError:
                if board.moves and not json:      # what was played before the refused move
                    print(board.transcript().to_lines())
                raise
            r = board.result()
        print(r.to_json() if json else format_play(r))
        record(lab.admin, r)          # after the play is shown: a record refused says why
    return 0


def format_search(s: Search) -> str:
    p = puzzle(s.puzzle)
    lines = [f"{p.name}: {s.orderings_played} orderings played to their end or to the break "
             f"({s.moves_played} moves)"]
    if s.shortest is None:
        lines.append(fill(f"none broke \"{p.invariant}\"", indent="  ", first=""))
    else:
        lines.append(f"{s.broken_by} broke it; the shortest: {','.join(s.shortest)} ({len(s.shortest)} moves)")
    return "\n".join(lines)
