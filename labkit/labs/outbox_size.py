"""Keeping the outbox small: what a growing history of published rows costs, and two ways out.

The relay marks each event published and leaves its row in the outbox.  Every number here is
read from the server (EXPLAIN (ANALYZE, BUFFERS), VACUUM (VERBOSE), ``pg_relation_size``,
``pg_current_wal_lsn``, ``pg_locks``); the SQL is in ``labkit/sql/outbox_size.sql``, the
relay's claim and mark are :mod:`labkit.labs.relay`'s.

* :func:`growth`: the outbox at several history sizes.  What does **not** grow: the relay's
  claim (its partial index holds only unpublished rows), and a VACUUM after a fixed number
  of new events (the visibility map lets it skip the history's pages, and with few pages
  to clean it may skip the index pass).  What **does** grow: the table and its other
  indexes on disk; VACUUM's index pass, which reads every page of every index whenever it
  runs (a plain VACUUM bypasses it while fewer than 2 % of the pages hold dead items); and
  autovacuum's trigger (``threshold + scale_factor x rows``), so dead row
  versions -- and dead entries in the partial index -- pile up longer between runs.
* :func:`delete_way` (way out A): delete old published rows in batches with ``FOR UPDATE
  SKIP LOCKED``; it writes WAL for every row and leaves every row behind as a dead row
  version for VACUUM (which writes WAL again); the table's file does not shrink.
* :func:`drop_way` (way out B): the same history in hourly partitions; an old partition is
  detached (``DETACH PARTITION ... CONCURRENTLY``), checked for unpublished events and
  dropped: little WAL, no dead row versions, the files go.
* :func:`beside_relay`: the batched delete beside a relay's open claim and a second cleaner
  holding its batch (scripted sessions).
* :func:`partition_locks`: what dropping a partition locks, and why ``DETACH ...
  CONCURRENTLY`` is the way to take one out while relays claim.

:func:`size_trace` runs growth, A and B on the same history; ``labkit trace outbox-size`` is
:func:`size_command`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
from psycopg import sql

from ..core.errors import LabkitError
from ..core.lab import Lab
from ..core.limits import bulk, number
from ..core.queries import query
from ..core.results import Result, not_json
from ..core.sessions import Sessions
from ..core.transcript import Transcript
from ._checked import one_row, one_row_named
from .relay import MARK, claim_text, create_outbox

SIZES = (0, 100_000, 400_000)   # published rows in the outbox, one reading each
TICK = 1_000                    # events the relay publishes between two VACUUMs
WAITING = 20                    # unpublished events the outbox always holds
HISTORY = 100_000               # the history ways A and B both shed
BATCH = 1_000                   # rows one cleanup DELETE takes
HOURS = 4                       # the history spans this many hours: one partition each
MAX_SIZE = 2_000_000
MAX_BATCH = 50_000
MAX_SIZES = 6
FILE = "outbox_size.sql"


def _q(name: str) -> str:
    return query(FILE, name).sql


def _ddl(name: str, **parts: Any) -> sql.Composed:
    """A query of outbox_size.sql with its ``{placeholders}`` filled: partition names as
    identifiers, bounds as literals (DDL takes no parameters)."""
    return sql.SQL(_q(name)).format(**{k: sql.Identifier(v) if k == "partition" else sql.Literal(v)
                                       for k, v in parts.items()})


# -- parameters ----------------------------------------------------------------------------------


def check_params(*, sizes: tuple[int, ...] | list[int] = SIZES, history: int = HISTORY,
                 batch: int = BATCH) -> None:
    """``sizes``: 1 to 6 history sizes, each 0 to 2,000,000 rows, in increasing order;
    ``history``: 1 to 2,000,000 rows; ``batch``: 1 to 50,000 rows, at most ``history``."""
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, (tuple, list)) or not sizes:
        raise LabkitError(f"sizes={sizes!r} is not a list of history sizes.",
                          "pass sizes=(0, 100_000, 400_000): published rows at each reading.")
    if len(sizes) > MAX_SIZES:
        raise LabkitError(f"sizes has {len(sizes)} readings; this lab takes at most {MAX_SIZES}.",
                          "pass fewer sizes, for example sizes=(0, 100_000, 400_000).")
    for s in sizes:
        number("each of sizes", s, high=MAX_SIZE, whole=True, example=100_000)
    if list(sizes) != sorted(set(sizes)):
        raise LabkitError(f"sizes={tuple(sizes)} is not increasing: the outbox only grows here.",
                          "pass the sizes smallest first, each once, e.g. (0, 100_000, 400_000).")
    number("history", history, low=1, high=MAX_SIZE, whole=True, example=HISTORY)
    number("batch", batch, low=1, high=MAX_BATCH, whole=True, example=BATCH)
    if batch > history:
        raise LabkitError(f"batch={batch:,} is larger than the whole history ({history:,} rows): "
                          "one DELETE would take it all, which is what batching avoids.",
                          f"pass a batch well below history, e.g. batch={max(1, history // 100):,}.")


# -- small readings ------------------------------------------------------------------------------


def disk_sizes(lab: Lab) -> dict[str, int]:
    """The outbox on disk (summed over partitions): ``table_bytes``, ``index_bytes``,
    ``partial_index_bytes``, ``total_bytes``."""
    sizes = one_row_named(lab.admin.execute(_q("sizes")), f"{FILE}'s sizes")
    return {name: int(v or 0) for name, v in sizes.items()}


def _lsn(conn: psycopg.Connection) -> str:
    return one_row(conn.execute(_q("wal_position")), f"{FILE}'s wal_position")[0]


OWN_WAL_FROM = 180000    # pg_stat_get_backend_wal: a session's own WAL, PostgreSQL 18 and later


def wal_scope(conn: psycopg.Connection) -> str:
    """Whose WAL :func:`_wal_since` counts on this server: "this session" (PostgreSQL 18 and
    later) or "the whole server" (before 18: the WAL position moved by every session)."""
    return "this session" if conn.info.server_version >= OWN_WAL_FROM else "the whole server"


def _wal_mark(conn: psycopg.Connection) -> int | str:
    """Where ``conn``'s WAL count stands: from PostgreSQL 18 on, the bytes this session has
    written (its pending statistics flushed first); before 18, the server's WAL position."""
    if conn.info.server_version >= OWN_WAL_FROM:
        return _own_wal(conn)
    return _lsn(conn)


def _own_wal(conn: psycopg.Connection) -> int:
    """The bytes of WAL ``conn``'s session has written (PostgreSQL 18 and later), its pending
    statistics flushed first."""
    conn.execute(_q("flush_own_stats"))
    return int(one_row(conn.execute(_q("own_wal_bytes")), f"{FILE}'s own_wal_bytes")[0])


def _wal_since(conn: psycopg.Connection, mark: int | str) -> int:
    """The WAL written since ``mark`` (a :func:`_wal_mark`): by ``conn``'s session alone
    from PostgreSQL 18 on, by the whole server before (an autocommit ``conn``)."""
    if isinstance(mark, int):               # a mark of PostgreSQL 18 or later: the session's own
        return _own_wal(conn) - mark
    return int(one_row(conn.execute(_q("wal_bytes"), {"after": _lsn(conn), "before": mark}),
                       f"{FILE}'s wal_bytes")[0])


