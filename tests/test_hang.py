"""A broker that stops answering: the relay's transaction must end anyway (labkit.labs.hang).

Every test runs on the real server.  The ``kind`` fixture runs the hang tests with the
recording broker (a scripted hang) and, when LABKIT_AMQP_URL is set, with RabbitMQ behind
the lab's TCP proxy (a network hang)."""

import json
import os
import socket
import threading
import time

import psycopg
import pytest
from conftest import backends_gone, child_pids, interrupt_when, returns_a_row

from labkit import Lab
from labkit.core.errors import LabkitError
from labkit.core.queries import query
from labkit.labs import broker as brokers
from labkit.labs import hang, relay

AMQP = os.environ.get("LABKIT_AMQP_URL", "").strip()
KINDS = ["recording"] + (["rabbitmq"] if AMQP else [])


@pytest.fixture(params=KINDS)
def kind(request):
    return request.param


def _nothing_left(db, lab, before: set[int], kind: str = "recording") -> None:
    assert child_pids() - before == set()
    assert backends_gone(db, f"labkit:{lab.schema}:hang-%") == []
    held = lab.execute(query("hang.sql", "hang_locks").sql, {"key": lab.advisory_key(hang.HANG_LOCK)})
    assert held == [(0,)]
    assert [t.name for t in threading.enumerate() if t.name == "labkit-hang-proxy"] == []
    if kind == "rabbitmq":                        # the lab's queue is gone from RabbitMQ too
        import pika

        with brokers.RabbitBroker.for_lab(lab, AMQP) as bk:
            with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="NOT_FOUND"):
                bk.depth()


def test_a_hung_broker_holds_only_the_unbounded_relays_transaction(lab, db, kind):
    before = child_pids()
    r = hang.broker_hang_trace(lab, hang_s=2.0, publish_timeout_s=0.5, deadline_s=1.0,
                               broker=kind, orders=10)
    assert r.broker == kind
    assert r.hang.startswith("network" if kind == "rabbitmq" else "scripted")
    # without bounds the transaction lasts the whole hang, its rows locked all along
    assert r.longest_transaction_s_unbounded >= 2.0
    assert r.server_saw_longest_s_unbounded >= 2.0 - 2 * hang.SAMPLE_S
    assert r.server_saw_longest_s_unbounded <= r.longest_transaction_s_unbounded + 0.1
    assert r.locks_held_while_hung_unbounded == 10
    assert r.backend_state_while_hung_unbounded == "idle in transaction"
    assert r.transactions_unbounded[0][0] == "committed" and len(r.transactions_unbounded) == 1
    # with them it gives the tick up after its publish timeout, and holds nothing while hung
    assert 0.5 <= r.longest_transaction_s_bounded <= 1.0 + 0.3
    assert r.server_saw_longest_s_bounded <= 1.0 + 0.3
    assert r.locks_held_while_hung_bounded == 0
    assert r.gave_up_by == "publish timeout"
    assert r.transactions_bounded[0][0] == "rolled back"
    assert r.transactions_bounded[-1][0] == "committed"
    assert r.probes_failed >= 1
    # the timed-out publish had reached the broker: published again, received twice, applied once
    assert r.duplicates_after_recovery_unbounded == 0
    assert r.duplicates_after_recovery_bounded == 1
    assert r.duplicated_events == [relay.event_id(11)]
    assert r.broker_messages == 21
    assert (r.lost, r.unpublished_at_end) == (0, 0)
    assert (r.consumer_applied, r.orders_applied_twice) == (20, 0)
    # the server-side backstop, read back from inside the bounded relay's transaction
    b = r.server_backstop
    assert b.seconds == 2.0
    if db.version_num >= 170000:
        assert b.settings == ["transaction_timeout"] and b.in_force.transaction_timeout == "2s"
    else:
        assert b.in_force.transaction_timeout is None
    assert b.in_force.idle_in_transaction_session_timeout == "2s"
    # SET LOCAL: after the relay's COMMIT the server is back on the session's own bounds
    assert b.after_commit == b.session != b.in_force
    assert b.session.idle_in_transaction_session_timeout != "2s"
    assert [x.t_s for x in r.timeline] == sorted(x.t_s for x in r.timeline)
    json.dumps(r.as_dict())
    _nothing_left(db, lab, before, kind)


def test_the_deadline_bounds_a_publish_that_may_wait_longer(lab):
    r = hang.broker_hang_trace(lab, hang_s=1.5, publish_timeout_s=5.0, deadline_s=0.6,
                               broker="recording", orders=3)
    assert r.gave_up_by == "deadline"
    assert 0.5 <= r.longest_transaction_s_bounded <= 0.6 + 0.3
    assert r.longest_transaction_s_unbounded >= 1.5
    assert (r.duplicates_after_recovery_bounded, r.lost) == (1, 0)


