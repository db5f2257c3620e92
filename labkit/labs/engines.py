"""Notebook 21, the cross-engine appendix: the workbook's claim on MySQL and MariaDB.

The scenes script :class:`~labkit.core.mysessions.MySessions` on a lab database
(:class:`~labkit.core.mysql.MyLab`); what InnoDB does differently shows in their steps:

* :func:`gap_scene` -- two SKIP LOCKED claims and a producer adding a job, with or without
  the claim's index, under REPEATABLE READ or READ COMMITTED;
* :func:`probe_locks` -- the same two claims, then one probe per index entry and per gap
  of the claim's index, each a real statement with a one-second lock wait: which of them
  wait, and for whom, is the claims' lock set as the server enforces it;
  :func:`plot_locks` draws it;
* :func:`finish_scene` -- two workers holding different jobs, one finishing first;
* :func:`convoy_side_by_side` -- the convoy sweep on PostgreSQL and on the MySQL-compatible
  server under both isolation levels, in one run, as one table; :func:`convoy_point` -- one
  of its points measured again (a timed shape's second look); :func:`plot_side_by_side`
  draws its jobs per second beside its efficiency.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core.errors import LabkitError
from ..core.mysessions import MySessions
from ..core.mysql import MyLab
from ..core.plots import PALETTE, plain_log_ticks
from ..core.queries import queries
from ..core.results import Result
from ..core.steps import Step
from . import convoy

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

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


@dataclass(frozen=True)
class GapScene(Result):
    """Two SKIP LOCKED claims and a producer's insert on the MySQL-compatible server
    (:func:`gap_scene`): each session's step, as the scripted run recorded it.

    a: A's claim (its rows: the job A got, none if it got nothing)
    b: B's claim, sent while A's transaction is open
    insert: P's insert of a job that sorts between jobs 1 and 2 (``waited`` and
        ``blocked_by``: whether a claim's lock held it up, and whose)
    transcript: the whole run, one line per step
    """

    a: Step
    b: Step
    insert: Step
    transcript: str


def gap_scene(lab: MyLab, isolation: str, *, indexed: bool) -> GapScene:
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
    return GapScene(a=a, b=b, insert=insert, transcript=text)


PROBE_WAIT_S = 1          # how long a probe waits for a lock before InnoDB gives up on it
HOLDERS = ("A", "B")


def _literal_sql(lab: MyLab, text: str, params: dict) -> str:
    """``text`` with ``params`` written in as the server's literals (a scripted step takes
    no parameters)."""
    return lab.admin.raw.cursor().mogrify(text, params)


def _clock(t) -> str:
    """A created_at as the figure and the probe table print it: 09:00:01, or 09:00:01.5."""
    tenths = f".{t.microsecond // 100_000}" if t.microsecond else ""
    return f"{t:%H:%M:%S}{tenths}"


def _probes(lab: MyLab) -> list[dict[str, Any]]:
    """One probe per entry of the claim's index and per gap around them, in key order,
    from the rows the table holds now: the entry's own locking read, or an insert whose
    entry sorts into the gap.  Each names the key it locks or inserts, (status, created_at)."""
    from datetime import timedelta

    entries = lab.execute(queries(SQL)["index_entries"].sql)
    if not entries:
        raise LabkitError("The job table is empty: there is no index entry to probe.",
                          "call engines.make_jobs(lab) first (probe_locks does).")
    new_id = max(row[0] for row in entries) + 1
    probes: list[dict[str, Any]] = []

    def gap(place: str, status: str, created_at, finishes=None) -> None:
        nonlocal new_id
        params = {"id": new_id, "status": status, "created_at": created_at}
        probes.append({"kind": "gap", "place": place, "probe": f"insert ({status}, {_clock(created_at)})",
                       "finishes": finishes,
                       "sql": _literal_sql(lab, queries(SQL)["probe_gap"].sql, params)})
        new_id += 1

    # 'DONE' sorts before 'PENDING': the gap in front of the first entry is where a finished
    # (or marked) job's new entry lands.  The probe writes the entry the second job would get
    # once finished, (DONE, its created_at): what finish_scene's UPDATE writes.
    second = entries[1] if len(entries) > 1 else entries[0]
    gap(f"before job {entries[0][0]}", "DONE", second[2], finishes=second[0])
    for k, (job, status, created_at) in enumerate(entries):
        probes.append({"kind": "entry", "place": f"job {job}",
                       "probe": f"lock ({status}, {_clock(created_at)})", "finishes": None,
                       "sql": _literal_sql(lab, queries(SQL)["probe_entry"].sql,
                                           {"status": status, "created_at": created_at})})
        if k + 1 < len(entries):
            later = entries[k + 1]
            gap(f"jobs {job}-{later[0]}", status, created_at + (later[2] - created_at) / 2)
        else:
            gap(f"after job {job}", status, created_at + timedelta(seconds=1))
    return probes


def probe_locks(lab: MyLab, isolation: str) -> pd.DataFrame:
    """What two SKIP LOCKED claims lock on the claim's index, asked of the server.

    On jobs 1, 2, 5 and 9 (with the index), A and B claim under ``isolation`` and keep their
    transactions open.  Then session P probes the index in key order: every entry with a
    locking read of that entry alone, every gap with an insert whose entry sorts into it
    (in front of the first entry, the entry job 2 gets once finished: (DONE, its
    created_at)), each probe in a transaction of its own, rolled back, with a lock wait of
    ``PROBE_WAIT_S`` s.  A probe that waits shows a lock; the server names who holds it
    (``INNODB_LOCK_WAITS``) and the lock the probe asked for.

    One row per probe, in index order: ``place`` (an entry, ``job 1``, or a gap,
    ``jobs 1-2``), ``kind`` (entry or gap), ``probe`` (what P ran, with the key it locks or
    inserts: ``lock (PENDING, 09:00:01)``, ``insert (PENDING, 09:00:01.5)``), ``waits_for``
    (A, B, or empty), ``lock`` (the lock P asked for, in InnoDB's words), ``mode`` (its
    mode alone: ``X`` or ``X,GAP``), ``claimed_by`` (the session whose claim returned that
    job, for an entry), ``finishes`` (for the first gap's probe, the job whose finished
    entry it writes).  ``df.attrs`` holds ``claims`` ({session: job}) and ``isolation``."""
    import pandas as pd

    if isolation not in LEVELS:
        raise LabkitError(f"isolation={isolation!r} is not one of the levels the appendix compares.",
                          f"pass one of {', '.join(LEVELS)}.")
    make_jobs(lab)
    probes = _probes(lab)
    rows = []
    with MySessions(lab, *HOLDERS, "P", isolation=isolation, lock_wait_timeout_s=PROBE_WAIT_S) as run:
        claims = {}
        for name in HOLDERS:
            run.step(name, "BEGIN")
            got = run.step(name, CLAIM, label="claim").rows
            claims[name] = got[0][0] if got else None
        for probe in probes:
            run.P("BEGIN")
            step = run.P(probe["sql"], label=probe["probe"])
            if step.waited:
                run.wait("P")                  # its lock wait runs out: error 1205
            run.P("ROLLBACK")
            lock = (step.wait_event or "") if step.waited else ""
            rows.append({"place": probe["place"], "kind": probe["kind"], "probe": probe["probe"],
                         "waits_for": ", ".join(step.blocked_by) if step.waited else "",
                         "lock": lock, "mode": _mode(lock), "finishes": probe["finishes"]})
        for name in HOLDERS:
            run.step(name, "COMMIT")
    df = pd.DataFrame(rows)
    owner = {f"job {job}": name for name, job in claims.items() if job is not None}
    df["claimed_by"] = [owner.get(place, "") for place in df["place"]]
    df.attrs.update(claims=claims, isolation=isolation)
    return df


def _mode(lock: str) -> str:
    """``RECORD X,GAP on job_pending (...)`` -> ``X,GAP`` (MySQL 8 adds ``,INSERT_INTENTION``)."""
    words = lock.split()
    return words[1] if len(words) > 1 and words[0] == "RECORD" else ""


_BOX_WIDTH = {"entry": 1.2, "gap": 0.7}
_HALF = 0.6                            # half an entry box's height: three lines of key


def _holder(probe: Any) -> str:
    """The session whose lock made ``probe`` wait ('' where it went through)."""
    return probe.waits_for.split(", ")[0] if probe.waits_for else ""


class _LockRow:
    """One level's row of :func:`plot_locks`, drawn left to right in key order: the entries
    and gaps, each probe's waiting insert below, and the locks each session holds above."""

    def __init__(self, ax: Any, y: float, colour: dict[str, Any], claimer: dict[Any, str]):
        self.ax, self.y, self.colour, self.claimer = ax, y, colour, claimer
        self.x = 0.0
        self.spans: list[tuple[float, float, str, str]] = []   # (x, width, holder, what) above the row
        self.inserts: list[float] = []                          # where an insert waited

    def draw(self, probes: list[Any]) -> None:
        """Every probe's box and what it waited for, then the locks above the row."""
        for k, probe in enumerate(probes):
            who = _holder(probe)
            self.ax.add_patch(self._box(probe, who))
            if probe.kind == "entry":
                self._entry(probes, k, who)
            elif who:                  # texts low and high in turn, so two never meet
                self._waiting_insert(probe, who)
            self.x += _BOX_WIDTH[probe.kind]
        if not self.inserts:
            gaps = sum(1 for probe in probes if probe.kind == "gap")
            self.ax.text(self.x / 2, self.y - _HALF - 0.15, f"all {gaps} inserts went through: no gap is locked",
                         ha="center", va="top")
        self._locks_above()

    def _box(self, probe: Any, who: str) -> Any:
        """An entry's box, or a gap's hatched slot, in the colour of the lock it waited for."""
        from matplotlib.patches import Rectangle

        return Rectangle((self.x, self.y - _HALF), _BOX_WIDTH[probe.kind], 2 * _HALF,
                         facecolor=self.colour.get(who, "white"), edgecolor="0.25", lw=1.5,
                         hatch="//" if probe.kind == "gap" else None)

    def _entry(self, probes: list[Any], k: int, who: str) -> None:
        """An entry's key in its box; the lock that stopped its probe, a next-key lock where
        the gap in front of it stopped a probe for the same session, a record lock otherwise."""
        probe = probes[k]
        key = probe.probe.split("(", 1)[1].rstrip(")").split(", ")
        self.ax.text(self.x + _BOX_WIDTH["entry"] / 2, self.y, f"{probe.place}\n" + "\n".join(key),
                     ha="center", va="center", linespacing=1.15,
                     color="white" if who == HOLDERS[0] else "black")
        if not who:
            return
        before = probes[k - 1] if k else None
        if before is not None and before.kind == "gap" and before.waits_for == probe.waits_for:
            self.spans.append((self.x - _BOX_WIDTH["gap"], _BOX_WIDTH["gap"] + _BOX_WIDTH["entry"], who,
                               "next-key"))
        else:
            self.spans.append((self.x, _BOX_WIDTH["entry"], who, "record"))

    def _waiting_insert(self, probe: Any, who: str) -> None:
        """The insert that waited in this gap, and for whom: a finished job's entry, or a new job's."""
        high = len(self.inserts) % 2
        self.inserts.append(self.x)
        x, y = self.x, self.y
        middle = x + _BOX_WIDTH["gap"] / 2
        finishes = getattr(probe, "finishes", None)
        key = probe.probe.split(" ", 1)[1]
        if finishes is not None and not _missing(finishes):
            finisher = self.claimer.get(int(finishes), "its worker")
            text = f"{finisher} finishing job {int(finishes)} writes {key}\nhere: waits for {who}"
        else:
            text = f"new job {key}:\nwaits for {who}"
        self.ax.annotate(text, (middle, y - _HALF - 0.05),
                         xytext=(middle + 1.3, y - _HALF - 0.3) if high else (x, y - _HALF - 1.0),
                         ha="left", va="top", arrowprops={"arrowstyle": "->", "lw": 1.5})

    def _locks_above(self) -> None:
        """Each session's lock as a bar above the entries (and gaps) it covers, named."""
        for left, span, who, what in self.spans:
            self.ax.plot([left + 0.05, left + span - 0.05], [self.y + _HALF + 0.15] * 2, color=self.colour[who],
                         lw=4, solid_capstyle="butt")
            self.ax.text(left + span / 2, self.y + _HALF + 0.25, f"{who}: {what} lock", ha="center", va="bottom")


