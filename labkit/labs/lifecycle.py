"""A worker's life on the production job table: heartbeats, zombies, and a graceful stop.

Real worker processes (:class:`labkit.core.procs.Worker`) poll production.sql's job table:
each runs the reaper (``reap`` in ``labkit/sql/lifecycle.sql``: a RUNNING job whose lease has
run out goes back to PENDING), then production.sql's ``claim`` (a lease of ``lease_s`` and
``claim_version + 1``), logs the handler's start in ``job_run`` (fenced: no claim, no run),
runs the handler and writes production.sql's ``complete`` (fenced by ``claim_version``).

* :func:`heartbeat_trace`: a job longer than its lease.  Without a heartbeat the lease runs
  out mid-handler, the second worker re-claims the job and runs it again (2 runs, and the
  first worker's complete matches 0 rows).  With a heartbeat every ``lease_s / 3`` (in the
  handler's own work loop, on the worker's connection, fenced by ``claim_version``) the lease
  never runs out: 1 run.
* :func:`zombie_trace`: a worker frozen with SIGSTOP past its lease; the other worker
  re-claims the job (``claim_version`` 2).  Resumed with SIGCONT, the zombie's heartbeat
  matches 0 rows, and it stops its handler without writing anything.
* :func:`shutdown_trace`: a worker that holds a small batch of claims (``per_worker_batch``:
  it claims several jobs, then runs them one by one, so it holds claims it has not started)
  is killed with SIGKILL: every claim it held stays RUNNING until its lease runs out, while
  the other workers go idle.  The same worker stopped with SIGTERM instead stops claiming,
  hands back the claims it has not started (``release``: PENDING at once, the attempt given
  back), finishes the job in hand if it can within ``deadline_s`` (else hands it back too,
  the attempt kept: the handler did start) and exits 0: no claim waits for a lease.

Choices, each visible in ``lifecycle.sql``:

* An expired lease is re-claimed through a **reaper** (``reap``), not a claim variant: every
  worker runs it before it claims, production.sql's claim stays unchanged, the reaper reads
  ``job_lease_idx``.  It keeps the attempt the claim counted and dead-letters a job that is
  out of attempts (a job that keeps killing its worker).
* The heartbeat is **interleaved** with the handler's work (every ``lease_s / 3``, between
  slices of work, on the worker's own connection), not a thread: it stops when the handler
  stops making progress, so a hung handler loses its lease.  A thread would keep a hung
  handler's lease alive for ever (it would need a progress watchdog); interleaving cannot
  beat during one long blocking call (that call needs a timeout shorter than the lease).
* ``release`` gives an **unstarted** claim its attempt back (a deploy must not push jobs
  toward the dead letter without running them) and **keeps** it for a job stopped mid-run
  (its handler did start, and may have had effects).

:func:`plot_leases` draws the heartbeat runs as a timeline, one lane per worker: the lease
each claim held, the handler, the heartbeats, the reaper and each completion, landed or
refused by the fence (:func:`lease_spans` is the same, as numbers).

Each trace scripts who claims first (the workers wait at a start gate) and returns counts and
an ordered event list of ``(worker, event, claim_version)``: the order is reproducible, the
times are not (they are real).
"""

from __future__ import annotations

import contextlib
import json as jsonlib
import math
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypedDict

from ..core.db import WORKER_GUARDS, open_connection
from ..core.errors import LabkitError
from ..core.lab import Lab
from ..core.limits import number
from ..core.procs import Context, Worker
from ..core.queries import query
from ..core.results import Result
from ..core.text import wrap
from ._checked import one_row_named, started_pid
from .production import fresh_table

LEASE_S = 1.0              # heartbeat traces: a short lease...
JOB_S = 2.5                # ...and a job that outlasts it
SHUTDOWN_LEASE_S = 30.0    # shutdown trace: a production-like lease, long next to a job
SHUTDOWN_JOB_S = 0.3
DEADLINE_S = 2.0
JOBS = 8
BATCH = 3
WORKERS = 2

POLL_S = 0.1               # an idle worker polls this often (or a quarter lease, if less)
SLICE_S = 0.02             # the handler works in slices; between them it checks the time
ROLE = "life-w"            # sessions are labkit:<schema>:life-w1, life-w2, ...
PARENT = "parent"


def _sql(name: str, file: str = "lifecycle.sql") -> str:
    return query(file, name).sql


def _role(name: str) -> str:
    return ROLE + name.rsplit(" ", 1)[-1]


# -- parameters ------------------------------------------------------------------------------------


def check_heartbeat(*, lease_s: float, job_s: float) -> None:
    """``lease_s`` from 0.2 to 60 s; ``job_s`` longer than the lease (else a heartbeat has
    nothing to do) and at most 300 s."""
    number("lease_s", lease_s, low=0.2, high=60, unit=" s", example=LEASE_S)
    number("job_s", job_s, high=300, unit=" s", example=JOB_S)
    if job_s <= lease_s:
        raise LabkitError(f"job_s={job_s:g} does not outlast the lease (lease_s={lease_s:g}): "
                          "the lease never runs out mid-job, with or without a heartbeat.",
                          f"pass job_s above lease_s, e.g. job_s={2.5 * lease_s:g} for lease_s={lease_s:g}.")


def check_shutdown(*, workers: int, jobs: int, per_worker_batch: int, job_s: float, lease_s: float,
                   deadline_s: float) -> None:
    """Every number in range, and the shapes the counting needs: a batch of at least 2 (a
    worker that holds one claim has nothing unstarted to hand back), a second worker to take
    what the first hands back, a lease longer than the run and the deadline."""
    number("workers", workers, low=2, high=4, whole=True, example=WORKERS)
    number("per_worker_batch", per_worker_batch, low=2, high=20, whole=True, example=BATCH)
    number("jobs", jobs, low=2, high=100, whole=True, example=JOBS)
    number("job_s", job_s, low=0.05, high=10, unit=" s", example=SHUTDOWN_JOB_S)
    number("lease_s", lease_s, low=10, high=3600, unit=" s", example=SHUTDOWN_LEASE_S)
    number("deadline_s", deadline_s, low=0, above=True, high=60, unit=" s", example=DEADLINE_S)
    if jobs < per_worker_batch:
        raise LabkitError(f"jobs={jobs} is fewer than one batch (per_worker_batch={per_worker_batch}).",
                          f"pass jobs >= per_worker_batch (defaults: {JOBS} and {BATCH}).")
    if jobs * job_s > lease_s / 2:
        raise LabkitError(f"{jobs} jobs of {job_s:g} s take {jobs * job_s:g} s: the killed worker's "
                          f"leases ({lease_s:g} s) could run out before the count.",
                          "pass fewer or shorter jobs (jobs * job_s <= lease_s / 2), or a longer lease_s.")
    if deadline_s >= lease_s:
        raise LabkitError(f"deadline_s={deadline_s:g} is not shorter than the lease ({lease_s:g} s): a "
                          "stopping worker could still be finishing after its lease ran out.",
                          f"pass deadline_s below lease_s (default {DEADLINE_S:g} s; the grace period "
                          "the platform gives, minus a margin).")


