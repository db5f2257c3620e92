"""The convoy: N workers claiming from one job table, measured.

Each worker is a thread with its own connection.  All of them wait at a barrier
and start together; they then loop *claim → job → finish* for a fixed time (or
until a backlog is drained) and record one event per claim: when they asked,
when they got the row, when the row lock was released and when the job was
done, plus every NOWAIT error.  Threads are enough here: a worker spends its
time waiting on the server or in ``sleep`` (the job), and psycopg releases the
GIL while it waits.

The model the measurements are compared with: with the row lock held for a job
of ``d`` seconds, *wait* and *NOWAIT* complete ``1/d`` jobs per second whatever
the number of workers (they all want the head of the queue, and only its holder
works), while *SKIP LOCKED* completes ``N/d``.  With claim + mark + commit, the
lock is held only for the claim, so every policy is modelled at ``N/d``.

``sweep()`` returns a tidy DataFrame; ``convoy_command()`` is ``labkit convoy``.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, overload

import psycopg
from psycopg import sql

from ..core import mysql
from ..core.db import WORKER_GUARDS
from ..core.errors import LabkitError
from ..core.files import data_file
from ..core.lab import Lab
from ..core.limits import bulk, number, writable_file
from ..core.plots import PALETTE, legend_beside, plain_log_ticks, setup_matplotlib, static_box
from ..core.queries import queries
from ..core.results import Result
from ..core.text import fill
from ..core.text import table as text_table
from ._checked import one_row

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

POLICIES = {"wait": "", "nowait": "NOWAIT", "skip": "SKIP LOCKED"}
POLICY_NAMES = {"wait": "wait (FOR UPDATE)", "nowait": "NOWAIT", "skip": "SKIP LOCKED"}
MAX_WORKERS = 64
MAX_JOBS = 400_000
MAX_JOB_MS = 60_000        # a job of a minute
MAX_SECONDS = 3_600        # an hour per point
MAX_POINTS = 200           # (policy, workers) points in one sweep
MAX_BACKOFF_MS = 60_000
ROLE_PREFIX = "convoy-w"

COLUMNS = ["policy", "workers", "variant", "job_ms", "seconds", "jobs", "jobs_per_s",
           "model_jobs_per_s", "efficiency", "claim_wait_p50_ms", "claim_wait_p95_ms",
           "claim_wait_p99_ms", "claim_wait_max_ms", "job_latency_p50_ms", "job_latency_p99_ms",
           "errors", "errors_per_s", "errors_per_job", "busy_workers", "idle_workers", "top_worker_share",
           "client_cpu_pct", "server_cpu_pct", "makespan_s", "model_makespan_s", "backlog",
           "claim_wait_censored", "claim_wait_p99_censored", "commit_delay_ms", "deadlocks"]


# -- the SQL the workers send ----------------------------------------------------------

WORKER_SQL = "convoy_worker.sql"     # named queries: claim, finish_holding, mark, finish, refill


def claim_sql(policy: str, engine: str = "postgresql") -> sql.Composed | str:
    """The claim statement for one policy (``wait``, ``nowait`` or ``skip``); on MySQL and
    MariaDB, the same text as a plain string."""
    _check_policy(policy)
    text = queries(WORKER_SQL)["claim"].sql
    if engine != "postgresql":
        return text.format(policy=POLICIES[policy])
    return sql.SQL(text).format(policy=sql.SQL(POLICIES[policy]))


# A NOWAIT claim that met a locked row: psycopg's error, or labkit's for MySQL and MariaDB.
BUSY = (psycopg.errors.LockNotAvailable, mysql.LockNotAvailable)
# A transaction the server rolled back to break a deadlock (never seen here on PostgreSQL;
# InnoDB's gap locks make them under REPEATABLE READ): the worker rolls back and goes on.
DEADLOCKS = (psycopg.errors.DeadlockDetected, mysql.Deadlock)


def _execute(conn: psycopg.Connection | mysql.MyConn, statement: sql.Composed | str) -> Any:
    """``statement`` run on ``conn``, its cursor: a MySQL-compatible connection takes the plain
    string :func:`claim_sql` makes for its engine."""
    if isinstance(conn, mysql.MyConn):
        if not isinstance(statement, str):
            raise LabkitError("A MySQL-compatible connection was given PostgreSQL's claim statement.",
                              "make the claim with claim_sql(policy, engine_of(lab)).")
        return conn.execute(statement)
    return conn.execute(statement)


def engine_of(lab: Any) -> str:
    """``postgresql``, or ``mariadb`` / ``mysql`` for a lab on a MySQL-compatible server."""
    return lab.engine if isinstance(lab, mysql.MyLab) else "postgresql"


# -- the model ---------------------------------------------------------------------------

def model_jobs_per_s(policy: str, workers: int, job_ms: float, hold: bool = True) -> float:
    """Predicted throughput: 1/d for wait and NOWAIT with the lock held for the job, N/d
    otherwise."""
    _check_policy(policy)
    d = job_ms / 1000.0
    if hold and policy in ("wait", "nowait"):
        return 1.0 / d
    return workers / d


def model_makespan_s(policy: str, workers: int, job_ms: float, backlog: int, hold: bool = True) -> float:
    """Predicted time to drain ``backlog`` jobs: M·d when only one worker can work at a
    time, ceil(M/N)·d when all of them can."""
    d = job_ms / 1000.0
    if hold and policy in ("wait", "nowait"):
        return backlog * d
    return math.ceil(backlog / workers) * d


# -- one measured run ------------------------------------------------------------------------

@dataclass
class Claim:
    """One job, as one worker saw it (seconds since the start signal)."""

    worker: int
    job: int
    asked: float        # started trying to claim (first attempt)
    claimed: float      # the claim returned the row
    released: float     # the row lock was released (commit)
    done: float         # the job was recorded as done
    errors: int         # NOWAIT errors before this claim succeeded


@dataclass
class WorkerLog:
    worker: int
    claims: list[Claim] = field(default_factory=list)
    error_times: list[float] = field(default_factory=list)
    errors: int = 0
    deadlocks: int = 0          # deadlocks this worker's transactions lost (InnoDB; retried)
    open_ask: float | None = None     # still trying to claim when the window closed
    ran_dry: bool = False
    failure: BaseException | None = None
    backend_pid: int | None = None


@dataclass
class ConvoyRun:
    """The outcome of one run: parameters, per-claim events, and the numbers."""

    policy: str
    workers: int
    job_ms: float
    seconds: float | None
    hold: bool
    backoff: bool
    backlog: int | None
    logs: list[WorkerLog]
    wall_s: float
    client_cpu_s: float
    server_cpu_s: float | None
    commit_delay_ms: float = 0.0

    # -- derived --------------------------------------------------------------------
    @property
    def variant(self) -> str:
        parts = ["hold" if self.hold else "no-hold"]
        if self.policy == "nowait":
            parts.append("backoff" if self.backoff else "tight")
        if self.backlog:
            parts.append(f"drain {self.backlog}")
        if self.commit_delay_ms:
            parts.append(f"commit_delay {self.commit_delay_ms:g} ms")
        return ", ".join(parts)

    @property
    def claims(self) -> list[Claim]:
        return sorted((c for log in self.logs for c in log.claims), key=lambda c: c.claimed)

    def counted(self) -> list[Claim]:
        """The jobs that count: done inside the measured window (all of them when draining)."""
        if self.backlog:
            return self.claims
        end = _window(self.seconds)
        return [c for c in self.claims if c.done <= end]

    @property
    def window_s(self) -> float:
        if self.backlog:
            return self.makespan_s
        return float(_window(self.seconds))

    @property
    def makespan_s(self) -> float:
        claims = self.claims
        return max(c.done for c in claims) if claims else 0.0

    @property
    def errors(self) -> int:
        if self.backlog:
            return sum(log.errors for log in self.logs)
        end = _window(self.seconds)
        return sum(1 for log in self.logs for t in log.error_times if t <= end)

    def events(self) -> pd.DataFrame:
        """One row per claim: worker, job, and the times (ms) it asked, got the row, released
        the lock and finished."""
        import pandas as pd

        rows = [{"worker": c.worker, "job": c.job, "asked_ms": c.asked * 1e3, "claimed_ms": c.claimed * 1e3,
                 "released_ms": c.released * 1e3, "done_ms": c.done * 1e3, "errors": c.errors}
                for c in self.claims]
        return pd.DataFrame(rows, columns=["worker", "job", "asked_ms", "claimed_ms", "released_ms",
                                           "done_ms", "errors"])

    def _censored_waits_ms(self) -> list[float]:
        """The waits (ms) of workers still asking when a timed run's window closed."""
        # a worker still waiting when the window closed has waited at least until then: its
        # wait is censored (a lower bound), and so is a percentile that lands among them
        if self.backlog:
            return []
        end = _window(self.seconds)
        return [(end - log.open_ask) * 1e3 for log in self.logs
                if log.open_ask is not None and log.open_ask < end]

    def _busy_workers(self, counted: list[Claim], window: float) -> float:
        """How many workers are busy with a job on average (the convoy's width)."""
        if not counted:
            return 0.0
        return sum(max(0.0, min(c.done, window) - c.claimed) for c in self.claims) / window

    def _spread(self, counted: list[Claim]) -> dict[str, Any]:
        """How the counted jobs spread over the workers: those that finished none, and the
        busiest one's share."""
        per_worker = [sum(1 for c in counted if c.worker == w) for w in range(self.workers)]
        return {"idle_workers": sum(1 for n in per_worker if n == 0),
                "top_worker_share": max(per_worker) / len(counted) if counted else float("nan")}

    def _cpu_pct(self) -> dict[str, float]:
        """The client's and the server's CPU over the run's wall time (NaN: not measured)."""
        return {"client_cpu_pct": 100.0 * self.client_cpu_s / self.wall_s,
                "server_cpu_pct": (100.0 * self.server_cpu_s / self.wall_s
                                   if self.server_cpu_s is not None else float("nan"))}

    def _drain_times(self) -> dict[str, float]:
        """A drain's makespan, measured and modelled (NaN for a timed run)."""
        if not self.backlog:
            return {"makespan_s": float("nan"), "model_makespan_s": float("nan")}
        return {"makespan_s": self.makespan_s,
                "model_makespan_s": model_makespan_s(self.policy, self.workers, self.job_ms, self.backlog,
                                                     self.hold)}

    def row(self) -> dict[str, Any]:
        """The tidy row this run contributes to a sweep."""
        import numpy as np

        counted = self.counted()
        window = self.window_s or float("nan")
        censored = self._censored_waits_ms()
        finished = [(c.claimed - c.asked) * 1e3 for c in counted]
        waits = np.array(finished + censored) if finished or censored else np.array([np.nan])
        latency = np.array([(c.done - c.asked) * 1e3 for c in counted]) if counted else np.array([np.nan])
        model = model_jobs_per_s(self.policy, self.workers, self.job_ms, self.hold)
        jobs_per_s = len(counted) / window if counted else 0.0
        errors = self.errors
        pct = lambda q: float(np.percentile(waits, q))  # noqa: E731
        return {
            "policy": self.policy, "workers": self.workers, "variant": self.variant,
            "job_ms": self.job_ms, "seconds": self.seconds, "jobs": len(counted),
            "jobs_per_s": jobs_per_s, "model_jobs_per_s": model,
            "efficiency": jobs_per_s / model if model else float("nan"),
            "claim_wait_p50_ms": pct(50), "claim_wait_p95_ms": pct(95), "claim_wait_p99_ms": pct(99),
            "claim_wait_max_ms": float(np.max(waits)),
            "job_latency_p50_ms": float(np.percentile(latency, 50)),
            "job_latency_p99_ms": float(np.percentile(latency, 99)),
            "errors": errors, "errors_per_s": errors / window,
            "errors_per_job": errors / len(counted) if counted else float("nan"),
            "busy_workers": self._busy_workers(counted, window),
            **self._spread(counted),
            **self._cpu_pct(),
            **self._drain_times(),
            "backlog": self.backlog or 0,
            "claim_wait_censored": len(censored),
            # the p99 lands among cut-off waits when one of them is at least as long
            "claim_wait_p99_censored": bool(censored) and max(censored) >= pct(99),
            "commit_delay_ms": self.commit_delay_ms,
            "deadlocks": sum(log.deadlocks for log in self.logs),
        }

    def summary(self) -> str:
        """A few lines of plain text: what ran and what came out."""
        r = self.row()
        head = (f"{POLICY_NAMES[self.policy]}, {self.workers} worker(s), d = {self.job_ms:g} ms, "
                f"{self.variant}")
        lines = [head,
                 f"  jobs/s {r['jobs_per_s']:.0f} (model {r['model_jobs_per_s']:.0f}, "
                 f"efficiency {r['efficiency']:.2f}); busy workers on average {r['busy_workers']:.1f}, "
                 f"workers that finished no job {r['idle_workers']}",
                 f"  claim wait p50 {r['claim_wait_p50_ms']:.1f} ms, p99 {r['claim_wait_p99_ms']:.1f} ms, "
                 f"max {r['claim_wait_max_ms']:.1f} ms; NOWAIT errors/s {r['errors_per_s']:.0f}"]
        if self.backlog:
            lines.append(f"  drained {self.backlog} jobs in {r['makespan_s']:.2f} s "
                         f"(model {r['model_makespan_s']:.2f} s)")
        return "\n".join(fill(line, indent="    ") for line in lines)

    def timeline(self, ax: Axes | None = None, title: str | None = None,
                 until_ms: float | None = None) -> Axes:
        """One lane per worker: waiting for the claim (hatched), holding the row lock
        (solid), running the job after the lock was released (light), NOWAIT errors (|)."""
        return plot_timeline(self, ax=ax, title=title, until_ms=until_ms)


