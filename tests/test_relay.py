"""The outbox relay: producer, brokers, consumer, the three crash traces, lag metrics.

Every test runs on the real server.  The ``broker`` fixture runs each broker test
twice: with the recording broker, and with the broker the environment picks
(RabbitMQ when LABKIT_AMQP_URL is set, as in CI's second leg; otherwise the
recording broker again, which ``test_the_environment_picks_the_broker`` asserts).
"""

import json
import os

import psycopg
import pytest

from labkit import cli
from labkit.core import load
from labkit.core.errors import LabkitError
from labkit.labs import broker as brokers
from labkit.labs import relay

pytestmark = pytest.mark.server      # every test here runs on the server (the commands too)

AMQP = os.environ.get("LABKIT_AMQP_URL", "").strip()


@pytest.fixture(params=["recording", "env"])
def broker(request, lab):
    bk = brokers.for_lab(lab, "recording" if request.param == "recording" else None)
    yield bk
    bk.discard()
    bk.close()


def test_the_environment_picks_the_broker(lab):
    with brokers.for_lab(lab) as bk:
        if AMQP:
            assert isinstance(bk, brokers.RabbitBroker)
            assert bk.describe().startswith("RabbitMQ") and "guest:guest" not in bk.describe()
        else:
            assert isinstance(bk, brokers.RecordingBroker)
        bk.discard()
    if not AMQP:
        with pytest.raises(LabkitError, match="LABKIT_AMQP_URL is not set"):
            brokers.for_lab(lab, "rabbitmq")


def test_producer_writes_order_and_outbox_row_together(lab):
    relay.create_outbox(lab)
    assert relay.place_orders(lab, 3) == ["evt-0001", "evt-0002", "evt-0003"]
    # order 3 exists: a second "order 3" fails on the order, and its outbox row goes too
    with pytest.raises(psycopg.errors.UniqueViolation):
        relay.place_orders(lab, 1, start=3)
    assert lab.execute("SELECT count(*) FROM shop_order") == [(3,)]
    assert lab.execute("SELECT event_id, aggregate, payload->>'type' FROM outbox ORDER BY id") == [
        ("evt-0001", "shop_order:1", "order_placed"), ("evt-0002", "shop_order:2", "order_placed"),
        ("evt-0003", "shop_order:3", "order_placed")]


def test_orders_placed_together_land_in_one_transaction_and_each_alone_in_its_own(lab):
    relay.create_outbox(lab)
    relay.place_orders(lab, 5, together=True)
    relay.place_orders(lab, 3, start=6)
    writers = lab.execute("SELECT xmin::text FROM outbox ORDER BY id")
    assert len({x for (x,) in writers[:5]}) == 1           # the burst: one commit for all five
    assert len({x for (x,) in writers[5:]}) == 3 and writers[5] != writers[4]
    # together means all or nothing: order 0 is new, order 1 clashes and takes order 0 with it
    with pytest.raises(psycopg.errors.UniqueViolation):
        relay.place_orders(lab, 2, start=0, together=True)
    assert lab.execute("SELECT count(*), min(id) FROM shop_order") == [(8, 1)]
    assert lab.execute("SELECT count(*) FROM outbox") == [(8,)]


def test_a_broker_told_not_to_wait_for_the_disk_commits_without_a_flush_and_says_so(lab):
    with brokers.RecordingBroker.for_lab(lab).reset() as durable:
        assert durable.conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
        quick = brokers.from_spec(durable.spec() | {"wait_for_disk": False})
        try:
            assert quick.conn.execute("SHOW synchronous_commit").fetchone() == ("off",)
            assert quick.spec()["wait_for_disk"] is False
            # what it published is there for every other session at once, like any commit
            quick.publish("evt-9", {"n": 9})
            assert durable.depth() == 1
        finally:
            quick.close()
        # a spec from before the setting existed rebuilds the broker that waits
        old = {k: v for k, v in durable.spec().items() if k != "wait_for_disk"}
        again = brokers.from_spec(old)
        try:
            assert again.conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
        finally:
            again.close()


def test_a_publish_is_not_undone_by_the_relays_rollback(lab, broker):
    relay.create_outbox(lab)
    relay.place_orders(lab, 2)
    with lab.connect(role="relay-1") as conn:
        with pytest.raises(ZeroDivisionError):
            with conn.transaction():
                conn.execute(relay.CLAIM, {"batch": 10})
                broker.publish("evt-0001", {"order_id": 1})
                conn.execute(relay.MARK, {"ids": [1, 2]})
                1 / 0
    assert lab.execute("SELECT count(*) FROM outbox WHERE published_at IS NOT NULL") == [(0,)]
    assert broker.depth() == 1
    assert [e for e, _ in broker.take_all()] == ["evt-0001"]
    assert broker.depth() == 0