# -- the worker (a child process) ------------------------------------------------------------------


class _StopFlag:
    """SIGTERM's handler in the worker: it notes the time and nothing else (no I/O in a signal
    handler); the worker's loops look at it between statements and between handler slices."""

    def __init__(self) -> None:
        self.at: float | None = None
        self.told = False

    def __call__(self, signum, frame) -> None:
        if self.at is None:
            self.at = time.monotonic()

    def __bool__(self) -> bool:
        return self.at is not None

    def past(self, deadline_s: float) -> bool:
        """SIGTERM came more than ``deadline_s`` ago."""
        return self.at is not None and time.monotonic() > self.at + deadline_s


def lifecycle_worker(ctx: Context, dsn: str, schema: str, lease_s: float, job_s: float,
                     heartbeat: bool = False, batch: int = 1, max_jobs: int = 0,
                     deadline_s: float = DEADLINE_S) -> dict:
    """Child process: reap, claim up to ``batch`` jobs, run them one by one (each ``job_s`` of
    work, heartbeating every ``lease_s / 3`` if ``heartbeat``), complete them; until it has
    handled ``max_jobs`` (0: no limit) or SIGTERM stops it.

    SIGTERM does not end the process: its handler sets a flag.  The worker then claims no
    more, hands back (``release``) the claims it holds but has not started, lets the job in
    hand finish until ``deadline_s`` after the signal (past that it stops the handler and hands
    that job back too) and returns, so the process exits 0."""
    stop = _StopFlag()
    signal.signal(signal.SIGTERM, stop)
    name = ctx.name
    held: list[tuple[int, int]] = []          # claimed, not started: (id, claim_version)

    def release(claims: list[tuple[int, int]], started: bool) -> list[int]:
        if not claims:
            return []
        ids = [r[0] for r in conn.execute(_sql("release"), {
            "ids": [c[0] for c in claims], "claim_versions": [c[1] for c in claims],
            "started": started}).fetchall()]
        ctx.emit("released", ids=sorted(ids), started=started,
                 claim_versions=[v for i, v in claims if i in ids])
        return ids

    def noticed() -> bool:
        """True once SIGTERM came; the first time, say so and hand back the unstarted claims."""
        if stop.at is None:
            return False
        if not stop.told:
            stop.told = True
            ctx.emit("sigterm", after_s=time.monotonic() - stop.at)
            release(held, started=False)
            held.clear()
        return True

    def handle(job_id: int, version: int) -> str:
        if conn.execute(_sql("start"), {"id": job_id, "claim_version": version,
                                        "worker": name}).fetchone() is None:
            ctx.emit("lost_before_start", id=job_id, claim_version=version)
            return "lost"
        ctx.emit("started", id=job_id, claim_version=version)
        every = lease_s / 3
        next_beat = time.monotonic() + every
        for _ in range(max(1, math.ceil(job_s / SLICE_S - 1e-9))):
            time.sleep(SLICE_S)                 # a slice of work (a frozen process does none)
            if heartbeat and time.monotonic() >= next_beat:
                rows = conn.execute(_sql("heartbeat"), {"id": job_id, "claim_version": version,
                                                        "lease_s": lease_s}).fetchall()
                ctx.emit("heartbeat", id=job_id, claim_version=version, rows=len(rows))
                if not rows:
                    ctx.emit("handler_stopped", id=job_id, claim_version=version)
                    return "lost"
                next_beat = time.monotonic() + every
            if noticed() and stop.past(deadline_s):
                release([(job_id, version)], started=True)
                return "abandoned"
        n = len(conn.execute(query("production.sql", "complete").sql,
                             {"id": job_id, "claim_version": version}).fetchall())
        ctx.emit("completed", id=job_id, claim_version=version, rows=n)
        return "finished"

    outcomes: dict[str, int] = {}
    with open_connection(dsn, schema=schema, role=_role(name), guards=WORKER_GUARDS) as conn:
        ctx.emit("ready", backend_pid=conn.info.backend_pid)
        ctx.pause("ready")                      # the parent says when to start
        poll_s = min(POLL_S, lease_s / 4)
        handled, idle = 0, False
        while not (max_jobs and handled >= max_jobs) and not noticed():
            for job_id, version, status in conn.execute(_sql("reap")).fetchall():
                ctx.emit("reaped", id=job_id, claim_version=version, status=status)
            # a claim's time is taken before it is sent: the server starts the lease at its
            # now(), after this, so a lease drawn from it never ends later than the server's
            asked = time.monotonic()
            while len(held) < batch and not stop:
                row = conn.execute(query("production.sql", "claim").sql,
                                   {"worker": name, "lease_s": lease_s}).fetchone()
                if row is None:
                    break
                held.append((row[0], row[5]))
            if noticed():
                break
            if not held:
                if not idle:
                    ctx.emit("idle")
                    idle = True
                until = time.monotonic() + poll_s
                while time.monotonic() < until and not stop:
                    time.sleep(SLICE_S)
                continue
            idle = False
            ctx.emit("claimed", ids=[c[0] for c in held], claim_versions=[c[1] for c in held], t=asked)
            while held and not noticed():
                job_id, version = held.pop(0)
                out = handle(job_id, version)
                outcomes[out] = outcomes.get(out, 0) + 1
                handled += 1
        noticed()
        ctx.emit("exiting", handled=handled)
    return {"handled": handled, "outcomes": outcomes}


# -- the parent's side -------------------------------------------------------------------------


def _setup(lab: Lab, jobs: int) -> None:
    lab.execute(_sql("drop"))
    fresh_table(lab)
    lab.execute(_sql("runs"))
    lab.execute(_sql("enqueue"), {"n": jobs})


def _statuses(lab: Lab) -> dict[str, int]:
    return one_row_named(lab.admin.execute(_sql("statuses")), "lifecycle.sql's statuses")


def _held(lab: Lab, worker: str) -> tuple[int, float]:
    waiting, left = lab.execute(_sql("held"), {"worker": worker})[0]
    return int(waiting), float(left)


@contextlib.contextmanager
def _workers(lab: Lab, n: int, timeout: float, **kw: Any) -> Iterator[list[Worker]]:
    """``n`` started workers, each connected and waiting at its start gate; every one of
    them is killed on the way out (an error, Ctrl-C), whatever state it is in."""
    procs = [Worker(lifecycle_worker, name=f"worker {i + 1}", dsn=lab.db.dsn, schema=lab.schema, **kw)
             for i in range(n)]
    try:
        for w in procs:
            w.start()
        for w in procs:
            w.wait_for("paused", tag="ready", timeout=timeout)
        yield procs
    finally:
        for w in procs:
            w.kill()


