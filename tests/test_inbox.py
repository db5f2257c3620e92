"""The consumer side: in-memory dedup, the inbox, and the inbox in separate transactions,
each consumer a real process SIGKILLed mid-stream and restarted, on the real server."""

import io
import json
import math
import struct
import time

import pytest
from conftest import backends_gone, child_pids, interrupt_when, returns_a_row

from labkit.core import procs
from labkit.core.errors import LabkitError
from labkit.core.lab import Lab, schema_name
from labkit.labs import inbox as ib
from labkit.labs import relay


def _consumer_backends(db, schema: str) -> list[tuple]:
    left = []
    for short, _, _ in ib.CONSUMERS.values():
        left += backends_gone(db, f"labkit:{schema}:{short}-%")
    return left + backends_gone(db, f"labkit:{schema}:observer")


def _nothing_left(db, schema: str, before: set[int]) -> None:
    assert [w.name for w in procs._live if w.alive] == []
    assert child_pids() - before == set()
    assert _consumer_backends(db, schema) == []


def _never():
    raise AssertionError("the lab was opened before the parameters were checked")


def test_the_stream_redelivers_before_and_after_the_restart():
    first, second = ib.stream(events=6, duplicates=2, kill_after=4)
    ev = relay.event_id
    assert [e for e, _ in first] == [ev(1), ev(2), ev(3), ev(1), ev(2), ev(4)]
    assert [e for e, _ in second] == [ev(4), ev(1), ev(2), ev(5), ev(6)]
    assert all(order == int(e[-4:]) for e, order in first + second)


def test_four_consumers_killed_and_restarted(lab, db):
    before = child_pids()
    t0 = time.monotonic()
    t = ib.consumer_trace(lab, events=20, duplicates=5, kill_after=10)
    assert time.monotonic() - t0 < 60        # a guard against a hang, not a speed goal
    ev = relay.event_id
    assert t.killed_on == ev(10)
    assert (t.deliveries_before_restart, t.deliveries_after_restart) == (9 + 5 + 1, 1 + 5 + 10)
    c = t.consumers

    # the set catches the copies while it lives, none after the restart
    assert c["in_memory"].twice == [ev(i) for i in (1, 2, 3, 4, 5, 10)]
    assert (t.effects_twice_in_memory, t.effects_lost_in_memory) == (6, 0)
    assert c["in_memory"].skipped_as_copy == 5
    assert c["in_memory"].at_kill == ib.AtKill(effect_committed=True, recorded=False)

    # the inbox: every event once; the kill fell inside its transaction
    assert set(c["inbox"].effects.values()) == {1} and len(c["inbox"].effects) == 20
    assert (t.effects_twice_inbox, t.effects_lost_inbox) == (0, 0)
    assert c["inbox"].at_kill == ib.AtKill(effect_committed=False, recorded=False)
    assert c["inbox"].skipped_as_copy == 10

    # separate transactions: every copy caught, the message in flight at the kill wrong
    ef, rf = c["separate_tx_effect_first"], c["separate_tx_record_first"]
    assert (ef.twice, ef.lost) == ([ev(10)], [])
    assert (rf.twice, rf.lost) == ([], [ev(10)])
    assert ef.at_kill == ib.AtKill(effect_committed=True, recorded=False)
    assert rf.at_kill == ib.AtKill(effect_committed=False, recorded=True)
    assert (ef.skipped_as_copy, rf.skipped_as_copy) == (10, 11)
    assert (t.effects_twice_separate_tx, t.effects_lost_separate_tx) == (1, 1)
    for r in c.values():
        others = {e: n for e, n in r.effects.items() if e not in r.twice + r.lost}
        assert set(others.values()) == {1}

    h = t.inbox
    assert h.primary_key == "inbox_pkey UNIQUE btree (event_id)"
    assert h.rows == 20 and h.copy_assigned_xid is False
    assert (h.pruned, h.late_copy, h.late_copy_applied_again) == (9, ev(1), True)
    assert (h.kept_copy, h.kept_copy_applied_again) == (ev(20), False)
    _nothing_left(db, lab.schema, before)


def test_kill_on_the_first_event_without_redeliveries(lab, db):
    before = child_pids()
    t = ib.consumer_trace(lab, events=3, duplicates=0, kill_after=1)
    ev = relay.event_id
    assert t.consumers["in_memory"].twice == [ev(1)]
    assert (t.effects_twice_inbox, t.effects_lost_inbox) == (0, 0)
    assert (t.effects_twice_separate_tx, t.effects_lost_separate_tx) == (1, 1)
    h = t.inbox
    assert (h.pruned, h.late_copy, h.late_copy_applied_again) == (0, None, None)
    _nothing_left(db, lab.schema, before)


def test_handle_refuses_what_it_cannot_do(lab):
    relay.create_outbox(lab)
    relay.place_orders(lab, 1)
    with lab.connect(role="t") as conn:
        with pytest.raises(LabkitError, match="No consumer"):
            ib.handle(conn, "outbox", relay.event_id(1), 1)
        with pytest.raises(LabkitError, match="set"):
            ib.handle(conn, "in_memory", relay.event_id(1), 1)
        assert ib.handle(conn, "inbox", relay.event_id(1), 1) is True
        assert ib.handle(conn, "inbox", relay.event_id(1), 1) is False
    assert lab.execute("SELECT labels_printed FROM shop_order") == [(1,)]


