"""When the server goes away: a restart, and a failover to a standby (notebook 19).

Both run on the lab's own throw-away servers (:class:`labkit.core.replica.ReplicaPair`), never
on the workbook's shared one, and every query is named in ``labkit/sql/failover.sql``.

:func:`restart_trace` -- a worker holds one job by a session advisory lock and another by a
committed row claim with a lease; the server restarts (an immediate shutdown, as ``pg_ctl
restart -m immediate``: the server's processes crash, and the next start recovers from the
WAL).  A restart keeps what was
committed and takes everything that lived in a session: the advisory lock goes with the
session that held it, so a second worker claims that job while the first still runs it; the
lease is a committed row, so nobody takes the other job until it runs out.

:func:`failover_trace` -- workers claim and complete jobs, a relay publishes the outbox, a
zombie's lease runs out and another worker claims its job; the primary crashes and the
standby is promoted.  With asynchronous replication, what the primary acknowledged and had not
yet sent is gone: completions (the jobs run again), marks (the events are published again) and
claims (a fencing token's version is handed out a second time, so the zombie's fenced write
passes).  With a synchronous standby, no acknowledged commit is lost and the fence holds; each
commit costs a round trip to the standby, measured in the same run.

The lab arranges one moment: it cuts the standby off (:meth:`ReplicaPair.cut_standby`) just
before the last commits, so that the standby is certainly behind when the primary dies.  A real
standby is behind by its replication lag, which the trace measures while the workers run
(``flush_lag_ms_max``): on one machine through a Unix socket it is small, across a network and
under load it is larger, and every acknowledged commit inside it is lost the same way.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from typing import Protocol

import psycopg

from ..core.checked import one_row
from ..core.errors import LabkitError
from ..core.load import shape
from ..core.queries import query
from ..core.replica import REPLICATIONS, Node, ReplicaPair
from ..core.results import Result
from ..core.text import table

SQL = "failover.sql"
LEASE = "30 seconds"
LEASE_TEXT = "30 s"
SHORT_LEASE = "100 milliseconds"


def q(name: str) -> str:
    return query(SQL, name).sql


def make_scene(node: Node, jobs: int) -> None:
    with node.connect(name="labkit:pair:setup") as conn:
        for statement in query(SQL, "scene").statements:
            conn.execute(statement)
        conn.execute(q("enqueue"), {"n": jobs})


def _lost(exc: BaseException) -> str:
    """A client's view of a connection the server took with it (stable words only)."""
    return "the connection is gone" if isinstance(exc, psycopg.OperationalError) else type(exc).__name__


# -- a restart --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RestartRun(Result):
    """A restart under a running worker (:func:`restart_trace`).

    advisory_claims_run_twice: jobs claimed by a session advisory lock that ran twice
    row_claims_run_twice: jobs claimed by a committed row with a lease that ran twice
    runs: {job id: [workers that ran it]}
    kept: what the restart kept (committed state)
    lost: what the restart took (everything that lived in a session or an open transaction)
    rows: the run, step by step: (what happened, what the server said)
    """

    advisory_claims_run_twice: int
    row_claims_run_twice: int
    runs: dict[int, list[str]]
    kept: list[str]
    lost: list[str]
    rows: list[tuple[str, str]]


def row_of(conn: psycopg.Connection, name: str, params: dict | None = None) -> tuple:
    """The one row the named query always returns."""
    return one_row(conn.execute(q(name), params), name)


def value_of(conn: psycopg.Connection, name: str, params: dict | None = None):
    """The first column of that row."""
    return row_of(conn, name, params)[0]


