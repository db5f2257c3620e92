"""PostgreSQL isolation-tester specs, run on a real server and printed the tester's way.

A spec (``src/test/isolation/specs/*.spec`` in PostgreSQL) names sessions, the
steps each session may take, and the orders ("permutations") to try them in::

    setup    { CREATE TABLE job (...); }      # run before every permutation
    teardown { DROP TABLE job; }              # run after every permutation

    session s1
    setup      { BEGIN; }                     # this session, before the steps
    step s1a   { SELECT ... FOR UPDATE; }
    step s1c   { COMMIT; }

    session s2
    ...

    permutation s1a s2a s1c s2c               # or none: every interleaving

``run()`` plays every permutation on a real server through :class:`Sessions`
and returns the text PostgreSQL's ``isolationtester`` prints, byte for byte:
``step s2a: SQL <waiting ...>`` when a step blocks on a lock, ``step s2a: <...
completed>`` when it later finishes, result sets the way libpq's ``PQprint``
lays them out, ``ERROR:  message`` for failures and ``s1: NOTICE:  ...`` for
notices.  So a spec's output can be compared with the ``.out`` file PostgreSQL
expects for it.

Where PostgreSQL's tester puts a spec's objects, so does ``run()``: in a database of the
run's own (``labkit_spec_<user>_<pid>``, made from ``template0`` and dropped at the end, on
an error or an interrupt too), in its ``public`` schema, so that ``EXPLAIN (VERBOSE)`` prints
``public.t`` as PostgreSQL's expected output does, the same on every run.  Where labkit's
database user may not create databases (no CREATEDB, as on some shared servers), the spec
runs in a lab schema instead and one printed note says why; names that PostgreSQL prints
as ``public.t`` then read ``lab_spec_<pid>_<user>.t`` (or the given lab's schema).
Databases that killed runs left behind: :func:`drop_spec_databases`.

Every SQL text of the spec (setup, teardown, session setup and teardown, steps) runs as
a throw-away role that may use that database's ``public`` schema (or that lab schema) and
nothing else (:mod:`labkit.core.sandbox`); where the server has parameter privileges
(PostgreSQL 15 and later) and labkit's user may grant them, that role may also set
``deadlock_timeout`` (:func:`grant_parameters`).  ``trusted=True`` (``--trusted``) runs the
SQL as labkit's own role instead, for a spec that needs more (one that updates
``pg_class``, say), and is refused on a classroom server
(:func:`refuse_trusted_on_a_classroom`).  On MySQL and MariaDB the SQL runs as a
throw-away user with rights on the run's database alone
(:class:`labkit.core.mysql.SandboxUser`).  A spec file may hold at most 1 MB, one
without permutation lines may interleave its steps in at most 10,000 ways, and a spec
may have at most ``MAX_SESSIONS`` (16) sessions.

Command line (wired in ``labkit/cli.py``)::

    labkit spec run FILE.spec [FILE2.spec ...] [--diff EXPECTED.out ...] [--trusted]
    labkit spec permutations FILE.spec
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TextIO

import psycopg
from psycopg import pq
from psycopg import sql as psql  # (``sql`` names a step's text below)
from psycopg.conninfo import make_conninfo

from ..core.checked import one_row
from ..core.db import Database, Guards, connect, current_user_tag, session_name
from ..core.errors import LabkitError, SpecError
from ..core.files import data_file
from ..core.lab import Lab
from ..core.mysessions import MySessions
from ..core.mysql import ENGINES
from ..core.queries import query, statements
from ..core.sandbox import Deadline, Sandbox, cancel_every, check_number, read_input
from ..core.sessions import MAX_SESSIONS, Sessions
from ..core.sessions import Step as EngineStep

MAX_SPEC_BYTES = 1_000_000
MAX_PERMUTATIONS = 10_000
MAX_TIMEOUT_S = 86_400

__all__ = ["Blocker", "Permutation", "PermutationStep", "Session", "Spec", "Step",
           "TrustRefused", "drop_spec_databases", "format_result", "grant_parameters", "parse",
           "parse_file", "refuse_trusted_on_a_classroom", "run", "run_file", "run_mysql",
           "spec_command", "spec_database_name", "spec_databases"]

# ======================================================================================
# The spec, as data
# ======================================================================================


@dataclass
class Step:
    name: str
    sql: str                 # as written between the braces, edges trimmed like the tester does
    session: str
    line: int = 0
    column: int = 0


@dataclass
class Session:
    name: str
    steps: list[Step]
    setup: str | None = None
    teardown: str | None = None
    conninfo: str | None = None
    line: int = 0
    column: int = 0


@dataclass
class Blocker:
    """One annotation inside ``step(...)`` in a permutation line.

    ``kind`` is ``"once"`` for ``(*)`` (report the step as waiting once, even if it
    finished at once), ``"step"`` for ``(other)`` (do not report it complete while step
    ``other`` is still running) or ``"notices"`` for ``(other notices N)`` (not before
    ``other``'s session has sent N more notices).
    """

    kind: str
    step: str | None = None
    notices: int | None = None
    line: int = 0
    column: int = 0

    @property
    def other(self) -> str:
        """The step a ``step`` or ``notices`` blocker waits on."""
        if self.step is None:
            raise SpecError(f"line {self.line}: a ({self.kind}) blocker names no step.",
                            "write (other) or (other notices N) after the step's name.")
        return self.step

    @property
    def needed(self) -> int:
        """How many more notices a ``notices`` blocker waits for."""
        if self.notices is None:
            raise SpecError(f"line {self.line}: a ({self.kind}) blocker counts no notices.",
                            "write (other notices N) after the step's name.")
        return self.notices

    def __str__(self) -> str:
        if self.kind == "once":
            return "*"
        if self.kind == "notices":
            return f"{self.step} notices {self.notices}"
        return str(self.step)


@dataclass
class PermutationStep:
    name: str
    blockers: list[Blocker] = field(default_factory=list)
    line: int = 0
    column: int = 0

    def __str__(self) -> str:
        if not self.blockers:
            return self.name
        return f"{self.name}({', '.join(str(b) for b in self.blockers)})"


@dataclass
class Permutation:
    steps: list[PermutationStep]
    line: int = 0

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.steps]


@dataclass
class Spec:
    sessions: list[Session]
    setup: list[str] = field(default_factory=list)
    teardown: str | None = None
    permutations: list[Permutation] = field(default_factory=list)
    conninfo: str | None = None
    filename: str = "<spec>"
    warnings: list[str] = field(default_factory=list)

    @property
    def steps(self) -> list[Step]:
        return [st for s in self.sessions for st in s.steps]

    def step(self, name: str) -> Step:
        for st in self.steps:
            if st.name == name:
                return st
        raise KeyError(name)

    def all_permutations(self) -> Iterator[Permutation]:
        """Every interleaving of the sessions' steps, each session's steps in order.

        The order is the tester's: take the next step of the first session that has
        one left, recurse, then try the next session instead (depth first).
        """
        piles = [0] * len(self.sessions)
        chosen: list[Step] = []
        total = sum(len(s.steps) for s in self.sessions)

        def recurse() -> Iterator[Permutation]:
            if len(chosen) == total:
                yield Permutation([PermutationStep(st.name) for st in chosen])
                return
            for i, sess in enumerate(self.sessions):
                if piles[i] < len(sess.steps):
                    chosen.append(sess.steps[piles[i]])
                    piles[i] += 1
                    yield from recurse()
                    piles[i] -= 1
                    chosen.pop()

        yield from recurse()

    def permutation_count(self) -> int:
        """How many permutations run: the permutation lines, or else the number of
        interleavings (a multinomial coefficient, counted without listing them)."""
        if self.permutations:
            return len(self.permutations)
        count, placed = 1, 0
        for sess in self.sessions:
            placed += len(sess.steps)
            count *= math.comb(placed, len(sess.steps))
        return count

    def check_size(self) -> None:
        """Refuse, before running anything, a spec whose interleavings are too many."""
        count = self.permutation_count()
        if count <= MAX_PERMUTATIONS:
            return
        steps = sum(len(s.steps) for s in self.sessions)
        shown = f"{count:,}" if count < 10 ** 12 else f"about 10^{len(str(count)) - 1}"
        raise SpecError(
            f"{self.filename}: its {len(self.sessions)} sessions with {steps} steps in all, and no "
            f"permutation line, interleave in {shown} ways; labkit runs at most "
            f"{MAX_PERMUTATIONS:,} permutations of a spec.",
            "write the orders worth running as `permutation s1a s2a s1b ...` lines at the end "
            "of the spec (or split it into smaller specs).")

    def permutations_to_run(self) -> Iterator[Permutation]:
        """The permutation lines, or every interleaving when there are none."""
        if self.permutations:
            yield from self.permutations
        else:
            yield from self.all_permutations()


# ======================================================================================
# Scanner (PostgreSQL's specscanner.l, with positions)
# ======================================================================================

KEYWORDS = {"conninfo", "notices", "permutation", "session", "setup", "step", "teardown"}
_SPACE = " \t\r\f"        # the scanner's {space}: note that a newline is not one


@dataclass
class _Tok:
    kind: str     # keyword text, "ident", "int", "sql", one of "(),*", or "eof"
    value: str
    line: int
    column: int

    def describe(self) -> str:
        if self.kind == "eof":
            return "the end of the file"
        if self.kind == "sql":
            return "an SQL block { ... }"
        if self.kind == "ident":
            return f"the name {self.value!r}"
        if self.kind == "int":
            return f"the number {self.value}"
        if self.kind in KEYWORDS:
            return f"the keyword {self.kind!r}"
        return repr(self.value)


def _error(filename: str, line: int, column: int, what: str, fix: str) -> SpecError:
    err = SpecError(f"{filename}:{line}:{column}: {what}", fix)
    err.filename, err.line, err.column = filename, line, column
    return err


def _tokenize(text: str, filename: str) -> list[_Tok]:
    """The tokens of a spec's text, each with the line and column it starts at."""
    return _Scanner(text, filename).scan()


class _Scanner:
    """One pass of PostgreSQL's specscanner.l over a spec's text: the tokens, each with the
    line and column it starts at, and an error that points at the place it is about."""

    def __init__(self, text: str, filename: str) -> None:
        self.text, self.filename = text, filename
        self.toks: list[_Tok] = []
        self.i, self.n = 0, len(text)
        self.line, self.col = 1, 1

    def advance(self, k: int) -> None:
        """Move ``k`` characters on, counting lines and columns."""
        for _ in range(k):
            if self.text[self.i] == "\n":
                self.line += 1
                self.col = 1
            else:
                self.col += 1
            self.i += 1

    def scan(self) -> list[_Tok]:
        """Every token of the text, then one ``eof``."""
        while self.i < self.n:
            c = self.text[self.i]
            if c == "\n" or c in _SPACE:
                self.advance(1)
            elif c == "#":
                self._skip_comment()
            elif c.isascii() and (c.isalpha() or c == "_"):
                self._word()
            elif c.isascii() and c.isdigit():
                self._number()
            elif c == '"':
                self._quoted_name()
            elif c == "{":
                self._sql_block()
            elif c in "(),*":
                self.toks.append(_Tok(c, c, self.line, self.col))
                self.advance(1)
            else:
                raise _error(self.filename, self.line, self.col, f"unexpected character {c!r}.",
                             "a spec holds only keywords, names, { SQL } blocks, # comments and, "
                             "in permutation lines, ( , * ) for blocker annotations.")
        self.toks.append(_Tok("eof", "", self.line, self.col))
        return self.toks

    def _skip_comment(self) -> None:
        """A # comment, up to the end of its line."""
        while self.i < self.n and self.text[self.i] not in "\n\r":
            self.advance(1)

    def _word(self) -> None:
        """A keyword, or a name (ASCII letters, digits and _)."""
        start, l0, c0 = self.i, self.line, self.col
        while self.i < self.n and self.text[self.i].isascii() and (self.text[self.i].isalnum()
                                                                   or self.text[self.i] == "_"):
            self.advance(1)
        word = self.text[start:self.i]
        self.toks.append(_Tok(word if word in KEYWORDS else "ident", word, l0, c0))

    def _number(self) -> None:
        """An integer (ASCII digits)."""
        start, l0, c0 = self.i, self.line, self.col
        while self.i < self.n and self.text[self.i].isascii() and self.text[self.i].isdigit():
            self.advance(1)
        self.toks.append(_Tok("int", self.text[start:self.i], l0, c0))

    def _quoted_name(self) -> None:
        """A "quoted name" on one line, "" standing for one "."""
        l0, c0 = self.line, self.col
        self.advance(1)
        buf: list[str] = []
        while True:
            if self.i >= self.n:
                raise _error(self.filename, l0, c0, "unterminated quoted name (the closing \" is missing).",
                             "end the name with a double quote on the same line.")
            ch = self.text[self.i]
            if ch == "\n":
                raise _error(self.filename, l0, c0, "a quoted name runs past the end of its line.",
                             "end the name with a double quote on the same line.")
            if ch == '"':
                if self.i + 1 < self.n and self.text[self.i + 1] == '"':      # "" stands for one "
                    buf.append('"')
                    self.advance(2)
                    continue
                self.advance(1)
                break
            buf.append(ch)
            self.advance(1)
        self.toks.append(_Tok("ident", "".join(buf), l0, c0))

    def _sql_block(self) -> None:
        """A { SQL } block: its text from the first non-space after { to the first }, with
        trailing spaces cut."""
        l0, c0 = self.line, self.col
        self.advance(1)
        while self.i < self.n and self.text[self.i] in _SPACE:
            self.advance(1)
        start = self.i
        while self.i < self.n and self.text[self.i] != "}":
            if self.text[self.i] == "{":
                # PostgreSQL's scanner would read on to the next block's }, and then
                # fail somewhere later; the real mistake is the missing } here.
                raise _error(self.filename, l0, c0,
                             f"unterminated SQL block: this {{ is not closed before the "
                             f"next {{ at line {self.line}, column {self.col}.",
                             "close the block with }. (As in PostgreSQL's tester, a block "
                             "ends at the first }, so its SQL cannot contain braces.)")
            self.advance(1)
        if self.i >= self.n:
            raise _error(self.filename, l0, c0, "unterminated SQL block: this { has no closing }.",
                         "close the block with }. (As in PostgreSQL's tester, the first } "
                         "ends a block, so a step's SQL cannot contain one.)")
        body = self.text[start:self.i].rstrip(_SPACE)
        self.advance(1)
        self.toks.append(_Tok("sql", body, l0, c0))


# ======================================================================================
# Parser (PostgreSQL's specparse.y grammar)
# ======================================================================================

class _Parser:
    def __init__(self, toks: list[_Tok], filename: str) -> None:
        self.toks = toks
        self.pos = 0
        self.filename = filename

    @property
    def tok(self) -> _Tok:
        return self.toks[self.pos]

    def take(self) -> _Tok:
        t = self.toks[self.pos]
        self.pos += 1
        return t

    def fail(self, tok: _Tok, expected: str, fix: str | None = None) -> SpecError:
        what = f"expected {expected}, found {tok.describe()}."
        if tok.kind == "ident" and any(f"'{kw}'" in expected for kw in KEYWORDS):
            what = f"unknown keyword {tok.value!r}: {what}"
            close = difflib.get_close_matches(tok.value.lower(), sorted(KEYWORDS), n=1, cutoff=0.6)
            if close and not fix:
                fix = f"did you mean {close[0]!r}? (Keywords are lower case.)"
        return _error(self.filename, tok.line, tok.column, what, fix or (
            "a spec is: setup { } blocks, an optional teardown { }, one or more "
            "`session NAME` (optional setup { }, `step NAME { SQL }` lines, optional "
            "teardown { }), then optional `permutation step step ...` lines."))

    def expect(self, kind: str, expected: str) -> _Tok:
        if self.tok.kind != kind:
            raise self.fail(self.tok, expected)
        return self.take()

    def name(self, what: str) -> _Tok:
        return self.expect("ident", what)

    def sql(self, after: str) -> str:
        return self.expect("sql", f"an SQL block {{ ... }} after {after!r}").value

    def parse(self) -> Spec:
        spec = Spec(sessions=[], filename=self.filename)
        if self.tok.kind == "conninfo":
            self.take()
            spec.conninfo = self.name("a connection string after 'conninfo'").value
        while self.tok.kind == "setup":
            self.take()
            spec.setup.append(self.sql("setup"))
        if self.tok.kind == "teardown":
            self.take()
            spec.teardown = self.sql("teardown")
        while self.tok.kind == "session":
            spec.sessions.append(self.session())
        if not spec.sessions:
            if self.tok.kind == "eof":
                raise _error(self.filename, self.tok.line, self.tok.column,
                             "the spec defines no session.",
                             "add at least one `session NAME` with one or more `step NAME { SQL }`.")
            expected = ("a keyword ('setup', 'teardown' or 'session')" if not spec.setup and
                        spec.teardown is None else
                        "a keyword ('session'" + (")" if spec.teardown is not None else
                                                  ", 'setup' or 'teardown')"))
            raise self.fail(self.tok, expected)
        while self.tok.kind == "permutation":
            spec.permutations.append(self.permutation())
        if self.tok.kind != "eof":
            if spec.permutations:
                expected = "'permutation' or the end of the file"
            elif spec.sessions[-1].teardown is not None:
                expected = "'session', 'permutation' or the end of the file"
            else:
                expected = "'step', 'teardown', 'session', 'permutation' or the end of the file"
            raise self.fail(self.tok, expected)
        return spec

    def session(self) -> Session:
        kw = self.take()
        name = self.name("a session name after 'session'")
        sess = Session(name.value, [], line=kw.line, column=kw.column)
        if self.tok.kind == "conninfo":
            self.take()
            sess.conninfo = self.name("a connection string after 'conninfo'").value
        if self.tok.kind == "setup":
            self.take()
            sess.setup = self.sql("setup")
        while self.tok.kind == "step":
            kw = self.take()
            sname = self.name("a step name after 'step'")
            sess.steps.append(Step(sname.value, self.sql(f"step {sname.value}"), sess.name,
                                   sname.line, sname.column))
        if not sess.steps:
            raise self.fail(self.tok, f"'step' (session {sess.name} needs at least one step)")
        if self.tok.kind == "teardown":
            self.take()
            sess.teardown = self.sql("teardown")
        return sess

    def permutation(self) -> Permutation:
        kw = self.take()
        perm = Permutation([], line=kw.line)
        while self.tok.kind == "ident":
            t = self.take()
            ps = PermutationStep(t.value, line=t.line, column=t.column)
            if self.tok.kind == "(":
                self.take()
                while True:
                    ps.blockers.append(self.blocker())
                    if self.tok.kind == ",":
                        self.take()
                        continue
                    self.expect(")", "',' or ')' in the blocker list")
                    break
            perm.steps.append(ps)
        if not perm.steps:
            raise self.fail(self.tok, "a step name after 'permutation'")
        return perm

    def blocker(self) -> Blocker:
        t = self.tok
        if t.kind == "*":
            self.take()
            return Blocker("once", line=t.line, column=t.column)
        name = self.name("a step name or * inside ( )")
        if self.tok.kind == "notices":
            self.take()
            count = self.expect("int", "a number after 'notices'")
            return Blocker("notices", name.value, int(count.value), name.line, name.column)
        return Blocker("step", name.value, line=name.line, column=name.column)


def _check(spec: Spec) -> None:
    """The tester's post-parse checks (check_testspec), with positions."""
    f = spec.filename
    seen_sessions: dict[str, Session] = {}
    for sess in spec.sessions:
        if sess.name in seen_sessions:
            raise _error(f, sess.line, sess.column, f"duplicate session name {sess.name!r}.",
                         "give each session its own name.")
        seen_sessions[sess.name] = sess
    seen: dict[str, Step] = {}
    for st in spec.steps:
        if st.name in seen:
            first = seen[st.name]
            raise _error(f, st.line, st.column,
                         f"duplicate step name {st.name!r} (first defined at line {first.line}).",
                         "step names are global to the spec: rename one of them.")
        seen[st.name] = st
    used: set[str] = set()
    for perm in spec.permutations:
        names = set(perm.names)
        for ps in perm.steps:
            if ps.name not in seen:
                raise _error(f, ps.line, ps.column,
                             f"undefined step {ps.name!r} specified in permutation.",
                             f"use one of the defined steps: {', '.join(sorted(seen))}.")
            used.add(ps.name)
        for ps in perm.steps:
            for b in ps.blockers:
                if b.kind == "once":
                    continue
                if b.step not in names:
                    raise _error(f, b.line, b.column,
                                 f"undefined blocking step {b.step!r} referenced in permutation "
                                 f"step {ps.name!r}.",
                                 "a blocker must name a step of the same permutation line.")
                if seen[b.step].session == seen[ps.name].session:
                    raise _error(f, b.line, b.column,
                                 f"permutation step {ps.name!r} cannot block on its own session.",
                                 "name a step of another session inside the ( ).")
    if spec.permutations:
        for step_name in sorted(seen):
            if step_name not in used:
                spec.warnings.append(f"unused step name: {step_name}")


def parse(text: str, filename: str = "<spec>") -> Spec:
    """Parse spec text; raise :class:`SpecError` (with file, line and column) if malformed."""
    spec = _Parser(_tokenize(text, filename), filename).parse()
    _check(spec)
    return spec


def parse_file(path: str | os.PathLike) -> Spec:
    try:
        text = read_input(path, what="spec file", max_bytes=MAX_SPEC_BYTES,
                          fix="give the path of a .spec file (an isolation spec, as text).")
    except LabkitError as exc:
        raise SpecError(exc.what, exc.fix) from None
    return parse(text, str(path))


# ======================================================================================
# Output formatting (libpq's PQprint with header, align and fieldSep "|")
# ======================================================================================

def _blen(s: str) -> int:
    # PQprint measures and pads in bytes (printf's %-*s), not characters.
    return len(s.encode("utf-8"))


def _not_numeric(value: str) -> bool:
    """fe-print.c's test, applied to one non-empty value of a column."""
    last = "0"
    for ch in value:
        last = ch
        if not (("0" <= ch <= "9") or ch in ".Ee -"):
            return True
    return value[0] in "Ee" or not ("0" <= last <= "9")


def format_result(columns: list[str], rows: list[tuple]) -> str:
    """A result set as ``PQprint`` prints it for the isolation tester.

    A column is right-aligned unless one of its non-empty values looks non-numeric
    (PQprint decides from the text, not the type); NULLs print as empty cells.
    """
    if not columns:
        return ""           # PQprint prints nothing for a result without fields
    width = [_blen(c) for c in columns]
    notnum = [False] * len(columns)
    for row in rows:
        for j, v in enumerate(row):
            if not v:
                continue
            if not notnum[j] and _not_numeric(v):
                notnum[j] = True
            width[j] = max(width[j], _blen(v))

    def cell(j: int, v: str | None) -> str:
        v = v or ""
        pad = " " * max(0, width[j] - _blen(v))
        return v + pad if notnum[j] else pad + v

    lines = ["|".join(cell(j, c) for j, c in enumerate(columns)),
             "+".join("-" * w for w in width)]
    lines += ["|".join(cell(j, v) for j, v in enumerate(row)) for row in rows]
    n = len(rows)
    return "\n".join(lines) + f"\n({n} row{'' if n == 1 else 's'})\n\n"


def _pgresult_text(res) -> str:
    nf, nt = res.nfields, res.ntuples
    cols = [(res.fname(j) or b"").decode() for j in range(nf)]
    rows = [tuple(None if res.get_value(i, j) is None else res.get_value(i, j).decode()
                  for j in range(nf)) for i in range(nt)]
    return format_result(cols, rows)


def _notice_text(diag) -> str:
    # libpq's default verbosity for a notice: severity and message, then DETAIL and HINT.
    sev = diag.severity or "NOTICE"
    text = f"{sev}:  {diag.message_primary or ''}\n"
    if diag.message_detail:
        text += f"DETAIL:  {diag.message_detail}\n"
    if diag.message_hint:
        text += f"HINT:  {diag.message_hint}\n"
    return text


def _severity(err) -> str:
    # The engine's StepError keeps the SQLSTATE and the message but not the severity;
    # errors that end the backend are FATAL, every other failed step is an ERROR.
    return "FATAL" if err.sqlstate in ("57P01", "57P02", "57P03") else "ERROR"


# ======================================================================================
# Running
# ======================================================================================

NONBLOCK = 1     # return as soon as the step waits for a lock
RETRY = 2        # a later look at a step already reported as waiting


@dataclass
class _Active:
    """A permutation step that has been sent (the engine's Step is ``step``)."""

    ps: PermutationStep
    session: str
    sql: str
    step: EngineStep
    targets: dict[int, int] = field(default_factory=dict)   # blocker index -> notices needed


class _Runner:
    """Plays a spec on PostgreSQL.  ``box`` is the sandbox: every connection comes from
    ``box.lab``, so all of the spec's SQL runs as its role.  :class:`_MyRunner` plays it on
    MySQL and MariaDB: it changes the engine, how a block of SQL runs and how a step prints."""

    def __init__(self, spec: Spec, lab, timeout: float, out: list[str], err: TextIO, *,
                 box: _Box | None = None) -> None:
        self.spec = spec
        self.box = box
        self.lab = lab
        self.timeout = timeout
        self.out = out
        self.err = err
        self.session_of = {st.name: st.session for st in spec.steps}
        self.sql_of = {st.name: st.sql for st in spec.steps}
        self.notices: list[tuple[str, str]] = []        # (session, text) not printed yet

    @property
    def pg_engine(self) -> Sessions:
        """The engine, where PostgreSQL's sessions are read (their libpq connections)."""
        if not isinstance(self.engine, Sessions):
            raise LabkitError("The spec runner read PostgreSQL's sessions on another engine.",
                              "report this: the MySQL runner replaces every step that reads them.")
        return self.engine

    # -- output -----------------------------------------------------------------------
    def emit(self, text: str) -> None:
        self.out.append(text)

    def warn(self, text: str) -> None:
        print(text, file=self.err)

    def flush_notices(self, session: str | None = None) -> None:
        keep = []
        for name, text in self.notices:
            if session is None or name == session:
                self.emit(f"{name}: {text}")
            else:
                keep.append((name, text))
        self.notices = keep

    # -- whole spec -------------------------------------------------------------------------
    def run(self) -> None:
        spec = self.spec
        if spec.conninfo or any(s.conninfo for s in spec.sessions):
            raise SpecError(f"{spec.filename}: 'conninfo' is not supported by labkit's runner.",
                            "remove the conninfo lines: every session runs on the lab's server.")
        self.emit(f"Parsed test spec with {len(spec.sessions)} sessions\n")
        self.control = self.lab.connect(role="spec-control")   # notices here are dropped
        try:
            for perm in spec.permutations_to_run():
                self.run_permutation(perm)
        finally:
            self.control.close()

    def _exec(self, pgconn, sql: str, what: str):
        """Run a setup or teardown block, cancelled if it outlives the step timeout twice
        over (its SQL may have turned statement_timeout off)."""
        if self.box is None:
            raise LabkitError("The spec runner has no sandbox to bound a setup block's run time with.",
                              "pass it box= (a Sandbox, or _OwnRole for a trusted run).")
        with self.box.deadline(2 * self.timeout) as clock:
            res = pgconn.exec_(sql.encode())
        if clock.fired:
            raise SpecError(f"{self.spec.filename}: {what} did not finish within "
                            f"{2 * self.timeout:g} s and was cancelled.",
                            "make the block quick (it runs before or after every permutation), "
                            "or raise --timeout.")
        return res

    def exec_control(self, sql: str, what: str) -> None:
        res = self._exec(self.control.pgconn, sql, what)
        if res.status == pq.ExecStatus.TUPLES_OK:
            self.emit(_pgresult_text(res))
        elif res.status != pq.ExecStatus.COMMAND_OK and res.status != pq.ExecStatus.EMPTY_QUERY:
            msg = (res.error_message or b"").decode(errors="replace").strip()
            if what == "teardown":
                self.warn(f"teardown failed: {msg}")     # the tester carries on
                return
            raise SpecError(f"{self.spec.filename}: {what} failed: {msg}",
                            "fix the SQL of the spec's setup block.")

    def exec_session(self, name: str, sql: str, what: str) -> None:
        s = self.pg_engine.sessions[name]
        res = self._exec(s.pgconn, sql, f"{what} of session {name}")
        self.flush_notices(name)
        if res.status == pq.ExecStatus.TUPLES_OK:
            self.emit(_pgresult_text(res))
        elif res.status != pq.ExecStatus.COMMAND_OK and res.status != pq.ExecStatus.EMPTY_QUERY:
            msg = (res.error_message or b"").decode(errors="replace").strip()
            if what == "teardown":
                self.warn(f"teardown of session {name} failed: {msg}")
                return
            fix = f"fix the SQL of session {name}'s setup block."
            if "permission denied to set parameter" in msg and self.box is not None \
                    and self.box.role is not None:
                fix = ("the spec's SQL runs as a throw-away role, which may set no such "
                       "parameter; run a spec you trust with --trusted.")
            raise SpecError(f"{self.spec.filename}: setup of session {name} failed: {msg}", fix)

    # -- one permutation -------------------------------------------------------------------
    def run_permutation(self, perm: Permutation) -> None:
        spec = self.spec
        self.emit("\nstarting permutation: " + " ".join(perm.names) + "\n")
        for sql in spec.setup:
            self.exec_control(sql, "setup")

        names = [s.name for s in spec.sessions]
        self.engine = self._open_engine(names)
        self.notices = []
        self.total_notices = {n: 0 for n in names}
        self.new_notice = False
        self.active: dict[str, _Active | None] = {n: None for n in names}
        self.pid_names = {s.pid: n for n, s in self.engine.sessions.items()}
        try:
            self._listen()
            for sess in spec.sessions:
                if sess.setup:
                    self.exec_session(sess.name, sess.setup, "setup")
            self.run_steps(perm)
            self.flush_notices()
            for sess in spec.sessions:
                if sess.teardown:
                    self.exec_session(sess.name, sess.teardown, "teardown")
            self.flush_notices()
        finally:
            self.engine.close()
        if spec.teardown:
            self.exec_control(spec.teardown, "teardown")

    def _open_engine(self, names: list[str]) -> Sessions | MySessions:
        # The tester sets no timeouts: lock_timeout 0 is the server's default.  The
        # engine's statement_timeout guard stays, at twice the step timeout, so that
        # our own cancel (after ``timeout``, reported like the tester's) comes first.
        return Sessions(self.lab, *names, lock_timeout="0",
                        statement_timeout=f"{int(self.timeout * 2000)}ms", track_locks=False)

    def _listen(self) -> None:
        """Collect each session's notices, as the tester prints them."""
        for name, s in self.pg_engine.sessions.items():
            s.conn.add_notice_handler(self._notice_handler(name))

    def _notice_handler(self, name: str) -> Callable[[psycopg.errors.Diagnostic], None]:
        def handler(diag: psycopg.errors.Diagnostic) -> None:
            self.notices.append((name, _notice_text(diag)))
            self.total_notices[name] += 1
            self.new_notice = True
        return handler

    def run_steps(self, perm: Permutation) -> None:
        waiting: list[_Active] = []
        for ps in perm.steps:
            name = self.session_of[ps.name]
            if self.active[name] is not None:
                # The session is still busy with an earlier step: wait for it to finish.
                start = time.monotonic()
                while (old := self.active[name]) is not None:
                    if not self.try_complete(old, RETRY):
                        waiting.remove(old)
                    waiting = self.try_complete_steps(waiting, NONBLOCK | RETRY)
                    if self.active[name] is not None:
                        if time.monotonic() - start > 2 * self.timeout:
                            raise LabkitError(
                                f"{self.spec.filename}: step {old.ps.name} did not complete "
                                f"within {2 * self.timeout:.0f} s (active steps: "
                                f"{' '.join(a.ps.name for a in self.active.values() if a)}).",
                                "check the permutation's blocker annotations.")
                        time.sleep(0.005)
            sql = self.sql_of[ps.name]
            # Sent, not waited for: try_complete below looks at it the tester's way.
            step = self.engine.send(name, sql, label=ps.name)
            act = _Active(ps, name, sql, step)
            self.active[name] = act
            for k, b in enumerate(ps.blockers):
                if b.kind == "notices":
                    act.targets[k] = b.needed + self.total_notices[self.session_of[b.other]]
            mustwait = self.try_complete(act, NONBLOCK)
            waiting = self.try_complete_steps(waiting, NONBLOCK | RETRY)
            if mustwait:
                waiting.append(act)
        waiting = self.try_complete_steps(waiting, RETRY)
        if waiting:
            raise LabkitError(
                f"{self.spec.filename}: failed to complete permutation due to mutually-blocking "
                f"steps ({' '.join(a.ps.name for a in waiting)}).",
                "check the permutation: every waiting step needs a later step that releases it.")

    def try_complete_steps(self, waiting: list[_Active], flags: int) -> list[_Active]:
        while True:
            self.new_notice = False
            before = len(waiting)
            have_blocker = False
            still = []
            for act in waiting:
                if self.try_complete(act, flags):
                    if act.ps.blockers:
                        have_blocker = True
                    still.append(act)
            waiting = still
            # A completion or a notice may have released a blocker annotation checked
            # earlier in the list: look again until nothing moves.
            if not (have_blocker and (len(waiting) < before or self.new_notice)):
                return waiting

    def try_complete(self, act: _Active, flags: int) -> bool:
        """Report ``act`` if it is complete; True while it still counts as waiting."""
        if not flags & RETRY and any(b.kind == "once" for b in act.ps.blockers):
            self._waiting_line(act)
            return True
        if not act.step.done:
            if flags & NONBLOCK:
                if not self._settle(act):
                    if not flags & RETRY:
                        self._waiting_line(act)
                    return True
            else:
                self._await(act)
        if self._has_blocker(act):
            if not flags & RETRY:
                self._waiting_line(act)
            return True
        self._completed(act, retry=bool(flags & RETRY))
        self.active[act.session] = None
        return False

    def _waiting_line(self, act: _Active) -> None:
        self.flush_notices(act.session)
        self.emit(f"step {act.ps.name}: {act.sql} <waiting ...>\n")

    def _completed(self, act: _Active, retry: bool) -> None:
        self.flush_notices(act.session)
        if retry:
            self.emit(f"step {act.ps.name}: <... completed>\n")
        else:
            self.emit(f"step {act.ps.name}: {act.sql}\n")
        step = act.step
        for r in step.results:
            if r.columns:
                self.emit(format_result(r.columns, r.text_rows))
        if step.error is not None:
            self.emit(f"{_severity(step.error)}:  {step.error.message}\n")
        # NOTIFY messages that reached this session
        pgconn = self.pg_engine.sessions[act.session].pgconn
        pgconn.consume_input()
        while (n := pgconn.notifies()) is not None:
            sender = self.pid_names.get(n.be_pid, f"PID {n.be_pid}")
            self.emit(f'{act.session}: NOTIFY "{n.relname.decode()}" with payload '
                      f'"{n.extra.decode()}" from {sender}\n')
            pgconn.consume_input()

    def _has_blocker(self, act: _Active) -> bool:
        for k, b in enumerate(act.ps.blockers):
            if b.kind == "step":
                other = self.active[self.session_of[b.other]]
                if other is not None and other.ps.name == b.step:
                    return True
            elif b.kind == "notices":
                if self.total_notices[self.session_of[b.other]] < act.targets[k]:
                    return True
        return False

    # -- waiting on the engine's sessions -------------------------------------------------
    # The tester's two looks at a running step, "finished, or blocked?" and "wait until
    # finished", are the engine's settle(): one test of "blocked" for labkit.
    def _settle(self, act: _Active) -> bool:
        """Wait until the step finishes (True) or waits for another session (False)."""
        return self.engine.settle(act.session, watchdog=self._watchdog(act)) is None

    def _await(self, act: _Active) -> None:
        self.engine.settle(act.session, until_done=True, watchdog=self._watchdog(act))

    def _watchdog(self, act: _Active) -> Callable[[float], None]:
        """The tester's limits on one look at a step: after the step timeout, cancel it and
        say so; after twice that, give up."""
        canceled = False

        def check(elapsed: float) -> None:
            nonlocal canceled
            if elapsed > self.timeout and not canceled:
                self.engine.cancel(act.session)
                self.emit(f"isolationtester: canceling step {act.ps.name} after "
                          f"{int(elapsed)} seconds\n")
                canceled = True
            elif elapsed > 2 * self.timeout:
                raise LabkitError(f"{self.spec.filename}: step {act.ps.name} timed out after "
                                  f"{int(elapsed)} seconds.",
                                  "check the permutation: the step waits for something that "
                                  "never happens.")
        return check


def run(spec_or_path: Spec | str | os.PathLike, lab: Lab | None = None, *,
        timeout: float = 60.0, reset: bool = True, stderr: TextIO | None = None,
        trusted: bool = False) -> str:
    """Run every permutation of a spec; return what isolationtester would print.

    ``spec_or_path`` is a :class:`Spec` or the path of a ``.spec`` file.  The spec runs
    where PostgreSQL's tester runs one: in the ``public`` schema of a database made for
    this run (on ``lab``'s server, or the one :func:`labkit.connect` finds), dropped at
    the end whatever happens.  Where this user may not create databases, it runs in
    ``lab``'s schema instead (reset first unless ``reset=False``), or without a ``lab`` in
    a throw-away lab ``spec_<pid>``, and a note on ``stderr`` says why.  ``timeout``
    (seconds) bounds one step: after it the step is cancelled, as the tester does after
    PGISOLATIONTIMEOUT.  Messages the tester writes to stderr (unused steps, failed
    teardown) go to ``stderr`` (default ``sys.stderr``).

    The spec's SQL runs as a throw-away role (:class:`labkit.core.sandbox.Sandbox`), which
    may also set ``deadlock_timeout`` where the server lets labkit grant that (see
    :func:`grant_parameters`).  With ``trusted=True`` it runs as labkit's own role instead,
    with all of that role's rights (refused on a classroom server:
    :func:`refuse_trusted_on_a_classroom`).
    """
    spec = spec_or_path if isinstance(spec_or_path, Spec) else parse_file(spec_or_path)
    check_number("timeout", timeout, low=0.1, high=MAX_TIMEOUT_S,
                 fix="give the step timeout in seconds, such as 60 (the default).")
    spec.check_size()
    if len(spec.sessions) > MAX_SESSIONS:
        raise SpecError(f"{spec.filename}: the spec has {len(spec.sessions)} sessions; labkit runs "
                        f"at most {MAX_SESSIONS} (each one is a connection of its own).",
                        "split it into specs with fewer sessions.")
    stderr = sys.stderr if stderr is None else stderr
    for w in spec.warnings:
        print(w, file=stderr)
    if lab is None:

        server = connect(quiet=True)
    else:
        server = lab.db
    out: list[str] = []
    if trusted:
        with server.connect(role="spec") as conn:
            refuse_trusted_on_a_classroom(conn)
    with _spec_place(server, lab, reset=reset, stderr=stderr) as place:
        if trusted:
            print(f"labkit spec: {TRUSTED_NOTE} ({place.admin.info.user}).", file=stderr)
            with _OwnRole(place) as own:
                _Runner(spec, place, timeout, out, stderr, box=own).run()
            return "".join(out)
        with Sandbox(place, connections=len(spec.sessions) + 4, statement_timeout_s=2 * timeout,
                     own_database=isinstance(place, _OwnDatabase)) as box:
            if box.role is None:
                print(f"labkit spec: the spec's SQL {box.note}.", file=stderr)
            else:
                grant_parameters(place.admin, box.role)
            _Runner(spec, box.lab, timeout, out, stderr, box=box).run()
    return "".join(out)


# ======================================================================================
# What the throw-away role may set, and the trusted mode
# ======================================================================================

# Settings a spec's session may need that PostgreSQL lets only a superuser set (or a role
# granted SET on them): the deadlock detector's wait, which PostgreSQL's own deadlock specs
# set per session.  (lock_timeout and statement_timeout any role may set.)
SANDBOX_PARAMETERS = ("deadlock_timeout",)

CLASSROOM_ENV = "LABKIT_CLASSROOM"
TRUSTED_NOTE = ("--trusted: ran the spec's SQL with your own role's rights, not as a "
                "throw-away role")


class TrustRefused(LabkitError):
    """``--trusted`` asked for where it is not allowed (a classroom server)."""


def grant_parameters(admin: psycopg.Connection, role: str) -> list[str]:
    """``GRANT SET ON PARAMETER`` each of :data:`SANDBOX_PARAMETERS` to the throw-away
    ``role``, where the server has parameter privileges (PostgreSQL 15 and later) and
    labkit's user may grant them (a superuser may); returns the names granted.  Dropping the
    role (``DROP OWNED BY`` first) revokes them."""
    if admin.info.server_version < 150000:
        return []
    granted = []
    for name in SANDBOX_PARAMETERS:
        try:
            with admin.transaction():
                admin.execute(psql.SQL("GRANT SET ON PARAMETER {} TO {}").format(
                    psql.Identifier(name), psql.Identifier(role)))
        except (psycopg.errors.InsufficientPrivilege, psycopg.errors.UndefinedObject):
            continue
        granted.append(name)
    return granted


def refuse_trusted_on_a_classroom(conn: psycopg.Connection | None = None) -> None:
    """Raise :class:`TrustRefused` on a classroom server: where ``LABKIT_CLASSROOM`` is set
    (to anything but empty; the classroom's hub sets ``LABKIT_CLASSROOM=1``), or where
    ``conn`` logged in as a classroom trainee role (``claimlab_*``, marked
    ``labkit classroom``).  There a spec is somebody else's homework on a shared server, and
    it runs as a throw-away role only."""
    from .classroom import MARK, PREFIX

    why = None
    if os.environ.get(CLASSROOM_ENV, "").strip():
        why = f"{CLASSROOM_ENV} is set: this is a classroom's machine"
    elif conn is not None:
        row = conn.execute(query("spec.sql", "classroom_login").sql,
                           {"like": PREFIX.replace("_", r"\_") + "%", "mark": MARK}).fetchone()
        if row is not None:
            why = f"the role {row[0]} is a classroom trainee's"
    if why is not None:
        raise TrustRefused(f"--trusted is refused here: {why}, and --trusted would run the "
                           "spec's SQL with your own role's rights.",
                           "run the spec without --trusted: it then runs as a throw-away role "
                           "that may use its own database and nothing else.")


class _Box(Protocol):
    """What :class:`_Runner` needs of a sandbox: the role the spec's SQL runs as (None: the
    lab's own) and a deadline for a block of SQL."""

    @property
    def role(self) -> str | None: ...

    def deadline(self, seconds: float) -> Deadline: ...


class _OwnRole:
    """What :class:`_Runner` needs of a sandbox, for a trusted run: the run's deadline
    cancels what the place's own connections run."""

    role = None

    def __init__(self, place: Lab) -> None:
        self.place = place

    def __enter__(self) -> _OwnRole:
        return self

    def __exit__(self, *exc) -> None:
        self.place.close()

    def cancel_all(self) -> None:
        cancel_every(self.place._conns)

    def deadline(self, seconds: float) -> Deadline:
        return Deadline(self, seconds)


def run_file(path: str | os.PathLike, lab: Lab | None = None, **kw) -> str:
    """:func:`run` on the spec file ``path``."""
    return run(parse_file(path), lab, **kw)


# ======================================================================================
# The same runner on MySQL and MariaDB (the cross-engine appendix)
# ======================================================================================

class _MyRunner(_Runner):
    """Plays a spec on a MySQL-compatible lab through :class:`MySessions`: the tester's
    order, its ``<waiting ...>`` (the server's lock-wait tables say a step waits) and its
    output.  An error prints as ``ERROR:  (1205) message``: MySQL's number, then its words.
    MySQL has no notices and no NOTIFY.  The spec's SQL runs in a database made for the run
    and dropped at the end, as a throw-away user that may use that database alone."""

    def _run_block(self, conn, text: str, what: str, fatal: str | None) -> None:
        import pymysql

        for stmt in statements(text):
            try:
                cur = conn.execute(stmt)
            except pymysql.err.MySQLError as exc:
                msg = f"({exc.args[0]}) {exc.args[1]}" if len(exc.args) > 1 else str(exc)
                if fatal is None:
                    self.warn(f"{what} failed: {msg}")
                    return
                raise SpecError(f"{self.spec.filename}: {what} failed: {msg}", fatal) from None
            if cur.description:
                self.emit(format_result([d[0] for d in cur.description],
                                        [tuple(None if v is None else str(v) for v in r)
                                         for r in cur.fetchall()]))

    def exec_control(self, sql: str, what: str) -> None:
        self._run_block(self.control, sql, what,
                        None if what == "teardown" else "fix the SQL of the spec's setup block.")

    def exec_session(self, name: str, sql: str, what: str) -> None:
        self._run_block(self.engine.sessions[name].conn, sql, f"{what} of session {name}",
                        None if what == "teardown" else f"fix the SQL of session {name}'s setup block.")

    def _open_engine(self, names: list[str]) -> MySessions:
        # InnoDB's lock-wait guard and the statement guard at twice the step timeout, so
        # that our own cancel (after ``timeout``, reported like the tester's) comes first.
        return MySessions(self.lab, *names, lock_wait_timeout_s=int(max(1, self.timeout * 2)),
                          statement_timeout_s=self.timeout * 2)

    def _listen(self) -> None:
        """MySQL sends no notices."""

    def _completed(self, act: _Active, retry: bool) -> None:
        self.emit(f"step {act.ps.name}: <... completed>\n" if retry else f"step {act.ps.name}: {act.sql}\n")
        step = act.step
        for r in step.results:
            if r.columns:
                self.emit(format_result(r.columns, r.text_rows))
        if step.error is not None:
            self.emit(f"ERROR:  ({step.error.sqlstate}) {step.error.message}\n")




def own_specs(engine: str = "postgresql") -> list[Path]:
    """The workbook's own specs for ``engine``, with their expected outputs beside them:
    data/specs for PostgreSQL, data/specs/mariadb for MariaDB and MySQL alike (their SQL runs
    on both; the outputs beside them were recorded on MariaDB, whose NOWAIT error MySQL
    numbers differently)."""
    folder = data_file("specs") if engine == "postgresql" else data_file("specs", "mariadb")
    return sorted(p for p in folder.iterdir() if p.suffix == ".spec")


def run_mysql(spec_or_path: Spec | str | os.PathLike, *, engine: str = "mariadb",
              timeout: float = 60.0, stderr: TextIO | None = None, trusted: bool = False) -> str:
    """:func:`run`, on the MySQL-compatible server :func:`labkit.core.mysql.find` finds (it
    must be ``engine``): in a database made for the run, dropped at the end, and as a
    throw-away user with rights on that database only (:class:`labkit.core.mysql.SandboxUser`),
    or with ``trusted=True`` as the configured user itself."""
    from ..core import mysql

    spec = spec_or_path if isinstance(spec_or_path, Spec) else parse_file(spec_or_path)
    check_number("timeout", timeout, low=0.1, high=MAX_TIMEOUT_S,
                 fix="give the step timeout in seconds, such as 60 (the default).")
    spec.check_size()
    stderr = sys.stderr if stderr is None else stderr
    for w in spec.warnings:
        print(w, file=stderr)
    server = mysql.find_engine(engine)
    if trusted:
        refuse_trusted_on_a_classroom()
    out: list[str] = []
    with mysql.MyLab.open(server, f"spec_{os.getpid()}") as lab:
        if trusted:
            print(f"labkit spec: {TRUSTED_NOTE} ({server.params['user']}).", file=stderr)
            _MyRunner(spec, lab, timeout, out, stderr).run()
        else:
            with mysql.SandboxUser(lab, connections=len(spec.sessions) + 4) as box:
                if box.user is None:
                    print(f"labkit spec: the spec's SQL {box.note}.", file=stderr)
                _MyRunner(spec, box.lab, timeout, out, stderr).run()
    return "".join(out)


# ======================================================================================
# Where a run's objects go: a database of its own, as in PostgreSQL's tester
# ======================================================================================

SPEC_DATABASE_PREFIX = "labkit_spec_"
_MAX_NAME = 63          # PostgreSQL keeps 63 bytes of a name

def spec_database_name(tag: str | None = None, pid: int | None = None) -> str:
    """``labkit_spec_<user tag>_<pid>``: the database a spec run of this process makes.  A
    name over 63 characters keeps the tag's start and a short hash of the whole tag."""
    tag = tag or current_user_tag()
    pid = os.getpid() if pid is None else pid
    name = f"{SPEC_DATABASE_PREFIX}{tag}_{pid}"
    if len(name) <= _MAX_NAME:
        return name
    tail = f"_{hashlib.sha1(tag.encode()).hexdigest()[:8]}_{pid}"
    room = _MAX_NAME - len(SPEC_DATABASE_PREFIX) - len(tail)
    return SPEC_DATABASE_PREFIX + tag[:room].rstrip("_") + tail


def spec_databases(conn: psycopg.Connection, *, tag: str | None = None) -> list[str]:
    """The databases that interrupted spec runs of user ``tag`` (of any user, with None)
    left behind and that this role may drop: named ``labkit_spec_*``, marked by labkit (the
    comment ``labkit:<user tag>``), owned by this role, with no session connected (a run
    holds sessions in its database from its start to its end)."""
    return [r[0] for r in conn.execute(query("doctor.sql", "spec_databases").sql, {"tag": tag}).fetchall()]


def drop_spec_databases(conn: psycopg.Connection, *, tag: str | None = None) -> list[str]:
    """Drop the databases :func:`spec_databases` names (``conn`` in autocommit, on any
    database of the server); returns the names dropped.  One that a session entered
    meanwhile is left as it is."""
    dropped = []
    for name in spec_databases(conn, tag=tag):
        try:
            conn.execute(psql.SQL("DROP DATABASE IF EXISTS {}").format(psql.Identifier(name)))
        except psycopg.errors.ObjectInUse:
            continue
        dropped.append(name)
    return dropped


class _OwnDatabase(Lab):
    """The ``public`` schema of a database made for one run, seen as a lab.  Its
    connections keep the server's default ``search_path`` (as the tester's do) and are
    named ``labkit:<database>:<role>``; dropping it drops the database."""

    def __init__(self, server: Database, dbname: str) -> None:
        inside = dataclasses.replace(server, dsn=make_conninfo(server.dsn, dbname=dbname),
                                     where=f"{server.where} (database {dbname})")
        super().__init__(inside, "spec")
        self.server = server
        self.dbname = dbname
        self.schema = "public"
        self.app_name = session_name(dbname)

    def __repr__(self) -> str:
        return f"Lab(public of database {self.dbname!r} on {self.db.backend})"

    def connect(self, *, autocommit: bool = True, role: str = "",
                guards: Guards | None = None) -> psycopg.Connection:
        conn = self.db.connect(autocommit=autocommit, role=role, guards=guards,
                               application_name=session_name(self.dbname, role))
        self._conns.add(conn)
        return conn

    @classmethod
    def make(cls, server: Database) -> _OwnDatabase | str:
        """A database of the run's own, reachable; or why there is none (this user may not
        create databases, or cannot connect to the one it made)."""
        name = spec_database_name()
        place = cls(server, name)
        ident = psql.Identifier(name)
        made = False            # (once True, whatever goes wrong drops the database again)
        try:
            with server.connect(role="spec") as conn:
                user, may = one_row(conn.execute(
                    "SELECT rolname, rolsuper OR rolcreatedb FROM pg_catalog.pg_roles "
                    "WHERE rolname = current_user"), "the current role's row of pg_roles")
                if not may:
                    return f"the database user {user} may not create databases (it has no CREATEDB)"
                if conn.execute("SELECT 1 FROM pg_catalog.pg_database WHERE datname = %s",
                                (name,)).fetchone():
                    # Left by a killed run of an earlier process that had this pid.
                    if conn.execute("SELECT 1 FROM pg_catalog.pg_stat_activity WHERE datname = %s",
                                    (name,)).fetchone():
                        raise LabkitError(f"The database {name} is in use by another spec run.",
                                          "wait until that run is over, then run this one again.")
                    conn.execute(psql.SQL("DROP DATABASE {}").format(ident))
                made = True
                try:
                    # From template0, as pg_regress makes the tester's: nothing that was
                    # added to template1 shows up in a spec's output.
                    conn.execute(psql.SQL("CREATE DATABASE {} TEMPLATE template0").format(ident))
                except psycopg.errors.InsufficientPrivilege as exc:
                    return f"creating a database failed: {_first_line(exc)}"
                conn.execute(psql.SQL("COMMENT ON DATABASE {} IS {}").format(
                    ident, psql.Literal(f"labkit:{place.user_tag}")))
            try:
                _ = place.admin                  # connect now: reach it before anything runs there
            except LabkitError as exc:
                place.discard()
                return f"the database {name} it made could not be reached ({exc.what})"
        except psycopg.Error as exc:
            if made:
                place.discard()
            raise LabkitError(f"Could not make the database {name} that the spec runs in: "
                              f"{_first_line(exc)}.",
                              "check the server with `labkit doctor`, then run the spec again.") from None
        except BaseException:
            if made:
                place.discard()
            raise
        return place

    def drop(self) -> None:
        """End the database's sessions and drop it."""
        self.close()
        ident = psql.Identifier(self.dbname)
        with self.server.connect(role="spec") as conn:
            deadline = time.monotonic() + 30
            while True:
                # The sessions of roles this one may end (DROP DATABASE itself waits 5 s
                # for any other to go).
                conn.execute("SELECT pg_catalog.pg_terminate_backend(pid) "
                             "FROM pg_catalog.pg_stat_activity WHERE datname = %s "
                             "AND pid <> pg_backend_pid() "
                             "AND pg_catalog.pg_has_role(usesysid, 'MEMBER')", (self.dbname,))
                try:
                    conn.execute(psql.SQL("DROP DATABASE IF EXISTS {}").format(ident))
                    return
                except psycopg.errors.ObjectInUse:
                    if time.monotonic() > deadline:
                        raise LabkitError(
                            f"The database {self.dbname} that the spec ran in could not be "
                            "dropped: sessions are still connected to it.",
                            "run `labkit clean` once they are gone: it drops the databases "
                            "that spec runs left behind.") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0].rstrip(".") if text else type(exc).__name__


