"""Crash torture: kill the workers at random points, then check that nothing was lost.

``labkit torture relay|drain|queue --kills N --seed S [--json]`` runs real worker
processes against a lab schema and hurts them, over and over, at points drawn from a
seeded random generator:

* ``sigkill``   -- SIGKILL of the worker process (the server sees its connection die);
* ``terminate`` -- the server ends the worker's backend (``pg_terminate_backend``);
* ``broker``    -- (relay) the broker refuses every publish for a short while;
* ``stall``     -- (drain) the worker freezes (SIGSTOP) past its lease, another drain
  re-claims its rows, then it wakes up as a zombie and writes its stale outcomes.

A killed worker is restarted (a new process) until the work is done.  Then the
invariants are checked from the database and the broker -- never from what the
workers or this script counted:

* relay: every outbox event reached the broker at least once; duplicates only among
  the rows a relay held (its uncommitted batch) at a kill, and no more of them;
* drain: no claim -- hence no new push -- after a delivery reached a terminal status;
  duplicate pushes bounded by what was leased and unfinished when a lease ran out;
  zero stale writes -- the fence's promise, so a run without the fence breaks it;
  poison rows (their send kills the drain process, every time) dead-lettered at their
  attempt limit by the claim, and no good row given up on because of them;
* queue (with a reaper): every job ended DONE or DEAD (dead-lettered), attempts never
  above the maximum, re-runs bounded by the reaper's take-backs.

The run is bounded in kills and in time (``max_seconds``) and stops by itself.
Every worker is killed and every broker switched back on when it ends, however it
ends (KeyboardInterrupt included).
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg

from ..core.checked import started_pid
from ..core.errors import LabkitError, ServerError
from ..core.lab import Lab
from ..core.limits import bulk, number
from ..core.procs import Context, Worker
from ..core.queries import queries, query
from ..core.text import fill, wrap
from ..labs import broker as brokers
from ..labs import claims as cl
from ..labs import drain as dr
from ..labs import relay as rl

DIALECTS = ("relay", "drain", "queue")
KINDS = {"relay": ("sigkill", "terminate", "broker"),
         "drain": ("sigkill", "terminate", "stall"),
         "queue": ("sigkill", "terminate")}
DEFAULT_BATCH = {"relay": 10, "drain": 5, "queue": 2}
MAX_WORKERS = 16
# Ceilings: a run stays within hours at the very most, and its tables within memory.
MAX_KILLS = 10_000
MAX_ITEMS = 200_000
MAX_BATCH = 1_000
MAX_SECONDS = 86_400
MAX_JOB_MS = 60_000
MAX_ATTEMPTS = 100

# -- SQL: what the run writes and what the checks read (labkit/sql/torture*.sql) ---------------

SQL = "torture.sql"
RELAY_IN_FLIGHT = query(SQL, "relay_in_flight").sql       # rows a relay's open transaction holds
RELAY_STATE = query(SQL, "relay_state").sql
DRAIN_AUDIT = query(SQL, "drain_audit").text              # the audit table and its trigger
DRAIN_POISON = (11, 37)                                   # deliveries whose send kills the drain
DRAIN_FILL = query(SQL, "drain_fill").sql
DRAIN_IN_FLIGHT = query(SQL, "drain_in_flight").sql       # leased and unfinished
DRAIN_HELD_BY = query(SQL, "drain_held_by").sql
DRAIN_DUPLICATED = query(SQL, "drain_duplicated").sql
QUEUE_FILL = query(SQL, "queue_fill").sql
# The invariants' counts, name -> SQL returning one number
DRAIN_CHECKS = {name: q.sql for name, q in queries("torture_drain_checks.sql").items()}
QUEUE_CHECKS = {name: q.sql for name, q in queries("torture_queue_checks.sql").items()}


def _counts(lab: Lab, checks: dict[str, str], max_attempts: int) -> dict[str, int]:
    return {name: int(lab.execute(q, {"max": max_attempts} if "%(max)s" in q else None)[0][0])
            for name, q in checks.items()}


def drain_counts(lab: Lab, max_attempts: int = dr.MAX_ATTEMPTS) -> dict[str, int]:
    """Every count of DRAIN_CHECKS, read from the lab's ledger, pushes and audit."""
    return _counts(lab, DRAIN_CHECKS, max_attempts)


def queue_counts(lab: Lab, max_attempts: int) -> dict[str, int]:
    """Every count of QUEUE_CHECKS, read from the lab's job table and effect log."""
    return _counts(lab, QUEUE_CHECKS, max_attempts)


# -- the report --------------------------------------------------------------------------------


