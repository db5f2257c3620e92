"""``labkit bench``: how fast a table queue can go, every figure measured in one run.

What is measured, side by side on the same server:

* the **claim ceiling**: clients claiming (claim + mark, no job work) as fast as they can, one
  transaction per call, for batch sizes 1, 10 and 100 — labkit's claimer against ``pgbench``
  running the very same statement (``labkit/sql/claim_skip_locked.sql``) with the same number
  of clients; the table is refilled and vacuumed before every run, and the claimed rows are
  counted in the table afterwards;
* the **physics** of the claim (:mod:`labkit.tools.physics`): for one durable run per batch
  size, the WAL bytes, commits, WAL syncs, buffers, wait events and client and server CPU per
  job, the time of one WAL flush on this disk, and what bounded each point (the flush, the
  CPUs, a lock, or the round trips);
* a **peer library** (PgQueuer, the ``bench`` extra) draining the same backlog of no-op jobs
  with the same number of workers and the same batch size as labkit's claim + finish loop;
* a **broker**: RabbitMQ at ``LABKIT_AMQP_URL`` (the ``rabbitmq`` extra), when one answers: a
  durable queue of persistent messages published with confirms, consumed with acks by as
  many consumers and in the same batches as the durable claim, set beside the table's
  durable claim figure of the same run; where none answers, the result says it was not
  measured;
* the **convoy**: SKIP LOCKED efficiency (jobs/s over N/d) at N = 16, d = 20 ms;
* **history**: the claim ceiling with 0 and many finished rows, with and without the partial
  index on the pending predicate;
* the embedded server's **start** (first use, cold start) and a warm **connect**;
* the headless run time of **notebooks** (each, and the whole workbook; the ``slides`` extra).

Every client runs in an OS process of its own (``labkit.core.procs``) with its own
connections: Python's GIL never limits a figure.  ``run()`` returns a plain dict (the JSON);
``labkit bench`` prints it.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core import db as dbmod
from ..core.checked import one_row
from ..core.db import WORKER_GUARDS, Database, lab_user, open_connection, session_name
from ..core.errors import LabkitError
from ..core.files import data_file
from ..core.lab import Lab, drop_schemas, read_sql
from ..core.limits import number
from ..core.plots import PALETTE, legend_below
from ..core.procs import Worker
from ..core.queries import strip_comments
from ..core.server import EmbeddedServer, bin_dir
from ..labs import claims, convoy
from . import physics

if TYPE_CHECKING:
    from collections.abc import Iterable
    from types import EllipsisType

    import pandas as pd
    import psycopg

    from ..core.procs import Context

Progress = Callable[[str], None]        # where a figure reports its progress lines

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
REFERENCE = data_file("bench_reference.json")
BATCHES = (1, 10, 100)
ROLE = "bench"                         # application_name labkit:<schema>:bench-...
# Every client session (labkit's claimers and pgbench alike) carries the workers' guards:
# they cost a timer per statement, so both sides pay for them.
GUARDS = WORKER_GUARDS
INT4, INT8_ARRAY, TEXT = 23, 1016, 25   # parameter type oids for the prepared statements

# A generous first guess of the ceiling (jobs/s) sizes the queue for a run; a run that
# empties the queue is repeated with a bigger one, so the guess only saves time.
CEILING_GUESS = {1: 10_000, 10: 50_000, 100: 150_000}


# -- settings --------------------------------------------------------------------------------

# The most each setting may ask for (seconds are per measured point).
SETTING_CEILINGS = {"clients": 64, "seconds": 600.0, "rounds": 100, "peer_jobs": 10_000_000,
                    "peer_batch": 10_000, "history_rows": 10_000_000, "history_batch": 10_000,
                    "history_pending": 10_000_000, "convoy_seconds": 600.0,
                    "amqp_messages": 10_000_000, "start_runs": 20}


@dataclass(frozen=True)
class Settings:
    """What one benchmark run does.  ``quick()`` for the test suite and the notebook,
    ``full()`` for the recorded reference."""

    quick: bool = False
    clients: int = 4                    # claimers, pgbench clients, peer and labkit workers
    seconds: float = 3.0                # measured seconds per claim-ceiling point
    rounds: int = 3                     # labkit/pgbench alternations per batch (median)
    batches: tuple = BATCHES
    peer_jobs: int = 40_000             # backlog drained by the peer and by labkit
    peer_batch: int = 10                # PgQueuer's default batch size
    history_rows: int = 1_000_000       # finished rows for the history figure
    history_batch: int = 10
    history_pending: int = 20_000       # the same backlog at every history point
    convoy_seconds: float = 3.0
    amqp_messages: int = 30_000
    notebooks: tuple | None = None      # None: every notebook in notebooks/
    start_runs: int = 3                 # cold starts of a throw-away embedded cluster

    @classmethod
    def quick_settings(cls, **kw: Any) -> Settings:
        base = cls(quick=True, seconds=1.0, rounds=1, peer_jobs=4_000, history_rows=50_000,
                   convoy_seconds=1.0, amqp_messages=3_000, notebooks=("00_start_here",), start_runs=1)
        return replace(base, **kw)

    @classmethod
    def full_settings(cls, **kw: Any) -> Settings:
        return replace(cls(), **kw)

    def check(self) -> Settings:
        def positive(name, value, kind=(int, float)):
            if not isinstance(value, kind) or isinstance(value, bool) or value <= 0:
                raise LabkitError(f"The benchmark's {name} must be a positive number, not {value!r}.",
                                  f"pass {name}= a number above 0 (the full run uses "
                                  f"{getattr(Settings(), name)!r}).")
            # finite, and within what a benchmark run on a laptop can do
            number(name, value, above=True, high=SETTING_CEILINGS[name], whole=kind is int,
                   example=getattr(Settings(), name))
        positive("clients", self.clients, int)
        positive("seconds", self.seconds)
        positive("rounds", self.rounds, int)
        positive("peer_jobs", self.peer_jobs, int)
        positive("peer_batch", self.peer_batch, int)
        positive("history_rows", self.history_rows, int)
        positive("history_batch", self.history_batch, int)
        positive("history_pending", self.history_pending, int)
        positive("convoy_seconds", self.convoy_seconds)
        positive("amqp_messages", self.amqp_messages, int)
        positive("start_runs", self.start_runs, int)
        if self.clients > 64:
            raise LabkitError(f"{self.clients} clients is more than the benchmark opens (64).",
                              "pass clients=4 (each client is a process and a connection).")
        if not self.batches or any(not isinstance(b, int) or not 1 <= b <= 10_000 for b in self.batches) \
                or len(self.batches) > 10:
            raise LabkitError(f"Batch sizes must be 1 to 10 whole numbers from 1 to 10,000, not "
                              f"{self.batches!r}.", "pass batches=(1, 10, 100).")
        return self


# -- the SQL -------------------------------------------------------------------------------------


def claim_statement() -> str:
    """The claim + mark statement the benchmark runs (labkit/sql/claim_skip_locked.sql)."""
    return read_sql("claim_skip_locked.sql")


def pgbench_script() -> str:
    """The pgbench script: the same statement, with pgbench's variables for the parameters
    (``:batch`` from ``-D batch=N``, the worker id from pgbench's own ``:client_id``)."""
    text = strip_comments(claim_statement())
    text = text.replace("%(batch)s", ":batch").replace("%(worker_id)s", ":client_id")
    if "%(" in text:
        raise LabkitError("claim_skip_locked.sql has a parameter the pgbench script does not map.",
                          "map it in labkit.tools.bench.pgbench_script().")
    return text + "\n"


# -- the claimer ---------------------------------------------------------------------------------

class Claimer:
    """labkit's claimer: one connection, the claim + mark statement prepared once and then
    executed through libpq — one round trip and one transaction (autocommit) per call,
    returning the claimed ids.  The same work as one pgbench transaction, with the least
    client-side work psycopg allows."""

    def __init__(self, conn: psycopg.Connection, worker_id: str, batch: int = 10):
        from psycopg import pq

        if conn.autocommit is False:
            raise LabkitError("The claimer needs an autocommit connection (one transaction per call).",
                              "open it with autocommit=True.")
        self._pq = pq
        self.conn = conn
        self.pg = conn.pgconn
        self.worker_id = worker_id
        self.batch = batch
        self.calls = 0
        self.claimed = 0
        claim, names = numbered(claim_statement())
        assert names == ["batch", "worker_id"], names
        finish, fnames = numbered(read_sql("finish_jobs.sql"))
        assert fnames == ["ids", "worker_id"], fnames
        self._prepare(b"labkit_claim", claim, [INT4, TEXT])
        self._prepare(b"labkit_finish", finish, [INT8_ARRAY, TEXT])
        self._wid = worker_id.encode()
        self._claim_params = [str(batch).encode(), self._wid]
        self._names = [b"labkit_claim", b"labkit_finish"]

    def close(self) -> None:
        """Forget the prepared statements (the connection stays open)."""
        for name in self._names:
            self.pg.exec_(b"DEALLOCATE " + name)
        self._names = []

    def _prepare(self, name: bytes, text: str, types: list[int]) -> None:
        res = self.pg.prepare(name, text.encode(), types)
        if res.status != self._pq.ExecStatus.COMMAND_OK:
            raise LabkitError(f"Preparing the benchmark statement failed: "
                              f"{res.error_message.decode(errors='replace').strip()}",
                              "check that the job table exists in the lab schema (lab.create_jobs(0)).")

    def _run(self, name: bytes, params: list[bytes]):
        res = self.pg.exec_prepared(name, params)
        if res.status != self._pq.ExecStatus.TUPLES_OK:
            raise LabkitError(f"The benchmark statement failed: "
                              f"{res.error_message.decode(errors='replace').strip()}",
                              "look at the server log; the job table may have been dropped under the run.")
        return res

    def claim(self) -> list[int]:
        """Claim and mark up to ``batch`` pending jobs; their ids."""
        res = self._run(b"labkit_claim", self._claim_params)
        get = res.get_value
        ids = [int(get(i, 0)) for i in range(res.ntuples)]
        self.calls += 1
        self.claimed += len(ids)
        return ids

    def claim_count(self) -> int:
        """Claim and mark up to ``batch`` pending jobs; how many.  The ids arrive as with
        :meth:`claim` (libpq reads the whole result) but are not turned into Python objects:
        what pgbench does with them, and all the ceiling needs."""
        n = self._run(b"labkit_claim", self._claim_params).ntuples
        self.calls += 1
        self.claimed += n
        return n

    def finish(self, ids: list[int]) -> int:
        """Mark claimed jobs DONE (the second short transaction); how many were still ours."""
        res = self._run(b"labkit_finish", [("{" + ",".join(map(str, ids)) + "}").encode(), self._wid])
        return res.ntuples


class CursorClaimer:
    """The same claim through psycopg's ordinary cursor API (``execute(..., prepare=True)``,
    ``fetchall()``): what most application code writes.  Measured beside the lean claimer
    to show what the convenience layer costs on the client."""

    def __init__(self, conn: psycopg.Connection, worker_id: str, batch: int = 10):
        self.conn = conn
        self.cur = conn.cursor()
        self.params = {"batch": batch, "worker_id": worker_id}
        self.query = strip_comments(claim_statement())
        self.calls = self.claimed = 0

    def close(self) -> None:
        self.cur.close()

    def claim(self) -> list[int]:
        self.cur.execute(self.query, self.params, prepare=True)
        ids = [r[0] for r in self.cur.fetchall()]
        self.calls += 1
        self.claimed += len(ids)
        return ids


def _wait_until(t: float) -> None:
    while True:
        left = t - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, 0.01))


