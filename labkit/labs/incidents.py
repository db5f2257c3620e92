"""The incident file: ten outages that users of PostgreSQL job queues reported, rebuilt small.

Each incident is a scene (a table or two in a lab schema of its own), a few sessions played in
a fixed order, and one invariant -- the promise the queue broke -- read back from the server
after the run.  :func:`run` plays an incident the way it broke (``fixed=False``) or with the fix
(``fixed=True``) and says whether the invariant held; nothing is decided by a ``sleep()``: the
order of the steps is the script's, and a step that waits is seen waiting by the server
(``pg_blocking_pids``), as everywhere in the workbook.

The reports come from the public trackers of the libraries named in :data:`INCIDENTS` (each
``source`` is a thread, ``owner/repo#number``); the words here are the workbook's own.  Two of
the scenes arrange a moment the report describes instead of waiting for it: the reaper's
"forty seconds later" is a time passed to the query (``at``), and a worker's crash is its
session ending.  The rest is what the server does with the statements as they stand.

The SQL is ``labkit/sql/incidents.sql``, one named query per step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg

from ..core.errors import LabkitError
from ..core.lab import Lab
from ..core.queries import queries, query
from ..core.results import Result, not_json
from ..core.sessions import Sessions
from ..core.text import fill
from ..core.transcript import Transcript

SQL_FILE = "incidents.sql"


def q(name: str) -> str:
    """The SQL of the named query ``name`` of incidents.sql, comments kept (one statement or
    several: the sessions send it as it is)."""
    return query(SQL_FILE, name).text


@dataclass(frozen=True)
class Incident:
    """One incident of the file: what a user reported, and the promise it broke.

    name: the incident's short name (``labkit incident run NAME``)
    title: what happened, in a line
    section: where in a job's life it happened (enqueue, claim, run, finish, watch, recover)
    source: the public thread it comes from, ``owner/repo#number``
    also: other threads that report the same thing
    invariant: the promise, as the run checks it
    """

    name: str
    title: str
    section: str
    source: str
    also: tuple[str, ...]
    invariant: str


class Readings(dict):
    """What an incident's run read back from the server, by name: ``run.observed.b_claimed``.
    Each incident reads its own things, so this is a mapping (its ``--json`` is an object) that
    is also read by attribute; a misspelt name is an AttributeError listing the names there are,
    and nothing may be changed."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"this run read back no {name!r}; it has "
                                 f"{', '.join(self) or 'nothing'}") from None

    def _frozen(self, *args: Any, **kw: Any) -> None:
        raise TypeError("an incident's readings are what the server showed: they cannot be changed")

    __setattr__ = __setitem__ = __delitem__ = update = pop = clear = setdefault = _frozen


@dataclass(frozen=True)
class IncidentRun(Result):
    """One incident played, broken or fixed (:func:`run`).

    name: the incident
    fixed: played with the fix
    invariant: the promise checked
    invariant_holds: whether the server's state after the run kept it
    observed: what the run read back from the server (counts, the error a step got...), by
        name (:class:`Readings`)
    took_s: wall-clock seconds the run took, set-up included
    transcript: the sessions' steps, in order (None for an incident without sessions)
    """

    name: str
    fixed: bool
    invariant: str
    invariant_holds: bool
    observed: Readings
    took_s: float
    transcript: Transcript | None = not_json()


@dataclass
class _Outcome:
    holds: bool
    observed: dict[str, Any]
    transcript: Transcript | None = None


class _Script:
    """The SQL an incident runs, by the name of its query in incidents.sql; ``using`` puts
    the caller's SQL in place of some (an exercise's checker plays the learner's fix so)."""

    def __init__(self, using: dict[str, str] | None = None) -> None:
        self.using = dict(using or {})

    def __call__(self, name: str) -> str:
        return self.using.get(name) or q(name)

    def label(self, name: str, label: str) -> str:
        """``label`` for the step that runs query ``name``; "your statement" for the caller's."""
        return "your statement" if name in self.using else label


def settled(run: Sessions, *names: str) -> None:
    """Wait until each of ``names`` has no step waiting (a step of the caller's SQL may wait
    for a lock, or be chosen as a deadlock's victim): the script never commits a session
    whose statement is still running."""
    for name in names:
        if run.sessions[name].pending is not None:
            run.wait(name)


