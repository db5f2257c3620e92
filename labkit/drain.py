"""The notification drain: lease-based claims, a slow push service, and real crashes.

The drain claims due rows of a delivery ledger in ONE statement that also grants
the lease (``labkit/sql/drain_claim.sql``): attempts + 1, next_attempt_at = now + 120 s,
claim_version + 1. The statement commits at once, so no row lock outlives it; the
pushes go out afterwards, and the batch's outcomes are written in one short
transaction at the end (``drain_complete.sql``, or ``drain_complete_fenced.sql``).

Time goes through one SQL function, ``lab_now()`` (a ``lab_clock`` row): the server's
real clock, or — in a lab — a frozen instant that :class:`Clock` moves on ("+120 s")
at once, so traces reproduce exactly.

:class:`PushSender` stands in for APNs. A send "takes" ``latency_s`` seconds of APNs
time; it really sleeps ``latency_s * speed`` (``speed=0`` in the traces: no waiting;
the anti-pattern measurement uses a small real sleep so that overlap is real). Token
prefixes decide the outcome, deterministically: ``bad-`` fails terminally
(BadDeviceToken), ``flaky-`` fails transiently on its first ``flaky_failures`` attempts
(ServiceUnavailable), anything else is delivered. Every delivered push is recorded in
``device_push`` over the sender's own autocommit connection, with its collapse id, so
the record survives a drain that is killed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import psycopg
from psycopg import sql

from .errors import LabkitError
from .lab import read_sql
from .limits import bulk, number
from .procs import entry_point
from .trace import Trace

T0 = "2026-03-02 09:00:00+00"   # the instant a lab's clock is frozen at
LEASE_S = 120
MAX_ATTEMPTS = 5
LATENCY_S = 2.0                 # what one APNs call "takes" in the story

# Small read-only queries for the traces' state snapshots.
STATUS_COUNTS = ("SELECT status, count(*) FROM delivery GROUP BY status ORDER BY status")
DUE_COUNT = ("SELECT count(*) FROM delivery "
             "WHERE status = 'pending' AND next_attempt_at <= lab_now()")
PUSH_COUNTS = """
SELECT count(*)                                                  AS pushes,
       coalesce(sum(n - 1), 0)                                   AS duplicates,
       coalesce(sum(n - 1) FILTER (WHERE collapse_id IS NULL), 0) AS visible_duplicates
  FROM (SELECT device_token, notification_id, collapse_id, count(*) AS n
          FROM device_push GROUP BY device_token, notification_id, collapse_id) AS per_device
"""
LOCKED_AMONG = """
SELECT %(n)s - count(*) FROM (
    SELECT id FROM delivery WHERE id = ANY(%(ids)s) FOR UPDATE SKIP LOCKED) AS free
"""
HELD_BUMP = ("UPDATE delivery SET attempts = attempts + 1, claim_version = claim_version + 1, "
             "next_attempt_at = lab_now() + make_interval(secs => %(lease_s)s) "
             "WHERE id = ANY(%(ids)s)")
RECORD_PUSH = """
INSERT INTO device_push (delivery_id, device_token, notification_id, collapse_id, pushed_by, pushed_at)
VALUES (%(id)s, %(device_token)s, %(notification_id)s, %(coalesce_key)s, %(by)s, lab_now())
"""


# -- the ledger and the clock -------------------------------------------------------------


def create_ledger(lab, n: int, *, bad: tuple[int, ...] = (), flaky: tuple[int, ...] = (),
                  no_collapse_every: int = 4, freeze_at: str | None = T0,
                  install: bool = True) -> "Clock":
    """(Re)create the drain's tables with ``n`` due deliveries, ids 1..n, oldest first.

    Delivery ``i`` is notification ``1000 + i`` to device ``dev-000i``; ids in ``bad`` get a
    dead token (``bad-…``), ids in ``flaky`` one that fails transiently at first. Every
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
    else:
        lab.execute("TRUNCATE delivery, device_push")
    clock = Clock(lab)
    if freeze_at is not None:
        clock.freeze(freeze_at)
    else:
        clock.real()
    number("n", n, high=MAX_OTHER, whole=True, example=50)
    bulk(
        lab,
        """
        INSERT INTO delivery (id, notification_id, device_token, next_attempt_at, coalesce_key)
        SELECT g, 1000 + g,
               CASE WHEN g = ANY(%(bad)s) THEN 'bad-' WHEN g = ANY(%(flaky)s) THEN 'flaky-'
                    ELSE 'dev-' END || lpad(g::text, 4, '0'),
               lab_now() - make_interval(secs => %(n)s - g + 1),
               CASE WHEN g %% %(every)s = 0 THEN NULL ELSE 'notif-' || (1000 + g) END
          FROM generate_series(1, %(n)s) AS g
        """,
        {"n": n, "bad": list(bad), "flaky": list(flaky), "every": no_collapse_every}, rows=n)
    lab.execute("ANALYZE delivery")
    return clock


