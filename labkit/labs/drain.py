"""The notification drain: lease-based claims, a slow push service, and real crashes.

The drain claims due rows of a delivery ledger in ONE statement that also grants
the lease (``labkit/sql/drain_claim.sql``): attempts + 1, next_attempt_at = now + 120 s,
claim_version + 1. The statement commits at once, so no row lock outlives it; the
pushes go out afterwards, and the batch's outcomes are written in one short
transaction at the end (``drain_complete.sql``, or ``drain_complete_fenced.sql``).

Time goes through the lab's clock, ``lab_now()`` (``core/clock.py``, ``sql/clock.sql``): the
server's real clock, or -- in a lab -- a frozen instant that :class:`~labkit.core.clock.Clock`
moves on ("+120 s") at once, so traces reproduce exactly.

:class:`PushSender` stands in for APNs. A send "takes" ``latency_s`` seconds of APNs
time; it really sleeps ``latency_s * speed`` (``speed=0`` in the traces: no waiting;
the anti-pattern measurement uses a small real sleep so that overlap is real). Token
prefixes decide the outcome, deterministically: ``bad-`` fails terminally
(BadDeviceToken), ``flaky-`` fails transiently on its first ``flaky_failures`` attempts
(ServiceUnavailable), ``poison-`` kills the process that sends it (SIGKILL to itself:
think of a payload that crashes the client library), anything else is delivered. Every
delivered push is recorded in ``device_push`` over the sender's own autocommit connection,
with its collapse id, so the record survives a drain that is killed.

A row whose attempts are used up without an outcome (its drain died or hung every time)
is dead-lettered by the claim itself (``drain_claim.sql``): status ``failed``, with a
``last_error`` that says it was abandoned. :class:`Device` shows what a phone displays
of the pushes it received (collapse ids replace a banner; an idempotency key can drop a
repeat). :func:`freeze_trace` freezes a drain (SIGSTOP) instead of killing it.

The other SQL the labs run -- filling the ledger, the sender's record, what the traces
(``*_trace``) read back -- is in ``drain_lab.sql``; the anti-pattern that holds its claim
across the sends is ``drain_claim_held.sql``.  A drain process connects with
:func:`drain_connection`.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from ..core.clock import T0, Clock
from ..core.db import WORKER_GUARDS, Guards, open_connection
from ..core.errors import LabkitError
from ..core.lab import Lab, read_sql
from ..core.limits import bulk, number
from ..core.procs import Context, Worker
from ..core.queries import query
from ..core.results import Result
from ..core.trace import Trace
from ._checked import one_row, started_pid

if TYPE_CHECKING:
    import pandas as pd

LEASE_S = 120
MAX_ATTEMPTS = 5
LATENCY_S = 2.0                 # what one APNs call "takes" in the story


def _lab_sql(name: str) -> str:
    """One of the queries of the drain's labs (``drain_lab.sql``)."""
    return query("drain_lab.sql", name).sql


STATUS_COUNTS = "SELECT status, count(*) FROM delivery GROUP BY status ORDER BY status"
DUE_COUNT = _lab_sql("due_count")


# -- the ledger and the clock -------------------------------------------------------------


def create_ledger(lab: Lab, n: int, *, bad: tuple[int, ...] = (), flaky: tuple[int, ...] = (),
                  no_collapse_every: int = 4, freeze_at: str | None = T0,
                  install: bool = True, poison: tuple[int, ...] = ()) -> Clock:
    """(Re)create the drain's tables with ``n`` due deliveries, ids 1..n, oldest first.

    Delivery ``i`` is notification ``1000 + i`` to device ``dev-000i``; ids in ``bad`` get a
    dead token (``bad-…``), ids in ``flaky`` one that fails transiently at first, ids in
    ``poison`` a payload that kills the process sending it (``poison-…``). Every
    ``no_collapse_every``-th delivery carries no coalesce key (its push has no collapse id).
    The clock is frozen at ``freeze_at`` (``None``: the server's real clock).
    ``install=False`` keeps the tables (live workers' connections stay valid) and only
    empties and refills them."""
    if n < 0:
        raise LabkitError(f"A ledger of {n} deliveries makes no sense.", "pass n >= 0.")
    if no_collapse_every < 1:
        raise LabkitError("no_collapse_every must be 1 or more.",
                          "pass 1 (no collapse ids at all) or a larger number.")
    if install:
        lab.run_file("drain_ledger.sql")
        clock = Clock.install(lab)
    else:
        lab.execute("TRUNCATE delivery, device_push")
        clock = Clock(lab)
    if freeze_at is not None:
        clock.freeze(freeze_at)
    else:
        clock.real()
    number("n", n, high=MAX_OTHER, whole=True, example=50)
    bulk(lab, _lab_sql("fill_ledger"),
         {"n": n, "bad": list(bad), "flaky": list(flaky), "poison": list(poison),
          "every": no_collapse_every}, rows=n)
    lab.execute("ANALYZE delivery")
    return clock


# -- the push service stand-in --------------------------------------------------------------


@dataclass(frozen=True)
class Claimed:
    """One claimed delivery: what the claim's RETURNING gives the sender."""
    id: int
    notification_id: int
    device_token: str
    coalesce_key: str | None
    attempts: int
    claim_version: int
    suspect: bool = False   # two earlier attempts never reported: sent last, on its own


@dataclass(frozen=True)
class Outcome:
    outcome: str            # sent, retry, failed
    error: str | None = None


class PushSender:
    """An APNs stand-in: slow, sometimes failing, and keeping a record of every push."""

    def __init__(self, conn: psycopg.Connection, *, name: str = "drain", latency_s: float = LATENCY_S,
                 speed: float = 0.0, flaky_failures: int = 2, die_on_poison: bool = False):
        if latency_s < 0 or speed < 0 or flaky_failures < 0:
            raise LabkitError("PushSender got a negative latency, speed or flaky_failures.",
                              "pass latency_s >= 0, speed >= 0 (0: do not really wait) and "
                              "flaky_failures >= 0.")
        self.conn = conn            # autocommit: each push is on record the moment it happens
        self.name = name
        self.latency_s = latency_s
        self.speed = speed
        self.flaky_failures = flaky_failures
        self.die_on_poison = die_on_poison   # only in a drain process of its own, never a kernel

    def send(self, row: Claimed, *, by: str | None = None) -> Outcome:
        """One push: its outcome, and (when delivered) the push on record, carrying the
        delivery id and the claim version it was sent under."""
        if self.speed:
            time.sleep(self.latency_s * self.speed)
        token = row.device_token
        if token.startswith("bad-"):
            return Outcome("failed", "BadDeviceToken")
        if token.startswith("flaky-") and row.attempts <= self.flaky_failures:
            return Outcome("retry", "ServiceUnavailable")
        if token.startswith("poison-"):
            if not self.die_on_poison:
                raise LabkitError(f"Delivery {row.id} is a poison row: sending it kills the process "
                                  "that sends it.", "send poison rows from a drain process of its own "
                                  "(drain_worker, poison_trace, the torture), not from this kernel.")
            os.kill(os.getpid(), signal.SIGKILL)     # a real crash: no clean-up runs
        self.conn.execute(_lab_sql("record_push"), {**asdict(row), "by": by or self.name})
        return Outcome("sent")


# -- the phone: what a user sees of the pushes ---------------------------------------------


@dataclass(frozen=True)
class Push(Result):
    """One push the push service delivered: a row of ``device_push``.

    seq: its number in the order the pushes were delivered (device_push's sequence)
    delivery_id: the ledger row (delivery) it was sent for
    claim_version: the claim_version of the claim it was sent under
    device_token: the device it went to
    notification_id: the notification it carries
    collapse_id: its collapse id (the delivery's coalesce key; None: it has none)
    pushed_by: the name of the drain (or worker) that sent it
    """

    seq: int
    delivery_id: int
    claim_version: int
    device_token: str
    notification_id: int
    collapse_id: str | None
    pushed_by: str


