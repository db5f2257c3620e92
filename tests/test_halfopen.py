"""A half-open connection (labkit.labs.halfopen): the network between a worker and the server
goes silent, no FIN and no RST, and what bounds each side's wait.

Every test that traces runs the real thing: a network namespace of the lab's own, a
throw-away PostgreSQL in it, workers over TCP, the loopback taken down under them.  One
trace (the ``run`` fixture) serves the tests that read its result; the interruption tests
start a trace of their own in a process of its own and stop it from outside (Ctrl-C, then
a kill with no clean-up), and look for anything it left: a process in its namespace, the
child, the server's folder."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import child_pids

from labkit.core.errors import LabkitError
from labkit.labs import halfopen

# a server of the lab's own, started in a network namespace of its own
pytestmark = [pytest.mark.server, pytest.mark.needs_netns]

ROOT = Path(__file__).resolve().parent.parent
CAP_S = 6.0
USER_TIMEOUT_MS = 2000


@pytest.fixture(scope="module")
def namespace():
    ok, why = halfopen.available()
    if not ok:
        pytest.skip(f"no network namespace on this machine: {why}")
    return why


@pytest.fixture(scope="module")
def run(namespace):
    before = child_pids()
    r = halfopen.half_open_trace(cap_s=CAP_S, tcp_user_timeout_ms=USER_TIMEOUT_MS)
    return r, before


def _pids_under(folder: str) -> list[int]:
    """Processes whose working directory is in ``folder`` (a server's are in its data folder)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                cwd = os.readlink(f"/proc/{name}/cwd")
            except OSError:
                continue
            if cwd == folder or cwd.startswith(folder.rstrip("/") + "/"):
                found.append(int(name))
    return found


def _alive(pid: int) -> bool:
    """A process with this pid exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def test_the_worker_with_tcp_user_timeout_gets_its_error_after_the_timeout_and_before_the_cap(run):
    r, _ = run
    assert USER_TIMEOUT_MS / 1000 <= r.detected_s_with_keepalive < CAP_S
    assert r.error_with_keepalive == "could not receive data from server: Connection timed out"


def test_the_worker_without_keepalive_is_still_waiting_at_the_cap(run):
    r, _ = run
    assert r.still_hanging_at_cap is True
    assert r.hung_s_without_keepalive == CAP_S
    # the trap: keepalives alone never probe a connection with a statement unanswered
    assert r.still_hanging_at_cap_keepalive_only is True
    assert r.hung_s_keepalive_only == CAP_S


def test_the_server_keeps_the_silent_workers_row_locked(run):
    r, _ = run
    assert r.row_locked_while_silent is True
    assert r.row_locked_s_without_keepalive == CAP_S
    assert r.kernel_keepalive_time_s == 7200          # what the server's side would wait for


def test_the_servers_own_keepalives_end_its_session_and_free_the_row(run):
    r, _ = run
    assert 0 < r.row_locked_s_with_keepalive < r.row_locked_s_keepalive_only < CAP_S
    ended = ("could not receive data from client: Connection timed out; "
             "unexpected EOF on client connection with an open transaction")
    assert r.server_said_with_keepalive == ended
    assert r.server_said_keepalive_only == ended
    # each session's own settings, as the server read them back over TCP
    assert r.server_settings["with_keepalive"] == ["1", "1", "2", str(USER_TIMEOUT_MS)]
    assert r.server_settings["keepalive_only"] == ["1", "1", "2", "0"]
    assert r.server_settings["without_keepalive"][0] == str(r.kernel_keepalive_time_s)
    assert r.server_settings["without_keepalive"][3] == "0"


def test_the_table_of_what_happened_is_exactly_this(run):
    r, _ = run
    ended = ("its session ended (could not receive data from client: Connection timed out), "
             "its job claimable again")
    assert r.rows == [
        ("each worker claims a job over TCP; then the network goes silent (no FIN, no RST)",
         "each session idle in transaction, each job's row locked"),
        ("worker without keepalive sends its UPDATE", "no answer and no error: still waiting at the cap"),
        ("the server, that session (server defaults)",
         "its session idle in transaction at the cap, its job's row still locked"),
        ("worker with keepalives and tcp_user_timeout sends its UPDATE",
         "error: could not receive data from server: Connection timed out"),
        ("the server, that session (tcp_keepalives_* and tcp_user_timeout)", ended),
        ("worker with keepalives only sends its UPDATE", "no answer and no error: still waiting at the cap"),
        ("the server, that session (tcp_keepalives_* only)", ended),
    ]


def test_the_json_holds_the_figures_and_not_the_runs_process_ids(run):
    r, _ = run
    data = json.loads(r.to_json())
    assert data["detected_s_with_keepalive"] == r.detected_s_with_keepalive
    assert data["rows"][0] == list(r.rows[0])
    assert not {"child_pid", "netns", "pair_folder"} & set(data)
    assert "still waiting at" in halfopen.report(r)


def test_nothing_of_the_run_is_left(run):
    r, before = run
    assert r.child_pid and r.netns.startswith("net:[") and r.pair_folder
    assert not _alive(r.child_pid)
    assert halfopen.namespace_pids(r.netns) == []
    assert _pids_under(r.pair_folder) == []
    assert not Path(r.pair_folder).exists()
    assert child_pids() - before == set()


# -- stopped from outside ---------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[1] == str(pid):
                found.append(int(name))
    return found


def _in_flight(pid: int) -> list[tuple[int, int]]:
    """The TCP sockets of ``pid``'s network namespace that hold data not yet acknowledged
    (the workers' statements, sent into the silence): each one's timer (1: retransmission)
    and how many times it has retransmitted, from /proc/<pid>/net/tcp."""
    try:
        lines = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split()
        if int(fields[4].split(":")[0], 16) > 0:
            found.append((int(fields[5].split(":")[0], 16), int(fields[6], 16)))
    return found


def _trace_in_a_process(timeout: float = 60) -> tuple[subprocess.Popen, int, str, set[str]]:
    """A trace in a process of its own, once its workers' statements are in the silence:
    the process, its child, the child's namespace, and the server's folders."""
    env = {k: v for k, v in os.environ.items() if k != "LABKIT_DSN"}
    proc = subprocess.Popen(
        [sys.executable, "-c", "from labkit.labs.halfopen import half_open_trace; half_open_trace(cap_s=20)"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    own = os.readlink(f"/proc/{proc.pid}/ns/net")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for kid in _children(proc.pid):
            try:
                netns = os.readlink(f"/proc/{kid}/ns/net")
            except OSError:
                continue
            if netns != own and len(_in_flight(kid)) == len(halfopen.VARIANTS):
                folders = set()
                for pid in halfopen.namespace_pids(netns):
                    try:
                        folders.add(os.readlink(f"/proc/{pid}/cwd"))
                    except OSError:
                        pass
                pairs = {f for f in folders if "-pairs/" in f}
                assert pairs, folders
                return proc, kid, netns, pairs
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"the trace did not reach the silence within {timeout} s: {proc.communicate()}")


def _nothing_left(child: int, netns: str, folders: set[str], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (halfopen.namespace_pids(netns) or _alive(child)
                                           or any(Path(f).exists() for f in folders)):
        time.sleep(0.05)
    assert halfopen.namespace_pids(netns) == []
    assert not _alive(child)
    for folder in folders:
        assert _pids_under(folder) == []
        assert not Path(folder).exists()


def test_ctrl_c_in_the_silence_leaves_nothing(namespace):
    proc, child, netns, folders = _trace_in_a_process()
    assert len(halfopen.namespace_pids(netns)) > 3       # the child, the server, its sessions
    # the silence is a loss to TCP: each statement unacknowledged, retransmitted, no error
    time.sleep(1.0)
    assert [timer for timer, retransmits in _in_flight(child) if retransmits >= 1] == [1, 1, 1]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert "KeyboardInterrupt" in err
    _nothing_left(child, netns, folders, timeout=0.5)    # the lab's own clean-up, already done


def test_a_lab_killed_outright_in_the_silence_leaves_nothing(namespace):
    proc, child, netns, folders = _trace_in_a_process()
    proc.kill()                                          # no clean-up of the lab's runs
    proc.communicate(timeout=60)
    _nothing_left(child, netns, folders)                 # the child's death signal does it


# -- what needs no server -----------------------------------------------------------------------------


@pytest.mark.parametrize("cap_s, ms, words", [
    (2.0, 2000, "cap_s=2 is too small"),
    (4.0, 3000, "pass cap_s of at least 4.5"),
    (6.0, 50, "tcp_user_timeout_ms=50 is too small"),
    (6.0, 2000.5, "is not a whole number"),
    (60.0, 2000, "more than this lab handles"),
])
def test_parameters_the_trace_cannot_run_with_name_the_fix(cap_s, ms, words):
    with pytest.raises(LabkitError, match=words) as info:
        halfopen.half_open_trace(cap_s=cap_s, tcp_user_timeout_ms=ms)
    assert "Fix:" in str(info.value)


def test_a_machine_that_refuses_a_namespace_is_told_why_and_how_to_allow_one():
    """A real refusal: in a user namespace of its own whose user.max_user_namespaces is 0 (the
    kernel's own limit, set by util-linux's unshare with the namespace's capabilities kept),
    as a user that is not root there, the lab asks the kernel and is refused."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and util-linux's unshare to make a namespace that refuses")
    script = ("from labkit.labs import halfopen\n"
              "print(halfopen.available())\n"
              "halfopen.half_open_trace()\n")
    done = subprocess.run(
        ["unshare", "--user", "--map-user=1000", "--map-group=1000", "--keep-caps", "sh", "-c",
         'echo 0 > /proc/sys/user/max_user_namespaces && exec "$0" -c "$1"', sys.executable, script],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    if "max_user_namespaces" in done.stderr and "Traceback" not in done.stderr:
        pytest.skip(f"this unshare cannot set the limit: {done.stderr.strip()}")
    refused = "unshare failed: No space left on device; user.max_user_namespaces is 0"
    assert done.stdout.startswith("(False, "), done.stdout + done.stderr
    assert refused in done.stdout
    assert f"LabkitError: This machine does not let an unprivileged user make a network namespace ({refused})" \
        in done.stderr
    assert "Fix: run the lab on Linux with unprivileged user namespaces enabled" in done.stderr
    assert "kernel.apparmor_restrict_unprivileged_userns=0" in done.stderr and "as root." in done.stderr
