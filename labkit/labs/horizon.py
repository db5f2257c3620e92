"""A long transaction anywhere holds the xmin horizon, and the queue's claims slow down.

A claim reads the front of the partial index of pending jobs.  Every job a worker claims
and completes leaves that index an entry pointing at a row version that is now dead.
Normally the next claim that walks over it finds the version dead to every snapshot and
marks the entry dead (the index scan's "kill_prior_tuple"), so later claims skip it without
visiting the table, and page pruning and VACUUM take the versions away.  A transaction that
keeps an old snapshot open -- a report under REPEATABLE READ idle in its transaction,
anywhere in the database -- holds the xmin horizon back: no version that died after its
snapshot was taken is dead to everyone, so no entry is marked dead, nothing is pruned,
VACUUM removes nothing, and every claim visits every job done since the report began.  A
transaction that has written, in any database of the server, holds back every snapshot's
xmin, and so every claim's scan; VACUUM of the job table counts only the sessions of its
own database, and removes the versions all the same (:func:`two_horizons`).

:func:`churn` runs real worker processes claiming and completing jobs, with or without such
a report open, and samples what one claim reads; :func:`horizon_trace` runs it both ways on
the same table size with the same workers, and :func:`plot` draws it;
:func:`who_holds_the_horizon` is the query that names the culprit; :func:`vacuum_removable`
shows VACUUM removing nothing while the report is open and everything once
``idle_in_transaction_session_timeout`` has ended it.  :func:`versions_scene` runs the same
story on ten jobs, with the transaction ids that wrote and replaced each row version, and
:func:`plot_versions` draws it: which versions VACUUM may remove, which it must keep, and
which index entries every claim reads.  :func:`index_recovery` is the clean-up after an
incident: VACUUM leaves the index its size, REINDEX INDEX CONCURRENTLY gives it back while
claims go on (:func:`reindex_runs`).  ``labkit trace horizon`` is :func:`horizon_command`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from ..core.checked import column_names, one_row
from ..core.db import WORKER_GUARDS, Guards, open_connection, session_name, wait_backends_gone
from ..core.errors import LabkitError
from ..core.lab import Lab
from ..core.limits import bulk, number
from ..core.procs import Context, Worker
from ..core.queries import query
from ..core.results import Result, not_json
from .claims import wait_for_horizon
from .production import fresh_table

if TYPE_CHECKING:
    from ..core.steps import Step
    from ..core.transcript import Transcript

LEASE_S = 60                 # a claim's lease: far longer than any run, so none runs out
SAMPLE_S = 0.5               # how often the parent samples what one claim reads
MAX_SECONDS = 600            # churn time of one run (of each phase in horizon_trace)
MAX_WORKERS = 16
REPORT_ROLE = "report"       # the long report's session: labkit:<schema>:report
WRITER_ROLE = "writer"       # the writer in another database: labkit:<schema>:writer
WORKER_ROLE = "churn-w"      # the workers' sessions: labkit:<schema>:churn-w1, ...
REPORT_MARGIN_S = 60         # the report ends itself this long after the run should have
# A run without the report is clean when, in none of its samples, a session other than the
# lab's own workers held the claim's horizon more than FOREIGN_AGE transactions back; on a
# shared server a run someone else held is run again, up to CLEAN_TRIES runs in all, and
# one still held after that says so (HorizonTrace.baseline_held_by, baseline_note).
FOREIGN_AGE = 200
CLEAN_TRIES = 3

# The backlog a run starts with: enough pending jobs that the workers never run dry.  A
# worker on a fast laptop claims and completes a few thousand jobs a second; a run longer
# than BACKLOG_S seconds is topped up as it goes, TOP_UP_S seconds of claims at a time.
JOBS_PER_WORKER_S = 5_000
MIN_JOBS = 10_000
MAX_JOBS = 2_000_000
BACKLOG_S = 30
TOP_UP_S = 10

_TUPLES = re.compile(r"tuples: (\d+) removed, (\d+) remain, (\d+) are dead but not yet removable")
_CUTOFF = re.compile(r"removable cutoff: (\d+)")
# A catalog every database shares: VACUUM computes its cutoff from the sessions of every
# database, where for a table of one database it counts that database's sessions only.
SHARED_CATALOG = "pg_catalog.pg_database"


def check_params(*, seconds: float, workers: int) -> None:
    """The bounds of a churn run, checked before anything is created."""
    number("seconds", seconds, low=1, high=MAX_SECONDS, unit=" s", example=4)
    number("workers", workers, low=1, high=MAX_WORKERS, whole=True, example=2)


def backlog(seconds: float, workers: int) -> int:
    """How many pending jobs a run of ``seconds`` with ``workers`` workers starts with."""
    want = math.ceil(min(seconds, BACKLOG_S) * workers * JOBS_PER_WORKER_S)
    return int(min(MAX_JOBS, max(MIN_JOBS, want)))


def create_queue(lab: Lab, jobs: int) -> None:
    """The production job table (production.sql "table") made afresh, holding ``jobs``
    pending jobs (horizon.sql "fill"), analyzed."""
    fresh_table(lab)
    bulk(lab, query("horizon.sql", "fill").sql, {"n": jobs}, rows=jobs)
    lab.execute("ANALYZE job")


# -- the worker process --------------------------------------------------------------------------


def churn_worker(ctx: Context, dsn: str, schema: str, role: str, lease_s: float = LEASE_S) -> dict:
    """The body of a worker process, one connection per run: connect, wait at the ``ready``
    pause for the monotonic time to stop at (None: end), then claim (production.sql
    "claim") and complete (production.sql "complete"), each its own transaction, as fast as
    it can until then; disconnect (the server sends the session's statistics as it ends)
    and report ``run_done``.  ``progress`` events carry ``(time, claim ms)`` per claim, the
    claim statement alone timed."""
    claim = query("production.sql", "claim").sql
    complete = query("production.sql", "complete").sql
    runs = 0
    while True:
        with open_connection(dsn, schema=schema, role=role, guards=WORKER_GUARDS) as conn:
            ctx.emit("connected", pid=conn.info.backend_pid, run=runs + 1)
            end = ctx.pause("ready")
            if end is None:
                return {"runs": runs}
            runs += 1
            samples: list[tuple[float, float]] = []
            dry = 0
            sent = time.monotonic()
            while (now := time.monotonic()) < end:
                t0 = time.perf_counter()
                row = conn.execute(claim, {"worker": role, "lease_s": lease_s}).fetchone()
                ms = (time.perf_counter() - t0) * 1000
                if row is None:
                    dry += 1
                    time.sleep(0.005)
                    continue
                samples.append((now, ms))
                conn.execute(complete, {"id": row[0], "claim_version": row[5]})
                if now - sent >= 0.25:
                    ctx.emit("progress", run=runs, samples=samples)
                    samples, sent = [], now
            ctx.emit("progress", run=runs, samples=samples)
        ctx.emit("run_done", run=runs, dry=dry)


def _start_workers(lab: Lab, workers: int, procs: list[Worker]) -> None:
    """Start the worker processes, each added to ``procs`` before it starts (so that the
    caller's clean-up kills it, even if Ctrl-C comes in the middle)."""
    for i in range(workers):
        w = Worker(churn_worker, name=f"churn {i + 1}", dsn=lab.db.dsn, schema=lab.schema,
                   role=f"{WORKER_ROLE}{i + 1}", lease_s=LEASE_S)
        procs.append(w)
        w.start()


def _stop_workers(procs: list[Worker], timeout: float = 10.0) -> None:
    """End workers that wait at their ``ready`` pause; kill any other."""
    for w in procs:
        if w.alive:
            w.resume(None)
    deadline = time.monotonic() + timeout
    for w in procs:
        while w.alive and time.monotonic() < deadline:
            w.poll(0.05)
        w.kill()


def _wait_gone(lab: Lab, pids: list[int], timeout: float = 10.0) -> None:
    """Until the server shows none of these sessions (a session's last statistics are sent
    as its backend exits)."""
    wait_backends_gone(lab.admin, pids, timeout=timeout, what="the lab's closed sessions")


# -- the long report -----------------------------------------------------------------------------


def open_report(lab: Lab, *, lasts_s: float) -> psycopg.Connection:
    """The report that holds the horizon: a session of its own (labkit:<schema>:report)
    that begins a REPEATABLE READ transaction, counts the jobs and then sits idle in
    transaction (horizon.sql "report").  Its ``idle_in_transaction_session_timeout`` ends it
    ``lasts_s`` seconds after its last statement, so nothing can hold the horizon for ever."""
    guards = Guards(lock_timeout="10s", statement_timeout="60s",
                    idle_in_transaction=f"{math.ceil(lasts_s)}s")
    conn = lab.connect(role=REPORT_ROLE, guards=guards)
    try:
        for s in query("horizon.sql", "report").statements:
            conn.execute(s)
    except BaseException:
        conn.close()
        raise
    return conn


@dataclass(frozen=True)
class HolderInfo(Result):
    """A session as pg_stat_activity shows it (:func:`holder_info`): the one that held the
    horizon, read while it was still open.

    pid: its backend's process id.
    database: the database it is connected to.
    application_name: its application_name (``labkit:<schema>:report`` for the lab's report).
    state: what it was doing (``idle in transaction`` for a holder between statements).
    xmin_age: how many transactions old its snapshot's xmin is; None when it has no snapshot.
    xid_age: how many transactions old its transaction id is; None when it has none.
    backend_xmin: its snapshot's xmin, a 32-bit xid as text; None when it has no snapshot.
    backend_xid: its transaction id, a 32-bit xid as text; None when it has none.
    """

    pid: int
    database: str | None
    application_name: str
    state: str | None
    xmin_age: int | None
    xid_age: int | None
    backend_xmin: str | None
    backend_xid: str | None


def holder_info(lab: Lab, pid: int) -> HolderInfo | None:
    """The session ``pid`` as pg_stat_activity shows it (horizon.sql "holder"); None when the
    server shows no such session."""
    rows = lab.execute(query("horizon.sql", "holder").sql, {"pid": pid})
    if not rows:
        return None
    pid, database, app, state, xmin_age, xid_age, xmin, xid = rows[0]
    return HolderInfo(pid=pid, database=database, application_name=app, state=state,
                      xmin_age=xmin_age, xid_age=xid_age, backend_xmin=xmin, backend_xid=xid)


def snapshot_xmin(conn: psycopg.Connection) -> str:
    """The xmin of the snapshot of ``conn``'s open transaction (horizon.sql "snapshot_xmin"),
    as text: what pg_stat_activity shows as that session's ``backend_xmin``."""
    return one_row(conn.execute(query("horizon.sql", "snapshot_xmin").sql), "horizon.sql's snapshot_xmin")[0]


def _plain(v: Any) -> Any:
    return float(v) if isinstance(v, Decimal) else v


@dataclass(frozen=True)
class HorizonHolder(Result):
    """A session that holds an xmin horizon back, as :func:`who_holds_the_horizon` names it
    (a row of horizon.sql "who_holds_the_horizon").

    pid: its backend's process id.
    datname: its database (None for a physical standby's walsender).
    application_name: its application_name.
    backend_type: ``client backend``, ``walsender``, ...
    state: what it is doing (``idle in transaction``, ``active``, ...).
    holds_back: where it counts: "this database" or "its own database" for a snapshot,
        "every snapshot on the server" for a transaction id, "every database" for a physical
        standby's walsender, "the catalogs (a logical slot)" for a logical one.
    backend_xmin: its snapshot's xmin, a 32-bit xid as text; None when it has no snapshot.
    backend_xid: its transaction id, a 32-bit xid as text; None when it has none.
    xmin_age: how many transactions old its snapshot's xmin is; None without a snapshot.
    xid_age: how many transactions old its transaction id is; None without one.
    xact_age_s: seconds since its transaction began (None outside a transaction).
    in_state_s: seconds since its state last changed.
    last_query: the first 60 characters of its last statement.
    """

    pid: int
    datname: str | None
    application_name: str
    backend_type: str
    state: str | None
    holds_back: str
    backend_xmin: str | None
    backend_xid: str | None
    xmin_age: int | None
    xid_age: int | None
    xact_age_s: float | None
    in_state_s: float | None
    last_query: str | None


def who_holds_the_horizon(lab: Lab, *, limit: int = 5) -> list[HorizonHolder]:
    """The sessions of every database of the server (walsenders included) that hold an xmin
    horizon back, oldest first, at most ``limit`` (horizon.sql "who_holds_the_horizon"): a
    :class:`HorizonHolder` each."""
    number("limit", limit, low=1, high=100, whole=True, example=5)
    cur = lab.admin.execute(query("horizon.sql", "who_holds_the_horizon").sql, {"limit": limit})
    cols = column_names(cur, "horizon.sql's who_holds_the_horizon")
    return [HorizonHolder(**dict(zip(cols, map(_plain, r)))) for r in cur.fetchall()]


@dataclass(frozen=True)
class OtherHorizonHolder(Result):
    """Something that holds the horizon with no session to show for it, as
    :func:`other_horizon_holders` names it (a row of horizon.sql "other_horizon_holders").

    kind: ``prepared transaction``, ``replication slot: xmin (every table)`` (a standby's
        hot_standby_feedback kept in its slot) or ``replication slot: catalog_xmin (system
        catalogs only)`` (a logical consumer's).
    name: the prepared transaction's gid, or the slot's name.
    database: its database (None for a physical slot).
    xmin_age: how many transactions old the xid it holds is.
    age_s: seconds since the transaction was prepared (None for a slot).
    """

    kind: str
    name: str
    database: str | None
    xmin_age: int | None
    age_s: float | None


def other_horizon_holders(lab: Lab) -> list[OtherHorizonHolder]:
    """What else holds the horizon with no session to show for it (horizon.sql
    "other_horizon_holders"): prepared transactions of every database and replication slots
    with an xmin, oldest first; an :class:`OtherHorizonHolder` each."""
    cur = lab.admin.execute(query("horizon.sql", "other_horizon_holders").sql)
    cols = column_names(cur, "horizon.sql's other_horizon_holders")
    return [OtherHorizonHolder(**dict(zip(cols, map(_plain, r)))) for r in cur.fetchall()]


# -- a writer in another database ----------------------------------------------------------------


class OtherDatabase:
    """Where the lab's writer runs: ``name`` (None: no other database could be used),
    ``created`` (a throw-away database of the lab's, dropped at the end), ``note`` (why
    there is none, or which existing one is used) and, once :meth:`begin` has run, ``conn``
    and ``statement`` (what the writer ran)."""

    def __init__(self, name: str | None, created: bool, note: str):
        self.name, self.created, self.note = name, created, note
        self.conn: psycopg.Connection | None = None
        self.statement = ""

    def begin(self, lab: Lab, *, lasts_s: float) -> psycopg.Connection:
        """Open the writer's session in this database (labkit:<schema>:writer) and leave it
        idle in a transaction that has written (horizon.sql "writer"; "writer_no_table" in a
        database that is not the lab's): it holds a transaction id until it ends.  Its
        ``idle_in_transaction_session_timeout`` ends it ``lasts_s`` seconds after its last
        statement, so nothing can hold the horizon for ever."""
        if self.name is None:
            raise LabkitError("There is no other database to open the writer in.",
                              "run it on a server where the role may create a database or "
                              "connect to one other than the lab's.")
        guards = Guards(lock_timeout="10s", statement_timeout="60s",
                        idle_in_transaction=f"{math.ceil(lasts_s)}s")
        self.conn = lab.db.connect(role=WRITER_ROLE, guards=guards, dbname=self.name,
                                   application_name=session_name(lab.schema, WRITER_ROLE))
        named = "writer" if self.created else "writer_no_table"
        try:
            if self.created:
                self.conn.execute(query("horizon.sql", "writer_table").sql)
            for s in query("horizon.sql", named).statements:
                self.conn.execute(s)
        except BaseException:
            self.close()
            raise
        self.statement = query("horizon.sql", named).statements[-1].strip()
        return self.conn

    def close(self) -> None:
        if self.conn is not None and not self.conn.closed:
            self.conn.close()


def throwaway_name(lab: Lab) -> str:
    """The name of the lab's throw-away database: its schema's, and ``_other``."""
    return f"{lab.schema[:57]}_other"


def _drop_database(lab: Lab, name: str) -> None:
    """Drop the lab's throw-away database, ending any session still in it first."""
    lab.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()", (name,))
    force = sql.SQL(" WITH (FORCE)") if lab.db.version_num >= 130000 else sql.SQL("")
    deadline = time.monotonic() + 10
    while True:
        try:
            lab.execute(sql.SQL("DROP DATABASE IF EXISTS {}{}").format(sql.Identifier(name), force))
            return
        except psycopg.errors.ObjectInUse:      # a session still leaving (before 13)
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@contextlib.contextmanager
def another_database(lab: Lab, *, create: bool = True,
                     prefer_existing: bool = False) -> Iterator[OtherDatabase]:
    """A database of the same server other than the lab's, for the writer: a throw-away one
    the lab creates (``create``; left over from an interrupted run, it is dropped first),
    or, where the role may not create a database, an existing one it may connect to
    (horizon.sql "other_databases", ``postgres`` first); when there is none, ``name`` is None
    and ``note`` says so.  ``prefer_existing``: an existing database first, and a
    throw-away one only when there is none (quicker: nothing is created).  At the end, even
    on error or Ctrl-C, the writer's session is closed (and waited for) and a throw-away
    database dropped."""
    other: OtherDatabase | None = None
    mine = throwaway_name(lab) if create else None
    try:
        if prefer_existing:
            rows = lab.execute(query("horizon.sql", "other_databases").sql)
            if rows:
                other = OtherDatabase(rows[0][0], False, f"the existing database {rows[0][0]}")
                mine = None
        if mine is not None:
            _drop_database(lab, mine)
            try:
                lab.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(mine)))
                other = OtherDatabase(mine, True, f"a throw-away database, {mine}, created for the lab")
            except psycopg.errors.InsufficientPrivilege:
                mine = None
        if other is None:
            rows = lab.execute(query("horizon.sql", "other_databases").sql)
            if rows:
                other = OtherDatabase(rows[0][0], False,
                                      f"the existing database {rows[0][0]} (this role may not create one)")
            else:
                other = OtherDatabase(None, False, "no other database: this role may not create one, "
                                      "and may connect to no database of this server but the lab's")
        yield other
    finally:
        pid = other.conn.info.backend_pid if other is not None and other.conn is not None \
            and not other.conn.closed else None
        if other is not None:
            other.close()
        if pid is not None:
            try:
                _wait_gone(lab, [pid])
            except LabkitError:
                lab.execute("SELECT pg_terminate_backend(%s)", (pid,))
        if mine is not None:
            _drop_database(lab, mine)


