"""Waking workers on a real server: NOTIFY at commit, folded, rolled back, missed while no
one listens; a polling worker process against a notified one, and its picture; the LISTEN
worker loop (woken, safety poll, a terminated connection, two workers, stop); nothing left
behind."""

import json
import threading
import time
from types import SimpleNamespace

import pytest
from conftest import backends_gone, backends_of, child_processes, interrupt_when

from labkit import Lab
from labkit.core.errors import LabkitError
from labkit.core.queries import query
from labkit.labs import wakeup as wk


def test_notify_is_delivered_at_commit_not_before(lab):
    r = wk.delivered_at_commit(lab, wait_ms=300)
    assert r.before_commit == 0          # B's transaction was open for the whole wait
    assert r.after_commit == 1
    assert r.payload == str(r.job_id) and r.from_producer
    assert [s.session for s in r.steps] == ["A", "B", "B", "A", "B", "A"]


def test_same_payload_is_folded_within_one_transaction_only(lab):
    r = wk.coalesced(lab, repeats=3)
    assert r.sent_in_one_transaction == 5 and r.same_payload_sent == 3
    assert r.payloads_sent[:3] == [r.payloads_sent[0]] * 3     # one payload, three times
    assert sorted(set(r.payloads_sent), key=int) == r.payloads  # then two others, once each
    assert r.same_payload_received == 1          # three NOTIFYs, one delivery
    assert r.distinct_payloads_received == 3 == r.received
    assert r.payloads == sorted(r.payloads, key=int)   # in the order they were sent
    assert r.next_transaction_received == 1      # another transaction: not folded


def test_a_rolled_back_notify_is_never_delivered(lab):
    r = wk.rolled_back(lab)
    assert (r.notified, r.received, r.jobs_in_table) == (1, 0, 0)


def test_a_notification_sent_while_no_one_listens_is_gone_and_the_poll_finds_the_job(lab):
    r = wk.missed_while_not_listening(lab, safety_poll_ms=200)
    assert r.notifications_received == 0
    assert r.found_by_poll == 1 and r.missed_notifications_caught_by_poll == 1
    assert r.waited_ms >= 190
    assert lab.execute("SELECT id, status FROM job") == [(r.job_id, "DONE")]


def test_every_listener_wakes_and_one_claim_finds_the_job(lab, db):
    r = wk.every_listener_wakes(lab, listeners=3)
    assert r.woke == 3 and r.jobs == 1
    assert sorted(r.found) == [0, 0, 1]
    assert r.claim_queries == 4                 # the finder's second claim finds nothing
    assert lab.execute("SELECT status, attempts FROM job") == [("DONE", 1)]
    assert backends_gone(db, f"labkit:{lab.schema}:wake-listen-%") == []
    with pytest.raises(LabkitError, match="listeners"):
        wk.every_listener_wakes(lab, listeners=1)


def test_the_limits_of_notify_are_read_from_the_server(lab):
    r = wk.notify_limits(lab)
    page = int(lab.execute("SHOW block_size")[0][0])
    assert r.page_bytes == page
    version = lab.execute("SHOW server_version_num")[0][0]
    if int(version) >= 170000:
        pages = int(lab.execute("SHOW max_notify_queue_pages")[0][0])
        assert r.queue_pages == pages and r.queue_bytes == pages * page
    else:
        assert r.queue_pages is None and r.queue_bytes is None
    assert 0 <= r.queue_usage < 1
    # the longest payload goes through; one byte more is refused, when pg_notify is called
    assert 0 < r.longest_payload < page
    assert r.too_long.as_dict() == {"sqlstate": "22023", "message": "payload string too long"}
    with lab.connect(role="wake-check", autocommit=False) as conn:
        sent = query("wakeup.sql", "notify_payload_of_length").sql
        conn.execute(sent, {"channel": wk.channel(lab), "n": r.longest_payload})
        conn.rollback()
        with pytest.raises(Exception, match="payload string too long"):
            conn.execute(sent, {"channel": wk.channel(lab), "n": r.longest_payload + 1})
        conn.rollback()