@dataclass
class TortureReport:
    """What one torture run did and what the database and broker say about it."""

    dialect: str
    seed: int
    workers: int
    batch: int
    planned_kills: int
    kills: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    restarts: int = 0
    crashes_on_their_own: int = 0     # poison jobs, broker retries exhausted, ...
    items: int = 0                    # outbox events / deliveries / jobs
    lost: int = 0
    duplicates: int = 0
    duplicate_bound: int = 0
    stale_writes: int = 0
    invariants: dict[str, bool] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    stopped_early: bool = False
    wall_s: float = 0.0
    fence: bool | None = None
    kill_log: list[dict] = field(default_factory=list, repr=False)

    @property
    def invariants_hold(self) -> bool:
        return bool(self.invariants) and all(self.invariants.values())

    @property
    def item_word(self) -> str:
        return {"relay": "events", "drain": "deliveries", "queue": "jobs"}[self.dialect]

    def to_dict(self) -> dict:
        out = {"dialect": self.dialect, "seed": self.seed, "workers": self.workers, "batch": self.batch,
               "kills": self.kills, "planned_kills": self.planned_kills, "kill_kinds": dict(self.kinds),
               "restarts": self.restarts, "crashes_on_their_own": self.crashes_on_their_own,
               self.item_word: self.items, "lost": self.lost, "duplicates": self.duplicates,
               "duplicate_bound": self.duplicate_bound, "stale_writes": self.stale_writes,
               "invariants": dict(self.invariants), "invariants_hold": self.invariants_hold,
               "stopped_early": self.stopped_early, "wall_s": round(self.wall_s, 2),
               "details": self.details}
        if self.dialect != "relay":
            out["events"] = self.items
        if self.dialect == "drain":
            out["poison_rows"] = self.details.get("poison_rows", 0)
            out["poison_dead_lettered"] = self.details.get("poison_dead_lettered", 0)
        if self.fence is not None:
            out["fence"] = self.fence
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, default=str)

    def verdicts(self) -> str:
        """The part of the report that does not depend on timing: what was planned, and
        which invariants held.  Reproduces exactly for a seed."""
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.kinds.items()))
        fence = "" if self.fence is None else (", fenced" if self.fence else ", NOT fenced")
        lines = wrap(f"torture {self.dialect} · seed {self.seed} · {self.kills} kills ({kinds}) · "
                     f"{self.workers} workers, batch {self.batch}{fence}", indent="    ")
        width = max((len(k) for k in self.invariants), default=10)
        for name, ok in self.invariants.items():
            lines.append(f"  {name:<{width}}  {'holds' if ok else 'BROKEN'}")
        lines.append("every invariant holds" if self.invariants_hold else "SOME INVARIANT IS BROKEN")
        return "\n".join(lines)

    def figures(self) -> str:
        """The counts, which depend on timing (how far a worker got before each kill)."""
        return fill(f"{self.items} {self.item_word}, lost {self.lost}, duplicates {self.duplicates} "
                    f"(bound {self.duplicate_bound}), stale writes {self.stale_writes}, "
                    f"{self.restarts} restarts, {self.crashes_on_their_own} crashes on their own, "
                    f"{self.wall_s:.1f} s", indent="    ")

    def __str__(self) -> str:
        return self.verdicts() + "\n" + self.figures()


# -- the worker processes ------------------------------------------------------------------------
# Each one works until it has found nothing to claim for ``idle_exit_s`` seconds, so a
# worker does not exit (and cost a restart) the moment the table runs low.

IDLE_EXIT_S = 1.0


# A publish that waits for the broker's confirm takes a round trip; the in-memory broker's takes
# microseconds, and a whole batch could then be published between two of the killer's looks
# (every 20 ms), so that a kill planned mid-batch landed after it.  Each publish takes this long.
PUBLISH_S = 0.005


def relay_until_idle(ctx: Context, *, dsn: str, schema: str, broker: dict, role: str, batch: int,
                     order: str = "outbox", backoff_s: float = 0.01, idle_exit_s: float = IDLE_EXIT_S) -> int:
    """The outbox relay (:class:`labkit.labs.relay.Relay`) in its own process; reports every
    publish, each taking :data:`PUBLISH_S` as a broker's confirm would.  A broker outage is ridden
    out by the relay's own backoff."""
    conn = rl.relay_connection(dsn, schema, role)
    bk = brokers.from_spec(broker, role=f"broker:{role}")
    try:
        ctx.emit("connected", pid=conn.info.backend_pid)
        def published(kind: str, **d: object) -> None:
            if kind == "published":
                ctx.emit(kind, **d)
                time.sleep(PUBLISH_S)

        relay = rl.Relay(conn, bk, batch=batch, order=order, hook=published)
        return _until_idle(lambda: relay.run(backoff_s=backoff_s), idle_exit_s)
    finally:
        bk.close()
        conn.close()


def drain_loop(ctx: Context, *, dsn: str, schema: str, batch: int, lease_s: float, fence: bool,
               max_attempts: int = dr.MAX_ATTEMPTS, idle_exit_s: float = IDLE_EXIT_S) -> int:
    """A drain (:class:`labkit.labs.drain.Drain`) in its own process.  Its two connections
    carry ``torture.worker = <its name>``, so the audit names the writer."""
    conn = dr.drain_connection(dsn, schema, ctx.name)
    sconn = dr.drain_connection(dsn, schema, ctx.name + "_apns")
    try:
        for c in (conn, sconn):
            c.execute("SELECT set_config('torture.worker', %s, false)", (ctx.name,))
        sender = dr.PushSender(sconn, name=ctx.name, die_on_poison=True)
        drain = dr.Drain(conn, sender, name=ctx.name, batch=batch, lease_s=lease_s, fence=fence,
                         max_attempts=max_attempts)
        ctx.emit("connected", pids=[conn.info.backend_pid, sconn.info.backend_pid])
        return _until_idle(
            lambda: len(drain.tick(on_sent=lambda i, row, out: ctx.emit("sent", id=row.id)).claimed),
            idle_exit_s)
    finally:
        conn.close()
        sconn.close()