# -- measuring ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimExecution(Result):
    """One execution of the claim's SELECT, measured by the server (:func:`explain_claim`).

    buffers: the shared buffers (hit + read, 8 kB pages) its execution touched, planning not
        counted: index pages and table pages both count, and entries that point into the
        page the scan is already on do not count that page again.
    select_ms: its execution time on the server, in milliseconds.
    """

    buffers: int
    select_ms: float


def explain_claim(lab: Lab) -> ClaimExecution:
    """One execution of the claim's SELECT, measured by the server: EXPLAIN (ANALYZE,
    BUFFERS) of horizon.sql "claim_select" (the SELECT inside production.sql's claim, FOR
    UPDATE SKIP LOCKED included) in a transaction that is rolled back."""
    conn = lab.admin
    with conn.transaction(force_rollback=True):
        out = one_row(conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
                                   + query("horizon.sql", "claim_select").sql), "EXPLAIN of the claim")[0][0]
    plan = out["Plan"]
    return ClaimExecution(buffers=int(plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0)),
                          select_ms=round(float(out.get("Execution Time", 0.0)), 3))


def claim_buffers(lab: Lab) -> int:
    """The shared buffers one execution of the claim's SELECT touches (:func:`explain_claim`)."""
    return explain_claim(lab).buffers


def dead_tuples(lab: Lab) -> int:
    """pg_stat_user_tables.n_dead_tup of the job table: every row version replaced since
    the last VACUUM, removable or not (page pruning leaves a stub that still counts).  It
    lags: each session sends its counts at most once a second, and as it ends."""
    rows = lab.execute(query("horizon.sql", "dead_tuples").sql)
    return int(rows[0][1]) if rows else 0


def horizon_holder(lab: Lab) -> tuple[int | None, str | None]:
    """How many transactions back a client session other than this one and the lab's own
    workers holds the claim's horizon, and which session that is (horizon.sql
    "horizon_age"): the oldest snapshot of a session of this database, or the oldest
    transaction id of a session of any database, and the session as
    ``<application_name> (pid N, <state>) in database <name>``; (None, None) when no such
    session has one."""
    rows = lab.execute(query("horizon.sql", "horizon_age").sql,
                       {"workers": session_name(lab.schema, WORKER_ROLE)})
    if not rows:
        return None, None
    age, pid, datname, app, state = rows[0]
    return age, f"{app or '(no application_name)'} (pid {pid}, {state}) in database {datname}"


@dataclass(frozen=True)
class Durability(Result):
    """What each commit waits for, as the server runs it (:func:`durability`; SHOW's text).

    fsync: ``on`` or ``off``: whether the server forces its writes to disk.
    synchronous_commit: ``on``, ``off``, ``local``, ...: whether a commit waits for its WAL to
        reach the disk (or a standby) before it returns.
    """

    fsync: str
    synchronous_commit: str


def durability(lab: Lab) -> Durability:
    """What each commit waits for: fsync and synchronous_commit as the server runs them."""
    fsync, sync = lab.execute(query("horizon.sql", "durability").sql)[0]
    return Durability(fsync=fsync, synchronous_commit=sync)


@dataclass(frozen=True)
class VacuumReport(Result):
    """What one VACUUM (VERBOSE) said (:func:`vacuum`).  Where the role may not vacuum the
    table (a shared catalog, to a role that is not a superuser), the server skips it with a
    warning, and every figure is None or "".

    removed: the dead row versions VACUUM took away (read from its VERBOSE report,
        PostgreSQL 15 and later; None before).
    remain: the row versions its report says remain in the table after it: the live ones
        (counted where VACUUM read every page, estimated from the pages it read otherwise)
        and the dead ones it had to keep.
    not_yet_removable: the dead row versions it found but had to keep for an older snapshot.
    cutoff: its "removable cutoff", a 32-bit xid: a version whose replacing transaction is
        older may go.
    n_dead_tup: pg_stat_user_tables.n_dead_tup right after (VACUUM sets it, as it ends, to the
        dead versions it kept); the job table only, None for another.
    line: the report's tuples line (``tuples: ... removed, ... remain, ... are dead but not
        yet removable``).
    index_line: its line about the claim's index (``index "job_due_idx": pages: ... in
        total, ... newly deleted, ...``); "" when VACUUM did not scan the indexes.
    """

    removed: int | None
    remain: int | None
    not_yet_removable: int | None
    cutoff: int | None
    n_dead_tup: int | None
    line: str
    index_line: str