def plot_locks(maps: dict[str, pd.DataFrame]) -> Figure:
    """The claim's index in key order, one row per isolation level (``maps``: level ->
    :func:`probe_locks`): each entry (a box with its key: job, status, created_at) and each
    gap (a hatched slot in front of the next entry) coloured by the session whose lock made
    its probe wait, white where the probe went through.  Above a row, what each session
    holds: a *next-key* lock where its entry and the gap in front of it both stopped a probe,
    a *record* lock where only the entry did.  Below it, the inserts that waited (the first
    gap's is where a finished job's entry lands), or a line saying that every insert went
    through."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if not maps:
        raise LabkitError("plot_locks needs at least one probed level.",
                          "pass {level: engines.probe_locks(lab, level)} for one or more levels.")
    colour = {name: PALETTE[k] for k, name in enumerate(HOLDERS)}
    levels = list(maps)
    step_y = 3.9                       # a row, its locks above and its waiting inserts below
    claims = maps[levels[0]].attrs.get("claims", {})
    claimer = {job: name for name, job in claims.items()}
    fig, ax = plt.subplots(figsize=(12, 0.4 + 3.0 * len(levels)))
    for n, level in enumerate(levels):
        row = _LockRow(ax, (len(levels) - 1 - n) * step_y, colour, claimer)
        row.draw(list(maps[level].itertuples()))
        ax.text(-0.15, row.y, level.replace(" ", "\n", 1), ha="right", va="center")
    # the bottom row (the last drawn) sets the width and the room below
    ax.set_xlim(-0.1, row.x + 0.1)
    bottom = -_HALF - (1.9 if row.inserts else 0.7)
    ax.set_ylim(bottom, (len(levels) - 1) * step_y + _HALF + 0.8)
    ax.set_axis_off()
    ax.set_title("The claim's index (status, created_at), in key order: what each probe waited for")
    handles = [Patch(facecolor=colour[name], edgecolor="0.25",
                     label=f"{name}'s lock ({name} claimed job {claims.get(name)})") for name in HOLDERS]
    handles += [Patch(facecolor="white", edgecolor="0.25", label="no lock: the probe went through"),
                Patch(facecolor="white", edgecolor="0.25", hatch="//", label="a gap between entries")]
    fig.legend(handles=handles, loc="outside lower center", ncol=2, frameon=False)
    return fig


def _missing(value) -> bool:
    """A missing value in a DataFrame column of optional ints (None or NaN)."""
    return value is None or value != value


@dataclass(frozen=True)
class FinishScene(Result):
    """Two workers holding different jobs, B finishing first (:func:`finish_scene`).

    finish: B's UPDATE that marks job 2 DONE (``waited`` and ``blocked_by``: whether A's claim
        held it up, and whose lock it was)
    transcript: the whole run, one line per step
    """

    finish: Step
    transcript: str


def finish_scene(lab: MyLab, isolation: str) -> FinishScene:
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
    return FinishScene(finish=finish, transcript=text)


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


def plot_side_by_side(side: pd.DataFrame) -> Figure:
    """:func:`convoy_side_by_side` drawn one engine per column: jobs per second on top (log,
    with the models' lines), efficiency (measured over the model) below.  Efficiency alone
    makes three policies that each reach their own model look alike; the row above shows
    that SKIP LOCKED's model is N times the others'."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import LogLocator

    if side is None or len(side) == 0 or "engine" not in side:
        raise LabkitError("plot_side_by_side needs the table convoy_side_by_side returns.",
                          "pass engines.convoy_side_by_side(pg, my, ...).")
    names = list(side["engine"].unique())
    fig, axes = plt.subplots(2, len(names), figsize=(12, 6.4), sharex=True, sharey="row",
                             squeeze=False)
    for col, name in enumerate(names):
        part = side[side["engine"] == name]
        top, bottom = axes[0][col], axes[1][col]
        convoy.plot_throughput(part, ax=top, title=name.replace(", ", "\n"))
        convoy.plot_efficiency(part, ax=bottom)
        bottom.set_title("")
        top.yaxis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
        plain_log_ticks(top.yaxis)
        for ax in (top, bottom):
            if ax.get_legend():
                ax.get_legend().remove()
            ax.set_xlabel("")
            ax.set_ylabel("")
        bottom.set_xlabel("workers N")
    axes[0][0].set_ylabel("jobs per second")
    axes[1][0].set_ylabel("measured / model")
    handles = [Line2D([], [], color=PALETTE[convoy.POLICY_COLOURS[p]], marker="o", lw=2,
                      label=convoy.POLICY_NAMES[p]) for p in convoy.POLICIES if p in set(side["policy"])]
    handles += [Line2D([], [], color="black", ls="--", lw=1.3, label="model: 1/d (top), 1 (below)"),
                Line2D([], [], color="black", ls=":", lw=1.3, label="model N/d")]
    fig.legend(handles=handles, loc="outside lower center", ncol=3, frameon=False)
    return fig


@dataclass(frozen=True)
class ConvoyPoint(Result):
    """One point of the convoy sweep (:func:`convoy_point`): its row of
    :func:`~labkit.labs.convoy.sweep`, the same fields in the same order (``convoy.COLUMNS``).
    A timed run counts the jobs done inside its window; NaN is a figure the run could not
    give.

    policy: the claim's lock policy: ``wait`` (FOR UPDATE), ``nowait`` or ``skip`` (SKIP LOCKED)
    workers: worker connections claiming at once (N)
    variant: the run in words: ``hold`` (row lock held for the job) or ``no-hold``, and for
        NOWAIT ``tight`` or ``backoff``
    job_ms: one job's length d, in milliseconds
    seconds: the measured window, in seconds (None: a backlog drained)
    jobs: jobs done inside the window
    jobs_per_s: jobs done per second of the window
    model_jobs_per_s: the model's jobs per second: 1/d for wait and NOWAIT with the lock held
        for the job, N/d otherwise
    efficiency: jobs_per_s over model_jobs_per_s
    claim_wait_p50_ms: median time from asking for a job to getting one, in milliseconds
        (waits still open when the window closed count as at least that long)
    claim_wait_p95_ms: its 95th percentile, in milliseconds
    claim_wait_p99_ms: its 99th percentile, in milliseconds
    claim_wait_max_ms: the longest claim wait, in milliseconds
    job_latency_p50_ms: median time from asking for a job to its end, in milliseconds
    job_latency_p99_ms: its 99th percentile, in milliseconds
    errors: NOWAIT errors (a claim that met a locked row) inside the window
    errors_per_s: errors per second of the window
    errors_per_job: errors per job done (NaN: no job done)
    busy_workers: workers busy with a job, on average over the window
    idle_workers: workers that finished no job
    top_worker_share: the busiest worker's share of the jobs done (NaN: no job done)
    client_cpu_pct: the client's CPU time over the run's wall time, in percent
    server_cpu_pct: the workers' server sessions' CPU time over the wall time, in percent (NaN:
        not measured: a server on another host, or a MySQL-compatible one)
    makespan_s: the time a drained backlog took, in seconds (NaN: a timed run)
    model_makespan_s: the model's time for it, in seconds (NaN: a timed run)
    backlog: jobs drained (0: a timed run)
    claim_wait_censored: claim waits still open when the window closed
    claim_wait_p99_censored: whether the p99 lands among those (then it is a lower bound)
    commit_delay_ms: the commit_delay every worker commit waited, in milliseconds
    deadlocks: transactions the server rolled back to break a deadlock (each retried)
    """

    policy: str
    workers: int
    variant: str
    job_ms: float
    seconds: float | None
    jobs: int
    jobs_per_s: float
    model_jobs_per_s: float
    efficiency: float
    claim_wait_p50_ms: float
    claim_wait_p95_ms: float
    claim_wait_p99_ms: float
    claim_wait_max_ms: float
    job_latency_p50_ms: float
    job_latency_p99_ms: float
    errors: int
    errors_per_s: float
    errors_per_job: float
    busy_workers: float
    idle_workers: int
    top_worker_share: float
    client_cpu_pct: float
    server_cpu_pct: float
    makespan_s: float
    model_makespan_s: float
    backlog: int
    claim_wait_censored: int
    claim_wait_p99_censored: bool
    commit_delay_ms: float
    deadlocks: int


def convoy_point(lab: Lab | MyLab, policy: str, workers: int, *, isolation: str | None = None,
                 job_ms: float = 20, seconds: float = 1.0) -> ConvoyPoint:
    """One point of :func:`convoy_side_by_side` run again: ``policy`` at ``workers`` on
    PostgreSQL (``lab`` a :class:`~labkit.core.lab.Lab`) or on the MySQL-compatible server
    under ``isolation`` (one of ``LEVELS``).  Returns the sweep's row (``jobs_per_s``,
    ``efficiency``, ``deadlocks``...)."""
    if not isinstance(lab, MyLab):
        return ConvoyPoint(**convoy.run(lab, policy, workers, job_ms, seconds).row())
    if isolation not in LEVELS:
        raise LabkitError(f"isolation={isolation!r} is not one of the levels the sweep runs.",
                          f"pass one of {', '.join(LEVELS)}.")
    saved = lab.isolation
    try:
        lab.isolation = isolation
        return ConvoyPoint(**convoy.run(lab, policy, workers, job_ms, seconds).row())
    finally:
        lab.isolation = saved
