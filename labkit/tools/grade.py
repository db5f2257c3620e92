"""The grader: run the reader's claim for real and say what is wrong with it.

``labkit grade claim FILE.sql [--json]`` (or :func:`grade_claim` from a notebook)
takes a claim written against the job table of ``sql/job_table.sql`` — one
statement, or a short script, that receives the worker's id as ``%(worker_id)s``
and returns the claimed job ids in its first column — and puts it through four
stages, each in a throw-away lab schema of its own:

1. **read**: the text is split into statements (comments, quotes and dollar quotes
   respected); the statement that locks the rows (FOR UPDATE ...) is found, and its own
   SELECT is read for ORDER BY; unknown parameters are refused, and so is SQL that
   changes a memory setting (:func:`labkit.core.sandbox.memory_refusal`).
2. **probe**: two sessions claim at the same moment (A's transaction still open
   when B claims), as in notebook 01.  The server says whether B waits for A (a
   convoy), fails at once (NOWAIT) or gets another job; A's rows show whether the
   claim marks them IN_PROGRESS with who and when, and how many it took.
3. **plan**: the claim is EXPLAINed (ANALYZE, BUFFERS, rolled back) over a long
   history of finished jobs: does it find pending jobs through an index, or read
   the history?
4. **run**: N worker processes claim over M jobs, each job takes a few ms outside
   the claim and is then marked DONE; one worker is SIGKILLed after its third job
   has run (before that job is marked).  The jobs' creation times are shuffled, so
   that the table's physical order is not their creation order, and while the workers
   start one more session of the run holds the oldest job locked, as a worker in the
   middle of its claim would.  Counted: jobs handed out twice, jobs run twice, jobs
   lost, jobs stuck IN_PROGRESS, time the workers' claims spent waiting for a row lock
   (sampled from pg_stat_activity by the grader's own session), lock errors, jobs
   claimed before an older one, and whether the work ran inside the claim's
   transaction.

Every session that runs the claim (the probe's two, the EXPLAIN's, the workers', the
one that holds a job) looks the same to the SQL: a worker id of one shape drawn at
random for each run, an application_name of one shape, the same settings.  The
verdict on waiting, NOWAIT errors, double claims and order rests on what the run
measured, whatever the probe saw.  The sessions that watch (the probe's monitor, the
sampler) log in as labkit's own role, so the claim's SQL cannot end them.

The claim's SQL runs as a throw-away role that may use its own schema and nothing
else (:mod:`labkit.core.sandbox`), and every stage is time-boxed: a statement that runs too
long is cancelled, and the claim fails with ``too_slow``.

The verdict is ``pass`` only when no problem was found.  Every problem is a short
code with an explanation that names the fix.  A syntax error, a statement that is
not a claim, or a runtime error is a problem in the report, never a crash.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import psycopg
from psycopg import sql

from ..core.checked import one_row
from ..core.db import Database, Guards, connect, open_connection
from ..core.errors import LabkitError, ServerError
from ..core.files import data_file
from ..core.lab import Lab
from ..core.procs import Context, Worker
from ..core.queries import statements
from ..core.sandbox import Sandbox, check_number, memory_refusal, read_input
from ..core.sessions import Sessions, classify
from ..core.steps import Step
from ..core.text import fill
from ..labs import claims

PARAM_RE = re.compile(r"%\((\w+)\)s")
TX_CONTROL = re.compile(r"^\s*(BEGIN|START\s+TRANSACTION|COMMIT|END|ROLLBACK|ABORT)\b", re.I)
SETTING = re.compile(r"^\s*(SET|RESET)\b", re.I)
PROBE_JOBS = 50
HISTORY_ROWS = 50_000
HISTORY_PAGES = 100   # a search for pending jobs that reads more pages than this reads the history
MAX_WORKERS = 64
MAX_JOBS = 100_000
MAX_JOB_MS = 1_000
MAX_SQL_BYTES = 1_000_000
STEP_TIMEOUT_S = 10.0   # one statement of the claim (and the grader's own set-up work)
LOCK_TIMEOUT = "5s"     # every session that runs the claim
HOLD_S = 1.0            # how long, at most, one session holds the oldest job as the run starts
RUN_TIMEOUT_S = 90.0    # the whole run of the worker processes
_counter = itertools.count(1)
SAMPLES = data_file("grader")


def sample(name: str) -> Path:
    """One of the sample answers in data/grader/ (correct.sql, wrong_nowait.sql, ...)."""
    path = SAMPLES / name
    if not path.is_file():
        have = ", ".join(sorted(p.name for p in SAMPLES.glob("*.sql")))
        raise LabkitError(f"No sample answer {name!r}.", f"use one of: {have}.")
    return path

# The explanation of every problem code: what is wrong, and the fix.
EXPLAIN = {
    "empty": "The file holds no SQL statement. Write the claim: one statement (or a short "
             "script) that returns the claimed job ids.",
    "bad_parameter": "The claim uses a parameter other than %(worker_id)s, or a bare % sign. "
                     "Use only %(worker_id)s, and write a literal % as %%.",
    "memory_setting": "The SQL raises a memory setting (work_mem, hash_mem_multiplier, "
                      "maintenance_work_mem, temp_buffers) above its bound, or changes settings "
                      "in a way that cannot be read before it runs (set_config, an UPDATE of "
                      "pg_settings, EXECUTE, DO, a function): SQL from a file runs within fixed "
                      "memory bounds, and a claim needs none of these. Remove it.",
    "syntax_error": "The SQL does not parse, so nothing ran. Fix the statement the server "
                    "names (try it in psql first).",
    "sql_error": "The SQL parses but fails when it runs. Fix the error the server names "
                 "(a column or table that does not exist in job(id, status, created_at, "
                 "worker_id, claimed_at)?).",
    "not_a_claim": "It returns no job ids that it locked or marked: it is a read, not a claim. "
                   "A claim locks the rows it picks (FOR UPDATE SKIP LOCKED) and marks them "
                   "IN_PROGRESS in the same transaction.",
    "claims_nothing": "With pending jobs waiting it claimed none. Select the pending jobs: "
                      "WHERE status = 'PENDING'.",
    "convoy": "Plain FOR UPDATE: a second worker waited for the first one's lock on the same "
              "oldest row, so workers queue behind each other and N of them do the work of "
              "one. Add SKIP LOCKED.",
    "nowait_error_storm": "NOWAIT: a second worker failed at once with ERROR 55P03 on the "
                          "same oldest row; under load most claims fail and retry (an error "
                          "storm). Use SKIP LOCKED, which moves on to a free row.",
    "no_status_update": "The claim locks rows but does not mark them: once its transaction "
                        "ends the job is PENDING again and the next worker claims it too "
                        "(double claims). Mark the rows IN_PROGRESS in the same statement or "
                        "transaction (UPDATE ... FROM the locked rows).",
    "no_owner": "The claimed rows are IN_PROGRESS but without worker_id or claimed_at, so a "
                "reaper cannot tell whose claim it is or whether its lease expired. Set "
                "worker_id = %(worker_id)s and claimed_at = now().",
    "done_at_claim": "The claim marks jobs DONE before they run: a worker that dies loses them "
                     "for good. Mark them IN_PROGRESS; DONE is written after the job ran.",
    "no_limit": "The claim took every pending job at once: one worker hoards the queue and a "
                "crash strands all of it. Add LIMIT (1 to a few dozen).",
    "no_order_by": "No ORDER BY: the claim takes pending jobs in whatever order the plan "
                   "returns them, so old jobs can starve. Add ORDER BY created_at (best "
                   "effort under SKIP LOCKED, but no longer arbitrary).",
    "scans_history": "Over a long history of finished jobs the claim reads far more pages than "
                     "it claims: no index serves its pending predicate, so every claim gets "
                     "slower as DONE rows pile up. Write the predicate as "
                     "status = 'PENDING' ORDER BY created_at, which the partial index "
                     "job_pending_created_idx covers (or archive finished jobs).",
    "work_inside_claim": "The script leaves its transaction open, so the job runs inside the "
                         "claim's transaction: row locks last as long as the job, and a worker "
                         "that dies after the job had its effect rolls the claim back; another "
                         "worker runs the job again. COMMIT right after marking the rows.",
    "double_claims": "The same job was handed to two workers while the first claim still "
                     "stood. Lock with FOR UPDATE SKIP LOCKED and mark IN_PROGRESS before "
                     "committing.",
    "lost_jobs": "Jobs ended neither done nor recoverable (DONE without running, or "
                 "IN_PROGRESS without owner). Mark IN_PROGRESS with worker_id and claimed_at.",
    "stalled": "The run did not finish in time: pending jobs were left that no worker would "
               "claim. Check the claim's WHERE clause.",
    "too_slow": "The claim ran too long and was cancelled (the grader gives each statement "
                "a few seconds). A claim picks a few pending jobs through an index and returns "
                "at once: remove what makes it wait or loop (pg_sleep, a lock it waits for, a "
                "changed statement_timeout).",
    "crash_not_tested": "No worker was killed while it held a claim (the run ended first, or "
                        "no worker ran three jobs), so nothing shows that the claim survives a "
                        "crash. Claim a few jobs at a time and grade it again with the default "
                        "jobs and job time.",
}


@dataclass
class Problem:
    code: str
    explain: str
    evidence: str = ""


@dataclass
class Report:
    file: str
    verdict: str = "fail"
    problems: list[Problem] = field(default_factory=list)
    statements: int = 0
    probe: str = ""                 # what B did while A's claim was open
    probe_claimed: list[int] = field(default_factory=list)
    uses_index: bool | None = None
    plan: list[str] = field(default_factory=list)
    plan_buffers: int | None = None
    workers: int = 0
    jobs: int = 0
    killed: str = ""
    double_claims: int | None = None
    duplicate_runs: int | None = None
    lost_jobs: int | None = None
    stuck_jobs: int | None = None
    stuck_recoverable: int | None = None
    unclaimed_jobs: int | None = None
    blocked_ms: float | None = None
    claim_waits: int | None = None  # worker sessions seen waiting for a row lock in the claim
    out_of_order: int | None = None  # jobs claimed before an older job (creation order)
    lock_errors: int | None = None
    work_inside_claim: bool | None = None
    run_seconds: float | None = None
    sandbox: str = ""               # which role the claim's SQL ran as

    @property
    def codes(self) -> list[str]:
        return [p.code for p in self.problems]

    def add(self, code: str, evidence: str = "") -> None:
        if code not in self.codes:
            self.problems.append(Problem(code, EXPLAIN[code], evidence))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["problems"] = [asdict(p) for p in self.problems]
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def brief(self) -> str:
        """Verdict and problems only: the same on every run (no measured numbers)."""
        lines = [f"{self.file}: {self.verdict.upper()}"]
        if not self.problems:
            lines.append("  no problem found")
        for p in self.problems:
            lines.append(fill(f"{p.code}: {p.explain}", indent="      ", first="  - "))
        return "\n".join(lines)

    def to_text(self) -> str:
        lines = [self.brief(), "  measured:"]
        if self.sandbox:
            lines.append(fill(f"the claim's SQL {self.sandbox}", indent="      ", first="    "))
        facts = [("probe", self.probe), ("uses index", self.uses_index),
                 ("plan", " > ".join(self.plan)), ("pages searched over the history", self.plan_buffers),
                 ("workers / jobs", f"{self.workers} / {self.jobs}"), ("killed", self.killed),
                 ("double claims", self.double_claims), ("jobs run twice", self.duplicate_runs),
                 ("lost jobs", self.lost_jobs), ("stuck IN_PROGRESS", self.stuck_jobs),
                 ("  of which a reaper can recover", self.stuck_recoverable),
                 ("left PENDING", self.unclaimed_jobs), ("blocked ms", self.blocked_ms),
                 ("workers that waited for a row lock", self.claim_waits),
                 ("jobs claimed before an older one", self.out_of_order),
                 ("lock errors", self.lock_errors), ("work inside claim tx", self.work_inside_claim)]
        for name, value in facts:
            if value not in (None, ""):
                lines.append(fill(f"{name}: {value}", indent="      ", first="    "))
        for p in self.problems:
            if p.evidence:
                lines.append(fill(f"evidence for {p.code}: {p.evidence}", indent="      ", first="    "))
        return "\n".join(lines)

    def print(self) -> None:
        print(self.to_text())


# -- reading the SQL ------------------------------------------------------------------------------

split_statements = statements     # the grader splits a learner's script as the server would


def _code_only(stmt: str) -> str:
    """The statement with quoted text blanked out (for keyword checks)."""
    return re.sub(r"'(?:[^']|'')*'|\$(\w*)\$.*?\$\1\$", "''", stmt, flags=re.S)


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def bind(script: str, worker_id: str) -> str:
    """Replace %(worker_id)s with a SQL literal and %% with %."""
    if "%(" not in script and "%%" not in script:
        return script
    return PARAM_RE.sub(lambda m: _literal(worker_id), script).replace("%%", "%")


def worker_ids(n: int) -> list[str]:
    """``n`` worker ids of one shape, drawn at random: the SQL cannot tell from its id (nor
    from the application_name that carries it) which stage of the grading runs it."""
    ids: set[str] = set()
    while len(ids) < n:
        ids.add("w" + secrets.token_hex(4))
    return sorted(ids, key=lambda _: secrets.randbits(32))


LOCKING = re.compile(r"\bFOR\s+(?:NO\s+KEY\s+UPDATE|UPDATE|KEY\s+SHARE|SHARE)\b", re.I)
ORDER_BY = re.compile(r"\bORDER\s+BY\b", re.I)


def _own_level(code: str, at: int) -> str:
    """The text of the query level that holds position ``at``: from the parenthesis that
    opens it to the one that closes it, with every nested parenthesis blanked out."""
    depth, start = 0, 0
    for i in range(at - 1, -1, -1):
        if code[i] == ")":
            depth += 1
        elif code[i] == "(":
            if depth == 0:
                start = i + 1
                break
            depth -= 1
    depth, end = 0, len(code)
    for i in range(at, len(code)):
        if code[i] == "(":
            depth += 1
        elif code[i] == ")":
            if depth == 0:
                end = i
                break
            depth -= 1
    out, depth = [], 0
    for ch in code[start:end]:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def unordered_claim(stmts: list[str]) -> str | None:
    """What in the claim statement has no ORDER BY of its own, or None.  The claim
    statement is the one that locks rows (FOR UPDATE, FOR SHARE ...), and each locking
    SELECT in it must order its own rows: an ORDER BY in another statement, or nested in
    a subquery of that SELECT, orders nothing it locks.  A claim that locks no row with
    such a clause is the last statement that reads the job table (its rows are the
    claimed ids), and it must hold an ORDER BY somewhere."""
    body = [_code_only(s) for s in stmts if not TX_CONTROL.match(s) and not SETTING.match(s)]
    locking = [(s, m) for s in body for m in LOCKING.finditer(s)]
    for code, m in locking:
        if not ORDER_BY.search(_own_level(code, m.start())):
            return (f"the SELECT that locks the rows ({' '.join(m.group(0).split()).upper()}) "
                    "has no ORDER BY of its own")
    if locking:
        return None
    readers = [c for c in body if re.search(r"\bjob\b", c, re.I)]
    if readers and not ORDER_BY.search(readers[-1]):
        return "the statement that claims the rows has no ORDER BY"
    return None


# -- the stages -----------------------------------------------------------------------------------

def _read(report: Report, text: str) -> tuple[list[str] | None, str | None]:
    """The statements, and what in the claim statement lacks an ORDER BY (or None)."""
    stmts = split_statements(text)
    report.statements = len(stmts)
    if not stmts:
        report.add("empty")
        return None, None
    code = " ".join(_code_only(s) for s in stmts)
    names = set(PARAM_RE.findall(code))
    stray = re.sub(r"%\(\w+\)s|%%", "", code)
    if names - {"worker_id"} or "%" in stray:
        report.add("bad_parameter", f"parameters found: {sorted(names) or 'none'}")
        return None, None
    refused = memory_refusal(stmts)
    if refused:
        report.add("memory_setting", refused)
        return None, None
    return stmts, unordered_claim(stmts)


def _claim_statements(stmts: list[str]) -> list[str]:
    return [s for s in stmts if not TX_CONTROL.match(s)]


class _AsWorkers:
    """The lab seen through the sandbox, every session named with one of ``names`` (the
    role asked for, if it is one of them, else the first) and set up like a graded
    worker's; a ``monitor`` logs in as labkit's own role instead, so that the claim's SQL
    cannot end it."""

    def __init__(self, box_lab, base: Lab, names: list[str]):
        self._box_lab = box_lab
        self._base = base
        self._names = list(names)

    def __getattr__(self, name):
        return getattr(self._box_lab, name)

    def connect(self, *, autocommit: bool = True, role: str = "", guards: Guards | None = None):
        if role == "monitor":
            return self._base.connect(autocommit=autocommit, role=role)
        name = role if role in self._names else self._names[0]
        conn = self._box_lab.connect(autocommit=autocommit, role=name, guards=guards)
        _session_settings(conn)
        return conn


def _as_workers(box_lab: Lab, base: Lab, names: list[str]) -> Lab:
    """An :class:`_AsWorkers` where a :class:`Lab` is asked for: it is the sandbox's lab in
    everything (``__getattr__`` forwards) but how it connects."""
    return cast(Lab, _AsWorkers(box_lab, base, names))


def _session_settings(conn: psycopg.Connection) -> None:
    """What every session that runs the claim sets, in the order the probe's sessions set it."""
    conn.execute(sql.SQL("SET lock_timeout = {}").format(sql.Literal(LOCK_TIMEOUT)))
    conn.execute(sql.SQL("SET statement_timeout = {}").format(
        sql.Literal(f"{int(STEP_TIMEOUT_S * 1000)}ms")))