def test_a_broker_that_is_down_refuses_and_comes_back(lab, broker):
    broker.publish("evt-0001", {"order_id": 1})
    broker.set_up(False)
    with pytest.raises(brokers.BrokerDown):
        broker.publish("evt-0002", {"order_id": 2})
    assert broker.depth() == 1          # what it held, it keeps
    broker.set_up(True)
    broker.publish("evt-0003", {"order_id": 3})
    assert [e for e, _ in broker.take_all()] == ["evt-0001", "evt-0003"]


def test_the_consumer_applies_each_event_once(lab, broker):
    relay.create_outbox(lab)
    relay.place_orders(lab, 2)
    for ev, oid in [("evt-0001", 1), ("evt-0002", 2), ("evt-0001", 1), ("evt-0001", 1)]:
        broker.publish(ev, {"order_id": oid})
    assert relay.consume(lab, broker) == ["evt-0001", "evt-0002", "evt-0001", "evt-0001"]
    assert lab.execute("SELECT id, labels_printed FROM shop_order ORDER BY id") == [(1, 1), (2, 1)]
    assert lab.execute("SELECT event_id FROM inbox ORDER BY 1") == [("evt-0001",), ("evt-0002",)]


def test_a_tick_claims_publishes_marks_and_an_empty_tick_is_idle(lab, broker):
    relay.create_outbox(lab)
    relay.place_orders(lab, 5)
    seen = []
    with lab.connect(role="relay-1") as conn:
        r = relay.Relay(conn, broker, batch=3, hook=lambda kind, **d: seen.append(kind))
        assert r.tick() == 3
        assert r.run() == 2
    assert seen == ["claimed"] + ["published"] * 3 + ["committed", "claimed"] + ["published"] * 2 + [
        "committed", "idle"]
    assert lab.execute("SELECT count(*) FROM outbox WHERE published_at IS NULL") == [(0,)]
    assert broker.depth() == 5


def test_relay_crash_mid_batch_duplicates_but_loses_nothing(lab, broker):
    tr = relay.crash_trace(lab, broker, batch=30, crash_after=12)
    s = tr.summary
    assert s["reclaimed_same_rows"] is True
    assert s["marked_published_after_crash"] == 0 and s["locks_held_after_crash"] == 0
    assert (s["broker_messages"], s["distinct_events"], s["duplicates"]) == (42, 30, 12)
    assert s["lost_events"] == [] and s["consumer_applied"] == 30 and s["orders_applied_twice"] == 0
    crash = [st for st in tr.steps if st.kind == "crash"]
    assert len(crash) == 1 and crash[0].state["locked_rows"] == 0 and crash[0].state["broker"] == 12
    before = tr.steps[2].state  # after 12 publishes, before the kill: the claim is held
    assert before["locked_rows"] == 30 and "outbox RowShareLock" in before["relay_locks"]


def test_a_crash_right_after_the_claim_publishes_nothing_twice(lab):
    with brokers.for_lab(lab, "recording") as bk:
        s = relay.crash_trace(lab, bk, batch=10, crash_after=0).summary
    assert (s["broker_messages"], s["duplicates"], s["consumer_applied"]) == (10, 0, 10)


def test_dual_write_loses_the_unpublished_events_for_good(lab, broker):
    tr = relay.dual_write_trace(lab, broker, batch=20, crash_after=5)
    s = tr.summary
    assert s["marked_published_after_crash"] == 20 and s["locks_held_after_crash"] == 0
    assert (s["broker_messages"], s["distinct_events"], s["duplicates"]) == (5, 5, 0)
    assert s["lost_events"] == [f"evt-{i:04d}" for i in range(6, 21)]
    assert s["consumer_applied"] == 5
    assert "no rows" in tr.steps[-2].action


def test_broker_down_rolls_back_backs_off_and_catches_up(lab, broker):
    tr = relay.broker_down_trace(lab, broker, batch=20, down_after=8)
    s = tr.summary
    assert (s["broker_messages"], s["distinct_events"], s["duplicates"]) == (28, 20, 8)
    assert s["lost_events"] == [] and s["consumer_applied"] == 20
    errors = [st for st in tr.steps if st.kind == "error"]
    assert [e.action.split("back off ")[1] for e in errors] == ["1 s", "2 s"]
    assert all(e.state["marked"] == 0 and e.state["locked_rows"] == 0 for e in errors)