def _claim_loop(claimer: Claimer | CursorClaimer, order: dict, out: dict) -> None:
    """One client thread: claim for the order's time window, or drain the queue."""
    try:
        _wait_until(order["start_at"])
        t0 = time.monotonic()
        finished = 0
        if order["mode"] == "ceiling":
            end = order["start_at"] + order["seconds"]
            t = t0
            # the lean claimer counts the rows it got, as pgbench does; the cursor API's claim
            # fetches them as Python objects: that is the layer it measures
            claim = claimer.claim_count if isinstance(claimer, Claimer) else claimer.claim
            while t < end:
                if not claim():             # the queue is empty: nothing left to measure
                    break
                t = time.monotonic()
        else:
            if not isinstance(claimer, Claimer):
                raise LabkitError("The cursor claimer measures the ceiling only: it does not finish jobs.",
                                  "drain with the style 'pq'.")
            while True:
                ids = claimer.claim()
                if not ids:
                    break
                finished += claimer.finish(ids)
            t = time.monotonic()
        out.update(claimed=claimer.claimed, calls=claimer.calls, started=t0, ended=t, finished=finished)
    except BaseException as exc:  # reported to the parent, never swallowed
        out["error"] = f"{type(exc).__name__}: {exc}"


def _report_stats(conns: list) -> None:
    """Ask each session to report its statistics to the server now (PostgreSQL 15 and later;
    otherwise a session reports them within a second or so of going idle)."""
    for conn in conns:
        if conn.info.server_version >= 150000:
            conn.execute("SELECT pg_stat_force_next_flush()")


def claimer_main(ctx: Context, dsn: str, schema: str, clients: int) -> dict:
    """The labkit client: one process with ``clients`` threads, each with its own connection
    (the shape of ``pgbench -c N -j N``).  psycopg releases the GIL while a thread waits for
    the server, so the threads claim in parallel.

    Orders (``resume(dict)``): ``{"mode": "ceiling", "batch": B, "style": "pq"|"cursor",
    "start_at": t, "seconds": s}`` claims (and marks) for s seconds from the shared
    monotonic time t; ``{"mode": "drain", "batch": B, "start_at": t}`` claims + finishes
    until the queue is empty.  ``None`` ends the process."""
    import resource
    import threading

    conns = []
    try:
        for i in range(clients):
            conns.append(open_connection(dsn, schema=schema, role=f"{ROLE}-c{i}", guards=GUARDS))
        while True:
            order = ctx.pause("ready")
            if order is None:
                return {"clients": clients}
            for conn in conns:  # each order says how durable its commits are
                conn.execute("SELECT set_config('synchronous_commit', %s, false)",
                             (order.get("synchronous_commit", "on"),))
            cls = CursorClaimer if order.get("style") == "cursor" else Claimer
            claimers = [cls(conn, f"c{i}", order["batch"]) for i, conn in enumerate(conns)]
            outs: list[dict] = [{} for _ in claimers]
            threads = [threading.Thread(target=_claim_loop, args=(c, order, o), daemon=True)
                       for c, o in zip(claimers, outs)]
            cpu0 = resource.getrusage(resource.RUSAGE_SELF)
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            cpu1 = resource.getrusage(resource.RUSAGE_SELF)
            for c in claimers:
                c.close()
            if order.get("report_stats"):
                _report_stats(conns)
            errors = [o["error"] for o in outs if "error" in o]
            if errors:
                raise RuntimeError(errors[0])
            ctx.emit("result", clients=outs,
                     cpu_s=(cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime),
                     synchronous_commit=[one_row(c.execute("SHOW synchronous_commit"), "SHOW synchronous_commit")[0]
                                         for c in conns])
    finally:
        for conn in conns:
            conn.close()


class ClaimerPool:
    """labkit's client process (``clients`` threads, one connection each), started once and
    given orders run after run.  Leaving the ``with`` block ends it (even on Ctrl-C)."""

    def __init__(self, lab: Lab, clients: int):

        self.lab = lab
        self.clients = clients
        self.worker = Worker("labkit.tools.bench:claimer_main", name="labkit claimer", dsn=lab.db.dsn,
                             schema=lab.schema, clients=clients)
        self.rounds = 0

    def __enter__(self) -> ClaimerPool:
        try:
            self.worker.start()
            self.worker.wait_for("paused", count=1, timeout=60)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def order(self, timeout: float = 120, **order: Any) -> dict:
        """Send one order; wait for and return the result (per-client figures and CPU)."""
        order["start_at"] = time.monotonic() + 0.05
        self.worker.resume(order)
        self.rounds += 1
        result = self.worker.wait_for("result", count=self.rounds, timeout=timeout)
        self.worker.wait_for("paused", count=self.rounds + 1, timeout=60)
        return result

    def close(self) -> None:
        w = self.worker
        try:
            if w.alive:
                w.resume(None)
                w.join(timeout=10)
        except (LabkitError, OSError, ValueError):
            pass
        finally:
            w.kill()


# -- the queue's state ---------------------------------------------------------------------------

def ensure_job_table(lab: Lab, *, index: bool = True) -> None:
    """The job table (labkit/sql/job_table.sql), with or without the partial index."""
    if lab.execute("SELECT to_regclass('job')")[0][0] is None:
        lab.run_file("job_table.sql")
    has = lab.execute("SELECT to_regclass('job_pending_created_idx')")[0][0] is not None
    if index and not has:
        lab.execute("CREATE INDEX job_pending_created_idx ON job (created_at) WHERE status = 'PENDING'")
    elif not index and has:
        lab.execute("DROP INDEX job_pending_created_idx")


def fill(lab: Lab, pending: int, *, history: int | None = None) -> None:
    """Reset the queue to the same state before every run: ``pending`` fresh pending jobs
    (ids 1..pending).  Finished history rows stay if ``history`` is None; otherwise the
    table is emptied and gets ``history`` finished rows, all older than the pending ones.
    Then VACUUM ANALYZE, so every run starts from a vacuumed, analysed table."""

    if history is not None:
        lab.execute("TRUNCATE job")
        claims.add_history(lab, history)
    else:
        lab.execute("DELETE FROM job WHERE status <> 'DONE'")
    claims.add_pending(lab, pending)
    lab.execute("VACUUM ANALYZE job")


def count_status(lab: Lab, status: str) -> int:
    return lab.execute("SELECT count(*) FROM job WHERE status = %s", (status,))[0][0]


# -- figure 1: the claim ceiling, labkit vs pgbench -------------------------------------------------

def pgbench_path(db: Database) -> Path:
    """pgbench for this server: the embedded wheel's for the embedded server; for another
    server the one on PATH (or PostgreSQL's own folders), else the wheel's (a client talks
    to older servers too)."""

    wheel = bin_dir() / "pgbench"
    if db.backend == "embedded":
        return wheel
    found = shutil.which("pgbench")
    if found:
        return Path(found)
    for p in sorted(Path("/usr/lib/postgresql").glob("*/bin/pgbench"), reverse=True):
        return p
    return wheel


@dataclass
class CeilingRun:
    who: str                # "labkit", "labkit (cursor API)" or "pgbench"
    batch: int
    clients: int
    jobs: int               # claimed rows, counted in the table
    seconds: float          # measured time of the transaction loop
    calls: int
    client_cpu_s: float | None = None

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else 0.0


def run_labkit_ceiling(lab: Lab, pool: ClaimerPool, batch: int, seconds: float, style: str = "pq",
                       synchronous_commit: str = "on", report_stats: bool = False) -> CeilingRun:
    """One run of the claimers; with ``report_stats`` their sessions report their statistics
    to the server at its end (the physics figure reads them)."""
    before = count_status(lab, "IN_PROGRESS")
    res = pool.order(mode="ceiling", batch=batch, seconds=seconds, style=style, timeout=seconds + 120,
                     synchronous_commit=synchronous_commit, report_stats=report_stats)
    results = res["clients"]
    if set(res["synchronous_commit"]) != {synchronous_commit}:
        raise LabkitError(f"The claimers ran with synchronous_commit {res['synchronous_commit']}, "
                          f"not {synchronous_commit!r}.",
                          "this is a bug in labkit bench: report it with the command you ran.")
    jobs = count_status(lab, "IN_PROGRESS") - before
    said = sum(r["claimed"] for r in results)
    if said != jobs:
        raise LabkitError(f"The claimers reported {said} claimed jobs but the table shows {jobs}.",
                          "this is a bug in labkit bench: report it with the command you ran.")
    start = min(r["started"] for r in results)
    wall = max(r["ended"] for r in results) - start
    who = "labkit" if style == "pq" else "labkit (cursor API)"
    return CeilingRun(who, batch, len(results), jobs, wall, sum(r["calls"] for r in results), res["cpu_s"])


