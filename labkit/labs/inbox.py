"""The consumer side of the outbox: what makes at-least-once delivery effectively once.

The relay delivers every event at least once, some of them twice (a relay that died
mid-batch, a broker that requeues what a dead consumer never acknowledged).  The consumer
makes that *effectively once* by recording each event id in the ``inbox`` (primary key on
``event_id``) in the same transaction as the event's effect: a copy hits the primary key,
inserts nothing and skips the effect, and a crash cannot fall between the record and the
effect, because they commit together.  Four consumers handle the same stream with the same
two writes, record and effect (``labkit/sql/inbox.sql``); only their COMMITs differ:

* ``in_memory``: keeps the ids seen in a Python set; effect, COMMIT, then the set.
  Killed between the COMMIT and the set.
* ``inbox``: BEGIN; record; effect; COMMIT.  Killed between the record and the effect,
  inside the transaction.
* ``separate_tx_effect_first``: is it recorded?; effect, COMMIT; record, COMMIT.
  Killed between the two COMMITs.
* ``separate_tx_record_first``: record, COMMIT; effect, COMMIT.  Killed between the two
  COMMITs.

:func:`consumer_trace` runs each consumer as OS processes (:class:`labkit.core.procs.Worker`):
process 1 handles the first part of the stream and is killed with SIGKILL at the scripted
point while it handles event ``kill_after``; process 2, a new process, gets what the broker
delivers next.  The broker is scripted by the parent (the same stream on every server, with
or without RabbitMQ): it hands each process its deliveries, and a message counts as
acknowledged once the consumer has finished with it, so the message in flight at the kill
is delivered again first -- as a broker requeues a message whose consumer died before
acknowledging it.  The stream, for ``events=N, duplicates=D, kill_after=K``::

    process 1:  e1 .. e(K-1),  e1 .. eD (redelivered),  eK  <- SIGKILL while handling it
    process 2:  eK (never acknowledged),  e1 .. eD (redelivered again),  e(K+1) .. eN

Every effect is read back from the database (``shop_order.labels_printed``), never counted
by the script.  What it shows: the set catches the copies that arrive while it lives and
none after the restart (D + 1 effects twice); the inbox applies every event once; the
separate transactions catch every copy but get the message in flight at the kill wrong --
once twice (effect first), once never (record first).

The inbox's cost and hygiene: its primary key is the deduplication, one index entry per
event applied; a copy costs one probe of it and writes nothing.  It grows by one row per
event forever unless pruned, and pruning is safe only past the longest delay after which
a copy can still arrive: the trace prunes the rows applied before the restart and shows a
late copy of one of them applied again.

:func:`plot_effects` draws a trace's effects: a row per consumer, a column per event, each
cell once, twice or never.  ``labkit trace consumer [--events N] [--duplicates D]
[--kill-after K] [--json]`` prints it (:func:`consumer_command`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import psycopg

from ..core.db import wait_backends_gone
from ..core.errors import LabkitError
from ..core.lab import Lab
from ..core.limits import number
from ..core.procs import Context, Worker
from ..core.queries import query
from ..core.results import Result
from ._checked import one_row
from .relay import create_outbox, event_id, place_orders, relay_connection

EVENTS = 20
DUPLICATES = 5
KILL_AFTER = 10
MAX_EVENTS = 1000
WAIT_S = 60.0

# name -> (role prefix, how it handles a message, where the kill falls)
CONSUMERS: dict[str, tuple[str, str, str]] = {
    "in_memory": ("memory", "in memory: a Python set of the ids seen",
                  "after the effect's COMMIT, before the set"),
    "inbox": ("inbox", "inbox: record and effect in one transaction",
              "after the inbox INSERT, before the effect and the COMMIT"),
    "separate_tx_effect_first": ("effect-first", "inbox, two transactions: effect, then record",
                                 "after the effect's COMMIT, before the record's"),
    "separate_tx_record_first": ("record-first", "inbox, two transactions: record, then effect",
                                 "after the record's COMMIT, before the effect's"),
}
KILL_POINT = "kill-point"


def _sql(name: str) -> str:
    return query("inbox.sql", name).sql


def _nothing() -> None:
    pass


# -- one message, four ways ----------------------------------------------------------------------


def handle(conn: psycopg.Connection, consumer: str, event: str, order_id: int, *,
           seen: set[str] | None = None, between: Callable[[], object] = _nothing) -> bool:
    """Handle one message the way ``consumer`` does (a name of :data:`CONSUMERS`) over the
    autocommit connection ``conn``; ``between`` runs between its two writes (the kill
    point).  ``seen`` is the in-memory consumer's set.  Returns True if it applied the
    effect, False if it took the message for a copy."""
    params = {"event_id": event, "order_id": order_id}
    if consumer == "in_memory":
        if seen is None:
            raise LabkitError("The in-memory consumer needs its set.", "pass seen=set().")
        if event in seen:
            return False
        with conn.transaction():
            conn.execute(_sql("effect"), params)
        between()
        seen.add(event)
        return True
    if consumer == "inbox":
        with conn.transaction():
            if conn.execute(_sql("record"), params).fetchone() is None:
                return False
            between()
            conn.execute(_sql("effect"), params)
        return True
    if consumer == "separate_tx_effect_first":
        if one_row(conn.execute(_sql("recorded"), params), "inbox.sql's recorded")[0]:
            return False
        with conn.transaction():
            conn.execute(_sql("effect"), params)
        between()
        with conn.transaction():
            conn.execute(_sql("record"), params)
        return True
    if consumer == "separate_tx_record_first":
        with conn.transaction():
            if conn.execute(_sql("record"), params).fetchone() is None:
                return False
        between()
        with conn.transaction():
            conn.execute(_sql("effect"), params)
        return True
    raise LabkitError(f"No consumer {consumer!r}.", f"use one of {', '.join(CONSUMERS)}.")


def consumer_process(ctx: Context, *, dsn: str, schema: str, role: str, consumer: str,
                     deliveries: list[tuple[str, int]], kill_at: int | None = None) -> int:
    """A consumer in its own OS process (run by a Worker): handles ``deliveries`` (event id,
    order id) in order, reporting each one it finished with (``acked``); at delivery
    ``kill_at`` it pauses between its two writes (tag ``kill-point``) for the parent to kill
    it there.  Its set of ids seen, if any, lives and dies with the process."""
    conn = relay_connection(dsn, schema, role)
    ctx.emit("connected", pid=conn.info.backend_pid)
    seen: set[str] = set()
    try:
        for n, (event, order_id) in enumerate(deliveries):
            between = (lambda: ctx.pause(KILL_POINT)) if n == kill_at else _nothing
            applied = handle(conn, consumer, event, order_id, seen=seen, between=between)
            ctx.emit("acked", event_id=event, applied=applied)
        return len(deliveries)
    finally:
        conn.close()


# -- the stream ------------------------------------------------------------------------------------


def check_params(*, events: int = EVENTS, duplicates: int = DUPLICATES, kill_after: int = KILL_AFTER) -> None:
    """Refuse a stream that cannot be built (a LabkitError that names the fix)."""
    number("events", events, low=1, high=MAX_EVENTS, whole=True, example=EVENTS)
    number("kill_after", kill_after, low=1, high=events, whole=True, example=min(KILL_AFTER, events))
    number("duplicates", duplicates, low=0, high=MAX_EVENTS, whole=True, example=0)
    if duplicates >= kill_after:
        raise LabkitError(f"duplicates={duplicates} with kill_after={kill_after}: only the "
                          f"{kill_after - 1} events handled before the kill can be redelivered.",
                          f"use duplicates < kill_after (duplicates={kill_after - 1} at most here).")


def stream(events: int = EVENTS, duplicates: int = DUPLICATES,
           kill_after: int = KILL_AFTER) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """The deliveries (event id, order id) to consumer process 1 -- which is killed while it
    handles its last one -- and to process 2."""
    check_params(events=events, duplicates=duplicates, kill_after=kill_after)
    ids = [(event_id(i), i) for i in range(1, events + 1)]
    first = ids[:kill_after - 1] + ids[:duplicates] + [ids[kill_after - 1]]
    second = [ids[kill_after - 1]] + ids[:duplicates] + ids[kill_after:]
    return first, second


# -- the trace ---------------------------------------------------------------------------------------


def _wait_gone(conn: psycopg.Connection, pid: int, timeout: float = 15.0) -> None:
    """Until the server has noticed that backend ``pid`` died (its transaction rolled back)."""
    wait_backends_gone(conn, [pid], timeout=timeout, what="the killed consumer's backend")


def _acks(worker: Worker) -> list[bool]:
    return [e["applied"] for e in worker.events if e["kind"] == "acked"]


@dataclass(frozen=True)
class AtKill(Result):
    """What the database held for the event in flight when a consumer's process 1 was killed.

    effect_committed: whether the event's effect (a label printed for its order) was committed
    recorded: whether its id was committed to the inbox
    """

    effect_committed: bool
    recorded: bool


@dataclass(frozen=True)
class ConsumerRun(Result):
    """One consumer of :data:`CONSUMERS` over the stream, killed and restarted, as the
    database shows it afterwards.

    handles: how it handles a message (the second text of :data:`CONSUMERS`)
    killed: where its process 1 was killed (the third text of :data:`CONSUMERS`)
    effects: {event id: labels printed for its order}, read from ``shop_order``
    twice: the event ids whose effect was applied more than once
    lost: the event ids whose effect was never applied
    at_kill: what the database held for the event in flight at the kill (an :class:`AtKill`)
    skipped_as_copy: deliveries the two processes took for a copy and did not apply
    """

    handles: str
    killed: str
    effects: dict[str, int]
    twice: list[str]
    lost: list[str]
    at_kill: AtKill
    skipped_as_copy: int


def _run_consumer(lab: Lab, obs: psycopg.Connection, consumer: str,
                  first: list[tuple[str, int]], second: list[tuple[str, int]]) -> tuple[ConsumerRun, datetime]:
    """One consumer over the stream: process 1 killed at its kill point on its last delivery,
    process 2 started after the server has seen process 1's backend go.  Returns what the
    database shows at the kill and after, and the server's clock between the two (the
    restart)."""
    short, handles, killed = CONSUMERS[consumer]
    for statement in query("inbox.sql", "fresh").statements:
        obs.execute(statement)
    killed_event, killed_order = first[-1]
    common = {"dsn": lab.db.dsn, "schema": lab.schema, "consumer": consumer}
    with Worker(consumer_process, name=f"{short} consumer 1", role=f"{short}-1",
                deliveries=first, kill_at=len(first) - 1, **common) as w1:
        pid = w1.wait_for("connected", timeout=WAIT_S)["pid"]
        w1.wait_for("paused", tag=KILL_POINT, timeout=WAIT_S)
        effect_committed, recorded = one_row(obs.execute(
            _sql("at_kill"), {"event_id": killed_event, "order_id": killed_order}), "inbox.sql's at_kill")
        w1.kill()
    _wait_gone(obs, pid)
    restart_at = one_row(obs.execute(_sql("server_clock")), "inbox.sql's server_clock")[0]
    with Worker(consumer_process, name=f"{short} consumer 2", role=f"{short}-2",
                deliveries=second, **common) as w2:
        w2.join(WAIT_S)
    effects: dict[str, int] = dict(obs.execute(_sql("effects")).fetchall())
    acks = _acks(w1) + _acks(w2)
    run = ConsumerRun(handles=handles, killed=killed, effects=effects,
                      twice=[e for e, n in effects.items() if n > 1],
                      lost=[e for e, n in effects.items() if n == 0],
                      at_kill=AtKill(effect_committed=bool(effect_committed), recorded=bool(recorded)),
                      skipped_as_copy=acks.count(False))
    return run, restart_at


@dataclass(frozen=True)
class InboxHygiene(Result):
    """The inbox consumer's table after its run: what it costs, and a prune too early.

    primary_key: the inbox's primary key, as "name UNIQUE method (column)": the deduplication
    rows: rows in the inbox: one per event applied
    copy_assigned_xid: whether recording a copy (which inserts nothing) took a transaction id
    pruned: rows a prune removed: those applied before the restart (a window shorter than the redelivery delay)
    late_copy: the pruned event a late copy was then delivered for (None when nothing was pruned)
    late_copy_applied_again: whether that late copy was applied a second time (None when nothing was pruned)
    kept_copy: an event still in the inbox a copy was then delivered for
    kept_copy_applied_again: whether that copy was applied a second time
    """

    primary_key: str
    rows: int
    copy_assigned_xid: bool
    pruned: int
    late_copy: str | None
    late_copy_applied_again: bool | None
    kept_copy: str
    kept_copy_applied_again: bool


def _inbox_hygiene(obs: psycopg.Connection, restart_at: datetime, first: list[tuple[str, int]],
                   second: list[tuple[str, int]]) -> InboxHygiene:
    """On the inbox consumer's end state: its primary key, its rows, what a copy writes, and
    a prune with a window shorter than a redelivery delay (the rows applied before the
    restart), followed by a late copy of a pruned event and one of a kept event."""
    name, method, unique, column = one_row(obs.execute(_sql("primary_key")), "inbox.sql's primary_key")
    rows = one_row(obs.execute("SELECT count(*) FROM inbox"), "the count of inbox rows")[0]
    kept_event, kept_order = second[-1]
    with obs.transaction(force_rollback=True):        # a copy: what does it write?
        obs.execute(_sql("record"), {"event_id": kept_event})
        copy_xid = one_row(obs.execute(_sql("own_xid")), "inbox.sql's own_xid")[0]
    pruned = obs.execute(_sql("prune"), {"cutoff": restart_at}).rowcount
    late_event, late_order = first[0]
    late_again = None
    if pruned:
        late_again = handle(obs, "inbox", late_event, late_order)
    kept_again = handle(obs, "inbox", kept_event, kept_order)
    return InboxHygiene(primary_key=f"{name} {'UNIQUE ' if unique else ''}{method} ({column})",
                        rows=rows,
                        copy_assigned_xid=copy_xid is not None,
                        pruned=pruned,
                        late_copy=late_event if pruned else None,
                        late_copy_applied_again=late_again,
                        kept_copy=kept_event,
                        kept_copy_applied_again=kept_again)


@dataclass(frozen=True)
class ConsumerTrace(Result):
    """The four consumers of :data:`CONSUMERS`, each killed and restarted over the same stream
    (:func:`consumer_trace`); the separate-transaction counts add up both orders.

    events: events in the stream (evt-0001 ...)
    duplicates: the first events redelivered before the restart and again after it
    kill_after: the number of the event in flight when process 1 was killed
    killed_on: that event's id
    deliveries_before_restart: messages delivered to process 1 (the one in flight at the kill included)
    deliveries_after_restart: messages delivered to process 2
    effects_twice_in_memory: events the in-memory consumer applied more than once
    effects_lost_in_memory: events it never applied
    effects_twice_inbox: events the inbox consumer (one transaction) applied more than once
    effects_lost_inbox: events it never applied
    effects_twice_separate_tx: events the two separate-transaction consumers applied more than once
    effects_lost_separate_tx: events they never applied
    consumers: {consumer name: its :class:`ConsumerRun`}, in the order of :data:`CONSUMERS`
    inbox: the inbox consumer's table afterwards, and a prune too early (an :class:`InboxHygiene`)
    """

    events: int
    duplicates: int
    kill_after: int
    killed_on: str
    deliveries_before_restart: int
    deliveries_after_restart: int
    effects_twice_in_memory: int
    effects_lost_in_memory: int
    effects_twice_inbox: int
    effects_lost_inbox: int
    effects_twice_separate_tx: int
    effects_lost_separate_tx: int
    consumers: dict[str, ConsumerRun]
    inbox: InboxHygiene


def consumer_trace(lab: Lab, *, events: int = EVENTS, duplicates: int = DUPLICATES,
                   kill_after: int = KILL_AFTER) -> ConsumerTrace:
    """The four consumers of :data:`CONSUMERS` over the same stream (:func:`stream`), each as
    a process killed with SIGKILL between its two writes while it handles event
    ``kill_after``, then a new process: a :class:`ConsumerTrace` -- the effects each
    consumer's processes left (a :class:`ConsumerRun` each), the copies applied twice and
    the events lost per consumer, and the inbox consumer's table afterwards, pruned too
    early (:class:`InboxHygiene`)."""
    first, second = stream(events, duplicates, kill_after)
    create_outbox(lab)
    place_orders(lab, events)
    obs = lab.connect(role="observer")
    runs: dict[str, ConsumerRun] = {}
    hygiene: InboxHygiene | None = None
    try:
        for consumer in CONSUMERS:
            runs[consumer], restart_at = _run_consumer(lab, obs, consumer, first, second)
            if consumer == "inbox":     # read before the next consumer makes the tables afresh
                hygiene = _inbox_hygiene(obs, restart_at, first, second)
    finally:
        obs.close()
    if hygiene is None:
        raise LabkitError("The inbox consumer did not run, so there is no inbox to read.",
                          f"keep \"inbox\" among the consumers ({', '.join(CONSUMERS)}).")
    separate = [runs["separate_tx_effect_first"], runs["separate_tx_record_first"]]
    return ConsumerTrace(
        events=events, duplicates=duplicates, kill_after=kill_after, killed_on=first[-1][0],
        deliveries_before_restart=len(first), deliveries_after_restart=len(second),
        effects_twice_in_memory=len(runs["in_memory"].twice),
        effects_lost_in_memory=len(runs["in_memory"].lost),
        effects_twice_inbox=len(runs["inbox"].twice), effects_lost_inbox=len(runs["inbox"].lost),
        effects_twice_separate_tx=sum(len(r.twice) for r in separate),
        effects_lost_separate_tx=sum(len(r.lost) for r in separate),
        consumers=runs, inbox=hygiene)


# -- the picture: which events each consumer applied once, twice or never -------------------------

# The consumers' names on the picture, shortest first said.
SHORT_NAMES = {"in_memory": "in memory", "inbox": "inbox, one transaction",
               "separate_tx_effect_first": "effect, then record",
               "separate_tx_record_first": "record, then effect"}


def _draw_effect_cells(ax, grid: list[list[int]], colours: list) -> None:
    """Each cell of the grid in its colour, with its count written on it."""
    from matplotlib.colors import BoundaryNorm, ListedColormap

    ax.imshow(grid, cmap=ListedColormap(colours), norm=BoundaryNorm([-0.5, 0.5, 1.5, 2.5, 3.5], 4),
              aspect="auto")
    for row, values in enumerate(grid):
        for col, v in enumerate(values):
            ax.text(col, row, str(v), ha="center", va="center",
                    color="black" if v == 1 else "white", fontweight="bold")


def _frame_kill_and_copies(ax, k: int, d: int, rows: int) -> None:
    """Frame the event in flight at the kill, and (dashed) the copies redelivered to every consumer."""
    from matplotlib.patches import Rectangle

    from ..core.plots import PALETTE

    ax.add_patch(Rectangle((k - 1.5, -0.5), 1, rows, fill=False, lw=3, ec=PALETTE[1],
                           clip_on=False))
    if d:   # the copies went to every consumer alike: frame their columns across every row
        ax.add_patch(Rectangle((-0.5, -0.5), d, rows, fill=False, lw=2.5, ls="--",
                               ec=PALETTE[7], clip_on=False))


def _event_tick_labels(n: int, k: int) -> list[str]:
    """The bottom axis's labels: the first and last event, every fifth, and the one killed."""
    return [str(i) if i in (1, n) or i % 5 == 0 or i == k else "" for i in range(1, n + 1)]


