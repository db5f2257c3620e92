"""Change data capture: the outbox read from the write-ahead log, not polled from its table.

The relay of :mod:`labkit.labs.relay` asks the outbox table, again and again, for rows not
yet published, and marks each row it published with an UPDATE.  Change data capture reads
the outbox rows where PostgreSQL already wrote them down in order -- the WAL -- through a
*logical replication slot* with the ``test_decoding`` output plugin::

    pg_logical_slot_peek_changes(slot, ...)   -- the INSERTs of committed transactions
    publish each outbox INSERT to the broker
    pg_replication_slot_advance(slot, lsn)     -- confirm: the slot forgets what was sent

What it shows (:func:`cdc_trace`, every figure read back from the server or the broker):

* events come out in *commit* order, one whole transaction after another -- not in id
  order (ids are handed out at INSERT, transactions commit when they commit); a poller
  that remembers the highest id it saw skips the rows whose transactions commit later;
* no query reads the outbox table and no row is updated per published event;
* the costs: while the consumer does not read, the slot keeps *all* WAL written since its
  restart point (the whole server's, not the outbox's) -- ``pg_replication_slots`` shows it
  grow, and fall once the consumer has read and confirmed; a slot serves one consumer (two
  readers of one slot each get part of the stream); wal_level must be ``logical``, read
  only at server start; and a forgotten slot keeps WAL until the disk is full, unless
  ``max_slot_wal_keep_size`` (PostgreSQL 13+) or ``idle_replication_slot_timeout`` (18+)
  gives up the slot first.

:func:`plot_retained` draws the slot's retained WAL after each step of the trace (the
consumer reading and confirming, down, back).  :func:`streaming_trace` shows the exception
to "whole transactions, at their commit": a reader that asks for streaming of in-progress
transactions (PostgreSQL 14 and later) gets a large open transaction's changes before its
end -- here one that then rolls back.  :func:`held_back_trace` shows where the kept WAL
begins: at ``restart_lsn``, which a transaction open at the consumer's confirm holds behind
``confirmed_flush_lsn``.  :func:`failover_slot` creates a slot with PostgreSQL
17's ``failover => true`` and reads what pg_replication_slots says of it.

The slot is named after the lab's schema and dropped at the end of every run, also on an
error or an interrupt: a forgotten slot keeps WAL for ever.
"""

from __future__ import annotations

import json as jsonlib
import math
import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
import psycopg.sql

from ..core.db import Guards
from ..core.errors import LabkitError
from ..core.lab import Lab
from ..core.limits import number
from ..core.queries import query
from ..core.results import Result
from . import broker as brokers
from . import relay
from ._checked import one_row
from .broker import Broker

SQL = "cdc.sql"
PLUGIN = "test_decoding"
MAX_EVENTS = 1000
MAX_PRODUCERS = 8
MAX_DOWN_BYTES = 256 * 1024 * 1024
DEFAULT_DOWN_BYTES = 4 * 1024 * 1024
SPLIT_ROUNDS = 4                 # two consumers on one slot: four reads, two events each
DOWN_CHUNKS = 4                  # the unrelated WAL written while the consumer is down, in parts
READING_CHUNKS = 2               # ... and that many parts of the same size while it reads
SLOT_WAIT_S = 15                 # creating a slot waits for running transactions this long
LET_GO_S = 5                     # a confirmed slot's restart_lsn is given this long to move on
READ_GUARDS = Guards(lock_timeout="10s", statement_timeout="60s")


def _q(name: str) -> str:
    return query(SQL, name).sql


def slot_name(lab: Lab) -> str:
    """The lab's slot: its schema's name (at most 41 characters) and ``_cdc``."""
    return f"{lab.schema}_cdc"


# -- can this server decode? ------------------------------------------------------------------------


def _unavailable(lab: Lab) -> LabkitError | None:
    """Why this server cannot give the lab a logical slot, or None when it can."""
    wal, effective, max_slots, taken, may_replicate, user = lab.execute(
        _q("prerequisites"), {"slot": slot_name(lab)})[0]
    # From PostgreSQL 19 a server at wal_level = replica turns logical decoding on by itself
    # when the first logical slot is created (effective_wal_level shows it).
    dynamic = effective is not None and wal == "replica"
    if wal != "logical" and not dynamic:
        if lab.db.backend == "embedded":
            fix = ("run `labkit server stop && labkit server start` in a terminal: labkit starts "
                   "its embedded server with wal_level = logical, and a server reads wal_level "
                   "only when it starts.")
        else:
            fix = ("as a superuser on that server run ALTER SYSTEM SET wal_level = logical; then "
                   "restart the server (wal_level is read only at server start).")
        return LabkitError(f"Logical decoding is off on this server: wal_level is {wal!r}, and a "
                           "logical replication slot needs wal_level = logical.", fix)
    if not may_replicate:
        return LabkitError(f"The database user {user!r} may not create replication slots (it is "
                           "neither a superuser nor a role with the REPLICATION attribute).",
                           f"as a superuser run ALTER ROLE {user} REPLICATION; or connect as a "
                           "user that has it.")
    if taken >= max_slots:
        return LabkitError(f"All {max_slots} replication slots of this server are taken "
                           "(max_replication_slots).",
                           "drop a slot nobody reads any more (SELECT slot_name, active FROM "
                           "pg_replication_slots), or raise max_replication_slots and restart.")
    return None


def logical_decoding_available(lab: Lab) -> tuple[bool, str]:
    """(True, what was checked) when the lab can create a logical slot here; else (False,
    the one-paragraph error that names the fix).  Creates nothing."""
    err = _unavailable(lab)
    if err is not None:
        return False, str(err)
    wal = lab.execute("SHOW wal_level")[0][0]
    return True, (f"wal_level = {wal}; a replication slot is free; the user may create one;\n"
                  f"output plugin {PLUGIN}")


def check_available(lab: Lab) -> None:
    """Raise the LabkitError of :func:`logical_decoding_available` when it says no."""
    err = _unavailable(lab)
    if err is not None:
        raise err


# -- the slot ---------------------------------------------------------------------------------------


def drop_slot(lab: Lab, timeout_s: float = 10.0) -> bool:
    """Drop the lab's slot if it exists; True if there was one.  A session of the lab still
    using it (a read interrupted half-way) is ended first; a session that is not the lab's
    is never touched: the error names it.  Runs over a connection of its own, so it works
    after an interrupt left the lab's connections unusable."""
    name = slot_name(lab)
    mine = f"labkit:{lab.schema}"
    with lab.db.connect(role="cdc-drop", guards=READ_GUARDS) as c:
        deadline = time.monotonic() + timeout_s
        while True:
            row = c.execute(_q("slot_holder"), {"slot": name}).fetchone()
            if row is None:
                return False
            pid, app = row
            if pid is None:
                try:
                    c.execute(_q("drop_slot"), {"slot": name})
                    return True
                except psycopg.errors.ObjectInUse:      # taken again in between: look again
                    pass
                except psycopg.errors.UndefinedObject:  # dropped in between
                    return False
            elif (app or "") == mine or (app or "").startswith(mine + ":"):
                c.execute("SELECT pg_terminate_backend(%s)", (pid,))
            else:
                raise LabkitError(f"The replication slot {name} is in use by a session that is not "
                                  f"this lab's (pid {pid}, {app or 'no name'}).",
                                  f"end that session, then run SELECT pg_drop_replication_slot('{name}').")
            if time.monotonic() > deadline:
                raise LabkitError(f"The replication slot {name} was still in use after {timeout_s:g} s "
                                  "and could not be dropped: it keeps WAL until it is.",
                                  f"run SELECT pg_drop_replication_slot('{name}') once the session "
                                  "using it has ended (`labkit doctor` lists sessions).")
            time.sleep(0.05)