def _before_restart(node: Node, w1: psycopg.Connection, w1_tx: psycopg.Connection,
                    rows: list[tuple[str, str]]) -> int:
    """w1 takes job 1 by an advisory lock and job 2 by a lease, LISTENs, and leaves job 3's
    update uncommitted; the version of its job 2 claim."""
    got = value_of(w1, "advisory_claim", {"id": 1})
    rows.append(("w1: pg_try_advisory_lock(1)", f"{got}: job 1 is w1's while w1's session lives"))
    claimed = row_of(w1, "lease_claim", {"worker": "w1", "lease": LEASE, "ids": [2]})
    rows.append((f"w1: claims job 2 with a {LEASE_TEXT} lease (a committed row)",
                 f"job {claimed[0]} RUNNING, version {claimed[1]}"))
    w1.execute("LISTEN job_events")
    w1_tx.execute("UPDATE job SET status = 'DONE' WHERE id = 3")
    rows.append(("w1: LISTEN job_events; another session of w1's marks job 3 DONE, not committed",
                 "both live only in w1's sessions"))
    with node.connect(name="labkit:pair:monitor") as monitor:
        rows.append(("the server's advisory locks before the restart",
                     f"{value_of(monitor, 'advisory_locks_held')} held"))
    return int(claimed[1])


def _after_restart(node: Node, rows: list[tuple[str, str]]) -> dict:
    """w2 claims what it can after the restart; what the server holds then."""
    with node.connect(name="labkit:pair:w2") as w2:
        candidates = [r[0] for r in w2.execute(q("advisory_candidates")).fetchall()]
        taken = next((j for j in candidates if value_of(w2, "advisory_claim", {"id": j})), None)
        rows.append(("w2: pg_try_advisory_lock on the first pending job",
                     f"job {taken}: true (w1's lock went with w1's session)"))
        lease = w2.execute(q("lease_claim"), {"worker": "w2", "lease": LEASE, "ids": [2]}).fetchone()
        rows.append(("w2: claims job 2 by its lease",
                     "no row: job 2's lease is committed and has not run out"
                     if lease is None else f"job {lease[0]}"))
        w2.execute(q("record_run"), {"id": taken, "worker": "w2", "claim": "advisory"})
        return {"w1_sessions": value_of(w2, "sessions_named", {"name": "labkit:pair:w1"}),
                "job3": value_of(w2, "job_state", {"id": 3}),
                "job2": row_of(w2, "job_state", {"id": 2}),
                "advisory": value_of(w2, "advisory_locks_held")}


def restart_trace() -> RestartRun:
    """Worker w1 holds job 1 by ``pg_try_advisory_lock`` and job 2 by a leased row claim; a
    LISTEN and an open transaction (on job 3) live in its sessions; the server restarts; w2
    claims what it can; both finish."""
    rows: list[tuple[str, str]] = []
    with ReplicaPair(standby=False) as pair:
        node = pair.primary
        assert node is not None
        make_scene(node, 3)
        # closing(): the two connections die with the restart, so nothing is committed on the way out
        with closing(node.connect(name="labkit:pair:w1")) as w1, \
                closing(node.connect(name="labkit:pair:w1-tx", autocommit=False)) as w1_tx:
            version = _before_restart(node, w1, w1_tx, rows)
            node.restart()
            rows.append(("the server restarts: an immediate shutdown (SIGQUIT, as pg_ctl restart -m "
                         "immediate), then recovery from the WAL", "accepting connections again"))
            try:
                w1.execute("SELECT 1")
                w1_state = "still open"
            except psycopg.Error as exc:
                w1_state = _lost(exc)
            rows.append(("w1's connection", w1_state))
            after = _after_restart(node, rows)
        # w1 still ran its two jobs while the server was away; it reconnects to report them.
        with node.connect(name="labkit:pair:w1-again") as again:
            again.execute(q("record_run"), {"id": 1, "worker": "w1", "claim": "advisory"})
            again.execute(q("record_run"), {"id": 2, "worker": "w1", "claim": "lease"})
            again.execute(q("complete"), {"id": 2, "version": version})
            per_job = again.execute(q("runs_per_job")).fetchall()
            names = again.execute(q("runs_by_worker")).fetchall()
    rows.append(("w1 and w2 finish; each records its run (scripted: w1 after reconnecting)",
                 "; ".join(f"job {j} ran {n}x ({claim})" for j, claim, n in per_job)))
    job2 = after["job2"]
    return RestartRun(
        advisory_claims_run_twice=sum(1 for _, claim, n in per_job if claim == "advisory" and n > 1),
        row_claims_run_twice=sum(1 for _, claim, n in per_job if claim == "lease" and n > 1),
        runs={job: workers.split(",") for job, workers in names},
        kept=[f"job 2's committed claim: {job2[0]}, worker {job2[1]}, version {job2[2]}"],
        lost=[f"w1's advisory lock on job 1 (advisory locks held after the restart by any session "
              f"but w2's: {after['advisory']})",
              f"w1's LISTEN, with w1's session (its sessions after the restart: {after['w1_sessions']})",
              f"job 3's uncommitted update (job 3 is {after['job3']} again)"],
        rows=rows)