def queue_loop(ctx: Context, *, idle_exit_s: float = IDLE_EXIT_S, **worker_kw: Any) -> int:
    """:func:`labkit.labs.claims.worker_main` (claim, run, finish; a poison job kills it) over
    and over: it returns when the queue has nothing pending."""
    return _until_idle(lambda: cl.worker_main(ctx, **worker_kw)["claims"], idle_exit_s)


def _until_idle(step: Callable[[], int], idle_exit_s: float) -> int:
    total, idle_since = 0, None
    while True:
        n = step()
        total += n
        if n:
            idle_since = None
            continue
        idle_since = idle_since or time.monotonic()
        if time.monotonic() - idle_since >= idle_exit_s:
            return total
        time.sleep(0.05)


# -- the run ------------------------------------------------------------------------------------


def check_params(dialect: str, *, kills: int, workers: int, batch: int, items: int,
                 max_seconds: float, seed: int) -> None:
    if dialect not in DIALECTS:
        raise LabkitError(f"No torture dialect {dialect!r}.", f"use one of {', '.join(DIALECTS)}.")
    if not isinstance(kills, int) or kills < 0:
        raise LabkitError(f"kills={kills!r}: a run kills 0 or more times.", "pass kills=20, for instance.")
    number("kills", kills, high=MAX_KILLS, whole=True, example=20)
    if not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
        raise LabkitError(f"A torture run needs 1 to {MAX_WORKERS} workers, not {workers!r}.",
                          "pass workers=2 (each worker is one process with its own connections).")
    if not isinstance(batch, int) or batch < 1:
        raise LabkitError(f"A batch of {batch!r} claims nothing.", "pass batch=1 or more.")
    number("batch", batch, low=1, high=MAX_BATCH, whole=True, example=10)
    if not isinstance(items, int) or items < 1:
        raise LabkitError(f"items={items!r}: there would be nothing to work on.", "pass items=1 or more.")
    number("items", items, low=1, high=MAX_ITEMS, whole=True, example=100)
    if batch > items:
        raise LabkitError(f"The batch ({batch}) is larger than the table ({items} rows): every "
                          "claim would take the whole table.", f"pass batch <= items (items={items}).")
    if not isinstance(max_seconds, (int, float)) or max_seconds <= 0:
        raise LabkitError(f"max_seconds={max_seconds!r} leaves no time to run.",
                          "pass a positive number of seconds (300, for instance).")
    number("max_seconds", max_seconds, above=True, high=MAX_SECONDS, unit=" s", example=300)
    if not isinstance(seed, int):
        raise LabkitError(f"seed={seed!r} is not a whole number.", "pass seed=1, for instance.")


@dataclass
class _Kill:
    victim: int          # worker slot
    kind: str
    after: int           # progress events of the victim before the kill
    jitter_ms: float     # extra sleep after that event (0: right at it)
    hold_s: float        # broker outage / stall length


def iter_plan(dialect: str, kills: int, seed: int, workers: int, batch: int) -> Iterator[_Kill]:
    """The kills of a run, one at a time as the run gets to them: victim, kind and point,
    all drawn from ``seed``."""
    number("kills", kills, high=MAX_KILLS, whole=True, example=20)
    rng = random.Random(f"torture:{dialect}:{seed}")
    for _ in range(kills):
        yield _Kill(victim=rng.randrange(workers), kind=rng.choice(KINDS[dialect]),
                    after=rng.randint(1, 2 * batch),
                    jitter_ms=rng.choice([0.0, rng.uniform(0.0, 3.0)]),
                    hold_s=rng.uniform(0.03, 0.15))


def plan(dialect: str, kills: int, seed: int, workers: int, batch: int) -> list[_Kill]:
    """The kills of a run as a list (the run itself draws them one at a time)."""
    return list(iter_plan(dialect, kills, seed, workers, batch))


def _poll(w: Worker, timeout: float = 0.0) -> None:
    """Collect a worker's pending events."""
    w.poll(timeout)


def _count(w: Worker, kind: str) -> int:
    return sum(1 for e in w.events if e["kind"] == kind)