@contextlib.contextmanager
def pgbench_conninfo(dsn: str, env: dict) -> Iterator[str]:
    """The connection string for a client program's command line, without the password;
    the password (if the DSN has one) goes in a PGPASSFILE (mode 0600, in a private
    temporary folder) named in ``env``, removed when the block ends."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    info = conninfo_to_dict(dsn)
    password = info.pop("password", None)
    if not password:
        yield make_conninfo("", **info)
        return
    folder = tempfile.mkdtemp(prefix="labkit-pgpass-")      # mode 0700, ours only
    path = os.path.join(folder, "pgpass")
    try:
        escaped = str(password).replace("\\", "\\\\").replace(":", "\\:")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"*:*:*:*:{escaped}\n")
        env["PGPASSFILE"] = path
        env.pop("PGPASSWORD", None)
        info.pop("passfile", None)
        yield make_conninfo("", **info)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run_pgbench(lab: Lab, batch: int, clients: int, seconds: float, script: Path, binary: Path) -> CeilingRun:
    before = count_status(lab, "IN_PROGRESS")
    # the same session as labkit's claimers: search_path, name and guards
    options = [f"-c search_path={lab.schema},public", *GUARDS.options()]
    env = dict(os.environ, PGOPTIONS=" ".join(options), PGAPPNAME=session_name(lab.schema, f"{ROLE}-pgbench"))
    secs = max(1, int(round(seconds)))
    import resource

    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    # The password never goes on pgbench's command line (anyone on the machine can read a
    # command line, with `ps`): it goes in a password file only we can read, removed after.
    with pgbench_conninfo(lab.db.dsn, env) as conninfo:
        args = [str(binary), "-n", "-M", "prepared", "-f", str(script), "-c", str(clients),
                "-j", str(clients), "-T", str(secs), "-D", f"batch={batch}", conninfo]
        try:
            proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=secs + 120)
        except subprocess.TimeoutExpired:
            raise LabkitError(f"pgbench did not finish within {secs + 120} s.",
                              "check the server's load (`labkit doctor`) and run the benchmark again.") from None
    tps = re.search(r"tps = ([\d.]+) \(without initial connection", proc.stdout)
    done = re.search(r"number of transactions actually processed: (\d+)", proc.stdout)
    if proc.returncode != 0 or not tps or not done:
        raise LabkitError(f"pgbench failed (exit {proc.returncode}): "
                          f"{(proc.stderr or proc.stdout).strip()[-600:]}",
                          f"run `{binary} --version`; if it is missing, install PostgreSQL's client tools "
                          "or use the embedded server (unset LABKIT_DSN).")
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    txns, rate = int(done.group(1)), float(tps.group(1))
    jobs = count_status(lab, "IN_PROGRESS") - before
    return CeilingRun("pgbench", batch, clients, jobs, txns / rate if rate else float(secs), txns,
                      (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime))


def claim_ceiling(lab: Lab, s: Settings, progress: Progress | None = None) -> dict:
    """Claim + mark as fast as possible for every batch size: labkit and pgbench alternate
    (``rounds`` times each, the median counts), each run from a refilled, vacuumed table."""
    progress = progress or (lambda msg: None)
    ensure_job_table(lab, index=True)
    binary = pgbench_path(lab.db)
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True).stdout.strip()
    runs: list[CeilingRun] = []
    with tempfile.TemporaryDirectory(prefix="labkit-bench-") as tmp, ClaimerPool(lab, s.clients) as pool:
        script = Path(tmp) / "claim.sql"
        script.write_text(pgbench_script())
        for batch in s.batches:
            guess = CEILING_GUESS.get(batch, 150_000) * s.clients / 4
            for rnd in range(s.rounds):
                order = ("labkit", "pgbench") if rnd % 2 == 0 else ("pgbench", "labkit")
                for who in order:
                    size = int(guess * s.seconds * 2) + s.clients * batch * 4
                    for _attempt in range(4):
                        fill(lab, size, history=0)
                        if who == "labkit":
                            r = run_labkit_ceiling(lab, pool, batch, s.seconds)
                        else:
                            r = run_pgbench(lab, batch, s.clients, s.seconds, script, binary)
                        if count_status(lab, "PENDING") > s.clients * batch:
                            break
                        size *= 3               # the queue ran dry: the figure would be low
                        guess = max(guess, r.jobs_per_s)
                    runs.append(r)
                    progress(f"claim ceiling, batch {batch:>3}: {who:<8} {r.jobs_per_s:>9,.0f} jobs/s "
                             f"({r.jobs:,} jobs in {r.seconds:.2f} s)")
        # what the convenience layer costs: the same claim through the cursor API, batch 10
        cursor_batch = 10 if 10 in s.batches else s.batches[0]
        size = int(CEILING_GUESS.get(cursor_batch, 150_000) * s.clients / 4 * s.seconds * 2)
        fill(lab, size, history=0)
        cur = run_labkit_ceiling(lab, pool, cursor_batch, s.seconds, style="cursor")
        progress(f"claim ceiling, batch {cursor_batch:>3}: cursor API {cur.jobs_per_s:>7,.0f} jobs/s")

    def median(who, batch):
        return statistics.median(r.jobs_per_s for r in runs if r.who == who and r.batch == batch)

    labkit = {str(b): median("labkit", b) for b in s.batches}
    pgb = {str(b): median("pgbench", b) for b in s.batches}
    def cpu(who, b):
        return statistics.median(r.client_cpu_s / r.calls * 1e6 for r in runs
                                 if r.who == who and r.batch == b and r.calls)

    lab_cpu = {str(b): cpu("labkit", b) for b in s.batches}
    pgb_cpu = {str(b): cpu("pgbench", b) for b in s.batches}
    return {
        "claim_jobs_per_s": labkit,
        "pgbench_jobs_per_s": pgb,
        "ratio_vs_pgbench": {b: labkit[b] / pgb[b] for b in labkit},
        "claim_client_cpu_us_per_call": lab_cpu,
        "pgbench_client_cpu_us_per_call": pgb_cpu,
        "claim_cursor_api_jobs_per_s": {str(cursor_batch): cur.jobs_per_s},
        "pgbench": version,
        "ceiling_runs": [asdict(r) | {"jobs_per_s": r.jobs_per_s} for r in runs + [cur]],
    }


# -- the figures' durability: what a commit promised, and what durable commits cost ------------------

DURABILITY_SETTINGS = ("fsync", "synchronous_commit", "wal_sync_method", "full_page_writes")


def durability(lab: Lab, s: Settings, progress: Progress | None = None) -> dict:
    """What the server promised for every commit of this run (fsync, synchronous_commit), and
    the claim ceiling at batch 1 and 10 measured twice in this run: with durable commits
    (synchronous_commit = on: COMMIT returns once the WAL is flushed) and with
    synchronous_commit = off (COMMIT returns before the flush).  On a server with
    fsync = off no commit is durable, and the figure says so instead of pretending."""
    progress = progress or (lambda msg: None)
    settings = {name: lab.execute("SELECT current_setting(%s)", (name,))[0][0]
                for name in DURABILITY_SETTINGS}
    fsync_on = settings["fsync"] == "on"
    ensure_job_table(lab, index=True)
    measured: dict[str, dict[str, float]] = {"on": {}, "off": {}}
    with ClaimerPool(lab, s.clients) as pool:
        for batch in (1, 10):
            for sc in ("on", "off"):
                size = int(CEILING_GUESS[batch] * s.clients / 4 * s.seconds * 2) + s.clients * batch * 4
                fill(lab, size, history=0)
                r = run_labkit_ceiling(lab, pool, batch, s.seconds, synchronous_commit=sc)
                measured[sc][str(batch)] = r.jobs_per_s
                progress(f"durability, batch {batch:>3}: synchronous_commit={sc:<3} "
                         f"{r.jobs_per_s:>9,.0f} jobs/s (fsync={settings['fsync']})")
    return {"durability": {
        "fsync": settings["fsync"],
        "synchronous_commit": settings["synchronous_commit"],
        "wal_sync_method": settings["wal_sync_method"],
        "full_page_writes": settings["full_page_writes"],
        "commits_durable": fsync_on and settings["synchronous_commit"] != "off",
        "claim_jobs_per_s_durable": measured["on"] if fsync_on else None,
        "claim_jobs_per_s_synchronous_commit_off": measured["off"],
        "note": ("claim + mark at batch 1 and 10, both measured in this run on this server"
                 if fsync_on else
                 "this server runs with fsync = off: no commit here is durable, so no durable "
                 "figure can be measured on it; every figure of this run is a non-durable one"),
    }}


# -- the physics: what one job costs, and the ceiling the disk sets ---------------------------------


def flush_folder(lab: Lab) -> tuple[Path, bool]:
    """A folder of ours on the disk that holds the server's WAL, and whether it is that disk
    for sure: the embedded server's own folder; for another server, the folder above its data
    directory when this machine can see it; else this machine's temporary folder."""
    if lab.db.backend == "embedded":
        return EmbeddedServer().data_dir, True
    try:
        data = Path(lab.execute("SELECT current_setting('data_directory')")[0][0])
    except Exception:                 # not allowed to read it: not a superuser, nor pg_read_all_settings
        data = None
    if data is not None and data.parent.is_dir() and os.access(data.parent, os.W_OK):
        return data.parent, True
    return Path(tempfile.gettempdir()), False


def _physics_run(lab: Lab, pool: ClaimerPool, watch: psycopg.Connection, batch: int, s: Settings,
                 names: list[str], syncs_counted: bool) -> tuple[float, physics.Physics]:
    """One durable run of the claimers at ``batch``, with the server's counters read around it
    (nothing else of labkit's runs between the two readings) and the sessions' wait events
    sampled during it; the run's jobs/s, and what one job cost."""
    size = int(CEILING_GUESS.get(batch, 150_000) * s.clients / 4 * s.seconds * 2) + s.clients * batch * 4
    fill(lab, size, history=0)
    lab.execute("SELECT pg_stat_force_next_flush()")      # the fill's own counts, reported now
    pids = [r[0] for r in watch.execute(physics.q("session_pids"), {"names": names}).fetchall()]
    cpu0 = physics.backend_cpu_s(pids)
    before = physics.settled_counters(watch)
    sampler = physics.WaitSampler(lambda: lab.db.connect(role=f"{ROLE}-watch"), names)
    sampler.start()
    try:
        res = pool.order(mode="ceiling", batch=batch, seconds=s.seconds, style="pq", timeout=s.seconds + 120,
                         synchronous_commit="on", report_stats=True)
    finally:
        sampler.stop()
    after = physics.settled_counters(watch)
    cpu1 = physics.backend_cpu_s(pids)
    clients = res["clients"]
    start, end = min(c["started"] for c in clients), max(c["ended"] for c in clients)
    jobs, calls = sum(c["claimed"] for c in clients), sum(c["calls"] for c in clients)
    return jobs / (end - start) if end > start else 0.0, physics.per_job(
        jobs=jobs, commits=calls, wal=physics.wal_bytes(watch, before, after), before=before, after=after,
        seen=sampler.seen(start, end), client_cpu_s=res["cpu_s"], syncs_counted=syncs_counted,
        server_cpu_s=None if cpu0 is None or cpu1 is None else cpu1 - cpu0)


