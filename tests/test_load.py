"""labkit.shape: a timed shape is asserted on an idle machine and said on a loaded one."""

import json
import os

import pytest

import labkit as lk
from labkit.core import load

IDLE = load.Reading(cpus=2, load_1m=0.3, stretch=1.0)
LOADED = load.Reading(cpus=2, load_1m=7.9, stretch=1.0)
STRETCHED = load.Reading(cpus=2, load_1m=0.5, stretch=3.2)


@pytest.fixture(autouse=True)
def _no_strict_mode_and_no_log(monkeypatch):
    """These tests set the mode themselves; CI's first leg runs with strict shapes on."""
    monkeypatch.delenv(load.STRICT_ENV, raising=False)
    monkeypatch.delenv(load.LOG_ENV, raising=False)


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


def test_a_shape_is_measured_again_before_the_load_is_blamed(capsys):
    seen = iter([(False, "260 ms"), (True, "120 ms")])
    assert lk.shape(False, "NOWAIT fails before 200 ms", measured="350 ms", again=lambda: next(seen),
                    check=lambda: pytest.fail("it held on the third measurement: no reading needed"))
    out = capsys.readouterr().out
    assert "held on measurement 3 of 3 (before: 350 ms; 260 ms)" in out


def test_three_measurements_at_most_then_the_load_is_read():
    calls = []

    def again():
        calls.append(1)
        return False, f"{300 + len(calls)} ms"

    with pytest.raises(AssertionError) as err:
        lk.shape(False, "NOWAIT fails before 200 ms", measured="300 ms", again=again, check=lambda: IDLE)
    assert len(calls) == 2
    assert "did not hold in 3 measurements (measured: 300 ms; 301 ms; 302 ms)" in str(err.value)


def test_strict_mode_fails_a_shape_even_on_a_loaded_machine(monkeypatch, capsys):
    monkeypatch.setenv(load.STRICT_ENV, "1")
    with pytest.raises(AssertionError) as err:
        lk.shape(False, "NOWAIT fails before 200 ms", measured="350 ms", check=lambda: LOADED)
    assert "LABKIT_STRICT_SHAPES is set, so the load is not blamed" in str(err.value)
    assert "Not checked here" not in capsys.readouterr().out


def test_a_shape_not_checked_is_written_to_the_log(monkeypatch, tmp_path):
    log = tmp_path / "shapes.jsonl"
    monkeypatch.setenv(load.LOG_ENV, str(log))
    assert lk.shape(True, "held", check=lambda: LOADED)
    assert not log.exists()                                  # a shape that held is not logged
    lk.shape(False, "NOWAIT fails before 200 ms", measured="350 ms", check=lambda: LOADED)
    lk.shape(False, "SKIP LOCKED scales", check=lambda: STRETCHED)
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["claim"] for e in entries] == ["NOWAIT fails before 200 ms", "SKIP LOCKED scales"]
    assert entries[0]["measured"] == "350 ms" and entries[0]["reading"] == LOADED.line()


def test_busy_means_more_runnable_work_than_cpus_or_a_late_wake_up():
    assert not IDLE.busy and LOADED.busy and STRETCHED.busy
    assert not load.Reading(cpus=8, load_1m=7.9, stretch=1.0).busy      # 8 CPUs carry it


def test_the_reading_sees_a_machine_kept_busy():
    quiet = load.reading()
    assert quiet.cpus == os.cpu_count() and quiet.stretch > 0.9
    import multiprocessing          # processes, not threads: they load the CPUs for real
    started, stop = multiprocessing.Semaphore(0), multiprocessing.Event()
    procs = [multiprocessing.Process(target=_spin, args=(started, stop))
             for _ in range(4 * (os.cpu_count() or 1))]
    for p in procs:
        p.start()
    try:
        # read only once every spinner spins (on a loaded machine a process can take a second
        # or more to start, and a reading taken before would see less load than there is)
        assert all(started.acquire(timeout=60) for _ in procs)
        loaded = load.reading()
    finally:
        stop.set()
        for p in procs:
            p.join()
    assert loaded.stretch > STRETCH_SEEN and loaded.busy, (quiet, loaded)


STRETCH_SEEN = load.STRETCH


def _spin(started, stop) -> None:
    started.release()
    # The Event is read between runs of pure arithmetic, not in a tight loop: its is_set()
    # takes a lock the spinners share, and processes queued on that lock sleep instead of
    # loading the CPUs (with eight of them on two cores the reading saw a stretch of 1.09).
    while not stop.is_set():
        for _ in range(200_000):
            pass


def _notebook_with_a_shape(folder):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "# NBVAL_IGNORE_OUTPUT\n"
        "import labkit as lk\n"
        "from labkit.core import load\n"
        "loaded = load.Reading(cpus=2, load_1m=7.9, stretch=1.0)\n"
        "lk.shape(False, 'a shape this cell breaks on purpose', measured='350 ms', check=lambda: loaded)\n")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    path = folder / "shapes.ipynb"
    nbformat.write(nb, path)
    return path


@pytest.mark.parametrize("strict", [False, True])
def test_a_notebook_run_counts_the_shapes_not_checked(tmp_path, strict):
    """The test run's closing line counts what lk.shape said instead of asserting, names it,
    and LABKIT_STRICT_SHAPES=1 turns it into a failure."""
    import subprocess
    import sys

    path = _notebook_with_a_shape(tmp_path)
    env = {k: v for k, v in os.environ.items()
           if k not in (load.STRICT_ENV, load.LOG_ENV) and not k.startswith("PYTEST_XDIST")}
    if strict:
        env[load.STRICT_ENV] = "1"
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "labkit.tools.pytest_plugin", "-p",
                          "no:cacheprovider", "--nbval", "--nbval-current-env", str(path)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    if strict:
        assert run.returncode == 1, run.stdout
        assert "LABKIT_STRICT_SHAPES is set, so the load is not blamed" in run.stdout
        assert "labkit: 0 timed shape(s) not checked on a loaded machine (LABKIT_STRICT_SHAPES=1" in run.stdout
    else:
        assert run.returncode == 0, run.stdout + run.stderr
        assert "labkit: 1 timed shape(s) not checked on a loaded machine" in run.stdout
        assert "shapes.ipynb::Cell 0: a shape this cell breaks on purpose (measured: 350 ms;" in run.stdout


def test_two_processes_count_every_shape_not_checked_once(tmp_path):
    """Under pytest-xdist (make test's -n 4) each worker's kernels log to the worker's own file,
    and the controlling process's closing line counts both notebooks' shapes, each once."""
    import shutil
    import subprocess
    import sys

    first = _notebook_with_a_shape(tmp_path)
    second = tmp_path / "shapes_again.ipynb"
    shutil.copy(first, second)
    env = {k: v for k, v in os.environ.items()
           if k not in (load.STRICT_ENV, load.LOG_ENV) and not k.startswith("PYTEST_XDIST")}
    env["LABKIT_DSN"] = env.get("LABKIT_DSN") or "postgresql://unused@127.0.0.1:1/unused"  # no server per worker
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "labkit.tools.pytest_plugin", "-p",
                          "no:cacheprovider", "-n", "2", "--dist", "loadfile", "--nbval",
                          "--nbval-current-env", str(first), str(second)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "labkit: 2 timed shape(s) not checked on a loaded machine" in run.stdout, run.stdout
    assert "shapes.ipynb::Cell 0: a shape this cell breaks" in run.stdout
    assert "shapes_again.ipynb::Cell 0: a shape this cell breaks" in run.stdout
