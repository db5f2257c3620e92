"""The outbox relay: a transaction-scoped claim, a real crash, a real broker.

The producer writes a business row and its outbox row in one transaction.  The relay
moves outbox rows to a broker, one *tick* at a time::

    BEGIN;
    SELECT ... FROM outbox WHERE published_at IS NULL ... FOR UPDATE SKIP LOCKED;  -- claim
    publish each row to the broker;                                               -- I/O
    UPDATE outbox SET published_at = now() WHERE id = ANY(claimed);               -- mark
    COMMIT;

The crash labs run each relay in its own OS process (:class:`labkit.core.procs.Worker`,
connected by :func:`relay_connection`), stop it at a scripted point (``ctx.pause``) and
kill it with SIGKILL there.  Every number a trace (``*_trace``) reports is read back from
the database (``outbox``, ``inbox``, ``shop_order``, ``pg_locks``, tuple ``xmax``: the
queries are in ``labkit/sql/outbox_lab.sql``) or from the broker — never counted by the
script.

``labkit trace relay|dual-write|broker-down`` prints the traces (:func:`trace_command`).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

import psycopg

from ..core.db import WORKER_GUARDS, open_connection, wait_backends_gone
from ..core.errors import LabkitError
from ..core.lab import Lab, read_sql
from ..core.limits import number
from ..core.plots import PALETTE, legend_below
from ..core.procs import Context, Worker
from ..core.queries import query, statements
from ..core.results import Result, not_json
from ..core.trace import Trace
from . import broker as brokers
from ._checked import one_row, started_pid
from .broker import Broker, BrokerDown

if TYPE_CHECKING:
    import pandas as pd

ITEMS = ["kettle", "lamp", "mug", "teapot", "rug"]
MAX_BATCH = 10_000         # rows in one relay tick (a trace places that many orders first)
MAX_ORDERS = 100_000
MAX_BACKOFF_S = 60
OUTBOX_TABLES = ["inbox", "outbox", "shop_order"]


CLAIM, = statements(read_sql("outbox_claim.sql"))
MARK, = statements(read_sql("outbox_mark.sql"))
PRODUCE = statements(read_sql("outbox_produce.sql"))
CONSUME, = statements(read_sql("outbox_consume.sql"))
METRICS, = statements(read_sql("outbox_metrics.sql"))


def _lab_sql(name: str) -> str:
    """One of the queries the relay's labs look at the systems with (``outbox_lab.sql``)."""
    return query("outbox_lab.sql", name).sql


def claim_text(batch: int) -> str:
    """The relay's claim with its batch size written in, for scripted sessions."""
    if int(batch) < 1:
        raise LabkitError(f"A relay batch of {batch} rows claims nothing.", "use batch=1 or more.")
    return CLAIM.replace("%(batch)s", str(int(batch)))


def event_id(order_id: int) -> str:
    """Stable event ids, so traces and lost-event lists reproduce exactly."""
    return f"evt-{order_id:04d}"


# -- set-up, producer, consumer ------------------------------------------------------------


def create_outbox(lab: Lab) -> None:
    """(Re)create shop_order, outbox and inbox in the lab's schema."""
    lab.execute("DROP TABLE IF EXISTS " + ", ".join(OUTBOX_TABLES))
    lab.run_file("outbox_tables.sql")


def place_orders(lab: Lab, n: int, *, start: int = 1, conn: psycopg.Connection | None = None,
                 together: bool = False) -> list[str]:
    """The producer: ``n`` orders, each with its outbox row in one transaction; with
    ``together``, all ``n`` in a single transaction (a bulk import: they land at once, with one
    commit).  Returns the event ids written."""
    if n < 0:
        raise LabkitError(f"Cannot place {n} orders.", "pass n=0 or more.")
    own = conn is None
    conn = conn or lab.connect(role="producer")
    try:
        ids = []
        whole, each = (conn.transaction, nullcontext) if together else (nullcontext, conn.transaction)
        with whole():
            for order_id in range(start, start + n):
                eid = event_id(order_id)
                params = {"order_id": order_id, "item": ITEMS[order_id % len(ITEMS)], "event_id": eid}
                with each():
                    for stmt in PRODUCE:
                        conn.execute(stmt, params)
                ids.append(eid)
        return ids
    finally:
        if own:
            conn.close()


def consume(lab: Lab, broker: Broker) -> list[str]:
    """The consumer: take every message the broker holds and apply each event once
    (inbox row + effect in one transaction).  Returns the event ids of the messages
    the broker delivered, duplicates included, in delivery order."""
    messages = broker.take_all()
    with lab.connect(role="consumer") as conn:
        for ev, body in messages:
            with conn.transaction():
                conn.execute(CONSUME, {"event_id": ev, "order_id": body["order_id"]})
    return [ev for ev, _ in messages]


# -- the relay -------------------------------------------------------------------------------


def _no_hook(kind: str, **data) -> None:
    pass


class PublishTimeout(RuntimeError):
    """The tick ran past its publish timeout: the relay gives the batch up (rolls back)."""


class Relay:
    """One relay over one connection.  ``order="outbox"`` publishes before COMMIT (the
    correct relay); ``order="commit-first"`` marks and commits first, then publishes
    (the dual-write bug).  ``hook(kind, **data)`` is told every move: claimed,
    published (n), committed, idle, publish_failed, publish_timeout, rollback_failed.

    ``publish_timeout_s``: the longest one tick may spend between its claim and its mark;
    checked before each publish and before the mark.  Past it, the relay gives the
    batch up (ROLLBACK) instead of publishing more of it.

    ``commit_every``: mark and COMMIT after every that many publishes, without claiming
    again (a proposal notebook 06 shows to be wrong: the first COMMIT releases the
    locks on the rest of the batch, which another relay then claims too)."""

    ORDERS = ("outbox", "commit-first")

    def __init__(self, conn: psycopg.Connection, broker: Broker, *, batch: int = 100,
                 order: str = "outbox", hook: Callable[..., None] = _no_hook,
                 publish_timeout_s: float | None = None, commit_every: int | None = None) -> None:
        if batch < 1:
            raise LabkitError(f"A relay batch of {batch} rows claims nothing.", "use batch=1 or more.")
        if order not in self.ORDERS:
            raise LabkitError(f"No relay order {order!r}.", f"use one of {self.ORDERS}.")
        if publish_timeout_s is not None:
            number("publish_timeout_s", publish_timeout_s, above=True, high=3600, unit=" s", example=1)
        if commit_every is not None:
            number("commit_every", commit_every, low=1, high=MAX_BATCH, whole=True, example=10)
            if order != "outbox":
                raise LabkitError("commit_every only applies to the outbox order.",
                                  "drop commit_every, or use order='outbox'.")
        self.conn, self.broker, self.batch, self.order, self.hook = conn, broker, batch, order, hook
        self.publish_timeout_s, self.commit_every = publish_timeout_s, commit_every

    def tick(self) -> int:
        """One claim-publish-mark-commit round; returns how many rows it claimed."""
        c = self.conn
        started = time.monotonic()
        c.execute("BEGIN")
        try:
            rows = c.execute(CLAIM, {"batch": self.batch}).fetchall()
            ids = [r[0] for r in rows]
            if not rows:
                c.execute("COMMIT")
                self.hook("idle")
                return 0
            self.hook("claimed", ids=ids, events=[r[1] for r in rows])
            if self.order == "commit-first":
                c.execute(MARK, {"ids": ids})
                c.execute("COMMIT")
                self.hook("committed", n=len(ids))
                self._publish(rows, 1, None)
                return len(ids)
            step = self.commit_every or len(rows)
            for k in range(0, len(rows), step):
                chunk = rows[k:k + step]
                self._publish(chunk, k + 1, started)
                self._check_deadline(started)
                c.execute(MARK, {"ids": [r[0] for r in chunk]})
                c.execute("COMMIT")
                self.hook("committed", n=len(chunk))
                if k + step < len(rows):
                    c.execute("BEGIN")
            return len(ids)
        except BaseException:
            self._rollback()
            raise

    def _rollback(self) -> None:
        """Roll the open transaction back; a connection the server has ended says why."""
        if self.conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            return
        try:
            self.conn.execute("ROLLBACK")
        except psycopg.Error as exc:
            self.hook("rollback_failed", sqlstate=exc.sqlstate, error=_first_line(exc))

    def _check_deadline(self, started: float | None) -> None:
        if started is None or self.publish_timeout_s is None:
            return
        spent = time.monotonic() - started
        if spent > self.publish_timeout_s:
            self.hook("publish_timeout", spent_s=spent)
            raise PublishTimeout(f"the tick ran {spent:.1f} s, past its publish timeout of "
                                 f"{self.publish_timeout_s:g} s")

    def _publish(self, rows, first: int, started: float | None) -> None:
        for n, (_, ev, body) in enumerate(rows, first):
            self._check_deadline(started)
            self.broker.publish(ev, body)
            self.hook("published", n=n, event_id=ev)

    def run(self, *, backoff_s: float = 1.0, max_attempts: int = 8,
            sleep: Callable[[float], None] = time.sleep) -> int:
        """Tick until nothing is left to claim; on BrokerDown roll back (``tick`` does)
        and retry after ``backoff_s``, doubling each time."""
        if backoff_s < 0 or max_attempts < 1:
            raise LabkitError(f"backoff_s={backoff_s}, max_attempts={max_attempts} cannot retry.",
                              "use backoff_s >= 0 and max_attempts >= 1.")
        total, failures = 0, 0
        while True:
            try:
                n = self.tick()
            except BrokerDown as exc:
                failures += 1
                if failures >= max_attempts:
                    raise LabkitError(f"The broker refused {failures} attempts in a row ({exc}).",
                                      "bring the broker back, then run the relay again.") from None
                delay = backoff_s * 2 ** (failures - 1)
                self.hook("publish_failed", attempt=failures, delay_s=delay, error=str(exc))
                sleep(delay)
                continue
            failures = 0
            total += n
            if n == 0:
                return total


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def relay_connection(dsn: str, schema: str, role: str, *,
                     idle_timeout_s: float | None = None) -> psycopg.Connection:
    """The connection of a relay in a process of its own (it has no Lab object): autocommit
    (the relay opens its transactions itself), named ``labkit:<schema>:<role>``, with the
    worker guards, except that ``idle_in_transaction_session_timeout`` is ``idle_timeout_s``
    (None: the server's setting, off by default) -- what ends a frozen relay's session is
    the frozen-relay lesson's subject."""
    idle = None if idle_timeout_s is None else f"{int(round(idle_timeout_s * 1000))}ms"
    return open_connection(dsn, schema=schema, role=role,
                           guards=dataclasses.replace(WORKER_GUARDS, idle_in_transaction=idle))