def _probe(report: Report, lab: Lab, box: Sandbox, stmts: list[str], no_order: str | None) -> bool:
    """Two claims in flight at once.  Returns False when the claim cannot be run further."""

    claims.fresh_jobs(box.lab, PROBE_JOBS)
    body = _claim_statements(stmts)
    if not body:
        report.add("not_a_claim", "the script only begins and ends a transaction")
        return False
    try:
        return _probe_sessions(report, lab, box, body, no_order)
    except ServerError:
        raise
    except LabkitError as exc:
        # The engine could not go on (the claim dropped the job table, say): a problem of
        # the claim, reported as one.
        report.add("sql_error", exc.what)
        return False
    except psycopg.OperationalError as exc:
        _still_up(lab)
        report.add("sql_error", f"a session of the probe was ended while the claim ran: {_first_line(exc)}")
        return False


def _still_up(lab: Lab) -> None:
    """Raise if the server itself is gone (labkit's own session cannot ask it anything)."""
    with lab.connect(role="monitor") as conn:
        conn.execute("SELECT 1")


def _first_line(exc: Exception) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _probe_sessions(report: Report, lab: Lab, box: Sandbox, body: list[str], no_order: str | None) -> bool:

    a_id, b_id = worker_ids(2)
    view = _as_workers(box.lab, lab, [a_id, b_id])
    with Sessions(view, a_id, b_id, watch={"job": "id"}, lock_timeout=LOCK_TIMEOUT,
                  statement_timeout=f"{int(STEP_TIMEOUT_S * 1000)}ms") as run:
        A = lambda text, **kw: run.step(a_id, text, **kw)  # noqa: E731
        B = lambda text, **kw: run.step(b_id, text, **kw)  # noqa: E731
        A("BEGIN")
        ids = _probe_first_claim(report, run, A, a_id, body)
        if ids is None:
            return False
        B("BEGIN")
        _probe_second_claim(report, run, A, B, b_id, body, ids)
        A("ROLLBACK")
        B("ROLLBACK")
    if no_order:
        report.add("no_order_by", no_order)
    return True


