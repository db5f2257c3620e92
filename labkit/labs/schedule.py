"""Scheduled and prioritised jobs on the production job table (notebook 11).

The claim (production.sql ``claim``) asks for "the most urgent due job":
``WHERE status = 'PENDING' AND run_at <= now() ORDER BY priority, run_at LIMIT 1``, served by
the partial index ``job_due_idx ON job (priority, run_at) WHERE status = 'PENDING'``.

* :func:`plans` EXPLAINs that search (ANALYZE, BUFFERS, rolled back: FOR UPDATE takes row
  locks) on a table with a long history of finished jobs, with the index and without it
  (dropped inside the EXPLAIN's own transaction, so ROLLBACK brings it back unbuilt and
  untouched).  With it the claim reads the front of the index and stops; without it every
  claim reads the whole table and sorts the due rows.
* :func:`scheduled_ahead` shows what the index cannot do.  ``run_at <= now()`` bounds the scan
  only inside one priority's slice of the index, never across priorities: the scan starts at
  the most urgent priority and passes every future-scheduled entry of every priority more
  urgent than the first due job.  Up to PostgreSQL 17 it reads them all (checking run_at in
  the index, without a visit to the table); PostgreSQL 18's skip scan can jump from one
  priority to the next with a fresh descent ("Index Searches" in EXPLAIN), which helps when
  the future rows sit at a few priority levels and stops helping when they are spread over
  many.  Either way, keep priority levels few, or keep future jobs out of the index the claim
  reads.
* :func:`starvation` scripts a steady stream of urgent jobs, on one connection and on an
  explicit clock (every instant is a parameter: no wall clock), and one low-priority job
  enqueued at tick 0.  Strict priority never claims it while the urgent jobs arrive as fast as
  the workers claim them.  The remedy here is the *aged turn*: every k-th claim takes the job
  that has been due longest, whatever its priority (``claim_oldest`` in schedule.sql, served by
  its own partial index ``(run_at, id) WHERE status = 'PENDING'``).  It was chosen because it
  keeps the production claim and its index as they are for the other k-1 claims, costs one more
  partial index (the same predicate as job_due_idx, so no update that was HOT before stops
  being HOT), and gives a bound anyone can check: a job with A due jobs ahead of it in due
  order is claimed within k·(A+1) claims, since every aged turn takes one of those A+1 jobs and
  nothing that arrives later goes ahead of it in that order (unless it is enqueued with a run_at
  already in the past: a backdated job jumps the aged turn's line too).  The run also shows that a
  scheduled job (run_at in the future) is not claimed before its time, even at the top
  priority.

The other remedies, and what they cost: an *effective priority* that improves with the wait,
``priority - (now() - enqueued_at) / X``, cannot be indexed as written (it reads now()), so
every claim sorts every due job; rewritten as a fixed key (``run_at + priority·X``, kept in a
column, since ``timestamptz + interval`` is not immutable) it can be, but then a priority step
is worth X seconds of waiting rather than a strict order.  A *reserved share* per priority (or a
queue per priority, each with its own workers) bounds the wait by the share, but idle reserved
workers cannot help a busy priority.
"""

from __future__ import annotations

import json as _json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from psycopg import sql

from ..core.db import WORKER_GUARDS
from ..core.errors import LabkitError
from ..core.lab import Lab
from ..core.limits import bulk, number
from ..core.queries import query
from ..core.results import Result
from . import production
from ._checked import one_row

SQL = "schedule.sql"

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=timezone.utc)   # tick 0 of the starvation script
TICK_S = 60            # one tick is a minute: jobs arrive one a second from its start...
CLAIM_AT_S = 59        # ...and the workers claim at its last second
SCHEDULED_DUE_S = 30   # the scheduled job falls due half a minute into its tick
LEASE_S = 300
PRIORITY = {"scheduled": 0, "high": 10, "low": 100}     # lower runs first
REMEDIES = ("aging",)
DUE_INDEX = "job_due_idx"
OLDEST_INDEX = "job_oldest_idx"