def read_pushes(lab: Lab) -> list[Push]:
    """Every push the push service delivered (``device_push``), in the order it delivered them."""
    return [Push(*r) for r in lab.execute(_lab_sql("read_pushes"))]


@dataclass
class Banner:
    """One notification on a phone's screen."""
    notification_id: int
    collapse_id: str | None
    pushes: int = 1                 # delivered pushes it stands for (> 1: later ones replaced it)


class Device:
    """A phone, as its user sees the pushes delivered to it.

    Pushes are shown in the order they arrive.  A push with a collapse id replaces the banner
    already on screen with the same collapse id (the user sees one, the latest); a push
    without a collapse id is one more banner.  ``dedup_on`` names a field of the push (say
    ``"delivery_id"``) that a receiver checks: a push whose key it has seen before is dropped
    and never shown -- an idempotency key checked downstream.

    A push is a :class:`Push` (a row of :func:`read_pushes`), a mapping with ``device_token``,
    ``notification_id`` and ``collapse_id``, or a tuple in that order.

    ``Device(token).show(pushes)`` delivers ``pushes`` (those for other tokens are ignored)
    and returns the banners on screen; ``Device.screens(pushes)`` builds one Device per token;
    ``Device.count(pushes)`` sums what every phone shows.
    """

    def __init__(self, token: str | None = None, *, dedup_on: str | None = None):
        self.token = token
        self.dedup_on = dedup_on
        self.banners: list[Banner] = []
        self.received = 0
        self.replaced = 0           # pushes folded into a banner already shown (same collapse id)
        self.dropped = 0            # pushes dropped on a key seen before (dedup_on)
        self._seen: set = set()

    @staticmethod
    def _push(push: Any) -> dict:
        if isinstance(push, Push):
            return push.as_dict()
        if isinstance(push, Mapping):
            return dict(push)
        if isinstance(push, (tuple, list)) and len(push) >= 3:
            return dict(zip(("device_token", "notification_id", "collapse_id", "delivery_id"), push))
        raise LabkitError(f"{push!r} is not a push.",
                          "pass rows of drain.read_pushes(lab), or (device_token, notification_id, "
                          "collapse_id) tuples.")

    def receive(self, push: Any) -> None:
        """One push arrives (one addressed to another token is ignored)."""
        p = self._push(push)
        if self.token is not None and p.get("device_token") != self.token:
            return
        self.received += 1
        if self.dedup_on is not None:
            if self.dedup_on not in p:
                raise LabkitError(f"A push has no {self.dedup_on!r} to deduplicate on.",
                                  f"pass pushes that carry {self.dedup_on!r} (drain.read_pushes does), "
                                  "or dedup_on=None.")
            key = p[self.dedup_on]
            if key in self._seen:
                self.dropped += 1
                return
            self._seen.add(key)
        cid = p.get("collapse_id")
        if cid is not None:
            for b in self.banners:
                if b.collapse_id == cid:
                    b.notification_id = p["notification_id"]
                    b.pushes += 1
                    self.replaced += 1
                    return
        self.banners.append(Banner(p["notification_id"], cid))

    def show(self, pushes: Iterable[Any]) -> list[Banner]:
        """Deliver ``pushes`` in order; the banners on screen afterwards."""
        for push in pushes:
            self.receive(push)
        return list(self.banners)

    @property
    def visible_duplicates(self) -> int:
        """Banners beyond one per notification: what the user sees twice."""
        return len(self.banners) - len({b.notification_id for b in self.banners})

    @classmethod
    def screens(cls, pushes: Iterable[Any], **kw: Any) -> dict[str | None, Device]:
        """One Device per token, every push delivered to its own (a mapping without a
        ``device_token``: the device under None)."""
        out: dict[str | None, Device] = {}
        for push in pushes:
            p = cls._push(push)
            tok = p.get("device_token")
            if tok not in out:
                out[tok] = cls(tok, **kw)
            out[tok].receive(p)
        return out

    @classmethod
    def count(cls, pushes: Iterable[Any], **kw: Any) -> PhoneCounts:
        """What all the phones show: pushes received, banners on screen, notifications,
        duplicates the users see, duplicates hidden (replaced by a collapse id) and dropped."""
        pushes = list(pushes)
        phones = cls.screens(pushes, **kw).values()
        banners = sum(len(d.banners) for d in phones)
        notes = sum(len({b.notification_id for b in d.banners}) for d in phones)
        received = sum(d.received for d in phones)
        distinct = len({(cls._push(p).get("device_token"), cls._push(p)["notification_id"]) for p in pushes})
        return PhoneCounts(pushes=received, banners=banners, notifications=notes,
                           duplicate_pushes=received - distinct,
                           visible_duplicates=banners - notes,
                           hidden_by_collapse_id=sum(d.replaced for d in phones),
                           dropped_by_key=sum(d.dropped for d in phones))


@dataclass(frozen=True)
class PhoneCounts(Result):
    """What all the phones show of the pushes delivered to them (:meth:`Device.count`).

    pushes: pushes the phones received
    banners: banners on their screens afterwards
    notifications: distinct notifications among those banners
    duplicate_pushes: pushes beyond one per (device, notification)
    visible_duplicates: banners beyond one per notification: what the users see twice
    hidden_by_collapse_id: pushes that replaced a banner with the same collapse id
    dropped_by_key: pushes a receiver dropped on a key it had seen before (``dedup_on``)
    """

    pushes: int
    banners: int
    notifications: int
    duplicate_pushes: int
    visible_duplicates: int
    hidden_by_collapse_id: int
    dropped_by_key: int


# -- the drain ---------------------------------------------------------------------------


@dataclass
class TickResult:
    claimed: list[Claimed]
    outcomes: dict[int, Outcome]
    lost: list[int]             # rows whose fenced write matched nothing: lease lost


class Drain:
    """One drain: claim a batch (lease granted in the claim), send, record the outcomes.

    ``fence=False`` is the drain without a fence (outcome written by id only);
    notebook 08 adds the fence. ``form`` picks the claim's shape: ``"in"`` (the drain's
    ``WHERE id IN (subselect)``) or ``"cte"`` (the form most queue libraries use)."""

    def __init__(self, conn: psycopg.Connection, sender: PushSender, *, name: str = "drain",
                 batch: int = 50, lease_s: float = LEASE_S, fence: bool = False,
                 max_attempts: int = MAX_ATTEMPTS, form: str = "in"):
        check_params(batch=batch, lease_s=lease_s, max_attempts=max_attempts)
        if form not in ("in", "cte"):
            raise LabkitError(f"Unknown claim form {form!r}.", "use form='in' or form='cte'.")
        self.conn, self.sender, self.name = conn, sender, name
        self.batch, self.lease_s, self.fence, self.max_attempts = batch, lease_s, fence, max_attempts
        self.claim_sql = read_sql("drain_claim.sql" if form == "in" else "drain_claim_cte.sql")
        self.complete_sql = read_sql("drain_complete_fenced.sql" if fence else "drain_complete.sql")

    def claim(self) -> list[Claimed]:
        rows = self.conn.execute(self.claim_sql, {"batch": self.batch, "lease_s": self.lease_s,
                                                  "max_attempts": self.max_attempts}).fetchall()
        return sorted((Claimed(*r) for r in rows), key=lambda c: c.id)

    def complete(self, row: Claimed, outcome: Outcome) -> int:
        """Write one outcome; the number of rows it matched (0: the lease was lost)."""
        cur = self.conn.execute(self.complete_sql, {
            "id": row.id, "claim_version": row.claim_version, "outcome": outcome.outcome,
            "error": outcome.error, "max_attempts": self.max_attempts})
        return cur.rowcount

    def complete_all(self, outcomes: list[tuple[Claimed, Outcome]]) -> list[int]:
        """All of a batch's outcomes in one short transaction; the ids whose lease was lost."""
        lost = []
        with self.conn.transaction():
            for row, out in outcomes:
                if self.complete(row, out) == 0:
                    lost.append(row.id)
        return lost

    def tick(self, on_sent: Callable[[int, Claimed, Outcome], Any] | None = None) -> TickResult:
        """Claim, send, record.  A suspect (see drain_claim.sql) is sent last, once the rest
        of the batch is recorded: if it kills the drain, it takes no other row with it."""
        claimed = self.claim()
        done: list[tuple[Claimed, Outcome]] = []
        outcomes: dict[int, Outcome] = {}
        lost: list[int] = []
        for i, row in enumerate(send_order(claimed), 1):
            if row.suspect and done:
                lost += self.complete_all(done)
                done = []
            out = self.sender.send(row, by=self.name)
            done.append((row, out))
            outcomes[row.id] = out
            if on_sent:
                on_sent(i, row, out)
        lost += self.complete_all(done)
        return TickResult(claimed, outcomes, lost)