def _send(w: Worker, sig: signal.Signals, log: list[dict]) -> None:
    log.append({"kind": "signal", "signal": sig.name, "to": w.name, "t": time.monotonic(),
                "name": PARENT})
    os.kill(started_pid(w), sig)


def _until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise LabkitError(f"{what} did not happen within {timeout:.0f} s.",
                              "the machine may be overloaded: run `labkit doctor`, then try again.")
        time.sleep(0.02)


def _check_exit(w: Worker, timeout: float) -> int | None:
    code = w.wait_exit(timeout)
    failed = [e for e in w.events if e["kind"] == "failed"]
    if failed:
        raise LabkitError(f"{w.name} failed: {failed[-1]['error']}",
                          "read the error; run `labkit doctor` if the server is in doubt.")
    return code


SIGNAL_TEXT = {"SIGSTOP": "SIGSTOP: frozen mid-handler", "SIGCONT": "SIGCONT: running again",
               "SIGTERM": "SIGTERM", "SIGKILL": "SIGKILL: dies at once"}


def _ids(ids: list[int]) -> str:
    return ("job " if len(ids) == 1 else "jobs ") + ", ".join(map(str, ids))


def _describe(e: dict, lease_s: float) -> tuple[str, str, int | None] | None:
    """One event as ``(worker, what happened, claim_version)``, or None if not shown."""
    who, kind, v = e.get("name", ""), e["kind"], e.get("claim_version")
    if kind == "signal":
        return (e["to"], SIGNAL_TEXT[e["signal"]], None)
    if kind == "claimed":
        vs = sorted(set(e["claim_versions"]))
        return (who, f"claims {_ids(e['ids'])}", vs[0] if len(vs) == 1 else None)
    if kind == "started":
        return (who, f"starts job {e['id']}'s handler (run logged)", v)
    if kind == "reaped":
        return (who, f"reaper: job {e['id']}'s lease ran out, back to {e['status']}", v)
    if kind == "heartbeat":
        if e["rows"]:
            return (who, f"heartbeat every {lease_s / 3:.2g} s: lease extended to now + {lease_s:g} s", v)
        return (who, "heartbeat matches 0 rows: the claim is no longer its own", v)
    if kind == "handler_stopped":
        return (who, "stops its handler, writes nothing", v)
    if kind == "completed":
        return (who, f"handler done; complete matches {e['rows']} row{'s' if e['rows'] != 1 else ''}"
                + ("" if e["rows"] else " (fenced: this run is wasted)"), v)
    if kind == "sigterm":
        return (who, "notices SIGTERM: claims nothing more", None)
    if kind == "released":
        if not e["ids"]:
            return None
        vs = sorted(set(e["claim_versions"]))
        what = (f"deadline passed: stops {_ids(e['ids'])} mid-run, hands it back (attempt kept)"
                if e["started"] else f"hands back {_ids(e['ids'])}, not started (attempts given back)")
        return (who, what, vs[0] if len(vs) == 1 else None)
    if kind == "lost_before_start":
        return (who, f"job {e['id']} is no longer its own: not started", v)
    if kind == "exiting":
        return (who, f"returns after {e['handled']} job{'s' if e['handled'] != 1 else ''}: exit 0", None)
    return None


def _events(workers: list[Worker], parent: list[dict], lease_s: float,
            keep: Callable[[dict], bool] = lambda e: True) -> list[tuple[str, str, int | None]]:
    """Every worker's events and the parent's signals, in the order they happened (one clock:
    CLOCK_MONOTONIC is the machine's), described; a worker's successful heartbeats under one
    claim are shown once, where the first one happened."""
    every = sorted([{**e, "name": w.name} for w in workers for e in w.events] + parent,
                   key=lambda e: e["t"])
    out, beats = [], set()
    for e in every:
        if not keep(e):
            continue
        if e["kind"] == "heartbeat" and e["rows"]:
            key = (e["name"], e["claim_version"])
            if key in beats:
                continue
            beats.add(key)
        line = _describe(e, lease_s)
        if line is not None:
            out.append(line)
    return out


def _count(w: Worker, kind: str, **match: Any) -> int:
    return sum(1 for e in w.events if e["kind"] == kind and all(e.get(k) == v for k, v in match.items()))


TIMELINE_KINDS = ("claimed", "started", "heartbeat", "reaped", "completed", "handler_stopped",
                  "idle", "signal")


@dataclass(frozen=True)
class LeaseEvent(Result):
    """One timed event of a heartbeat or zombie run, for :func:`lease_spans` and
    :func:`plot_leases`.

    worker: the worker it happened in (a signal: the worker it was sent to).
    kind: ``claimed``, ``started``, ``heartbeat``, ``reaped``, ``completed``,
        ``handler_stopped``, ``idle`` or ``signal``.
    t: seconds since worker 1's first claim, on the machine's monotonic clock (a claim's
        time is when it was sent, before the server started its lease).
    claim_version: the claim it belongs to (None: no claim, or a claim of several versions).
    rows: rows the heartbeat or the complete matched (None for the other kinds).
    signal: the signal sent, ``SIGSTOP``, ``SIGCONT``, ... (None for the other kinds).
    """

    worker: str
    kind: str
    t: float
    claim_version: int | None
    rows: int | None
    signal: str | None


def _timeline(workers: list[Worker], parent: list[dict]) -> list[LeaseEvent]:
    """The run's events as timed records for a drawing, in the order they happened."""
    every = sorted([{**e, "name": w.name} for w in workers for e in w.events] + parent,
                   key=lambda e: e["t"])
    every = [e for e in every if e["kind"] in TIMELINE_KINDS]
    t0 = next((e["t"] for e in every if e["kind"] == "claimed"), every[0]["t"] if every else 0.0)

    def version(e: dict) -> int | None:
        if e["kind"] == "claimed" and len(set(e["claim_versions"])) == 1:
            return e["claim_versions"][0]
        return e.get("claim_version")

    return [LeaseEvent(worker=e["to"] if e["kind"] == "signal" else e["name"], kind=e["kind"],
                       t=round(e["t"] - t0, 4), claim_version=version(e),
                       rows=e.get("rows"), signal=e.get("signal")) for e in every]


def _timeout(*seconds: float) -> float:
    return 30 + 2 * sum(seconds)


# -- 1. heartbeats -------------------------------------------------------------------------------


Events = list[tuple[str, str, int | None]]
"""A run's events, described for print (:func:`format_events`): (worker, what happened,
claim_version or None)."""


