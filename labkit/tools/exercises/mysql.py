"""The cross-engine appendix's exercise the server checks: the claim-and-mark on MySQL or
MariaDB, which have no ``UPDATE ... RETURNING``.

The learner writes the statements one worker sends in one transaction (a string of
statements separated by semicolons, or a list of them), taking ``%(worker_id)s``; the last
statement that returns rows returns the claimed job's id in its first column (that is how
the worker learns which job it has).  :func:`check_claim_mark` runs them in three workers
at once on the MySQL-compatible server, in scripted sessions
(:class:`~labkit.core.mysessions.MySessions`) over a scratch database of their own, and
reads from the server what happened: whether a worker waited, which jobs the workers read
back, which jobs each worker held locked until its COMMIT (another session's NOWAIT probes
of every job, just before and just after it), and what the table holds after the commits.
Each WRONG line says what happened; the hint, for the first of them, says where to look.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from ...core import mysql
from ...core.errors import LabkitError
from ...core.mysessions import MySessions
from ...core.queries import queries, statements
from ...core.steps import Step
from . import Check, fill_in, scratch_name

SQL = "mysql_jobs.sql"
LEVELS = ("READ COMMITTED", "REPEATABLE READ")
# A worker that waits gives up after this long (error 1205).  A wait that ends does so when its
# holder commits, and the holder first sends its last statements and the NOWAIT probe of every
# job: milliseconds on an idle machine, past two seconds on a loaded one (seen under make test's
# four processes on two cores), where a shorter bound turned a wait into a timeout and the
# verdict's hint into the wrong one.  A circular wait is a deadlock, which InnoDB ends at once;
# so only a wait on a lock no worker holds lasts this long.
LOCK_WAIT_S = 20
MAX_STATEMENTS = 8
BASE = datetime(2026, 1, 1, 9, 0, 0)

# One hint per way an answer goes wrong, for the first finding that is WRONG: each says where
# to look, never what to write.
HINTS = {
    "failed": (
        "Read where the server's parser stopped: that is a part of the PostgreSQL claim this "
        "server lacks (the cell before the exercise tried RETURNING on each statement). A worker "
        "may send several statements in one transaction, and must still learn which job it took."),
    "waited": (
        "Look at which statement of each worker waited, and for whom: it asked for a row another "
        "worker held. Which rows does that statement lock, and what do §1's policies do with a "
        "locked row?"),
    "read_back": (
        "A worker learns its job only from rows its statements return: the last statement that "
        "returns rows must give the job's id, and nothing else does."),
    "no_job": (
        "Run the claim alone and look at which rows it locks, not only at the one it returns: a "
        "locking read locks every row it reads (§2). EXPLAIN shows whether an index serves its "
        "ORDER BY, or whether it reads and sorts every PENDING row."),
    "oldest": (
        "Look at the order the claim reads the jobs in: the checker numbers them newest first, "
        "so their ids run the other way from their age."),
    "released": (
        "Something ended the worker's transaction between the claim and its COMMIT, and its lock "
        "with it: look for a statement that commits (COMMIT, or DDL, which commits implicitly)."),
    "marked": (
        "Compare the table after the commits with the jobs the workers took: look at which rows "
        "the UPDATE changes, and to what."),
}
# Under REPEATABLE READ, when the statements pass under READ COMMITTED: the waits are on gaps.
GAP_HINT = (
    "The same statements pass under READ COMMITTED; here workers waited although no two took "
    "the same row. Look at the lock each waiting statement asked for, and at §2's figure: "
    "where does a marked job's new index entry land, and whose lock covers that gap?")


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
    return fill_in(lambda q, p: lab.admin.raw.cursor().mogrify(q, p), text, params, name_error=True)


def _scratch(lab: mysql.MyLab) -> mysql.MyLab:
    """A throw-away database next to ``lab``'s (the caller drops it, in a ``finally``)."""
    return mysql.MyLab.open(lab.server, scratch_name("check"))


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
    the oldest, each worker holds the lock of its own job and of no other until it commits
    (another session's NOWAIT is refused before the COMMIT and granted after it), and after
    the commits exactly those jobs read IN_PROGRESS under their workers.  A worker that
    reads back nothing is judged on the one job it marked as its own.  ``lab=None`` finds
    the server (and says how to get one if there is none)."""
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
    check = Check(title)
    scratch = _scratch(lab)
    try:
        _jobs_newest_first(scratch, jobs)
        texts = {n: [_bind(scratch, part, {"worker_id": n}) for part in parts] for n in names}
        with MySessions(scratch, *names, isolation=isolation, lock_wait_timeout_s=LOCK_WAIT_S) as run:
            sent, held = _play(run, scratch, names, texts, jobs)
        return _judge(check, scratch, names, jobs, sent, held, isolation)
    finally:
        scratch.drop()


def _play(run: MySessions, scratch: mysql.MyLab, names: list[str],
          texts: dict[str, list[str]], jobs: int) -> tuple[dict[str, list[Step]], dict[str, set]]:
    """The workers' statements in turns; each worker commits once it has sent everything
    and no other worker can move.  Returns each worker's steps and the jobs whose locks its
    COMMIT released (another session's NOWAIT probe of every job, just before and just after
    the COMMIT): the jobs it held until then."""
    sent: dict[str, list[Step]] = {n: [] for n in names}
    todo = {n: list(texts[n]) for n in names}
    ended: set[str] = set()            # committed, or rolled back after an error
    held: dict[str, set] = {}
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
        before = _locked_jobs(scratch, jobs)
        run.step(n, "COMMIT")
        held[n] = before - _locked_jobs(scratch, jobs)

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


def _returned_rows(steps: list[Step]) -> bool:
    """Did any of the worker's statements return a result set (even an empty one)?"""
    return any(r.columns for step in steps for r in step.results)


def _claimed(steps: list[Step]):
    """The job a worker read back: the first value of the last statement that returned rows
    (None if none did, or it returned no row)."""
    for step in reversed(steps):
        if step.results and step.results[-1].columns:
            rows = step.rows
            return rows[0][0] if rows and rows[0] else None
    return None


def _locked_jobs(scratch: mysql.MyLab, jobs: int) -> set:
    """The jobs someone holds locked right now: another session asks for each with NOWAIT
    (and rolls back what it got)."""
    locked = set()
    conn = scratch.connect(role="probe", lock_wait_timeout_s=1)
    try:
        for job in range(1, jobs + 1):
            try:
                conn.execute("SELECT id FROM job WHERE id = %s FOR UPDATE NOWAIT", (job,))
            except mysql.LockNotAvailable:
                locked.add(job)
    finally:
        conn.rollback()
        conn.close()
    return locked


def _jobs(ids) -> str:
    """Job ids as the findings name them: "job 4" or "jobs 1, 2, 3"."""
    ids = sorted(ids)
    return f"job{'s' if len(ids) != 1 else ''} {', '.join(map(str, ids))}"


def _who(names) -> str:
    return ", ".join(names)


class _Findings:
    """A check's findings as they are added, with the hint of each WRONG one, in order."""

    def __init__(self, check: Check) -> None:
        self.check = check
        self.hints: list[str] = []

    def add(self, ok: bool, text: str, why: str) -> None:
        """One finding; a WRONG one queues the hint for ``why``."""
        self.check.add(ok, text)
        if not ok:
            self.hints.append(HINTS[why])

    def done(self) -> Check:
        """The check, with the hint for its first WRONG finding (if there is one)."""
        if self.hints:
            self.check.hint = self.hints[0]
        return self.check


@dataclass(frozen=True)
class _Outcome:
    """What the workers took and what the table holds after the commits."""

    rows: dict[int, tuple[str, str | None]]     # job -> (status, worker_id)
    got: dict[str, int | None]                  # the job each worker read back
    marked: dict[str, list[int]]                # the jobs IN_PROGRESS under each worker
    took: dict[str, int | None]                 # the one it read back, else the one it marked

    @property
    def pending(self) -> int:
        """How many jobs are still PENDING."""
        return sum(1 for status, _ in self.rows.values() if status == "PENDING")

    @property
    def ids(self) -> list[int]:
        """The jobs the workers took, a job taken twice listed twice."""
        return [v for v in self.took.values() if v is not None]


def _read_outcome(scratch: mysql.MyLab, names: list[str], sent: dict[str, list[Step]]) -> _Outcome:
    """The table after the commits, and the job each worker read back, marked and took."""
    rows = {r[0]: (r[1], r[2]) for r in scratch.execute("SELECT id, status, worker_id FROM job")}
    got = {n: _claimed(sent[n]) for n in names}
    marked = {n: [j for j, (status, w) in rows.items() if w == n and status == "IN_PROGRESS"]
              for n in names}
    # the job each worker took: the one it read back, else the one row it marked as its own
    took = {n: got[n] if got[n] is not None else (marked[n][0] if len(marked[n]) == 1 else None)
            for n in names}
    return _Outcome(rows, got, marked, took)


def _judge_failures(findings: _Findings, errors: dict) -> bool:
    """The finding for statements that failed other than by waiting; True if any did."""
    other = {n: e for n, e in errors.items() if e.kind not in ("lock_timeout", "deadlock")}
    if not other:
        return False
    first = next(iter(other))
    more = [n for n in other if n != first]
    same = bool(more) and all(other[m].sqlstate == other[first].sqlstate for m in more)
    findings.add(False, f"the statements failed on the server: {first}: {_short(other[first])}"
                 + (f" (and the same for {_who(more)})" if same else ""), "failed")
    return True


def _waits(names: list[str], sent: dict[str, list[Step]]) -> dict[str, list[tuple[str, list[str]]]]:
    """Each worker that waited: the label of each statement that waited, and for whom."""
    waits = {n: [(s.label, sorted(s.blocked_by)) for s in sent[n] if s.waited] for n in names}
    return {n: w for n, w in waits.items() if w}


def _judge_waits(findings: _Findings, waited: dict[str, list[tuple[str, list[str]]]],
                 errors: dict) -> None:
    """The finding on waits, and one for each worker whose wait ended in an error."""
    findings.add(not waited, "no worker waited" if not waited else
                 "worker(s) waited for another one's lock: " + "; ".join(
                     f"{n} for {', '.join(sorted({b for _, who in w for b in who}))} "
                     f"(at {', '.join(dict.fromkeys(label for label, _ in w))})" for n, w in waited.items()),
                 "waited")
    for n, e in errors.items():
        what = ("was rolled back as a deadlock victim (1213): its whole transaction is gone"
                if e.kind == "deadlock" else
                f"gave up waiting after {LOCK_WAIT_S} s (1205): its statement was rolled back")
        findings.add(False, f"worker {n} {what}", "waited")


def _judge_read_back(findings: _Findings, names: list[str], sent: dict[str, list[Step]],
                     outcome: _Outcome) -> None:
    """1. Did each worker read back the id of its job?"""
    got, marked = outcome.got, outcome.marked
    silent = [n for n in names if not _returned_rows(sent[n])]
    empty = [n for n in names if n not in silent and got[n] is None]
    shown = ", ".join(f"{n} {'-' if v is None else v}" for n, v in got.items())
    if silent:
        findings.add(False, f"no statement of {_who(silent)} returned rows, so that worker cannot tell "
                     "which job it holds" + (f" (it marked {_jobs(marked[silent[0]])})"
                                             if len(silent) == 1 and marked[silent[0]] else ""),
                     "read_back")
    if empty:
        pending = outcome.pending
        findings.add(False, f"{_who(empty)} read back no job (no row, or NULL) although "
                     f"{pending} job{'s' if pending != 1 else ''} were still PENDING after every commit",
                     "no_job")
    if not silent and not empty:
        findings.add(True, f"each worker read back the id of its job (read back: {shown})", "read_back")


def _judge_one_worker_per_job(findings: _Findings, outcome: _Outcome) -> None:
    """2. Did any job go to two workers?"""
    ids = outcome.ids
    twice = sorted({v for v in ids if ids.count(v) > 1})
    findings.add(not twice, "no job was handed to two workers" if not twice else
                 f"{_jobs(twice)} went to more than one worker", "waited")


def _judge_oldest_first(findings: _Findings, names: list[str], jobs: int, outcome: _Outcome) -> None:
    """3. Did the oldest jobs go first (if any job was taken)?"""
    ids = outcome.ids
    if not ids:
        return
    oldest = list(range(jobs, jobs - len(names), -1))
    right = sorted(ids) == sorted(oldest)
    taken = ", ".join(f"{n} job {v}" for n, v in outcome.took.items() if v is not None)
    none = [n for n, v in outcome.took.items() if v is None]
    findings.add(right, f"the oldest jobs went first (taken: {taken}; the checker numbers jobs newest "
                 "first)" if right else
                 f"the workers took: {taken}" + (f" ({_who(none)}: none)" if none else "")
                 + f"; the oldest, {_jobs(oldest)}, should have gone first (the checker numbers jobs "
                 "newest first)", "oldest")


def _judge_locks(findings: _Findings, names: list[str], held: dict[str, set], outcome: _Outcome) -> None:
    """4. Did each worker hold the lock of its own job, and of no other, until its COMMIT?"""
    took = outcome.took
    loose = [n for n in names if took[n] is not None and took[n] not in held.get(n, set())]
    if loose:
        findings.add(False, f"just before its COMMIT, {_who(loose)} held no lock on the job it took "
                     f"({', '.join(str(took[n]) for n in loose)}): another session's NOWAIT got it, so "
                     "another worker could have claimed it between your statements", "released")
    for n in names:
        locks = held.get(n, set())
        if locks - {took[n]}:
            findings.add(False, f"{n} held the locks of {_jobs(locks)} until its COMMIT, "
                         + (f"though it took only job {took[n]}" if took[n] is not None else
                            "though it took no job")
                         + ": another worker's SKIP LOCKED passed over all of them", "no_job")
    if outcome.ids and not loose and not any(held.get(n, set()) - {took[n]} for n in names):
        findings.add(True, "until its COMMIT each worker held the lock of its own job and of no other "
                     "(another session's NOWAIT was refused before the COMMIT, granted after it)", "released")


def _mark_wrong(status: str, worker: str | None) -> str:
    """What is wrong with a taken job's row, its verbs left to fill in for one job or several."""
    if status == "PENDING":
        return "{is} still PENDING: the next claim takes {it} again"
    if status == "IN_PROGRESS":
        return ("{reads} IN_PROGRESS under "
                + (f"worker {worker}" if worker else "no worker_id") + ": nothing says who runs {it}")
    return "{reads} " + status


def _table_mistakes(outcome: _Outcome) -> list[str]:
    """What the table holds that it should not: taken jobs not IN_PROGRESS under their
    worker (grouped by what is wrong), and jobs no worker took that are no longer PENDING."""
    wrong: dict[str, list[str]] = {}
    for n, v in outcome.took.items():
        if v is None:
            continue
        status, worker = outcome.rows.get(v, ("missing", None))
        if (status, worker) != ("IN_PROGRESS", n):
            wrong.setdefault(_mark_wrong(status, worker), []).append(f"{n}'s job {v}")
    texts = [f"{', '.join(taken_)} " + what.format(**({"is": "is", "reads": "reads", "it": "it"}
                                                    if len(taken_) == 1 else
                                                    {"is": "are", "reads": "read", "it": "them"}))
             for what, taken_ in wrong.items()]
    ids = outcome.ids
    others = sorted(j for j, (status, _) in outcome.rows.items() if j not in ids and status != "PENDING")
    if others:
        texts.append(f"{_jobs(others)}, which no worker took, "
                     f"{'is' if len(others) == 1 else 'are'} no longer PENDING")
    return texts


def _judge_table(findings: _Findings, outcome: _Outcome) -> None:
    """5. Does the table after the commits hold each taken job IN_PROGRESS under its worker,
    and the rest PENDING (if any job was taken)?"""
    texts = _table_mistakes(outcome)
    if outcome.ids:
        findings.add(not texts, "after COMMIT each job taken reads IN_PROGRESS with its worker's id; the "
                     "rest are PENDING" if not texts else "after COMMIT " + "; ".join(texts), "marked")


def _judge(check: Check, scratch: mysql.MyLab, names: list[str], jobs: int,
           sent: dict[str, list[Step]], held: dict[str, set], isolation: str) -> Check:
    """The findings, from what the server did and what the table holds; the hint is the one
    for the first finding that is WRONG."""
    findings = _Findings(check)
    errors = {n: s.error for n in names for s in sent[n] if s.error}
    if _judge_failures(findings, errors):
        return findings.done()
    waited = _waits(names, sent)
    _judge_waits(findings, waited, errors)
    if errors:
        return findings.done()
    outcome = _read_outcome(scratch, names, sent)
    _judge_read_back(findings, names, sent, outcome)
    _judge_one_worker_per_job(findings, outcome)
    _judge_oldest_first(findings, names, jobs, outcome)
    _judge_locks(findings, names, held, outcome)
    _judge_table(findings, outcome)
    findings.done()
    rest_ok = all(ok for ok, _ in check.findings[1:])
    if waited and rest_ok and isolation == "REPEATABLE READ":
        check.hint = GAP_HINT          # the statements are right; the isolation level is not
    return check