# Ceilings: a run stays within a minute or so, its table within a laptop's disk.
MAX_HISTORY = 2_000_000
MAX_PENDING = 100_000
MAX_FUTURE = 500_000
MAX_LEVELS = 10_000           # priorities -1 .. -levels, inside smallint
MAX_TICKS = 10_000
MAX_PER_TICK = 50             # arrivals one a second, before the claim at second 59
MAX_CLAIMS = 50_000           # claims in one starvation run

EXPLAIN_GUARDS = WORKER_GUARDS


def _sql(name: str) -> str:
    return query(SQL, name).sql


# -- the table ----------------------------------------------------------------------------------

def fresh_table(lab: Lab) -> None:
    """Drop the lab's job table and make it again from production.sql ``table`` (with its two
    partial indexes, job_due_idx among them)."""
    production.fresh_table(lab)


def _pages(lab: Lab, relation: str) -> int:
    return int(lab.execute(_sql("relation_pages"), {"relation": relation})[0][0])


def _server_version(lab: Lab) -> int:
    return lab.admin.info.server_version


# -- EXPLAIN ------------------------------------------------------------------------------------

def _buffers(node: dict) -> int:
    return int(node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0))


def _render(node: dict, depth: int = 0) -> list[str]:
    """One plan node and its children, short: type, index, rows and buffers, then the
    conditions that say what the node checked."""
    label = node["Node Type"]
    if "Index Name" in node:
        label += f" using {node['Index Name']}"
    if "Relation Name" in node:
        label += f" on {node['Relation Name']}"
    arrow = " " * (6 * depth - 4) + "->  " if depth else ""
    lines = [f"{arrow}{label}  (rows={int(node.get('Actual Rows', 0))}, buffers={_buffers(node)})"]
    detail = " " * (6 * depth + 2)
    if node.get("Sort Key"):
        lines.append(f"{detail}Sort Key: {', '.join(node['Sort Key'])}")
    for key in ("Index Cond", "Filter", "Rows Removed by Filter", "Index Searches"):
        value = node.get(key)
        if value is not None and not (key == "Rows Removed by Filter" and not value):
            lines.append(f"{detail}{key}: {int(value) if isinstance(value, float) else value}")
    for child in node.get("Plans", []):
        lines.extend(_render(child, depth + 1))
    return lines


@dataclass(frozen=True)
class ClaimPlan(Result):
    """The claim's search as EXPLAIN (ANALYZE, BUFFERS) ran it once (:func:`explain_claim`).

    nodes: the plan's node types, top down (``Limit``, ``LockRows``, ``Index Scan``).
    index: the first index scanned (None: no index).
    index_searches: descents of that index (PostgreSQL 18 and newer; else None).
    rows_removed: rows a Filter threw away, over the whole plan.
    buffers: shared buffers hit + read by the whole plan.
    ms: execution time, in ms.
    text: the plan, short: each node with its rows and buffers, and what it checked.
    """

    nodes: list[str]
    index: str | None
    index_searches: int | None
    rows_removed: int
    buffers: int
    ms: float
    text: str


def explain_claim(lab: Lab, *, drop_index: str | None = None, lock: bool = True) -> ClaimPlan:
    """EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) the claim's search (schedule.sql
    ``claim_search``, production.sql's claim without its UPDATE) in a transaction that is rolled
    back, so its row lock goes; with ``lock=False`` the same search without FOR UPDATE SKIP
    LOCKED (``claim_search_read``).  ``drop_index`` drops that index first in the same transaction:
    the planner plans without it, and the ROLLBACK puts it back as it was.  (DROP INDEX holds an
    ACCESS EXCLUSIVE lock on the table until then: a lab's move, never a live queue's.)

    Returns a :class:`ClaimPlan`: ``nodes`` (plan node types, top down), ``index`` (the index scanned, or None),
    ``buffers`` (shared buffers hit + read by the whole plan), ``ms`` (execution time),
    ``index_searches`` (descents of the index, PostgreSQL 18 and newer; else None),
    ``rows_removed`` (rows a Filter threw away) and ``text`` (the plan, short)."""
    with lab.connect(role="explain", guards=EXPLAIN_GUARDS) as conn:
        with conn.transaction(force_rollback=True):
            if drop_index:
                conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(drop_index)))
            search = _sql("claim_search" if lock else "claim_search_read")
            doc = one_row(conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + search), "EXPLAIN of the claim")[0]
    if isinstance(doc, str):
        doc = _json.loads(doc)
    top = doc[0]
    nodes: list[str] = []
    found: dict[str, Any] = {"index": None, "index_searches": None, "rows_removed": 0}

    def walk(node: dict) -> None:
        nodes.append(node["Node Type"])
        if "Index Name" in node and found["index"] is None:
            found["index"] = node["Index Name"]
            found["index_searches"] = node.get("Index Searches")
        found["rows_removed"] += int(node.get("Rows Removed by Filter", 0))
        for child in node.get("Plans", []):
            walk(child)

    walk(top["Plan"])
    return ClaimPlan(nodes=nodes, index=found["index"], index_searches=found["index_searches"],
                     rows_removed=found["rows_removed"], buffers=_buffers(top["Plan"]),
                     ms=round(float(top.get("Execution Time", 0.0)), 3),
                     text="\n".join(_render(top["Plan"])))