def physics_figure(lab: Lab, s: Settings, progress: Progress | None = None) -> dict:
    """For every batch size, one durable run of the claimers and what each job cost it
    (``physics``), and the ceiling this machine's disk sets on durable commits, with what
    each point spent its time on (``ceiling``).  See :mod:`labkit.tools.physics`.  It reads
    statistics PostgreSQL 15 added; on an older server it says it was not measured."""
    progress = progress or (lambda msg: None)
    if lab.db.version_num < 150000:
        why = f"PostgreSQL {lab.db.version} has no pg_stat_force_next_flush(): the physics needs 15 or later"
        progress(f"physics: not measured ({why})")
        return {"physics": None, "ceiling": {"not_measured": why}}
    ensure_job_table(lab, index=True)
    folder, same_disk = flush_folder(lab)
    flush = physics.flush_time(folder)
    # PostgreSQL's own tool times the same thing, every sync method, one second each: the full
    # run only (it takes about twenty seconds)
    pgtf = None if s.quick else physics.pg_test_fsync(bin_dir() / "pg_test_fsync", folder)
    progress(f"physics: one 8 kB write and its {flush.method} take {flush.flush_ms:.3f} ms here "
             f"(at most {flush.durable_commits_per_s_one_session:,.0f} durable commits/s for one session)")
    sync_method = lab.execute("SELECT current_setting('wal_sync_method')")[0][0]
    names = [session_name(lab.schema, f"{ROLE}-c{i}") for i in range(s.clients)]
    per_batch: dict[str, dict] = {}
    bounds: dict[str, dict] = {}
    rates: dict[str, float] = {}
    lab.execute("ALTER TABLE job SET (autovacuum_enabled = off)")   # no autovacuum's WAL in the readings
    try:
        with ClaimerPool(lab, s.clients) as pool, lab.db.connect(role=f"{ROLE}-physics") as watch:
            for batch in s.batches:
                rate, ph = _physics_run(lab, pool, watch, batch, s, names,
                                        syncs_counted=not sync_method.startswith("open_"))
                per_batch[str(batch)] = ph.as_dict()
                rates[str(batch)] = rate
                bounds[str(batch)] = physics.bound(jobs_per_s=rate, physics=ph, cpus=os.cpu_count() or 1)
                progress(f"physics, batch {batch:>3}: {rate:>9,.0f} jobs/s, {ph.wal_bytes_per_job:,.0f} WAL "
                         f"bytes per job; most seen: {bounds[str(batch)]['bound']}")
            gc = physics.group_commit(lambda: lab.connect(role=f"{ROLE}-commit"), watch,
                                      seconds=0.5 if s.quick else 1.0)
    finally:
        lab.execute("ALTER TABLE job RESET (autovacuum_enabled)")
    for point in gc.points:
        progress(f"physics, group commit: {point['sessions']} session(s), commit_delay "
                 f"{point['commit_delay_us']} µs: {point['commits_per_s']:>9,.0f} durable commits/s, "
                 f"{point['syncs_per_commit']:.3f} syncs per commit")
    return {"physics": per_batch,
            "ceiling": {**flush.as_dict(), "same_disk_as_server": same_disk, "wal_sync_method": sync_method,
                        "pg_test_fsync_ms": pgtf,
                        "clients": s.clients, "claim_jobs_per_s_durable": rates, "bound": bounds,
                        "group_commit": gc.as_dict()}}


PUBLISHED = data_file("published_throughput.yaml")


def published(path: Path = PUBLISHED) -> list[dict]:
    """The published throughputs of PostgreSQL job queues, with their sources: reference data
    set beside this machine's figure, never asserted."""
    import yaml

    try:
        entries = yaml.safe_load(path.read_text(encoding="utf-8"))["entries"]
    except (OSError, KeyError, TypeError, yaml.YAMLError) as exc:
        raise LabkitError(f"The published figures in {path} cannot be read ({exc}).",
                          "restore data/published_throughput.yaml from the repository.") from None
    return list(entries)


def per_core_table(mine: dict, entries: list[dict] | None = None):
    """Two DataFrames: the published figures, highest per core first; and this run's own rows
    per core (the durable claim alone, batch by batch, and the drain, claim + finish, where the
    run measured it): set beside each other, never sorted into one list, since a published
    figure counts whole jobs and the claim rows only the first write of one."""
    import pandas as pd

    cpus = (mine.get("machine") or {}).get("cpus") or os.cpu_count() or 1
    theirs = pd.DataFrame([{"system": e["system"], "figure": e["figure"], "unit": e["unit"].split(",")[0],
                            "cores": e["cores"],
                            "per core": None if e["per_core"] is None else round(e["per_core"]),
                            "batch": e["batch"],
                            "durable": "not stated" if e["durable"] is None else e["durable"]}
                           for e in (published() if entries is None else entries)])
    theirs = theirs.sort_values("per core", ascending=False, na_position="last").reset_index(drop=True)
    durable = (mine.get("durability") or {}).get("commits_durable", True)
    ours = [{"what": f"labkit's claim + mark, no completion, batch {b}", "jobs/s": round(rate),
             "per core": round(rate / cpus), "durable": durable}
            for b, rate in ((mine.get("ceiling") or {}).get("claim_jobs_per_s_durable") or {}).items()]
    drain = ((mine.get("peer") or {}).get("labkit") or {}).get("jobs_per_s")
    if drain:
        ours.append({"what": f"labkit's drain, claim + finish, batch {mine['settings']['peer_batch']}",
                     "jobs/s": round(drain), "per core": round(drain / cpus), "durable": durable})
    for column in ("cores", "per core", "batch"):
        theirs[column] = theirs[column].astype("Int64")
    return theirs, pd.DataFrame(ours)


# -- figure 2: a peer library (PgQueuer) drains the same backlog ---------------------------------------

def peer_available() -> tuple[str | None, str]:
    """(version of PgQueuer, driver) or (None, why not)."""
    try:
        from importlib import metadata

        version = metadata.version("pgqueuer")
    except Exception:
        return None, "PgQueuer is not installed (pip install 'labkit[bench]')"
    try:
        import asyncpg  # noqa: F401

        return version, "asyncpg"
    except ImportError:
        return version, "psycopg (async)"


def _pgqueuer_env(prefix: str) -> None:
    # Every PgQueuer object name (and its NOTIFY channel, which is global to the database)
    # gets the prefix, so a benchmark never meets another PgQueuer on the same server.
    os.environ["PGQUEUER_PREFIX"] = prefix


async def _pgqueuer_driver(dsn: str, schema: str, driver: str, role: str) -> tuple[Any, Any]:
    """An async connection for PgQueuer (labkit's factory is synchronous), named and placed
    in the lab's schema as every labkit session is."""
    search_path, name = f"{schema},public", session_name(schema, role)
    if driver == "asyncpg":
        import asyncpg
        from pgqueuer.db import AsyncpgDriver

        conn = await asyncpg.connect(dsn, server_settings={"search_path": search_path,
                                                           "application_name": name})
        return conn, AsyncpgDriver(conn)
    import psycopg
    from pgqueuer.db import PsycopgDriver

    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True, application_name=name,
                                                 options=f"-c search_path={search_path}")
    return conn, PsycopgDriver(conn)


def pgqueuer_setup_main(ctx: Context, dsn: str, schema: str, prefix: str, driver: str, jobs: int) -> dict:
    """Install PgQueuer's tables in the lab schema and enqueue ``jobs`` no-op jobs."""
    import asyncio

    _pgqueuer_env(prefix)

    async def go():
        from pgqueuer.domain.settings import db_settings
        from pgqueuer.queries import Queries

        conn, drv = await _pgqueuer_driver(dsn, schema, driver, f"{ROLE}-pgq-setup")
        try:
            q = Queries(drv)
            await q.install()
            for start in range(0, jobs, 1000):
                n = min(1000, jobs - start)
                await q.enqueue(["noop"] * n, [None] * n, [0] * n)
            st = db_settings()
            return {"queue_table": st.queue_table, "log_table": st.queue_table_log}
        finally:
            await conn.close()

    return asyncio.run(go())


def pgqueuer_worker_main(ctx: Context, dsn: str, schema: str, prefix: str, driver: str, batch: int) -> dict:
    """One PgQueuer QueueManager with a no-op entrypoint, drained (``mode=drain``) from the
    shared start time; reports when it started and stopped."""
    import asyncio

    _pgqueuer_env(prefix)

    async def go():
        from pgqueuer.qm import QueueManager
        from pgqueuer.queries import Queries
        from pgqueuer.types import QueueExecutionMode

        conn, drv = await _pgqueuer_driver(dsn, schema, driver, f"{ROLE}-pgq-{ctx.name[-1]}")
        try:
            qm = QueueManager(Queries(drv))

            @qm.entrypoint("noop")
            async def noop(job) -> None:
                return None

            order = ctx.pause("ready")
            _wait_until(order["start_at"])
            t0 = time.monotonic()
            await qm.run(batch_size=batch, mode=QueueExecutionMode.drain)
            return {"started": t0, "ended": time.monotonic()}
        finally:
            await conn.close()

    return asyncio.run(go())


def run_together(workers: list) -> list:
    """Start worker processes, let them all get ready (each pauses once it is), release them
    at one instant, and return what each returned; every one is killed at the end, also on
    an error."""
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.wait_for("paused", timeout=60)
        start_at = time.monotonic() + 0.05
        for w in workers:
            w.resume({"start_at": start_at})
        return [w.join(timeout=600)["result"] for w in workers]
    finally:
        for w in workers:
            w.kill()

def numbered(text: str) -> tuple[str, list[str]]:
    """``%(name)s`` placeholders as ``$1, $2 ...`` (first appearance order), comments dropped:
    the form libpq prepares.  Returns the text and the parameter names in order."""
    names: list[str] = []

    def sub(m: re.Match) -> str:
        if m.group(1) not in names:
            names.append(m.group(1))
        return f"${names.index(m.group(1)) + 1}"

    return re.sub(r"%\((\w+)\)s", sub, strip_comments(text)), names


def _drain_with_pgqueuer(lab: Lab, s: Settings, driver: str) -> dict:

    prefix = f"lkb{os.getpid()}_"
    setup = Worker("labkit.tools.bench:pgqueuer_setup_main", name="pgqueuer setup", dsn=lab.db.dsn,
                   schema=lab.schema, prefix=prefix, driver=driver, jobs=s.peer_jobs)
    with setup:
        done = setup.join(timeout=300)
    if done is None:
        raise LabkitError("The PgQueuer setup process ended without reporting its tables.",
                          "read the error above it, then run `labkit bench` again.")
    names = done["result"]
    workers = [Worker("labkit.tools.bench:pgqueuer_worker_main", name=f"pgqueuer {i}", dsn=lab.db.dsn,
                      schema=lab.schema, prefix=prefix, driver=driver, batch=s.peer_batch)
               for i in range(s.clients)]
    results = run_together(workers)
    from psycopg import sql

    left = lab.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(names["queue_table"])))[0][0]
    logged = lab.execute(sql.SQL("SELECT count(*) FROM {} WHERE status = 'successful'").format(
        sql.Identifier(names["log_table"])))[0][0]
    if left or logged != s.peer_jobs:
        raise LabkitError(f"PgQueuer left {left} jobs in its queue and logged {logged} of "
                          f"{s.peer_jobs} as successful.",
                          "run the benchmark again; if it repeats, the peer's drain mode stopped early.")
    wall = max(r["ended"] for r in results) - min(r["started"] for r in results)
    return {"jobs": s.peer_jobs, "seconds": wall, "jobs_per_s": s.peer_jobs / wall}


