"""Waking workers on a real server: NOTIFY at commit, folded, rolled back, missed while no
one listens; a polling worker process against a notified one; nothing left behind."""

import json
import time

import pytest
from conftest import backends_gone, child_processes, interrupt_when

from labkit import Lab
from labkit.core.errors import LabkitError
from labkit.labs import wakeup as wk


def test_notify_is_delivered_at_commit_not_before(lab):
    r = wk.delivered_at_commit(lab, wait_ms=300)
    assert r["before_commit"] == 0          # B's transaction was open for the whole wait
    assert r["after_commit"] == 1
    assert r["payload"] == str(r["job_id"]) and r["from_producer"]
    assert [s["session"] for s in r["steps"]] == ["A", "B", "B", "A", "B", "A"]


def test_same_payload_is_folded_within_one_transaction_only(lab):
    r = wk.coalesced(lab, repeats=3)
    assert r["sent_in_one_transaction"] == 5 and r["same_payload_sent"] == 3
    assert r["same_payload_received"] == 1          # three NOTIFYs, one delivery
    assert r["distinct_payloads_received"] == 3 == r["received"]
    assert r["payloads"] == sorted(r["payloads"], key=int)   # in the order they were sent
    assert r["next_transaction_received"] == 1      # another transaction: not folded


def test_a_rolled_back_notify_is_never_delivered(lab):
    r = wk.rolled_back(lab)
    assert r == {**r, "notified": 1, "received": 0, "jobs_in_table": 0}


def test_a_notification_sent_while_no_one_listens_is_gone_and_the_poll_finds_the_job(lab):
    r = wk.missed_while_not_listening(lab, safety_poll_ms=200)
    assert r["notifications_received"] == 0
    assert r["found_by_poll"] == 1 and r["missed_notifications_caught_by_poll"] == 1
    assert r["waited_ms"] >= 190
    assert lab.execute("SELECT id, status FROM job") == [(r["job_id"], "DONE")]


def test_a_notified_worker_claims_far_sooner_than_a_polling_one(lab, db):
    t = time.monotonic()
    r = wk.notify_trace(lab, jobs=12, poll_ms=400, safety_poll_ms=500)
    assert time.monotonic() - t < 20                  # the notebook's section: about 8 s here
    assert r["notify_latency_ms_p50"] < r["poll_latency_ms_p50"] / 5
    assert 400 * 0.1 < r["poll_latency_ms_p50"] < 400            # about half a poll
    assert r["poll_latency_ms_p99"] < 400 * 1.5
    assert r["claims_from_notify"] + r["claims_from_poll"] == 12
    assert r["claims_from_notify"] >= 11               # each job woke the worker itself
    assert r["missed_notifications_caught_by_poll"] == 1
    assert 0 <= r["notification_queue_usage"] < 0.01    # every listener read its notifications
    assert backends_gone(db, f"labkit:{lab.schema}:wake-%") == []


def test_the_shape_the_notebook_asserts_fails_when_the_wake_up_saves_nothing():
    ok = dict(notify_latency_ms_p50=1.5, poll_latency_ms_p50=180.0, poll_latency_ms_p99=420.0,
              poll_ms=400)
    holds, seen = wk.saves(ok)
    assert holds is True and "1.5 ms notified against 180 ms polling" in seen
    assert wk.saves({**ok, "notify_latency_ms_p50": 40.0})[0] is False     # not 5x shorter
    assert wk.saves({**ok, "poll_latency_ms_p99": 700.0})[0] is False      # a poll waited too long


def test_the_worker_claims_every_job_from_the_table_in_both_modes(lab):
    for mode in wk.MODES:
        r = wk.latency(lab, jobs=5, poll_ms=50, safety_poll_ms=2000, mode=mode)
        assert len(r["latencies_ms"]) == 5 and min(r["latencies_ms"]) >= 0
        assert lab.execute("SELECT status, count(*) FROM job GROUP BY status") == [("DONE", 5)]
        if mode == "poll":
            assert r["claims_from_notify"] == 0 == r["notifications_received"]
        else:
            assert r["notifications_received"] == 5 and r["claims_from_notify"] >= 4