class _Run(ABC):
    """Shared machinery: worker slots, restarts, freezing, the time bound."""

    progress_kind = "progress"

    def __init__(self, lab: Lab, report: TortureReport, deadline: float):
        self.lab = lab
        self.report = report
        self.deadline = deadline
        self.slots: list[Worker | None] = [None] * report.workers
        self.gen = 0
        self.failures_in_a_row = 0
        self.last_failure = ""
        self.idle_exit_s = IDLE_EXIT_S
        self.every: list[Worker] = []
        self.killed: set[Worker] = set()   # workers the run hurt: their failures are ours
        self.next_id = 1                   # the id the next work item added gets

    def add(self, n: int) -> None:
        """Add ``n`` work items, numbered on from the last."""
        self.insert(self.next_id, self.next_id + n - 1)
        self.next_id += n
        self.report.items += n

    # -- what each dialect provides --
    @abstractmethod
    def setup(self, items: int) -> None:
        """Create the dialect's tables with ``items`` work items."""

    @abstractmethod
    def insert(self, first: int, last: int) -> None:
        """Write work items ``first``..``last`` (inclusive)."""

    @abstractmethod
    def new_worker(self, slot: int) -> Worker:
        """A Worker, not started yet."""

    @abstractmethod
    def work_left(self) -> bool:
        """Some work item is not finished yet."""

    @abstractmethod
    def claimable(self) -> int:
        """How many work items a worker could take now."""

    @abstractmethod
    def strike(self, k: _Kill, victim: Worker) -> None:
        """Hurt ``victim`` the way ``k`` says."""

    @abstractmethod
    def check(self) -> None:
        """Read the invariants back from the database (and broker) into the report."""

    @abstractmethod
    def unstick(self) -> None:
        """Every worker found nothing to do while work is left: make it claimable."""

    def stuck(self) -> bool:
        """Work is left but none of it can be claimed now (leases, backoffs, dead claims)."""
        return False

    def top_up(self) -> None:
        """During the kill phase, keep enough work in the table."""
        low = self.report.batch * self.report.workers * 5
        if self.claimable() < low:
            self.add(low * 2)

    # -- workers --
    def start(self, slot: int) -> Worker:
        self.gen += 1
        w = self.new_worker(slot)
        self.every.append(w)        # known before it runs: kill_all() finds it whatever happens
        self.slots[slot] = w
        w.start()
        return w

    def ensure(self, slot: int) -> Worker:
        w = self.slots[slot]
        if w is None or not w.alive:
            if w is not None:
                self._note_exit(w)
                self.report.restarts += 1
            w = self.start(slot)
        return w

    def _note_exit(self, w: Worker) -> None:
        if w in self.killed:
            return
        _poll(w)
        failed = [e for e in w.events if e["kind"] == "failed"]
        if failed or w.exitcode not in (0, None):
            self.report.crashes_on_their_own += 1
            # a worker that got somewhere before it crashed (a poison job) is no sign of a
            # server that went away; one that crashes before any progress may be
            progressed = _count(w, self.progress_kind) > 0
            self.failures_in_a_row = 0 if progressed else self.failures_in_a_row + 1
            self.last_failure = failed[-1]["error"] if failed else f"exit code {w.exitcode}"
            if self.failures_in_a_row >= 8:
                self.check_server()
                if self.failures_in_a_row >= 40:
                    raise LabkitError(f"The {self.report.dialect} workers keep failing on their own "
                                      f"({self.last_failure}).",
                                      "read the error; run `labkit doctor` and repeat the run.")
        else:
            self.failures_in_a_row = 0

    def check_server(self) -> None:
        self.sql("SELECT 1")

    def kill_proc(self, w: Worker) -> None:
        self.killed.add(w)
        w.kill()

    def kill_all(self) -> None:
        for w in self.every:
            if w is not None:
                try:
                    if w.alive:
                        os.kill(started_pid(w), signal.SIGCONT)
                except OSError:
                    pass
                self.killed.add(w)
                w.kill()

    def alive(self) -> list[Worker]:
        return [w for w in self.slots if w is not None and w.alive]

    def backend_pids(self, w: Worker) -> list[int]:
        _poll(w)
        for e in reversed(w.events):
            if e["kind"] == "connected":
                return list(e.get("pids") or [e["pid"]])
        return []

    def freeze(self, ws: list[Worker]) -> list[Worker]:
        frozen = []
        for w in ws:
            if w.pid is None:               # never started: nothing to freeze
                continue
            try:
                os.kill(w.pid, signal.SIGSTOP)
                frozen.append(w)
            except OSError:
                pass
        pids = [p for w in frozen for p in self.backend_pids(w)]
        deadline = time.monotonic() + 2.0
        # a frozen client sends nothing more; wait until its backend finished what it had
        while pids and self.sql("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s) "
                                "AND state = 'active'", (pids,))[0][0]:
            if time.monotonic() > deadline:
                break
            time.sleep(0.005)
        return frozen

    @staticmethod
    def thaw(ws: list[Worker]) -> None:
        for w in ws:
            if w.pid is None:               # never started: nothing to thaw
                continue
            try:
                os.kill(w.pid, signal.SIGCONT)
            except OSError:
                pass

    def terminate(self, w: Worker, rng_pick: int) -> None:
        pids = self.backend_pids(w)
        if not pids:
            self.kill_proc(w)           # not connected yet: nothing to terminate; crash it
            return
        pid = pids[rng_pick % len(pids)]
        self.killed.add(w)             # its failure on the dead connection is ours
        self.sql("SELECT pg_terminate_backend(%s)", (pid,))

    def wait_gone(self, pids: list[int], timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while pids and self.sql("SELECT 1 FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)):
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)

    def sql(self, query: str, params: Any = None) -> list[tuple]:
        try:
            return self.lab.execute(query, params)
        except ServerError as exc:
            raise self._gone(exc) from None

    def fill(self, query: str, params: Any, rows: int) -> None:
        """A bulk INSERT of work items, under a statement timeout (limits.bulk)."""
        try:
            bulk(self.lab, query, params, rows=rows)
        except ServerError as exc:
            raise self._gone(exc) from None

    def _gone(self, exc: ServerError) -> ServerError:
        return ServerError(
            f"The torture run stopped: the server went away after {self.report.kills} kills "
            f"({exc.what})", "start the server again (`labkit server start`) and repeat the "
            "run: it rebuilds its tables from scratch.")

    def out_of_time(self) -> bool:
        return time.monotonic() > self.deadline

    # -- the two phases --
    def kill_phase(self, kills: Iterable[_Kill]) -> None:
        for i, k in enumerate(kills):
            while True:
                if self.out_of_time():
                    self.report.stopped_early = True
                    return
                self.top_up()
                victim = [self.ensure(s) for s in range(len(self.slots))][k.victim]
                _poll(victim)
                target = _count(victim, self.progress_kind) + k.after
                topped = time.monotonic()
                while victim.alive and _count(victim, self.progress_kind) < target:
                    if self.out_of_time():
                        self.report.stopped_early = True
                        return
                    _poll(victim, 0.02)
                    if time.monotonic() - topped > 0.1:    # keep work there for a late starter
                        self.top_up()
                        topped = time.monotonic()
                    for s, w in enumerate(self.slots):
                        if w is not victim and (w is None or not w.alive):
                            self.ensure(s)
                if victim.alive:
                    break
                # it ran out of claimable work before the kill point: make more claimable
                if not self.alive() or all(w is None or not w.alive for w in self.slots):
                    self.unstick()
            if k.jitter_ms:
                time.sleep(k.jitter_ms / 1000)
            self.strike(k, victim)
            self.report.kills += 1
            self.report.kinds[k.kind] = self.report.kinds.get(k.kind, 0) + 1
            self.report.kill_log.append({"kill": i + 1, "kind": k.kind, "victim": victim.name})

    def finish_phase(self, timeout: float) -> None:
        """No more kills: restart whatever stopped until the work is done."""
        deadline = time.monotonic() + timeout
        stuck_since = None
        while self.work_left():
            if time.monotonic() > deadline:
                raise LabkitError(f"The {self.report.dialect} workers did not finish the work within "
                                  f"{timeout:.0f} s after the last kill.",
                                  "run `labkit doctor` (a lock held outside the run?) and repeat.")
            if self.stuck():
                stuck_since = stuck_since or time.monotonic()
                if time.monotonic() - stuck_since > 0.3:
                    self.unstick()
                    stuck_since = None
            else:
                stuck_since = None
            if not self.alive():
                self.unstick()
            for s in range(len(self.slots)):
                self.ensure(s)
            for w in self.alive():
                _poll(w)
            time.sleep(0.05)
        # the work is done; whatever still runs finds nothing more and is stopped by
        # kill_all() before the checks read the tables


# -- relay ----------------------------------------------------------------------------------------


class _RelayRun(_Run):
    progress_kind = "published"

    def __init__(self, lab: Lab, report: TortureReport, deadline: float, broker: brokers.Broker,
                 order: str = "outbox"):
        super().__init__(lab, report, deadline)
        self.broker = broker
        self.order = order
        self.in_flight: set[str] = set()

    def setup(self, items: int) -> None:
        rl.create_outbox(self.lab)
        self.add(items)

    def insert(self, first: int, last: int) -> None:
        rl.place_orders(self.lab, last - first + 1, start=first)

    def new_worker(self, slot: int) -> Worker:
        role = f"relay-{slot + 1}-{self.gen}"
        return Worker(relay_until_idle, name=role, dsn=self.lab.db.dsn, schema=self.lab.schema,
                      broker=self.broker.spec(), role=role, batch=self.report.batch,
                      order=self.order, idle_exit_s=self.idle_exit_s)

    def unpublished(self) -> int:
        return self.sql(RELAY_STATE)[0][1]

    def work_left(self) -> bool:
        return self.unpublished() > 0

    def claimable(self) -> int:
        return self.unpublished()

    def unstick(self) -> None:
        time.sleep(0.05)   # rows of a dying backend stay locked until the server notices

    def _snapshot(self, ws: list[Worker]) -> int:
        pids = [p for w in ws for p in self.backend_pids(w)]
        rows = [r[0] for r in self.sql(RELAY_IN_FLIGHT, {"pids": pids})] if pids else []
        self.in_flight.update(rows)
        self.report.duplicate_bound += len(rows)
        return len(rows)

    def strike(self, k: _Kill, victim: Worker) -> None:
        if k.kind == "broker":
            frozen = self.freeze(self.alive())
            try:
                self._snapshot(frozen)
                self.broker.set_up(False)
            finally:
                self.thaw(frozen)
            try:
                time.sleep(k.hold_s)
            finally:
                self.broker.set_up(True)
            return
        frozen = self.freeze([victim])
        try:
            self._snapshot(frozen)
            if k.kind == "sigkill":
                self.kill_proc(victim)
            else:
                self.terminate(victim, k.after)
        finally:
            self.thaw(frozen)

    def check(self) -> None:
        r = self.report
        depth = self.broker.depth()
        delivered = rl.consume(self.lab, self.broker)
        obs = rl.Observer(self.lab, self.broker)
        try:
            out = obs.outcome(delivered, depth)
        finally:
            obs.close()
        total, unpublished = self.sql(RELAY_STATE)[0]
        outbox_ids = {row[0] for row in self.sql("SELECT event_id FROM outbox")}
        got = set(delivered)
        lost = sorted(outbox_ids - got)
        counts: dict[str, int] = {}
        for e in delivered:
            counts[e] = counts.get(e, 0) + 1
        duplicated = {e for e, n in counts.items() if n > 1}
        r.items = total
        r.lost = len(lost)
        r.duplicates = out["duplicates"]
        r.invariants = {
            "every outbox row was marked published": unpublished == 0,
            "every event reached the broker (none lost)": not lost,
            "no row marked published without its message": not out["lost_events"],
            "duplicates only from batches in flight at a kill": duplicated <= self.in_flight,
            "duplicates <= rows in flight at the kills": r.duplicates <= r.duplicate_bound,
            "the consumer applied every event exactly once": (
                out["consumer_applied"] == total and out["orders_applied_twice"] == 0),
        }
        r.details = {"broker": self.broker.kind, "broker_messages": out["broker_messages"],
                     "distinct_events": out["distinct_events"], "lost_events": lost[:10],
                     "duplicated_events": len(duplicated), "consumer_applied": out["consumer_applied"]}


# -- drain ----------------------------------------------------------------------------------------


class _DrainRun(_Run):
    progress_kind = "sent"
    LEASE_S = 120

    def __init__(self, lab: Lab, report: TortureReport, deadline: float, fence: bool):
        super().__init__(lab, report, deadline)
        self.fence = fence
        self.clock: dr.Clock | None = None
        self.in_flight: set[int] = set()
        self.jumps = 0

    def setup(self, items: int) -> None:
        self.clock = dr.create_ledger(self.lab, 0)
        self.sql(DRAIN_AUDIT)
        self.add(items)

    def insert(self, first: int, last: int) -> None:
        self.fill(DRAIN_FILL, {"first": first, "last": last, "poison": list(DRAIN_POISON)},
                  last - first + 1)

    def new_worker(self, slot: int) -> Worker:
        return Worker(drain_loop, name=f"drain-{slot + 1}-{self.gen}", dsn=self.lab.db.dsn,
                      schema=self.lab.schema, batch=self.report.batch, lease_s=self.LEASE_S,
                      fence=self.fence, idle_exit_s=self.idle_exit_s)

    def pending(self) -> int:
        return self.sql(DRAIN_CHECKS["pending"])[0][0]

    def work_left(self) -> bool:
        return self.pending() > 0

    def claimable(self) -> int:
        return self.sql(dr.DUE_COUNT)[0][0]

    def jump(self, frozen_already: bool = False) -> None:
        """Move the lab's clock past every lease (and every retry backoff): whatever was
        leased and unfinished is due again.  Counted with every worker frozen."""
        frozen = [] if frozen_already else self.freeze(self.alive())
        try:
            rows = [r[0] for r in self.sql(DRAIN_IN_FLIGHT)]
            self.in_flight.update(rows)
            self.report.duplicate_bound += len(rows)
            if self.clock is None:
                raise LabkitError("The drain run has no clock to move: its ledger was never made.",
                                  "call setup() before the kill phase.")
            self.clock.advance(self.LEASE_S + 1)
            self.jumps += 1
        finally:
            self.thaw(frozen)

    def unstick(self) -> None:
        self.jump()

    def stuck(self) -> bool:
        return self.sql(dr.DUE_COUNT)[0][0] == 0

    def strike(self, k: _Kill, victim: Worker) -> None:
        frozen = self.freeze(self.alive())
        try:
            self.jump(frozen_already=True)
            if k.kind == "sigkill":
                self.kill_proc(victim)
            elif k.kind == "terminate":
                self.terminate(victim, k.after)
        except BaseException:
            self.thaw(frozen)
            raise
        if k.kind != "stall":
            self.thaw(frozen)
            return
        # the victim stays frozen past its (expired) lease until the others have re-claimed
        # what it held (or a few seconds went by): then it wakes up as a zombie
        try:
            self.thaw([w for w in frozen if w is not victim])
            held = [r[0] for r in self.sql(DRAIN_HELD_BY, {"worker": victim.name})]
            deadline = time.monotonic() + 3.0 + k.hold_s
            while held and time.monotonic() < deadline:
                if not self.sql(DRAIN_HELD_BY, {"worker": victim.name}):
                    break
                for slot, w in enumerate(self.slots):     # a drain a poison row killed meanwhile
                    if w is not victim and (w is None or not w.alive):
                        self.ensure(slot)
                self.top_up()
                time.sleep(0.02)
            time.sleep(k.hold_s)
        finally:
            self.thaw([victim])

    def check(self) -> None:
        r = self.report
        c = drain_counts(self.lab, dr.MAX_ATTEMPTS)
        duplicated = {row[0] for row in self.sql(DRAIN_DUPLICATED)}
        r.items = c["deliveries"]
        r.lost = c["pending"] + c["sent_never_pushed"] + c["good_token_failed"]
        r.duplicates = c["duplicate_pushes"]
        r.stale_writes = c["stale_writes"]
        r.invariants = {
            "every delivery ended sent or failed": c["pending"] == 0,
            "no delivery lost (sent means pushed; good tokens delivered)": (
                c["sent_never_pushed"] == 0 and c["good_token_failed"] == 0),
            "no push to a dead token": c["bad_token_pushed"] == 0,
            "a terminal status is never overwritten": c["terminal_overwritten"] == 0,
            "no claim, no push after a terminal status": (
                c["claims_after_terminal"] == 0 and c["pushes_after_terminal"] == 0),
            "duplicate pushes only of rows in flight at a lease expiry": duplicated <= self.in_flight,
            "duplicate pushes <= rows in flight at the lease expiries": r.duplicates <= r.duplicate_bound,
            f"every poison row dead-lettered at its limit ({dr.MAX_ATTEMPTS}), never pushed": (
                c["poison_dead_lettered"] == c["poison_rows"] and c["poison_pushed"] == 0),
            # the fence's promise, checked with the fence and without it: unfenced, it breaks
            "zero stale writes (the fence's promise)": r.stale_writes == 0,
        }
        r.details = {**{k: v for k, v in c.items() if k not in ("deliveries", "stale_writes")},
                     "clock_jumps": self.jumps,
                     "sent": self.sql("SELECT count(*) FROM delivery WHERE status = 'sent'")[0][0],
                     "failed": self.sql("SELECT count(*) FROM delivery WHERE status = 'failed'")[0][0]}


# -- queue ----------------------------------------------------------------------------------------


class _QueueRun(_Run):
    progress_kind = "ran"
    LEASE = "30 seconds"

    def __init__(self, lab: Lab, report: TortureReport, deadline: float, max_attempts: int, job_ms: float):
        super().__init__(lab, report, deadline)
        self.max_attempts = max_attempts
        self.job_ms = job_ms
        self.poison = 7
        self.reaps = 0

    def setup(self, items: int) -> None:
        cl.fresh_jobs(self.lab, 0)
        self.sql("DROP TABLE IF EXISTS effect_log, effect_once")
        cl.add_leases(self.lab)
        cl.add_effects(self.lab)
        self.add(items)

    def insert(self, first: int, last: int) -> None:
        self.fill(QUEUE_FILL, {"first": first, "last": last}, last - first + 1)

    def new_worker(self, slot: int) -> Worker:
        name = f"queue-{slot + 1}-{self.gen}"
        return Worker(queue_loop, name=name, dsn=self.lab.db.dsn, schema=self.lab.schema,
                      worker_id=name, batch=self.report.batch, job_ms=self.job_ms, effects=("log",),
                      poison=(self.poison,), report="jobs", idle_exit_s=self.idle_exit_s)

    def left(self) -> tuple[int, int]:
        return tuple(self.sql("SELECT count(*) FILTER (WHERE status = 'PENDING'), "
                              "count(*) FILTER (WHERE status = 'IN_PROGRESS') FROM job")[0])

    def work_left(self) -> bool:
        return sum(self.left()) > 0

    def claimable(self) -> int:
        return self.left()[0]

    def reap(self) -> None:
        """The reaper, with its clock a lease ahead: every claim made before now counts as
        expired -- a killed worker's, and those of live workers that were mid-job."""
        try:
            cl.reap(self.lab, lease=self.LEASE, max_attempts=self.max_attempts,
                    as_of=self.sql("SELECT now() + %s::interval + interval '1 second'", (self.LEASE,))[0][0])
        except ServerError as exc:
            raise ServerError(f"The torture run stopped: the server went away after "
                              f"{self.report.kills} kills ({exc.what})",
                              "start the server again (`labkit server start`) and repeat the run.") from None
        self.reaps += 1

    def unstick(self) -> None:
        self.reap()

    def stuck(self) -> bool:
        pending, in_progress = self.left()
        return pending == 0 and in_progress > 0

    def strike(self, k: _Kill, victim: Worker) -> None:
        if k.kind == "sigkill":
            self.kill_proc(victim)
        else:
            self.terminate(victim, k.after)
        self.reap()

    def check(self) -> None:
        r = self.report
        c = queue_counts(self.lab, self.max_attempts)
        poison = self.sql("SELECT status, attempts FROM job WHERE id = %s", (self.poison,))
        r.items = c["jobs"]
        r.lost = c["unfinished"] + c["done_never_ran"]
        r.duplicates = c["duplicate_runs"]
        r.duplicate_bound = c["reaped"]
        r.invariants = {
            "every job ended DONE or DEAD": c["unfinished"] == 0,
            "no job marked DONE without running": c["done_never_ran"] == 0,
            f"attempts never above the maximum ({self.max_attempts})": c["max_attempts_seen"] <= self.max_attempts,
            "DEAD exactly at the maximum, DONE below it": c["dead_not_at_max"] == 0 and c["done_at_max"] == 0,
            "re-runs only of jobs the reaper took back": c["reruns_never_reaped"] == 0,
            "re-runs <= the reaper's take-backs": r.duplicates <= r.duplicate_bound,
            "the poison job was dead-lettered": bool(poison) and poison[0] == ("DEAD", self.max_attempts),
        }
        r.details = {"done": c["done"], "dead": c["dead"], "reaped": c["reaped"],
                     "max_attempts_seen": c["max_attempts_seen"], "reaper_runs": self.reaps,
                     "poison_job": {"id": self.poison, "status": poison[0][0] if poison else None}}


# -- entry points -----------------------------------------------------------------------------------


def torture(lab: Lab, dialect: str, *, kills: int = 20, seed: int = 1, workers: int = 2,
            batch: int | None = None, items: int | None = None, fence: bool = True,
            max_attempts: int = 5, job_ms: float = 1.0, max_seconds: float = 300,
            broker: brokers.Broker | None = None, relay_order: str = "outbox") -> TortureReport:
    """Run one torture: ``kills`` faults at seeded random points, restarts until the work
    is done, then the invariants checked from the database (and broker).

    ``batch`` rows per claim (relay 10, drain 5, queue 2); ``items`` the work to start
    with (more is added while kills remain); ``fence`` (drain) fenced completions;
    ``max_attempts`` (queue) the reaper's dead-letter limit; ``max_seconds`` bounds the
    kill phase (the run then finishes the work and reports ``stopped_early``);
    ``relay_order="commit-first"`` tortures the dual-write bug instead of the outbox relay
    (the checks then find the events it lost)."""
    batch, items = _sizes(dialect, workers, batch, items)
    check_params(dialect, kills=kills, workers=workers, batch=batch, items=items,
                 max_seconds=max_seconds, seed=seed)
    if dialect == "queue" and (not isinstance(max_attempts, int) or max_attempts < 1):
        raise LabkitError(f"max_attempts={max_attempts!r} dead-letters every job at once.",
                          "pass max_attempts=1 or more (5 by default).")
    if dialect == "queue":
        number("max_attempts", max_attempts, low=1, high=MAX_ATTEMPTS, whole=True, example=5)
    if relay_order not in rl.Relay.ORDERS:
        raise LabkitError(f"No relay order {relay_order!r}.", f"use one of {rl.Relay.ORDERS}.")
    if not isinstance(job_ms, (int, float)) or job_ms < 0:
        raise LabkitError(f"job_ms={job_ms!r} is a negative duration.", "pass job_ms >= 0.")
    number("job_ms", job_ms, high=MAX_JOB_MS, unit=" ms", example=1)
    report = TortureReport(dialect, seed, workers, batch, kills,
                           fence=fence if dialect == "drain" else None)
    t0 = time.monotonic()
    deadline = t0 + max_seconds
    own_broker = False
    relay_broker: brokers.Broker | None = None         # the relay dialect's broker
    if dialect == "relay":
        own_broker = broker is None
        relay_broker = broker or brokers.for_lab(lab)
        relay_broker.reset()
        run: _Run = _RelayRun(lab, report, deadline, relay_broker, relay_order)
    elif dialect == "drain":
        run = _DrainRun(lab, report, deadline, fence)
    else:
        run = _QueueRun(lab, report, deadline, max_attempts, job_ms)
    try:
        try:
            run.setup(items)
            run.kill_phase(iter_plan(dialect, kills, seed, workers, batch))
            run.finish_phase(timeout=max(60.0, max_seconds / 2))
        finally:
            run.kill_all()
            if relay_broker is not None:
                _switch_on(relay_broker)
        run.check()
    except psycopg.OperationalError as exc:
        raise ServerError(f"The torture run stopped: the server went away after {report.kills} "
                          f"kills ({str(exc).strip().splitlines()[0] if str(exc).strip() else exc}).",
                          "start the server again (`labkit server start`) and repeat the run: it "
                          "rebuilds its tables from scratch.") from None
    finally:
        if own_broker and relay_broker is not None:
            try:
                relay_broker.discard()
            except Exception:
                pass
            relay_broker.close()
    report.wall_s = time.monotonic() - t0
    return report


def _sizes(dialect: str, workers, batch, items) -> tuple:
    """The batch and the starting work of a run, by default from the dialect and workers."""
    batch = DEFAULT_BATCH.get(dialect, 1) if batch is None else batch
    if items is None and isinstance(batch, int) and isinstance(workers, int):
        items = max(40, batch * max(workers, 1) * 6)
    return batch, items


def _switch_on(broker: brokers.Broker) -> None:
    """Leave the broker on, even when the run was interrupted in the middle of switching
    it (its connection may then be unusable: use a fresh one)."""
    try:
        broker.set_up(True)
        return
    except Exception:
        pass
    fresh = brokers.from_spec(broker.spec(), role="broker:cleanup")
    try:
        fresh.set_up(True)
    finally:
        fresh.close()


def torture_command(*, open_lab: Callable[[], Lab], dialect: str, kills: int, seed: int, workers: int,
                    batch: int | None, fence: bool, max_seconds: float, broker: str | None, order: str,
                    json: bool) -> int:
    """``labkit torture relay|drain|queue --kills N --seed S [--json]``: exit 1 when an
    invariant breaks.  ``open_lab()`` gives the run its own lab."""
    # the parameters first: nothing is created for a run that cannot happen
    rows, items = _sizes(dialect, workers, batch, None)
    check_params(dialect, kills=kills, workers=workers, batch=rows, items=items,
                 max_seconds=max_seconds, seed=seed)
    with open_lab() as lab:
        bk = brokers.for_lab(lab, broker) if dialect == "relay" else None
        try:
            rep = torture(lab, dialect, kills=kills, seed=seed, workers=workers,
                          batch=batch, fence=fence, max_seconds=max_seconds,
                          broker=bk, relay_order=order)
        finally:
            if bk is not None:
                bk.discard()
                bk.close()
    print(rep.to_json() if json else str(rep))
    return 0 if rep.invariants_hold else 1