class Clock:
    """The lab's clock: ``lab_now()`` in SQL. Frozen in labs, the server's clock otherwise."""

    def __init__(self, lab):
        self.lab = lab

    def freeze(self, at: str = T0) -> "Clock":
        self.lab.execute("UPDATE lab_clock SET frozen_at = %s, shift = '0 s'", (at,))
        return self

    def real(self) -> "Clock":
        self.lab.execute("UPDATE lab_clock SET frozen_at = NULL, shift = '0 s'")
        return self

    def advance(self, seconds: float) -> "Clock":
        """Move the clock on at once: ``clock.advance(120)`` is "+120 s"."""
        if seconds < 0:
            raise LabkitError(f"The clock cannot go back ({seconds} s).",
                              "pass a positive number of seconds; use freeze() to start over.")
        number("seconds", seconds, high=100 * 365 * 86_400, unit=" s", example=120)
        self.lab.execute("UPDATE lab_clock SET shift = shift + make_interval(secs => %s)",
                         (seconds,))
        return self

    def now(self):
        return self.lab.execute("SELECT lab_now()")[0][0]

    @property
    def frozen(self) -> bool:
        return self.lab.execute("SELECT frozen_at IS NOT NULL FROM lab_clock")[0][0]

    def elapsed(self) -> float:
        """Seconds the clock has been moved on since it was frozen."""
        return float(self.lab.execute("SELECT extract(epoch FROM shift) FROM lab_clock")[0][0])

    def rel(self, ts) -> str:
        """``ts`` as "T+120 s", relative to the instant the clock was frozen at."""
        secs = self.lab.execute("SELECT extract(epoch FROM %s::timestamptz - frozen_at) FROM lab_clock",
                                (ts,))[0][0]
        return "T" if secs is None else f"T{float(secs):+.0f} s"


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


@dataclass(frozen=True)
class Outcome:
    outcome: str            # sent, retry, failed
    error: str | None = None


class PushSender:
    """An APNs stand-in: slow, sometimes failing, and keeping a record of every push."""

    def __init__(self, conn: psycopg.Connection, *, name: str = "drain", latency_s: float = LATENCY_S,
                 speed: float = 0.0, flaky_failures: int = 2):
        if latency_s < 0 or speed < 0 or flaky_failures < 0:
            raise LabkitError("PushSender got a negative latency, speed or flaky_failures.",
                              "pass latency_s >= 0, speed >= 0 (0: do not really wait) and "
                              "flaky_failures >= 0.")
        self.conn = conn            # autocommit: each push is on record the moment it happens
        self.name = name
        self.latency_s = latency_s
        self.speed = speed
        self.flaky_failures = flaky_failures

    def send(self, row: Claimed, *, by: str | None = None) -> Outcome:
        if self.speed:
            time.sleep(self.latency_s * self.speed)
        token = row.device_token
        if token.startswith("bad-"):
            return Outcome("failed", "BadDeviceToken")
        if token.startswith("flaky-") and row.attempts <= self.flaky_failures:
            return Outcome("retry", "ServiceUnavailable")
        self.conn.execute(RECORD_PUSH, {**asdict(row), "by": by or self.name})
        return Outcome("sent")


# -- the drain ---------------------------------------------------------------------------


@dataclass
class TickResult:
    claimed: list[Claimed]
    outcomes: dict[int, Outcome]
    lost: list[int]             # rows whose fenced write matched nothing: lease lost