def _bind(lab: Lab, text: str, params: dict[str, Any]) -> str:
    """``text`` with ``params`` written in as literals (a session sends text)."""
    return psycopg.ClientCursor(lab.admin).mogrify(text, params)


def _scene(lab: Lab, name: str) -> None:
    lab.reset()
    lab.execute(q(f"{name}_scene"))


def _count(lab: Lab, sql_text: str) -> int:
    return int(lab.execute(sql_text)[0][0])


# -- enqueue --------------------------------------------------------------------------------------
def _unique_enqueue(lab: Lab, fixed: bool, sql: _Script) -> _Outcome:
    """Two web requests enqueue the same report at once.  Broken: each checks for a live job
    with the key, sees none (the other's insert is not committed), and inserts.  Fixed: a
    partial unique index; the second insert waits for the first transaction and, once it
    commits, ON CONFLICT DO NOTHING makes it a no-op."""
    _scene(lab, "unique_enqueue")
    if fixed:
        lab.execute(sql("unique_enqueue_index"))
    with Sessions(lab, "A", "B") as run:
        run.A("BEGIN")
        run.B("BEGIN")
        if fixed:
            label = sql.label("unique_enqueue_upsert", "INSERT ON CONFLICT")
            run.A(sql("unique_enqueue_upsert"), label=label)
            run.B(sql("unique_enqueue_upsert"), label=label)
        else:
            run.A(sql("unique_enqueue_check"), label="count 'report:42'")
            run.B(sql("unique_enqueue_check"), label="count 'report:42'")
            run.A(sql("unique_enqueue_insert"), label="INSERT 'report:42'")
            run.B(sql("unique_enqueue_insert"), label="INSERT 'report:42'")
        settled(run, "A")
        run.A("COMMIT")
        settled(run, "B")
        run.B("COMMIT")
        transcript = run.transcript()
    live = _count(lab, "SELECT count(*) FROM job WHERE unique_key = 'report:42' "
                       "AND status IN ('PENDING', 'RUNNING')")
    return _Outcome(live == 1, {"live_jobs_with_the_key": live}, transcript)


def _enqueue_outside(lab: Lab, fixed: bool, sql: _Script) -> _Outcome:
    """The web app writes an order and enqueues the job that ships it.  Broken: the job is
    inserted on another connection (the queue's own pool), so it is committed before the
    order is; a worker claims it and finds no order; and when the order's transaction rolls
    back, the job stays.  Fixed: the job is inserted in the order's transaction, so the
    worker sees both or neither."""
    _scene(lab, "enqueue")
    with Sessions(lab, "web", "queue", "worker") as run:
        run.web("BEGIN")
        run.web(sql("enqueue_order"), label="INSERT order 7")
        if fixed:
            run.web(sql("enqueue_job"), label="INSERT job, order 7")
        else:
            run.queue(sql("enqueue_job"), label="INSERT job, order 7")
        early = run.worker(sql("enqueue_work"), label="claim, read order")
        run.web("ROLLBACK")
        run.worker(sql("enqueue_left"), label="jobs left")
        transcript = run.transcript()
    claimed = [r[0] for r in early.rows]
    without_order = sum(1 for line in claimed if line.endswith("no such order"))
    orphans = _count(lab, "SELECT count(*) FROM job j WHERE NOT EXISTS "
                          "(SELECT 1 FROM shop_order o WHERE o.id = j.order_id)")
    return _Outcome(without_order == 0 and orphans == 0,
                    {"jobs_claimed": len(claimed), "claimed_without_their_order": without_order,
                     "jobs_left_for_a_rolled_back_order": orphans}, transcript)


# -- claim ----------------------------------------------------------------------------------------
def _frozen_now(lab: Lab, fixed: bool, sql: _Script) -> _Outcome:
    """A poller keeps one transaction open and asks, again and again, what is due ``now()``.
    ``now()`` is the time its transaction started: a job that fell due after that is never
    due to it.  Fixed: ``statement_timestamp()``, the start of the poll's own statement."""
    _scene(lab, "frozen_now")
    poll = "frozen_now_poll_fixed" if fixed else "frozen_now_poll_broken"
    label = "due <= " + ("statement_timestamp()" if fixed else "now()")
    with Sessions(lab, "poller", "app") as run:
        run.poller("BEGIN")
        run.poller(sql(poll), label=label)
        run.app(sql("frozen_now_enqueue"), label="INSERT job due at once")
        seen = [run.poller(sql(poll), label=label).rows[0][0] for _ in range(3)]
        run.poller("COMMIT")
        transcript = run.transcript()
    return _Outcome(all(n == 1 for n in seen), {"due_jobs": 1, "due_jobs_the_polls_saw": seen},
                    transcript)


