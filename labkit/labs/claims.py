"""Claiming correctly: claim-mark-commit, the held-open mistake, leases, the reaper,
idempotent effects, batch size, history and ordering (notebooks 03-05).

Everything here runs against the job table of ``sql/job_table.sql`` (plus the
columns of ``sql/job_table_leases.sql`` / ``sql/job_table_keys.sql`` where a lab
needs them).  Workers that must be able to crash run as real OS processes
(:class:`labkit.procs.Worker`) with :func:`worker_main` as their body; the parent
kills them with SIGKILL at a scripted pause.

``labkit bench-history`` measures claim throughput against a
growing history of finished jobs (0 → 10k → 100k → 1M), with and without the
partial index on the pending predicate.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, ClassVar

import psycopg
from psycopg import sql

from ..core.db import WORKER_GUARDS, open_connection
from ..core.errors import LabkitError
from ..core.files import read_sql
from ..core.lab import FIRST_JOB, Lab
from ..core.limits import bulk, number
from ..core.procs import Context, Worker
from ..core.queries import query
from ..core.results import Result
from ._checked import one_row

CLAIM_SQL = read_sql("claim_skip_locked.sql")
HOLD_OPEN_SQL = read_sql("claim_hold_open.sql")
PER_KEY_SQL = read_sql("claim_per_key.sql")
PER_KEY_RACY_SQL = read_sql("claim_per_key_racy.sql")   # the recipe that races: see notebook 05
FINISH_SQL = read_sql("finish_jobs.sql")
REAPER_SQL = read_sql("reaper.sql")

STYLES = ("claim_mark_commit", "hold_open", "per_key")
EFFECTS = ("log", "once")
HISTORY_FIRST_ID = 10_000_001   # finished jobs get ids far above the pending ones

# A worker process's limits: a worker's, but with no limit on idling in a transaction,
# since the held-open worker does that on purpose (it runs its jobs, or sits paused,
# inside the claim's transaction) and the lessons watch it do so.
CLAIM_WORKER_GUARDS = replace(WORKER_GUARDS, idle_in_transaction=None)


# -- checks ---------------------------------------------------------------------------------

# Ceilings: a lab run stays within minutes, its tables within a laptop's disk.
MAX_ROWS = 10_000_000        # jobs or finished history rows in one table
MAX_CLAIMS = 100_000         # claims in one measurement
MAX_LADDER = 12              # points of a history ladder
MAX_COUNTS = {"jobs": MAX_ROWS, "pending": MAX_ROWS, "done": MAX_ROWS, "claims": MAX_CLAIMS,
              "workers": 64, "rounds": 20, "customers": 10_000, "batch": 10_000, "job_ms": 60_000.0}


def _positive(name: str, value, *, zero_ok: bool = False) -> None:
    if value is None or (value < 0 if zero_ok else value <= 0):
        need = "0 or more" if zero_ok else "1 or more"
        raise LabkitError(f"{name} must be {need}, not {value!r}.",
                          f"pass {name}={'0' if zero_ok else '1'} or a larger number.")
    if name in MAX_COUNTS:
        high = MAX_COUNTS[name]
        number(name, value, low=0 if zero_ok else 1, high=high, whole=isinstance(high, int),
               example=1 if isinstance(high, int) else 5)


def _style(style: str) -> None:
    if style not in STYLES:
        raise LabkitError(f"Unknown claim style {style!r}.", f"use one of {', '.join(STYLES)}.")


# -- the claim, in-process ----------------------------------------------------------------------

def claim(conn: psycopg.Connection, worker_id: str, batch: int = 1) -> list[int]:
    """Claim-mark-commit on an autocommit connection: one statement, one short transaction."""
    _positive("batch", batch)
    return [r[0] for r in conn.execute(CLAIM_SQL, {"batch": batch, "worker_id": worker_id}).fetchall()]


def claim_per_key(conn: psycopg.Connection, worker_id: str) -> list[int]:
    """One per-key claim (claim_per_key.sql) on an autocommit connection."""
    return [r[0] for r in conn.execute(PER_KEY_SQL, {"worker_id": worker_id}).fetchall()]


def inline(sql_text: str, **params: Any) -> str:
    """The SQL text with each ``%(name)s`` replaced by the value as a quoted literal, for
    a :class:`labkit.Sessions` step (which sends plain text)."""
    out = sql_text
    for name, value in params.items():
        marker = f"%({name})s"
        if marker not in out:
            raise LabkitError(f"The SQL has no parameter %({name})s.",
                              "pass only the parameters it names, for example worker_id='A'.")
        out = out.replace(marker, sql.Literal(value).as_string(None))
    if "%(" in out:
        left = out[out.index("%("):].split(")s", 1)[0] + ")s"
        raise LabkitError(f"The SQL still has a parameter {left} with no value.",
                          "pass a value for every parameter it names.")
    return out.replace("%%", "%")


def keyed_queue(lab: Lab, customers: Iterable[str], *, leases: bool = False) -> None:
    """A fresh job table with one pending job per entry of ``customers`` (job i belongs to
    ``customers[i - 1]``; ids and created_at follow the list's order), plus the customer
    column of job_table_keys.sql and, with ``leases``, job_table_leases.sql."""
    customers = list(customers)
    _positive("jobs", len(customers))
    fresh_jobs(lab, len(customers))
    lab.run_file("job_table_keys.sql")
    if leases:
        add_leases(lab)
    lab.execute("UPDATE job SET customer = (%s::text[])[id]", (customers,))
    lab.execute("ANALYZE job")


PARTITION_LAYOUTS = {"status": "job_table_by_status.sql", "month": "job_table_by_month.sql"}


def partitioned_queue(lab: Lab, layout: str, jobs: int = 3) -> None:
    """A fresh job table partitioned by ``layout`` ("status": job_table_by_status.sql,
    "month": job_table_by_month.sql) with ``jobs`` pending jobs, one a second from
    2026-01-01 09:00 UTC, ids 1..jobs."""
    if layout not in PARTITION_LAYOUTS:
        raise LabkitError(f"Unknown partition layout {layout!r}.",
                          f"use one of {', '.join(PARTITION_LAYOUTS)}.")
    # the month layout has two months of partitions: 59 days of jobs one a second
    number("jobs", jobs, low=1, high=1_000_000, whole=True, example=3)
    lab.execute("DROP TABLE IF EXISTS job, job_archive CASCADE")
    lab.run_file(PARTITION_LAYOUTS[layout])
    add_pending(lab, jobs)


def finish(conn: psycopg.Connection, worker_id: str, ids: list[int]) -> list[int]:
    """Mark the jobs DONE (only those this worker still owns); returns the ids marked."""
    return [r[0] for r in conn.execute(FINISH_SQL, {"ids": list(ids), "worker_id": worker_id}).fetchall()]


def reap(lab: Lab, *, lease: str = "30 seconds", max_attempts: int = 3,
         as_of: datetime | None = None) -> list[tuple]:
    """Run the reaper once; returns (id, new status, attempts) of every job it took back.
    ``as_of`` is the reaper's "now" (default: the server's clock)."""
    _positive("max_attempts", max_attempts)
    return lab.execute(REAPER_SQL, {"lease": lease, "max_attempts": max_attempts, "as_of": as_of})


def add_leases(lab: Lab) -> None:
    """attempts, the DEAD state and the reaper's index (sql/job_table_leases.sql)."""
    lab.run_file("job_table_leases.sql")