def test_two_relays_at_once_publish_disjoint_batches(lab, broker):
    out = relay.two_relays(lab, broker, orders=40, batch=20)
    a, b = out.claims
    assert len(a) == len(b) == 20 and not set(a) & set(b) and sorted(a + b) == list(range(1, 41))
    assert out.locked_while_both_held == 40
    assert (out.broker_messages, out.distinct_events, out.duplicates) == (40, 40, 0)
    assert out.consumer_applied == 40


def test_lag_metrics_come_from_the_partial_index(lab):
    relay.create_outbox(lab)
    relay.place_orders(lab, 2000)
    lab.execute("UPDATE outbox SET published_at = now() WHERE id <= 1990")
    lab.execute("VACUUM ANALYZE outbox")
    depth, age = relay.metrics(lab)
    assert depth == 10 and age > 0
    plan = "\n".join(r[0] for r in lab.execute("EXPLAIN (COSTS OFF) " + relay.METRICS))
    assert "outbox_unpublished_idx" in plan


def test_marking_rows_published_leaves_index_entries_until_vacuum(lab):
    relay.create_outbox(lab)
    relay.place_orders(lab, 200)
    lab.execute("UPDATE outbox SET published_at = now() WHERE id <= 190")
    lab.execute("VACUUM ANALYZE outbox")
    out = relay.dead_index_entries(lab, arriving=2000)
    first, second, after = out.first_scan, out.second_scan, out.after_vacuum
    # the first scan after the batch follows every stale entry to the heap
    assert first.heap_fetches >= 2000
    # it marks them dead, but they stay on the index pages until VACUUM removes them
    assert second.heap_fetches < first.heap_fetches and second.buffers < first.buffers
    assert after.buffers < second.buffers and after.heap_fetches == 0
    assert relay.metrics(lab)[0] == 10


def test_lag_grows_while_the_relay_is_paused(lab):
    """A timed shape: measured up to three times (load.shape), and on a loaded machine said,
    not failed, unless LABKIT_STRICT_SHAPES is set."""
    def measure():
        df = relay.measure_lag(lab, rate_per_s=40, run_s=1.6, pause=(0.5, 1.1))
        paused = df[df.relay == "paused"]
        before = df[(df.relay == "running") & (df.t_s < 0.5)]
        assert len(paused) >= 3 and len(before) >= 3
        # 40 orders/s for 0.6 s: the frozen relay leaves them all in the outbox (at least half
        # of them, allowing for a busy machine), more than it ever let pile up while running
        holds = (paused.depth.max() >= 12 and paused.depth.max() > before.depth.max()
                 and paused.oldest_age_s.max() > before.oldest_age_s.max())
        return holds, (f"running: depth {before.depth.max()}, age {before.oldest_age_s.max():.2f} s; "
                       f"paused: depth {paused.depth.max()}, age {paused.oldest_age_s.max():.2f} s")

    holds, measured = measure()
    load.shape(holds, "a paused relay's outbox grows deeper and older than a running one's",
               measured=measured, again=measure)


def test_a_burst_raises_the_depth_not_the_age_a_freeze_raises_both(lab):
    def measure():
        df = relay.measure_lag(lab, rate_per_s=40, run_s=2.4, pause=(1.4, 2.0), burst=(0.3, 150))
        assert df.attrs["burst"] == (0.3, 150) and df.attrs["pause"] == (1.4, 2.0)
        burst = df[(df.t_s >= 0.3) & (df.t_s < 1.0)]
        frozen = df[df.relay == "paused"]
        # the burst lands at once, in one transaction, while the relay runs: the depth jumps past
        # anything the freeze piles up (40/s for 0.6 s, about 24 rows), yet the oldest row is
        # never older than the two ticks that drain it (100 rows a tick), the freeze's is. The
        # sample right after the burst sees 150 less what one tick took if it got in between.
        holds = (burst.depth.max() > frozen.depth.max()
                 and burst.oldest_age_s.max() < frozen.oldest_age_s.max())
        return holds, (f"burst: depth {burst.depth.max()}, age {burst.oldest_age_s.max():.2f} s; "
                       f"frozen: depth {frozen.depth.max()}, age {frozen.oldest_age_s.max():.2f} s")

    holds, measured = measure()
    load.shape(holds, "a burst raises the depth, not the age; a freeze raises both", measured=measured,
               again=measure)


