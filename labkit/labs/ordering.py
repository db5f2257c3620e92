"""Ordering with more than one relay: per-aggregate inversions, and two remedies.

The producer writes a stream of events over ``aggregates`` aggregates (orders), each with
its version: the aggregate's row is bumped in the same transaction that writes the event,
so one aggregate's events carry versions 1, 2, 3... in commit order (``ordering.sql``
"produce").  Relays in OS processes of their own move them to the broker, each tick being
the relay of notebook 06: claim a batch ``FOR UPDATE SKIP LOCKED``, publish it, mark it,
COMMIT.

With one relay the broker receives every aggregate's events in version order.  With two,
relay 1 can hold an older batch while relay 2 claims the next one (SKIP LOCKED skips relay
1's rows) and publishes it first: a later version of an order reaches the broker before an
earlier one.  :func:`ordering_trace` counts those *per-aggregate inversions* in the broker's
own order (the recording broker's ``seq``, RabbitMQ's queue order): pairs of messages of
one aggregate where the later version arrived first.

Whether two relays' publishes overlap is up to the scheduler, so a free run may show no
inversion.  ``schedule="scripted"`` (the default) makes it reproducible: each relay stops
after every claim, and the lab lets ONE of the relays that hold a claim go on (publish,
mark, COMMIT, claim again), chosen by a random generator seeded with ``seed``.  Nothing
else is scripted: what each claim returns is the server's answer.  ``schedule="free"``
lets the relays run at once, each waiting a seeded random 0..``hold_ms`` ms between claim
and publish (a publish's latency, varying), and measures what happens.

The remedies:

(a) one claimer per aggregate at a time (``per_aggregate=True``): the per-aggregate claim
    (``remedy="per-key"``, ``ordering.sql`` "claim_per_aggregate", the outbox's version of
    notebook 05's claim_per_key.sql: only an aggregate's oldest unpublished event is
    claimable), or partitioning (``remedy="partition"``: relay i claims only the aggregates
    with hash(aggregate) mod relays = i).  Either gives 0 inversions at the broker.
(b) a consumer that checks versions (:func:`consumer_check`): it keeps the last version
    applied per aggregate, drops an event whose version is not newer, and parks an event
    that comes after a gap until the gap fills.
"""

from __future__ import annotations

import bisect
import hashlib
import json as _json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from ..core.errors import LabkitError
from ..core.lab import Lab
from ..core.limits import number
from ..core.procs import Context, Worker
from ..core.queries import query
from ..core.results import Result
from . import broker as brokers
from ._checked import one_row
from .broker import Broker
from .relay import CLAIM, MARK, create_outbox, relay_connection

SQL = "ordering.sql"
MAX_RELAYS = 8
MAX_AGGREGATES = 1_000
MAX_EVENTS = 5_000
MAX_BATCH = 1_000
MAX_HOLD_MS = 1_000
MAX_SEED = 2**31 - 1
SCHEDULES = ("scripted", "free")
REMEDIES = ("per-key", "partition")
CLAIMS = ("skip-locked",) + REMEDIES
GUARANTEES = {
    "skip-locked": "none across relays: a relay holding an older batch can be overtaken by one "
                   "that claimed a later batch; one relay alone publishes in claim order",
    "per-key": "an aggregate's next event is claimable only once its previous one is published "
               "and marked: the broker gets each aggregate in version order (a crash before the "
               "COMMIT republishes the batch, each event before its aggregate's next); costs: "
               "one event per aggregate in flight, and an event that cannot be published holds "
               "its aggregate",
    "partition": "every event of an aggregate goes to one relay, which publishes in claim order: "
                 "in version order while the number of relays stays put; a relay that stops "
                 "stalls its share, and changing the number moves aggregates mid-flight",
}
IDLE_POLL_S = 0.005        # a free relay with nothing to claim asks the server again after this
SAMPLE = 10                # inversions and steps shown in a result
TIMEOUT_S = 60             # the longest the lab waits for one relay's move


def _q(name: str) -> str:
    return query(SQL, name).sql