def add_effects(lab: Lab) -> None:
    """The two effect tables of sql/effects.sql (effect_log and effect_once)."""
    lab.run_file("effects.sql")


@dataclass(frozen=True)
class JobEffects(Result):
    """The effects one job's runs left in the two effect tables of sql/effects.sql
    (:func:`effect_counts`); ``JobEffects()`` is a job that left none.

    log: rows in effect_log, the plain effect: one per run of the job
    once: rows in effect_once, the idempotent effect (unique on the job id): 1 however often
        the job ran
    """

    log: int = 0
    once: int = 0


def effect_counts(lab: Lab) -> dict[int, JobEffects]:
    """The effects of every job that left one, by job id (a job that left none is absent:
    ``effect_counts(lab).get(job_id, JobEffects())``)."""
    counts: dict[int, dict[str, int]] = {}
    for table in EFFECTS:
        for job_id, n in lab.execute(f"SELECT job_id, count(*) FROM effect_{table} GROUP BY 1"):
            counts.setdefault(job_id, {})[table] = n
    return {job_id: JobEffects(**n) for job_id, n in counts.items()}


@dataclass(frozen=True)
class JobRow(Result):
    """One job as the job table holds it now (:func:`job_row`).

    status: PENDING, IN_PROGRESS, DONE (or DEAD, with job_table_leases.sql)
    worker: the worker_id on the row: the worker that claimed it last (None: never claimed,
        or handed back by the reaper)
    claimed_at_set: whether the row carries a claim time (claimed_at IS NOT NULL)
    attempts: claims of it that ran out their lease (None: the table has no attempts column,
        added by job_table_leases.sql)
    """

    status: str
    worker: str | None
    claimed_at_set: bool
    attempts: int | None = None


def job_row(lab: Lab, job_id: int) -> JobRow:
    """One job: its status, worker, whether it has a claim time, its attempts (if the column
    exists)."""
    cols = [r[0] for r in lab.execute(
        "SELECT column_name FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND table_name = 'job'")]
    extra = ", attempts" if "attempts" in cols else ""
    row = lab.execute(f"SELECT status, worker_id, claimed_at IS NOT NULL{extra} FROM job WHERE id = %s",
                      (job_id,))
    if not row:
        raise LabkitError(f"There is no job {job_id}.", "create the jobs first (lab.create_jobs(n)).")
    return JobRow(status=row[0][0], worker=row[0][1], claimed_at_set=row[0][2],
                  attempts=row[0][3] if extra else None)


def fresh_jobs(lab: Lab, n: int) -> None:
    """Drop the lab's job table (and its archive) and create it again with ``n`` pending jobs."""
    _positive("jobs", n, zero_ok=True)
    lab.execute("DROP TABLE IF EXISTS job, job_archive CASCADE")
    lab.create_jobs(n)