def _check_policy(policy: str) -> None:
    if policy not in POLICIES:
        raise LabkitError(f"Unknown claim policy {policy!r}.",
                          f"use one of {', '.join(POLICIES)}.")


def _validate(policy, workers, job_ms, seconds, backlog) -> None:
    _check_policy(policy)
    if not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
        raise LabkitError(f"A convoy run needs 1 to {MAX_WORKERS} workers, not {workers!r}.",
                          "pass workers=1 or more (each worker is one connection to the server).")
    if not (isinstance(job_ms, (int, float)) and job_ms > 0):
        raise LabkitError(f"The job duration must be a positive number of milliseconds, not {job_ms!r}.",
                          "pass job_ms=20, for instance.")
    number("job_ms", job_ms, above=True, high=MAX_JOB_MS, unit=" ms", example=20)
    if backlog is None:
        if not (isinstance(seconds, (int, float)) and seconds > 0):
            raise LabkitError(f"A timed run needs a positive duration, not seconds={seconds!r}.",
                              "pass seconds=1 (or drain a backlog with backlog=M).")
        number("seconds", seconds, above=True, high=MAX_SECONDS, unit=" s", example=2)
    elif not (isinstance(backlog, int) and backlog >= 1):
        raise LabkitError(f"A backlog to drain must be 1 job or more, not {backlog!r}.",
                          "pass backlog=100, for instance, or backlog=None for a timed run.")
    else:
        number("backlog", backlog, low=1, high=MAX_JOBS, whole=True, unit=" jobs", example=100)


