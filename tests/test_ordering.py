"""Ordering with more than one relay, on the real server: per-aggregate inversions with
two relays claiming FOR UPDATE SKIP LOCKED, none with one relay or with one claimer per
aggregate, and the consumer that checks versions.

The relay tests run with the recording broker and with the broker the environment picks
(RabbitMQ when LABKIT_AMQP_URL is set)."""

import json
import time
from collections import Counter

import pytest
from conftest import backends_gone, child_pids, interrupt_when, returns_a_row

from labkit.core.errors import LabkitError
from labkit.core.queries import queries
from labkit.labs import broker as brokers
from labkit.labs import ordering as od


def _relays_gone(db, lab) -> None:
    assert backends_gone(db, f"labkit:{lab.schema}:relay%") == []
    assert backends_gone(db, f"labkit:{lab.schema}:broker:relay%") == []


@pytest.fixture(params=["recording", "env"])
def broker(request, lab):
    bk = brokers.for_lab(lab, "recording" if request.param == "recording" else None)
    yield bk
    bk.discard()
    bk.close()


def _versions_in_order(delivered) -> bool:
    last: dict[str, int] = {}
    for agg, version, _ in delivered:
        if version < last.get(agg, 0):
            return False
        last[agg] = version
    return True


# -- the producer and the counting ---------------------------------------------------------------


def test_the_producer_numbers_each_aggregates_events_1_2_3(lab):
    od.create_ordered_outbox(lab)
    written = od.produce(lab, 40, 4, seed=3)
    assert len(written) == 40 and {a for a, _ in written} <= {f"order-{k}" for k in range(1, 5)}
    rows = lab.execute("SELECT aggregate, version, event_id, payload->>'version' FROM outbox ORDER BY id")
    assert [(a, v) for a, v, _, _ in rows] == written
    for agg, n in Counter(a for a, _ in written).items():
        assert [v for a, v in written if a == agg] == list(range(1, n + 1))
    assert all(e == f"evt-{a}-v{v}" and int(p) == v for a, v, e, p in rows)
    assert lab.execute("SELECT sum(version) FROM aggregate_state")[0][0] == 40
    assert od.produce(lab, 0, 4) == []


def test_inversions_are_pairs_of_one_aggregate_with_the_later_version_first():
    order = [("a", 2, "a2"), ("b", 1, "b1"), ("a", 1, "a1"), ("a", 3, "a3"), ("a", 1, "a1"),
             ("b", 2, "b2")]
    r = od.count_inversions(order)
    # (a2, a1), (a2, a1 again), (a3, a1 again); b is in order; a duplicate is no inversion
    assert r.per_aggregate_inversions == 3
    assert r.late_messages == 2 and r.aggregates_out_of_order == 1
    assert r.inversions[0].as_dict() == {"aggregate": "a", "published_first": 2, "then": 1, "position": 2}
    assert od.count_inversions([("a", 1, ""), ("a", 1, ""), ("a", 2, "")]).per_aggregate_inversions == 0


def test_the_partition_in_python_is_the_partition_in_sql(lab):
    names = [od.aggregate_name(k, 30) for k in range(1, 31)]
    for relays in (2, 3, 5):
        got = lab.execute("SELECT a, mod(get_byte(decode(md5(a), 'hex'), 0), %s) FROM unnest(%s::text[]) a",
                          (relays, names))
        assert dict(got) == {a: od.partition_of(a, relays) for a in names}


# -- the relays -----------------------------------------------------------------------------------


def test_one_relay_publishes_every_aggregate_in_version_order(lab, db):
    r = od.ordering_trace(lab, relays=1, aggregates=10, events=120, batch=5)
    assert (r.published, r.distinct_events, r.unpublished_left) == (120, 120, 0)
    assert r.per_aggregate_inversions == 0 and r.late_messages == 0 and r.inversions == []
    assert r.published_by == [120] and r.ticks_by == [24]
    assert r.max_claimed_at_once == 1
    _relays_gone(db, lab)


def test_two_skip_locked_relays_publish_later_versions_first(lab, db, broker):
    r = od.ordering_trace(lab, broker, relays=2, aggregates=10, events=200, batch=5, seed=0)
    assert r.broker == broker.kind
    assert (r.published, r.distinct_events, r.unpublished_left) == (200, 200, 0)
    assert r.per_aggregate_inversions > 0 and r.late_messages > 0
    assert not _versions_in_order(r.delivered)
    for s in r.inversions:                        # each sample is a real inversion
        agg, first, then, pos = s.aggregate, s.published_first, s.then, s.position
        assert first > then and r.delivered[pos][:2] == [agg, then]
        assert [agg, first] in [d[:2] for d in r.delivered[:pos]]
    assert r.max_claimed_at_once == 2             # both relays held events of one aggregate
    assert sum(r.published_by) == 200 and min(r.published_by) > 0
    assert r.steps[0].startswith("relay-1: claims 5") and r.steps[1].startswith("relay-2: claims 5")
    _relays_gone(db, lab)


