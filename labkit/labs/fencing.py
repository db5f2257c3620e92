"""Leases need fences: a zombie worker, with and without a fencing token.

A worker whose lease ran out may still be alive, waiting on a slow send. Another
worker re-claims the row (the claim bumps ``claim_version``) and finishes it. Then
the zombie's send returns and it writes its stale outcome:

* without a fence (``WHERE id = %(id)s``) the write lands and clobbers the status;
* with a fence (``... AND claim_version = %(claim_version)s``) it matches zero rows,
  and the zombie learns it lost the lease.

Notebook 08 writes this interleaving out itself, one SQL statement per step, with
``lk.Sessions``: :func:`bind` gives the drain's SQL with its parameters written in (a session
sends plain text), :func:`write_text` one worker's outcome write, :func:`story` prints the run
with the scripted events that are not SQL (the pushes) in their worker's column, and
:func:`check_late_write` is the checker it calls afterwards -- did the zombie's late write land
(a lost update) or was it fenced?

:func:`zombie_trace` runs the same story with the drain's own code (``Drain``, the push
service stand-in, the phone) and is what ``labkit trace zombie`` prints.  Both are scripted
steps in one process on the lab's frozen clock, so they reproduce exactly.  ``zombie_push``
scripts the zombie's own push: ``"lost"`` (it never reaches the device) or ``"delivered"`` (it
reached the device; only the answer was lost, so the request timed out) -- the case the fence
cannot help with: the device then has the push twice, and only a receiver that checks a key
(the delivery id) shows it once. :func:`check_fenced_write` runs a reader's completion write as
the zombie and as the live worker, in both orders, on the row's second attempt and on its last,
and says whether the stale write got through.

:func:`raise_concurrency` runs the drain as real processes at a given concurrency (drains, rows
a claim) with one drain killed and one frozen mid-batch, and counts what that cost: duplicate
pushes, stale writes that landed, row locks held; :func:`batch_outlives_lease` shows a batch
whose sends take longer than its lease being re-claimed while it is still going out.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import psycopg

from ..core.clock import Clock
from ..core.errors import LabkitError
from ..core.lab import Lab
from ..core.queries import strip_comments
from ..core.results import Result
from ..core.sessions import Sessions, Step
from ..core.text import wrap
from ..core.trace import Trace
from . import drain as dr
from ._checked import started_pid

ROW = ("SELECT status, attempts, claim_version, next_attempt_at, last_error "
       "FROM delivery WHERE id = 1")
PUSHES_TO_DEVICE = "SELECT count(*) FROM device_push WHERE delivery_id = 1"


def _row(lab: Lab, clock: dr.Clock) -> dict:
    status, attempts, version, due, error = lab.execute(ROW)[0]
    return {"status": status, "attempts": attempts, "claim_version": version,
            "next_attempt_at": clock.rel(due), "last_error": error or "-"}


# -- the interleaving written out with Sessions (notebook 08) -------------------------------------


def bind(lab: Lab, query: str, **params: object) -> str:
    """``query`` (one of the drain's .sql files) with its ``%(name)s`` parameters written in
    as SQL literals and its comment lines dropped: the plain text a scripted session
    (``lk.Sessions``) sends, since a session step takes no parameters."""
    if not isinstance(query, str) or not query.strip():
        raise LabkitError("The SQL to write the parameters into is empty.",
                          "pass the text of a statement, e.g. lk.read_sql('drain_claim.sql').")
    try:
        return psycopg.ClientCursor(lab.admin).mogrify(strip_comments(query), params)
    except (psycopg.ProgrammingError, KeyError, TypeError, ValueError) as exc:
        raise LabkitError(f"The SQL's parameters could not be filled in ({exc}).",
                          f"pass a value for every %(name)s it uses (given: {', '.join(params) or 'none'}), "
                          "and write a literal % as %%.") from None


def write_params(row: dr.Claimed, outcome: dr.Outcome) -> dict:
    """The parameters of an outcome write (drain_complete*.sql) for one claimed row: its id,
    the claim_version its claim handed out, the outcome and error, and max_attempts."""
    return {"id": row.id, "claim_version": row.claim_version, "outcome": outcome.outcome,
            "error": outcome.error, "max_attempts": dr.MAX_ATTEMPTS}


def write_text(lab: Lab, query: str, row: dr.Claimed, outcome: dr.Outcome) -> str:
    """The outcome write ``query`` as the worker holding ``row`` sends it: :func:`write_params`
    written in by :func:`bind`.  Every write carries its own claim's version; only a fenced
    ``WHERE`` (``AND claim_version = %(claim_version)s``) looks at it."""
    return bind(lab, query, **write_params(row, outcome))


def _check_scripted(run: Sessions, scripted: dict[int, tuple[str, str]]) -> None:
    """Each scripted event keyed by a step of ``run`` and given as (session, text)."""
    for n, event in scripted.items():
        if not (isinstance(n, int) and 1 <= n <= len(run.steps)):
            raise LabkitError(f"scripted={{{n!r}: ...}}: the run has steps 1 to {len(run.steps)}.",
                              "key each scripted event by the number of the step it follows.")
        if not (isinstance(event, tuple) and len(event) == 2 and event[0] in run.names):
            raise LabkitError(f"scripted={{{n}: {event!r}}} is not (session, text) of this run "
                              f"(sessions: {', '.join(run.names)}).",
                              "pass e.g. scripted={1: ('W1', 'calls APNs: no answer (scripted)')}.")


def _add_scripted_rows(rows: list, scripted: dict[int, tuple[str, str]]) -> list:
    """The transcript's rows with each scripted event right after its step, marked ``·``."""
    out = []
    for row in rows:
        out.append(row)
        if row.n.isdigit() and int(row.n) in scripted:
            session, text = scripted[int(row.n)]
            out.append(replace(row, n="·", session=session, text=text, note="", locks="", kind="ok"))
    return out


def _answer_columns(run: Sessions) -> dict[tuple[str, ...], list[str]]:
    """The column names of every answer of more than one column, each with the labels of
    the steps that got it."""
    seen: dict[tuple[str, ...], list[str]] = {}         # columns -> the labels of the steps
    for step in run.steps:
        shown = [r for r in step.results if r.columns]
        if shown and len(shown[-1].columns) > 1:
            labels = seen.setdefault(tuple(shown[-1].columns), [])
            if step.label not in labels:
                labels.append(step.label)
    return seen


def _story_footer(seen: dict[tuple[str, ...], list[str]], notes: dict[int | str, str]) -> list[str]:
    """The lines under the table: the answers' column names, then the notes."""
    lines: list[str] = []
    width = max([len(str(k)) for k in notes] + [6])
    indent = " " * (width + 7)
    for i, (cols, labels) in enumerate(seen.items()):
        lines += wrap(f"{' / '.join(labels)} → ({', '.join(cols)})", indent=indent,
                      first=f"{'' if i else 'answers':<{width + 5}}  ")
    for key, text in notes.items():
        for i, part in enumerate(str(text).splitlines() or [""]):
            lines += wrap(part, indent=indent, first=f"{'' if i else 'step ' + str(key):<{width + 5}}  ")
    return lines


def story(run: Sessions, *, scripted: Mapping[int, tuple[str, str]] | None = None,
          notes: Mapping[int | str, str] | None = None) -> str:
    """``run``'s transcript as text, with what happened outside SQL and a few notes.

    ``scripted`` maps a step number to ``(session, text)``: an event of that session that is
    not SQL (a push that hangs, one that is delivered), shown right after the step as a row
    marked ``·`` in the session's own column.  Under the table come the column names of every
    answer of more than one column (as the server named them) and then ``notes``, keyed by a
    step number (or a few: ``"2, 8"``); a note's further lines are indented under its first."""
    scripted, notes = dict(scripted or {}), dict(notes or {})
    _check_scripted(run, scripted)
    t = run.transcript()
    t.rows = _add_scripted_rows(t.rows, scripted)
    return "\n".join([t.to_text(), *_story_footer(_answer_columns(run), notes)])


LATE_ROW = "SELECT status, outcomes FROM delivery WHERE id = %s"


@dataclass(frozen=True)
class LateWrite(Result):
    """The checker's verdict on a zombie's late outcome write, read from the server.

    ``matched`` is how many rows the late write touched; ``carried`` the claim_version the
    zombie's claim handed out (and its write carried); ``owner_version`` the claim_version of
    the claim that re-claimed the row (the new owner's); ``status`` and ``outcomes`` are the
    row as it is now; ``correct_status`` is what the new owner recorded."""
    delivery_id: int
    matched: int
    carried: int
    owner_version: int
    status: str
    outcomes: int
    correct_status: str

    @property
    def lost_update(self) -> bool:
        """The stale write landed: the row's outcome is no longer the new owner's."""
        return self.matched > 0

    @property
    def fenced(self) -> bool:
        """The stale write matched nothing and the new owner's outcome stands."""
        return self.matched == 0 and self.status == self.correct_status

    @property
    def clobbered(self) -> bool:
        """The row's status is not the one the new owner recorded."""
        return self.status != self.correct_status

    def report(self) -> str:
        verdict = ("LOST UPDATE" if self.lost_update else "FENCED" if self.fenced
                   else "NOT FENCED CORRECTLY")
        lines = [f"{verdict} on delivery {self.delivery_id}",
                 f"  the late write carried claim_version {self.carried}; the new owner's claim "
                 f"is version {self.owner_version}"]
        if self.lost_update:
            lines.append(f"  it matched {self.matched} row: the stale worker overwrote the new "
                         "owner's outcome")
        elif self.fenced:
            lines.append("  it matched 0 rows: the zombie learns it lost the lease and drops "
                         "its result")
        else:
            lines.append("  it matched 0 rows, but the new owner's own write did not land "
                         "either")
        lines.append(f"  status now '{self.status}'; the new owner recorded "
                     f"'{self.correct_status}'; outcome writes on the row: {self.outcomes}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.report()


def _late_write(lab: Lab, delivery_id: int, matched: int, carried: int, owner_version: int,
                correct_status: str) -> LateWrite:
    status, outcomes = lab.execute(LATE_ROW, (delivery_id,))[0]
    return LateWrite(delivery_id, matched, carried, owner_version, status, outcomes, correct_status)


def rows_matched(step: Step) -> int:
    """How many rows a write step touched: the ``n`` of the server's ``UPDATE n``."""
    if step.error is not None:
        raise LabkitError(f"Step {step.index + 1} ({step.label!r}) failed: {step.error.short()}.",
                          "fix the statement; the checker reads how many rows a write touched.")
    if not step.done:
        raise LabkitError(f"Step {step.index + 1} ({step.label!r}) is still waiting.",
                          "let it finish (end its blocker's transaction, or run.wait(...)) first.")
    tag = step.results[-1].command.split() if step.results else []
    if len(tag) < 2 or tag[0] not in ("UPDATE", "DELETE", "INSERT") or not tag[-1].isdigit():
        raise LabkitError(f"Step {step.index + 1} ({step.label!r}) is not a write "
                          f"(the server answered {step.outcome()!r}).",
                          "pass the step of the late UPDATE.")
    return int(tag[-1])


def check_late_write(lab: Lab, late: Step, zombie: dr.Claimed, owner: dr.Claimed, *,
                     correct_status: str = "sent") -> LateWrite:
    """The checker for a zombie interleaving written out with ``lk.Sessions``: ``late`` is the
    step of the zombie's outcome write, ``zombie`` the row its claim returned (its id and the
    claim_version it carried), ``owner`` the row the re-claim returned (the new owner's).
    Reads the row from the server: a lost update if the late write touched a row, fenced if
    it touched none and the status is ``correct_status`` (what the new owner recorded)."""
    if zombie.id != owner.id or zombie.claim_version >= owner.claim_version:
        raise LabkitError(f"The zombie's claim (delivery {zombie.id}, version {zombie.claim_version}) "
                          f"must be an older claim of the same row as the owner's (delivery "
                          f"{owner.id}, version {owner.claim_version}).",
                          "pass the first claim's row as zombie and the re-claim's row as owner.")
    return _late_write(lab, zombie.id, rows_matched(late), zombie.claim_version,
                       owner.claim_version, correct_status)


def zombie_trace(lab: Lab, *, fence: bool, lease_s: float = dr.LEASE_S, overrun_s: float = 1,
                 timeout_s: float = 5, zombie_push: str = "lost") -> Trace:
    """Worker 1 claims, its send hangs past the lease; ``overrun_s`` after the lease ran out
    worker 2 re-claims and delivers; ``timeout_s`` after the lease ran out worker 1's request
    times out and it writes "retry later" (with ``Drain.complete_all``, which returns the ids
    whose lease was lost) — fenced or not.  Then the clock moves on by the backoff that
    "retry later" asks for and worker 2 claims again.  ``zombie_push="delivered"``: worker 1's
    push did reach the device before its request timed out."""
    dr.check_params(lease_s=lease_s, overrun_s=overrun_s, timeout_s=timeout_s)
    if zombie_push not in ("lost", "delivered"):
        raise LabkitError(f"zombie_push={zombie_push!r}: the zombie's push is either lost or delivered.",
                          "pass zombie_push='lost' (scripted never to arrive) or 'delivered'.")
    if overrun_s <= 0:
        raise LabkitError("overrun_s must be > 0: the zombie exists only once its lease ran out.",
                          "pass overrun_s=1 (one second past the lease).")
    if timeout_s <= overrun_s:
        raise LabkitError(f"The zombie's request must time out after its lease ran out "
                          f"(timeout_s={timeout_s} <= overrun_s={overrun_s}).",
                          "pass timeout_s larger than overrun_s (defaults: 5 and 1).")
    clock = dr.create_ledger(lab, 1, no_collapse_every=1)   # no collapse id: duplicates show
    tr = Trace(f"Zombie worker, {'WITH' if fence else 'WITHOUT'} a fence "
               f"({'WHERE id AND claim_version' if fence else 'WHERE id'})"
               + ("; its push was delivered, only the answer was lost" if zombie_push == "delivered" else ""))
    w1 = dr.make_drain(lab, "worker 1", batch=1, lease_s=lease_s, fence=fence)
    w2 = dr.make_drain(lab, "worker 2", batch=1, lease_s=lease_s, fence=fence)
    try:
        (mine,) = w1.claim()
        tr.add("worker 1", "claim delivery 1",
               f"the claim hands out claim_version {mine.claim_version} and a {lease_s:.0f} s lease",
               _row(lab, clock))
        if zombie_push == "delivered":
            w1.sender.send(mine)        # it reaches the device; the answer never comes back
            tr.add("worker 1", "send the push to APNs … it reaches the device, the answer does not",
                   "the request hangs (a slow network, a stalled connection): the worker waits, "
                   "not knowing the push was delivered",
                   {"pushes_to_device": lab.execute(PUSHES_TO_DEVICE)[0][0]})
        else:
            tr.add("worker 1", "send the push to APNs … no answer",
                   "the request hangs (a slow network, a stalled connection): the worker waits; "
                   "scripted: this push never reaches the device", {})
        clock.advance(lease_s + overrun_s)
        tr.add("clock", f"+{lease_s + overrun_s:g} s (the {lease_s:g} s lease, then {overrun_s:g} s "
                        "more): the lease has run out",
               "worker 1 is still waiting for APNs: alive, but no longer the owner — a zombie",
               {"at": f"T+{clock.elapsed():.0f} s", "due_now": lab.execute(dr.DUE_COUNT)[0][0]})
        (theirs,) = w2.claim()
        tr.add("worker 2", "re-claim delivery 1",
               f"the row was due again; claim_version is now {theirs.claim_version}",
               _row(lab, clock))
        live_out = w2.sender.send(theirs)
        live_rows = w2.complete(theirs, live_out)
        tr.add("worker 2", f"push delivered; write '{live_out.outcome}' (matched {live_rows} row)",
               "the device has the notification and the ledger says so: the correct state",
               {**_row(lab, clock), "pushes_to_device": lab.execute(PUSHES_TO_DEVICE)[0][0]})
        correct = "sent"                # worker 2's push was delivered and recorded

        clock.advance(timeout_s - overrun_s)
        timed_out = (f"clock +{timeout_s - overrun_s:g} s ({timeout_s:g} s after the lease ran out): "
                     "the request times out; write 'retry later'")
        lost = w1.complete_all([(mine, dr.Outcome("retry", "timeout: no answer from APNs"))])
        zombie_rows = 0 if lost else 1          # by id, at most one row
        verdict = _late_write(lab, mine.id, zombie_rows, mine.claim_version, theirs.claim_version,
                              correct)
        final = verdict.status
        at = {"at": f"T+{clock.elapsed():.0f} s"}
        if zombie_rows:
            tr.add("worker 1", f"{timed_out} with WHERE id = 1 (matched {zombie_rows} row)",
                   "the stale outcome overwrites the correct one: the delivered push is "
                   "scheduled to go out again", {**at, **_row(lab, clock)}, kind="error")
        else:
            tr.add("worker 1", f"{timed_out} with claim_version = {mine.claim_version} (matched 0 rows)",
                   f"the row's claim_version is {theirs.claim_version}, so the fenced write "
                   "changes nothing: Drain.complete_all returns the id as lease lost and worker 1 "
                   "does nothing more with it", {**at, **_row(lab, clock), "lease_lost": lost},
                   kind="check")

        # Move on by one backoff: when the zombie's "retry later" falls due (or would have).
        attempts = lab.execute("SELECT attempts FROM delivery WHERE id = 1")[0][0]
        wait = float(lab.execute("SELECT extract(epoch FROM drain_backoff(%s))", (attempts,))[0][0])
        clock.advance(wait)
        res = w2.tick()
        pushes = lab.execute(PUSHES_TO_DEVICE)[0][0]
        pushes_list = dr.read_pushes(lab)
        shown = len(dr.Device().show(pushes_list))
        keyed = len(dr.Device(dedup_on="delivery_id").show(pushes_list))
        if res.claimed:
            why = "the clobbered row is due again, so the device gets the same push again"
        elif pushes > 1:
            why = ("nothing is due: the ledger stays right (sent), but the device got the push twice — "
                   "the zombie's, delivered before its request timed out, and worker 2's")
        else:
            why = "nothing is due: the delivery stays sent, pushed once"
        due = ("when the 'retry later' falls due" if zombie_rows
               else "when the refused 'retry later' would have fallen due")
        tr.add("worker 2", f"clock +{wait:g} s = drain_backoff({attempts}), {due}; the next tick "
                           f"claims {len(res.claimed)} row(s)", why,
               {"at": f"T+{clock.elapsed():.0f} s", "status": lab.execute(ROW)[0][0],
                "pushes_to_device": pushes})
        tr.add("device", "show the pushes (drain.Device; the pushes carry no collapse id)",
               "a plain phone shows every push it got; a receiver that keeps the delivery ids it has "
               "seen (the idempotency key sent with the push) shows it once",
               {"banners_shown": shown, "banners_with_delivery_id_key": keyed}, kind="check")
    finally:
        dr.close_drain(w1)
        dr.close_drain(w2)
    tr.summary = {"fence": fence, "zombie_push": zombie_push, "zombie_write_rows": zombie_rows,
                  "lease_lost": lost, "final_status": final, "correct_status": correct, "clobbered": verdict.clobbered,
                  "reclaimed_after_zombie": len(res.claimed), "pushes_to_device": pushes,
                  "banners_shown": shown, "banners_with_delivery_id_key": keyed}
    return tr


# -- the exercise checker -----------------------------------------------------------------------


@dataclass(frozen=True)
class FenceScenario(Result):
    """One scenario of :func:`check_fenced_write`: a zombie's late 'retry' and the live
    worker's 'sent', both written with the completion write under check.

    scenario: when the zombie writes: after the live 'sent' (``AFTER``) or while the live
        worker is still sending (``WHILE``)
    attempt: the live worker's claim's attempt on the row
    max_attempts: the drain's MAX_ATTEMPTS (on the last attempt a 'retry' by id ends 'failed')
    zombie_rows: rows the zombie's late write matched (fenced: 0)
    live_rows: rows the live worker's write matched (fenced: 1)
    final_status: the delivery's status at the end (fenced: 'sent', its push was delivered)
    ok: whether the scenario ended as a fenced write must
    wrong: what went wrong, one sentence each (empty when ok)
    """

    scenario: str
    attempt: int
    max_attempts: int
    zombie_rows: int
    live_rows: int
    final_status: str
    ok: bool
    wrong: list[str]


@dataclass(frozen=True)
class FenceCheck(Result):
    """The checker's verdict on a completion write (:func:`check_fenced_write`).

    passed: whether the write is fenced: every scenario ok and the SQL ran
    scenarios: the scenarios run, in order (fewer if the SQL failed)
    problem: what the write gets wrong, or how the SQL failed ("" when it passed)
    """

    passed: bool
    scenarios: list[FenceScenario] = field(default_factory=list)
    problem: str = ""

    def report(self) -> str:
        lines = [("PASS" if self.passed else "FAIL") + ": the completion write "
                 + ("is fenced" if self.passed else "is not fenced correctly")]
        if self.scenarios:
            lines.append("  ok: the zombie's late 'retry' matches 0 rows, the live worker's 'sent' "
                         "1 row, and the")
            lines.append("      delivery (its push was delivered) ends 'sent'; anything else: WRONG")
            head = ("the zombie writes", "live's attempt", "zombie's write", "live's write", "ends")
            rows = [(s.scenario, f"{s.attempt} of {s.max_attempts}",
                     _rows(s.zombie_rows), _rows(s.live_rows), s.final_status)
                    for s in self.scenarios]
            widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
            lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(head, widths)).rstrip())
            for r, s in zip(rows, self.scenarios):
                lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths))
                             + ("  ok" if s.ok else "  WRONG"))
        if self.problem:
            lines += wrap(self.problem, indent="    ", first="  ")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.report()