# -- a failover ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FailoverRun(Result):
    """A failover to the standby (:func:`failover_trace`).

    replication: "async" or "sync" (the standby is the primary's synchronous standby)
    acknowledged: commits the primary acknowledged after the standby was cut off
    lost_commits: of those, commits the promoted standby does not have
    jobs_run_again: jobs whose completion was acknowledged and that ran again after the failover
    events_published_twice: events the broker received more than once (the inbox drops them)
    events_missing: jobs the new primary holds as done whose event never reached the broker
    marks_lost: events marked published (acknowledged) that were unmarked after the failover
    in_flight: commits that were waiting for the standby when the primary died (never acknowledged)
    fence_version_reissued: a job's version was handed to a second worker after the failover
    zombie_write_accepted: the old holder's write, fenced by its version, passed on the new primary
    zombie_write_accepted_with_epoch: the same write fenced by (epoch, version), epoch the
        timeline its claim was made on, passed
    timelines: (the old primary's timeline, the promoted standby's)
    commit_ms_p50: the median commit (claim or completion) while the standby streamed, in ms
    flush_lag_ms_max: the longest a commit the primary had flushed took to be flushed on the
        standby too, while the workers ran (pg_stat_replication.flush_lag): the window in which
        an acknowledged commit exists on the primary only
    rows: the run, step by step: (what happened, what the server said)
    """

    replication: str
    acknowledged: int
    lost_commits: int
    jobs_run_again: int
    events_published_twice: int
    events_missing: int
    marks_lost: int
    in_flight: int
    fence_version_reissued: bool
    zombie_write_accepted: bool
    zombie_write_accepted_with_epoch: bool
    timelines: tuple[int, int]
    commit_ms_p50: float
    flush_lag_ms_max: float
    rows: list[tuple[str, str]]


class _Broker:
    """The message broker: outside the database, so it survives the failover."""

    def __init__(self) -> None:
        self.received: list[str] = []
        self._lock = threading.Lock()

    def publish(self, event: str) -> None:
        with self._lock:
            self.received.append(event)


def _relay_tick(conn: psycopg.Connection, broker: _Broker, batch: int) -> list[int]:
    """Claim a batch, publish each event, mark them, commit; the ids marked (on success)."""
    with conn.transaction():
        events = conn.execute(q("relay_claim"), {"batch": batch}).fetchall()
        for _, event in events:
            broker.publish(event)
        ids = [i for i, _ in events]
        if ids:
            conn.execute(q("relay_mark"), {"ids": ids})
    return ids


def _claim_and_complete(conn: psycopg.Connection, worker: str, job: int,
                        timings: list[float] | None = None) -> tuple[int, int]:
    """Claim ``job`` (a lease), run it, complete it; (version, epoch) it held."""
    t = time.perf_counter()
    row = row_of(conn, "lease_claim", {"worker": worker, "lease": LEASE, "ids": [job]})
    t_claim = time.perf_counter() - t
    conn.execute(q("record_run"), {"id": job, "worker": worker, "claim": "lease"})
    t = time.perf_counter()
    conn.execute(q("complete"), {"id": job, "version": row[1]})
    if timings is not None:
        timings += [t_claim, time.perf_counter() - t]
    return row[1], row[2]