def _key_share(lab: Lab, fixed: bool, sql: _Script) -> _Outcome:
    """The web app writes a log line for job 1 in a transaction that is still open; the
    log's foreign key has locked job 1 FOR KEY SHARE.  Broken: the claim locks the job FOR
    UPDATE NOWAIT, which conflicts with KEY SHARE: 55P03, the job is not claimed (without
    NOWAIT it would wait for the web app).  Fixed: FOR NO KEY UPDATE, the lock an UPDATE
    that keeps the key takes anyway, does not conflict with KEY SHARE."""
    _scene(lab, "key_share")
    claim = "key_share_claim_fixed" if fixed else "key_share_claim_broken"
    lock = "FOR NO KEY UPDATE NOWAIT" if fixed else "claim FOR UPDATE NOWAIT"
    with Sessions(lab, "web", "worker") as run:
        run.web("BEGIN")
        run.web(sql("key_share_log"), label="INSERT job_log, job 1")
        run.worker("BEGIN")
        got = run.worker(sql(claim), label=lock)
        run.worker("ROLLBACK")
        run.web("COMMIT")
        transcript = run.transcript()
    return _Outcome(got.error is None and got.rows == [(1,)],
                    {"claimed": [r[0] for r in got.rows],
                     "error": got.error.sqlstate if got.error else None}, transcript)


def _repeatable_read(lab: Lab, fixed: bool, sql: _Script) -> _Outcome:
    """Two workers claim with the workbook's own claim, but their transactions run under
    REPEATABLE READ.  B's snapshot is taken before A's claim commits; B's claim then meets
    job 1, changed by a transaction its snapshot does not see, and fails with 40001.
    Fixed: READ COMMITTED, where the row is read again at its newest version and skipped."""
    _scene(lab, "repeatable_read")
    level = "READ COMMITTED" if fixed else "REPEATABLE READ"
    with Sessions(lab, "A", "B") as run:
        run.A(f"BEGIN ISOLATION LEVEL {level}", label=f"BEGIN {level}")
        run.B(f"BEGIN ISOLATION LEVEL {level}", label=f"BEGIN {level}")
        run.B("SELECT count(*) AS pending FROM job WHERE status = 'PENDING'", label="read the queue")
        a = run.A(sql("repeatable_read_claim"), label="claim, SKIP LOCKED")
        run.A("COMMIT")
        b = run.B(sql("repeatable_read_claim"), label="claim, SKIP LOCKED")
        run.B("ROLLBACK" if b.error else "COMMIT")
        transcript = run.transcript()
    return _Outcome(b.error is None and len(b.rows) == 1,
                    {"a_claimed": [r[0] for r in a.rows], "b_claimed": [r[0] for r in b.rows],
                     "b_error": b.error.sqlstate if b.error else None}, transcript)


def _try_lock_leak(lab: Lab, fixed: bool, sql: _Script) -> _Outcome:
    """The claim takes a session advisory lock in its WHERE clause and sorts by ``run_at``,
    which has no index.  The filter runs in the scan, below the sort and the LIMIT: it locks
    every pending job, and returns one.  The worker unlocks the one it ran; the others stay
    locked for as long as its connection lives, and a second worker finds nothing to claim.
    Fixed: FOR UPDATE SKIP LOCKED, which locks the row it returns and no other."""
    _scene(lab, "try_lock")
    claim = "try_lock_claim_fixed" if fixed else "try_lock_claim_broken"
    label = "claim, SKIP LOCKED" if fixed else "claim by try-lock"
    with Sessions(lab, "A", "B") as run:
        run.A("BEGIN")
        a = run.A(sql(claim), label=label)
        held = run.A(sql("try_lock_held"), label="advisory locks held")
        b = run.B(sql(claim), label=label)
        run.A("COMMIT")
        transcript = run.transcript()
    pending = _count(lab, "SELECT count(*) FROM job")
    return _Outcome(len(b.rows) == 1,
                    {"pending_jobs": pending, "a_claimed": [r[0] for r in a.rows],
                     "a_advisory_locks": held.rows[0][0], "b_claimed": [r[0] for r in b.rows]},
                    transcript)


