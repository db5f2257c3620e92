"""Keeping the outbox small, on a real server: what grows with the history and what does
not, batched deletes against dropped partitions on the same history, the cleanup beside
a relay, and what removing a partition locks."""

import json
import math
import time

import pytest
from conftest import backends_gone, backends_of, interrupt_when, returns_a_row

from labkit import Lab
from labkit.core.errors import LabkitError
from labkit.labs import outbox_size as osz


def _own_sessions_gone(db, schema: str, timeout: float = 10.0) -> list[tuple]:
    """Sessions of the lab still alive after ``timeout`` s, but the lab's own admin
    connection (the test's fixture holds it until the test ends)."""
    deadline = time.monotonic() + timeout
    while True:
        left = [b for b in backends_of(db, f"labkit:{schema}:%") if not b[1].endswith(":admin")]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def _never(*_a, **_k):
    raise AssertionError("the lab was opened before the parameters were checked")


@pytest.mark.parametrize("kw, name", [
    ({"history": 0}, "history"), ({"history": 2_000_001}, "history"), ({"history": 1.5}, "history"),
    ({"history": "100"}, "history"), ({"batch": 0}, "batch"), ({"batch": 50_001}, "batch"),
    ({"batch": True}, "batch"), ({"batch": math.nan}, "batch"), ({"history": 100, "batch": 500}, "batch"),
    ({"largest": 3}, "largest"), ({"largest": 2_000_001}, "largest"), ({"largest": -1}, "largest"),
])
def test_bad_parameters_are_refused_before_any_lab_is_opened(kw, name):
    with pytest.raises(LabkitError) as err:
        osz.size_command(open_lab=_never, json=True, **kw)
    assert name in str(err.value) and "Fix:" in str(err.value)


@pytest.mark.parametrize("sizes", [(), "0,100", (100, 0), (0, 0, 10), (0, -1), (0, 1.5),
                                   tuple(range(7)), (0, 2_000_001)])
def test_bad_size_ladders_are_refused(sizes):
    with pytest.raises(LabkitError) as err:
        osz.size_trace(None, sizes=sizes)
    assert "sizes" in str(err.value) and "Fix:" in str(err.value)


def test_other_bad_inputs_are_refused(lab):
    with pytest.raises(LabkitError, match="tick"):
        osz.growth(lab, sizes=(0,), tick=0)
    with pytest.raises(LabkitError, match="history"):
        osz.beside_relay(lab, batch=4, history=8)
    with pytest.raises(LabkitError, match="hours"):
        osz.delete_way(lab, history=1000, batch=10, hours=0)


def test_the_claim_stays_cheap_while_the_table_and_vacuums_index_pass_grow(lab, db):
    rows = osz.growth(lab, sizes=(0, 20_000, 80_000), tick=500)
    assert [r.published_rows for r in rows] == [0, 20_000, 80_000]
    claim = [r.claim_buffers for r in rows]
    assert all(r.claim_rows == 10 for r in rows)
    # the partial index holds only the few unpublished rows: the claim reads as much at
    # 80,000 published rows as with none
    assert max(claim) <= min(claim) + 3 and max(claim) < 40, claim
    table = [r.table_bytes for r in rows]
    assert table[0] < table[1] < table[2] and table[2] > 2 * table[1]
    partial = [r.partial_index_bytes for r in rows]
    assert max(partial) <= min(partial) + 3 * 8192, partial     # a few pages, whatever the history
    # a VACUUM after one tick reads the tick's pages, not the history's...
    last = rows[-1]
    assert last.vacuum_pages_scanned * 10 < last.vacuum_pages_total
    # ...and skips the index pass (INDEX_CLEANUP AUTO) once its dead items sit on fewer
    # than 2 % of the pages: run on the empty outbox, bypassed on the largest; the dead
    # entries it leaves are removed by the next pass, with the next tick's
    for r in rows:
        below = r.vacuum_dead_item_pages < 0.02 * r.vacuum_pages_total
        assert (r.vacuum_index_scans, r.vacuum_bypassed) == ((0, 1) if below else (1, 0)), r
    assert rows[0].vacuum_index_scans == 1 and rows[-1].vacuum_index_scans == 0
    assert [r.index_pass_dead_items for r in rows] == [500 * (1 + r.vacuum_bypassed) for r in rows]
    # ...but an index pass, where it runs (here forced: INDEX_CLEANUP ON), reads every
    # index page: it grows with the history
    passes = [r.index_pass_buffers for r in rows]
    assert passes[0] < passes[1] < passes[2] and passes[2] > 2 * passes[1], passes
    after = [r.autovacuum_after for r in rows]
    assert after[0] < after[1] < after[2] and after[2] >= 0.2 * 80_000 * 0.9
    assert backends_gone(db, f"labkit:{lab.schema}:relay") == []