def wait_for_horizon(lab: Lab, timeout: float = 30.0) -> None:
    """Wait until no other session of this database holds a snapshot or transaction that
    began before now, and no transaction of any database (a session's, a prepared one, a
    replication slot's xmin) is older than now -- a new snapshot here would count it as
    running -- so that VACUUM may remove what this lab just made dead.  (Unlike
    :func:`labkit.labs.claims.wait_for_horizon` it takes no transaction id: a commit that
    took an id and wrote nothing is flushed lazily, and until it is, VACUUM may not mark
    the pages of other transactions near it all-visible.)"""
    x = lab.execute(_q("now_xid"))[0][0]
    deadline = time.monotonic() + timeout
    while held := lab.execute(_q("older_snapshots"), {"x": x}):
        if time.monotonic() > deadline:
            who = ", ".join(f"pid {p} ({a or 'no name'})" if p else a for p, a in held[:5])
            raise LabkitError(f"Other sessions ({who}) still see row versions this lab has just "
                              f"replaced or deleted, so VACUUM cannot remove them; waited {timeout:.0f} s.",
                              "end those transactions (`labkit doctor` lists them, `labkit clean` ends "
                              "your own idle ones) and run the cell again.")
        time.sleep(0.05)


_PAGES = re.compile(r"pages: (\d+) removed, (\d+) remain, (\d+) scanned")
_INDEX_SCANS = re.compile(r"index scans: (\d+)")
_REMOVED = re.compile(r"tuples: (\d+) removed")
_DEAD_ITEMS = re.compile(r"(\d+) dead item identifiers")
_BUFFERS = re.compile(r"buffer usage: (\d+) hits, (\d+) (?:misses|reads), (\d+) dirtied")
_WAL = re.compile(r"WAL usage: (\d+) records, (\d+) full page images, (\d+) bytes")
_INDEX_SCAN = re.compile(r"index scan (needed|bypassed|not needed): (\d+) pages from table")


def vacuum(lab: Lab, options: str = "VERBOSE") -> dict[str, int | float]:
    """``VACUUM (VERBOSE, PARALLEL 0, <options>) outbox`` (no parallel workers: as autovacuum
    runs it), measured by the server's own VERBOSE report (PostgreSQL
    15 and later), summed over partitions: ``pages_total``, ``pages_scanned`` (pages it read;
    the visibility map lets it skip the rest), ``index_scans`` (index passes: each reads
    every page of every index), ``removed`` (dead row versions it removed), ``dead_items``
    (dead item identifiers it found: one per deleted or replaced row version),
    ``dead_item_pages`` (heap pages holding them), ``bypassed`` (tables whose index pass it
    skipped: with INDEX_CLEANUP AUTO, the default and autovacuum's, it skips the pass when
    fewer than 2 % of the table's pages hold dead items -- they stay, for a later VACUUM --
    and reports "index scan bypassed"), ``buffers`` (hits + reads), ``wal_bytes`` (its own
    WAL) and ``ms`` (its wall time).  Waits first until no other transaction can still see
    what it is to remove."""
    options = ", ".join(["VERBOSE", "PARALLEL 0"] + [o.strip() for o in options.split(",")
                                                      if o.strip() and o.strip().upper() != "VERBOSE"])
    wait_for_horizon(lab)
    notes: list[str] = []

    def note(diag: psycopg.errors.Diagnostic) -> None:
        notes.append(diag.message_primary or "")

    conn = lab.admin
    conn.add_notice_handler(note)
    t0 = time.perf_counter()
    try:
        conn.execute(f"VACUUM ({options}) outbox")
    finally:
        conn.remove_notice_handler(note)
    ms = (time.perf_counter() - t0) * 1000
    text = "\n".join(notes)
    pages = _PAGES.findall(text)
    if not pages:
        raise LabkitError("VACUUM (VERBOSE) did not report its pages in the form this lab reads "
                          "(PostgreSQL 15 and later).", "run the lab on PostgreSQL 15 or newer.")
    return {
        "pages_total": sum(int(p[0]) + int(p[1]) for p in pages),
        "pages_scanned": sum(int(p[2]) for p in pages),
        "index_scans": sum(int(n) for n in _INDEX_SCANS.findall(text)),
        "removed": sum(int(n) for n in _REMOVED.findall(text)),
        "dead_items": sum(int(n) for n in _DEAD_ITEMS.findall(text)),
        "dead_item_pages": sum(int(n) for _, n in _INDEX_SCAN.findall(text)),
        "bypassed": sum(1 for verdict, _ in _INDEX_SCAN.findall(text) if verdict == "bypassed"),
        "buffers": sum(int(h) + int(r) for h, r, _ in _BUFFERS.findall(text)),
        "wal_bytes": sum(int(b) for _, _, b in _WAL.findall(text)),
        "ms": round(ms, 2),
    }


def settle(lab: Lab, timeout: float = 5.0) -> int:
    """VACUUM (ANALYZE) the outbox until the visibility map covers at least 90 % of its
    pages (pg_class.relallvisible): the steady state a measured VACUUM starts from, where
    it skips the pages nothing changed on.  VACUUM marks a page all-visible only once the
    commits of its rows are known flushed; a busy server that commits asynchronously
    elsewhere can delay that a moment, so it retries (each retry cheap: the pages already
    marked are skipped) for up to ``timeout`` s.  Returns the VACUUMs run."""
    deadline, n = time.monotonic() + timeout, 0
    while True:
        vacuum(lab, "ANALYZE")
        n += 1
        pages, visible = lab.execute(_q("visible_pages"))[0]
        if visible >= 0.9 * pages or time.monotonic() > deadline:
            return n
        time.sleep(0.1)


def claim_cost(lab: Lab, batch: int = 10) -> dict[str, Any]:
    """The relay's claim (relay.py's, ``batch`` rows) run once under EXPLAIN (ANALYZE,
    BUFFERS) in a transaction that is rolled back: ``buffers`` (shared hit + read, index and
    table pages), ``ms`` (execution time on the server), ``rows``, ``locks`` (relations the
    claim's transaction holds locks on: the outbox, its partitions and their indexes)."""
    conn = lab.admin
    with conn.transaction(force_rollback=True):
        out = one_row(conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + claim_text(batch)),
                      "EXPLAIN of the relay's claim")[0][0]
        locks = conn.execute(_q("own_locks")).fetchall()
    plan = out["Plan"]
    return {"buffers": int(plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0)),
            "ms": round(float(out.get("Execution Time", 0.0)), 3),
            "rows": int(plan.get("Actual Rows", 0)),
            "locks": len({r[0] for r in locks})}


def _relay_tick(lab: Lab, n: int) -> int:
    """One relay tick without a broker: claim ``n`` rows (relay.py's claim) and mark them
    published (relay.py's mark) in one transaction.  Returns the rows marked."""
    with lab.connect(role="relay") as conn:
        with conn.transaction():
            ids = [r[0] for r in conn.execute(claim_text(n)).fetchall()]
            if ids:
                conn.execute(MARK, {"ids": ids})
    return len(ids)


class _Ids:
    """Event numbers for arriving events, unique within a lab run."""

    def __init__(self) -> None:
        self.next = 1

    def take(self, n: int) -> int:
        first, self.next = self.next, self.next + n
        return first


def _arrive(lab: Lab, ids: _Ids, n: int) -> None:
    if n > 0:
        lab.execute(_q("arrive"), {"n": n, "first": ids.take(n)})


def _history(lab: Lab, n: int, *, first: int, start: datetime, step_s: float) -> None:
    if n > 0:
        bulk(lab, _q("history"), {"n": n, "first": first, "start": start, "step_s": step_s}, rows=n)


