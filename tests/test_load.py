"""labkit.shape: a timed shape is asserted on an idle machine and said on a loaded one."""

import os
import time

import pytest

import labkit as lk
from labkit.core import load

IDLE = load.Reading(cpus=2, load_1m=0.3, stretch=1.0)
LOADED = load.Reading(cpus=2, load_1m=7.9, stretch=1.0)
STRETCHED = load.Reading(cpus=2, load_1m=0.5, stretch=3.2)


def test_a_shape_that_holds_is_silent(capsys):
    assert lk.shape(True, "NOWAIT fails at once", check=lambda: pytest.fail("no reading needed"))
    assert capsys.readouterr().out == ""


def test_a_broken_shape_on_an_idle_machine_fails():
    with pytest.raises(AssertionError) as err:
        lk.shape(False, "NOWAIT fails before 200 ms", measured="350 ms", check=lambda: IDLE)
    assert "NOWAIT fails before 200 ms: did not hold (measured: 350 ms)" in str(err.value)
    assert "not loaded (1-minute load 0.3 on 2 CPUs" in str(err.value)


@pytest.mark.parametrize("reading", [LOADED, STRETCHED])
def test_a_broken_shape_on_a_loaded_machine_is_said(capsys, reading):
    assert lk.shape(False, "NOWAIT fails before 200 ms", measured="350 ms", check=lambda: reading) is False
    out = capsys.readouterr().out
    assert out.startswith("Not checked here: NOWAIT fails before 200 ms (measured: 350 ms). This machine is loaded")
    assert reading.line() in out


def test_busy_means_more_runnable_work_than_cpus_or_a_late_wake_up():
    assert not IDLE.busy and LOADED.busy and STRETCHED.busy
    assert not load.Reading(cpus=8, load_1m=7.9, stretch=1.0).busy      # 8 CPUs carry it


def test_the_reading_sees_a_machine_kept_busy():
    quiet = load.reading()
    assert quiet.cpus == os.cpu_count() and quiet.stretch > 0.9
    import multiprocessing          # processes, not threads: they load the CPUs for real
    procs = [multiprocessing.Process(target=_spin, args=(1.5,)) for _ in range(4 * (os.cpu_count() or 1))]
    for p in procs:
        p.start()
    try:
        time.sleep(0.3)
        loaded = load.reading()
    finally:
        for p in procs:
            p.join()
    assert loaded.stretch > STRETCH_SEEN and loaded.busy, (quiet, loaded)


STRETCH_SEEN = load.STRETCH


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
