"""One way to read labkit's SQL: whole files, named queries, and statements.

SQL a reader should read lives in ``labkit/sql/*.sql``.  A file holds either one piece of
SQL (``read_sql("reaper.sql")``) or several named queries, each under a header line and
its one-line description::

    -- name: claim
    -- Every worker asks for the oldest pending job.
    SELECT id FROM job WHERE status = 'PENDING' ORDER BY created_at LIMIT 1 FOR UPDATE {policy};

``query("convoy_worker.sql", "claim")`` gives that query's SQL (comments kept, as the reader
sees it), ``queries(...)`` every query of a file, and ``statements(text)`` splits SQL into
its statements the way the server would: semicolons inside quotes, comments and
dollar-quoted bodies do not end a statement.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache, cached_property

from .errors import LabkitError
from .files import read_sql

_NAME = re.compile(r"^--\s*name:\s*([\w-]+)\s*$")


@dataclass(frozen=True)
class Query:
    name: str
    description: str     # the comment lines right under the name, joined
    text: str            # the SQL as written, comments kept (what a notebook prints)

    @cached_property
    def statements(self) -> list[str]:
        """The query's statements, comments dropped, without their final semicolons (split
        once: the engine asks for some of them on every poll)."""
        return statements(self.text)

    @cached_property
    def sql(self) -> str:
        """The one statement of a single-statement query."""
        stmts = self.statements
        if len(stmts) != 1:
            raise LabkitError(f"The query {self.name!r} holds {len(stmts)} statements, not one.",
                              "Use .statements to run them one by one.")
        return stmts[0]


@cache
def queries(filename: str) -> dict[str, Query]:
    """Every named query of ``labkit/sql/<filename>``, in file order."""
    found: dict[str, Query] = {}
    name: str | None = None
    lines: list[str] = []

    def close() -> None:
        if name is None:
            return
        text = "\n".join(lines).strip("\n")
        desc = []
        for line in text.splitlines():
            if not line.startswith("--"):
                break
            desc.append(line[2:].strip())
        found[name] = Query(name, " ".join(desc), text.rstrip() + "\n")

    for line in read_sql(filename).splitlines():
        m = _NAME.match(line)
        if m:
            close()
            name, lines = m.group(1), []
            if name in found:
                raise LabkitError(f"{filename} names the query {name!r} twice.",
                                  f"rename one of the two '-- name: {name}' lines in labkit/sql/{filename}.")
        elif name is not None:
            lines.append(line)
    close()
    if not found:
        raise LabkitError(f"{filename} holds no named query (no '-- name: ...' line).",
                          f"start each query in labkit/sql/{filename} with a '-- name: <name>' line.")
    return found


def query(filename: str, name: str) -> Query:
    """The query ``name`` of ``labkit/sql/<filename>``."""
    found = queries(filename)
    if name not in found:
        raise LabkitError(f"{filename} has no query called {name!r}.",
                          f"It has: {', '.join(found)}.")
    return found[name]


def strip_comments(text: str) -> str:
    """The SQL with its ``--`` comment lines and blank lines dropped."""
    return "\n".join(line for line in text.splitlines()
                     if line.strip() and not line.strip().startswith("--")).strip()


def statements(text: str) -> list[str]:
    """Split SQL on semicolons outside quotes, comments and dollar quotes.
    Comments are dropped; empty statements too."""
    out, buf = [], []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "-" and text.startswith("--", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if c == "/" and text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
            buf.append(" ")
            continue
        if c in "'\"":
            j = i + 1
            while j < n:
                if text[j] == c:
                    if j + 1 < n and text[j + 1] == c:
                        j += 2
                        continue
                    break
                j += 1
            buf.append(text[i:j + 1])
            i = j + 1
            continue
        if c == "$":
            m = re.match(r"\$([A-Za-z_]\w*)?\$", text[i:])
            if m:
                tag = m.group(0)
                j = text.find(tag, i + len(tag))
                j = n if j < 0 else j + len(tag)
                buf.append(text[i:j])
                i = j
                continue
        if c == ";":
            stmt = "".join(buf).strip()
            if stmt:
                out.append(stmt)
            buf = []
            i += 1
            continue
        buf.append(c)
        i += 1
    stmt = "".join(buf).strip()
    if stmt:
        out.append(stmt)
    return out