def vacuum(lab: Lab, table: str = "job") -> VacuumReport:
    """VACUUM (VERBOSE) the job table (or ``table``, schema-qualified where it must be), and
    what it said: a :class:`VacuumReport`."""
    notes: list[str] = []

    def note(diag: psycopg.errors.Diagnostic) -> None:
        notes.append(diag.message_primary or "")

    conn = lab.admin
    conn.add_notice_handler(note)
    try:
        conn.execute(sql.SQL("VACUUM (VERBOSE) {}").format(sql.Identifier(*table.split("."))))
    finally:
        conn.remove_notice_handler(note)
    text = "\n".join(notes)
    m, cut = _TUPLES.search(text), _CUTOFF.search(text)       # the table's own, before TOAST's
    line = next((ln.strip() for ln in text.splitlines() if ln.strip().startswith("tuples:")), "")
    index_line = next((ln.strip() for ln in text.splitlines()
                       if ln.strip().startswith('index "job_due_idx"')), "")
    return VacuumReport(removed=int(m.group(1)) if m else None,
                        remain=int(m.group(2)) if m else None,
                        not_yet_removable=int(m.group(3)) if m else None,
                        cutoff=int(cut.group(1)) if cut else None,
                        n_dead_tup=dead_tuples(lab) if table == "job" else None,
                        line=line, index_line=index_line)


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return round(s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))], 3)


def _runs_done(w: Worker) -> int:
    return sum(1 for e in w.events if e["kind"] == "run_done")


def _failure(w: Worker) -> str:
    failed = [e for e in w.events if e["kind"] == "failed"]
    return failed[-1]["error"] if failed else f"exit code {w.exitcode}"


def _hold_the_horizon(lab: Lab, hold_horizon: bool, other: OtherDatabase | None,
                      seconds: float) -> psycopg.Connection | None:
    """Open what holds the horizon for the run: the writer in ``other``, the report, or nothing."""
    if hold_horizon and other is not None:
        return other.begin(lab, lasts_s=seconds + REPORT_MARGIN_S)
    if hold_horizon:
        return open_report(lab, lasts_s=seconds + REPORT_MARGIN_S)
    return None


def _collect_progress(procs: list[Worker], samples: list, deadline: float) -> float:
    """Gather the workers' claim timings until ``deadline`` (a worker that stops is an error); the time then."""
    while (now := time.monotonic()) < deadline:
        for w in procs:
            for e in w.poll(0):
                if e["kind"] == "progress":
                    samples.extend(e["samples"])
            if not w.alive:
                raise LabkitError(f"Worker {w.name!r} stopped in the middle of the run "
                                  f"({_failure(w)}).", "read the error, then run it again.")
        time.sleep(min(0.02, max(0.0, deadline - now)))
    return now


def _sample_point(lab: Lab, now: float, t0: float) -> dict:
    """One point of the run's series: the claim's EXPLAIN, the dead tuples, and how far back
    and by whom the horizon was held."""
    age, holder = horizon_holder(lab)
    return {"t": round(now - t0, 3), **explain_claim(lab).as_dict(),
            "dead": dead_tuples(lab), "horizon_age": age, "horizon_holder": holder}


def _top_up_if_running_low(lab: Lab, jobs: int, claimed: int, now: float, t0: float, end: float,
                           last_run_at):
    """On a long run, add jobs before the workers run out; the jobs and the last run_at after it."""
    left = jobs - claimed
    rate = claimed / max(now - t0, 1e-3)
    if left < rate * TOP_UP_S / 2 and end - now > 1:        # a long run: top up
        n = int(min(MAX_JOBS, max(MIN_JOBS, rate * TOP_UP_S)))
        bulk(lab, query("horizon.sql", "top_up").sql, {"n": n, "after": last_run_at}, rows=n)
        last_run_at += timedelta(microseconds=n)
        jobs += n
    return jobs, last_run_at


def _claims_of_run(procs: list[Worker], run: dict[int, int]) -> tuple[list, int]:
    """Every claim timing the workers reported for this run, and how many claims found nothing."""
    samples = [s for w in procs for e in w.events
               if e["kind"] == "progress" and e["run"] == run[id(w)] for s in e["samples"]]
    dry = sum(e["dry"] for w in procs for e in w.events
              if e["kind"] == "run_done" and e["run"] == run[id(w)])
    return samples, dry


def _name_the_holder(lab: Lab, report: psycopg.Connection | None,
                     other: OtherDatabase | None) -> tuple[Any, list | None]:
    """Who held the horizon, and (a writer elsewhere) the rows that name it; then wait for the horizon."""
    held_by = holder_info(lab, report.info.backend_pid) if report is not None else None
    named = None
    if report is not None and other is not None:    # the query a reader runs names it
        named = [h for h in who_holds_the_horizon(lab, limit=100)
                 if h.pid == report.info.backend_pid]
        wait_for_horizon(lab)   # no session of this database is older: VACUUM's own cutoff
    elif report is None:
        wait_for_horizon(lab)   # on a shared server, someone else's snapshot would keep some
    return held_by, named


def _run(lab: Lab, procs: list[Worker], *, jobs: int, seconds: float, hold_horizon: bool,
         other: OtherDatabase | None = None) -> dict:
    """One timed run of workers waiting at their ``ready`` pause, on a filled table; with
    ``hold_horizon``, the report holds the horizon (or, given ``other``, a writer idle in a
    transaction in that database)."""
    run = {id(w): _runs_done(w) + 1 for w in procs}
    for w in procs:
        w.wait_for("paused", count=run[id(w)], tag="ready", timeout=60)
    pids = [w.wait_for("connected", run=run[id(w)], timeout=60)["pid"] for w in procs]
    last_run_at = lab.execute("SELECT max(run_at) FROM job")[0][0]
    report = None
    try:
        report = _hold_the_horizon(lab, hold_horizon, other, seconds)
        t0 = time.monotonic()
        end = t0 + seconds
        for w in procs:
            w.resume(end)
        samples: list[tuple[float, float]] = []
        series: list[dict] = []
        next_at = t0 + SAMPLE_S
        while time.monotonic() < end:
            now = _collect_progress(procs, samples, min(next_at, end))
            if now >= end:
                break
            series.append(_sample_point(lab, now, t0))
            next_at += SAMPLE_S
            jobs, last_run_at = _top_up_if_running_low(lab, jobs, len(samples), now, t0, end,
                                                       last_run_at)
        for w in procs:
            w.wait_for("run_done", run=run[id(w)], timeout=60)
        samples, dry = _claims_of_run(procs, run)
        _wait_gone(lab, pids)                   # every count is in the statistics now
        held_by, named = _name_the_holder(lab, report, other)
        dead = dead_tuples(lab)
        # the horizons as they stand with the holder still open: a new snapshot's xmin here
        # (the oldest transaction running anywhere on the server), VACUUM's cutoff on the job
        # table (this database's horizon), and, with a holder, its cutoff on a catalog every
        # database shares (every database's)
        snap = int(lab.execute(query("horizon.sql", "snapshot_xmin").sql)[0][0])
        vac = vacuum(lab)                       # with the report still open
        shared = vacuum(lab, SHARED_CATALOG).cutoff if report is not None else None
    finally:
        if report is not None:
            report.close()
    return {"t0": t0, "samples": samples, "series": series, "held_by": held_by, "dry": dry,
            "dead": dead, "vacuum": vac, "jobs": jobs, "named": named,
            "snapshot_xmin": snap, "shared_cutoff": shared}


@dataclass(frozen=True)
class SeriesPoint(Result):
    """One sample of a churn run, taken by the parent about every ``SAMPLE_S`` seconds.

    t: seconds into the run.
    claim_ms: the median claim, in milliseconds (the claim statement alone, timed in the
        worker), over the claims since the previous sample; None when there was none.
    claims: how many claims the workers made since the previous sample.
    buffers: the shared buffers one execution of the claim's SELECT touched then
        (:func:`explain_claim`).
    select_ms: that execution's time on the server, in milliseconds.
    dead: pg_stat_user_tables.n_dead_tup of the job table then (it lags by about a second).
    horizon_age: how many transactions back a session other than the lab's workers held the
        claim's horizon then (:func:`horizon_holder`); None when none did.
    horizon_holder: that session, as ``<application_name> (pid N, <state>) in database
        <name>``; None when none held it.
    """

    t: float
    claim_ms: float | None
    claims: int
    buffers: int
    select_ms: float
    dead: int
    horizon_age: int | None
    horizon_holder: str | None


@dataclass(frozen=True)
class ChurnRun(Result):
    """One churn run: worker processes claiming and completing jobs on a fresh job table,
    with or without something holding the xmin horizon (:func:`churn`).

    claims: the claims that took a job, all workers together.
    claims_per_s: those per second of the run.
    claim_ms_p50: the median claim, in milliseconds (the claim statement alone, timed in the
        worker); None without a claim.
    claim_ms_p99: the 99th percentile of the same.
    buffers_per_claim: the median, over the samples taken in the last third of the run, of
        the shared buffers one execution of the claim's SELECT touched (:func:`explain_claim`).
    select_ms: the same samples' median execution time of that SELECT on the server, in
        milliseconds (what the walk costs, without the commit and the round trip).
    dead_tuples: n_dead_tup once the run was over and every worker's session had ended (every
        version replaced, removable or not).
    unremovable: the dead versions a VACUUM run right then (the holder still open) found but
        could not remove.
    vacuum_line: that VACUUM's tuples line.
    claim_xmin: the xmin of a snapshot taken in the lab's database just before that VACUUM
        (the oldest transaction then running anywhere on the server, as for a claim's own
        snapshot), a 32-bit xid.
    vacuum_cutoff: that VACUUM's removable cutoff (this database's horizon), a 32-bit xid.
    shared_cutoff: with a holder open, VACUUM's removable cutoff on a catalog every database
        shares (``SHARED_CATALOG``); None without a holder, or where the role may not vacuum it.
    ran_dry: claims that found no job (0: the backlog was enough).
    jobs: the table's pending jobs at the start, plus any top up.
    series: the samples, in order (:class:`SeriesPoint`).
    horizon_held_by: the holder as pg_stat_activity showed it at the end of the run (its pid,
        database, application_name, state, ages and xids); None without one.
    named_by_query: the rows of :func:`who_holds_the_horizon` that named the holder, read
        while it was open (a writer in another database only; None otherwise).
    workers: how many worker processes ran.
    seconds: how long they ran.
    """

    claims: int
    claims_per_s: float
    claim_ms_p50: float | None
    claim_ms_p99: float | None
    buffers_per_claim: float | None
    select_ms: float | None
    dead_tuples: int
    unremovable: int | None
    vacuum_line: str
    claim_xmin: int
    vacuum_cutoff: int | None
    shared_cutoff: int | None
    ran_dry: int
    jobs: int
    series: list[SeriesPoint]
    horizon_held_by: HolderInfo | None
    named_by_query: list[HorizonHolder] | None
    workers: int
    seconds: float