# -- the producer ------------------------------------------------------------------------------


def aggregate_name(k: int, aggregates: int) -> str:
    """The name of aggregate ``k`` (1-based) of ``aggregates``: ``order-03`` of 10."""
    return f"order-{k:0{len(str(aggregates))}d}"


def partition_of(aggregate: str, relays: int) -> int:
    """The relay (0-based) the partitioned claim gives ``aggregate`` to: the first byte of
    md5(aggregate) modulo ``relays``, as ``ordering.sql`` "claim_partition" computes it."""
    return hashlib.md5(aggregate.encode()).digest()[0] % relays


def create_ordered_outbox(lab: Lab) -> None:
    """(Re)create the outbox of notebook 06 with a version per aggregate, and the
    aggregates' rows (``ordering.sql`` "tables")."""
    lab.execute("DROP TABLE IF EXISTS aggregate_state, applied_version, parked_event, applied_event")
    create_outbox(lab)
    for stmt in query(SQL, "tables").statements:
        lab.execute(stmt)


def produce(lab: Lab, events: int, aggregates: int, *, seed: int = 0) -> list[tuple[str, int]]:
    """The producer: ``events`` events, each of an aggregate drawn (seeded) from
    ``aggregates``, each written in its own transaction with the aggregate's next version.
    Returns (aggregate, version) in the order they were written."""
    rng = random.Random(seed)
    out = []
    with lab.connect(role="producer") as conn:
        for _ in range(events):
            agg = aggregate_name(rng.randrange(aggregates) + 1, aggregates)
            event_id, = one_row(conn.execute(_q("produce"), {"aggregate": agg}), f"{SQL}'s produce")
            out.append((agg, int(event_id.rsplit("-v", 1)[1])))
    return out


# -- counting inversions ---------------------------------------------------------------------


@dataclass(frozen=True)
class Inversion(Result):
    """A message that reached the broker after a later version of its aggregate.

    aggregate: the aggregate (``order-07``).
    published_first: the highest version of it the broker already had.
    then: the late message's version.
    position: the late message's place in the broker's order (0-based).
    """

    aggregate: str
    published_first: int
    then: int
    position: int


@dataclass(frozen=True)
class Inversions(Result):
    """Per-aggregate inversions in one order of messages (:func:`count_inversions`).

    per_aggregate_inversions: pairs of messages of one aggregate with the later version first.
    late_messages: messages a later version of their aggregate arrived before.
    aggregates_out_of_order: aggregates with at least one inversion.
    inversions: the first late messages (at most ``SAMPLE``), in order.
    """

    per_aggregate_inversions: int
    late_messages: int
    aggregates_out_of_order: int
    inversions: list[Inversion]


def count_inversions(order: Sequence[Sequence[Any]]) -> Inversions:
    """Per-aggregate inversions in ``order`` ((aggregate, version, ...) in the broker's
    order): pairs of messages of one aggregate with the later version first.  Also the
    late messages (a later version of their aggregate arrived before them), the
    aggregates with at least one inversion, and a sample of inversions (the late message
    and the highest version already there)."""
    seen: dict[str, list[int]] = {}
    pairs = late = 0
    sample: list[Inversion] = []
    out_of_order: set[str] = set()
    for position, (agg, version, *_) in enumerate(order):
        versions = seen.setdefault(agg, [])
        before = len(versions) - bisect.bisect_right(versions, version)
        if before:
            pairs += before
            late += 1
            out_of_order.add(agg)
            if len(sample) < SAMPLE:
                sample.append(Inversion(aggregate=agg, published_first=versions[-1],
                                        then=version, position=position))
        bisect.insort(versions, version)
    return Inversions(per_aggregate_inversions=pairs, late_messages=late,
                      aggregates_out_of_order=len(out_of_order), inversions=sample)


# -- the relay process ------------------------------------------------------------------------------