def _probe_first_claim(report: Report, run: Sessions, A: Callable[..., Step], a_id: str,
                       body: list[str]) -> list[int] | None:
    """A claims, its transaction left open: the ids it claimed, once they are read back as
    job rows it holds locked and its marks are judged; None when the claim cannot be run
    further (an error, no ids, nothing claimed, rows that are not its jobs)."""
    a = A("; ".join(bind(s, a_id) for s in body), label="claim")
    if a.error is not None:
        code = "syntax_error" if a.error.sqlstate == "42601" else "sql_error"
        report.add(code, a.error.short())
        return None
    ids = _ids(a.rows)
    if ids is None:
        report.add("not_a_claim", f"first column is not a job id: {a.rows[:3]}")
        return None
    report.probe_claimed = ids
    if not ids:
        report.add("claims_nothing", "A's claim returned no rows")
        return None
    held = run.locked_rows()[a_id]
    id_array = "'{" + ",".join(map(str, ids)) + "}'::bigint[]"      # ids are ints
    rows = A("SELECT id, status, worker_id, claimed_at IS NOT NULL FROM job "
             f"WHERE id = ANY({id_array}) ORDER BY id", label="look").rows
    unknown = set(ids) - {r[0] for r in rows}
    if unknown or not set(ids) <= set(held):
        report.add("not_a_claim",
                   f"ids {sorted(unknown)} are not jobs" if unknown
                   else f"A returned {ids} but holds no lock on {sorted(set(ids) - set(held))}")
        return None
    _judge_claimed_rows(report, rows, ids, a_id)
    return ids