def relay_process(ctx: Context, *, dsn: str, schema: str, broker: dict, role: str = "relay-1",
                  batch: int = 100, order: str = "outbox", pause_at: Iterable[str] = (),
                  backoff_s: float = 1.0, idle_timeout_s: float | None = None,
                  publish_timeout_s: float | None = None, commit_every: int | None = None) -> int:
    """A relay in its own OS process (run by a Worker), scripted: it runs until nothing is
    left to claim, and pauses at the tags in ``pause_at`` ("claimed", "committed",
    "published:N", "publish_failed"; "TAG#K" pauses at the K-th time only) so the parent can
    look at the database, or kill it there.  While scripted (``pause_at`` given) the backoff
    is the parent's to decide: the relay reports the delay and pauses.  ``idle_timeout_s``
    sets idle_in_transaction_session_timeout on the relay's session."""
    pause_at = set(pause_at)
    conn = relay_connection(dsn, schema, role, idle_timeout_s=idle_timeout_s)
    bk = brokers.from_spec(broker, role=f"broker:{role}")
    ctx.emit("connected", pid=conn.info.backend_pid)
    if "ready" in pause_at:                   # a common start for relays that then run free
        ctx.pause("ready")

    seen: dict[str, int] = {}

    def hook(kind, **data):
        ctx.emit(kind, **data)
        tag = f"{kind}:{data['n']}" if kind == "published" else kind
        seen[tag] = seen.get(tag, 0) + 1
        if tag in pause_at or f"{tag}#{seen[tag]}" in pause_at:
            ctx.pause(tag)

    try:
        relay = Relay(conn, bk, batch=batch, order=order, hook=hook,
                      publish_timeout_s=publish_timeout_s, commit_every=commit_every)
        return relay.run(backoff_s=backoff_s, sleep=(lambda s: None) if pause_at else time.sleep)
    except (psycopg.Error, PublishTimeout) as exc:
        ctx.emit("stopped", sqlstate=getattr(exc, "sqlstate", None), error=_first_line(exc))
        raise
    finally:
        bk.close()
        conn.close()


def timed_relay_process(ctx: Context, *, dsn: str, schema: str, broker: dict, role: str = "relay-1",
                        batch: int = 100, interval_s: float = 0.1, run_for_s: float = 3.0) -> int:
    """A relay in its own OS process (run by a Worker) that ticks every ``interval_s`` for
    ``run_for_s`` seconds, whether or not it finds rows (the lag lab); returns the rows it
    claimed."""
    conn = relay_connection(dsn, schema, role)
    bk = brokers.from_spec(broker, role=f"broker:{role}")
    try:
        relay = Relay(conn, bk, batch=batch)
        ctx.emit("ready", pid=conn.info.backend_pid)
        deadline = time.monotonic() + run_for_s
        total = 0
        while time.monotonic() < deadline:
            total += relay.tick()
            time.sleep(interval_s)
        return total
    finally:
        bk.close()
        conn.close()


# -- looking at the systems ---------------------------------------------------------------------

class Observer:
    """Reads the state the traces show: outbox rows, row locks, pg_locks, the broker
    (with the queries of ``outbox_lab.sql``)."""

    def __init__(self, lab: Lab, broker: Broker) -> None:
        self.lab, self.broker = lab, broker
        self.conn = lab.connect(role="observer")
        self.relay_pids: list[int] = []   # backends the relays reported ("connected")

    def watch(self, worker: Worker) -> int:
        """Follow the relay in ``worker``; returns its backend pid."""
        pid = worker.wait_for("connected", timeout=60)["pid"]
        self.relay_pids.append(pid)
        return pid

    def close(self) -> None:
        self.conn.close()

    def relay_backends(self) -> list[tuple[int, str | None]]:
        """(pid, transaction id or None) of each relay backend still on the server."""
        return self.conn.execute(_lab_sql("relay_backends"), {"pids": self.relay_pids}).fetchall()

    def backend_state(self, pid: int) -> tuple[str, str | None, float] | None:
        """(state, transaction id, seconds in that state) of backend ``pid``; None once it is gone."""
        return self.conn.execute(_lab_sql("backend_state"), {"pid": pid}).fetchone()

    def relay_locks(self, pids: list[int] | None = None) -> list[str]:
        """Locks the relay backends hold, from pg_locks (the outbox table and own xid)."""
        if pids is None:
            pids = [p for p, _ in self.relay_backends()]
        return [r[0] for r in self.conn.execute(_lab_sql("relay_locks"), {"pids": pids}).fetchall()]

    def relay_locks_text(self) -> str:
        return " + ".join(self.relay_locks()) or "none"

    def pg_locks_of(self, pid: int) -> int:
        return one_row(self.conn.execute("SELECT count(*) FROM pg_locks WHERE pid = %s", (pid,)),
                       "the count of pg_locks")[0]

    def locked_rows(self) -> int:
        """Outbox rows locked by a live relay transaction (tuple xmax = its xid)."""
        xids = [x for _, x in self.relay_backends() if x]
        if not xids:
            return 0
        return one_row(self.conn.execute(_lab_sql("locked_rows"), {"xids": xids}),
                       "relay_lab.sql's locked_rows")[0]

    def snapshot(self) -> dict:
        unpublished, marked = one_row(self.conn.execute(_lab_sql("outbox_rows")),
                                      "relay_lab.sql's outbox_rows")
        return {"unpublished": unpublished, "marked": marked, "locked_rows": self.locked_rows(),
                "relay_locks": self.relay_locks_text(), "broker": self.broker.depth()}

    def wait_gone(self, pid: int, timeout: float = 15) -> None:
        """Until the server has noticed that backend ``pid`` died."""
        wait_backends_gone(self.conn, [pid], timeout=timeout, what="the killed relay's backend")

    def outcome(self, delivered: list[str], broker_messages: int) -> dict:
        """The end state, read from the database; ``delivered`` are the event ids the
        broker handed to the consumer, ``broker_messages`` the broker's depth before."""
        c = self.conn
        outbox_rows = one_row(c.execute("SELECT count(*) FROM outbox"), "the count of outbox rows")[0]
        lost = [r[0] for r in c.execute(_lab_sql("lost_events")).fetchall()]
        applied, twice = one_row(c.execute(_lab_sql("labels_printed")), "relay_lab.sql's labels_printed")
        distinct = len(set(delivered))
        return {"outbox_rows": outbox_rows, "broker_messages": broker_messages,
                "distinct_events": distinct, "duplicates": broker_messages - distinct,
                "lost_events": lost, "consumer_applied": int(applied),
                "orders_applied_twice": twice}


