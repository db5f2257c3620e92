"""The physics of a queue run: what one claimed job cost the server and the machine, and the
ceiling this machine's disk sets on durable commits (``labkit bench``'s ``physics`` figure).

Read around one run of the claimers, per job:

* **WAL** -- bytes, from the server's WAL position before and after (exact: the difference of
  two LSNs), and records;
* **commits** -- the claimers' transactions, counted by the claimers themselves (one per call);
* **WAL writes and syncs** -- from the server's statistics: ``pg_stat_io`` (object ``wal``) on
  PostgreSQL 18 and later, ``pg_stat_wal`` before; both count syncs only for the sync methods
  that call fsync or fdatasync, so under an ``open_*`` method the syncs are not known.
  Sessions report their counts to the shared statistics in batches; the claimers ask for
  theirs to be reported at the end of the run (``pg_stat_force_next_flush()``, an undocumented
  function of PostgreSQL 15 and later that its own tests use), and the reading waits until the
  counters stand still;
* **buffers** hit and read (``pg_stat_database``);
* **wait events** -- what the claimers' sessions were doing, sampled from ``pg_stat_activity``
  while they ran (only the looks inside the run count): a wait event, running on a CPU or
  waiting for one ("CPU"), or idle, waiting for the client's next statement;
* **CPU** -- the client's (the claimer process's own usage) and the server's (the claimers'
  backends, read from ``/proc``: only where the server runs on this machine and its processes
  can be read).

The ceiling: :func:`flush_time` times what a durable commit waits for, one 8 kB write and its
``fdatasync`` (``fsync`` where there is none) on the disk that holds the server's WAL, as
PostgreSQL's ``pg_test_fsync`` does in its first test.  One session committing durably can do
at most one commit per flush; several sessions can share a flush (group commit).
:func:`bound` says, for each measured point, what bounded it.
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import psycopg

from ..core.checked import one_row
from ..core.errors import LabkitError
from ..core.queries import query
from ..core.results import Result

SQL = "physics.sql"
SAMPLE_S = 0.02            # one look at the sessions' wait events every 20 ms
SETTLE_S = 2.0             # the most the reading waits for the statistics to stand still
FLUSH_BYTES = 8192         # what one WAL flush writes at the least: one WAL page


def q(name: str) -> str:
    return query(SQL, name).sql


@dataclass(frozen=True)
class Counters:
    """One reading of the server's counters (:func:`read_counters`)."""

    wal_lsn: str
    wal_records: int
    wal_writes: int
    wal_syncs: int
    blks_hit: int
    blks_read: int


def read_counters(conn: psycopg.Connection) -> Counters:
    """The server's counters now (an autocommit connection: each statement sees the latest)."""
    lsn = one_row(conn.execute(q("wal_position")), "wal_position")[0]
    io = "wal_counters_18" if conn.info.server_version >= 180000 else "wal_counters"
    records, writes, syncs = one_row(conn.execute(q(io)), io)
    hit, read = one_row(conn.execute(q("buffer_counters")), "buffer_counters")
    return Counters(lsn, int(records), int(writes), int(syncs), int(hit), int(read))


def settled_counters(conn: psycopg.Connection, timeout: float = SETTLE_S) -> Counters:
    """The counters once two readings 50 ms apart agree (the last sessions' reports are in),
    or after ``timeout``."""
    last = read_counters(conn)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = read_counters(conn)
        if (now.wal_records, now.wal_writes, now.wal_syncs) == (last.wal_records, last.wal_writes, last.wal_syncs):
            return now
        last = now
    return last


def wal_bytes(conn: psycopg.Connection, before: Counters, after: Counters) -> int:
    return int(one_row(conn.execute("SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)",
                                    (after.wal_lsn, before.wal_lsn)), "pg_wal_lsn_diff")[0])


class WaitSampler(threading.Thread):
    """Samples what the sessions of the application_names ``names`` are doing, every
    ``SAMPLE_S``, on a connection of its own, until stopped; each look is kept with its time."""

    def __init__(self, dsn_connect, names: list[str]):
        super().__init__(name="labkit-wait-sampler", daemon=True)
        self.conn = dsn_connect()
        self.names = names
        self.looks: list[tuple[float, str]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        statement = q("wait_sample")
        try:
            while not self.stopping.is_set():
                t = time.monotonic()
                for (what,) in self.conn.execute(statement, {"names": self.names}).fetchall():
                    self.looks.append((t, what))
                self.stopping.wait(SAMPLE_S)
        finally:
            self.conn.close()

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)

    def seen(self, start: float = float("-inf"), end: float = float("inf")) -> Counter[str]:
        """What was seen between ``start`` and ``end`` (monotonic times: one clock for every
        process of this machine)."""
        return Counter(what for t, what in self.looks if start <= t <= end)