def test_a_notified_worker_claims_far_sooner_than_a_polling_one(lab, db):
    t = time.monotonic()
    r = wk.notify_trace(lab, jobs=12, poll_ms=400, safety_poll_ms=500)
    assert time.monotonic() - t < 20                  # the notebook's section: about 8 s here
    assert r.notify_latency_ms_p50 < r.poll_latency_ms_p50 / 5
    assert 400 * 0.1 < r.poll_latency_ms_p50 < 400            # about half a poll
    assert r.poll_latency_ms_p99 <= r.poll_latency_ms_max < 400 * 1.5
    assert r.claims_from_notify + r.claims_from_poll == 12
    assert r.claims_from_notify >= 11               # each job woke the worker itself
    assert r.missed_notifications_caught_by_poll == 1
    # a claim per job plus an empty one per wake-up and the first sweep: no fewer than polling's
    assert r.notify_claim_queries >= 2 * 12 + 1 and \
        r.notify_claim_queries >= r.poll_claim_queries
    assert 0 <= r.notification_queue_usage < 0.01    # every listener read its notifications
    assert backends_gone(db, f"labkit:{lab.schema}:wake-%") == []


def test_the_shape_the_notebook_asserts_fails_when_the_wake_up_saves_nothing():
    ok = dict(notify_latency_ms_p50=1.5, poll_latency_ms_p50=180.0, poll_latency_ms_max=420.0,
              poll_ms=400)

    def trace(**figures):       # the four figures saves() reads of a NotifyTrace
        return SimpleNamespace(**{**ok, **figures})

    holds, seen = wk.saves(trace())
    assert holds is True and "1.5 ms notified against 180 ms polling" in seen
    assert wk.saves(trace(notify_latency_ms_p50=40.0))[0] is False     # not 5x shorter
    assert wk.saves(trace(poll_latency_ms_max=700.0))[0] is False      # a poll waited too long


def test_the_worker_claims_every_job_from_the_table_in_both_modes(lab):
    for mode in wk.MODES:
        r = wk.latency(lab, jobs=5, poll_ms=50, safety_poll_ms=2000, mode=mode)
        assert len(r.latencies_ms) == 5 and min(r.latencies_ms) >= 0
        assert lab.execute("SELECT status, count(*) FROM job GROUP BY status") == [("DONE", 5)]
        if mode == "poll":
            assert r.claims_from_notify == 0 == r.notifications_received
        else:
            # a job that came while the worker was claiming the one before is claimed in that
            # drain, and the worker may stop before the last NOTIFY reaches it
            assert 4 <= r.notifications_received <= 5 and r.claims_from_notify >= 4


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
    assert list(out) == ["jobs", "poll_ms", "safety_poll_ms", "poll_latency_ms_p50",
                         "poll_latency_ms_p99", "poll_latency_ms_max", "notify_latency_ms_p50",
                         "notify_latency_ms_p99", "notify_latency_ms_max",
                         "poll_over_notify_p50", "poll_idle_wakeups", "notify_idle_wakeups",
                         "poll_claim_queries", "notify_claim_queries", "claims_from_notify",
                         "claims_from_poll", "missed_notifications_caught_by_poll",
                         "missed_waited_ms", "notification_queue_usage", "timeline"]
    assert list(out["timeline"]) == ["poll", "notify", "restart"]
    assert list(out["timeline"]["restart"]) == ["down", "enqueued", "listening", "claimed"]
    job = out["timeline"]["notify"]["jobs"][0]      # (job id, enqueued, claimed, what woke it)
    assert job[0] == 1 and job[3] in ("poll", "notify")
    assert wk.notify_command(open_lab=open_lab, jobs=1, poll_ms=10, safety_poll_ms=10, json=False) == 0
    text = capsys.readouterr().out
    assert "LISTEN/NOTIFY" in text and "safety-net poll" in text
    with db.connect() as conn:
        for lab in opened:
            assert conn.execute("SELECT to_regnamespace(%s)", (lab.schema,)).fetchone()[0] is None
            assert backends_gone(db, f"labkit:{lab.schema}:%") == []


@pytest.mark.usefixtures("gc_paused")
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


# -- the timeline and its picture ---------------------------------------------------------------