@contextmanager
def _spec_place(server: Database, lab: Lab | None, *, reset: bool,
                stderr: TextIO) -> Iterator[Lab]:
    """Where one run's objects go: the public schema of a database of its own, dropped at
    the end (on an error or an interrupt too); else a lab schema, with a note saying why."""
    own = _OwnDatabase.make(server)
    if isinstance(own, _OwnDatabase):
        try:
            yield own
        except BaseException:
            own.discard()          # the error that ended the run is the one to report
            raise
        own.drop()
        return
    fallback = lab is None
    if lab is None:
        # One lab per process, so that runs in parallel never reset each other's schema.
        lab = Lab.open(server, f"spec_{os.getpid()}")
    elif reset:
        lab.reset()
    print(f"labkit spec: ran in schema {lab.schema}, not in a database of its own as "
          f"PostgreSQL's tester does, because {own}; names that PostgreSQL prints as "
          f"public.t read {lab.schema}.t here.", file=stderr)
    try:
        yield lab
    finally:
        if fallback:
            lab.discard()


# ======================================================================================
# Command line
# ======================================================================================

def spec_command(*, what: str, specs: list[str], diff: list[str] | None = None,
                 timeout: float = 60.0, engine: str = "postgresql", check: bool = False,
                 trusted: bool = False) -> int:
    """``labkit spec run FILE.spec ... [--diff EXPECTED.out ...] [--timeout S] [--trusted]``
    (exit 1 on a mismatch, 3 when a step had to be cancelled, 2 when ``--trusted`` is
    refused) · ``labkit spec permutations FILE.spec ...``

    ``--engine mariadb`` (or ``mysql``) plays the specs on the MySQL-compatible server of
    the cross-engine appendix.  Without FILE.spec, ``run`` plays the workbook's own specs for
    the engine; with ``--check``, each compared with the output shipped beside it.
    ``--trusted`` runs the spec's SQL with labkit's own role (or user) instead of a
    throw-away one: only for specs you trust, and never on a classroom server."""
    if engine not in ENGINES:
        print(f"labkit spec: --engine {engine!r} is not one of {', '.join(ENGINES)}.", file=sys.stderr)
        return 2
    if what == "run" and not specs:
        own = own_specs(engine)
        specs = [str(p) for p in own]
        if check:
            diff = [str(p.with_suffix(".out")) for p in own]
    elif check:
        print("labkit spec: --check compares the workbook's own specs with their outputs; give no "
              "FILE.spec with it (or use --diff EXPECTED.out).", file=sys.stderr)
        return 2
    try:
        if what == "permutations":
            _print_permutations(specs)
            return 0
        if diff and len(diff) != len(specs):
            print(f"labkit spec: give one --diff per spec ({len(specs)} specs, "
                  f"{len(diff)} --diff).", file=sys.stderr)
            return 2
        return _play_specs(specs, diff, _player(engine, timeout, trusted))
    except TrustRefused as exc:
        print(f"labkit spec: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"labkit spec: {exc}", file=sys.stderr)
        return 2


def _player(engine: str, timeout: float, trusted: bool) -> Callable[[str], str]:
    """What plays one spec file on the engine and returns the tester's output."""
    if engine == "postgresql":
        return lambda path: run_file(path, timeout=timeout, trusted=trusted)
    return lambda path: run_mysql(path, engine=engine, timeout=timeout, trusted=trusted)


def _print_permutations(specs: list[str]) -> None:
    """Each spec's permutations, one ``permutation`` line each (its warnings on stderr)."""
    for path in specs:
        spec = parse_file(path)
        spec.check_size()
        for w in spec.warnings:
            print(w, file=sys.stderr)
        for perm in spec.permutations_to_run():
            print("permutation " + " ".join(str(ps) for ps in perm.steps))


def _play_specs(specs: list[str], diff: list[str] | None, play: Callable[[str], str]) -> int:
    """Play each spec and print its output, or (``diff``: an expected output per spec) say
    whether it matches and print a unified diff where not.  The exit status: 0, 1 on a
    mismatch, 3 when a step had to be cancelled."""
    status = 0
    for k, path in enumerate(specs):
        output = play(path)
        if "isolationtester: canceling step" in output:
            # a step never finished and had to be cancelled: say so in the exit code
            status = max(status, 3)
        if not diff:
            if len(specs) > 1:
                print(f"{'' if k == 0 else chr(10)}==> {path} <==")
            sys.stdout.write(output)
        elif not _matches_expected(path, output, diff[k]):
            status = 1
    return status


def _matches_expected(path: str, output: str, expected_path: str) -> bool:
    """Whether a spec's output is the expected one: says ok, or prints the unified diff."""
    expected = read_input(expected_path, what="expected output file",
                          max_bytes=10 * MAX_SPEC_BYTES,
                          fix="give the .out file that goes with the spec.")
    if output == expected:
        print(f"ok: {path} matches {expected_path}")
        return True
    sys.stdout.writelines(difflib.unified_diff(
        expected.splitlines(keepends=True), output.splitlines(keepends=True),
        fromfile=str(expected_path), tofile=f"{path} (this run)"))
    return False
