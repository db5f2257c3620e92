"""labkit hub plan: a room's nodes from its measured footprint (labkit/tools/capacity.py).

The model is arithmetic over data/room_footprint.yaml (what `labkit hub loadtest` measured):
no server, no cluster.  These run under -m "not server".
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.cli import main
from labkit.core.errors import LabkitError
from labkit.core.files import data_file
from labkit.tools import capacity

GIB = 1024 ** 3


@pytest.fixture(scope="module", params=capacity.MODES)
def fp(request):
    return capacity.load_footprint(None, request.param)


def test_the_shipped_footprint_holds_both_modes_as_measured():
    rooms = yaml.safe_load(data_file(capacity.FOOTPRINT).read_text())
    assert set(rooms) == {"embedded", "shared"}
    for mode, e in rooms.items():
        assert e["mode"] == mode and e["failures"] == 0
        assert e["notebooks"] == ["00_start_here", "01_one_lock_three_policies", "03_claim_mark_commit"]
        assert 0 < e["cpu_seconds"]["median"] <= e["cpu_seconds"]["max"]
        assert 0 < e["peak_memory_mb"]["median"] <= e["peak_memory_mb"]["max"]
        # the whole room cannot have used more CPU than the machine had over the run
        assert e["trainees"] * e["cpu_seconds"]["median"] <= e["cpus"] * e["wall_s"]
        for field in ("trainees", "cpus", "wall_s", "date", "machine", "cpu_counted_by"):
            assert e[field], field
    assert "server_cpu_seconds_per_trainee" in rooms["shared"]


def test_the_count_is_the_ceiling_computed_by_hand_from_the_file():
    """40 trainees, nodes of 4 CPUs and 16 GiB, the embedded footprint, step by step."""
    e = yaml.safe_load(data_file(capacity.FOOTPRINT).read_text())["embedded"]
    fp = capacity.load_footprint(None, "embedded")
    cpu = math.ceil(round(e["cpu_seconds"]["max"] / e["wall_s"] / 0.05, 9)) * 0.05
    peak = max(e["peak_memory_mb"]["max"], e["working_set_mb"]["max"])
    mib = math.ceil(peak * 1.25 / 32) * 32
    # GKE's tiers: CPU 6 % + 1 % + 2 x 0.5 % of the first four; memory 25 % of 4 GiB, 20 % of
    # 4, 10 % of the next 8; the 100 MiB eviction threshold; the DaemonSets' 0.1 CPU, 256 MiB
    cpus_left = 4 - (0.06 + 0.01 + 0.01) - 0.1
    mib_left = 16 * 1024 - (1024 + 0.8 * 1024 + 0.8 * 1024) - 100 - 256
    by_cpu, by_mem = math.floor(round(cpus_left / cpu, 9)), math.floor(mib_left / mib)
    want = max(math.ceil(40 / by_cpu), math.ceil(40 / by_mem))
    p = capacity.plan(trainees=40, node_cpus=4, node_memory=16 * GIB, fp=fp)
    assert (p.cpu_per_trainee, p.memory_mib_per_trainee) == (pytest.approx(cpu), mib)
    assert (p.per_node_by_cpu, p.per_node_by_memory) == (by_cpu, by_mem)
    assert p.nodes == want
    assert p.bound_by == ("CPU" if math.ceil(40 / by_cpu) >= math.ceil(40 / by_mem) else "memory")


def test_the_request_is_above_both_measured_peaks(fp):
    mib = capacity.memory_mib_per_trainee(fp)
    in_pod = fp.peak_memory_mb_max - (fp.backend_memory_mb_max or 0 if fp.mode == "shared" else 0)
    assert mib >= in_pod * (1 + capacity.MEMORY_MARGIN)
    if fp.mode == "shared":                     # the backends are the shared server's, not the pod's
        assert fp.backend_memory_mb_max and mib < fp.peak_memory_mb_max * (1 + capacity.MEMORY_MARGIN) + 32
    assert mib >= (fp.working_set_mb_max or 0) * (1 + capacity.MEMORY_MARGIN)
    assert mib % capacity.MEMORY_STEP_MIB == 0
    assert capacity.cpu_per_trainee(fp) >= fp.cpu_seconds_max / fp.wall_s


@settings(max_examples=60, deadline=None)
@given(trainees=st.integers(1, 500), cpus=st.sampled_from([2, 4, 8, 16, 32]),
       gib=st.sampled_from([4, 8, 16, 32, 64]))
def test_more_node_memory_or_cpus_never_means_more_nodes(trainees, cpus, gib):
    fp = capacity.load_footprint(None, "embedded")
    base = capacity.plan(trainees=trainees, node_cpus=cpus, node_memory=gib * GIB, fp=fp).nodes
    assert capacity.plan(trainees=trainees, node_cpus=cpus, node_memory=2 * gib * GIB, fp=fp).nodes <= base
    assert capacity.plan(trainees=trainees, node_cpus=2 * cpus, node_memory=gib * GIB, fp=fp).nodes <= base
    assert capacity.plan(trainees=trainees + 1, node_cpus=cpus, node_memory=gib * GIB, fp=fp).nodes >= base


def test_a_heavier_footprint_binds_by_memory():
    fp = capacity.load_footprint(None, "embedded")
    heavy = replace(fp, peak_memory_mb_max=3000.0, working_set_mb_max=None)
    p = capacity.plan(trainees=40, node_cpus=16, node_memory=16 * GIB, fp=heavy)
    assert p.bound_by == "memory" and p.memory_mib_per_trainee == 3776     # 3000 x 1.25 -> 32s
    assert p.nodes == math.ceil(40 / p.per_node_by_memory)


def test_reservations_follow_the_tiers():
    assert capacity.reserved_cpu(1) == pytest.approx(0.06)
    assert capacity.reserved_cpu(4) == pytest.approx(0.08)
    assert capacity.reserved_cpu(8) == pytest.approx(0.09)
    assert capacity.reserved_memory(16 * GIB) == int(2.6 * GIB) + 100 * 1024 ** 2
    assert capacity.reserved_memory(4 * GIB) == GIB + 100 * 1024 ** 2


@pytest.mark.parametrize("text, want", [("16Gi", 16 * GIB), ("16G", 16 * 10 ** 9), ("16384M", 16384 * 10 ** 6),
                                        ("16384Mi", 16 * GIB), (" 1.5Gi ", int(1.5 * GIB)),
                                        (str(8 * GIB), 8 * GIB),
                                        # a unit as people write it: GB is G (10^9), GiB is Gi (2^30)
                                        ("16GB", 16 * 10 ** 9), ("16 GB", 16 * 10 ** 9), ("16GiB", 16 * GIB)])
def test_memory_is_read_as_kubernetes_writes_it(text, want):
    assert capacity.parse_memory(text) == want


@pytest.mark.parametrize("text", ["lots", "16gb", "-16Gi", "16", "", "16Gi16", "16B", "16GBB"])
def test_memory_that_is_not_a_node_is_refused_naming_the_fix(text):
    with pytest.raises(LabkitError) as err:
        capacity.parse_memory(text)
    assert "16Gi" in str(err.value)
    assert "1G = 10^9 bytes" in str(err.value) and "1Gi = 2^30 bytes" in str(err.value)


def test_cpus_as_kubernetes_writes_them():
    assert capacity.parse_cpus("4") == 4 and capacity.parse_cpus("3500m") == 3.5
    for bad in ("0", "four", "-2", "0m"):
        with pytest.raises(LabkitError, match="--node-cpus 4"):
            capacity.parse_cpus(bad)


@pytest.mark.parametrize("argv, says", [
    (["--trainees", "0", "--node-cpus", "4", "--node-memory", "16Gi"], "--trainees"),
    (["--trainees", "many", "--node-cpus", "4", "--node-memory", "16Gi"], "--trainees 40"),
    (["--trainees", "40", "--node-cpus", "4", "--node-memory=-16Gi"], "negative"),
    (["--trainees", "40", "--node-cpus", "4", "--node-memory", "sixteen"], "16Gi"),
    (["--trainees", "40", "--node-cpus", "0.1", "--node-memory", "16Gi"], "cannot hold one trainee"),
    (["--trainees", "40", "--node-cpus", "4", "--node-memory", "16Gi", "--footprint", "/no/such/file.yaml"],
     "--footprint-out"),
])
def test_bad_input_exits_2_with_a_message_naming_the_fix(argv, says, capsys):
    assert main(["hub", "plan", *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and "Fix:" in err


def test_a_footprint_without_the_mode_is_refused(tmp_path):
    one = tmp_path / "room.yaml"
    rooms = yaml.safe_load(data_file(capacity.FOOTPRINT).read_text())
    one.write_text(yaml.safe_dump({"embedded": rooms["embedded"]}))
    assert capacity.load_footprint(one, "embedded").source == str(one)
    with pytest.raises(LabkitError, match="no entry for the shared mode"):
        capacity.load_footprint(one, "shared")
    rooms["embedded"]["cpu_seconds"] = {"median": 0, "max": 0}
    one.write_text(yaml.safe_dump(rooms))
    with pytest.raises(LabkitError, match="nothing was measured"):
        capacity.load_footprint(one, "embedded")


def test_the_command_says_what_was_measured_and_what_is_assumed(capsys):
    assert main(["hub", "plan", "--trainees", "40", "--node-cpus", "4", "--node-memory", "16Gi"]) == 0
    out = capsys.readouterr().out
    fp = capacity.load_footprint(None, "embedded")
    p = capacity.plan(trainees=40, node_cpus=4, node_memory=16 * GIB, fp=fp)
    assert out.startswith(f"a room of 40 trainees (embedded mode) needs {p.nodes} node")
    assert "measured (" in out and "assumed:" in out and "computed:" in out
    assert f"median {fp.cpu_seconds_median:g} s" in out
    assert main(["hub", "plan", "--trainees", "40", "--node-cpus", "4", "--node-memory", "16Gi",
                 "--mode", "shared", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["plan"]["mode"] == "shared" and got["footprint"]["mode"] == "shared"
    assert got["assumed"]["memory_margin"] == capacity.MEMORY_MARGIN


def test_a_footprint_written_by_the_load_test_is_read_by_the_plan(tmp_path):
    """roomload.write_footprint's file, from a report of the shape loadtest makes, read back."""
    from labkit.tools import roomload
    report = {"mode": "embedded", "trainees": 4, "cpus": 2, "notebooks": ["00_start_here"],
              "cpu_s_per_trainee_median": 6.0, "cpu_s_per_trainee_max": 7.5, "cpu_counted_by": "cgroup v1",
              "memory_mb_per_trainee_median": 300, "memory_mb_per_trainee_max": 320,
              "working_set_mb_per_trainee_median": 310, "working_set_mb_per_trainee_max": 330,
              "wall_s": 30.0, "failures": 0, "hub_and_proxy_mb": 170}
    out = tmp_path / "mine.yaml"
    roomload.write_footprint(report, out)
    roomload.write_footprint({**report, "mode": "shared", "server_cpu_s_per_trainee": 1.0,
                              "server_backends_mb_per_trainee_max": 30}, out)
    fp = capacity.load_footprint(out, "embedded")
    assert (fp.cpu_seconds_max, fp.peak_memory_mb_max, fp.working_set_mb_max, fp.wall_s) == (7.5, 320, 330, 30.0)
    assert capacity.cpu_per_trainee(fp) == 0.25                 # 7.5 / 30, on the 0.05 grid
    assert capacity.memory_mib_per_trainee(fp) == 416           # 330 x 1.25 = 412.5 -> 416
    assert capacity.load_footprint(out, "shared").server_cpu_seconds_per_trainee == 1.0
    assert out.read_text().startswith("# A training room's footprint")