@dataclass(frozen=True)
class HeartbeatRun(Result):
    """One job longer than its lease, two worker processes (:func:`heartbeat_trace`).

    heartbeat: whether the workers heartbeat.
    lease_s: the lease, in seconds.
    job_s: how long the job's handler works, in seconds.
    runs: rows in the runs log: how many times the handler started.
    claims: the job's claim_version at the end: how many times it was claimed.
    completes_landed: completes that matched the row.
    completes_refused: completes that matched 0 rows (fenced off).
    heartbeats: heartbeats that matched the row, all workers.
    final_status: the job's status at the end.
    exit_codes: each worker's exit code, by name (None: it did not exit).
    events: the run's events, described, for :func:`format_events`.
    timeline: the run's timed events, for :func:`lease_spans` and :func:`plot_leases`.
    """

    heartbeat: bool
    lease_s: float
    job_s: float
    runs: int
    claims: int
    completes_landed: int
    completes_refused: int
    heartbeats: int
    final_status: str
    exit_codes: dict[str, int | None]
    events: Events
    timeline: list[LeaseEvent]


def heartbeat_trace(lab: Lab, *, lease_s: float = LEASE_S, job_s: float = JOB_S,
                    heartbeat: bool) -> HeartbeatRun:
    """One job of ``job_s`` (longer than its lease ``lease_s``) and two worker processes.
    Worker 1 claims it first (scripted); worker 2 polls.  Without a heartbeat worker 2's
    reaper finds the lease run out mid-handler, worker 2 re-claims and runs the job again:
    ``runs == 2``, and worker 1's complete matches 0 rows.  With a heartbeat every
    ``lease_s / 3`` the lease never runs out: ``runs == 1`` (worker 2 is then stopped with
    SIGTERM).  Each worker handles at most one job.

    Returns a :class:`HeartbeatRun`: ``runs`` (rows in the runs log), ``claims`` (the job's
    claim_version at the end), ``completes_landed``, ``completes_refused``, ``heartbeats``
    (successful ones, all workers), ``final_status``, ``exit_codes``, ``events`` (described,
    for print) and ``timeline`` (timed records, for :func:`plot_leases`)."""
    check_heartbeat(lease_s=lease_s, job_s=job_s)
    _setup(lab, 1)
    timeout = _timeout(lease_s, job_s)
    parent: list[dict] = []
    with _workers(lab, 2, timeout, lease_s=lease_s, job_s=job_s, heartbeat=heartbeat, max_jobs=1) as ws:
        w1, w2 = ws
        w1.resume()
        w1.wait_for("started", timeout=timeout)
        w2.resume()
        if heartbeat:
            w1.wait_for("completed", timeout=timeout)
            _send(w2, signal.SIGTERM, parent)
        codes = {w.name: _check_exit(w, timeout) for w in ws}
    s = _statuses(lab)
    status, version = lab.execute("SELECT status, claim_version FROM job WHERE id = 1")[0]
    events = _events(ws, parent, lease_s,
                     keep=lambda e: e["kind"] != "exiting"
                     and not (e["kind"] == "signal" and e.get("to") == w2.name)
                     and not (e["kind"] == "sigterm" and e.get("name") == w2.name))
    if heartbeat:   # worker 2 never found the job free; the lab ends it once worker 1 is done
        events.append((w2.name, "found nothing to claim: the lease never ran out (the lab stops it)", None))
    return HeartbeatRun(
        heartbeat=heartbeat, lease_s=lease_s, job_s=job_s,
        runs=s["runs"], claims=int(version),
        completes_landed=sum(_count(w, "completed", rows=1) for w in ws),
        completes_refused=sum(_count(w, "completed", rows=0) for w in ws),
        heartbeats=sum(_count(w, "heartbeat", rows=1) for w in ws),
        final_status=status, exit_codes=codes, events=events,
        timeline=_timeline(ws, [p for p in parent if p["to"] != w2.name]),
    )


@dataclass(frozen=True)
class ZombieRun(Result):
    """A worker frozen past its lease, then resumed (:func:`zombie_trace`).

    lease_s: the lease, in seconds.
    job_s: how long the job's handler works, in seconds.
    zombie_heartbeat_rows: rows the resumed worker's heartbeat matched (0: fenced off).
    zombie_stopped: whether it then stopped its handler.
    zombie_completes: completes it wrote (0: it wrote no outcome).
    zombie_claim_version: the claim_version its heartbeat was fenced by (1).
    owner_claim_version: the job's claim_version at the end (2: worker 2's claim).
    runs: rows in the runs log: how many times the handler started.
    final_status: the job's status at the end.
    exit_codes: each worker's exit code, by name (None: it did not exit).
    events: the run's events, described, for :func:`format_events`.
    timeline: the run's timed events, for :func:`lease_spans` and :func:`plot_leases`.
    """

    lease_s: float
    job_s: float
    zombie_heartbeat_rows: int
    zombie_stopped: bool
    zombie_completes: int
    zombie_claim_version: int
    owner_claim_version: int
    runs: int
    final_status: str
    exit_codes: dict[str, int | None]
    events: Events
    timeline: list[LeaseEvent]


LeaseRun = HeartbeatRun | ZombieRun
"""What :func:`lease_spans` and :func:`plot_leases` read: a heartbeat run or a zombie run."""


def zombie_trace(lab: Lab, *, lease_s: float = LEASE_S, job_s: float = JOB_S) -> ZombieRun:
    """Both workers heartbeat.  Worker 1 claims the job and heartbeats once; then it is frozen
    (SIGSTOP) past its lease.  Worker 2's reaper puts the job back, worker 2 re-claims it
    (claim_version 2), starts and heartbeats.  Worker 1 is resumed (SIGCONT): its next
    heartbeat, fenced by claim_version 1, matches 0 rows and it stops its handler without
    writing anything; worker 2 finishes the job.

    Returns a :class:`ZombieRun`: ``zombie_heartbeat_rows`` (0), ``zombie_stopped`` (True), ``zombie_completes``
    (0: the zombie wrote no outcome), ``zombie_claim_version``, ``owner_claim_version``,
    ``runs`` (2: both started), ``final_status``, ``exit_codes``, ``events`` and ``timeline``
    (as :func:`heartbeat_trace`'s)."""
    check_heartbeat(lease_s=lease_s, job_s=job_s)
    _setup(lab, 1)
    timeout = _timeout(lease_s, job_s)
    parent: list[dict] = []
    with _workers(lab, 2, timeout, lease_s=lease_s, job_s=job_s, heartbeat=True, max_jobs=1) as ws:
        w1, w2 = ws
        w1.resume()
        w1.wait_for("started", timeout=timeout)
        w1.wait_for("heartbeat", rows=1, timeout=timeout)
        _send(w1, signal.SIGSTOP, parent)
        w2.resume()
        w2.wait_for("started", timeout=timeout)
        w2.wait_for("heartbeat", rows=1, timeout=timeout)
        _send(w1, signal.SIGCONT, parent)
        stopped = w1.wait_for("handler_stopped", timeout=timeout)
        codes = {w.name: _check_exit(w, timeout) for w in ws}
    beat = [e for e in w1.events if e["kind"] == "heartbeat"][-1]
    status, version = lab.execute("SELECT status, claim_version FROM job WHERE id = 1")[0]
    return ZombieRun(
        lease_s=lease_s, job_s=job_s,
        zombie_heartbeat_rows=beat["rows"], zombie_stopped=bool(stopped),
        zombie_completes=_count(w1, "completed"),
        zombie_claim_version=beat["claim_version"], owner_claim_version=int(version),
        runs=_statuses(lab)["runs"], final_status=status, exit_codes=codes,
        events=_events(ws, parent, lease_s, keep=lambda e: e["kind"] != "exiting"),
        timeline=_timeline(ws, parent),
    )


