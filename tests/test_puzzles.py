"""The scheduler's seat: each puzzle's known solution breaks its promise on a real server and
an ordering that keeps it does not; every ordering the server allows is played to show that no
shorter solution exists and that the unbreakable puzzles cannot be broken; a move the server
would not let happen is refused with the moves that are legal; a crash is a real one; the
learner's record reaches the presenter's status without running anything a trainee wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import backends_gone, login_role

from labkit import cli
from labkit.core.errors import LabkitError
from labkit.core.lab import Lab
from labkit.core.queries import queries
from labkit.labs import puzzles as pz

BREAKABLE = [p.name for p in pz.puzzles() if p.breakable]
UNBREAKABLE = [p.name for p in pz.puzzles() if not p.breakable]

# For each breakable puzzle, an ordering that runs every program and keeps the promise.
KEEPS = {
    "read_then_mark": ["A", "A", "A", "B", "B", "B"],
    "wait_convoy": ["A", "A", "A", "B", "B", "B"],
    "empty_handed": ["A", "A", "B", "B"],
    "unfenced_zombie": ["A", "A", "T", "B"],
    "high_water_relay": ["W1", "W1", "W2", "W2", "R", "R"],
    "held_lock_drain": ["D1", "D1", "D1", "D1", "D2"],
}


def labkit_cli(*args: str, user: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "LABKIT_USER": user}
    return subprocess.run([sys.executable, "-m", "labkit", *args], capture_output=True, text=True,
                          timeout=120, env=env)


@pytest.fixture
def record_user(db):
    """A learner's name of this test's own, and its record schema dropped afterwards."""
    user = f"puzzler{os.getpid()}"
    yield user
    with db.connect() as c:
        c.execute(f'DROP SCHEMA IF EXISTS "{pz.RECORD_PREFIX}{user}" CASCADE')


def test_there_are_puzzles_at_every_level_some_of_which_cannot_be_broken():
    assert len(pz.puzzles()) >= 8
    assert {p.level for p in pz.puzzles()} == set(pz.LEVELS)
    assert len(UNBREAKABLE) >= 3 and len(BREAKABLE) >= 5
    assert set(KEEPS) == set(BREAKABLE)
    names = set(queries(pz.SQL_FILE))
    for p in pz.puzzles():
        assert p.scene in names and p.check in names, p.name
        assert all(m.query in names for program in p.programs.values() for m in program), p.name
        assert p.why and p.notebook, p.name
        if p.shortest:
            assert set(t.rstrip(pz.CRASH) for t in p.shortest) <= set(p.sessions), p.name


def labkit_here(capsys, *args: str) -> tuple[int, str, str]:
    """``labkit ARGS`` run in this process (as the command line's main() runs it): the exit
    code, what it printed and what it said on stderr."""
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("name", BREAKABLE)
def test_the_known_solution_breaks_the_promise_from_the_command_line(db, name, record_user, capsys, monkeypatch):
    monkeypatch.setenv("LABKIT_USER", record_user)
    p = pz.puzzle(name)
    code, out, err = labkit_here(capsys, "play", name, "--steps", ",".join(p.shortest), "--json")
    assert code == 0, err
    got = json.loads(out)
    assert got["invariant_broken"] is True
    assert got["broken_after"] == got["moves"] == len(p.shortest) == got["shortest"]
    assert got["steps"] == list(p.shortest)
    assert got["invariant"] == p.invariant
    # The command wrote the play into the learner's record.
    with db.connect() as c:
        assert pz.progress(c, c.info.user, schema=pz.record_schema())[name]["fewest_moves"] == len(p.shortest)


@pytest.mark.parametrize("name", BREAKABLE)
def test_an_ordering_that_runs_every_program_can_keep_the_promise(lab, name):
    r = pz.play(lab, name, KEEPS[name])
    assert r.invariant_broken is False and r.broken_after is None
    assert r.moves == len(KEEPS[name])


def test_a_promise_broken_once_stays_broken_and_the_record_keeps_the_move_that_broke_it(lab, db, record_user,
                                                                                       monkeypatch):
    # B's wait ends when A commits, and a second drain then locks the row the check reads: the
    # state after the last move no longer shows the break, and the verdict is still the break.
    monkeypatch.setenv("LABKIT_USER", record_user)
    waited = pz.play(lab, "wait_convoy", ["A", "B", "A", "A", "B", "B"])
    assert waited.invariant_broken and waited.broken_after == 2 and not waited.broken_now
    assert waited.observed == {"sessions_waiting": 1, "jobs_claimed_twice": 0}      # at the break
    assert "BROKEN after move 2 of 6 (the check no longer sees it" in pz.format_play(waited)
    pushed = pz.play(lab, "held_lock_drain", ["D1", "D1", "D1!", "D2"])
    assert pushed.invariant_broken and pushed.broken_after == 3 and not pushed.broken_now
    pz.record(lab.admin, pushed)
    with db.connect() as c:
        assert pz.progress(c, c.info.user, schema=pz.record_schema())["held_lock_drain"] == {"plays": 1, "fewest_moves": 3}


def test_the_command_says_false_for_an_ordering_that_keeps_the_promise(record_user):
    # As a reader types it: a process of its own, its JSON on stdout.
    done = labkit_cli("play", "read_then_mark", "--steps", "A,A,A,B,B,B", "--json", user=record_user)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["invariant_broken"] is False


@pytest.mark.parametrize("name", BREAKABLE)
def test_every_ordering_played_finds_none_shorter_than_the_known_solution(lab, name):
    found = pz.search(lab, name)
    p = pz.puzzle(name)
    assert found.shortest is not None and len(found.shortest) == len(p.shortest)
    assert found.broken_by >= 1 and found.orderings_played > found.broken_by
    # What the search found breaks it when played again.
    assert pz.play(lab, name, found.shortest).invariant_broken


@pytest.mark.parametrize("name", UNBREAKABLE)
def test_no_ordering_the_server_allows_breaks_an_unbreakable_puzzle(lab, name):
    found = pz.search(lab, name)
    assert found.shortest is None and found.broken_by == 0
    # Every program's steps in every interleaving: at least the orderings of two workers'
    # three steps each that never wait (two of the puzzles wait, and lose some).
    assert found.orderings_played >= 14
    assert found.moves_played >= 4 * found.orderings_played


def test_a_waiting_session_cannot_move_and_the_refusal_names_the_legal_moves(lab):
    with pz.Board(lab, "wait_convoy") as board:
        board.move("A")
        board.move("B")
        assert board.waiting("B") and board.legal() == ["A"]
        assert board.observed["sessions_waiting"] == 1
        with pytest.raises(LabkitError) as e:
            board.move("B")
        assert "B is waiting for a lock A holds" in str(e.value) and "legal now: A" in str(e.value)
        for bad, said in (("C", "has no session 'C'"), ("A!", "cannot be killed in this puzzle"),
                          ("!", "names no session"), ("A!!", "is not a move")):
            with pytest.raises(LabkitError, match=said):
                board.move(bad)
        board.move("A")
        board.move("A")          # A commits; B's claim, which waited, completes
        assert not board.waiting("B") and board.observed["sessions_waiting"] == 0
        # A locking claim that waited went on to the next row: FOR UPDATE locks before LIMIT.
        claim_b = next(s for s in board.run.steps if s.session == "B")
        assert claim_b.waited and claim_b.rows == [(2,)]


def test_a_crash_ends_the_backend_and_rolls_its_transaction_back(lab, db):
    with pz.Board(lab, "held_lock_drain") as board:
        with pytest.raises(LabkitError, match="has not started"):
            board.move("D1!")
        board.move("D1")
        pid = board.run.sessions["D1"].pid
        assert lab.execute("SELECT attempts FROM delivery")[0][0] == 0      # not committed yet
        board.move("D1")
        board.move("D1!")
        assert lab.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,))[0][0] == 0
        assert lab.execute("SELECT attempts FROM delivery")[0][0] == 0
        assert board.observed == {"broken": True, "pushes_not_counted": 1}
        assert "D1" not in board.legal() and "D1!" not in board.legal()
        # The other drain finds the delivery free again: the crash released the row lock.
        board.move("D2")
        assert board.run.steps[-1].rows == [(1,)]
    # Its sessions, their aside connections and the monitor are gone (the lab's own admin
    # connection stays, as in every lab).
    assert backends_gone(db, f"labkit:{lab.schema}:D%") == []
    assert backends_gone(db, f"labkit:{lab.schema}:monitor") == []


def test_a_claim_that_found_nothing_stops_its_worker(lab):
    with pz.Board(lab, "held_lock_drain") as board:
        board.move("D1")
        board.move("D2")                # D1 holds the delivery: D2's claim skips it
        assert board.ended["D2"] == "found no work" and "D2" not in board.legal()
        assert [s.label for s in board.run.steps if s.session == "D2"] == ["claim", "stops"]
        with pytest.raises(LabkitError, match="D2 has no step left"):
            board.move("D2")


def test_the_seat_widget_plays_by_clicks_and_reads_as_text(lab, db, record_user, monkeypatch):
    monkeypatch.setenv("LABKIT_USER", record_user)
    seat = pz.Seat(lab, "unfenced_zombie")
    try:
        assert repr(seat.box) == "The scheduler's seat: unfenced_zombie, 0 moves played, the promise holds"
        assert len(repr(seat.box)) <= 110 and "Goal: Make a worker write" in seat.text()
        assert seat.buttons["A"].description == "A: claim (id, token)" and not seat.buttons["A"].disabled
        for token in ("A", "T", "B", "A"):
            seat.buttons[token].click()
        text = seat.text()
        assert "BROKEN after move 4: A,T,B,A" in text and "by_a_worker_not_owning_it: 1" in text
        assert repr(seat.box).endswith("4 moves played, the promise broken")
        assert seat.buttons["A"].disabled and seat.buttons["A"].description == "A: done"
        assert "BROKEN after move 4" in seat.out.outputs[0]["text"]
        with db.connect() as c:     # the play went into the record once it broke
            assert pz.progress(c, c.info.user, schema=pz.record_schema())["unfenced_zombie"] == {"plays": 1, "fewest_moves": 4}
        seat.again.click()
        assert "holds after 0 moves" in seat.text() and not seat.buttons["A"].disabled
    finally:
        seat.close()


@pytest.fixture
def trainee(db):
    yield from login_role(db, f"puzzle_trainee_{os.getpid()}")


def test_the_presenter_reads_a_trainees_record_from_the_catalogue_only(db, trainee, monkeypatch):
    role = f"puzzle_trainee_{os.getpid()}"
    monkeypatch.setenv("LABKIT_USER", role)
    lab = Lab.open(trainee, "puzzle_record")
    try:
        for steps in (["A", "A", "A", "B", "B", "B"], ["A", "B", "A", "A", "B", "B"]):
            pz.record(lab.admin, pz.play(lab, "read_then_mark", steps))
        pz.record(lab.admin, pz.play(lab, "skip_locked", ["A", "B"]))
        schema = pz.RECORD_PREFIX + role
        # The trainee's table is closed to others; what the presenter reads is the summary.
        with db.connect() as c:
            got = pz.progress(c, role)
            assert got == {"read_then_mark": {"plays": 2, "fewest_moves": 6},
                           "skip_locked": {"plays": 1, "fewest_moves": None}}
            assert pz.progress_line(got) == f"1/{len(BREAKABLE)} broken (1 at shortest), 3 plays"
            assert pz.progress(c, "nobody_at_all") == {} and pz.progress_line({}) == "-"
        # A trainee who writes their own summary can claim a solve (it is a progress board,
        # not an exam), but nothing that is not a summary of known puzzles is read.
        forged = {"read_then_mark": [1, 2], "no_such_puzzle": [1, 1], "wait_convoy": ["x", 1],
                  "skip_locked": [1, 2, 3]}
        lab.admin.execute(f'COMMENT ON SCHEMA "{schema}" IS %s'.replace("%s", "'" + json.dumps(forged) + "'"))
        with db.connect() as c:
            assert pz.progress(c, role) == {"read_then_mark": {"plays": 1, "fewest_moves": 2}}
        lab.admin.execute(f"COMMENT ON SCHEMA \"{schema}\" IS 'not json'")
        with db.connect() as c:
            assert pz.progress(c, role) == {}
    finally:
        lab.drop()


def test_the_command_lists_and_refuses_as_a_reader_types_it(record_user, capsys, monkeypatch):
    monkeypatch.setenv("LABKIT_USER", record_user)
    code, out, _ = labkit_here(capsys, "play", "--list", "--json")
    assert code == 0
    got = json.loads(out)
    assert [d["name"] for d in got] == list(pz.NAMES)
    assert {d["name"] for d in got if not d["breakable"]} == set(UNBREAKABLE)
    for args, said in ((["play"], "Name a puzzle"), (["play", "nope"], "No puzzle is called 'nope'"),
                       (["play", "wait_convoy", "--steps", "A,B,B"], "B is waiting for a lock A holds"),
                       (["play", "wait_convoy", "--steps", "A", "--search"], "two different things"),
                       (["play", "wait_convoy", "--steps", ","], "names no move"),
                       (["play", "--list", "wait_convoy"], "takes no puzzle")):
        code, _, err = labkit_here(capsys, *args)
        assert code == 2 and said in err, (args, err)
        assert err.startswith("labkit play: ") and "Fix:" in err
    # A refused move shows what was played before it.
    code, out, err = labkit_here(capsys, "play", "wait_convoy", "--steps", "A,B,B")
    assert code == 2 and "B is waiting" in err and "BLOCKS (waits for A)" in out
    code, out, _ = labkit_here(capsys, "play", "held_lock_drain")
    assert code == 0 and "D1: claim, push, done, commit (may be killed: D1!)" in out


def test_a_progress_reported_from_a_trainees_side_is_taken_only_in_its_shape():
    # `labkit hub status` reads each trainee's progress from a process of the trainee's: an
    # odd value neither breaks the presenter's table nor names a puzzle that is not there.
    good = {"plays": 2, "fewest_moves": 3}
    for odd in (None, [], "3/6", {"read_then_mark": "all"}, {"read_then_mark": {"plays": True}},
                {"read_then_mark": {"plays": 1, "fewest_moves": -1}}, {"no_such": good},
                {"read_then_mark": {"plays": 1.5, "fewest_moves": None}}):
        assert pz.checked_progress(odd) == {}
        assert pz.progress_line(odd) == "-"
    assert pz.checked_progress({"read_then_mark": {**good, "extra": "x"}, "x": 1}) == {"read_then_mark": good}
    assert pz.progress_line({"read_then_mark": good}).startswith("1/")


@pytest.fixture
def squatter(db):
    yield from login_role(db, f"puzzle_squatter_{os.getpid()}")


def test_a_record_schema_another_role_made_first_is_refused_and_nothing_of_its_runs(db, squatter, lab,
                                                                                   monkeypatch):
    # The record's name is predictable: a trainee makes the victim's record schema first, with
    # a table whose trigger would run as the victim (here: it would make the squatter a
    # superuser's equal by changing the victim's password).  The victim's play is refused
    # before anything is written, and the trigger never runs.
    victim = f"victim{os.getpid()}"
    monkeypatch.setenv("LABKIT_USER", victim)
    schema = pz.record_schema()
    with squatter.connect() as c:
        c.execute(f'CREATE SCHEMA "{schema}"')
        c.execute(f'CREATE TABLE "{schema}".puzzle_play (puzzle text, steps text[], moves int, '
                  'broken boolean, at timestamptz DEFAULT now())')
        c.execute(f'CREATE TABLE "{schema}".fired (by_whom text)')
        c.execute(f'CREATE FUNCTION "{schema}".trap() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN '
                  f'INSERT INTO "{schema}".fired VALUES (current_user); RETURN NEW; END $$')
        c.execute(f'CREATE TRIGGER trap BEFORE INSERT ON "{schema}".puzzle_play '
                  f'FOR EACH ROW EXECUTE FUNCTION "{schema}".trap()')
        c.execute(f'GRANT USAGE, CREATE ON SCHEMA "{schema}" TO PUBLIC')
        c.execute(f'GRANT INSERT, SELECT ON ALL TABLES IN SCHEMA "{schema}" TO PUBLIC')
    played = pz.play(lab, "wait_convoy", ["A", "B"])
    with pytest.raises(pz.RecordTaken, match=f"belongs to puzzle_squatter_{os.getpid()}"):
        pz.record(lab.admin, played)
    with squatter.connect() as c:
        assert c.execute(f'SELECT count(*) FROM "{schema}".fired').fetchone() == (0,)
        assert c.execute(f'SELECT count(*) FROM "{schema}".puzzle_play').fetchone() == (0,)


def test_a_long_learners_name_keeps_its_record_apart_from_another(monkeypatch):
    names = set()
    for user in ("x" * 200, "x" * 201):
        monkeypatch.setenv("LABKIT_USER", user)
        names.add(pz.record_schema())
    assert len(names) == 2 and all(len(n) <= 63 and n.startswith(pz.RECORD_PREFIX) for n in names)


def test_a_summary_too_long_or_too_deep_is_passed_over(db, trainee, monkeypatch):
    role = f"puzzle_trainee_{os.getpid()}"
    with trainee.connect() as c:
        for i, comment in enumerate(("[" * 100000, '{"read_then_mark": [' + "9" * 5000 + ", null]}",
                                     '{"read_then_mark": [' + str(10**7) + ", 3]}")):
            c.execute(f'CREATE SCHEMA "{pz.RECORD_PREFIX}odd{i}"')
            c.execute(f'COMMENT ON SCHEMA "{pz.RECORD_PREFIX}odd{i}" IS ' + "'" + comment + "'")
    with db.connect() as c:
        assert pz.progress(c, role) == {}
