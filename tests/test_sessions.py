"""The session engine against a real server: blocking, errors, guards, cleanup."""

import time

import pytest
from conftest import backends_of

import labkit
from labkit.core.errors import LabkitError
from labkit.core.sessions import MAX_SESSIONS
from labkit.core.text import TEXT_WIDTH

CLAIM = "SELECT id FROM job WHERE status = 'PENDING' ORDER BY created_at LIMIT 1 FOR UPDATE"


@pytest.fixture
def jobs(lab):
    lab.create_jobs(5)
    return lab


def test_blocked_step_is_detected_from_the_server_and_completes_after_commit(jobs):
    with labkit.Sessions(jobs, "A", "B", watch={"job": "id"}) as s:
        s.A("BEGIN")
        a = s.A(CLAIM)
        s.B("BEGIN")
        t0 = time.monotonic()
        b = s.B(CLAIM)
        detect_s = time.monotonic() - t0
        assert a.rows == [(1,)]
        assert b.waited and not b.done
        assert b.blocked_by == ["A"]
        assert b.wait_event.startswith("Lock:")
        # Detected long before any guard could fire (lock_timeout is 5 s).
        assert detect_s < 2.0
        assert b.locks_after == {"A": [1], "B": []}
        s.A("UPDATE job SET status = 'DONE' WHERE id = 1")
        commit = s.A("COMMIT")
        # B re-checked row 1, found it no longer PENDING, and took the next one.
        assert b.done and b.completed_after == commit.index
        assert b.rows == [(2,)]
        text = s.transcript().to_text()
        assert "BLOCKS (waits for A)" in text and "unblocks B" in text
        s.B("COMMIT")


def test_one_commit_that_lets_two_sessions_through_says_so_on_its_own_row(jobs):
    with labkit.Sessions(jobs, "A", "B", "C") as s:
        s.A("BEGIN")
        s.A("SELECT id FROM job WHERE id IN (1, 2) FOR UPDATE")
        s.B("SELECT id FROM job WHERE id = 1 FOR UPDATE")
        s.C("SELECT id FROM job WHERE id = 2 FOR UPDATE")
        s.A("COMMIT")
        rows = {r.n: r for r in s.transcript().rows}
    assert rows["5"].note == "unblocks B; unblocks C"           # A's COMMIT let both through
    assert rows["3'"].note == "" and rows["4'"].note == ""
    assert list(rows) == ["1", "2", "3", "4", "5", "3'", "4'"]


def test_nowait_and_lock_timeout_share_55P03_but_are_told_apart(jobs):
    with labkit.Sessions(jobs, "A", "B", "C") as s:
        s.A("BEGIN")
        s.A(CLAIM)
        nowait = s.B(CLAIM + " NOWAIT")
        s.C("SET lock_timeout = '100ms'")
        timed = s.C(CLAIM)
        assert timed.waited  # it waits first: lock_timeout has not fired yet
        assert s.wait("C") is timed
    assert nowait.error.sqlstate == timed.error.sqlstate == "55P03"
    assert nowait.error.kind == "nowait"
    assert 'could not obtain lock on row in relation "job"' in nowait.error.message
    assert timed.error.kind == "lock_timeout"
    assert "lock timeout" in timed.error.message
    assert not nowait.waited


def test_statement_ms_is_the_servers_time_for_the_last_statement(jobs):
    with labkit.Sessions(jobs, "A", "B", "C") as s:
        slept = s.A("SELECT pg_sleep(0.3)")
        assert 300 <= s.statement_ms("A") <= slept.elapsed_ms   # the server's time is within the client's
        s.A("BEGIN")
        s.A(CLAIM)
        s.B("BEGIN")
        nowait = s.B(CLAIM + " NOWAIT")
        assert nowait.error.kind == "nowait"
        assert 0 <= s.statement_ms("B") <= nowait.elapsed_ms
        s.C("SET lock_timeout = '200ms'")
        timed = s.C(CLAIM)
        assert s.statement_ms("C") is None                       # still waiting: no time yet
        s.wait("C")
        assert timed.error.kind == "lock_timeout" and 200 <= s.statement_ms("C") <= timed.elapsed_ms
        with pytest.raises(LabkitError):
            s.statement_ms("Z")


def test_skip_locked_gives_three_sessions_three_disjoint_rows(jobs):
    with labkit.Sessions(jobs, "A", "B", "C", watch={"job": "id"}) as s:
        got = {}
        for name in "ABC":
            s.step(name, "BEGIN")
            got[name] = s.step(name, CLAIM + " SKIP LOCKED").rows
        assert got == {"A": [(1,)], "B": [(2,)], "C": [(3,)]}
        assert s.locked_rows() == {"A": [1], "B": [2], "C": [3]}


