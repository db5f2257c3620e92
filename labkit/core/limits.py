"""Bounds on what a lab may be asked to do, checked before any work starts.

Every number a command takes is checked here the same way: it must be a number (a whole
one where a count is meant), finite (no ``inf``, no ``nan``), not below its floor and not
above a ceiling that keeps a run to minutes on a laptop.  A bad one is a
:class:`~labkit.errors.LabkitError` that names the parameter, the range and an example.

Bulk writes (thousands of rows in one INSERT) run under a statement timeout, with the
server checking that the client is still there, so an INSERT whose client vanished
(killed, interrupted, the laptop closed) is cancelled by the server instead of running on.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from psycopg import sql
from psycopg.abc import Params

from .errors import LabkitError, ServerError
from .lab import Lab


def _fmt(x) -> str:
    return f"{x:,}" if isinstance(x, int) else f"{x:g}"


def number(name: str, value: Any, *, high: float, low: float = 0, above: bool = False, whole: bool = False,
           unit: str = "", example: float | None = None) -> int | float:
    """``value`` if it is a finite number with ``low <= value <= high`` (``low < value`` when
    ``above``); a whole number when ``whole``.  Otherwise a LabkitError naming ``name``."""
    example = example if example is not None else (low + 1 if whole else high / 10)
    kind = "a whole number" if whole else "a number"
    where = f"{'above' if above else 'from'} {_fmt(low)} to {_fmt(high)}{unit}"
    fix = f"pass {name}={_fmt(example)} (any value {where})."
    if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)):
        raise LabkitError(f"{name}={value!r} is not {kind}.", fix)
    if not math.isfinite(value):
        raise LabkitError(f"{name}={value!r} is not a finite number.", fix)
    if value < low or (above and value == low):
        raise LabkitError(f"{name}={_fmt(value)} is too small: it must be {where}.", fix)
    if value > high:
        raise LabkitError(f"{name}={_fmt(value)} is more than this lab handles ({_fmt(high)}{unit} at most).",
                          fix)
    return value


def writable_file(path: str | os.PathLike, what: str = "the output") -> Path:
    """Check, before any work, that ``path`` can be written: its folder exists and takes a
    new file.  Nothing is left behind by the check."""
    p = Path(path).expanduser()
    What = what[:1].upper() + what[1:]
    fix = "pass a file name in a folder that exists and that you may write to (out/convoy.png, say)."
    if p.is_dir():
        raise LabkitError(f"{What} {str(path)!r} is a folder, not a file.", fix)
    folder = p.parent if str(p.parent) else Path(".")
    if folder.exists() and not folder.is_dir():
        raise LabkitError(f"The folder of {what} ({str(folder)!r}) is a file, not a folder.", fix)
    if not folder.is_dir():
        raise LabkitError(f"The folder of {what} ({str(folder)!r}) does not exist.",
                          f"create it first (mkdir -p {folder}), or {fix}")
    existed = p.exists()
    try:
        with open(p, "ab"):
            pass
    except OSError as exc:
        raise LabkitError(f"{What} {str(path)!r} cannot be written ({exc.strerror or exc}).", fix) from None
    if not existed:
        try:
            p.unlink()
        except OSError:
            pass
    return p


# -- bulk writes ----------------------------------------------------------------------------------

BULK_BASE_S = 60           # every bulk statement gets this long...
BULK_ROWS_PER_S = 20_000   # ...plus a second per this many rows (a slow laptop writes more)


def bulk_timeout_s(rows: int) -> float:
    return BULK_BASE_S + max(0, rows) / BULK_ROWS_PER_S


def bulk(lab: Lab, query: str | bytes | sql.SQL | sql.Composed, params: Params | None = None, *,
         rows: int) -> None:
    """Run one bulk statement (an INSERT of ``rows`` rows) on the lab's admin connection,
    in a transaction of its own with a statement timeout sized for it, and with the server
    checking every two seconds that the client is still connected (PostgreSQL 14 and
    newer), so that it stops when its client is gone."""
    import psycopg


    timeout_ms = int(bulk_timeout_s(rows) * 1000)
    conn = lab.admin
    try:
        with conn.transaction():
            conn.execute("SELECT set_config('statement_timeout', %s, true)", (f"{timeout_ms}ms",))
            if conn.info.server_version >= 140000:
                conn.execute("SELECT set_config('client_connection_check_interval', '2s', true)")
            conn.execute(query, params)
    except psycopg.errors.QueryCanceled:
        raise LabkitError(f"Writing {rows:,} rows took over {timeout_ms / 1000:.0f} s and was cancelled.",
                          "check the server's load with `labkit doctor`, or ask for fewer rows.") from None
    except psycopg.OperationalError as exc:
        if not (conn.closed or conn.broken):
            raise
        raise ServerError(f"The server stopped answering while writing {rows:,} rows into {lab.schema} "
                          f"({str(exc).strip().splitlines()[0] if str(exc).strip() else exc}).",
                          "if you use the embedded server, run `labkit server start` and run the "
                          "command again.") from None
