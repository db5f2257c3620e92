"""Cursor relays on a real server: the high-water mark loses the event whose transaction was
still open when it read past it; the published flag and the transaction-id cursor do not, and
the transaction-id cursor waits for every transaction that has written something."""

import json
import math
import re

import pytest
from conftest import backends_gone

from labkit import Lab
from labkit.core.errors import LabkitError
from labkit.core.queries import query
from labkit.labs import cursor as cg
from labkit.labs import relay as rl


def _never(*_a, **_k):
    raise AssertionError("the lab was opened before the parameters were checked")


def _no_sessions_left(db, schema: str) -> None:
    for role in cg.SESSION_ROLES:
        assert backends_gone(db, f"labkit:{schema}:{role}") == [], role


def _clean(run) -> None:
    """The script ran as written: no step waited for a lock or failed."""
    assert not any(st.waited or st.error or not st.done for st in run.steps)


def test_the_high_water_mark_loses_the_event_p1_held_open(lab, db):
    r = cg.cursor_gap(lab)
    n = cg.PRELOAD + 1
    assert r.p1_event == n and r.newer_events == [n + 1, n + 2, n + 3]
    assert r.cursor_lost_events == [n] and r.lost_event_ids == [rl.event_id(n)]
    assert r.publish_order == [n + 1, n + 2, n + 3]           # all of P2's, while P1 was open
    assert r.published_while_open == 3 and r.held_back_while_open == 0
    assert r.published_after_commit == [] and r.cursor_at_end == n + 3
    _clean(r.run)
    # The row is there and committed, and the relay's read will never return it.
    assert lab.execute("SELECT event_id FROM outbox WHERE id = %s", (n,)) == [(rl.event_id(n),)]
    assert lab.execute(query("cursor.sql", "cursor_read").sql, {"batch": 100}) == []
    assert f"{rl.event_id(n)} is lost" in r.transcript
    assert "read id > 2" in r.transcript and "read id > 6" in r.transcript
    _no_sessions_left(db, lab.schema)


def test_the_flag_relay_publishes_the_event_once_p1_commits(lab, db):
    r = cg.flag_gap(lab)
    n = r.p1_event
    assert r.flag_lost_events == []
    assert r.publish_order == [n + 1, n + 2, n + 3, n]        # n as soon as P1 committed
    assert r.published_while_open == 3 and r.published_after_commit == [n]
    assert lab.execute("SELECT count(*) FROM outbox WHERE published_at IS NULL") == [(0,)]
    assert lab.execute("SELECT count(*) FROM published WHERE relay = 'flag' "
                       "GROUP BY outbox_id HAVING count(*) > 1") == []    # each exactly once
    _clean(r.run)
    _no_sessions_left(db, lab.schema)


def test_the_transaction_id_cursor_loses_nothing_and_waits_for_p1(lab, db):
    r = cg.safe_cursor_gap(lab)
    n = r.p1_event
    assert r.safe_cursor_lost_events == []
    assert r.published_while_open == 0 and r.held_back_while_open == 3
    assert r.oldest_writer == "P1"
    assert r.publish_order == [n, n + 1, n + 2, n + 3]        # xid order: P1's first
    assert r.cursor_at_end == n + 3
    cur_xid, row_xid = lab.execute("SELECT c.last_xid::text, o.xid::text FROM relay_cursor c, outbox o "
                                   "WHERE c.relay = 'safe' AND o.id = %s", (n + 3,))[0]
    assert cur_xid == row_xid
    _clean(r.run)
    _no_sessions_left(db, lab.schema)


def test_the_three_relays_differ_only_in_their_read(lab):
    """Same producers, same preload, same interleaving: only the relay's read differs."""
    out = {k: f(lab, later=1) for k, f in (("cursor", cg.cursor_gap), ("flag", cg.flag_gap),
                                           ("safe", cg.safe_cursor_gap))}
    p1 = [[st.label for st in r.run.steps if st.session in ("P1", "P2")] for r in out.values()]
    assert p1[0] == p1[1] == p1[2] == ["BEGIN", "place order 3", "place order 4", "COMMIT"]
    assert out["cursor"].cursor_lost_events == [3] and out["cursor"].publish_order == [4]
    assert out["flag"].flag_lost_events == [] and out["flag"].publish_order == [4, 3]
    assert out["safe"].safe_cursor_lost_events == [] and out["safe"].publish_order == [3, 4]
    assert out["safe"].held_back_while_open == 1