def _drain_with_labkit(lab: Lab, s: Settings) -> dict:
    ensure_job_table(lab, index=True)
    fill(lab, s.peer_jobs, history=0)
    with ClaimerPool(lab, s.clients) as pool:
        results = pool.order(mode="drain", batch=s.peer_batch, timeout=600)["clients"]
    done = count_status(lab, "DONE")
    finished = sum(r["finished"] for r in results)
    if done != s.peer_jobs or finished != s.peer_jobs:
        raise LabkitError(f"labkit's drain finished {finished} jobs ({done} DONE in the table) of "
                          f"{s.peer_jobs}.", "this is a bug in labkit bench: report it with the command you ran.")
    wall = max(r["ended"] for r in results) - min(r["started"] for r in results)
    return {"jobs": s.peer_jobs, "seconds": wall, "jobs_per_s": s.peer_jobs / wall}


PEER_WORK = ("each side drains the same backlog of no-op jobs with {w} workers, batch {b}: "
             "labkit (one process, {w} threads with a connection each) claims + marks a batch (one "
             "transaction), then marks it DONE (a second); PgQueuer {v} ({w} processes, one "
             "QueueManager and connection each, {d} driver, defaults otherwise) dequeues a batch (marks it picked), "
             "runs each job as an asyncio task and moves finished jobs to its log table in "
             "batches. Time: first worker's start to last worker's exit.")


def peer(lab: Lab, s: Settings, progress: Progress | None = None) -> dict:
    progress = progress or (lambda msg: None)
    version, driver = peer_available()
    labkit_side = _drain_with_labkit(lab, s)
    progress(f"peer drain: labkit   {labkit_side['jobs_per_s']:>9,.0f} jobs/s "
             f"({s.peer_jobs:,} jobs in {labkit_side['seconds']:.2f} s)")
    if version is None:
        progress(f"peer drain: skipped — {driver}")
        return {"peer": {"library": None, "skipped": driver, "labkit": labkit_side},
                "ratio_vs_peer": None}
    side = _drain_with_pgqueuer(lab, s, driver)
    progress(f"peer drain: pgqueuer {side['jobs_per_s']:>9,.0f} jobs/s "
             f"({s.peer_jobs:,} jobs in {side['seconds']:.2f} s)")
    return {"peer": {"library": f"pgqueuer {version}", "driver": driver, "workers": s.clients,
                     "batch": s.peer_batch, "labkit": labkit_side, "pgqueuer": side,
                     "what": PEER_WORK.format(w=s.clients, b=s.peer_batch, v=version, d=driver)},
            "ratio_vs_peer": labkit_side["jobs_per_s"] / side["jobs_per_s"]}


# -- figure 3: a broker, against the table's durable claim ------------------------------------------

AMQP_BATCHES = ("1", "10")              # the durable claim's batch sizes
AMQP_BODY = b'{"job": 0, "payload": "bench"}'   # every message the broker is measured with
AMQP_IDLE_S = 0.5                       # a consumer that gets nothing for this long has drained


def amqp_consumer_main(ctx: Context, url: str, queue: str, batch: int) -> dict:
    """One RabbitMQ consumer (its own process and connection): prefetch ``batch``, one ack
    (``multiple``) per ``batch`` messages, until the queue gives it nothing for
    ``AMQP_IDLE_S``.  Reports how many it took and when its first and last ack went."""
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=batch)
        order = ctx.pause("ready")
        _wait_until(order["start_at"])
        t0 = time.monotonic()
        got = unacked = 0
        last = t0
        tag = None
        for method, _props, _body in ch.consume(queue, inactivity_timeout=AMQP_IDLE_S):
            if method is None:
                break
            got += 1
            unacked += 1
            tag = method.delivery_tag
            if unacked == batch:
                ch.basic_ack(tag, multiple=True)
                unacked = 0
                last = time.monotonic()
        if unacked:
            ch.basic_ack(tag, multiple=True)
            last = time.monotonic()
        ch.cancel()
        return {"got": got, "started": t0, "ended": last}
    finally:
        conn.close()


def _amqp_not_measured(why: str, progress: Progress) -> dict:
    progress(f"broker: not measured here ({why})")
    return {"amqp": {"measured": False, "skipped": f"not measured here: {why}",
                     "note": f"the broker was not measured here ({why}); no broker figure of this run "
                             "stands beside the table's"}}


def _durable_consume(url: str, ch: Any, name: str, n: int, batch: int, clients: int) -> float:
    """Consume ``n`` persistent messages already in the durable queue ``name`` with ``clients``
    consumer processes, prefetch and one ack per ``batch``; messages per second, first
    consumer's start to last ack."""
    workers = [Worker("labkit.tools.bench:amqp_consumer_main", name=f"amqp consumer {i}", url=url,
                      queue=name, batch=batch) for i in range(clients)]
    results = run_together(workers)
    got = sum(r["got"] for r in results)
    left = ch.queue_declare(name, durable=True, passive=True).method.message_count
    if got != n or left:
        raise LabkitError(f"RabbitMQ delivered {got} of {n} messages ({left} left in the queue).",
                          "check the broker's health and run the benchmark again.")
    wall = max(r["ended"] for r in results) - min(r["started"] for r in results)
    return n / wall


def amqp(s: Settings, progress: Progress | None = None, durability: dict | None = None) -> dict:
    """RabbitMQ at ``LABKIT_AMQP_URL``, measured in this run, when one answers.

    *durable*, the broker's side of the table's durable claim: a durable queue, persistent
    messages published with publisher confirms (one publisher, each publish waits for its
    confirm), then consumed with acks by ``clients`` consumer processes, once per batch size
    of the durable claim (prefetch = batch, one ack per batch) — the table's claimers'
    number and batch.  ``messages_per_s`` (per batch) is the consume + ack rate, set beside
    ``durability``'s durable claim figure from the same run, with what each side was
    measured under.  *transient*: a non-durable queue without confirms, one publisher
    then one consumer.  Where no broker answers, the result says it was not measured."""
    progress = progress or (lambda msg: None)
    url = os.environ.get("LABKIT_AMQP_URL", "").strip()
    if not url:
        return _amqp_not_measured("LABKIT_AMQP_URL is not set", progress)
    try:
        import pika
    except ImportError:
        return _amqp_not_measured("the RabbitMQ client pika is not installed (pip install 'labkit[rabbitmq]')",
                                  progress)
    try:
        conn = pika.BlockingConnection(pika.URLParameters(url))
    except Exception as exc:
        return _amqp_not_measured(f"RabbitMQ at LABKIT_AMQP_URL did not answer ({type(exc).__name__})",
                                  progress)
    out: dict = {"measured": True}
    try:
        out["transient"] = _amqp_transient(pika, conn, s.amqp_messages, progress)
        n, publish, rates = _amqp_durable(pika, conn, url, s, progress)
    finally:
        with contextlib.suppress(Exception):
            conn.close()
    out["durable"] = _amqp_durable_figures(s, n, publish, rates, durability or {})
    out["what"] = ("pika BlockingConnection; transient: non-durable queue, no confirms, one publisher then "
                   "one consumer (prefetch 200, an ack per message); durable: durable queue, persistent "
                   "messages, publisher confirms (one publisher), then consumer processes with prefetch "
                   "and one ack per batch")
    return {"amqp": out}


def _amqp_transient(pika: Any, conn: Any, n: int, progress: Progress) -> dict:
    """No durability asked for: ``n`` messages to a non-durable queue without confirms from
    one publisher, then consumed by one consumer with an ack each.  Both rates."""
    ch = conn.channel()
    name = f"labkit-bench-{os.getpid()}-transient"
    try:
        ch.queue_declare(name, durable=False, exclusive=True, auto_delete=False)
        props = pika.BasicProperties(delivery_mode=1)
        t0 = time.perf_counter()
        for _ in range(n):
            ch.basic_publish("", name, AMQP_BODY, props)
        while ch.queue_declare(name, passive=True).method.message_count < n:
            time.sleep(0.001)
        t1 = time.perf_counter()
        ch.basic_qos(prefetch_count=200)
        got = 0
        for method, _props, _body in ch.consume(name, inactivity_timeout=10):
            if method is None:
                break
            ch.basic_ack(method.delivery_tag)
            got += 1
            if got >= n:
                break
        ch.cancel()
        t2 = time.perf_counter()
        if got != n:
            raise LabkitError(f"RabbitMQ delivered {got} of {n} messages.",
                              "check the broker's health and run the benchmark again.")
        progress(f"broker, transient: publish {n / (t1 - t0):>9,.0f} msgs/s, "
                 f"consume + ack {n / (t2 - t1):>9,.0f} msgs/s")
        return {"messages": n, "publish_msgs_per_s": n / (t1 - t0), "consume_msgs_per_s": n / (t2 - t1)}
    finally:
        with contextlib.suppress(Exception):
            ch.queue_delete(name)
            ch.close()


