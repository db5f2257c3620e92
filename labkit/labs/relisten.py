"""The listener that died: workers woken by LISTEN/NOTIFY, and a server restart under them.

A worker woken by NOTIFY keeps one connection open and runs LISTEN on it.  On the server, that
LISTEN belongs to the connection's session and lives in the server's memory: no table holds it
and nothing of it is written to disk.  When the server restarts, every session ends, and every
LISTEN with it; the server that comes back has no record that anyone listened, and a NOTIFY
sent to the channel reaches no one.  A worker that does not open a new connection and LISTEN
again is never woken; if it has no poll of its own, it never looks at the table either, and
its queue grows while its thread still runs.  This is the shape of reports such as
graphile-worker #541 ("LISTEN/NOTIFY sometimes drops without recovery") and Oban #1499 (after
the notifier restarted, new jobs stay "available" until the node is restarted).

:func:`listener_trace` shows it on a real server, a throw-away one of the lab's own
(:class:`~labkit.core.replica.ReplicaPair`, never the workbook's server, which other notebooks
share).  Two workers, each in a thread of this process, each with its own queue and channel so
that they never compete:

* :class:`NaiveListener` -- LISTEN once, then wait for notifications for ever; when a wait
  fails, log it and wait again on the same connection; no safety poll;
* :class:`~labkit.labs.wakeup.ListenWorker` -- a new connection after ``retry_s`` when its
  connection dies, LISTEN and a sweep of the table on it, and a safety poll.

Both are idle when the server restarts (an immediate shutdown, SIGQUIT, then a start).  A
producer then enqueues jobs with their NOTIFY to each queue, and the trace watches ``cap_s``.
The naive listener claims nothing; the ListenWorker claims every job, the first ones by the
sweep that follows its new LISTEN.  Read from the server afterwards: a new session's
``pg_listening_channels()`` is empty, and the sessions that listened before the restart are
not in ``pg_stat_activity`` any more.  :func:`trace_command` prints the run
(``labkit trace listener``).

What this lab does not measure, for the notebook's prose:

* A safety poll on the listener's own connection would not have saved the naive listener: it
  would fail on the dead connection as the wait does.  A poll through a pool, which opens new
  connections, would find the jobs a poll interval late (graphile-worker #541's workers went
  on polling every few minutes).  What gives the queue back its wake-ups is a new connection
  that LISTENs again.  Here the ListenWorker's safety poll has nothing to do: the sweep after
  its new LISTEN finds the jobs whose NOTIFY came while it had no connection.
* Notifications committed but not yet read when the server stops are lost too: at start the
  server empties its notification queue (``pg_notify/``; ``AsyncShmemInit`` in
  ``src/backend/commands/async.c``, read, not measured here).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from ..core.errors import LabkitError
from ..core.limits import number
from ..core.queries import query
from ..core.replica import Node, ReplicaPair
from ..core.results import Result
from ..core.text import table as text_table
from ._checked import one_row
from .wakeup import ListenWorker

NAIVE, WORKER = "naive", "worker"          # the two queues (and workers)
CHANNELS = {NAIVE: "naive_jobs", WORKER: "worker_jobs"}
APPS = {NAIVE: "relisten:naive", WORKER: "relisten:worker", "probe": "relisten:probe"}
SPREAD_S = 1.0               # the jobs after the restart are enqueued over this long
TICK_S = 0.1                 # how long a wait for a notification lasts before stop() is checked
NAIVE_PAUSE_S = 1.0          # the naive listener's pause after a failed wait
READY_S = 10                 # how long the script waits for a worker to answer a step
CAP_S = (2.0, 60.0)
RETRY_S = 0.5                # the ListenWorker's pause before a new connection
MAX_JOBS = 100


def _q(name: str) -> str:
    return query("relisten.sql", name).sql


def claim(conn: psycopg.Connection, queue: str, worker: str) -> int | None:
    """Claim the oldest available job of ``queue`` (relisten.sql "claim", in its own
    transaction: the connection is in autocommit); its id, or None when none is waiting."""
    row = conn.execute(_q("claim"), {"queue": queue, "worker": worker}).fetchone()
    return None if row is None else row[0]


def check_params(*, cap_s: Any = None, jobs: Any = None, safety_poll_s: Any = None,
                 retry_s: Any = None) -> None:
    """Every parameter the trace takes, checked before a server is made."""
    if cap_s is not None:
        number("cap_s", cap_s, low=CAP_S[0], high=CAP_S[1], unit=" s", example=6)
    if jobs is not None:
        number("jobs", jobs, low=1, high=MAX_JOBS, whole=True, example=5)
    if safety_poll_s is not None:
        number("safety_poll_s", safety_poll_s, low=0.1, high=30, unit=" s", example=2)
    if retry_s is not None:
        number("retry_s", retry_s, low=0.05, high=10, unit=" s", example=0.5)
    if cap_s is not None and retry_s is not None and cap_s <= SPREAD_S + retry_s:
        raise LabkitError(f"cap_s={cap_s:g} leaves no time to watch: the jobs are enqueued over "
                          f"{SPREAD_S:g} s after the restart and the worker reconnects after "
                          f"retry_s={retry_s:g} s.",
                          f"pass a cap_s above {SPREAD_S + retry_s:g} (cap_s=6, say).")


class NaiveListener:
    """The listener of the trackers' reports, written as it is often written with psycopg 3:

    * one autocommit connection, opened once; LISTEN on its channel, and no sweep of the table;
    * then, for ever, ``conn.notifies(timeout=tick_s)``; on each notification it claims until
      its queue is empty, as the ListenWorker does;
    * when the wait raises ``psycopg.OperationalError`` it logs the error, pauses ``pause_s``
      and waits again, on the same connection.  Once the server has gone, psycopg raises at
      once on every wait ("consuming input failed: server closed the connection unexpectedly"
      the first time, "the connection is lost" after that, with ``conn.closed`` true), so
      the pause is all that keeps the loop from spinning a CPU.  It never opens another
      connection and never runs LISTEN again;
    * no safety poll: it reads the table only when a notification comes.

    ``connect()`` opens the connection; ``claim(conn)`` claims one job and returns its id, or
    None.  stop() ends it within ``tick_s`` (or ``pause_s``, during a pause).  ``log``: (seconds
    since ``started``, what happened)."""

    def __init__(self, connect: Callable[[], psycopg.Connection], channel: str,
                 claim: Callable[[psycopg.Connection], int | None], *,
                 pause_s: float = NAIVE_PAUSE_S, tick_s: float = TICK_S):
        self.connect, self.channel, self.claim = connect, channel, claim
        self.pause_s, self.tick_s = pause_s, tick_s
        self.stopping = threading.Event()
        self.log: list[tuple[float, str]] = []
        self.started = time.monotonic()
        self.connection_closed = False      # what psycopg said of the connection at the end

    def note(self, what: str) -> None:
        self.log.append((round(time.monotonic() - self.started, 3), what))

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        """LISTEN once, then wait until stop(); the connection is closed at the end."""
        conn = self.connect()
        try:
            conn.execute(sql.SQL(_q("listen")).format(channel=sql.Identifier(self.channel)))
            self.note(f"LISTEN {self.channel}")
            while not self.stopping.is_set():
                try:
                    woken = list(conn.notifies(timeout=self.tick_s, stop_after=1))
                except psycopg.OperationalError as exc:   # logged, and then: wait again
                    self.note(f"wait failed: {str(exc).splitlines()[0]}")
                    self.stopping.wait(self.pause_s)
                    continue
                if woken:
                    self.drain(conn)
        finally:
            self.connection_closed = conn.closed
            conn.close()
            self.note("stopped")

    def drain(self, conn: psycopg.Connection) -> None:
        """Claim until nothing is waiting (or stop())."""
        while not self.stopping.is_set():
            job = self.claim(conn)
            if job is None:
                return
            self.note(f"notification: claimed job {job}")


@dataclass(frozen=True)
class ListenerRun(Result):
    """A server restart under two LISTEN workers (:func:`listener_trace`).  Times are seconds;
    the logs' clock starts when the workers do.

    cap_s: how long the trace watched after the restart (from the server taking connections
        again); a queue with no claim in that time stalled this long
    jobs: jobs enqueued, each with its NOTIFY, to each queue after the restart
    stalled_s_without_reconnect: from the first of those jobs' enqueue to the naive listener's
        first claim of one, on the server's clock; cap_s if it claimed none
    jobs_waiting_without_reconnect: the naive listener's jobs still waiting at the end
    stalled_s_with_reconnect: the same for the ListenWorker
    jobs_waiting_with_reconnect: the ListenWorker's jobs still waiting at the end
    safety_poll_s: the ListenWorker's safety poll
    retry_s: how long the ListenWorker waits before a new connection
    restarted_at_s: when the server went down, on the logs' clock
    restart_took_s: from the server going down to its taking connections again
    worker_listening_again_s: from the server going down to the ListenWorker's new LISTEN
        (None if it never ran one)
    naive_wait_failures: waits of the naive listener that failed after the restart (about one
        per pause: it never stopped trying the dead connection)
    naive_connection_closed: whether psycopg had marked the naive listener's connection
        closed (true: the library knew; the loop never asked)
    naive_listens: LISTENs the naive listener ran (1)
    worker_listens: LISTENs the ListenWorker ran (2: one on each connection)
    server_restarted: whether pg_postmaster_start_time() changed across the restart
    channels_before_restart: pg_listening_channels() of a probe session that LISTENed on both
        channels before the restart
    channels_after_restart: pg_listening_channels() of the probe's new session afterwards ([])
    old_sessions_left: of the sessions that listened before the restart (the two workers' and
        the probe's), how many pg_stat_activity still shows (0)
    naive_sessions_after: the naive listener's sessions in pg_stat_activity afterwards (0)
    worker_sessions_after: the ListenWorker's sessions afterwards (1, a new one)
    naive_log: the naive listener's log: (seconds, what happened)
    worker_log: the ListenWorker's log: (seconds, what happened, job id or None)
    rows: (what happened, what each worker did), one per step of the script, in words and
        with no timings: the same on every run that behaves the same
    table: the rows as a text table
    """

    cap_s: float
    jobs: int
    stalled_s_without_reconnect: float
    jobs_waiting_without_reconnect: int
    stalled_s_with_reconnect: float
    jobs_waiting_with_reconnect: int
    safety_poll_s: float
    retry_s: float
    restarted_at_s: float
    restart_took_s: float
    worker_listening_again_s: float | None
    naive_wait_failures: int
    naive_connection_closed: bool
    naive_listens: int
    worker_listens: int
    server_restarted: bool
    channels_before_restart: list[str]
    channels_after_restart: list[str]
    old_sessions_left: int
    naive_sessions_after: int
    worker_sessions_after: int
    naive_log: list[tuple[float, str]]
    worker_log: list[tuple[float, str, int | None]]
    rows: list[tuple[str, str]]
    table: str


@dataclass(frozen=True)
class _ServerView:
    """What the server said about listening, before or after the restart."""

    channels: list[str]
    sessions: dict[str, list[int]]
    started: Any


def _server_view(conn: psycopg.Connection) -> _ServerView:
    sessions: dict[str, list[int]] = {app: [] for app in APPS.values()}
    for app, pid in conn.execute(_q("sessions"), {"apps": list(APPS.values())}):
        sessions[app].append(pid)
    return _ServerView(channels=list(one_row(conn.execute(_q("listening")), "relisten.sql's listening")[0]),
                       sessions=sessions,
                       started=one_row(conn.execute(_q("started")), "relisten.sql's started")[0])


class _Trace:
    """One run of :func:`listener_trace` on ``node``: the workers, the script, the readings."""

    def __init__(self, node: Node, *, cap_s: float, jobs: int, safety_poll_s: float, retry_s: float):
        self.node, self.cap_s, self.jobs = node, cap_s, jobs
        self.naive = NaiveListener(lambda: node.connect(name=APPS[NAIVE]), CHANNELS[NAIVE],
                                   lambda conn: claim(conn, NAIVE, NAIVE))
        self.worker = ListenWorker(lambda: node.connect(name=APPS[WORKER]), CHANNELS[WORKER],
                                   lambda conn: claim(conn, WORKER, WORKER),
                                   safety_poll_s=safety_poll_s, retry_s=retry_s, tick_s=TICK_S)
        self.t0 = time.monotonic()
        self.naive.started = self.worker.started = self.t0       # one clock for both logs
        self.failed: list[BaseException] = []
        self.threads = [threading.Thread(target=self._serve, args=(w,), name=f"relisten-{name}",
                                         daemon=True)
                        for name, w in ((NAIVE, self.naive), (WORKER, self.worker))]

    def _serve(self, worker: NaiveListener | ListenWorker) -> None:
        try:
            worker.run()
        except BaseException as exc:                 # reported by the script's next wait
            self.failed.append(exc)

    def until(self, done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + READY_S
        while not done():
            if self.failed:
                raise self.failed[0]
            if time.monotonic() > deadline:
                raise LabkitError(f"The lab's workers did not {what} within {READY_S} s.",
                                  "the machine may be overloaded: run the cell again.")
            time.sleep(0.01)

    def naive_claims(self) -> int:
        return sum(1 for _, what in self.naive.log if "claimed" in what)

    def worker_claims(self) -> int:
        return sum(1 for _, _, job in self.worker.log if job is not None)

    def start(self) -> None:
        """The table, then both workers, until each has LISTENed."""
        with self.node.connect(name="relisten:setup") as conn:
            for statement in query("relisten.sql", "schema").statements:
                conn.execute(statement)
        for t in self.threads:
            t.start()
        self.until(lambda: any(w.startswith("LISTEN") for _, w in self.naive.log)
                    and any(w == "LISTEN" for _, w, _ in self.worker.log), "LISTEN")

    def enqueue(self, conn: psycopg.Connection, queue: str) -> int:
        return one_row(conn.execute(_q("enqueue_and_notify"), {"queue": queue, "channel": CHANNELS[queue]}),
                       "relisten.sql's enqueue_and_notify")[0]

    def stop(self) -> None:
        """Both workers stopped and their threads joined (the ListenWorker within a tick, the
        naive listener within a tick or its pause)."""
        self.naive.stop()
        self.worker.stop()
        for t in self.threads:
            if t.ident is not None:
                t.join(READY_S)


def listener_trace(*, cap_s: float = 6.0, jobs: int = 5, safety_poll_s: float = 2.0,
                   retry_s: float = RETRY_S) -> ListenerRun:
    """Two LISTEN workers across a server restart, on a throw-away server of the trace's own
    (a :class:`~labkit.core.replica.ReplicaPair` without a standby):

    1. the naive listener and the ListenWorker start, each LISTENing on its own channel;
    2. a job to each queue with its NOTIFY: both claim theirs (the naive listener works, until
       the restart);
    3. a probe session LISTENs on both channels; the server is restarted (SIGQUIT to the
       postmaster, every session ends; then a start);
    4. ``jobs`` jobs to each queue, each with its NOTIFY, in rounds spread over a second from
       the moment the server takes connections again; the trace watches until ``cap_s``
       after that moment, then reads each queue from the table and, in a new probe session,
       the channels it listens on and the sessions the server has.

    Both workers are stopped and their threads joined at the end, also on an error or Ctrl-C;
    the server and its folder are removed.  A :class:`ListenerRun`."""
    check_params(cap_s=cap_s, jobs=jobs, safety_poll_s=safety_poll_s, retry_s=retry_s)
    with ReplicaPair(standby=False) as pair:
        assert pair.primary is not None
        trace = _Trace(pair.primary, cap_s=cap_s, jobs=jobs, safety_poll_s=safety_poll_s,
                       retry_s=retry_s)
        try:
            return _script(trace, safety_poll_s=safety_poll_s, retry_s=retry_s)
        finally:
            trace.stop()


def _script(trace: _Trace, *, safety_poll_s: float, retry_s: float) -> ListenerRun:
    node = trace.node
    trace.start()
    with node.connect(name="relisten:producer") as producer:
        for queue in (NAIVE, WORKER):
            trace.enqueue(producer, queue)
        trace.until(lambda: trace.naive_claims() == 1 and trace.worker_claims() == 1,
                     "claim the job each was sent")
    warm = (len(trace.naive.log), len(trace.worker.log))
    probe = node.connect(name=APPS["probe"])
    try:
        for ch in CHANNELS.values():
            probe.execute(sql.SQL(_q("listen")).format(channel=sql.Identifier(ch)))
        before = _server_view(probe)
        t_down = time.monotonic()
        node.restart()
        t_up = time.monotonic()
    finally:
        probe.close()
    first_ids = _produce(trace, t_up)
    _watch(trace, t_up + trace.cap_s)
    waiting, stalled = {}, {}
    with node.connect(name=APPS["probe"]) as conn:      # the probe, on a new session
        for queue in (NAIVE, WORKER):
            waiting[queue], stall = one_row(conn.execute(_q("queue_after"),
                                                         {"queue": queue, "first_id": first_ids[queue]}),
                                            "relisten.sql's queue_after")
            stalled[queue] = trace.cap_s if stall is None else round(min(stall, trace.cap_s), 3)
        after = _server_view(conn)
    trace.stop()
    return _result(trace, before=before, after=after, waiting=waiting, stalled=stalled, warm=warm,
                   t_down=t_down, t_up=t_up, safety_poll_s=safety_poll_s, retry_s=retry_s)


def _produce(trace: _Trace, t_up: float) -> dict[str, int]:
    """``jobs`` rounds of one job (and its NOTIFY) to each queue, spread over SPREAD_S from
    ``t_up``; the first job's id in each queue."""
    gap = SPREAD_S / (trace.jobs - 1) if trace.jobs > 1 else 0.0
    first: dict[str, int] = {}
    with trace.node.connect(name="relisten:producer") as producer:
        for i in range(trace.jobs):
            time.sleep(max(0.0, t_up + i * gap - time.monotonic()))
            for queue in (NAIVE, WORKER):
                job = trace.enqueue(producer, queue)
                first.setdefault(queue, job)
    return first


def _watch(trace: _Trace, until: float) -> None:
    """Until ``until``, in short sleeps (Ctrl-C is noticed at once); a worker's failure is raised."""
    while (left := until - time.monotonic()) > 0:
        if trace.failed:
            raise trace.failed[0]
        time.sleep(min(left, 0.05))
    if trace.failed:
        raise trace.failed[0]


def _result(trace: _Trace, *, before: _ServerView, after: _ServerView, waiting: dict[str, int],
            stalled: dict[str, float], warm: tuple[int, int], t_down: float, t_up: float,
            safety_poll_s: float, retry_s: float) -> ListenerRun:
    naive_log, worker_log = list(trace.naive.log), list(trace.worker.log)
    down_s = round(t_down - trace.t0, 3)
    relistened = [t for t, what, _ in worker_log[warm[1]:] if what == "LISTEN"]
    old_pids = {pid for pids in before.sessions.values() for pid in pids}
    now_pids = {pid for pids in after.sessions.values() for pid in pids}
    facts = {
        "naive_wait_failures": sum(1 for _, w in naive_log[warm[0]:] if w.startswith("wait failed")),
        "naive_listens": sum(1 for _, w in naive_log if w.startswith("LISTEN")),
        "worker_listens": sum(1 for _, w, _ in worker_log if w == "LISTEN"),
        "old_sessions_left": len(old_pids & now_pids),
        "naive_sessions_after": len(after.sessions[APPS[NAIVE]]),
        "worker_sessions_after": len(after.sessions[APPS[WORKER]]),
    }
    rows = _rows(trace, warm, before=before, after=after, waiting=waiting, facts=facts)
    return ListenerRun(
        cap_s=trace.cap_s, jobs=trace.jobs,
        stalled_s_without_reconnect=stalled[NAIVE], jobs_waiting_without_reconnect=waiting[NAIVE],
        stalled_s_with_reconnect=stalled[WORKER], jobs_waiting_with_reconnect=waiting[WORKER],
        safety_poll_s=safety_poll_s, retry_s=retry_s, restarted_at_s=down_s,
        restart_took_s=round(t_up - t_down, 3),
        worker_listening_again_s=round(relistened[0] - down_s, 3) if relistened else None,
        naive_connection_closed=trace.naive.connection_closed,
        server_restarted=before.started != after.started,
        channels_before_restart=before.channels, channels_after_restart=after.channels,
        naive_log=naive_log, worker_log=worker_log, rows=rows,
        table=text_table(["what happened", "what each worker did"], [list(r) for r in rows]),
        **facts)


def _claimed(n: int, of: int) -> str:
    if n == 0:
        return "claimed none"
    return f"claimed all {of}" if n == of else f"claimed {n} of {of}"


def _sessions(n: int) -> str:
    return "no session" if n == 0 else "1 session" if n == 1 else f"{n} sessions"


def _naive_did(after: list[tuple[float, str]]) -> str:
    """What the naive listener did about the restart, from its log after it."""
    failures = sum(1 for _, w in after if w.startswith("wait failed"))
    if failures > 1:
        did = "its wait failed; it logged that and waited again on the same connection, failing every time"
    elif failures == 1:
        did = "its wait failed once; it logged that and waited again on the same connection"
    else:
        did = "nothing: it went on waiting"
    listens = any(w.startswith("LISTEN") for _, w in after)
    return did + ("; it ran LISTEN again" if listens else "; it never LISTENed again")


def _worker_did(after: list[tuple[float, str, int | None]]) -> str:
    """What the ListenWorker did about the restart, from its log after it."""
    lost = any(w == "connection lost" for _, w, _ in after)
    listens = any(w == "LISTEN" for _, w, _ in after)
    if lost and listens:
        return "connection lost; a new connection, LISTEN on it and a sweep of its queue"
    return "connection lost; no new LISTEN" if lost else "nothing: it went on waiting"


def _rows(trace: _Trace, warm: tuple[int, int], *, before: _ServerView, after: _ServerView,
          waiting: dict[str, int], facts: dict[str, int]) -> list[tuple[str, str]]:
    """The run in words, from the logs and the server's answers: no timings, so that two runs
    that behave the same read the same."""
    naive_after, worker_after = trace.naive.log[warm[0]:], trace.worker.log[warm[1]:]
    naive_claims = sum(1 for _, w in naive_after if "claimed" in w)
    worker_claims = sum(1 for _, _, job in worker_after if job is not None)
    first_why = next((why for _, why, job in trace.worker.log[:warm[1]] if job is not None), None)
    first = "woken, claimed it" if first_why == "notify" else f"claimed it ({first_why})"
    gone = ("gone from pg_stat_activity" if facts["old_sessions_left"] == 0
            else f"{facts['old_sessions_left']} still in pg_stat_activity")
    return [
        ("both workers start, each LISTENing on its own channel",
         f"naive listener: LISTEN {CHANNELS[NAIVE]}; ListenWorker: LISTEN {CHANNELS[WORKER]}, then a sweep"),
        ("a job to each queue, with its NOTIFY", f"naive listener: woken, claimed it; ListenWorker: {first}"),
        ("a probe session LISTENs on both channels",
         f"its pg_listening_channels(): {', '.join(before.channels) or 'none'}"),
        ("the server restarts (an immediate shutdown, then a start)",
         f"naive listener: {_naive_did(naive_after)}; ListenWorker: {_worker_did(worker_after)}"),
        (f"{trace.jobs} jobs to each queue, one at a time, each with its NOTIFY",
         f"naive listener: {_claimed(naive_claims, trace.jobs)}; "
         f"ListenWorker: {_claimed(worker_claims, trace.jobs)}"),
        ("the watch ends",
         f"naive listener: {waiting[NAIVE]} jobs waiting; ListenWorker: {waiting[WORKER]} jobs waiting"),
        ("the probe connects again (a new session)",
         f"its pg_listening_channels(): {', '.join(after.channels) or 'none'}; the sessions that "
         f"listened before the restart: {gone}; naive listener: {_sessions(facts['naive_sessions_after'])}, "
         f"ListenWorker: {_sessions(facts['worker_sessions_after'])}"),
    ]


def report(r: ListenerRun) -> str:
    """The run as text: the table, then the figures."""
    lines = [
        "The listener that died: a server restart under two LISTEN workers "
        "(on a throw-away server of the lab's own)",
        "",
        r.table,
        "",
        f"after the restart, {r.jobs} jobs to each queue with their NOTIFY; watched for {r.cap_s:g} s",
        f"  naive listener (no reconnect, no safety poll):  {r.jobs_waiting_without_reconnect} jobs "
        f"waiting, stalled {r.stalled_s_without_reconnect:g} s"
        + (" (the whole watch)" if r.stalled_s_without_reconnect >= r.cap_s else ""),
        f"  ListenWorker (reconnect after {r.retry_s:g} s, safety poll {r.safety_poll_s:g} s):  "
        f"{r.jobs_waiting_with_reconnect} jobs waiting, stalled {r.stalled_s_with_reconnect:g} s",
        f"  the restart took {r.restart_took_s:g} s; the ListenWorker was listening again "
        + (f"{r.worker_listening_again_s:g} s after the server went down"
           if r.worker_listening_again_s is not None else "never"),
        f"  the naive listener's wait failed {r.naive_wait_failures} times on its dead connection "
        f"(psycopg had marked it closed: {'yes' if r.naive_connection_closed else 'no'})",
    ]
    return "\n".join(lines)


def trace_command(*, cap_s: float, jobs: int, json: bool) -> int:
    """``labkit trace listener [--cap 6] [--jobs 5] [--json]``: :func:`listener_trace`, as
    text or JSON."""
    check_params(cap_s=cap_s, jobs=jobs, retry_s=RETRY_S)
    r = listener_trace(cap_s=cap_s, jobs=jobs)
    print(r.to_json() if json else report(r))
    return 0