@contextmanager
def slot_errors(lab: Lab) -> Iterator[None]:
    """Around the creation of a logical slot: the server's refusals as LabkitErrors that
    name the fix (running transactions it waited for, no test_decoding, no logical
    decoding, no free slot).  The statement must run under a statement_timeout of
    :data:`SLOT_WAIT_S` for the first."""
    try:
        yield
    except (psycopg.errors.QueryCanceled, psycopg.errors.LockNotAvailable):
        with lab.db.connect(role="cdc-look") as look:
            writers = look.execute(_q("writers")).fetchall()
        who = ", ".join(f"pid {p} ({a}, open {s} s)" for p, a, s in writers) or "none left now"
        raise LabkitError(f"Creating the replication slot waited {SLOT_WAIT_S} s for the "
                          f"transactions already running to end, and they did not ({who}).",
                          "wait for the transactions named above to end, or end them where "
                          "they are yours (`labkit clean` ends your own idle ones), then run "
                          "this again.") from None
    except psycopg.errors.UndefinedFile:
        raise LabkitError(f"This server has no {PLUGIN} output plugin (a contrib module).",
                          "install the server's contrib modules (on Debian and Ubuntu they "
                          "ship with postgresql-NN; elsewhere postgresqlNN-contrib), or use the "
                          "embedded server.") from None
    except psycopg.errors.ObjectNotInPrerequisiteState as exc:
        raise LabkitError(f"The server refused a logical slot: {str(exc).strip()}.",
                          "set wal_level = logical (ALTER SYSTEM) and restart the server.") from None
    except psycopg.errors.ConfigurationLimitExceeded as exc:
        raise LabkitError(f"The server has no free replication slot: {str(exc).strip()}.",
                          "drop a slot nobody reads any more (SELECT slot_name, active FROM "
                          "pg_replication_slots), or raise max_replication_slots and restart.") from None


def _create_slot(lab: Lab, name: str | None = None, how: str = "create_slot") -> str:
    """Create the lab's slot (or the slot ``name``, with cdc.sql's query ``how``); returns
    the LSN its stream starts at."""
    name = name or slot_name(lab)
    with lab.connect(role="cdc-slot", guards=Guards(statement_timeout=f"{SLOT_WAIT_S}s")) as c, \
            slot_errors(lab):
        return one_row(c.execute(_q(how), {"slot": name}), f"{SQL}'s {how}")[0]


@contextmanager
def lab_slot(lab: Lab) -> Iterator[str]:
    """The lab's logical slot for the length of the block (a slot a killed run left behind
    is dropped first); dropped when the block ends, however it ends."""
    check_available(lab)
    try:
        drop_slot(lab)
        _create_slot(lab)
        yield slot_name(lab)
    finally:
        drop_slot(lab)


# -- reading the stream -------------------------------------------------------------------------------

_CHANGE = re.compile(r"^table (?P<table>\S+): (?P<op>INSERT|UPDATE|DELETE):(?P<cols>.*)$", re.S)
_COLUMN = re.compile(r" (?P<name>[^\s\[]+)\[(?P<type>[^\]]+)\]:(?P<value>'(?:[^']|'')*'|\S+)")
_WHOLE = {"smallint", "integer", "bigint", "oid"}


def _value(kind: str, text: str) -> Any:
    if text == "null":
        return None
    if text.startswith("'"):
        text = text[1:-1].replace("''", "'")
        return jsonlib.loads(text) if kind in ("json", "jsonb") else text
    if kind in _WHOLE:
        return int(text)
    if kind == "boolean":
        return text == "true"
    return text


def parse_change(line: str) -> dict:
    """One change line of test_decoding, e.g. ``table s.outbox: INSERT: id[bigint]:3
    event_id[text]:'evt-0003' ...``, as ``{"table", "op", "columns": {name: value}}``:
    integers as int, text unquoted, json parsed, null as None."""
    m = _CHANGE.match(line)
    if m is None:
        raise LabkitError(f"Not a test_decoding change line: {line[:80]!r}.",
                          "pass the data column of a row of pg_logical_slot_peek_changes.")
    cols = {c["name"]: _value(c["type"], c["value"]) for c in _COLUMN.finditer(m["cols"])}
    return {"table": m["table"], "op": m["op"], "columns": cols}


@dataclass
class Txn:
    """One decoded transaction that inserted into the outbox."""

    xid: int
    commit_lsn: str                       # the end of its commit record: where to confirm to
    events: list[dict] = field(default_factory=list)     # the outbox rows it inserted
    lines: list[tuple[str, int, str]] = field(default_factory=list)   # (lsn, xid, data) as read


def _transactions(rows: list[tuple[str, str, str]]) -> list[Txn]:
    txns: list[Txn] = []
    current: Txn | None = None
    for lsn, xid, data in rows:
        x = int(xid)
        if data.startswith("BEGIN"):
            current = Txn(x, "")
        elif data.startswith("COMMIT"):
            if current is not None:
                current.commit_lsn = lsn
                current.lines.append((lsn, x, data))
                txns.append(current)
            current = None
            continue
        elif current is not None:
            current.events.append(parse_change(data)["columns"])
        if current is not None:
            current.lines.append((lsn, x, data))
    return txns


class Consumer:
    """The change-data-capture consumer: reads the lab's slot over a connection of its own.
    :meth:`deliver` is the whole loop: peek, publish each outbox INSERT, confirm."""

    def __init__(self, lab: Lab, slot: str, role: str = "cdc-consumer"):
        self.slot = slot
        self.prefix = f"table {lab.schema}.outbox: INSERT:"
        self.conn = lab.connect(role=role, guards=READ_GUARDS)

    def read(self, *, consume: bool = False) -> list[Txn]:
        """The outbox transactions the slot holds, in commit order.  ``consume=True`` reads
        with pg_logical_slot_get_changes: confirmed as soon as it returns."""
        rows = self.conn.execute(_q("get" if consume else "peek"),
                                 {"slot": self.slot, "prefix": self.prefix}).fetchall()
        return _transactions(rows)

    def confirm(self, lsn: str) -> str:
        """Tell the slot everything up to ``lsn`` is done; returns where it now stands."""
        return one_row(self.conn.execute(_q("confirm"), {"slot": self.slot, "upto": lsn}),
                       "cdc.sql's confirm")[0]

    def deliver(self, broker: Broker) -> list[Txn]:
        """Peek, publish every outbox event to ``broker`` in stream order, then confirm up to
        the last commit published (a crash before the confirm publishes them again: at
        least once, as with the relay)."""
        txns = self.read()
        for t in txns:
            for e in t.events:
                broker.publish(e["event_id"], e["payload"])
        if txns:
            self.confirm(txns[-1].commit_lsn)
        return txns

    def close(self) -> None:
        self.conn.close()


class ListBroker(Broker):
    """A broker that is a Python list: for a comparison nobody consumes."""

    kind = "list"

    def __init__(self) -> None:
        self.messages: list[tuple[str, dict]] = []

    def publish(self, event_id: str, body: dict) -> None:
        self.messages.append((event_id, body))

    def depth(self) -> int:
        return len(self.messages)

    def take_all(self) -> list[tuple[str, dict]]:
        out, self.messages = self.messages, []
        return out

    def set_up(self, up: bool) -> None:
        pass

    def reset(self) -> ListBroker:
        self.messages = []
        return self

    def describe(self) -> str:
        return "a Python list"