def ordering_relay(ctx: Context, *, dsn: str, schema: str, broker: dict, role: str, index: int,
                   relays: int, batch: int, claim: str = "skip-locked", scripted: bool = True,
                   hold_ms: float = 0.0, seed: int = 0) -> dict:
    """A relay in its own OS process (run by a Worker): notebook 06's tick (claim, publish,
    mark, COMMIT) with the claim ``claim`` ("skip-locked": relay.CLAIM; "per-key";
    "partition": relay ``index`` of ``relays``).  It stops when no unpublished event is left
    that it could ever claim; with nothing to claim while others hold the rest, it asks
    again (scripted: when the lab says so; free: after IDLE_POLL_S).  Scripted, it pauses
    after every claim ("claimed") and every empty claim ("idle"); free, it waits a seeded
    random 0..``hold_ms`` ms between claim and publish.  It pauses once at "ready" first."""
    conn = relay_connection(dsn, schema, role, idle_timeout_s=TIMEOUT_S)
    bk = brokers.from_spec(broker, role=f"broker:{role}")
    rng = random.Random(f"{seed}:{role}")
    params: dict[str, Any] = {"batch": batch, "relays": relays, "partition": None}
    sql = CLAIM
    if claim == "per-key":
        sql = _q("claim_per_aggregate")
    elif claim == "partition":
        sql, params["partition"] = _q("claim_partition"), index
    published = ticks = 0
    try:
        ctx.emit("connected", pid=conn.info.backend_pid)
        ctx.pause("ready")
        while True:
            conn.execute("BEGIN")
            rows = conn.execute(sql, params).fetchall()
            if not rows:
                conn.execute("COMMIT")
                left = one_row(conn.execute(_q("unpublished"), params), f"{SQL}'s unpublished")[0]
                if not left:
                    break
                ctx.emit("idle", left=left)
                if scripted:
                    ctx.pause("idle")
                else:
                    time.sleep(IDLE_POLL_S)
                continue
            ticks += 1
            ctx.emit("claimed", events=[[p["aggregate"], p["version"]] for _, _, p in rows])
            if scripted:
                ctx.pause("claimed")
            elif hold_ms:
                time.sleep(rng.uniform(0, hold_ms) / 1000)
            for _, ev, body in rows:
                bk.publish(ev, body)
            ctx.emit("published", n=len(rows))          # before the mark: the claim's end
            conn.execute(MARK, {"ids": [r[0] for r in rows]})
            conn.execute("COMMIT")
            published += len(rows)
            ctx.emit("committed", n=len(rows))
        return {"published": published, "ticks": ticks}
    finally:
        bk.close()
        conn.close()


# -- the trace ----------------------------------------------------------------------------------------


def check_params(*, relays: int = 2, aggregates: int = 10, events: int = 200, batch: int = 5,
                 per_aggregate: bool = False, remedy: str = "per-key", schedule: str = "scripted",
                 hold_ms: float = 5.0, seed: int = 0) -> None:
    """Every parameter of :func:`ordering_trace`, checked before anything is created."""
    number("relays", relays, low=1, high=MAX_RELAYS, whole=True, example=2)
    number("aggregates", aggregates, low=1, high=MAX_AGGREGATES, whole=True, example=10)
    number("events", events, low=1, high=MAX_EVENTS, whole=True, example=200)
    number("batch", batch, low=1, high=MAX_BATCH, whole=True, example=5)
    number("hold_ms", hold_ms, high=MAX_HOLD_MS, unit=" ms", example=5)
    number("seed", seed, high=MAX_SEED, whole=True, example=0)
    if not isinstance(per_aggregate, bool):
        raise LabkitError(f"per_aggregate={per_aggregate!r} is not True or False.",
                          "pass per_aggregate=True (one claimer per aggregate) or False.")
    if remedy not in REMEDIES:
        raise LabkitError(f"No remedy {remedy!r}.", f"use one of {', '.join(REMEDIES)}.")
    if schedule not in SCHEDULES:
        raise LabkitError(f"No schedule {schedule!r}.", f"use one of {', '.join(SCHEDULES)}.")