@pytest.mark.skipif(not (hasattr(os, "geteuid") and os.geteuid() == 0), reason="makes a control group: as root only")
def test_a_trainees_group_counts_the_cpu_of_a_process_that_has_ended():
    """What roomload reads per trainee: the CPU time of their group, a process that ran in it
    and ended included (oslimits.cpu_seconds)."""
    import subprocess
    import sys

    from labkit.tools import oslimits
    name = "trainee-cpu-probe"
    where = oslimits.prepare(name)
    if oslimits.cpu_seconds(where) is None:
        oslimits.remove(name)
        pytest.skip(f"this machine's control groups cannot count CPU time ({where.layout})")
    try:
        before = oslimits.cpu_seconds(where)
        busy = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass"
        subprocess.run([sys.executable, "-c", busy], preexec_fn=lambda: oslimits.join(where), check=True)
        used = oslimits.cpu_seconds(where) - before
        assert 0.5 <= used < 5, used
        assert oslimits.working_set_bytes(where) is not None
    finally:
        oslimits.remove(name)


# -- what the plan says about a node, its packing and its limits ---------------------------

def _text(trainees, cpus, memory, mode="embedded"):
    fp = capacity.load_footprint(None, mode)
    p = capacity.plan(trainees=trainees, node_cpus=cpus, node_memory=memory, fp=fp)
    return p, capacity.text(p, fp, allocatable=False)


