"""Exercises the server checks: the learner writes SQL, a checker runs it live and says
what broke.

A checker takes the learner's SQL as a string, builds the scene it needs in a scratch
schema of its own (next to the notebook's lab, dropped afterwards), runs the SQL there in
real sessions, in a scripted order where the order is the point, and returns a
:class:`Check`: one line per finding, ``ok`` or ``WRONG``, and a hint once something is
wrong. It reads what happened from the database, never from the learner's SQL text.

The pieces every checker shares are here: :class:`Check`, :func:`scratch` (the throw-away
schema; :func:`scratch_name` names a throw-away database on another engine), :func:`bind`
(the learner's parameters written in, with an error that says which ones are allowed;
:func:`fill_in` does it with another engine's driver), :func:`unchanged` (whether an attempt is
still the notebook's starting point) and :class:`Solo` (one autocommit session). The interview drill's
checkers (the claim, the dashboard count, the reaper) are in :mod:`labkit.tools.drill`;
each later notebook's checkers are in a module of this package named after it.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...core.db import Guards
from ...core.errors import LabkitError
from ...core.lab import Lab
from ...core.text import fill

if TYPE_CHECKING:
    import psycopg

# A check's lines are at most this wide (the widest a notebook's output may be is 96).
WIDTH = 88

_scratch_ids = itertools.count(1)


@dataclass
class Check:
    """The outcome of one self-check: each finding is (ok, text)."""

    title: str
    findings: list[tuple[bool, str]] = field(default_factory=list)
    hint: str = ""

    @property
    def passed(self) -> bool:
        return bool(self.findings) and all(ok for ok, _ in self.findings)

    def add(self, ok: bool, text: str) -> bool:
        self.findings.append((bool(ok), text))
        return bool(ok)

    def __str__(self) -> str:
        lines = [f"{'PASS' if self.passed else 'FAIL'}: {self.title}"]
        lines += [fill(text, WIDTH, " " * 9, f"  {'ok' if ok else 'WRONG':5}  ") for ok, text in self.findings]
        if not self.passed and self.hint:
            lines.append(fill(self.hint, WIDTH, "        ", "  hint  "))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)


def unchanged(attempt: object, starter: str) -> bool:
    """Whether ``attempt`` is still ``starter``, the notebook's starting point: SQL comments,
    spacing, case and a closing semicolon aside (a checker answers the untouched starting point
    with what is wrong and an invitation to try, and keeps its hint for an attempt)."""
    def plain(text: str) -> str:
        text = re.sub(r"--[^\n]*", " ", text)
        return " ".join(text.split()).rstrip(";").strip().lower()
    return isinstance(attempt, str) and plain(attempt) == plain(starter)


def scratch_name(prefix: str = "drill_check") -> str:
    """A name for a throw-away schema or database that no other of this process has."""
    return f"{prefix}_{os.getpid()}_{next(_scratch_ids)}"


def scratch(lab: Lab) -> Lab:
    """A throw-away lab schema next to ``lab``'s (the caller drops it, in a ``finally``)."""
    return Lab.open(lab.db, scratch_name())


def fill_in(mogrify: Callable[[str, dict], str], query: str, params: dict,
            errors: tuple[type[Exception], ...] = (KeyError, TypeError, ValueError), *,
            name_error: bool = False) -> str:
    """``query`` with ``params`` written in as literals by ``mogrify(query, params)`` (a
    driver's client-side cursor's).  One of ``errors`` from it becomes a LabkitError that
    says which parameters are allowed (naming the error's type too with ``name_error``)."""
    try:
        return mogrify(query, params)
    except errors as exc:
        allowed = (f"use only {', '.join(f'%({k})s' for k in params)}" if params
                   else "this statement takes no parameters")
        detail = f"{type(exc).__name__}: {exc}" if name_error else str(exc)
        raise LabkitError(f"The SQL's parameters could not be filled in ({detail}).",
                          f"{allowed}, and write a literal % as %%.") from None


def bind(lab: Lab, query: str, params: dict) -> str:
    """The learner's SQL with its parameters written in as literals (for a scripted session)."""
    import psycopg

    if not isinstance(query, str) or not query.strip():
        raise LabkitError("The SQL to check is empty.", "write your statement in the string and run the cell again.")
    return fill_in(lambda q, p: psycopg.ClientCursor(lab.admin).mogrify(q, p), query, params,
                   (psycopg.ProgrammingError, KeyError, TypeError, ValueError))


class Solo:
    """One autocommit session of a lab, closed on exit (for SQL that runs alone)."""

    def __init__(self, lab: Lab, role: str = "reaper", statement_timeout: str = "10s"):
        self.conn = lab.connect(role=role, guards=Guards(statement_timeout=statement_timeout))

    def __enter__(self) -> psycopg.Connection:
        return self.conn

    def __exit__(self, *exc: object) -> None:
        self.conn.close()