@dataclass(frozen=True)
class LeaseSpan(Result):
    """One claim of a heartbeat or zombie run, from its timeline (:func:`lease_spans`).  Times
    are seconds since worker 1's first claim.

    worker: the worker that claimed.
    claim_version: the claim's version (None: a claim of several versions).
    claimed: when it claimed, in seconds.
    started: when the handler started, in seconds (None: it did not).
    ended: when the handler ended, in seconds (None: it did not).
    heartbeats: when each heartbeat that matched a row was sent, in seconds.
    lease_end: the last extension plus the lease, in seconds.
    expired: whether the lease ran out before the claim ended (completed, or taken back by a
        reaper).
    reaped: when a reaper took it back, in seconds (None: none did).
    outcome: ``landed`` or ``refused`` (the complete matched 1 row or 0), ``stopped`` (a
        heartbeat matched 0 rows and the handler stopped), or None (it did not end).
    """

    worker: str
    claim_version: int | None
    claimed: float
    started: float | None
    ended: float | None
    heartbeats: list[float]
    lease_end: float
    expired: bool
    reaped: float | None
    outcome: str | None


def _claim_events(claim: LeaseEvent, events: list[LeaseEvent]) -> list[LeaseEvent]:
    """The events of one claim: its worker's, at its claim_version, from the claim on."""
    return [e for e in events if e.worker == claim.worker and e.claim_version == claim.claim_version
            and e.t >= claim.t]


def _reaped_at(claim: LeaseEvent, events: list[LeaseEvent]) -> float | None:
    """When a reaper took the claim back (a ``reaped`` event at its claim_version), or None."""
    return next((e.t for e in events if e.kind == "reaped" and e.t >= claim.t
                 and e.claim_version == claim.claim_version), None)


def _claim_outcome(end: LeaseEvent | None) -> str | None:
    """How a claim ended: ``"stopped"``, ``"landed"`` or ``"refused"``, or None (it did not)."""
    if end is None:
        return None
    if end.kind == "handler_stopped":
        return "stopped"
    return "landed" if end.rows else "refused"


def _lease_span(claim: LeaseEvent, events: list[LeaseEvent], lease_s: float) -> LeaseSpan:
    """One claim's span in :func:`lease_spans`, from the run's timeline."""
    mine = _claim_events(claim, events)
    beats = [e.t for e in mine if e.kind == "heartbeat" and e.rows]
    started = next((e.t for e in mine if e.kind == "started"), None)
    end = next((e for e in mine if e.kind in ("completed", "handler_stopped")), None)
    reaped = _reaped_at(claim, events)
    lease_end = max([claim.t, *beats]) + lease_s
    outcome = _claim_outcome(end)
    held_until = (reaped if reaped is not None
                  else end.t if end is not None and outcome == "landed" else None)
    return LeaseSpan(
        worker=claim.worker, claim_version=claim.claim_version, claimed=claim.t,
        started=started, ended=None if end is None else end.t, heartbeats=beats,
        lease_end=lease_end, expired=held_until is None or lease_end < held_until,
        reaped=reaped, outcome=outcome)


def lease_spans(run: LeaseRun) -> list[LeaseSpan]:
    """Each claim of a :func:`heartbeat_trace` (or :func:`zombie_trace`) run, from its
    ``timeline``: ``worker``, ``claim_version``, ``claimed``, ``started`` and ``ended`` (the
    handler's start and end), ``heartbeats`` (the times of those that matched a row),
    ``lease_end`` (the last extension plus the lease), ``expired`` (the lease ran out before
    the claim ended: completed, or taken back by a reaper), ``reaped`` (when a reaper took
    it back, or None) and ``outcome``: ``"landed"`` or ``"refused"`` (the complete matched 1 row
    or 0), ``"stopped"`` (a heartbeat matched 0 rows and the handler stopped), or None."""
    return [_lease_span(c, run.timeline, run.lease_s) for c in run.timeline if c.kind == "claimed"]


def _check_lease_runs(runs: tuple[Any, ...], titles: list[str] | None) -> None:
    """:func:`plot_leases`' arguments: traces' results, and one title per run if any."""
    if not runs or not all(isinstance(r, (HeartbeatRun, ZombieRun)) for r in runs):
        raise LabkitError("plot_leases draws the results of heartbeat_trace or zombie_trace.",
                          "pass what they returned, e.g. plot_leases(without, beating).")
    if titles is not None and len(titles) != len(runs):
        raise LabkitError(f"{len(titles)} titles for {len(runs)} runs.", "pass one title per run, or none.")


def _lease_colours() -> dict[str, str]:
    """The timeline's colours: the lease, the handler, the handler past its lease, a landed complete."""
    from ..core.plots import PALETTE

    return {"lease": PALETTE[5], "work": PALETTE[0], "late": PALETTE[2], "done": PALETTE[3]}


def _draw_lease(ax: Any, sp: LeaseSpan, y: float, colour: str) -> bool:
    """The lease a claim held (a bar), and the part still ahead when its handler ended
    (dotted); True if there was such a part."""
    # not expired: it ended (reaped, or its complete landed) before the lease ran out
    held_to = sp.lease_end if sp.expired else (sp.reaped if sp.reaped is not None else sp.ended)
    if held_to is None:
        held_to = sp.lease_end
    ax.barh(y, held_to - sp.claimed, left=sp.claimed, height=0.7, color=colour, alpha=0.45)
    if not sp.expired and sp.ended is not None and sp.lease_end > sp.ended:
        # the lease the last heartbeat gave, still ahead when the handler ended
        ax.barh(y, sp.lease_end - sp.ended, left=sp.ended, height=0.7, fill=False,
                edgecolor=colour, ls=":", lw=2.5)
        return True
    return False


def _draw_handler(ax: Any, sp: LeaseSpan, y: float, colours: dict[str, str]) -> None:
    """The handler running: in the work colour while the lease held, in the late one after."""
    if sp.started is None or sp.ended is None:
        return
    cut = min(max(sp.lease_end, sp.started), sp.ended) if sp.expired else sp.ended
    ax.barh(y, cut - sp.started, left=sp.started, height=0.3, color=colours["work"])
    if cut < sp.ended:
        ax.barh(y, sp.ended - cut, left=cut, height=0.3, color=colours["late"])