def test_statement_timeout_guard_ends_a_runaway_step(jobs):
    with labkit.Sessions(jobs, "A", statement_timeout="200ms") as s:
        st = s.A("SELECT pg_sleep(30)")
    assert st.error.kind == "statement_timeout"
    assert st.elapsed_ms < 5000


def test_a_step_for_a_waiting_session_is_refused_with_the_fix(jobs):
    with labkit.Sessions(jobs, "A", "B", lock_timeout="300ms") as s:
        s.A("BEGIN")
        s.A(CLAIM)
        s.B("BEGIN")
        b = s.B(CLAIM)
        assert b.waited
        with pytest.raises(LabkitError, match=r"still waiting .* blocked by A.*run.wait\('B'\)"):
            s.B("ROLLBACK")
        # waiting on purpose: the guard (lock_timeout) ends B's wait, and B goes on
        assert s.wait("B") is b
        assert b.error.kind == "lock_timeout" and b.script_waited
        nxt = s.B("ROLLBACK")
        assert nxt.done and not nxt.error


def test_wrong_case_session_name_gets_the_same_clear_error(jobs):
    with labkit.Sessions(jobs, "A") as s:
        with pytest.raises(LabkitError, match="No session named 'a'"):
            s.a("SELECT 1")
        with pytest.raises(LabkitError, match="No session named 'Z'"):
            s.wait("Z")


def test_sql_errors_are_captured_not_raised(jobs):
    with labkit.Sessions(jobs, "A") as s:
        st = s.A("SELEC 1")
    assert st.error.sqlstate == "42601"


def test_unknown_session_and_bad_names_get_clear_errors(jobs):
    with pytest.raises(LabkitError, match="No session named"):
        with labkit.Sessions(jobs, "A") as s:
            s.step("Z", "SELECT 1")
    with pytest.raises(LabkitError, match="must differ"):
        labkit.Sessions(jobs, "A", "A")


@pytest.mark.parametrize("how", ["exit", "interrupt"])
def test_closing_a_run_releases_every_lock_and_connection(jobs, db, how):
    try:
        with labkit.Sessions(jobs, "A", "B") as s:
            s.A("BEGIN")
            s.A(CLAIM)
            s.B("BEGIN")
            assert s.B(CLAIM).waited
            if how == "interrupt":
                raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    left = [b for b in backends_of(db, jobs.app_name + ":%") if not b[1].endswith(":admin")]
    assert left == []
    # Nothing holds row 1 any more: a NOWAIT claim gets it at once.
    assert jobs.execute(CLAIM + " NOWAIT") == [(1,)]


def test_transcript_renders_text_html_and_swimlane(jobs):
    import matplotlib

    matplotlib.use("Agg")
    with labkit.Sessions(jobs, "A", "B", watch={"job": "id"}) as s:
        s.A("BEGIN")
        s.A(CLAIM, label="claim")
        s.B("BEGIN")
        s.B(CLAIM + " NOWAIT", label="claim NOWAIT")
        s.A("COMMIT")
        t = s.transcript()
    text = t.to_text()
    lines = text.splitlines()
    rule = next(i for i, line in enumerate(lines) if set(line) <= set("- "))
    assert " ".join(lines[:rule]).split() == ["#", "A", "B", "note", "locked", "rows"]
    assert max(map(len, lines)) <= TEXT_WIDTH
    assert "ERROR 55P03" in text and "NOWAIT: fails at once" in text
    assert "A:1" in text
    html = t.to_html()
    assert html.count("<tr>") == len(t.rows) + 1
    # one line a step: the session named in its own column, the note and the locks beside it
    lines = t.to_lines().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("1 "))
    assert " ".join(lines[:first]).split() == ["#", "session", "step", "→", "result", "note", "rows",
                                               "locked"]
    # a row that does not fit goes on inside its columns, on lines without a number
    assert [line.split()[0] for line in lines[first:] if line[:1] != " "] == [r.n for r in t.rows]
    assert max(map(len, lines)) <= TEXT_WIDTH
    nowait = next(line for line in lines if "claim NOWAIT" in line)
    assert nowait.split()[:2] == ["4", "B"] and "ERROR 55P03" in nowait and "A:1" in nowait
    ax = t.swimlane()
    assert [tick.get_text() for tick in ax.get_yticklabels()] == ["B", "A"]