def _next_stop(w: Worker, start: int, timeout: float = TIMEOUT_S) -> tuple[str, int]:
    """The worker's next pause tag ("claimed", "idle") or "done", read from its events
    after index ``start``; and the index to read from next time."""
    deadline = time.monotonic() + timeout
    while True:
        for i in range(start, len(w.events)):
            e = w.events[i]
            if e["kind"] == "paused":
                return e["tag"], i + 1
            if e["kind"] == "done":
                return "done", i + 1
            if e["kind"] == "failed":
                raise LabkitError(f"Relay {w.name!r} failed: {e['error']}",
                                  "read the error; the relay's SQL or the broker refused.")
        start = len(w.events)
        if not w.alive:
            w.poll()
            if len(w.events) > start:
                continue
            raise LabkitError(f"Relay {w.name!r} ended without a word (exit code {w.exitcode}).",
                              "run the cell again; `labkit doctor` shows whether the server is up.")
        if time.monotonic() > deadline:
            raise LabkitError(f"Relay {w.name!r} made no move within {timeout:.0f} s.",
                              "check the server's load with `labkit doctor`, then run it again.")
        w.poll(0.02)


def _describe(w: Worker, tag: str, at: int) -> str:
    """One step of the scripted schedule, from the events the relay sent up to index ``at``."""
    evs = w.events[:at]
    if tag == "done":
        return f"{w.name}: nothing left to claim; stops"
    if tag == "idle":
        return f"{w.name}: claims nothing (the rest is held by others or must wait)"
    claimed = [e for e in evs if e["kind"] == "claimed"][-1]["events"]
    what = ", ".join(f"{a} v{v}" for a, v in claimed[:4]) + (" ..." if len(claimed) > 4 else "")
    return f"{w.name}: claims {len(claimed)} ({what})"


def _run_scripted(workers: list[Worker], rng: random.Random, events: int) -> list[str]:
    """Let the relays claim one after the other, then repeatedly let one relay holding a
    claim (drawn by ``rng``) publish, mark, COMMIT and claim again; after each such move,
    every idle relay tries to claim once more.  Returns the steps, in order."""
    at = {w.name: 0 for w in workers}
    state: dict[str, str] = {}
    steps: list[str] = []

    def move(w: Worker, released: bool) -> None:
        w.resume()
        state[w.name], at[w.name] = _next_stop(w, at[w.name])
        if released:
            n = [e for e in w.events[:at[w.name]] if e["kind"] == "committed"][-1]["n"]
            steps.append(f"{w.name}: publishes its {n}, marks them, COMMIT")
        steps.append(_describe(w, state[w.name], at[w.name]))

    for w in workers:                                   # each waits at "ready"
        _, at[w.name] = _next_stop(w, 0)
    for w in workers:                                   # the first claims, in turn
        move(w, False)
    budget = 4 * events + 10 * len(workers) + 10        # a move publishes, or makes room
    while any(s != "done" for s in state.values()):
        budget -= 1
        if budget < 0:
            raise LabkitError("The scripted relays stopped making progress.",
                              "report this run's parameters; it is a bug in the lab.")
        holders = [w for w in workers if state[w.name] == "claimed"]
        if holders:
            move(rng.choice(holders), True)
        for w in workers:
            if state[w.name] == "idle":
                move(w, False)
    return steps


def _max_claimed_at_once(workers: list[Worker]) -> int:
    """The most relays that held a claim on one aggregate at the same moment, from the
    relays' events: a claim lasts from its "claimed" to its "published" (sent before the
    mark, so a claim of the same aggregate that had to wait for this COMMIT starts later)."""
    spans = []
    for w in workers:
        held: list[str] = []
        for e in w.events:
            if e["kind"] == "claimed":
                held = sorted({a for a, _ in e["events"]})
                spans += [(e["t"], 1, a) for a in held]
            elif e["kind"] == "published":
                spans += [(e["t"], -1, a) for a in held]
                held = []
    live: dict[str, int] = {}
    best = 0
    for _, delta, agg in sorted(spans, key=lambda s: (s[0], s[1])):
        live[agg] = live.get(agg, 0) + delta
        best = max(best, live[agg])
    return best