@dataclass(frozen=True)
class HorizonRun(ChurnRun):
    """One of :func:`horizon_trace`'s two runs: the fields of :class:`ChurnRun`, and

    runs: how many runs it took to get it (a run someone else's transaction held back is run
        again, up to ``CLEAN_TRIES``).
    someone_else: for the run without a holder, who else held the claim's horizon back in
        it, as the lab saw it (:func:`someone_else`); None when no one did, and for the run
        with a holder.
    set_aside: for the run without a holder, who else held the horizon in each run of it
        that was done again, in order; empty when the first run was kept.
    """

    runs: int
    someone_else: str | None
    set_aside: list[str]


def _summary(raw: dict, *, seconds: float) -> dict[str, Any]:
    """The fields of a :class:`ChurnRun` but ``workers`` and ``seconds``, from :func:`_run`'s."""
    t0, samples, series = raw["t0"], raw["samples"], raw["series"]
    ms = [m for _, m in samples]
    out_series = []
    lo = 0.0
    for p in series:
        inside = [m for t, m in samples if lo <= t - t0 < p["t"]]
        out_series.append(SeriesPoint(t=p["t"], claim_ms=round(statistics.median(inside), 3) if inside else None,
                                      claims=len(inside), buffers=p["buffers"], select_ms=p["select_ms"],
                                      dead=p["dead"], horizon_age=p["horizon_age"],
                                      horizon_holder=p["horizon_holder"]))
        lo = p["t"]
    late = [p for p in series if p["t"] >= seconds * 2 / 3] or series[-1:]
    vac: VacuumReport = raw["vacuum"]
    return {
        "claims": len(samples),
        "claims_per_s": round(len(samples) / seconds, 1),
        "claim_ms_p50": _pct(ms, 0.50),
        "claim_ms_p99": _pct(ms, 0.99),
        "buffers_per_claim": statistics.median(p["buffers"] for p in late) if late else None,
        "select_ms": statistics.median(p["select_ms"] for p in late) if late else None,
        "dead_tuples": raw["dead"],
        "unremovable": vac.not_yet_removable,
        "vacuum_line": vac.line,
        "claim_xmin": raw["snapshot_xmin"],
        "vacuum_cutoff": vac.cutoff,
        "shared_cutoff": raw["shared_cutoff"],
        "ran_dry": raw["dry"],
        "jobs": raw["jobs"],
        "series": out_series,
        "horizon_held_by": raw["held_by"],
        "named_by_query": raw["named"],
    }


def churn(lab: Lab, *, seconds: float, workers: int = 2, hold_horizon: bool,
          jobs: int | None = None) -> ChurnRun:
    """``workers`` worker processes claim and complete jobs for ``seconds`` seconds on a
    fresh production job table of ``jobs`` pending jobs (by default enough that they never
    run dry; a long run is topped up as it goes), with (``hold_horizon=True``) or without a
    report holding the xmin horizon: a session of its own (labkit:<schema>:report) that
    began a REPEATABLE READ transaction, counted the jobs, and sits idle in transaction for
    the whole run.

    Returns a :class:`ChurnRun`: the claims and their latency, what one claim read (sampled
    every ~0.5 s), the dead versions and what a VACUUM run at the end could not remove, the
    samples, and the report as the server showed it at the end of the run."""
    check_params(seconds=seconds, workers=workers)
    jobs = backlog(seconds, workers) if jobs is None else int(
        number("jobs", jobs, low=1, high=MAX_JOBS, whole=True, example=MIN_JOBS))
    procs: list[Worker] = []
    try:
        _start_workers(lab, workers, procs)
        create_queue(lab, jobs)                  # while the workers start
        raw = _run(lab, procs, jobs=jobs, seconds=seconds, hold_horizon=hold_horizon)
        _stop_workers(procs)
    finally:
        for w in procs:
            w.kill()
    return ChurnRun(**_summary(raw, seconds=seconds), workers=workers, seconds=seconds)


# -- both runs, and the figure --------------------------------------------------------------------


def someone_else(run: ChurnRun) -> str | None:
    """Who else held the claim's horizon back during a run without the report, as the lab
    saw it: of the samples in which a session other than the lab's workers held it more
    than ``FOREIGN_AGE`` transactions back, the one furthest back, as ``<session>, N
    transactions back at T s``; None when no sample had one.  Every sample of the run
    counts, the first as much as the last: the claims made while someone held the horizon
    left entries no scan could mark dead, and every later claim reads them."""
    held = [p for p in run.series if p.horizon_age is not None and p.horizon_age > FOREIGN_AGE]
    if not held:
        return None
    worst = max(held, key=lambda p: p.horizon_age or 0)
    return f"{worst.horizon_holder}, {worst.horizon_age:,} transactions back at {worst.t:g} s"


@dataclass(frozen=True)
class HorizonTrace(Result):
    """:func:`horizon_trace`: the same churn run without and then with something holding the
    horizon, side by side.  Each ``..._without`` / ``..._with`` pair is that figure of
    :class:`ChurnRun` for the run without and the run with the holder (``_with`` None when
    there was no run with it); xids are 32-bit, as the server shows them.

    claim_ms_p50_without, claim_ms_p50_with: the median claim, in milliseconds.
    claim_ms_p99_without, claim_ms_p99_with: its 99th percentile, in milliseconds.
    buffers_per_claim_without, buffers_per_claim_with: the buffers one claim's SELECT touched
        (a median over the last third of the run).
    select_ms_without, select_ms_with: that SELECT's execution time on the server, in ms.
    claims_without, claims_with: the claims that took a job.
    dead_tuples_without, dead_tuples_with: n_dead_tup at the end of the run.
    unremovable_without, unremovable_with: the dead versions VACUUM at the end could not remove.
    claim_xmin_without, claim_xmin_with: the xmin of a new snapshot in the lab's database at
        the end (the oldest transaction then running anywhere on the server).
    vacuum_cutoff_without, vacuum_cutoff_with: VACUUM's removable cutoff on the job table
        (this database's horizon).
    shared_cutoff_without, shared_cutoff_with: VACUUM's cutoff on a catalog every database
        shares (None without a holder, or where the role may not vacuum it).
    horizon_age_without, horizon_age_with: how far back, at most, a session other than the
        lab's workers held the claim's horizon during the run, in transactions (with the
        holder, the holder's; without it, None or small, unless someone else's transaction
        held the horizon then); None when no sample had one.
    baseline_held_by: who else held the claim's horizon back during the run without a
        holder, in every one of its runs (``without.runs``), as the lab saw it in the last
        (:func:`someone_else`): that run is not a clean baseline.  None when the run kept
        was clean.
    horizon_held_by: the holder, as "labkit:<schema>:report (idle in transaction)" (and
        " in database <name>" for a writer in another database); None without one.
    holder: the holder as pg_stat_activity showed it at the end of the run (its pid,
        database, application_name, state, xmin_age, xid_age, backend_xmin and backend_xid);
        None without one.
    holder_xid: what it held, as a 32-bit xid: the writer's transaction id, or the report's
        snapshot xmin; None without a holder.
    durability: what each commit waited for (fsync and synchronous_commit).
    server: the server's PostgreSQL version.
    seconds: the churn time of each run, in seconds.
    workers: the worker processes of each run.
    jobs: the pending jobs each run's table started with.
    without: the run without a holder, whole (its series included).
    with_: the run with the holder, whole; None when there was none.  Its JSON key is ``with``.
    """

    claim_ms_p50_without: float | None
    claim_ms_p50_with: float | None
    claim_ms_p99_without: float | None
    claim_ms_p99_with: float | None
    buffers_per_claim_without: float | None
    buffers_per_claim_with: float | None
    select_ms_without: float | None
    select_ms_with: float | None
    claims_without: int
    claims_with: int | None
    dead_tuples_without: int
    dead_tuples_with: int | None
    unremovable_without: int | None
    unremovable_with: int | None
    claim_xmin_without: int
    claim_xmin_with: int | None
    vacuum_cutoff_without: int | None
    vacuum_cutoff_with: int | None
    shared_cutoff_without: int | None
    shared_cutoff_with: int | None
    horizon_age_without: int | None
    horizon_age_with: int | None
    baseline_held_by: str | None
    horizon_held_by: str | None
    holder: HolderInfo | None
    holder_xid: int | None
    durability: Durability
    server: str
    seconds: float
    workers: int
    jobs: int
    without: HorizonRun
    with_: HorizonRun | None

    def as_dict(self, only: Iterable[str] | None = None) -> dict[str, Any]:
        """The fields as plain values (see :class:`~labkit.core.results.Result`), ``with_``
        under its JSON key, ``with``."""
        names = None if only is None else ["with_" if n == "with" else n for n in only]
        return {("with" if k == "with_" else k): v for k, v in super().as_dict(names).items()}


@dataclass(frozen=True)
class HorizonTraceElsewhere(HorizonTrace):
    """:func:`horizon_trace` with ``other_database``: the horizon held by a writer idle in a
    transaction in another database of the server.  The fields of :class:`HorizonTrace`, and

    holder_database: the writer's database; None when there was no other database to use
        (and then no run with it: ``note`` says why).
    other_database_created: whether it was a throw-away database the lab created (and
        dropped), or an existing one.
    note: where the writer ran, or why it could not.
    writer_statement: the statement the writer ran last, in its open transaction; None
        without a writer.
    holders: the rows of :func:`who_holds_the_horizon` that named the writer, read while it
        was open; None without a run with it.
    vacuum_unremovable_with: what VACUUM VERBOSE on the job table found dead but not yet
        removable then, once no session of the lab's database held its own cutoff back.
    vacuum_line_with: that VACUUM's tuples line.
    """

    holder_database: str | None
    other_database_created: bool
    note: str
    writer_statement: str | None
    holders: list[HorizonHolder] | None
    vacuum_unremovable_with: int | None
    vacuum_line_with: str | None


def _run_is_clean(run: HorizonRun, hold: bool) -> bool:
    """Whether a run measured what it should: without a holder, nobody else held the horizon
    in any of its samples; with one, its closing VACUUM removed every dead version."""
    if hold:
        return not run.unremovable      # (the writer elsewhere: see horizon_trace)
    return run.someone_else is None


def _clean_run(lab: Lab, procs: list[Worker], *, jobs: int, seconds: float, workers: int,
               hold: bool, other: OtherDatabase | None) -> HorizonRun:
    """One of the two runs on a fresh table, run again (up to ``CLEAN_TRIES`` in all) while it
    is not clean; the run without a holder says who else held the horizon, in the run kept
    (``someone_else``) and in each run set aside (``set_aside``)."""
    tries = CLEAN_TRIES if not hold or other is not None else 1
    set_aside: list[str] = []
    for attempt in range(1, tries + 1):
        if attempt > 1:                 # someone else held it: let them finish
            with contextlib.suppress(LabkitError):
                wait_for_horizon(lab)
        create_queue(lab, jobs)
        raw = _run(lab, procs, jobs=jobs, seconds=seconds, hold_horizon=hold, other=other)
        run = HorizonRun(**_summary(raw, seconds=seconds), workers=workers, seconds=seconds,
                         runs=attempt, someone_else=None, set_aside=list(set_aside))
        if not hold:
            run = dataclasses.replace(run, someone_else=someone_else(run))
        if _run_is_clean(run, hold):
            break
        if run.someone_else is not None:
            set_aside.append(run.someone_else)
    return run