# -- the three traces -------------------------------------------------------------------------------


def _check(batch: int, point: int, name: str) -> None:
    if isinstance(batch, int) and batch < 1:
        raise LabkitError(f"batch={batch}: the relay would claim nothing.", "use --batch 1 or more.")
    number("batch", batch, low=1, high=MAX_BATCH, whole=True, example=100)
    if isinstance(point, bool) or not isinstance(point, int) or not 0 <= point < batch:
        raise LabkitError(f"{name}={point!r} is outside the batch of {batch}.",
                          f"use 0 <= {name} < batch, so the crash falls inside the batch.")


def _fresh_outbox(lab: Lab, broker: Broker, orders: int) -> None:
    """An empty broker, and a new outbox with ``orders`` orders placed."""
    broker.reset()
    create_outbox(lab)
    place_orders(lab, orders)


@contextmanager
def _outbox_run(lab: Lab, broker: Broker | None, orders: int) -> Iterator[tuple[Broker, Observer]]:
    """The start every relay lab shares: the broker (the lab's own when ``broker`` is None,
    discarded at the end), a new outbox with ``orders`` orders placed, and an Observer."""
    with brokers.used_by(lab, broker) as bk:
        _fresh_outbox(lab, bk, orders)
        obs = Observer(lab, bk)
        try:
            yield bk, obs
        finally:
            obs.close()


@contextmanager
def _traced(lab: Lab, broker: Broker | None, orders: int,
            title: str) -> Iterator[tuple[Trace, Broker, Observer]]:
    """:func:`_outbox_run`, with the Trace ``title`` whose first step is the producer's."""
    with _outbox_run(lab, broker, orders) as (bk, obs):
        tr = Trace(title)
        tr.add("producer", f"place {orders} orders", "each order and its outbox row commit together",
               obs.snapshot())
        yield tr, bk, obs


def _relay(lab: Lab, broker: Broker, role: str, **kw) -> Worker:
    return Worker(relay_process, name=role.replace("-", " "), dsn=lab.db.dsn, schema=lab.schema,
                  broker=broker.spec(), role=role, **kw)


def _claimed(relay: Worker) -> list[int]:
    """The ids ``relay`` claimed, once it has paused right after its claim."""
    ids = relay.wait_for("claimed", timeout=60)["ids"]
    relay.wait_for("paused", tag="claimed", timeout=60)
    return ids


def _resume_to(relay: Worker, tag: str) -> None:
    """Let ``relay`` run on to its pause at ``tag``."""
    relay.resume()
    relay.wait_for("paused", tag=tag, timeout=60)


def _sigkill(obs: Observer, relay: Worker, pid: int) -> tuple[dict, dict]:
    """SIGKILL ``relay`` (its backend: ``pid``) and wait until the server has noticed.
    Returns the state then, and what the crash left: rows marked, locks still held."""
    relay.kill()
    obs.wait_gone(pid)
    after = obs.snapshot()
    return after, {"marked_published_after_crash": after["marked"],
                   "locks_held_after_crash": obs.pg_locks_of(pid) + after["locked_rows"]}


def _deliver(lab: Lab, broker: Broker, obs: Observer) -> tuple[list[str], dict]:
    """The consumer takes every message the broker holds: the event ids it got, and the
    end state (:meth:`Observer.outcome`)."""
    depth = broker.depth()
    delivered = consume(lab, broker)
    return delivered, obs.outcome(delivered, depth)


def _finish(tr: Trace, lab: Lab, broker: Broker, obs: Observer, extra: dict) -> Trace:
    """The trace's last step (the consumer) and its summary: the outbox's rows, ``extra``,
    then what the broker and the consumer show."""
    delivered, out = _deliver(lab, broker, obs)
    tr.add("consumer", f"take {len(delivered)} messages; apply each event once",
           "the inbox's primary key on event_id turns every duplicate into a no-op",
           {"delivered": len(delivered), "distinct": out["distinct_events"],
            "applied": out["consumer_applied"]})
    summary = {"outbox_rows": out["outbox_rows"]}
    summary.update(extra)
    summary.update({k: out[k] for k in ("broker_messages", "distinct_events", "duplicates",
                                         "lost_events", "consumer_applied", "orders_applied_twice")})
    tr.summary = summary
    return tr


def crash_trace(lab: Lab, broker: Broker | None = None, *, batch: int = 100,
                crash_after: int = 40) -> Trace:
    """Relay 1 claims ``batch`` rows, publishes ``crash_after`` of them, is SIGKILLed;
    relay 2 claims the same rows and publishes them all; the consumer deduplicates."""
    _check(batch, crash_after, "crash_after")
    title = f"Relay crash mid-batch: {batch} claimed, killed after {crash_after} publishes"
    with _traced(lab, broker, batch, title) as (tr, broker, obs):
        crash_tag = f"published:{crash_after}" if crash_after else "claimed"
        with _relay(lab, broker, "relay-1", batch=batch, pause_at=["claimed", crash_tag]) as r1:
            pid = obs.watch(r1)
            first = _claimed(r1)
            tr.add("relay 1", f"BEGIN; claim {len(first)} rows FOR UPDATE SKIP LOCKED",
                   "the row locks are the claim; they last until this transaction ends",
                   obs.snapshot())
            if crash_after:
                _resume_to(r1, crash_tag)
                tr.add("relay 1", f"publish {crash_after} of {len(first)}",
                       "the broker holds them now; no outbox row is marked yet", obs.snapshot())
            after, crashed = _sigkill(obs, r1, pid)
        tr.add("relay 1", "SIGKILL (the process dies mid-batch)",
               "the server sees the connection drop and rolls back: nothing marked, locks gone, "
               "the broker keeps what it got", after, kind="crash")
        with _relay(lab, broker, "relay-2", batch=batch, pause_at=["claimed#1"]) as r2:
            obs.watch(r2)
            again = _claimed(r2)
            same = "the same rows" if again == first else "other rows"
            tr.add("relay 2", f"BEGIN; claim {len(again)} rows FOR UPDATE SKIP LOCKED",
                   f"{same}: nothing marked them, and nothing locks them any more", obs.snapshot())
            r2.resume()
            r2.join(60)
        tr.add("relay 2", f"publish all {len(again)}, mark them, COMMIT",
               "the first publishes are sent a second time: at-least-once, by design",
               obs.snapshot())
        return _finish(tr, lab, broker, obs, {"reclaimed_same_rows": again == first, **crashed})


def dual_write_trace(lab: Lab, broker: Broker | None = None, *, batch: int = 100,
                     crash_after: int = 40) -> Trace:
    """The same relay written commit-first, publish-after, killed after ``crash_after``
    publishes: the rest are marked published and never reach the broker."""
    _check(batch, crash_after, "crash_after")
    title = f"The dual-write bug: commit first, publish after, killed after {crash_after} publishes"
    with _traced(lab, broker, batch, title) as (tr, broker, obs):
        crash_tag = f"published:{crash_after}" if crash_after else "committed"
        with _relay(lab, broker, "relay-1", batch=batch, order="commit-first",
                    pause_at=["claimed", "committed", crash_tag]) as r1:
            pid = obs.watch(r1)
            first = _claimed(r1)
            tr.add("relay 1", f"BEGIN; claim {len(first)} rows FOR UPDATE SKIP LOCKED",
                   "the same claim as the correct relay", obs.snapshot())
            _resume_to(r1, "committed")
            tr.add("relay 1", f"mark {len(first)} published, COMMIT — before publishing",
                   "the database now says every event was sent; none was", obs.snapshot())
            if crash_after:
                _resume_to(r1, crash_tag)
                tr.add("relay 1", f"publish {crash_after} of {len(first)}",
                       "publishing runs outside any transaction", obs.snapshot())
            after, crashed = _sigkill(obs, r1, pid)
        tr.add("relay 1", "SIGKILL (the process dies mid-batch)",
               "nothing to roll back: the marks were committed before the publishes",
               after, kind="crash")
        with _relay(lab, broker, "relay-2", batch=batch) as r2:
            obs.watch(r2)
            r2.wait_for("idle", timeout=60)
            r2.join(60)
        tr.add("relay 2", "BEGIN; claim … FOR UPDATE SKIP LOCKED → no rows",
               "every row is marked published, so no relay will ever send the rest",
               obs.snapshot())
        return _finish(tr, lab, broker, obs, crashed)