@dataclass(frozen=True)
class OrderingTrace(Result):
    """Events of several aggregates drained by several relays, and the per-aggregate
    inversions in the broker's order (:func:`ordering_trace`; ``labkit trace relay --relays 2
    --json`` prints it without ``delivered``).

    relays: the relay processes.
    aggregates: the aggregates (orders) the events were drawn from.
    events: the events the producer wrote.
    batch: the most events one claim takes.
    claim: the claim the relays ran: ``skip-locked``, ``per-key`` or ``partition``.
    guarantee: what that claim guarantees about order, in words (:data:`GUARANTEES`).
    per_aggregate: whether one claimer per aggregate was asked for.
    schedule: ``scripted`` (the relay that goes on drawn with ``seed``) or ``free``.
    seed: the seed of the producer and of the schedule.
    hold_ms: the free relays' longest wait between claim and publish, in ms (None: scripted).
    broker: the broker's kind: ``recording`` or ``rabbitmq``.
    published: messages the broker holds.
    distinct_events: distinct event ids among them.
    unpublished_left: outbox events never published.
    per_aggregate_inversions: pairs of messages of one aggregate with the later version first.
    late_messages: messages a later version of their aggregate arrived before.
    aggregates_out_of_order: aggregates with at least one inversion.
    inversions: the first late messages (at most ``SAMPLE``), in the broker's order.
    max_claimed_at_once: the most relays that held events of one aggregate at once.
    published_by: per relay, the events it published (None: it did not end).
    ticks_by: per relay, its claims that returned events (None: it did not end).
    steps: the scripted schedule's first moves, in words ([] when free).
    seconds: how long the relays ran, in seconds.
    delivered: every message in the broker's order, as [aggregate, version, event_id].
    """

    relays: int
    aggregates: int
    events: int
    batch: int
    claim: str
    guarantee: str
    per_aggregate: bool
    schedule: str
    seed: int
    hold_ms: float | None
    broker: str
    published: int
    distinct_events: int
    unpublished_left: int
    per_aggregate_inversions: int
    late_messages: int
    aggregates_out_of_order: int
    inversions: list[Inversion]
    max_claimed_at_once: int
    published_by: list[int | None]
    ticks_by: list[int | None]
    steps: list[str]
    seconds: float
    delivered: list[list[Any]]