def send_order(claimed: list[Claimed]) -> list[Claimed]:
    """The batch in the order the drain sends it: by id, a suspect last."""
    return sorted(claimed, key=lambda c: (c.suspect, c.id))


MAX_BATCH = 10_000
MAX_LEASE_S = 7 * 86_400       # a week
MAX_ATTEMPTS_CAP = 1_000
MAX_OTHER = 1_000_000          # counts (ticks, rows...) and seconds of the other parameters


def check_params(*, batch: int = 1, lease_s: float = 1, max_attempts: int = 1, **more: float) -> None:
    """Every parameter a finite number in its range (nan and inf included: a clear error)."""
    if isinstance(batch, (int, float)) and batch < 1:
        raise LabkitError(f"A drain batch of {batch} claims nothing.", "pass batch >= 1 (50 is typical).")
    number("batch", batch, low=1, high=MAX_BATCH, whole=True, example=50)
    if isinstance(lease_s, (int, float)) and lease_s <= 0:
        raise LabkitError(f"A lease of {lease_s} s expires before the send starts.",
                          "pass lease_s > 0 (120 s by default): longer than a send takes.")
    number("lease_s", lease_s, above=True, high=MAX_LEASE_S, unit=" s", example=LEASE_S)
    if isinstance(max_attempts, (int, float)) and max_attempts < 1:
        raise LabkitError(f"max_attempts={max_attempts} never lets a push be tried.",
                          "pass max_attempts >= 1 (5 by default).")
    number("max_attempts", max_attempts, low=1, high=MAX_ATTEMPTS_CAP, whole=True, example=MAX_ATTEMPTS)
    for name, value in more.items():
        if value is None:
            continue
        if isinstance(value, (int, float)) and value < 0:
            raise LabkitError(f"{name}={value} is negative.", f"pass {name} >= 0.")
        number(name, value, high=MAX_OTHER, example=1)


def drain_connection(dsn: str, schema: str, role: str, *,
                     guards: Guards = WORKER_GUARDS) -> psycopg.Connection:
    """The connection of a drain in a process of its own (it has no Lab object): autocommit,
    with the search_path and the name ``lab.connect(role=...)`` gives, and ``guards``."""
    return open_connection(dsn, schema=schema, role=role, guards=guards)


def make_drain(lab: Lab, name: str, **kw: Any) -> Drain:
    """An in-kernel drain with its own connections (sender included) into ``lab``."""
    sender_kw = {k: kw.pop(k) for k in ("latency_s", "speed", "flaky_failures") if k in kw}
    conn = lab.connect(role=name.replace(" ", "_"))
    sender = PushSender(lab.connect(role=name.replace(" ", "_") + "_apns"), name=name, **sender_kw)
    return Drain(conn, sender, name=name, **kw)


def close_drain(drain: Drain) -> None:
    """Close both of ``drain``'s connections (its own and its sender's)."""
    for conn in (drain.conn, drain.sender.conn):
        if not conn.closed:
            conn.close()


# -- a drain in its own OS process (for the crash) --------------------------------------------


def _process_connections(ctx: Context, dsn: str, schema: str, *, guards: Guards = WORKER_GUARDS,
                         **sender_kw: Any) -> tuple[psycopg.Connection, PushSender]:
    """A drain process's connection (with ``guards``) and its push sender, on a connection of
    its own (``<name>_apns``), as :func:`make_drain` gives a drain in the kernel."""
    role = ctx.name.replace(" ", "_")
    conn = drain_connection(dsn, schema, role, guards=guards)
    return conn, PushSender(drain_connection(dsn, schema, role + "_apns"), name=ctx.name, **sender_kw)


def drain_worker(ctx: Context, dsn: str, schema: str, batch: int, lease_s: float, fence: bool = False,
                 pause_after_claim: bool = True, pause_after_sends: int | None = None,
                 max_attempts: int = MAX_ATTEMPTS) -> dict:
    """Child process: one tick of the drain, with scripted pauses the parent may kill (or
    freeze) it at.  A poison row kills it for real."""
    conn, sender = _process_connections(ctx, dsn, schema, die_on_poison=True)
    drain = Drain(conn, sender, name=ctx.name, batch=batch, lease_s=lease_s, fence=fence,
                  max_attempts=max_attempts)
    ctx.emit("connected", pid=conn.info.backend_pid, sender_pid=sender.conn.info.backend_pid)
    claimed = drain.claim()
    ctx.emit("claimed", ids=[c.id for c in claimed])
    if pause_after_claim:
        ctx.pause("claimed")
    done: list[tuple[Claimed, Outcome]] = []
    lost: list[int] = []
    for i, row in enumerate(send_order(claimed), 1):
        if row.suspect and done:
            lost += drain.complete_all(done)
            done = []
        ctx.emit("sending", id=row.id)
        out = sender.send(row, by=ctx.name)
        done.append((row, out))
        ctx.emit("sent", id=row.id, outcome=out.outcome)
        if pause_after_sends is not None and i == pause_after_sends:
            ctx.pause(f"sent-{i}")
    lost += drain.complete_all(done)
    return {"claimed": len(claimed), "lost": lost}


# -- trace 1: the drain crashes mid-send -----------------------------------------------------


def _statuses(lab: Lab) -> dict[str, int]:
    counts = dict(lab.execute(STATUS_COUNTS))
    return {s: counts.get(s, 0) for s in ("pending", "sent", "failed")}


def _pushes(lab: Lab) -> dict[str, int]:
    pushes, dups = lab.execute(_lab_sql("push_counts"))[0]
    return {"pushes": int(pushes), "duplicate_pushes": int(dups)}


def locked_among(lab: Lab, ids: list[int]) -> int:
    """How many of the deliveries ``ids`` some other session holds a row lock on right now.

    A probe session of its own (``labkit:<schema>:probe``) locks the free ones with
    ``FOR UPDATE SKIP LOCKED``, counts the ones it had to skip, and rolls back at once, so
    that the probe itself leaves no lock behind (``drain_lab.sql``, ``locked_among``).  A
    lease claim has committed before the sends: ``locked_among(lab, claimed_ids)`` is 0."""
    with lab.connect(role="probe") as conn:
        with conn.transaction(force_rollback=True):
            return int(one_row(conn.execute(_lab_sql("locked_among"), {"ids": ids, "n": len(ids)}),
                               "drain_lab.sql's locked_among")[0])


def _wait_backend_gone(lab: Lab, pid: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while lab.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)):
        if time.monotonic() > deadline:
            raise LabkitError(f"The server still shows the killed drain's session after {timeout:.0f} s.",
                              "run `labkit doctor`; the server may be overloaded.")
        time.sleep(0.02)


