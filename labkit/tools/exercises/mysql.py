"""The cross-engine appendix's exercise the server checks: the claim-and-mark on MySQL or
MariaDB, which have no ``UPDATE ... RETURNING``.

The learner writes the statements one worker sends in one transaction (a string of
statements separated by semicolons, or a list of them), taking ``%(worker_id)s``; the last
statement that returns rows returns the claimed job's id in its first column (that is how
the worker learns which job it has).  :func:`check_claim_mark` runs them in three workers
at once on the MySQL-compatible server, in scripted sessions
(:class:`~labkit.core.mysessions.MySessions`) over a scratch database of their own, and
reads from the server what happened: whether a worker waited, which jobs the workers read
back, whether each job was still locked by its worker until that worker committed (a
NOWAIT probe from another session), and what the table holds after the commits.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from datetime import datetime, timedelta

from ...core import mysql
from ...core.errors import LabkitError
from ...core.mysessions import MySessions
from ...core.queries import queries, statements
from ...core.steps import Step
from . import Check

SQL = "mysql_jobs.sql"
LEVELS = ("READ COMMITTED", "REPEATABLE READ")
LOCK_WAIT_S = 2            # a worker that waits gives up after this long (error 1205)
MAX_STATEMENTS = 8
BASE = datetime(2026, 1, 1, 9, 0, 0)

CLAIM_MARK_HINT = (
    "MySQL and MariaDB 10.11 have no UPDATE ... RETURNING, so the claim takes two statements "
    "in one transaction: a SELECT of the oldest PENDING id with FOR UPDATE SKIP LOCKED, kept "
    "in a variable (SET @job = NULL, then SELECT id INTO @job ...), then an UPDATE of that one "
    "row (status, worker_id = %(worker_id)s, claimed_at) WHERE id = @job, and last SELECT @job, "
    "so the worker reads back its job.")
GAP_HINT = (
    "Under REPEATABLE READ each claim also locks the gap in front of its index entry, and each "
    "mark moves a job's entry (PENDING to IN_PROGRESS) into the gap in front of the oldest "
    "claimed job: the workers' sessions need READ COMMITTED.")

_ids = itertools.count(1)


def _statements(answer: str | Sequence[str]) -> list[str]:
    """The learner's statements, one per item; bad input named with its fix."""
    if isinstance(answer, str):
        parts = statements(answer)
    elif isinstance(answer, Sequence) and all(isinstance(s, str) for s in answer):
        parts = [part for s in answer for part in statements(s)]
    else:
        raise LabkitError(f"The answer must be SQL text (or a list of statements), not "
                          f"{type(answer).__name__}.",
                          "write your statements in one string, separated by semicolons.")
    if not parts:
        raise LabkitError("The SQL to check is empty.",
                          "write your statements in the string and run the cell again.")
    if len(parts) > MAX_STATEMENTS:
        raise LabkitError(f"The answer holds {len(parts)} statements; a claim needs a few.",
                          f"keep it to at most {MAX_STATEMENTS} statements.")
    return parts


def _bind(lab: mysql.MyLab, text: str, params: dict) -> str:
    """One statement with its parameters written in as the server's literals."""
    try:
        return lab.admin.raw.cursor().mogrify(text, params)
    except (KeyError, TypeError, ValueError) as exc:
        raise LabkitError(f"The SQL's parameters could not be filled in ({type(exc).__name__}: {exc}).",
                          f"use only {', '.join(f'%({k})s' for k in params)}, and write a literal % "
                          "as %%.") from None


def _scratch(lab: mysql.MyLab) -> mysql.MyLab:
    """A throw-away database next to ``lab``'s (the caller drops it, in a ``finally``)."""
    return mysql.MyLab.open(lab.server, f"check_{os.getpid()}_{next(_ids)}")


def _jobs_newest_first(lab: mysql.MyLab, n: int) -> None:
    """The job table with its index and ``n`` pending jobs numbered newest first (job n is
    the oldest), so that a claim reading in id order takes the newest."""
    lab.execute(queries(SQL)["job_table"].sql)
    add = queries(SQL)["add_job"].sql
    for job in range(1, n + 1):
        lab.execute(add, (job, "PENDING", BASE - timedelta(seconds=job), None))


def _short(error) -> str:
    """A server error in one line: its number and its first clause."""
    message = " ".join(error.message.split())        # the learner's SQL may span lines
    text = message.split(";")[0]
    if "near '" in message:                         # a syntax error: where the parser stopped
        near = message.split("near '", 1)[1]
        text += f", near '{near[:40]}{'...' if len(near) > 40 else ''}"
    return f"ERROR {error.sqlstate} {text}"