# -- 1. growth -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GrowthReading(Result):
    """The outbox at one history size: one reading of :func:`growth`.

    published_rows: published rows the outbox held (its history) at this reading
    table_bytes: the table (heap) on disk, in bytes
    index_bytes: all its indexes on disk, in bytes
    partial_index_bytes: the claim's partial index (unpublished rows only) on disk, in bytes
    total_bytes: table, indexes and TOAST together, in bytes
    claim_buffers: buffers (8 kB pages, shared hit + read) the relay's claim of 10 rows read
    claim_ms: the claim's execution time on the server, in milliseconds
    claim_rows: the rows the claim returned
    vacuum_pages_scanned: heap pages the plain VACUUM after one tick read
    vacuum_pages_total: heap pages the table had at that VACUUM
    vacuum_index_scans: index passes that VACUUM ran (0: it bypassed the pass)
    vacuum_buffers: buffers (hits + reads) that VACUUM touched
    vacuum_dead_item_pages: heap pages holding dead items that VACUUM found
    vacuum_bypassed: 1 if that VACUUM skipped its index pass (INDEX_CLEANUP AUTO), else 0
    vacuum_ms: that VACUUM's wall time, in milliseconds
    index_pass_buffers: buffers (hits + reads) the VACUUM with INDEX_CLEANUP ON touched
    index_pass_ms: that VACUUM's wall time, in milliseconds
    index_pass_scans: index passes that VACUUM ran
    index_pass_dead_items: dead item identifiers that VACUUM removed (a bypassed pass's included)
    autovacuum_after: dead row versions autovacuum would wait for before it vacuums the table
    """

    published_rows: int
    table_bytes: int
    index_bytes: int
    partial_index_bytes: int
    total_bytes: int
    claim_buffers: int
    claim_ms: float
    claim_rows: int
    vacuum_pages_scanned: int
    vacuum_pages_total: int
    vacuum_index_scans: int
    vacuum_buffers: int
    vacuum_dead_item_pages: int
    vacuum_bypassed: int
    vacuum_ms: float
    index_pass_buffers: int
    index_pass_ms: float
    index_pass_scans: int
    index_pass_dead_items: int
    autovacuum_after: int


def growth(lab: Lab, *, sizes: tuple[int, ...] = SIZES, tick: int = TICK) -> list[GrowthReading]:
    """The relay's outbox (relay.create_outbox, autovacuum off for it) grown through
    ``sizes`` published rows (written already published: the lab's shortcut for a history
    the relay worked through), always with a few unpublished ones.  At each size, after a
    VACUUM (ANALYZE) that brings it to a steady state: the relay publishes ``tick`` events
    and a plain VACUUM runs (``vacuum_*``; ``vacuum_index_scans`` is 0 when it bypassed
    the index pass, which it does while fewer than 2 % of the pages hold dead items);
    it publishes ``tick`` more and a VACUUM with INDEX_CLEANUP ON runs (``index_pass_*``:
    the pass forced, as a plain VACUUM or autovacuum makes it once enough pages hold dead
    rows; ``index_pass_dead_items`` counts the dead items it removed, a bypassed VACUUM's
    included); then the claim is measured (``claim_buffers``, ``claim_ms``).  Also
    ``table_bytes``, ``index_bytes``, ``partial_index_bytes``, ``total_bytes`` and
    ``autovacuum_after`` (dead row versions autovacuum would wait for).  One
    :class:`GrowthReading` per size."""
    check_params(sizes=sizes)
    number("tick", tick, low=1, high=MAX_BATCH, whole=True, example=TICK)
    create_outbox(lab)
    lab.execute("ALTER TABLE outbox SET (autovacuum_enabled = off)")
    ids = _Ids()
    _arrive(lab, ids, WAITING)
    start = lab.execute("SELECT now() - interval '30 days'")[0][0]
    have = 0
    out: list[GrowthReading] = []
    for size in sizes:
        _history(lab, size - have, first=have + 1, start=start, step_s=1.0)
        have = size
        settle(lab)                            # steady state: history pages all-visible
        _arrive(lab, ids, tick)
        _relay_tick(lab, tick)
        plain = vacuum(lab)
        _arrive(lab, ids, tick)
        _relay_tick(lab, tick)
        full = vacuum(lab, "INDEX_CLEANUP ON")
        claim = claim_cost(lab)
        disk = disk_sizes(lab)
        out.append(GrowthReading(
            published_rows=size, table_bytes=disk["table_bytes"], index_bytes=disk["index_bytes"],
            partial_index_bytes=disk["partial_index_bytes"], total_bytes=disk["total_bytes"],
            claim_buffers=claim["buffers"], claim_ms=claim["ms"], claim_rows=claim["rows"],
            vacuum_pages_scanned=int(plain["pages_scanned"]), vacuum_pages_total=int(plain["pages_total"]),
            vacuum_index_scans=int(plain["index_scans"]), vacuum_buffers=int(plain["buffers"]),
            vacuum_dead_item_pages=int(plain["dead_item_pages"]), vacuum_bypassed=int(plain["bypassed"]),
            vacuum_ms=plain["ms"],
            index_pass_buffers=int(full["buffers"]), index_pass_ms=full["ms"],
            index_pass_scans=int(full["index_scans"]), index_pass_dead_items=int(full["dead_items"]),
            autovacuum_after=int(lab.execute(_q("autovacuum_after"))[0][0])))
    return out


# -- 2. way out A: batched deletes ---------------------------------------------------------------


def _this_hour(lab: Lab) -> datetime:
    """The start of the server's current hour, in UTC (so that adding hours never meets a
    daylight-saving change)."""
    return lab.execute("SELECT date_trunc('hour', now())")[0][0].astimezone(timezone.utc)


def _history_bounds(lab: Lab, history: int, hours: int) -> tuple[datetime, datetime, float]:
    """(start, cutoff, step_s): the history spans the ``hours`` whole hours before the
    current one; the cutoff is the current hour's start."""
    cutoff = _this_hour(lab)
    return cutoff - timedelta(hours=hours), cutoff, hours * 3600 / history


@dataclass(frozen=True)
class DeleteWay(Result):
    """Way out A, measured: the old published rows deleted in batches, then VACUUM
    (:func:`delete_way`).

    delete_rows: published rows the cleanup deleted
    delete_batches: DELETE transactions that deleted at least one row
    delete_ms: the cleanup loop's wall time, in milliseconds
    delete_wal_bytes: WAL written over the loop, in bytes (whose: ``wal_scope``)
    wal_scope: whose WAL ``delete_wal_bytes`` counts: "this session" (PostgreSQL 18+) or "the whole server"
    delete_dead_tuples: dead row versions the VACUUM afterwards found (one per deleted row)
    vacuum_removed: dead row versions that VACUUM removed
    vacuum_ms: that VACUUM's wall time, in milliseconds
    vacuum_wal_bytes: the WAL that VACUUM wrote, in bytes
    vacuum_index_scans: index passes that VACUUM ran
    table_bytes_before: the table (heap) on disk before the cleanup, in bytes
    table_bytes_after: the same after the cleanup and its VACUUM (it does not shrink)
    total_bytes_before: table, indexes and TOAST before the cleanup, in bytes
    total_bytes_after: the same after the cleanup and its VACUUM, in bytes
    claim_buffers: buffers (8 kB pages, hits + reads) the relay's claim of 10 rows read here,
        before the cleanup (the same history as :func:`drop_way`'s claim)
    claim_locks: relations the relay's claim locks on this outbox (the table and its indexes)
    unpublished_left: unpublished events still in the outbox afterwards
    """

    delete_rows: int
    delete_batches: int
    delete_ms: float
    delete_wal_bytes: int
    wal_scope: str
    delete_dead_tuples: int
    vacuum_removed: int
    vacuum_ms: float
    vacuum_wal_bytes: int
    vacuum_index_scans: int
    table_bytes_before: int
    table_bytes_after: int
    total_bytes_before: int
    total_bytes_after: int
    claim_buffers: int
    claim_locks: int
    unpublished_left: int