def _window(seconds: float | None) -> float:
    """A timed run's window, ``seconds``: a run with no backlog to drain needs one."""
    if seconds is None:
        raise LabkitError("A timed run needs a positive duration, not seconds=None.",
                          "pass seconds=1 (or drain a backlog with backlog=M).")
    return seconds


def jobs_needed(workers: int, job_ms: float, seconds: float) -> int:
    """Enough pending jobs that no policy can run out in ``seconds``."""
    return int(math.ceil(workers * seconds * 1000.0 / job_ms * 1.3)) + 2 * workers + 16


class WorkerPool:
    """Worker connections, opened once and reused across the points of a sweep."""

    def __init__(self, lab: Lab | mysql.MyLab):
        self.lab = lab
        self.conns: list[psycopg.Connection | mysql.MyConn] = []

    def get(self, n: int) -> list[psycopg.Connection | mysql.MyConn]:
        self.conns = [c for c in self.conns if not c.closed and not c.broken]
        while len(self.conns) < n:
            # the guards: a worker never hangs a notebook, whatever goes wrong
            self.conns.append(self.lab.connect(autocommit=False, role=f"{ROLE_PREFIX}{len(self.conns)}",
                                               guards=WORKER_GUARDS))
        return self.conns[:n]

    def cancel(self) -> None:
        for conn in self.conns:
            try:
                conn.cancel_safe(timeout=2)
            except Exception:
                pass

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.close()
            except Exception:
                pass
        self.conns = []

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def prepare_queue(lab: Lab | mysql.MyLab, n: int) -> None:
    """Create the job table if needed and fill it with ``n`` fresh pending jobs."""
    if n > MAX_JOBS:
        raise LabkitError(f"This run would need {n} pending jobs (more than {MAX_JOBS}).",
                          "use fewer workers, fewer seconds or a longer job_ms.")
    if isinstance(lab, mysql.MyLab):
        _prepare_mysql_queue(lab, n)
        return
    if lab.execute("SELECT to_regclass('job')")[0][0] is None:
        lab.run_file("job_table.sql")
    for stmt in queries(WORKER_SQL)["refill"].statements:
        if "%(n)s" in stmt:
            bulk(lab, stmt, {"n": n}, rows=n)
        else:
            lab.execute(stmt)


def _prepare_mysql_queue(lab: mysql.MyLab, n: int) -> None:
    """The same fresh queue on MySQL or MariaDB: ``n`` pending jobs, one a second."""
    import datetime as dt

    q = queries("mysql_jobs.sql")
    if not lab.execute("SHOW TABLES LIKE 'job'"):
        lab.execute(q["job_table"].sql)
    lab.execute(q["empty"].sql)
    start = dt.datetime(2026, 1, 1, 9, 0, 0)
    cur = lab.admin.raw.cursor()
    for lo in range(1, n + 1, 5000):
        cur.executemany(q["add_job"].sql, [(i, "PENDING", start + dt.timedelta(seconds=i - 1), f"job {i}")
                                           for i in range(lo, min(n, lo + 4999) + 1)])
    lab.execute("ANALYZE TABLE job")


def _backend_cpu_s(pids: list[int]) -> float | None:
    """CPU seconds the server spent in these backends, from /proc (same host only)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            return None
    return total


def _is_local(lab: Lab | mysql.MyLab) -> bool:
    if isinstance(lab, mysql.MyLab):
        return False             # one server process, its sessions are threads: no per-session CPU
    dsn = lab.db.dsn
    return any(h in dsn for h in ("127.0.0.1", "localhost", "host=/", "%2F")) or "@/" in dsn


@dataclass(frozen=True)
class _Backoff:
    """NOWAIT's backoff after an error: on or off, and its base and cap (ms)."""

    on: bool
    base_ms: float
    cap_ms: float

    def pause_s(self, rng: random.Random, attempt: int) -> float:
        """A random pause up to min(cap, base·2^attempt), in seconds."""
        return rng.uniform(0, min(self.cap_ms, self.base_ms * 2 ** attempt)) / 1e3


@dataclass(frozen=True)
class _WorkerPlan:
    """What every worker of one run does: the statements it sends, the job's length, whether
    the row lock is held for the job, the backoff, when to stop, and the seed of its rng."""

    claim: sql.Composed | str
    stmts: dict[str, str]
    job_s: float
    hold: bool
    backoff: _Backoff
    deadline: float
    backlog: int | None
    seed: int


class _Crew:
    """The worker threads' shared state: their logs, the start barrier (whose action notes
    the start time), the stop signal, and one finished event per worker."""

    def __init__(self, workers: int):
        self.stop = threading.Event()
        self.logs = [WorkerLog(w) for w in range(workers)]
        # Each worker says it has finished through its own event.  The caller waits on these,
        # never in Thread.join while a Ctrl-C can land: CPython 3.11's join, interrupted by
        # KeyboardInterrupt, can mark a still-running thread as stopped (bpo-45274's clean-up),
        # after which every later join returns at once and the worker is left running.
        self.finished = [threading.Event() for _ in range(workers)]
        self.t0_box: list[float] = []
        self.barrier = threading.Barrier(workers + 1, action=self._go)

    def _go(self) -> None:
        """The barrier's action: the start signal, its time noted."""
        self.t0_box.append(time.perf_counter())

    def running(self) -> list[int]:
        """The workers that have not finished yet."""
        return [w for w, e in enumerate(self.finished) if not e.is_set()]


def _check_commit_delay(lab: Lab | mysql.MyLab, commit_delay_ms: float) -> None:
    """``commit_delay_ms`` in range, and only on PostgreSQL."""
    number("commit_delay_ms", commit_delay_ms, low=0, high=100, unit=" ms", example=5)
    if commit_delay_ms and isinstance(lab, mysql.MyLab):
        raise LabkitError("commit_delay_ms is PostgreSQL's commit_delay; MySQL and MariaDB have none.",
                          "leave commit_delay_ms at 0 on this engine.")


def _checked_backoff(backoff: bool, base_ms: float, cap_ms: float | None, job_ms: float) -> _Backoff:
    """The backoff's times checked (the cap is ``job_ms`` when not given)."""
    if cap_ms is None:
        cap_ms = float(job_ms)
    if base_ms <= 0 or cap_ms <= 0:
        raise LabkitError("Backoff times must be positive.", "pass backoff_base_ms=1, backoff_cap_ms=20.")
    number("backoff_base_ms", base_ms, above=True, high=MAX_BACKOFF_MS, unit=" ms", example=1)
    number("backoff_cap_ms", cap_ms, above=True, high=MAX_BACKOFF_MS, unit=" ms", example=20)
    return _Backoff(backoff, base_ms, cap_ms)