# -- 1. the plan with and without the index -----------------------------------------------------

def _check_plans(history: int, pending: int) -> None:
    number("history", history, high=MAX_HISTORY, whole=True, example=200_000)
    number("pending", pending, low=1, high=MAX_PENDING, whole=True, example=1_000)


@dataclass(frozen=True)
class ClaimPlans(Result):
    """The claim's plan with job_due_idx and without it (:func:`plans`).

    history: finished jobs in the table.
    pending: pending jobs (one in five scheduled up to a day ahead).
    due: pending jobs due now.
    table_pages: the job table's pages.
    index_pages: job_due_idx's pages.
    with_index: the claim with job_due_idx.
    without_index: the claim with job_due_idx dropped (in the EXPLAIN's own transaction).
    without_lock: the search with the index but without FOR UPDATE SKIP LOCKED.
    buffer_ratio: buffers without the index / with it.
    fill_s: seconds the fill, VACUUM and ANALYZE took.
    """

    history: int
    pending: int
    due: int
    table_pages: int
    index_pages: int
    with_index: ClaimPlan
    without_index: ClaimPlan
    without_lock: ClaimPlan
    buffer_ratio: float
    fill_s: float


def plans(lab: Lab, *, history: int = 200_000, pending: int = 1_000) -> ClaimPlans:
    """The claim's plan with job_due_idx and without it, on ``history`` finished jobs and
    ``pending`` pending ones (priorities 0 to 9; one in five scheduled up to a day ahead),
    vacuumed and analysed.  With the index the claim reads the front of the index and stops;
    without it it reads every page of the table (history included) and sorts the due rows.

    Returns a :class:`ClaimPlans`: ``history``, ``pending``, ``due`` (pending jobs due now),
    ``table_pages``, ``index_pages`` (job_due_idx), ``with_index`` and ``without_index`` (each a
    :class:`ClaimPlan`), ``without_lock`` (the search with the index but without
    FOR UPDATE SKIP LOCKED: no LockRows, and no Filter repeating the index's predicate),
    ``buffer_ratio`` (buffers without / with) and ``fill_s`` (seconds the fill, VACUUM and
    ANALYZE took)."""
    import time

    _check_plans(history, pending)
    fresh_table(lab)
    t0 = time.perf_counter()
    if history:
        bulk(lab, _sql("fill_history"), {"n": history}, rows=history)
    bulk(lab, _sql("fill_pending"), {"n": pending}, rows=pending)
    lab.execute("VACUUM ANALYZE job")
    fill_s = time.perf_counter() - t0
    with_index = explain_claim(lab)
    without_index = explain_claim(lab, drop_index=DUE_INDEX)
    without_lock = explain_claim(lab, lock=False)
    due = lab.execute(_sql("due_now"))[0][0]
    return ClaimPlans(history=history, pending=pending, due=int(due),
                      table_pages=_pages(lab, "job"), index_pages=_pages(lab, DUE_INDEX),
                      with_index=with_index, without_index=without_index, without_lock=without_lock,
                      buffer_ratio=round(without_index.buffers / max(1, with_index.buffers), 1),
                      fill_s=round(fill_s, 2))