def _rows(n: int) -> str:
    return f"{n} row" + ("" if n == 1 else "s")


def _write(conn: psycopg.Connection, query: str, row: dr.Claimed, outcome: dr.Outcome) -> int:
    return conn.execute(query, write_params(row, outcome)).rowcount


AFTER, WHILE = "after the live 'sent'", "while live is sending"


def _fence_ledger(scratch: Lab, earlier: int) -> Clock:
    """A fresh one-delivery ledger whose row has had ``earlier`` attempts, each answered
    'retry'; its clock."""
    clock = dr.create_ledger(scratch, 1, no_collapse_every=1)
    scratch.execute("UPDATE delivery SET attempts = %s, outcomes = %s WHERE id = 1",
                    (earlier, earlier))
    return clock


def _fence_writes(scratch: Lab, clock: Clock, query: str, lease_s: float,
                  zombie_first: bool) -> tuple[int, int, dr.Claimed] | str:
    """The zombie claims the row, its lease runs out, the live worker re-claims it; both
    write ``query`` (the zombie's late 'retry', the live worker's 'sent'), in the order
    given.  The rows each write matched and the live worker's claim, or how the SQL failed."""
    zombie = dr.make_drain(scratch, "zombie", batch=1, lease_s=lease_s)
    live = dr.make_drain(scratch, "live", batch=1, lease_s=lease_s)
    try:
        (old,) = zombie.claim()
        clock.advance(lease_s + 1)
        (new,) = live.claim()
        late = dr.Outcome("retry", "timeout: no answer from APNs")
        if zombie_first:
            z = _write(zombie.conn, query, old, late)
            n = _write(live.conn, query, new, live.sender.send(new))
        else:
            n = _write(live.conn, query, new, live.sender.send(new))
            z = _write(zombie.conn, query, old, late)
    except psycopg.Error as exc:
        return f"the SQL failed: {type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
    finally:
        dr.close_drain(zombie)
        dr.close_drain(live)
    return z, n, new


