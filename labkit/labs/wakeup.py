"""Waking a worker: polling the job table, or LISTEN/NOTIFY with a safety-net poll.

A worker that polls sleeps ``poll_ms`` between empty claims, so a job waits half a poll on
average.  A worker that LISTENs sleeps until a NOTIFY wakes it, and then claims from the
table (production.sql "claim") until the table is empty: the notification is a wake-up,
never the job.  What the server guarantees about NOTIFY, shown here on a real server:

* :func:`delivered_at_commit` -- a NOTIFY is delivered when (and only if) its transaction
  commits: a listener waiting while the producer's transaction is open receives nothing;
  the commit delivers it.  :func:`rolled_back` -- a rolled-back NOTIFY is never delivered.
* :func:`coalesced` -- the same channel and payload notified several times in one
  transaction arrive once; distinct payloads arrive each; notifications from different
  transactions are never folded (the NOTIFY reference page says so).
* :func:`missed_while_not_listening` -- a notification committed while no session listens
  (the worker is restarting) is gone: LISTEN does not replay the past.  Only a poll of the
  table finds that job, which is why a notified worker keeps a safety-net poll (and sweeps
  the table right after its LISTEN).
* :func:`every_listener_wakes` -- every listening session receives every notification: N
  listeners, one job, N wake-ups and one claim that finds it.  :func:`notify_limits` -- the
  notification queue's size and use, and the longest payload the server takes.
* :func:`latency` / :func:`notify_trace` -- a real worker process, enqueue-to-claim latency
  on the server's clock, polling against notification (``labkit notify``:
  :func:`notify_command`); :func:`saves` -- the shape the notebook asserts of it;
  :func:`plot_wakeups` -- the run's timeline: when each job arrived and when each worker
  noticed it.
* :class:`ListenWorker` -- a LISTEN worker loop in full (its own connection, LISTEN then a
  sweep, claim until empty on every wake-up, a safety poll, reconnect, a clean stop), with
  :func:`claim_one`; :func:`listen_worker_run` -- it, live, against a scripted producer that
  sends a job with no NOTIFY and ends the worker's connection.

What this lab does not measure, for the notebook's prose (checked against the PostgreSQL
documentation and source, not measured here):

* The notification queue holds what has been sent but not yet read by every listening
  session (its size: :func:`notify_limits`).  It is cleaned up only as far as the slowest listener has read:
  a session that LISTENs and then sits in a long transaction holds it back; the log warns
  from half full; once full, every transaction that calls NOTIFY fails at commit.
  ``pg_notification_queue_usage()`` reports the share in use.
* At commit, a transaction that notified takes a heavyweight lock (AccessExclusiveLock on
  "database 0", shared by every database of the cluster) and holds it until its commit is
  done, so that queue entries appear in commit order (``PreCommit_Notify`` in
  ``src/backend/commands/async.c``).  Committing transactions that notified therefore
  commit one at a time; under many concurrent writers that notify, this is the known
  scalability limit of NOTIFY.  Transactions that do not notify are not in that line.
* LISTEN is session state: through PgBouncer in transaction pooling mode the LISTEN lands
  on whichever server connection ran that transaction, and the client receives nothing.
  The listener needs a direct (or session-pooled) connection.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

import psycopg
from psycopg import sql

from ..core.db import WORKER_GUARDS, open_connection, session_name
from ..core.errors import LabkitError
from ..core.lab import Lab
from ..core.limits import number
from ..core.procs import Context, Worker
from ..core.queries import query
from ..core.results import Result
from ..core.text import table as text_table
from ._checked import one_row
from .production import fresh_table

MODES = ("poll", "notify")
LEASE_S = 30                 # the claim's lease; the handler here does nothing, so never reached
WAIT_MS = 300                # how long a listener watches for a notification that must not come
DELIVERY_TIMEOUT_S = 10      # how long a listener waits for one that must come
MAX_JOBS = 10_000
POLL_MS = (10, 60_000)
MAX_RUN_S = 3600             # a latency run's schedule: jobs x 0.6 x poll_ms, at most an hour
GAP = (0.1, 1.1)             # arrivals are this many poll intervals apart, uniformly at random


def _q(name: str) -> str:
    return query("wakeup.sql", name).sql


def channel(lab: Lab) -> str:
    """The lab's notification channel.  Channels belong to the database, not to a schema:
    the name carries the lab's schema so that two labs never wake each other's workers."""
    return f"{lab.schema}_jobs"


def create_table(lab: Lab) -> None:
    """The production job table, empty (dropped first if a run left one)."""
    fresh_table(lab)


def listen(conn: psycopg.Connection, name: str) -> None:
    """LISTEN on ``name`` (an identifier: quoted by psycopg, never pasted in)."""
    conn.execute(sql.SQL(_q("listen")).format(channel=sql.Identifier(name)))


def _received(conn: psycopg.Connection, timeout_s: float, stop_after: int | None = None) -> list:
    """The notifications ``conn`` receives within ``timeout_s`` (fewer if ``stop_after``)."""
    return list(conn.notifies(timeout=timeout_s, stop_after=stop_after))


def _close(*conns: psycopg.Connection | None) -> None:
    for c in conns:
        if c is not None and not c.closed:
            c.close()


@contextmanager
def _listener_and_enqueuer(lab: Lab) -> Iterator[tuple[psycopg.Connection, psycopg.Connection, str]]:
    """A fresh job table; session A (autocommit) listening on the lab's channel and session B
    (in a transaction) to enqueue: ``(a, b, channel)``, both closed at the end."""
    create_table(lab)
    ch = channel(lab)
    a = b = None
    try:
        a = lab.connect(role="wake-listen")
        b = lab.connect(role="wake-enqueue", autocommit=False)
        listen(a, ch)
        yield a, b, ch
    finally:
        _close(a, b)


def check_params(*, jobs: Any = None, poll_ms: Any = None, safety_poll_ms: Any = None,
                 mode: Any = None, wait_ms: Any = None) -> None:
    """Every parameter the lab takes, checked before anything is created."""
    if jobs is not None:
        number("jobs", jobs, low=1, high=MAX_JOBS, whole=True, example=20)
    if poll_ms is not None:
        number("poll_ms", poll_ms, low=POLL_MS[0], high=POLL_MS[1], unit=" ms", example=500)
    if safety_poll_ms is not None:
        number("safety_poll_ms", safety_poll_ms, low=POLL_MS[0], high=POLL_MS[1], unit=" ms",
               example=5000)
    if wait_ms is not None:
        number("wait_ms", wait_ms, low=10, high=10_000, unit=" ms", example=WAIT_MS)
    if mode is not None and mode not in MODES:
        raise LabkitError(f"mode={mode!r} is not a way to wake a worker.",
                          "pass mode='poll' (sleep between empty claims) or mode='notify' "
                          "(LISTEN, with a safety-net poll).")
    if jobs is not None and poll_ms is not None:
        run_s = jobs * poll_ms / 1000 * sum(GAP) / 2
        if run_s > MAX_RUN_S:
            raise LabkitError(f"jobs={jobs:,} arriving about {sum(GAP) / 2 * poll_ms:g} ms apart "
                              f"(poll_ms={poll_ms:g}) would take about {run_s / 60:.0f} minutes per mode.",
                              "pass fewer jobs or a shorter poll_ms (jobs x poll_ms x 0.6 under an "
                              "hour; jobs=20 poll_ms=500 takes 6 s).")


# -- the server's guarantees, scripted step by step ---------------------------------------------


@dataclass(frozen=True)
class WakeStep(Result):
    """One step of a scripted NOTIFY story, in the order it happened.

    session: who acted: "A" (the listener) or "B" (the producer)
    did: what it did (a statement, or a wait)
    saw: what it saw, in words
    """

    session: str
    did: str
    saw: str


@dataclass(frozen=True)
class DeliveredAtCommit(Result):
    """A NOTIFY sent inside a transaction, watched by a listener before and after the commit
    (:func:`delivered_at_commit`).

    channel: the lab's notification channel
    job_id: the job B enqueued (and notified) in its transaction
    before_commit: notifications A received while B's transaction was open (0)
    after_commit: notifications A received once B committed (1)
    payload: the payload A received (the job's id, as text); None if nothing came
    from_producer: whether the notification names B's backend as its sender
    waited_ms: how long A waited, ms, while B's transaction was open
    delivered_ms: ms from B's COMMIT returning to A holding the notification
    steps: what each session did and saw, in order (a :class:`WakeStep` each)
    """

    channel: str
    job_id: int
    before_commit: int
    after_commit: int
    payload: str | None
    from_producer: bool
    waited_ms: float
    delivered_ms: float
    steps: list[WakeStep]


def delivered_at_commit(lab: Lab, *, wait_ms: float = WAIT_MS) -> DeliveredAtCommit:
    """Session A LISTENs; session B begins, inserts a job and notifies; A waits ``wait_ms``
    and receives nothing; B commits; A receives the notification, its payload the job's id:
    a :class:`DeliveredAtCommit`."""
    check_params(wait_ms=wait_ms)
    with _listener_and_enqueuer(lab) as (a, b, ch):
        steps = [("A", f"LISTEN {ch}", "listening")]
        job_id = one_row(b.execute(_q("enqueue")), "wakeup.sql's enqueue")[0]
        steps.append(("B", "BEGIN; INSERT INTO job ...", f"job {job_id}, not committed"))
        b.execute(_q("notify"), {"channel": ch, "payload": str(job_id)})
        steps.append(("B", f"SELECT pg_notify('{ch}', '{job_id}')", "queued in B's transaction"))
        before = _received(a, wait_ms / 1000)
        steps.append(("A", f"wait {wait_ms:g} ms", f"{len(before)} notifications"))
        b.commit()
        t = time.monotonic()
        steps.append(("B", "COMMIT", "the job and its notification become visible together"))
        after = _received(a, DELIVERY_TIMEOUT_S, stop_after=1)
        delivered_ms = (time.monotonic() - t) * 1000
        steps.append(("A", "wait", f"{len(after)} notification: payload "
                                   f"{after[0].payload if after else '-'}"))
        return DeliveredAtCommit(
            channel=ch, job_id=job_id, before_commit=len(before), after_commit=len(after),
            payload=after[0].payload if after else None,
            from_producer=bool(after) and after[0].pid == b.info.backend_pid,
            waited_ms=wait_ms, delivered_ms=round(delivered_ms, 2),
            steps=[WakeStep(session=who, did=did, saw=saw) for who, did, saw in steps])


@dataclass(frozen=True)
class Coalesced(Result):
    """Notifications folded within one transaction, and not across two (:func:`coalesced`).

    channel: the lab's notification channel
    sent_in_one_transaction: NOTIFYs the first transaction sent
    same_payload_sent: of those, how many carried the same payload (the first job's id)
    payloads_sent: the payloads the first transaction sent, in the order it sent them
    received: notifications the listener received from that transaction
    same_payload_received: of those, how many carried the repeated payload (1: folded)
    distinct_payloads_received: distinct payloads received (every distinct one arrives)
    payloads: the payloads received, in arrival order
    next_transaction_received: deliveries of the same payload notified again by a second
        transaction (1: never folded with the first's)
    """

    channel: str
    sent_in_one_transaction: int
    same_payload_sent: int
    payloads_sent: list[str]
    received: int
    same_payload_received: int
    distinct_payloads_received: int
    payloads: list[str]
    next_transaction_received: int


def coalesced(lab: Lab, *, repeats: int = 3, wait_ms: float = WAIT_MS) -> Coalesced:
    """One transaction enqueues three jobs and notifies the first one's id ``repeats`` times,
    then the other two ids once each; it commits.  The listener receives each distinct
    payload once.  A second transaction then notifies the first id again: received again
    (folding happens only within one transaction).  A :class:`Coalesced`."""
    number("repeats", repeats, low=2, high=100, whole=True, example=3)
    check_params(wait_ms=wait_ms)
    with _listener_and_enqueuer(lab) as (a, b, ch):
        ids = [one_row(b.execute(_q("enqueue")), "wakeup.sql's enqueue")[0] for _ in range(3)]
        sent = [str(ids[0])] * repeats + [str(i) for i in ids[1:]]
        for payload in sent:
            b.execute(_q("notify"), {"channel": ch, "payload": payload})
        b.commit()
        got = [n.payload for n in _received(a, wait_ms / 1000)]
        b.execute(_q("notify"), {"channel": ch, "payload": str(ids[0])})
        b.commit()
        again = [n.payload for n in _received(a, wait_ms / 1000)]
        return Coalesced(channel=ch, sent_in_one_transaction=len(sent), same_payload_sent=repeats,
                         payloads_sent=sent, received=len(got),
                         same_payload_received=got.count(str(ids[0])),
                         distinct_payloads_received=len(set(got)), payloads=got,
                         next_transaction_received=again.count(str(ids[0])))


@dataclass(frozen=True)
class RolledBack(Result):
    """A NOTIFY whose transaction rolled back (:func:`rolled_back`).

    channel: the lab's notification channel
    notified: NOTIFYs sent in the rolled-back transaction (1)
    received: notifications the listener received (0: never delivered)
    waited_ms: how long the listener waited, ms
    jobs_in_table: jobs in the table afterwards (0: the job went with the transaction)
    """

    channel: str
    notified: int
    received: int
    waited_ms: float
    jobs_in_table: int


def rolled_back(lab: Lab, *, wait_ms: float = WAIT_MS) -> RolledBack:
    """Session B inserts a job, notifies, and rolls back; the listener waits ``wait_ms``: a
    :class:`RolledBack` (nothing delivered, no job left)."""
    check_params(wait_ms=wait_ms)
    with _listener_and_enqueuer(lab) as (a, b, ch):
        job_id = one_row(b.execute(_q("enqueue")), "wakeup.sql's enqueue")[0]
        b.execute(_q("notify"), {"channel": ch, "payload": str(job_id)})
        b.rollback()
        got = _received(a, wait_ms / 1000)
        return RolledBack(channel=ch, notified=1, received=len(got), waited_ms=wait_ms,
                          jobs_in_table=lab.execute("SELECT count(*) FROM job")[0][0])


@dataclass(frozen=True)
class ListenersWoken(Result):
    """Several listeners, one job and its NOTIFY (:func:`every_listener_wakes`).

    channel: the lab's notification channel
    listeners: sessions listening on the channel
    jobs: jobs enqueued (1)
    woke: listeners that received the notification (all of them)
    found: jobs each listener's claims found, in turn (one 1, the rest 0)
    claim_queries: claim queries all the listeners ran, the empty ones included
    """

    channel: str
    listeners: int
    jobs: int
    woke: int
    found: list[int]
    claim_queries: int


def every_listener_wakes(lab: Lab, *, listeners: int = 3) -> ListenersWoken:
    """``listeners`` sessions LISTEN on the lab's channel; a producer enqueues one job with its
    NOTIFY.  Each listener waits for its notification and then, as a notified worker does,
    claims until nothing is due (production.sql "claim"), one listener after the other.  A
    :class:`ListenersWoken`: every listener woke, one claim found the job."""
    number("listeners", listeners, low=2, high=20, whole=True, example=3)
    create_table(lab)
    ch = channel(lab)
    conns: list[psycopg.Connection] = []
    try:
        for i in range(listeners):
            conns.append(lab.connect(role=f"wake-listen-{i + 1}"))
            listen(conns[-1], ch)
        lab.execute(_q("enqueue_and_notify"), {"channel": ch})
        got = [_received(c, DELIVERY_TIMEOUT_S, stop_after=1) for c in conns]
        found, queries = [], 0
        for i, conn in enumerate(conns):
            n = 0
            while True:
                queries += 1
                if _claim(conn, f"listener-{i + 1}", LEASE_S) is None:
                    break
                n += 1
            found.append(n)
        return ListenersWoken(channel=ch, listeners=listeners, jobs=1,
                              woke=sum(1 for g in got if g), found=found, claim_queries=queries)
    finally:
        _close(*conns)


@dataclass(frozen=True)
class ServerError(Result):
    """An error the server raised.

    sqlstate: its SQLSTATE code
    message: its primary message
    """

    sqlstate: str | None
    message: str


@dataclass(frozen=True)
class NotifyLimits(Result):
    """Two limits of NOTIFY, read from the server (:func:`notify_limits`).

    queue_pages: the notification queue's size in pages (max_notify_queue_pages; None before PostgreSQL 17)
    page_bytes: bytes in a page of the queue (block_size)
    queue_bytes: the queue's size in bytes (None before PostgreSQL 17)
    queue_usage: the share of the queue in use now, 0 to 1 (pg_notification_queue_usage())
    longest_payload: the longest payload pg_notify accepts, bytes
    too_long: the error a payload one byte longer gives (a :class:`ServerError`)
    """

    queue_pages: int | None
    page_bytes: int
    queue_bytes: int | None
    queue_usage: float
    longest_payload: int
    too_long: ServerError


def notify_limits(lab: Lab) -> NotifyLimits:
    """Two limits of NOTIFY, read from the server: the notification queue's maximum size
    (``max_notify_queue_pages`` pages of ``block_size`` bytes; the setting exists from
    PostgreSQL 17) and how full it is now (``pg_notification_queue_usage()``); and the
    longest payload ``pg_notify`` accepts, found by trying lengths in transactions that are
    rolled back, with the error one byte more gives.  A :class:`NotifyLimits`."""
    ch = channel(lab)
    with lab.connect(role="wake-limits", autocommit=False) as conn:
        pages, page_bytes = one_row(conn.execute(_q("queue_size")), "wakeup.sql's queue_size")
        usage = one_row(conn.execute(_q("queue_usage")), "wakeup.sql's queue_usage")[0]
        conn.rollback()

        def error_at(n: int) -> psycopg.Error | None:
            try:
                conn.execute(_q("notify_payload_of_length"), {"channel": ch, "n": n})
                return None
            except psycopg.errors.InvalidParameterValue as exc:
                return exc
            finally:
                conn.rollback()                   # nothing is ever delivered

        low, high = 1, 1 << 20                    # accepted, refused
        if error_at(low) is not None or error_at(high) is None:
            raise LabkitError("pg_notify did not refuse a payload of a mebibyte, or refused one "
                              "of a byte.", "check the server with `labkit doctor`.")
        while high - low > 1:
            mid = (low + high) // 2
            if error_at(mid) is None:
                low = mid
            else:
                high = mid
        exc = error_at(high)
        if exc is None:
            raise LabkitError(f"pg_notify accepted a payload of {high} bytes that it refused a moment "
                              "before.", "run it again; if it happens again, check the server with "
                              "`labkit doctor`.")
    return NotifyLimits(queue_pages=pages, page_bytes=page_bytes,
                        queue_bytes=pages * page_bytes if pages is not None else None,
                        queue_usage=usage, longest_payload=low,
                        too_long=ServerError(sqlstate=exc.sqlstate,
                                             message=(exc.diag.message_primary or str(exc)).strip()))


def _claim(conn: psycopg.Connection, worker: str, lease_s: float) -> tuple[int, float] | None:
    """production.sql "claim", then (in the claim's transaction) the job's wait on the
    server's clock; the job is then completed (production.sql "complete").  None if the
    table had nothing due."""
    with conn.transaction():
        row = conn.execute(query("production.sql", "claim").sql,
                           {"worker": worker, "lease_s": lease_s}).fetchone()
        if row is None:
            return None
        job_id, version = row[0], row[5]
        waited = one_row(conn.execute(_q("claimed_latency"), {"id": job_id}),
                         "wakeup.sql's claimed_latency")[0]
    conn.execute(query("production.sql", "complete").sql, {"id": job_id, "claim_version": version})
    return job_id, waited


@dataclass(frozen=True)
class RestartTimeline(Result):
    """A restarted listener's run, in seconds on the server's clock from the moment its old
    session went: what :func:`plot_wakeups` draws in its last lane.

    down: when the old session (and its LISTEN) went (0)
    enqueued: when the job and its NOTIFY were committed, nobody listening
    listening: when the new session's LISTEN ran
    claimed: when its safety-net poll claimed the job
    """

    down: float
    enqueued: float
    listening: float
    claimed: float


@dataclass(frozen=True)
class MissedWhileAway(Result):
    """A notification committed while the worker restarted, and the poll that found its job
    (:func:`missed_while_not_listening`).

    channel: the lab's notification channel
    job_id: the job enqueued, with its NOTIFY, while no session listened
    notifications_received: notifications the new session received (0: LISTEN does not replay the past)
    waited_ms: how long the new session waited for one, ms, before its poll
    found_by_poll: jobs the safety-net poll claimed
    missed_notifications_caught_by_poll: of those, the jobs no notification announced
    timeline: when each thing happened (a :class:`RestartTimeline`)
    """

    channel: str
    job_id: int
    notifications_received: int
    waited_ms: float
    found_by_poll: int
    missed_notifications_caught_by_poll: int
    timeline: RestartTimeline


def missed_while_not_listening(lab: Lab, *, safety_poll_ms: float = 1000) -> MissedWhileAway:
    """The worker restarts: its old session (and its LISTEN) is gone when a producer commits
    a job and its NOTIFY.  The new session LISTENs and waits ``safety_poll_ms``: no
    notification comes (LISTEN does not replay the past).  Its safety-net poll claims from
    the table and finds the job.  A :class:`MissedWhileAway`."""
    check_params(safety_poll_ms=safety_poll_ms)
    create_table(lab)
    ch = channel(lab)
    old = producer = worker = None
    try:
        old = lab.connect(role="wake-old")
        listen(old, ch)
        down = one_row(old.execute(_q("clock")), "wakeup.sql's clock")[0]
        old.close()                                    # the worker goes down for a restart
        producer = lab.connect(role="wake-enqueue")
        job_id = one_row(producer.execute(_q("enqueue_and_notify"), {"channel": ch}),
                         "wakeup.sql's enqueue_and_notify")[0]
        worker = lab.connect(role="wake-worker")       # the new worker process is up
        listen(worker, ch)
        listening = one_row(worker.execute(_q("clock")), "wakeup.sql's clock")[0]
        t = time.monotonic()
        got = _received(worker, safety_poll_ms / 1000)
        waited_ms = (time.monotonic() - t) * 1000
        announced = {n.payload for n in got}
        found, waits = [], {}
        while (c := _claim(worker, "wake-worker", LEASE_S)) is not None:
            found.append(c[0])
            waits[c[0]] = c[1]
        missed = [i for i in found if str(i) not in announced]
        enqueued = dict(lab.execute(_q("enqueued_times")))[job_id]
        timeline = RestartTimeline(
            down=0.0, enqueued=round(enqueued - down, 4), listening=round(listening - down, 4),
            claimed=round(enqueued - down + waits.get(job_id, float("nan")) / 1000, 4))
        return MissedWhileAway(channel=ch, job_id=job_id, notifications_received=len(got),
                               waited_ms=round(waited_ms, 1), found_by_poll=len(found),
                               missed_notifications_caught_by_poll=len(missed), timeline=timeline)
    finally:
        _close(old, producer, worker)


# -- a real worker process: polling against notification -----------------------------------------


def wake_worker(ctx: Context, dsn: str, schema: str, mode: str, channel: str, jobs: int,
                poll_ms: float, safety_poll_ms: float, deadline_s: float) -> dict:
    """The worker process.  ``poll``: claim until the table is empty, sleep ``poll_ms``,
    again.  ``notify``: LISTEN, then the same claims on every wake-up, a wake-up being a
    notification or ``safety_poll_ms`` without one.  Ends once it has claimed ``jobs``.
    Returns plain values (they go back to :func:`latency` through the worker's pipe):
    ``claimed`` (job id, latency ms, what woke it), ``wakes`` (server clock, what woke it,
    jobs claimed), ``wakeups``, ``idle_wakeups``, ``claim_queries``,
    ``notifications_received`` and ``missed``."""
    with open_connection(dsn, schema=schema, role="wake-worker", guards=WORKER_GUARDS) as conn:
        if mode == "notify":
            listen(conn, channel)
        claimed: list[tuple[int, float, str]] = []       # (job id, latency ms, what woke us)
        wakes: list[tuple[float, str, int]] = []         # (server clock, what woke us, jobs claimed)
        ready = False
        announced: set[str] = set()
        wakeups = idle_wakeups = claim_queries = notified = 0
        source = "poll"                                  # the sweep right after LISTEN
        deadline = time.monotonic() + deadline_s
        while len(claimed) < jobs and time.monotonic() < deadline:
            wakeups += 1
            before = len(claimed)
            woke_at = one_row(conn.execute(_q("clock")), "wakeup.sql's clock")[0]
            while (c := _claim(conn, ctx.name, LEASE_S)) is not None:
                claim_queries += 1
                claimed.append((c[0], c[1], source))
            claim_queries += 1                           # the claim that found nothing
            idle_wakeups += len(claimed) == before
            wakes.append((woke_at, source, len(claimed) - before))
            if not ready:                                # the first sweep is done: the producer may
                ctx.emit("ready", pid=conn.info.backend_pid)   # start, and every job is then announced
                ready = True
            if len(claimed) >= jobs:
                break
            if mode == "poll":
                time.sleep(poll_ms / 1000)
                source = "poll"
            else:
                got = _received(conn, safety_poll_ms / 1000, stop_after=1)
                notified += len(got)
                announced.update(n.payload for n in got)
                source = "notify" if got else "poll"
        if mode == "notify" and any(s == "poll" for _, _, s in claimed):
            # a notification may still be on its way for a job a safety poll claimed
            got = _received(conn, 0.05)
            notified += len(got)
            announced.update(n.payload for n in got)
        missed = sum(1 for i, _, s in claimed if s == "poll" and str(i) not in announced)
        return {"claimed": claimed, "wakes": wakes, "wakeups": wakeups, "idle_wakeups": idle_wakeups,
                "claim_queries": claim_queries, "notifications_received": notified,
                "missed": missed if mode == "notify" else 0}


def arrivals(jobs: int, poll_ms: float, seed: int = 0) -> list[float]:
    """When each job is enqueued, in seconds from the start: gaps drawn uniformly from
    0.1 to 1.1 poll intervals.  A gap spread over a whole poll interval puts each arrival
    at a uniformly random phase of the worker's poll cycle, whatever the previous one was;
    ``seed`` makes the schedule repeatable."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(jobs):
        t += rng.uniform(*GAP) * poll_ms / 1000
        out.append(t)
    return out


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100), interpolated between the nearest ranks."""
    xs = sorted(values)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


class JobWait(NamedTuple):
    """One job of a worker's run, in seconds on the server's clock from the run's first
    enqueue (a tuple: JSON prints it as a list, in this order).

    job_id: the job's id
    enqueued_s: when it was enqueued
    claimed_s: when the worker claimed it
    woke_by: what woke the worker before that claim: "poll" (a poll, or the first sweep) or "notify"
    """

    job_id: int
    enqueued_s: float
    claimed_s: float
    woke_by: str


class WakeUp(NamedTuple):
    """One time a worker woke and claimed, in seconds on the server's clock from the run's
    first enqueue (a tuple: JSON prints it as a list, in this order).

    at_s: when it woke (before the first enqueue for its first sweep: negative)
    woke_by: what woke it: "poll" or "notify"
    claimed: jobs it claimed on that wake-up
    """

    at_s: float
    woke_by: str
    claimed: int


@dataclass(frozen=True)
class WorkerTimeline(Result):
    """One worker's run on the server's clock, from the first enqueue: what
    :func:`plot_wakeups` draws in that worker's lane.

    jobs: each job's enqueue and claim, by job id (a :class:`JobWait` each)
    wakeups: each time the worker woke and claimed, in order (a :class:`WakeUp` each)
    """

    jobs: list[JobWait]
    wakeups: list[WakeUp]


@dataclass(frozen=True)
class Latency(Result):
    """One worker process, polling or notified, and the enqueue-to-claim wait of each job,
    measured on the server's clock (:func:`latency`).

    mode: how the worker was woken: "poll" or "notify"
    jobs: jobs enqueued
    poll_ms: the polling worker's interval, ms (what spaced the arrivals in either mode)
    safety_poll_ms: the notified worker's safety-net poll, ms
    latency_ms_p50: the median enqueue-to-claim wait, ms
    latency_ms_p99: the 99th percentile of that wait, ms
    latency_ms_max: the longest wait, ms
    claims_from_poll: claims made after a poll woke the worker (or in its first sweep)
    claims_from_notify: claims made after a notification woke it
    wakeups: times the worker woke
    idle_wakeups: wake-ups whose claims found nothing (the cost of polling)
    claim_queries: claim queries it ran, the empty ones included
    notifications_received: notifications it received
    missed_notifications_caught_by_poll: jobs a poll claimed that no notification announced
    wall_s: seconds from the first enqueue to the worker's end, on this machine's clock
    latencies_ms: each job's wait, ms, by job id
    timeline: the run on the server's clock (a :class:`WorkerTimeline`)
    """

    mode: str
    jobs: int
    poll_ms: float
    safety_poll_ms: float
    latency_ms_p50: float
    latency_ms_p99: float
    latency_ms_max: float
    claims_from_poll: int
    claims_from_notify: int
    wakeups: int
    idle_wakeups: int
    claim_queries: int
    notifications_received: int
    missed_notifications_caught_by_poll: int
    wall_s: float
    latencies_ms: list[float]
    timeline: WorkerTimeline


def latency(lab: Lab, *, jobs: int = 20, poll_ms: float = 500, safety_poll_ms: float = 5000,
            mode: str = "notify", seed: int = 0) -> Latency:
    """A worker process waits for work (``mode`` "poll" or "notify"); this process enqueues
    ``jobs`` jobs at the times :func:`arrivals` gives (in notify mode each with its NOTIFY, in
    the same statement).  The worker measures each job's enqueue-to-claim latency on the
    server's clock: a :class:`Latency`."""
    check_params(jobs=jobs, poll_ms=poll_ms, safety_poll_ms=safety_poll_ms, mode=mode)
    number("seed", seed, low=0, high=2**31, whole=True, example=0)
    create_table(lab)
    ch = channel(lab)
    at = arrivals(jobs, poll_ms, seed)
    deadline_s = at[-1] + safety_poll_ms / 1000 + 60
    enqueue = _q("enqueue_and_notify") if mode == "notify" else _q("enqueue")
    w = Worker(wake_worker, name=f"wake {mode}", dsn=lab.db.dsn, schema=lab.schema, mode=mode,
               channel=ch, jobs=jobs, poll_ms=poll_ms, safety_poll_ms=safety_poll_ms,
               deadline_s=deadline_s)
    producer = None
    try:
        w.start()
        w.wait_for("ready", timeout=60)
        producer = lab.connect(role="wake-enqueue")
        t0 = time.monotonic()
        for due in at:
            pause = t0 + due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            producer.execute(enqueue, {"channel": ch})
        done = w.join(deadline_s + 30)
        wall_s = time.monotonic() - t0
    finally:
        w.kill()
        _close(producer)
    r = (done or {}).get("result") or {}
    claimed = r.get("claimed", [])
    if len(claimed) != jobs:
        raise LabkitError(f"The {mode} worker claimed {len(claimed)} of {jobs} jobs before its "
                          "deadline.", "check the server's load with `labkit doctor` and run again.")
    by_id = sorted(claimed)
    lat = [ms for _, ms, _ in by_id]
    enqueued = dict(lab.execute(_q("enqueued_times")))
    t0 = min(enqueued.values())
    timeline = WorkerTimeline(
        jobs=[JobWait(i, round(enqueued[i] - t0, 4), round(enqueued[i] - t0 + ms / 1000, 4), s)
              for i, ms, s in by_id],
        wakeups=[WakeUp(round(at - t0, 4), s, n) for at, s, n in r["wakes"]])
    return Latency(mode=mode, jobs=jobs, poll_ms=poll_ms, safety_poll_ms=safety_poll_ms,
                   latency_ms_p50=round(percentile(lat, 50), 2),
                   latency_ms_p99=round(percentile(lat, 99), 2),
                   latency_ms_max=round(max(lat), 2),
                   claims_from_poll=sum(1 for *_, s in claimed if s == "poll"),
                   claims_from_notify=sum(1 for *_, s in claimed if s == "notify"),
                   wakeups=r["wakeups"], idle_wakeups=r["idle_wakeups"],
                   claim_queries=r["claim_queries"],
                   notifications_received=r["notifications_received"],
                   missed_notifications_caught_by_poll=r["missed"],
                   wall_s=round(wall_s, 2), latencies_ms=[round(x, 2) for x in lat],
                   timeline=timeline)


def saves(r: NotifyTrace) -> tuple[bool, str]:
    """The shape of :func:`notify_trace`'s result that notebook 12 asserts, and what was
    measured: the notified worker's median wait is under a fifth of the polling worker's, and
    the polling worker's worst (longest) wait is within one and a half intervals (one
    interval, plus the claim).  Both waits are on the server's clock."""
    holds = (r.notify_latency_ms_p50 * 5 < r.poll_latency_ms_p50
             and r.poll_latency_ms_max <= r.poll_ms * 1.5)
    return holds, (f"median {r.notify_latency_ms_p50:g} ms notified against "
                   f"{r.poll_latency_ms_p50:g} ms polling; polling's worst "
                   f"{r.poll_latency_ms_max:g} ms, every {r.poll_ms:g} ms")


@dataclass(frozen=True)
class WakeTimelines(Result):
    """The three runs of :func:`notify_trace` on the server's clock: what
    :func:`plot_wakeups` draws.

    poll: the polling worker's run (a :class:`WorkerTimeline`)
    notify: the notified worker's run (a :class:`WorkerTimeline`)
    restart: the restarted listener's run (a :class:`RestartTimeline`)
    """

    poll: WorkerTimeline
    notify: WorkerTimeline
    restart: RestartTimeline


@dataclass(frozen=True)
class NotifyTrace(Result):
    """Polling against notification on the same arrivals, then a restart that misses a
    notification (:func:`notify_trace`; what ``labkit trace notify --json`` prints).  Every
    wait is enqueue to claim, on the server's clock.

    jobs: jobs enqueued in each worker's run
    poll_ms: the polling worker's interval, ms
    safety_poll_ms: the notified worker's safety-net poll, ms (and the restarted worker's wait before its poll)
    poll_latency_ms_p50: the polling worker's median wait, ms
    poll_latency_ms_p99: the polling worker's 99th-percentile wait, ms
    poll_latency_ms_max: the polling worker's longest wait, ms
    notify_latency_ms_p50: the notified worker's median wait, ms
    notify_latency_ms_p99: the notified worker's 99th-percentile wait, ms
    notify_latency_ms_max: the notified worker's longest wait, ms
    poll_over_notify_p50: how many times shorter the notified worker's median wait is
    poll_idle_wakeups: the polling worker's wake-ups that found nothing
    notify_idle_wakeups: the notified worker's wake-ups that found nothing
    poll_claim_queries: claim queries the polling worker ran, the empty ones included
    notify_claim_queries: claim queries the notified worker ran, the empty ones included
    claims_from_notify: the notified worker's claims made after a notification
    claims_from_poll: the notified worker's claims made after a safety poll (or its first sweep)
    missed_notifications_caught_by_poll: jobs of the restart that no notification announced, found by the poll
    missed_waited_ms: how long the restarted worker waited, ms, before its poll found that job
    notification_queue_usage: the share of the notification queue in use at the end, 0 to 1
        (0 when every listener reads)
    timeline: the three runs on the server's clock (a :class:`WakeTimelines`)
    """

    jobs: int
    poll_ms: float
    safety_poll_ms: float
    poll_latency_ms_p50: float
    poll_latency_ms_p99: float
    poll_latency_ms_max: float
    notify_latency_ms_p50: float
    notify_latency_ms_p99: float
    notify_latency_ms_max: float
    poll_over_notify_p50: float
    poll_idle_wakeups: int
    notify_idle_wakeups: int
    poll_claim_queries: int
    notify_claim_queries: int
    claims_from_notify: int
    claims_from_poll: int
    missed_notifications_caught_by_poll: int
    missed_waited_ms: float
    notification_queue_usage: float
    timeline: WakeTimelines


def notify_trace(lab: Lab, *, jobs: int = 20, poll_ms: float = 500, safety_poll_ms: float = 1000,
                 seed: int = 0) -> NotifyTrace:
    """Polling against notification on the same arrivals (:func:`latency` in each mode), then
    the restart that misses a notification (:func:`missed_while_not_listening`).
    ``safety_poll_ms`` is the notified worker's safety-net poll (and what the restarted
    worker waits before its poll finds the missed job).  About ``1.2 x jobs x poll_ms`` plus
    ``safety_poll_ms`` plus two process starts.  A :class:`NotifyTrace`, whose ``timeline``
    :func:`plot_wakeups` draws."""
    check_params(jobs=jobs, poll_ms=poll_ms, safety_poll_ms=safety_poll_ms)
    p = latency(lab, jobs=jobs, poll_ms=poll_ms, safety_poll_ms=safety_poll_ms, mode="poll", seed=seed)
    n = latency(lab, jobs=jobs, poll_ms=poll_ms, safety_poll_ms=safety_poll_ms, mode="notify", seed=seed)
    m = missed_while_not_listening(lab, safety_poll_ms=safety_poll_ms)
    return NotifyTrace(
        jobs=jobs, poll_ms=poll_ms, safety_poll_ms=safety_poll_ms,
        poll_latency_ms_p50=p.latency_ms_p50, poll_latency_ms_p99=p.latency_ms_p99,
        poll_latency_ms_max=p.latency_ms_max,
        notify_latency_ms_p50=n.latency_ms_p50, notify_latency_ms_p99=n.latency_ms_p99,
        notify_latency_ms_max=n.latency_ms_max,
        poll_over_notify_p50=round(p.latency_ms_p50 / max(n.latency_ms_p50, 0.01), 1),
        poll_idle_wakeups=p.idle_wakeups, notify_idle_wakeups=n.idle_wakeups,
        poll_claim_queries=p.claim_queries, notify_claim_queries=n.claim_queries,
        claims_from_notify=n.claims_from_notify, claims_from_poll=n.claims_from_poll,
        missed_notifications_caught_by_poll=m.missed_notifications_caught_by_poll,
        missed_waited_ms=m.waited_ms,
        notification_queue_usage=lab.execute(_q("queue_usage"))[0][0],
        timeline=WakeTimelines(poll=p.timeline, notify=n.timeline, restart=m.timeline))


# -- the picture: when jobs arrive, and when each worker notices them ------------------------


def _sub_rows(jobs: list[JobWait], margin: float) -> list[int]:
    """A sub-row for each job (in the order given) so that no two waits on one sub-row
    overlap, nor come within ``margin`` of each other: the first sub-row that is free."""
    ends: list[float] = []
    rows = []
    for _, enq, claimed, _ in jobs:
        row = next((k for k, e in enumerate(ends) if e + margin < enq), len(ends))
        if row == len(ends):
            ends.append(claimed)
        else:
            ends[row] = claimed
        rows.append(row)
    return rows


def plot_wakeups(t: NotifyTrace):
    """:func:`notify_trace`'s ``timeline`` drawn, one lane per worker, on the server's clock:
    each job's enqueue (open circle) and claim (filled), the wait between them (a bar; waits
    that overlap go on sub-rows of their lane, one above the other), and each time the worker
    woke and claimed (a tick).  The polling worker's jobs wait for its next poll; the
    notified worker's are claimed as their NOTIFY arrives at commit; the restarted worker
    (its own run, from the moment its old session went) never hears the NOTIFY sent while it
    was away, LISTENs again with no sweep after it, and its safety-net poll finds the job.
    Returns the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    from ..core.plots import PALETTE

    if not isinstance(t, NotifyTrace):
        raise LabkitError("plot_wakeups draws what notify_trace returns.",
                          "pass t = wakeup.notify_trace(lab, ...).")
    tl, poll_ms, safety_ms = t.timeline, t.poll_ms, t.safety_poll_ms
    lanes = [(tl.poll, f"polling every\n{poll_ms:g} ms", t.poll_latency_ms_p50),
             (tl.notify, "LISTEN, woken\nby NOTIFY", t.notify_latency_ms_p50)]
    r = tl.restart
    wait_c, job_c, idle_c, lost_c, listen_c = (PALETTE[1], PALETTE[0], PALETTE[7], PALETTE[2],
                                               PALETTE[3])
    end = max([j.claimed_s for lane, _, _ in lanes for j in lane.jobs] + [r.claimed + 1.1])
    margin = 0.025 * (end + 0.15)           # about a marker's width, in seconds
    step = 0.26                             # between the sub-rows of a lane
    fig, ax = plt.subplots(figsize=(12, 6.2))
    labels, ys = [], []
    for row, (lane, name, median) in enumerate(lanes):
        y = 2.1 - row * 1.05
        ys.append(y)
        sub = _sub_rows(lane.jobs, margin)
        n = max(sub, default=0) + 1
        at = [y + (n - 1) / 2 * step - k * step for k in sub]
        for (_, enq, claimed, _), yy in zip(lane.jobs, at):
            ax.plot([enq, claimed], [yy, yy], color=wait_c, lw=9, solid_capstyle="butt", zorder=1)
        ax.plot([j.enqueued_s for j in lane.jobs], at, "o", mfc="white", mec=job_c, mew=2, ms=11,
                ls="none", zorder=2)
        ax.plot([j.claimed_s for j in lane.jobs], at, "o", color=job_c, ms=7, ls="none", zorder=3)
        woke = [w.at_s for w in lane.wakeups if w.at_s >= -0.05]
        half = max(0.2, (n - 1) / 2 * step + 0.14)
        ax.vlines(woke, y - half, y + half, color=idle_c, lw=1.5, zorder=0)
        labels.append(f"{name}\nmedian wait {median:.3g} ms")
    # the restart: the job and its NOTIFY commit after the old session went, before the new
    # LISTEN; no sweep follows that LISTEN here, so the first claim is the safety-net poll
    y = 0
    ys.append(y)
    ax.plot([r.enqueued, r.claimed], [y, y], color=wait_c, lw=9, solid_capstyle="butt")
    ax.plot([r.enqueued], [y], "o", mfc="white", mec=job_c, mew=2, ms=11, zorder=2)
    ax.plot([r.enqueued], [y + 0.36], "x", color=lost_c, ms=14, mew=3)
    ax.plot([r.listening], [y - 0.36], "^", color=listen_c, ms=13)
    ax.vlines([r.claimed], y - 0.2, y + 0.2, color=idle_c, lw=1.5, zorder=0)
    ax.plot([r.claimed], [y], "o", color=job_c, ms=7, zorder=3)
    ax.annotate("its NOTIFY, sent while no session listened", (r.enqueued, y + 0.36),
                xytext=(14, 0), textcoords="offset points", va="center")
    ax.annotate("the new LISTEN, and no sweep after it (on purpose)", (r.listening, y - 0.36),
                xytext=(14, 0), textcoords="offset points", va="center")
    ax.annotate(f"the safety-net poll, {safety_ms / 1000:g} s after the LISTEN",
                (r.claimed, y), xytext=(14, 0), textcoords="offset points", va="center")
    labels.append("a restarted\nlistener")
    ax.set_yticks(ys)
    ax.set_yticklabels(labels)
    ax.set_ylim(-0.6, 2.75)
    ax.set_xlim(-0.05, end + 0.1)
    ax.set_xlabel("seconds on the server's clock, from the first enqueue (the restart: from "
                  "its old session's end)")
    ax.set_title("When each worker notices a job")
    ax.spines["left"].set_visible(False)
    ax.tick_params(axis="y", length=0)
    handles = [Line2D([], [], ls="none", marker="o", mfc="white", mec=job_c, mew=2, ms=11,
                      label="enqueued"),
               Line2D([], [], ls="none", marker="o", color=job_c, ms=7, label="claimed"),
               Line2D([], [], color=wait_c, lw=9, label="the job's wait"),
               Line2D([], [], ls="none", marker="|", color=idle_c, ms=20, mew=1.5,
                      label="the worker wakes, claims"),
               Line2D([], [], ls="none", marker="x", color=lost_c, ms=12, mew=3,
                      label="a NOTIFY nobody heard"),
               Line2D([], [], ls="none", marker="^", color=listen_c, ms=12, label="a new LISTEN")]
    fig.legend(handles=handles, loc="outside lower center", ncol=3, frameon=False)
    return fig


# -- a LISTEN worker loop, in full -----------------------------------------------------------


def claim_one(conn: psycopg.Connection, worker: str = "listener") -> int | None:
    """Claim the most urgent due job (production.sql "claim": SKIP LOCKED, a lease), run it
    (here there is nothing to run) and mark it done; its id, or None when nothing is due."""
    with conn.transaction():
        row = conn.execute(query("production.sql", "claim").sql,
                           {"worker": worker, "lease_s": LEASE_S}).fetchone()
    if row is None:
        return None
    job_id, version = row[0], row[5]
    conn.execute(query("production.sql", "complete").sql,
                 {"id": job_id, "claim_version": version})
    return job_id


class ListenWorker:
    """A worker woken by NOTIFY that loses no job:

    * its own autocommit connection (never through a transaction pooler): LISTEN first, then
      a sweep of the table, so that a job committed before the LISTEN is found by the sweep
      and one committed after it is announced;
    * on every wake-up, a notification or ``safety_poll_s`` without one, it claims until
      nothing is due: a notification may stand for several jobs, and one that never came
      costs a safety poll's delay, never a job;
    * a connection that dies (a restart, a network cut, pg_terminate_backend) is replaced
      after ``retry_s``; the new one LISTENs and sweeps again;
    * stop() ends it within ``tick_s``, once the job in hand is done.

    ``connect()`` opens a new autocommit connection; ``claim(conn)`` claims, runs and
    completes one job and returns its id, or None.  ``log``: (seconds since start, what
    happened, job id or None)."""

    def __init__(self, connect: Callable[[], psycopg.Connection], channel: str,
                 claim: Callable[[psycopg.Connection], int | None], *,
                 safety_poll_s: float = 5.0, retry_s: float = 1.0, tick_s: float = 0.1):
        self.connect, self.channel, self.claim = connect, channel, claim
        self.safety_poll_s, self.retry_s, self.tick_s = safety_poll_s, retry_s, tick_s
        self.stopping = threading.Event()
        self.log: list[tuple[float, str, int | None]] = []
        self.started = time.monotonic()

    def note(self, what: str, job: int | None = None) -> None:
        self.log.append((round(time.monotonic() - self.started, 3), what, job))

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        """Serve until stop(); a connection that dies, or cannot be opened, is tried again."""
        while not self.stopping.is_set():
            try:
                conn = self.connect()
            except psycopg.OperationalError:            # the server is away: try again soon
                self.note("connect failed")
                self.stopping.wait(self.retry_s)
                continue
            try:
                with conn:
                    self.serve(conn)
            except psycopg.OperationalError:            # the connection died under us
                self.note("connection lost")
                self.stopping.wait(self.retry_s)
        self.note("stopped")

    def serve(self, conn: psycopg.Connection) -> None:
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
        self.note("LISTEN")
        self.drain(conn, "sweep")                   # what was committed while nobody listened
        while not self.stopping.is_set():
            woken = self.wait(conn)
            self.drain(conn, "notify" if woken else "safety poll")

    def wait(self, conn: psycopg.Connection) -> bool:
        """True when a notification came, False after safety_poll_s without one (or on stop)."""
        deadline = time.monotonic() + self.safety_poll_s
        while not self.stopping.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if list(conn.notifies(timeout=min(left, self.tick_s), stop_after=1)):
                return True
        return False

    def drain(self, conn: psycopg.Connection, why: str) -> None:
        """Claim until nothing is due (or stop())."""
        while not self.stopping.is_set():
            job = self.claim(conn)
            if job is None:
                return
            self.note(why, job)


def _until(done: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise LabkitError(f"The LISTEN worker did not {what} within {timeout_s:g} s.",
                              "check the server's load with `labkit doctor` and run again.")
        time.sleep(0.01)


@dataclass(frozen=True)
class ListenWorkerRun(Result):
    """A :class:`ListenWorker` against a scripted producer (:func:`listen_worker_run`).

    rows: (what happened, what the worker did about it), one per step of the script
    claimed: {job id: what woke the worker before it claimed that job: "notify", "safety poll" or "sweep"}
    claims: {job id: times it was claimed}, read from the table afterwards
    jobs: jobs in the table
    quiet_job: the job inserted with no NOTIFY
    away_job: the job enqueued, with its NOTIFY, while the worker had no connection
    safety_poll_after_s: seconds from the quiet job's insert to its claim by the safety poll
    listens: connections that LISTENed (2: the first, and the one after the cut)
    stopped_in_s: seconds from stop() to the worker's end
    log: the worker's log: (seconds since it started, what happened, job id or None)
    table: the rows as a text table
    """

    rows: list[tuple[str, str]]
    claimed: dict[int, str]
    claims: dict[int, int]
    jobs: int
    quiet_job: int
    away_job: int
    safety_poll_after_s: float
    listens: int
    stopped_in_s: float
    log: list[tuple[float, str, int | None]]
    table: str


def listen_worker_run(lab: Lab, *, safety_poll_s: float = 1.0) -> ListenWorkerRun:
    """A :class:`ListenWorker` in a thread of this process, and a scripted producer:

    1. three jobs enqueued with their NOTIFY (two of them in one transaction);
    2. a job inserted with no NOTIFY (a wake-up that never came): the safety poll claims it;
    3. the worker's connection ended with pg_terminate_backend, and the server made to
       refuse its reconnects for a moment (scripted, in its ``connect``); meanwhile a job
       and its NOTIFY are committed, which no session hears;
    4. the server answers again: the worker LISTENs on a new connection and its sweep
       claims that job; one more job with its NOTIFY; then stop().

    Each step waits for the worker's answer, read from its log.  A :class:`ListenWorkerRun`."""
    number("safety_poll_s", safety_poll_s, low=0.05, high=30, unit=" s", example=1)
    create_table(lab)
    ch = channel(lab)
    app = session_name(lab.schema, "listen-worker")
    server_up = threading.Event()
    server_up.set()

    def connect() -> psycopg.Connection:
        if not server_up.is_set():
            raise psycopg.OperationalError("the server refuses connections (scripted)")
        return lab.connect(role="listen-worker")

    worker = ListenWorker(connect, ch, claim_one, safety_poll_s=safety_poll_s, retry_s=0.2)
    failed: list[BaseException] = []

    def serve() -> None:
        try:
            worker.run()
        except BaseException as exc:                # reported to the script below
            failed.append(exc)

    thread = threading.Thread(target=serve, name="listen-worker", daemon=True)
    producer = lab.connect(role="wake-enqueue")
    rows: list[tuple[str, str]] = []
    seen = 0

    def claimed() -> dict[int, str]:
        return {job: why for _, why, job in worker.log if job is not None}

    def step(what: str, wait_for: Callable[[], bool] | None, timeout_s: float = 10,
             settle_s: float = 0.0) -> None:
        """One row: what the script did, then what the worker did about it (once it has;
        ``settle_s`` more for a second notification of the same commit to be served)."""
        nonlocal seen
        if wait_for is not None:
            _until(lambda: wait_for() or bool(failed), timeout_s, f"answer: {what}")
            if failed:
                raise failed[0]
            time.sleep(settle_s)
        now = len(worker.log)
        # the refused reconnects are said once, in their own row
        rows.append((what, _did(worker.log[seen:now], skip=() if "refuses" in what
                                                       else ("connect failed",))
                     if wait_for is not None else "-"))
        seen = now

    def notified(n: int = 1) -> list[int]:
        with producer.transaction():
            return [one_row(producer.execute(_q("enqueue_and_notify"), {"channel": ch}),
                            "wakeup.sql's enqueue_and_notify")[0]
                    for _ in range(n)]

    def logged(what: str) -> bool:
        return any(w == what for _, w, _ in worker.log[seen:])

    try:
        thread.start()
        step("the worker starts", lambda: logged("LISTEN"))
        first = notified()
        step(f"job {first[0]} enqueued: its NOTIFY comes at commit",
             lambda: first[0] in claimed())
        pair = notified(2)
        step(f"jobs {pair[0]}, {pair[1]} in one transaction, a NOTIFY each",
             lambda: set(pair) <= set(claimed()), settle_s=0.2)
        quiet = one_row(producer.execute(_q("enqueue")), "wakeup.sql's enqueue")[0]
        t_quiet = time.monotonic()
        step(f"job {quiet} inserted with no NOTIFY (a lost wake-up)",
             lambda: quiet in claimed(), timeout_s=safety_poll_s + 10)
        quiet_after = time.monotonic() - t_quiet
        server_up.clear()
        producer.execute(_q("terminate"), {"app": app})
        step("its connection ended by pg_terminate_backend", lambda: logged("connection lost"))
        step("the server refuses connections (scripted)", lambda: logged("connect failed"))
        _until(lambda: not producer.execute(_q("backends_of"), {"app": app}).fetchall(), 10,
               "let go of its connection")
        away = notified()
        step(f"job {away[0]} enqueued with its NOTIFY: nobody listens", None)
        server_up.set()
        step("the server takes connections again", lambda: away[0] in claimed())
        last = notified()
        step(f"job {last[0]} enqueued: its NOTIFY comes at commit",
             lambda: last[0] in claimed())
        t_stop = time.monotonic()
        worker.stop()
        thread.join(10)
        stopped_in = time.monotonic() - t_stop
        step("stop()", lambda: not thread.is_alive())
        if failed:
            raise failed[0]
    finally:
        worker.stop()
        server_up.set()
        thread.join(10)
        _close(producer)
    claims = dict(lab.execute("SELECT id, attempts FROM job ORDER BY id"))
    table = text_table(["what happened", "what the worker did"], [list(r) for r in rows])
    return ListenWorkerRun(rows=rows, claimed=claimed(), claims=claims, jobs=len(claims),
                           quiet_job=quiet, away_job=away[0],
                           safety_poll_after_s=round(quiet_after, 2),
                           listens=sum(1 for _, w, _ in worker.log if w == "LISTEN"),
                           stopped_in_s=round(stopped_in, 2), log=list(worker.log), table=table)


def _did(log: list[tuple[float, str, int | None]], skip: tuple[str, ...] = ()) -> str:
    """A stretch of the worker's log in words: the jobs each kind of wake-up claimed, and
    repeats said once."""
    parts: list[str] = []
    for _, what, job in log:
        if what in skip:
            continue
        if job is None:
            if not parts or parts[-1] != what:
                parts.append(what)
        elif parts and parts[-1].startswith(f"{what}: claimed job"):
            parts[-1] = parts[-1].replace("claimed job ", "claimed jobs ", 1) + f", {job}"
        else:
            parts.append(f"{what}: claimed job {job}")
    return "; ".join(parts) or "-"


# -- command line: labkit notify ------------------------------------------------------------------


def notify_command(*, open_lab: Callable[[], Lab], jobs: int = 20, poll_ms: float = 500,
                   safety_poll_ms: float = 1000, json: bool = False) -> int:
    """``labkit notify [--jobs 20] [--poll-ms 500] [--safety-poll-ms 1000] [--json]``: the
    same arrivals to a polling worker and to a notified one, and a restart that misses a
    notification.  ``open_lab()`` gives the run its own lab (dropped at the end)."""
    check_params(jobs=jobs, poll_ms=poll_ms, safety_poll_ms=safety_poll_ms)   # before the lab
    with open_lab() as lab:
        r = notify_trace(lab, jobs=jobs, poll_ms=poll_ms, safety_poll_ms=safety_poll_ms)
    if json:
        print(r.to_json())
        return 0
    print(f"{jobs} jobs, one every {sum(GAP) / 2 * poll_ms:g} ms on average; enqueue to claim, "
          "on the server's clock")
    print(f"  polling every {poll_ms:g} ms:  p50 {r.poll_latency_ms_p50:8.1f} ms   "
          f"p99 {r.poll_latency_ms_p99:8.1f} ms   {r.poll_claim_queries} claim queries")
    print(f"  LISTEN/NOTIFY:        p50 {r.notify_latency_ms_p50:8.1f} ms   "
          f"p99 {r.notify_latency_ms_p99:8.1f} ms   {r.notify_claim_queries} claim queries "
          f"({r.claims_from_notify} claims after a notification, {r.claims_from_poll} "
          f"after a safety poll)")
    print(f"  the notified worker's median is {r.poll_over_notify_p50:g}x shorter")
    print(f"  a restart: {r.missed_notifications_caught_by_poll} job enqueued while no one "
          f"listened, found by the safety-net poll after {r.missed_waited_ms:g} ms")
    return 0
