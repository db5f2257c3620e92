"""A relay that keeps its place with a high-water mark loses events; a published flag or a
transaction-id cursor does not.

Many relays read the outbox by position instead of marking rows::

    SELECT id, ... FROM outbox WHERE id > :cursor ORDER BY id;   -- publish them, then
    cursor := the last id read

A sequence hands out ids when rows are inserted, but transactions commit in another order.
Producer P1 inserts (and gets id n) and has not committed; producer P2 inserts n+1 and
commits; the relay reads ``id > cursor``, sees n+1 but not n (invisible until P1 commits),
publishes n+1 and moves its cursor past n.  P1 commits; no read ``id > cursor`` ever returns
n again: the event is lost, with no error anywhere.

Three relays, the same interleaving (``lk.Sessions``: sessions P1, P2 and relay; scripted, so
it reproduces exactly), all on the outbox of ``relay.create_outbox``, in ``cursor.sql``:

* the high-water mark (``cursor_read``): loses event n (:func:`cursor_gap`);
* the seed's relay (``published_at IS NULL ... FOR UPDATE SKIP LOCKED``, relay.py's claim):
  a row it has not published stays unpublished, so its next claim takes n once P1 commits
  (:func:`flag_gap`);
* a transaction-id cursor (``safe_read``): each row keeps its writer's transaction id
  (``xid8 DEFAULT pg_current_xact_id()``) and the relay reads only rows whose writer is older
  than the oldest transaction still running (``xid < pg_snapshot_xmin(pg_current_snapshot())``),
  in (xid, id) order, its cursor (xid, id).  That bound is the id of the oldest open *writer*
  (the oldest running transaction that has an xid), not the xmin horizon of
  :mod:`labkit.labs.horizon`, which any snapshot holds.  Nothing that can still commit lies
  behind its cursor, so nothing is lost; the price is lag: while P1 is open it publishes
  nothing newer than P1's transaction (:func:`safe_cursor_gap`), and any transaction that has written
  anything, on any table of any database of the server, holds it back the same way
  (:func:`open_writer_stall`).

Why the transaction-id cursor keeps (xid, id) and not the id alone: a transaction's xid comes
from its first write and an outbox row's id from its INSERT, so the two orders can differ.
:func:`id_cursor_gap` runs the bound with an id cursor (``bounded_read``) beside the (xid, id)
cursor in one script: the id cursor passes a row whose writer is newer, for good.

The broker is a table here (``published``): a scripted session sends only SQL.  Every number
returned is read back from the server, and so is each run's ``timeline`` (when each row was
inserted, committed and published, where the cursor stood at each read), which
:func:`plot_cursors` draws.  ``labkit trace cursor-gap`` prints
:func:`cursor_gap_trace` (:func:`cursor_gap_command`).
"""

from __future__ import annotations

import json as _json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.errors import LabkitError
from ..core.lab import Lab
from ..core.limits import number
from ..core.queries import query, statements
from ..core.results import Result, not_json
from ..core.sessions import Sessions
from . import fencing
from . import relay as rl

BATCH = 100          # rows one relay read takes at most
PRELOAD = 2          # orders placed and published before the script starts
MAX_LATER = 20
MAX_WAIT_S = 600
RELAYS = ("cursor", "flag", "safe", "bounded")
SESSION_ROLES = ("P1", "P2", "relay", "batch", "monitor", "relay-setup", "producer")


def check_params(*, later: int = 3, wait_s: float = 10.0) -> None:
    """Refuse bad parameters before anything is created: ``later`` orders P2 commits while
    P1 is open (1 to 20), ``wait_s`` the longest wait for other sessions' transactions that
    hold the safe cursor back before the script starts (0 to 600 s)."""
    number("later", later, low=1, high=MAX_LATER, whole=True, example=3)
    number("wait_s", wait_s, high=MAX_WAIT_S, unit=" s", example=10)


def _sql(name: str) -> str:
    return query("cursor.sql", name).text


def _rows(lab: Lab, name: str, **params) -> list[tuple]:
    return lab.execute(query("cursor.sql", name).sql, params)


def _ids(ids: list[int]) -> str:
    """3, 4, 5 -- or 3…9 for a longer run of ids."""
    if len(ids) > 3 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}…{ids[-1]}"
    return ", ".join(str(i) for i in ids)


def unpublished(lab: Lab, relay: str) -> list[int]:
    """Committed outbox rows ``relay`` has not published, by id."""
    return [r[0] for r in _rows(lab, "unpublished", relay=relay)]


def cursor_position(lab: Lab, relay: str) -> int:
    """The last id the cursor of ``relay`` ("cursor" or "safe") has passed."""
    return _rows(lab, "cursor_position", relay=relay)[0][0]


def publish_order(lab: Lab, relay: str) -> list[int]:
    """The outbox ids ``relay`` published, in the order the broker got them."""
    return [r[0] for r in _rows(lab, "published_order", relay=relay)]


def _answer(step) -> str:
    """A step's answer as the transcript shows it: the outbox ids a read, a claim or a
    producer's ``placed`` returned (``ids 4, 5, 6``, ``id 3``), else the server's brief answer."""
    shown = [r for r in step.results if r.columns]
    if step.error or not shown or shown[-1].columns[0] != "id":
        return step.outcome(brief=True)
    ids = [int(row[0]) for row in shown[-1].text_rows]
    return f"id{'s' if len(ids) > 1 else ''} {_ids(ids)}" if ids else "(no rows)"