def _fence_scenario(scratch: Lab, z: int, n: int, new: dr.Claimed, *, zombie_first: bool) -> FenceScenario:
    """One scenario's verdict: the rows each write matched, the status the delivery ends
    in, and what went wrong."""
    final = scratch.execute("SELECT status FROM delivery WHERE id = 1")[0][0]
    wrong = ((["the zombie's write landed"] if z else [])
             + (["the live worker's write was refused"] if n != 1 else [])
             + ([f"the delivered push ends '{final}'"] if final != "sent" else []))
    return FenceScenario(scenario=WHILE if zombie_first else AFTER,
                         attempt=new.attempts, max_attempts=dr.MAX_ATTEMPTS,
                         zombie_rows=z, live_rows=n, final_status=final,
                         ok=not wrong, wrong=wrong)


def _fence_scenarios(scratch: Lab, query: str, lease_s: float) -> tuple[list[FenceScenario], str]:
    """Every scenario of :func:`check_fenced_write` in ``scratch``, in order, until the SQL
    fails: the scenarios run, and how it failed ("" if it did not)."""
    scenarios: list[FenceScenario] = []
    for earlier in (0, dr.MAX_ATTEMPTS - 2):
        for zombie_first in (False, True):
            clock = _fence_ledger(scratch, earlier)
            writes = _fence_writes(scratch, clock, query, lease_s, zombie_first)
            if isinstance(writes, str):
                return scenarios, writes
            scenarios.append(_fence_scenario(scratch, *writes, zombie_first=zombie_first))
    return scenarios, ""