def _amqp_durable(pika: Any, conn: Any, url: str, s: Settings,
                  progress: Progress) -> tuple[int, list[float], dict[str, float]]:
    """Durable queue, persistent messages, publisher confirms; consumed with acks by the
    clients, once per batch size.  The messages per batch (a whole number of the biggest
    batch, so no consumer is left waiting for a short one), the publish rates and the
    consume + ack rate by batch."""
    step = max(int(b) for b in AMQP_BATCHES)
    n = max(step, s.amqp_messages // 3 // step * step)
    ch = conn.channel()
    ch.confirm_delivery()                       # each basic_publish waits for its confirm
    name = f"labkit-bench-{os.getpid()}-durable"
    props = pika.BasicProperties(delivery_mode=2)              # persistent
    publish: list[float] = []
    rates: dict[str, float] = {}
    try:
        ch.queue_declare(name, durable=True, exclusive=False, auto_delete=False)
        for b in AMQP_BATCHES:
            t0 = time.perf_counter()
            for _ in range(n):
                ch.basic_publish("", name, AMQP_BODY, props, mandatory=True)
            publish.append(n / (time.perf_counter() - t0))
            rates[b] = _durable_consume(url, ch, name, n, int(b), s.clients)
            progress(f"broker, durable, batch {b:>2}: publish + confirm {publish[-1]:>7,.0f} msgs/s, "
                     f"consume + ack {rates[b]:>9,.0f} msgs/s ({s.clients} consumers)")
    finally:
        with contextlib.suppress(Exception):
            ch.queue_delete(name)
            ch.close()
    return n, publish, rates


def _amqp_durable_figures(s: Settings, n: int, publish: list[float], rates: dict[str, float], d: dict) -> dict:
    """The broker's durable figures beside the table's durable claim of the same run (``d``:
    the run's durability figures), with what each side was measured under."""
    table_side = d.get("claim_jobs_per_s_durable")
    return {
        "messages": n, "consumers": s.clients, "batches": [int(b) for b in AMQP_BATCHES],
        "publish_msgs_per_s": statistics.median(publish),
        "messages_per_s": rates,
        "table_claim_jobs_per_s_durable": table_side,
        "ratio_to_table": ({b: rates[b] / table_side[b] for b in rates if table_side.get(b)}
                           if table_side else None),
        "under": {
            "fsync": d.get("fsync"), "synchronous_commit": d.get("synchronous_commit"),
            "table_commits_durable": d.get("commits_durable"),
            "table": (f"claim + mark from a backlog, {s.clients} clients, one transaction per claim of a "
                      "batch, synchronous_commit = on (COMMIT returns once the WAL is flushed)"),
            "broker": (f"durable queue, persistent messages, each publish confirmed before the next; "
                       f"{s.clients} consumer processes, prefetch = batch, one ack per batch"),
        },
        "note": ("broker and table measured in this run, on this machine" if table_side else
                 "the table's durable claim has no figure in this run (" +
                 (d.get("note") or "the durability figure was not measured") + "): nothing to set "
                 "the broker beside"),
    }


def durable_cost(batch: int = 1, settings: Settings | None = None) -> dict:
    """The durability figure measured once more at one batch size, in a schema of its own
    (dropped after): ``{"on": jobs/s, "off": jobs/s, "fsync": ...}``, durable commits
    (synchronous_commit = on) and synchronous_commit = off back to back."""
    s = (settings or Settings.quick_settings()).check()
    lab = Lab.open(dbmod.connect(quiet=True), f"bench_{os.getpid()}_d")
    try:
        ensure_job_table(lab, index=True)
        got = {}
        with ClaimerPool(lab, s.clients) as pool:
            for sc in ("on", "off"):
                size = int(CEILING_GUESS.get(batch, 150_000) * s.clients / 4 * s.seconds * 2) + s.clients * batch * 4
                fill(lab, size, history=0)
                got[sc] = run_labkit_ceiling(lab, pool, batch, s.seconds, synchronous_commit=sc).jobs_per_s
        return got | {"fsync": lab.execute("SHOW fsync")[0][0]}
    finally:
        lab.discard()


# -- figure 4: the convoy ------------------------------------------------------------------------------

def convoy_efficiency(lab: Lab, s: Settings, progress: Progress | None = None) -> dict:

    r = convoy.run(lab, "skip", 16, 20, s.convoy_seconds).row()
    (progress or (lambda m: None))(f"convoy: SKIP LOCKED, N = 16, d = 20 ms: {r['jobs_per_s']:,.0f} jobs/s, "
                                   f"efficiency {r['efficiency']:.3f}")
    return {"convoy_efficiency_16": r["efficiency"],
            "convoy": {"workers": 16, "job_ms": 20, "seconds": s.convoy_seconds,
                       "jobs_per_s": r["jobs_per_s"], "model_jobs_per_s": r["model_jobs_per_s"]}}


# -- figure 5: history and the partial index ------------------------------------------------------------

def history(lab: Lab, s: Settings, progress: Progress | None = None) -> dict:
    """The claim rate (labkit's claimer, batch ``history_batch``) with 0 and ``history_rows``
    finished rows in the table, with and without the partial index.  Every point starts
    from the same backlog of ``history_pending`` pending jobs, so history is the only thing
    that changes; a point ends when the backlog is claimed or after ``seconds``."""
    progress = progress or (lambda msg: None)
    points = []
    with ClaimerPool(lab, s.clients) as pool:
        for done in (0, s.history_rows):
            built = False
            for index in (True, False):
                ensure_job_table(lab, index=index)
                fill(lab, s.history_pending, history=None if built else done)
                built = True
                r = run_labkit_ceiling(lab, pool, s.history_batch, s.seconds)
                points.append({"done_rows": done, "partial_index": index, "jobs_per_s": r.jobs_per_s,
                               "jobs": r.jobs, "seconds": r.seconds})
                progress(f"history: {done:>9,} done rows, {'with' if index else 'without':>7} the index: "
                         f"{r.jobs_per_s:>9,.0f} jobs/s ({r.jobs:,} jobs in {r.seconds:.2f} s)")
    lab.execute("DROP TABLE IF EXISTS job")
    return {"history": {"done_rows": s.history_rows, "pending": s.history_pending, "batch": s.history_batch,
                        "clients": s.clients, "points": points}}


# -- figure 6: the embedded server's start and a warm connect -------------------------------------------

def server_start(lab: Lab, s: Settings, progress: Progress | None = None) -> dict:
    """A throw-away embedded cluster in a temporary folder (the user's server is never
    touched): first start (initdb + start), then ``start_runs`` cold starts of the stopped
    cluster; and the median warm connect (connect + SELECT 1) to the server under test."""

    progress = progress or (lambda msg: None)
    tmp = Path(tempfile.mkdtemp(prefix="labkit-bench-pg-"))
    os.chmod(tmp, 0o755)  # as root the server's own user must pass through it
    server = EmbeddedServer(tmp / "pg")
    cold: list[float] = []
    try:
        t0 = time.perf_counter()
        server.start()
        first = time.perf_counter() - t0
        for _ in range(s.start_runs):
            server.stop()
            t0 = time.perf_counter()
            server.start()
            with open_connection(server.url(), role=f"{ROLE}-start") as c:
                c.execute("SELECT 1")
            cold.append(time.perf_counter() - t0)
    finally:
        try:
            server.stop()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    warm = []
    for _ in range(10):
        t0 = time.perf_counter()
        with open_connection(lab.db.dsn, schema=lab.schema, role=f"{ROLE}-connect") as c:
            c.execute("SELECT 1")
        warm.append(time.perf_counter() - t0)
    out = {"first_start_s": first, "cold_start_s": statistics.median(cold),
           "warm_connect_ms": statistics.median(warm) * 1e3}
    progress(f"server: first start (initdb) {first:.2f} s, cold start {out['cold_start_s']:.2f} s, "
             f"warm connect {out['warm_connect_ms']:.1f} ms")
    return {"server_start": out}


# -- figure 7: notebooks, headless ---------------------------------------------------------------------

def notebook_names(wanted: Iterable[str] | None = None) -> list[str]:
    names = [p.stem for p in sorted(NOTEBOOKS.glob("[0-9]*.ipynb"))]
    if wanted is None:
        return names
    missing = [w for w in wanted if w not in names]
    if missing:
        raise LabkitError(f"No notebook called {missing[0]!r} in {NOTEBOOKS}.",
                          f"use one of: {', '.join(names)}.")
    return [w for w in names if w in set(wanted)]


def time_notebooks(names: list[str], progress: Progress | None = None, timeout: int = 600) -> dict:
    """Run each notebook headless (nbclient, a fresh kernel, from notebooks/) on an in-memory
    copy — nothing in notebooks/ is rewritten — and time it.  The kernels run as their own
    LABKIT_USER so the reader's and the test suite's lab schemas are left alone; the schemas
    they create are dropped afterwards.  Without nbclient (the ``slides`` extra) the figure
    is skipped, and the result says why."""
    progress = progress or (lambda msg: None)
    try:
        import nbformat
        from nbclient import NotebookClient
    except ImportError:
        why = "nbclient is not installed (pip install 'labkit[slides]')"
        progress(f"notebooks: skipped ({why})")
        return _no_notebooks(notebooks_skipped=why)
    user = f"bench{os.getpid()}"
    times: dict[str, float] = {}
    errors: dict[str, str] = {}
    t_all = time.perf_counter()
    try:
        with lab_user(user):
            for name in names:
                nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
                client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                        resources={"metadata": {"path": str(NOTEBOOKS)}})
                t0 = time.perf_counter()
                try:
                    # the kernel's own stderr (start-up chatter) would land in the caller's output
                    client.execute(stderr=subprocess.DEVNULL)
                except Exception as exc:       # nbclient raises CellExecutionError and others
                    errors[name] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:200]}"
                times[name] = time.perf_counter() - t0
                progress(f"notebook {name}: {times[name]:.1f} s" + (" (FAILED)" if name in errors else ""))
    finally:
        _drop_schemas_of(user)
    return {"notebook_seconds": times, "workbook_seconds": time.perf_counter() - t_all,
            "notebook_errors": errors, "workbook_notebooks": len(names),
            "workbook_complete": len(names) == len(notebook_names())}


def _no_notebooks(**why: str) -> dict:
    """The notebook figures of a run that timed none."""
    return {"notebook_seconds": {}, "workbook_seconds": None, "workbook_notebooks": 0,
            "workbook_complete": False, "notebook_errors": {}, **why}


def _drop_schemas_of(user: str) -> None:

    try:
        with dbmod.connect(quiet=True).connect() as conn:
            drop_schemas(conn, "lab\\_%\\_" + user)
    except Exception:
        pass


# -- goals, the run, the table ---------------------------------------------------------------------------

GOALS = (
    ("ratio_vs_pgbench_1", "labkit's claimer ≥ 1.0 × pgbench at batch 1", 1.0, ">="),
    ("ratio_vs_pgbench_10", "labkit's claimer ≥ 1.0 × pgbench at batch 10", 1.0, ">="),
    ("ratio_vs_pgbench_100", "labkit's claimer ≥ 1.0 × pgbench at batch 100", 1.0, ">="),
    ("client_cpu_vs_pgbench_1", "labkit's client CPU per claim ≤ 1.3 × pgbench's at batch 1", 1.3, "<="),
    ("ratio_vs_peer", "labkit ≥ 1.0 × the peer library (PgQueuer)", 1.0, ">="),
    ("convoy_efficiency_16", "convoy efficiency ≥ 0.85 (SKIP LOCKED, N = 16, d = 20 ms)", 0.85, ">="),
    ("notebook_max_seconds", "every notebook headless ≤ 60 s", 60.0, "<="),
    ("workbook_seconds", "the whole workbook headless ≤ 5 min", 300.0, "<="),
    ("cold_start_s", "embedded server ready ≤ 2 s cold", 2.0, "<="),
)


def goals(result: dict) -> list[dict]:
    """Each speed goal with the measured value and met / missed / not measured."""
    nb = result.get("notebook_seconds") or {}
    cpu_l, cpu_p = (result.get("claim_client_cpu_us_per_call") or {}), (result.get("pgbench_client_cpu_us_per_call") or {})
    values = {
        "ratio_vs_pgbench_1": (result.get("ratio_vs_pgbench") or {}).get("1"),
        "ratio_vs_pgbench_10": (result.get("ratio_vs_pgbench") or {}).get("10"),
        "ratio_vs_pgbench_100": (result.get("ratio_vs_pgbench") or {}).get("100"),
        "client_cpu_vs_pgbench_1": cpu_l["1"] / cpu_p["1"] if cpu_l.get("1") and cpu_p.get("1") else None,
        "ratio_vs_peer": result.get("ratio_vs_peer"),
        "convoy_efficiency_16": result.get("convoy_efficiency_16"),
        "notebook_max_seconds": max(nb.values()) if nb else None,
        "workbook_seconds": result.get("workbook_seconds") if result.get("workbook_complete") else None,
        "cold_start_s": (result.get("server_start") or {}).get("cold_start_s"),
    }
    out = []
    for key, text, target, op in GOALS:
        v = values[key]
        met = None if v is None else (v >= target if op == ">=" else v <= target)
        out.append({"goal": text, "key": key, "target": target, "measured": v,
                    "status": "not measured" if met is None else ("met" if met else "missed")})
    return out