def test_the_id_alone_under_the_bound_loses_a_row_the_xid_id_cursor_publishes(lab, db):
    r = cg.id_cursor_gap(lab)
    n = cg.PRELOAD + 1
    assert r.xid_order == [n + 1, n]                    # ids and xids in different orders
    assert r.id_cursor_lost_events == [n] and r.lost_event_ids == [rl.event_id(n)]
    assert r.safe_cursor_lost_events == []
    assert r.publish_order == {"bounded": [n + 1], "safe": [n + 1, n]}
    # the id cursor stands past row n, which is committed, and its read will never return it
    assert cg.cursor_position(lab, "bounded") == n + 1
    assert lab.execute(query("cursor.sql", "bounded_read").sql, {"batch": 100}) == []
    _clean(r.run)
    labels = [(st.session, st.label) for st in r.run.steps]
    assert labels[:4] == [("P1", f"BEGIN; order {n + 1}"), ("P2", f"BEGIN; place order {n}"),
                          ("P1", f"order {n + 1}'s event"), ("P1", "COMMIT")]
    assert labels.index(("P2", "COMMIT")) > labels.index(("relay", f"B cursor := row {n + 1}"))
    assert f"{rl.event_id(n)} is lost" in r.transcript
    assert r.transcript == cg.id_cursor_gap(lab).transcript        # reproduces exactly
    assert max(map(len, r.transcript.splitlines())) <= 96
    _no_sessions_left(db, lab.schema)


def test_a_writer_anywhere_holds_the_safe_cursor_back_a_reader_does_not(lab, db):
    r = cg.open_writer_stall(lab)
    assert r.held_back_by_open_reader == 0 and r.published_while_reader_open == 1
    assert r.held_back_by_open_writer == 1 and r.oldest_writer == "batch"
    assert r.safe_cursor_lost_events == []
    _clean(r.run)
    _no_sessions_left(db, lab.schema)


def test_transcripts_reproduce_exactly_and_show_no_transaction_ids(lab):
    first = cg.safe_cursor_gap(lab).transcript
    again = cg.safe_cursor_gap(lab).transcript          # other xids, the same text
    assert first == again
    stall = cg.open_writer_stall(lab).transcript
    assert stall == cg.open_writer_stall(lab).transcript
    assert cg.cursor_gap(lab).transcript == cg.cursor_gap(lab).transcript
    assert not re.search(r"\d{4,}", re.sub(r"evt-\d+", "", first + stall))


def test_an_older_writer_of_another_session_is_named_not_waited_for_forever(lab, db):
    with db.connect() as other:                     # another schema, another table: any writer
        other.execute("BEGIN")
        other.execute("SELECT pg_current_xact_id()")  # a transaction id, as a first write gets one
        pid = other.info.backend_pid
        try:
            with pytest.raises(LabkitError) as err:
                cg.safe_cursor_gap(lab, wait_s=0.3)
            assert f"pid {pid}" in str(err.value) and "Fix:" in str(err.value)
            assert cg.cursor_gap(lab).cursor_lost_events == [3]   # it does not wait for anyone
        finally:
            other.execute("ROLLBACK")
    assert cg.safe_cursor_gap(lab, later=1).safe_cursor_lost_events == []
    _no_sessions_left(db, lab.schema)


def test_settling_waits_for_older_writers_of_other_sessions_not_for_the_runs_own(lab, db):
    from labkit import Sessions

    cg.create_cursor_outbox(lab, "safe")
    with db.connect() as other, Sessions(lab, "P1", "relay") as run:
        run.P1("BEGIN")
        run.P1(cg.place_text(lab, 3))                      # P1, of the run, holds an older xid
        other.execute("BEGIN")
        other.execute("SELECT pg_current_xact_id()")
        lab.execute(cg.place_text(lab, 4))                  # committed, newer than both
        with pytest.raises(LabkitError) as err:
            cg.settle_other_writers(lab, run, 0.2)
        assert f"pid {other.info.backend_pid}" in str(err.value)
        assert f"pid {run.sessions['P1'].pid}" not in str(err.value)
        other.execute("ROLLBACK")
        cg.settle_other_writers(lab, run, 0.2)              # only the run's own P1 is older now
        assert run.relay(query("cursor.sql", "oldest_writer").sql).rows == [("P1",)]


@pytest.mark.parametrize("kw", [
    {"later": 0}, {"later": 21}, {"later": 1.5}, {"later": True}, {"later": "3"},
    {"wait_s": -1}, {"wait_s": math.nan}, {"wait_s": 601}, {"wait_s": "10"},
])
def test_bad_parameters_are_refused_before_any_lab_is_opened(kw):
    args = {"later": 3, "wait_s": 10, **kw}
    with pytest.raises(LabkitError) as err:
        cg.cursor_gap_command(open_lab=_never, json=False, **args)
    assert next(iter(kw)) in str(err.value) and "Fix:" in str(err.value)


def test_bad_input_to_the_lab_functions(lab):
    with pytest.raises(LabkitError, match="later"):
        cg.cursor_gap(lab, later=0)
    with pytest.raises(LabkitError, match="later"):
        cg.safe_cursor_gap(lab, later=MAX_PLUS_ONE)
    with pytest.raises(LabkitError, match="wait_s"):
        cg.open_writer_stall(lab, wait_s=-1)
    with pytest.raises(LabkitError, match="wait_s"):
        cg.id_cursor_gap(lab, wait_s=601)
    with pytest.raises(LabkitError, match="No relay"):
        cg.create_cursor_outbox(lab, "offset")
    with pytest.raises(LabkitError, match="No relay"):
        cg.tick(lab, "offset", lambda text, label: [])


MAX_PLUS_ONE = cg.MAX_LATER + 1


