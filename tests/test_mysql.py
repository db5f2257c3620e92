"""The cross-engine appendix's engine: MySQL 8 / MariaDB through labkit.core.mysql.

The tests that need a server run on the one labkit.core.mysql.find() finds
(LABKIT_MYSQL_DSN, else 127.0.0.1:3306, else with LABKIT_BACKEND=docker a container); without
one they are skipped with the one line that says how to run them.  The tests of what happens
*without* a server (and of bad input) need none and always run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
from conftest import press_ctrl_c

from labkit.core import load, mysql
from labkit.core.errors import ServerError
from labkit.core.mysessions import MySessions
from labkit.labs import convoy, engines
from labkit.tools import spec

REASON = mysql.skip_reason()

CLAIM = "SELECT id FROM job WHERE status = 'PENDING' ORDER BY created_at LIMIT 1 FOR UPDATE"
@pytest.fixture
def server() -> mysql.MyServer:
    """The server.  (Without one, the repository's conftest.py has already turned the tests
    marked needs_mysql into one skip line; this skip is for a run that bypasses it.)"""
    if REASON is not None:
        pytest.skip(REASON)
    return mysql.find()


@pytest.fixture
def mylab(server):
    lab = mysql.MyLab.open(server, "pytest_mysql")
    try:
        yield lab
    finally:
        lab.drop()


# -- without a server ------------------------------------------------------------------------

def run_labkit(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    full = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "labkit", *args], capture_output=True, text=True,
                          env=full, timeout=120)


def test_turned_off_is_one_line_that_says_how_to_run_it(monkeypatch):
    monkeypatch.setenv(mysql.ENV, "off")
    monkeypatch.setattr(mysql, "_cached", None)
    reason = mysql.skip_reason()
    assert reason is not None and "\n" not in reason
    assert reason.startswith("cross-engine appendix skipped:") and "LABKIT_MYSQL_DSN" in reason


def test_nothing_set_and_nothing_answering_is_the_skip_line_a_new_user_sees(monkeypatch):
    monkeypatch.delenv(mysql.ENV, raising=False)
    monkeypatch.delenv("LABKIT_BACKEND", raising=False)
    monkeypatch.setattr(mysql, "LOCAL", ("127.0.0.1", 1, "root", "test"))   # a port nothing listens on
    monkeypatch.setattr(mysql, "_cached", None)
    reason = mysql.skip_reason()
    assert reason == ("cross-engine appendix skipped: No MySQL or MariaDB server: LABKIT_MYSQL_DSN is not "
                      "set and nothing answers on 127.0.0.1:1. To run it: set "
                      "LABKIT_MYSQL_DSN=mysql://USER@HOST:PORT/DATABASE (MySQL 8+ or MariaDB 10.6+), or "
                      "start one on 127.0.0.1:1, or set LABKIT_BACKEND=docker for a container.")
    with pytest.raises(SystemExit) as stop:            # notebook 21's first cell: the same line
        mysql.find_or_stop()
    assert str(stop.value) == reason


@pytest.mark.parametrize("dsn, words", [
    ("postgresql://root@127.0.0.1/test", "must be a URL such as mysql://"),
    ("mysql://root@127.0.0.1:3306", "needs a host and a database"),
    ("mysql://root:s3cret@127.0.0.1:99999/test", "could not be read"),
    ("mariadb://root:s3@cret@db.example", "needs a host and a database"),   # an @ in the password
])
def test_a_malformed_dsn_is_named_and_its_password_never_shown(dsn, words):
    with pytest.raises(ServerError) as err:
        mysql.parse_dsn(dsn)
    assert words in str(err.value) and "Fix:" in str(err.value)
    assert "s3cret" not in str(err.value) and "cret" not in str(err.value)


def test_a_dsn_where_nothing_answers_says_so_and_the_fix(monkeypatch):
    monkeypatch.setenv(mysql.ENV, "mysql://root:s3cret@127.0.0.1:1/test")
    done = run_labkit("convoy", "--engine", "mariadb", "--workers", "1", "--seconds", "0.2",
                      "--no-progress")
    assert done.returncode == 2
    assert "No MySQL or MariaDB server answered at LABKIT_MYSQL_DSN 127.0.0.1:1/test" in done.stderr
    assert "Fix: start the server" in done.stderr and "s3cret" not in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("flavour, version", [("MariaDB", (10, 5, 22)), ("MySQL", (5, 7, 44)),
                                              ("MySQL", (8, 0, 0))])
def test_a_server_without_skip_locked_is_refused_naming_the_version_it_needs(flavour, version):
    with pytest.raises(ServerError) as err:
        mysql.check_version(flavour, version, "somewhere")
    need = ".".join(map(str, mysql.MINIMUM[flavour]))
    assert f"SKIP LOCKED arrived in {flavour} {need}" in str(err.value)
    assert "Fix: point LABKIT_MYSQL_DSN at" in str(err.value)


@pytest.mark.parametrize("flavour, version", [("MariaDB", (10, 6, 0)), ("MariaDB", (10, 11, 19)),
                                              ("MySQL", (8, 0, 1)), ("MySQL", (8, 4, 3))])
def test_servers_with_skip_locked_are_accepted(flavour, version):
    mysql.check_version(flavour, version, "somewhere")


def test_isolation_is_refused_for_postgresql():
    done = run_labkit("convoy", "--isolation", "read-committed", "--workers", "1")
    assert done.returncode == 2 and "--isolation is for --engine mariadb or mysql" in done.stderr


# -- the three policies, live ----------------------------------------------------------------

@pytest.mark.needs_mysql
def test_wait_blocks_nowait_fails_at_once_skip_locked_takes_the_next(mylab):
    engines.make_jobs(mylab)
    with MySessions(mylab, "A", "B", "C") as run:
        run.A("BEGIN")
        first = run.A(CLAIM)
        run.B("BEGIN")
        waits = run.B(CLAIM)
        run.C("BEGIN")
        nowait = run.C(CLAIM + " NOWAIT")
        usable = run.C("SELECT 1 AS still_usable")
        skip = run.C(CLAIM + " SKIP LOCKED")
        run.A("COMMIT")
        run.B("COMMIT")
        run.C("COMMIT")
    assert first.rows == [(1,)] and not first.waited
    assert waits.waited and waits.blocked_by == ["A"] and waits.completed_after == 8
    assert "RECORD X on job_pending" in waits.wait_event
    assert waits.rows == [(1,)]                  # A did not mark it: still PENDING
    assert nowait.error.sqlstate in ("1205", "3572") and nowait.error.kind == "nowait"
    assert not nowait.waited and nowait.elapsed_ms < 1000
    assert usable.rows == [(1,)]                 # the error ended the statement, not the transaction
    assert skip.rows == [(2,)] and not skip.waited


@pytest.mark.needs_mysql
def test_a_slow_step_that_waits_for_no_lock_is_not_called_blocked(mylab):
    engines.make_jobs(mylab)
    with MySessions(mylab, "A", "B") as run:
        run.A("BEGIN")
        run.A(CLAIM)
        slow = run.B("SELECT SLEEP(0.4) AS slept")   # long, but no lock: the server says so
        run.A("COMMIT")
    assert slow.done and not slow.waited and slow.elapsed_ms >= 400


@pytest.mark.needs_mysql
def test_a_lock_wait_timeout_is_told_from_nowait_by_the_statement(mylab):
    engines.make_jobs(mylab)
    with MySessions(mylab, "A", "B", lock_wait_timeout_s=1) as run:
        run.A("BEGIN")
        run.A(CLAIM)
        run.B("BEGIN")
        timed_out = run.B(CLAIM)
        run.wait("B")
        run.A("ROLLBACK")
    assert timed_out.error.sqlstate == "1205" and timed_out.error.kind == "lock_timeout"
    assert timed_out.elapsed_ms >= 900


# -- InnoDB's gap locks ----------------------------------------------------------------------

@pytest.mark.needs_mysql
def test_without_the_index_one_claim_locks_every_row_it_sorted(mylab):
    rr = engines.gap_scene(mylab, "REPEATABLE READ", indexed=False)
    assert rr.a.rows == [(1,)] and rr.b.rows == []   # 2, 5 and 9 are free, and B gets nothing
    assert rr.insert.waited and "A" in rr.insert.blocked_by   # nor can a producer add a job
    rc = engines.gap_scene(mylab, "READ COMMITTED", indexed=False)
    assert rc.b.rows == [] and not rc.insert.waited          # READ COMMITTED frees the insert only


@pytest.mark.needs_mysql
def test_with_the_index_repeatable_read_still_locks_the_gap_before_each_claim(mylab):
    rr = engines.gap_scene(mylab, "REPEATABLE READ", indexed=True)
    assert (rr.a.rows, rr.b.rows) == ([(1,)], [(2,)])
    # the new job sorts between jobs 1 and 2: in the gap B's claim of job 2 locked with it
    assert rr.insert.waited and rr.insert.blocked_by == ["B"]
    assert "GAP" in rr.insert.wait_event and "asked for RECORD X,GAP" in rr.transcript
    rc = engines.gap_scene(mylab, "READ COMMITTED", indexed=True)
    assert (rc.a.rows, rc.b.rows) == ([(1,)], [(2,)]) and not rc.insert.waited


@pytest.mark.needs_mysql
def test_under_repeatable_read_finishing_one_job_waits_for_the_worker_of_another(mylab):
    rr = engines.finish_scene(mylab, "REPEATABLE READ").finish
    rc = engines.finish_scene(mylab, "READ COMMITTED").finish
    assert rr.waited and rr.blocked_by == ["A"] and rr.completed_after is not None
    assert not rc.waited and rc.results[-1].command == "UPDATE 1"


@pytest.mark.needs_mysql
def test_probes_find_next_key_locks_under_repeatable_read_and_record_locks_under_read_committed(mylab):
    rr = engines.probe_locks(mylab, "REPEATABLE READ")
    rc = engines.probe_locks(mylab, "READ COMMITTED")
    assert rr.attrs["claims"] == rc.attrs["claims"] == {"A": 1, "B": 2}
    # in index order: a gap, then each entry followed by the gap in front of the next one
    assert list(rr["place"]) == ["before job 1", "job 1", "jobs 1-2", "job 2", "jobs 2-5", "job 5",
                                 "jobs 5-9", "job 9", "after job 9"]
    assert list(rr["kind"]) == ["gap", "entry"] * 4 + ["gap"]
    # each claim's entry and the gap in front of it (a next-key lock); nothing past them
    assert list(rr["waits_for"]) == ["A", "A", "B", "B", "", "", "", "", ""]
    assert list(rc["waits_for"]) == ["", "A", "", "B", "", "", "", "", ""]
    gaps = rr[(rr["kind"] == "gap") & (rr["waits_for"] != "")]
    assert all("X,GAP" in lock and "job_pending" in lock for lock in gaps["lock"])
    assert [mode.split(",INSERT")[0] for mode in rr["mode"][:4]] == ["X,GAP", "X", "X,GAP", "X"]
    # each probe names the key it locks or inserts; the first gap's is job 2's entry once
    # finished: DONE sorts before PENDING
    assert list(rr["probe"][:4]) == ["insert (DONE, 09:00:02)", "lock (PENDING, 09:00:01)",
                                     "insert (PENDING, 09:00:01.5)", "lock (PENDING, 09:00:02)"]
    assert rr["finishes"][0] == 2 and rr["finishes"][1:].isna().all()
    assert list(rr.loc[rr["kind"] == "entry", "claimed_by"]) == ["A", "B", "", ""]
    # every probe was rolled back: the table is as make_jobs left it
    assert mylab.execute("SELECT id, status FROM job ORDER BY id") == [
        (1, "PENDING"), (2, "PENDING"), (5, "PENDING"), (9, "PENDING")]
    with pytest.raises(Exception, match="not one of the levels"):
        engines.probe_locks(mylab, "SERIALIZABLE")


@pytest.mark.needs_mysql
def test_the_lock_map_is_drawn_from_a_real_run_and_fits_a_slide(mylab):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.patches import Rectangle

    from labkit.core.plots import PALETTE, setup_matplotlib
    from labkit.tools.training import IMG_MAX_PX, SLIDE_WIDTH_PX
    from test_figures import figure_png, png_size

    setup_matplotlib()
    maps = {level: engines.probe_locks(mylab, level) for level in engines.LEVELS}
    fig = engines.plot_locks(maps)
    boxes = [p for p in fig.axes[0].patches if isinstance(p, Rectangle)]
    assert len(boxes) == sum(len(df) for df in maps.values())
    colour = {"A": PALETTE[0], "B": PALETTE[1], "": "white"}
    drawn = [matplotlib.colors.to_hex(b.get_facecolor()) for b in boxes]
    probed = [matplotlib.colors.to_hex(colour[w]) for df in maps.values() for w in df["waits_for"]]
    assert drawn == probed                       # each box is its probe's outcome
    words = [t.get_text() for t in fig.axes[0].texts]
    assert "A: next-key lock" in words and "A: record lock" in words
    assert sum("waits for" in w for w in words) == 2          # the two inserts that waited
    assert "B finishing job 2 writes (DONE, 09:00:02)\nhere: waits for A" in words
    assert "new job (PENDING, 09:00:01.5):\nwaits for B" in words
    assert "job 1\nPENDING\n09:00:01" in words                 # each entry with its key
    assert "all 5 inserts went through: no gap is locked" in words      # READ COMMITTED's row
    width, height = png_size(figure_png(fig))
    assert width <= SLIDE_WIDTH_PX and height <= IMG_MAX_PX
    with pytest.raises(Exception, match="at least one probed level"):
        engines.plot_locks({})


@pytest.mark.needs_mysql
def test_the_side_by_side_chart_shows_jobs_per_second_beside_efficiency(mylab):
    import matplotlib

    matplotlib.use("Agg")
    import labkit as lk
    from labkit.core.plots import setup_matplotlib
    from labkit.tools.training import IMG_MAX_PX, SLIDE_WIDTH_PX
    from test_figures import figure_png, png_size

    setup_matplotlib()
    pg = lk.lab("pytest_mysql_side", quiet=True)
    try:
        side = engines.convoy_side_by_side(pg, mylab, workers=(1, 4), policies=("wait", "skip"),
                                           job_ms=20, seconds=0.3)
    finally:
        pg.drop()
    fig = engines.plot_side_by_side(side)
    top, bottom = fig.axes[:3], fig.axes[3:]
    assert len(fig.axes) == 6 and all(ax.get_yscale() == "log" for ax in top)
    for ax, name in zip(top, side["engine"].unique()):
        part = side[side["engine"] == name]
        skip = [line for line in ax.get_lines() if line.get_label() == "SKIP LOCKED, this run"][0]
        assert list(skip.get_ydata()) == list(part[part["policy"] == "skip"]["jobs_per_s"])
    assert all(ax.get_yscale() == "linear" for ax in bottom)
    width, height = png_size(figure_png(fig))
    assert width <= SLIDE_WIDTH_PX and height <= IMG_MAX_PX


# -- the convoy, the specs, the server going away ---------------------------------------------

@pytest.mark.needs_mysql
def test_the_convoy_reports_the_same_keys_and_counts_deadlock_victims(mylab):
    mylab.isolation = "READ COMMITTED"

    def sweep():
        return convoy.sweep(mylab, [1, 8], ["wait", "skip"], job_ms=20, seconds=0.5).set_index(
            ["policy", "workers"])

    def scales(by):
        skip, wait = by.loc[("skip", 8), "jobs"], by.loc[("wait", 8), "jobs"]
        return skip > 3 * wait, f"8 workers: {skip} jobs with SKIP LOCKED, {wait} waiting"

    by = sweep()
    assert list(by.reset_index().columns) == convoy.COLUMNS
    assert by.loc[("skip", 8), "deadlocks"] == 0 and by.loc[("wait", 8), "deadlocks"] == 0
    assert (by["server_cpu_pct"].isna()).all()       # one server process: no per-session CPU
    # SKIP LOCKED scales here: a timed shape, measured again before the machine's load is blamed
    holds, seen = scales(by)
    load.shape(holds, "8 workers with SKIP LOCKED do over three times the jobs of 8 that wait",
               measured=seen, again=lambda: scales(sweep()))


@pytest.mark.needs_mysql
def test_one_point_again_runs_under_the_level_asked_and_puts_the_labs_level_back(mylab):
    mylab.isolation = "READ COMMITTED"
    row = engines.convoy_point(mylab, "wait", 4, isolation="REPEATABLE READ", job_ms=20, seconds=0.5)
    assert (row.policy, row.workers) == ("wait", 4) and row.jobs > 0
    assert row.deadlocks > 0                      # a claim queued behind a finishing job, under RR
    assert list(row.as_dict()) == convoy.COLUMNS     # the sweep's row, column for column
    assert mylab.isolation == "READ COMMITTED"
    with pytest.raises(Exception, match="not one of the levels"):
        engines.convoy_point(mylab, "wait", 4, isolation="SERIALIZABLE")


@pytest.mark.needs_mysql
def test_convoy_command_on_the_engine_gives_json_with_the_postgresql_keys(server):
    done = run_labkit("convoy", "--engine", server.engine, "--workers", "1,2", "--policies", "skip",
                      "--seconds", "0.3", "--format", "json", "--no-progress")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [r["workers"] for r in rows] == [1, 2] and list(rows[0]) == convoy.COLUMNS
    assert server.flavour in done.stderr and "REPEATABLE READ" in done.stderr
    other = "mysql" if server.engine == "mariadb" else "mariadb"
    wrong = run_labkit("convoy", "--engine", other, "--workers", "1", "--no-progress")
    assert wrong.returncode == 2 and f"pass --engine {server.engine}" in wrong.stderr
    # the workbook's own specs, on the other engine: the same one paragraph, no traceback
    wrong = run_labkit("spec", "run", "--engine", other)
    assert wrong.returncode == 2 and f"pass --engine {server.engine}" in wrong.stderr
    assert "Traceback" not in wrong.stderr


@pytest.mark.needs_mysql
def test_the_workbooks_own_specs_give_their_shipped_output(server, capsys):
    if server.engine != "mariadb":
        pytest.skip(f"the shipped outputs are MariaDB's; this server is {server.describe()}")
    assert spec.spec_command(what="run", specs=[], engine="mariadb", check=True) == 0
    out = capsys.readouterr().out
    assert out.count("ok: ") == 3


@pytest.mark.needs_mysql
def test_a_server_that_goes_away_mid_run_is_one_paragraph_naming_the_fix(mylab):
    engines.make_jobs(mylab)
    with MySessions(mylab, "A", "B") as run:
        run.A("BEGIN")
        run.A(CLAIM)
        mysql.kill(mylab.server, run.sessions["A"].thread_id, query_only=False)
        with pytest.raises(ServerError) as err:
            run.A("SELECT 1")
    text = str(err.value)
    assert "went away in the middle of the run" in text and "Fix: start the server again" in text
    assert "\n" not in text


@pytest.mark.needs_mysql
def test_closing_a_run_ends_its_waiting_statements_and_leaves_no_session(mylab):
    engines.make_jobs(mylab)
    run = MySessions(mylab, "A", "B")
    run.A("BEGIN")
    run.A(CLAIM)
    run.B("BEGIN")
    assert run.B(CLAIM).waited
    threads = [s.thread_id for s in run.sessions.values()]
    run.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        left = mylab.execute("SELECT id FROM information_schema.PROCESSLIST WHERE id IN (%s, %s)", threads)
        if not left:
            break
        time.sleep(0.05)
    assert left == []


@pytest.mark.needs_mysql
@pytest.mark.usefixtures("gc_paused")
def test_an_interrupted_convoy_leaves_no_worker_behind(mylab):
    mylab.isolation = "READ COMMITTED"
    stop = threading.Timer(0.5, press_ctrl_c)
    stop.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            convoy.run(mylab, "wait", workers=4, job_ms=20, seconds=5)
    finally:
        stop.cancel()
    mylab.close_connections()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        left = mylab.execute("SELECT COUNT(*) FROM information_schema.PROCESSLIST "
                             "WHERE db = %s AND id <> CONNECTION_ID()",
                             (mylab.database,))
        if left == [(0,)]:
            break
        time.sleep(0.05)
    assert left == [(0,)]


def test_doctor_names_the_appendix_skip_without_calling_it_a_problem():
    done = run_labkit("doctor", env={mysql.ENV: "off"})
    assert "cross-engine appendix (notebook 21) skipped: LABKIT_MYSQL_DSN=off turns" in done.stdout
    assert "PROBLEM" not in done.stdout.split("cross-engine appendix")[1]


@pytest.mark.needs_mysql
def test_doctor_names_the_appendix_server(server):
    done = run_labkit("doctor")
    assert f"cross-engine appendix (notebook 21): {server.flavour} {server.version}" in done.stdout