# -- what the index cannot do: future jobs at more urgent priorities ------------------------------

def _check_ahead(future: int, levels: Sequence[int], pending: int) -> tuple[int, ...]:
    number("future", future, low=1, high=MAX_FUTURE, whole=True, example=50_000)
    number("pending", pending, low=1, high=MAX_PENDING, whole=True, example=1_000)
    if isinstance(levels, (str, bytes)) or not isinstance(levels, Sequence) or not 1 <= len(levels) <= 4:
        raise LabkitError(f"levels={levels!r} is not a list of one to four level counts.",
                          "pass levels=(1, 1000): the future jobs at one priority level, then spread over 1,000.")
    for n in levels:
        number("levels", n, low=1, high=MAX_LEVELS, whole=True, example=1_000)
    return tuple(levels)


@dataclass(frozen=True)
class AheadCase(Result):
    """The claim with future jobs at more urgent priorities, spread over some priority levels
    (one case of :func:`scheduled_ahead`).

    levels: the priority levels the future jobs are spread over.
    future: the jobs scheduled an hour or more ahead.
    nodes: the plan's node types, top down.
    index: the index scanned (None: no index).
    buffers: shared buffers hit + read by the whole plan.
    index_searches: descents of the index (PostgreSQL 18 and newer; else None).
    ms: execution time, in ms.
    index_pages: job_due_idx's pages.
    walk_ratio: buffers / the baseline's (the claim with no future jobs).
    text: the plan, short.
    """

    levels: int
    future: int
    nodes: list[str]
    index: str | None
    buffers: int
    index_searches: int | None
    ms: float
    index_pages: int
    walk_ratio: float
    text: str


@dataclass(frozen=True)
class ScheduledAhead(Result):
    """What job_due_idx cannot do: future jobs at more urgent priorities than every due job
    (:func:`scheduled_ahead`).

    server_version: the server's version number (``180001``).
    skip_scan: whether the server has skip scan (PostgreSQL 18 or newer).
    future: the jobs scheduled ahead in each case.
    baseline: the claim with no future jobs.
    ahead: one case per number of priority levels, in the order asked.
    """

    server_version: int
    skip_scan: bool
    future: int
    baseline: ClaimPlan
    ahead: list[AheadCase]


def scheduled_ahead(lab: Lab, *, future: int = 50_000, levels: Sequence[int] = (1, 1_000),
                    pending: int = 1_000) -> ScheduledAhead:
    """What job_due_idx cannot do: ``future`` jobs scheduled an hour or more ahead at
    priorities more urgent than every due job, at one priority level and then spread over
    more (one fresh table per case, besides ``pending`` jobs as in :func:`plans`).
    ``run_at <= now()`` is checked inside each priority's slice of the index; nothing lets the
    scan jump past a slice's future rows but PostgreSQL 18's skip scan, one descent per
    priority level, and only when the levels are few.

    Returns a :class:`ScheduledAhead`: ``server_version`` (e.g. 180001), ``skip_scan``
    (PostgreSQL 18 or newer), ``future``, ``baseline`` (the claim with no future jobs: a
    :class:`ClaimPlan`) and ``ahead``: one :class:`AheadCase` per entry of ``levels`` with ``levels``, ``future``, ``nodes``,
    ``index``, ``buffers``, ``index_searches``, ``ms``, ``index_pages`` and ``walk_ratio``
    (buffers / the baseline's)."""
    levels = _check_ahead(future, levels, pending)
    fresh_table(lab)
    bulk(lab, _sql("fill_pending"), {"n": pending}, rows=pending)
    lab.execute("ANALYZE job")
    baseline = explain_claim(lab)
    ahead: list[AheadCase] = []
    for n in levels:
        fresh_table(lab)
        bulk(lab, _sql("fill_pending"), {"n": pending}, rows=pending)
        bulk(lab, _sql("fill_ahead"), {"n": future, "levels": n}, rows=future)
        lab.execute("ANALYZE job")
        plan = explain_claim(lab)
        ahead.append(AheadCase(levels=n, future=future, nodes=plan.nodes, index=plan.index,
                               buffers=plan.buffers, index_searches=plan.index_searches,
                               ms=plan.ms, index_pages=_pages(lab, DUE_INDEX),
                               walk_ratio=round(plan.buffers / max(1, baseline.buffers), 1),
                               text=plan.text))
    version = _server_version(lab)
    return ScheduledAhead(server_version=version, skip_scan=version >= 180000, future=future,
                          baseline=baseline, ahead=ahead)