class _Actor(threading.Thread):
    """One client's part after the cut: its acknowledged commits, or the error that ended it."""

    def __init__(self, node: Node, name: str, work: Callable[[psycopg.Connection, list], None]):
        super().__init__(name=name, daemon=True)
        self.node, self.work = node, work
        self.conn = node.connect(name=f"labkit:pair:{name}")
        self.acked: list[tuple] = []
        self.error = ""

    def run(self) -> None:
        try:
            self.work(self.conn, self.acked)
        except psycopg.Error as exc:
            self.error = _lost(exc)
        finally:
            self.conn.close()


def _sync_waiters(node: Node) -> int:
    with node.connect(name="labkit:pair:monitor") as conn:
        return int(value_of(conn, "sync_waiters"))


def _play(node: Node, actor: _Actor, waiting: int, timeout: float = 20) -> int:
    """Start ``actor``; return once it has finished or is waiting for the standby; the number
    of sessions then waiting for it."""
    actor.start()
    deadline = time.monotonic() + timeout
    while actor.is_alive():
        now_waiting = _sync_waiters(node)
        if now_waiting > waiting:
            return now_waiting
        if time.monotonic() > deadline:
            raise LabkitError(f"{actor.name} neither finished nor waited for the standby in "
                              f"{timeout:.0f} s.", "the machine may be overloaded: run it again.")
        time.sleep(0.01)
    return waiting