def broker_down_trace(lab: Lab, broker: Broker | None = None, *, batch: int = 100,
                      down_after: int = 40, backoff_s: float = 1.0) -> Trace:
    """The broker goes down after ``down_after`` publishes: the publish fails, the batch
    rolls back, the relay backs off (doubling) and catches up when the broker returns."""
    _check(batch, down_after, "down_after")
    if isinstance(backoff_s, (int, float)) and backoff_s <= 0:
        raise LabkitError(f"backoff_s={backoff_s} would retry in a tight loop.", "use backoff_s > 0.")
    number("backoff_s", backoff_s, above=True, high=MAX_BACKOFF_S, unit=" s", example=1)
    title = f"Broker down after {down_after} publishes: roll back, back off, catch up"
    with _traced(lab, broker, batch, title) as (tr, broker, obs):
        stop_tag = f"published:{down_after}" if down_after else "claimed"
        with _relay(lab, broker, "relay-1", batch=batch, backoff_s=backoff_s,
                    pause_at=["claimed#1", f"{stop_tag}#1", "publish_failed"]) as r1:
            obs.watch(r1)
            r1.wait_for("paused", tag="claimed", timeout=60)
            if down_after:
                _resume_to(r1, stop_tag)
                tr.add("relay 1", f"BEGIN; claim {batch}; publish {down_after}",
                       "a normal tick, so far", obs.snapshot())
            broker.set_up(False)
            tr.add("broker", "goes down", "every publish is refused from now on", obs.snapshot())
            for attempt in (1, 2):
                r1.resume()
                ev = r1.wait_for("publish_failed", count=attempt, timeout=60)
                r1.wait_for("paused", tag="publish_failed", count=attempt, timeout=60)
                claimed = r1.wait_for("claimed", count=attempt, timeout=60)["ids"]
                done = [e for e in r1.events if e["kind"] == "published"][-1]["n"] \
                    if attempt == 1 and down_after else 0
                what = (f"publish {done + 1} refused" if attempt == 1
                        else f"retry: claim {len(claimed)} again; publish 1 refused")
                tr.add("relay 1", f"{what} → ROLLBACK; back off {ev['delay_s']:g} s",
                       "nothing was marked, so nothing is lost; the locks go with the rollback, "
                       "the broker keeps what it had", obs.snapshot(), kind="error")
            broker.set_up(True)
            tr.add("broker", "comes back", "publishes are accepted again", obs.snapshot())
            r1.resume()
            r1.join(60)
        tr.add("relay 1", f"claim {batch} again; publish all, mark them, COMMIT",
               "caught up: every event is in the broker, some of them twice", obs.snapshot())
        return _finish(tr, lab, broker, obs, {})

# -- a frozen relay ------------------------------------------------------------------------------

# Why the server ended a backend, from the error the woken client reads on its connection.
ENDED_BY = {"25P03": "idle_in_transaction_session_timeout",
            "25P04": "transaction_timeout",
            "57P01": "pg_terminate_backend or a server shutdown"}
MAX_IDLE_TIMEOUT_S = 60
MAX_WATCH_S = 600


@dataclasses.dataclass(frozen=True)
class BoundSetting(Result):
    """One server setting that may end a backend whose client froze inside a transaction,
    as ``pg_settings`` shows it (text, as the server gives it).

    value: its value for this session, in ``unit`` ("0": off)
    unit: its unit ("ms", "s", or "" for a count)
    default: the server's built-in default (boot_val), in the same unit
    """

    value: str
    unit: str
    default: str


@dataclasses.dataclass(frozen=True)
class ServerBounds(Result):
    """What ends a backend whose client froze inside a transaction, as this server and this
    session are configured (:func:`server_bounds`).

    connection: how this session reaches the server: "tcp" (keepalives apply) or "unix socket"
    settings: each setting by its name (idle_in_transaction_session_timeout,
        transaction_timeout, tcp_keepalives_*, tcp_user_timeout,
        client_connection_check_interval; those the server has), in name order
    """

    connection: str
    settings: dict[str, BoundSetting]


def server_bounds(lab: Lab) -> ServerBounds:
    """What ends a backend whose client froze inside a transaction, as this server and this
    session are configured: the settings' values (0 = off), their units, the server's boot
    default, and whether the session came over TCP (keepalives) or a Unix socket."""
    rows = lab.execute(_lab_sql("freeze_bounds"))
    over = lab.execute("SELECT CASE WHEN inet_client_addr() IS NULL THEN 'unix socket' ELSE 'tcp' END")[0][0]
    return ServerBounds(connection=over,
                        settings={n: BoundSetting(value=v, unit=u, default=b) for n, v, u, b in rows})


@dataclasses.dataclass(frozen=True)
class Keepalive(Result):
    """This machine's own TCP keepalive defaults (Linux, ``/proc/sys/net/ipv4/tcp_keepalive_*``):
    what ``tcp_keepalives_* = 0`` means on a TCP connection here.

    time: seconds a connection stays idle before the first probe
    intvl: seconds between probes
    probes: unanswered probes before the peer is given up
    dead_after_s: seconds from the last packet until a silent peer is given up
        (time + intvl * probes)
    """

    time: int
    intvl: int
    probes: int
    dead_after_s: int


def os_keepalive() -> Keepalive | None:
    """Linux's own TCP keepalive defaults (what tcp_keepalives_* = 0 means there), or None."""
    base = "/proc/sys/net/ipv4/"
    try:
        vals = {k: int(open(base + f"tcp_keepalive_{k}").read()) for k in ("time", "intvl", "probes")}
    except (OSError, ValueError):
        return None
    return Keepalive(**vals, dead_after_s=vals["time"] + vals["intvl"] * vals["probes"])


def _check_freeze(batch, freeze_after, idle_timeout_s, publish_timeout_s, watch_s) -> None:
    _check(batch, freeze_after, "freeze_after")
    if idle_timeout_s is not None:
        number("idle_timeout_s", idle_timeout_s, above=True, high=MAX_IDLE_TIMEOUT_S, unit=" s", example=2)
    if publish_timeout_s is not None:
        number("publish_timeout_s", publish_timeout_s, above=True, high=MAX_IDLE_TIMEOUT_S, unit=" s",
               example=1)
        if idle_timeout_s is not None and publish_timeout_s >= idle_timeout_s:
            raise LabkitError(f"publish_timeout_s={publish_timeout_s:g} is not shorter than "
                              f"idle_timeout_s={idle_timeout_s:g}: the server would end a live, merely "
                              "slow relay before the relay gave its batch up.",
                              "use a publish timeout shorter than the idle timeout (half of it, say).")
    number("watch_s", watch_s, above=True, high=MAX_WATCH_S, unit=" s", example=15)
    if idle_timeout_s is not None and watch_s <= idle_timeout_s:
        raise LabkitError(f"watch_s={watch_s:g} ends before idle_timeout_s={idle_timeout_s:g} can.",
                          "use watch_s longer than idle_timeout_s (several times, on a busy machine).")


AUTO = "auto"


@dataclasses.dataclass
class _FrozenRelay:
    """Relay 1, frozen mid-batch: its process, its backend's pid, the backend's state and
    transaction id while frozen, when it went idle (the lab's clock), the rows it held, and
    when it went idle by the server's clock (read once the freeze is shown)."""

    worker: Worker
    pid: int
    state: str | None
    xid: str | None
    idle_since: float
    held: int
    idle_since_server: Any = None


def _freeze_title(batch: int, freeze_after: int, idle_timeout_s: float | None) -> str:
    """The freeze trace's title: the batch, where it freezes, and what bounds the session."""
    bound = (f"idle_in_transaction_session_timeout = {idle_timeout_s:g} s on its session"
             if idle_timeout_s is not None else "no idle_in_transaction_session_timeout")
    return f"Relay frozen mid-batch: {batch} claimed, frozen after {freeze_after} publishes ({bound})"


def _freeze_relay_1(tr: Trace, obs: Observer, r1: Worker, *, tag: str, batch: int,
                    freeze_after: int) -> _FrozenRelay:
    """Start relay 1, let it run to its pause at ``tag`` and freeze its process (SIGSTOP)
    there, its transaction open: the trace's freeze step."""
    r1.start()
    pid = obs.watch(r1)
    r1.wait_for("paused", tag=tag, timeout=60)
    os.kill(started_pid(r1), signal.SIGSTOP)           # the freeze: the process runs no more code
    r1.resume()                               # read by the process only once it is woken
    asked = time.monotonic()
    state, xid, idle_for = obs.backend_state(pid) or (None, None, None)
    # When the backend went idle: measured from before the question, so that the
    # released_after_s below is never short of the real time.
    idle_since = asked - (idle_for or 0.0)
    frozen = obs.snapshot()
    tr.add("relay 1", f"BEGIN; claim {batch}; publish {freeze_after}; then frozen (SIGSTOP)",
           "a host freeze, a paused VM, a long GC pause: the process stops, its connection "
           f"stays open, and the server sees a session '{state}'", frozen, kind="freeze")
    return _FrozenRelay(r1, pid, state, xid, idle_since, frozen["locked_rows"])