def test_a_node_holds_as_many_as_fit_as_the_user_scheduler_packs_them():
    """The chart's user-scheduler fills the busiest node first: every node but the last is full,
    and what each trainee has when all run at once is computed for a full node."""
    p, out = _text(40, 4, 16 * GIB)
    fit = min(p.per_node_by_cpu, p.per_node_by_memory)
    assert p.trainees_per_node == fit
    assert p.trainees_on_each_node == [fit] * (p.nodes - 1) + [40 - fit * (p.nodes - 1)]
    assert sum(p.trainees_on_each_node) == 40
    assert p.cpu_each_when_all_run == pytest.approx(min(p.allocatable_cpus / fit, capacity.CPU_LIMIT), abs=1e-3)
    assert f"when all {fit} on the fullest node run a cell" in out
    assert "at most" not in out.split("computed:")[1]        # no "at most N on one", spread evenly


def test_the_assumptions_say_what_is_not_counted_and_that_the_cpu_is_a_floor():
    _, out = _text(40, 4, 16 * GIB)
    assumed = out.split("assumed:")[1].split("computed:")[0]
    assert "the hub, the proxy and the user-scheduler" in assumed and "database" not in assumed
    assert "8 trainees on 2 CPUs: 0.25 each" in assumed and "floor" in assumed
    assert "not notebook 02" in assumed
    _, shared = _text(40, 4, 16 * GIB, "shared")
    assert "the shared database server" in shared.split("assumed:")[1].split("computed:")[0]