# -- run and finish -------------------------------------------------------------------------------
def _hot_row(lab: Lab, fixed: bool, sql: _Script) -> _Outcome:
    """Each worker claims a job and, in the same transaction, updates the queue's statistics:
    one row that every worker writes.  The first worker's transaction lasts as long as its
    job; the second worker's bookkeeping waits for it, so at most one job runs at a time
    whatever the number of workers.  Fixed: a row per worker."""
    _scene(lab, "hot_row")
    book = "hot_row_bookkeeping_fixed" if fixed else "hot_row_bookkeeping_broken"
    label = "UPDATE own worker row" if fixed else "UPDATE queue_stats"
    with Sessions(lab, "A", "B") as run:
        for w in ("A", "B"):
            run.step(w, "BEGIN")
            run.step(w, sql("hot_row_claim"), label="claim, SKIP LOCKED")
            run.step(w, _bind(lab, sql(book), {"worker": w}), label=label)
        last = run.steps[-1]
        b_waited, wait_event = last.waited, last.wait_event
        run.A("COMMIT")
        run.wait("B")
        run.B("COMMIT")
        transcript = run.transcript()
    return _Outcome(not b_waited, {"b_waited_for_a": b_waited, "b_wait_event": wait_event}, transcript)


def _batch_callback(lab: Lab, fixed: bool, sql: _Script) -> _Outcome:
    """The last two jobs of a batch finish at the same moment, and the batch's "all done"
    callback must fire once.  Broken: each worker commits its job, then asks whether any job
    of the batch is left; both ask after both commits, both see none, both fire.  Fixed: each
    worker decrements the batch's counter in its job's transaction; the row lock makes the
    second wait for the first, and only the one that brings it to 0 fires."""
    _scene(lab, "batch")
    with Sessions(lab, "A", "B") as run:
        run.A("BEGIN")
        run.B("BEGIN")
        run.A(_bind(lab, sql("batch_finish"), {"job": 1}), label="job 1 DONE")
        run.B(_bind(lab, sql("batch_finish"), {"job": 2}), label="job 2 DONE")
        if fixed:
            label = sql.label("batch_count_fixed", "remaining - 1, fire at 0")
            run.A(_bind(lab, sql("batch_count_fixed"), {"worker": "A"}), label=label)
            run.B(_bind(lab, sql("batch_count_fixed"), {"worker": "B"}), label=label)
            settled(run, "A")
            run.A("COMMIT")
            settled(run, "B")
            run.B("COMMIT")
        else:
            run.A("COMMIT")
            run.B("COMMIT")
            run.A(_bind(lab, sql("batch_check_broken"), {"worker": "A"}), label="none left? fire")
            run.B(_bind(lab, sql("batch_check_broken"), {"worker": "B"}), label="none left? fire")
        transcript = run.transcript()
    fired = [r[0] for r in lab.execute("SELECT fired_by FROM callback_log ORDER BY fired_by")]
    return _Outcome(len(fired) == 1, {"callbacks_fired": len(fired), "fired_by": fired}, transcript)


# -- watch and recover ----------------------------------------------------------------------------
HISTORY = (20_000, 200_000)   # finished jobs in the table, before and after it grew
PENDING = 50


def _buffers(lab: Lab) -> tuple[int, str]:
    """Buffers the monitoring query touches, and the plan's top scan node."""
    plan = lab.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query(SQL_FILE, "history_monitor").sql)
    top = plan[0][0][0]["Plan"]
    node = top
    while node.get("Plans"):
        node = node["Plans"][0]
    return int(top.get("Shared Hit Blocks", 0)) + int(top.get("Shared Read Blocks", 0)), node["Node Type"]


def _history_count(lab: Lab, fixed: bool, sql: _Script) -> _Outcome:
    """A dashboard counts the pending jobs every few seconds.  Broken: the job table keeps
    its finished jobs and has no index for the question, so the count reads the whole
    table, and its cost grows with history the queue no longer needs.  Fixed: a partial
    index over the pending jobs, which the count reads alone (an index-only scan once
    VACUUM has marked the pages all-visible)."""
    _scene(lab, "history")
    if fixed:
        lab.execute(sql("history_index"))
    touched, scans = [], []
    done_before = 0
    for done in HISTORY:
        lab.execute(sql("history_add"), {"pending": PENDING if not done_before else 0,
                                       "done": done - done_before})
        done_before = done
        lab.execute("VACUUM (ANALYZE) job")
        n, scan = _buffers(lab)
        touched.append(n)
        scans.append(scan)
    growth = touched[1] / max(1, touched[0])
    return _Outcome(growth < 2, {"finished_jobs": list(HISTORY), "buffers_per_count": touched,
                                 "scan": scans[-1], "growth": round(growth, 2)})


