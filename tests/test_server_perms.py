"""The embedded server starts again on a data directory whose mode a volume widened.

Kubernetes mounts a trainee's volume with a group of its own (KubeSpawner's fs_gid, the chart's
singleuser.fsGid: 100), and the kubelet then adds g+rwx and the setgid bit to what is on it at
each mount: the cluster folder, 0700 when initdb made it, becomes 2770, and PostgreSQL refuses to
start on it.  labkit sets it back to 0700 before it starts the server (EmbeddedServer
._mend_cluster_mode); the pod's start hook does the same (tests/test_kubernetes.py).
"""

from __future__ import annotations

import stat

from labkit.cli import main


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_cluster_whose_mode_a_volume_widened_starts_again_and_is_0700(scratch_server, capsys):
    first = scratch_server.start()
    assert first.running
    assert mode(scratch_server.pgdata) == 0o700
    assert not scratch_server.stop().running
    marker = scratch_server.pgdata / "claimlab-test-marker"     # gone if the cluster were made anew
    marker.write_text("the trainee's cluster")
    scratch_server.pgdata.chmod(0o2770)                 # what the kubelet leaves after a mount
    assert mode(scratch_server.pgdata) == 0o2770
    capsys.readouterr()
    assert main(["server", "start"]) == 0               # through labkit's command, as a notebook would
    out = capsys.readouterr()
    assert scratch_server.status().running
    assert mode(scratch_server.pgdata) == 0o700
    assert "set back to 0700" in out.err and "2770" in out.err
    assert marker.read_text() == "the trainee's cluster"  # the same cluster, not a new one
    # A mode PostgreSQL accepts (0750: the group may read) is left as it is.
    assert not scratch_server.stop().running
    scratch_server.pgdata.chmod(0o750)
    assert scratch_server.start().running
    assert mode(scratch_server.pgdata) == 0o750
    assert "set back" not in capsys.readouterr().err