def _story(run: Sessions, notes: dict[int | str, str]) -> str:
    """``run`` as a table, one column per session, each step ``label → answer``, and the notes
    under it keyed by step.  A run that did not go as scripted (a step waited or failed) is
    printed in full by :func:`fencing.story` instead."""
    if any(st.waited or st.error or not st.done for st in run.steps):
        return fencing.story(run, notes=notes)
    head = ["#", *run.names]
    table = [[str(i + 1)] + [f"{st.label} → {_answer(st)}" if st.session == name else ""
                             for name in run.names] for i, st in enumerate(run.steps)]
    widths = [max(len(row[i]) for row in [head, *table]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(head, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table]
    width = max([len(f"step {k}") for k in notes] + [0])
    lines += [f"{'step ' + str(k):<{width}}  {text}" for k, text in notes.items()]
    return "\n".join(lines)


# -- the three relays, one statement per step ------------------------------------------------

StepFn = Callable[[str, str], list[tuple]]      # (sql text, label) -> rows of the last result


def place_parts(lab: Lab, order_id: int) -> tuple[str, str]:
    """The seed's producer (outbox_produce.sql) for one order, as two texts a scripted session
    sends: its shop_order row (the transaction's first write, which gives the transaction its
    xid), then its outbox row with the id the sequence gave it read back."""
    params = {"order_id": order_id, "item": rl.ITEMS[order_id % len(rl.ITEMS)],
              "event_id": rl.event_id(order_id)}
    order, event = (fencing.bind(lab, s, **params).rstrip().rstrip(";") for s in rl.PRODUCE)
    placed = fencing.bind(lab, _sql("placed"), event_id=params["event_id"]).rstrip().rstrip(";")
    return order, f"{event};\n{placed}"


def place_text(lab: Lab, order_id: int) -> str:
    """The seed's producer (outbox_produce.sql) for one order, with the id the sequence gave
    its outbox row read back in the same transaction: the text a scripted session sends.  In
    autocommit the three statements of one message are one transaction."""
    return ";\n".join(place_parts(lab, order_id))


def tick(lab: Lab, relay: str, step: StepFn, *, settle: Callable[[], None] | None = None,
         tag: str = "") -> list[int]:
    """One round of ``relay`` ("cursor", "flag", "safe" or "bounded"), each statement sent
    through ``step(sql, label)``; returns the outbox ids it published, in order.  ``settle()``,
    when given, runs before a read below the bound (see :func:`settle_other_writers`).
    ``tag``, when given, starts each label (``A read``, ``A cursor := 4``) and the cursor's
    move names the row it moves to.

    cursor:  read ``id > cursor``; publish; cursor := last id read.
    flag:    BEGIN; the seed's claim (SKIP LOCKED); publish; mark published_at; COMMIT.
    safe:    read below the oldest open writer past (xid, id); publish; cursor := (xid, id) of the last.
    bounded: read below the oldest open writer past the last id, by id; publish; cursor := last id."""
    if relay not in RELAYS:
        raise LabkitError(f"No relay {relay!r}.", f"use one of {', '.join(RELAYS)}.")
    if relay == "flag":
        ids = [r[0] for r in step("BEGIN;\n" + rl.claim_text(BATCH), "BEGIN; claim")]
        if ids:
            step(fencing.bind(lab, _sql("publish"), relay=relay, ids=ids), f"publish {_ids(ids)}")
            step(fencing.bind(lab, rl.MARK, ids=ids), f"mark {_ids(ids)} published")
        step("COMMIT", "COMMIT")
        return ids
    if relay in ("safe", "bounded") and settle is not None:
        settle()
    pre = f"{tag} " if tag else ""
    read = {"cursor": "cursor_read", "safe": "safe_read", "bounded": "bounded_read"}[relay]
    label = (f"read id > {cursor_position(lab, relay)}" if relay == "cursor" and not tag
             else "read" if tag else "read below oldest writer")
    ids = [r[0] for r in step(fencing.bind(lab, _sql(read), batch=BATCH), pre + label)]
    if ids:
        step(fencing.bind(lab, _sql("publish"), relay=relay, ids=ids), f"{pre}publish {_ids(ids)}")
        advance = {"cursor": "cursor_advance", "safe": "safe_advance", "bounded": "bounded_advance"}[relay]
        to = (f"row {ids[-1]}" if relay == "safe" and tag else
              f"(xid of {ids[-1]}, {ids[-1]})" if relay == "safe" else f"{ids[-1]}")
        step(fencing.bind(lab, _sql(advance), id=ids[-1]), f"{pre}cursor := {to}")
    return ids


# -- set-up ------------------------------------------------------------------------------------


def _older_writers(lab: Lab, relay: str) -> list[tuple]:
    """Other sessions' (and prepared) transactions as old as the oldest row ``relay`` has not
    published: what keeps the safe cursor from reading it."""
    rows = _rows(lab, "oldest_unpublished", relay=relay)
    if not rows or rows[0][0] is None:
        return []
    return _rows(lab, "older_writers", x=rows[0][0], mine=[])


def settle_other_writers(lab: Lab, run: Sessions, wait_s: float) -> None:
    """Wait (up to ``wait_s``, asking the server) until no session outside ``run`` holds a
    transaction id older than the newest committed outbox row's writer.  Such a transaction
    would hold the safe cursor back as P1 does, and the script would not reproduce (on a
    server shared with other work, short ones come and go).  Race-free: a transaction that
    starts later gets a newer id, which holds back none of the rows already there.  A
    LabkitError names the sessions still there after ``wait_s``."""
    newest = _rows(lab, "newest_xid")
    if not newest:
        return
    mine = [s.pid for s in run.sessions.values()]
    deadline = time.monotonic() + wait_s
    while who := _rows(lab, "older_writers", x=newest[0][0], mine=mine):
        if time.monotonic() > deadline:
            raise _held_back_error(who, f"waited {wait_s:g} s")
        time.sleep(0.02)


def _held_back_error(who: list[tuple], waited: str) -> LabkitError:
    names = ", ".join(f"pid {pid} ({app or 'no name'}, database {dbname or '?'})" if pid != "prepared"
                      else f"prepared transaction {app!r} (database {dbname})" for pid, dbname, app in who[:5])
    return LabkitError(
        f"Transactions of other sessions that have written something ({names or 'not visible to you'}) "
        f"are older than the outbox rows, so the safe cursor may not read past them; {waited}. "
        "A transaction with an id, in any database of the server, holds back every snapshot's xmin, "
        "which is where the safe cursor stops.",
        "wait for the transactions named above to end, or end them where they are yours "
        "(`labkit clean` ends your own idle ones), then run it again.")


def create_cursor_outbox(lab: Lab, relay: str, *, wait_s: float = 10.0) -> None:
    """A new outbox (relay.create_outbox) with what the cursor relays need (``cursor.sql``,
    ``tables``), and ``PRELOAD`` orders placed and published by ``relay``: its cursor stands
    after them.  The safe cursor may wait up to ``wait_s`` for older transactions of other
    sessions to end; a LabkitError names them if they do not."""
    if relay not in RELAYS:
        raise LabkitError(f"No relay {relay!r}.", f"use one of {', '.join(RELAYS)}.")
    rl.create_outbox(lab)
    lab.execute("DROP TABLE IF EXISTS relay_cursor, published, batch_log")
    for stmt in query("cursor.sql", "tables").statements:
        lab.execute(stmt)
    rl.place_orders(lab, PRELOAD)
    _publish_all(lab, relay, wait_s)


def _publish_all(lab: Lab, relay: str, wait_s: float) -> None:
    """``relay`` publishes every committed outbox row, over a connection of its own."""
    with lab.connect(role="relay-setup") as conn:
        def step(text: str, label: str) -> list[tuple]:
            rows: list[tuple] = []
            for stmt in statements(text):
                cur = conn.execute(stmt)
                rows = cur.fetchall() if cur.description else rows
            return rows

        deadline = time.monotonic() + wait_s
        while unpublished(lab, relay):
            if tick(lab, relay, step):
                continue
            if time.monotonic() > deadline:
                raise _held_back_error(_older_writers(lab, relay), f"waited {wait_s:g} s")
            time.sleep(0.05)


# -- what the server showed at every step: the figure's data ------------------------------------


@dataclass(frozen=True)
class TimelineRow(Result):
    """One outbox row in a run's timeline; each time is a step of the transcript (0: before
    the script started).

    id: the row's outbox id.
    inserted: the step whose INSERT returned its id (None: not placed by a step).
    committed: the first step after which another session could see it.
    published: the step after which the broker had it (None: never published).
    """

    id: int
    inserted: int | None
    committed: int | None
    published: int | None


@dataclass(frozen=True)
class TimelinePoll(Result):
    """One read (or claim) of the relay in a run's timeline.

    step: the transcript's step of the read.
    ids: the outbox ids it returned, in order.
    below_bound: for the safe cursor, how many outbox rows lay below the oldest open writer
        at that read (None for the other relays).
    """

    step: int
    ids: list[int]
    below_bound: int | None


@dataclass(frozen=True)
class Timeline(Result):
    """One run as the server showed it after every step (:func:`plot_cursors` draws it), with
    no transaction id in it (they differ on every run); steps are the transcript's.

    relay: the relay that ran: ``cursor``, ``flag`` or ``safe``.
    steps: how many steps the transcript has.
    bound: for the safe cursor, (step, outbox rows below the oldest open writer) after every
        step; [] for the other relays.
    order: the outbox ids in the relay's read order.
    order_by: that order: ``id``, or ``(xid, id)`` for the safe cursor.
    rows: each outbox row, in ``order``: when it was inserted, committed and published.
    cursor: (step, the id the cursor stood at from that step on), one pair per move, the first
        at step 0; [] for the flag relay, which keeps no cursor.
    polls: each read of the relay, in order.
    """

    relay: str
    steps: int
    bound: list[tuple[int, int]]
    order: list[int]
    order_by: str
    rows: list[TimelineRow]
    cursor: list[tuple[int, int]]
    polls: list[TimelinePoll]


class _Timeline:
    """Sampled from the server after every step of a run: when each outbox row was inserted
    (the producer's step that returned its id), when another session could first see it
    (committed), when the broker got it, where the relay's cursor stood, and at each poll
    what it returned and, for the safe cursor, where the oldest open writer stood after every
    step (read as the relay's next read would see it: ``settle()`` first waits out older
    writers of other sessions, as before each read).  Steps are numbered as in the transcript;
    rows placed before the script are at step 0."""

    def __init__(self, lab: Lab, relay: str, settle: Callable[[], None] | None = None) -> None:
        self.lab, self.relay, self.settle = lab, relay, settle
        self.bounds: list[tuple[int, int]] = []
        before = [r[0] for r in lab.execute("SELECT id FROM outbox ORDER BY id")]
        self.inserted = {i: 0 for i in before}
        self.committed = {i: 0 for i in before}
        self.published = {i: 0 for i in publish_order(lab, relay)}
        self.cursor = [(0, cursor_position(lab, relay))] if relay != "flag" else []
        self.polls: list[dict] = []

    def after(self, run: Sessions) -> None:
        k, st = len(run.steps), run.steps[-1]
        if st.session != "relay" and st.label.startswith("place order"):
            self.inserted.update({int(r[0]): k for r in st.rows})
        for (i,) in self.lab.execute("SELECT id FROM outbox ORDER BY id"):
            self.committed.setdefault(i, k)
        for i in publish_order(self.lab, self.relay):
            self.published.setdefault(i, k)
        if self.relay != "flag":
            at = cursor_position(self.lab, self.relay)
            if at != self.cursor[-1][1]:
                self.cursor.append((k, at))
        bound = None
        if self.relay == "safe":
            if self.settle is not None:
                self.settle()
            bound = int(self.lab.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text")[0][0])
            self.bounds.append((k, bound))
        if st.session == "relay" and st.label.startswith(("read", "BEGIN; claim")):
            self.polls.append({"step": k, "ids": [int(r[0]) for r in st.rows], "bound": bound})

    def result(self, steps: int) -> Timeline:
        """The timeline, with no transaction id in it (they differ on every run): rows in the
        relay's read order ("id", or "(xid, id)" for the safe cursor) and, per poll of the safe
        cursor, how many of them lay below the oldest open writer; ``bound``: that count after
        every step, as (step, rows below)."""
        xids = {i: int(x) for i, x in self.lab.execute("SELECT id, xid::text FROM outbox")}
        key = (lambda i: (xids[i], i)) if self.relay == "safe" else (lambda i: i)
        order = sorted(xids, key=key)
        polls = [TimelinePoll(step=p["step"], ids=p["ids"],
                              below_bound=sum(xids[i] < p["bound"] for i in order)
                              if self.relay == "safe" else None)
                 for p in self.polls]
        bound = [(k, sum(xids[i] < b for i in order)) for k, b in self.bounds]
        return Timeline(relay=self.relay, steps=steps, bound=bound,
                        order=order, order_by="(xid, id)" if self.relay == "safe" else "id",
                        rows=[TimelineRow(id=i, inserted=self.inserted.get(i),
                                          committed=self.committed.get(i),
                                          published=self.published.get(i)) for i in order],
                        cursor=self.cursor, polls=polls)


# -- the interleaving --------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RelayGap(Result):
    """One relay in the interleaving: P1 holds order n open while P2 commits ``later`` newer
    orders, the relay reads, P1 commits, the relay reads until it publishes nothing.  Ids are
    outbox ids, read back from the server; :class:`CursorGap`, :class:`FlagGap` and
    :class:`SafeCursorGap` add the ids the relay lost, each under its relay's name.

    lost_event_ids: the event ids of the rows the relay never published (``evt-0003``).
    p1_event: n, the id of P1's row.
    newer_events: the ids of P2's rows, n+1 onwards.
    published_while_open: rows the relay published in its read while P1 was open.
    held_back_while_open: committed rows it had not published after that read.
    published_after_commit: the ids it published after P1's COMMIT, in order.
    publish_order: the ids the broker got, in order, after the rows placed before the script.
    cursor_at_end: the last id the relay's cursor passed (None for the flag relay: no cursor).
    oldest_writer: the session whose transaction was the safe cursor's bound while P1 was open
        ("P1"); None for the other relays.
    transcript: the run as text, a column per session, with notes.
    timeline: the run as the server showed it after every step, for :func:`plot_cursors`.
    run: the Sessions run (``fencing.story(run)`` prints it); not in the JSON.
    """

    lost_event_ids: list[str]
    p1_event: int
    newer_events: list[int]
    published_while_open: int
    held_back_while_open: int
    published_after_commit: list[int]
    publish_order: list[int]
    cursor_at_end: int | None
    oldest_writer: str | None
    transcript: str
    timeline: Timeline
    run: Sessions = not_json()


@dataclass(frozen=True, kw_only=True)
class CursorGap(RelayGap):
    """The high-water-mark relay in the interleaving (:func:`cursor_gap`): the fields of
    :class:`RelayGap`, and

    cursor_lost_events: the ids it never published ([n]).
    """

    cursor_lost_events: list[int]


@dataclass(frozen=True, kw_only=True)
class FlagGap(RelayGap):
    """The seed's relay, the published flag, in the interleaving (:func:`flag_gap`): the
    fields of :class:`RelayGap`, and

    flag_lost_events: the ids it never published ([]).
    """

    flag_lost_events: list[int]


@dataclass(frozen=True, kw_only=True)
class SafeCursorGap(RelayGap):
    """The transaction-id cursor in the interleaving (:func:`safe_cursor_gap`): the fields of
    :class:`RelayGap`, and

    safe_cursor_lost_events: the ids it never published ([]).
    """

    safe_cursor_lost_events: list[int]


def _notes_while_open(relay: str, n: int, newer: list[int], first: int, now: int) -> dict[int | str, str]:
    """What the relay's first tick did while P1 was open, keyed by the step each note follows."""
    if relay == "cursor":
        return {first: (f"it sees {_ids(newer)}, committed; row {n} is not visible yet, so "
                        f"id > {PRELOAD} passes over it"),
                now: (f"the cursor moves to {newer[-1]}: every id up to {newer[-1]} now "
                      "counts as published")}
    if relay == "flag":
        return {first: (f"the claim takes the unpublished rows it can see: {_ids(newer)}; "
                        f"row {n} is not visible yet")}
    return {first: (f"P1 is the oldest open writer: rows {_ids(newer)} have newer writers, "
                    "so they are held back")}


def _tick_until_idle(lab: Lab, relay: str, step: StepFn, settle: Callable[[], None] | None,
                     later: int) -> list[int]:
    """Tick the relay until a tick publishes nothing (``later + 3`` ticks at most); what it sent."""
    sent: list[int] = []
    for _ in range(later + 3):                     # until a tick finds nothing
        got = tick(lab, relay, step, settle=settle)
        sent += got
        if not got:
            break
    return sent


def _notes_at_end(relay: str, n: int, newer: list[int], lost: list[int], cursor: int | None,
                  after: int, last: int) -> dict[int | str, str]:
    """What the ticks after P1's COMMIT did, and what was lost, keyed by the step each note follows."""
    if relay == "cursor":
        return {last: (f"id > {cursor} never returns row {n}: {rl.event_id(n)} is lost"
                       if lost else "nothing lost")}
    if relay == "flag":
        return {after: f"row {n} still has published_at NULL: the next claim takes it",
                last: _end_note(lost, "nothing left to claim")}
    return {after: (f"P1 has ended, and no older writer is open: rows {_ids([n] + newer)} go out "
                    f"in xid order, {n} first"),
            last: _end_note(lost, "nothing left to read")}


def _relay_gap(lab: Lab, relay: str, later: int, wait_s: float) -> dict[str, Any]:
    """P1 BEGIN + INSERT (id n); P2 commits ``later`` orders; the relay ticks; P1 commits; the
    relay ticks until it publishes nothing.  What was lost is read from the server.  Returns
    the fields of a :class:`RelayGap`, and ``lost_events``."""
    create_cursor_outbox(lab, relay, wait_s=wait_s)
    n = PRELOAD + 1
    newer = list(range(n + 1, n + later + 1))
    notes: dict[int | str, str] = {}
    holder = None

    def settle() -> None:                               # called only inside the with block below
        settle_other_writers(lab, run, wait_s)

    timeline = _Timeline(lab, relay, settle if relay == "safe" else None)
    with Sessions(lab, "P1", "P2", "relay") as run:
        def do(session: str, text: str, label: str | None = None):
            st = run.step(session, text, label=label)
            timeline.after(run)
            return st

        def step(text: str, label: str) -> list[tuple]:
            return do("relay", text, label).rows

        def at() -> int:
            return len(run.steps)

        do("P1", "BEGIN")
        placed = do("P1", place_text(lab, n), label=f"place order {n}")
        if placed.rows != [(n, rl.event_id(n))]:
            raise LabkitError(f"P1's outbox row got id {placed.rows}, not {n}: the outbox was not new.",
                              "run it on a lab of its own (lab.reset() first).")
        if relay == "cursor":                           # the same for every relay: said once
            notes[at()] = f"P1's INSERT took id {n}; P1 has not committed, so no other session sees row {n}"
        for k in newer:
            do("P2", place_text(lab, k), label=f"place order {k}")
        if relay == "cursor":
            notes[at()] = (f"P2's {'orders are' if later > 1 else 'order is'} committed: "
                           f"row{'s' if later > 1 else ''} {_ids(newer)}")
        first = at() + 1
        sent_open = tick(lab, relay, step, settle=settle)
        if relay == "safe":
            settle()
            holder_rows = do("relay", fencing.bind(lab, _sql("oldest_writer")),
                             label="oldest open writer?").rows
            holder = holder_rows[0][0] if holder_rows else None
        held_open = unpublished(lab, relay)             # committed, not published: P1's row is not committed
        notes.update(_notes_while_open(relay, n, newer, first, at()))
        do("P1", "COMMIT")
        if relay == "cursor":
            notes[at()] = f"row {n} is committed now"
        after = at() + 1
        sent_after = _tick_until_idle(lab, relay, step, settle, later)
        last = at()
    lost = unpublished(lab, relay)
    if relay == "safe" and lost and (who := _older_writers(lab, relay)):
        raise _held_back_error(who, "one began while the script ran")
    cursor = cursor_position(lab, relay) if relay != "flag" else None
    notes.update(_notes_at_end(relay, n, newer, lost, cursor, after, last))
    return {"lost_events": lost,
            "lost_event_ids": [rl.event_id(i) for i in lost],
            "p1_event": n,
            "newer_events": newer,
            "published_while_open": len(sent_open),
            "held_back_while_open": len(held_open),
            "published_after_commit": sent_after,
            "publish_order": publish_order(lab, relay)[PRELOAD:],
            "cursor_at_end": cursor,
            "oldest_writer": holder,
            "transcript": _story(run, dict(sorted(notes.items()))),
            "timeline": timeline.result(len(run.steps)),
            "run": run}


def _end_note(lost: list[int], idle: str) -> str:
    return (f"{idle}: every event was published" if not lost
            else f"{idle}, yet row(s) {_ids(lost)} were never published")


def _gap(lab: Lab, relay: str, later: int, wait_s: float) -> dict[str, Any]:
    check_params(later=later, wait_s=wait_s)
    return _relay_gap(lab, relay, later, wait_s)


def cursor_gap(lab: Lab, *, later: int = 3) -> CursorGap:
    """The high-water-mark relay (``WHERE id > cursor ORDER BY id``) in the interleaving:
    P1 BEGIN + INSERT gets id n; P2 commits ``later`` orders (n+1...); the relay reads,
    publishes them and moves its cursor past n; P1 commits; the relay reads again: nothing.

    Returns a :class:`CursorGap`: ``cursor_lost_events`` (outbox ids: [n]), what it published
    and when, the ``transcript`` (the run as text, with notes), the ``timeline`` (sampled
    from the server after every step, for :func:`plot_cursors`) and the ``run``."""
    fields = _gap(lab, "cursor", later, 0.0)
    return CursorGap(cursor_lost_events=fields.pop("lost_events"), **fields)


def flag_gap(lab: Lab, *, later: int = 3) -> FlagGap:
    """The same interleaving with the seed's relay (``published_at IS NULL ... FOR UPDATE SKIP
    LOCKED``, relay.py's claim and mark): it publishes n once P1 commits.  Returns a
    :class:`FlagGap`: the same fields as :func:`cursor_gap`'s, with ``flag_lost_events`` ([])."""
    fields = _gap(lab, "flag", later, 0.0)
    return FlagGap(flag_lost_events=fields.pop("lost_events"), **fields)


def safe_cursor_gap(lab: Lab, *, later: int = 3, wait_s: float = 10.0) -> SafeCursorGap:
    """The same interleaving with the transaction-id cursor (``xid < pg_snapshot_xmin(
    pg_current_snapshot())``, ordered and kept by (xid, id)): it loses nothing, and while P1 is
    open it publishes none of the ``later`` newer events (``held_back_while_open``).  Returns
    a :class:`SafeCursorGap`: the same fields as :func:`cursor_gap`'s, with
    ``safe_cursor_lost_events`` ([]) and ``oldest_writer`` ("P1": whose transaction id was
    ``pg_snapshot_xmin``).  ``wait_s``: how long to wait for older transactions of other
    sessions to end, before the script and before each of the relay's reads
    (:func:`settle_other_writers`)."""
    fields = _gap(lab, "safe", later, wait_s)
    return SafeCursorGap(safe_cursor_lost_events=fields.pop("lost_events"), **fields)


class _Script:
    """What a scripted run's steps use: ``step(sql, label)`` sends a statement as session
    ``relay`` (:func:`tick`'s ``step``) and returns its rows, ``at()`` is the number of steps
    so far (the transcript's row of the last one), and ``settle()`` waits up to ``wait_s``
    for older writers of other sessions (:func:`settle_other_writers`)."""

    def __init__(self, lab: Lab, run: Sessions, wait_s: float) -> None:
        self.lab, self.run, self.wait_s = lab, run, wait_s

    def step(self, text: str, label: str) -> list[tuple]:
        return self.run.relay(text, label=label).rows

    def at(self) -> int:
        return len(self.run.steps)

    def settle(self) -> None:
        settle_other_writers(self.lab, self.run, self.wait_s)

    def tools(self) -> tuple[StepFn, Callable[[], int], Callable[[], None]]:
        """``step``, ``at`` and ``settle``, to call by those names."""
        return self.step, self.at, self.settle


# -- why the cursor is (xid, id), not the id alone -----------------------------------------------


@dataclass(frozen=True)
class IdCursorGap(Result):
    """The bound with the id alone as the cursor (relay A) beside the (xid, id) cursor
    (relay B), in one script where ids and transaction ids come in different orders
    (:func:`id_cursor_gap`).  Ids are outbox ids; n is the row P2 placed.

    id_cursor_lost_events: the ids relay A never published ([n]).
    safe_cursor_lost_events: the ids relay B never published ([]).
    lost_event_ids: relay A's lost rows as event ids.
    xid_order: rows n and n+1 in their writers' transaction-id order ([n+1, n]).
    publish_order: per relay, ``bounded`` (A) and ``safe`` (B), the ids the broker got, in
        order, after the rows placed before the script.
    transcript: the run as text, a column per session, with notes.
    run: the Sessions run (``fencing.story(run)`` prints it); not in the JSON.
    """

    id_cursor_lost_events: list[int]
    safe_cursor_lost_events: list[int]
    lost_event_ids: list[str]
    xid_order: list[int]
    publish_order: dict[str, list[int]]
    transcript: str
    run: Sessions = not_json()


def id_cursor_gap(lab: Lab, *, wait_s: float = 10.0) -> IdCursorGap:
    """Ids and transaction ids in different orders: the bound with the id alone as the cursor
    (relay A, ``bounded_read``) loses a row that the (xid, id) cursor (relay B, ``safe_read``)
    publishes, in one script.  P1 writes its order row first (so its transaction gets the
    older xid); P2 begins, places order n and takes outbox id n; P1 writes its outbox row,
    id n+1, and commits.  With P2 still open both relays read: row n+1 is below the bound
    (its writer is older than P2 and has ended), so both publish it.  A's cursor is now n+1,
    B's is (xid, id) of row n+1.  P2 commits: ``id > n+1`` never returns row n, while row n
    sorts after B's cursor, its writer being newer.

    Returns an :class:`IdCursorGap`: ``id_cursor_lost_events`` ([n]),
    ``safe_cursor_lost_events`` ([]), ``xid_order`` ([n+1, n]), ``publish_order`` (per relay),
    ``transcript`` and ``run``.  ``wait_s``: how long to wait for older transactions
    of other sessions, before the script and before each read (:func:`settle_other_writers`)."""
    check_params(wait_s=wait_s)
    create_cursor_outbox(lab, "safe", wait_s=wait_s)
    _publish_all(lab, "bounded", wait_s)
    n = PRELOAD + 1
    notes: dict[int | str, str] = {}
    with Sessions(lab, "P1", "P2", "relay") as run:
        step, at, settle = _Script(lab, run, wait_s).tools()

        order, event = place_parts(lab, n + 1)
        run.P1(f"BEGIN;\n{order}", label=f"BEGIN; order {n + 1}")
        notes[at()] = f"P1's first write, order {n + 1}'s row, gives its transaction an xid"
        placed = run.P2(f"BEGIN;\n{place_text(lab, n)}", label=f"BEGIN; place order {n}")
        notes[at()] = f"P2's transaction gets a newer xid, but its outbox row takes id {n} first"
        got = run.P1(event, label=f"order {n + 1}'s event")
        if placed.rows != [(n, rl.event_id(n))] or got.rows != [(n + 1, rl.event_id(n + 1))]:
            raise LabkitError(f"The outbox rows got ids {placed.rows} and {got.rows}, not {n} and {n + 1}: "
                              "the outbox was not new.", "run it on a lab of its own (lab.reset() first).")
        notes[at()] = f"P1's outbox row takes id {n + 1}: by xid, row {n + 1} comes before row {n}"
        run.P1("COMMIT")
        read_at = at() + 1
        tick(lab, "bounded", step, settle=settle, tag="A")
        notes[read_at] = (f"P2 is the oldest open writer; row {n + 1}'s writer, P1, is older and "
                          "has ended")
        notes[at()] = f"A's cursor moves to {n + 1}: every id up to {n + 1} counts as published"
        tick(lab, "safe", step, settle=settle, tag="B")
        notes[at()] = f"B's cursor is row {n + 1}'s (xid, id); row {n}'s writer is newer"
        run.P2("COMMIT")
        notes[at()] = f"row {n} is committed now"
        read_at = at() + 1
        tick(lab, "bounded", step, settle=settle, tag="A")
        notes[read_at] = f"id > {n + 1} never returns row {n}: {rl.event_id(n)} is lost"
        read_at = at() + 1
        for _ in range(3):
            if not tick(lab, "safe", step, settle=settle, tag="B"):
                break
        notes[read_at] = f"row {n} sorts after B's cursor: B publishes it"
    lost = unpublished(lab, "bounded")
    safe_lost = unpublished(lab, "safe")
    if safe_lost and (who := _older_writers(lab, "safe")):
        raise _held_back_error(who, "one began while the script ran")
    xid_order = [i for (i,) in lab.execute("SELECT id FROM outbox WHERE id = ANY(%s) ORDER BY xid",
                                           ([n, n + 1],))]
    return IdCursorGap(id_cursor_lost_events=lost,
                       safe_cursor_lost_events=safe_lost,
                       lost_event_ids=[rl.event_id(i) for i in lost],
                       xid_order=xid_order,
                       publish_order={r: publish_order(lab, r)[PRELOAD:] for r in ("bounded", "safe")},
                       transcript=_story(run, dict(sorted(notes.items()))),
                       run=run)


# -- what holds the safe cursor back -----------------------------------------------------------


@dataclass(frozen=True)
class WriterStall(Result):
    """What holds the transaction-id cursor back (:func:`open_writer_stall`): session
    ``batch`` first only reads, then writes a row to another table, while P1 places orders.
    Counts are outbox rows.

    held_back_by_open_reader: committed rows the safe cursor had not published after its read
        while ``batch`` had only read (0).
    published_while_reader_open: rows it published in that read (1).
    held_back_by_open_writer: committed rows it held back while ``batch``, having written, was
        open (1).
    oldest_writer: the session whose transaction was the cursor's bound then ("batch").
    safe_cursor_lost_events: the outbox ids it never published ([]).
    transcript: the run as text, a column per session, with notes.
    run: the Sessions run (``fencing.story(run)`` prints it); not in the JSON.
    """

    held_back_by_open_reader: int
    published_while_reader_open: int
    held_back_by_open_writer: int
    oldest_writer: str | None
    safe_cursor_lost_events: list[int]
    transcript: str
    run: Sessions = not_json()


def open_writer_stall(lab: Lab, *, wait_s: float = 10.0) -> WriterStall:
    """What holds the transaction-id cursor back: a transaction that has written something,
    not one that only reads.  Session ``batch`` opens a REPEATABLE READ transaction and reads
    (a snapshot, no transaction id): P1's order goes through.  The same transaction then
    inserts a row into ``batch_log``, a table the outbox has nothing to do with, and so gets a
    transaction id: P1's next order is held back until ``batch`` commits.

    Returns a :class:`WriterStall`: ``held_back_by_open_reader`` (0),
    ``held_back_by_open_writer`` (1), ``oldest_writer`` ("batch"), ``safe_cursor_lost_events``
    ([]), ``transcript``, ``run``."""
    check_params(wait_s=wait_s)
    create_cursor_outbox(lab, "safe", wait_s=wait_s)
    n = PRELOAD + 1
    notes: dict[int | str, str] = {}
    with Sessions(lab, "batch", "P1", "relay") as run:
        step, at, settle = _Script(lab, run, wait_s).tools()

        run.batch("BEGIN ISOLATION LEVEL REPEATABLE READ", label="BEGIN REPEATABLE READ")
        run.batch("SELECT count(*) AS orders FROM shop_order", label="read")
        notes[at()] = "batch holds a snapshot, and no transaction id: it has written nothing"
        run.P1(place_text(lab, n), label=f"place order {n}")
        read_at = at() + 1
        sent_reader = tick(lab, "safe", step, settle=settle)
        notes[read_at] = f"a transaction that has only read holds nothing back: row {n} goes out"
        held_reader = len(unpublished(lab, "safe"))
        run.batch("INSERT INTO batch_log (note) VALUES ('nightly export')", label="log a line")
        notes[at()] = "batch's first write, to a table the outbox has nothing to do with, gives it an xid"
        run.P1(place_text(lab, n + 1), label=f"place order {n + 1}")
        read_at = at() + 1
        tick(lab, "safe", step, settle=settle)
        notes[read_at] = f"row {n + 1} is committed, but its writer is newer than batch: held back"
        settle()
        holder_rows = run.relay(fencing.bind(lab, _sql("oldest_writer")),
                                label="oldest open writer?").rows
        holder = holder_rows[0][0] if holder_rows else None
        held_writer = len(unpublished(lab, "safe"))
        run.batch("COMMIT")
        after = at() + 1
        for _ in range(3):
            if not tick(lab, "safe", step, settle=settle):
                break
        notes[after] = f"batch has ended: row {n + 1} goes out"
    lost = unpublished(lab, "safe")
    if lost and (who := _older_writers(lab, "safe")):
        raise _held_back_error(who, "one began while the script ran")
    return WriterStall(held_back_by_open_reader=held_reader,
                       published_while_reader_open=len(sent_reader),
                       held_back_by_open_writer=held_writer,
                       oldest_writer=holder,
                       safe_cursor_lost_events=lost,
                       transcript=_story(run, notes),
                       run=run)


# -- the figure ----------------------------------------------------------------------------------


LEGEND_ORDER = ["inserted, not committed (no one else sees it)", "committed, waiting", "published",
                "committed, never published", "the relay's cursor: rows below it count as published",
                "a poll (the read)", "oldest open writer: the read stays below it"]


def _draw_timeline(ax, tl: Timeline, title: str) -> None:
    """One run's timeline on ``ax``: a row per outbox id (in the relay's read order, the first
    read at the bottom), x the transcript's step; each row dotted while it is inserted but not
    committed, solid while committed and waiting, a dot when the broker got it, a cross at the
    end if it never did; the cursor as a step line between rows, a triangle at each poll; for
    the safe cursor, the oldest open writer's bound after every step as a dashed line."""
    from ..core.plots import PALETTE

    end = tl.steps + 0.6
    rank = {row.id: y for y, row in enumerate(tl.rows, start=1)}
    for y, row in enumerate(tl.rows, start=1):
        ins, com, pub = row.inserted, row.committed, row.published
        if com is None:                     # never seen committed: nothing to draw
            continue
        if ins is not None and com > ins:
            ax.plot([ins, com], [y, y], ls=":", lw=3, color=PALETTE[7],
                    label="inserted, not committed (no one else sees it)")
        if pub is None:
            ax.plot([com, end], [y, y], lw=4, color=PALETTE[2], label="committed, never published")
            ax.plot([end], [y], "X", ms=16, color=PALETTE[2])
        else:
            if pub > com:
                ax.plot([com, pub], [y, y], lw=4, color=PALETTE[5], label="committed, waiting")
            ax.plot([pub], [y], "o", ms=12, color=PALETTE[3], label="published")
    xs = [k for k, _ in tl.cursor] + [end]
    ys = [rank[i] + 0.5 for _, i in tl.cursor]
    ax.step(xs, ys + ys[-1:], where="post", lw=3, color=PALETTE[0],
            label="the relay's cursor: rows below it count as published")
    level = dict(zip(xs, ys))
    for poll in tl.polls:
        at = max(k for k in level if k <= poll.step)
        ax.plot([poll.step], [level[at]], "v", ms=14, color=PALETTE[0], label="a poll (the read)")
    if tl.order_by == "(xid, id)" and tl.bound:
        steps = [k for k, _ in tl.bound]
        below = [b + 0.5 for _, b in tl.bound]
        ax.step(steps + [end], below + below[-1:], where="post", ls="--", lw=3, color=PALETTE[1],
                label="oldest open writer: the read stays below it")
    ax.set_yticks(list(rank.values()), [f"id {i}" for i in rank])
    ax.set_ylim(0.4, len(rank) + 0.9)
    ax.set_xlim(-0.4, end + 0.4)
    ax.set_xticks(range(0, tl.steps + 1, 2))
    ax.set_xlabel("step of the transcript")
    ax.set_title(title)


def plot_cursors(high_water: RelayGap, safe: RelayGap):
    """The high-water mark (left) and the transaction-id cursor (right) in the same script,
    from :func:`cursor_gap`'s and :func:`safe_cursor_gap`'s ``timeline``: each outbox row from
    its INSERT to its COMMIT and to the broker, the cursor at each poll, and the row the
    high-water mark passed.  Returns the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.artist import Artist

    from ..core.plots import setup_matplotlib

    for name, r in (("high_water", high_water), ("safe", safe)):
        if not isinstance(getattr(r, "timeline", None), Timeline):
            raise LabkitError(f"{name} is not a run with a timeline.",
                              "pass the results of cursor.cursor_gap(lab) and cursor.safe_cursor_gap(lab).")
    if high_water.timeline.relay != "cursor" or safe.timeline.relay != "safe":
        raise LabkitError("plot_cursors takes the high-water mark's run, then the safe cursor's.",
                          "pass cursor.cursor_gap(lab), then cursor.safe_cursor_gap(lab).")
    setup_matplotlib()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 6.3))
    _draw_timeline(left, high_water.timeline, "id > cursor")
    _draw_timeline(right, safe.timeline, "(xid, id) below the oldest writer")
    left.set_ylabel("outbox row, in read order")
    handles: dict[str, Artist] = {}
    for ax in (left, right):
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    order = sorted(handles, key=lambda label: LEGEND_ORDER.index(label))
    fig.legend([handles[label] for label in order], order, loc="outside lower center", ncol=2,
               frameon=False)
    return fig


# -- the trace and its command -------------------------------------------------------------------


@dataclass(frozen=True)
class CursorGapTrace(Result):
    """The three relays in the same interleaving, then what holds the safe cursor back
    (:func:`cursor_gap_trace`; ``labkit trace cursor-gap --json`` prints it without the
    transcripts).  Ids are outbox ids; n is P1's row; "per relay" means keys ``cursor``,
    ``flag`` and ``safe``.

    cursor_lost_events: the ids the high-water mark never published ([n]).
    flag_lost_events: the ids the published-flag relay never published ([]).
    safe_cursor_lost_events: the ids the transaction-id cursor never published ([]).
    lost_event_ids: the high-water mark's lost rows as event ids.
    p1_event: n.
    later: the orders P2 committed while P1 was open.
    held_back_while_open: committed rows the transaction-id cursor held back while P1 was
        open (``later``).
    published_while_open: per relay, the rows it published while P1 was open.
    publish_order: per relay, the ids the broker got, in order.
    oldest_writer: the session whose transaction was the safe cursor's bound while P1 was
        open ("P1").
    held_back_by_open_reader: rows an open transaction that had only read held back (0).
    held_back_by_open_writer: rows an open transaction that had written to another table held
        back (1).
    stalled_by: the session of that writer ("batch").
    transcripts: per relay, and ``stall`` for the last run, the runs as text.
    """

    cursor_lost_events: list[int]
    flag_lost_events: list[int]
    safe_cursor_lost_events: list[int]
    lost_event_ids: list[str]
    p1_event: int
    later: int
    held_back_while_open: int
    published_while_open: dict[str, int]
    publish_order: dict[str, list[int]]
    oldest_writer: str | None
    held_back_by_open_reader: int
    held_back_by_open_writer: int
    stalled_by: str | None
    transcripts: dict[str, str]


def cursor_gap_trace(lab: Lab, *, later: int = 3, wait_s: float = 10.0) -> CursorGapTrace:
    """The three relays in the same interleaving, then what holds the safe cursor back.

    Returns a :class:`CursorGapTrace`: ``cursor_lost_events`` ([n]), ``flag_lost_events``
    ([]), ``safe_cursor_lost_events`` ([]), ``held_back_while_open`` (the safe cursor's:
    ``later``), ``published_while_open`` and ``publish_order`` (per relay),
    ``held_back_by_open_reader`` (0), ``held_back_by_open_writer`` (1) and ``transcripts``."""
    check_params(later=later, wait_s=wait_s)
    c, f, s = (cursor_gap(lab, later=later), flag_gap(lab, later=later),
               safe_cursor_gap(lab, later=later, wait_s=wait_s))
    runs: dict[str, RelayGap] = {"cursor": c, "flag": f, "safe": s}
    stall = open_writer_stall(lab, wait_s=wait_s)
    return CursorGapTrace(cursor_lost_events=c.cursor_lost_events,
                          flag_lost_events=f.flag_lost_events,
                          safe_cursor_lost_events=s.safe_cursor_lost_events,
                          lost_event_ids=c.lost_event_ids,
                          p1_event=c.p1_event,
                          later=later,
                          held_back_while_open=s.held_back_while_open,
                          published_while_open={k: r.published_while_open for k, r in runs.items()},
                          publish_order={k: r.publish_order for k, r in runs.items()},
                          oldest_writer=s.oldest_writer,
                          held_back_by_open_reader=stall.held_back_by_open_reader,
                          held_back_by_open_writer=stall.held_back_by_open_writer,
                          stalled_by=stall.oldest_writer,
                          transcripts={**{k: r.transcript for k, r in runs.items()},
                                       "stall": stall.transcript})


TITLES = {"cursor": "the high-water mark: WHERE id > cursor ORDER BY id",
          "flag": "the seed's relay: published_at IS NULL ... FOR UPDATE SKIP LOCKED",
          "safe": "the transaction-id cursor: xid < pg_snapshot_xmin(pg_current_snapshot())",
          "stall": "what holds the transaction-id cursor back: a transaction that has written"}


def cursor_gap_command(*, open_lab: Callable[[], Lab], later: int = 3, wait_s: float = 10.0,
                       json: bool) -> int:
    """``labkit trace cursor-gap [--later 3] [--wait 10] [--json]``: :func:`cursor_gap_trace`
    (``later`` 1 to 20 orders P2 commits while P1 is open; ``wait_s`` 0 to 600 s), printed as
    the four runs and a summary, or as JSON (without the transcripts).  ``open_lab()`` gives
    the run its own lab, dropped at the end."""
    check_params(later=later, wait_s=wait_s)              # before anything is created
    with open_lab() as lab:
        r = cursor_gap_trace(lab, later=later, wait_s=wait_s)
    if json:
        print(_json.dumps({k: v for k, v in r.as_dict().items() if k != "transcripts"}, indent=2))
        return 0
    for kind, text in r.transcripts.items():
        print(f"-- {TITLES[kind]}")
        print(text)
        print()
    n, ids = r.p1_event, r.lost_event_ids
    print(f"P1 held event {n} open while P2 committed {later} newer one(s):")
    print(f"  high-water mark   lost {r.cursor_lost_events} ({', '.join(ids) or 'none'}); "
          f"published {r.published_while_open['cursor']} while P1 was open")
    print(f"  published flag    lost {r.flag_lost_events}; "
          f"published {r.published_while_open['flag']} while P1 was open")
    print(f"  transaction-id    lost {r.safe_cursor_lost_events}; held back "
          f"{r.held_back_while_open} while P1 was open (the oldest open writer: {r.oldest_writer})")
    print(f"  an open reader held back {r.held_back_by_open_reader}, an open writer on another "
          f"table {r.held_back_by_open_writer} ({r.stalled_by})")
    return 0