@pytest.mark.parametrize("kw", [
    {"events": 0}, {"events": ib.MAX_EVENTS + 1}, {"events": 2.5}, {"events": True}, {"events": "20"},
    {"kill_after": 0}, {"kill_after": 21}, {"kill_after": math.nan},
    {"duplicates": -1}, {"duplicates": 10}, {"duplicates": 1.5},
    {"events": 5, "kill_after": 1, "duplicates": 1}])
def test_bad_parameters_are_refused_before_any_lab_opens(kw):
    with pytest.raises(LabkitError, match="Fix:"):
        ib.consumer_command(open_lab=_never, json=True, **kw)
    with pytest.raises(LabkitError):
        ib.consumer_trace(None, **kw)


def test_the_command_prints_json_and_text_and_drops_its_lab(db, capsys):
    made: list[Lab] = []

    def open_lab():
        made.append(Lab.open(db, f"t_inbox_cmd_{len(made)}"))
        return made[-1]

    assert ib.consumer_command(open_lab=open_lab, events=8, duplicates=2, kill_after=4, json=True) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["effects_twice_in_memory"], out["effects_twice_inbox"]) == (3, 0)
    assert (out["effects_twice_separate_tx"], out["effects_lost_separate_tx"]) == (1, 1)
    assert out["consumers"]["inbox"]["effects"] == {relay.event_id(i): 1 for i in range(1, 9)}
    assert ib.consumer_command(open_lab=open_lab, json=False) == 0
    text = capsys.readouterr().out
    assert "inbox: record and effect in one transaction" in text and "inbox_pkey" in text
    assert "a late copy of evt-0001 is applied again" in text
    with db.connect() as conn:
        for lab in made:
            assert conn.execute("SELECT to_regnamespace(%s)", (lab.schema,)).fetchone()[0] is None
            assert backends_gone(db, f"labkit:{lab.schema}:%") == []


CONNECTED = "SELECT 1 FROM pg_stat_activity WHERE application_name = %s"


@pytest.mark.usefixtures("gc_paused")
def test_ctrl_c_while_a_consumer_runs_leaves_nothing(lab, db):
    before, sent = child_pids(), []
    # the inbox consumer's process 1 is connected: it handles its deliveries, or is paused
    # inside its transaction at the kill point
    watcher = interrupt_when(db.connect, returns_a_row(CONNECTED, (f"labkit:{lab.schema}:inbox-1",)), sent,
                             timeout=30, poll_s=0.005)
    with pytest.raises(KeyboardInterrupt):
        ib.consumer_trace(lab)
    watcher.join(5)
    assert sent and time.monotonic() - sent[0] < 10
    _nothing_left(db, lab.schema, before)


@pytest.mark.usefixtures("gc_paused")
def test_ctrl_c_mid_command_drops_its_lab(db):
    before, sent = child_pids(), []
    name = f"t_inbox_ctrl_c_{id(sent)}"
    schema = schema_name(name)
    watcher = interrupt_when(db.connect, returns_a_row(CONNECTED, (f"labkit:{schema}:memory-1",)), sent,
                             timeout=30, poll_s=0.005)
    with pytest.raises(KeyboardInterrupt):
        ib.consumer_command(open_lab=lambda: Lab.open(db, name), json=True)
    watcher.join(5)
    assert sent
    _nothing_left(db, schema, before)
    assert backends_gone(db, f"labkit:{schema}:%") == []
    with db.connect() as conn:
        assert conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchall() == []


def test_the_picture_draws_this_runs_effects(lab):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from labkit.tools.training import IMG_MAX_PX, SLIDE_WIDTH_PX

    t = ib.consumer_trace(lab, events=8, duplicates=2, kill_after=4)
    fig = ib.plot_effects(t)
    ax = fig.axes[0]
    ev = relay.event_id
    # the grid is the run's effects, read back from the server: a row per consumer
    drawn = ax.images[0].get_array().tolist()
    assert drawn == [[t.consumers[c].effects[ev(i)] for i in range(1, 9)] for c in ib.CONSUMERS]
    assert drawn[0] == [2, 2, 1, 2, 1, 1, 1, 1] and drawn[3][3] == 0      # the set; record first
    assert [x.get_text() for x in ax.texts][:8] == [str(v) for v in drawn[0]]
    assert [x.get_text() for x in ax.get_yticklabels()] == list(ib.SHORT_NAMES.values())
    tops = [x.get_text() for a in ax.child_axes for x in a.get_xticklabels()]
    assert tops == ["1–2: copies to every consumer", "killed here"]
    tally = [x.get_text() for a in ax.child_axes for x in a.get_yticklabels()]
    assert tally == ["3 twice", "all once", "1 twice", "1 lost"]
    frame = [p for p in ax.patches if not p.get_fill() and p.get_linestyle() == "solid"]
    assert len(frame) == 1 and frame[0].get_x() == 4 - 1.5                # event 4, in flight at the kill
    copies = [p for p in ax.patches if not p.get_fill() and p.get_linestyle() == "--"]
    # events 1 and 2, redelivered to every consumer: the frame spans every row
    assert len(copies) == 1 and (copies[0].get_x(), copies[0].get_width()) == (-0.5, 2)
    assert copies[0].get_height() == len(ib.CONSUMERS)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    plt.close(fig)
    width, height = struct.unpack(">II", buf.getvalue()[16:24])
    assert width <= SLIDE_WIDTH_PX and height <= IMG_MAX_PX, (width, height)


def test_the_picture_refuses_what_is_not_a_trace():
    with pytest.raises(LabkitError, match="consumer_trace"):
        ib.plot_effects({"events": 3})