REAPER_AT = {"claimed": 0, "restarted": 35, "reaper": 40}   # seconds after the claim


def _reaper_worker_id(lab: Lab, fixed: bool, sql: _Script) -> _Outcome:
    """The reaper frees the jobs of workers that stopped heartbeating.  The pod "pod-a"
    claims job 1 and dies; Kubernetes restarts it under the same name, and the new process
    heartbeats, knowing of no job.  Broken: to the reaper, pod-a is alive, so job 1 stays
    RUNNING for ever.  Fixed: the claim itself carries a lease; the reaper frees a job whose
    lease ran out, whoever held it.  (The times are passed in: the reaper looks as it would
    forty seconds after the claim.)"""
    _scene(lab, "reaper")
    base = lab.execute("SELECT now()")[0][0]

    def at(what: str) -> dict[str, Any]:
        return {"at": base + timedelta(seconds=REAPER_AT[what])}

    for statement in query(SQL_FILE, "reaper_claim").statements:
        lab.execute(statement, at("claimed"))
    lab.execute(sql("reaper_heartbeat"), at("restarted"))
    freed = lab.execute(sql("reaper_fixed" if fixed else "reaper_broken"), at("reaper"))
    status = lab.execute("SELECT status FROM job WHERE id = 1")[0][0]
    return _Outcome(status == "PENDING", {"jobs_freed": [r[0] for r in freed], "job_1_status": status})


# -- the file -------------------------------------------------------------------------------------
INCIDENTS: dict[str, tuple[Incident, Callable[[Lab, bool, _Script], _Outcome]]] = {}


def _add(fn: Callable[[Lab, bool, _Script], _Outcome], **kw: Any) -> None:
    incident = Incident(also=tuple(kw.pop("also", ())), **kw)
    INCIDENTS[incident.name] = (incident, fn)


_add(_unique_enqueue, name="unique-enqueue", section="enqueue",
     title="check-then-insert lets the same unique job in twice",
     source="oban-bg/oban#122", also=("riverqueue/river#451",),
     invariant="at most one live job per unique key")
_add(_enqueue_outside, name="enqueue-outside", section="enqueue",
     title="a job enqueued on another connection runs before its data commits, and outlives a rollback",
     source="timgit/pg-boss#199", also=("timgit/pg-boss#341", "rails/solid_queue#409"),
     invariant="every job a worker claims finds its order, and no job is left for an order that never was")
_add(_frozen_now, name="frozen-now", section="claim",
     title="now() is the transaction's start: a long-lived poller never sees a job fall due",
     source="riverqueue/river#614", also=("que-rb/que#409",),
     invariant="a job that is due is seen by the next poll")
_add(_key_share, name="key-share", section="claim",
     title="a child row's foreign key locks the job FOR KEY SHARE, and the FOR UPDATE claim fails",
     source="odoo/odoo#64424", also=("OCA/queue#873",),
     invariant="a pending job is claimed while its log lines are being written")
_add(_repeatable_read, name="repeatable-read", section="claim",
     title="the claim under REPEATABLE READ fails with 40001 when another worker claimed first",
     source="oban-bg/oban#1132", also=("hangfire-postgres/Hangfire.PostgreSql#169",),
     invariant="a worker's claim gets a job while pending jobs are left")
_add(_try_lock_leak, name="try-lock-leak", section="claim",
     title="pg_try_advisory_lock() in the WHERE clause locks every row it looks at, not the one returned",
     source="que-rb/que#298", also=("bensheldon/good_job#1735", "bensheldon/good_job#179"),
     invariant="a second worker gets a job while pending jobs are left")
_add(_hot_row, name="hot-row", section="run",
     title="every worker updates one bookkeeping row, and its lock lets one job run at a time",
     source="rails/solid_queue#630",
     invariant="one worker's bookkeeping never waits for another worker's job")