def ordering_trace(lab: Lab, broker: Broker | None = None, *, relays: int = 2, aggregates: int = 10,
                   events: int = 200, per_aggregate: bool = False, remedy: str = "per-key",
                   batch: int = 5, schedule: str = "scripted", hold_ms: float = 5.0,
                   seed: int = 0) -> OrderingTrace:
    """``events`` events over ``aggregates`` aggregates, drained by ``relays`` relay
    processes claiming ``batch`` at a time, with the plain SKIP LOCKED claim or, with
    ``per_aggregate``, one claimer per aggregate (``remedy`` "per-key" or "partition").
    Counts the per-aggregate inversions in the broker's order.  ``schedule``: "scripted"
    (the relay that goes on is drawn with ``seed``: reproducible) or "free" (the relays run
    at once, waiting 0..``hold_ms`` ms between claim and publish).

    Returns an :class:`OrderingTrace`: the parameters, what the broker got
    (``published``, ``distinct_events``, ``unpublished_left``), the inversions counted in
    its order (``per_aggregate_inversions``, ``late_messages``, ``inversions`` ...),
    ``max_claimed_at_once``, per relay ``published_by`` and ``ticks_by``, the scripted
    ``steps``, and ``delivered``: [aggregate, version, event_id] in the broker's order."""
    check_params(relays=relays, aggregates=aggregates, events=events, batch=batch,
                 per_aggregate=per_aggregate, remedy=remedy, schedule=schedule,
                 hold_ms=hold_ms, seed=seed)
    claim = remedy if per_aggregate else "skip-locked"
    scripted = schedule == "scripted"
    with brokers.used_by(lab, broker, reset=True) as bk:
        create_ordered_outbox(lab)
        produce(lab, events, aggregates, seed=seed)
        workers = [Worker(ordering_relay, name=f"relay-{i + 1}", dsn=lab.db.dsn, schema=lab.schema,
                          broker=bk.spec(), role=f"relay-{i + 1}", index=i, relays=relays,
                          batch=batch, claim=claim, scripted=scripted, hold_ms=hold_ms, seed=seed)
                   for i in range(relays)]
        steps: list[str] = []
        try:
            for w in workers:
                w.start()
            for w in workers:
                w.wait_for("paused", tag="ready", timeout=TIMEOUT_S)
            t0 = time.monotonic()
            if scripted:
                steps = _run_scripted(workers, random.Random(seed), events)
            else:
                for w in workers:
                    w.resume()
            done = [w.join(TIMEOUT_S) for w in workers]
            seconds = time.monotonic() - t0
        finally:
            for w in workers:
                w.kill()
        messages = bk.take_all()
        left = lab.execute(_q("unpublished"), {"partition": None, "relays": relays})[0][0]
    delivered = [[body["aggregate"], int(body["version"]), ev] for ev, body in messages]
    counted = count_inversions(delivered)
    return OrderingTrace(relays=relays, aggregates=aggregates, events=events, batch=batch,
                         claim=claim, guarantee=GUARANTEES[claim], per_aggregate=per_aggregate,
                         schedule=schedule, seed=seed,
                         hold_ms=None if scripted else hold_ms, broker=bk.kind,
                         published=len(delivered), distinct_events=len({d[2] for d in delivered}),
                         unpublished_left=left,
                         per_aggregate_inversions=counted.per_aggregate_inversions,
                         late_messages=counted.late_messages,
                         aggregates_out_of_order=counted.aggregates_out_of_order,
                         inversions=counted.inversions,
                         max_claimed_at_once=_max_claimed_at_once(workers),
                         published_by=[d["result"]["published"] if d else None for d in done],
                         ticks_by=[d["result"]["ticks"] if d else None for d in done],
                         steps=steps[:SAMPLE], seconds=round(seconds, 3), delivered=delivered)


# -- the consumer that checks versions ------------------------------------------------------------

CONSUMERS = {
    "apply_all": "applies every message as it comes: each effect once per message, in the "
                 "broker's order; an aggregate's state can go back to an older version",
    "drop_stale": "applies a message only if its version is newer than the last applied: "
                  "never goes back, ends on the latest version, but skips every event that "
                  "arrived late (fine for full-state snapshots, wrong for changes)",
    "in_order": "drops versions already applied, parks a version that comes after a gap "
                "and applies it once the gap fills: every version once, in version order; "
                "a version that never comes holds its aggregate back",
}


@dataclass(frozen=True)
class ConsumerOutcome(Result):
    """What one consumer did with the messages, as its tables show it afterwards.  Counts
    are events (messages).

    applied: times an effect was applied.
    applied_late: applications after a later version of the same aggregate.
    applied_twice: applications beyond the first of one event (aggregate, version).
    never_applied: events of the outbox never applied.
    dropped: messages dropped, their version not newer than the last one applied.
    parked: times an event was parked, waiting for a gap to fill.
    parked_max: the most events parked at once.
    still_parked: events still parked at the end.
    aggregates_behind: aggregates whose last applied version is not their latest.
    guarantee: what this consumer guarantees, in words (:data:`CONSUMERS`).
    """

    applied: int
    applied_late: int
    applied_twice: int
    never_applied: int
    dropped: int
    parked: int
    parked_max: int
    still_parked: int
    aggregates_behind: int
    guarantee: str