LIMITS = [
    "The clients and the server's backends share this machine's cores (and with whatever else "
    "runs on it): every figure is a ceiling of this machine, not of PostgreSQL.",
    "The claim ceiling is set by the server's work per transaction (index search, row lock, "
    "UPDATE, WAL, commit); a lean client adds little, and bigger batches spread the commit over "
    "more jobs.",
    "The physics figure reads the server's own counters around one durable run per batch size: "
    "WAL bytes from its insert position, syncs from pg_stat_io (pg_stat_wal before PostgreSQL 18), "
    "server CPU from the claimers' backends only (not the WAL writer's). Its flush time is one "
    "8 kB write and its sync on the WAL's disk, as pg_test_fsync's first test times it; several "
    "sessions can share one flush, so the one-session bound is not the ceiling of four.",
    "The cursor-API figure is the same claim through psycopg's ordinary cursor API, measured "
    "once at batch 10 beside the lean claimer: what that layer costs on the client is the gap, "
    "when it is larger than one measurement's noise; on a machine with few cores that CPU is "
    "taken from the server.",
]


def machine() -> dict:
    import psycopg

    try:
        cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                    if line.startswith("model name")), platform.processor())
    except OSError:
        cpu = platform.processor()
    return {"cpus": os.cpu_count(), "cpu": cpu, "os": f"{platform.system()} {platform.release()}",
            "python": platform.python_version(), "psycopg": psycopg.__version__,
            "load_average_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}


def run(lab: Lab | None = None, settings: Settings | None = None, *, quick: bool = True,
        notebooks: Iterable[str] | None | EllipsisType = ..., progress: Progress | None = None,
        figures: tuple[str, ...] | None = None) -> dict:
    """Run the benchmark; return every figure as one dict (what ``--json`` prints).

    ``lab``: the lab schema to work in (a fresh one of its own when None, dropped after).
    ``notebooks``: names to time (``()`` times none; the default is the settings' choice).
    ``figures``: a subset of ``("ceiling", "durability", "peer", "amqp", "convoy", "history", "server",
    "notebooks")``."""
    s = (settings or (Settings.quick_settings() if quick else Settings.full_settings()))
    if notebooks is not ...:
        s = replace(s, notebooks=None if notebooks is None else tuple(notebooks))
    s.check()
    figures = _chosen_figures(figures)
    progress = progress or (lambda msg: None)
    no_workbook = "notebooks" in figures and not notebook_names()
    names = notebook_names(s.notebooks) if "notebooks" in figures and not no_workbook else []


    own = lab is None
    if lab is None:
        lab = Lab.open(dbmod.connect(quiet=True), f"bench_{os.getpid()}")
    t_start = time.perf_counter()
    result: dict = {"quick": s.quick, "server": lab.db.describe().split(" · ")[0] + " · " + lab.db.backend,
                    "machine": machine(), "settings": asdict(s)}
    try:
        _measure_figures(lab, s, figures, progress, result)
        _time_workbook(figures, names, no_workbook, progress, result)
    finally:
        if own:
            lab.discard()
    result["goals"] = goals(result)
    result["limits"] = LIMITS
    result["bench_seconds"] = time.perf_counter() - t_start
    return result


FIGURES = ("ceiling", "durability", "physics", "peer", "amqp", "convoy", "history", "server", "notebooks")


def _chosen_figures(figures: tuple[str, ...] | None) -> tuple[str, ...]:
    """The figures asked for (None or empty: all of them), each one known."""
    figures = tuple(figures or FIGURES)
    bad = [f for f in figures if f not in FIGURES]
    if bad:
        raise LabkitError(f"Unknown benchmark figure {bad[0]!r}.", f"use some of {', '.join(FIGURES)}.")
    return figures


def _measure_figures(lab: Lab, s: Settings, figures: tuple[str, ...], progress: Progress, result: dict) -> None:
    """Measure the figures asked for on the server, in this order, into ``result`` (the
    broker's beside the durability figure measured just before it)."""
    if "ceiling" in figures:
        result |= claim_ceiling(lab, s, progress)
    if "durability" in figures:
        result |= durability(lab, s, progress)
    if "physics" in figures:
        result |= physics_figure(lab, s, progress)
    if "peer" in figures:
        result |= peer(lab, s, progress)
    if "amqp" in figures:
        result |= amqp(s, progress, result.get("durability"))
    if "convoy" in figures:
        lab.execute("DROP TABLE IF EXISTS job")
        result |= convoy_efficiency(lab, s, progress)
    if "history" in figures:
        lab.execute("DROP TABLE IF EXISTS job")
        result |= history(lab, s, progress)
    if "server" in figures:
        result |= server_start(lab, s, progress)


def _time_workbook(figures: tuple[str, ...], names: list[str], no_workbook: bool, progress: Progress,
                   result: dict) -> None:
    """Time the notebooks named (``names``) headless into ``result``, or say why none was."""
    if no_workbook:
        # an installed labkit without the workbook beside it: nothing to time
        why = f"no notebooks in {NOTEBOOKS} (labkit installed without the workbook): run from a checkout"
        progress(f"notebooks: skipped ({why})")
        result |= _no_notebooks(notebooks_skipped=why)
    elif "notebooks" in figures:
        result |= time_notebooks(names, progress) if names else _no_notebooks()


def _fmt(v, unit: str = "") -> str:
    if v is None:
        return "—"
    if isinstance(v, float) and abs(v) < 10:
        return f"{v:.2f}{unit}"
    return f"{v:,.0f}{unit}"


def table(result: dict) -> str:
    """The benchmark as a plain-text table, then the goals and what limits the figures."""
    rows = [tuple(str(x) for x in r) for rows_of in _TABLE_ROWS for r in rows_of(result)]
    return "\n".join(_table_lines(result, rows) + _table_notes(result))


def _ceiling_rows(result: dict) -> list[tuple]:
    """The claim ceiling against pgbench by batch, and the client CPU each spends per call."""
    rows: list[tuple] = [(f"claim ceiling, batch {b} (jobs/s)", _fmt(v),
                          f"pgbench {_fmt(result['pgbench_jobs_per_s'][b])}", _fmt(result["ratio_vs_pgbench"][b]))
                         for b, v in (result.get("claim_jobs_per_s") or {}).items()]
    cpu_l, cpu_p = result.get("claim_client_cpu_us_per_call") or {}, result.get("pgbench_client_cpu_us_per_call") or {}
    rows += [(f"  client CPU per claim call, batch {b} (µs)", _fmt(cpu_l[b]), f"pgbench {_fmt(cpu_p[b])}",
              _fmt(cpu_l[b] / cpu_p[b])) for b in cpu_l if cpu_p.get(b)]
    return rows


def _durability_rows(result: dict) -> list[tuple]:
    """What the server promises at commit, and the claim with durable commits against
    synchronous_commit = off."""
    d = result.get("durability")
    if not d:
        return []
    rows: list[tuple] = [(f"server: fsync={d['fsync']}, synchronous_commit={d['synchronous_commit']}",
                          "durable" if d["commits_durable"] else "NOT durable", d["wal_sync_method"], "—")]
    for b, v in (d.get("claim_jobs_per_s_synchronous_commit_off") or {}).items():
        durable = (d.get("claim_jobs_per_s_durable") or {}).get(b)
        rows.append((f"  claim, batch {b}: durable commits vs synchronous_commit=off (jobs/s)",
                     _fmt(durable) if durable else "—", f"async {_fmt(v)}",
                     _fmt(durable / v) if durable and v else "—"))
    return rows


def _physics_rows(result: dict) -> list[tuple]:
    """What one job cost by batch (WAL, syncs, CPU), the disk's flush, and what bounded each point."""
    ph, c = result.get("physics"), result.get("ceiling")
    if not ph or not c:
        return []
    rows: list[tuple] = [(f"one 8 kB write + {c['method']} on the WAL's disk (ms)", _fmt(c["flush_ms"]),
                          f"≤ {_fmt(c['durable_commits_per_s_one_session'])} durable commits/s, one session",
                          "—")]
    for g in (c.get("group_commit") or {}).get("points", []):
        rows.append((f"  durable one-row commits, {g['sessions']} session(s), commit_delay {g['commit_delay_us']} µs",
                     _fmt(g["commits_per_s"]), f"{g['syncs_per_commit']:.3f} syncs per commit", "—"))
    for b, p in ph.items():
        cpu = "—" if p["server_cpu_us_per_job"] is None else _fmt(p["server_cpu_us_per_job"])
        rows.append((f"  physics, batch {b}: WAL bytes, syncs, server µs per job", _fmt(p["wal_bytes_per_job"]),
                     f"{p['wal_syncs_per_job']:.3f} syncs, {cpu} µs", c["bound"][b]["bound"]))
    return rows


def _cursor_api_rows(result: dict) -> list[tuple]:
    """The same claim through psycopg's cursor API, against the lean claimer."""
    return [(f"  same, psycopg cursor API, batch {b}", _fmt(v), f"lean claimer {_fmt(result['claim_jobs_per_s'][b])}",
             _fmt(v / result["claim_jobs_per_s"][b]))
            for b, v in (result.get("claim_cursor_api_jobs_per_s") or {}).items()]


def _peer_rows(result: dict) -> list[tuple]:
    """Draining no-op jobs, against the peer library (or why it was skipped)."""
    p = result.get("peer")
    if not p:
        return []
    if p.get("library"):
        return [(f"drain {p['labkit']['jobs']:,} no-op jobs (jobs/s)", _fmt(p["labkit"]["jobs_per_s"]),
                 f"{p['library']} {_fmt(p['pgqueuer']['jobs_per_s'])}", _fmt(result["ratio_vs_peer"]))]
    return [(f"drain {p['labkit']['jobs']:,} no-op jobs (jobs/s)", _fmt(p["labkit"]["jobs_per_s"]),
             f"peer skipped: {p['skipped']}", "—")]


def _amqp_rows(result: dict) -> list[tuple]:
    """The broker, transient and durable, beside the table's durable claim (or why it was
    not measured)."""
    a = result.get("amqp")
    if not a:
        return []
    if not a.get("measured"):
        return [("RabbitMQ (msgs/s)", "—", a["skipped"], "—")]
    m = a["transient"]
    rows: list[tuple] = [("RabbitMQ transient: publish / consume+ack (msgs/s)", "—",
                          f"{_fmt(m['publish_msgs_per_s'])} / {_fmt(m['consume_msgs_per_s'])}", "—")]
    m = a["durable"]
    rows.append(("RabbitMQ durable: publish + confirm (msgs/s)", "—", _fmt(m["publish_msgs_per_s"]), "—"))
    for b, v in m["messages_per_s"].items():
        table_side = (m["table_claim_jobs_per_s_durable"] or {}).get(b)
        rows.append((f"  durable claim vs durable consume+ack, batch {b} (per s)", _fmt(table_side),
                     f"RabbitMQ {_fmt(v)}", _fmt(table_side / v) if table_side else "—"))
    return rows


def _convoy_history_rows(result: dict) -> list[tuple]:
    """SKIP LOCKED against the convoy model, and the claim over a growing history with and
    without the partial index."""
    rows: list[tuple] = []
    if "convoy_efficiency_16" in result:
        c = result["convoy"]
        rows.append(("convoy: SKIP LOCKED N = 16, d = 20 ms (jobs/s)", _fmt(c["jobs_per_s"]),
                     f"model N/d {_fmt(c['model_jobs_per_s'])}", _fmt(result["convoy_efficiency_16"])))
    h = result.get("history")
    if h:
        by = {(pt["done_rows"], pt["partial_index"]): pt["jobs_per_s"] for pt in h["points"]}
        rows += [(f"claim, batch {h['batch']}, {done:,} done rows (jobs/s)", _fmt(by[(done, True)]),
                  f"no index {_fmt(by[(done, False)])}", _fmt(by[(done, True)] / by[(done, False)]))
                 for done in sorted({pt["done_rows"] for pt in h["points"]})]
    return rows


def _timing_rows(result: dict) -> list[tuple]:
    """How long the embedded server takes to start and connect, and the notebooks headless."""
    rows: list[tuple] = []
    st = result.get("server_start")
    if st:
        rows.append(("embedded server: first start / cold start (s)",
                     f"{st['first_start_s']:.2f} / {st['cold_start_s']:.2f}", "", ""))
        rows.append(("warm connect + SELECT 1 (ms)", f"{st['warm_connect_ms']:.1f}", "", ""))
    rows += [(f"notebook {name} headless (s)", f"{sec:.1f}",
              "FAILED" if name in result.get("notebook_errors", {}) else "", "")
             for name, sec in (result.get("notebook_seconds") or {}).items()]
    if result.get("workbook_seconds") is not None:
        n, complete = result["workbook_notebooks"], result["workbook_complete"]
        rows.append((f"{'whole workbook' if complete else f'{n} notebook(s)'} headless (s)",
                     f"{result['workbook_seconds']:.1f}", "", ""))
    if result.get("notebooks_skipped"):
        rows.append(("notebooks headless (s)", "—", f"skipped: {result['notebooks_skipped']}", "—"))
    return rows


# the table's rows, in the order it prints them
_TABLE_ROWS = (_ceiling_rows, _durability_rows, _physics_rows, _cursor_api_rows, _peer_rows, _amqp_rows, _convoy_history_rows,
               _timing_rows)


def _table_lines(result: dict, rows: list[tuple[str, ...]]) -> list[str]:
    """The table itself: a line saying what was measured on, the heading, and the rows in
    columns as wide as their widest cell."""
    head = ("figure", "labkit", "other side", "ratio")
    w = [max(len(r[i]) for r in rows + [head]) for i in range(4)]
    lines = [f"labkit bench{' --quick' if result.get('quick') else ''} · {result.get('server', '')} · "
             f"{result['machine']['cpus']} CPUs · {result['settings']['clients']} clients"]
    lines.append("  ".join(h.ljust(w[i]) if i == 0 else h.rjust(w[i]) for i, h in enumerate(head)))
    for r in rows:
        lines.append("  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(r)))
    return lines


def _table_notes(result: dict) -> list[str]:
    """Under the table: the goals, what each side does, and what limits the figures."""
    lines = ["", "goals:"]
    for g in result.get("goals", []):
        lines.append(f"  {g['status'].upper():<12} {g['goal']} (measured {_fmt(g['measured'])})")
    lines.append("")
    lines.append("what each side does:")
    if result.get("pgbench"):
        n = result['settings']['clients']
        lines.append(f"  claim ceiling: labkit's client is one process with {n} threads, each with one "
                     "connection running claim_skip_locked.sql (claim + mark, one transaction per call, "
                     f"prepared, ids returned) for the measured time; pgbench ({result['pgbench']}) runs the "
                     f"same statement with -M prepared, -c {n} -j {n} and the same session settings; "
                     "claimed rows are counted in the table, which is refilled and vacuumed before each run.")
    p = result.get("peer")
    if p and p.get("what"):
        lines.append("  peer: " + p["what"])
    lines.append("what limits the figures:")
    lines.extend(f"  - {x}" for x in result.get("limits", []))
    return lines


def load_reference(path: Path = REFERENCE) -> dict:
    """The reference run recorded in data/ (bench_reference.md describes the machine)."""
    if not path.exists():
        raise LabkitError(f"The benchmark reference {path} is missing.",
                          f"record one with `labkit bench --json > {path}`.")
    return json.loads(path.read_text())


def headline(result: dict) -> dict:
    """The figures a reader compares, flat: name -> value (None when not measured)."""
    out: dict[str, float | None] = {}
    for b, v in (result.get("claim_jobs_per_s") or {}).items():
        out[f"claim jobs/s, batch {b}"] = v
    for b, v in (result.get("pgbench_jobs_per_s") or {}).items():
        out[f"pgbench jobs/s, batch {b}"] = v
    for b, v in (result.get("ratio_vs_pgbench") or {}).items():
        out[f"labkit / pgbench, batch {b}"] = v
    p = result.get("peer") or {}
    out["drain jobs/s, labkit"] = (p.get("labkit") or {}).get("jobs_per_s")
    out["drain jobs/s, PgQueuer"] = (p.get("pgqueuer") or {}).get("jobs_per_s")
    out["labkit / PgQueuer"] = result.get("ratio_vs_peer")
    a = result.get("amqp") or {}
    if "transient" in a:
        out["RabbitMQ transient publish msgs/s"] = a["transient"]["publish_msgs_per_s"]
        out["RabbitMQ transient consume msgs/s"] = a["transient"]["consume_msgs_per_s"]
    if "durable" in a:
        out["RabbitMQ durable publish msgs/s"] = a["durable"]["publish_msgs_per_s"]
        for b, v in (a["durable"].get("messages_per_s") or {}).items():
            out[f"RabbitMQ durable consume + ack msgs/s, batch {b}"] = v
    out["convoy efficiency, N = 16"] = result.get("convoy_efficiency_16")
    h = result.get("history")
    if h:
        for pt in h["points"]:
            out[f"claim jobs/s, {pt['done_rows']:,} done rows, "
                f"{'index' if pt['partial_index'] else 'no index'}"] = pt["jobs_per_s"]
    st = result.get("server_start") or {}
    out["server cold start s"] = st.get("cold_start_s")
    out["warm connect ms"] = st.get("warm_connect_ms")
    return out


def compare(mine: dict, reference: dict) -> pd.DataFrame:
    """Your figures beside the reference's: a DataFrame indexed by figure, with both values
    and yours / reference (figures one side did not measure are left out)."""
    import pandas as pd

    a, b = headline(reference), headline(mine)
    rows = [(k, a[k], b.get(k)) for k in a if a[k] is not None and b.get(k) is not None]
    df = pd.DataFrame(rows, columns=["figure", "reference", "yours"]).set_index("figure")
    df["yours / reference"] = df["yours"] / df["reference"]
    return df


def plot_ceiling(mine: dict | None, reference: dict | None):
    """Claim ceiling by batch size, on plain axes from 0: jobs claimed per second (left) and
    claims per second (right, jobs / batch), labkit and pgbench, yours (solid) and the
    reference (hatched).  Returns the two axes."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    runs = [(name, r) for name, r in (("reference", reference), ("yours", mine)) if r]
    batches = list((runs[0][1])["claim_jobs_per_s"])
    fig, (jobs, calls) = plt.subplots(1, 2, figsize=(12, 6))
    width = 0.8 / (2 * len(runs))
    k = 0
    for name, r in runs:
        for who, key, colour in (("labkit", "claim_jobs_per_s", PALETTE[0]),
                                 ("pgbench", "pgbench_jobs_per_s", PALETTE[1])):
            xs = [i + (k - (2 * len(runs) - 1) / 2) * width for i in range(len(batches))]
            style = dict(color=colour, hatch="//" if name == "reference" else None,
                         alpha=0.55 if name == "reference" else 1.0, edgecolor="white")
            durable = (r.get("durability") or {}).get("commits_durable")
            promise = "" if durable is None else (", durable" if durable else ", fsync = off")
            jobs.bar(xs, [r[key][b] for b in batches], width, label=f"{who}, {name}{promise}", **style)
            calls.bar(xs, [r[key][b] / int(b) for b in batches], width, **style)
            k += 1
    for ax, label in ((jobs, "jobs claimed per second"), (calls, "claims per second (jobs / batch)")):
        ax.set_xticks(range(len(batches)), [f"batch {b}" for b in batches])
        ax.set_ylabel(label)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    jobs.set_title("More jobs per second with a bigger batch...")
    calls.set_title("...in fewer, heavier claims")
    legend_below(fig, jobs, ncol=2)
    fig.suptitle("Claim ceiling: claim + mark, one transaction per call")
    return jobs, calls


# -- command line --------------------------------------------------------------------------------------

def bench_command(*, quick: bool, json: bool, notebooks: list[str] | None, clients: int | None,
                  seconds: float | None, check: bool, figures: list[str] | None = None) -> int:
    """``labkit bench [--quick] [--json] [--notebooks NAME ...] [--figures NAME ...]``: progress
    on stderr, the table or JSON on stdout; with ``check``, exit 1 when a goal is missed."""
    from json import dumps  # (the parameter ``json`` is the --json switch)


    kw = {k: v for k, v in (("clients", clients), ("seconds", seconds)) if v is not None}
    s = Settings.quick_settings(**kw) if quick else Settings.full_settings(**kw)
    if notebooks is not None:
        s = replace(s, notebooks=tuple(notebooks))

    def progress(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    s.check()                       # every setting, before any work
    chosen = _chosen_figures(tuple(figures or ()))
    progress(dbmod.connect(quiet=True).describe())
    result = run(settings=s, progress=progress, figures=chosen)
    print(dumps(result, indent=1, default=str) if json else table(result))
    progress(f"benchmark done in {result['bench_seconds']:.0f} s")
    if check and any(g["status"] == "missed" for g in result["goals"]):
        return 1
    return 0