def _claim_beside_frozen(lab: Lab, tr: Trace, obs: Observer, batch: int) -> int:
    """Another relay's claim while relay 1 is frozen (the same SQL, its own session, rolled
    back): the rows it got, and the trace's step."""
    with lab.connect(role="relay-2", autocommit=False) as other:
        others = len(other.execute(CLAIM, {"batch": batch}).fetchall())
        other.rollback()
    tr.add("relay 2", f"BEGIN; claim … FOR UPDATE SKIP LOCKED → {others} rows; ROLLBACK",
           "the frozen relay's locks are held: SKIP LOCKED skips every row of its batch, and "
           "nothing publishes them", obs.snapshot())
    return others


def _wait_for_backend_end(obs: Observer, pid: int, watch_s: float) -> tuple[float, Any]:
    """Poll the frozen backend for at most ``watch_s``: when the last poll ran, and the
    backend's state then (None: it is gone)."""
    deadline = time.monotonic() + watch_s
    while obs.backend_state(pid) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    gone_at = time.monotonic()
    return gone_at, obs.backend_state(pid)


def _kill_frozen(tr: Trace, obs: Observer, frozen: _FrozenRelay, last: Any, watch_s: float) -> dict[str, Any]:
    """Nothing on the server ended the frozen session: the lab kills relay 1's process (the
    trace's step); what was measured: how long the backend was held at least."""
    measured = {"released_after_s": None, "held_for_at_least_s": round(last[2], 3)}
    frozen.worker.kill()                      # SIGKILL ends a stopped process too
    obs.wait_gone(frozen.pid)
    tr.add("lab", f"nothing on the server ended the frozen session within {watch_s:g} s: "
                  "SIGKILL the frozen process", "only a process that dies closes its "
           "connection; the kill is the lab's, to end the demonstration", obs.snapshot(),
           kind="crash")
    return measured


def _server_ended(tr: Trace, obs: Observer, frozen: _FrozenRelay, granted: list, *, gone_at: float,
                  idle_timeout_s: float | None) -> dict[str, Any]:
    """The server ended the frozen backend (the trace's step): how long after it went idle,
    by the server's clock (to a waiter's lock being granted) and by the lab's."""
    measured: dict[str, Any] = {}
    since = frozen.idle_since_server
    if granted and since and since[0] is not None:
        measured["released_after_server_s"] = round((granted[0] - since[0]).total_seconds(), 3)
    # From the moment the backend went idle in its transaction to the first poll
    # that found it gone (so late by at most one poll, 50 ms).
    measured["released_after_s"] = round(gone_at - frozen.idle_since, 3)
    tr.add("server", f"idle in transaction longer than {idle_timeout_s:g} s: the server "
                     "ends relay 1's backend", "its transaction rolls back: nothing "
           "marked, every lock released, while relay 1 is still frozen", obs.snapshot())
    return measured


def _relay_2_publishes(lab: Lab, broker: Broker, tr: Trace, obs: Observer, *, batch: int,
                       freeze_after: int) -> None:
    """Relay 2 claims the released batch and publishes it all (the trace's step)."""
    with _relay(lab, broker, "relay-2", batch=batch) as r2:
        obs.watch(r2)
        again = r2.wait_for("claimed", timeout=60)["ids"]
        r2.join(60)
    tr.add("relay 2", f"claim {len(again)} rows; publish all, mark them, COMMIT",
           f"the {freeze_after} events relay 1 published before it froze go out a second time",
           obs.snapshot())


def _wake_relay_1(tr: Trace, obs: Observer, r1: Worker,
                  publish_timeout_s: float | None | str) -> tuple[int, dict | None]:
    """SIGCONT: relay 1 wakes to a connection that is gone (the trace's step).  What it
    published after waking, and the error it got (None: none)."""
    seen = len([e for e in r1.events if e["kind"] == "published"])
    os.kill(started_pid(r1), signal.SIGCONT)       # the freeze ends
    r1.wait_exit(60)
    stale_publishes = len([e for e in r1.events if e["kind"] == "published"]) - seen
    errors = [e for e in r1.events if e.get("sqlstate")]
    woke_to = errors[0] if errors else None
    gave_up = any(e["kind"] == "publish_timeout" for e in r1.events)
    what = (f"publish timeout passed ({publish_timeout_s:g} s): give the batch up, ROLLBACK"
            if gave_up else
            f"publish the other {stale_publishes} of its batch; then mark")
    err = f"{woke_to['error']} ({woke_to['sqlstate']})" if woke_to else "no error"
    tr.add("relay 1", f"SIGCONT (wakes): {what} → {err}",
           "its connection is gone: nothing it does reaches the database and it cannot "
           "commit; " + ("it publishes nothing more" if gave_up else
                         "every event it published after waking is a duplicate"),
           obs.snapshot(), kind="error")
    return stale_publishes, woke_to


def _stale_writes(obs: Observer, xid: str | None) -> int:
    """Outbox rows the frozen transaction's xid wrote (0 if it had none)."""
    if not xid:
        return 0
    return one_row(obs.conn.execute("SELECT count(*) FROM outbox WHERE xmin::text = %s",
                                    (xid,)), "the count of stale outbox writes")[0]


def _released_by(killed: bool, woke_to: dict | None, watch_s: float) -> str:
    """Who ended the frozen session: the lab's SIGKILL, or the server (and why)."""
    if killed:
        return f"SIGKILL by the lab after {watch_s:g} s (nothing on the server ended it)"
    if woke_to:
        return ENDED_BY.get(woke_to["sqlstate"], f"the server ({woke_to['sqlstate']})")
    return "the server (no reason reached the client)"


def freeze_trace(lab: Lab, broker: Broker | None = None, *, batch: int = 100, freeze_after: int = 40,
                 idle_timeout_s: float | None = 2.0, publish_timeout_s: float | None | str = AUTO,
                 watch_s: float = 15.0) -> Trace:
    """Relay 1 claims ``batch`` rows, publishes ``freeze_after``, and its process is frozen
    (SIGSTOP) there, its transaction open.  Another relay's claim skips every locked row.
    The server ends the frozen backend after ``idle_timeout_s`` (its session's
    idle_in_transaction_session_timeout; None: the server's setting, off by default), or
    nothing does within ``watch_s`` and the lab kills the frozen process.  Relay 2 then
    publishes the batch; relay 1 is woken (SIGCONT) and finds its connection gone.
    ``publish_timeout_s`` (default: half the idle timeout) makes the woken relay give the
    batch up instead of publishing the rest of it.

    The trace's text and summary reproduce exactly; the measured time from the backend
    going idle to its end is ``trace.measured["released_after_s"]`` (the lab's clock, late by at most
    one poll) and ``trace.measured["released_after_server_s"]`` (the server's clock: from the
    backend's ``state_change`` to the moment a session waiting for one of its row locks got it)."""
    if publish_timeout_s == AUTO:
        publish_timeout_s = None if idle_timeout_s is None else idle_timeout_s / 2
    _check_freeze(batch, freeze_after, idle_timeout_s, publish_timeout_s, watch_s)
    with _traced(lab, broker, batch, _freeze_title(batch, freeze_after, idle_timeout_s)) as (tr, broker, obs):
        measured: dict[str, Any] = {}
        # Trace (core/trace.py) declares no ``measured``: this trace carries one more attribute
        tr.measured = measured  # type: ignore[attr-defined]
        waiter = None
        tag = f"published:{freeze_after}" if freeze_after else "claimed"
        r1 = _relay(lab, broker, "relay-1", batch=batch, pause_at=[f"{tag}#1"],
                    idle_timeout_s=idle_timeout_s, publish_timeout_s=publish_timeout_s)
        try:
            frozen = _freeze_relay_1(tr, obs, r1, tag=tag, batch=batch, freeze_after=freeze_after)
            others = _claim_beside_frozen(lab, tr, obs, batch)
            # Who ends the frozen backend, and when -- by the server's clock: when the backend
            # went idle in its transaction, and when a session waiting for one of its row locks
            # got it (the moment the batch was let go).
            frozen.idle_since_server = obs.conn.execute(_lab_sql("state_since"), {"pid": frozen.pid}).fetchone()
            first_id = r1.wait_for("claimed", timeout=60)["ids"][0]
            waiter, granted = lab.when_lock_granted(_lab_sql("lock_granted_at"), {"id": first_id}, watch_s + 30)
            gone_at, last = _wait_for_backend_end(obs, frozen.pid, watch_s)
            killed = last is not None
            if killed:
                measured.update(_kill_frozen(tr, obs, frozen, last, watch_s))
            else:
                waiter.join(watch_s + 30)
                measured.update(_server_ended(tr, obs, frozen, granted, gone_at=gone_at,
                                              idle_timeout_s=idle_timeout_s))
            _relay_2_publishes(lab, broker, tr, obs, batch=batch, freeze_after=freeze_after)
            stale_publishes, woke_to = (0, None) if killed else _wake_relay_1(tr, obs, r1, publish_timeout_s)
        finally:
            if r1.alive:
                os.kill(started_pid(r1), signal.SIGCONT)
                r1.kill()
            if waiter is not None:
                waiter.join(watch_s + 30)
        out = _finish(tr, lab, broker, obs, {
            "backend_state_while_frozen": frozen.state,
            "locks_held_while_frozen": frozen.held,
            "claimed_by_others_while_frozen": others,
            "released_by": _released_by(killed, woke_to, watch_s),
            "stale_publishes_after_wake": stale_publishes,
            "stale_writes_after_wake": _stale_writes(obs, frozen.xid)})
        out.summary["duplicates_after_wake"] = out.summary["duplicates"]
        return out


