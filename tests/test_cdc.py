"""Change data capture through a logical replication slot, on real servers.

* A server without logical decoding (wal_level below logical: the shared server when it
  runs so, PostgreSQL 15 on CI, and a scratch embedded cluster started at replica) is
  refused before anything is created: exit 2, a paragraph that names the fix, no slot.
* On a logical server (a scratch embedded cluster, started with labkit's settings) the
  trace delivers in commit order without reading or updating the outbox, the slot's WAL
  grows while the consumer is down and falls once it has read, two consumers on one slot
  split the stream, and the slot is gone afterwards -- also after Ctrl-C, including
  Ctrl-C in the middle of a read that holds the slot.  A reader that asks for streaming
  of in-progress transactions gets a large open transaction's changes before its end, in
  blocks, the last changes still held back.  A transaction open at the consumer's confirm
  holds the slot's restart_lsn back: the slot keeps more than the consumer is behind.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import backends_gone

import labkit
from labkit import Lab
from labkit.core.errors import LabkitError
from labkit.core.server import EmbeddedServer
from labkit.labs import cdc

MB = 1024 * 1024


def _slots(db, prefix: str) -> list[str]:
    with db.connect() as conn:
        return [r[0] for r in conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE starts_with(slot_name, %s)",
            (prefix,)).fetchall()]


def _schema_exists(db, schema: str) -> bool:
    with db.connect() as conn:
        return conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone() is not None


def _decodes(db) -> bool:
    with db.connect() as conn:
        wal, effective = conn.execute("SELECT current_setting('wal_level'), "
                                      "current_setting('effective_wal_level', true)").fetchone()
    return wal == "logical" or (effective is not None and wal == "replica")


def _refused(db, capsys, name: str) -> str:
    """Run the command on ``db``; it must refuse with exit 2 and leave nothing behind."""
    opened: list[Lab] = []

    def open_lab() -> Lab:
        opened.append(Lab.open(db, name))
        return opened[0]

    assert cdc.cdc_command(open_lab=open_lab, json=True) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "wal_level" in err and "Fix:" in err and len(err.strip().splitlines()) == 1
    schema = opened[0].schema
    assert _slots(db, schema) == []
    assert not _schema_exists(db, schema)
    return err


# -- no database -----------------------------------------------------------------------------------


def test_a_test_decoding_line_is_parsed_into_typed_columns():
    line = ("table lab_x.outbox: INSERT: id[bigint]:3 event_id[text]:'evt-0003' "
            "payload[jsonb]:'{\"item\": \"it''s\", \"order_id\": 3}' "
            "created_at[timestamp with time zone]:'2026-01-01 10:00:00+00' "
            "published_at[timestamp with time zone]:null")
    c = cdc.parse_change(line)
    assert c["table"] == "lab_x.outbox" and c["op"] == "INSERT"
    assert c["columns"] == {"id": 3, "event_id": "evt-0003", "payload": {"item": "it's", "order_id": 3},
                            "created_at": "2026-01-01 10:00:00+00", "published_at": None}
    with pytest.raises(LabkitError):
        cdc.parse_change("BEGIN 1234")


def test_the_embedded_server_is_started_with_logical_wal_level(tmp_path):
    assert "-c wal_level=logical" in EmbeddedServer(tmp_path)._options(54329)


def test_bad_numbers_are_refused_before_a_lab_is_opened():
    def open_lab():
        raise AssertionError("the lab was opened")

    for kw in ({"events": 0}, {"events": 10**6}, {"producers": 1}, {"down_mb": float("inf")},
               {"down_mb": -1}, {"down_events": -1}):
        with pytest.raises(LabkitError):
            cdc.cdc_command(open_lab=open_lab, json=True, **kw)


# -- servers without logical decoding ---------------------------------------------------------------


def test_the_shared_server_runs_the_trace_or_refuses_it_by_its_wal_level(db, capsys):
    """Whichever the server under test is: at wal_level = logical the command runs and
    reports the issue's keys, leaving no slot; below it, it refuses before creating
    anything (PostgreSQL 15 on CI's second leg)."""
    if _decodes(db):
        name = f"cdc_on_{os.getpid()}"
        opened: list[Lab] = []

        def open_lab() -> Lab:
            opened.append(Lab.open(db, name))
            return opened[0]

        assert cdc.cdc_command(open_lab=open_lab, json=True, events=3, down_mb=1) == 0
        r = json.loads(capsys.readouterr().out)
        assert r["events"] == 3 and r["delivered"] == 6 and r["in_commit_order"] is True
        assert r["wal_retained_bytes_while_down"] >= MB
        assert _slots(db, opened[0].schema) == [] and not _schema_exists(db, opened[0].schema)
        return
    err = _refused(db, capsys, f"cdc_off_{os.getpid()}")
    if db.backend == "embedded":
        assert "labkit server stop && labkit server start" in err
    else:
        assert "ALTER SYSTEM SET wal_level = logical" in err and "restart" in err
    lab = Lab.open(db, f"cdc_off2_{os.getpid()}")
    try:
        ok, why = cdc.logical_decoding_available(lab)
        assert not ok and "wal_level" in why
        with pytest.raises(LabkitError, match="wal_level"):
            cdc.cdc_trace(lab)
        assert lab.execute("SELECT count(*) FROM pg_tables WHERE schemaname = %s", (lab.schema,)) == [(0,)]
        assert _slots(db, lab.schema) == []
    finally:
        lab.drop()


def test_an_embedded_server_started_at_replica_is_refused_with_the_restart_as_fix(replica_server, capsys):
    db = replica_server
    assert not _decodes(db)
    err = _refused(db, capsys, "cdc_replica")
    assert "'replica'" in err and "labkit server stop && labkit server start" in err


# -- a logical server --------------------------------------------------------------------------------


@pytest.fixture
def logical_server(scratch_server):
    scratch_server.start()
    db = labkit.connect(quiet=True)
    assert _decodes(db)                      # labkit's own start settings give logical
    return db


def test_the_outbox_read_from_the_wal_in_commit_order_and_what_the_slot_costs(logical_server):
    db = logical_server
    lab = Lab.open(db, "cdc_full")
    try:
        ok, why = cdc.logical_decoding_available(lab)
        assert ok, why
        # a slot a killed run left behind is dropped, not an error
        lab.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (cdc.slot_name(lab),))
        t = time.monotonic()
        r = cdc.cdc_trace(lab, events=9, down_bytes=2 * MB, producers=3)
        assert time.monotonic() - t < 12
    finally:
        lab.drop()

    # commit order, not id order; whole transactions, BEGIN/COMMIT xids as committed
    assert r.events == 9 and r.down_events == 9 and r.delivered == 18
    assert r.in_commit_order is True and r.in_id_order is False
    assert r.commit_order[:6] == [3, 2, 1, 6, 5, 4]
    assert r.delivered_ids == r.commit_order and sorted(r.delivered_ids) == list(range(1, 19))
    assert r.stream_xids == r.commit_xids and len(set(r.commit_xids)) == 18
    assert r.stream_xids != sorted(r.stream_xids)       # xids are handed out in id order too
    lines = r.first_round_stream
    assert len(lines) == 9
    assert [ln.split("  ")[2].split()[0] for ln in lines[:3]] == ["BEGIN", "table", "COMMIT"]
    assert "outbox: INSERT: id[bigint]:3 " in lines[1]
    # what an id watermark poller would have missed
    assert r.poller_saw_after_first_commit == [3] and r.id_watermark_skips == [1, 2]
    # no polling, no marking; the relay over the same rows scans and updates
    assert r.consumer_outbox_scans == 0 and r.consumer_rows_updated == 0
    assert r.rows_marked_published == 0
    rl = r.relay
    assert rl.published == 18 + 8 and rl.rows_updated == 18 + 8 and rl.outbox_scans >= 2
    assert rl.publish_order_ids == sorted(rl.publish_order_ids)      # id order
    # its scans: a claim per tick (one batch of 100, then one that finds nothing) and a mark
    # per batch; and one tick more, on the emptied outbox, scans it all the same
    assert (rl.ticks, rl.marks) == (2, 1) and rl.outbox_scans >= rl.ticks + rl.marks
    assert rl.empty_tick_scans >= 1
    # the cost: WAL kept while down, given back after the read and confirm
    assert r.unrelated_wal_bytes >= 2 * MB
    assert r.wal_retained_bytes_while_down >= 2 * MB > r.wal_retained_bytes_before_down
    assert r.consumer_behind_bytes_while_down >= 2 * MB
    # once read and confirmed, the slot lets go of all it kept while down (measured by how far its
    # restart_lsn moved: the retained bytes after the read also count what others write meanwhile)
    assert r.wal_released_bytes_after_read >= r.wal_retained_bytes_while_down
    assert r.wal_status_while_down == "reserved" and r.safe_wal_size_while_down is None
    assert r.guards.max_slot_wal_keep_size == "-1"
    assert r.guards.idle_replication_slot_timeout in ("0", None)
    # one slot, two consumers: each gets the turns it read, nobody gets everything
    s = r.two_consumers_one_slot
    assert len(s.written) == 8 and s.overlap == []
    assert sorted(s.a_got + s.b_got) == sorted(s.written)
    assert s.a_missed == 4 and s.b_missed == 4
    # and the slot is gone
    assert r.slot_left is False and _slots(db, "lab_cdc_full") == []
    _the_series_and_its_picture(r)