def _draw_claim_marks(ax: Any, sp: LeaseSpan, y: float, lane: dict[str, int], timeline: list[LeaseEvent],
                      colours: dict[str, str]) -> None:
    """A claim's marks: where its lease ran out, its heartbeats, the reaper (in the reaping
    worker's lane) and how its complete ended."""
    if sp.expired:
        ax.plot([sp.lease_end] * 2, [y - 0.35, y + 0.35], color="black", ls="--", lw=2)
    if sp.heartbeats:
        ax.plot(sp.heartbeats, [y] * len(sp.heartbeats), "|", color="black", ms=26, mew=2.5)
    if sp.reaped is not None:
        reaper = next(e.worker for e in timeline if e.kind == "reaped" and e.t == sp.reaped)
        ax.plot(sp.reaped, lane[reaper], "v", color="black", ms=14)
    if sp.outcome == "landed":
        ax.plot(sp.ended, y, "o", color=colours["done"], ms=16, mec="black")
    elif sp.outcome in ("refused", "stopped"):
        ax.plot(sp.ended, y, "X", color=colours["late"], ms=18, mec="black")
        ax.annotate("0 rows: fenced", (sp.ended, y), xytext=(16, 0),
                    textcoords="offset points", va="center", color=colours["late"])


def _draw_frozen(ax: Any, timeline: list[LeaseEvent], lane: dict[str, int]) -> bool:
    """Each SIGSTOP to SIGCONT of a worker, hatched in its lane; True if there was one."""
    frozen = False
    for stop in (e for e in timeline if e.kind == "signal" and e.signal == "SIGSTOP"):
        cont = next((e.t for e in timeline if e.kind == "signal"
                     and e.signal == "SIGCONT" and e.t > stop.t), None)
        if cont is not None and stop.worker in lane:
            ax.barh(lane[stop.worker], cont - stop.t, left=stop.t, height=0.3, color="white",
                    edgecolor="black", hatch="//", lw=0)
            frozen = True
    return frozen


def _lease_title(run: LeaseRun) -> str:
    """A panel's default title: with or without a heartbeat, the lease, the job, the runs."""
    times: dict[int | None, str] = {1: "once", 2: "twice"}
    runs_word = times.get(run.runs, f"{run.runs} times")
    beating = run.heartbeat if isinstance(run, HeartbeatRun) else True     # a zombie's workers beat
    return (f"{'with' if beating else 'without'} a heartbeat: "
            f"lease {run.lease_s:g} s, job {run.job_s:g} s, the handler ran {runs_word}")


def _draw_lease_panel(ax: Any, run: LeaseRun, title: str, colours: dict[str, str]) -> tuple[bool, bool]:
    """One run's panel, a lane per worker; whether it drew a lease still ahead, and a freeze."""
    timeline = run.timeline
    names = sorted({e.worker for e in timeline if e.worker.startswith("worker")})
    lane = {w: len(names) - 1 - i for i, w in enumerate(names)}
    ahead = False
    for sp in lease_spans(run):
        y = lane[sp.worker]
        ahead = _draw_lease(ax, sp, y, colours["lease"]) or ahead
        ax.annotate(f"claim v{sp.claim_version}", (sp.claimed, y + 0.36), xytext=(2, 2),
                    textcoords="offset points", va="bottom")
        _draw_handler(ax, sp, y, colours)
        _draw_claim_marks(ax, sp, y, lane, timeline, colours)
    frozen = _draw_frozen(ax, timeline, lane)
    if not [sp for sp in lease_spans(run) if sp.worker != names[0]] and len(names) > 1:
        ax.text(0.5, lane[names[1]], f"{names[1]}: nothing to claim, the lease never ran out",
                transform=ax.get_yaxis_transform(), ha="center", va="center")
    ax.set_yticks(list(lane.values()), list(lane))
    ax.set_ylim(-0.7, len(names) - 0.15)
    ax.spines["left"].set_visible(False)
    ax.tick_params(axis="y", length=0)
    ax.set_title(title, loc="left")
    return ahead, frozen


def _lease_legend(fig: Any, colours: dict[str, str], *, ahead: bool, frozen: bool) -> None:
    """The legend under the panels: the dotted lease and the freeze only where drawn."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    lease_c, late_c = colours["lease"], colours["late"]
    handles = [Patch(color=lease_c, alpha=0.45, label="lease held"),
               Patch(color=colours["work"], label="handler running"),
               Patch(color=late_c, label="running, lease run out"),
               Line2D([], [], ls="none", marker="|", color="black", ms=18, mew=2.5, label="heartbeat"),
               Line2D([], [], ls="--", color="black", lw=2, label="lease runs out"),
               Line2D([], [], ls="none", marker="v", color="black", ms=12, label="reaper takes it back"),
               Line2D([], [], ls="none", marker="o", color=colours["done"], mec="black", ms=13,
                      label="complete: 1 row"),
               Line2D([], [], ls="none", marker="X", color=late_c, mec="black", ms=14,
                      label="0 rows: the fence refuses")]
    if ahead:
        handles.insert(1, Patch(facecolor="none", edgecolor=lease_c, ls=":", lw=2.5,
                                label="lease still ahead at the end"))
    if frozen:
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="//", label="frozen (SIGSTOP)"))
    fig.legend(handles=handles, loc="outside lower center", ncol=3, frameon=False)


def plot_leases(*runs: LeaseRun, titles: list[str] | None = None):
    """A timeline of each run (one panel per run, :func:`heartbeat_trace`'s or
    :func:`zombie_trace`'s result), one lane per worker: the lease each claim held (from the
    claim to its last extension plus the lease; dotted where it was still ahead when the
    handler ended), the handler running (in another colour once its lease has run out), each
    heartbeat, the reaper taking the job back, and each
    completion, landed or refused by the fence.  Returns the figure."""
    import matplotlib.pyplot as plt

    from ..core.plots import setup_matplotlib

    _check_lease_runs(runs, titles)
    setup_matplotlib()
    if len(runs) > 2:
        raise LabkitError(f"{len(runs)} runs: a slide has room for two panels.",
                          "pass one or two runs, e.g. plot_leases(without, beating).")
    colours = _lease_colours()
    fig, axes = plt.subplots(len(runs), 1, figsize=(11.5, 1.6 + 2.1 * len(runs)), sharex=True, squeeze=False)
    frozen = ahead = False
    for n, (ax, run) in enumerate(zip(axes[:, 0], runs)):
        drew_ahead, drew_frozen = _draw_lease_panel(ax, run, titles[n] if titles else _lease_title(run), colours)
        ahead, frozen = ahead or drew_ahead, frozen or drew_frozen
    axes[-1, 0].set_xlabel("seconds since worker 1 claimed the job")
    _lease_legend(fig, colours, ahead=ahead, frozen=frozen)
    return fig


def heartbeat_command(*, open_lab: Callable[[], Lab], lease_s: float = LEASE_S, job_s: float = JOB_S,
                      json: bool = False) -> int:
    """``labkit trace heartbeat [--lease 1] [--job 2.5] [--json]``: the job run without and with
    a heartbeat, then the zombie; a summary (``runs_without_heartbeat``,
    ``runs_with_heartbeat``, ``zombie_heartbeat_rows``, ``zombie_stopped``), and with the text
    output each run's events."""
    check_heartbeat(lease_s=lease_s, job_s=job_s)
    with open_lab() as lab:
        without = heartbeat_trace(lab, lease_s=lease_s, job_s=job_s, heartbeat=False)
        beating = heartbeat_trace(lab, lease_s=lease_s, job_s=job_s, heartbeat=True)
        zombie = zombie_trace(lab, lease_s=lease_s, job_s=job_s)
    summary = {"runs_without_heartbeat": without.runs, "runs_with_heartbeat": beating.runs,
               "zombie_heartbeat_rows": zombie.zombie_heartbeat_rows,
               "zombie_stopped": zombie.zombie_stopped}
    if json:
        print(jsonlib.dumps(summary, indent=2))
        return 0
    titles = (f"Without a heartbeat (lease {lease_s:g} s, job {job_s:g} s)",
              f"With a heartbeat every {lease_s / 3:.2g} s",
              "A zombie: frozen past its lease, then resumed")
    for title, events in zip(titles, (without.events, beating.events, zombie.events)):
        print(title)
        print(format_events(events))
        print()
    width = max(map(len, summary))
    for k, v in summary.items():
        print(f"{k:<{width}}  {v}")
    return 0


