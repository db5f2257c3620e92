"""Notebook 14's exercise the server checks: the alert on replication slots.

The learner writes the query an alert runs: for each replication slot, its name, whether a
consumer is connected, and the WAL it keeps, in bytes.  :func:`check_slot_alert` builds a
scene on the server with three slots of its own and runs the query there:

* the **lagging** slot, a logical slot nobody reads: its consumer confirmed everything up
  to a moment when a transaction was still open, so its ``restart_lsn`` (where the WAL it
  keeps begins) stayed behind its ``confirmed_flush_lsn`` (how far the consumer confirmed);
  at least :data:`LAG_BYTES` lie between them;
* the **connected** slot, a permanent logical slot (``temporary`` false) that a session of
  the checker streams from over the replication protocol (``START_REPLICATION``), so the
  server shows it ``active``;
* the **physical** slot, nobody's, created with its WAL reserved at once: it has no
  ``confirmed_flush_lsn``, and it keeps WAL all the same.

Then it measures the truth itself (``pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)``
just before the query, and from the WAL inserted just after it: anything written in
between, by anyone, is allowed for) and compares.  Every slot is dropped however the check
ends: a forgotten slot fills the disk of a shared server.  It needs a server that can
decode (wal_level = logical, as the embedded server runs); elsewhere it raises the
LabkitError that says why and what to do.
"""

from __future__ import annotations

import math
import re
import time
from decimal import Decimal
from numbers import Real

from ...core.db import Guards, hide, open_connection, wait_backends_gone
from ...core.errors import LabkitError
from ...core.lab import Lab
from ...core.queries import query as named_query
from ...core.text import and_list
from ...labs import cdc
from . import Check, Solo, bind, scratch

SQL = "cdc.sql"
LAG_BYTES = 1024 * 1024          # WAL the lagging slot keeps past what its consumer confirmed
CONNECTED_BYTES = 128 * 1024     # WAL written after all three slots exist
SLACK_BYTES = 16 * 1024          # a reading of the WAL written a moment earlier (flushed, say)

# What to look at, not the query: which column of pg_replication_slots says a consumer holds
# the slot, and which of the slot's two positions the WAL it keeps begins at.
ALERT_HINT = ("Look at what pg_replication_slots gives for each slot: the column that says "
              "whether a session is reading it, and its two positions in the WAL (notebook 14's "
              "\"Where the kept WAL begins\" compared them). Measure from the one where the kept "
              "WAL begins to the current WAL position, keep the bytes a number, and list every "
              "slot, physical ones too.")

# pg_size_pretty's output: a whole number and a unit (bytes below 10 kB, then kB below 10 MB ...)
_PRETTY = re.compile(r"^\s*(-?\d+)\s*(bytes|kB|MB|GB|TB|PB)\s*$")
_UNIT = {"bytes": 1, "kB": 1024, "MB": 1024 ** 2, "GB": 1024 ** 3, "TB": 1024 ** 4, "PB": 1024 ** 5}


def _q(name: str) -> str:
    return named_query(SQL, name).sql


def slot_names(lab: Lab) -> tuple[str, str, str]:
    """The checker's three slots for ``lab``: (the lagging one, the connected one, the
    physical one).  Named after the lab, so that a run killed half-way leaves slots the next
    run drops first."""
    return (f"{lab.schema}_alert_lagging", f"{lab.schema}_alert_connected",
            f"{lab.schema}_alert_physical")


def _pretty_bytes(text: str) -> tuple[int, int] | None:
    """The range of byte counts a pg_size_pretty text stands for, or None if it is not one."""
    m = _PRETTY.match(text)
    if not m:
        return None
    unit = _UNIT[m.group(2)]
    value = int(m.group(1)) * unit
    return value - unit // 2, value + unit // 2