def test_the_scripted_schedule_reproduces_exactly(lab):
    runs = [od.ordering_trace(lab, relays=2, aggregates=6, events=60, batch=4, seed=7) for _ in range(2)]
    assert runs[0].delivered == runs[1].delivered
    assert runs[0].per_aggregate_inversions == runs[1].per_aggregate_inversions > 0
    assert runs[0].steps == runs[1].steps


@pytest.mark.parametrize("relays, batch", [(2, 5), (3, 3)])
def test_the_per_aggregate_claim_gives_no_inversion(lab, db, relays, batch):
    # relays x batch <= aggregates: each relay finds heads of its own to claim
    r = od.ordering_trace(lab, relays=relays, aggregates=10, events=200, batch=batch, per_aggregate=True)
    assert r.claim == "per-key"
    assert (r.published, r.distinct_events, r.unpublished_left) == (200, 200, 0)
    assert r.per_aggregate_inversions == 0 and _versions_in_order(r.delivered)
    assert r.max_claimed_at_once == 1
    assert min(r.published_by) > 0                # every relay still takes part
    _relays_gone(db, lab)


def test_partitioned_relays_give_no_inversion_and_split_by_hash(lab, db, broker):
    r = od.ordering_trace(lab, broker, relays=2, aggregates=10, events=150, batch=5,
                          per_aggregate=True, remedy="partition")
    assert r.claim == "partition"
    assert (r.published, r.unpublished_left) == (150, 0)
    assert r.per_aggregate_inversions == 0 and r.max_claimed_at_once == 1
    share = Counter(od.partition_of(a, 2) for a, _, _ in r.delivered)
    assert r.published_by == [share[0], share[1]]
    _relays_gone(db, lab)


def test_free_relays_one_claimer_per_aggregate_holds_without_a_script(lab, db):
    r = od.ordering_trace(lab, relays=2, aggregates=10, events=150, batch=5, per_aggregate=True,
                          schedule="free", hold_ms=3, seed=1)
    assert r.steps == [] and r.hold_ms == 3
    assert (r.published, r.unpublished_left) == (150, 0)
    assert r.per_aggregate_inversions == 0 and r.max_claimed_at_once == 1
    _relays_gone(db, lab)


def test_free_skip_locked_relays_overlap_on_one_aggregate(lab, db):
    r = od.ordering_trace(lab, relays=2, aggregates=10, events=150, batch=5, schedule="free",
                          hold_ms=20, seed=1)
    assert (r.published, r.distinct_events, r.unpublished_left) == (150, 150, 0)
    # with a 0-20 ms publish delay the two relays' claims overlap: both held one aggregate
    assert r.max_claimed_at_once == 2
    assert r.per_aggregate_inversions == od.count_inversions(r.delivered).per_aggregate_inversions
    _relays_gone(db, lab)


# -- the consumer ------------------------------------------------------------------------------------


def test_three_consumers_over_an_inverted_stream(lab):
    r = od.ordering_trace(lab, relays=2, aggregates=10, events=200, batch=5, seed=0)
    c = od.consumer_check(lab, r.delivered)
    assert c.messages == 200 and c.per_aggregate_inversions == r.per_aggregate_inversions > 0
    naive, stale, ordered = c.apply_all, c.drop_stale, c.in_order
    assert naive.applied == 200 and naive.applied_late == r.late_messages > 0
    assert naive.never_applied == 0
    assert stale.applied_late == 0 and stale.dropped == r.late_messages
    assert stale.never_applied == r.late_messages and stale.aggregates_behind == 0
    assert ordered.applied == 200 and ordered.applied_late == 0 and ordered.never_applied == 0
    assert ordered.applied_twice == 0 and ordered.dropped == 0
    assert ordered.parked > 0 and ordered.parked_max > 0 and ordered.still_parked == 0
    assert ordered.aggregates_behind == 0
    assert all(getattr(c, k).guarantee for k in od.CONSUMERS)


def test_the_in_order_consumer_drops_duplicates_and_waits_for_a_missing_version(lab):
    od.create_ordered_outbox(lab)
    od.produce(lab, 6, 2, seed=0)
    rows = lab.execute("SELECT aggregate, version, event_id FROM outbox ORDER BY id")
    by = {(a, v): [a, v, e] for a, v, e in rows}
    a = rows[0][0]
    top = max(v for x, v, _ in rows if x == a)
    assert top >= 3, "the seed gives aggregate a at least three events"
    # a's v1 twice, then a's v3 (v2 never comes), then the rest of a
    msgs = [by[(a, 1)], by[(a, 1)], by[(a, 3)]] + [by[(a, v)] for v in range(4, top + 1)]
    c = od.consumer_check(lab, msgs)
    ordered = c.in_order
    assert ordered.applied == 1 and ordered.dropped == 1
    assert ordered.still_parked == top - 2 == ordered.parked_max
    assert ordered.aggregates_behind == 2            # a stuck at v1; the other got nothing
    naive = c.apply_all
    assert naive.applied == len(msgs) and naive.applied_twice == 1
    # the missing v2 arrives: everything parked behind it is applied in order
    c = od.consumer_check(lab, msgs + [by[(a, 2)]])
    assert c.in_order.applied == top and c.in_order.still_parked == 0
    assert c.in_order.applied_late == 0