def _writer_fields(other: OtherDatabase | None) -> dict[str, Any]:
    """Where the writer in another database ran (nothing without one)."""
    return {} if other is None else {
        "holder_database": other.name, "other_database_created": other.created, "note": other.note,
        "writer_statement": other.statement or None}


def _side_by_side(without: HorizonRun, ran: HorizonRun | None) -> dict[str, Any]:
    """Each figure of the two runs side by side (``_with`` None without that run), and the
    oldest horizon other sessions held during each."""
    fields: dict[str, Any] = {}
    for key in ("claim_ms_p50", "claim_ms_p99", "buffers_per_claim", "select_ms", "claims",
                "dead_tuples", "unremovable", "claim_xmin", "vacuum_cutoff", "shared_cutoff"):
        fields[f"{key}_without"] = getattr(without, key)
        fields[f"{key}_with"] = getattr(ran, key) if ran else None
    for name, one in (("without", without), ("with", ran)):    # was the run without one clean?
        ages = [p.horizon_age for p in (one.series if one else []) if p.horizon_age is not None]
        fields[f"horizon_age_{name}"] = max(ages, default=None)
    return fields


def _holder_fields(held, other_database: bool) -> dict[str, Any]:
    """Who held the horizon in the run with a holder: its name and state, the row, its transaction id."""
    where = f" in database {held.database}" if other_database and held else ""
    return {
        "horizon_held_by": f"{held.application_name} ({held.state}){where}" if held else None,
        "holder": held,
        "holder_xid": (int(held.backend_xid or held.backend_xmin or 0) or None) if held else None,
    }


def _elsewhere_fields(ran: HorizonRun | None) -> dict[str, Any]:
    """What the run with the writer in another database found: who named it, what VACUUM kept."""
    return {"holders": ran.named_by_query if ran else None,
            "vacuum_unremovable_with": ran.unremovable if ran else None,
            "vacuum_line_with": ran.vacuum_line if ran else None}


def horizon_trace(lab: Lab, *, seconds: float = 4, workers: int = 2, other_database: bool = False,
                  create_database: bool = True) -> HorizonTrace:
    """:func:`churn` twice with the same workers (started once) on a fresh table of the
    same size: first with no report open, then with one holding the horizon -- or, with
    ``other_database``, with a writer idle in a transaction in another database of the same
    server (:func:`another_database`: a throw-away one, or with ``create_database=False`` or
    where the role may not create one, an existing one; dropped or left as it was at the end).

    Returns a :class:`HorizonTrace` (with ``other_database``, a
    :class:`HorizonTraceElsewhere`): each figure of the two runs side by side, the holder,
    what was measured under, and each run whole.  On a shared server, a run without the
    report that someone else's long transaction held back in any of its samples
    (:func:`someone_else`) is run again, up to ``CLEAN_TRIES`` runs in all: ``without.runs``
    says how many it took, ``without.set_aside`` who held the runs set aside, and
    ``baseline_held_by`` who held the last when every run was held (:func:`baseline_note`
    says it in a sentence).  So
    is a run with the writer in another database whose closing VACUUM a statement of someone
    else's, in flight in the lab's database, made keep some versions (its snapshot is no
    newer than the writer's id): ``with_.runs``."""
    check_params(seconds=seconds, workers=workers)
    jobs = backlog(seconds, workers)
    procs: list[Worker] = []
    out: dict[str, HorizonRun] = {}
    with contextlib.ExitStack() as stack:
        other = stack.enter_context(another_database(lab, create=create_database)) if other_database else None
        try:
            _start_workers(lab, workers, procs)
            for name, hold in (("without", False), ("with", True)):
                if hold and other is not None and other.name is None:
                    break                   # nowhere to open the writer: said in ``note``
                out[name] = _clean_run(lab, procs, jobs=jobs, seconds=seconds, workers=workers,
                                       hold=hold, other=other)
            _stop_workers(procs)
        finally:
            for w in procs:
                w.kill()
        extra = _writer_fields(other)
    without, ran = out["without"], out.get("with")
    held = ran.horizon_held_by if ran else None
    fields = _side_by_side(without, ran)
    fields.update(
        baseline_held_by=without.someone_else,
        **_holder_fields(held, other_database),
        durability=durability(lab),
        server=lab.db.version,
        seconds=seconds, workers=workers, jobs=jobs,
        without=without, with_=ran,
    )
    if not other_database:
        return HorizonTrace(**fields)
    return HorizonTraceElsewhere(**fields, **extra, **_elsewhere_fields(ran))