def _ask_for_a_row(conn: psycopg.Connection | mysql.MyConn, plan: _WorkerPlan, log: WorkerLog,
                   stop: threading.Event, now: Callable[[], float],
                   rng: random.Random) -> tuple[Any, bool, int]:
    """Send the claim until it is answered (retrying a deadlock victim and, after a NOWAIT
    error, at once or after a backoff): the row (None: nothing claimable), whether it was
    answered (not: stopped, or out of time while retrying), and the errors on the way."""
    errors = attempt = 0
    while not stop.is_set():
        try:
            return _execute(conn, plan.claim).fetchone(), True, errors
        except DEADLOCKS:              # InnoDB under REPEATABLE READ: retry
            conn.rollback()
            log.deadlocks += 1
        except BUSY:
            conn.rollback()
            errors += 1
            log.errors += 1
            log.error_times.append(now())
            if now() >= plan.deadline:
                break
            if plan.backoff.on:
                time.sleep(plan.backoff.pause_s(rng, attempt))
                attempt += 1
    return None, False, errors


def _run_job(conn: psycopg.Connection | mysql.MyConn, plan: _WorkerPlan, params: dict[str, Any],
             now: Callable[[], float]) -> tuple[float, float]:
    """The job on a claimed row, the lock held through it or claim + mark + commit first;
    when the row lock was released and when the job was done."""
    if plan.hold:
        time.sleep(plan.job_s)                                  # the job, row locked
        conn.execute(plan.stmts["finish_holding"], params)
        conn.commit()
        released = done = now()
        return released, done
    conn.execute(plan.stmts["mark"], params)
    conn.commit()
    released = now()
    time.sleep(plan.job_s)                                      # the job, no lock held
    conn.execute(plan.stmts["finish"], params)
    conn.commit()
    return released, now()


def _claim_loop(w: int, conn: psycopg.Connection | mysql.MyConn, plan: _WorkerPlan, log: WorkerLog,
                stop: threading.Event, now: Callable[[], float], rng: random.Random) -> None:
    """Claim, run the job, finish, until stopped, out of time or out of rows; each claim
    recorded in ``log``."""
    me = f"w{w}"
    while not stop.is_set() and now() < plan.deadline:
        asked = now()
        row, answered, errors = _ask_for_a_row(conn, plan, log, stop, now, rng)
        claimed = now()
        if not answered:                  # stopped, or out of time while retrying
            log.open_ask = asked
            break
        if row is None:                   # nothing left this worker could claim
            conn.rollback()
            log.ran_dry = not plan.backlog
            break
        if claimed >= plan.deadline:
            conn.rollback()            # asked in time, got the row too late: hand it back
            log.open_ask = asked
            break
        job = row[0]
        try:
            released, done = _run_job(conn, plan, {"id": job, "worker": me}, now)
        except DEADLOCKS:       # chosen as the victim: its work is rolled back, not done
            conn.rollback()
            log.deadlocks += 1
            continue
        log.claims.append(Claim(w, job, asked, claimed, released, done, errors))


def _worker_thread(w: int, conn: psycopg.Connection | mysql.MyConn, plan: _WorkerPlan, crew: _Crew) -> None:
    """One worker thread: wait at the barrier, run the claim loop; a failure is recorded
    (and stops the others), and the worker's finished event is set on the way out."""
    log = crew.logs[w]
    rng = random.Random(plan.seed * 1000 + w)
    try:
        log.backend_pid = conn.info.backend_pid
        crew.barrier.wait(timeout=30)
        t0 = crew.t0_box[0]
        _claim_loop(w, conn, plan, log, crew.stop, lambda: time.perf_counter() - t0, rng)
    except threading.BrokenBarrierError:
        pass
    except BaseException as exc:  # recorded, re-raised in the caller
        log.failure = exc
        crew.stop.set()
    finally:
        try:
            conn.rollback()
        except Exception:
            pass
        crew.finished[w].set()


def _measure_crew(crew: _Crew, threads: list[threading.Thread], conns: list[psycopg.Connection | mysql.MyConn],
                  *, local: bool, limit: float) -> tuple[float, float, float | None]:
    """Start the threads, give the start signal and wait for every worker (at most ``limit``
    seconds): the wall time, the client's CPU seconds and the server backends' (None where
    /proc cannot tell)."""
    for t in threads:
        t.start()
    pids = [c.info.backend_pid for c in conns]
    cpu_server0 = _backend_cpu_s(pids) if local else None
    cpu_client0 = time.process_time()
    crew.barrier.wait(timeout=30)
    t_start = time.perf_counter()
    # short waits, so that Ctrl-C (KeyboardInterrupt) is noticed at once
    while crew.running() and time.perf_counter() - t_start < limit:
        crew.finished[crew.running()[0]].wait(0.05)
    wall = time.perf_counter() - t_start
    cpu_client = time.process_time() - cpu_client0
    cpu_server1 = _backend_cpu_s(pids) if cpu_server0 is not None else None
    if crew.running():
        raise LabkitError("Convoy workers did not finish in time (a lock held outside the run?).",
                          "run `labkit doctor` to find the session holding the lock, then re-run.")
    server = (cpu_server1 - cpu_server0) if cpu_server0 is not None and cpu_server1 is not None else None
    return wall, cpu_client, server


def _stop_crew(crew: _Crew, threads: list[threading.Thread], pool: WorkerPool) -> None:
    """Every worker stopped: the barrier broken, the queries of those still running
    cancelled, each waited for (15 s at most) and joined."""
    for w, t in enumerate(threads):
        if t.ident is None:             # never started (interrupted while starting them)
            crew.finished[w].set()
    crew.stop.set()
    crew.barrier.abort()
    if crew.running():
        pool.cancel()
    give_up = time.monotonic() + 15
    for w in crew.running():
        crew.finished[w].wait(max(0.0, give_up - time.monotonic()))
    for t in threads:                   # each has left its loop: these joins are short
        if t.ident is not None:
            t.join(max(0.1, give_up - time.monotonic()))


def _raise_worker_failure(logs: list[WorkerLog], *, timed: bool) -> None:
    """A worker's failure raised as a LabkitError, and a timed run whose queue ran dry."""
    for log in logs:
        if log.failure is not None:
            exc = log.failure
            if isinstance(exc, LabkitError):       # already says what happened and the fix
                raise exc
            raise LabkitError(f"Convoy worker {log.worker} failed: {type(exc).__name__}: {exc}",
                              "check the server with `labkit doctor` and re-run.") from exc
    if timed and any(log.ran_dry for log in logs):
        raise LabkitError("The queue ran dry during a timed run, so the figures would be wrong.",
                          "this is a labkit bug (jobs_needed); report it, or use a longer job_ms.")