def _fence_problem(scenarios: list[FenceScenario]) -> str:
    """What a write that failed the check gets wrong, if one of the two usual mistakes."""
    if any(s.live_rows == 0 for s in scenarios if not s.zombie_rows):
        return "the live worker's own write matched nothing: the fence must let the current claim through."
    if any(s.zombie_rows for s in scenarios):
        return ("the zombie's write still lands: carry the claim version it was issued "
                "(AND claim_version = %(claim_version)s).")
    return ""


def check_fenced_write(lab: Lab, query: str, *, lease_s: float = dr.LEASE_S) -> FenceCheck:
    """Run ``query`` (a completion write taking ``%(id)s``, ``%(claim_version)s``,
    ``%(outcome)s``, ``%(error)s``, ``%(max_attempts)s``) as a zombie and as the live
    worker, in a scratch schema next to ``lab``'s.  The zombie's late outcome is 'retry'
    (its request timed out), the live worker's 'sent' (its push was delivered), in two orders:

    * the zombie writes *after* the live worker recorded 'sent';
    * the zombie writes *while* the live worker is still sending (so the status is
      still 'pending': a status check alone cannot tell the two workers apart);

    each with the live worker's claim on the row's second attempt, and on its last one
    (``MAX_ATTEMPTS``: the row had ``MAX_ATTEMPTS - 2`` attempts, all answered 'retry', before
    the zombie claimed it).  On the last attempt a 'retry' written by id ends the row
    'failed'.

    Fenced correctly means: the zombie's write matches 0 rows every time, the live
    worker's write matches 1 row, and the delivery ends 'sent'."""
    if not isinstance(query, str) or not query.strip():
        raise LabkitError("The completion write to check is empty.",
                          "pass the SQL text of your UPDATE (see drain_complete.sql).")
    scratch = Lab.open(lab.db, f"{lab.name}_fence_check")
    try:
        scenarios, problem = _fence_scenarios(scratch, query, lease_s)
    finally:
        scratch.drop()
    passed = bool(scenarios) and not problem and all(s.ok for s in scenarios)
    if not passed and not problem:
        problem = _fence_problem(scenarios)
    return FenceCheck(passed, scenarios, problem)