def plot(result: HorizonTrace, ax=None):
    """Claim latency (left) and buffers per claim (right, on a linear axis: the growth is the
    point) over the run, without and with the report holding the horizon, from
    :func:`horizon_trace`'s result.  ``ax``: two matplotlib axes to draw on (None: a new
    figure).  Returns the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import StrMethodFormatter

    from ..core.plots import legend_below, setup_matplotlib

    setup_matplotlib()
    if ax is None:
        fig, (top, bottom) = plt.subplots(1, 2, figsize=(12, 6), sharex=True)
    else:
        top, bottom = ax
        fig = top.figure
    for run, label, style in ((result.without, "no long transaction", "-"),
                              (result.with_, "a REPEATABLE READ report idle in transaction", "-")):
        if run is None:
            raise LabkitError("This trace has no run with the horizon held: there is nothing to "
                              "draw it against.", "read its note for why, and draw a trace that has both runs.")
        series = run.series
        t = [p.t for p in series]
        top.plot(t, [p.claim_ms for p in series], style, marker="o", ms=3, label=label)
        bottom.plot(t, [p.buffers for p in series], style, marker="o", ms=3, label=label)
    top.set_ylabel("claim, median ms")
    top.set_ylim(bottom=0)
    bottom.set_ylabel("buffers one claim reads")
    bottom.set_ylim(bottom=0)
    bottom.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    for panel in (top, bottom):
        panel.set_xlabel("seconds into the run")
    legend_below(fig, top, ncol=1)
    d = result.durability
    fig.suptitle(f"The claim while a snapshot holds the xmin horizon: {result.workers} workers,\n"
                 f"PostgreSQL {result.server}, fsync={d.fsync}, "
                 f"synchronous_commit={d.synchronous_commit}")
    return fig


# The rows of :func:`runs_table`, each a figure of :func:`churn` (see there).
FIGURES = ("claims", "claim_ms_p50", "claim_ms_p99", "buffers_per_claim", "select_ms", "unremovable")


# The figures that are times, in milliseconds: printed with three decimals each.
TIMES = ("claim_ms_p50", "claim_ms_p99", "select_ms")
# The figures that are a median of buffers counted (half a buffer where the samples are
# even): printed rounded to a whole buffer.
BUFFERS = ("buffers_per_claim",)


def _figure(name: str, v: Any) -> str:
    if v is not None and name in TIMES:
        return f"{v:,.3f}"
    if v is not None and name.startswith(BUFFERS):
        return f"{round(v):,}"
    return _fmt(v)


def runs_table(result: HorizonTrace, held_by: str):
    """:func:`horizon_trace`'s two runs side by side, a row per figure (:data:`FIGURES`) and a
    column per run ("no long transaction", and ``held_by``): a pandas DataFrame of the
    numbers as text, counts as whole numbers, times (:data:`TIMES`) with three decimals, a
    median of buffers (:data:`BUFFERS`) rounded to a whole buffer; "-" for a figure a run has
    not."""
    import pandas as pd

    return pd.DataFrame({"no long transaction": [_figure(f, getattr(result, f"{f}_without")) for f in FIGURES],
                         held_by: [_figure(f, getattr(result, f"{f}_with")) for f in FIGURES]},
                        index=list(FIGURES))


def baseline_note(result: HorizonTrace) -> str:
    """One sentence on :func:`horizon_trace`'s run with no long transaction: clean (no session
    but the lab's workers held the claim's horizon more than ``FOREIGN_AGE`` transactions
    back in any of its samples), and how many runs it took; or, when someone else held it
    in every run, that it is no clean baseline and who held it, as the lab saw it."""
    run = result.without
    if result.baseline_held_by is not None:
        return (f"the run with no long transaction is not a clean baseline: another session "
                f"held the claim's horizon back in each of its {run.runs} runs, in the last "
                f"{result.baseline_held_by}; its figures include the walk that hold caused")
    where = f"in any of its {len(run.series)} samples" if len(run.series) != 1 else "in its one sample"
    note = (f"the run with no long transaction was clean: no other session held the claim's "
            f"horizon more than {FOREIGN_AGE} transactions back {where}")
    if run.set_aside:
        runs = "the run" if len(run.set_aside) == 1 else "each run"
        note += (f" (it took {run.runs} runs: someone else held the horizon in {runs} before "
                 f"it, {'; '.join(run.set_aside)})")
    return note


# The rows of :func:`two_horizons`: a field of :func:`horizon_trace`'s result, and its label.
# The cutoffs are the "removable cutoff" of VACUUM VERBOSE's output for that table.
HORIZONS = (("holder_xid", "the holder's xmin or xid"),
            ("claim_xmin_with", "a new snapshot's xmin here"),
            ("vacuum_cutoff_with", "removable cutoff: job"),
            ("shared_cutoff_with", "removable cutoff: pg_database"))
# The rows under them that say whether the holder held each horizon: a field of
# :class:`HorizonsHeld`, and its label.
HELD = (("snapshot_xmin", "the holder holds a new snapshot's xmin"),
        ("job_cutoff", "the holder holds job's cutoff"),
        ("shared_cutoff", "the holder holds pg_database's cutoff"))
# The last rows: what the holder cost, as in :func:`runs_table`.
HORIZON_COSTS = (("buffers_per_claim_with", "buffers one claim reads, median"),
                 ("unremovable_with", "VACUUM kept on job"))


@dataclass(frozen=True)
class HorizonsHeld(Result):
    """Which horizons the holder of a :func:`horizon_trace` run held back
    (:func:`horizons_held`).  The holder holds a horizon when that horizon is no newer than
    the holder's own xid (its snapshot's xmin, or its transaction id): then no version that
    died after the holder began may be marked dead or removed under it.  None where there is
    no such horizon (or no holder).

    snapshot_xmin: the xmin of a new snapshot in the lab's database, which every claim's
        scan tests the versions it meets against.
    job_cutoff: VACUUM's removable cutoff on the job table (this database's horizon).
    shared_cutoff: VACUUM's removable cutoff on a catalog every database shares (None where
        the role may not vacuum it).
    """

    snapshot_xmin: bool | None
    job_cutoff: bool | None
    shared_cutoff: bool | None


def horizons_held(result: HorizonTrace) -> HorizonsHeld:
    """Which horizons the holder of ``result``'s run with a holder held back: a
    :class:`HorizonsHeld`, each horizon compared with the holder's xid as the server compares
    xids (:func:`xid_newer`)."""
    def held(horizon: int | None) -> bool | None:
        if horizon is None or result.holder_xid is None:
            return None
        return not xid_newer(horizon, result.holder_xid)

    return HorizonsHeld(snapshot_xmin=held(result.claim_xmin_with),
                        job_cutoff=held(result.vacuum_cutoff_with),
                        shared_cutoff=held(result.shared_cutoff_with))


def two_horizons(report: HorizonTrace, writer: HorizonTrace):
    """The horizons a report in the lab's database and a writer in another database held,
    side by side, from two :func:`horizon_trace` results (the second with
    ``other_database``): a row per :data:`HORIZONS` (the holder's snapshot xmin or
    transaction id; the xmin of a new snapshot in the lab's database, the oldest transaction
    running anywhere on the server; VACUUM's removable cutoff on the job table, this
    database's horizon, and on a catalog every database shares), xids as the server shows
    them (32-bit), "-" where there is none; a row per :data:`HELD`, "yes" or "no": whether
    the holder held that horizon (:func:`horizons_held`), so that nobody compares the xids
    by eye; and a row per :data:`HORIZON_COSTS` (what one claim read and what VACUUM
    kept).  The cutoffs are
    VACUUM VERBOSE's "removable cutoff".  A claim's scan marks an entry dead only for a
    version that died before both of the first two horizons: each holder held one.  A pandas
    DataFrame of text."""
    import pandas as pd

    def column(t: HorizonTrace) -> list[str]:
        held = horizons_held(t).as_dict()
        said = {True: "yes", False: "no", None: "-"}
        return ([_figure(k, getattr(t, k)) for k, _ in HORIZONS] + [said[held[k]] for k, _ in HELD]
                + [_figure(k, getattr(t, k)) for k, _ in HORIZON_COSTS])

    return pd.DataFrame({"report here": column(report), "writer elsewhere": column(writer)},
                        index=[label for _, label in HORIZONS + HELD + HORIZON_COSTS])


def xid_newer(a: int, b: int) -> bool:
    """Whether 32-bit transaction id ``a`` is newer than ``b`` (modulo 2^32, as the server
    compares them)."""
    return 0 < (a - b) % 2**32 < 2**31


# -- VACUUM while the report is open, and after -------------------------------------------------


@dataclass(frozen=True)
class VacuumRemovable(Result):
    """VACUUM while the report holds the horizon, and after the server ended the report
    (:func:`vacuum_removable`).  Counts are row versions of the job table.

    jobs: the jobs worked off while the report was open.
    dead_versions: the dead versions that left (2 per job: PENDING and RUNNING).
    holder: the report as pg_stat_activity showed it while it was open.
    removed_while_held: the dead versions VACUUM removed with the report open.
    remain_while_held: the row versions its report says remain in the table: the live ones
        and the dead ones it kept.
    not_removable_while_held: those it found but had to keep.
    n_dead_tup_while_held: n_dead_tup right after that VACUUM.
    line_while_held: that VACUUM's tuples line.
    removed_after: the dead versions VACUUM removed once the report had ended.
    remain_after: the row versions its report says remain in the table then.
    not_removable_after: those it still had to keep.
    n_dead_tup_after: n_dead_tup right after that VACUUM.
    line_after: that VACUUM's tuples line.
    ended_by: the setting that ended the report
        (``idle_in_transaction_session_timeout = 1s``).
    ended_after_s: seconds from setting it to the server showing the session gone.
    """

    jobs: int
    dead_versions: int
    holder: HolderInfo | None
    removed_while_held: int | None
    remain_while_held: int | None
    not_removable_while_held: int | None
    n_dead_tup_while_held: int | None
    line_while_held: str
    removed_after: int | None
    remain_after: int | None
    not_removable_after: int | None
    n_dead_tup_after: int | None
    line_after: str
    ended_by: str
    ended_after_s: float


def vacuum_removable(lab: Lab, *, jobs: int = 1000, timeout_s: float = 1) -> VacuumRemovable:
    """VACUUM can remove no row version that died after the report's snapshot was taken,
    and all of them once the report is gone.

    A fresh table of ``jobs`` pending jobs, autovacuum off for it (only the VACUUMs shown
    run), vacuumed; the report opens (:func:`open_report`); on a session of its own the
    whole queue is worked off (horizon.sql "work_off": two dead versions per job), and that
    session ends (so its counts are in the statistics).  VACUUM (VERBOSE) then removes
    nothing.  Then the fix: ``idle_in_transaction_session_timeout`` set to ``timeout_s`` in
    the report's session (horizon.sql "end_idle_reports"); the server ends the session once
    it has been idle that long; when no other transaction in the database is older than
    now, VACUUM runs again and removes them all.

    Returns a :class:`VacuumRemovable`: what each VACUUM removed and kept, and how the
    report ended."""
    number("jobs", jobs, low=1, high=100_000, whole=True, example=1000)
    number("timeout_s", timeout_s, low=0.1, high=30, unit=" s", example=1)
    create_queue(lab, jobs)
    lab.execute("ALTER TABLE job SET (autovacuum_enabled = off)")
    lab.execute("VACUUM job")
    report = open_report(lab, lasts_s=REPORT_MARGIN_S)
    try:
        pid = report.info.backend_pid
        with lab.connect(role=f"{WORKER_ROLE}1") as worker:
            wpid = worker.info.backend_pid
            for s in query("horizon.sql", "work_off").statements:
                worker.execute(s)
        _wait_gone(lab, [wpid])
        holder = holder_info(lab, pid)
        held = vacuum(lab)
        setting = f"{timeout_s:g}s" if float(timeout_s).is_integer() else f"{round(timeout_s * 1000)}ms"
        t = time.monotonic()
        report.execute(query("horizon.sql", "end_idle_reports").sql, {"timeout": setting})
        _wait_gone(lab, [pid], timeout=timeout_s + 30)
        ended_after = time.monotonic() - t
    finally:
        report.close()
    wait_for_horizon(lab)           # another session's older snapshot would keep them too
    after = vacuum(lab)
    return VacuumRemovable(
        jobs=jobs, dead_versions=2 * jobs, holder=holder,
        removed_while_held=held.removed, remain_while_held=held.remain,
        not_removable_while_held=held.not_yet_removable,
        n_dead_tup_while_held=held.n_dead_tup, line_while_held=held.line,
        removed_after=after.removed, remain_after=after.remain,
        not_removable_after=after.not_yet_removable,
        n_dead_tup_after=after.n_dead_tup, line_after=after.line,
        ended_by=f"idle_in_transaction_session_timeout = {setting}",
        ended_after_s=round(ended_after, 2),
    )


# -- the mechanism, drawn: row versions, index entries and the horizon ---------------------------

SCENE_ROLE = "scene"         # the scene's worker: labkit:<schema>:scene
MAX_SCENE_JOBS = 20          # a row each in the drawing
MARK_TRIES = 20              # claims, after the report ends, until one reads a single entry


def xact_id(conn: psycopg.Connection) -> int:
    """The transaction id of ``conn``'s open transaction (horizon.sql "xact_id"), as the
    64-bit number that only grows."""
    return int(one_row(conn.execute(query("horizon.sql", "xact_id").sql), "horizon.sql's xact_id")[0])


def wait_until_dead_to_all(lab: Lab, xid: int, *, timeout: float = 30.0) -> None:
    """Wait until no session still sees the row versions transaction ``xid`` replaced
    (horizon.sql "older_than": an older transaction id anywhere on the server, or an older
    snapshot in this database).  On a shared server someone else's long transaction can hold
    them; after ``timeout`` seconds, a LabkitError names it.  Then one transaction of the
    lab's own takes an id (horizon.sql "xact_id"), as some transaction always does on a live
    server: a session tests dead versions against a horizon it recomputes only once its
    snapshots' xmin has moved on, and on an idle server nothing else would move it."""
    deadline = time.monotonic() + timeout
    while old := lab.execute(query("horizon.sql", "older_than").sql, {"x": str(xid)}):
        if time.monotonic() > deadline:
            who = ", ".join((f"pid {pid} in {db}" if pid is not None else db)
                            + (f" open since {since:%H:%M:%S}" if since else "")
                            for pid, db, since in old[:5])
            raise LabkitError(f"{len(old)} transaction(s) or slot(s) on the server ({who}) still see row "
                              f"versions this lab has just replaced; waited {timeout:.0f} s for "
                              "them to end.",
                              "end that transaction (`labkit clean` ends your own idle ones) and "
                              "run the cell again.")
        time.sleep(0.05)
    lab.execute(query("horizon.sql", "xact_id").sql)


def entries_read(lab: Lab) -> int:
    """The index entries one claim reads: the claim's SELECT (horizon.sql "claim_select", FOR
    UPDATE SKIP LOCKED included) run once in a transaction that is rolled back, and the
    entries the server counted its scan of job_due_idx returning (horizon.sql
    "entries_read", read before and after).  An entry already marked dead is skipped
    without being counted; one whose version is dead but may not be marked yet is read,
    its table row visited and passed over; the scan stops at the first live one.  The
    transaction forbids sequential and bitmap scans: on a table of a few rows, once VACUUM
    has counted them, the planner would rather read the table, where a real queue's claim
    reads the index."""
    conn = lab.admin
    counted = query("horizon.sql", "entries_read").sql
    with conn.transaction(force_rollback=True):
        conn.execute("SET LOCAL enable_seqscan = off")
        conn.execute("SET LOCAL enable_bitmapscan = off")
        before = one_row(conn.execute(counted, {"index": "job_due_idx"}), "the index's page count")[0]
        conn.execute(query("horizon.sql", "claim_select").sql).fetchall()
        after = one_row(conn.execute(counted, {"index": "job_due_idx"}), "the index's page count")[0]
    return int(after - before)


def _read_once_marked(lab: Lab) -> int:
    """The entries one claim reads once the claims before it have marked the dead ones: the
    next claim's, or on a busy server, where a session may test against a horizon it has
    not recomputed yet, the first of up to ``MARK_TRIES`` more that reads one entry."""
    read = entries_read(lab)
    for _ in range(MARK_TRIES):
        if read == 1:
            break
        time.sleep(0.05)
        lab.execute(query("horizon.sql", "xact_id").sql)
        read = entries_read(lab)
    return read


def _work_one(conn: psycopg.Connection) -> dict:
    """One job claimed (production.sql "claim") and completed ("complete"), each in its own
    transaction, as a worker does; with the transaction id of each."""
    with conn.transaction():
        row = conn.execute(query("production.sql", "claim").sql,
                           {"worker": SCENE_ROLE, "lease_s": LEASE_S}).fetchone()
        if row is None:
            raise LabkitError("The scene's queue ran dry.", "pass fewer jobs before and after.")
        claim_xid = xact_id(conn)
    with conn.transaction():
        conn.execute(query("production.sql", "complete").sql, {"id": row[0], "claim_version": row[5]})
        complete_xid = xact_id(conn)
    return {"id": row[0], "claim_xid": claim_xid, "complete_xid": complete_xid}


@dataclass(frozen=True)
class SceneJob(Result):
    """One job of :func:`versions_scene`, in the order the claim takes them.  A done job's
    versions are PENDING (from the scene's ``fill_xid`` to its claim), RUNNING (from its claim
    to its completion) and DONE (live); transaction ids are 64-bit.

    id: the job's id.
    phase: "before" (done before the report opened), "after" (done while it was open) or
        "pending".
    claim_xid: the transaction that claimed it; None while pending.
    complete_xid: the transaction that completed it; None while pending.
    """

    id: int
    phase: str
    claim_xid: int | None
    complete_xid: int | None


@dataclass(frozen=True)
class VersionsScene(Result):
    """What a held horizon keeps, job by job, on a queue small enough to draw
    (:func:`versions_scene`; :func:`plot_versions` draws it).  Transaction ids are 64-bit.

    jobs: each job in the order the claim takes them (:class:`SceneJob`).
    fill_xid: the transaction that wrote every job.
    horizon: the report's snapshot xmin.
    last_xid: the scene's last transaction.
    removable: the dead versions whose xmax, the transaction that replaced them, is older
        than the horizon (counted from the ids above).
    kept: the other dead versions.
    skipped: done jobs whose index entry's version died before the horizon.
    walked_past: done jobs whose index entry's version died after it.
    read_clean: index entries one claim read before the report opened.
    read_held: index entries one claim read with it open.
    read_released: index entries the first claim after it ended read.
    read_after: index entries a claim read once the entries were marked (the next one, or
        on a busy server one of the few after it).
    vacuum_held: what VACUUM VERBOSE said with the report open.
    vacuum_after: what it said after the report ended.
    """

    jobs: list[SceneJob]
    fill_xid: int
    horizon: int
    last_xid: int
    removable: int
    kept: int
    skipped: int
    walked_past: int
    read_clean: int
    read_held: int
    read_released: int
    read_after: int
    vacuum_held: VacuumReport
    vacuum_after: VacuumReport


def versions_scene(lab: Lab, *, jobs: int = 10, before: int = 3, after: int = 4,
                   timeout_s: float = 30) -> VersionsScene:
    """What a held horizon keeps, job by job, on a queue small enough to draw.

    A fresh job table of ``jobs`` pending jobs (one transaction writes them all), autovacuum
    off for it (only the VACUUMs shown run).  A worker claims and completes ``before`` jobs;
    once no session anywhere still sees their old versions, one claim runs to mark their
    index entries dead, and the next is counted; then the report opens (REPEATABLE READ, one
    count, idle: :func:`open_report`) and its snapshot's xmin is the horizon.  The worker
    claims and completes ``after`` more jobs.  With the report still open: the entries one
    claim reads (:func:`entries_read`) and VACUUM VERBOSE.  Then the report ends, and once
    nothing older holds them: the entries the next claim reads (it marks them dead), the
    one after it, and VACUUM VERBOSE again.

    Returns a :class:`VersionsScene`: each job with the transactions that wrote and replaced
    its versions, the horizon, the entries one claim read at each moment, and each VACUUM."""
    number("jobs", jobs, low=3, high=MAX_SCENE_JOBS, whole=True, example=10)
    number("before", before, low=1, high=MAX_SCENE_JOBS, whole=True, example=3)
    number("after", after, low=1, high=MAX_SCENE_JOBS, whole=True, example=4)
    if before + after >= jobs:
        raise LabkitError(f"before={before} and after={after} leave no pending job of jobs={jobs}.",
                          "pass before + after smaller than jobs, for example jobs=10, before=3, after=4.")
    number("timeout_s", timeout_s, low=1, high=600, unit=" s", example=30)
    fresh_table(lab)
    lab.execute("ALTER TABLE job SET (autovacuum_enabled = off)")
    done: dict[int, dict] = {}
    with lab.connect(role=SCENE_ROLE) as worker:
        wpid = worker.info.backend_pid
        with worker.transaction():
            worker.execute(query("horizon.sql", "fill").sql, {"n": jobs})
            fill_xid = xact_id(worker)
        for _ in range(before):
            j = _work_one(worker)
            done[j["id"]] = {**j, "phase": "before"}
        wait_until_dead_to_all(lab, max(j["complete_xid"] for j in done.values()), timeout=timeout_s)
        entries_read(lab)                       # marks the dead entries it passes
        read_clean = _read_once_marked(lab)
        report = open_report(lab, lasts_s=REPORT_MARGIN_S)
        try:
            rpid = report.info.backend_pid
            horizon = int(one_row(report.execute(query("horizon.sql", "snapshot_horizon").sql),
                                  "horizon.sql's snapshot_horizon")[0])
            for _ in range(after):
                j = _work_one(worker)
                done[j["id"]] = {**j, "phase": "after"}
            read_held = entries_read(lab)
            vacuum_held = vacuum(lab)
        finally:
            report.close()
    _wait_gone(lab, [wpid, rpid])
    last_xid = max(j["complete_xid"] for j in done.values())
    wait_until_dead_to_all(lab, last_xid, timeout=timeout_s)
    read_released = entries_read(lab)
    read_after = _read_once_marked(lab)
    vacuum_after = vacuum(lab)
    order = lab.execute(query("horizon.sql", "claim_order").sql)
    rows = [done.get(i) or {"id": i, "phase": "pending", "claim_xid": None, "complete_xid": None}
            for i, _ in order]
    ended = [j for j in rows if j["claim_xid"] is not None]
    return VersionsScene(
        jobs=[SceneJob(id=j["id"], phase=j["phase"], claim_xid=j["claim_xid"], complete_xid=j["complete_xid"])
              for j in rows],
        fill_xid=fill_xid, horizon=horizon, last_xid=last_xid,
        removable=sum((j["claim_xid"] < horizon) + (j["complete_xid"] < horizon) for j in ended),
        kept=sum((j["claim_xid"] >= horizon) + (j["complete_xid"] >= horizon) for j in ended),
        skipped=sum(j["claim_xid"] < horizon for j in ended),
        walked_past=sum(j["claim_xid"] >= horizon for j in ended),
        read_clean=read_clean, read_held=read_held,
        read_released=read_released, read_after=read_after,
        vacuum_held=vacuum_held, vacuum_after=vacuum_after,
    )


def plot_versions(scene: VersionsScene):
    """:func:`versions_scene` drawn: one row per job, in the order the claim takes them.
    Left, the job's entry in the claim's index: marked dead and skipped, read and passed
    over (its version died after the horizon), the pending job the claim stops at, or not
    reached.  Right, the job's row versions along the scene's transactions in the order
    they ran, evenly spaced (one step each, numbered from 1, the fill; other sessions'
    transactions left out), coloured by what VACUUM may do with them; the horizon as a
    dashed line between the last transaction before the report's snapshot and the first
    after it (where the report opened; its xid in the legend), and a dotted line after the
    last transaction, where the report ended.  Returns the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    from ..core.plots import PALETTE, setup_matplotlib

    setup_matplotlib()
    jobs, horizon = scene.jobs, scene.horizon
    xids = sorted({scene.fill_xid, *(x for j in jobs for x in (j.claim_xid, j.complete_xid)
                                     if x is not None)})
    step = {x: i for i, x in enumerate(xids)}
    now = len(xids)
    line_at = next((i for i, x in enumerate(xids) if x >= horizon), now) - 0.5
    live, gone, kept = PALETTE[0], "#AAAAAA", PALETTE[2]
    gap = 0.08                                   # a gap between one version and the next

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 6.4), sharey=True,
                                      gridspec_kw={"width_ratios": [1, 4.2]})

    def version(y: int, a: float, b: float, colour: str) -> None:
        right.plot([a + gap, b - gap], [y, y], color=colour, lw=9, solid_capstyle="butt")

    first_pending = next(i for i, j in enumerate(jobs) if j.phase == "pending")
    for y, j in enumerate(jobs):
        start = step[scene.fill_xid]
        if j.claim_xid is None or j.complete_xid is None:       # pending
            version(y, start, now + 0.5, live)
            mark = ("o", live, "full" if y == first_pending else "none")
        else:
            c, d = step[j.claim_xid], step[j.complete_xid]
            version(y, start, c, gone if j.claim_xid < horizon else kept)      # PENDING
            version(y, c, d, gone if j.complete_xid < horizon else kept)       # RUNNING
            version(y, d, now + 0.5, live)                                     # DONE
            mark = ("x", gone, "full") if j.claim_xid < horizon else ("o", kept, "full")
        left.plot([0], [y], marker=mark[0], color=mark[1], ms=14, mew=3, fillstyle=mark[2], ls="none")
    left.annotate("the claim\nstops here", (0, first_pending), xytext=(0.35, first_pending),
                  va="center", ha="left")
    left.set_xlim(-0.5, 1.6)
    left.set_xticks([])
    left.set_title("its index entry")
    left.set_yticks(range(len(jobs)), [f"job {j.id}" for j in jobs])
    for side in ("bottom", "left"):
        left.spines[side].set_visible(False)
    left.tick_params(axis="y", length=0)

    right.axvline(line_at, color="black", ls="--", lw=2)
    right.annotate("report opens: the horizon", (line_at, -0.75), xytext=(6, 0),
                   textcoords="offset points", va="center", ha="left")
    ended_at = now - 0.5                             # after the scene's last transaction
    right.axvline(ended_at, color="black", ls=":", lw=2)
    right.annotate("report ends", (ended_at, -0.75), xytext=(-6, 0), textcoords="offset points",
                   va="center", ha="right")
    right.set_xticks(range(len(xids)), [str(i + 1) for i in range(len(xids))])
    right.set_xlim(-0.5, now + 0.5)
    right.set_ylim(len(jobs) - 0.5, -1.25)           # a row above the jobs for the label
    right.set_xlabel("the scene's transactions in order, evenly spaced (1 wrote the jobs)")
    right.set_title("its row versions, from the transaction that wrote each to the one that "
                    "replaced it")
    right.spines["left"].set_visible(False)
    right.tick_params(axis="y", length=0)
    handles = [Line2D([], [], color=live, lw=9, label="live version"),
               Line2D([], [], color=gone, lw=9,
                      label=f"died before the horizon: VACUUM may remove ({scene.removable})"),
               Line2D([], [], color=kept, lw=9,
                      label=f"died after it: VACUUM must keep ({scene.kept})"),
               Line2D([], [], color="black", ls="--", lw=2,
                      label=f"the horizon: xid {horizon:,}, the report's snapshot xmin"),
               Line2D([], [], color="black", ls=":", lw=2,
                      label="the report ends, after the scene's last transaction"),
               Line2D([], [], color=gone, marker="x", ms=14, mew=3, ls="none",
                      label="entry marked dead: skipped"),
               Line2D([], [], color=kept, marker="o", ms=14, ls="none",
                      label=f"entry read, row passed over ({scene.read_held - 1} a claim)"),
               Line2D([], [], color=live, marker="o", ms=14, ls="none",
                      label="the pending job the claim takes"),
               Line2D([], [], color=live, marker="o", ms=14, ls="none", fillstyle="none",
                      label="pending, not reached")]
    fig.legend(handles=handles, loc="outside lower center", ncol=2, frameon=False)
    return fig


# -- after the incident: VACUUM keeps the index's size, REINDEX CONCURRENTLY gives it back ----------


def _literal(lab: Lab, statement: str, params: dict) -> str:
    """``statement`` with its parameters written in as literals (a scripted session's step)."""
    return psycopg.ClientCursor(lab.admin).mogrify(statement, params)


def index_pages(lab: Lab) -> int:
    """The claim's index (job_due_idx) on disk, in pages (horizon.sql "index_pages")."""
    return int(lab.execute(query("horizon.sql", "index_pages").sql)[0][0])


@dataclass(frozen=True)
class ReindexRuns(Result):
    """Three scripted runs of a REINDEX of the claim's index while other sessions use the
    table (:func:`reindex_runs`).  Transcripts and steps only: nothing of it is in the JSON.

    concurrently: the transcript of REINDEX INDEX CONCURRENTLY while W1 holds a claim open
        and W2 claims (``.print()`` prints it).
    concurrently_steps: its steps by label: ``W1 claim``, ``reindex``, ``W2 claim`` (each
        with ``waited``, ``blocked_by``, ``rows``).
    pages_after_concurrently: the index's size once the concurrent rebuild was done
        (:func:`index_pages`), before the plain ones.
    buffers_after_concurrently: what one claim read then (:func:`claim_buffers`).
    plain: the transcript of a plain REINDEX INDEX inside R's transaction while W2 claims.
    plain_steps: its steps by label: ``reindex``, ``W2 claim``.
    plain_read: the same with Q reading the table (a count) in place of W2's claim.
    plain_read_steps: its steps by label: ``reindex``, ``Q read``.
    plain_held: the locks R held on the job table and the claim's index while W2 waited,
        read from pg_locks: (the table or index, the mode), such as ``("job", "ShareLock")``.
    plain_waits: for ``W2 claim`` and ``Q read``, the locks each waited for, read the same
        way while it waited (empty for a step that did not wait).
    """

    concurrently: Transcript = not_json()
    concurrently_steps: dict[str, Step] = not_json()
    pages_after_concurrently: int = not_json()
    buffers_after_concurrently: int = not_json()
    plain: Transcript = not_json()
    plain_steps: dict[str, Step] = not_json()
    plain_read: Transcript = not_json()
    plain_read_steps: dict[str, Step] = not_json()
    plain_held: list[tuple[str, str]] = not_json()
    plain_waits: dict[str, list[tuple[str, str]]] = not_json()


def relation_locks(lab: Lab, pid: int, *, granted: bool) -> list[tuple[str, str]]:
    """The locks session ``pid`` holds (``granted``) or waits for on the job table and the
    claim's index (horizon.sql "relation_locks"): (the table or index, the mode as pg_locks
    names it) each."""
    rows = lab.execute(query("horizon.sql", "relation_locks").sql, {"pid": pid, "granted": granted})
    return [(rel, mode) for rel, mode in rows]


def reindex_runs(lab: Lab) -> ReindexRuns:
    """Three scripted runs (:class:`~labkit.core.sessions.Sessions`) on the lab's job table,
    each a REINDEX of the claim's index while other sessions use the table.

    ``concurrently``: W1 claims a job in a transaction it keeps open; R runs REINDEX INDEX
    CONCURRENTLY (horizon.sql "reindex_concurrently"), which waits for W1; meanwhile W2
    claims a job at once; W1 commits and R finishes.  ``plain``: R runs a plain REINDEX
    (horizon.sql "reindex") in a transaction; W2's claim waits for R; R commits and the
    claim goes through.  ``plain_read``: the same with Q's plain read of the table
    (horizon.sql "read_jobs") in place of the claim.  While W2 and Q wait, the locks R
    holds and the ones each waits for are read from pg_locks (:func:`relation_locks`).
    Returns each run's transcript and its steps, and those locks: a :class:`ReindexRuns`."""
    from ..core.sessions import Sessions

    claim = _literal(lab, query("production.sql", "claim").sql, {"worker": "W", "lease_s": LEASE_S})
    with Sessions(lab, "W1", "R", "W2", lock_timeout="10s") as run:
        run.W1("BEGIN")
        steps = {"W1 claim": run.W1(claim, label="claim")}
        steps["reindex"] = run.R(query("horizon.sql", "reindex_concurrently").sql,
                                 label="REINDEX CONCURRENTLY")
        steps["W2 claim"] = run.W2(claim, label="claim")
        run.W1("COMMIT")
        run.wait("R")
        concurrently, concurrently_steps = run.transcript(), steps
    rebuilt = index_pages(lab), claim_buffers(lab)
    reindex = query("horizon.sql", "reindex").sql
    with Sessions(lab, "R", "W2", lock_timeout="10s") as run:
        run.R("BEGIN")
        steps = {"reindex": run.R(reindex, label="REINDEX"), "W2 claim": run.W2(claim, label="claim")}
        held = relation_locks(lab, run.sessions["R"].pid, granted=True)
        waits = {"W2 claim": relation_locks(lab, run.sessions["W2"].pid, granted=False)}
        run.R("COMMIT")
        run.wait("W2")
        plain, plain_steps = run.transcript(), steps
    with Sessions(lab, "R", "Q", lock_timeout="10s") as run:
        run.R("BEGIN")
        steps = {"reindex": run.R(reindex, label="REINDEX"),
                 "Q read": run.Q(query("horizon.sql", "read_jobs").sql, label="read")}
        waits["Q read"] = relation_locks(lab, run.sessions["Q"].pid, granted=False)
        run.R("COMMIT")
        run.wait("Q")
        plain_read, plain_read_steps = run.transcript(), steps
    return ReindexRuns(concurrently=concurrently, concurrently_steps=concurrently_steps,
                       pages_after_concurrently=rebuilt[0], buffers_after_concurrently=rebuilt[1],
                       plain=plain, plain_steps=plain_steps, plain_read=plain_read,
                       plain_read_steps=plain_read_steps, plain_held=held, plain_waits=waits)


@dataclass(frozen=True)
class IndexRecovery(Result):
    """A horizon incident and the clean-up after it, measured on the claim's index
    (:func:`index_recovery`).  Pages are the index's (job_due_idx) 8 kB pages on disk;
    buffers, the shared buffers one execution of the claim's SELECT touched
    (:func:`claim_buffers`).

    backlog: the pending jobs the queue kept throughout.
    churn: the jobs run through while the report was open.
    pages_clean: the index's size before the incident (the table freshly vacuumed).
    buffers_clean: what one claim read then.
    pages_held: the index's size with the report open, the jobs done.
    buffers_held: what one claim read then.
    vacuum: what VACUUM VERBOSE said once the report had ended.
    pages_vacuumed: the index's size after that VACUUM.
    buffers_vacuumed: what one claim read then.
    pages_reindexed: the index's size after REINDEX INDEX CONCURRENTLY.
    buffers_reindexed: what one claim read then.
    reindex: the REINDEX runs (concurrent, and plain for comparison), as transcripts.
    """

    backlog: int
    churn: int
    pages_clean: int
    buffers_clean: int
    pages_held: int
    buffers_held: int
    vacuum: VacuumReport
    pages_vacuumed: int
    buffers_vacuumed: int
    pages_reindexed: int
    buffers_reindexed: int
    reindex: ReindexRuns


def index_recovery(lab: Lab, *, backlog: int = 200, churn: int = 20_000, batch: int = 500,
                   timeout_s: float = 30) -> IndexRecovery:
    """A horizon incident and the clean-up after it, measured on the claim's index.

    A fresh table of ``backlog`` pending jobs, autovacuum off for it (only the VACUUM shown
    runs), vacuumed: the index's size (``pages_clean``) and what one claim reads
    (``buffers_clean``, :func:`claim_buffers`).  The report opens (:func:`open_report`) and
    the queue runs ``churn`` jobs through, ``batch`` at a time (horizon.sql "churn_round":
    as many new jobs arrive as are claimed and completed, so ``backlog`` stay pending):
    ``pages_held``, ``buffers_held``.  The report ends; once nothing older holds the
    versions, VACUUM VERBOSE (``vacuum``, :func:`vacuum`) removes them all: ``pages_vacuumed``,
    ``buffers_vacuumed``.  Then :func:`reindex_runs` (REINDEX CONCURRENTLY while claims go
    on, and plain ones for comparison): ``pages_reindexed``, ``buffers_reindexed`` (read
    after the concurrent rebuild, before the plain ones), and that function's results under
    ``reindex``: an
    :class:`IndexRecovery`."""
    number("backlog", backlog, low=1, high=100_000, whole=True, example=200)
    number("churn", churn, low=1, high=1_000_000, whole=True, example=20_000)
    number("batch", batch, low=1, high=100_000, whole=True, example=500)
    number("timeout_s", timeout_s, low=1, high=600, unit=" s", example=30)
    create_queue(lab, backlog)
    lab.execute("ALTER TABLE job SET (autovacuum_enabled = off)")
    lab.execute("VACUUM job")
    pages_clean, buffers_clean = index_pages(lab), claim_buffers(lab)
    report = open_report(lab, lasts_s=REPORT_MARGIN_S)
    try:
        rpid = report.info.backend_pid
        left = churn
        while left > 0:
            n = min(batch, left)
            for s in query("horizon.sql", "churn_round").statements:
                lab.execute(s, {"n": n})
            left -= n
        pages_held, buffers_held = index_pages(lab), claim_buffers(lab)
        last = int(lab.execute(query("horizon.sql", "xact_id").sql)[0][0])
    finally:
        report.close()
    _wait_gone(lab, [rpid])
    wait_until_dead_to_all(lab, last, timeout=timeout_s)
    vacuumed = vacuum(lab)
    pages_vacuumed, buffers_vacuumed = index_pages(lab), claim_buffers(lab)
    runs = reindex_runs(lab)
    return IndexRecovery(backlog=backlog, churn=churn, pages_clean=pages_clean, buffers_clean=buffers_clean,
                         pages_held=pages_held, buffers_held=buffers_held, vacuum=vacuumed,
                         pages_vacuumed=pages_vacuumed, buffers_vacuumed=buffers_vacuumed,
                         pages_reindexed=runs.pages_after_concurrently,
                         buffers_reindexed=runs.buffers_after_concurrently,
                         reindex=runs)


# -- command line: labkit trace horizon -----------------------------------------------------------


def horizon_command(*, open_lab: Callable[[], Lab], seconds: float = 10, workers: int = 2,
                    other_database: bool = False, json: bool) -> int:
    """``labkit trace horizon [--seconds 10] [--workers 2] [--other-database] [--json]``:
    :func:`horizon_trace` (``seconds`` of churn per phase, 1 to 600; ``workers`` 1 to 16;
    ``other_database``: the horizon held by a writer idle in a transaction in another
    database of the server instead of a report in the lab's), printed as a short summary or
    as JSON.  ``open_lab()`` gives the run its own lab, dropped at the end."""
    check_params(seconds=seconds, workers=workers)          # before anything is created
    with open_lab() as lab:
        r = horizon_trace(lab, seconds=seconds, workers=workers, other_database=other_database)
    if json:
        print(r.to_json())
        return 0
    d = r.durability
    print(f"{workers} workers claim + complete for {seconds:g} s per run on {r.jobs:,} pending jobs "
          f"(PostgreSQL {r.server}, fsync={d.fsync}, synchronous_commit={d.synchronous_commit})")
    elsewhere = r if isinstance(r, HorizonTraceElsewhere) else None
    if elsewhere is not None:
        print(f"the writer's database: {elsewhere.note}")
    print(baseline_note(r))
    print(f"{'':24}{'without':>12}{'with':>12}")
    for key, label in (("claims", "claims"), ("claim_ms_p50", "claim p50 ms"),
                       ("claim_ms_p99", "claim p99 ms"), ("buffers_per_claim", "buffers a claim, median"),
                       ("select_ms", "its SELECT, server ms"),
                       ("dead_tuples", "n_dead_tup at the end"),
                       ("unremovable", "VACUUM could not remove")):
        print(f"{label:24}{_figure(key, getattr(r, key + '_without')):>12}"
              f"{_figure(key, getattr(r, key + '_with')):>12}")
    h = r.holder
    if h is None:
        print("no run with the horizon held: " + (elsewhere.note if elsewhere is not None else "no holder"))
    elif elsewhere is not None:
        print(f"horizon held by {r.horizon_held_by}, pid {h.pid}, its transaction id "
              f"{h.xid_age} transactions old at the end; VACUUM VERBOSE said: {elsewhere.vacuum_line_with}")
    else:
        print(f"horizon held by {r.horizon_held_by}, pid {h.pid}, its snapshot "
              f"{h.xmin_age} transactions old at the end")
    return 0


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and not v.is_integer():
        return f"{v:,.3f}" if v < 10 else f"{v:,.1f}"
    return f"{int(v):,}"