def _the_series_and_its_picture(r: cdc.CdcTrace) -> None:
    """What the slot kept after each step: a sawtooth while the consumer reads and confirms,
    every byte while it is down, nothing much once it is back; and the figure draws that."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from test_figures import figure_png, png_size

    from labkit.tools.training import IMG_MAX_PX, SLIDE_WIDTH_PX

    pts = r.retained_series
    chunk = 2 * MB // cdc.DOWN_CHUNKS
    assert [p.phase for p in pts] == (["reading"] * (3 + 2 * cdc.READING_CHUNKS)
                                      + ["down"] * (1 + cdc.DOWN_CHUNKS) + ["back"] * 2)
    written = [p.written_bytes for p in pts]
    assert written == sorted(written) and written[-1] >= 3 * MB
    confirmed = [p for p in pts if p.step == "confirmed"]
    assert len(confirmed) == cdc.READING_CHUNKS and all(p.retained_bytes < chunk // 4 for p in confirmed)
    assert r.reading_wal_bytes >= cdc.READING_CHUNKS * chunk
    down = [p for p in pts if p.phase == "down"]
    for a, b in zip(down, down[1:]):            # while down, the slot keeps every byte written
        assert b.retained_bytes - a.retained_bytes == b.written_bytes - a.written_bytes > 0
    assert down[-1].retained_bytes >= 2 * MB and pts[-1].retained_bytes < chunk // 4
    fig = cdc.plot_retained(r)
    ax = fig.axes[0]
    [line] = [ln for ln in ax.get_lines() if ln.get_label().startswith("WAL the slot keeps")]
    assert list(line.get_ydata()) == [p.retained_bytes / MB for p in pts]
    assert list(line.get_xdata()) == [p.written_bytes / MB for p in pts]
    assert "restart_lsn" in ax.get_title()
    # a band per phase, side by side: "down" ends where "back" begins, at the last point down
    spans = {}
    for b in ax.patches:       # axvspan: a Rectangle (matplotlib 3.9+) or a Polygon before
        xs = ([b.get_x(), b.get_x() + b.get_width()] if hasattr(b, "get_width")
              else [v[0] for v in b.get_xy()])
        spans[b.get_label()] = (min(xs), max(xs))
    assert set(spans) >= set(cdc.PHASES.values()), spans
    last_down = max(p.written_bytes for p in pts if p.phase == "down") / MB
    assert spans[cdc.PHASES["down"]][1] == spans[cdc.PHASES["back"]][0] == last_down
    assert spans[cdc.PHASES["back"]][1] > max(p.written_bytes for p in pts) / MB
    width, height = png_size(figure_png(fig))
    assert width <= SLIDE_WIDTH_PX and height <= IMG_MAX_PX, (width, height)
    plt.close("all")
    with pytest.raises(LabkitError, match="cdc_trace"):
        cdc.plot_retained({"events": 3})


def test_a_failover_slot_says_so_and_is_dropped(logical_server):
    """PostgreSQL 17 and later: a slot created with failover => true reads failover true and
    synced false on the primary, and is gone afterwards; before 17 nothing is created."""
    lab = Lab.open(logical_server, "cdc_failover")
    try:
        f = cdc.failover_slot(lab)
        assert _slots(logical_server, lab.schema) == []
    finally:
        lab.drop()
    assert f.server_version_num == logical_server.version_num
    if logical_server.version_num < cdc.FAILOVER_FROM:
        assert f.ran is False
        return
    assert f.ran is True and f.failover is True and f.synced is False
    assert f.temporary is False and f.in_recovery is False and f.slot_left is False
    assert f.sync_replication_slots == "off" and f.synchronized_standby_slots == ""


def test_a_reader_that_asks_for_streaming_gets_an_open_transaction_that_then_aborts(logical_server):
    lab = Lab.open(logical_server, "cdc_stream")
    try:
        r = cdc.streaming_trace(lab, events=500)
        assert _slots(logical_server, lab.schema) == []
    finally:
        lab.drop()
    # the plain read: nothing of a transaction that has not committed, nor of one that aborted
    assert r.whole_while_open == 0 and r.whole_after_rollback == 0
    # the streaming read: its changes, in blocks, before its end -- and it then aborted
    s = r.streamed_while_open
    assert s.opening >= 1 and s.opening == s.closing and s.other == 0
    assert 0 < s.change <= r.events
    # each block is what the decoder held when the transaction passed logical_decoding_work_mem:
    # the changes after the last block, fewer than one block, are still held
    blocks = r.streamed_blocks
    assert len(blocks) == s.opening and sum(blocks) == s.change and min(blocks) > 0
    assert r.events - sum(blocks) < max(blocks)
    assert all(f"TXN {r.xid}" in line for line in r.streamed_sample)
    assert r.status == "aborted" and r.work_mem == "64kB"
    # what a new subscription asks pgoutput for: streaming by default from PostgreSQL 18
    v = logical_server.version_num
    assert r.subscription_streaming_default == ("p" if v >= 180000 else "f" if v >= 160000 else "false")


def test_a_transaction_open_at_the_confirm_holds_restart_lsn_back(logical_server):
    """The consumer confirms everything while another session's transaction is open: the slot's
    confirmed_flush_lsn moves on, its restart_lsn stays before that transaction's start, so the
    slot keeps more than its consumer is behind; once it has ended and the consumer confirmed
    again, restart_lsn moves on past all of it."""
    lab = Lab.open(logical_server, "cdc_held")
    try:
        r = cdc.held_back_trace(lab, nbytes=MB)
        assert _slots(logical_server, lab.schema) == [] and r.slot_left is False
        with pytest.raises(LabkitError, match="nbytes"):
            cdc.held_back_trace(lab, nbytes=0)
    finally:
        lab.drop()
    o, e = r.open, r.ended
    assert r.written_bytes >= MB
    assert o.behind_bytes < MB <= r.written_bytes <= o.retained_bytes
    assert o.restart_lsn != o.confirmed_flush_lsn
    assert r.moved_bytes >= r.written_bytes and e.retained_bytes < MB


class _CtrlC(cdc.ListBroker):
    """A broker whose ``at``-th publish is interrupted by Ctrl-C."""

    def __init__(self, at: int):
        super().__init__()
        self.at, self.n = at, 0

    def publish(self, event_id, body):
        self.n += 1
        if self.n == self.at:
            raise KeyboardInterrupt
        super().publish(event_id, body)


def test_ctrl_c_drops_the_slot_also_while_a_read_holds_it(logical_server):
    db = logical_server
    # in-process: Ctrl-C while publishing what the consumer read after being down
    lab = Lab.open(db, "cdc_int")
    try:
        with pytest.raises(KeyboardInterrupt):
            cdc.cdc_trace(lab, _CtrlC(at=5), events=3, down_events=3, down_bytes=MB)
        assert _slots(db, lab.schema) == []
    finally:
        lab.drop()

    # another process: SIGINT while its consumer's read holds the slot (it decodes 32 MB)
    code = ("import sys, labkit; from labkit import Lab; from labkit.labs import cdc; "
            "sys.exit(cdc.cdc_command(open_lab=lambda: Lab.open(labkit.connect(quiet=True), "
            "'cdc_sigint'), json=True, events=3, down_mb=32))")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=os.environ.copy())
    held = None
    try:
        deadline = time.monotonic() + 60
        with db.connect() as conn:
            while held is None and p.poll() is None and time.monotonic() < deadline:
                held = conn.execute(
                    "SELECT slot_name, active_pid FROM pg_replication_slots "
                    "WHERE starts_with(slot_name, 'lab_cdc_sigint') AND active_pid IS NOT NULL "
                    "AND pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn) > 16 * 1024 * 1024").fetchone()
                time.sleep(0.01)
        assert held is not None, p.communicate(timeout=60)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode != 0 and "KeyboardInterrupt" in err
    assert _slots(db, "lab_cdc_sigint") == []
    assert backends_gone(db, "labkit:lab\\_cdc\\_sigint%") == []
    with db.connect() as conn:
        assert conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'lab\\_cdc\\_sigint%'"
                            ).fetchone()[0] == 0