# -- 2. starvation, and the aged turn -----------------------------------------------------------

def _check_starvation(ticks, high_per_tick, claims_per_tick, remedy, every, scheduled_tick, sample) -> None:
    if remedy is not None and remedy not in REMEDIES:
        raise LabkitError(f"remedy={remedy!r} is not a remedy this lab knows.",
                          "pass remedy=None (strict priority) or remedy='aging' (every k-th claim "
                          "takes the job due longest, whatever its priority; k is every=).")
    number("ticks", ticks, low=2, high=MAX_TICKS, whole=True, example=60)
    number("high_per_tick", high_per_tick, high=MAX_PER_TICK, whole=True, example=3)
    number("claims_per_tick", claims_per_tick, low=1, high=MAX_PER_TICK, whole=True, example=3)
    number("every", every, low=2, high=1_000, whole=True, example=4)
    number("sample", sample, high=1_000, whole=True, example=12)
    number("scheduled_tick", scheduled_tick, low=1, high=ticks - 1, whole=True,
           example=min(10, ticks - 1))
    if ticks * claims_per_tick > MAX_CLAIMS:
        raise LabkitError(f"ticks × claims_per_tick = {ticks * claims_per_tick:,} claims is more than "
                          f"this lab runs ({MAX_CLAIMS:,} at most).",
                          "pass fewer ticks or claims_per_tick (ticks=60, claims_per_tick=3, say).")


def _at(tick: int, second: float = 0) -> datetime:
    return T0 + timedelta(seconds=tick * TICK_S + second)


def _enqueue(conn: Any, enqueue: str, kind: str, n: int, tick: int, second: float,
             run_at: datetime | None = None) -> list[int]:
    """``n`` jobs of ``kind`` arriving ``second`` s into ``tick`` (one a second); their ids."""
    rows = conn.execute(enqueue, {"kind": kind, "priority": PRIORITY[kind], "n": n, "tick": tick,
                                  "at": _at(tick, second), "run_at": run_at}).fetchall()
    return [r[0] for r in rows]


def _first_arrivals(conn: Any, enqueue: str, *, high_per_tick: int, scheduled_tick: int) -> tuple[int, int, int]:
    """Tick 0's low-priority job and scheduled job, after its urgent ones: their ids, and how
    many due jobs are ahead of the low job in due order when it arrives."""
    (low_id,) = _enqueue(conn, enqueue, "low", 1, 0, high_per_tick)
    (scheduled_id,) = _enqueue(conn, enqueue, "scheduled", 1, 0, high_per_tick + 1,
                               run_at=_at(scheduled_tick, SCHEDULED_DUE_S))
    older_due = int(one_row(conn.execute(_sql("older_due"), {"id": low_id, "now": _at(0, CLAIM_AT_S)}),
                            "schedule.sql's older_due")[0])
    return low_id, scheduled_id, older_due


@dataclass(frozen=True)
class TickClaim(Result):
    """One claim of :func:`starvation`'s run that got a job.

    claim: the claim's number, 1-based, counting only claims that got a job.
    tick: the tick it was made in (at the tick's last second).
    kind: the job's kind: ``high``, ``low`` or ``scheduled``.
    job: the job's id.
    priority: the job's priority (lower runs first).
    turn: ``priority`` (the production claim) or ``aged`` (the aged turn: the job due longest).
    """

    claim: int
    tick: int
    kind: str
    job: int
    priority: int
    turn: str


@dataclass(frozen=True)
class ScheduledJob(Result):
    """When :func:`starvation`'s scheduled job fell due and when it was claimed; seconds are
    after tick 0's start.

    due_tick: the tick its run_at falls in.
    claimed_tick: the tick it was claimed in (None: never).
    due_s: its run_at, in seconds.
    claimed_s: when it was claimed, in seconds (None: never).
    """

    due_tick: int
    claimed_tick: int | None
    due_s: int
    claimed_s: int | None