def format_events(events: list[tuple[str, str, int | None]]) -> str:
    """The event list as aligned lines: worker, claim_version (``v1``; ``-`` for none), event."""
    width = max([len(w) for w, _, _ in events] + [6])
    return "\n".join(line for w, text, v in events
                     for line in wrap(text, first=f"  {w:<{width}}  {'-' if v is None else f'v{v}':>3}  ",
                                      indent=" " * (width + 9)))


# -- 2. graceful shutdown ----------------------------------------------------------------------------


def _signal_worker_1(lab: Lab, w1: Worker, sig: signal.Signals, parent: list[dict],
                     timeout: float) -> tuple[int | None, float]:
    """Send ``sig`` to worker 1 mid-job (SIGKILL: and kill it); its exit code and the seconds
    from the signal to its exit, returned once its session is gone from the server too."""
    backend = next(e["backend_pid"] for e in w1.events if e["kind"] == "ready")
    t_sig = time.monotonic()
    _send(w1, sig, parent)
    if sig == signal.SIGKILL:
        w1.kill()
    code = _check_exit(w1, timeout)
    stop_s = time.monotonic() - t_sig
    _until(lambda: not lab.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (backend,)),
           timeout, f"the end of {w1.name}'s session")
    return code, stop_s


def _until_the_others_idle(lab: Lab, others: list[Worker], victim: str, timeout: float) -> None:
    """Wait until the other workers have taken everything claimable and each sits idle."""
    # the others have taken everything claimable: nothing PENDING, nothing RUNNING but
    # what the stopped worker still holds, and each of them idle
    _until(lambda: (lambda s: s["pending"] == 0 and s["running"] == _held(lab, victim)[0])(_statuses(lab)),
           timeout, "the other workers taking every claimable job")
    for w in others:
        w.wait_for("idle", timeout=timeout)


def _stop_the_others(others: list[Worker], parent: list[dict], timeout: float) -> None:
    """SIGTERM every other worker, then wait for each to exit."""
    for w in others:
        _send(w, signal.SIGTERM, parent)
    for w in others:
        _check_exit(w, timeout)


def _stop_events(w1: Worker, parent: list[dict], lease_s: float, *, waiting: int, statuses: dict[str, int],
                 jobs: int) -> list[tuple[str, str, int | None]]:
    """Worker 1's events and the signals it got, and the server's last word: its claims
    still RUNNING, or none."""
    victim = w1.name
    events = _events([w1], [p for p in parent if p["to"] == victim], lease_s)
    if waiting:
        events.append(("server", f"{waiting} of {victim}'s claims still RUNNING: they wait out the lease "
                                 f"while the other workers sit idle ({statuses['done']} of {jobs} jobs DONE)",
                       None))
    else:
        events.append(("server", f"no claim of {victim}'s left RUNNING: the other workers ran the rest "
                                 f"({statuses['done']} of {jobs} jobs DONE)", None))
    return events


def _released_counts(w1: Worker) -> dict[str, Any]:
    """What worker 1 handed back (unstarted, and stopped mid-run), and whether it finished
    every job it started."""
    released = [e for e in w1.events if e["kind"] == "released"]
    started = [e["id"] for e in w1.events if e["kind"] == "started"]
    return {"released": sum(len(e["ids"]) for e in released if not e["started"]),
            "stopped_mid_run": sum(len(e["ids"]) for e in released if e["started"]),
            "finished_in_deadline": _count(w1, "completed", rows=1) == len(started) and bool(started)}


def _one_stop(lab: Lab, sig: signal.Signals, *, workers: int, jobs: int, per_worker_batch: int,
              job_s: float, lease_s: float, deadline_s: float) -> dict:
    """One run: every worker waits at its gate; worker 1 claims its batch and starts its
    first job; the others start; worker 1 gets ``sig`` mid-job.  Then the others drain what
    they can; the count is taken once nothing more is claimable."""
    _setup(lab, jobs)
    timeout = _timeout(jobs * job_s, deadline_s)
    parent: list[dict] = []
    victim = "worker 1"
    with _workers(lab, workers, timeout, lease_s=lease_s, job_s=job_s, batch=per_worker_batch,
                  deadline_s=deadline_s) as ws:
        w1, others = ws[0], ws[1:]
        w1.resume()
        claimed = w1.wait_for("claimed", timeout=timeout)
        w1.wait_for("started", timeout=timeout)
        for w in others:
            w.resume()
        code, stop_s = _signal_worker_1(lab, w1, sig, parent, timeout)
        _until_the_others_idle(lab, others, victim, timeout)
        waiting, left = _held(lab, victim)
        s = _statuses(lab)
        _stop_the_others(others, parent, timeout)
    events = _stop_events(w1, parent, lease_s, waiting=waiting, statuses=s, jobs=jobs)
    return {"waiting": waiting, "lease_left_s": round(left, 1) if waiting else 0.0,
            "exit_code": code, "stop_s": stop_s, "claimed": len(claimed["ids"]),
            **_released_counts(w1), "statuses": s, "events": events}


class _Shutdown(TypedDict):
    """The parameters of a shutdown run (:func:`check_shutdown`, :func:`_one_stop`)."""
    workers: int
    jobs: int
    per_worker_batch: int
    job_s: float
    lease_s: float
    deadline_s: float