# -- bad input, clean-up, the command --------------------------------------------------------------


@pytest.mark.parametrize("kw, match", [
    ({"relays": 0}, "relays=0 is too small"),
    ({"relays": 99}, "relays=99 is more than"),
    ({"relays": 2.5}, "not a whole number"),
    ({"aggregates": 0}, "aggregates=0"),
    ({"events": 0}, "events=0"),
    ({"events": 10**6}, "events=1,000,000 is more than"),
    ({"batch": 0}, "batch=0"),
    ({"hold_ms": -1}, "hold_ms=-1"),
    ({"hold_ms": float("nan")}, "not a finite number"),
    ({"seed": -1}, "seed=-1"),
    ({"per_aggregate": "yes"}, "not True or False"),
    ({"remedy": "lock"}, "No remedy 'lock'"),
    ({"schedule": "fast"}, "No schedule 'fast'"),
])
def test_bad_parameters_are_refused_before_anything_is_created(db, kw, match):
    def never():
        raise AssertionError("the lab was opened before the parameters were checked")

    with pytest.raises(LabkitError, match=match):
        od.ordering_command(open_lab=never, json=True, **kw)
    with pytest.raises(LabkitError, match=match):
        od.check_params(**kw)


def test_bad_messages_and_a_lab_without_an_outbox_are_refused(lab):
    with pytest.raises(LabkitError, match="has no ordered outbox"):
        od.consumer_check(lab, [])
    od.create_ordered_outbox(lab)
    for bad in ("abc", [["a", 0, "e"]], [["a", 1]], [[1, 1, "e"]], [["a", True, "e"]]):
        with pytest.raises(LabkitError, match="delivered|not a message"):
            od.consumer_check(lab, bad)
    with pytest.raises(LabkitError, match="either delivered"):
        od.consumer_check(lab, [], relays=2)
    with pytest.raises(LabkitError, match="No broker kind"):
        od.ordering_command(open_lab=lambda: None, json=True, broker="kafka")


def test_the_sql_file_describes_every_query():
    qs = queries("ordering.sql")
    assert {"tables", "produce", "claim_per_aggregate", "claim_partition", "unpublished",
            "consumer_tables", "last_applied", "apply", "park", "unpark", "consumer_outcome"} <= set(qs)
    assert all(q.description and "\n" not in q.description for q in qs.values())


def test_command_prints_json_and_drops_its_lab(db, capsys):
    from labkit import Lab

    opened = []

    def open_lab():
        opened.append(Lab.open(db, f"t_ordering_cmd_{id(opened)}"))
        return opened[-1]

    assert od.ordering_command(open_lab=open_lab, relays=2, aggregates=10, events=100,
                               per_aggregate=True, json=True) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["per_aggregate_inversions"] == 0 and out["published"] == 100
    assert "delivered" not in out and out["consumers"]["in_order"]["parked"] == 0
    assert out["consumers"]["apply_all"]["applied_late"] == 0
    schema = opened[0].schema
    with db.connect() as conn:
        assert conn.execute("SELECT to_regnamespace(%s)", (schema,)).fetchone()[0] is None
    assert backends_gone(db, f"labkit:{schema}:%") == []
    assert od.ordering_command(open_lab=open_lab, relays=2, events=60, json=False) == 0
    text = capsys.readouterr().out
    assert "per-aggregate inversions:" in text and "reached the broker before" in text
    assert "consumer in_order:" in text


@pytest.mark.usefixtures("gc_paused")
def test_ctrl_c_mid_run_leaves_no_relay_process_or_session(lab, db):
    before = child_pids()
    sent: list[float] = []

    # Ctrl-C once a relay holds its claim
    watcher = interrupt_when(db.connect, returns_a_row(
        "SELECT 1 FROM pg_stat_activity WHERE application_name LIKE %s AND state = 'idle in transaction'",
        (f"labkit:{lab.schema}:relay%",)), sent)
    with pytest.raises(KeyboardInterrupt):
        od.ordering_trace(lab, relays=2, events=500, batch=5, schedule="free", hold_ms=1000)
    watcher.join(5)
    assert sent and time.monotonic() - sent[0] < 20
    assert child_pids() - before == set()
    _relays_gone(db, lab)