def crash_trace(lab: Lab, *, batch: int = 50, crash_after: int = 12, lease_s: float = LEASE_S,
                warmup: int = 10, others: int = 10) -> Trace:
    """A drain (a real process) claims ``batch`` rows with leases, sends ``crash_after`` pushes
    and is SIGKILLed; a second drain carries on; the leases run out; the rows come back.  The
    steps that push record ``pushes`` (every push so far) beside the ledger's counts."""

    check_params(batch=batch, lease_s=lease_s, warmup=warmup, others=others)
    if lease_s < 2:
        raise LabkitError(f"A lease of {lease_s} s leaves no room for the trace's 'one second "
                          "before the lease ends' step.", "pass lease_s >= 2 (120 s by default).")
    if not 0 <= crash_after <= batch:
        raise LabkitError(f"crash_after={crash_after} is outside the batch of {batch}.",
                          "pass 0 <= crash_after <= batch.")
    bad = tuple(i for i in (3, 7) if i <= warmup)
    clock = create_ledger(lab, warmup + batch + others, bad=bad)
    tr = Trace(f"Drain crash mid-send: {batch} leased rows, killed after {crash_after} pushes")
    crashed_ids = list(range(warmup + 1, warmup + batch + 1))

    # 0. an earlier tick: some rows reach terminal states before the crash
    if warmup:
        first = make_drain(lab, "drain 0", batch=warmup, lease_s=lease_s)
        try:
            res = first.tick()
        finally:
            close_drain(first)
    terminal_before = dict(lab.execute(
        "SELECT id, claim_version FROM delivery WHERE status IN ('sent', 'failed')"))
    if warmup:
        tr.add("drain 0", f"tick: claim {len(res.claimed)}, send, record outcomes",
               "an earlier tick finished normally: these rows are terminal now (sent or failed)",
               {**_statuses(lab), "pushes": _pushes(lab)["pushes"], "at": "T"})

    w = Worker(drain_worker, name="drain 1", dsn=lab.db.dsn, schema=lab.schema, batch=batch,
               lease_s=lease_s, pause_after_sends=crash_after if crash_after else None)
    try:
        w.start()
        pid = w.wait_for("connected", timeout=60)["pid"]
        got = w.wait_for("claimed", timeout=60)["ids"]
        w.wait_for("paused", tag="claimed", timeout=60)
        lease_until = lab.execute("SELECT max(next_attempt_at) FROM delivery WHERE id = ANY(%s)", (got,))[0][0]
        tr.add("drain 1", f"claim {len(got)} rows: one UPDATE grants {lease_s:.0f} s leases, then commits",
               "attempts + 1, next_attempt_at = now + lease, claim_version + 1; the statement has "
               "committed, so no row lock is held while the pushes go out",
               {"claimed": len(got), "ids": f"{min(got)}..{max(got)}" if got else "-",
                "lease_until": clock.rel(lease_until), "rows_locked": locked_among(lab, got)})
        if crash_after:
            w.resume()
            w.wait_for("paused", tag=f"sent-{crash_after}", timeout=60)
            tr.add("drain 1", f"send {crash_after} pushes (APNs, ~{LATENCY_S:.0f} s each)",
                   "the devices have them; the ledger does not know yet: outcomes are written "
                   "after the batch", {"pushes_by_drain_1": lab.execute(
                       "SELECT count(*) FROM device_push WHERE pushed_by = 'drain 1'")[0][0],
                       **_statuses(lab), "pushes": _pushes(lab)["pushes"]})
        w.kill()
    finally:
        w.kill()
    _wait_backend_gone(lab, pid)
    sent_before = lab.execute("SELECT count(DISTINCT delivery_id) FROM device_push "
                              "WHERE delivery_id = ANY(%s)", (crashed_ids,))[0][0]
    claimed_rows = lab.execute(_lab_sql("still_leased"), {"ids": crashed_ids})[0][0]
    locks_after = locked_among(lab, crashed_ids)
    tr.add("drain 1", "SIGKILL (the process dies mid-batch)",
           "nothing marked the sent rows: they still read claimed, lease in the future; the "
           "server saw the connection die, and no lock is left behind",
           {"claimed_unmarked": claimed_rows, "pushed_but_unmarked": sent_before,
            "rows_locked": locks_after, "due_now": lab.execute(DUE_COUNT)[0][0]}, kind="crash")

    # 2. a second drain is not blocked by anything
    second = make_drain(lab, "drain 2", batch=batch, lease_s=lease_s)
    try:
        res2 = second.tick()
        ids2 = [c.id for c in res2.claimed]
        tr.add("drain 2", f"claim at once: {len(ids2)} other rows; send; record outcomes",
               "the crashed batch is not due (its leases run) and nothing is locked, so the "
               "second drain takes the remaining due rows without waiting",
               {"claimed": len(ids2), "from_crashed_batch": len(set(ids2) & set(crashed_ids)),
                **_statuses(lab), "pushes": _pushes(lab)["pushes"]})

        clock.advance(lease_s - 1)
        early = second.claim()
        tr.add("drain 2", f"clock +{lease_s - 1:.0f} s; claim again",
               "one second before the leases end, the crashed rows are still not due",
               {"at": f"T+{clock.elapsed():.0f} s", "claimed": len(early)})
        clock.advance(1)
        due = lab.execute(DUE_COUNT)[0][0]
        tr.add("clock", "+1 s: the leases run out", "the lease is a timestamp, so expiry needs "
               "no reaper: the rows simply become due again", {"at": f"T+{clock.elapsed():.0f} s",
                                                               "due_now": due})
        res3 = second.tick()
        ids3 = [c.id for c in res3.claimed]
        reclaimed = lab.execute("SELECT count(*) FROM delivery WHERE id = ANY(%s) AND claim_version = 2",
                                (crashed_ids,))[0][0]
        tr.add("drain 2", f"re-claim {len(ids3)} rows; send all; record outcomes",
               "attempt 2 for every row of the crashed batch: the ones pushed before the crash "
               "are pushed a second time", {"claimed": len(ids3), "attempts": sorted(
                   {c.attempts for c in res3.claimed}), **_statuses(lab), "pushes": _pushes(lab)["pushes"]})
    finally:
        close_drain(second)

    terminal_reclaimed = sum(
        1 for i, v in lab.execute("SELECT id, claim_version FROM delivery WHERE id = ANY(%s)",
                                  (list(terminal_before),))
        if v != terminal_before[i])
    pushes = Device.count(read_pushes(lab))
    tr.add("devices", "count what each device received (the sender's record)",
           "delivered to model phones (drain.Device): a push with the same collapse id replaces "
           "the banner on screen; one without a collapse id is a second banner",
           {"duplicate_pushes": pushes.duplicate_pushes,
            "hidden_by_collapse_id": pushes.hidden_by_collapse_id,
            "visible_duplicates": pushes.visible_duplicates,
            "terminal_rows_reclaimed": terminal_reclaimed}, kind="check")
    tr.summary = {
        "claimed": len(got),
        "sent_before_crash": int(sent_before),
        "locks_held_after_crash": locks_after,
        "claimed_by_second_drain_at_once": len(ids2),
        "due_before_lease_end": len(early),
        "reclaimed_after_lease": int(reclaimed),
        "duplicate_pushes": pushes.duplicate_pushes,
        "visible_duplicates": pushes.visible_duplicates,
        "terminal_rows_reclaimed": terminal_reclaimed,
    }
    return tr


# -- trace: a poison row, through its attempts to its dead letter ---------------------------------


def _one_tick(lab: Lab, name: str, *, batch: int, lease_s: float, fence: bool = False,
              max_attempts: int = MAX_ATTEMPTS, timeout: float = 60) -> dict:
    """One drain tick in a process of its own; what it claimed and pushed, and how it ended."""

    w = Worker(drain_worker, name=name, dsn=lab.db.dsn, schema=lab.schema, batch=batch,
               lease_s=lease_s, fence=fence, pause_after_claim=False, max_attempts=max_attempts)
    try:
        w.start()
        code = w.wait_exit(timeout)
    finally:
        w.kill()
    failed = [e for e in w.events if e["kind"] == "failed"]
    if failed:
        raise LabkitError(f"The drain process {name!r} failed: {failed[-1]['error']}",
                          "read the error; run `labkit doctor` if the server is in doubt.")
    claimed: list[int] = next((e["ids"] for e in w.events if e["kind"] == "claimed"), [])
    return {"claimed": claimed, "sent": [e["id"] for e in w.events if e["kind"] == "sent"],
            "sending": [e["id"] for e in w.events if e["kind"] == "sending"],
            "exitcode": code, "killed": code == -signal.SIGKILL}