# -- command line: labkit trace zombie ------------------------------------------------------------


def trace_command(*, open_lab: Callable[[], Lab], fence: bool, lease: float, zombie_push: str,
                  json: bool) -> int:
    """``labkit trace zombie --fence|--no-fence [--json]``.  ``open_lab()`` gives the run its
    own lab (a schema of this run's own: two runs at once never touch each other's tables)."""
    dr.check_params(lease_s=lease)      # before anything is created
    with open_lab() as lab:
        tr = zombie_trace(lab, fence=fence, lease_s=lease, zombie_push=zombie_push)
    print(tr.report(json))
    return 0


# -- raising the drain's concurrency: a crash and a zombie among more drains (notebook 08) ------


def pool_worker(ctx, dsn: str, schema: str, batch: int, lease_s: float, fence: bool,
                send_s: float) -> dict:
    """Child process: one drain of a pool.  Each time the parent resumes it, it ticks until
    its claim comes back empty, and reports what it sent, when it started and ended, and the
    longest time it held row locks: its claim statement (which commits at once) and its
    outcome transaction, each timed by its own clock."""
    conn, sender = dr._process_connections(ctx, dsn, schema, latency_s=dr.LATENCY_S,
                                           speed=send_s / dr.LATENCY_S)
    drain = dr.Drain(conn, sender, name=ctx.name, batch=batch, lease_s=lease_s, fence=fence)
    runs = 0
    while ctx.pause("ready") is not None:
        runs += 1
        start, sent, ticks, longest = time.monotonic(), 0, 0, 0.0
        while True:
            t = time.monotonic()
            rows = drain.claim()
            longest = max(longest, time.monotonic() - t)
            if not rows:
                break
            ticks += 1
            done = [(row, sender.send(row, by=ctx.name)) for row in dr.send_order(rows)]
            sent += len(done)
            t = time.monotonic()
            drain.complete_all(done)
            longest = max(longest, time.monotonic() - t)
        ctx.emit("finished", run=runs, start=start, end=time.monotonic(), sent=sent, ticks=ticks,
                 longest_lock_s=longest)
    return {"runs": runs}