def _as_range(value) -> tuple[int, int] | None:
    """The byte counts a cell of the WAL column stands for: a number, or pg_size_pretty's text."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, Decimal)):
        return int(value), int(value)
    if isinstance(value, Real):                     # a float, a Fraction: its whole part
        whole = int(math.trunc(value))
        return whole, whole
    if isinstance(value, str):
        return _pretty_bytes(value)
    return None


def _confirm_all(conn, slot: str) -> None:
    """The lagging consumer confirms everything written so far: a record of the running
    transactions is written (decoding moves restart_lsn only at one) and flushed, then the
    slot is advanced to the current WAL position."""
    import psycopg

    try:
        if conn.info.server_version >= 160000:
            conn.execute(named_query(SQL, "log_running_xacts").sql)
            conn.execute(named_query(SQL, "heartbeat").sql)
        else:
            conn.execute("CHECKPOINT")
    except psycopg.errors.InsufficientPrivilege:
        raise LabkitError("The checker may not write a record of the running transactions "
                          "(pg_log_standby_snapshot, or CHECKPOINT before PostgreSQL 16), which "
                          "its scene needs.",
                          "run the check as a superuser, or on the embedded server.") from None
    upto = conn.execute(_q("current_lsn")).fetchone()[0]
    conn.execute(_q("confirm"), {"slot": slot, "upto": upto})


def _stream_from(lab: Lab, slot: str):
    """A session that streams from the logical ``slot`` over the replication protocol, as
    pg_recvlogical or a CDC tool does: while it is open the server shows the slot active,
    and the slot stays a permanent one.  It reads nothing of what the server sends and
    confirms nothing, so the slot's positions stay where they are.  The caller closes it."""
    import psycopg

    try:
        conn = open_connection(lab.db.dsn, schema=lab.schema, role="alert-reading",
                               check_client_ms=lab.db.check_client_ms, replication="database")
    except psycopg.OperationalError as exc:
        why = hide(str(exc).strip().splitlines()[-1], lab.db.dsn)
        raise LabkitError("The checker could not open a replication connection to stream from "
                          f"its slot: {why}",
                          "allow this user replication connections to the database (pg_hba.conf), "
                          "or run the check on the embedded server.") from None
    try:
        conn.pgconn.send_query(f'START_REPLICATION SLOT "{slot}" LOGICAL 0/0'.encode())
        result = conn.pgconn.get_result()
        if result is None or result.status != psycopg.pq.ExecStatus.COPY_BOTH:
            why = (result.error_message.decode(errors="replace").strip()
                   if result is not None else "no answer")
            raise LabkitError(f"The server would not stream from the checker's slot: {why}",
                              "run the cell again; if it fails again, run `labkit doctor`.")
    except BaseException:
        conn.close()
        raise
    return conn


def _truth(lab: Lab, slots: tuple[str, ...]) -> dict[str, tuple]:
    """{slot: (active, kept_low, kept_high, behind_low, behind_high)} read now."""
    return {r[0]: r[1:] for r in lab.execute(_q("alert_truth"), {"slots": list(slots)})}


def _wait_active(lab: Lab, slots: tuple[str, ...], connected: str, timeout_s: float = 5.0) -> None:
    """Until the server shows the connected slot active (the streaming session has taken it)."""
    deadline = time.monotonic() + timeout_s
    while not _truth(lab, slots).get(connected, (False,))[0]:
        if time.monotonic() > deadline:
            raise LabkitError("The checker could not build its scene: the session streaming from "
                              f"its slot did not show as reading it within {timeout_s:g} s.",
                              "run the cell again; if it fails again, run `labkit doctor`.")
        time.sleep(0.02)