def test_dropping_partitions_sheds_the_same_history_for_far_less_than_deleting_it(lab, db):
    out = osz.size_trace(lab, history=30_000, batch=500, sizes=(0, 30_000), hours=3)
    assert out.delete_rows == out.drop_rows == 30_000
    assert out.delete_batches == 60 and out.drop_partitions == 3
    # every deleted row is a dead row version VACUUM must remove; a dropped one is not
    assert out.delete_dead_tuples == 30_000
    assert out.drop_dead_tuples == 0
    assert out.drop_wal_bytes * 10 < out.delete_wal_bytes
    assert out.drop_ms < out.delete_ms
    assert out.delete_vacuum_wal_bytes > 0
    # the deleted rows' pages stay in the file; the dropped partitions' files are gone
    assert out.delete_table_bytes_after == out.delete_table_bytes_before
    assert out.drop_table_bytes_after * 10 < out.drop_table_bytes_before
    assert out.claim_buffers[0] < 40 and out.partitioned_claim_buffers < 40
    # the claim prunes no partition: it locks each one and its index
    assert out.claim_locks_partitioned >= out.claim_locks_plain + 2 * 5
    assert out.unique_event_id_refused.startswith("0A000")
    assert _own_sessions_gone(db, lab.schema) == []


def test_the_ways_keep_every_unpublished_event(lab):
    a = osz.delete_way(lab, history=2_000, batch=300, hours=2)
    assert a.unpublished_left == osz.WAITING and a.delete_batches == 7
    b = osz.drop_way(lab, history=2_000, hours=2)
    assert b.unpublished_left == osz.WAITING and b.drop_partitions == 2


def test_a_partition_with_an_unpublished_event_is_not_dropped(lab):
    from datetime import timedelta
    hour = osz._this_hour(lab)
    names = osz.create_partitioned(lab, first=hour - timedelta(hours=1), hours=1)
    lab.execute("INSERT INTO outbox (event_id, aggregate, payload, created_at) "
                "VALUES ('evt-late', 'shop_order:1', '{}', %s)", (hour - timedelta(minutes=30),))
    with pytest.raises(LabkitError, match="1 unpublished") as err:
        osz.remove_partition(lab, names[0])
    assert "Fix:" in str(err.value)
    assert lab.execute("SELECT count(*) FROM outbox WHERE published_at IS NULL")[0][0] == 1
    assert lab.execute("SELECT count(*) FROM pg_inherits WHERE inhrelid = %s::regclass",
                       (names[0],))[0][0] == 1


def test_the_batched_delete_skips_what_others_hold_and_never_meets_the_relay(lab, db):
    r = osz.beside_relay(lab, batch=4, history=12, waiting=3)
    assert r.relay_claimed == 3
    assert r.cleaner1_deleted == 4
    assert (r.skip_deleted, r.skip_waited) == (4, False)
    assert r.cleaner1_held_after_skip == 4
    assert r.waiting_waited and r.waiting_blocked_by == ["cleaner1"]
    assert r.waiting_deleted == 4                     # after cleaner 1's COMMIT: the next four
    assert r.relay_held_throughout
    assert (r.unpublished_left, r.published_left) == (3, 0)
    rows = r.transcript.rows
    assert any(row.session == "cleaner2" and row.note.startswith("BLOCKS (waits for cleaner1") for row in rows)
    assert "cleaner1" in r.transcript.to_text()
    assert backends_gone(db, f"labkit:{lab.schema}:%relay%") == []
    assert backends_gone(db, f"labkit:{lab.schema}:cleaner%") == []