def delete_way(lab: Lab, *, history: int = HISTORY, batch: int = BATCH, hours: int = HOURS) -> DeleteWay:
    """Way out A on the relay's outbox holding ``history`` published rows (over ``hours``
    hours) and a few unpublished ones: the cleanup (outbox_size.sql ``cleanup_batch``)
    deletes every published row older than the current hour, ``batch`` rows a
    transaction, until a batch deletes nothing; then VACUUM.  Returns ``delete_rows``,
    ``delete_batches``, ``delete_ms``, ``delete_wal_bytes`` (the WAL the cleanup's session
    wrote; before PostgreSQL 18, the whole server's over the loop: ``wal_scope`` says which),
    ``delete_dead_tuples`` (dead row versions VACUUM found afterwards: one per deleted
    row), ``vacuum_ms``, ``vacuum_wal_bytes``, ``vacuum_index_scans``,
    ``table_bytes_before``/``after`` (the heap: it does not shrink -- VACUUM gives back
    only empty pages at the end of the file, and the newest rows sit there),
    ``total_bytes_before``/``after``, ``claim_buffers``, ``claim_locks`` and ``unpublished_left`` (a
    :class:`DeleteWay`)."""
    check_params(history=history, batch=batch)
    number("hours", hours, low=1, high=48, whole=True, example=HOURS)
    create_outbox(lab)
    lab.execute("ALTER TABLE outbox SET (autovacuum_enabled = off)")
    start, cutoff, step_s = _history_bounds(lab, history, hours)
    _history(lab, history, first=1, start=start, step_s=step_s)
    _arrive(lab, _Ids(), WAITING)
    settle(lab)
    before = disk_sizes(lab)
    claim = claim_cost(lab)
    deleted = batches = 0
    with lab.connect(role="cleanup") as conn:
        lsn = _wal_mark(conn)
        scope = wal_scope(conn)
        t0 = time.perf_counter()
        while True:
            n = conn.execute(_q("cleanup_batch"), {"n": batch, "older_than": cutoff}).rowcount
            if n <= 0:
                break
            deleted += n
            batches += 1
        ms = (time.perf_counter() - t0) * 1000
        wal = _wal_since(conn, lsn)
    vac = vacuum(lab)
    after = disk_sizes(lab)
    return DeleteWay(delete_rows=deleted, delete_batches=batches, delete_ms=round(ms, 1),
                     delete_wal_bytes=wal, wal_scope=scope, delete_dead_tuples=int(vac["dead_items"]),
                     vacuum_removed=int(vac["removed"]),
                     vacuum_ms=vac["ms"], vacuum_wal_bytes=int(vac["wal_bytes"]),
                     vacuum_index_scans=int(vac["index_scans"]),
                     table_bytes_before=before["table_bytes"], table_bytes_after=after["table_bytes"],
                     total_bytes_before=before["total_bytes"], total_bytes_after=after["total_bytes"],
                     claim_buffers=claim["buffers"], claim_locks=claim["locks"],
                     unpublished_left=_unpublished(lab))


def _unpublished(lab: Lab) -> int:
    return int(lab.execute("SELECT count(*) FROM outbox WHERE published_at IS NULL")[0][0])


# -- 3. way out B: time partitions -----------------------------------------------------------------


def _partition_name(at: datetime) -> str:
    return "outbox_" + at.strftime("%Y%m%d_%H")


def create_partitioned(lab: Lab, *, first: datetime, hours: int) -> list[str]:
    """The partitioned outbox (outbox_size.sql ``partitioned_outbox``), made afresh, with
    one partition per hour from ``first``: ``hours`` hours, plus the two after them (the
    current hour and the next, made ahead).  Returns the partition names, oldest first."""
    lab.execute("DROP TABLE IF EXISTS inbox, outbox, shop_order CASCADE")
    for statement in query(FILE, "partitioned_outbox").statements:
        lab.execute(statement)
    names = []
    for h in range(hours + 2):
        lo = first + timedelta(hours=h)
        names.append(_partition_name(lo))
        lab.execute(_ddl("partition", partition=names[-1], start=lo, stop=lo + timedelta(hours=1)))
    return names


def _unique_event_id_refused(lab: Lab) -> str | None:
    """The server's answer to UNIQUE (event_id) on the partitioned outbox: its error
    message, or None if it took it."""
    try:
        with lab.admin.transaction(force_rollback=True):
            lab.admin.execute(_q("unique_event_id"))
    except psycopg.Error as exc:
        return f"{exc.sqlstate}: {str(exc).strip().splitlines()[0]}"
    return None


def remove_partition(lab: Lab, name: str, conn: psycopg.Connection | None = None) -> None:
    """Take an old partition out (DETACH ... CONCURRENTLY), check it holds no unpublished
    event, and drop it.  An unpublished event stops the drop: the partition is attached
    again (same bounds, as it was) and a LabkitError says so."""
    conn = conn or lab.admin
    bound = one_row(conn.execute("SELECT pg_get_expr(c.relpartbound, c.oid) FROM pg_class c "
                                 "WHERE c.oid = %s::regclass", (sql.Identifier(name).as_string(conn),)),
                    f"the bounds of partition {name}")[0]
    conn.execute(_ddl("detach", partition=name))
    left = one_row(conn.execute(_ddl("unpublished_in", partition=name)), f"{FILE}'s unpublished_in")[0]
    if left:
        conn.execute(sql.SQL("ALTER TABLE outbox ATTACH PARTITION {} " + bound).format(sql.Identifier(name)))
        raise LabkitError(f"Partition {name} still holds {left} unpublished event(s): dropping it "
                          "would lose them. It was attached again.",
                          "let the relay publish them (or move them), then remove the partition.")
    conn.execute(_ddl("drop", partition=name))


@dataclass(frozen=True)
class DropWay(Result):
    """Way out B, measured: the same history in hourly partitions, the old ones detached and
    dropped, then VACUUM (:func:`drop_way`).

    drop_partitions: old partitions removed
    drop_rows: published rows they held
    drop_ms: the removals' wall time, in milliseconds
    drop_wal_bytes: WAL written over the removals, in bytes (whose: ``wal_scope``)
    wal_scope: whose WAL ``drop_wal_bytes`` counts: "this session" (PostgreSQL 18+) or "the whole server"
    drop_dead_tuples: dead row versions the VACUUM afterwards found (none: the files are gone)
    table_bytes_before: the tables (heaps) of every partition on disk before, in bytes
    table_bytes_after: the same after the removals and the VACUUM (it shrinks)
    total_bytes_before: tables, indexes and TOAST of every partition before, in bytes
    total_bytes_after: the same after the removals and the VACUUM, in bytes
    claim_buffers: buffers (8 kB pages, hits + reads) the relay's claim of 10 rows read here
    claim_locks: relations that claim locks: the outbox, every partition and their indexes (none pruned)
    unique_event_id_refused: the server's error for UNIQUE (event_id) here, "SQLSTATE: message" (None: took it)
    unpublished_left: unpublished events still in the outbox afterwards
    """

    drop_partitions: int
    drop_rows: int
    drop_ms: float
    drop_wal_bytes: int
    wal_scope: str
    drop_dead_tuples: int
    table_bytes_before: int
    table_bytes_after: int
    total_bytes_before: int
    total_bytes_after: int
    claim_buffers: int
    claim_locks: int
    unique_event_id_refused: str | None
    unpublished_left: int