def test_memory_limits_past_the_node_are_warned_of_naming_the_eviction():
    """values.yaml's pods ask for 480Mi and may take 1536Mi: 15 of them on a node of 4 CPUs and
    16 GiB can take more memory than the node has."""
    p, out = _text(40, 4, 16 * GIB)
    full = p.trainees_on_each_node[0]
    assert full * capacity.MEMORY_LIMIT_MIB > p.allocatable_mib
    assert p.memory_limits_on_the_fullest_node_mib == full * capacity.MEMORY_LIMIT_MIB
    assert len(p.warnings) == 1
    head = out.splitlines()[1]
    assert head.startswith("warning: memory is overcommitted") and "evicts" in head and "such as 02" in head
    assert f"{full} x {capacity.MEMORY_LIMIT_MIB} MiB" in head
    # a node with memory for every pod's limit: no warning
    p, out = _text(4, 4, 16 * GIB)
    assert 4 * capacity.MEMORY_LIMIT_MIB <= p.allocatable_mib and p.warnings == [] and "warning" not in out


def test_the_text_counts_in_good_english_and_caps_a_trainees_cpu_at_the_limit():
    p, out = _text(1, 1, 16 * 1024 * GIB)                    # one trainee, one CPU, 16Ti
    head = out.splitlines()[0]
    assert head.startswith("a room of 1 trainee (embedded mode) needs 1 node of 1 CPU and 16384 GiB")
    assert "e+" not in out and "1 trainees" not in out and "1 CPUs" not in out and "1 nodes" not in out
    p, out = _text(3, 16, 16 * GIB)                          # 15.79 CPU for 3 trainees
    assert p.cpu_each_when_all_run == capacity.CPU_LIMIT
    line = next(x for x in out.splitlines() if "on the fullest node run a cell" in x)
    assert f"each has {capacity.CPU_LIMIT:g} CPU (its limit" in line
    assert "each has 5" not in line