def backend_gone(lab: Lab, worker: Worker, timeout: float = 10) -> None:
    """Wait until the server no longer shows the backends of a killed worker (their
    transactions rolled back, their locks freed).  The worker reported their pids in its
    ``connected`` event."""
    pids = [p for e in worker.events if e["kind"] == "connected" for p in e["pids"]]
    deadline = time.monotonic() + timeout
    while pids and lab.execute("SELECT 1 FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)):
        if time.monotonic() > deadline:
            raise LabkitError(f"The server still shows worker {worker.name!r}'s session after "
                              f"{timeout:.0f} s.", "run `labkit doctor`; end it with `labkit clean`.")
        time.sleep(0.02)


# -- a worker as a real process -------------------------------------------------------------------

def job_duration_ms(job_id: int, job_ms: float, jitter: float) -> float:
    """A job's run time: ``job_ms`` give or take ``jitter`` (a fraction), fixed per job id."""
    if not jitter:
        return job_ms
    return job_ms * (1 + random.Random(job_id).uniform(-jitter, jitter))


@dataclass(frozen=True)
class _Handler:
    """How a worker process runs each job it claimed: the effects it writes, the job's time
    (and jitter), the poison jobs that kill it, where it pauses, and what it reports."""

    worker_id: str
    effects: Sequence[str]
    job_ms: float
    jitter: float
    poison: Sequence[int]
    pause_after: int | None
    report: str


def _claim_batch(conn: psycopg.Connection, style: str, worker_id: str, batch: int) -> list[int]:
    """One claim in ``style``: ``hold_open`` opens the transaction it keeps for the whole batch."""
    if style == "hold_open":
        conn.execute("BEGIN")
        return [r[0] for r in conn.execute(HOLD_OPEN_SQL, {"batch": batch}).fetchall()]
    if style == "per_key":
        return claim_per_key(conn, worker_id)
    return claim(conn, worker_id, batch)


def _run_batch(ctx: Context, fx: psycopg.Connection | None, ids: list[int], handler: _Handler, ran: int) -> int:
    """Run each claimed job: a poison job kills the worker, its effects are written, its time
    slept, ``ran`` emitted, and the worker pauses after its ``pause_after``-th job.  The jobs
    run so far, this batch's included."""
    for job_id in ids:
        if job_id in handler.poison:
            os.kill(os.getpid(), signal.SIGKILL)   # the handler takes the worker down
        if fx is not None:              # opened exactly when there are effects
            for kind in handler.effects:
                _write_effect(fx, kind, job_id, handler.worker_id)
        ms = job_duration_ms(job_id, handler.job_ms, handler.jitter)
        if ms:
            time.sleep(ms / 1000)
        ran += 1
        if handler.report == "jobs":
            ctx.emit("ran", id=job_id)
        if handler.pause_after is not None and ran == handler.pause_after:
            ctx.pause("mid-job")
    return ran


def _mark_batch(conn: psycopg.Connection, style: str, worker_id: str, ids: list[int]) -> list[int]:
    """Mark the batch DONE (``hold_open``: and commit the claim's transaction); the ids marked."""
    if style == "hold_open":
        conn.execute(query("claim_worker.sql", "finish_held").sql, {"worker_id": worker_id, "ids": ids})
        conn.execute("COMMIT")
        return ids
    return finish(conn, worker_id, ids)


def worker_main(ctx: Context, dsn: str, schema: str, worker_id: str, style: str = "claim_mark_commit",
                batch: int = 1, job_ms: float = 0.0, jitter: float = 0.0, effects: Sequence[str] = (),
                pause_after: int | None = None, poison: Sequence[int] = (), max_claims: int | None = None,
                report: str = "jobs", sync_start: bool = False) -> dict[str, int]:
    """The body of a worker process.

    ``style``: ``claim_mark_commit`` (claim in one short transaction, run, then mark
    DONE), ``hold_open`` (lock, run the jobs, mark DONE and commit only at the end) or
    ``per_key`` (claim_per_key.sql, batch 1).  For each job the handler writes its
    ``effects`` ("log", "once") on a connection of its own, sleeps the job's time, and
    emits ``ran``.  ``pause_after=k`` stops after the k-th job has run (its effects
    written, not yet marked DONE): the parent kills the worker there.  A job in
    ``poison`` kills its own worker (SIGKILL) every time it runs.  ``report``: "jobs"
    emits claimed/ran/done events per batch and job, "batches" only per batch,
    "none" only start and end.
    """
    _style(style)
    handler = _Handler(worker_id, effects, job_ms, jitter, poison, pause_after, report)
    with ExitStack() as stack:
        def connect(role: str) -> psycopg.Connection:
            return stack.enter_context(open_connection(dsn, schema=schema, role=role,
                                                       guards=CLAIM_WORKER_GUARDS))

        conn = connect(worker_id)
        fx = connect(worker_id + ":fx") if effects else None
        ran = done = claims = 0
        ctx.emit("connected", pids=[c.info.backend_pid for c in (conn, fx) if c is not None])
        if sync_start:
            ctx.pause("ready")                  # the parent starts every worker at once
        ctx.emit("start")
        while max_claims is None or claims < max_claims:
            t_tx = time.monotonic()
            ids = _claim_batch(conn, style, worker_id, batch)
            claim_ms = (time.monotonic() - t_tx) * 1000
            if not ids:
                if style == "hold_open":
                    conn.execute("ROLLBACK")
                break
            claims += 1
            if report != "none":
                ctx.emit("claimed", ids=ids)
            ran = _run_batch(ctx, fx, ids, handler, ran)
            t_work_end = time.monotonic()
            marked = _mark_batch(conn, style, worker_id, ids)
            # How long the claim's transaction (and its row locks) lasted.
            tx_ms = (time.monotonic() - t_tx) * 1000 if style == "hold_open" else claim_ms
            done += len(marked)
            if report in ("jobs", "batches"):
                ctx.emit("finished", ids=marked, lost=sorted(set(ids) - set(marked)), tx_ms=tx_ms,
                         work_end=t_work_end)
        ctx.emit("end", jobs=done)
        return {"claims": claims, "ran": ran, "done": done}


def _write_effect(fx: psycopg.Connection, kind: str, job_id: int, worker_id: str) -> None:
    if kind not in EFFECTS:
        raise ValueError(f"unknown effect {kind!r}")
    fx.execute(query("claim_worker.sql", f"effect_{kind}").sql, {"job_id": job_id, "worker_id": worker_id})


def wait_exit(worker: Worker, timeout: float = 60) -> int | None:
    """Wait for a worker that is expected to die on its own (a poison job); its exit code."""
    return worker.wait_exit(timeout)


def start_worker(lab: Lab, worker_id: str, **kw: Any) -> Worker:
    """A started :class:`labkit.procs.Worker` running :func:`worker_main` in ``lab``."""
    _style(kw.get("style", "claim_mark_commit"))
    _positive("batch", kw.get("batch", 1))
    _positive("job_ms", kw.get("job_ms", 0.0), zero_ok=True)
    bad = set(kw.get("effects", ())) - set(EFFECTS)
    if bad:
        raise LabkitError(f"Unknown effect(s) {sorted(bad)}.", f"use effects from {EFFECTS}.")
    return Worker("labkit.labs.claims:worker_main", name=worker_id, dsn=lab.db.dsn, schema=lab.schema,
                  worker_id=worker_id, **kw).start()


def run_workers(lab: Lab, n: int, *, timeout: float = 120, **kw: Any) -> list[Worker]:
    """Start ``n`` workers (w1..wn) with the same settings, wait for all; returns them
    (their ``events`` hold what they did).  Every worker is killed on the way out."""
    _positive("workers", n)
    workers = []
    try:
        for i in range(n):
            workers.append(start_worker(lab, f"w{i + 1}", sync_start=True, **kw))
        for w in workers:
            w.wait_for("paused", tag="ready", timeout=timeout)
        for w in workers:
            w.resume()
        for w in workers:
            w.join(timeout)
        return workers
    finally:
        for w in workers:
            w.kill()


# -- measurements -----------------------------------------------------------------------------------

@dataclass
class DrainRun:
    """What a set of workers did with a queue (one run of :func:`drain`)."""

    workers: int
    batch: int
    jobs: int
    seconds: float
    finished: list[tuple[float, int, str]] = field(default_factory=list)   # (work end, job id, worker)

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else float("inf")


def drain(lab: Lab, *, jobs: int, workers: int = 2, batch: int = 1, job_ms: float = 0.0,
          jitter: float = 0.0, style: str = "claim_mark_commit", report: str = "none") -> DrainRun:
    """Fresh job table with ``jobs`` pending jobs, drained by ``workers`` processes.
    Time runs from the first worker's start event to the last worker's end event (the
    processes' start-up is not counted)."""
    _positive("jobs", jobs)
    fresh_jobs(lab, jobs)
    if style == "per_key":
        raise LabkitError("drain() builds a plain job table.", "use ordering_run() for per-key claims.")
    ws = run_workers(lab, workers, style=style, batch=batch, job_ms=job_ms, jitter=jitter,
                     report=report)
    return _drain_result(lab, ws, workers, batch)


def _drain_result(lab: Lab, ws: list[Worker], workers: int, batch: int) -> DrainRun:
    starts = [e["t"] for w in ws for e in w.events if e["kind"] == "start"]
    ends = [e["t"] for w in ws for e in w.events if e["kind"] == "end"]
    # A job's finishing moment is the end of its work, taken before its DONE is sent: the
    # moment the worker got back from that commit can come late on a loaded machine, after
    # another worker has claimed, run and finished the customer's next job.
    finished = sorted((e["work_end"], i, w.name) for w in ws for e in w.events
                      if e["kind"] == "finished" for i in e["ids"])
    done = lab.execute("SELECT count(*) FROM job WHERE status = 'DONE'")[0][0]
    return DrainRun(workers, batch, done, max(ends) - min(starts), finished)


def inversions(order: Sequence[int], key: dict[int, str] | None = None) -> int:
    """Pairs of jobs finished in the opposite order of their ids (ids follow creation
    order).  With ``key`` (job id -> key) only pairs within the same key count."""
    n = 0
    for i, a in enumerate(order):
        for b in order[i + 1:]:
            if a > b and (key is None or key[a] == key[b]):
                n += 1
    return n


@dataclass(frozen=True)
class OrderingRun(Result):
    """The order in which ``workers`` processes finished a queue's jobs (:func:`ordering_run`).

    workers: worker processes that drained the queue
    jobs: jobs that ended DONE
    order: the job ids in the order they finished (ids follow creation order)
    inversions: pairs of jobs finished in the opposite order of their creation
    pairs: pairs of finished jobs in all (the most inversions there can be)
    key_inversions: inversions between two jobs of the same customer (None: the jobs had no
        customers)
    in_flight_max: most jobs of one customer in flight at the same moment (None: no customers)
    """

    workers: int
    jobs: int
    order: list[int]
    inversions: int
    pairs: int
    key_inversions: int | None = None
    in_flight_max: int | None = None


def ordering_run(lab: Lab, *, jobs: int, workers: int, customers: int = 0, job_ms: float = 5.0,
                 jitter: float = 0.8, per_key: bool = True) -> OrderingRun:
    """Drain ``jobs`` jobs with ``workers`` processes, jobs of uneven length; return the
    finishing order and its inversions.  With ``customers`` > 0, every job belongs to one
    of that many customers (round robin) and, with ``per_key``, the workers claim with
    claim_per_key.sql (one job per customer in flight)."""
    _positive("jobs", jobs)
    fresh_jobs(lab, jobs)
    key = None
    style = "claim_mark_commit"
    if customers:
        lab.run_file("job_table_keys.sql")
        lab.execute("UPDATE job SET customer = 'c' || ((id - 1) %% %s + 1)", (customers,))
        lab.execute("ANALYZE job")
        key = dict(lab.execute("SELECT id, customer FROM job"))
        style = "per_key" if per_key else "claim_mark_commit"
    ws = run_workers(lab, workers, style=style, job_ms=job_ms, jitter=jitter, report="batches")
    d = _drain_result(lab, ws, workers, 1)
    order = [job_id for _, job_id, _ in d.finished]
    return OrderingRun(workers=workers, jobs=d.jobs, order=order, inversions=inversions(order),
                       pairs=len(order) * (len(order) - 1) // 2,
                       key_inversions=inversions(order, key) if key is not None else None,
                       in_flight_max=_max_in_flight_per_key(ws, key) if key is not None else None)


def serial_per_key_order(jobs: int, customers: int, *, job_ms: float = 5.0,
                         jitter: float = 0.8) -> list[int]:
    """The finishing order ordering_run() would give if each customer's jobs ran back to
    back and nothing else took time: every customer is its own serial timeline (job i is
    customer ``(i - 1) % customers``), and the global order is those timelines
    interleaved by their running sums of job times."""
    _positive("jobs", jobs)
    _positive("customers", customers)
    clock = [0.0] * customers
    ends = []
    for job_id in range(1, jobs + 1):
        c = (job_id - 1) % customers
        clock[c] += job_duration_ms(job_id, job_ms, jitter)
        ends.append((clock[c], job_id))
    return [job_id for _, job_id in sorted(ends)]


def _max_in_flight_per_key(ws, key) -> int:
    """Most jobs of one customer in flight at the same moment, from the workers' events."""
    spans = []
    for w in ws:
        for e in w.events:
            if e["kind"] == "claimed":
                spans += [(e["t"], 1, key[i]) for i in e["ids"]]
            elif e["kind"] == "finished":
                # the work's end, taken before DONE is sent: the next claim of the same
                # customer can only succeed once that DONE has committed
                spans += [(e["work_end"], -1, key[i]) for i in e["ids"]]
    live: dict[str, int] = {}
    best = 0
    for _, delta, k in sorted(spans, key=lambda s: (s[0], s[1])):
        live[k] = live.get(k, 0) + delta
        best = max(best, live[k])
    return best


# -- history --------------------------------------------------------------------------------------

def make_queue(lab: Lab, *, pending: int, done: int = 0, index: bool = True) -> None:
    """The job table with ``done`` finished jobs (older) and ``pending`` pending ones.
    ``index=False`` drops the partial index on the pending predicate."""
    _positive("pending", pending, zero_ok=True)
    _positive("done", done, zero_ok=True)
    fresh_jobs(lab, 0)
    if not index:
        lab.execute("DROP INDEX job_pending_created_idx")
    add_history(lab, done)
    add_pending(lab, pending)
    lab.execute("VACUUM ANALYZE job")


def add_pending(lab: Lab, n: int) -> None:
    """``n`` pending jobs, ids 1..n, one a second from 2026-01-01 09:00 UTC
    (sql/job_rows.sql: pending)."""
    _positive("pending", n, zero_ok=True)
    if n:
        bulk(lab, query("job_rows.sql", "pending").sql, {"n": n, **FIRST_JOB}, rows=n)


def add_history(lab: Lab, n: int) -> None:
    """``n`` finished jobs, all created before 2026, ids from 10,000,001
    (sql/job_rows.sql: history)."""
    _positive("done", n, zero_ok=True)
    if n:
        bulk(lab, query("job_rows.sql", "history").sql, {"n": n, "first_id": HISTORY_FIRST_ID}, rows=n)


def table_pages(lab: Lab, relation: str = "job") -> int:
    """The size of a table or index of the lab, in pages."""
    return lab.execute("SELECT pg_relation_size(%s::regclass) / current_setting('block_size')::int",
                       (relation,))[0][0]


def archive_done(lab: Lab, *, settle_s: float = 20.0) -> int:
    """Move DONE jobs to job_archive (sql/archive_done.sql) and rewrite the job table so
    the empty pages go too.  A rewrite keeps rows that an open snapshot elsewhere on the
    server may still see, so it is retried for up to ``settle_s`` seconds until the table
    holds only its live rows.  Returns the table's size in pages."""
    lab.run_file("archive_done.sql")
    live = lab.execute("SELECT count(*) FROM job")[0][0]
    deadline = time.monotonic() + settle_s
    while True:
        lab.execute("VACUUM FULL ANALYZE job")
        pages = table_pages(lab)
        # about 80 rows of the job table fit in a page; allow generous slack
        if pages <= live // 40 + 2 or time.monotonic() > deadline:
            return pages
        time.sleep(0.5)


def wait_for_horizon(lab: Lab, timeout: float = 30.0) -> None:
    """Wait until no other transaction in this database still holds a snapshot taken
    before now, so that the row versions this lab has just made dead are dead to
    everyone: only then can VACUUM remove them or an index scan mark their entries dead.
    (On a shared server someone else's long transaction holds them back.)"""
    xid = lab.execute("SELECT pg_current_xact_id()::text")[0][0]   # a transaction of its own
    deadline = time.monotonic() + timeout
    while True:
        old = lab.execute(query("xmin_horizon.sql", "older_transactions").sql, {"x": xid})
        if not old:
            return
        if time.monotonic() > deadline:
            who = ", ".join(f"pid {pid}" + (f" open since {since:%H:%M:%S}" if since else "")
                            for pid, since in old[:5])
            raise LabkitError(f"{len(old)} transaction(s) elsewhere on the server ({who}) "
                              f"still see row versions this lab has just replaced or deleted, so VACUUM "
                              f"cannot remove them; waited {timeout:.0f} s for it to end.",
                              "end that transaction (`labkit clean` ends your own idle ones) and run "
                              "the cell again.")
        time.sleep(0.1)


def _claim_buffers(lab: Lab) -> int:
    """Shared buffers one claim touches (EXPLAIN ANALYZE, rolled back)."""
    return plan_of(lab, CLAIM_SQL, {"batch": 1, "worker_id": "explain"}, analyze=True).buffers


@dataclass(frozen=True)
class ChurnReadings(Result):
    """What a mass UPDATE out of PENDING leaves in the partial index (:func:`churn_readings`):
    the claim's shared buffers (EXPLAIN ANALYZE, rolled back) and the index's size in pages,
    along the way.

    index_pages_before: the partial index's size before the UPDATE, in pages
    index_pages_after_update: its size right after the UPDATE (its dead entries still in it)
    buffers_after_update: buffers the first claim after the UPDATE touched (it visits the
        heap for every dead version, and marks their entries dead)
    buffers_at_next_claim: buffers the next claim touched (it still reads the entries
        marked dead)
    buffers_after_vacuum: buffers a claim touched after a plain VACUUM (the entries gone)
    index_pages_after_vacuum: the index's size after VACUUM, in pages
    """

    index_pages_before: int
    index_pages_after_update: int
    buffers_after_update: int
    buffers_at_next_claim: int
    buffers_after_vacuum: int
    index_pages_after_vacuum: int


def churn_readings(lab: Lab, *, pending: int = 100_000, done: int = 99_900) -> ChurnReadings:
    """What a mass UPDATE out of PENDING leaves in the partial index.  A fresh table of
    ``pending`` pending jobs, vacuumed, with autovacuum off for this table only (so that
    nothing cleans up between the readings); then one UPDATE sets the ``done`` oldest to
    DONE.  Returns the shared buffers of the claim (EXPLAIN ANALYZE, rolled back) right
    after the UPDATE, at the next claim, and after a plain VACUUM, with the partial
    index's size in pages before the UPDATE, after it and after VACUUM."""
    _positive("pending", pending)
    _positive("done", done)
    if done >= pending:
        raise LabkitError(f"done={done:,} leaves no pending job out of pending={pending:,}.",
                          "pass done smaller than pending, for example pending=100_000, done=99_900.")
    fresh_jobs(lab, 0)
    lab.execute("ALTER TABLE job SET (autovacuum_enabled = off)")
    add_pending(lab, pending)
    lab.execute("VACUUM ANALYZE job")
    index = "job_pending_created_idx"
    pages_before = table_pages(lab, index)
    lab.execute("UPDATE job SET status = 'DONE', worker_id = 'old', claimed_at = now() WHERE id <= %s",
                (done,))
    wait_for_horizon(lab)              # the old versions are dead to everyone now
    pages_after_update = table_pages(lab, index)
    after_update = _claim_buffers(lab)
    next_claim = _claim_buffers(lab)
    lab.execute("VACUUM job")
    after_vacuum = _claim_buffers(lab)
    return ChurnReadings(index_pages_before=pages_before, index_pages_after_update=pages_after_update,
                         buffers_after_update=after_update, buffers_at_next_claim=next_claim,
                         buffers_after_vacuum=after_vacuum,
                         index_pages_after_vacuum=table_pages(lab, index))


@dataclass(frozen=True)
class TableShrink(Result):
    """The job table's size as half its rows are deleted and a plain VACUUM runs
    (:func:`vacuum_truncation`).

    pages_before: the table's size before the DELETE, in pages
    pages_after_delete: its size right after the DELETE (a DELETE frees no page)
    pages_after_vacuum: its size after VACUUM, which gives back only the empty pages at the
        table's end
    """

    pages_before: int
    pages_after_delete: int
    pages_after_vacuum: int


def vacuum_truncation(lab: Lab, *, rows: int = 20_000, where: str = "tail") -> TableShrink:
    """A table of ``rows`` jobs loses half of them to a DELETE — the newest half
    (``where="tail"``: the empty pages end the table) or a block in the middle
    (``where="middle"``: live rows stay on the last pages) — then a plain VACUUM runs.
    Returns the table's size in pages before the DELETE, after it and after VACUUM."""
    _positive("jobs", rows)
    if where not in ("tail", "middle"):
        raise LabkitError(f"where={where!r}: the deleted rows are either the 'tail' or the 'middle'.",
                          "pass where='tail' or where='middle'.")
    fresh_jobs(lab, 0)
    lab.execute("ALTER TABLE job SET (autovacuum_enabled = off)")
    add_pending(lab, rows)
    before = table_pages(lab)
    if where == "tail":
        lab.execute("DELETE FROM job WHERE id > %s", (rows // 2,))
    else:
        lab.execute("DELETE FROM job WHERE id > %s AND id <= %s", (rows // 4, rows // 4 + rows // 2))
    after_delete = table_pages(lab)
    wait_for_horizon(lab)
    lab.execute("VACUUM job")
    return TableShrink(pages_before=before, pages_after_delete=after_delete,
                       pages_after_vacuum=table_pages(lab))


def claim_rate(lab: Lab, *, claims: int = 200, worker_id: str = "bench") -> float:
    """Claims per second of claim + finish, one at a time, on one connection.  Commits do
    not wait for the disk here (synchronous_commit = off, this session only), so the figure
    is the claim's own work, not the server's fsync time."""
    _positive("claims", claims)
    with lab.connect(role=worker_id) as conn:
        conn.execute("SET synchronous_commit = off")
        t0 = time.perf_counter()
        for _ in range(claims):
            ids = claim(conn, worker_id, 1)
            if not ids:
                raise LabkitError("The queue ran dry during a claim-rate measurement.",
                                  "create more pending jobs than claims.")
            finish(conn, worker_id, ids)
        return claims / (time.perf_counter() - t0)


@dataclass(frozen=True)
class HistoryPoint(Result):
    """One point of :func:`history_ladder`: claim throughput with ``done_rows`` finished jobs
    in the table, with or without the partial index on the pending predicate.

    done_rows: finished (DONE) jobs in the table
    partial_index: whether the table had the partial index on the pending predicate
    claims_per_s: claims per second (claim + finish, one at a time), the best round
    search_pages: shared buffers the claim's search for a pending job read (EXPLAIN ANALYZE
        on the freshly built table, rolled back)
    claim_buffers: shared buffers the whole claim statement touched (the same EXPLAIN)
    table_pages: the job table's size, in pages
    pkey_pages: its primary key's size, in pages

    ``as_dict()`` gives each field under the label a table of the ladder shows it with
    (``LABELS``: ``done rows``, ``claims/s``...): ``pd.DataFrame([p.as_dict() for p in points])``
    is that table.
    """

    done_rows: int
    partial_index: bool
    claims_per_s: float
    search_pages: int
    claim_buffers: int
    table_pages: int
    pkey_pages: int

    LABELS: ClassVar[dict[str, str]] = {
        "done_rows": "done rows", "partial_index": "partial index", "claims_per_s": "claims/s",
        "search_pages": "search pages", "claim_buffers": "claim buffers", "table_pages": "table pages",
        "pkey_pages": "pkey pages"}

    def as_dict(self, only: Iterable[str] | None = None) -> dict[str, Any]:
        """The fields as plain values (see :class:`~labkit.core.results.Result`), each under
        its label in ``LABELS``; ``only`` names them by label or by field."""
        field_of = {label: name for name, label in self.LABELS.items()}
        names = None if only is None else [field_of.get(n, n) for n in only]
        return {self.LABELS[k]: v for k, v in super().as_dict(names).items()}


def history_ladder(lab: Lab, ladder: Sequence[int] = (0, 10_000, 100_000), *, claims: int = 200,
                   claims_without_index: int | None = None, rounds: int = 1,
                   out: Callable[[str], object] | None = None) -> list[HistoryPoint]:
    """Claim throughput with ``done`` finished rows in the table, with and without the
    partial index.  Every (done, index) point gets a table of its own (in a schema of its
    own, dropped at the end), all built first; then ``rounds`` rounds each run
    ``claims`` claims on every point in turn, so that load from elsewhere on a shared
    machine falls on all points alike, and each point keeps its best round.  Returns one
    :class:`HistoryPoint` per point: claims/s, the pages the claim's search reads and the
    buffers the whole claim statement touches (EXPLAIN ANALYZE on the freshly built table,
    rolled back), and the sizes in pages of the table and its primary key."""
    _positive("rounds", rounds)
    points = [(done, index) for done in ladder for index in (True, False)]
    subs: list[Lab] = []
    built: list[HistoryPoint] = []        # each point as built, its rate still to measure
    sizes: list[int] = []                 # claims measured per round at each point
    try:
        for i, (done, index) in enumerate(points):
            n = claims if index or claims_without_index is None else claims_without_index
            sub = Lab.open(lab.db, f"{lab.name}_h{i}", user=lab.user_tag)
            subs.append(sub)
            make_queue(sub, pending=n * rounds + 10, done=done, index=index)
            plan = plan_of(sub, CLAIM_SQL, {"batch": 1, "worker_id": "explain"}, analyze=True)
            built.append(HistoryPoint(done_rows=done, partial_index=index, claims_per_s=0.0,
                                      search_pages=plan.search_buffers, claim_buffers=plan.buffers,
                                      table_pages=table_pages(sub), pkey_pages=table_pages(sub, "job_pkey")))
            sizes.append(n)
        best = [0.0] * len(built)
        for _ in range(rounds):
            for k, (sub, n) in enumerate(zip(subs, sizes)):
                best[k] = max(best[k], claim_rate(sub, claims=n))
    finally:
        for sub in subs:
            sub.discard()
    rows = [replace(point, claims_per_s=rate) for point, rate in zip(built, best)]
    for row in rows:
        if out:
            out(f"  {row.done_rows:>9,} done rows  index={'yes' if row.partial_index else 'no ':3}  "
                f"{row.claims_per_s:9.0f} claims/s")
    return rows


@dataclass(frozen=True)
class QueryPlan(Result):
    """A statement's plan, from EXPLAIN (FORMAT JSON) in a transaction rolled back
    (:func:`plan_of`).

    nodes: the plan's node types, top down ("Limit", "LockRows", "Index Scan"...)
    indexes: the indexes its scans use, in the same order
    buffers: shared buffers (hit or read) the whole statement touched (0 without ANALYZE)
    search_buffers: of them, those of the scans that search for rows (a scan with no Index
        Cond or Recheck Cond: the search for pending jobs, not a look-up by key)
    ms: the execution time, in milliseconds (None without ANALYZE)
    """

    nodes: list[str]
    indexes: list[str]
    buffers: int
    search_buffers: int
    ms: float | None


def plan_of(lab: Lab, query: str, params: dict[str, Any] | None = None, *,
            analyze: bool = False) -> QueryPlan:
    """EXPLAIN a claim inside a transaction that is rolled back.  Returns the plan's node
    types (top down), the indexes it uses and, with ``analyze``, shared buffers touched
    and the execution time."""
    import json

    opts = "ANALYZE, BUFFERS, FORMAT JSON" if analyze else "FORMAT JSON"
    with lab.connect(role="explain") as conn:
        with conn.transaction(force_rollback=True):
            doc = one_row(conn.execute(f"EXPLAIN ({opts}) {query}", params), "EXPLAIN")[0]
    if isinstance(doc, str):
        doc = json.loads(doc)
    top = doc[0]
    nodes, indexes = [], []
    search = 0

    def pages(node):
        return node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0)

    def walk(node):
        nonlocal search
        kind = node["Node Type"]
        nodes.append(kind)
        if "Index Name" in node:
            indexes.append(node["Index Name"])
        # A scan that looks rows up by key (Index Cond) fetches what was already found;
        # a scan without one is the search for pending jobs.
        if kind in SCANS and "Index Cond" not in node and "Recheck Cond" not in node:
            search += pages(node)
        for child in node.get("Plans", []):
            walk(child)

    walk(top["Plan"])
    return QueryPlan(nodes=nodes, indexes=indexes, buffers=pages(top["Plan"]), search_buffers=search,
                     ms=top.get("Execution Time"))


SCANS = ("Seq Scan", "Index Scan", "Index Only Scan", "Bitmap Heap Scan")


# -- the command line -------------------------------------------------------------------------------

def _ladder(text: str) -> list[int]:
    """``--ladder 0,10000,100000``: whole numbers of finished rows, each in range."""
    try:
        ladder = [int(x.strip().replace("_", "")) for x in text.split(",") if x.strip()]
    except ValueError:
        raise LabkitError(f"--ladder {text!r} is not a list of whole numbers.",
                          "pass --ladder 0,10000,100000 (finished rows at each point).") from None
    if not 1 <= len(ladder) <= MAX_LADDER:
        raise LabkitError(f"--ladder has {len(ladder)} points; a ladder has 1 to {MAX_LADDER}.",
                          "pass --ladder 0,10000,100000, for instance.")
    for x in ladder:
        if not 0 <= x <= MAX_ROWS:
            raise LabkitError(f"--ladder {x:,}: a point has 0 to {MAX_ROWS:,} finished rows.",
                              "pass --ladder 0,10000,100000, for instance.")
    return ladder


def bench_history_command(*, open_lab: Callable[[], Lab], ladder: str, claims: int,
                          claims_without_index: int) -> int:
    """``labkit bench-history``: claim throughput at each point of ``ladder`` (finished rows,
    comma separated), with and without the partial index.  ``open_lab()`` gives the run its
    own lab (a schema of this run's own: two runs at once never touch each other's tables)."""
    points = _ladder(ladder)
    number("claims", claims, low=1, high=MAX_CLAIMS, whole=True, example=300)
    number("claims_without_index", claims_without_index, low=1, high=MAX_CLAIMS // 10,
           whole=True, example=60)
    with open_lab() as lab:
        print(f"claim + finish, one at a time, one connection; ladder {points}")
        rows = history_ladder(lab, points, claims=claims,
                              claims_without_index=claims_without_index, out=print)
        make_queue(lab, pending=claims + 10, done=max(points), index=False)
        archive_done(lab)
        archived = claim_rate(lab, claims=claims)
        print(f"  after archiving {max(points):,} done rows (no partial index): {archived:9.0f} claims/s")
        by = {(r.done_rows, r.partial_index): r.claims_per_s for r in rows}
        top = max(points)
        print(f"slow-down from {min(points):,} to {top:,} done rows: "
              f"with index ×{by[(min(points), True)] / by[(top, True)]:.1f}, "
              f"without ×{by[(min(points), False)] / by[(top, False)]:.1f}")
    return 0