def _judge_claimed_rows(report: Report, rows: list, ids: list[int], a_id: str) -> None:
    """A's claimed rows inside its open transaction: marked IN_PROGRESS (not still PENDING,
    not DONE already), with its worker id and a claim time, and not every pending job."""
    statuses = {r[1] for r in rows}
    if statuses == {"PENDING"}:
        report.add("no_status_update", "A's claimed rows are still PENDING inside its transaction")
    elif "DONE" in statuses:
        report.add("done_at_claim", f"A's claimed rows read {sorted(statuses)}")
    elif any(r[2] is None or not r[3] for r in rows):
        report.add("no_owner", "worker_id or claimed_at is NULL on A's claimed rows")
    elif any(r[2] != a_id for r in rows):
        report.add("no_owner", "worker_id is not the worker's %(worker_id)s")
    if len(ids) == PROBE_JOBS:
        report.add("no_limit", f"A claimed all {PROBE_JOBS} pending jobs in one go")


def _probe_second_claim(report: Report, run: Sessions, A: Callable[..., Step], B: Callable[..., Step],
                        b_id: str, body: list[str], ids: list[int]) -> None:
    """B claims while A's claim of ``ids`` is still open: it waits for A (a convoy), fails
    at once (NOWAIT or another error), or gets jobs, which must not be A's."""
    b = B("; ".join(bind(s, b_id) for s in body), label="claim")
    if b.waited:
        report.probe = f"B waited for A ({b.wait_event})"
        report.add("convoy", report.probe)
        A("ROLLBACK")
        run.wait(b_id)
    elif b.error is not None:
        report.probe = f"B failed at once: {b.error.brief()}"
        if b.error.kind == "nowait":
            report.add("nowait_error_storm", report.probe)
        else:
            report.add("sql_error", b.error.short())
    else:
        got = _ids(b.rows) or []
        report.probe = f"B claimed {got} while A held {ids}"
        if set(got) & set(ids):
            report.add("double_claims", report.probe)


def _ids(rows) -> list[int] | None:
    if not rows:
        return []
    if any(not isinstance(r[0], int) or isinstance(r[0], bool) for r in rows):
        return None
    return [r[0] for r in rows]


def _plan(report: Report, lab: Lab, box: Sandbox, stmts: list[str]) -> None:

    claims.make_queue(box.lab, pending=50, done=HISTORY_ROWS)
    nodes, buffers, seq = [], 0, False
    for s in _claim_statements(stmts):
        if SETTING.match(s) or not re.search(r"\bjob\b", _code_only(s), re.I):
            continue
        wid = worker_ids(1)[0]
        try:
            p = claims.plan_of(_as_workers(box.lab, lab, [wid]), bind(s, wid), analyze=True)
        except psycopg.errors.QueryCanceled:
            report.add("too_slow", f"EXPLAIN ANALYZE of the claim was cancelled after {STEP_TIMEOUT_S:g} s")
            return
        except psycopg.OperationalError as exc:
            _still_up(lab)
            report.add("sql_error", f"the session that ran EXPLAIN was ended: {_first_line(exc)}")
            return
        except psycopg.Error as exc:
            report.add("sql_error", f"EXPLAIN failed: {exc.diag.message_primary}")
            return
        nodes += p.nodes
        buffers += p.search_buffers
        seq = seq or "Seq Scan" in p.nodes
    report.plan = nodes
    report.plan_buffers = buffers
    report.uses_index = any("Index" in n for n in nodes) and not seq
    if buffers > HISTORY_PAGES:
        report.add("scans_history", f"{buffers} pages read over {HISTORY_ROWS:,} finished jobs "
                                    f"({'seq scan' if seq else 'index walks the history'})")


# -- the run: worker processes --------------------------------------------------------------------

LOCK_KINDS = ("nowait", "lock_timeout", "deadlock", "serialization")
MARK_DONE = "UPDATE job SET status = 'DONE' WHERE id = ANY(%s)"
COUNT_PENDING = "SELECT count(*) FROM job WHERE status = 'PENDING'"
# Statements of the grader's own that a worker session runs between claims (as the server
# shows them): a wait in one of these is not a wait of the claim.
OWN_STATEMENTS = [MARK_DONE.replace("%s", "$1"), COUNT_PENDING, "COMMIT", "ROLLBACK"]


