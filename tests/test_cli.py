"""labkit doctor and labkit clean, run as a user would run them."""

import os
import subprocess
import sys


def labkit_cmd(*args):
    return subprocess.run([sys.executable, "-m", "labkit.cli", *args], capture_output=True,
                          text=True, env=os.environ.copy(), timeout=120)


def test_doctor_reports_a_session_left_in_a_transaction_and_clean_ends_it(lab):
    lab.create_jobs(1)
    stray = lab.connect(role="forgotten")
    stray.execute("BEGIN")
    stray.execute("SELECT id FROM job FOR UPDATE")
    pid = stray.info.backend_pid
    # a moment ago is not a leftover by default (it could be a running notebook) ...
    assert f"pid {pid}" not in labkit_cmd("doctor").stdout
    # ... but it is once it has been idle longer than the threshold
    out = labkit_cmd("doctor", "--idle-seconds", "0")
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"pid {pid}" in out.stdout and "labkit clean" in out.stdout
    assert "PostgreSQL" in out.stdout and "psycopg" in out.stdout
    cleaned = labkit_cmd("clean", "--idle-seconds", "0")
    assert cleaned.returncode == 0 and "ended" in cleaned.stdout
    # the lock is gone with the session
    assert lab.execute("SELECT id FROM job FOR UPDATE NOWAIT") == [(1,)]
    stray.close()


def test_doctor_exits_1_when_the_server_cannot_be_reached(tmp_path):
    env = os.environ.copy()
    env["LABKIT_DSN"] = "postgresql://nobody@127.0.0.1:1/none"
    out = subprocess.run([sys.executable, "-m", "labkit.cli", "doctor"], capture_output=True,
                         text=True, env=env, timeout=60)
    assert out.returncode == 1 and "PROBLEM" in out.stdout


def test_bad_usage_is_reported_by_argparse():
    out = labkit_cmd("server", "explode")
    assert out.returncode == 2 and "invalid choice" in out.stderr