def run(lab: Lab | mysql.MyLab, policy: str = "skip", workers: int = 4, job_ms: float = 20, seconds: float | None = 1.0, *,
        hold: bool = True, backoff: bool = False, backlog: int | None = None,
        backoff_base_ms: float = 1.0, backoff_cap_ms: float | None = None,
        pool: WorkerPool | None = None, seed: int = 2026, commit_delay_ms: float = 0.0) -> ConvoyRun:
    """Run ``workers`` workers with one claim ``policy`` against a fresh job table.

    Timed (``seconds``): the queue never runs dry and the jobs done inside the window
    count.  Draining (``backlog=M``): M jobs, and the run ends when they are all done.
    ``hold``: the row lock is held while the job runs (the anti-pattern); otherwise
    claim + mark + commit, job, then a second transaction marks it done.
    ``backoff`` (NOWAIT only): after an error, sleep a random time up to
    min(cap, base·2^attempt) instead of retrying at once.
    ``commit_delay_ms``: every worker commit waits that long before its WAL flush (the
    server's own ``commit_delay``, with ``commit_siblings = 0``): a real, slower durable
    commit, for a machine whose disk flushes too fast to show what a commit costs.  It needs
    a superuser and a server with fsync on (PostgreSQL skips the delay otherwise).
    """
    _validate(policy, workers, job_ms, seconds, backlog)
    _check_commit_delay(lab, commit_delay_ms)
    pause = _checked_backoff(backoff, backoff_base_ms, backoff_cap_ms, job_ms)
    n_jobs = backlog if backlog else jobs_needed(workers, job_ms, _window(seconds))
    prepare_queue(lab, n_jobs)
    own_pool = pool is None
    pool = pool or WorkerPool(lab)
    plan = _WorkerPlan(claim=claim_sql(policy, engine_of(lab)),
                       stmts={name: queries(WORKER_SQL)[name].sql for name in ("finish_holding", "mark", "finish")},
                       job_s=job_ms / 1000.0, hold=hold, backoff=pause,
                       deadline=float("inf") if backlog else float(_window(seconds)), backlog=backlog, seed=seed)
    crew = _Crew(workers)
    conns = pool.get(workers)
    if commit_delay_ms:
        _commit_delay(lab, conns, commit_delay_ms)
    threads = [threading.Thread(target=_worker_thread, args=(w, c, plan, crew), name=f"convoy-w{w}", daemon=True)
               for w, c in enumerate(conns)]
    local = _is_local(lab)
    limit = (plan.deadline if not backlog else model_makespan_s(policy, 1, job_ms, backlog) * 3 + 30) + 30
    try:
        wall, cpu_client, cpu_server = _measure_crew(crew, threads, conns, local=local, limit=limit)
    finally:
        _stop_crew(crew, threads, pool)
        if own_pool:
            pool.close()
        elif commit_delay_ms:
            _commit_delay(lab, [c for c in conns if not c.closed and not c.broken], 0.0)
    _raise_worker_failure(crew.logs, timed=not backlog)
    return ConvoyRun(policy, workers, float(job_ms), None if backlog else float(_window(seconds)), hold, backoff,
                     backlog, crew.logs, wall, cpu_client, cpu_server, float(commit_delay_ms))


@dataclass(frozen=True)
class CommitCost(Result):
    """What one tiny commit costs on this server (:func:`commit_cost_ms`), one INSERT per
    commit on one connection, back to back.

    fsync: the server's fsync setting (on: a flushed commit is durable)
    synchronous_commit: the server's synchronous_commit setting (the sessions' default)
    synchronous_commit_on_ms: one commit with synchronous_commit on (COMMIT returns after the
        WAL flush), in milliseconds
    synchronous_commit_off_ms: one commit with synchronous_commit off (COMMIT returns before
        the flush), in milliseconds
    flush_ms: the difference: what waiting for the flush adds to a commit, in milliseconds
    """

    fsync: str
    synchronous_commit: str
    synchronous_commit_on_ms: float
    synchronous_commit_off_ms: float
    flush_ms: float


def commit_cost_ms(lab: Lab, commits: int = 200) -> CommitCost:
    """What one tiny commit costs on this server, in ms: with synchronous_commit on (COMMIT
    returns after the WAL flush; durable when fsync is on) and off, measured back to back on
    one connection; with the server's fsync and synchronous_commit."""
    number("commits", commits, low=10, high=100_000, whole=True, example=200)
    conn = lab.connect(role="commit-cost")
    try:
        # an ordinary table: a temporary one writes no WAL, and its commit flushes nothing
        conn.execute("CREATE TABLE IF NOT EXISTS commit_cost (n int)")
        fsync = one_row(conn.execute("SHOW fsync"), "SHOW fsync")[0]
        synchronous_commit = one_row(conn.execute("SHOW synchronous_commit"), "SHOW synchronous_commit")[0]
        per_commit_ms = {}
        for mode in ("on", "off"):
            conn.execute("SELECT set_config('synchronous_commit', %s, false)", (mode,))
            t0 = time.perf_counter()
            for i in range(commits):
                conn.execute("INSERT INTO commit_cost VALUES (%s)", (i,))  # autocommit: one commit each
            per_commit_ms[mode] = (time.perf_counter() - t0) * 1000 / commits
        conn.execute("DROP TABLE commit_cost")
        return CommitCost(fsync=fsync, synchronous_commit=synchronous_commit,
                          synchronous_commit_on_ms=per_commit_ms["on"],
                          synchronous_commit_off_ms=per_commit_ms["off"],
                          flush_ms=per_commit_ms["on"] - per_commit_ms["off"])
    finally:
        conn.close()


def _commit_delay(lab: Lab | mysql.MyLab, conns: list[psycopg.Connection | mysql.MyConn],
                  delay_ms: float) -> None:
    """Set (or, with 0, reset) commit_delay on the worker connections (PostgreSQL's)."""
    pg: list[psycopg.Connection] = []
    for conn in conns:
        if not isinstance(conn, psycopg.Connection):
            raise LabkitError("commit_delay_ms is PostgreSQL's commit_delay; MySQL and MariaDB have none.",
                              "leave commit_delay_ms at 0 on this engine.")
        pg.append(conn)
    if not delay_ms:
        for conn in pg:
            conn.execute("RESET commit_delay")
            conn.execute("RESET commit_siblings")
            conn.commit()
        return
    fsync = lab.execute("SHOW fsync")[0][0]
    if fsync != "on":
        raise LabkitError("commit_delay does nothing on a server with fsync = off (PostgreSQL skips "
                          "the delay when it does not flush).",
                          "run on a durable server (the embedded one is), or leave commit_delay_ms at 0.")
    try:
        for conn in pg:
            conn.execute(sql.SQL("SET commit_delay = {}").format(sql.Literal(int(delay_ms * 1000))))
            conn.execute("SET commit_siblings = 0")
            conn.commit()
    except psycopg.errors.InsufficientPrivilege:
        for conn in pg:
            conn.rollback()
        raise LabkitError("Only a superuser may set commit_delay, and this login is not one.",
                          "run this cell on the embedded server (you are its superuser), or skip it.") from None


# -- a sweep -------------------------------------------------------------------------------------

@overload
def sweep(lab: Lab | mysql.MyLab, workers: Sequence[int] = ..., policies: Sequence[str] = ...,
          job_ms: float = ..., seconds: float | None = ..., *, hold: bool = ..., backoff: bool = ...,
          backlog: int | None = ..., progress: bool = ..., keep_runs: Literal[False] = ...,
          commit_delay_ms: float = ...) -> pd.DataFrame: ...


@overload
def sweep(lab: Lab | mysql.MyLab, workers: Sequence[int] = ..., policies: Sequence[str] = ...,
          job_ms: float = ..., seconds: float | None = ..., *, hold: bool = ..., backoff: bool = ...,
          backlog: int | None = ..., progress: bool = ..., keep_runs: Literal[True],
          commit_delay_ms: float = ...) -> tuple[pd.DataFrame, list[ConvoyRun]]: ...


@overload
def sweep(lab: Lab | mysql.MyLab, workers: Sequence[int] = ..., policies: Sequence[str] = ...,
          job_ms: float = ..., seconds: float | None = ..., *, hold: bool = ..., backoff: bool = ...,
          backlog: int | None = ..., progress: bool = ..., keep_runs: bool,
          commit_delay_ms: float = ...) -> pd.DataFrame | tuple[pd.DataFrame, list[ConvoyRun]]: ...