def test_the_timeline_is_the_runs_own_clock(lab):
    r = wk.notify_trace(lab, jobs=4, poll_ms=100, safety_poll_ms=200)
    for mode, p50 in (("poll", r.poll_latency_ms_p50), ("notify", r.notify_latency_ms_p50)):
        tl = getattr(r.timeline, mode)
        assert [j[0] for j in tl.jobs] == [1, 2, 3, 4]
        assert min(j[1] for j in tl.jobs) == 0                    # from the first enqueue
        waits = sorted((claimed - enq) * 1000 for _, enq, claimed, _ in tl.jobs)
        assert abs((waits[1] + waits[2]) / 2 - p50) < 1              # the same waits, measured
        assert sum(n for _, _, n in tl.wakeups) == 4              # every claim on a wake-up
        assert all(a <= b for (a, _, _), (b, _, _) in zip(tl.wakeups, tl.wakeups[1:]))
    assert {j.woke_by for j in r.timeline.notify.jobs} == {"notify"}
    rs = r.timeline.restart
    assert rs.down == 0 < rs.enqueued < rs.listening < rs.claimed
    assert rs.claimed - rs.listening >= 0.19                   # the safety poll's 200 ms


def test_the_picture_draws_a_real_run_and_fits_a_slide(lab):
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from labkit.core.plots import setup_matplotlib
    from labkit.tools.training import IMG_MAX_PX, SLIDE_WIDTH_PX

    setup_matplotlib()
    r = wk.notify_trace(lab, jobs=5, poll_ms=100, safety_poll_ms=200)
    fig = wk.plot_wakeups(r)
    ax = fig.axes[0]
    drawn = {round(x, 4) for line in ax.get_lines() for x in line.get_xdata()}
    for mode in ("poll", "notify"):
        for _, enq, claimed, _ in getattr(r.timeline, mode).jobs:
            assert {round(enq, 4), round(claimed, 4)} <= drawn       # every enqueue and claim
    restart = r.timeline.restart
    assert {round(restart.enqueued, 4), round(restart.listening, 4),
            round(restart.claimed, 4)} <= drawn
    # overlapping waits of one lane are drawn on different sub-rows
    for mode in ("poll", "notify"):
        jobs = getattr(r.timeline, mode).jobs
        rows = wk._sub_rows(jobs, 0.0)
        for (_, e1, c1, _), r1 in zip(jobs, rows):
            for (_, e2, c2, _), r2 in zip(jobs, rows):
                if (e1, c1) != (e2, c2) and e1 <= e2 <= c1:
                    assert r1 != r2
    assert wk._sub_rows([wk.JobWait(1, 0.0, 0.5, "poll"), wk.JobWait(2, 0.2, 0.5, "poll"),
                         wk.JobWait(3, 0.6, 0.7, "poll")], 0.05) == [0, 1, 0]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "a new LISTEN" in legend
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert f"median wait {r.poll_latency_ms_p50:.3g} ms" in labels[0]
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    plt.close(fig)
    width, height = (int.from_bytes(buf.getvalue()[16:20], "big"),
                     int.from_bytes(buf.getvalue()[20:24], "big"))
    assert width <= SLIDE_WIDTH_PX and height <= IMG_MAX_PX
    with pytest.raises(LabkitError, match="notify_trace"):
        wk.plot_wakeups({"poll_ms": 400})


# -- the LISTEN worker loop ---------------------------------------------------------------------


def _started(worker) -> threading.Thread:
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    _until(lambda: any(w == "LISTEN" for _, w, _ in worker.log))
    return thread