class Drain:
    """One drain: claim a batch (lease granted in the claim), send, record the outcomes.

    ``fence=False`` is the drain as the source shipped it (outcome written by id only);
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
        rows = self.conn.execute(self.claim_sql, {"batch": self.batch, "lease_s": self.lease_s}).fetchall()
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
        claimed = self.claim()
        done: list[tuple[Claimed, Outcome]] = []
        for i, row in enumerate(claimed, 1):
            out = self.sender.send(row, by=self.name)
            done.append((row, out))
            if on_sent:
                on_sent(i, row, out)
        lost = self.complete_all(done)
        return TickResult(claimed, {r.id: o for r, o in done}, lost)


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


def lab_conn(dsn: str, schema: str, role: str, *, autocommit: bool = True) -> psycopg.Connection:
    """A connection for a worker process (it has no Lab object): same search_path and
    application_name as ``lab.connect(role=...)``, with guards against hanging."""
    return psycopg.connect(dsn, autocommit=autocommit, connect_timeout=10,
                           application_name=f"labkit:{schema}:{role}"[:63],
                           options=f"-c search_path={schema},public -c lock_timeout=30s "
                                   f"-c statement_timeout=60s")


def make_drain(lab, name: str, **kw) -> Drain:
    """An in-kernel drain with its own connections (sender included) into ``lab``."""
    sender_kw = {k: kw.pop(k) for k in ("latency_s", "speed", "flaky_failures") if k in kw}
    conn = lab.connect(role=name.replace(" ", "_"))
    sender = PushSender(lab.connect(role=name.replace(" ", "_") + "_apns"), name=name, **sender_kw)
    return Drain(conn, sender, name=name, **kw)


def close_drain(drain: Drain) -> None:
    for conn in (drain.conn, drain.sender.conn):
        if not conn.closed:
            conn.close()


# -- a drain in its own OS process (for the crash) --------------------------------------------


def drain_worker(ctx, dsn: str, schema: str, batch: int, lease_s: float, fence: bool = False,
                 pause_after_claim: bool = True, pause_after_sends: int | None = None) -> dict:
    """Child process: one tick of the drain, with scripted pauses the parent may kill it at."""
    role = ctx.name.replace(" ", "_")
    conn = lab_conn(dsn, schema, role)
    sender = PushSender(lab_conn(dsn, schema, role + "_apns"), name=ctx.name)
    drain = Drain(conn, sender, name=ctx.name, batch=batch, lease_s=lease_s, fence=fence)
    ctx.emit("connected", pid=conn.info.backend_pid, sender_pid=sender.conn.info.backend_pid)
    claimed = drain.claim()
    ctx.emit("claimed", ids=[c.id for c in claimed])
    if pause_after_claim:
        ctx.pause("claimed")
    done = []
    for i, row in enumerate(claimed, 1):
        out = sender.send(row, by=ctx.name)
        done.append((row, out))
        ctx.emit("sent", id=row.id, outcome=out.outcome)
        if pause_after_sends is not None and i == pause_after_sends:
            ctx.pause(f"sent-{i}")
    lost = drain.complete_all(done)
    return {"claimed": len(claimed), "lost": lost}


# -- trace 1: the drain crashes mid-send -----------------------------------------------------


def _statuses(lab) -> dict[str, int]:
    counts = dict(lab.execute(STATUS_COUNTS))
    return {s: counts.get(s, 0) for s in ("pending", "sent", "failed")}


def _pushes(lab) -> dict[str, int]:
    pushes, dups, visible = lab.execute(PUSH_COUNTS)[0]
    return {"pushes": int(pushes), "duplicate_pushes": int(dups), "visible_duplicates": int(visible)}


def _locked_among(lab, ids: list[int]) -> int:
    """How many of ``ids`` some other session holds a row lock on (probe, then roll back)."""
    with lab.connect(role="probe") as conn:
        with conn.transaction(force_rollback=True):
            return int(conn.execute(LOCKED_AMONG, {"ids": ids, "n": len(ids)}).fetchone()[0])


def _wait_backend_gone(lab, pid: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while lab.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)):
        if time.monotonic() > deadline:
            raise LabkitError(f"The server still shows the killed drain's session after {timeout:.0f} s.",
                              "run `labkit doctor`; the server may be overloaded.")
        time.sleep(0.02)


def crash_trace(lab, *, batch: int = 50, crash_after: int = 12, lease_s: float = LEASE_S,
                warmup: int = 10, others: int = 10) -> Trace:
    """A drain (a real process) claims ``batch`` rows with leases, sends ``crash_after`` pushes
    and is SIGKILLed; a second drain carries on; the leases run out; the rows come back."""
    from .procs import Worker

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
               {**_statuses(lab), "at": "T"})

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
                "lease_until": clock.rel(lease_until), "rows_locked": _locked_among(lab, got)})
        if crash_after:
            w.resume()
            w.wait_for("paused", tag=f"sent-{crash_after}", timeout=60)
            tr.add("drain 1", f"send {crash_after} pushes (APNs, ~{LATENCY_S:.0f} s each)",
                   "the devices have them; the ledger does not know yet: outcomes are written "
                   "after the batch", {"pushes_by_drain_1": lab.execute(
                       "SELECT count(*) FROM device_push WHERE pushed_by = 'drain 1'")[0][0],
                       **_statuses(lab)})
        w.kill()
    finally:
        w.kill()
    _wait_backend_gone(lab, pid)
    sent_before = lab.execute("SELECT count(DISTINCT delivery_id) FROM device_push "
                              "WHERE delivery_id = ANY(%s)", (crashed_ids,))[0][0]
    claimed_rows = lab.execute(
        "SELECT count(*) FROM delivery WHERE id = ANY(%s) AND status = 'pending' "
        "AND claim_version = 1 AND next_attempt_at > lab_now()", (crashed_ids,))[0][0]
    locks_after = _locked_among(lab, crashed_ids)
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
                **_statuses(lab)})

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
                   {c.attempts for c in res3.claimed}), **_statuses(lab)})
    finally:
        close_drain(second)

    terminal_reclaimed = sum(
        1 for i, v in lab.execute("SELECT id, claim_version FROM delivery WHERE id = ANY(%s)",
                                  (list(terminal_before),))
        if v != terminal_before[i])
    pushes = _pushes(lab)
    tr.add("devices", "count what each device received (the sender's record)",
           "a duplicate with the same collapse id replaces the first banner on the device; "
           "one without a collapse id shows twice",
           {"duplicate_pushes": pushes["duplicate_pushes"],
            "hidden_by_collapse_id": pushes["duplicate_pushes"] - pushes["visible_duplicates"],
            "visible_duplicates": pushes["visible_duplicates"],
            "terminal_rows_reclaimed": terminal_reclaimed}, kind="check")
    tr.summary = {
        "claimed": len(got),
        "sent_before_crash": int(sent_before),
        "locks_held_after_crash": locks_after,
        "claimed_by_second_drain_at_once": len(ids2),
        "due_before_lease_end": len(early),
        "reclaimed_after_lease": int(reclaimed),
        "duplicate_pushes": pushes["duplicate_pushes"],
        "visible_duplicates": pushes["visible_duplicates"],
        "terminal_rows_reclaimed": terminal_reclaimed,
    }
    return tr


# -- trace 2: the anti-pattern, measured -------------------------------------------------------


MODES = {
    "lease": "lease: claim commits, sends outside any transaction",
    "held, SKIP LOCKED": "FOR UPDATE SKIP LOCKED held across the sends",
    "held, FOR UPDATE": "FOR UPDATE (wait) held across the sends",
}


def bench_worker(ctx, dsn: str, schema: str, batch: int, lease_s: float, latency_s: float,
                 speed: float) -> dict:
    """Child process: runs the drain in whichever mode the parent resumes it with, until
    nothing is due; reports its send intervals and the time it spent inside a transaction."""
    role = ctx.name.replace(" ", "_")
    conn = lab_conn(dsn, schema, role)
    sender = PushSender(lab_conn(dsn, schema, role + "_apns"), name=ctx.name,
                        latency_s=latency_s, speed=speed)
    drain = Drain(conn, sender, name=ctx.name, batch=batch, lease_s=lease_s)
    held = {p: sql.SQL(read_sql("drain_claim_held.sql")).format(policy=sql.SQL(p))
            for p in ("FOR UPDATE", "FOR UPDATE SKIP LOCKED")}
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
                        conn.execute(HELD_BUMP, {"ids": [r.id for r in rows], "lease_s": lease_s})
                        for row in rows:
                            drain.complete(row, Outcome("sent"))
                in_tx += time.monotonic() - t
            claims += 1
            if not rows:
                empty += 1
                if not conn.execute(DUE_COUNT).fetchone()[0]:
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


def compare_claim_scopes(lab, *, drains: int = 4, rows: int = 40, batch: int = 5,
                         send_ms: float = 40, modes: tuple[str, ...] = tuple(MODES)):
    """Run the same work with ``drains`` drain processes in each mode; measure wall time,
    how many sends overlapped, and how long each drain's connection sat in a transaction.
    A send really sleeps ``send_ms`` (standing for ~2 s of APNs time)."""
    import pandas as pd

    from .procs import Worker

    if drains < 1:
        raise LabkitError(f"{drains} drains cannot drain anything.", "pass drains >= 1 (4 is a good lab).")
    check_params(batch=batch, rows=rows, send_ms=send_ms)
    if rows < 1:
        raise LabkitError(f"{rows} deliveries give the drains nothing to do.", "pass rows >= 1 (40 is a good lab).")
    for m in modes:
        if m not in MODES:
            raise LabkitError(f"Unknown mode {m!r}.", f"use some of {list(MODES)}.")
    workers = [Worker(bench_worker, name=f"drain {i + 1}", dsn=lab.db.dsn, schema=lab.schema,
                      batch=batch, lease_s=LEASE_S, latency_s=LATENCY_S,
                      speed=send_ms / 1000 / LATENCY_S) for i in range(drains)]
    out = []
    try:
        create_ledger(lab, rows)
        for w in workers:
            w.start()
        for k, mode in enumerate(modes, 1):
            for w in workers:
                w.wait_for("paused", count=k, tag="ready", timeout=90)
            create_ledger(lab, rows, install=False)
            t0 = time.monotonic()
            for w in workers:
                w.resume(mode)
            reports = [w.wait_for("finished", mode=mode, timeout=120) for w in workers]
            sends = [(s, e) for r in reports for s, e, _ in r["sends"]]
            wall = max(r["t"] for r in reports) - t0   # until the last drain found nothing due
            pushes = _pushes(lab)
            out.append({
                "mode": mode, "drains": drains, "rows": rows, "wall_s": round(wall, 3),
                "max_parallel_sends": _max_overlap(sends),
                "in_transaction_s": round(sum(r["in_tx"] for r in reports), 3),
                "connection_busy_share": round(sum(r["in_tx"] for r in reports) / (drains * wall), 3)
                if wall else 0.0,
                "empty_claims": sum(r["empty"] for r in reports) - drains,
                "pushes": pushes["pushes"], "duplicates": pushes["duplicate_pushes"],
                "sent": _statuses(lab)["sent"]})
        for w in workers:
            w.wait_for("paused", count=len(modes) + 1, tag="ready", timeout=90)
            w.resume(None)
        for w in workers:
            w.join(30)
    finally:
        for w in workers:
            w.kill()
    return pd.DataFrame(out).set_index("mode")


# -- a busy morning, for the metrics -------------------------------------------------------------


def run_ticks(lab, clock: Clock, *, ticks: int, every_s: float, batch: int = 50,
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


@entry_point("labkit trace drain")
def main(argv: list[str] | None = None) -> int:
    """``labkit trace drain [--batch 50] [--crash-after 12] [--lease 120] [--json]``"""
    import labkit

    p = argparse.ArgumentParser(prog="labkit trace drain",
                                description="Trace a lease-based drain killed mid-send, on a real server.")
    p.add_argument("--batch", type=int, default=50, help="rows the drain claims (default 50)")
    p.add_argument("--crash-after", type=int, default=12, help="pushes sent before SIGKILL (default 12)")
    p.add_argument("--lease", type=float, default=LEASE_S, help="lease in seconds (default 120)")
    p.add_argument("--json", action="store_true", help="print the summary and steps as JSON")
    args = p.parse_args(argv)
    try:
        check_params(batch=args.batch, lease_s=args.lease)     # before anything is created
        # a schema of this run's own: two runs at once never touch each other's tables
        with labkit.connect(quiet=args.json).lab(f"trace_drain_{os.getpid()}") as lab:
            tr = crash_trace(lab, batch=args.batch, crash_after=args.crash_after, lease_s=args.lease)
    except LabkitError as exc:
        print(f"labkit: {exc}", file=sys.stderr)
        return 2
    print(tr.report(args.json))
    return 0


if __name__ == "__main__":
    sys.exit(main())