def _scripted_drain(lab: Lab, name: str, *, batch: int, fence: bool,
                    pause_after: int) -> tuple[dr.Worker, list[int], list[int]]:
    """A drain process that claims ``batch`` rows, sends ``pause_after`` and waits there."""
    w = dr.Worker(dr.drain_worker, name=name, dsn=lab.db.dsn, schema=lab.schema, batch=batch,
                  lease_s=dr.LEASE_S, fence=fence, pause_after_claim=False,
                  pause_after_sends=pause_after)
    w.start()
    ev = w.wait_for("connected", timeout=60)
    ids = w.wait_for("claimed", timeout=60)["ids"]
    w.wait_for("paused", tag=f"sent-{pause_after}", timeout=60)
    return w, [ev["pid"], ev["sender_pid"]], ids


def _run_pool(pool: list, run: int) -> dict:
    """Resume every drain of the pool once; wait until each found nothing to claim."""
    for w in pool:
        w.wait_for("paused", tag="ready", count=run, timeout=90)
    for w in pool:
        w.resume("run")
    reports = [w.wait_for("finished", run=run, timeout=120) for w in pool]
    wall = max(r["end"] for r in reports) - min(r["start"] for r in reports)
    sent = sum(r["sent"] for r in reports)
    return {"sent": sent, "wall_s": wall, "longest_lock_s": max(r["longest_lock_s"] for r in reports)}