def grade_worker(ctx: Context, dsn: str, schema: str, worker_id: str, script: str, job_ms: float = 2.0,
                 pause_after: int | None = None, deadline_s: float = 30.0,
                 statement_timeout_s: float = STEP_TIMEOUT_S, check_client_ms: int | None = None,
                 user: str | None = None, password: str | None = None) -> dict:
    """Body of one graded worker process: run the reader's script, run each claimed job
    (job_ms, outside the script), mark it DONE, and report everything as events.
    ``user`` and ``password`` log in as the sandbox role the script runs as (None: the DSN's)."""

    # Killed (as one worker will be), its query does not run on without it: the server
    # checks the client's socket every check_client_ms (PostgreSQL 14 and later).  The
    # session is set up as the probe's sessions are (see _session_settings).
    conn = open_connection(dsn, schema=schema, role=worker_id, check_client_ms=check_client_ms,
                           guards=Guards(statement_timeout=f"{int(statement_timeout_s * 1000)}ms"),
                           user=user, password=password)
    try:
        _session_settings(conn)
        ctx.emit("connected", pids=[conn.info.backend_pid])
        ctx.pause("ready")                      # all workers start claiming together
        ran, errors, empties = _claim_until_done(ctx, conn, script, job_ms, pause_after, deadline_s)
        ctx.emit("end", errors=errors, empties=empties)
        return {"ran": ran, "errors": errors}
    except psycopg.OperationalError as exc:
        if not (conn.broken or conn.closed):
            raise
        ctx.emit("sql_error", sqlstate=exc.sqlstate or "", message="the worker's session was ended: "
                 + _first_line(exc))
        return {"ran": 0, "errors": 1}
    finally:
        conn.close()


def _claim_until_done(ctx: Context, conn: psycopg.Connection, script: str, job_ms: float,
                      pause_after: int | None, deadline_s: float) -> tuple[int, int, int]:
    """A graded worker's loop: claim with the script, run and mark what it claimed, until
    the queue is empty, the deadline passes or the script fails for a reason other than a
    lock.  The jobs it ran, the errors it met and the claims that came back empty."""
    ran = errors = empties = 0
    end = time.monotonic() + deadline_s
    ctx.emit("start")
    while time.monotonic() < end:
        t0 = time.monotonic()
        try:
            rows = _run_script(conn, script)
        except psycopg.Error as exc:
            errors, go_on = _after_script_error(ctx, conn, exc, errors)
            if go_on:
                continue
            break
        in_tx = conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        ids = [r[0] for r in rows or [] if isinstance(r[0], int)]
        ctx.emit("claimed", ids=ids, in_tx=in_tx, ms=(time.monotonic() - t0) * 1000, t0=t0)
        if not ids:
            if _queue_empty(conn, in_tx):
                break
            empties += 1
            time.sleep(0.005)
            continue
        ran = _run_jobs(ctx, conn, ids, in_tx, job_ms, pause_after, ran)
    return ran, errors, empties


def _run_script(conn: psycopg.Connection, script: str) -> list | None:
    """Run the reader's script once: the rows of its last statement that returns any (None:
    no statement does)."""
    cur = conn.execute(script)
    rows = None
    while True:
        if cur.description:
            rows = cur.fetchall()
        if not cur.nextset():
            break
    return rows


def _after_script_error(ctx: Context, conn: psycopg.Connection, exc: psycopg.Error,
                        errors: int) -> tuple[int, bool]:
    """The script failed: its transaction rolled back and the error counted and told.  The
    errors so far, and whether to claim again (after a lock error) or stop (the session was
    ended, or any other error)."""
    state = exc.sqlstate or ""
    kind = "serialization" if state == "40001" else classify(state, str(exc))
    if conn.broken or conn.closed:
        ctx.emit("sql_error", sqlstate=state, message="the worker's session was ended: "
                 + _first_line(exc))
        return errors, False
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        conn.execute("ROLLBACK")
    errors += 1
    if kind in LOCK_KINDS:
        if errors <= 3:
            ctx.emit("lock_error", sqlstate=state, lock=kind)
        time.sleep(0.001)
        return errors, True
    ctx.emit("sql_error", sqlstate=state, message=exc.diag.message_primary or str(exc))
    return errors, False


def _queue_empty(conn: psycopg.Connection, in_tx: bool) -> bool:
    """A claim came back empty (its transaction, if open, rolled back): whether no job is
    left pending."""
    if in_tx:
        conn.execute("ROLLBACK")
    return one_row(conn.execute(COUNT_PENDING), "the count of pending jobs")[0] == 0


def _run_jobs(ctx: Context, conn: psycopg.Connection, ids: list[int], in_tx: bool, job_ms: float,
              pause_after: int | None, ran: int) -> int:
    """Run the claimed jobs (job_ms each, pausing at the crash point) and mark them DONE,
    committing the claim's transaction if it is still open.  The jobs run so far."""
    for job_id in ids:
        time.sleep(job_ms / 1000)
        ran += 1
        ctx.emit("ran", id=job_id)
        if pause_after is not None and ran == pause_after:
            ctx.pause("crash point")
    conn.execute(MARK_DONE, (ids,))
    if in_tx:
        conn.execute("COMMIT")
    return ran


class _LockSampler(threading.Thread):
    """Labkit's own session (not the sandbox role's, which the claim could end) samples
    pg_stat_activity: which of the run's worker sessions wait for a row lock while they run
    the claim, and who holds it."""

    def __init__(self, lab: Lab, pids: list[int], holder_pid: int | None, interval: float = 0.005):
        super().__init__(daemon=True)
        self.conn = lab.connect(role="sampler")
        self.pids = pids
        self.holder_pid = holder_pid
        self.interval = interval
        self.blocked_s = 0.0
        self.samples = 0            # samples in which at least one claim waited
        self.waiters: set[int] = set()
        self.waited_on_holder = threading.Event()
        self.stop = threading.Event()
        self.error = ""

    def run(self) -> None:
        last = time.monotonic()
        while not self.stop.is_set():
            try:
                rows = self.conn.execute(
                    "SELECT pid, pg_blocking_pids(pid) FROM pg_stat_activity WHERE pid = ANY(%s) "
                    "AND wait_event_type = 'Lock' AND wait_event IN ('transactionid', 'tuple') "
                    "AND query <> ALL(%s)", (self.pids, OWN_STATEMENTS)).fetchall()
            except psycopg.Error as exc:
                self.error = _first_line(exc)
                return
            now = time.monotonic()
            self.blocked_s += len(rows) * (now - last)
            last = now
            if rows:
                self.samples += 1
                self.waiters.update(pid for pid, _ in rows)
                if self.holder_pid is not None and any(self.holder_pid in (by or []) for _, by in rows):
                    self.waited_on_holder.set()
            self.stop.wait(self.interval)

    def finish(self) -> float:
        self.stop.set()
        self.join(5)
        self.conn.close()
        return self.blocked_s * 1000