def drop_way(lab: Lab, *, history: int = HISTORY, hours: int = HOURS) -> DropWay:
    """Way out B on the same history as :func:`delete_way`, in hourly partitions: every
    partition older than the current hour is removed (:func:`remove_partition`), then
    VACUUM.  Returns ``drop_partitions``, ``drop_rows``, ``drop_ms``, ``drop_wal_bytes``
    (the removing session's WAL, or the whole server's before PostgreSQL 18: ``wal_scope``), ``drop_dead_tuples`` (what VACUUM found
    afterwards: none), ``table_bytes_before``/``after`` and ``total_bytes_before``/``after``
    (they do shrink: the files are gone), ``claim_buffers``, ``claim_locks`` (the claim
    locks every partition and its index: no partition can be pruned by created_at) and
    ``unique_event_id_refused`` (the server's error for UNIQUE (event_id)), and
    ``unpublished_left`` (a :class:`DropWay`)."""
    check_params(history=history, batch=1)
    number("hours", hours, low=1, high=48, whole=True, example=HOURS)
    start, cutoff, step_s = _history_bounds(lab, history, hours)
    names = create_partitioned(lab, first=start, hours=hours)
    refused = _unique_event_id_refused(lab)
    _history(lab, history, first=1, start=start, step_s=step_s)
    _arrive(lab, _Ids(), WAITING)
    settle(lab)
    before = disk_sizes(lab)
    claim = claim_cost(lab)
    old = names[:hours]
    rows = int(lab.execute("SELECT count(*) FROM outbox WHERE created_at < %s", (cutoff,))[0][0])
    with lab.connect(role="cleanup") as conn:
        lsn = _wal_mark(conn)
        scope = wal_scope(conn)
        t0 = time.perf_counter()
        for name in old:
            remove_partition(lab, name, conn)
        ms = (time.perf_counter() - t0) * 1000
        wal = _wal_since(conn, lsn)
    vac = vacuum(lab)
    after = disk_sizes(lab)
    return DropWay(drop_partitions=len(old), drop_rows=rows, drop_ms=round(ms, 1),
                   drop_wal_bytes=wal, wal_scope=scope, drop_dead_tuples=int(vac["dead_items"]),
                   table_bytes_before=before["table_bytes"], table_bytes_after=after["table_bytes"],
                   total_bytes_before=before["total_bytes"], total_bytes_after=after["total_bytes"],
                   claim_buffers=claim["buffers"], claim_locks=claim["locks"],
                   unique_event_id_refused=refused, unpublished_left=_unpublished(lab))


# -- the two compared --------------------------------------------------------------------------------


@dataclass(frozen=True)
class SizeTrace(Result):
    """The outbox's growth and the two ways out on one history (:func:`size_trace`); the
    lists hold one value per size of ``sizes``, smallest first.

    history: published rows ways A and B both shed
    batch: rows one cleanup DELETE takes (way A)
    sizes: the history sizes growth was read at, in published rows
    growth: one :class:`GrowthReading` per size
    claim_buffers: per size, buffers (8 kB pages) the relay's claim of 10 rows read
    table_bytes: per size, the table (heap) on disk, in bytes
    total_bytes: per size, table, indexes and TOAST on disk, in bytes
    vacuum_buffers: per size, buffers a plain VACUUM after one tick touched
    index_pass_buffers: per size, buffers a VACUUM with its index pass forced touched
    autovacuum_after: per size, dead row versions autovacuum would wait for
    delete_rows: A: published rows the batched DELETE removed
    delete_batches: A: DELETE transactions that removed rows
    delete_ms: A: the cleanup loop's wall time, in milliseconds
    delete_wal_bytes: A: WAL written by the cleanup, in bytes (see :class:`DeleteWay`'s ``wal_scope``)
    delete_dead_tuples: A: dead row versions the VACUUM afterwards found
    delete_vacuum_ms: A: that VACUUM's wall time, in milliseconds
    delete_vacuum_wal_bytes: A: the WAL that VACUUM wrote, in bytes
    delete_table_bytes_before: A: the table on disk before the cleanup, in bytes
    delete_table_bytes_after: A: the table on disk after the cleanup and its VACUUM, in bytes
    delete_total_bytes_before: A: table, indexes and TOAST before, in bytes
    delete_total_bytes_after: A: table, indexes and TOAST after, in bytes
    drop_partitions: B: old partitions detached and dropped
    drop_rows: B: published rows they held
    drop_ms: B: the removals' wall time, in milliseconds
    drop_wal_bytes: B: WAL written by the removals, in bytes (see :class:`DropWay`'s ``wal_scope``)
    drop_dead_tuples: B: dead row versions the VACUUM afterwards found
    drop_table_bytes_before: B: the partitions' tables on disk before, in bytes
    drop_table_bytes_after: B: the partitions' tables on disk after, in bytes
    drop_total_bytes_before: B: tables, indexes and TOAST before, in bytes
    drop_total_bytes_after: B: tables, indexes and TOAST after, in bytes
    partitioned_claim_buffers: B: buffers the relay's claim of 10 rows read on the partitioned outbox
    claim_locks_plain: relations the claim locks on A's plain outbox
    claim_locks_partitioned: relations the claim locks on B's partitioned outbox
    unique_event_id_refused: the server's error for UNIQUE (event_id) on B's outbox ("SQLSTATE: message")
    """

    history: int
    batch: int
    sizes: list[int]
    growth: list[GrowthReading]
    claim_buffers: list[int]
    table_bytes: list[int]
    total_bytes: list[int]
    vacuum_buffers: list[int]
    index_pass_buffers: list[int]
    autovacuum_after: list[int]
    delete_rows: int
    delete_batches: int
    delete_ms: float
    delete_wal_bytes: int
    delete_dead_tuples: int
    delete_vacuum_ms: float
    delete_vacuum_wal_bytes: int
    delete_table_bytes_before: int
    delete_table_bytes_after: int
    delete_total_bytes_before: int
    delete_total_bytes_after: int
    drop_partitions: int
    drop_rows: int
    drop_ms: float
    drop_wal_bytes: int
    drop_dead_tuples: int
    drop_table_bytes_before: int
    drop_table_bytes_after: int
    drop_total_bytes_before: int
    drop_total_bytes_after: int
    partitioned_claim_buffers: int
    claim_locks_plain: int
    claim_locks_partitioned: int
    unique_event_id_refused: str | None


def size_trace(lab: Lab, *, history: int = HISTORY, batch: int = BATCH,
               sizes: tuple[int, ...] = SIZES, hours: int = HOURS) -> SizeTrace:
    """:func:`growth` over ``sizes``, then ways A (:func:`delete_way`) and B
    (:func:`drop_way`) on the same ``history``: a :class:`SizeTrace`, with ``sizes``,
    ``growth`` (one :class:`GrowthReading` per size), ``claim_buffers``, ``table_bytes``,
    ``total_bytes``, ``vacuum_buffers``, ``index_pass_buffers``, ``autovacuum_after`` (each
    a list, one value per size); A's ``delete_*`` fields, ``delete_vacuum_ms``,
    ``delete_vacuum_wal_bytes``, ``delete_table_bytes_before``/``after``,
    ``delete_total_bytes_before``/``after``; B's ``drop_*`` fields,
    ``drop_table_bytes_before``/``after``, ``drop_total_bytes_before``/``after``,
    ``partitioned_claim_buffers``, ``claim_locks_plain``, ``claim_locks_partitioned``,
    ``unique_event_id_refused``; ``history``, ``batch``."""
    check_params(sizes=sizes, history=history, batch=batch)
    number("hours", hours, low=1, high=48, whole=True, example=HOURS)
    rows = growth(lab, sizes=sizes)
    a = delete_way(lab, history=history, batch=batch, hours=hours)
    b = drop_way(lab, history=history, hours=hours)
    return SizeTrace(
        history=history, batch=batch, sizes=list(sizes), growth=rows,
        claim_buffers=[r.claim_buffers for r in rows], table_bytes=[r.table_bytes for r in rows],
        total_bytes=[r.total_bytes for r in rows], vacuum_buffers=[r.vacuum_buffers for r in rows],
        index_pass_buffers=[r.index_pass_buffers for r in rows],
        autovacuum_after=[r.autovacuum_after for r in rows],
        delete_rows=a.delete_rows, delete_batches=a.delete_batches, delete_ms=a.delete_ms,
        delete_wal_bytes=a.delete_wal_bytes, delete_dead_tuples=a.delete_dead_tuples,
        delete_vacuum_ms=a.vacuum_ms, delete_vacuum_wal_bytes=a.vacuum_wal_bytes,
        delete_table_bytes_before=a.table_bytes_before, delete_table_bytes_after=a.table_bytes_after,
        delete_total_bytes_before=a.total_bytes_before, delete_total_bytes_after=a.total_bytes_after,
        drop_partitions=b.drop_partitions, drop_rows=b.drop_rows, drop_ms=b.drop_ms,
        drop_wal_bytes=b.drop_wal_bytes, drop_dead_tuples=b.drop_dead_tuples,
        drop_table_bytes_before=b.table_bytes_before, drop_table_bytes_after=b.table_bytes_after,
        drop_total_bytes_before=b.total_bytes_before, drop_total_bytes_after=b.total_bytes_after,
        partitioned_claim_buffers=b.claim_buffers,
        claim_locks_plain=a.claim_locks, claim_locks_partitioned=b.claim_locks,
        unique_event_id_refused=b.unique_event_id_refused)