def _consume(conn: psycopg.Connection, messages: Sequence[Sequence[Any]], kind: str) -> ConsumerOutcome:
    """Run one consumer over ``messages``, one transaction per message (the version read
    and locked, the decision, the effect and the new version commit together)."""
    last_sql = query(SQL, "last_applied").statements
    apply_sql, park_sql, unpark_sql = _q("apply"), _q("park"), _q("unpark")
    dropped = parked = parked_now = parked_max = 0
    for agg, version, event_id in messages:
        p = {"aggregate": agg, "version": version, "event_id": event_id}
        with conn.transaction():
            conn.execute(last_sql[0], p)
            last = one_row(conn.execute(last_sql[1], p), f"{SQL}'s last_applied")[0]
            if kind == "apply_all" or (kind == "drop_stale" and version > last):
                conn.execute(apply_sql, p)
            elif version <= last:
                dropped += 1
            elif kind == "in_order" and version > last + 1:
                conn.execute(park_sql, p)
                parked += 1
                parked_now += 1
                parked_max = max(parked_max, parked_now)
            else:                                   # in_order, the next version: apply it,
                conn.execute(apply_sql, p)          # then whatever waited for it
                nxt = version + 1
                while row := conn.execute(unpark_sql, {"aggregate": agg, "version": nxt}).fetchone():
                    conn.execute(apply_sql, {"aggregate": agg, "version": nxt, "event_id": row[0]})
                    parked_now -= 1
                    nxt += 1
    applied, late, twice, never, still, behind = one_row(conn.execute(_q("consumer_outcome")),
                                                         f"{SQL}'s consumer_outcome")
    return ConsumerOutcome(applied=applied, applied_late=late, applied_twice=twice,
                           never_applied=never, dropped=dropped, parked=parked,
                           parked_max=parked_max, still_parked=still, aggregates_behind=behind,
                           guarantee=CONSUMERS[kind])


@dataclass(frozen=True)
class ConsumerCheck(Result):
    """Three consumers over the same messages, in the broker's order (:func:`consumer_check`).

    messages: the messages each consumer got.
    per_aggregate_inversions: pairs of those messages of one aggregate with the later version
        first.
    apply_all: what the consumer that applies every message did.
    drop_stale: what the consumer that drops a version not newer than the last applied did.
    in_order: what the consumer that drops duplicates and parks a version after a gap did.
    """

    messages: int
    per_aggregate_inversions: int
    apply_all: ConsumerOutcome
    drop_stale: ConsumerOutcome
    in_order: ConsumerOutcome


def consumer_check(lab: Lab, delivered: Sequence[Sequence[Any]] | None = None,
                   **trace: Any) -> ConsumerCheck:
    """Three consumers over the same messages, in the broker's order (``delivered`` of an
    :func:`ordering_trace` run on this lab; None: run one now with ``trace``'s parameters):
    apply_all, drop_stale and in_order (:data:`CONSUMERS` says what each guarantees).

    Returns a :class:`ConsumerCheck`: ``messages``, ``per_aggregate_inversions`` (of those
    messages), and per consumer (``apply_all``, ``drop_stale``, ``in_order``) a
    :class:`ConsumerOutcome`: applied, applied_late, applied_twice, never_applied, dropped,
    parked, parked_max, still_parked, aggregates_behind, guarantee."""
    if delivered is None:
        delivered = ordering_trace(lab, **trace).delivered
    elif trace:
        raise LabkitError(f"consumer_check got messages and trace parameters ({', '.join(trace)}).",
                          "pass either delivered=result.delivered or the trace's parameters.")
    messages = _messages(delivered)
    if lab.execute("SELECT to_regclass('outbox') IS NULL OR to_regclass('aggregate_state') IS NULL")[0][0]:
        raise LabkitError("This lab has no ordered outbox to check the consumers against.",
                          "run ordering_trace(lab) on this lab first and pass its delivered.")
    outcomes: dict[str, ConsumerOutcome] = {}
    with lab.connect(role="consumer") as conn:
        for kind in CONSUMERS:
            conn.execute("DROP TABLE IF EXISTS applied_version, parked_event, applied_event")
            for stmt in query(SQL, "consumer_tables").statements:
                conn.execute(stmt)
            outcomes[kind] = _consume(conn, messages, kind)
    return ConsumerCheck(messages=len(messages),
                         per_aggregate_inversions=count_inversions(messages).per_aggregate_inversions,
                         apply_all=outcomes["apply_all"], drop_stale=outcomes["drop_stale"],
                         in_order=outcomes["in_order"])