@dataclass(frozen=True)
class ShutdownParams(Result):
    """The parameters a shutdown run ran with (:func:`shutdown_trace`).

    workers: worker processes.
    jobs: jobs in all.
    per_worker_batch: claims a worker takes at a time.
    job_s: how long one job's handler works, in seconds.
    lease_s: the lease, in seconds.
    deadline_s: how long a stopping worker may take to finish the job in hand, in seconds.
    """

    workers: int
    jobs: int
    per_worker_batch: int
    job_s: float
    lease_s: float
    deadline_s: float


@dataclass(frozen=True)
class ShutdownTrace(Result):
    """Worker 1 killed with SIGKILL mid-job, then (on a fresh table) stopped with SIGTERM
    (:func:`shutdown_trace`; ``labkit trace shutdown --json`` prints :data:`SHUTDOWN_KEYS`).

    waiting_lease_after_kill: worker 1's claims still RUNNING once the others sat idle, after
        the kill.
    lease_left_s: how long those claims still wait for their lease, in seconds (0.0: none wait).
    waiting_lease_after_graceful: the same after SIGTERM (0).
    claimed_by_worker_1: the claims worker 1 took in its batch (SIGTERM run).
    released: unstarted claims it handed back, their attempts given back.
    finished_in_deadline: whether it finished every job it started before exiting.
    stopped_mid_run: jobs it handed back because the deadline passed (attempt kept).
    exit_code_kill: worker 1's exit code after SIGKILL (-9).
    exit_code_graceful: its exit code after SIGTERM (0; None: it did not exit).
    stop_s: seconds from SIGTERM to its exit.
    done_after_graceful: jobs DONE at the end of the SIGTERM run.
    runs_after_graceful: handler starts logged in the SIGTERM run.
    max_attempts_after_graceful: the most attempts any job used in that run (1: a hand-back
        costs no attempt).
    events_kill: worker 1's events and signals in the SIGKILL run, described.
    events_graceful: the same in the SIGTERM run.
    params: what the runs ran with.
    """

    waiting_lease_after_kill: int
    lease_left_s: float
    waiting_lease_after_graceful: int
    claimed_by_worker_1: int
    released: int
    finished_in_deadline: bool
    stopped_mid_run: int
    exit_code_kill: int | None
    exit_code_graceful: int | None
    stop_s: float
    done_after_graceful: int
    runs_after_graceful: int
    max_attempts_after_graceful: int
    events_kill: Events
    events_graceful: Events
    params: ShutdownParams


def shutdown_trace(lab: Lab, *, workers: int = WORKERS, jobs: int = JOBS, per_worker_batch: int = BATCH,
                   job_s: float = SHUTDOWN_JOB_S, lease_s: float = SHUTDOWN_LEASE_S,
                   deadline_s: float = DEADLINE_S) -> ShutdownTrace:
    """Two runs on the same setup: ``jobs`` jobs of ``job_s``, ``workers`` worker processes,
    each claiming ``per_worker_batch`` jobs at a time (so a worker holds claims it has not
    started) with a ``lease_s`` lease.  Worker 1 claims its batch first and, one job in, is

    * killed with SIGKILL: every claim it held stays RUNNING until its lease runs out, while
      the other workers finish the rest and go idle (``waiting_lease_after_kill``, and
      ``lease_left_s``, how long they still wait);
    * stopped with SIGTERM: it claims nothing more, hands back its unstarted claims at once
      (``released``, attempts given back), finishes the job in hand within ``deadline_s``
      (``finished_in_deadline``) and exits 0: ``waiting_lease_after_graceful == 0``, and the
      others finish every job, each run exactly once (``runs_after_graceful == jobs``).

    Returns a :class:`ShutdownTrace`; also ``exit_code_kill`` (-9), ``exit_code_graceful`` (0), ``stop_s`` (SIGTERM to exit),
    ``stopped_mid_run`` (jobs handed back because the deadline passed), ``done_after_graceful``,
    ``max_attempts_after_graceful`` (1: a hand-back costs no attempt), ``events_kill`` and
    ``events_graceful``."""
    kw = _Shutdown(workers=workers, jobs=jobs, per_worker_batch=per_worker_batch, job_s=job_s,
                   lease_s=lease_s, deadline_s=deadline_s)
    check_shutdown(**kw)
    kill = _one_stop(lab, signal.SIGKILL, **kw)
    term = _one_stop(lab, signal.SIGTERM, **kw)
    return ShutdownTrace(
        waiting_lease_after_kill=kill["waiting"], lease_left_s=kill["lease_left_s"],
        waiting_lease_after_graceful=term["waiting"],
        claimed_by_worker_1=term["claimed"], released=term["released"],
        finished_in_deadline=term["finished_in_deadline"], stopped_mid_run=term["stopped_mid_run"],
        exit_code_kill=kill["exit_code"], exit_code_graceful=term["exit_code"],
        stop_s=round(term["stop_s"], 2),
        done_after_graceful=term["statuses"]["done"], runs_after_graceful=term["statuses"]["runs"],
        max_attempts_after_graceful=term["statuses"]["max_attempts_used"],
        events_kill=kill["events"], events_graceful=term["events"],
        params=ShutdownParams(**kw),
    )


SHUTDOWN_KEYS = ("waiting_lease_after_kill", "lease_left_s", "waiting_lease_after_graceful", "released",
                 "finished_in_deadline", "stopped_mid_run", "exit_code_kill", "exit_code_graceful",
                 "stop_s", "done_after_graceful")


def shutdown_command(*, open_lab: Callable[[], Lab], workers: int = WORKERS, lease_s: float = SHUTDOWN_LEASE_S,
                     deadline_s: float = DEADLINE_S, jobs: int = JOBS, per_worker_batch: int = BATCH,
                     job_s: float = SHUTDOWN_JOB_S, json: bool = False) -> int:
    """``labkit trace shutdown [--workers 2] [--lease 30] [--deadline 2] [--json]``: worker 1
    killed, then stopped gracefully; the summary (:data:`SHUTDOWN_KEYS`), and with the text
    output both runs' events."""
    kw = _Shutdown(workers=workers, jobs=jobs, per_worker_batch=per_worker_batch, job_s=job_s,
                   lease_s=lease_s, deadline_s=deadline_s)
    check_shutdown(**kw)
    with open_lab() as lab:
        out = shutdown_trace(lab, **kw)
    summary = out.as_dict(only=SHUTDOWN_KEYS)
    if json:
        print(jsonlib.dumps(summary, indent=2))
        return 0
    print(f"SIGKILL: worker 1 (a batch of {per_worker_batch} claims, lease {lease_s:g} s) dies mid-job")
    print(format_events(out.events_kill))
    print()
    print(f"SIGTERM: worker 1 stops claiming, hands back, finishes within {deadline_s:g} s")
    print(format_events(out.events_graceful))
    print()
    width = max(map(len, summary))
    for k, v in summary.items():
        print(f"{k:<{width}}  {v}")
    return 0