@dataclasses.dataclass(frozen=True)
class RelayFreeze(Result):
    """A relay frozen mid-batch (SIGSTOP), its transaction open (:func:`freeze_summary`): the
    trace's summary, read from the database and the broker, and what was measured.

    outbox_rows: rows in the outbox at the end
    backend_state_while_frozen: the frozen relay's backend state in pg_stat_activity
        ("idle in transaction")
    locks_held_while_frozen: outbox rows the frozen relay's transaction kept locked
    claimed_by_others_while_frozen: rows another relay's claim got while it was frozen
    released_by: what ended the frozen session: the setting or reason the server gave, or
        the lab's SIGKILL when nothing on the server ended it
    stale_publishes_after_wake: messages the woken relay published after its session was gone
    stale_writes_after_wake: outbox rows whose current version the frozen transaction wrote
        (0: none of its writes stands)
    broker_messages: messages the broker held before the consumer took them, duplicates included
    distinct_events: distinct events among the delivered messages
    duplicates: messages beyond one per event
    lost_events: event ids marked published that the consumer never applied
    consumer_applied: shipping labels the consumer printed in all (one per event applied)
    orders_applied_twice: orders that got more than one label (0: the inbox deduplicated)
    duplicates_after_wake: the duplicates, once the woken relay has done what it does
    released_after_s: seconds from the backend going idle in its transaction to the lab's
        first poll that found it gone (late by at most one poll); None when the lab killed it
    released_after_server_s: the same by the server's clock, from the backend's state_change
        to a waiting session getting one of its row locks; None when not measured
    held_for_at_least_s: seconds the backend was seen held when the lab killed it; None when
        the server ended it
    trace: the trace itself (not in the JSON)
    """

    outbox_rows: int
    backend_state_while_frozen: str | None
    locks_held_while_frozen: int
    claimed_by_others_while_frozen: int
    released_by: str
    stale_publishes_after_wake: int
    stale_writes_after_wake: int
    broker_messages: int
    distinct_events: int
    duplicates: int
    lost_events: list[str]
    consumer_applied: int
    orders_applied_twice: int
    duplicates_after_wake: int
    released_after_s: float | None = None
    released_after_server_s: float | None = None
    held_for_at_least_s: float | None = None
    trace: Trace = not_json()


def freeze_summary(lab: Lab, broker: Broker | None = None, *, batch: int = 100, freeze_after: int = 40,
                   idle_timeout_s: float | None = 2.0, publish_timeout_s: float | None | str = AUTO,
                   watch_s: float = 15.0) -> RelayFreeze:
    """:func:`freeze_trace` as a result: the trace's summary (locks_held_while_frozen,
    claimed_by_others_while_frozen, released_by, duplicates_after_wake,
    stale_writes_after_wake, ...), the measured released_after_s, and the trace itself."""
    tr = freeze_trace(lab, broker, batch=batch, freeze_after=freeze_after,
                      idle_timeout_s=idle_timeout_s, publish_timeout_s=publish_timeout_s,
                      watch_s=watch_s)
    # freeze_trace's Trace carries ``measured``, an attribute Trace (core/trace.py) does not declare
    measured: dict[str, Any] = tr.measured  # type: ignore[attr-defined]
    return RelayFreeze(**tr.summary, released_after_s=measured.get("released_after_s"),
                       released_after_server_s=measured.get("released_after_server_s"),
                       held_for_at_least_s=measured.get("held_for_at_least_s"), trace=tr)


# -- committing mid-batch ----------------------------------------------------------------------------


def commit_every_trace(lab: Lab, broker: Broker | None = None, *, batch: int = 100,
                       commit_every: int = 10) -> Trace:
    """Relay 1 claims ``batch`` rows and commits after every ``commit_every`` publishes
    (marking those); relay 2 ticks right after relay 1's first COMMIT.  No process
    crashes.  The order of the two relays' moves is scripted; the summary counts the
    duplicates from the broker."""
    number("batch", batch, low=2, high=MAX_BATCH, whole=True, example=100)
    number("commit_every", commit_every, low=1, high=MAX_BATCH, whole=True, example=10)
    if commit_every >= batch:
        raise LabkitError(f"commit_every={commit_every} never commits inside a batch of {batch}.",
                          "use commit_every smaller than batch (10 of 100, say).")
    title = f"Commit every {commit_every} publishes: two relays, no crash"
    with _traced(lab, broker, batch, title) as (tr, broker, obs):
        with _relay(lab, broker, "relay-1", batch=batch, commit_every=commit_every,
                    pause_at=["claimed#1", "committed#1"]) as r1:
            obs.watch(r1)
            first = _claimed(r1)
            tr.add("relay 1", f"BEGIN; claim {len(first)} rows FOR UPDATE SKIP LOCKED",
                   "the whole batch is locked", obs.snapshot())
            _resume_to(r1, "committed")
            tr.add("relay 1", f"publish {commit_every}; mark them; COMMIT",
                   f"the COMMIT ends the transaction, and with it the locks on all {len(first)} rows: "
                   f"the {len(first) - commit_every} unpublished ones are free to claim", obs.snapshot())
            with _relay(lab, broker, "relay-2", batch=batch, pause_at=["claimed#1"]) as r2:
                obs.watch(r2)
                second = _claimed(r2)
                overlap = len(set(first) & set(second))
                tr.add("relay 2", f"BEGIN; claim … FOR UPDATE SKIP LOCKED → {len(second)} rows",
                       f"{overlap} of them are rows relay 1 claimed and still means to publish",
                       obs.snapshot())
                r2.resume()
                r2.join(60)
            tr.add("relay 2", f"publish {len(second)}, mark them, COMMIT", "a normal tick",
                   obs.snapshot())
            r1.resume()
            r1.join(60)
        rest = len(first) - commit_every
        tr.add("relay 1", f"publish the other {rest} of its batch, {commit_every} at a time, "
                          "marking and committing each time",
               "it never claimed again, so it does not know relay 2 sent them already", obs.snapshot())
        return _finish(tr, lab, broker, obs, {"crashes": 0, "claimed_by_both": overlap})


@contextmanager
def _paused_relays(lab: Lab, broker: Broker, obs: Observer, n: int, pause_at: str,
                   **kw) -> Iterator[list[Worker]]:
    """Relay processes relay-1 .. relay-``n``, started one after the other: each is followed
    by ``obs`` and has paused at ``pause_at`` before the next one starts.  Whatever is left
    of them is SIGKILLed when the block ends."""
    workers = [_relay(lab, broker, f"relay-{i}", pause_at=[pause_at], **kw) for i in range(1, n + 1)]
    try:
        for w in workers:
            w.start()
            obs.watch(w)
            w.wait_for("paused", tag=pause_at.partition("#")[0], timeout=60)
        yield workers
    finally:
        for w in workers:
            w.kill()


def _let_go(workers: list[Worker], timeout: float) -> None:
    """Resume every paused worker, then wait for each one to end."""
    for w in workers:
        w.resume()
    for w in workers:
        w.join(timeout)