def test_a_frozen_relay_keeps_its_locks_until_the_server_ends_its_session(lab, broker):
    out = relay.freeze_summary(lab, broker, batch=20, freeze_after=8, idle_timeout_s=2.0)
    assert out.backend_state_while_frozen == "idle in transaction"
    assert out.locks_held_while_frozen == 20 and out.claimed_by_others_while_frozen == 0
    assert out.released_by == "idle_in_transaction_session_timeout"
    # the server cannot end it before the timeout; on a busy machine it may be late
    assert 2.0 <= out.released_after_s < 2.0 + 10
    # by the server's clock: from going idle in its transaction to a waiter getting a row lock
    assert 2.0 <= out.released_after_server_s <= out.released_after_s
    # woken past its publish timeout (1 s, half the idle timeout), it publishes nothing more
    # and writes nothing: the only duplicates are the 8 relay 2 sent again
    assert out.stale_publishes_after_wake == 0 and out.stale_writes_after_wake == 0
    assert out.duplicates_after_wake == out.duplicates == 8
    assert out.lost_events == [] and out.consumer_applied == 20
    woke = [st for st in out.trace.steps if st.kind == "error"]
    assert len(woke) == 1 and "25P03" in woke[0].action


def test_the_freeze_trace_reproduces_exactly(lab):
    with brokers.for_lab(lab, "recording") as bk:
        a = relay.freeze_summary(lab, bk, batch=10, freeze_after=3)
        b = relay.freeze_summary(lab, bk, batch=10, freeze_after=3)
    assert a.trace.to_text() == b.trace.to_text()
    assert "released_after_s" not in a.trace.to_text()      # the one measured figure stays out
    # a freeze is not a crash: the frozen step says so
    frozen = [st for st in a.trace.steps if st.kind == "freeze"]
    assert len(frozen) == 1 and "SIGSTOP" in frozen[0].action
    assert "⏸ FROZEN" in a.trace.to_text()


def test_a_woken_relay_without_a_publish_timeout_publishes_the_rest_again(lab):
    with brokers.for_lab(lab, "recording") as bk:
        out = relay.freeze_summary(lab, bk, batch=20, freeze_after=8, idle_timeout_s=2.0,
                                 publish_timeout_s=None)
    assert out.released_by == "idle_in_transaction_session_timeout"
    assert out.stale_publishes_after_wake == 12 and out.stale_writes_after_wake == 0
    assert out.duplicates_after_wake == 20 and out.consumer_applied == 20


def test_without_an_idle_timeout_nothing_on_the_server_ends_a_frozen_session(lab):
    with brokers.for_lab(lab, "recording") as bk:
        out = relay.freeze_summary(lab, bk, batch=10, freeze_after=4, idle_timeout_s=None, watch_s=3)
    assert out.released_by.startswith("SIGKILL by the lab after 3 s")
    assert out.released_after_s is None and out.held_for_at_least_s >= 3
    assert out.locks_held_while_frozen == 10 and out.duplicates == 4


def test_the_server_reports_its_bounds_on_a_frozen_session(lab):
    b = relay.server_bounds(lab)
    assert b.connection in ("unix socket", "tcp")
    assert b.settings["idle_in_transaction_session_timeout"].default == "0"
    for name in ("tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count"):
        assert name in b.settings
    if b.connection == "unix socket":       # keepalives do not apply: they read as 0
        assert b.settings["tcp_keepalives_idle"].value == "0"
    keepalive = relay.os_keepalive()
    if keepalive is not None:                 # Linux: what tcp_keepalives_* = 0 means here
        assert keepalive.dead_after_s == keepalive.time + keepalive.intvl * keepalive.probes


def test_committing_mid_batch_duplicates_with_no_crash(lab, broker):
    tr = relay.commit_every_trace(lab, broker, batch=20, commit_every=5)
    s = tr.summary
    assert s["crashes"] == 0 and s["claimed_by_both"] == 15
    assert (s["broker_messages"], s["distinct_events"], s["duplicates"]) == (35, 20, 15)
    assert s["lost_events"] == [] and s["consumer_applied"] == 20
    assert tr.steps[2].state["locked_rows"] == 0 and tr.steps[2].state["marked"] == 5


def test_free_running_relays_duplicate_only_when_they_commit_mid_batch(lab):
    with brokers.for_lab(lab, "recording") as bk:
        right = relay.free_relays(lab, bk, orders=600, batch=100)
        every = relay.free_relays(lab, bk, orders=600, batch=100, commit_every=10)
    assert right.duplicates == 0 and sum(right.published_by) == 600
    # unscripted: how many depends on timing, but a relay that commits mid-batch unlocks rows
    # it still means to publish, and the other relay claims them
    assert every.duplicates > 0 and sum(every.published_by) == 600 + every.duplicates
    assert right.lost_events == every.lost_events == []
    assert right.consumer_applied == every.consumer_applied == 600