class _Failover:
    """One failover run, step by step (:func:`failover_trace` calls the steps in order)."""

    def __init__(self, pair: ReplicaPair, *, jobs: int, after_cut: int, batch: int):
        assert pair.primary is not None and pair.standby is not None
        self.pair, self.primary, self.standby = pair, pair.primary, pair.standby
        self.jobs, self.after_cut, self.batch = jobs, after_cut, batch
        self.zombie_job = jobs                  # the last job: A claims it, its lease runs out, B takes it
        self.before = jobs - after_cut - 1      # jobs done before the cut
        self.late = range(self.before + 1, self.before + 1 + after_cut)   # ...and after it
        self.broker = _Broker()
        self.rows: list[tuple[str, str]] = []
        self.timings: list[float] = []
        self.lag_max = 0.0
        self.tokens: dict[str, tuple[int, int]] = {}
        self.acked: list[tuple] = []
        self.in_flight: list[str] = []
        self.timelines = (0, 0)

    def before_cut(self) -> None:
        """w1 claims and completes, the relay publishes, A claims the zombie's job; all streamed."""
        make_scene(self.primary, self.jobs)
        kind = "a synchronous" if self.pair.replication == "sync" else "an asynchronous"
        self.rows.append((f"a primary and {kind} standby; {self.jobs} jobs", "the standby streams the primary's WAL"))
        with self.primary.connect(name="labkit:pair:w1") as w1, \
                self.primary.connect(name="labkit:pair:relay", autocommit=False) as relay:
            for job in range(1, self.before + 1):
                _claim_and_complete(w1, "w1", job, self.timings)
                if job % 10 == 0:
                    self.lag_max = max(self.lag_max, self.pair.flush_lag_ms())
            while len(self.broker.received) < self.before - self.batch:
                _relay_tick(relay, self.broker, self.batch)
            row = row_of(w1, "lease_claim", {"worker": "A", "lease": SHORT_LEASE, "ids": [self.zombie_job]})
            self.tokens["A"] = (row[1], row[2])
        self.rows.append((f"w1 claims and completes jobs 1-{self.before}; the relay publishes "
                          f"{len(self.broker.received)} events and marks them", "every commit acknowledged, and streamed"))
        self.rows.append((f"worker A claims job {self.zombie_job} with a short lease",
                          f"A's token: version {row[1]}, epoch {row[2]}"))
        self.pair.wait_caught_up()
        time.sleep(0.2)             # A's lease runs out

    def _work(self, conn: psycopg.Connection, acked: list) -> None:
        """w1's next jobs: three commits each (the claim, the run's record, the completion)."""
        for job in self.late:
            row = row_of(conn, "lease_claim", {"worker": "w1", "lease": LEASE, "ids": [job]})
            acked.append(("claim", job, (row[1], row[2])))
            conn.execute(q("record_run"), {"id": job, "worker": "w1", "claim": "lease"})
            acked.append(("run", job))
            conn.execute(q("complete"), {"id": job, "version": row[1]})
            acked.append(("complete", job))

    def _relay(self, conn: psycopg.Connection, acked: list) -> None:
        conn.autocommit = False
        while ids := _relay_tick(conn, self.broker, self.batch):
            acked.append(("mark", tuple(ids)))

    def _b_claims(self, conn: psycopg.Connection, acked: list) -> None:
        row = row_of(conn, "lease_claim", {"worker": "B", "lease": LEASE, "ids": [self.zombie_job]})
        acked.append(("claim", self.zombie_job, (row[1], row[2]), "B"))

    def fail_over(self) -> None:
        """The standby is cut off; three clients commit (or wait); the primary crashes; the
        standby is promoted."""
        old_timeline = self.pair.timeline(self.primary)
        self.pair.cut_standby()
        self.rows.append(("the lab cuts the standby off (arranged: its primary_conninfo cleared)",
                          "it receives no more WAL"))
        actors = [_Actor(self.primary, "w1", self._work), _Actor(self.primary, "relay", self._relay),
                  _Actor(self.primary, "B", self._b_claims)]
        waiting = 0
        try:
            for actor in actors:
                waiting = _play(self.primary, actor, waiting)
        finally:
            self.primary.crash()
            for actor in actors:
                actor.join(20)
        self.acked = [a for actor in actors for a in actor.acked]
        self.in_flight = [a.name for a in actors if a.error]
        self.rows.append(("after the cut: w1 completes the next jobs, the relay publishes and marks, "
                          f"B claims job {self.zombie_job} (A's lease ran out)",
                          f"{len(self.acked)} commits acknowledged, {waiting} waiting for the standby"
                          + (" (wait event SyncRep)" if waiting else "")))
        self.rows.append(("the primary crashes (SIGQUIT: an immediate shutdown)",
                          f"clients waiting on it: {', '.join(self.in_flight) or 'none'}"))
        self.pair.promote()
        self.timelines = (old_timeline, self.pair.timeline(self.standby))
        self.rows.append(("the standby is promoted (pg_promote)",
                          f"timeline {self.timelines[0]} -> {self.timelines[1]}"))

    def _is_lost(self, conn: psycopg.Connection, entry: tuple) -> bool:
        """Whether the new primary lacks one acknowledged commit."""
        kind, key, *rest = entry
        if kind == "complete":
            return value_of(conn, "job_state", {"id": key}) != "DONE"
        if kind == "run":
            return not value_of(conn, "run_recorded", {"id": key, "worker": "w1"})
        if kind == "mark":
            return value_of(conn, "unmarked", {"ids": list(key)}) > 0
        if rest[1:] == ["B"]:
            self.tokens["B"] = rest[0]
        return row_of(conn, "job_state", {"id": key})[2] < rest[0][0]      # its version went back

    def count_lost(self) -> tuple[int, int]:
        """Of the acknowledged commits, how many the new primary lacks; and the marks lost."""
        with self.standby.connect(name="labkit:pair:check") as conn:
            lost = sum(self._is_lost(conn, entry) for entry in self.acked)
            marks_lost = sum(value_of(conn, "unmarked", {"ids": list(key)})
                             for kind, key, *_ in self.acked if kind == "mark")
        self.rows.append(("on the promoted standby: the acknowledged commits",
                          f"{len(self.acked) - lost} of {len(self.acked)} there, {lost} lost"))
        return lost, marks_lost

    def carry_on(self) -> dict:
        """The workers carry on against the new primary: they run what is claimable, the relay
        publishes what is unmarked, C claims the zombie's job, and the zombie writes."""
        completed = {key for kind, key, *_ in self.acked if kind == "complete"}
        with self.standby.connect(name="labkit:pair:w2") as w2, \
                self.standby.connect(name="labkit:pair:relay2", autocommit=False) as relay2:
            run_again = 0
            for job in self.late:
                row = w2.execute(q("lease_claim"), {"worker": "w2", "lease": LEASE, "ids": [job]}).fetchone()
                if row is not None:
                    w2.execute(q("complete"), {"id": job, "version": row[1]})
                    run_again += job in completed
            while _relay_tick(relay2, self.broker, self.batch):
                pass
            done = [r[0] for r in w2.execute(q("done_jobs")).fetchall()]
            c = row_of(w2, "lease_claim", {"worker": "C", "lease": LEASE, "ids": [self.zombie_job]})
            zombie = self.tokens.get("B", self.tokens["A"])
            with w2.transaction(force_rollback=True):
                epoch_write = w2.execute(q("fenced_write_epoch"), {
                    "worker": "zombie", "id": self.zombie_job, "version": zombie[0], "epoch": zombie[1]}).rowcount
            zombie_write = w2.execute(q("fenced_write"), {"worker": "zombie", "id": self.zombie_job,
                                                          "version": zombie[0]}).rowcount
        reissued = any(version == c[1] for version, _ in self.tokens.values())
        twice = sum(1 for n in Counter(self.broker.received).values() if n > 1)
        missing = len({f"job {j} done" for j in done} - set(self.broker.received))
        who = "B" if "B" in self.tokens else "A"
        self.rows.append(("w2 runs what is claimable; the relay publishes what is unmarked",
                          f"{run_again} acknowledged completions run again; {twice} events published "
                          f"twice; done jobs whose event never reached the broker: {missing}"))
        self.rows.append((f"C claims job {self.zombie_job} on the new primary",
                          f"version {c[1]}, epoch {c[2]}: "
                          + ("a version already handed out before the failover" if reissued else "a new version")))
        self.rows.append((f"the zombie {who} writes with its token (version {zombie[0]})",
                          "accepted" if zombie_write else "refused: its version is not the job's"))
        self.rows.append((f"the same write fenced by (epoch, version) = ({zombie[1]}, {zombie[0]})",
                          "accepted" if epoch_write else "refused: its epoch is an older timeline's"))
        return {"run_again": run_again, "twice": twice, "missing": missing, "reissued": reissued,
                "zombie_write": bool(zombie_write), "epoch_write": bool(epoch_write)}