def poison_trace(lab: Lab, *, rows: int = 3, poison: int = 3, batch: int = 3, lease_s: float = LEASE_S,
                 max_attempts: int = MAX_ATTEMPTS) -> Trace:
    """A poison row (its send kills the drain process: a real SIGKILL, every time) goes
    through its attempts to the dead letter.  Each tick is a new drain process, as a
    supervisor restarts a drain that died; the clock moves on one lease between ticks."""
    check_params(batch=batch, lease_s=lease_s, max_attempts=max_attempts, rows=rows)
    if not 1 <= poison <= rows:
        raise LabkitError(f"The poison row {poison} is not among the {rows} rows.",
                          "pass 1 <= poison <= rows.")
    clock = create_ledger(lab, rows, poison=(poison,))
    tr = Trace(f"A poison row: delivery {poison} kills the drain that sends it "
               f"(max_attempts {max_attempts}, lease {lease_s:.0f} s)")
    ticks = crashes = 0
    while lab.execute("SELECT status FROM delivery WHERE id = %s", (poison,))[0][0] == "pending":
        ticks += 1
        if ticks > 4 * max_attempts + rows + 2:
            raise LabkitError("The poison row was still pending after many ticks.",
                              "run `labkit doctor`; the claim may not dead-letter (drain_claim.sql).")
        t = _one_tick(lab, f"drain {ticks}", batch=batch, lease_s=lease_s, max_attempts=max_attempts)
        crashes += t["killed"]
        st, att, outs, never, err = lab.execute(_lab_sql("poison_row"), {"id": poison})[0]
        state = {"claimed": t["claimed"] or "-", "pushed": t["sent"] or "-",
                 f"row {poison}": f"{st}, attempts {att}, outcomes {outs}",
                 "suspects": lab.execute(_lab_sql("suspects"))[0][0],
                 "sent": lab.execute("SELECT count(*) FROM delivery WHERE status = 'sent'")[0][0]}
        if t["killed"]:
            tr.add(f"drain {ticks}", f"claim {len(t['claimed'])}; push {t['sent'] or 'nothing'}; "
                   f"send row {poison}: the process dies (SIGKILL)",
                   "no outcome is written for anything in the batch; the attempts stay counted",
                   state, kind="crash")
        elif poison in t["claimed"] or st != "pending":
            tr.add(f"drain {ticks}", "claim: the row's attempts are used up, so the claim dead-letters it",
                   f"last_error: {err}", state, kind="check")
        else:
            tr.add(f"drain {ticks}", f"claim {len(t['claimed'])}; push and record {t['sent']}",
                   "a suspect goes alone among suspects, and last: the rows sent before it are "
                   "recorded first" if any(t["claimed"]) else "nothing due", state)
        clock.advance(lease_s)
    final = dict(zip(("status", "attempts", "outcomes", "never_reported", "last_error"),
                     lab.execute(_lab_sql("poison_row"), {"id": poison})[0]))
    others = lab.execute("SELECT count(*) FILTER (WHERE status = 'sent'), count(*) FROM delivery "
                         "WHERE id <> %s", (poison,))[0]
    shown = Device.count(read_pushes(lab))
    tr.summary = {"poison_status": final["status"], "poison_attempts": final["attempts"],
                  "poison_outcomes": final["outcomes"], "poison_last_error": final["last_error"],
                  "crashes": crashes, "drain_processes": ticks,
                  "others_sent": int(others[0]), "others": int(others[1]),
                  "pushes": shown.pushes, "duplicate_pushes": shown.duplicate_pushes,
                  "poison_pushed": lab.execute("SELECT count(*) FROM device_push WHERE delivery_id = %s",
                                               (poison,))[0][0]}
    return tr


# -- rows that crashed their drain: the histories of notebook 07's exercise 4 ---------------------


OLD_CRASHED_TWICE = _lab_sql("crashed_twice_guess")     # attempts >= 2 AND last_error IS NULL: wrong


def _kill_after_claim(lab: Lab, name: str, *, batch: int, lease_s: float = LEASE_S) -> list[int]:
    """A drain process claims ``batch`` rows and is SIGKILLed before it sends anything."""

    w = Worker(drain_worker, name=name, dsn=lab.db.dsn, schema=lab.schema, batch=batch,
               lease_s=lease_s)
    try:
        w.start()
        pid = w.wait_for("connected", timeout=60)["pid"]
        ids = w.wait_for("claimed", timeout=60)["ids"]
        w.wait_for("paused", tag="claimed", timeout=60)
    finally:
        w.kill()
    _wait_backend_gone(lab, pid)
    return ids


def crash_histories(lab: Lab) -> dict[int, int]:
    """Three deliveries with the histories that tell a right "crashed at least twice" query
    from a wrong one, made by real drain processes killed after their claims:

    * row 1 fails transiently (an outcome is written), then its drain is killed twice;
    * row 2's drain is killed twice;
    * row 3's drain is killed once, and a live drain holds its second attempt right now.

    Returns how many times a drain holding each row was killed (the processes' own record)."""
    clock = create_ledger(lab, 3, flaky=(1,))
    kills = {1: 0, 2: 0, 3: 0}
    live = make_drain(lab, "drain", batch=1)
    try:
        live.tick()                                           # row 1: ServiceUnavailable, +10 s
        clock.advance(10)
        for i in _kill_after_claim(lab, "drain k1", batch=3):  # rows 1, 2, 3
            kills[i] += 1
        clock.advance(LEASE_S)
        for i in _kill_after_claim(lab, "drain k2", batch=2):  # rows 1, 2
            kills[i] += 1
        live.lease_s = 600
        live.claim()                                          # row 3: attempt 2, still running
        clock.advance(LEASE_S)                                # k2's leases are over
    finally:
        close_drain(live)
    return kills


# -- trace: a drain frozen, not killed -----------------------------------------------------------