def _messages(delivered: Sequence[Sequence[Any]]) -> list[tuple[str, int, str]]:
    fix = "pass the 'delivered' list of an ordering_trace result: [aggregate, version, event_id] each."
    if isinstance(delivered, (str, bytes)) or not isinstance(delivered, Sequence):
        raise LabkitError(f"delivered={delivered!r:.60} is not a list of messages.", fix)
    out = []
    for m in delivered:
        if (isinstance(m, (str, bytes)) or not isinstance(m, Sequence) or len(m) != 3
                or not isinstance(m[0], str) or isinstance(m[1], bool) or not isinstance(m[1], int)
                or m[1] < 1 or not isinstance(m[2], str)):
            raise LabkitError(f"{m!r:.60} is not a message [aggregate, version >= 1, event_id].", fix)
        out.append((m[0], m[1], m[2]))
    return out


# -- command line --------------------------------------------------------------------------------


def ordering_command(*, open_lab: Callable[[], Lab], relays: int = 2, aggregates: int = 10,
                     per_aggregate: bool = False, json: bool, events: int = 200, batch: int = 5,
                     remedy: str = "per-key", schedule: str = "scripted", hold_ms: float = 5.0,
                     seed: int = 0, broker: str | None = None) -> int:
    """``labkit trace relay --relays 2 --aggregates 10 [--per-aggregate] [--json]``:
    :func:`ordering_trace` and :func:`consumer_check` on a lab of the run's own (dropped at
    the end), printed as a short summary or as JSON (the messages themselves left out)."""
    check_params(relays=relays, aggregates=aggregates, events=events, batch=batch,
                 per_aggregate=per_aggregate, remedy=remedy, schedule=schedule,
                 hold_ms=hold_ms, seed=seed)
    if broker is not None and broker not in ("recording", "rabbitmq"):
        raise LabkitError(f"No broker kind {broker!r}.", "use 'recording' or 'rabbitmq'.")
    with open_lab() as lab, brokers.for_lab(lab, broker) as bk:
        try:
            r = ordering_trace(lab, bk, relays=relays, aggregates=aggregates, events=events,
                               per_aggregate=per_aggregate, remedy=remedy, batch=batch,
                               schedule=schedule, hold_ms=hold_ms, seed=seed)
            c = consumer_check(lab, r.delivered)
        finally:
            bk.discard()
    consumers: dict[str, ConsumerOutcome] = {k: getattr(c, k) for k in CONSUMERS}
    if json:
        out = {k: v for k, v in r.as_dict().items() if k != "delivered"}
        out["consumers"] = {k: v.as_dict() for k, v in consumers.items()}
        print(_json.dumps(out, indent=2))
        return 0
    how = {"skip-locked": "FOR UPDATE SKIP LOCKED", "per-key": "the per-aggregate claim",
           "partition": "partitioned by hash(aggregate)"}[r.claim]
    sched = (f"scripted (seed {seed})" if schedule == "scripted"
             else f"free, 0-{hold_ms:g} ms between claim and publish")
    print(f"{relays} relay(s), {how}, batch {batch}; {events} events over {aggregates} aggregates; "
          f"{sched}; {r.broker} broker")
    print(f"published {r.published} ({r.distinct_events} distinct), by relay: "
          f"{', '.join(str(n) for n in r.published_by)}")
    print(f"per-aggregate inversions: {r.per_aggregate_inversions} "
          f"({r.late_messages} late messages, {r.aggregates_out_of_order} aggregates out of order)")
    for s in r.inversions[:3]:
        print(f"  {s.aggregate}: v{s.published_first} reached the broker before v{s.then}")
    for kind, v in consumers.items():
        print(f"consumer {kind}: applied {v.applied}, {v.applied_late} late, "
              f"{v.never_applied} never, parked at most {v.parked_max}, "
              f"{v.aggregates_behind} aggregates behind")
    return 0