def test_watching_a_missing_table_and_bad_session_names_are_explained(lab):
    with pytest.raises(LabkitError, match="does not exist"):
        labkit.Sessions(lab, "A", watch={"nope": "id"})
    lab.create_jobs(1)
    with pytest.raises(LabkitError, match="does not exist"):
        labkit.Sessions(lab, "A", watch={"job": "no_such_column"})
    with pytest.raises(LabkitError, match="cannot name a session"):
        labkit.Sessions(lab, "A", "step")


def test_send_settle_and_blockers_are_the_one_test_of_blocked_other_tools_use(jobs):
    with labkit.Sessions(jobs, "A", "B") as s:
        s.A("BEGIN")
        s.A(CLAIM)
        s.B("BEGIN")
        b = s.send("B", CLAIM)             # sent, not waited for
        assert not b.done and not b.waited
        blockers = s.settle("B")           # until it finishes or the server says it waits
        assert blockers.sessions == ["A"] and blockers.wait_event.startswith("Lock:")
        assert s.blockers("B") == blockers and s.blockers("A") is None
        assert s.settle("A") is None       # nothing running: finished
        s.send("A", "ROLLBACK")
        assert s.settle("A") is None
        assert s.settle("B", until_done=True) is None and b.rows == [(1,)]
        s.B("COMMIT")


def test_a_watchdog_may_cancel_a_step_the_tools_way(jobs):
    looks = []

    def watchdog(elapsed):
        if elapsed > 0.2 and not looks:
            s.sessions["A"].conn.cancel()
            looks.append(elapsed)

    with labkit.Sessions(jobs, "A") as s:
        slow = s.send("A", "SELECT pg_sleep(30)")
        assert s.settle("A", watchdog=watchdog) is None
    assert looks and slow.error.sqlstate == "57014" and "user request" in slow.error.message


def test_eight_sessions_queue_for_one_row_and_the_bound_is_named(jobs):
    names = [f"W{i}" for i in range(1, 9)]
    lock_1 = "SELECT id FROM job WHERE id = 1 FOR UPDATE"
    with labkit.Sessions(jobs, *names) as s:
        s.W1("BEGIN")
        s.W1(lock_1)
        queued = [s.step(name, lock_1) for name in names[1:]]
        for step in queued:
            assert step.waited and step.blocked_by and set(step.blocked_by) <= set(names[:-1])
        s.W1("COMMIT")
        for name in names[1:]:
            s.wait(name)
        assert all(step.rows == [(1,)] for step in queued)
    too_many = [f"S{i}" for i in range(MAX_SESSIONS + 1)]
    with pytest.raises(LabkitError, match=rf"1 to {MAX_SESSIONS} sessions, not {MAX_SESSIONS + 1}"
                                          rf".*at most {MAX_SESSIONS}"):
        labkit.Sessions(jobs, *too_many)
    with pytest.raises(LabkitError, match=rf"1 to {MAX_SESSIONS} sessions, not 0.*name the sessions"):
        labkit.Sessions(jobs)


def test_a_three_session_transcript_with_long_sql_and_notes_fits_the_width(jobs):
    from test_text import expected_by_column, words_by_column

    long_claim = CLAIM.replace("SELECT id", "SELECT id, status, created_at, 'a long label for the claim'")
    with labkit.Sessions(jobs, "A", "B", "C", watch={"job": "id"}) as s:
        for name in "ABC":
            s.step(name, "BEGIN")
        s.A(long_claim)
        s.B(long_claim)                      # waits for A
        s.C(long_claim + " NOWAIT")          # fails at once
        s.C("SELECT 1")                      # the transaction already failed
        s.C("COMMIT")                        # ... so COMMIT rolls it back
        s.A("COMMIT")                        # unblocks B
        s.B("COMMIT")
        t = s.transcript()
    text = t.to_text()
    lines = text.splitlines()
    assert max(map(len, lines)) <= TEXT_WIDTH
    cells = [[r.n] + [r.text if r.session == n else "" for n in t.names] + [r.note, r.locks]
             for r in t.rows]
    columns = words_by_column(text)
    assert columns == expected_by_column(cells)
    notes = " ".join(columns[4])
    assert "BLOCKS (waits for A)" in notes and "NOWAIT: fails at once" in notes
    assert "transaction already failed: every statement errors until ROLLBACK" in notes
    rule = next(i for i, line in enumerate(lines) if set(line) <= set("- "))
    assert [line.split()[0] for line in lines[rule + 1:] if line[:1] != " "] == [r.n for r in t.rows]