def _wait_stopped(pid: int, timeout: float = 5) -> str:
    """Wait until our child ``pid`` is stopped (SIGSTOP is delivered a moment after it is
    sent): "stopped", or "running" if it is not after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            got, status = os.waitpid(pid, os.WUNTRACED | os.WNOHANG)
        except ChildProcessError:
            return "gone"
        if got == pid and os.WIFSTOPPED(status):
            return "stopped"
        if time.monotonic() > deadline:
            return "running"
        time.sleep(0.005)


LOCKS_OF = "SELECT count(*) FROM pg_locks WHERE pid = ANY(%s)"


def _sessions_state(lab: Lab, pids: list[int]) -> str:
    """The states of backends ``pids`` as pg_stat_activity shows them ("gone": none left)."""
    return lab.execute(_lab_sql("sessions_state"), {"pids": pids})[0][0]


def freeze_trace(lab: Lab, *, batch: int = 50, freeze_after: int = 12, lease_s: float = 5.0,
                 fence: bool = True, others: int = 10) -> Trace:
    """A drain (a real process) claims ``batch`` rows with a ``lease_s`` lease, sends
    ``freeze_after`` pushes and is frozen with SIGSTOP -- a paused VM, a stalled host, a
    long GC pause: the process is alive and its connections stay open.  What the server
    sees while it is frozen; who may take its rows and when; what it does when it wakes.
    The lab's clock is frozen, so the trace reproduces exactly."""

    check_params(batch=batch, lease_s=lease_s, others=others)
    if lease_s < 2:
        raise LabkitError(f"A lease of {lease_s} s leaves no room for the trace's 'one second "
                          "before the lease ends' step.", "pass lease_s >= 2 (5 s by default).")
    if not 1 <= freeze_after < batch:
        raise LabkitError(f"freeze_after={freeze_after} must leave unsent rows in the batch of {batch}.",
                          "pass 1 <= freeze_after < batch (12 of 50 by default).")
    clock = create_ledger(lab, batch + others)
    tr = Trace(f"Drain frozen mid-send (SIGSTOP): {batch} rows leased for {lease_s:g} s, "
               f"frozen after {freeze_after} pushes, {'fenced' if fence else 'NOT fenced'}")
    batch_ids = list(range(1, batch + 1))
    w = Worker(drain_worker, name="drain 1", dsn=lab.db.dsn, schema=lab.schema, batch=batch,
               lease_s=lease_s, fence=fence, pause_after_claim=False, pause_after_sends=freeze_after)
    second = make_drain(lab, "drain 2", batch=batch, lease_s=lease_s, fence=fence)
    try:
        w.start()
        ev = w.wait_for("connected", timeout=60)
        pids = [ev["pid"], ev["sender_pid"]]
        got = w.wait_for("claimed", timeout=60)["ids"]
        w.wait_for("paused", tag=f"sent-{freeze_after}", timeout=60)
        os.kill(started_pid(w), signal.SIGSTOP)
        w.resume()                      # queued: it goes on only once it is woken up
        proc_state = _wait_stopped(started_pid(w))
        frozen_at = clock.now()
        lease_until = lab.execute("SELECT max(next_attempt_at) FROM delivery WHERE id = ANY(%s)",
                                  (got,))[0][0]
        locks = int(lab.execute(LOCKS_OF, (pids,))[0][0])
        rows_locked = locked_among(lab, got)
        sessions = _sessions_state(lab, pids)
        tr.add("drain 1", f"claim {len(got)} rows ({lease_s:g} s leases), push {freeze_after}, "
               "then SIGSTOP: frozen mid-batch", "the process is alive and its connections are "
               "open; it sends nothing. The claim committed before the sends, so its sessions are "
               "idle, not idle in a transaction: it holds no lock",
               {"process": proc_state, "sessions": sessions, "locks_held": locks,
                "rows_locked": rows_locked, "lease_until": clock.rel(lease_until)}, kind="freeze")
        res = second.tick()
        at_once = [c.id for c in res.claimed]
        tr.add("drain 2", f"claim at once: {len(at_once)} other rows",
               "nothing is locked, but the frozen batch is leased: not due",
               {"claimed": len(at_once), "from_frozen_batch": len(set(at_once) & set(batch_ids))})
        clock.advance(lease_s - 1)
        early = second.claim()
        tr.add("drain 2", f"clock +{lease_s - 1:g} s; claim again",
               "one second before the leases end, the frozen batch is still not due: nobody may "
               "send it, and nobody can free it early (the server sees a healthy idle client)",
               {"at": f"T+{clock.elapsed():g} s", "claimed": len(early)})
        clock.advance(1)
        res = second.tick()
        taken = [c.id for c in res.claimed]
        # lab seconds from the freeze until another drain could claim the frozen batch
        released_after = (lease_until - frozen_at).total_seconds() if set(batch_ids) <= set(taken) else None
        tr.add("drain 2", f"clock +1 s: the leases end; re-claim {len(taken)} rows, push, record",
               "drain 1 is still frozen: the lease, not the server, decided its rows were free",
               {"at": f"T+{clock.elapsed():g} s", "claimed": len(taken),
                "from_frozen_batch": len(set(taken) & set(batch_ids)), **_statuses(lab)})
        pushes_before_wake = lab.execute("SELECT count(*) FROM device_push WHERE pushed_by = 'drain 1'")[0][0]
        os.kill(started_pid(w), signal.SIGCONT)
        done = w.join(60)
        lost = (done or {}).get("result", {}).get("lost", [])
        after_wake = lab.execute("SELECT count(*) FROM device_push WHERE pushed_by = 'drain 1'")[0][0] \
            - pushes_before_wake
        landed = len(got) - len(lost)
        tr.add("drain 1", f"SIGCONT: wakes up, pushes its other {after_wake} rows, writes "
               f"{len(got)} outcomes", ("the fence rejects every late write (0 rows matched): it "
               "learns it lost the lease; the pushes it made after waking are duplicates")
               if fence else "its late writes land over drain 2's: stale writes",
               {"pushes_after_wake": after_wake, "writes_landed": landed, "writes_rejected": len(lost),
                **_statuses(lab)}, kind="check" if fence else "error")
    finally:
        w.kill()            # SIGKILL ends the child even while it is stopped
        close_drain(second)
    shown = Device.count(read_pushes(lab))
    tr.add("devices", "deliver every push to a model phone (drain.Device)",
           "the rows pushed again after waking were already delivered by drain 2",
           {"duplicate_pushes": shown.duplicate_pushes,
            "hidden_by_collapse_id": shown.hidden_by_collapse_id,
            "visible_duplicates": shown.visible_duplicates})
    tr.summary = {
        "fence": fence, "lease_s": lease_s, "claimed": len(got), "frozen_after_pushes": freeze_after,
        "process_state_while_frozen": proc_state, "sessions_while_frozen": sessions,
        "locks_held_while_frozen": locks, "rows_locked_while_frozen": rows_locked,
        "claimed_by_others_before_lease_end": len(early) + len(set(at_once) & set(batch_ids)),
        "claimed_by_others_while_frozen": len(set(taken) & set(batch_ids)),
        "released_after_s": released_after, "released_by": "lease expiry",
        "duplicates_after_wake": after_wake,
        "stale_writes_after_wake": landed,         # every late write is stale: the rows were re-claimed
        "late_writes_rejected": len(lost),
        "duplicate_pushes": shown.duplicate_pushes, "visible_duplicates": shown.visible_duplicates,
    }
    return tr


def _held_claim(policy: str) -> sql.Composed:
    """The anti-pattern's claim (``drain_claim_held.sql``) with its locking clause ``policy``."""
    return sql.SQL(query("drain_claim_held.sql", "claim").sql).format(policy=sql.SQL(policy))


def _count_held_attempt(conn: psycopg.Connection, rows: list[Claimed], lease_s: float) -> None:
    """The anti-pattern's other half, in the transaction its claim opened, after the sends."""
    conn.execute(query("drain_claim_held.sql", "count_attempt").sql,
                 {"ids": [r.id for r in rows], "lease_s": lease_s})


def held_worker(ctx: Context, dsn: str, schema: str, batch: int, freeze_after: int,
                idle_timeout_s: float) -> dict:
    """Child process: the anti-pattern drain -- FOR UPDATE SKIP LOCKED inside a transaction
    held open across the sends -- with ``idle_in_transaction_session_timeout`` set on its
    session.  It pauses after ``freeze_after`` pushes (the parent freezes it there)."""
    idle = dataclasses.replace(WORKER_GUARDS, idle_in_transaction=f"{int(idle_timeout_s * 1000)}ms")
    conn, sender = _process_connections(ctx, dsn, schema, guards=idle)
    ctx.emit("connected", pid=conn.info.backend_pid, sender_pid=sender.conn.info.backend_pid)
    with conn.transaction():
        rows = [Claimed(*r) for r in conn.execute(_held_claim("FOR UPDATE SKIP LOCKED"),
                                                  {"batch": batch}).fetchall()]
        ctx.emit("claimed", ids=[r.id for r in rows])
        for i, row in enumerate(rows, 1):
            sender.send(row, by=ctx.name)
            ctx.emit("sent", id=row.id)
            if i == freeze_after:
                ctx.pause("frozen-here")
        _count_held_attempt(conn, rows, LEASE_S)
    return {"committed": len(rows)}