def failover_trace(*, replication: str = "async", jobs: int = 160, after_cut: int = 5,
                   batch: int = 10) -> FailoverRun:
    """The failover, with ``replication`` "async" or "sync" (see the module's text)."""
    if replication not in REPLICATIONS:
        raise LabkitError(f"--replication {replication!r} is not one the trace knows.",
                          "use --replication async or --replication sync.")
    if jobs < 4 * batch or not 1 <= after_cut <= batch:
        raise LabkitError(f"jobs={jobs}, after_cut={after_cut}, batch={batch} leave no room for the trace.",
                          f"use jobs >= {4 * batch} and 1 <= after_cut <= batch.")
    with ReplicaPair(replication=replication) as pair:
        run = _Failover(pair, jobs=jobs, after_cut=after_cut, batch=batch)
        run.before_cut()
        run.fail_over()
        lost, marks_lost = run.count_lost()
        after = run.carry_on()
    timings = sorted(run.timings)
    return FailoverRun(
        replication=replication, acknowledged=len(run.acked), lost_commits=lost,
        jobs_run_again=after["run_again"], events_published_twice=after["twice"],
        events_missing=after["missing"], marks_lost=marks_lost,
        in_flight=len(run.in_flight), fence_version_reissued=after["reissued"],
        zombie_write_accepted=after["zombie_write"], zombie_write_accepted_with_epoch=after["epoch_write"],
        timelines=run.timelines, commit_ms_p50=round(timings[len(timings) // 2] * 1000, 3),
        flush_lag_ms_max=round(run.lag_max, 3), rows=run.rows)


# -- the realistic case: no arranged moment ------------------------------------------------------------


@dataclass(frozen=True)
class StreamCrash(Result):
    """An asynchronous pair whose primary crashes while a writer commits as fast as it can, at
    no arranged moment (:func:`crash_mid_stream`).

    acknowledged: commits the writer was told succeeded
    lost: of those, the ones the promoted standby lacks
    lost_are_the_newest: the lost ones are exactly the last ones acknowledged (a suffix)
    kept_unacknowledged: commits the standby has whose acknowledgement the writer never got
        (the crash came between the commit and its answer)
    ran_s: how long the writer ran before the crash
    """

    acknowledged: int
    lost: int
    lost_are_the_newest: bool
    kept_unacknowledged: int
    ran_s: float


def crash_mid_stream(*, seconds: float = 1.0) -> StreamCrash:
    """The writer commits one row at a time; after ``seconds`` the primary crashes (SIGQUIT)
    and the standby is promoted; what it kept is read back."""
    if not 0 < seconds <= 30:
        raise LabkitError(f"seconds={seconds} is not a run this trace makes.", "use 0 < seconds <= 30.")
    acked: list[int] = []
    stop = threading.Event()

    def write(conn: psycopg.Connection) -> None:
        n = 0
        try:
            while not stop.is_set():
                n += 1
                conn.execute(q("stream_commit"), {"n": n})
                acked.append(n)
        except psycopg.Error:
            pass                      # the crash: this commit's answer never came

    with ReplicaPair(replication="async") as pair:
        primary, standby = pair.primary, pair.standby
        assert primary is not None and standby is not None
        with primary.connect(name="labkit:pair:setup") as conn:
            conn.execute(q("stream_scene"))
        pair.wait_caught_up()
        with closing(primary.connect(name="labkit:pair:writer")) as conn:
            writer = threading.Thread(target=write, args=(conn,), daemon=True)
            started = time.monotonic()
            writer.start()
            time.sleep(seconds)
            primary.crash()
            ran = time.monotonic() - started
            stop.set()
            writer.join(20)
        pair.promote()
        with standby.connect(name="labkit:pair:check") as conn:
            kept = [r[0] for r in conn.execute(q("stream_kept")).fetchall()]
    kept_set, acked_set = set(kept), set(acked)
    lost = sorted(acked_set - kept_set)
    return StreamCrash(acknowledged=len(acked), lost=len(lost),
                       lost_are_the_newest=lost == acked[len(acked) - len(lost):],
                       kept_unacknowledged=len(kept_set - acked_set), ran_s=round(ran, 3))


# -- what a synchronous standby costs a commit -----------------------------------------------------


COMMIT_LEVELS = ("local", "on", "remote_apply")


@dataclass(frozen=True)
class CommitCost(Result):
    """The cost of a commit at each ``synchronous_commit`` level, on one pair whose standby is
    the primary's synchronous standby (:func:`commit_cost`).  ``local`` waits for the
    primary's own disk only: what every commit does with an asynchronous standby.  ``on``
    also waits until the standby has flushed the commit to its disk; ``remote_apply`` until it
    has replayed it, so a read on the standby sees it.

    ms_p50: {level: the median commit, in ms}
    commits: commits timed at each level (interleaved in rounds, so that each level meets the
        same machine)
    """

    ms_p50: dict[str, float]
    commits: int


def commit_cost(*, commits: int = 300, rounds: int = 6) -> CommitCost:
    """Time ``commits`` one-row commits at each level of :data:`COMMIT_LEVELS`, in ``rounds``
    interleaved blocks, on a pair with a synchronous standby."""
    if commits < rounds or rounds < 1:
        raise LabkitError(f"commits={commits} in rounds={rounds} leaves a round empty.",
                          "use commits >= rounds >= 1.")
    times: dict[str, list[float]] = {level: [] for level in COMMIT_LEVELS}
    with ReplicaPair(replication="sync") as pair:
        primary = pair.primary
        assert primary is not None
        with primary.connect(name="labkit:pair:setup") as conn:
            conn.execute(q("commit_probe_scene"))
        sessions = {level: primary.connect(name=f"labkit:pair:{level}") for level in COMMIT_LEVELS}
        try:
            for level, conn in sessions.items():
                conn.execute(f"SET synchronous_commit = {level}")
                conn.execute(q("commit_probe"))          # the first commit opens the way
            statement = q("commit_probe")
            for _ in range(rounds):
                for level, conn in sessions.items():
                    for _ in range(commits // rounds):
                        t = time.perf_counter()
                        conn.execute(statement)
                        times[level].append(time.perf_counter() - t)
        finally:
            for conn in sessions.values():
                conn.close()
    return CommitCost(ms_p50={level: round(sorted(ts)[len(ts) // 2] * 1000, 3) for level, ts in times.items()},
                      commits=len(times["on"]))


def commit_cost_checked(*, commits: int = 300, rounds: int = 6) -> CommitCost:
    """:func:`commit_cost`, with its shape asserted (a commit that waits for the standby costs
    more than one that does not), measured again before a loaded machine is blamed; the last
    measurement."""
    costs = [commit_cost(commits=commits, rounds=rounds)]

    def line(c: CommitCost) -> str:
        return f"local {c.ms_p50['local']:.3f} ms, on {c.ms_p50['on']:.3f} ms"

    def again() -> tuple[bool, str]:
        costs.append(commit_cost(commits=commits, rounds=rounds))
        return costs[-1].ms_p50["local"] < costs[-1].ms_p50["on"], line(costs[-1])

    shape(costs[0].ms_p50["local"] < costs[0].ms_p50["on"],
          "a commit that waits for the standby costs more than one that does not",
          measured=line(costs[0]), again=again)
    return costs[-1]


# -- the commands ------------------------------------------------------------------------------------


def report(run: RestartRun | FailoverRun, figures: list[str], *, json: bool) -> str:
    """A trace's report: its JSON, or its steps as a table and then its figures."""
    if json:
        return run.to_json()
    values = run.as_dict(figures)
    return steps(run) + "\n\n" + "\n".join(f"{name}: {value}" for name, value in values.items())


RESTART_FIGURES = ["advisory_claims_run_twice", "row_claims_run_twice"]
FAILOVER_FIGURES = ["lost_commits", "jobs_run_again", "events_published_twice",
                    "fence_version_reissued", "zombie_write_accepted", "commit_ms_p50"]


def restart_command(*, json: bool) -> int:
    """``labkit trace restart [--json]``."""
    print(report(restart_trace(), RESTART_FIGURES, json=json))
    return 0


def failover_command(*, replication: str, json: bool) -> int:
    """``labkit trace failover --replication async|sync [--json]``."""
    print(report(failover_trace(replication=replication), FAILOVER_FIGURES, json=json))
    return 0


class Steps(Protocol):
    """A trace's result that carries its steps: (what happened, what the server said)."""

    @property
    def rows(self) -> list[tuple[str, str]]: ...


def steps(run: Steps) -> str:
    """A trace's steps as a table (no timings in it: a notebook compares it exactly)."""
    return table(["what happened", "what the server said"], run.rows)


def promises(async_run: FailoverRun, sync_run: FailoverRun) -> str:
    """What the two failovers kept and broke, side by side, read from their results."""
    def yes(flag: bool) -> str:
        return "yes" if flag else "no"
    rows = [
        ("acknowledged commits lost", async_run.lost_commits, sync_run.lost_commits),
        ("jobs run again after an acknowledged completion", async_run.jobs_run_again, sync_run.jobs_run_again),
        ("events the relay published twice", async_run.events_published_twice, sync_run.events_published_twice),
        ("done jobs whose event never reached the broker", async_run.events_missing, sync_run.events_missing),
        ("commits in flight at the crash (never acknowledged)", async_run.in_flight, sync_run.in_flight),
        ("a fence's version handed out twice", yes(async_run.fence_version_reissued),
         yes(sync_run.fence_version_reissued)),
        ("the zombie's version-fenced write accepted", yes(async_run.zombie_write_accepted),
         yes(sync_run.zombie_write_accepted)),
        ("the zombie's (epoch, version)-fenced write accepted",
         yes(async_run.zombie_write_accepted_with_epoch), yes(sync_run.zombie_write_accepted_with_epoch)),
    ]
    return table(["across the failover", "asynchronous", "synchronous"],
                 [(a, str(b), str(c)) for a, b, c in rows])