@dataclasses.dataclass(frozen=True)
class FreeRelays(Result):
    """Relay processes draining a backlog with nothing scripted but a common start
    (:func:`free_relays`), read back from the database and the broker.

    relays: relay processes that ran
    commit_every: publishes between COMMITs inside a batch (None: one COMMIT after the batch)
    published_by: messages each relay published, relay 1's first
    outbox_rows: rows in the outbox at the end
    broker_messages: messages the broker held before the consumer took them, duplicates included
    distinct_events: distinct events among the delivered messages
    duplicates: messages beyond one per event
    lost_events: event ids marked published that the consumer never applied
    consumer_applied: shipping labels the consumer printed in all (one per event applied)
    orders_applied_twice: orders that got more than one label (0: the inbox deduplicated)
    """

    relays: int
    commit_every: int | None
    published_by: list[int]
    outbox_rows: int
    broker_messages: int
    distinct_events: int
    duplicates: int
    lost_events: list[str]
    consumer_applied: int
    orders_applied_twice: int


def free_relays(lab: Lab, broker: Broker | None = None, *, orders: int = 1000, batch: int = 100,
                commit_every: int | None = None, relays: int = 2) -> FreeRelays:
    """``relays`` relay processes drain a backlog of ``orders`` with nothing scripted but a
    common start: each runs its own ticks until it finds nothing to claim.  No process
    crashes.  Returns the outcome read from the database and the broker (duplicates,
    lost events), and how many messages each relay published."""
    number("orders", orders, low=1, high=MAX_ORDERS, whole=True, example=1000)
    number("batch", batch, low=1, high=MAX_BATCH, whole=True, example=100)
    number("relays", relays, low=1, high=16, whole=True, example=2)
    if commit_every is not None:
        number("commit_every", commit_every, low=1, high=MAX_BATCH, whole=True, example=10)
    with _outbox_run(lab, broker, orders) as (broker, obs):
        with _paused_relays(lab, broker, obs, relays, "ready", batch=batch,
                            commit_every=commit_every) as workers:
            _let_go(workers, 120)
        published = [len([e for e in w.events if e["kind"] == "published"]) for w in workers]
        _, out = _deliver(lab, broker, obs)
        return FreeRelays(relays=relays, commit_every=commit_every, published_by=published, **out)


TRACES: dict[str, Callable[..., Trace]] = {"relay": crash_trace, "dual-write": dual_write_trace, "broker-down": broker_down_trace}


# -- two relays at once ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TwoRelays(Result):
    """Two relay processes, each holding its claim while the other claims (:func:`two_relays`),
    read back from the database and the broker.

    claims: the outbox ids each relay claimed, relay 1's first
    locked_while_both_held: outbox rows locked while both relays held their claims
    broker_messages: messages the broker held before the consumer took them, duplicates included
    delivered: the event ids the broker handed to the consumer, in delivery order
    outbox_rows: rows in the outbox at the end
    distinct_events: distinct events among the delivered messages
    duplicates: messages beyond one per event
    lost_events: event ids marked published that the consumer never applied
    consumer_applied: shipping labels the consumer printed in all (one per event applied)
    orders_applied_twice: orders that got more than one label (0: the inbox deduplicated)
    """

    claims: list[list[int]]
    locked_while_both_held: int
    broker_messages: int
    delivered: list[str]
    outbox_rows: int
    distinct_events: int
    duplicates: int
    lost_events: list[str]
    consumer_applied: int
    orders_applied_twice: int


def two_relays(lab: Lab, broker: Broker | None = None, *, orders: int = 100, batch: int = 50) -> TwoRelays:
    """Two relay processes, each holding its claim while the other claims: the batches
    are disjoint.  Returns both claims and the broker's messages."""
    if orders < 0 or batch < 1:
        raise LabkitError(f"orders={orders}, batch={batch}: nothing to share.", "use orders >= 0 and batch >= 1.")
    number("orders", orders, high=MAX_ORDERS, whole=True, example=100)
    number("batch", batch, low=1, high=MAX_BATCH, whole=True, example=50)
    with _outbox_run(lab, broker, orders) as (broker, obs):
        with _paused_relays(lab, broker, obs, 2, "claimed#1", batch=batch) as workers:
            claims = [w.wait_for("claimed", timeout=60)["ids"] for w in workers]
            held = obs.locked_rows()
            _let_go(workers, 60)
        delivered, out = _deliver(lab, broker, obs)
        return TwoRelays(claims=claims, locked_while_both_held=held, delivered=delivered, **out)


# -- what marking a row published leaves in the partial index -------------------------------------

MAX_ARRIVING = 100_000


@dataclasses.dataclass(frozen=True)
class IndexScan(Result):
    """One read of the metrics query's index-only scan of the partial index (EXPLAIN ANALYZE).

    heap_fetches: index entries the scan had to check in the table (the heap)
    buffers: buffers (8 kB pages, shared hit + read) the scan touched
    """

    heap_fetches: int
    buffers: int


def _index_scan(lab: Lab) -> IndexScan:
    """Heap fetches and buffers of the metrics query's index-only scan of the partial index
    (sequential and bitmap scans switched off for it: the index's cost is what is read)."""
    import re

    with lab.connect(role="explain") as conn:      # the index's cost, whatever the planner prefers
        conn.execute("SET enable_seqscan = off")
        conn.execute("SET enable_bitmapscan = off")
        plan = "\n".join(r[0] for r in conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF, SUMMARY OFF) " + METRICS))
    at = plan.find("Index Only Scan using outbox_unpublished_idx")
    if at < 0:
        raise LabkitError("The metrics query did not read the partial index outbox_unpublished_idx:\n"
                          + plan, "run relay.create_outbox and VACUUM ANALYZE outbox first.")
    node = plan[at:]
    hit = re.search(r"Buffers: shared hit=(\d+)(?: read=(\d+))?", node)
    fetches = re.search(r"Heap Fetches: (\d+)", node)
    if fetches is None:
        raise LabkitError("The metrics query's index-only scan shows no Heap Fetches line:\n" + plan,
                          "report this with the server's version (`labkit doctor`): its EXPLAIN "
                          "output is not the one this lab reads.")
    return IndexScan(heap_fetches=int(fetches[1]),
                     buffers=int(hit[1]) + int(hit[2] or 0) if hit else 0)


@dataclasses.dataclass(frozen=True)
class DeadIndexEntries(Result):
    """The metrics query's index scan after a batch of events was marked published
    (:func:`dead_index_entries`), read three times.

    arriving: events inserted and marked published
    first_scan: the scan right after the batch was marked
    second_scan: the same scan once more (the first marked the stale entries dead)
    after_vacuum: the scan after VACUUM removed the dead entries
    """

    arriving: int
    first_scan: IndexScan
    second_scan: IndexScan
    after_vacuum: IndexScan

    def by_when(self) -> dict[str, IndexScan]:
        """The three scans in the order they ran, each under when it ran: "first scan",
        "second scan", "after VACUUM"."""
        return {"first scan": self.first_scan, "second scan": self.second_scan,
                "after VACUUM": self.after_vacuum}


def dead_index_entries(lab: Lab, arriving: int = 3000, wait_s: float = 30.0) -> DeadIndexEntries:
    """A batch of ``arriving`` events is inserted and marked published (autovacuum off on the
    outbox, so only the VACUUM here runs); the metrics query's index scan is read three times:
    right after, once more, and after VACUUM.  The outbox must exist with its statistics
    (``VACUUM ANALYZE outbox``).  Waits up to ``wait_s`` for older snapshots of other sessions
    to end (they would keep the dead row versions); a LabkitError names them if they do not."""
    number("arriving", arriving, low=1, high=MAX_ARRIVING, whole=True, example=3000)
    number("wait_s", wait_s, high=600, unit=" s", example=30)
    lab.execute("ALTER TABLE outbox SET (autovacuum_enabled = off)")
    lo, hi = lab.execute(_lab_sql("arrive"), {"n": arriving})[0]
    lab.execute("UPDATE outbox SET published_at = now() WHERE id BETWEEN %s AND %s", (lo, hi))
    xid = lab.execute("SELECT xmin::text FROM outbox WHERE id = %s", (lo,))[0][0]
    older = _lab_sql("older_snapshots")
    deadline = time.monotonic() + wait_s
    while (held := lab.execute(older, {"x": xid})) and time.monotonic() < deadline:
        time.sleep(0.1)
    if held:
        who = ", ".join(f"pid {p} ({a or 'no name'})" for p, a in held)
        raise LabkitError(f"Other sessions hold snapshots older than the relay's marks ({who}): "
                          "VACUUM could not remove the dead row versions, so this lab would show "
                          "nothing.", "end those transactions (`labkit doctor` lists them, "
                          "`labkit clean` ends yours), then run the cell again.")
    first = _index_scan(lab)
    second = _index_scan(lab)
    lab.execute("VACUUM outbox")
    return DeadIndexEntries(arriving=arriving, first_scan=first, second_scan=second,
                            after_vacuum=_index_scan(lab))