def _claim_tick(conn: Any, stmts: dict[str, str], claims: list[TickClaim], tick: int, *,
                claims_per_tick: int, aging: bool, every: int) -> int:
    """The tick's claims at its last second, each job completed at once (a turn with nothing
    due passes), appended to ``claims``; how many were aged turns."""
    now = _at(tick, CLAIM_AT_S)
    aged_turns = 0
    for _ in range(claims_per_tick):
        turn = len(claims) + 1
        aged = aging and turn % every == 0
        row = conn.execute(stmts["claim_oldest"] if aged else stmts["claim_at"],
                           {"worker": "w1", "now": now, "lease_s": LEASE_S}).fetchone()
        if row is None:
            continue                    # nothing due: the turn passes
        aged_turns += aged
        job_id, kind, _payload, _attempts, _max, version = row
        conn.execute(stmts["complete"], {"id": job_id, "claim_version": version})
        claims.append(TickClaim(claim=len(claims) + 1, tick=tick, kind=kind, job=job_id,
                                priority=PRIORITY[kind], turn="aged" if aged else "priority"))
    return aged_turns


def _scheduled_outcome(sched_claim: TickClaim | None, scheduled_tick: int) -> ScheduledJob:
    """When the scheduled job fell due and when it was claimed: ticks, and seconds after T0."""
    return ScheduledJob(due_tick=scheduled_tick,
                        claimed_tick=None if sched_claim is None else sched_claim.tick,
                        due_s=scheduled_tick * TICK_S + SCHEDULED_DUE_S,
                        claimed_s=None if sched_claim is None else sched_claim.tick * TICK_S + CLAIM_AT_S)


def _aged_bound(aging: bool, every: int, older_due: int, claims_per_tick: int) -> tuple[int | None, int | None]:
    """The aged turn's promise: the low job claimed within every·(older_due+1) claims, so by
    that tick (None, None without a remedy)."""
    bound_claims = every * (older_due + 1) if aging else None
    return bound_claims, None if bound_claims is None else (bound_claims - 1) // claims_per_tick


@dataclass(frozen=True)
class Starvation(Result):
    """A low-priority job among a steady stream of urgent ones (:func:`starvation`).

    remedy: None (strict priority) or ``aging`` (the aged turn).
    every: the aged turn's k: every k-th claim is one (None without a remedy).
    ticks: the ticks the run lasted (a tick is a minute of the script's clock).
    high_per_tick: urgent jobs arriving each tick.
    claims_per_tick: claims made each tick.
    claims: the claims that got a job.
    aged_turns: the aged turns that got a job.
    claimed_by_kind: jobs claimed, per kind (``high``, ``low``, ``scheduled``).
    waited_ticks: ticks from the low job's arrival (tick 0) to its claim (None: never claimed).
    starved: whether the low job was never claimed.
    older_due: due jobs ahead of the low job in due order when it arrived.
    bound_claims: the aged turn's promise: the low job claimed within every·(older_due+1)
        claims (None without a remedy).
    bound_ticks: the tick that promise reaches (None without a remedy).
    low_claim: the claim that took the low job (None: never claimed).
    backlog_at_end: jobs due and waiting after the last claim.
    scheduled: when the job scheduled ahead at the top priority fell due and was claimed.
    claimed_sample: the first claims, in order.
    claim_sql: the claim the aged turn sends, or the priority claim without a remedy
        (schedule.sql as written).
    index_sql: the aged turn's index (None without a remedy).
    """

    remedy: str | None
    every: int | None
    ticks: int
    high_per_tick: int
    claims_per_tick: int
    claims: int
    aged_turns: int
    claimed_by_kind: dict[str, int]
    waited_ticks: int | None
    starved: bool
    older_due: int
    bound_claims: int | None
    bound_ticks: int | None
    low_claim: TickClaim | None
    backlog_at_end: int
    scheduled: ScheduledJob
    claimed_sample: list[TickClaim]
    claim_sql: str
    index_sql: str | None