@dataclass(frozen=True)
class ConcurrencyRun(Result):
    """One drain run at a given concurrency, with one drain killed and one frozen mid-batch
    (:func:`raise_concurrency`): counted from the server, timed by the drains' clocks.

    drains: drain processes in the pool
    batch: rows a claim takes
    fence: whether the outcome writes were fenced by claim_version
    rows: deliveries in the backlog
    zombie_state: the frozen drain's process state while frozen ("stopped")
    rows_locked_mid_batch: row locks the killed and the frozen drain held while paused mid-batch
    pushes: pushes on record (device_push)
    duplicate_pushes: pushes beyond one per (device, notification)
    shown_twice_with_delivery_id_key: duplicates a receiver keyed on the delivery id still
        showed (0: the key dropped every one)
    reclaimed_after_lease: rows the pool sent once the lab's clock passed the lease
    zombie_writes: outcome writes the woken zombie made (its batch)
    zombie_writes_refused: of them, those the fence refused (0 rows matched)
    stale_writes_landed: outcome writes beyond one per delivery: writes of a claim that was
        no longer the row's
    sent: deliveries that ended 'sent'
    pending: deliveries left 'pending'
    failed: deliveries that ended 'failed'
    backlog_rows: rows the pool sent while it drained the backlog
    backlog_s: seconds the pool took to drain the backlog (the drains' clocks)
    jobs_per_s: backlog_rows / backlog_s (None if no time passed)
    longest_lock_ms: the longest any pool drain held row locks (a claim or an outcome
        transaction), in milliseconds
    send_ms: what one send really slept, in milliseconds
    """

    drains: int
    batch: int
    fence: bool
    rows: int
    zombie_state: str
    rows_locked_mid_batch: int
    pushes: int
    duplicate_pushes: int
    shown_twice_with_delivery_id_key: int
    reclaimed_after_lease: int
    zombie_writes: int
    zombie_writes_refused: int
    stale_writes_landed: int
    sent: int
    pending: int
    failed: int
    backlog_rows: int
    backlog_s: float
    jobs_per_s: float | None
    longest_lock_ms: float
    send_ms: float


def raise_concurrency(lab: Lab, *, drains: int, batch: int, fence: bool, rows: int = 160,
                      send_ms: float = 20) -> ConcurrencyRun:
    """One drain run at a given concurrency (``drains`` processes, ``batch`` rows a claim) over
    a backlog of ``rows`` deliveries, with one crash and one zombie, scripted:

    1. drain "crash" claims ``batch`` rows, sends half of them, and is SIGKILLed;
    2. drain "zombie" claims the next ``batch``, sends half, and is frozen with SIGSTOP;
    3. the pool of ``drains`` drain processes drains the rest (each send really sleeps
       ``send_ms``): the throughput is measured here;
    4. the lab's clock passes the lease: the pool re-claims and sends both batches;
    5. the zombie is resumed (SIGCONT): it sends the rest of its batch and writes its outcomes,
       by id (``fence=False``) or fenced by claim version.

    Counted from the server: the pushes on record (``device_push``), duplicates among them,
    the row locks either scripted drain held while paused mid-batch (``locked_among``), and
    the stale writes that landed: outcome writes beyond one per delivery (``outcomes`` in the
    ledger; every delivery ends ``sent`` by its latest claim, so any more came from a claim that
    was no longer the row's).  Timed by the drains' clocks: jobs a second while the pool drains
    the backlog, and the longest a drain held row locks (a claim or an outcome transaction)."""
    if drains < 1:
        raise LabkitError(f"{drains} drains cannot drain anything.", "pass drains >= 1.")
    dr.check_params(batch=batch, rows=rows, send_ms=send_ms, drains=drains)
    if batch < 2 or rows < 2 * batch + drains:
        raise LabkitError(f"A batch of {batch} in a backlog of {rows} leaves the pool nothing to do.",
                          "pass batch >= 2 and rows >= 2 * batch + drains.")
    clock = dr.create_ledger(lab, rows)
    half = batch // 2
    pool = [dr.Worker(pool_worker, name=f"drain {i + 1}", dsn=lab.db.dsn, schema=lab.schema,
                      batch=batch, lease_s=dr.LEASE_S, fence=fence, send_s=send_ms / 1000)
            for i in range(drains)]
    crash: dr.Worker | None = None
    zombie: dr.Worker | None = None
    try:
        for w in pool:
            w.start()
        crash, crash_pids, crash_ids = _scripted_drain(lab, "crash", batch=batch, fence=fence,
                                                       pause_after=half)
        locked_mid_batch = dr.locked_among(lab, crash_ids)
        crash.kill()
        dr._wait_backend_gone(lab, crash_pids[0])
        zombie, zombie_pids, zombie_ids = _scripted_drain(lab, "zombie", batch=batch, fence=fence,
                                                          pause_after=half)
        os.kill(started_pid(zombie), signal.SIGSTOP)
        zombie.resume()                     # queued: it goes on only once it is woken up
        state = dr._wait_stopped(started_pid(zombie))
        locked_frozen = dr.locked_among(lab, zombie_ids)
        backlog = _run_pool(pool, 1)
        clock.advance(dr.LEASE_S + 1)
        again = _run_pool(pool, 2)
        os.kill(started_pid(zombie), signal.SIGCONT)
        done = zombie.join(60) or {}
        lost = done.get("result", {}).get("lost", [])
        for w in pool:
            w.wait_for("paused", tag="ready", count=3, timeout=90)
            w.resume(None)
        for w in pool:
            w.join(30)
    finally:
        for left in [*pool, crash, zombie]:
            if left is not None:
                left.kill()
    statuses = dr._statuses(lab)
    extra_writes = lab.execute("SELECT coalesce(sum(outcomes), 0) - count(*) FROM delivery")[0][0]
    pushes = dr.read_pushes(lab)
    shown = dr.Device.count(pushes, dedup_on="delivery_id")
    return ConcurrencyRun(
        drains=drains, batch=batch, fence=fence, rows=rows,
        zombie_state=state,
        rows_locked_mid_batch=locked_mid_batch + locked_frozen,
        pushes=len(pushes), duplicate_pushes=shown.duplicate_pushes,
        shown_twice_with_delivery_id_key=shown.visible_duplicates + shown.hidden_by_collapse_id,
        reclaimed_after_lease=again["sent"],
        zombie_writes=len(zombie_ids), zombie_writes_refused=len(lost),
        stale_writes_landed=int(extra_writes),
        sent=statuses["sent"], pending=statuses["pending"], failed=statuses["failed"],
        backlog_rows=backlog["sent"], backlog_s=round(backlog["wall_s"], 3),
        jobs_per_s=round(backlog["sent"] / backlog["wall_s"], 1) if backlog["wall_s"] else None,
        longest_lock_ms=round(1000 * max(backlog["longest_lock_s"], again["longest_lock_s"]), 1),
        send_ms=send_ms,
    )