@dataclass(frozen=True)
class HeldFreeze(Result):
    """A drain that holds its claim in an open transaction, frozen mid-batch (SIGSTOP)
    (:func:`frozen_held_drain`), read from the server.

    claimed: rows its claim locked
    session_while_frozen: its session's state in pg_stat_activity while it was frozen
        ("idle in transaction")
    locks_held_while_frozen: of its rows, those a probe found locked while it was frozen
    claimed_by_others_before_release: rows another drain's claim got before the locks went
    released_after_s: seconds from the freeze to the lab's poll that found the locks gone
        (the lab's clock, rounded to 10 ms); None if they never went within ``wait_s``
    released_after_server_s: seconds from the session going idle in its transaction to a
        waiting session getting one of its row locks (the server's clock); None if not seen
    released_by: what ended the session ("idle_in_transaction_session_timeout", or
        "nothing yet")
    claimed_by_others_while_frozen: of its rows, those another drain claimed once the locks
        went, the drain still frozen
    wake_error: the error the woken drain got (None: none)
    duplicate_pushes: pushes beyond one per (device, notification), on every phone
    """

    claimed: int
    session_while_frozen: str
    locks_held_while_frozen: int
    claimed_by_others_before_release: int
    released_after_s: float | None
    released_after_server_s: float | None
    released_by: str
    claimed_by_others_while_frozen: int
    wake_error: str | None
    duplicate_pushes: int


def frozen_held_drain(lab: Lab, *, batch: int = 10, freeze_after: int = 3,
                      idle_timeout_s: float = 2.0, wait_s: float = 30) -> HeldFreeze:
    """The same freeze, for a drain that holds its claim in an open transaction (the
    anti-pattern of section 3): its session is *idle in transaction* and keeps its row
    locks while it is frozen.  Measured: how long until they go (``released_after_s`` by the
    lab's clock, from the freeze to the poll that found them gone; ``released_after_server_s``
    by the server's, from the session going idle in its transaction to the moment a session
    waiting for one of its row locks got it), and what ends them --
    here ``idle_in_transaction_session_timeout`` (``idle_timeout_s``, set on the frozen
    drain's session; 0, the default, would never end it)."""

    check_params(batch=batch, idle_timeout_s=idle_timeout_s, wait_s=wait_s)
    if not 1 <= freeze_after < batch:
        raise LabkitError(f"freeze_after={freeze_after} must leave unsent rows in the batch of {batch}.",
                          "pass 1 <= freeze_after < batch (3 of 10 by default).")
    if not 0 < idle_timeout_s < wait_s:
        raise LabkitError(f"idle_timeout_s={idle_timeout_s} must be above 0 and below wait_s={wait_s}.",
                          "pass idle_timeout_s=2 (seconds) and leave wait_s at 30.")
    create_ledger(lab, batch)
    w = Worker(held_worker, name="drain 1", dsn=lab.db.dsn, schema=lab.schema, batch=batch,
               freeze_after=freeze_after, idle_timeout_s=idle_timeout_s)
    second = make_drain(lab, "drain 2", batch=batch)
    try:
        w.start()
        ev = w.wait_for("connected", timeout=60)
        pid = ev["pid"]
        got = w.wait_for("claimed", timeout=60)["ids"]
        w.wait_for("paused", tag="frozen-here", timeout=60)
        os.kill(started_pid(w), signal.SIGSTOP)
        w.resume()
        t0 = time.monotonic()
        _wait_stopped(started_pid(w))
        state = _sessions_state(lab, [pid])
        idle_since = lab.execute(_lab_sql("state_since"), {"pid": pid})
        locked = locked_among(lab, got)
        others_early = len(second.claim())
        waiter, granted = lab.when_lock_granted(_lab_sql("lock_granted_at"), {"id": got[0]}, wait_s + 30)
        while locked_among(lab, got) and time.monotonic() - t0 < wait_s:
            time.sleep(0.02)
        released_after = time.monotonic() - t0
        still = locked_among(lab, got)
        if not still:
            waiter.join(wait_s + 30)
        on_server = (round((granted[0] - idle_since[0][0]).total_seconds(), 3)
                     if granted and idle_since and idle_since[0][0] is not None else None)
        gone = not lab.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,))
        taken = [c.id for c in second.tick().claimed] if not still else []
        os.kill(started_pid(w), signal.SIGCONT)
        w.wait_exit(60)
        failed = [e["error"] for e in w.events if e["kind"] == "failed"]
    finally:
        w.kill()            # SIGKILL ends the child even while it is stopped
        close_drain(second)
    shown = Device.count(read_pushes(lab))
    return HeldFreeze(claimed=len(got), session_while_frozen=state, locks_held_while_frozen=locked,
                      claimed_by_others_before_release=others_early,
                      released_after_s=round(released_after, 2) if not still else None,
                      released_after_server_s=on_server,
                      released_by=("idle_in_transaction_session_timeout" if gone and not still
                                   else "nothing yet"),
                      claimed_by_others_while_frozen=len(set(taken) & set(got)),
                      wake_error=failed[-1] if failed else None,
                      duplicate_pushes=shown.duplicate_pushes)


@dataclass(frozen=True)
class DrainFreeze(Result):
    """A lease drain frozen mid-send (SIGSTOP) (:func:`freeze_summary`): the trace's summary,
    on the lab's frozen clock.

    fence: whether the drain's outcome writes were fenced by claim_version
    lease_s: the lease its claim granted, in lab seconds
    claimed: rows its claim leased
    frozen_after_pushes: pushes it sent before it was frozen
    process_state_while_frozen: its process's state while frozen ("stopped")
    sessions_while_frozen: its sessions' state in pg_stat_activity while frozen ("idle")
    locks_held_while_frozen: locks its sessions held in pg_locks while frozen
    rows_locked_while_frozen: of its rows, those a probe found locked while it was frozen
    claimed_by_others_before_lease_end: of its rows, those another drain claimed before the
        leases ended
    claimed_by_others_while_frozen: of its rows, those another drain claimed once the leases
        ended, the drain still frozen
    released_after_s: lab seconds from the freeze until another drain could claim the whole
        batch (the lease's end); None if it could not
    released_by: what freed its rows ("lease expiry")
    duplicates_after_wake: pushes the woken drain sent for rows already re-claimed
    stale_writes_after_wake: the woken drain's late outcome writes that landed
    late_writes_rejected: the woken drain's late outcome writes the fence rejected (0 rows matched)
    duplicate_pushes: pushes beyond one per (device, notification), on every phone
    visible_duplicates: banners the users see twice
    """

    fence: bool
    lease_s: float
    claimed: int
    frozen_after_pushes: int
    process_state_while_frozen: str
    sessions_while_frozen: str
    locks_held_while_frozen: int
    rows_locked_while_frozen: int
    claimed_by_others_before_lease_end: int
    claimed_by_others_while_frozen: int
    released_after_s: float | None
    released_by: str
    duplicates_after_wake: int
    stale_writes_after_wake: int
    late_writes_rejected: int
    duplicate_pushes: int
    visible_duplicates: int


def freeze_summary(lab: Lab, batch: int = 50, freeze_after: int = 12, *, lease_s: float = 5.0,
                   fence: bool = True, others: int = 10) -> DrainFreeze:
    """:func:`freeze_trace`'s summary: ``locks_held_while_frozen``,
    ``claimed_by_others_while_frozen``, ``released_after_s``, ``released_by``,
    ``duplicates_after_wake``, ``stale_writes_after_wake`` (late writes that landed) and more."""
    return DrainFreeze(**freeze_trace(lab, batch=batch, freeze_after=freeze_after, lease_s=lease_s,
                                      fence=fence, others=others).summary)


# -- trace 2: the anti-pattern, measured -------------------------------------------------------


MODES = {
    "lease": "lease: claim commits, sends outside any transaction",
    "held, SKIP LOCKED": "FOR UPDATE SKIP LOCKED held across the sends",
    "held, FOR UPDATE": "FOR UPDATE (wait) held across the sends",
}