def top(seen: Counter[str], n: int = 3) -> list[dict]:
    """The ``n`` most seen, each with its share of all the looks."""
    total = sum(seen.values())
    return [{"what": what, "share": round(count / total, 3)} for what, count in seen.most_common(n)] if total else []


FLUSH_WAITS = ("LWLock:WALWrite", "IO:WalSync", "IO:WalWrite")


def shares(seen: Counter[str]) -> dict[str, float]:
    """The looks by what they show: waiting for a WAL flush (``LWLock:WALWrite`` is queueing
    behind another session's flush: group commit at work), on a CPU or waiting for one, idle
    waiting for the client, waiting for a lock, or anything else."""
    total = sum(seen.values()) or 1
    kinds: Counter[str] = Counter()
    for what, count in seen.items():
        if what in FLUSH_WAITS:
            kinds["flush"] += count
        elif what == "CPU":
            kinds["cpu"] += count
        elif what.startswith("idle"):
            kinds["client"] += count
        elif what.startswith(("Lock:", "LWLock:")):
            kinds["lock"] += count
        else:
            kinds["other"] += count
    return {kind: round(kinds[kind] / total, 3) for kind in ("flush", "cpu", "client", "lock", "other")}


def backend_cpu_s(pids: list[int]) -> float | None:
    """The CPU time the server processes ``pids`` have used, from ``/proc``; None where it
    cannot be read, or where a pid is not a PostgreSQL process of this machine (a server on
    another machine or in a container, whose pids mean nothing here; or no ``/proc``)."""
    if not pids:
        return None
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0
    for pid in pids:
        try:
            if b"postgres" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                return None               # a pid of another machine's or a container's server
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
        total += int(fields[11]) + int(fields[12])        # utime, stime (fields 14 and 15)
    return total / tick


@dataclass(frozen=True)
class Physics(Result):
    """What one job cost, over one run of the claimers (see the module's text).

    jobs, commits: claimed in the run, and transactions the claimers committed
    wal_bytes_per_job, wal_records_per_job: the WAL written, per claimed job
    commits_per_job, wal_writes_per_job, wal_syncs_per_job: per claimed job (the writes and
        syncs None where the server's sync method is not counted: an ``open_*`` one)
    buffers_hit_per_job, buffers_read_per_job: shared buffers found, and read from outside them
    top_wait_events: what the claimers' sessions were seen doing, most seen first, with shares
    wait_shares: the looks by kind (:func:`shares`): flush, cpu, client, lock, other
    looks: how many looks the shares come from
    client_cpu_us_per_job: the claimer process's CPU, in microseconds
    server_cpu_us_per_job: the claimers' backends' CPU, in microseconds (None where unreadable)
    """

    jobs: int
    commits: int
    wal_bytes_per_job: float
    wal_records_per_job: float
    commits_per_job: float
    wal_writes_per_job: float | None
    wal_syncs_per_job: float | None
    buffers_hit_per_job: float
    buffers_read_per_job: float
    top_wait_events: list[dict]
    wait_shares: dict[str, float]
    looks: int
    client_cpu_us_per_job: float | None
    server_cpu_us_per_job: float | None


def per_job(*, jobs: int, commits: int, wal: int, before: Counters, after: Counters, seen: Counter[str],
            client_cpu_s: float | None, server_cpu_s: float | None, syncs_counted: bool = True) -> Physics:
    """The readings of one run, divided by the jobs it claimed."""
    n = max(jobs, 1)

    def each(value: float) -> float:
        return round(value / n, 3)

    return Physics(
        jobs=jobs, commits=commits, wal_bytes_per_job=each(wal),
        wal_records_per_job=each(after.wal_records - before.wal_records),
        commits_per_job=each(commits),
        wal_writes_per_job=each(after.wal_writes - before.wal_writes) if syncs_counted else None,
        wal_syncs_per_job=each(after.wal_syncs - before.wal_syncs) if syncs_counted else None,
        buffers_hit_per_job=each(after.blks_hit - before.blks_hit),
        buffers_read_per_job=each(after.blks_read - before.blks_read), top_wait_events=top(seen),
        wait_shares=shares(seen), looks=sum(seen.values()),
        client_cpu_us_per_job=None if client_cpu_s is None else round(client_cpu_s / n * 1e6, 1),
        server_cpu_us_per_job=None if server_cpu_s is None else round(server_cpu_s / n * 1e6, 1))


# -- the ceiling ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FlushTime(Result):
    """What one durable commit waits for on this disk (:func:`flush_time`).

    flush_ms: the median time of one 8 kB write and its sync, in ms
    flushes: how many were timed
    method: the sync call ("fdatasync", or "fsync" where there is none)
    folder: the folder whose disk was measured
    durable_commits_per_s_one_session: 1000 / flush_ms, the most one session committing durably
        can do (several sessions can share a flush)
    """

    flush_ms: float
    flushes: int
    method: str
    folder: str
    durable_commits_per_s_one_session: float