def _label_effect_axes(ax, n: int, k: int, consumers: list[str]) -> None:
    """Name the events and the consumers, and draw white lines between the cells."""
    ax.set_xticks(range(n), _event_tick_labels(n, k))
    ax.set_xlabel("event (evt-0001 ...): labels printed for its order")
    ax.set_yticks(range(len(consumers)), [SHORT_NAMES.get(c, c) for c in consumers])
    ax.set_xticks([x - 0.5 for x in range(n + 1)], minor=True)
    ax.set_yticks([y - 0.5 for y in range(len(consumers) + 1)], minor=True)
    ax.grid(which="minor", color="white", lw=2)
    ax.tick_params(which="minor", length=0)
    for side in ("left", "bottom"):
        ax.spines[side].set_visible(False)


def _name_frames_on_top(ax, k: int, d: int) -> None:
    """The top axis: what the kill frame and the copies' frame mark."""
    top = ax.secondary_xaxis("top")
    marks: list[tuple[float, str]] = [(k - 1, "killed here")]
    if d:
        marks.insert(0, ((d - 1) / 2, f"{'1' if d == 1 else f'1–{d}'}: copies to every consumer"))
    top.set_xticks([x for x, _ in marks], [label for _, label in marks])
    top.tick_params(length=0)
    top.spines["top"].set_visible(False)