def check_slot_alert(lab: Lab, query: str) -> Check:
    """Run the learner's alert ``query`` (no parameters) over three slots of the checker's
    own: a logical one lagging and nobody's, a permanent logical one a session streams from,
    and a physical one nobody's.  It passes when the query returns three columns, every slot
    once: its name, whether a consumer is connected (a boolean), and the WAL it keeps in
    bytes (a number within what the server kept before and after the query ran).  Every slot
    is dropped however the check ends."""
    import psycopg

    text = bind(lab, query, {})
    cdc.check_available(lab)
    slots = slot_names(lab)
    lagging, connected, physical = slots
    check = Check("an alert on replication slots: one a session reads, two that nobody reads",
                  hint=ALERT_HINT)
    for name in slots:
        lab.execute(_q("drop_slot_if_there"), {"slot": name})      # a killed run's, if any
    s = scratch(lab)
    wait = Guards(statement_timeout=f"{cdc.SLOT_WAIT_S}s")
    opened: list[psycopg.Connection] = []
    try:
        cdc.unrelated_table(s)
        consumer = s.connect(role="alert-lagging", guards=wait)
        pin = s.connect(role="alert-pin", autocommit=False)
        opened += [consumer, pin]
        with cdc.slot_errors(s):
            consumer.execute(_q("create_slot"), {"slot": lagging})
        # a transaction stays open while the lagging consumer confirms everything
        pin.execute(_q("alert_pin"))
        cdc.unrelated_wal(s, LAG_BYTES)
        _confirm_all(consumer, lagging)
        pin.commit()
        with cdc.slot_errors(s):
            consumer.execute(_q("alert_create_physical"), {"slot": physical})
            consumer.execute(_q("create_slot"), {"slot": connected})
        opened.append(_stream_from(s, connected))
        _wait_active(s, slots, connected)
        cdc.unrelated_wal(s, CONNECTED_BYTES)
        before = _truth(s, slots)
        if (set(before) != set(slots) or before[lagging][1] < LAG_BYTES
                or before[lagging][3] >= LAG_BYTES or not before[connected][0]
                or before[lagging][0] or before[physical][0]):
            raise LabkitError("The checker could not build its scene: its lagging slot does not "
                              "keep more WAL than its consumer confirmed, or a slot is not read "
                              "as it should be.",
                              "run the cell again; if it fails again, run `labkit doctor`.")
        with Solo(s, role="alert") as conn:
            try:
                cur = conn.execute(text)
                rows = cur.fetchall() if cur.description else []
                width = len(cur.description or [])
            except Exception as exc:  # noqa: BLE001 - the learner's SQL may fail in any way
                check.add(False, f"the query failed: {type(exc).__name__}: "
                                 f"{str(exc).strip().splitlines()[0]}")
                return check
        after = _truth(s, slots)
        _judge(check, rows, width, slots, before, after)
        return check
    finally:
        pids = [c.info.backend_pid for c in opened if not c.closed]
        for conn in opened:                    # the streaming session lets go of its slot ...
            conn.close()
        try:
            wait_backends_gone(lab.admin, pids, what="the checker's slot sessions")  # ... once it ended
            for name in slots:
                lab.execute(_q("drop_slot_if_there"), {"slot": name})
        finally:
            s.drop()


def _who(slots: tuple[str, str, str]) -> dict[str, str]:
    """How the findings name each of the checker's slots."""
    lagging, connected, physical = slots
    return {lagging: "the logical slot nobody reads", connected: "the logical slot a session reads",
            physical: "the physical slot nobody reads"}


def _name_column(rows: list[tuple], ours: set[str]) -> int | None:
    """The first of the three columns that names one of the checker's slots, if any does."""
    return next((c for c in range(3) if any(isinstance(r[c], str) and r[c] in ours
                                            for r in rows)), None)


def _judge_listed(check: Check, rows: list[tuple], name_col: int,
                  slots: tuple[str, str, str]) -> tuple[dict[str, tuple], list[str]]:
    """The finding on whether each slot is listed once; returns each listed slot's (first)
    row, and the slots missing."""
    seen = {name: [r for r in rows if r[name_col] == name] for name in slots}
    who = _who(slots)
    missing = [name for name in slots if not seen[name]]
    twice = [name for name in seen if len(seen[name]) > 1]
    check.add(not missing and not twice,
              "every slot is listed once, by its name" if not missing and not twice else
              f"a slot is missing ({and_list([who[n] for n in missing])}): an alert lists every "
              "slot, logical or physical, and a WHERE clause hid it" if missing else
              "a slot is listed more than once: one row per slot")
    return {name: found[0] for name, found in seen.items() if found}, missing


def _flag_column(row: dict[str, tuple], name_col: int) -> int | None:
    """The one other column that is a boolean in every listed row (None unless exactly one is)."""
    flags = [c for c in range(3) if c != name_col and all(isinstance(r[c], bool) for r in row.values())]
    return flags[0] if len(flags) == 1 else None


def _judge_connected(check: Check, row: dict[str, tuple], flag: int,
                     slots: tuple[str, str, str], only: str) -> None:
    """The finding on the connected column: true for the slot a session reads, false for the
    ones nobody reads.  A wrong one says for which slots it is wrong, not which column to use."""
    who = _who(slots)
    connected = slots[1]
    expected = {name: name == connected for name in slots}
    says = {name: r[flag] for name, r in row.items()}
    wrong = [name for name in says if says[name] is not expected[name]]
    if not wrong:
        said = and_list([f"{'true' if expected[n] else 'false'} for {who[n]}" for n in says])
        check.add(True, f"the connected column is {said}{only}")
        return
    why = ("it should say whether a session is reading the slot at this moment, and "
           + ("that slot is a permanent one, which a session reads all the same"
              if connected in wrong else "nobody reads the slot"))
    said = and_list([f"{'true' if says[n] else 'false'} for {who[n]}" for n in wrong])
    check.add(False, f"the connected column is {said}: {why}")