BAD = [
    dict(jobs=0), dict(jobs=10_001), dict(jobs=2.5), dict(jobs=True),
    dict(poll_ms=5), dict(poll_ms=60_001), dict(poll_ms=float("nan")), dict(poll_ms="500"),
    dict(safety_poll_ms=0), dict(safety_poll_ms=float("inf")),
    dict(mode="push"), dict(jobs=10_000, poll_ms=60_000),
]


@pytest.mark.parametrize("bad", BAD, ids=[",".join(f"{k}={v}" for k, v in b.items()) for b in BAD])
def test_bad_parameters_raise_before_anything_starts(bad):
    args = {"jobs": 20, "poll_ms": 500, "safety_poll_ms": 5000, "mode": "notify", **bad}
    with pytest.raises(LabkitError, match="Fix:"):
        wk.check_params(**args)
    if "mode" not in bad:
        def open_lab():
            pytest.fail("the command opened a lab for bad parameters")
        kw = {k: v for k, v in args.items() if k != "mode"}
        with pytest.raises(LabkitError):
            wk.notify_command(open_lab=open_lab, json=False, **kw)


def test_bad_parameters_of_the_scripted_steps(lab):
    with pytest.raises(LabkitError, match="wait_ms"):
        wk.delivered_at_commit(lab, wait_ms=0)
    with pytest.raises(LabkitError, match="repeats"):
        wk.coalesced(lab, repeats=1)
    with pytest.raises(LabkitError, match="safety_poll_ms"):
        wk.missed_while_not_listening(lab, safety_poll_ms=-1)
    with pytest.raises(LabkitError, match="mode"):
        wk.latency(lab, mode="push")


def test_command_prints_json_and_text_and_drops_its_lab(db, capsys):
    opened: list[Lab] = []

    def open_lab():
        opened.append(Lab.open(db, f"t_wake_cmd_{len(opened)}"))
        return opened[-1]

    assert wk.notify_command(open_lab=open_lab, jobs=3, poll_ms=50, safety_poll_ms=100, json=True) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"poll_latency_ms_p50", "notify_latency_ms_p50",
            "missed_notifications_caught_by_poll"} <= set(out)
    assert wk.notify_command(open_lab=open_lab, jobs=1, poll_ms=10, safety_poll_ms=10, json=False) == 0
    text = capsys.readouterr().out
    assert "LISTEN/NOTIFY" in text and "safety-net poll" in text
    with db.connect() as conn:
        for lab in opened:
            assert conn.execute("SELECT to_regnamespace(%s)", (lab.schema,)).fetchone()[0] is None
            assert backends_gone(db, f"labkit:{lab.schema}:%") == []


def test_keyboard_interrupt_mid_run_leaves_no_worker_and_no_session(lab, db):
    before = {p.pid for p in child_processes()}
    sent: list[float] = []

    def jobs_flow(conn) -> bool:
        # the worker is connected and jobs are arriving (read from the server)
        worker = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                              (f"labkit:{lab.schema}:wake-worker",)).fetchone()[0]
        return bool(worker and conn.execute("SELECT to_regclass('job') IS NOT NULL").fetchone()[0]
                    and conn.execute("SELECT count(*) FROM job").fetchone()[0] >= 2)

    watcher = interrupt_when(lambda: lab.connect(role="watch"), jobs_flow, sent)
    with pytest.raises(KeyboardInterrupt):
        wk.latency(lab, jobs=200, poll_ms=200, mode="notify")
    watcher.join(5)
    assert sent and time.monotonic() - sent[0] < 10
    assert [p for p in child_processes() if p.pid not in before] == []
    assert backends_gone(db, f"labkit:{lab.schema}:wake-%") == []