# -- the producers -------------------------------------------------------------------------------------


class _Producers:
    """``n`` producer sessions writing interleaved transactions: in each round every one of
    them BEGINs and inserts an order and its outbox row (ids ascending), then they COMMIT
    in the reverse order."""

    def __init__(self, lab: Lab, n: int):
        self.lab = lab
        self.conns = [lab.connect(role=f"cdc-prod-{i + 1}") for i in range(n)]
        self.next_order = 1
        self.committed: list[tuple[int, int]] = []          # (outbox id, xid), commit order

    def round(self, k: int, after_first_commit: Callable[[], None] | None = None) -> None:
        conns = self.conns[:k]
        position: dict[int, tuple[int, int]] = {}
        open_: list[psycopg.Connection] = []
        try:
            for i, c in enumerate(conns):
                order_id = self.next_order
                self.next_order += 1
                c.execute("BEGIN")
                open_.append(c)
                params = {"order_id": order_id, "item": relay.ITEMS[order_id % len(relay.ITEMS)],
                          "event_id": relay.event_id(order_id)}
                for stmt in relay.PRODUCE:
                    c.execute(stmt, params)
                oid, xid = one_row(c.execute(_q("producer_position")), "cdc.sql's producer_position")
                position[i] = (int(oid), int(xid))
            for j, i in enumerate(reversed(range(k))):
                conns[i].execute("COMMIT")
                open_.remove(conns[i])
                self.committed.append(position[i])
                if j == 0 and after_first_commit is not None:
                    after_first_commit()
        finally:
            for c in open_:
                if not c.closed and not c.broken:
                    try:
                        c.execute("ROLLBACK")
                    except psycopg.Error:
                        pass

    def write(self, n: int, after_first_commit: Callable[[], None] | None = None) -> None:
        """``n`` events in rounds of as many transactions as there are producers."""
        first = True
        while n > 0:
            k = min(n, len(self.conns))
            self.round(k, after_first_commit if first else None)
            first = False
            n -= k

    def close(self) -> None:
        for c in self.conns:
            c.close()


def unrelated_table(lab: Lab) -> None:
    """The lab's table that is not the outbox, made afresh (empty)."""
    for stmt in query(SQL, "unrelated_table").statements:
        lab.execute(stmt)