@dataclass(frozen=True)
class OutlivedLease(Result):
    """A batch whose sends may take longer than its lease (:func:`batch_outlives_lease`), on
    the lab's clock: no crash, no pause.

    batch: rows drain 1 claimed
    batch_s: lab seconds its sends took in all (batch * latency_s)
    lease_s: the lease its claim granted, in lab seconds
    taken_by_drain_2: rows of the batch drain 2 claimed while drain 1 was still sending
    taken_after_push: how many pushes drain 1 had sent when drain 2 got them (None: never)
    pushes: pushes on record (device_push)
    duplicate_pushes: pushes beyond one per (device, notification)
    drain_1_writes_landed: drain 1's outcome writes that matched their row
    """

    batch: int
    batch_s: float
    lease_s: float
    taken_by_drain_2: int
    taken_after_push: int | None
    pushes: int
    duplicate_pushes: int
    drain_1_writes_landed: int


def batch_outlives_lease(lab: Lab, *, batch: int, lease_s: float = dr.LEASE_S,
                         latency_s: float = dr.LATENCY_S, fence: bool = True) -> OutlivedLease:
    """No crash and no pause: drain 1 claims ``batch`` rows and sends them one by one, each
    push moving the lab's clock on ``latency_s`` (what an APNs call takes); after each push,
    drain 2 claims once, until it gets rows.  When the batch takes longer than the lease,
    drain 2 takes drain 1's rows while drain 1 is still sending them -- every row of the batch,
    since drain 1 writes no outcome before the end -- and both send them."""
    dr.check_params(batch=batch, lease_s=lease_s, latency_s=latency_s)
    clock = dr.create_ledger(lab, batch, no_collapse_every=1)
    one = dr.make_drain(lab, "drain 1", batch=batch, lease_s=lease_s, fence=fence)
    two = dr.make_drain(lab, "drain 2", batch=batch, lease_s=lease_s, fence=fence)
    taken: list[int] = []
    at: list[int] = []

    def after_push(i: int, row: dr.Claimed, out: dr.Outcome) -> None:
        clock.advance(latency_s)                     # the push took latency_s of APNs time
        if not taken:
            got = two.tick()
            if got.claimed:
                taken.extend(c.id for c in got.claimed)
                at.append(i)

    try:
        res = one.tick(after_push)
    finally:
        dr.close_drain(one)
        dr.close_drain(two)
    pushes, dups = lab.execute(dr._lab_sql("push_counts"))[0]
    return OutlivedLease(batch=batch, batch_s=batch * latency_s, lease_s=lease_s,
                         taken_by_drain_2=len(taken), taken_after_push=at[0] if at else None,
                         pushes=int(pushes), duplicate_pushes=int(dups),
                         drain_1_writes_landed=len(res.claimed) - len(res.lost))