# -- the cleanup beside a relay (scripted sessions) ----------------------------------------------------


def _literal(lab: Lab, text: str, params: dict) -> str:
    """``text`` with ``params`` written in, for a scripted session (which sends plain SQL)."""
    return psycopg.ClientCursor(lab.admin).mogrify(text, params)


def _claim_step(n: int) -> str:
    """A scripted relay's claim: relay.py's claim of ``n`` rows in a new transaction, showing
    only the ids it locked (the transaction stays open: the locks are the claim)."""
    return ("BEGIN;\nWITH claim AS (\n" + claim_text(n) + "\n)\n"
            "SELECT string_agg(id::text, ', ' ORDER BY id) AS claimed_ids FROM claim")


def _claimed(step) -> int | None:
    """How many ids a :func:`_claim_step` step claimed."""
    if not step.done or step.error:
        return None
    ids = step.rows[0][0] if step.rows else None
    return len(ids.split(",")) if ids else 0


def _delete_step(text: str) -> str:
    """A scripted cleaner's batch (a DELETE) showing the ids it deleted."""
    return ("WITH deleted AS (\n" + text.rstrip().rstrip(";") + "\nRETURNING id\n)\n"
            "SELECT string_agg(id::text, ', ' ORDER BY id) AS deleted_ids FROM deleted")


def _deleted(step) -> int | None:
    """How many ids a :func:`_delete_step` step deleted."""
    if not step.done or step.error:
        return None
    ids = step.rows[0][0] if step.rows else None
    return len(ids.split(",")) if ids else 0


@dataclass(frozen=True)
class BesideRelay(Result):
    """The batched cleanup beside a relay's open claim, in scripted sessions
    (:func:`beside_relay`).

    relay_claimed: unpublished rows the relay's claim locked (None if the step did not finish)
    cleaner1_deleted: rows cleaner 1's batch (SKIP LOCKED, transaction kept open) deleted
    skip_deleted: rows cleaner 2's batch with SKIP LOCKED deleted
    skip_waited: whether that batch waited for a lock
    cleaner1_held_after_skip: rows cleaner 1 still held locked after cleaner 2's batch
    waiting_waited: whether cleaner 2's batch without SKIP LOCKED waited
    waiting_blocked_by: the sessions it waited for
    waiting_deleted: rows that batch deleted once it went on
    relay_held_throughout: whether the relay kept its claimed rows locked through every cleaner step
    unpublished_left: unpublished rows in the outbox at the end
    published_left: published rows in the outbox at the end
    transcript: the run, step by step, with the rows each session held locked (for display)
    """

    relay_claimed: int | None
    cleaner1_deleted: int | None
    skip_deleted: int | None
    skip_waited: bool
    cleaner1_held_after_skip: int
    waiting_waited: bool
    waiting_blocked_by: list[str]
    waiting_deleted: int | None
    relay_held_throughout: bool
    unpublished_left: int
    published_left: int
    transcript: Transcript = not_json()


def beside_relay(lab: Lab, *, batch: int = 4, history: int = 12, waiting: int = 3) -> BesideRelay:
    """The batched cleanup next to a relay, in scripted sessions (watching the outbox's
    row locks): the relay claims the ``waiting`` unpublished rows and keeps its transaction
    open; cleaner 1 deletes a batch of ``batch`` old published rows and keeps its
    transaction open; cleaner 2 runs the same batch (SKIP LOCKED) -- it takes the next
    ``batch`` rows without waiting -- and then the batch without SKIP LOCKED, which waits
    for cleaner 1 until cleaner 1 commits.  Cleaner 2 runs in autocommit: each batch commits
    as it ends.  Each batch shows the ids it deleted (``deleted_ids``).  The relay's rows are never in a cleaner's way:
    it locks unpublished rows, the cleanup reads published ones.

    Returns ``relay_claimed``, ``cleaner1_deleted``, ``skip_deleted``, ``skip_waited``,
    ``cleaner1_held_after_skip`` (cleaner 2 left them alone), ``waiting_waited``,
    ``waiting_blocked_by``, ``waiting_deleted``, ``relay_held_throughout`` (the relay kept
    its rows locked through every cleaner step), ``unpublished_left``,
    ``published_left`` and ``transcript`` (the run, for display): a :class:`BesideRelay`."""
    number("batch", batch, low=1, high=100, whole=True, example=4)
    number("waiting", waiting, low=1, high=100, whole=True, example=3)
    number("history", history, low=3 * batch, high=1000, whole=True, example=3 * batch)
    create_outbox(lab)
    start = lab.execute("SELECT now() - interval '2 hours'")[0][0]
    _history(lab, history, first=1, start=start, step_s=1.0)
    _arrive(lab, _Ids(), waiting)
    older_than = lab.execute("SELECT now() - interval '1 hour'")[0][0]
    skip = _delete_step(_literal(lab, _q("cleanup_batch"), {"n": batch, "older_than": older_than}))
    wait = _delete_step(_literal(lab, _q("cleanup_batch_waiting"),
                                 {"n": batch, "older_than": older_than}))
    with Sessions(lab, "relay", "cleaner1", "cleaner2", watch={"outbox": "id"}) as run:
        claim = run.relay(_claim_step(waiting), label=f"claim {waiting}, SKIP LOCKED")
        held = list(claim.locks_after.get("relay", []))
        c1 = run.cleaner1("BEGIN;\n" + skip, label=f"BEGIN; delete {batch}, SKIP LOCKED")
        c2 = run.cleaner2(skip, label=f"delete {batch}, SKIP LOCKED")
        c1_held = len(c2.locks_after.get("cleaner1", []))
        relay_kept = [c1.locks_after.get("relay", []), c2.locks_after.get("relay", [])]
        w = run.cleaner2(wait, label=f"delete {batch}, plain FOR UPDATE")
        relay_kept.append(w.locks_after.get("relay", []))
        run.cleaner1("COMMIT")
        run.relay("ROLLBACK", label="ROLLBACK: nothing marked")
        transcript = run.transcript()
    unpublished = _unpublished(lab)
    published = int(lab.execute("SELECT count(*) FROM outbox WHERE published_at IS NOT NULL")[0][0])
    return BesideRelay(relay_claimed=_claimed(claim), cleaner1_deleted=_deleted(c1),
                       skip_deleted=_deleted(c2), skip_waited=c2.waited,
                       cleaner1_held_after_skip=c1_held,
                       waiting_waited=w.waited, waiting_blocked_by=list(w.blocked_by),
                       waiting_deleted=_deleted(w),
                       relay_held_throughout=bool(held) and all(sorted(k) == sorted(held) for k in relay_kept),
                       unpublished_left=unpublished, published_left=published, transcript=transcript)


# -- what removing a partition locks -------------------------------------------------------------------