_add(_batch_callback, name="batch-callback", section="finish",
     title="a batch's \"all done\" callback fires twice when its last two jobs finish together",
     source="bensheldon/good_job#832", also=("rails/solid_queue#142",),
     invariant="the batch's callback fires exactly once")
_add(_history_count, name="history-count", section="watch",
     title="the dashboard's count(*) reads every finished job the table keeps",
     source="bensheldon/good_job#1758", also=("riverqueue/riverui#106", "timgit/pg-boss#228"),
     invariant="the cost of counting the pending jobs does not grow with history")
_add(_reaper_worker_id, name="reaper-worker-id", section="recover",
     title="the reaper keys on the worker's name, and a restarted pod of the same name hides its lost job",
     source="procrastinate-org/procrastinate#1518",
     invariant="a job whose worker died is claimable again once its claim has run out")

NAMES = list(INCIDENTS)


def incidents() -> list[Incident]:
    """Every incident of the file, in the order of a job's life."""
    return [incident for incident, _ in INCIDENTS.values()]


def incident(name: str) -> Incident:
    """The incident called ``name`` (a LabkitError listing the names if there is none)."""
    if name not in INCIDENTS:
        raise LabkitError(f"No incident is called {name!r}.",
                          f"use one of: {', '.join(NAMES)} (`labkit incident list`).")
    return INCIDENTS[name][0]


def run(lab: Lab, name: str, *, fixed: bool = False, using: dict[str, str] | None = None) -> IncidentRun:
    """Play the incident ``name`` in ``lab`` (its schema is rebuilt), broken or ``fixed``.
    ``using`` puts other SQL in place of named queries of incidents.sql (an exercise's
    checker plays the learner's fix this way)."""
    about = incident(name)
    unknown = sorted(set(using or {}) - set(queries(SQL_FILE)))
    if unknown:
        raise LabkitError(f"incidents.sql has no query {', '.join(unknown)}.",
                          "name a query of labkit/sql/incidents.sql in using=.")

    start = time.monotonic()
    outcome = INCIDENTS[name][1](lab, fixed, _Script(using))
    return IncidentRun(name=name, fixed=fixed, invariant=about.invariant,
                       invariant_holds=outcome.holds, observed=Readings(outcome.observed),
                       took_s=round(time.monotonic() - start, 2), transcript=outcome.transcript)


def _layout(t: Transcript) -> str:
    """A row per step: its session, what it ran and got, and the note (one line each, so the
    broken run and the fixed one read the same way, whatever their sessions' names)."""
    return t.to_lines()


def format_run(r: IncidentRun) -> str:
    """An incident run as text: the transcript (if any), what was read back, the verdict."""
    lines = []
    if r.transcript is not None:
        lines += [_layout(r.transcript), ""]
    lines += [fill(f"{k}: {v}", indent="    ") for k, v in r.observed.items()]
    verdict = "holds" if r.invariant_holds else "BROKEN"
    lines.append(fill(f"{'fixed' if r.fixed else 'as reported'}: \"{r.invariant}\" -- {verdict}",
                      indent="    "))
    return "\n".join(lines)


def listing() -> str:
    """The file as text: each incident's name, where in a job's life, what happened, and the
    public thread it comes from."""
    lines = []
    for i in incidents():
        lines.append(fill(f"{i.name} ({i.section}): {i.title}", indent="    "))
        lines.append(fill(f"{i.source}" + (f"; also {', '.join(i.also)}" if i.also else ""),
                          indent="      ", first="    "))
    return "\n".join(lines)


def list_command(*, json: bool = False) -> int:
    """``labkit incident list [--json]``."""
    import json as jsonlib

    if json:
        print(jsonlib.dumps([{"name": i.name, "title": i.title, "section": i.section,
                              "source": i.source, "also": list(i.also), "invariant": i.invariant}
                             for i in incidents()], indent=2))
    else:
        print(listing())
    return 0


def run_command(*, open_lab: Callable[[], Lab], name: str, fixed: bool = False, json: bool = False) -> int:
    """``labkit incident run NAME [--fixed] [--json]``: exit 0 whether or not the invariant
    held (the run says which); a LabkitError for an unknown name."""
    incident(name)
    with open_lab() as lab:
        r = run(lab, name, fixed=fixed)
    print(r.to_json() if json else format_run(r))
    return 0
