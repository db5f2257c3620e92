"""When the server goes away: a restart, and a failover to a standby (notebook 19).

Both run on the lab's own throw-away servers (:class:`labkit.core.replica.ReplicaPair`), never
on the workbook's shared one, and every query is named in ``labkit/sql/failover.sql``.

:func:`restart_trace` -- a worker holds one job by a session advisory lock and another by a
committed row claim with a lease; the server restarts (an immediate shutdown, as ``pg_ctl
restart -m immediate``: a crash, then recovery from the WAL).  A restart keeps what was
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
(``lag_bytes_max``): on one machine through a Unix socket it is small, across a network and
under load it is larger, and every acknowledged commit inside it is lost the same way.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from ..core.errors import LabkitError
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


def _scene(node: Node, jobs: int) -> None:
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


def restart_trace() -> RestartRun:
    """Worker w1 holds job 1 by ``pg_try_advisory_lock`` and job 2 by a leased row claim; a
    LISTEN and an open transaction (on job 3) live in its sessions; the server restarts; w2
    claims what it can; both finish."""
    rows: list[tuple[str, str]] = []
    with ReplicaPair(standby=False) as pair:
        node = pair.primary
        assert node is not None
        _scene(node, 3)
        w1 = node.connect(name="labkit:pair:w1")
        w1_tx = node.connect(name="labkit:pair:w1-tx", autocommit=False)
        try:
            got = w1.execute(q("advisory_claim"), {"id": 1}).fetchone()[0]
            rows.append(("w1: pg_try_advisory_lock(1)", f"{got}: job 1 is w1's while w1's session lives"))
            claimed = w1.execute(q("lease_claim"), {"worker": "w1", "lease": LEASE, "ids": [2]}).fetchone()
            rows.append((f"w1: claims job 2 with a {LEASE_TEXT} lease (a committed row)",
                         f"job {claimed[0]} RUNNING, version {claimed[1]}"))
            w1.execute("LISTEN job_events")
            w1_tx.execute("UPDATE job SET status = 'DONE' WHERE id = 3")
            rows.append(("w1: LISTEN job_events; another session of w1's marks job 3 DONE, not committed",
                         "both live only in w1's sessions"))
            before = node.one("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted")
            rows.append(("the server's advisory locks before the restart", f"{before} held"))

            node.restart()
            rows.append(("the server restarts: an immediate shutdown (SIGQUIT, as pg_ctl restart -m "
                         "immediate), then recovery from the WAL", "accepting connections again"))
            try:
                w1.execute("SELECT 1")
                w1_state = "still open"
            except psycopg.Error as exc:
                w1_state = _lost(exc)
            rows.append(("w1's connection", w1_state))

            with node.connect(name="labkit:pair:w2") as w2:
                candidates = [r[0] for r in w2.execute(q("advisory_candidates")).fetchall()]
                w2_advisory = next((j for j in candidates
                                    if w2.execute(q("advisory_claim"), {"id": j}).fetchone()[0]), None)
                rows.append(("w2: pg_try_advisory_lock on the first pending job",
                             f"job {w2_advisory}: granted, the lock went with w1's session"))
                w2_lease = w2.execute(q("lease_claim"), {"worker": "w2", "lease": LEASE,
                                                         "ids": [2]}).fetchone()
                rows.append(("w2: claims job 2 by its lease",
                             "no row: job 2's lease is committed and has not run out"
                             if w2_lease is None else f"job {w2_lease[0]}"))
                w2.execute(q("record_run"), {"id": w2_advisory, "worker": "w2", "claim": "advisory"})
                listening = w2.execute("SELECT count(*) FROM pg_stat_activity "
                                       "WHERE application_name = 'labkit:pair:w1'").fetchone()[0]
                job3 = w2.execute(q("job_state"), {"id": 3}).fetchone()[0]
                job2 = w2.execute(q("job_state"), {"id": 2}).fetchone()
                advisory_after = w2.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                                            "AND granted AND pid <> pg_backend_pid()").fetchone()[0]
            # w1 still ran its two jobs while the server was away; it reconnects to report them.
            with node.connect(name="labkit:pair:w1-again") as again:
                again.execute(q("record_run"), {"id": 1, "worker": "w1", "claim": "advisory"})
                again.execute(q("record_run"), {"id": 2, "worker": "w1", "claim": "lease"})
                again.execute(q("complete"), {"id": 2, "version": claimed[1]})
                per_job = again.execute(q("runs_per_job")).fetchall()
                names = again.execute("SELECT job_id, string_agg(worker, ',' ORDER BY worker) "
                                      "FROM job_run GROUP BY job_id ORDER BY job_id").fetchall()
        finally:
            for conn in (w1, w1_tx):
                conn.close()
    runs = {job: workers.split(",") for job, workers in names}
    rows.append(("w1 and w2 finish and record their runs",
                 "; ".join(f"job {j} ran {n}x ({claim})" for j, claim, n in per_job)))
    kept = [f"job 2's committed claim: {job2[0]}, worker {job2[1]}, version {job2[2]}"]
    lost = [f"w1's advisory lock on job 1 (advisory locks held after the restart, w2's aside: {advisory_after})",
            f"w1's LISTEN, with w1's session (its sessions after the restart: {listening})",
            f"job 3's uncommitted update (job 3 is {job3} again)"]
    return RestartRun(
        advisory_claims_run_twice=sum(1 for _, claim, n in per_job if claim == "advisory" and n > 1),
        row_claims_run_twice=sum(1 for _, claim, n in per_job if claim == "lease" and n > 1),
        runs=runs, kept=kept, lost=lost, rows=rows)


# -- a failover ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FailoverRun(Result):
    """A failover to the standby (:func:`failover_trace`).

    replication: "async" or "sync" (the standby is the primary's synchronous standby)
    acknowledged: commits the primary acknowledged after the standby was cut off
    lost_commits: of those, commits the promoted standby does not have
    jobs_run_again: jobs whose completion was acknowledged and that ran again after the failover
    events_published_twice: events the broker received more than once (the inbox drops them)
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
    row = conn.execute(q("lease_claim"), {"worker": worker, "lease": LEASE, "ids": [job]}).fetchone()
    t_claim = time.perf_counter() - t
    if row is None:
        raise LabkitError(f"Job {job} could not be claimed.", "run the trace again.")
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
    return int(node.one("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"))


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


def failover_trace(*, replication: str = "async", jobs: int = 160, after_cut: int = 5,
                   batch: int = 10) -> FailoverRun:
    """The failover, with ``replication`` "async" or "sync" (see the module's text)."""
    if replication not in REPLICATIONS:
        raise LabkitError(f"--replication {replication!r} is not one the trace knows.",
                          "use --replication async or --replication sync.")
    if jobs < 4 * batch or not 1 <= after_cut <= batch:
        raise LabkitError(f"jobs={jobs}, after_cut={after_cut}, batch={batch} leave no room for the trace.",
                          f"use jobs >= {4 * batch} and 1 <= after_cut <= batch.")
    rows: list[tuple[str, str]] = []
    broker = _Broker()
    zombie_job = jobs          # the last job: A claims it, its lease runs out, B takes it
    before = jobs - after_cut - 1
    with ReplicaPair(replication=replication) as pair:
        primary, standby = pair.primary, pair.standby
        assert primary is not None and standby is not None
        _scene(primary, jobs)
        rows.append((f"a primary and {'a synchronous' if replication == 'sync' else 'an asynchronous'} "
                     f"standby; {jobs} jobs", "the standby streams the primary's WAL"))

        timings: list[float] = []
        lag_max = 0.0
        with primary.connect(name="labkit:pair:w1") as w1, \
                primary.connect(name="labkit:pair:relay", autocommit=False) as relay:
            for job in range(1, before + 1):
                _claim_and_complete(w1, "w1", job, timings)
                if job % 10 == 0:
                    lag_max = max(lag_max, pair.flush_lag_ms())
            while len(broker.received) < before - batch:
                _relay_tick(relay, broker, batch)
            a_version, a_epoch = w1.execute(q("lease_claim"), {"worker": "A", "lease": SHORT_LEASE,
                                                              "ids": [zombie_job]}).fetchone()[1:]
        rows.append((f"w1 claims and completes jobs 1-{before}; the relay publishes "
                     f"{len(broker.received)} events and marks them",
                     "every commit acknowledged, and streamed"))
        rows.append((f"worker A claims job {zombie_job} with a short lease",
                     f"A's token: version {a_version}, epoch {a_epoch}"))
        pair.wait_caught_up()
        time.sleep(0.2)             # A's lease runs out
        old_timeline = pair.timeline(primary)

        pair.cut_standby()
        rows.append(("the lab cuts the standby off (arranged: its primary_conninfo cleared)",
                     "it receives no more WAL"))

        def work(conn, acked):
            for job in range(before + 1, before + 1 + after_cut):
                acked.append(("complete", job, _claim_and_complete(conn, "w1", job)))

        def relay_work(conn, acked):
            conn.autocommit = False
            while True:
                ids = _relay_tick(conn, broker, batch)
                if not ids:
                    break
                acked.append(("mark", tuple(ids)))

        def b_work(conn, acked):
            row = conn.execute(q("lease_claim"), {"worker": "B", "lease": LEASE,
                                                  "ids": [zombie_job]}).fetchone()
            acked.append(("claim", zombie_job, (row[1], row[2])))

        actors = [_Actor(primary, "w1", work), _Actor(primary, "relay", relay_work),
                  _Actor(primary, "B", b_work)]
        waiting = 0
        try:
            for actor in actors:
                waiting = _play(primary, actor, waiting)
        finally:
            primary.crash()
            for actor in actors:
                actor.join(20)
        acked = [a for actor in actors for a in actor.acked]
        in_flight = sum(1 for actor in actors if actor.error)
        rows.append(("after the cut: w1 completes the next jobs, the relay publishes and marks, "
                     f"B claims job {zombie_job} (A's lease ran out)",
                     f"{len(acked)} commits acknowledged, {waiting} waiting for the standby"))
        rows.append(("the primary crashes (SIGQUIT: an immediate shutdown)",
                     f"clients waiting on it: {', '.join(a.name for a in actors if a.error) or 'none'}"))

        pair.promote()
        new_timeline = pair.timeline(standby)
        rows.append(("the standby is promoted (pg_promote)", f"timeline {old_timeline} -> {new_timeline}"))

        with standby.connect(name="labkit:pair:check") as conn:
            lost = marks_lost = 0
            completed_before: set[int] = set()
            b_token = None
            for kind, key, *rest in acked:
                if kind == "complete":
                    completed_before.add(key)
                    status = conn.execute(q("job_state"), {"id": key}).fetchone()[0]
                    lost += status != "DONE"
                elif kind == "mark":
                    unmarked = conn.execute("SELECT count(*) FROM outbox WHERE id = ANY(%s) "
                                            "AND NOT published", (list(key),)).fetchone()[0]
                    marks_lost += unmarked
                    lost += unmarked > 0
                else:
                    b_token = rest[0]
                    version = conn.execute(q("job_state"), {"id": key}).fetchone()[2]
                    lost += version != b_token[0]
            rows.append(("on the promoted standby: the acknowledged commits",
                         f"{len(acked) - lost} of {len(acked)} there, {lost} lost"))

        # The workers carry on against the new primary: they run what is claimable again and
        # the relay publishes what is unmarked.
        with standby.connect(name="labkit:pair:w2") as w2, \
                standby.connect(name="labkit:pair:relay2", autocommit=False) as relay2:
            run_again = 0
            for job in range(before + 1, before + 1 + after_cut):
                row = w2.execute(q("lease_claim"), {"worker": "w2", "lease": LEASE, "ids": [job]}).fetchone()
                if row is not None:
                    w2.execute(q("complete"), {"id": job, "version": row[1]})
                    run_again += job in completed_before
            while _relay_tick(relay2, broker, batch):
                pass
            c_version, c_epoch = w2.execute(q("lease_claim"), {"worker": "C", "lease": LEASE,
                                                              "ids": [zombie_job]}).fetchone()[1:]
            handed = {(a_version, a_epoch)} | ({b_token} if b_token else set())
            reissued = any(v == c_version for v, _ in handed)
            zombie = b_token or (a_version, a_epoch)
            with w2.transaction(force_rollback=True):
                epoch_write = w2.execute(q("fenced_write_epoch"), {
                    "worker": "zombie", "id": zombie_job, "version": zombie[0], "epoch": zombie[1]}).rowcount
            zombie_write = w2.execute(q("fenced_write"), {"worker": "zombie", "id": zombie_job,
                                                          "version": zombie[0]}).rowcount
        twice = sum(1 for n in Counter(broker.received).values() if n > 1)
        who = "B" if b_token else "A"
        rows.append(("w2 runs what is claimable; the relay publishes what is unmarked",
                     f"{run_again} acknowledged completions run again; {twice} events published twice"))
        rows.append((f"C claims job {zombie_job} on the new primary",
                     f"version {c_version}, epoch {c_epoch}: "
                     + ("a version already handed out before the failover" if reissued else "a new version")))
        rows.append((f"the zombie {who} writes with its token (version {zombie[0]})",
                     "accepted" if zombie_write else "refused: its version is not the job's"))
        rows.append((f"the same write fenced by (epoch, version) = ({zombie[1]}, {zombie[0]})",
                     "accepted" if epoch_write else "refused: its epoch is an older timeline's"))
    timings.sort()
    return FailoverRun(
        replication=replication, acknowledged=len(acked), lost_commits=lost,
        jobs_run_again=run_again, events_published_twice=twice, marks_lost=marks_lost,
        in_flight=in_flight, fence_version_reissued=reissued,
        zombie_write_accepted=bool(zombie_write), zombie_write_accepted_with_epoch=bool(epoch_write),
        timelines=(old_timeline, new_timeline),
        commit_ms_p50=round(timings[len(timings) // 2] * 1000, 3), flush_lag_ms_max=round(lag_max, 3),
        rows=rows)


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


# -- the commands ------------------------------------------------------------------------------------


def report(run: Result, figures: list[str], *, json: bool) -> str:
    """A trace's report: its JSON, or its steps as a table and then its figures."""
    if json:
        return run.to_json()
    steps = table(["what happened", "what the server said"], getattr(run, "rows"))
    values = run.as_dict(figures)
    return steps + "\n\n" + "\n".join(f"{name}: {value}" for name, value in values.items())


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