def _judge_wal_type(check: Check, cells: dict[str, object]) -> bool:
    """The finding on a WAL column that is not a number; False when its bytes cannot be
    judged at all (pg_size_pretty's text still can be; a NULL is judged per slot)."""
    values = [v for v in cells.values() if v is not None]
    if not values:
        check.add(False, "the WAL column is NULL for every slot: it should be the bytes each "
                         "slot keeps")
        return False
    if any(isinstance(v, str) for v in values):
        check.add(False, "the WAL column is text, as pg_size_pretty gives: an alert compares "
                         "numbers, and as text '9 MB' sorts above '10 GB'. Keep the bytes")
    elif not all(isinstance(v, Real) or isinstance(v, Decimal) for v in values):
        check.add(False, "the WAL column is not a number of bytes")
        return False
    return True


def _judge(check: Check, rows: list[tuple], width: int, slots: tuple[str, str, str],
           before: dict, after: dict) -> None:
    """The findings on the alert's result in order: its width, the slots it lists, the
    connected column, then the WAL column; a finding the rest cannot be judged without
    ends the check."""
    if width != 3:
        check.add(False, f"it returns {width} column(s); the alert needs three: the slot's name, "
                         "whether a consumer is connected, and the WAL it keeps in bytes")
        return
    name_col = _name_column(rows, set(slots))
    if name_col is None:
        check.add(False, "none of the checker's three slots is in the result: an alert lists "
                         "every slot, by its name (slot_name)")
        return
    row, missing = _judge_listed(check, rows, name_col, slots)
    # what the findings below can say: only of the slots the result lists
    who = _who(slots)
    only = ("" if not missing else " (the one slot listed)" if len(row) == 1
            else " (the slots listed)")
    listed = "each slot" if not missing else f"{and_list([who[n] for n in row])}{only}"
    flag = _flag_column(row, name_col)
    if flag is None:
        check.add(False, "no column says true or false whether a consumer is connected "
                         "(pg_replication_slots.active)")
        return
    _judge_connected(check, row, flag, slots, only)
    wal = next(c for c in range(3) if c not in (name_col, flag))
    cells = {name: r[wal] for name, r in row.items()}
    if _judge_wal_type(check, cells):
        _judge_bytes(check, cells, slots, before, after, listed)


def _judge_bytes(check: Check, cells: dict, slots: tuple[str, str, str], before: dict,
                 after: dict, listed: str = "each slot") -> None:
    def within(value, low: int | None, high: int | None) -> bool:
        span = _as_range(value)
        return (span is not None and low is not None and high is not None
                and span[1] >= low - SLACK_BYTES and span[0] <= high)

    lagging = slots[0]
    who = _who(slots)
    kept = {name: (before[name][1], after[name][2]) for name in cells}
    behind = {name: (before[name][3], after[name][4]) for name in cells}
    wrong = []
    for name, value in cells.items():
        if within(value, *kept[name]):
            continue
        if name == lagging and within(value, *behind[name]):
            wrong.append(f"for {who[name]} it gives under {LAG_BYTES // (1024 * 1024)} "
                         "MB, how far its consumer is behind what it confirmed "
                         f"(confirmed_flush_lsn); the slot keeps more than "
                         f"{LAG_BYTES // (1024 * 1024)} MB: a transaction open at the confirm "
                         "held back where its kept WAL begins")
        elif value is None:
            wrong.append(f"for {who[name]} it gives NULL, yet the slot keeps WAL: measure from a "
                         "position that every kind of slot has")
        elif _as_range(value) is None:
            wrong.append(f"for {who[name]} it gives no number of bytes ({value!r})")
        else:
            low, high = kept[name]
            wrong.append(f"for {who[name]} it gives {value} bytes; the slot kept from "
                         f"{low:,} to {high:,} bytes while the query ran")
    if not wrong:
        check.add(True, f"for {listed} it gives the WAL the slot keeps (from its restart_lsn), "
                        "as the checker measured it before and after the query")
    for text in wrong:
        check.add(False, text)