def flush_time(folder: Path, seconds: float = 0.5) -> FlushTime:
    """Time 8 kB writes, each followed by its sync, for ``seconds``, in a file of its own in
    ``folder`` (removed after)."""
    sync = getattr(os, "fdatasync", None) or os.fsync
    page = os.urandom(FLUSH_BYTES)
    times: list[float] = []
    fd, path = tempfile.mkstemp(prefix="labkit-flush-", dir=folder)
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end or len(times) < 5:
            os.lseek(fd, 0, os.SEEK_SET)
            t = time.perf_counter()
            os.write(fd, page)
            sync(fd)
            times.append(time.perf_counter() - t)
    finally:
        os.close(fd)
        os.unlink(path)
    ms = statistics.median(times) * 1000
    return FlushTime(flush_ms=round(ms, 4), flushes=len(times), method=sync.__name__, folder=str(folder),
                     durable_commits_per_s_one_session=round(1000 / ms, 1) if ms > 0 else 0.0)


VERDICTS = {"flush": "flush", "cpu": "cpu", "lock": "lock", "client": "round trips", "other": "other"}


def bound(*, jobs_per_s: float, physics: Physics, cpus: int) -> dict:
    """What one measured point spent its sessions' time on, from the looks inside the run: the
    kind seen most (waiting for a WAL flush, on a CPU or waiting for one, a lock, or idle while
    the client and the round trip had their turn: ``round trips``); with every kind's share,
    and the share of the machine's CPUs the client and the claimers' backends used (None where
    the server's CPU cannot be read)."""
    cpu_us = (physics.client_cpu_us_per_job or 0) + (physics.server_cpu_us_per_job or 0)
    cpu = cpu_us * jobs_per_s / 1e6 / max(cpus, 1) if physics.server_cpu_us_per_job is not None else None
    kinds = physics.wait_shares
    most = max(kinds, key=lambda k: kinds[k]) if any(kinds.values()) else "other"
    return {"bound": VERDICTS[most], "shares": kinds, "cpu_busy": None if cpu is None else round(cpu, 3),
            "top_wait_event": physics.top_wait_events[0]["what"] if physics.top_wait_events else None}


# -- the roofline ---------------------------------------------------------------------------------


def roofline(ceiling: dict, per_batch: dict, *, cpus: int) -> list[dict]:
    """For each batch size of a run (``ceiling`` and ``physics`` of ``labkit bench --json``):
    the measured jobs/s and the two roofs over it.

    * the **flush roof**: every durable commit waits for a WAL flush, and ``clients`` sessions
      can at best share each one (group commit), so jobs/s <= batch x clients / flush time
      (optimistic: a flush that carries many commits writes more than the 8 kB timed);
    * the **CPU roof**: this machine's CPUs divided by the CPU one job took, client and server
      (None where the server's CPU could not be read)."""
    points = []
    flush_s = ceiling["flush_ms"] / 1000
    for batch, p in per_batch.items():
        b = int(batch)
        cpu_us = (p["client_cpu_us_per_job"] or 0) + (p["server_cpu_us_per_job"] or 0)
        points.append({
            "batch": b,
            "jobs_per_s": ceiling["claim_jobs_per_s_durable"][batch],
            "flush_roof": b * ceiling["clients"] / flush_s if flush_s > 0 else None,
            "cpu_roof": cpus * 1e6 / cpu_us if p["server_cpu_us_per_job"] is not None and cpu_us else None,
            "bound": ceiling["bound"][batch]["bound"],
        })
    return points