def check_claim_mark(lab: mysql.MyLab | None, answer: str | Sequence[str], *,
                     workers: int = 3, isolation: str = "READ COMMITTED") -> Check:
    """Run ``answer`` -- the statements one worker sends inside one transaction, taking
    ``%(worker_id)s``, the last of them that returns rows returning the claimed job's id --
    in ``workers`` sessions at once on the MySQL-compatible server, under ``isolation``,
    over six pending jobs (numbered newest first) with the claim's index.

    The workers take turns statement by statement (A's first, B's first, C's first, then
    everyone's second...); a worker whose statement waits is left waiting while the others
    go on, and a worker that has sent everything commits once no one else can move.  It
    passes when no worker waits or fails, each reads back one job, the jobs differ and are
    the oldest, each job is still locked by its worker until that worker commits (another
    session's NOWAIT is refused), and after the commits exactly those jobs read IN_PROGRESS
    under their workers.  ``lab=None`` finds the server (and says how to get one if there
    is none)."""
    if lab is None:
        lab = mysql.MyLab(mysql.find(), "checks")        # NoServer names the fix
    if not isinstance(lab, mysql.MyLab):
        raise LabkitError(f"check_claim_mark runs on the MySQL-compatible server, and was given "
                          f"{type(lab).__name__}.",
                          "pass the appendix's lab, mysql.MyLab.open(server, ...) (or None to "
                          "find the server).")
    if not 2 <= workers <= 5:
        raise LabkitError(f"check_claim_mark runs 2 to 5 workers, not {workers}.",
                          "use workers=3 (the default).")
    if isolation not in LEVELS:
        raise LabkitError(f"isolation={isolation!r} is not one of the levels the check runs.",
                          f"pass one of {', '.join(LEVELS)}.")
    parts = _statements(answer)
    names = [chr(ord("A") + i) for i in range(workers)]
    jobs = workers + 3
    title = f"{workers} workers claim and mark at once ({isolation})"
    check = Check(title, hint=CLAIM_MARK_HINT)
    scratch = _scratch(lab)
    try:
        _jobs_newest_first(scratch, jobs)
        texts = {n: [_bind(scratch, part, {"worker_id": n}) for part in parts] for n in names}
        with MySessions(scratch, *names, isolation=isolation, lock_wait_timeout_s=LOCK_WAIT_S) as run:
            sent, held = _play(run, scratch, names, texts)
        return _judge(check, scratch, names, jobs, sent, held, isolation)
    finally:
        scratch.drop()


def _play(run: MySessions, scratch: mysql.MyLab, names: list[str],
          texts: dict[str, list[str]]) -> tuple[dict[str, list[Step]], dict[str, bool | None]]:
    """The workers' statements in turns; each worker commits once it has sent everything
    and no other worker can move, after a NOWAIT probe of the job it read back.  Returns
    each worker's steps and whether its job was still locked just before its COMMIT
    (None: nothing to probe)."""
    sent: dict[str, list[Step]] = {n: [] for n in names}
    todo = {n: list(texts[n]) for n in names}
    ended: set[str] = set()            # committed, or rolled back after an error
    held: dict[str, bool | None] = {}
    for n in names:
        run.step(n, "BEGIN")

    def busy(n: str) -> bool:
        return bool(sent[n]) and not sent[n][-1].done

    def failed(n: str) -> bool:
        return any(s.done and s.error for s in sent[n])

    def end(n: str) -> None:
        ended.add(n)
        if failed(n):
            run.step(n, "ROLLBACK")
            return
        held[n] = _still_locked(scratch, _claimed(sent[n]))
        run.step(n, "COMMIT")

    while len(ended) < len(names):
        moved = False
        for n in names:                # one turn: each free worker sends its next statement
            if n in ended or busy(n) or failed(n) or not todo[n]:
                continue
            k = len(texts[n]) - len(todo[n]) + 1
            sent[n].append(run.step(n, todo[n].pop(0), label=f"statement {k}"))
            moved = True
        if moved:
            continue
        ready = [n for n in names if n not in ended and not busy(n) and (failed(n) or not todo[n])]
        if ready:
            end(ready[0])
        else:                          # everyone left waits: let the first one's wait end
            run.wait(next(n for n in names if n not in ended and busy(n)))
    return sent, held