# -- lag -------------------------------------------------------------------------------------------


def metrics(lab: Lab) -> tuple[int, float]:
    """(depth, age of the oldest unpublished row in seconds), from the partial index."""
    depth, age = lab.execute(METRICS)[0]
    return depth, age


def measure_lag(lab: Lab, broker: Broker | None = None, *, rate_per_s: float = 40, interval_s: float = 0.1,
                run_s: float = 3.0, pause: tuple[float, float] = (1.0, 2.0), sample_s: float = 0.05,
                batch: int = 100, burst: tuple[float, int] | None = None) -> pd.DataFrame:
    """Orders arrive at ``rate_per_s``; a relay process ticks every ``interval_s``; it is
    frozen (SIGSTOP) during ``pause`` and thawed (SIGCONT) after.  ``burst=(t, n)`` places n
    more orders at once (one transaction) at time t, the relay running.  Samples depth and the oldest row's age
    every ``sample_s``.  Returns a DataFrame (t_s, depth, oldest_age_s, relay); ``df.attrs``
    keeps ``pause`` and ``burst`` for :func:`plot_lag`."""
    if min(rate_per_s, interval_s, sample_s, run_s, batch) <= 0:
        raise LabkitError("rate_per_s, interval_s, sample_s, run_s and batch must be positive.",
                          "pass positive numbers, for example rate_per_s=40, run_s=3, batch=100.")
    number("rate_per_s", rate_per_s, above=True, high=10_000, example=40)
    number("interval_s", interval_s, above=True, high=60, unit=" s", example=0.1)
    number("sample_s", sample_s, above=True, high=60, unit=" s", example=0.05)
    number("run_s", run_s, above=True, high=600, unit=" s", example=3)
    number("batch", batch, low=1, high=MAX_BATCH, whole=True, example=100)
    if not 0 <= pause[0] < pause[1] <= run_s:
        raise LabkitError(f"pause={pause} does not fit in run_s={run_s}.",
                          "use pause=(start, end) with 0 <= start < end <= run_s.")
    if burst is not None:
        number("burst time", burst[0], low=0, high=run_s, unit=" s", example=0.5)
        number("burst size", burst[1], low=1, high=MAX_BATCH * 10, whole=True, example=150)
        if pause[0] <= burst[0] < pause[1]:
            raise LabkitError(f"burst at {burst[0]} s falls inside the pause {pause}.",
                              "place the burst while the relay runs, for example burst=(0.5, 150).")
    with brokers.used_by(lab, broker) as bk:
        df = _measure_lag(lab, bk, rate_per_s, interval_s, run_s, pause, sample_s, batch, burst)
    df.attrs.update(pause=pause, burst=burst)
    return df


def _measure_lag(lab: Lab, broker, rate_per_s, interval_s, run_s, pause, sample_s, batch, burst):
    import pandas as pd

    _fresh_outbox(lab, broker, 0)
    # the relay's pace is its ticks, not this machine's disk: the recording broker's publishes
    # do not each wait for a WAL flush; the relay's commit of its marks flushes them with it
    spec = broker.spec() | ({"wait_for_disk": False} if broker.kind == "recording" else {})
    w = Worker(timed_relay_process, name="timed relay", dsn=lab.db.dsn, schema=lab.schema,
               broker=spec, batch=batch, interval_s=interval_s, run_for_s=run_s + 1.0)
    rows, stopped, placed, next_id = [], False, 0.0, 1
    producer = lab.connect(role="producer")
    try:
        w.start()
        w.wait_for("ready", timeout=60)
        t0 = time.monotonic()
        while (t := time.monotonic() - t0) < run_s:
            if not stopped and pause[0] <= t < pause[1]:
                os.kill(started_pid(w), signal.SIGSTOP)
                stopped = True
            due = int(t * rate_per_s) - int(placed)
            if burst is not None and t >= burst[0]:
                place_orders(lab, burst[1], start=next_id, conn=producer, together=True)
                next_id += burst[1]
                burst = None
            if due > 0:
                place_orders(lab, due, start=next_id, conn=producer)
                next_id += due
                placed += due
            depth, age = metrics(lab)
            # stamped when read: a placement that took long must not date its depth back
            rows.append((round(time.monotonic() - t0, 3), depth, age, "paused" if stopped else "running"))
            if stopped and t >= pause[1]:       # thawed after the last sample read while frozen
                os.kill(started_pid(w), signal.SIGCONT)
                stopped = False
            time.sleep(max(0.0, sample_s - (time.monotonic() - t0 - t)))
    finally:
        if stopped and w.alive:
            os.kill(started_pid(w), signal.SIGCONT)
        producer.close()
        w.kill()
    return pd.DataFrame(rows, columns=["t_s", "depth", "oldest_age_s", "relay"])


def plot_lag(df: pd.DataFrame, pause: tuple[float, float] | None = None, title: str = "Outbox lag"):
    """The lag of :func:`measure_lag` on two panels sharing the time axis: the oldest unpublished
    row's age on the left, the outbox's depth on the right; the pause shaded, the burst marked.  Returns the
    two axes."""
    import matplotlib.pyplot as plt

    pause = pause or df.attrs.get("pause")
    burst = df.attrs.get("burst")
    fig, (age, depth) = plt.subplots(1, 2, figsize=(12, 5.6), sharex=True)
    for ax in (age, depth):
        if pause:
            ax.axvspan(*pause, color=PALETTE[1], alpha=0.18,
                       label="relay frozen (SIGSTOP)" if ax is age else None)
        if burst:
            ax.axvline(burst[0], color=PALETTE[4], ls=":", lw=1.5,
                       label=f"a burst of {burst[1]} orders" if ax is age else None)
    age.plot(df.t_s, df.oldest_age_s, color=PALETTE[0], lw=2)
    age.set_ylabel("oldest row's\nage (s)")
    age.set_ylim(bottom=0)
    depth.plot(df.t_s, df.depth, color=PALETTE[2], lw=2)
    depth.set_ylabel("depth\n(unpublished rows)")
    depth.set_ylim(bottom=0)
    for ax in (age, depth):
        ax.set_xlabel("time (s)")
    legend_below(fig, age, ncol=2)
    fig.suptitle(title)
    return age, depth


# -- command line --------------------------------------------------------------------------------


def trace_command(*, open_lab: Callable[[], Lab], kind: str, batch: int, crash_after: int,
                  freeze_after: int | None, idle_timeout: float, publish_timeout: float | None,
                  watch: float, broker: str | None, json: bool) -> int:
    """``labkit trace relay|dual-write|broker-down [--batch N] [--crash-after N] [--json]``;
    ``labkit trace relay --freeze-after N [--idle-timeout S] [--publish-timeout S]`` freezes
    the relay instead of killing it.  ``open_lab()`` gives the run its own lab (the process
    id in its name: two runs at once never share, reset or drop each other's tables)."""
    point = {"broker-down": "down_after"}.get(kind, "crash_after")
    run: Callable[[Lab, Broker], Trace]
    if freeze_after is not None:
        if kind != "relay":
            raise LabkitError(f"--freeze-after applies to the relay trace, not {kind}.",
                              "use `labkit trace relay --freeze-after 40`.")
        idle = idle_timeout or None
        pub = AUTO if publish_timeout is None else (publish_timeout or None)
        if pub == AUTO:
            pub = None if idle is None else idle / 2
        _check_freeze(batch, freeze_after, idle, pub, watch)
        run = lambda lab, bk: freeze_trace(lab, bk, batch=batch,          # noqa: E731
                                                 freeze_after=freeze_after,
                                                 idle_timeout_s=idle, publish_timeout_s=pub,
                                                 watch_s=watch)
    else:
        _check(batch, crash_after, point)       # before anything is created
        run = lambda lab, bk: TRACES[kind](lab, bk, batch=batch,           # noqa: E731
                                           **{point: crash_after})
    with open_lab() as lab, brokers.for_lab(lab, broker) as bk:
        try:
            tr = run(lab, bk)
        finally:
            bk.discard()
    measured = getattr(tr, "measured", {})
    print(tr.report(json, broker=bk.kind, **measured))
    if measured and not json:
        print("measured: " + ", ".join(f"{k}={v}" for k, v in measured.items()))
    return 0
