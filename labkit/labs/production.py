"""The production job table that notebooks 10 and 11 share (``labkit/sql/production.sql``).

Every lab of those notebooks (horizon, retries, lifecycle, schedule, wakeup, pooler) starts
from the same table, made afresh by :func:`fresh_table`, so that a notebook can run them one
after another in one schema.
"""

from __future__ import annotations

from ..core.lab import Lab
from ..core.queries import query


def fresh_table(lab: Lab) -> None:
    """Drop the lab's job table (and whatever depends on it) and make it again, empty, with
    its two partial indexes."""
    lab.execute(query("production.sql", "drop").sql)
    for statement in query("production.sql", "table").statements:
        lab.execute(statement)
