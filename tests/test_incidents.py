"""The incident file: each incident breaks its invariant as reported and keeps it fixed, on a
real server, with what the server did read back; the command lists and runs them as a reader
types it; a run leaves no session and no schema behind."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from conftest import backends_of

from labkit.core.errors import LabkitError
from labkit.core.lab import Lab
from labkit.core.queries import queries
from labkit.labs import incidents as inc

# What each incident's run reads back, broken and fixed: the mechanism, not only the verdict.
OBSERVED = {
    "unique-enqueue": ({"live_jobs_with_the_key": 2}, {"live_jobs_with_the_key": 1}),
    "enqueue-outside": ({"jobs_claimed": 1, "claimed_without_their_order": 1,
                         "jobs_left_for_a_rolled_back_order": 1},
                        {"jobs_claimed": 0, "claimed_without_their_order": 0,
                         "jobs_left_for_a_rolled_back_order": 0}),
    "frozen-now": ({"due_jobs": 1, "due_jobs_the_polls_saw": [0, 0, 0]},
                   {"due_jobs": 1, "due_jobs_the_polls_saw": [1, 1, 1]}),
    "key-share": ({"claimed": [], "error": "55P03"}, {"claimed": [1], "error": None}),
    "repeatable-read": ({"a_claimed": [1], "b_claimed": [], "b_error": "40001"},
                        {"a_claimed": [1], "b_claimed": [2], "b_error": None}),
    "try-lock-leak": ({"pending_jobs": 5, "a_claimed": [1], "a_advisory_locks": 5, "b_claimed": []},
                      {"pending_jobs": 5, "a_claimed": [1], "a_advisory_locks": 0, "b_claimed": [2]}),
    "hot-row": ({"b_waited_for_a": True, "b_wait_event": "Lock:transactionid"},
                {"b_waited_for_a": False, "b_wait_event": None}),
    "batch-callback": ({"callbacks_fired": 2, "fired_by": ["A", "B"]},
                       {"callbacks_fired": 1, "fired_by": ["B"]}),
    "reaper-worker-id": ({"jobs_freed": [], "job_1_status": "RUNNING"},
                         {"jobs_freed": [1], "job_1_status": "PENDING"}),
}


def test_the_file_holds_ten_incidents_each_with_a_public_thread_and_a_section():
    assert len(inc.NAMES) >= 10 and len(set(inc.NAMES)) == len(inc.NAMES)
    assert set(OBSERVED) | {"history-count"} == set(inc.NAMES)
    for i in inc.incidents():
        for thread in (i.source, *i.also):
            assert re.fullmatch(r"[\w.-]+/[\w.-]+#\d+", thread), (i.name, thread)
        assert i.section in ("enqueue", "claim", "run", "finish", "watch", "recover"), i.name
        assert i.invariant and i.title
    # every incident builds its own scene, from a named query of incidents.sql
    assert len([n for n in queries(inc.SQL_FILE) if n.endswith("_scene")]) == len(inc.NAMES)


@pytest.mark.parametrize("name", sorted(OBSERVED))
def test_an_incident_breaks_as_reported_and_holds_fixed(lab, name):
    broken = inc.run(lab, name)
    fixed = inc.run(lab, name, fixed=True)
    assert (broken.invariant_holds, fixed.invariant_holds) == (False, True)
    assert (broken.observed, fixed.observed) == OBSERVED[name]
    assert broken.took_s < 30 and fixed.took_s < 30
    assert broken.invariant == fixed.invariant == inc.incident(name).invariant


def test_history_count_grows_with_history_without_the_index_and_stays_flat_with_it(lab):
    broken = inc.run(lab, "history-count")
    fixed = inc.run(lab, "history-count", fixed=True)
    assert broken.observed.scan == "Seq Scan" and broken.observed.growth > 5
    assert fixed.observed.scan == "Index Only Scan"
    assert fixed.observed.buffers_per_count[0] == fixed.observed.buffers_per_count[1]
    assert fixed.observed.buffers_per_count[1] < broken.observed.buffers_per_count[0]
    assert (broken.invariant_holds, fixed.invariant_holds) == (False, True)


def test_the_fixed_unique_enqueue_shows_the_second_insert_waiting_for_the_first(lab):
    text = inc.format_run(inc.run(lab, "unique-enqueue", fixed=True))
    rows = [re.sub(r"\s+", " ", line).strip() for line in text.splitlines()[1:9]]
    assert rows == ["1 A BEGIN → BEGIN", "2 B BEGIN → BEGIN", "3 A INSERT ON CONFLICT → INSERT 0 1",
                    "4 B INSERT ON CONFLICT <waiting ...> BLOCKS (waits for A)",
                    "5 A COMMIT → COMMIT unblocks B", "4' B <... completed> → INSERT 0 0",
                    "6 B COMMIT → COMMIT", ""], text


def test_what_a_run_read_back_is_read_by_name_and_cannot_be_changed(lab):
    got = inc.run(lab, "key-share")
    assert got.observed.error == "55P03" and got.observed["claimed"] == []
    with pytest.raises(AttributeError, match="no 'errors'; it has claimed, error"):
        got.observed.errors
    with pytest.raises(TypeError, match="cannot be changed"):
        got.observed["error"] = None
    assert json.loads(got.to_json())["observed"] == {"claimed": [], "error": "55P03"}


def test_an_unknown_incident_names_the_ones_there_are(lab):
    with pytest.raises(LabkitError) as err:
        inc.run(lab, "no-such-thing")
    assert "unique-enqueue" in str(err.value) and "labkit incident list" in str(err.value)


def _labkit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "labkit", *args], capture_output=True, text=True,
                          timeout=120)


def test_the_list_command_prints_every_incident_as_json_and_text():
    done = _labkit("incident", "list", "--json")
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    assert [i["name"] for i in listed] == inc.NAMES
    assert all({"name", "source", "section"} <= set(i) for i in listed)
    text = _labkit("incident", "list").stdout
    assert all(f"{i.name} ({i.section})" in text and i.source in text for i in inc.incidents())


@pytest.mark.server
def test_the_run_command_reports_broken_then_fixed_and_leaves_nothing_behind(db):
    broken = _labkit("incident", "run", "batch-callback", "--json")
    fixed = _labkit("incident", "run", "batch-callback", "--fixed", "--json")
    assert broken.returncode == fixed.returncode == 0, broken.stderr + fixed.stderr
    assert json.loads(broken.stdout)["invariant_holds"] is False
    assert json.loads(fixed.stdout) | {"took_s": 0} == {
        "name": "batch-callback", "fixed": True, "invariant": inc.incident("batch-callback").invariant,
        "invariant_holds": True, "observed": {"callbacks_fired": 1, "fired_by": ["B"]}, "took_s": 0}
    text = _labkit("incident", "run", "key-share").stdout
    assert "55P03" in text and "-- BROKEN" in text
    assert backends_of(db, "labkit:lab_incident_%") == []
    with db.connect() as conn:
        assert conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'lab\\_incident\\_%'"
                            ).fetchone()[0] == 0
    bad = _labkit("incident", "run", "nope")
    assert bad.returncode == 2 and "labkit incident list" in bad.stderr


def test_an_interrupted_incident_leaves_no_session_holding_a_lock(db, monkeypatch):
    """Ctrl-C between two steps (B waits for A's lock): the sessions are rolled back and
    closed on the way out, and the lab's schema is dropped by the command's lab."""
    from labkit.core import sessions

    real = sessions.Sessions.step
    calls = []

    def interrupted(self, session, sql_text, **kw):
        calls.append(session)
        if len(calls) == 5:          # after B's insert is waiting for A
            raise KeyboardInterrupt
        return real(self, session, sql_text, **kw)

    monkeypatch.setattr(sessions.Sessions, "step", interrupted)
    name = "t_incident_interrupted"
    with pytest.raises(KeyboardInterrupt):
        inc.run_command(open_lab=lambda: Lab.open(db, name), name="unique-enqueue", fixed=True)
    assert backends_of(db, f"labkit:lab_{name}%") == []
    with db.connect() as conn:
        assert conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname LIKE %s",
                            (f"lab_{name}%",)).fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
                            "WHERE a.application_name LIKE %s", (f"labkit:lab_{name}%",)).fetchone()[0] == 0
