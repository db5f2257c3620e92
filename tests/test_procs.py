"""Worker processes: events, scripted pauses, and a real SIGKILL the server notices."""

import time

import pytest

from labkit.core.errors import LabkitError
from labkit.core.procs import Worker


def hold_lock_then_pause(ctx, dsn, schema):
    import psycopg

    conn = psycopg.connect(dsn, options=f"-c search_path={schema}",
                           application_name=f"labkit:{schema}:child")
    conn.execute("SELECT id FROM job WHERE id = 1 FOR UPDATE")  # in a transaction (not autocommit)
    ctx.emit("locked", pid=conn.info.backend_pid)
    ctx.pause("holding")
    conn.commit()
    return "finished"


def count_to(ctx, n):
    for i in range(n):
        ctx.emit("tick", i=i)
    return n


def boom(ctx):
    raise ValueError("bad parameter")


def test_events_and_result_come_back():
    w = Worker(count_to, name="counter", n=5).start()
    assert w.join(30)["result"] == 5
    assert [e["i"] for e in w.events if e["kind"] == "tick"] == [0, 1, 2, 3, 4]


def test_a_failing_child_is_reported_with_its_error():
    w = Worker(boom, name="boom").start()
    with pytest.raises(LabkitError, match="ValueError: bad parameter"):
        w.join(30)


def test_sigkill_at_a_scripted_point_releases_the_servers_locks(lab):
    lab.create_jobs(2)
    w = Worker(hold_lock_then_pause, name="holder", dsn=lab.db.dsn, schema=lab.schema).start()
    backend = w.wait_for("locked", timeout=30)["pid"]
    w.wait_for("paused", tag="holding")
    # the child's transaction holds row 1
    with pytest.raises(Exception):
        lab.execute("SELECT id FROM job WHERE id = 1 FOR UPDATE NOWAIT")
    w.kill()
    assert not w.alive and w.exitcode == -9
    # the server notices the dead connection and its locks are gone
    deadline = time.monotonic() + 10
    while lab.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (backend,)):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert lab.execute("SELECT id FROM job WHERE id = 1 FOR UPDATE NOWAIT") == [(1,)]


def test_resume_lets_the_child_finish(lab):
    lab.create_jobs(1)
    with Worker(hold_lock_then_pause, name="holder", dsn=lab.db.dsn, schema=lab.schema) as w:
        w.wait_for("paused", timeout=30)
        w.resume()
        assert w.join(30)["result"] == "finished"


def crash_at_once(ctx):
    import os

    ctx.emit("starting")
    os._exit(7)


def test_wait_exit_and_poll():
    w = Worker(crash_at_once, name="short-lived").start()
    assert w.wait_exit(30) == 7
    assert [e["kind"] for e in w.poll()] == [] and w.events[0]["kind"] == "starting"
    stuck = Worker(hold_forever, name="stuck").start()
    with pytest.raises(LabkitError, match="still running"):
        stuck.wait_exit(1)
    assert not stuck.alive


def hold_forever(ctx):
    ctx.pause("forever")


# -- signals ----------------------------------------------------------------------------------------


def test_sigterm_and_sighup_raise_stopped_once_and_the_handlers_come_back():
    import os
    import signal

    from labkit.core.procs import Stopped, signal_exit_code, stop_signals_interrupt

    before = signal.getsignal(signal.SIGTERM)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        cleaned = []
        with pytest.raises(Stopped) as info:
            with stop_signals_interrupt():
                try:
                    os.kill(os.getpid(), signum)
                    time.sleep(5)
                finally:
                    os.kill(os.getpid(), signum)    # a second one must not cut the clean-up short
                    time.sleep(0.05)
                    cleaned.append(True)
        assert cleaned == [True]
        assert isinstance(info.value, KeyboardInterrupt) and signal_exit_code(info.value) == 128 + signum
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_signal_during_a_deferred_section_lands_after_it():
    import os
    import signal

    from labkit.core.procs import signals_deferred

    done = []
    with pytest.raises(KeyboardInterrupt):
        with signals_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            done.append("the section ran to its end")
    assert done == ["the section ran to its end"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.usefixtures("gc_paused")
def test_a_ctrl_c_pressed_from_another_thread_is_not_lost_in_a_gc_callback():
    """The tests that press Ctrl-C mid-run do it with conftest's press_ctrl_c, under the
    gc_paused fixture.  Python ignores an exception raised in a gc callback, so an interrupt that
    lands while one runs is lost and the run goes on; here a slow callback runs at every
    collection, and the busy loop would make many, so without the pause nearly every press
    would be lost."""
    import gc
    import threading

    from conftest import press_ctrl_c

    def slow(phase, info):
        if phase == "start":
            time.sleep(0.01)

    gc.callbacks.append(slow)
    timer = threading.Timer(0.3, press_ctrl_c)
    try:
        timer.start()
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            while time.monotonic() - t0 < 10:
                _ = [[i] for i in range(2000)]        # containers: collections, one after another
        assert time.monotonic() - t0 < 5
    finally:
        timer.cancel()
        gc.callbacks.remove(slow)