def _tally_text(r: ConsumerRun) -> str:
    """One consumer's tally: how many events it applied twice and how many it lost."""
    said = [f"{len(r.twice)} twice"] * bool(r.twice) + [f"{len(r.lost)} lost"] * bool(r.lost)
    return ", ".join(said) or "all once"


def _tally_on_right(ax, t: ConsumerTrace, consumers: list[str]) -> None:
    """The right axis: each consumer's tally."""
    right = ax.secondary_yaxis("right")
    right.set_yticks(range(len(consumers)), [_tally_text(t.consumers[c]) for c in consumers])
    right.tick_params(length=0)
    right.spines["right"].set_visible(False)


def plot_effects(t: ConsumerTrace, ax=None):
    """The effects of :func:`consumer_trace`'s run, ``t``, as a grid: a row per consumer, a
    column per event, each cell the labels printed for that event (read back from
    ``shop_order``): once, twice or never, in three colours.  The event in flight at the kill
    is framed; so, dashed across every row, are the events redelivered on both sides of the
    restart (each consumer got the same copies); the top axis names both frames; the right
    axis tallies each row.  ``ax``: a matplotlib axes to draw on (None: a new
    figure).  Returns the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from ..core.plots import PALETTE, setup_matplotlib

    if not isinstance(t, ConsumerTrace):
        raise LabkitError("plot_effects draws the result of consumer_trace().",
                          "pass t = inbox.consumer_trace(lab).")
    setup_matplotlib()
    consumers = list(t.consumers)
    n, k, d = t.events, t.kill_after, t.duplicates
    events = [event_id(i) for i in range(1, n + 1)]
    grid = [[min(t.consumers[c].effects.get(e, 0), 3) for e in events] for c in consumers]
    if ax is None:
        fig, ax = plt.subplots(figsize=(12, 1.2 + 0.8 * len(consumers)))
    else:
        fig = ax.figure
    # never, once, twice, three times or more
    colours = [PALETTE[7], PALETTE[5], PALETTE[2], PALETTE[4]]
    _draw_effect_cells(ax, grid, colours)
    _frame_kill_and_copies(ax, k, d, len(consumers))
    _label_effect_axes(ax, n, k, consumers)
    _name_frames_on_top(ax, k, d)
    _tally_on_right(ax, t, consumers)
    fig.legend([Patch(color=colours[i]) for i in (1, 2, 0)], ["applied once", "twice", "never (lost)"],
               loc="outside lower center", ncol=3, frameon=False)
    return fig


# -- command line --------------------------------------------------------------------------------


def format_trace(t: ConsumerTrace) -> str:
    """The trace as a few lines of text (none wider than about 100 characters): the
    stream, one line per consumer, the inbox."""
    lines = [f"{t.events} events, {t.duplicates} of them redelivered before the restart "
             "and again after it;",
             f"process 1 of each consumer SIGKILLed while handling {t.killed_on}",
             f"deliveries: {t.deliveries_before_restart} to process 1, "
             f"{t.deliveries_after_restart} to process 2 ({t.killed_on} first: never acknowledged)",
             ""]
    width = max(len(v[1]) for v in CONSUMERS.values())
    lines.append(f"{'consumer':<{width}}  {'at the kill: effect / id':<30}  twice  lost")
    for r in t.consumers.values():
        k = r.at_kill
        at = (f"{'committed' if k.effect_committed else 'not committed'} / "
              f"{'recorded' if k.recorded else 'not recorded'}")
        lines.append(f"{r.handles:<{width}}  {at:<30}  {len(r.twice):>5}  {len(r.lost):>4}")
    h = t.inbox
    lines += ["",
              f"inbox: primary key {h.primary_key}; {h.rows} rows, one per event applied",
              f"a copy {'writes' if h.copy_assigned_xid else 'writes nothing (no transaction id)'}"]
    if h.pruned:
        lines += [f"pruned the {h.pruned} rows applied before the restart "
                  "(a window shorter than the redelivery delay):",
                  f"  a late copy of {h.late_copy} is applied "
                  f"{'again' if h.late_copy_applied_again else 'not again'}; "
                  f"a copy of {h.kept_copy} (kept) is "
                  f"{'applied again' if h.kept_copy_applied_again else 'a no-op'}"]
    lines.append("safe pruning window: longer than the longest delay after which a copy can still arrive")
    return "\n".join(lines)


def consumer_command(*, open_lab: Callable[[], Lab], events: int = EVENTS, duplicates: int = DUPLICATES,
                     kill_after: int = KILL_AFTER, json: bool = False) -> int:
    """``labkit trace consumer [--events 20] [--duplicates 5] [--kill-after 10] [--json]``:
    the four consumers killed and restarted over the same stream (:func:`consumer_trace`), as
    text or JSON."""
    check_params(events=events, duplicates=duplicates, kill_after=kill_after)
    with open_lab() as lab:
        t = consumer_trace(lab, events=events, duplicates=duplicates, kill_after=kill_after)
    print(t.to_json() if json else format_trace(t))
    return 0
