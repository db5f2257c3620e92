"""Values the labs take as given -- the one row a statement always returns (``INSERT ...
RETURNING``, ``SELECT count(*)``, a clock read), the pid of a worker process that has
started -- taken with a check that fails with an error naming what was missing, instead of
``'NoneType' object is not subscriptable`` further on.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

import psycopg

from .errors import LabkitError

Row = TypeVar("Row")


class Worker(Protocol):
    """What :func:`started_pid` reads of a :class:`~labkit.core.procs.Worker`."""

    name: str

    @property
    def pid(self) -> int | None: ...



def one_row(cur: psycopg.Cursor[Row], what: str) -> Row:
    """The cursor's next row; a :class:`LabkitError` naming ``what`` (the statement) when there
    is none."""
    row = cur.fetchone()
    if row is None:
        raise LabkitError(f"{what} returned no row, where it always returns one.",
                          "report this, with the notebook cell that ran it: the lab's tables or "
                          "its SQL are not what the lab wrote.")
    return row


def started_pid(worker: Worker) -> int:
    """The process id of a worker that has been started; a :class:`LabkitError` if it has not."""
    pid = worker.pid
    if pid is None:
        raise LabkitError(f"Worker {worker.name!r} has no process: it was never started.",
                          "call its start() (or use it in a with block) before signalling it.")
    return pid


def one_row_named(cur: psycopg.Cursor[tuple[Any, ...]], what: str) -> dict[str, Any]:
    """The cursor's next row as {column name: value}; a :class:`LabkitError` naming ``what``
    when there is none."""
    row = one_row(cur, what)
    if cur.description is None:     # a cursor that gave a row has its columns
        raise LabkitError(f"{what} returned a row without column names.",
                          "report this: psycopg describes every result that has rows.")
    return dict(zip([c.name for c in cur.description], row))


def column_names(cur: psycopg.Cursor[Any], what: str) -> list[str]:
    """The names of the columns of ``cur``'s result; a :class:`LabkitError` naming ``what``
    when the statement returned no result set (it was not a query)."""
    if cur.description is None:
        raise LabkitError(f"{what} returned no columns, where it always returns rows.",
                          "report this, with the notebook cell that ran it: the lab's SQL is not "
                          "what the lab wrote.")
    return [c.name for c in cur.description]