def sweep(lab: Lab | mysql.MyLab, workers: Sequence[int] = (1, 2, 4, 8, 16, 32),
          policies: Sequence[str] = ("wait", "nowait", "skip"), job_ms: float = 20,
          seconds: float | None = 2.0, *, hold: bool = True, backoff: bool = False, backlog: int | None = None,
          progress: bool = False, keep_runs: bool = False,
          commit_delay_ms: float = 0.0) -> pd.DataFrame | tuple[pd.DataFrame, list[ConvoyRun]]:
    """Every (policy, workers) point; a tidy DataFrame, one row per point (columns COLUMNS).
    ``keep_runs=True`` also returns the ConvoyRun objects: ``(df, runs)``."""
    import pandas as pd

    workers = list(workers)
    policies = list(policies)
    if not workers or not policies:
        raise LabkitError("A sweep needs at least one worker count and one policy.",
                          "pass workers=(1, 2, 4) and policies=('wait', 'skip'), for instance.")
    for p in policies:
        _check_policy(p)
    for n in workers:
        _validate(policies[0], n, job_ms, seconds, backlog)
    if len(workers) * len(policies) > MAX_POINTS:
        raise LabkitError(f"A sweep of {len(policies)} policies × {len(workers)} worker counts has more "
                          f"than {MAX_POINTS} points.", "pass fewer worker counts, such as 1,2,4,8,16,32.")
    points = [(p, n) for p in policies for n in workers]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(points), desc="convoy", unit="point", file=sys.stderr, leave=False)
    rows, runs = [], []
    try:
        with WorkerPool(lab) as pool:
            for p, n in points:
                if bar is not None:
                    bar.set_postfix_str(f"{p} × {n}")
                r = run(lab, p, n, job_ms, seconds, hold=hold, backoff=backoff, backlog=backlog, pool=pool,
                        commit_delay_ms=commit_delay_ms)
                rows.append(r.row())
                if keep_runs:
                    runs.append(r)
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    df = pd.DataFrame(rows, columns=COLUMNS)
    return (df, runs) if keep_runs else df


# -- reference data ------------------------------------------------------------------------------

def reference_path() -> str:
    return str(data_file("convoy_reference.csv"))


def load_reference(path: str | None = None) -> pd.DataFrame:
    """The reference sweep recorded with ``labkit convoy --format csv`` (data/)."""
    import pandas as pd

    path = path or reference_path()
    if not os.path.exists(path):
        raise LabkitError(f"No reference sweep at {path}.",
                          "record one: `labkit convoy --format csv > data/convoy_reference.csv`.")
    return pd.read_csv(path)


# -- plots ---------------------------------------------------------------------------------------

POLICY_COLOURS = {"wait": 2, "nowait": 1, "skip": 0}
# a reference sweep's points: hollow, one shape per policy, so that two policies' references
# differ in shape as well as colour where their lines meet
REFERENCE_MARKERS = {"wait": "s", "nowait": "^", "skip": "D"}


def _colour(policy: str) -> str:

    return PALETTE[POLICY_COLOURS[policy]]


def _log2_workers(ax: Axes, workers: Iterable[int]) -> None:
    ax.set_xscale("log", base=2)
    ticks = sorted(set(int(w) for w in workers))
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(t) for t in ticks])
    ax.minorticks_off()


def _axes(ax: Axes | None, size: tuple[float, float]) -> Axes:
    """``ax``, or the axes of a new figure ``size`` inches large."""
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=size)
    return ax


def _by_policy(df: pd.DataFrame) -> Iterator[tuple[str, pd.DataFrame, str]]:
    """(policy, its rows sorted by workers, its colour) for each policy in the sweep."""
    present = set(df["policy"])
    for policy in POLICIES:
        if policy in present:
            yield policy, df[df["policy"] == policy].sort_values("workers"), _colour(policy)


def _against_workers(ax: Axes, workers: Iterable[int], ylabel: str, title: str) -> Axes:
    """What every per-policy plot ends with: workers on a log2 axis, a log y axis, the
    labels, and the legend beside the axes."""
    _log2_workers(ax, workers)
    ax.set_yscale("log")
    plain_log_ticks(ax.yaxis)
    ax.set_xlabel("workers N")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    legend_beside(ax)
    return ax


def plot_throughput(df: pd.DataFrame, reference: pd.DataFrame | None = None, ax: Axes | None = None,
                    title: str | None = None) -> Axes:
    """Jobs per second against workers, per policy, with the model's lines (dashed) and,
    if given, a reference sweep (faint)."""
    import numpy as np

    ax = _axes(ax, (10, 5.5))
    job_ms = float(df["job_ms"].iloc[0])
    hold = df["variant"].iloc[0].startswith("hold")
    workers = sorted(set(df["workers"]) | (set(reference["workers"]) if reference is not None else set()))
    grid = np.array(workers, dtype=float)
    for policy, part, colour in _by_policy(df):
        if reference is not None:
            ref = reference[(reference["policy"] == policy)
                            & reference["variant"].isin(set(part["variant"]))].sort_values("workers")
            if len(ref):
                ax.plot(ref["workers"], ref["jobs_per_s"], color=colour, lw=1.2, ls="-.",
                        marker=REFERENCE_MARKERS[policy], markersize=10, markerfacecolor="white",
                        markeredgewidth=2, label=f"{POLICY_NAMES[policy]}, reference")
        ax.plot(part["workers"], part["jobs_per_s"], "o-", color=colour, lw=2,
                label=f"{POLICY_NAMES[policy]}, this run")
    # the model, once per distinct line, in black
    shown = set()
    for policy, _, _ in _by_policy(df):
        model = tuple(model_jobs_per_s(policy, int(n), job_ms, hold) for n in grid)
        if model in shown:
            continue
        shown.add(model)
        flat = model[0] == model[-1]
        ax.plot(grid, model, ls="--" if flat else ":", color="black", lw=1.3,
                label="model 1/d (wait, NOWAIT)" if flat else "model N/d")
    return _against_workers(ax, workers, "jobs per second (log)",
                            title or f"Throughput against workers\n(d = {job_ms:g} ms, "
                                     f"{'lock held for the job' if hold else 'claim + mark + commit'})")


def plot_efficiency(df: pd.DataFrame, ax: Axes | None = None, title: str | None = None) -> Axes:
    """Measured throughput over the model's (1/d for wait and NOWAIT, N/d for SKIP LOCKED)
    against workers, on a linear axis from 0: the fall a log throughput axis hides."""
    ax = _axes(ax, (10, 5))
    for policy, part, colour in _by_policy(df):
        ax.plot(part["workers"], part["efficiency"], "o-", color=colour, lw=2, label=POLICY_NAMES[policy])
    ax.axhline(1.0, color="black", ls="--", lw=1.2, label="the model")
    _log2_workers(ax, df["workers"])
    ax.set_ylim(0, max(1.15, float(df["efficiency"].max()) + 0.05))
    ax.set_xlabel("workers N")
    ax.set_ylabel("measured / model")
    ax.set_title(title or "Efficiency: how close\neach policy gets to its model")
    legend_beside(ax)
    return ax


def plot_claim_wait(df: pd.DataFrame, ax: Axes | None = None, title: str | None = None) -> Axes:
    """Claim-wait percentiles (p50 solid, p99 dashed) against workers, log scale."""
    ax = _axes(ax, (10, 5.5))
    for policy, part, colour in _by_policy(df):
        ax.plot(part["workers"], part["claim_wait_p50_ms"].clip(lower=0.01), "o-", color=colour,
                label=f"{POLICY_NAMES[policy]} p50")
        ax.plot(part["workers"], part["claim_wait_p99_ms"].clip(lower=0.01), "s--", color=colour,
                label=f"{POLICY_NAMES[policy]} p99")
        cut = part[part["claim_wait_p99_censored"].astype(bool)] if "claim_wait_p99_censored" in part else part[:0]
        if len(cut):  # a p99 among waits still open at the end: a lower bound, not a value
            ax.plot(cut["workers"], cut["claim_wait_p99_ms"], "s", markersize=12, markerfacecolor="white",
                    markeredgecolor=colour, label=f"{POLICY_NAMES[policy]} p99 ≥ (cut off by the run's end)")
    timed = df["seconds"].dropna()
    if len(timed):
        ax.axhline(float(timed.max()) * 1000, color="0.5", linestyle=":", linewidth=1)
        ax.annotate("the longest wait\na run can measure", (0.02, float(timed.max()) * 1000),
                    xycoords=("axes fraction", "data"), xytext=(0, -4), textcoords="offset points",
                    va="top", color="0.35")
    return _against_workers(ax, df["workers"], "time to claim a job (ms, log)",
                            title or f"Claim wait against workers\n(d = {float(df['job_ms'].iloc[0]):g} ms)")