def _locks_while(lab: Lab, statement: sql.Composed) -> dict[str, str]:
    """The table locks this session holds right after ``statement``, in a transaction that
    is then rolled back: {table name: strongest mode} for the outbox and its partitions."""
    conn = lab.admin
    tables = {oid: name for oid, name, kind in conn.execute(_q("outbox_relations")).fetchall()
              if kind in ("r", "p")}
    strength = ["AccessShareLock", "RowShareLock", "RowExclusiveLock", "ShareUpdateExclusiveLock",
                "ShareLock", "ShareRowExclusiveLock", "ExclusiveLock", "AccessExclusiveLock"]
    held: dict[str, str] = {}
    with conn.transaction(force_rollback=True):
        conn.execute(statement)
        for oid, mode in conn.execute(_q("own_locks_on"), {"oids": list(tables)}).fetchall():
            name = tables[oid]
            if name not in held or strength.index(mode) > strength.index(held[name]):
                held[name] = mode
    return held


def _table_locks(lab: Lab, pid: int) -> list[tuple[str, str, bool]]:
    """(relation, mode, granted) for each lock session ``pid`` holds or waits for on the
    outbox's tables and indexes, read from ``lab.admin``."""
    return [tuple(r) for r in lab.admin.execute(_q("table_locks_of"), {"pid": pid}).fetchall()]


@dataclass(frozen=True)
class Removal(Result):
    """One way of taking the old partition out while relay 1 holds a claim open (scripted
    sessions): what :func:`partition_locks` reports for the DROP (:class:`DropRemoval`) and for
    DETACH ... CONCURRENTLY (:class:`DetachRemoval`).  ``<old>`` is the old partition.

    remover_waited: whether the DROP / DETACH waited
    remover_blocked_by: the sessions it waited for
    remover_error: the server's error for it, short (None: it ran)
    relay2_waited: whether relay 2's claim, sent after it, waited
    relay2_blocked_by: the sessions relay 2 waited for
    relay2_claimed_at_once: whether relay 2 claimed without waiting
    relay2_claimed: rows relay 2's claim took (None if it had not finished)
    remover_done_after_relay1_commit: whether the DROP / DETACH completed at relay 1's COMMIT
    remover_held: (relation, lock mode) of each table lock it held, read while relay 1 was open
    remover_asked: (relation, lock mode) of each table lock it was waiting for, read then
    remover_waits_for: (lock type, mode, the sessions holding it) of what it waited for, read then
    detach_pending: whether pg_inherits marked ``<old>`` as being detached, read then
    old_relations: ``<old>`` and its indexes: how many relations
    relay1_locked_old: how many of them relay 1's claim locked
    relay2_locked_old: how many of them relay 2's claim locked
    """

    remover_waited: bool
    remover_blocked_by: list[str]
    remover_error: str | None
    relay2_waited: bool
    relay2_blocked_by: list[str]
    relay2_claimed_at_once: bool
    relay2_claimed: int | None
    remover_done_after_relay1_commit: bool
    remover_held: list[tuple[str, str]]
    remover_asked: list[tuple[str, str]]
    remover_waits_for: list[tuple[str, str, list[str]]]
    detach_pending: bool
    old_relations: int
    relay1_locked_old: int
    relay2_locked_old: int


@dataclass(frozen=True)
class DropRemoval(Removal):
    """DROP TABLE of the old, attached partition while relay 1 holds a claim (see
    :class:`Removal` for the fields they share).

    partition_gone: whether the partition was gone afterwards
    transcript: the run, step by step (the old partition shown as ``<old>``; for display)
    """

    partition_gone: bool
    transcript: Transcript = not_json()


@dataclass(frozen=True)
class DetachRemoval(Removal):
    """DETACH PARTITION ... CONCURRENTLY of the old partition while relay 1 holds a claim (see
    :class:`Removal` for the fields they share).

    detached: whether the partition was detached afterwards (it is then dropped)
    transcript: the run, step by step (the old partition shown as ``<old>``; for display)
    """

    detached: bool
    transcript: Transcript = not_json()


def _one_removal(lab: Lab, remover: sql.Composable, label: str, old: str) -> dict[str, Any]:
    """relay 1 claims two events and keeps its transaction open (its tick, still running);
    ``remover`` runs; relay 2 claims; then, while relay 1 is still open, another session reads
    what the remover holds and waits for, whether ``old`` is marked as being detached, and
    which of ``old``'s relations relay 2's claim locked; relay 1 commits (it marked nothing:
    the claim alone is the point); relay 2 commits.  Returns the fields of a
    :class:`Removal`, and ``transcript``."""
    old_relations = {old, *(r[0] for r in lab.execute(
        "SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = %s::regclass",
        (sql.Identifier(old).as_string(lab.admin),)))}
    with Sessions(lab, "relay1", "remover", "relay2") as run:
        run.relay1(_claim_step(2), label="claim 2, SKIP LOCKED")
        r = run.remover(remover.as_string(lab.admin), label=label)
        r2 = run.relay2(_claim_step(2), label="claim 2, SKIP LOCKED")
        r2_claimed_at_once = not r2.waited
        names = {session.pid: name for name, session in run.sessions.items()}
        remover_pid = run.sessions["remover"].pid
        remover_locks = _table_locks(lab, remover_pid)
        waits = lab.admin.execute(_q("waits_for"), {"pid": remover_pid}).fetchall()
        relay1_pid = run.sessions["relay1"].pid
        pending = lab.admin.execute(_q("detach_pending"),
                                    {"partition": sql.Identifier(old).as_string(lab.admin)}).fetchall()
        relay2_on_old = sorted(n for n, _, granted in _table_locks(lab, run.sessions["relay2"].pid)
                               if granted and n in old_relations)
        relay1_on_old = sorted(n for n, _, granted in _table_locks(lab, relay1_pid)
                               if granted and n in old_relations)
        c1 = run.relay1("COMMIT", label="COMMIT: nothing marked")
        run.relay2("COMMIT")
        if not r.done:
            run.wait("remover")
        transcript = run.transcript()
    return {"remover_waited": r.waited, "remover_blocked_by": list(r.blocked_by),
            "remover_error": r.error.short() if r.error else None,
            "relay2_waited": r2.waited, "relay2_blocked_by": list(r2.blocked_by),
            "relay2_claimed_at_once": r2_claimed_at_once,
            "relay2_claimed": _claimed(r2),
            "remover_done_after_relay1_commit": r.completed_after == c1.index,
            "remover_held": [(n, m) for n, m, granted in remover_locks if granted],
            "remover_asked": [(n, m) for n, m, granted in remover_locks if not granted],
            "remover_waits_for": [(kind, mode, [names.get(p, p) for p in pids or []])
                                  for kind, mode, pids in waits],
            "detach_pending": bool(pending and pending[0][0]),
            "old_relations": len(old_relations), "relay1_locked_old": len(relay1_on_old),
            "relay2_locked_old": len(relay2_on_old),
            "transcript": transcript}


def _refused(lab: Lab, statement: sql.Composed | str, params: Any = None) -> str | None:
    """The server's error for ``statement`` (run in autocommit: DETACH ... CONCURRENTLY
    cannot run in a transaction block) as "SQLSTATE: message", or None if it ran."""
    try:
        lab.admin.execute(statement, params)
    except psycopg.Error as exc:
        return f"{exc.sqlstate}: {str(exc).strip().splitlines()[0]}"
    return None