def starvation(lab: Lab, *, ticks: int = 60, high_per_tick: int = 3, claims_per_tick: int = 3,
               remedy: str | None = None, every: int = 4, scheduled_tick: int = 10,
               sample: int = 12) -> Starvation:
    """A low-priority job among a steady stream of urgent ones, scripted tick by tick on one
    connection and an explicit clock (tick t is minute t after 2026-03-02 09:00 UTC).

    At tick 0 the first ``high_per_tick`` urgent jobs (priority 10) arrive one a second, then
    one low-priority job (priority 100), then a job at the top priority (0) scheduled for
    ``scheduled_tick`` (run_at half a minute into that tick).  Every tick after that
    ``high_per_tick`` more urgent jobs arrive, and at the tick's last second the workers make
    ``claims_per_tick`` claims (production.sql's claim on the script's clock, schedule.sql
    ``claim_at``), each finished at once.  With ``remedy='aging'`` every ``every``-th claim is an
    aged turn (``claim_oldest``): the job due longest, whatever its priority.

    Returns a :class:`Starvation`: ``remedy``, ``every`` (None without a remedy), ``ticks``, ``high_per_tick``,
    ``claims_per_tick``, ``claims`` (claims that got a job), ``aged_turns``,
    ``claimed_by_kind`` ({"high", "low", "scheduled"}: jobs claimed), ``waited_ticks`` (ticks
    from the low job's arrival to its claim; None: never claimed), ``starved`` (waited_ticks is
    None), ``older_due`` (due jobs ahead of the low job in due order when it arrived),
    ``bound_claims`` and ``bound_ticks`` (the aged turn's promise: claimed within
    every·(older_due+1) claims, so by that tick; None without a remedy), ``low_claim`` (the
    claim that took it, or None), ``backlog_at_end`` (jobs due and waiting after the last
    claim), ``scheduled`` ({"due_tick", "claimed_tick", "due_s", "claimed_s"}: seconds after
    T0), ``claimed_sample`` (the first ``sample`` claims: claim, tick, kind, job, priority,
    turn), ``claim_sql`` (the claim the aged turn sends, or the priority claim without a
    remedy: schedule.sql as written) and ``index_sql`` (the aged turn's index, or None)."""
    _check_starvation(ticks, high_per_tick, claims_per_tick, remedy, every, scheduled_tick, sample)
    aging = remedy == "aging"
    fresh_table(lab)
    if aging:
        lab.execute(_sql("oldest_index"))
    lab.execute("ANALYZE job")
    enqueue = _sql("enqueue_at")
    stmts = {"claim_at": _sql("claim_at"), "claim_oldest": _sql("claim_oldest"),
             "complete": query("production.sql", "complete").sql}
    claims: list[TickClaim] = []
    aged_turns = 0
    low_id = scheduled_id = None
    older_due = 0
    conn = lab.connect(role="sched-worker", guards=WORKER_GUARDS)
    try:
        # The run is about order, not durability: commits do not wait for the disk.
        conn.execute("SET synchronous_commit = off")
        for tick in range(ticks):
            if high_per_tick:
                _enqueue(conn, enqueue, "high", high_per_tick, tick, 0)
            if tick == 0:
                low_id, scheduled_id, older_due = _first_arrivals(conn, enqueue, high_per_tick=high_per_tick,
                                                                  scheduled_tick=scheduled_tick)
            aged_turns += _claim_tick(conn, stmts, claims, tick, claims_per_tick=claims_per_tick, aging=aging,
                                      every=every)
        backlog = int(one_row(conn.execute(_sql("due_count"), {"now": _at(ticks - 1, CLAIM_AT_S)}),
                              "schedule.sql's due_count")[0])
    finally:
        conn.close()

    by_id = {c.job: c for c in claims}
    low_claim = None if low_id is None else by_id.get(low_id)
    counts = {k: sum(1 for c in claims if c.kind == k) for k in ("high", "low", "scheduled")}
    bound_claims, bound_ticks = _aged_bound(aging, every, older_due, claims_per_tick)
    return Starvation(
        remedy=remedy, every=every if aging else None, ticks=ticks,
        high_per_tick=high_per_tick, claims_per_tick=claims_per_tick,
        claims=len(claims), aged_turns=aged_turns, claimed_by_kind=counts,
        waited_ticks=None if low_claim is None else low_claim.tick,
        starved=low_claim is None, older_due=older_due,
        bound_claims=bound_claims, bound_ticks=bound_ticks,
        low_claim=low_claim, backlog_at_end=backlog,
        scheduled=_scheduled_outcome(None if scheduled_id is None else by_id.get(scheduled_id), scheduled_tick),
        claimed_sample=claims[:sample],
        claim_sql=query(SQL, "claim_oldest" if aging else "claim_at").text,
        index_sql=query(SQL, "oldest_index").text if aging else None,
    )