def queue_positions(r: ConvoyRun) -> pd.DataFrame:
    """For every claim of a timed run: how many other workers were already waiting when it
    asked (its place in the line), how long it waited, and what a first-come-first-served
    line would have made it wait (one job of d for each worker ahead, plus half a job for
    the one running).  Waits still open when the run ended are included as lower bounds
    (``censored``)."""
    import pandas as pd

    asks = [(c.worker, c.asked, c.claimed, False) for c in r.claims]
    if r.seconds is not None:
        asks += [(log.worker, log.open_ask, float(r.seconds), True) for log in r.logs
                 if log.open_ask is not None and log.open_ask < r.seconds]
    rows = []
    for w, asked, got, censored in asks:
        ahead = sum(1 for w2, a2, g2, _ in asks if w2 != w and a2 < asked < g2)
        rows.append({"worker": w, "position": ahead, "wait_ms": (got - asked) * 1e3,
                     "fifo_ms": (ahead + 0.5) * r.job_ms, "censored": censored})
    return pd.DataFrame(rows, columns=["worker", "position", "wait_ms", "fifo_ms", "censored"])


def plot_wait_by_position(q: pd.DataFrame, ax: Axes | None = None, title: str | None = None) -> Axes:
    """Claim wait against the place in the line at arrival, beside first-come-first-served."""
    ax = _axes(ax, (10, 5))
    done, cut = q[~q["censored"]], q[q["censored"]]
    ax.scatter(done["position"], done["wait_ms"].clip(lower=0.1), s=18, alpha=0.6, color=_colour("wait"),
               label="a claim: its wait")
    if len(cut):
        ax.scatter(cut["position"], cut["wait_ms"], s=40, facecolors="white", edgecolors=_colour("wait"),
                   label="still waiting at the end (at least this)")
    fifo = q.groupby("position")["fifo_ms"].first()
    ax.plot(fifo.index, fifo.values, "k--", linewidth=1, label="first come, first served")
    ax.set_yscale("log")
    ax.set_xlabel("workers already waiting when it asked")
    ax.set_ylabel("claim wait (ms, log)")
    ax.set_title(title or "Does the place in the line decide the wait?")
    legend_beside(ax)
    return ax


def plot_errors(df: pd.DataFrame, ax: Axes | None = None, title: str | None = None) -> Axes:
    """NOWAIT errors per second against workers, one line per variant."""

    ax = _axes(ax, (10, 5))
    part = df[df["policy"] == "nowait"]
    for i, (variant, rows) in enumerate(part.groupby("variant", sort=False)):
        rows = rows.sort_values("workers")
        ax.plot(rows["workers"], rows["errors_per_s"], "o-", color=PALETTE[(1 + 3 * i) % len(PALETTE)],
                label=f"NOWAIT, {variant}")
    _log2_workers(ax, part["workers"])
    ax.set_xlabel("workers N")
    ax.set_ylabel("errors per second")
    ax.set_title(title or "NOWAIT: errors per second\nagainst workers")
    ax.legend(loc="upper left", frameon=False)
    return ax


def plot_makespan(df: pd.DataFrame, ax: Axes | None = None, title: str | None = None) -> Axes:
    """Time to drain a backlog against workers, per policy, with the model (dashed)."""
    ax = _axes(ax, (10, 5))
    for policy, part, colour in _by_policy(df):
        ax.plot(part["workers"], part["makespan_s"], "o-", color=colour, label=f"{POLICY_NAMES[policy]}, measured")
        ax.plot(part["workers"], part["model_makespan_s"], "--", color=colour, lw=1.2, label=f"{POLICY_NAMES[policy]}, model")
    backlog = int(df["backlog"].iloc[0])
    return _against_workers(ax, df["workers"], "time to drain the backlog (s, log)",
                            title or f"Draining {backlog} jobs of {float(df['job_ms'].iloc[0]):g} ms")


def plot_timeline(r: ConvoyRun, ax: Axes | None = None, title: str | None = None,
                  until_ms: float | None = None) -> Axes:
    """One lane per worker (see :meth:`ConvoyRun.timeline`)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch


    ax = _axes(ax, (12, min(6.4, 1.4 + 0.45 * r.workers)))
    until = until_ms if until_ms is not None else (r.window_s * 1e3)
    for log in r.logs:
        y = r.workers - 1 - log.worker
        waits = [(c.asked * 1e3, (c.claimed - c.asked) * 1e3) for c in log.claims if c.asked * 1e3 < until]
        holds = [(c.claimed * 1e3, (c.released - c.claimed) * 1e3) for c in log.claims if c.claimed * 1e3 < until]
        free = [(c.released * 1e3, (c.done - c.released) * 1e3) for c in log.claims
                if c.released * 1e3 < until and c.done > c.released]
        ax.broken_barh(waits, (y - 0.35, 0.7), facecolors="none", edgecolors=PALETTE[1], hatch="///", lw=0.5)
        ax.broken_barh(holds, (y - 0.35, 0.7), facecolors=PALETTE[0], edgecolors="white", lw=0.5)
        if free:
            ax.broken_barh(free, (y - 0.35, 0.7), facecolors=PALETTE[5], edgecolors="white", lw=0.5)
        errs = [t * 1e3 for t in log.error_times if t * 1e3 < until]
        if errs:
            ax.plot(errs, [y] * len(errs), "|", color=PALETTE[2], markersize=12, alpha=0.6)
    handles: list[Artist] = [Patch(facecolor="none", edgecolor=PALETTE[1], hatch="///",
                                   label="waiting to claim"),
                             Patch(facecolor=PALETTE[0], label="job, row lock held")]
    if not r.hold:
        handles.append(Patch(facecolor=PALETTE[5], label="job, no lock held"))
    if any(log.error_times for log in r.logs):
        handles.append(plt.Line2D([], [], color=PALETTE[2], marker="|", ls="none", markersize=12,
                                  label="NOWAIT error"))
    ax.set_yticks(range(r.workers))
    ax.set_yticklabels([f"worker {w}" for w in reversed(range(r.workers))])
    ax.set_xlim(0, until)
    ax.set_xlabel("time since the start signal (ms)")
    ax.set_title(title or f"{POLICY_NAMES[r.policy]}: {r.workers} workers, d = {r.job_ms:g} ms ({r.variant})")
    legend_beside(ax, handles=handles)
    return ax


def plot_sweep(df: pd.DataFrame, reference: pd.DataFrame | None = None, path: str | None = None) -> Figure:
    """The three sweep panels in one figure (throughput, claim wait, NOWAIT errors)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 6.4))
    plot_throughput(df, reference, ax=axes[0])
    plot_claim_wait(df, ax=axes[1])
    plot_errors(df, ax=axes[2])
    for ax in axes:  # each panel's legend under it: three panels fill the width
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)
    if path:
        fig.savefig(path, dpi=110, metadata={"Software": None})
    return fig