def bench_worker(ctx: Context, dsn: str, schema: str, batch: int, lease_s: float, latency_s: float,
                 speed: float) -> dict:
    """Child process: runs the drain in whichever mode the parent resumes it with, until
    nothing is due; reports its send intervals and the time it spent inside a transaction."""
    conn, sender = _process_connections(ctx, dsn, schema, latency_s=latency_s, speed=speed)
    drain = Drain(conn, sender, name=ctx.name, batch=batch, lease_s=lease_s)
    held = {p: _held_claim(p) for p in ("FOR UPDATE", "FOR UPDATE SKIP LOCKED")}
    runs = 0
    while True:
        mode = ctx.pause("ready")
        if mode is None:
            return {"runs": runs}
        runs += 1
        sends, in_tx, claims, empty = [], 0.0, 0, 0
        while True:
            if mode == "lease":
                t = time.monotonic()
                rows = drain.claim()
                in_tx += time.monotonic() - t
                for row in rows:
                    s = time.monotonic()
                    sender.send(row, by=ctx.name)
                    sends.append((s, time.monotonic(), row.id))
                done = [(r, Outcome("sent")) for r in rows]
                t = time.monotonic()
                drain.complete_all(done)
                in_tx += time.monotonic() - t
            else:
                policy = "FOR UPDATE" if mode == "held, FOR UPDATE" else "FOR UPDATE SKIP LOCKED"
                t = time.monotonic()
                with conn.transaction():
                    rows = [Claimed(*r) for r in conn.execute(
                        held[policy], {"batch": batch}).fetchall()]
                    for row in rows:
                        s = time.monotonic()
                        sender.send(row, by=ctx.name)
                        sends.append((s, time.monotonic(), row.id))
                    if rows:
                        _count_held_attempt(conn, rows, lease_s)
                        for row in rows:
                            drain.complete(row, Outcome("sent"))
                in_tx += time.monotonic() - t
            claims += 1
            if not rows:
                empty += 1
                if not one_row(conn.execute(DUE_COUNT), "drain_lab.sql's due_count")[0]:
                    break
                time.sleep(0.005)   # due rows exist but are locked by another drain
        ctx.emit("finished", mode=mode, sends=sends, in_tx=in_tx, claims=claims, empty=empty)


def _max_overlap(intervals: list[tuple[float, float]]) -> int:
    points = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals],
                    key=lambda p: (p[0], p[1]))
    best = cur = 0
    for _, d in points:
        cur += d
        best = max(best, cur)
    return best


def _check_scopes(drains: int, rows: int, batch: int, send_ms: float, modes: tuple[str, ...]) -> None:
    """:func:`compare_claim_scopes`' parameters: drains and rows to work with, known modes."""
    if drains < 1:
        raise LabkitError(f"{drains} drains cannot drain anything.", "pass drains >= 1 (4 is a good lab).")
    check_params(batch=batch, rows=rows, send_ms=send_ms)
    if rows < 1:
        raise LabkitError(f"{rows} deliveries give the drains nothing to do.", "pass rows >= 1 (40 is a good lab).")
    for m in modes:
        if m not in MODES:
            raise LabkitError(f"Unknown mode {m!r}.", f"use some of {list(MODES)}.")


def _drain_mode(lab: Lab, workers: list[Worker], k: int, mode: str, rows: int) -> tuple[list[dict], float]:
    """The ``k``-th mode's run: a fresh ledger of ``rows`` deliveries, every drain started in
    ``mode`` at once, until each reports it found nothing due.  Their reports, and the start."""
    for w in workers:
        w.wait_for("paused", count=k, tag="ready", timeout=90)
    create_ledger(lab, rows, install=False)
    t0 = time.monotonic()
    for w in workers:
        w.resume(mode)
    return [w.wait_for("finished", mode=mode, timeout=120) for w in workers], t0


def _scope_row(lab: Lab, mode: str, reports: list[dict], t0: float, *, drains: int, rows: int) -> dict[str, Any]:
    """One mode's measurements: wall time, sends in parallel, time in transaction, empty
    claims, and what the pushes and the ledger show."""
    sends = [(s, e) for r in reports for s, e, _ in r["sends"]]
    wall = max(r["t"] for r in reports) - t0   # until the last drain found nothing due
    pushes = _pushes(lab)
    in_tx = sum(r["in_tx"] for r in reports)
    return {
        "mode": mode, "drains": drains, "rows": rows, "wall_s": round(wall, 3),
        "max_parallel_sends": _max_overlap(sends),
        "in_transaction_s": round(in_tx, 3),
        "connection_busy_share": round(in_tx / (drains * wall), 3) if wall else 0.0,
        "empty_claims": sum(r["empty"] for r in reports) - drains,
        "pushes": pushes["pushes"], "duplicates": pushes["duplicate_pushes"],
        "sent": _statuses(lab)["sent"]}


def _end_drains(workers: list[Worker], rounds: int) -> None:
    """Let every drain, paused after its last round, leave its loop and exit."""
    for w in workers:
        w.wait_for("paused", count=rounds + 1, tag="ready", timeout=90)
        w.resume(None)
    for w in workers:
        w.join(30)


def compare_claim_scopes(lab: Lab, *, drains: int = 4, rows: int = 40, batch: int = 5,
                         send_ms: float = 40, modes: tuple[str, ...] = tuple(MODES)) -> pd.DataFrame:
    """Run the same work with ``drains`` drain processes in each mode; measure wall time,
    how many sends overlapped, and how long each drain's connection sat in a transaction.
    A send really sleeps ``send_ms`` (standing for ~2 s of APNs time)."""
    import pandas as pd

    _check_scopes(drains, rows, batch, send_ms, modes)
    workers = [Worker(bench_worker, name=f"drain {i + 1}", dsn=lab.db.dsn, schema=lab.schema,
                      batch=batch, lease_s=LEASE_S, latency_s=LATENCY_S,
                      speed=send_ms / 1000 / LATENCY_S) for i in range(drains)]
    out = []
    try:
        create_ledger(lab, rows)
        for w in workers:
            w.start()
        for k, mode in enumerate(modes, 1):
            reports, t0 = _drain_mode(lab, workers, k, mode, rows)
            out.append(_scope_row(lab, mode, reports, t0, drains=drains, rows=rows))
        _end_drains(workers, len(modes))
    finally:
        for w in workers:
            w.kill()
    return pd.DataFrame(out).set_index("mode")


# -- a busy morning, for the metrics -------------------------------------------------------------


def run_ticks(lab: Lab, clock: Clock, *, ticks: int, every_s: float, batch: int = 50,
              lease_s: float = LEASE_S, fence: bool = False) -> list[int]:
    """``ticks`` drain ticks, the clock moved on ``every_s`` before each; claimed per tick."""
    check_params(batch=batch, lease_s=lease_s, ticks=ticks, every_s=every_s)
    d = make_drain(lab, "drain", batch=batch, lease_s=lease_s, fence=fence)
    try:
        got = []
        for _ in range(ticks):
            clock.advance(every_s)
            got.append(len(d.tick().claimed))
        return got
    finally:
        close_drain(d)


# -- command line: labkit trace drain -----------------------------------------------------------


def trace_command(*, open_lab: Callable[[], Lab], batch: int, crash_after: int,
                  freeze_after: int | None, lease: float | None, fence: bool, json: bool) -> int:
    """``labkit trace drain [--batch 50] [--crash-after 12 | --freeze-after 12] [--lease S]
    [--no-fence] [--json]``.  ``open_lab()`` gives the run its own lab (a schema of this
    run's own: two runs at once never touch each other's tables)."""
    lease = lease if lease is not None else (5.0 if freeze_after is not None else LEASE_S)
    check_params(batch=batch, lease_s=lease)     # before anything is created
    with open_lab() as lab:
        if freeze_after is not None:
            tr = freeze_trace(lab, batch=batch, freeze_after=freeze_after, lease_s=lease, fence=fence)
        else:
            tr = crash_trace(lab, batch=batch, crash_after=crash_after, lease_s=lease)
    print(tr.report(json))
    return 0