def _claimed(steps: list[Step]):
    """The job a worker read back: the first value of the last statement that returned rows
    (None if none did, or it returned no row)."""
    for step in reversed(steps):
        if step.results and step.results[-1].columns:
            rows = step.rows
            return rows[0][0] if rows and rows[0] else None
    return None


def _still_locked(scratch: mysql.MyLab, job) -> bool | None:
    """Is ``job`` locked by someone right now?  Another session asks for it with NOWAIT."""
    if job is None:
        return None
    conn = scratch.connect(role="probe", lock_wait_timeout_s=1)
    try:
        conn.execute("SELECT id FROM job WHERE id = %s FOR UPDATE NOWAIT", (job,))
        return False
    except mysql.LockNotAvailable:
        return True
    finally:
        conn.rollback()
        conn.close()


def _judge(check: Check, scratch: mysql.MyLab, names: list[str], jobs: int,
           sent: dict[str, list[Step]], held: dict[str, bool | None], isolation: str) -> Check:
    """The findings, from what the server did and what the table holds."""
    errors = {n: s.error for n in names for s in sent[n] if s.error}
    other = {n: e for n, e in errors.items() if e.kind not in ("lock_timeout", "deadlock")}
    if other:
        first = next(iter(other))
        more = [n for n in other if n != first]
        check.add(False, f"the statements failed on the server: {first}: {_short(other[first])}"
                  + (f" (and the same for {', '.join(more)})" if more and all(
                      other[m].sqlstate == other[first].sqlstate for m in more) else ""))
        return check
    waits = {n: sorted({b for s in sent[n] if s.waited for b in s.blocked_by}) for n in names}
    waited = {n: who for n, who in waits.items() if who}
    check.add(not waited, "no worker waited" if not waited else
              "worker(s) waited for another one's lock: "
              + "; ".join(f"{n} for {', '.join(who)}" for n, who in waited.items()))
    for n, e in errors.items():
        what = ("was rolled back as a deadlock victim (1213): its whole transaction is gone"
                if e.kind == "deadlock" else
                f"gave up waiting after {LOCK_WAIT_S} s (1205): its statement was rolled back")
        check.add(False, f"worker {n} {what}")
    if errors:
        return check
    got = {n: _claimed(sent[n]) for n in names}
    shown = ", ".join(f"{n} {'-' if v is None else v}" for n, v in got.items())
    check.add(bool(got) and all(v is not None for v in got.values()),
              f"each worker read back the id of its job (read back: {shown})")
    ids = [v for v in got.values() if v is not None]
    check.add(len(ids) == len(set(ids)), "no job was handed to two workers" if len(ids) == len(set(ids))
              else "a job was handed to more than one worker")
    oldest = list(range(jobs, jobs - len(names), -1))
    check.add(sorted(ids) == sorted(oldest),
              f"the oldest jobs went first (jobs {', '.join(map(str, oldest))}; the checker numbers "
              "jobs newest first)")
    probed = {n: h for n, h in held.items() if h is not None}
    loose = [n for n, h in probed.items() if not h]
    check.add(bool(probed) and not loose,
              "until its COMMIT each worker still held its job's lock (another session's NOWAIT "
              "was refused)" if not loose else
              f"before COMMIT the job of {', '.join(loose)} was not locked any more: another "
              "worker could have claimed it between your statements")
    rows = {r[0]: (r[1], r[2]) for r in scratch.execute("SELECT id, status, worker_id FROM job")}
    marked = {n: rows.get(v) == ("IN_PROGRESS", n) for n, v in got.items() if v is not None}
    others = [j for j, (status, _) in rows.items() if j not in ids and status != "PENDING"]
    good = bool(marked) and all(marked.values()) and not others
    if good:
        text = "after COMMIT each job read back reads IN_PROGRESS with its worker's id; the rest are PENDING"
    elif others:
        text = (f"after COMMIT job(s) {', '.join(map(str, sorted(others)))}, which no worker read "
                "back, are no longer PENDING")
    else:
        unmarked = [f"{n}'s job {got[n]} reads "
                    + "/".join("-" if v is None else str(v) for v in rows.get(got[n], ("missing",)))
                    for n, ok in marked.items() if not ok]
        text = ("after COMMIT the jobs are not marked IN_PROGRESS by their workers ("
                + "; ".join(unmarked) + "): the next claim takes them again")
    check.add(good, text)
    rest_ok = all(ok for ok, _ in check.findings[1:])
    if waited and rest_ok and isolation == "REPEATABLE READ":
        check.hint = GAP_HINT          # the statements are right; the isolation level is not
    return check