# -- command line -------------------------------------------------------------------------------

def _summary_text(p: ClaimPlans, a: ScheduledAhead, strict: Starvation, aged: Starvation) -> str:
    w, wo = p.with_index, p.without_index
    lines = [f"the claim's search on {p.history:,} finished + {p.pending:,} pending jobs "
             f"({p.due:,} due), {p.table_pages:,} table pages",
             f"  {'with ' + DUE_INDEX + ':':<19} {' > '.join(w.nodes)} ({w.index})  "
             f"{w.buffers:,} buffers  {w.ms:.2f} ms",
             f"  {'without it:':<19} {' > '.join(wo.nodes)}  {wo.buffers:,} buffers  "
             f"{wo.ms:.2f} ms  (×{p.buffer_ratio:g} the buffers)",
             f"{a.future:,} jobs scheduled an hour ahead at priorities above every due job "
             f"(server {a.server_version // 10000}, skip scan {'yes' if a.skip_scan else 'no'}):",
             f"  {'none:':<19} {a.baseline.buffers:,} buffers"]
    for row in a.ahead:
        searches = "" if row.index_searches is None else f", {row.index_searches} index search(es)"
        where = f"at {row.levels:,} level(s):"
        lines.append(f"  {where:<19} {row.buffers:,} buffers{searches}  (×{row.walk_ratio:g})")
    lines.append(f"starvation: {strict.ticks} ticks, {strict.high_per_tick} urgent jobs arrive and "
                 f"{strict.claims_per_tick} claims are made a tick")
    for run, name in ((strict, "strict priority"), (aged, f"aged turn every {aged.every} claims")):
        waited = "never claimed (starved)" if run.starved else f"claimed after {run.waited_ticks} tick(s)"
        bound = "" if run.bound_ticks is None else f" (promised: by tick {run.bound_ticks})"
        lines.append(f"  {name:<26} the low job: {waited}{bound}; scheduled job due at tick "
                     f"{run.scheduled.due_tick}, claimed at tick {run.scheduled.claimed_tick}")
    return "\n".join(lines)


def schedule_command(*, open_lab: Callable[[], Lab], history: int = 200_000, pending: int = 1_000,
                     future: int = 50_000, ticks: int = 60, high_per_tick: int = 3,
                     claims_per_tick: int = 3, every: int = 4, json: bool = False) -> int:
    """``labkit schedule``: the claim's plan with and without job_due_idx, the future jobs it
    walks past, and a low-priority job under strict priority and with the aged turn.  Every
    parameter is checked before the lab is opened; the lab is dropped at the end, also on
    Ctrl-C.  ``open_lab()`` gives the run its own lab."""
    _check_plans(history, pending)
    levels = _check_ahead(future, (1, 1_000), pending)
    scheduled_tick = min(10, ticks - 1) if isinstance(ticks, int) and ticks >= 2 else 1
    _check_starvation(ticks, high_per_tick, claims_per_tick, "aging", every, scheduled_tick, 12)
    with open_lab() as lab:
        p = plans(lab, history=history, pending=pending)
        a = scheduled_ahead(lab, future=future, levels=levels, pending=pending)
        runs = [starvation(lab, ticks=ticks, high_per_tick=high_per_tick, claims_per_tick=claims_per_tick,
                           remedy=remedy, every=every, scheduled_tick=scheduled_tick)
                for remedy in (None, "aging")]
    if json:
        summary = {"plans": p.as_dict(), "scheduled_ahead": a.as_dict(),
                   "starvation": [r.as_dict() for r in runs]}
        print(_json.dumps(summary, indent=2))
    else:
        print(_summary_text(p, a, *runs))
    return 0