def test_the_command_prints_json_and_drops_its_lab(db, capsys):
    opened = []

    def open_lab():
        opened.append(Lab.open(db, f"t_cursor_cmd_{id(opened)}"))
        return opened[-1]

    assert cg.cursor_gap_command(open_lab=open_lab, later=2, json=True) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cursor_lost_events"] == [3] and out["lost_event_ids"] == ["evt-0003"]
    assert out["flag_lost_events"] == [] and out["safe_cursor_lost_events"] == []
    assert out["held_back_while_open"] == 2 and out["published_while_open"] == {
        "cursor": 2, "flag": 2, "safe": 0}
    assert (out["held_back_by_open_reader"], out["held_back_by_open_writer"]) == (0, 1)
    assert "transcripts" not in out
    schema = opened[0].schema
    with db.connect() as conn:
        assert conn.execute("SELECT to_regnamespace(%s)", (schema,)).fetchone()[0] is None
    assert backends_gone(db, f"labkit:{schema}:%") == []


def test_the_command_prints_the_runs_and_a_summary(db, capsys):
    assert cg.cursor_gap_command(open_lab=lambda: Lab.open(db, "t_cursor_cmd_text"),
                                 later=1, json=False) == 0
    text = capsys.readouterr().out
    assert "-- the high-water mark" in text and "evt-0003 is lost" in text
    assert "transaction-id    lost []; held back 1 while P1 was open" in text


def test_an_interrupt_mid_script_leaves_no_session_and_no_lab(db, monkeypatch):
    opened = []

    def open_lab():
        opened.append(Lab.open(db, f"t_cursor_int_{id(opened)}"))
        return opened[-1]

    real = cg.tick

    def interrupted(lab, relay, step, **kw):
        if lab.execute("SELECT count(*) FROM outbox")[0][0] > cg.PRELOAD:   # inside the script
            raise KeyboardInterrupt
        return real(lab, relay, step, **kw)

    monkeypatch.setattr(cg, "tick", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cg.cursor_gap_command(open_lab=open_lab, json=True)
    schema = opened[0].schema
    with db.connect() as conn:
        assert conn.execute("SELECT to_regnamespace(%s)", (schema,)).fetchone()[0] is None
    assert backends_gone(db, f"labkit:{schema}:%") == []


def test_the_timeline_is_read_from_the_server_and_drawn(lab):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    high, safe = cg.cursor_gap(lab), cg.safe_cursor_gap(lab)
    n, hw, sc = high.p1_event, high.timeline, safe.timeline
    assert hw.order == sc.order == [1, 2, n, n + 1, n + 2, n + 3]
    assert (hw.order_by, sc.order_by) == ("id", "(xid, id)")
    rows = {r.id: r for r in hw.rows}
    # P1's row: inserted at step 2, committed at step 9 (its COMMIT), never published; the
    # cursor moved from 2 to n + 3 at step 8, between the two
    assert (rows[n].inserted, rows[n].committed, rows[n].published) == (2, 9, None)
    assert hw.cursor == [(0, cg.PRELOAD), (8, n + 3)]
    assert [(p.step, p.ids) for p in hw.polls] == [(6, [n + 1, n + 2, n + 3]), (10, [])]
    assert all(rows[i].inserted == rows[i].committed < rows[i].published == 7 for i in (n + 1, n + 2, n + 3))
    # the safe cursor: its first read stops below P1's row (2 rows below the bound), the
    # second, after P1's COMMIT, has all six below it and returns n...n+3
    assert [(p.step, p.ids, p.below_bound) for p in sc.polls] == [
        (6, [], 2), (9, [n, n + 1, n + 2, n + 3], 6), (12, [], 6)]
    assert {r.id: r.published for r in sc.rows}[n] == 10
    assert sc.cursor == [(0, cg.PRELOAD), (11, n + 3)]
    # the bound after every step: two rows below it until P1's COMMIT (step 8), all six after
    assert sc.bound == [(k, 2 if k < 8 else 6) for k in range(1, sc.steps + 1)]
    assert rows[n].committed == 9 and {r.id: r for r in sc.rows}[n].committed == 8
    assert hw.bound == []
    assert not re.search(r"\d{4,}", json.dumps([hw.as_dict(), sc.as_dict()]))   # no transaction id
    fig = cg.plot_cursors(high, safe)
    left, right = fig.axes[:2]
    lost = [line for line in left.get_lines() if line.get_label() == "committed, never published"]
    assert len(lost) == 1 and set(lost[0].get_ydata()) == {hw.order.index(n) + 1}
    assert not [line for line in right.get_lines() if line.get_label() == "committed, never published"]
    assert [t.get_text() for t in left.get_yticklabels()] == [f"id {i}" for i in hw.order]
    bound = [line for line in right.get_lines() if "oldest open writer" in line.get_label()]
    assert len(bound) == 1 and not right.collections           # a dashed line, nothing shaded
    fig.canvas.draw()
    width, height = fig.canvas.get_width_height()
    assert width <= 1224 and height <= 664
    plt.close(fig)
    with pytest.raises(LabkitError, match="safe cursor's"):
        cg.plot_cursors(safe, high)
    with pytest.raises(LabkitError, match="timeline"):
        cg.plot_cursors({}, safe)