class _Holder:
    """One more session of the run, set up as a worker's, that holds the oldest pending
    job locked for a moment as the workers start, as a worker in the middle of its claim
    would: a claim that waits for it, or fails on it, shows that in the run itself."""

    def __init__(self, box: Sandbox):
        self.conn = box.lab.connect(role=worker_ids(1)[0])
        _session_settings(self.conn)
        self.pid = self.conn.info.backend_pid
        self.job: int | None = None
        self.since = 0.0

    def hold(self) -> None:
        self.conn.execute("BEGIN")
        row = self.conn.execute("SELECT id FROM job WHERE status = 'PENDING' ORDER BY created_at "
                                "LIMIT 1 FOR UPDATE SKIP LOCKED").fetchone()
        self.job = row[0] if row else None
        self.since = time.monotonic()

    def release(self) -> None:
        try:
            if not self.conn.closed and not self.conn.broken:
                self.conn.execute("ROLLBACK")
        except psycopg.Error:
            pass       # ended by the claim's SQL: its lock went with it
        self.since = 0.0

    def close(self) -> None:
        self.release()
        self.conn.close()


SHUFFLE = """
UPDATE job SET created_at = s.created_at
  FROM (SELECT a.id, b.created_at
          FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM job) a
          JOIN (SELECT created_at, row_number() OVER (ORDER BY random()) AS n FROM job) b USING (n)) s
 WHERE job.id = s.id
"""


def _fresh_shuffled(box_lab, jobs: int) -> None:
    """The run's jobs, their creation times shuffled among them: a claim that takes rows in
    the table's order takes them out of creation order, and the run sees it."""
    claims.fresh_jobs(box_lab, jobs)
    box_lab.execute(SHUFFLE)
    box_lab.execute("ANALYZE job")


def _run(report: Report, lab: Lab, box: Sandbox, stmts: list[str], workers: int, jobs: int, job_ms: float,
         crash_after: int = 3) -> None:
    """``lab`` is labkit's own view of the lab (it watches pg_stat_activity); the jobs are
    made, claimed and counted through the sandbox ``box``."""

    if not _stage(report, box, 2 * STEP_TIMEOUT_S, _fresh_shuffled, box.lab, jobs):
        return
    ws: list[Worker] = []
    sampler = holder = None
    t0 = time.monotonic()
    timed_out = False
    victim = None
    try:
        _start_workers(ws, lab, box, "; ".join(stmts), workers, job_ms, crash_after)
        pids = [p for w in ws for e in w.events if e["kind"] == "connected" for p in e["pids"]]
        holder = _Holder(box)
        holder.hold()
        sampler = _LockSampler(lab, pids, holder.pid)
        sampler.start()
        for w in ws:
            w.resume()
        victim, timed_out = _until_workers_end(lab, ws, holder, sampler)
        report.killed = (f"{victim.name} (SIGKILL after its job #{crash_after} ran, before it was marked)"
                         if victim else f"nobody (no worker ran {crash_after} jobs)")
    finally:
        for w in ws:
            w.kill()
        if holder is not None:
            holder.close()
        if sampler is not None:
            report.blocked_ms = round(sampler.finish(), 1)
    report.run_seconds = round(time.monotonic() - t0, 2)
    _judge_run(report, sampler, timed_out, victim)
    # Counted through labkit's own session: the claim's SQL may have ended the role's.
    _stage(report, box, 2 * STEP_TIMEOUT_S, _tally, report, lab, ws,
           holder.job if holder is not None else None)


def _start_workers(ws: list[Worker], lab: Lab, box: Sandbox, script: str, workers: int, job_ms: float,
                   crash_after: int) -> None:
    """Start the run's worker processes, each added to ``ws`` as it starts (so that all that
    started are stopped, whatever happens), and wait until every one is ready to claim."""
    check_client_ms = lab.db.check_client_ms
    for wid in worker_ids(workers):
        ws.append(Worker("labkit.tools.grade:grade_worker", name=wid, dsn=lab.db.dsn, schema=lab.schema,
                         worker_id=wid, script=bind(script, wid), job_ms=job_ms,
                         pause_after=crash_after, deadline_s=min(30.0, RUN_TIMEOUT_S),
                         statement_timeout_s=STEP_TIMEOUT_S, check_client_ms=check_client_ms,
                         **box.worker_kwargs()).start())
    for w in ws:
        w.wait_for("paused", tag="ready", timeout=60)


def _until_workers_end(lab: Lab, ws: list[Worker], holder: _Holder,
                       sampler: _LockSampler) -> tuple[Worker | None, bool]:
    """Watch the run until every worker has ended or RUN_TIMEOUT_S has passed, releasing
    the holder's job when it has done its part.  Every worker stops after its third job;
    the first to get there is killed, the others go on.  The worker killed (None: nobody
    got there), and whether the run timed out."""
    stopped: set[str] = set()
    victim = None
    deadline = time.monotonic() + RUN_TIMEOUT_S
    next_look = 0.0
    while any(w.alive for w in ws):
        now = time.monotonic()
        if now > deadline:
            return victim, True
        if holder.since and (sampler.waited_on_holder.is_set() or now - holder.since > HOLD_S
                             or (now > next_look and _only_held_left(lab, holder))):
            holder.release()
        if now > next_look:
            next_look = now + 0.02
        victim = _crash_the_first(lab, ws, stopped, victim)
    return victim, False


def _crash_the_first(lab: Lab, ws: list[Worker], stopped: set[str], victim: Worker | None) -> Worker | None:
    """Each worker newly paused at its crash point (``stopped``: those already seen there):
    the first of all is killed, the others resume.  The worker killed, if any yet."""
    for w in ws:
        w.poll(0.002)
        if w.name in stopped or not any(e["kind"] == "paused" and e.get("tag") == "crash point"
                                        for e in w.events):
            continue
        stopped.add(w.name)
        if victim is None:
            victim = w
            w.kill()
            claims.backend_gone(lab, w)
        else:
            w.resume()
    return victim