def unrelated_wal(lab: Lab, nbytes: int) -> int:
    """Write at least ``nbytes`` of WAL into the table that is not the outbox (made by
    :func:`unrelated_table`); returns the bytes of WAL the server wrote meanwhile."""
    start = lab.execute(_q("current_lsn"))[0][0]
    rows, written = min(2000, max(200, nbytes // 400)), 0
    for _ in range(100):
        if written >= nbytes:
            break
        lab.execute(_q("unrelated_rows"), {"n": rows})
        before, written = written, lab.execute(_q("wal_since"), {"lsn": start})[0][0]
        per_row = max(1.0, (written - before) / rows)
        rows = int(min(50_000, max(200, math.ceil((nbytes - written) / per_row * 1.05))))
    return int(written)


# -- the trace -----------------------------------------------------------------------------------------


def check_params(*, events: int, down_events: int | None, down_bytes: int, producers: int) -> None:
    """The bounds of :func:`cdc_trace`'s numbers, checked before anything is opened."""
    number("events", events, low=1, high=MAX_EVENTS, whole=True, example=12)
    if down_events is not None:
        number("down_events", down_events, low=0, high=MAX_EVENTS, whole=True, example=12)
    number("down_bytes", down_bytes, low=0, high=MAX_DOWN_BYTES, whole=True, unit=" bytes",
           example=DEFAULT_DOWN_BYTES)
    number("producers", producers, low=2, high=MAX_PRODUCERS, whole=True, example=3)


def _flush_stats(conn: psycopg.Connection) -> None:
    """Make ``conn``'s table statistics reach the shared counters now (PostgreSQL 15+)."""
    if conn.info.server_version >= 150000:
        conn.execute(_q("flush_stats"))


def _activity(lab: Lab) -> tuple[int, int] | None:
    """(scans, rows updated) of the outbox so far; None before PostgreSQL 15, whose counters
    reach the view late (through the statistics collector) and cannot be read exactly."""
    if lab.admin.info.server_version < 150000:
        return None
    scans, updated = lab.execute(_q("outbox_activity"))[0]
    return int(scans), int(updated)


def _delta(after: tuple[int, int] | None, before: tuple[int, int] | None) -> tuple[int | None, int | None]:
    if after is None or before is None:
        return None, None
    return after[0] - before[0], after[1] - before[1]


def _outbox_read(lab: Lab, sql: str, params: dict | None = None) -> list[tuple]:
    """A read of the outbox table over a connection of its own whose scan is counted at
    once, so that it never lands in a later measurement of who scanned the outbox."""
    with lab.connect(role="cdc-look") as c:
        rows = c.execute(sql, params).fetchall()
        _flush_stats(c)
    return rows


def _slot_state(lab: Lab, slot: str) -> dict:
    row = lab.execute(_q("slot_state"), {"slot": slot})[0]
    keys = ("restart_lsn", "confirmed_flush_lsn", "current_lsn", "retained_bytes", "behind_bytes",
            "wal_status", "safe_wal_size", "active_pid")
    return dict(zip(keys, row))


def _let_go_of_wal(lab: Lab, consumer: Consumer, slot: str, past: str,
                   wait_s: float = LET_GO_S) -> tuple[dict, int]:
    """After the consumer confirmed: move the slot's restart_lsn past ``past``.  Decoding
    moves restart_lsn only at a record of the running transactions that it has read and the
    consumer has confirmed; the background writer logs one every 15 s when the server is
    busy.  Here one is logged at once (PostgreSQL 16+: pg_log_standby_snapshot, flushed by a
    heartbeat's commit; before: CHECKPOINT) and confirmed.  A transaction of another session
    that was running at that record holds restart_lsn before its start: the round is
    repeated (three times at once, then every 50 ms for up to ``wait_s`` seconds) until such
    transactions have ended.  Returns the slot's state and how many rounds it took."""
    version = consumer.conn.info.server_version
    deadline = time.monotonic() + wait_s
    n = 0
    while True:
        state = _slot_state(lab, slot)
        if lab.execute(_q("lsn_reached"), {"a": state["restart_lsn"], "b": past})[0][0]:
            return state, n
        if n >= 3:
            if time.monotonic() > deadline:
                return state, n
            time.sleep(0.05)
        try:
            if version >= 160000:
                upto = one_row(consumer.conn.execute(_q("log_running_xacts")), "cdc.sql's log_running_xacts")[0]
                consumer.conn.execute(_q("heartbeat"))
            else:
                consumer.conn.execute("CHECKPOINT")
                upto = one_row(consumer.conn.execute(_q("current_lsn")), "cdc.sql's current_lsn")[0]
        except psycopg.errors.InsufficientPrivilege:
            return state, n
        if consumer.read():                       # nothing of ours may be skipped by the confirm
            return state, n
        consumer.confirm(upto)
        n += 1


@dataclass(frozen=True)
class RetainedPoint(Result):
    """The slot's retained WAL after one step of :func:`cdc_trace`'s run: a point of
    :func:`plot_retained`.

    phase: what the consumer was doing: ``reading``, ``down`` or ``back`` (the keys of :data:`PHASES`).
    step: the step just done, in words (``"read and confirmed"``, ``"another table written"``, ...).
    written_bytes: bytes of WAL the server wrote from the run's start to this step.
    retained_bytes: bytes of WAL the slot keeps now (from its restart_lsn to the current position).
    """

    phase: str
    step: str
    written_bytes: int
    retained_bytes: int


@dataclass(frozen=True)
class SlotGuards(Result):
    """The server's settings that bound what a forgotten slot costs, as the server shows them.

    max_slot_wal_keep_size: the most WAL a slot may keep before the server gives it up (``"-1"``: no bound).
    idle_replication_slot_timeout: how long a slot may go unread before it is given up (``"0"``:
        never; None before PostgreSQL 18).
    max_wal_size: the WAL size at which the server starts a checkpoint (text, e.g. ``"1GB"``).
    max_replication_slots: how many replication slots the server has room for.
    """

    max_slot_wal_keep_size: str
    idle_replication_slot_timeout: str | None
    max_wal_size: str
    max_replication_slots: int


@dataclass(frozen=True)
class TwoConsumers(Result):
    """Two consumers, A and B, reading one slot in turns (each read confirms what it got).

    written: outbox ids written during this part of the run, in commit order.
    a_got: outbox ids consumer A received, in the order it got them.
    b_got: outbox ids consumer B received, in the order it got them.
    overlap: outbox ids both received (none: a slot hands each change to one reader).
    a_missed: how many of ``written`` consumer A never received.
    b_missed: how many of ``written`` consumer B never received.
    """

    written: list[int]
    a_got: list[int]
    b_got: list[int]
    overlap: list[int]
    a_missed: int
    b_missed: int


@dataclass(frozen=True)
class RelayComparison(Result):
    """The polling relay draining the same outbox, for comparison with the CDC consumer.

    published: events it published.
    outbox_scans: scans of the outbox table while it ran, sequential and index
        (pg_stat_user_tables; None before PostgreSQL 15).
    rows_updated: outbox rows it updated, one per published event (None before PostgreSQL 15).
    publish_order_ids: outbox ids in the order it published them (id order).
    ticks: its ticks, one claim each; the last claimed nothing, which is how it knew it was done.
    marks: the UPDATEs that marked its batches published (one per tick that claimed rows).
    empty_tick_scans: scans of the outbox by one more tick, on the outbox it had emptied (None
        before PostgreSQL 15): what a poller costs on every tick when there is nothing to send.
    """

    published: int
    outbox_scans: int | None
    rows_updated: int | None
    publish_order_ids: list[int]
    ticks: int
    marks: int
    empty_tick_scans: int | None


@dataclass(frozen=True)
class CdcTrace(Result):
    """The outbox read through a logical slot, end to end (:func:`cdc_trace`).

    events: events written while the consumer was up.
    down_events: events written while the consumer was down.
    producers: producer sessions writing interleaved transactions.
    delivered: messages the broker delivered.
    in_commit_order: True if the broker got the events in the order their transactions
        committed, one whole transaction after another.
    wal_retained_bytes_while_down: bytes of WAL the slot kept at the end of the consumer's downtime.
    commit_order: outbox ids in the order their transactions committed.
    delivered_ids: outbox ids in the order the broker delivered them (None: an event the slot
        did not give).
    id_order: the same ids in id order.
    in_id_order: True if the broker got the events in id order.
    commit_xids: the producers' transaction ids, in commit order.
    stream_xids: the transaction ids the slot's stream gave, in stream order.
    first_round_stream: the first round's lines as decoded: ``lsn  xid  data``.
    poller_saw_after_first_commit: outbox ids a poll of the table saw after the first commit.
    id_watermark_skips: outbox ids a poller keeping the highest id it saw would never read.
    consumer_outbox_scans: scans of the outbox table while the consumer ran (None before PostgreSQL 15).
    consumer_rows_updated: outbox rows updated while the consumer ran (None before PostgreSQL 15).
    rows_marked_published: outbox rows with published_at set at the end of the consumer's run.
    wal_retained_bytes_before_down: bytes of WAL the slot kept just before the consumer went down.
    consumer_behind_bytes_while_down: bytes of WAL from the slot's confirmed_flush_lsn to the
        current position, at the end of the downtime.
    unrelated_wal_bytes: bytes of WAL written into another table while the consumer was down.
    reading_wal_bytes: bytes of WAL written into another table while the consumer was reading.
    retained_series: the slot's retained WAL after each step (:class:`RetainedPoint`;
        :func:`plot_retained` draws it).
    wal_retained_bytes_after_read: bytes of WAL the slot kept once the consumer was back and
        had read and confirmed.
    wal_released_bytes_after_read: bytes of WAL the slot's restart_lsn moved on from the
        downtime's end to then (not inflated by WAL others write meanwhile).
    restart_lsn_nudges: rounds (log the running transactions, confirm) it took to move the
        slot's restart_lsn past the downtime.
    wal_status_while_down: pg_replication_slots.wal_status at the end of the downtime (``reserved``, ...).
    safe_wal_size_while_down: bytes of WAL that could still be written before the slot is
        given up, at the end of the downtime (None: no bound).
    guards: the settings that bound what a slot may keep (:class:`SlotGuards`).
    two_consumers_one_slot: two consumers reading the one slot (:class:`TwoConsumers`).
    relay: the polling relay over the same rows (:class:`RelayComparison`).
    slot: the slot's name.
    broker: the broker's kind (``recording``, ``rabbitmq``, ``list``).
    slot_left: True if the slot was still on the server after the run (False: dropped).
    seconds: how long the run took, in seconds.
    """

    events: int
    down_events: int
    producers: int
    delivered: int
    in_commit_order: bool
    wal_retained_bytes_while_down: int
    commit_order: list[int]
    delivered_ids: list[int | None]
    id_order: list[int]
    in_id_order: bool
    commit_xids: list[int]
    stream_xids: list[int]
    first_round_stream: list[str]
    poller_saw_after_first_commit: list[int]
    id_watermark_skips: list[int]
    consumer_outbox_scans: int | None
    consumer_rows_updated: int | None
    rows_marked_published: int
    wal_retained_bytes_before_down: int
    consumer_behind_bytes_while_down: int
    unrelated_wal_bytes: int
    reading_wal_bytes: int
    retained_series: list[RetainedPoint]
    wal_retained_bytes_after_read: int
    wal_released_bytes_after_read: int
    restart_lsn_nudges: int
    wal_status_while_down: str
    safe_wal_size_while_down: int | None
    guards: SlotGuards
    two_consumers_one_slot: TwoConsumers
    relay: RelayComparison
    slot: str
    broker: str
    slot_left: bool
    seconds: float


def cdc_trace(lab: Lab, broker: Broker | None = None, *, events: int = 12,
              down_events: int | None = None, down_bytes: int = DEFAULT_DOWN_BYTES,
              producers: int = 3) -> CdcTrace:
    """The outbox through a logical slot, end to end, on a logical server (a LabkitError
    naming the fix otherwise; ask :func:`logical_decoding_available` first to branch).

    1. ``producers`` sessions write ``events`` outbox events in interleaved transactions that
       commit in the reverse of their id order; a poller's query after the first commit of
       the first round shows what an id watermark would skip.  The consumer peeks, publishes
       to the broker (the lab's own when ``broker`` is None), confirms.
       While it is up, rows worth half of ``down_bytes`` go into another table in two parts,
       the consumer confirming after each (as a CDC tool's heartbeat does).
    2. The consumer is down: ``down_events`` more events (default ``events``) and
       ``down_bytes`` of unrelated WAL (rows in another table, in four parts); the slot's
       retained WAL grows.
    3. The consumer reads and confirms: the retained WAL falls.
    4. Two consumers read one slot in turns: each gets part of the stream.
    5. The polling relay over the same rows, for comparison: its scans and UPDATEs.

    Returns a :class:`CdcTrace`: whether the broker got the events in commit order, and the
    evidence (the orders, the stream as decoded, who scanned and updated the outbox, the WAL
    the slot kept at each step, the two consumers, the relay)."""
    down_events = events if down_events is None else down_events
    check_params(events=events, down_events=down_events, down_bytes=down_bytes, producers=producers)
    check_available(lab)
    t0 = time.monotonic()
    with brokers.used_by(lab, broker) as bk:
        bk.reset()
        relay.create_outbox(lab)
        # Building the outbox's three indexes scanned the table three times, counted on the
        # admin session and sent to the shared counters only when it next flushes (at most
        # once a second): flush them now, or they may land inside a window measured below.
        _flush_stats(lab.admin)
        with lab_slot(lab) as slot:
            fields = _trace(lab, bk, slot, events, down_events, down_bytes, producers)
    return CdcTrace(**fields,
                    slot_left=lab.execute(_q("slot_holder"), {"slot": slot_name(lab)}) != [],
                    seconds=round(time.monotonic() - t0, 2))


class _Series:
    """The slot's retained WAL sampled through the run: one point per step, with the WAL
    the server has written since the run began (the x of :func:`plot_retained`)."""

    def __init__(self, lab: Lab, slot: str):
        self.lab, self.slot = lab, slot
        self.start = lab.execute(_q("current_lsn"))[0][0]
        self.points: list[RetainedPoint] = []

    def sample(self, phase: str, step: str, state: dict | None = None) -> dict:
        state = state or _slot_state(self.lab, self.slot)
        written = self.lab.execute(_q("wal_between"), {"before": self.start,
                                                       "after": state["current_lsn"]})[0][0]
        self.points.append(RetainedPoint(phase=phase, step=step, written_bytes=int(written),
                                         retained_bytes=int(state["retained_bytes"])))
        return state


def _id_watermark_skips(prod: _Producers, events: int, watermark: int, seen: list[int],
                        later: set[int]) -> list[int]:
    """The ids an id-watermark poller never returns: committed after its first poll, below what it saw."""
    # committed after the first poll with an id below what it saw: the next poll
    # (id > watermark) does not return them, and no later one will
    return sorted(i for i, _ in prod.committed[:events]
                  if i < watermark and i not in seen and i not in later)


def _write_other_tables_while_reading(lab: Lab, consumer: Consumer, slot: str, series: _Series,
                                      chunk: int) -> int:
    """Write WAL for another table while the consumer is up, confirming as it goes; the bytes written."""
    reading_wal = 0
    for _ in range(READING_CHUNKS if chunk else 0):
        reading_wal += unrelated_wal(lab, chunk)
        series.sample("reading", "another table written")
        state, _n = _let_go_of_wal(lab, consumer, slot, lab.execute(_q("current_lsn"))[0][0])
        series.sample("reading", "confirmed", state)
    return reading_wal


def _trace(lab: Lab, bk: Broker, slot: str, events: int, down_events: int, down_bytes: int,
           producers: int) -> dict[str, Any]:
    """The run of :func:`cdc_trace` in its slot: the fields of :class:`CdcTrace` but the slot's
    fate and the time taken, which the caller adds."""
    prod = _Producers(lab, producers)
    consumer = Consumer(lab, slot)
    series = _Series(lab, slot)
    chunk = down_bytes // DOWN_CHUNKS
    try:
        # 1. interleaved producers; a poller's view after the first commit
        series.sample("reading", "slot created")
        seen: list[int] = []
        prod.write(events, lambda: seen.extend(r[0] for r in _outbox_read(lab, _q("committed_ids"),
                                                                          {"after": 0})))
        watermark = max(seen)
        later = {r[0] for r in _outbox_read(lab, _q("committed_ids"), {"after": watermark})}
        skipped = _id_watermark_skips(prod, events, watermark, seen, later)
        series.sample("reading", f"{events} events written")
        before = _activity(lab)
        txns = consumer.deliver(bk)
        first_round = [line for t in txns[:producers] for line in t.lines]
        series.sample("reading", "read and confirmed")
        # while the consumer is up, other tables are written too; it confirms as it goes
        # (a heartbeat, as CDC tools send one, lets the slot move past WAL it has no use for)
        unrelated_table(lab)
        reading_wal = _write_other_tables_while_reading(lab, consumer, slot, series, chunk)
        before_down = _slot_state(lab, slot)

        # 2. the consumer is down
        prod.write(down_events)
        series.sample("down", f"{down_events} events written")
        unrelated = 0
        for _ in range(DOWN_CHUNKS if chunk else 0):
            unrelated += unrelated_wal(lab, chunk)
            series.sample("down", "another table written")
        down = _slot_state(lab, slot)
        past = down["current_lsn"]

        # 3. the consumer is back
        txns += consumer.deliver(bk)
        series.sample("back", "read and confirmed")
        _flush_stats(consumer.conn)
        scans, updated = _delta(_activity(lab), before)
        after, nudges = _let_go_of_wal(lab, consumer, slot, past)
        series.sample("back", "slot let go", after)
        marked = _outbox_read(lab, "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL")[0][0]
        delivered = bk.take_all()

        # 4. two consumers, one slot
        split = _two_consumers(lab, slot, prod)

        # 5. the relay, for comparison, over the same (never marked) rows
        compare = _relay_comparison(lab)
    finally:
        consumer.close()
        prod.close()

    by_event = {e["event_id"]: e["id"] for t in txns for e in t.events}
    delivered_ids = [by_event.get(ev) for ev, _ in delivered]
    commit_order = [oid for oid, _ in prod.committed[:events + down_events]]
    commit_xids = [x for _, x in prod.committed[:events + down_events]]
    stream_xids = [t.xid for t in txns]
    guard_row = lab.execute(_q("guards"))[0]
    return {
        "events": events,
        "down_events": down_events,
        "producers": producers,
        "delivered": len(delivered),
        "in_commit_order": delivered_ids == commit_order and stream_xids == commit_xids,
        "wal_retained_bytes_while_down": int(down["retained_bytes"]),
        "commit_order": commit_order,
        "delivered_ids": delivered_ids,
        "id_order": sorted(commit_order),
        "in_id_order": delivered_ids == sorted(commit_order),
        "commit_xids": commit_xids,
        "stream_xids": stream_xids,
        "first_round_stream": [f"{lsn}  {xid}  {data}" for lsn, xid, data in first_round],
        "poller_saw_after_first_commit": sorted(seen),
        "id_watermark_skips": skipped,
        "consumer_outbox_scans": scans,
        "consumer_rows_updated": updated,
        "rows_marked_published": int(marked),
        "wal_retained_bytes_before_down": int(before_down["retained_bytes"]),
        "consumer_behind_bytes_while_down": int(down["behind_bytes"]),
        "unrelated_wal_bytes": unrelated,
        "reading_wal_bytes": reading_wal,
        "retained_series": series.points,
        "wal_retained_bytes_after_read": int(after["retained_bytes"]),
        # how far restart_lsn moved between "down" and "after read": unlike the retained bytes
        # after the read, not inflated by WAL other sessions write while the consumer reads
        "wal_released_bytes_after_read": lab.execute(
            _q("wal_between"), {"before": down["restart_lsn"], "after": after["restart_lsn"]})[0][0],
        "restart_lsn_nudges": nudges,
        "wal_status_while_down": down["wal_status"],
        "safe_wal_size_while_down": down["safe_wal_size"],
        "guards": SlotGuards(max_slot_wal_keep_size=guard_row[0],
                             idle_replication_slot_timeout=guard_row[1],
                             max_wal_size=guard_row[2], max_replication_slots=guard_row[3]),
        "two_consumers_one_slot": split,
        "relay": compare,
        "slot": slot,
        "broker": bk.kind,
    }


def _two_consumers(lab: Lab, slot: str, prod: _Producers) -> TwoConsumers:
    """Consumers A and B read the one slot in turns (get_changes: each read confirms): two
    events are written before each read."""
    a, b = Consumer(lab, slot, "cdc-consumer-a"), Consumer(lab, slot, "cdc-consumer-b")
    got: dict[str, list[int]] = {"a": [], "b": []}
    written: list[int] = []
    try:
        for r in range(SPLIT_ROUNDS):
            start = len(prod.committed)
            prod.round(2)
            written += [oid for oid, _ in prod.committed[start:]]
            who = "a" if r % 2 == 0 else "b"
            got[who] += [e["id"] for t in (a if who == "a" else b).read(consume=True) for e in t.events]
    finally:
        a.close()
        b.close()
    return TwoConsumers(written=written, a_got=got["a"], b_got=got["b"],
                        overlap=sorted(set(got["a"]) & set(got["b"])),
                        a_missed=len(set(written) - set(got["a"])),
                        b_missed=len(set(written) - set(got["b"])))


def _relay_comparison(lab: Lab) -> RelayComparison:
    """The polling relay drains the same outbox (no row was ever marked): its claims scan
    the table and each published row is an UPDATE."""
    before = _activity(lab)
    lb = ListBroker()
    moves: list[str] = []
    with lab.connect(role="cdc-relay") as conn:
        poller = relay.Relay(conn, lb, batch=100, hook=lambda kind, **_: moves.append(kind))
        poller.run()
        _flush_stats(conn)
        scans, updated = _delta(_activity(lab), before)
        ticks, marks = moves.count("claimed") + moves.count("idle"), moves.count("committed")
        # one tick more, as a poller's next tick finds the outbox empty
        idle_before = _activity(lab)
        poller.tick()
        _flush_stats(conn)
        empty_scans, _ = _delta(_activity(lab), idle_before)
    ids = dict(_outbox_read(lab, "SELECT event_id, id FROM outbox"))
    return RelayComparison(published=len(lb.messages), outbox_scans=scans, rows_updated=updated,
                           publish_order_ids=[ids[ev] for ev, _ in lb.messages],
                           ticks=ticks, marks=marks, empty_tick_scans=empty_scans)


STREAM_WORK_MEM = "64kB"         # the smallest logical_decoding_work_mem the server takes
STREAM_EVENTS = 500              # one transaction's events: well over 64 kB once decoded
FLUSH_WAIT_S = 5                 # a commit flushes the WAL at once; this is only a bound


@dataclass(frozen=True)
class StreamedLines(Result):
    """The lines a streaming read of an open transaction returned, counted by kind.

    opening: ``opening a streamed block`` lines: one per block.
    change: ``streaming change`` lines: the transaction's changes streamed before its end.
    closing: ``closing a streamed block`` lines: one per block.
    other: any other line (none is expected).
    """

    opening: int
    change: int
    closing: int
    other: int


@dataclass(frozen=True)
class StreamingTrace(Result):
    """A large open transaction read with and without streaming, then rolled back
    (:func:`streaming_trace`).

    events: outbox rows the producer's one transaction wrote.
    xid: the producer's transaction id (text, as the slot shows it).
    work_mem: the consumer's logical_decoding_work_mem (``"64kB"``).
    whole_while_open: lines of the transaction a plain read returned while it was open.
    streamed_while_open: lines the streaming read returned while it was open, by kind
        (:class:`StreamedLines`).
    streamed_blocks: the changes in each streamed block, in order (each block is what the decoder
        held when the decoded changes passed logical_decoding_work_mem; the rest stay in memory).
    streamed_sample: the streaming read's first two lines and its last.
    whole_after_rollback: lines of the transaction a plain read returned after its rollback.
    status: pg_xact_status of the transaction at the end (``aborted``).
    subscription_streaming_default: what a new subscription asks pgoutput for
        (:func:`subscription_streaming_default`; None if this user may not create one).
    """

    events: int
    xid: str
    work_mem: str
    whole_while_open: int
    streamed_while_open: StreamedLines
    streamed_blocks: list[int]
    streamed_sample: list[str]
    whole_after_rollback: int
    status: str
    subscription_streaming_default: str | None


def streaming_trace(lab: Lab, *, events: int = STREAM_EVENTS) -> StreamingTrace:
    """Logical decoding with streaming of in-progress transactions asked for (PostgreSQL 14
    and later).  A producer writes ``events`` outbox rows in one transaction and leaves it
    open; the consumer, its ``logical_decoding_work_mem`` at 64 kB, peeks at the lab's slot
    twice: as every other read of this lab does (cdc.sql ``peek_xid``), and asking
    test_decoding to stream (``peek_streaming``).  Then the producer rolls back and the
    consumer peeks once more, without streaming.

    Returns a :class:`StreamingTrace`: what each read returned of the open transaction, the
    streamed blocks, and what became of the transaction."""
    number("events", events, low=1, high=10_000, whole=True, example=STREAM_EVENTS)
    relay.create_outbox(lab)
    with lab_slot(lab) as slot:
        with lab.connect(role="cdc-producer") as producer, \
                lab.connect(role="cdc-consumer", guards=READ_GUARDS) as consumer:
            consumer.execute(_q("decoding_work_mem"), {"mem": STREAM_WORK_MEM})
            producer.execute("BEGIN")
            producer.execute(_q("bulk_events"), {"n": events})
            xid, lsn = one_row(producer.execute(_q("producer_xid")), "cdc.sql's producer_xid")
            consumer.execute(_q("flush_wal"))
            deadline = time.monotonic() + FLUSH_WAIT_S
            while not one_row(consumer.execute(_q("flushed"), {"lsn": lsn}), "cdc.sql's flushed")[0]:
                if time.monotonic() > deadline:
                    raise LabkitError(f"The server did not flush the producer's WAL to disk within "
                                      f"{FLUSH_WAIT_S} s of a commit, so the slot could not decode it.",
                                      "run the cell again; if it keeps failing, check the server's "
                                      "synchronous_commit (`SHOW synchronous_commit`: on, by default).")
                time.sleep(0.02)
            at = {"slot": slot, "xid": xid}
            whole_open = [r[0] for r in consumer.execute(_q("peek_xid"), at).fetchall()]
            streamed = [r[0] for r in consumer.execute(_q("peek_streaming"), at).fetchall()]
            producer.execute("ROLLBACK")
            whole_after = [r[0] for r in consumer.execute(_q("peek_xid"), at).fetchall()]
            status = one_row(consumer.execute(_q("xact_status"), {"xid": xid}), "cdc.sql's xact_status")[0]
    kinds = {"opening": 0, "change": 0, "closing": 0, "other": 0}
    blocks: list[int] = []
    for line in streamed:
        kind = ("opening" if line.startswith("opening a streamed block") else
                "change" if line.startswith("streaming change") else
                "closing" if line.startswith("closing a streamed block") else "other")
        kinds[kind] += 1
        if kind == "opening":
            blocks.append(0)
        elif kind == "change" and blocks:
            blocks[-1] += 1
    return StreamingTrace(events=events, xid=xid, work_mem=STREAM_WORK_MEM,
                          whole_while_open=len(whole_open), streamed_while_open=StreamedLines(**kinds),
                          streamed_blocks=blocks, streamed_sample=streamed[:2] + streamed[-1:],
                          whole_after_rollback=len(whole_after), status=status,
                          subscription_streaming_default=subscription_streaming_default(lab))


def subscription_streaming_default(lab: Lab) -> str | None:
    """What a new subscription on this server asks pgoutput for by default: ``"f"`` (no
    streaming), ``"t"`` or ``"p"`` (streaming; p: applied in parallel), as pg_subscription
    shows it (``"false"``/``"true"`` before PostgreSQL 16).  Read from a subscription created
    without connecting, in a transaction rolled back; None if this user may not create one."""
    name = slot_name(lab) + "_sub"
    with lab.connect(role="cdc-probe", autocommit=False) as conn:
        try:
            conn.execute(psycopg.sql.SQL(_q("subscription_probe")).format(name=psycopg.sql.Identifier(name)))
            return one_row(conn.execute(_q("subscription_streaming"), {"name": name}),
                           "cdc.sql's subscription_streaming")[0]
        except psycopg.errors.InsufficientPrivilege:
            return None
        finally:
            conn.rollback()


# -- where the kept WAL begins: restart_lsn, not the consumer's confirm ------------------------------

HELD_BACK_BYTES = 1024 * 1024    # WAL written while another session's transaction stays open


def _confirm_everything(consumer: Consumer) -> str:
    """The consumer confirms everything written so far: a record of the running transactions
    is logged (decoding moves restart_lsn only at one; PostgreSQL 16+ pg_log_standby_snapshot,
    flushed by a heartbeat's commit; before, a CHECKPOINT logs one), then the slot is advanced
    to the current WAL position, which is returned."""
    conn = consumer.conn
    try:
        if conn.info.server_version >= 160000:
            conn.execute(_q("log_running_xacts"))
            conn.execute(_q("heartbeat"))
        else:
            conn.execute("CHECKPOINT")
    except psycopg.errors.InsufficientPrivilege:
        raise LabkitError("This user may not write a record of the running transactions "
                          "(pg_log_standby_snapshot, or CHECKPOINT before PostgreSQL 16), which "
                          "the slot needs before it can move its restart_lsn.",
                          "run it as a superuser, or on the embedded server.") from None
    upto = one_row(conn.execute(_q("current_lsn")), "cdc.sql's current_lsn")[0]
    consumer.confirm(upto)
    return upto


@dataclass(frozen=True)
class SlotPosition(Result):
    """Where a slot stood at one moment, as pg_replication_slots shows it.

    restart_lsn: the oldest WAL position the slot keeps (text, ``0/1A2B3C4``).
    confirmed_flush_lsn: the position up to which its consumer confirmed (text).
    retained_bytes: bytes of WAL from restart_lsn to the current position: what the slot keeps.
    behind_bytes: bytes of WAL from confirmed_flush_lsn to the current position: how far the
        consumer is behind.
    """

    restart_lsn: str
    confirmed_flush_lsn: str
    retained_bytes: int
    behind_bytes: int

    @classmethod
    def of(cls, state: dict) -> SlotPosition:
        """The position from a reading of cdc.sql's ``slot_state``."""
        return cls(restart_lsn=state["restart_lsn"], confirmed_flush_lsn=state["confirmed_flush_lsn"],
                   retained_bytes=int(state["retained_bytes"]), behind_bytes=int(state["behind_bytes"]))


@dataclass(frozen=True)
class HeldBack(Result):
    """A transaction open at the consumer's confirm holding the slot's restart_lsn back
    (:func:`held_back_trace`).

    written_bytes: bytes of WAL written while the other session's transaction was open.
    open: the slot once the consumer had confirmed everything, the transaction still open
        (:class:`SlotPosition`).
    ended: the slot once the transaction had committed and the consumer confirmed again.
    moved_bytes: bytes of WAL restart_lsn moved on from ``open`` to ``ended``.
    slot_left: True if the slot was still on the server afterwards (False: dropped).
    """

    written_bytes: int
    open: SlotPosition
    ended: SlotPosition
    moved_bytes: int
    slot_left: bool


def held_back_trace(lab: Lab, *, nbytes: int = HELD_BACK_BYTES) -> HeldBack:
    """Where the WAL a slot keeps begins: at its ``restart_lsn``, which a transaction open at
    the consumer's confirm holds back, not at ``confirmed_flush_lsn``.  With the lab's slot
    made afresh, another session opens a transaction and writes a row (so it has a
    transaction id); ``nbytes`` of WAL go into the lab's other table; the consumer confirms
    everything written so far, and the slot is read (``open``).  Then the transaction
    commits, the consumer confirms again until restart_lsn has moved past the first reading
    (:func:`_let_go_of_wal`), and the slot is read once more (``ended``).

    Returns a :class:`HeldBack`: the slot's two readings and how far restart_lsn moved."""
    number("nbytes", nbytes, low=1, high=MAX_DOWN_BYTES, whole=True, unit=" bytes",
           example=HELD_BACK_BYTES)
    check_available(lab)
    unrelated_table(lab)
    with lab_slot(lab) as slot:
        consumer = Consumer(lab, slot)
        held = lab.connect(role="cdc-open", autocommit=False)
        try:
            held.execute(_q("alert_pin"))
            written = unrelated_wal(lab, nbytes)
            _confirm_everything(consumer)
            opened = _slot_state(lab, slot)
            held.commit()
            ended, _n = _let_go_of_wal(lab, consumer, slot, opened["current_lsn"])
        finally:
            held.close()
            consumer.close()
    moved = lab.execute(_q("wal_between"), {"before": opened["restart_lsn"],
                                            "after": ended["restart_lsn"]})[0][0]
    return HeldBack(written_bytes=written, open=SlotPosition.of(opened), ended=SlotPosition.of(ended),
                    moved_bytes=int(moved),
                    slot_left=lab.execute(_q("slot_holder"), {"slot": slot_name(lab)}) != [])


# -- the picture: what the slot keeps ---------------------------------------------------------------

PHASES = {"reading": "consumer reading, confirming as it goes", "down": "consumer down",
          "back": "consumer back: read and confirmed"}


def plot_retained(r: CdcTrace, ax=None):
    """The slot's retained WAL through :func:`cdc_trace`'s run (``r.retained_series``), on
    linear axes: across, the WAL the server wrote since the run began; up, the WAL the slot
    keeps (``pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)``).  The background says what
    the consumer was doing.  ``ax``: the axes to draw on (None: a new figure).  Returns the
    figure."""
    import matplotlib.pyplot as plt

    from ..core.plots import PALETTE, legend_below, setup_matplotlib

    series = r.retained_series if isinstance(r, CdcTrace) else None
    if not series or not all(isinstance(p, RetainedPoint) and p.phase in PHASES for p in series):
        raise LabkitError("That is not a result of cdc.cdc_trace with its retained_series.",
                          "pass what cdc.cdc_trace(lab) returned.")
    setup_matplotlib()
    if ax is None:
        fig, ax = plt.subplots(figsize=(11, 5.6))
    else:
        fig = ax.figure
    mb = 1024 * 1024
    x = [p.written_bytes / mb for p in series]
    y = [p.retained_bytes / mb for p in series]
    last_reading = max(i for i, p in enumerate(series) if p.phase == "reading")
    last_down = max((i for i, p in enumerate(series) if p.phase == "down"), default=last_reading)
    right = max(x) * 1.04            # a margin, so that the "back" phase has a band to show
    ax.axvspan(0, x[last_reading], color=PALETTE[3], alpha=0.15, lw=0, label=PHASES["reading"])
    ax.axvspan(x[last_reading], x[last_down], color=PALETTE[1], alpha=0.2, lw=0, label=PHASES["down"])
    ax.axvspan(x[last_down], right, color=PALETTE[4], alpha=0.25, lw=0, label=PHASES["back"])
    ax.plot(x, y, marker="o", ms=7, lw=3, color=PALETTE[0],
            label="WAL the slot keeps (pg_replication_slots)")
    back = [i for i, p in enumerate(series) if p.phase == "back"]
    if back:
        end, low = x[back[-1]], 0.3 * max(y)
        ax.annotate("the slot lets go once\nits restart_lsn moves", xy=(end, low),
                    xytext=(end - 0.05 * max(x), low), ha="right", va="center",
                    arrowprops={"arrowstyle": "->", "color": PALETTE[7], "lw": 2})
    ax.set_xlim(0, right)
    ax.set_ylim(0, max(max(y) * 1.1, 0.1))
    ax.set_xlabel("WAL the server wrote since the run began (MB)")
    ax.set_ylabel("WAL the slot keeps (MB)")
    ax.set_title("A slot keeps every byte written since its restart_lsn")
    legend_below(fig, ax, ncol=2)
    return fig


# -- failover: a logical slot lives on one server ---------------------------------------------------

FAILOVER_FROM = 170000


@dataclass(frozen=True)
class FailoverSlot(Result):
    """A slot created with ``failover => true`` and read back (:func:`failover_slot`); every
    field after ``ran`` is None when it did not run (before PostgreSQL 17).

    server_version_num: the server's version number (``170004``: 17.4).
    ran: True if the slot was created (PostgreSQL 17 and later).
    slot: the slot's name.
    failover: pg_replication_slots.failover: True, the slot is to be copied to the standbys.
    synced: pg_replication_slots.synced: True only for a copy on a standby.
    temporary: pg_replication_slots.temporary.
    sync_replication_slots: the setting a standby reads to copy the primary's failover slots.
    synchronized_standby_slots: the physical slots whose standbys must have the WAL before a
        failover slot's consumer gets it (read on the primary; ``""``: none).
    in_recovery: True if this server is a standby.
    slot_left: True if the slot was still on the server afterwards (False: dropped).
    """

    server_version_num: int
    ran: bool
    slot: str | None = None
    failover: bool | None = None
    synced: bool | None = None
    temporary: bool | None = None
    sync_replication_slots: str | None = None
    synchronized_standby_slots: str | None = None
    in_recovery: bool | None = None
    slot_left: bool | None = None


def failover_slot(lab: Lab) -> FailoverSlot:
    """PostgreSQL 17 and later: create a logical slot with ``failover => true`` (one a
    standby running ``sync_replication_slots`` would copy), read its ``failover`` and
    ``synced`` columns and the two settings slot synchronization uses, and drop it.
    Before 17 nothing is created: ``ran`` is False.

    Returns a :class:`FailoverSlot`."""
    version = lab.admin.info.server_version
    if version < FAILOVER_FROM:
        return FailoverSlot(server_version_num=version, ran=False)
    check_available(lab)
    name = slot_name(lab)[:59] + "_fo"
    try:
        lab.execute(_q("drop_slot_if_there"), {"slot": name})     # a killed run's, if any
        _create_slot(lab, name, "create_failover_slot")
        slot, failover, synced, temporary = lab.execute(_q("failover_state"), {"slot": name})[0]
        sync, standby_slots, recovery = lab.execute(_q("failover_settings"))[0]
    finally:
        lab.execute(_q("drop_slot_if_there"), {"slot": name})
    left = lab.execute(_q("slot_holder"), {"slot": name}) != []
    return FailoverSlot(server_version_num=version, ran=True, slot=slot, failover=failover,
                        synced=synced, temporary=temporary, sync_replication_slots=sync,
                        synchronized_standby_slots=standby_slots, in_recovery=recovery,
                        slot_left=left)


# -- command line: labkit trace cdc ------------------------------------------------------------------


def _size(n: int) -> str:
    return f"{n / (1024 * 1024):.2f} MB" if n >= 10_000 else f"{n} bytes"


def report(r: CdcTrace) -> str:
    """The trace in a few lines."""
    s = r.two_consumers_one_slot
    rl = r.relay
    return "\n".join([
        f"{r.events} events from {r.producers} producers, each round committing in the "
        f"reverse of id order; slot {r.slot} ({PLUGIN}), broker: {r.broker}",
        f"  delivered in commit order: {'yes' if r.in_commit_order else 'NO'}  "
        f"(first ids delivered {r.delivered_ids[:6]}, id order {r.id_order[:6]})",
        f"  a poller keeping the highest id it saw would skip {r.id_watermark_skips}",
        f"  the consumer: {r.consumer_outbox_scans} scans of the outbox, "
        f"{r.consumer_rows_updated} rows updated (the relay: {rl.outbox_scans} scans, "
        f"{rl.rows_updated} rows updated)",
        f"  WAL kept by the slot: {_size(r.wal_retained_bytes_before_down)}, then "
        f"{_size(r.wal_retained_bytes_while_down)} while the consumer was down "
        f"({r.down_events} events and {_size(r.unrelated_wal_bytes)} of unrelated "
        f"WAL), {_size(r.wal_retained_bytes_after_read)} after it read and confirmed",
        f"  two consumers on one slot: A got {s.a_got}, B got {s.b_got} (each missed "
        f"{s.a_missed} and {s.b_missed} of {len(s.written)})",
        f"  guard: max_slot_wal_keep_size = {r.guards.max_slot_wal_keep_size}, "
        f"wal_status while down: {r.wal_status_while_down}; slot dropped: "
        f"{'yes' if not r.slot_left else 'NO'}",
    ])


def cdc_command(*, open_lab: Callable[[], Lab], json: bool = False, events: int = 12,
                down_events: int | None = None, down_mb: float = 4, producers: int = 3) -> int:
    """``labkit trace cdc [--events 12] [--down-events N] [--down-mb 4] [--producers 3]
    [--json]``: the outbox read through a logical replication slot.  On a server without
    logical decoding it prints the error that names the fix and returns 2, having created
    nothing but the lab's empty schema (dropped)."""
    number("down_mb", down_mb, low=0, high=MAX_DOWN_BYTES // (1024 * 1024), unit=" MB", example=4)
    down_bytes = int(down_mb * 1024 * 1024)
    check_params(events=events, down_events=down_events, down_bytes=down_bytes, producers=producers)
    with open_lab() as lab:
        ok, why = logical_decoding_available(lab)
        if not ok:
            print(why, file=sys.stderr)
            return 2
        r = cdc_trace(lab, events=events, down_events=down_events, down_bytes=down_bytes,
                      producers=producers)
    print(r.to_json() if json else report(r))
    return 0