# -- text ------------------------------------------------------------------------------------

TABLE_COLUMNS = ["policy", "workers", "variant", "jobs_per_s", "model_jobs_per_s", "efficiency",
                 "claim_wait_p50_ms", "claim_wait_p99_ms", "errors_per_s", "busy_workers"]


# the headers the text table prints: in words, so that a narrow column wraps its header
TABLE_HEADERS = {"jobs_per_s": "jobs/s", "model_jobs_per_s": "model jobs/s",
                 "claim_wait_p50_ms": "p50 wait ms", "claim_wait_p99_ms": "p99 wait ms",
                 "errors_per_s": "errors/s", "busy_workers": "busy workers",
                 "makespan_s": "makespan s", "model_makespan_s": "model makespan s"}


def table(df: pd.DataFrame, columns: Sequence[str] | None = None) -> str:
    """The sweep as aligned text within the width budget, rounded for reading; numbers to the
    right, a long variant or header wrapped inside its column."""
    cols = [c for c in (columns or TABLE_COLUMNS) if c in df.columns]
    if df["backlog"].fillna(0).astype(int).any() and "makespan_s" not in cols:
        cols += ["makespan_s", "model_makespan_s"]

    def cell(v) -> str:
        if isinstance(v, float):
            return "" if v != v else (f"{v:.2f}" if abs(v) < 10 else f"{v:.0f}")
        return str(v)

    rows = [[cell(v) for v in rec] for rec in df[cols].itertuples(index=False)]
    numeric = [i for i, c in enumerate(cols) if df[c].dtype.kind in "iuf"]
    return text_table([TABLE_HEADERS.get(c, c) for c in cols], rows, right=numeric)


# -- a widget for trainers ---------------------------------------------------------------------

def trainer_panel(lab: Lab, policy: str = "wait", workers: int = 4, job_ms: float = 20, seconds: float = 1.0,
                  hold: bool = True) -> ConvoyRun:
    """Re-run one point live with other N, d and policy.  Runs once with the given values
    and prints the text summary (static readers see that); the widget re-runs on click."""
    import ipywidgets as widgets
    import matplotlib.pyplot as plt
    from IPython.display import display

    first = run(lab, policy, workers, job_ms, seconds, hold=hold)
    print(first.summary())
    w_policy = widgets.Dropdown(options=[(POLICY_NAMES[p], p) for p in POLICIES], value=policy,
                                description="policy")
    w_n = widgets.IntSlider(value=workers, min=1, max=32, description="workers N")
    w_d = widgets.IntSlider(value=int(job_ms), min=5, max=200, step=5, description="d (ms)")
    w_hold = widgets.Checkbox(value=hold, description="lock held for the job")
    button = widgets.Button(description="run", button_style="primary")
    out = widgets.Output()

    def show(r: ConvoyRun) -> None:
        out.clear_output(wait=True)
        with out:
            print(r.summary())
            if r.workers <= 12:
                r.timeline(until_ms=min(r.window_s * 1e3, 40 * r.job_ms))
                plt.show()

    def on_click(_):
        button.disabled = True
        try:
            show(run(lab, w_policy.value, w_n.value, w_d.value, seconds, hold=w_hold.value))
        except LabkitError as exc:
            with out:
                print(exc)
        finally:
            button.disabled = False

    button.on_click(on_click)

    box = static_box([widgets.HBox([w_policy, w_n, w_d]), widgets.HBox([w_hold, button]), out],
                     lambda: "trainer panel: policy, workers N, d, lock held, run "
                             "(its first run is summarised above)")
    display(box)
    return first


# -- the speed goals (the benchmark) ---------------------------------------------------------------

def check_goals(df: pd.DataFrame, wall_s: float | None = None, *, skip_min: float = 0.85, flat_tol: float = 0.15,
                max_wall_s: float = 45.0) -> list[tuple[str, bool]]:
    """The convoy's speed goals, each with pass/fail (lock held, timed sweep)."""
    results = []
    skip = df[(df["policy"] == "skip") & (df["workers"] <= 16)]
    if len(skip):
        worst = skip["efficiency"].min()
        results.append((f"SKIP LOCKED >= {skip_min:.2f} of N/d for N <= 16 (worst {worst:.3f})", bool(worst >= skip_min)))
    flat = df[df["policy"].isin(["wait", "nowait"])]
    if len(flat):
        dev = (flat["efficiency"] - 1).abs().max()
        results.append((f"wait and NOWAIT within ±{flat_tol:.0%} of 1/d (worst deviation {dev:.3f})",
                        bool(dev <= flat_tol)))
    if wall_s is not None:
        results.append((f"sweep wall time <= {max_wall_s:g} s ({wall_s:.1f} s)", wall_s <= max_wall_s))
    return results


# -- command line ----------------------------------------------------------------------------------

def _check_plot_path(path: str) -> None:
    """The plot's file can be written, in a format matplotlib writes: found out before the
    sweep, not after it."""
    from matplotlib.backend_bases import FigureCanvasBase

    suffix = os.path.splitext(path)[1].lstrip(".").lower()
    kinds = FigureCanvasBase.get_supported_filetypes()
    if suffix and suffix not in kinds:
        raise LabkitError(f"--plot {path!r}: matplotlib cannot write .{suffix} files.",
                          f"end the file name in one of .{', .'.join(sorted(kinds))} (.png, say).")
    writable_file(path, "the plot's file")


def convoy_command(*, open_lab: Callable[[], Lab], workers: list[int], policies: list[str],
                   job_ms: float, seconds: float, hold: bool, backoff: bool, drain: int | None,
                   format: str, plot: str | None, check: bool, progress: bool) -> int:
    """``labkit convoy``: run a sweep and print it as a table, CSV or JSON; with ``check``,
    exit 1 when a speed goal is missed.  ``open_lab()`` gives the run its own lab."""
    lab = None
    try:
        # every parameter, and the plot's file, checked before any work
        sweep_params = dict(job_ms=job_ms, seconds=None if drain else seconds, backlog=drain)
        for n in workers if policies else []:
            _validate(policies[0], n, **sweep_params)
        if plot:
            _check_plot_path(plot)
        lab = open_lab()
        database = lab.db
        where = lab.describe() if isinstance(lab, mysql.MyLab) else database.describe()
        print(where, file=sys.stderr)
        t0 = time.perf_counter()
        df = sweep(lab, workers, policies, job_ms, None if drain else seconds,
                   hold=hold, backoff=backoff, backlog=drain, progress=progress)
        wall = time.perf_counter() - t0
    finally:
        if lab is not None:
            lab.discard()
    if format == "csv":
        sys.stdout.write(df.to_csv(index=False, float_format="%.4g"))
    elif format == "json":
        records = json.loads(df.to_json(orient="records", double_precision=6))
        print(json.dumps(records, indent=1))
    else:
        print(table(df))
    print(f"{len(df)} point(s) in {wall:.1f} s ({where})", file=sys.stderr)
    if plot:
        import matplotlib

        matplotlib.use("Agg")

        setup_matplotlib()
        plot_sweep(df, path=plot)
        print(f"plots saved to {plot}", file=sys.stderr)
    if check:
        ok = True
        for text, passed in check_goals(df, wall if not drain else None):
            print(f"{'PASS' if passed else 'FAIL'}  {text}", file=sys.stderr)
            ok = ok and passed
        return 0 if ok else 1
    return 0