def _judge_run(report: Report, sampler: _LockSampler | None, timed_out: bool, victim: Worker | None) -> None:
    """What the run itself showed: claims that waited for a row lock, a run that did not
    end in time, a crash that was never tested."""
    report.claim_waits = len(sampler.waiters) if sampler else None
    if sampler and sampler.waiters:
        report.add("convoy", f"{len(sampler.waiters)} worker(s) of the run waited for a row lock in the "
                             f"claim ({report.blocked_ms} ms in all)"
                             + (", one of them behind a claim held open by another session"
                                if sampler.waited_on_holder.is_set() else ""))
    if timed_out:
        report.add("too_slow", f"the workers were still running after {RUN_TIMEOUT_S:g} s and were stopped")
    if victim is None:
        report.add("crash_not_tested", report.killed)


def _only_held_left(lab: Lab, holder: _Holder) -> bool:
    """Whether the job the holder holds is the last one pending (the workers have nothing
    else to claim, so holding it longer measures nothing more)."""
    return lab.execute(COUNT_PENDING)[0][0] <= (1 if holder.job is not None else 0)


def out_of_order(claims_seen: dict[int, tuple[float, float]], created: dict[int, Any]) -> int:
    """Jobs claimed before an older job whose claim only began after theirs had ended:
    ``claims_seen`` maps each job to (start, end) of the first claim that returned it."""
    order = sorted(claims_seen, key=lambda i: created[i])
    latest_start = float("-inf")
    count = 0
    for job in order:                    # oldest first, with the latest start of an older job's claim
        start, end = claims_seen[job]
        if latest_start > end:
            count += 1
        latest_start = max(latest_start, start)
    return count


@dataclass
class _RunEvents:
    """What the run's workers told, counted: who claimed each job and when, the first claim
    of each job (start, end), how often each job ran, lock errors, NOWAIT errors, whether
    the work ran inside the claim's transaction, and the most jobs one claim returned."""

    claimed_by: dict[int, set] = field(default_factory=dict)
    first: dict[int, tuple[float, float]] = field(default_factory=dict)
    runs: dict[int, int] = field(default_factory=dict)
    lock_errors: int = 0
    nowaits: int = 0
    in_tx: bool = False
    biggest: int = 0

    def count(self, report: Report, w) -> None:
        """Count one worker's events; an SQL error it told is a problem of the report."""
        for e in w.events:
            if e["kind"] == "claimed":
                self._claimed(w.name, e)
            elif e["kind"] == "ran":
                self.runs[e["id"]] = self.runs.get(e["id"], 0) + 1
            elif e["kind"] == "end":
                self.lock_errors += e["errors"]
            elif e["kind"] == "lock_error":
                self.nowaits += e.get("sqlstate") == "55P03"
            elif e["kind"] == "sql_error":
                report.add("sql_error", f"{e['sqlstate']} {e['message']}".strip())
        if not any(e["kind"] == "end" for e in w.events):
            self.lock_errors += sum(1 for e in w.events if e["kind"] == "lock_error")

    def _claimed(self, name: str, e: dict) -> None:
        """One claim of a worker: who got each job, and the span of each job's first claim."""
        self.in_tx = self.in_tx or e["in_tx"]
        self.biggest = max(self.biggest, len(e["ids"]))
        for i in e["ids"]:
            self.claimed_by.setdefault(i, set()).add((name, e["t"]))
            span = (e.get("t0", e["t"] - e["ms"] / 1000), e["t"])
            if i not in self.first or span[1] < self.first[i][1]:
                self.first[i] = span


def _tally(report: Report, lab: Lab, ws, held: int | None = None) -> None:
    """Count what the run did, from the workers' events and the job table as it was left,
    and diagnose it (``held``: the job the holder held, left out of the order count)."""
    seen = _RunEvents()
    for w in ws:
        seen.count(report, w)
    report.work_inside_claim = seen.in_tx
    report.lock_errors = seen.lock_errors
    report.double_claims = sum(1 for v in seen.claimed_by.values() if len(v) > 1)
    report.duplicate_runs = sum(1 for n in seen.runs.values() if n > 1)
    _count_jobs(report, lab, seen, held)
    _diagnose_run(report, seen)


def _count_jobs(report: Report, lab: Lab, seen: _RunEvents, held: int | None) -> None:
    """What the job table says after the run: jobs stuck IN_PROGRESS (and how many of them
    a reaper can recover), left PENDING, lost, and claimed before an older one."""
    rows = lab.execute("SELECT id, status, worker_id IS NOT NULL AND claimed_at IS NOT NULL, created_at FROM job")
    created = {i: c for i, _, _, c in rows}
    report.stuck_jobs = sum(1 for _, s, _, _ in rows if s == "IN_PROGRESS")
    report.stuck_recoverable = sum(1 for _, s, owned, _ in rows if s == "IN_PROGRESS" and owned)
    report.unclaimed_jobs = sum(1 for _, s, _, _ in rows if s == "PENDING")
    report.lost_jobs = sum(1 for i, s, owned, _ in rows
                           if (s == "DONE" and i not in seen.runs) or (s == "IN_PROGRESS" and not owned))
    first = {i: span for i, span in seen.first.items() if i in created and i != held}
    report.out_of_order = out_of_order(first, created)