def test_dropping_an_attached_partition_stalls_the_relays_detach_concurrently_does_not(lab, db):
    r = osz.partition_locks(lab)
    old = r.partition
    assert r.drop_locks == {"outbox": "AccessExclusiveLock", old: "AccessExclusiveLock"}
    assert r.detach_locks["outbox"] == "AccessExclusiveLock"
    assert old in r.claim_locks and "outbox" in r.claim_locks
    d = r.drop
    assert d.remover_waited and d.remover_blocked_by == ["relay1"]
    assert d.relay2_waited and d.relay2_blocked_by == ["remover"]
    assert d.remover_error is None and d.partition_gone
    # the DROP queues for the outbox's strongest lock, behind relay 1's claim
    assert d.remover_asked == [("outbox", "AccessExclusiveLock")]
    assert d.remover_waits_for == [("relation", "AccessExclusiveLock", ["relay1"])]
    assert not d.detach_pending and d.relay2_locked_old == 0    # relay 2 had not planned yet
    c = r.detach
    assert c.remover_waited and c.remover_blocked_by == ["relay1"]
    assert not c.relay2_waited and c.relay2_claimed == 2
    assert c.remover_error is None and c.detached
    # while it waits, the DETACH holds no table lock: it waits for relay 1's transaction to
    # end; the partition is marked, and a claim planned meanwhile leaves it out
    assert c.remover_held == [] and c.remover_asked == []
    assert c.remover_waits_for == [("virtualxid", "ShareLock", ["relay1"])]
    assert c.detach_pending
    assert c.old_relations == 3 and c.relay1_locked_old == 3 and c.relay2_locked_old == 0
    # the partitions' limits, in the server's words
    assert r.no_partition_refused.startswith("23514: no partition of relation")
    assert r.default_refused.startswith("55000: ") and "default partition" in r.default_refused
    assert not lab.execute("SELECT 1 FROM pg_class WHERE relname = 'outbox_default' "
                           "AND relnamespace = %s::regnamespace", (lab.schema,))
    assert _own_sessions_gone(db, lab.schema) == []


def test_the_command_prints_json_and_drops_its_lab(db, capsys):
    made = []

    def open_lab():
        made.append(Lab.open(db, f"outbox_size_cli_{len(made)}"))
        return made[-1]

    assert osz.size_command(open_lab=open_lab, history=4_000, batch=400, largest=8_000, json=True) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == list(osz.SUMMARY_KEYS)          # the summary's keys, in its order
    assert out["sizes"] == [0, 2_000, 8_000] and out["delete_rows"] == out["drop_rows"] == 4_000
    assert osz.size_command(open_lab=open_lab, history=4_000, batch=400, largest=8_000, json=False) == 0
    text = capsys.readouterr().out
    assert "DELETE in batches of 400" in text and "detach + drop 4 partitions" in text
    schemas = [lab.schema for lab in made]
    with db.connect() as conn:
        assert conn.execute("SELECT nspname FROM pg_namespace WHERE nspname = ANY(%s)",
                            (schemas,)).fetchall() == []
    for s in schemas:
        assert backends_gone(db, f"labkit:{s}:%") == []


@pytest.mark.usefixtures("gc_paused")
def test_ctrl_c_mid_command_drops_its_lab_and_leaves_no_session(db):

    from labkit.core.lab import schema_name

    name = f"outbox_size_ctrl_c_{id(db)}"
    schema = schema_name(name)
    sent: list[float] = []

    # Ctrl-C once the partitioned outbox exists
    watcher = interrupt_when(db.connect, returns_a_row(
        "SELECT 1 FROM pg_class WHERE relname = 'outbox' AND relkind = 'p' "
        "AND relnamespace::regnamespace::text = %s", (schema,)), sent, poll_s=0.01)
    with pytest.raises(KeyboardInterrupt):
        osz.size_command(open_lab=lambda: Lab.open(db, name), history=200_000, batch=1_000,
                         largest=4_000, json=True)
    watcher.join(5)
    assert sent
    with db.connect() as conn:
        assert conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchall() == []
    assert backends_gone(db, f"labkit:{schema}:%") == []