@dataclass(frozen=True)
class PartitionLocks(Result):
    """What taking an old partition out locks, and what it does to relays claiming meanwhile
    (:func:`partition_locks`).

    partition: the old partition's name (``<old>`` in the transcripts)
    drop_locks: {table: strongest lock mode} held right after DROP TABLE of the attached partition
    detach_locks: {table: strongest lock mode} held right after a plain DETACH PARTITION
    claim_locks: the names of the tables and indexes one claim locks (every partition: none is pruned)
    drop: the DROP TABLE run beside relay 1's open claim (a :class:`DropRemoval`)
    detach: the DETACH ... CONCURRENTLY run beside it (a :class:`DetachRemoval`)
    no_partition_refused: the server's error for an event past the last partition ("SQLSTATE: message")
    default_refused: its error for DETACH ... CONCURRENTLY with a DEFAULT partition ("SQLSTATE: message")
    """

    partition: str
    drop_locks: dict[str, str]
    detach_locks: dict[str, str]
    claim_locks: list[str]
    drop: DropRemoval
    detach: DetachRemoval
    no_partition_refused: str | None
    default_refused: str | None


def partition_locks(lab: Lab) -> PartitionLocks:
    """What taking an old partition out locks, read from pg_locks, and what it does to
    relays claiming meanwhile (scripted sessions).

    ``drop_locks`` / ``detach_locks``: {table: lock mode} held right after DROP TABLE of an
    attached partition / a plain DETACH PARTITION (rolled back).  ``claim_locks``: the
    tables and indexes one claim locks (every partition: none is pruned).  Then two runs,
    each with relay 1's claim transaction open: ``drop`` -- DROP TABLE of the old partition
    waits for relay 1, and relay 2's claim waits behind the DROP (``relay2_waited``,
    ``relay2_blocked_by``): the relays stall until relay 1 ends; ``detach`` -- DETACH
    PARTITION ... CONCURRENTLY also waits for relay 1, but relay 2 claims at once, and the
    detach completes when relay 1 commits.  Each run has its ``transcript`` (the old
    partition appears there as ``<old>``, so that it reads the same every hour), and what
    another session read while relay 1 was still open: ``remover_held`` / ``remover_asked``
    (its table locks, granted or waited for), ``remover_waits_for`` ((lock type, mode,
    sessions) of what it waits for), ``detach_pending`` (pg_inherits' mark on ``<old>``),
    ``old_relations`` (``<old>`` and its indexes) and how many of them relay 1's and relay 2's
    claims locked (``relay1_locked_old``, ``relay2_locked_old``).

    Last, the partitions' own limits, as the server states them: ``no_partition_refused``,
    its error for an event created after the last partition ends; ``default_refused``, its
    error for DETACH ... CONCURRENTLY once the outbox has a DEFAULT partition.  A
    :class:`PartitionLocks`."""
    hour = _this_hour(lab)
    first = hour - timedelta(hours=1)
    names = create_partitioned(lab, first=first, hours=1)
    old = names[0]

    def fill_old() -> None:
        _history(lab, 20, first=ids.take(20), start=first + timedelta(minutes=1), step_s=1.0)

    ids = _Ids()
    fill_old()
    _arrive(lab, ids, 6)
    drop_locks = _locks_while(lab, _ddl("drop", partition=old))
    detach_locks = _locks_while(lab, sql.SQL("ALTER TABLE outbox DETACH PARTITION {}").format(sql.Identifier(old)))
    with lab.admin.transaction(force_rollback=True):
        lab.admin.execute(claim_text(2))
        claim_locks = sorted({r[0] for r in lab.admin.execute(_q("own_locks")).fetchall()})
    dropped = _one_removal(lab, _ddl("drop", partition=old), "DROP TABLE <old>", old)
    gone = not lab.execute("SELECT 1 FROM pg_class WHERE relname = %s AND relnamespace = "
                           "%s::regnamespace", (old, lab.schema))
    lab.execute(_ddl("partition", partition=old, start=first, stop=hour))
    fill_old()
    detached = _one_removal(lab, _ddl("detach", partition=old), "DETACH <old> CONCURRENTLY", old)
    still_attached = bool(lab.execute("SELECT 1 FROM pg_inherits WHERE inhrelid = %s::regclass",
                                      (sql.Identifier(old).as_string(lab.admin),)))
    if not still_attached:
        lab.execute(_ddl("drop", partition=old))
    # the partitions' limits: an event past the last partition, and a DEFAULT partition
    late = _refused(lab, "INSERT INTO outbox (event_id, aggregate, payload, created_at) "
                         "VALUES ('evt-late', 'shop_order:0', '{}', %s)",
                    (hour + timedelta(hours=2),))    # the next hour's partition ends at hour + 2
    lab.execute(_ddl("default_partition", partition="outbox_default"))
    default = _refused(lab, _ddl("detach", partition=names[1]))
    lab.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier("outbox_default")))
    return PartitionLocks(partition=old, drop_locks=drop_locks, detach_locks=detach_locks,
                          claim_locks=claim_locks, drop=DropRemoval(**dropped, partition_gone=gone),
                          detach=DetachRemoval(**detached, detached=not still_attached),
                          no_partition_refused=late, default_refused=default)


# -- command line ------------------------------------------------------------------------------------

SUMMARY_KEYS = ("history", "batch", "sizes", "claim_buffers", "table_bytes", "vacuum_buffers",
                "index_pass_buffers", "autovacuum_after",
                "delete_rows", "delete_batches", "delete_ms", "delete_wal_bytes", "delete_dead_tuples",
                "delete_vacuum_ms", "delete_vacuum_wal_bytes",
                "delete_table_bytes_before", "delete_table_bytes_after",
                "drop_partitions", "drop_rows", "drop_ms", "drop_wal_bytes", "drop_dead_tuples",
                "drop_table_bytes_before", "drop_table_bytes_after",
                "partitioned_claim_buffers", "claim_locks_plain", "claim_locks_partitioned",
                "unique_event_id_refused")


def size_command(*, open_lab: Callable[[], Lab], history: int = HISTORY, batch: int = BATCH,
                 largest: int = SIZES[-1], json: bool = False) -> int:
    """``labkit trace outbox-size [--history N] [--batch N] [--largest N] [--json]``: the
    outbox at 0, ``largest / 4`` and ``largest`` published rows, then ways A and B on a
    history of ``history`` rows (:func:`size_trace`); a summary (:data:`SUMMARY_KEYS`)."""
    number("largest", largest, low=4, high=MAX_SIZE, whole=True, example=SIZES[-1])
    ladder = (0, largest // 4, largest)
    check_params(sizes=ladder, history=history, batch=batch)
    with open_lab() as lab:
        out = size_trace(lab, history=history, batch=batch, sizes=ladder)
    if json:
        print(out.to_json(only=SUMMARY_KEYS))
        return 0
    print(f"{'published rows':>15} {'outbox MB':>9} {'claim buffers':>14} {'VACUUM buffers':>15} "
          f"{'index pass buffers':>19} {'autovacuum after':>17}")
    for r in out.growth:
        print(f"{r.published_rows:>15,} {r.total_bytes / 2**20:>9.1f} {r.claim_buffers:>14} "
              f"{r.vacuum_buffers:>15} {r.index_pass_buffers:>19} {r.autovacuum_after:>17,}")
    print()
    print(f"Shedding {history:,} published rows:")
    print(f"  A  DELETE in batches of {batch:,}: {out.delete_ms:,.0f} ms, "
          f"{out.delete_wal_bytes / 2**20:.1f} MB of WAL, {out.delete_dead_tuples:,} dead row versions; "
          f"VACUUM after it {out.delete_vacuum_ms:,.0f} ms; table "
          f"{out.delete_table_bytes_before / 2**20:.1f} -> {out.delete_table_bytes_after / 2**20:.1f} MB")
    print(f"  B  detach + drop {out.drop_partitions} partitions: {out.drop_ms:,.0f} ms, "
          f"{out.drop_wal_bytes / 2**10:.0f} kB of WAL, {out.drop_dead_tuples} dead row versions; table "
          f"{out.drop_table_bytes_before / 2**20:.1f} -> {out.drop_table_bytes_after / 2**20:.1f} MB")
    return 0