def plot_roofline(points: list[dict], *, title: str = "What bounds the durable claim"):
    """The roofline of :func:`roofline`'s points: batch size across, jobs/s up, both on log
    scales; the measured points and the two roofs.  Returns the axes."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    from ..core.plots import PALETTE, legend_below, plain_log_ticks

    fig, ax = plt.subplots(figsize=(10, 6))
    xs = [p["batch"] for p in points]
    flush = [p["flush_roof"] for p in points]
    cpu = [p["cpu_roof"] for p in points]
    if all(v is not None for v in flush):
        ax.plot(xs, flush, "--", color=PALETTE[1], label="flush roof: batch x clients / one WAL flush")
    if all(v is not None for v in cpu):
        ax.plot(xs, cpu, ":", color=PALETTE[2], linewidth=2, label="CPU roof: CPUs / CPU per job")
    ax.plot(xs, [p["jobs_per_s"] for p in points], "o-", color=PALETTE[0], markersize=9,
            label="measured: durable claim + mark")
    for p in points:
        ax.annotate(p["bound"], (p["batch"], p["jobs_per_s"]), textcoords="offset points", xytext=(8, -16))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(xs, [f"batch {x}" for x in xs])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_ylabel("jobs claimed per second")
    plain_log_ticks(ax.yaxis)
    ax.set_title(title)
    legend_below(fig, ax, ncol=1)
    return ax


# -- group commit ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupCommit(Result):
    """Durable one-row commits from several sessions at once (:func:`group_commit`).

    points: one per (sessions, commit_delay_us): commits_per_s, syncs_per_commit (the WAL syncs
        the server did per commit: below 1 when sessions shared a flush)
    commit_delay_measured: whether commit_delay could be set (a superuser, or a role granted SET
        on it)
    """

    points: list[dict]
    commit_delay_measured: bool


def _commit_loop(conn: psycopg.Connection, until: float, counts: list[int], i: int) -> None:
    statement = q("group_commit_insert")
    n = 0
    while time.monotonic() < until:
        conn.execute(statement)
        n += 1
    counts[i] = n


def _group_point(connect, watch: psycopg.Connection, sessions: int, seconds: float,
                 delay_us: int) -> dict:
    conns = [connect() for _ in range(sessions)]
    try:
        for conn in conns:
            conn.execute("SET synchronous_commit = on")
            if delay_us:
                conn.execute(f"SET commit_delay = {int(delay_us)}")
                conn.execute("SET commit_siblings = 1")
        before = settled_counters(watch)
        counts = [0] * sessions
        until = time.monotonic() + seconds
        threads = [threading.Thread(target=_commit_loop, args=(c, until, counts, i)) for i, c in enumerate(conns)]
        started = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        took = time.monotonic() - started
        for conn in conns:
            conn.execute("SELECT pg_stat_force_next_flush()")
        after = settled_counters(watch)
    finally:
        for conn in conns:
            conn.close()
    commits = sum(counts)
    return {"sessions": sessions, "commit_delay_us": delay_us, "commits_per_s": round(commits / took, 1),
            "syncs_per_commit": round((after.wal_syncs - before.wal_syncs) / max(commits, 1), 3)}


def group_commit(connect, watch: psycopg.Connection, *, sessions: tuple[int, ...] = (1, 2, 4, 8),
                 seconds: float = 0.5, commit_delay_us: int = 100) -> GroupCommit:
    """Durable one-row commits for ``seconds`` with each number of ``sessions`` (each from
    ``connect()``, an autocommit connection to a lab schema), and once more with the most
    sessions and ``commit_delay`` (where this role may set it: a superuser, or a role granted SET
    on it), with ``commit_siblings = 1`` (the default, 5, would leave fewer than eight sessions'
    flushes undelayed).  The table is created in the lab schema if it is not there."""
    with connect() as conn:
        conn.execute(q("group_commit_scene"))
        allowed = bool(one_row(conn.execute(q("may_set_commit_delay")), "may_set_commit_delay")[0])
    points = [_group_point(connect, watch, n, seconds, 0) for n in sessions]
    if allowed and commit_delay_us:
        points.append(_group_point(connect, watch, max(sessions), seconds, commit_delay_us))
    return GroupCommit(points=points, commit_delay_measured=bool(allowed and commit_delay_us))


# -- PostgreSQL's own measurement of the same thing -------------------------------------------------

FSYNC_LINE = re.compile(r"^\s+(\w+)\s+([\d.]+) ops/sec\s+(\d+) usecs/op", re.M)


def pg_test_fsync(binary: Path, folder: Path, seconds: int = 1, timeout: float = 120) -> dict[str, float]:
    """PostgreSQL's ``pg_test_fsync`` on ``folder``'s disk (``seconds`` per test): for each
    ``wal_sync_method`` it could run, the time of one 8 kB write and its sync, in ms (its first
    test).  Its file is removed after."""
    path = Path(tempfile.mkdtemp(prefix="labkit-pgtf-", dir=folder))
    try:
        done = subprocess.run([str(binary), "-s", str(seconds), "-f", str(path / "pg_test_fsync.out")],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise LabkitError(f"pg_test_fsync did not finish within {timeout:.0f} s.",
                          "the disk may be very slow or busy: run the benchmark again later.") from None
    finally:
        shutil.rmtree(path, ignore_errors=True)
    first = done.stdout.split("Compare file sync methods using two", 1)[0]
    found = {m.group(1): int(m.group(3)) / 1000 for m in FSYNC_LINE.finditer(first)}
    if done.returncode != 0 or not found:
        raise LabkitError(f"pg_test_fsync failed (exit {done.returncode}): "
                          f"{(done.stderr or done.stdout).strip()[-300:]}",
                          "run it by hand to see why; the benchmark's own flush time stands without it.")
    return found