def _diagnose_run(report: Report, seen: _RunEvents) -> None:
    """The problems the run's counts show, in the order they are told: what the claim does
    (hoarding, NOWAIT errors, work inside the claim), then the measured harm that no
    diagnosis explains."""
    # A claim of the graded run that took more jobs at once than the probe's claim did, and
    # more than one worker's share of the run, behaved otherwise when it was not probed (the
    # SQL may tell the two apart): it hoards the queue, whatever the probe saw.
    probed = len(report.probe_claimed or [])
    share = max(1, report.jobs // max(1, report.workers))
    _add_broken(report, [
        (probed and seen.biggest > max(probed, share) and "no_limit" not in report.codes, "no_limit",
         f"in the run, one claim took {seen.biggest} of the {report.jobs} jobs at once, "
         f"where the probe's claim took {probed}"),
        (seen.nowaits, "nowait_error_storm", f"claims of the run failed with ERROR 55P03 "
                                             f"({report.lock_errors} lock error(s) in all)"),
        (seen.in_tx, "work_inside_claim", f"{report.duplicate_runs} job(s) ran twice after the crash"),
    ])
    # Measured harm that no diagnosis above explains still fails the claim.
    explained = {"no_status_update", "work_inside_claim", "no_owner", "done_at_claim", "no_limit"}
    unexplained = not explained & set(report.codes)
    _add_broken(report, [
        (report.double_claims and unexplained, "double_claims", f"{report.double_claims} job(s) handed out twice"),
        (report.lost_jobs and unexplained, "lost_jobs", f"{report.lost_jobs} job(s)"),
        (report.unclaimed_jobs and unexplained and report.stuck_jobs == report.stuck_recoverable, "stalled",
         f"{report.unclaimed_jobs} job(s) still PENDING at the end"),
        (report.out_of_order and unexplained, "no_order_by",
         f"in the run, {report.out_of_order} job(s) were claimed before an older "
         "job whose claim began only after theirs had ended"),
    ])


def _add_broken(report: Report, rules: list[tuple[object, str, str]]) -> None:
    """Add the problem of each (condition, code, evidence) rule whose condition holds, in order."""
    for failed, code, evidence in rules:
        if failed:
            report.add(code, evidence)


# -- the entry points ---------------------------------------------------------------------------

def _stage(report: Report, box: Sandbox, seconds: float, fn, *args):
    """Run one stage under a deadline.  False when the stage says the claim cannot go
    further, when it was cancelled (a ``too_slow`` problem, replacing what the cancelled
    stage had found) or when the claim's SQL broke the lab so that it could not go on."""
    before = len(report.problems)
    with box.deadline(seconds) as clock:
        try:
            result = fn(*args) is not False
        except psycopg.errors.QueryCanceled:
            clock.fired, result = True, False
        except psycopg.OperationalError:
            raise
        except ServerError as exc:
            # A session the grader opened as the sandbox role was ended: by the claim's SQL
            # (it may end sessions of its own role) if labkit's own session still gets in.
            try:
                _still_up(box.base)
            except Exception:
                raise exc from None
            report.add("sql_error", "a session the grader ran as the claim's role was ended "
                                    "(pg_terminate_backend in the claim?)")
            result = False
        except psycopg.Error as exc:
            report.add("sql_error", f"after the claim ran, the grader's own SQL failed: "
                                    f"{exc.diag.message_primary or exc}")
            result = False
    if clock.fired:
        del report.problems[before:]
        report.add("too_slow", f"a stage of the grading was cancelled after {seconds:g} s")
        return False
    return result


def check_settings(workers: int | float, jobs: int | float, job_ms: int | float) -> None:
    """The grader's numbers, or a one-paragraph error naming the allowed range."""
    check_number("workers", workers, low=2, high=MAX_WORKERS, integer=True,
                 fix=f"pass 2 to {MAX_WORKERS} workers (one is killed; the default is 4).")
    check_number("jobs", jobs, low=1, high=MAX_JOBS, integer=True,
                 fix=f"pass up to {MAX_JOBS:,} jobs (the default, 120, is plenty).")
    if jobs < 4 * workers:
        raise LabkitError(f"{jobs} jobs are too few for {workers} workers.",
                          f"pass jobs={4 * workers} or more.")
    check_number("job_ms", job_ms, low=0, high=MAX_JOB_MS,
                 fix=f"pass a job time from 0 to {MAX_JOB_MS:,} ms (the default is 2).")


def grade_claim(sql_or_path: str | Path, *, workers: int | float = 4, jobs: int | float = 120, job_ms: float = 2.0,
                db: Database | None = None, name: str | None = None, run: bool = True) -> Report:
    """Grade a claim given as SQL text or as a path to a .sql file."""
    if isinstance(workers, int) and not isinstance(workers, bool) and workers < 2:
        raise LabkitError(f"The grader needs at least 2 workers (one is killed), not {workers}.",
                          "pass workers=2 or more.")
    check_settings(workers, jobs, job_ms)
    workers, jobs = int(workers), int(jobs)
    text, label = _load(sql_or_path, name)
    report = Report(file=label, workers=workers, jobs=jobs)
    stmts, no_order = _read(report, text)
    if stmts is None:
        return _verdict(report)
    db = db or connect(quiet=True)
    lab = Lab.open(db, f"grade_{os.getpid()}_{next(_counter)}")
    try:
        # The claim's SQL runs as a role of its own (probe sessions, EXPLAIN, workers);
        # ``lab`` itself only watches (the probe's monitor, the sampler) and cleans up.
        with Sandbox(lab, connections=workers + 8, statement_timeout_s=STEP_TIMEOUT_S) as box:
            report.sandbox = box.note
            if (_stage(report, box, STEP_TIMEOUT_S + 3, _probe, report, lab, box, stmts, no_order)
                    and not {"syntax_error", "sql_error"} & set(report.codes)):
                _stage(report, box, 2 * STEP_TIMEOUT_S + 5, _plan, report, lab, box, stmts)
                if run and not {"sql_error", "too_slow"} & set(report.codes):
                    _run(report, lab, box, stmts, workers, jobs, job_ms)
    finally:
        lab.drop()
    return _verdict(report)


def _load(sql_or_path, name):
    if isinstance(sql_or_path, Path) or (isinstance(sql_or_path, str) and sql_or_path.endswith(".sql")
                                         and "\n" not in sql_or_path):
        path = Path(sql_or_path)
        text = read_input(path, what="SQL file", max_bytes=MAX_SQL_BYTES,
                          fix="give the path of a .sql file holding your claim.")
        return text, name or path.name
    text = str(sql_or_path)
    if len(text.encode()) > MAX_SQL_BYTES or "\x00" in text:
        raise LabkitError(f"The claim is {len(text.encode()):,} bytes" + (" and holds a NUL byte"
                          if "\x00" in text else "") + f"; a claim is text of at most {MAX_SQL_BYTES:,}.",
                          "pass the claim itself: one statement or a short script.")
    return text, name or "your claim"


def _verdict(report: Report) -> Report:
    report.verdict = "fail" if report.problems else "pass"
    return report


def grade_command(*, file: str, json: bool, workers: int | float, jobs: int | float,
                  job_ms: int | float) -> int:
    """``labkit grade claim FILE.sql [--json] [--workers N] [--jobs M] [--job-ms MS]``: exit 1
    when the claim fails."""
    report = grade_claim(Path(file), workers=workers, jobs=jobs, job_ms=job_ms)
    print(report.to_json() if json else report.to_text())
    return 0 if report.verdict == "pass" else 1