def _until(done, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _claimed(worker) -> dict:
    return {job: why for _, why, job in worker.log if job is not None}


def _worker(lab, **kw):
    return wk.ListenWorker(lambda: lab.connect(role="listen-worker"), wk.channel(lab),
                           wk.claim_one, **kw)


def test_a_notify_wakes_the_listen_worker_long_before_its_safety_poll(lab, db):
    wk.create_table(lab)
    worker = _worker(lab, safety_poll_s=30)
    thread = _started(worker)
    try:
        job = lab.execute(query("wakeup.sql", "enqueue_and_notify").sql,
                          {"channel": wk.channel(lab)})[0][0]
        t = time.monotonic()
        _until(lambda: job in _claimed(worker), timeout=5)
        assert time.monotonic() - t < 2 and _claimed(worker) == {job: "notify"}
    finally:
        worker.stop()
        thread.join(5)
    assert not thread.is_alive() and worker.log[-1][1] == "stopped"
    assert lab.execute("SELECT status, attempts FROM job") == [("DONE", 1)]
    assert backends_gone(db, f"labkit:{lab.schema}:listen-worker") == []


def test_a_job_no_notify_announced_is_claimed_by_the_safety_poll(lab):
    wk.create_table(lab)
    lab.execute(query("wakeup.sql", "enqueue").sql)             # before it starts: the sweep
    claims: list = []

    def claim(conn):
        got = wk.claim_one(conn)
        claims.append(got)
        return got

    worker = wk.ListenWorker(lambda: lab.connect(role="listen-worker"), wk.channel(lab), claim,
                             safety_poll_s=0.5)
    thread = _started(worker)
    try:
        # the sweep has claimed job 1 and found nothing more due: the worker now waits (a job
        # inserted before that, on a loaded machine, would be the sweep's too)
        _until(lambda: 1 in _claimed(worker) and None in claims)
        job = lab.execute(query("wakeup.sql", "enqueue").sql)[0][0]   # no NOTIFY at all
        t = time.monotonic()
        _until(lambda: job in _claimed(worker), timeout=5)
        waited = time.monotonic() - t
    finally:
        worker.stop()
        thread.join(5)
    assert _claimed(worker) == {1: "sweep", job: "safety poll"}
    assert 0.2 <= waited <= 2.5


def test_it_survives_pg_terminate_backend_and_listens_again(lab, db):
    wk.create_table(lab)
    worker = _worker(lab, safety_poll_s=30, retry_s=0.2)
    thread = _started(worker)
    app = f"labkit:{lab.schema}:listen-worker"
    try:
        old = backends_of(db, app)[0][0]
        assert lab.execute(query("wakeup.sql", "terminate").sql, {"app": app}) == [(True,)]
        _until(lambda: sum(w == "LISTEN" for _, w, _ in worker.log) == 2)
        assert any(w == "connection lost" for _, w, _ in worker.log)
        new = [pid for pid, *_ in backends_of(db, app)]
        assert new and old not in new
        job = lab.execute(query("wakeup.sql", "enqueue_and_notify").sql,
                          {"channel": wk.channel(lab)})[0][0]
        _until(lambda: job in _claimed(worker), timeout=5)   # the new connection's LISTEN
        assert _claimed(worker)[job] == "notify"
    finally:
        worker.stop()
        thread.join(5)
    assert not thread.is_alive()
    assert backends_gone(db, app) == []


def test_two_listen_workers_claim_every_job_exactly_once(lab):
    wk.create_table(lab)
    workers = [_worker(lab, safety_poll_s=0.3) for _ in range(2)]
    threads = [_started(w) for w in workers]
    try:
        notify = query("wakeup.sql", "enqueue_and_notify").sql
        for _ in range(30):
            lab.execute(notify, {"channel": wk.channel(lab)})
        _until(lambda: lab.execute("SELECT count(*) FROM job WHERE status = 'DONE'") == [(30,)])
    finally:
        for w in workers:
            w.stop()
        for t in threads:
            t.join(5)
    mine = [set(_claimed(w)) for w in workers]
    assert not mine[0] & mine[1] and mine[0] | mine[1] == set(range(1, 31))
    assert lab.execute("SELECT count(*) FROM job WHERE attempts <> 1") == [(0,)]


def test_stop_ends_a_waiting_worker_at_once(lab):
    wk.create_table(lab)
    worker = _worker(lab, safety_poll_s=30)
    thread = _started(worker)
    t = time.monotonic()
    worker.stop()
    thread.join(5)
    assert not thread.is_alive() and time.monotonic() - t < 1


def test_the_scripted_run_the_notebook_shows(lab, db):
    r = wk.listen_worker_run(lab, safety_poll_s=0.5)
    assert r.claimed == {1: "notify", 2: "notify", 3: "notify", 4: "safety poll",
                            5: "sweep", 6: "notify"}
    assert r.claims == {i: 1 for i in range(1, 7)} and r.listens == 2
    did = dict(r.rows)
    assert did["the worker starts"] == "LISTEN"
    assert did["its connection ended by pg_terminate_backend"] == "connection lost"
    assert did["the server refuses connections (scripted)"] == "connect failed"
    assert did["the server takes connections again"] == "LISTEN; sweep: claimed job 5"
    assert did["stop()"] == "stopped"
    # the safety poll's window opened when jobs 2 and 3 were served, 0.2 s before the insert
    assert 0.15 <= r.safety_poll_after_s <= 3 and r.stopped_in_s < 1
    assert max(len(line) for line in r.table.splitlines()) <= 96
    for role in ("listen-worker", "wake-enqueue"):
        assert backends_gone(db, f"labkit:{lab.schema}:{role}") == []
    with pytest.raises(LabkitError, match="safety_poll_s"):
        wk.listen_worker_run(lab, safety_poll_s=0)