def test_a_relay_that_commits_every_n_leaves_the_rest_of_its_batch_unlocked(lab):
    relay.create_outbox(lab)
    relay.place_orders(lab, 6)
    with brokers.for_lab(lab, "recording") as bk, lab.connect(role="relay-1") as conn, \
            lab.connect(role="relay-2", autocommit=False) as other:
        seen = []

        def hook(kind, **data):
            if kind == "committed" and not seen:
                seen.append(len(other.execute(relay.CLAIM, {"batch": 10}).fetchall()))
                other.rollback()

        assert relay.Relay(conn, bk, batch=6, commit_every=2, hook=hook).tick() == 6
    assert seen == [4]


@pytest.mark.parametrize("call, match", [
    (lambda lab: relay.freeze_summary(lab, batch=10, freeze_after=10), "freeze_after=10"),
    (lambda lab: relay.freeze_summary(lab, batch=10, freeze_after=3, idle_timeout_s=2,
                                    publish_timeout_s=2), "not shorter than"),
    (lambda lab: relay.freeze_summary(lab, batch=10, freeze_after=3, idle_timeout_s=2, watch_s=2),
     "watch_s=2"),
    (lambda lab: relay.freeze_summary(lab, batch=10, freeze_after=3, idle_timeout_s=0), "idle_timeout_s=0"),
    (lambda lab: relay.commit_every_trace(lab, batch=10, commit_every=10), "commit_every=10"),
])
def test_bad_freeze_and_commit_parameters_name_the_fix(lab, call, match):
    with pytest.raises(LabkitError, match=match) as info:
        call(lab)
    assert info.value.fix


def test_command_line_replays_a_frozen_relay_as_json(capsys):
    assert cli.main(["trace", "relay", "--batch", "10", "--freeze-after", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("locks_held_while_frozen", "claimed_by_others_while_frozen", "released_after_s",
                "released_by", "duplicates_after_wake", "stale_writes_after_wake"):
        assert key in out
    assert (out["locks_held_while_frozen"], out["claimed_by_others_while_frozen"]) == (10, 0)
    assert out["released_by"] == "idle_in_transaction_session_timeout"
    assert out["duplicates_after_wake"] == 4 and out["stale_writes_after_wake"] == 0
    assert any("SIGSTOP" in st["text"] for st in out["steps"])
    assert cli.main(["trace", "dual-write", "--freeze-after", "4"]) == 2
    assert "--freeze-after applies to the relay trace" in capsys.readouterr().err


@pytest.mark.parametrize("call, match", [
    (lambda lab: relay.crash_trace(lab, batch=0), "batch=0"),
    (lambda lab: relay.crash_trace(lab, batch=10, crash_after=10), "crash_after=10"),
    (lambda lab: relay.dual_write_trace(lab, batch=10, crash_after=-1), "crash_after=-1"),
    (lambda lab: relay.broker_down_trace(lab, batch=10, down_after=5, backoff_s=0), "backoff_s=0"),
    (lambda lab: relay.measure_lag(lab, run_s=1, pause=(0.5, 2)), "pause="),
    (lambda lab: relay.place_orders(lab, -1), "n=0 or more"),
])
def test_bad_parameters_name_the_fix(lab, call, match):
    with pytest.raises(LabkitError, match=match) as info:
        call(lab)
    assert info.value.fix


def test_relay_refuses_a_zero_batch(lab):
    with brokers.for_lab(lab, "recording") as bk, lab.connect() as conn:
        with pytest.raises(LabkitError, match="batch=1 or more"):
            relay.Relay(conn, bk, batch=0)


def test_command_line_prints_the_summary_as_json(capsys):
    assert cli.main(["trace", "dual-write", "--batch", "10", "--crash-after", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    s = out["summary"]
    for key in ("outbox_rows", "marked_published_after_crash", "broker_messages", "distinct_events",
                "duplicates", "lost_events", "consumer_applied", "locks_held_after_crash"):
        assert key in s
    assert s["lost_events"] == [f"evt-{i:04d}" for i in range(4, 11)]
    assert out["broker"] == ("rabbitmq" if AMQP else "recording")
    assert cli.main(["trace", "relay", "--batch", "5", "--crash-after", "9"]) == 2
    assert "crash_after=9" in capsys.readouterr().err