def _backend_gone(conn, pid: int, timeout: float) -> float | None:
    """Seconds until the server has ended backend ``pid`` (polled), or None."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if not conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchall():
            return time.monotonic() - start
        time.sleep(0.02)
    return None


def test_the_backstop_ends_a_transaction_whose_relay_went_silent(lab):
    with lab.connect(role="hang-silent") as silent, lab.connect(role="hang-watch") as watch:
        pid = silent.info.backend_pid
        silent.execute("BEGIN")
        silent.execute(query("hang.sql", "backstop").sql, {"ms": "300ms"})
        silent.execute("SELECT 1")                 # then nothing: idle in transaction
        assert _backend_gone(watch, pid, 10) is not None
        with pytest.raises(psycopg.Error) as info:
            silent.execute("SELECT 1")
        assert info.value.sqlstate in ("25P03", None)   # None: the connection was read closed


def test_only_transaction_timeout_bounds_a_transaction_of_short_busy_statements(lab, db):
    """Statements of 0.1 s back to back: no statement and no idle gap reaches a 0.4 s
    backstop, so only PostgreSQL 17's transaction_timeout (set inside the transaction)
    ends it."""
    with lab.connect(role="hang-busy") as busy, lab.connect(role="hang-watch") as watch:
        pid = busy.info.backend_pid
        busy.execute("BEGIN")
        busy.execute(query("hang.sql", "backstop").sql, {"ms": "400ms"})
        if db.version_num >= 170000:
            busy.execute(query("hang.sql", "backstop_whole").sql, {"ms": "400ms"})
        ended = None
        start = time.monotonic()
        while time.monotonic() - start < 1.5:
            try:
                busy.execute("SELECT pg_sleep(0.1)")
            except psycopg.Error as exc:
                ended = exc.sqlstate or "gone"
                break
        if db.version_num >= 170000:
            assert ended in ("25P04", "gone") and _backend_gone(watch, pid, 5) is not None
            assert time.monotonic() - start < 1.2
        else:
            assert ended is None
            assert busy.execute("SELECT 1").fetchone() == (1,)
            busy.execute("ROLLBACK")


def test_backstop_trace_shows_which_setting_ends_which_transaction(lab, db):
    before = child_pids()
    r = hang.backstop_trace(lab, backstop_s=0.4, busy_s=1.2, step_s=0.1, rows=4)
    silent, busy, busy_whole = r.cases
    assert [c.relay for c in r.cases] == ["silent", "busy", "busy"]
    assert r.server_version_num == db.version_num
    # silent (idle in transaction): idle_in_transaction_session_timeout ends it, and its locks go
    assert silent.ran and silent.ended_by_server
    assert silent.claimed == silent.rows_locked == silent.claimable_after == 4
    assert 0.4 <= silent.transaction_s < 0.4 + 1.0
    assert silent.sqlstate in ("25P03", None)
    # busy with short statements: neither statement_timeout nor the idle timeout ever fires
    assert busy.ran and not busy.ended_by_server and busy.sqlstate is None
    assert busy.transaction_s >= 1.2 and busy.rows_locked == 4 and busy.claimable_after == 0
    # transaction_timeout bounds the sum (PostgreSQL 17 and later)
    assert busy_whole.backstop[-1] == "transaction_timeout"
    if db.version_num >= 170000:
        assert busy_whole.ran and busy_whole.ended_by_server
        assert 0.4 <= busy_whole.transaction_s < 0.4 + 1.0
        assert busy_whole.sqlstate in ("25P04", None) and busy_whole.claimable_after == 4
    else:
        assert busy_whole.ran is False and busy_whole.ended_by_server is None
    json.dumps(r.as_dict())
    assert child_pids() - before == set()
    assert backends_gone(db, f"labkit:{lab.schema}:hang-backstop-%") == []


@pytest.mark.parametrize("kw, match", [
    (dict(backstop_s=0), "backstop_s=0"),
    (dict(busy_s=0.5), "busy_s=0.5"),
    (dict(step_s=0.3), "step_s=0.3"),
    (dict(rows=0), "rows=0"),
])
def test_backstop_trace_names_the_fix_for_bad_parameters(lab, kw, match):
    with pytest.raises(LabkitError, match=match) as info:
        hang.backstop_trace(lab, **kw)
    assert info.value.fix


@pytest.mark.usefixtures("gc_paused")
def test_ctrl_c_mid_hang_leaves_no_process_session_or_lock(lab, db, kind):
    before = child_pids()
    sent: list[float] = []

    # Ctrl-C once the unbounded relay has sat in its transaction for a second
    watcher = interrupt_when(lambda: lab.connect(role="watch"), returns_a_row(
        "SELECT 1 FROM pg_stat_activity WHERE application_name = %s "
        "AND state = 'idle in transaction' AND clock_timestamp() - xact_start > interval '1 s'",
        (f"labkit:{lab.schema}:hang-relay-u",)), sent)
    with pytest.raises(KeyboardInterrupt):
        hang.broker_hang_trace(lab, hang_s=5.0, broker=kind, orders=5)
    watcher.join(5)
    assert sent and time.monotonic() - sent[0] < 10
    _nothing_left(db, lab, before, kind)


def test_the_proxy_lets_requests_through_and_holds_answers():
    server = socket.create_server(("127.0.0.1", 0))
    got: list[bytes] = []

    def echo():
        conn, _ = server.accept()
        with conn:
            while data := conn.recv(100):
                got.append(data)
                conn.sendall(data.upper())
            got.append(b"<eof>")

    t = threading.Thread(target=echo, daemon=True)
    t.start()
    with hang.HangProxy("127.0.0.1", server.getsockname()[1]) as proxy:
        client = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        client.sendall(b"one")
        assert client.recv(100) == b"ONE"
        proxy.hang(True)
        client.sendall(b"two")
        deadline = time.monotonic() + 5
        while got != [b"one", b"two"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert got == [b"one", b"two"]             # the request went through...
        client.settimeout(0.3)
        with pytest.raises(socket.timeout):       # ...its answer did not
            client.recv(100)
        proxy.hang(False)
        client.settimeout(5)
        assert client.recv(100) == b"TWO"
        client.close()
        t.join(5)
        assert got[-1] == b"<eof>"                # the relay side closed: so did the upstream side
    server.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=1)


def test_the_proxy_url_keeps_everything_but_host_and_port():
    p = hang.HangProxy("127.0.0.1", 9)
    try:
        assert p.url("amqp://guest:guest@127.0.0.1:5672/") == f"amqp://guest:guest@127.0.0.1:{p.port}/"
        assert p.url("amqp://u:p%40ss@rabbit.example/%2F?heartbeat=30") == \
            f"amqp://u:p%40ss@127.0.0.1:{p.port}/%2F?heartbeat=30"
        assert p.url("amqp://[::1]:5673/vh") == f"amqp://127.0.0.1:{p.port}/vh"
    finally:
        p.close()


@pytest.mark.parametrize("kw, match", [
    (dict(hang_s=0), "hang_s=0"),
    (dict(hang_s=31), "hang_s=31"),
    (dict(hang_s=1.2, deadline_s=1.0), "hang_s=1.2 does not outlast"),
    (dict(publish_timeout_s=0), "publish_timeout_s=0"),
    (dict(deadline_s=-1), "deadline_s=-1"),
    (dict(orders=0), "orders=0"),
    (dict(broker="kafka"), "No broker kind 'kafka'"),
])
def test_bad_parameters_name_the_fix_before_anything_starts(kw, match):
    def open_lab():
        raise AssertionError("the lab was opened before the parameters were checked")

    with pytest.raises(LabkitError, match=match) as info:
        hang.broker_hang_command(open_lab=open_lab, **{"hang_s": 3.0, "publish_timeout_s": 0.5,
                                                        "deadline_s": 1.0, "broker": None, **kw},
                                 json=True)
    assert info.value.fix


def test_the_command_prints_json_and_drops_its_lab(db, capsys):
    opened: list[Lab] = []

    def open_lab():
        opened.append(Lab.open(db, f"hang_cli_{os.getpid()}"))
        return opened[-1]

    assert hang.broker_hang_command(open_lab=open_lab, hang_s=1.5, publish_timeout_s=0.3,
                                    deadline_s=0.6, broker="recording", json=True) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("longest_transaction_s_unbounded", "longest_transaction_s_bounded",
                "locks_held_while_hung_unbounded", "locks_held_while_hung_bounded",
                "duplicates_after_recovery_bounded", "lost", "broker"):
        assert key in out
    assert out["lost"] == 0 and out["broker"] == "recording"
    with db.connect() as conn:
        assert conn.execute("SELECT to_regnamespace(%s)", (opened[0].schema,)).fetchone()[0] is None
    assert hang.broker_hang_command(open_lab=open_lab, hang_s=1.5, publish_timeout_s=0.3,
                                    deadline_s=0.6, broker="recording", json=False) == 0
    text = capsys.readouterr().out
    assert "unbounded relay" in text and "bounded relay" in text and "lost: 0" in text
