"""Notebook 19, the cross-engine appendix: the workbook's claim on MySQL and MariaDB.

The scenes script :class:`~labkit.core.mysessions.MySessions` on a lab database
(:class:`~labkit.core.mysql.MyLab`); what InnoDB does differently shows in their steps:

* :func:`gap_scene` -- two SKIP LOCKED claims and a producer adding a job, with or without
  the claim's index, under REPEATABLE READ or READ COMMITTED;
* :func:`finish_scene` -- two workers holding different jobs, one finishing first;
* :func:`convoy_side_by_side` -- the convoy sweep on PostgreSQL and on the MySQL-compatible
  server under both isolation levels, in one run, as one table; :func:`convoy_point` -- one
  of its points measured again (a timed shape's second look).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..core.errors import LabkitError
from ..core.mysessions import MySessions
from ..core.mysql import MyLab
from ..core.queries import queries
from . import convoy

if TYPE_CHECKING:
    import pandas as pd

    from ..core.lab import Lab

SQL = "mysql_jobs.sql"
# Jobs 1, 2, 5 and 9, one a second apart in id: the gaps between them are where InnoDB's
# gap locks live.
JOBS = ("INSERT INTO job (id, created_at) VALUES (1, '2026-01-01 09:00:01'), "
        "(2, '2026-01-01 09:00:02'), (5, '2026-01-01 09:00:05'), (9, '2026-01-01 09:00:09')")
CLAIM = ("SELECT id FROM job WHERE status = 'PENDING' ORDER BY created_at LIMIT 1 "
         "FOR UPDATE SKIP LOCKED")
# A new job whose created_at sorts between jobs 1 and 2.
PRODUCE = "INSERT INTO job (id, created_at) VALUES (3, '2026-01-01 09:00:01.5')"
LEVELS = ("REPEATABLE READ", "READ COMMITTED")


def make_jobs(lab: MyLab, *, indexed: bool = True) -> None:
    """A fresh job table (with the claim's index, or without it) holding jobs 1, 2, 5, 9."""
    lab.execute("DROP TABLE IF EXISTS job")
    lab.execute(queries(SQL)["job_table" if indexed else "job_table_unindexed"].sql)
    lab.execute(JOBS)


def gap_scene(lab: MyLab, isolation: str, *, indexed: bool) -> dict[str, Any]:
    """A and B claim with SKIP LOCKED; then producer P adds a job that sorts between jobs 1
    and 2; A and B commit.  Returns the steps (``a``, ``b``, ``insert``) and the transcript."""
    make_jobs(lab, indexed=indexed)
    with MySessions(lab, "A", "B", "P", isolation=isolation) as run:
        run.A("BEGIN")
        a = run.A(CLAIM, label="claim")
        run.B("BEGIN")
        b = run.B(CLAIM, label="claim")
        insert = run.P(PRODUCE, label="add job 3")
        run.A("COMMIT")
        run.B("COMMIT")
        if run.sessions["P"].pending is not None:
            run.wait("P")
        text = run.transcript().to_lines()
    return {"a": a, "b": b, "insert": insert, "transcript": text}


def finish_scene(lab: MyLab, isolation: str) -> dict[str, Any]:
    """A and B each claim a job with SKIP LOCKED; B finishes first (its UPDATE moves job 2's
    entry in the index on status), then A commits.  Returns B's finishing step and the
    transcript."""
    make_jobs(lab)
    with MySessions(lab, "A", "B", isolation=isolation) as run:
        for name in "AB":
            run.step(name, "BEGIN")
            run.step(name, CLAIM, label="claim")
        finish = run.B("UPDATE job SET status = 'DONE' WHERE id = 2", label="finish job 2")
        run.A("COMMIT")
        if run.sessions["B"].pending is not None:
            run.wait("B")
        run.B("COMMIT")
        text = run.transcript().to_lines()
    return {"finish": finish, "transcript": text}


def convoy_side_by_side(pg: Lab, my: MyLab, workers=(1, 4, 16), policies=("wait", "nowait", "skip"),
                        job_ms: float = 20, seconds: float = 1.0) -> pd.DataFrame:
    """One sweep on PostgreSQL, then the same sweep on the MySQL-compatible server under
    REPEATABLE READ and under READ COMMITTED: one table with an ``engine`` column."""
    import pandas as pd

    parts = []
    df = convoy.sweep(pg, workers, policies, job_ms=job_ms, seconds=seconds)
    parts.append(df.assign(engine=f"PostgreSQL {pg.db.version}"))
    saved = my.isolation
    try:
        for level in LEVELS:
            my.isolation = level
            df = convoy.sweep(my, workers, policies, job_ms=job_ms, seconds=seconds)
            parts.append(df.assign(engine=f"{my.server.flavour} {my.server.version}, {level}"))
    finally:
        my.isolation = saved
    return pd.concat(parts, ignore_index=True)


def convoy_point(lab: Lab | MyLab, policy: str, workers: int, *, isolation: str | None = None,
                 job_ms: float = 20, seconds: float = 1.0) -> dict[str, Any]:
    """One point of :func:`convoy_side_by_side` run again: ``policy`` at ``workers`` on
    PostgreSQL (``lab`` a :class:`~labkit.core.lab.Lab`) or on the MySQL-compatible server
    under ``isolation`` (one of ``LEVELS``).  Returns the sweep's row as a dict (``jobs_per_s``,
    ``efficiency``, ``deadlocks``...)."""
    if not isinstance(lab, MyLab):
        return convoy.sweep(lab, (workers,), (policy,), job_ms=job_ms, seconds=seconds).iloc[0].to_dict()
    if isolation not in LEVELS:
        raise LabkitError(f"isolation={isolation!r} is not one of the levels the sweep runs.",
                          f"pass one of {', '.join(LEVELS)}.")
    saved = lab.isolation
    try:
        lab.isolation = isolation
        return convoy.sweep(lab, (workers,), (policy,), job_ms=job_ms, seconds=seconds).iloc[0].to_dict()
    finally:
        lab.isolation = saved
