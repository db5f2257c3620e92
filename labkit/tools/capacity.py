"""``labkit hub plan``: how many nodes a room of N trainees needs, from a measured footprint.

The footprint is what ``labkit hub loadtest`` measured per trainee while every trainee of a
room ran notebooks 00, 01 and 03 at the same moment (``data/room_footprint.yaml``, or a file
the presenter measured with ``--footprint-out`` and gives with ``--footprint``).  Notebook 02,
the convoy, with its worker processes, is not in the shipped footprint: a room that runs it
measures it (``labkit hub loadtest --notebooks 02_the_convoy --footprint-out FILE``).  From it:

memory per trainee (the pod's memory guarantee, which the scheduler reserves)
    the larger of the two peaks measured -- the sum of the trainee's processes' PSS (in the
    shared mode less their backends on the shared server, which are not in the pod), and their
    control group's working set -- plus ``MEMORY_MARGIN``, rounded up to ``MEMORY_STEP_MIB``.
    PSS splits a page that several processes map between them, so on one machine each trainee
    is charged a part of the Python and PostgreSQL libraries the room shares; a pod shares its
    anonymous memory with no one, and the working set counts page cache only for the group
    that read the file first.  Neither is what a pod will use to the byte: the margin covers
    the difference, and a longer cell than the notebooks measured.
CPU per trainee (the pod's CPU guarantee)
    the trainee's CPU seconds (everything their server started) over the wall time of the
    run, the larger of median and max, rounded up to ``CPU_STEP``.  In the measured run the
    room's CPUs were shared by every trainee at once, so this is the share at which a node's
    trainees, all running a cell together, go at the pace that was measured; a pod's CPU
    limit (above the guarantee) lets a trainee who runs alone go faster.  The rate measured
    cannot exceed the test machine's share (8 trainees on 2 CPUs: 0.25 each): it is a floor
    of what the workload takes, not what it would take on an idle node.
a node
    its CPUs and memory less what Kubernetes keeps for itself (``reserved_cpu`` and
    ``reserved_memory``: the kubelet's and the system's reservation and the eviction
    threshold, by the tiers GKE documents; other clouds reserve amounts of the same order),
    less the DaemonSets every node runs (``DAEMONSET_CPU``, ``DAEMONSET_MIB``: an assumption).
    ``--allocatable`` says the sizes given are the node's Allocatable already (``kubectl
    describe node``), and only the DaemonSets are taken off.

A pod is never split across nodes: a node holds ``floor(cpu / cpu per trainee)`` trainees by
CPU and ``floor(memory / memory per trainee)`` by memory, the smaller of the two, and the room
needs ``max(ceil(N / by CPU), ceil(N / by memory))`` nodes.  The chart's user-scheduler (on by
default) packs pods onto the busiest node that has room, so a node holds as many as fit: what
each trainee has when all of a node's run a cell at once is computed for a full node.  Not in
the count: the hub, the proxy and the user-scheduler (the chart's own pods; the hub and
proxy's memory was measured and is printed), and in the shared mode the database server.

The scheduler places pods by their guarantees; a pod may use up to its limit.  When a full
node's pods x the memory limit is more than the node has for them, the plan warns: if they all
use more than their guarantee at once (a notebook not in the footprint, a trainee's own
experiment), the node runs short of memory and the kubelet evicts pods that use more than they
asked for.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from ..core.errors import LabkitError
from ..core.files import data_file
from ..core.limits import number
from ..core.text import and_list

FOOTPRINT = "room_footprint.yaml"
MODES = ("embedded", "shared")
MAX_TRAINEES = 10_000
MEMORY_MARGIN = 0.25            # over the larger measured peak: see the module's text
MEMORY_STEP_MIB = 32
CPU_STEP = 0.05
CPU_LIMIT = 1.0                 # what one trainee may burst to (values.yaml: singleuser.cpu.limit)
MEMORY_LIMIT_MIB = 1536         # what one trainee's pod may take (values.yaml: singleuser.memory.limit)
DAEMONSET_CPU = 0.1             # kube-proxy, the network plugin, a log shipper: assumed
DAEMONSET_MIB = 256
EVICTION_MIB = 100              # the kubelet's default hard eviction threshold (memory.available)
GIB = 1024 ** 3
MIB = 1024 ** 2

UNITS = {"": 1, "k": 1000, "K": 1000, "M": 1000 ** 2, "G": 1000 ** 3, "T": 1000 ** 4,
         "Ki": 1024, "Mi": 1024 ** 2, "Gi": 1024 ** 3, "Ti": 1024 ** 4}
# For the command's help and its refusals: the units as Kubernetes reads them.
MEMORY_UNITS = "Gi, Mi and Ti are powers of 2, 1Gi = 2^30 bytes; G, M and T powers of 10, 1G = 10^9 bytes, and 16GB is 16G"
MEMORY_FIX = (f"write the node's memory as Kubernetes does: 16Gi, 16G or 16384Mi (a bare number is bytes; "
              f"{MEMORY_UNITS}).")


def quantity_bytes(text: str | int | float) -> int | None:
    """Bytes, from a Kubernetes quantity (``16Gi``, ``16G``, ``16384M``, ``480Mi``, or bytes);
    a unit may end in B as people write it (``16GB`` is ``16G``, ``16GiB`` is ``16Gi``).  None
    when ``text`` is not one."""
    found = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(?:(Ki|Mi|Gi|Ti|k|K|M|G|T)B?)?\s*", str(text))
    return int(float(found.group(1)) * UNITS[found.group(2) or ""]) if found else None


def parse_memory(text: str | int | float) -> int:
    """A node's memory in bytes, from a Kubernetes quantity: ``16Gi``, ``16G``, ``16384M``..."""
    value = quantity_bytes(text)
    if value is None and str(text).strip().startswith("-"):
        raise LabkitError(f"--node-memory {text!r} is negative.", MEMORY_FIX)
    if value is None:
        raise LabkitError(f"--node-memory {text!r} is not an amount of memory.", MEMORY_FIX)
    if value < GIB:
        raise LabkitError(f"--node-memory {text!r} is less than 1 GiB: no node that small runs a trainee "
                          "(a bare number is bytes).", MEMORY_FIX)
    return value


def parse_cpus(text: str | int | float) -> float:
    """CPUs, as Kubernetes writes them: ``4``, ``3.5`` or ``3500m``."""
    found = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(m?)\s*", str(text))
    fix = "give the node's CPUs as a number, as Kubernetes writes them: --node-cpus 4 (or 3.5, or 3500m)."
    if not found:
        what = "negative" if str(text).strip().startswith("-") else "not a number of CPUs"
        raise LabkitError(f"--node-cpus {text!r} is {what}.", fix)
    cpus = float(found.group(1)) / (1000 if found.group(2) else 1)
    if cpus <= 0:
        raise LabkitError(f"--node-cpus {text!r} is no CPU at all.", fix)
    return cpus


def reserved_cpu(cpus: float) -> float:
    """What GKE's kubelet keeps of a node's CPUs: 6 % of the first, 1 % of the second, 0.5 % of
    the next two, 0.25 % of the rest."""
    tiers = [(1, 0.06), (1, 0.01), (2, 0.005), (math.inf, 0.0025)]
    return _tiered(cpus, tiers)


def reserved_memory(total: int) -> int:
    """What GKE's kubelet keeps of a node's memory, in bytes: 25 % of the first 4 GiB, 20 % of
    the next 4, 10 % of the next 8, 6 % of the next 112, 2 % above 128 GiB; and the eviction
    threshold (100 MiB).  Nodes under 1 GiB are not planned for."""
    tiers = [(4 * GIB, 0.25), (4 * GIB, 0.20), (8 * GIB, 0.10), (112 * GIB, 0.06), (math.inf, 0.02)]
    return int(_tiered(total, tiers)) + EVICTION_MIB * MIB


def _tiered(amount: float, tiers: list[tuple[float, float]]) -> float:
    kept, left = 0.0, amount
    for size, share in tiers:
        part = min(left, size)
        kept += part * share
        left -= part
        if left <= 0:
            break
    return kept


# -- the footprint ------------------------------------------------------------------------

@dataclass
class Footprint:
    mode: str
    trainees: int
    cpus: int
    notebooks: list
    cpu_seconds_median: float
    cpu_seconds_max: float
    peak_memory_mb_median: float
    peak_memory_mb_max: float
    working_set_mb_max: float | None
    wall_s: float
    date: str
    machine: str
    hub_and_proxy_mb: float | None = None
    server_cpu_seconds_per_trainee: float | None = None
    backend_memory_mb_max: float | None = None
    source: str = ""

    @property
    def measures_the_convoy(self) -> bool:
        """Whether notebook 02, the convoy with its worker processes, was among those measured."""
        return any(n.startswith("02") for n in self.notebooks)


def default_footprint() -> Path:
    return data_file(FOOTPRINT)


def load_footprint(path: Path | None, mode: str) -> Footprint:
    """One mode's entry of a footprint file (the shipped one when ``path`` is None)."""
    import yaml
    path = path or default_footprint()
    fix = ("give --footprint a file written by `sudo labkit hub loadtest --footprint-out FILE` "
           f"(--mode {mode}), or leave --footprint out for the shipped measurement.")
    try:
        rooms = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise LabkitError(f"The footprint {path} cannot be read ({exc.strerror or exc}).", fix) from None
    except yaml.YAMLError:
        raise LabkitError(f"The footprint {path} is not YAML.", fix) from None
    if not isinstance(rooms, dict) or not isinstance(rooms.get(mode), dict):
        raise LabkitError(f"The footprint {path} has no entry for the {mode} mode.", fix)
    e = rooms[mode]
    try:
        got = Footprint(
            mode=mode, trainees=int(e["trainees"]), cpus=int(e["cpus"]), notebooks=list(e["notebooks"]),
            cpu_seconds_median=float(e["cpu_seconds"]["median"]), cpu_seconds_max=float(e["cpu_seconds"]["max"]),
            peak_memory_mb_median=float(e["peak_memory_mb"]["median"]),
            peak_memory_mb_max=float(e["peak_memory_mb"]["max"]),
            working_set_mb_max=_maybe((e.get("working_set_mb") or {}).get("max")),
            wall_s=float(e["wall_s"]), date=str(e["date"]), machine=str(e["machine"]),
            hub_and_proxy_mb=_maybe(e.get("hub_and_proxy_mb")),
            server_cpu_seconds_per_trainee=_maybe(e.get("server_cpu_seconds_per_trainee")),
            backend_memory_mb_max=_maybe((e.get("backend_memory_mb") or {}).get("max")),
            source=str(path))
    except (KeyError, TypeError, ValueError) as exc:
        raise LabkitError(f"The footprint {path}, {mode} mode, lacks or misspells a field ({exc}).", fix) from None
    for name in ("cpu_seconds_max", "peak_memory_mb_max", "wall_s"):
        if not getattr(got, name) > 0:
            raise LabkitError(f"The footprint {path}, {mode} mode, has {name} = {getattr(got, name)}: "
                              "nothing was measured.", fix)
    return got


def _maybe(value) -> float | None:
    return None if value is None else float(value)


# -- the plan -----------------------------------------------------------------------------

@dataclass
class Plan:
    trainees: int
    mode: str
    node_cpus: float
    node_memory_mib: float
    allocatable_cpus: float
    allocatable_mib: float
    cpu_per_trainee: float
    memory_mib_per_trainee: int
    per_node_by_cpu: int
    per_node_by_memory: int
    nodes_by_cpu: int
    nodes_by_memory: int
    nodes: int
    bound_by: str
    trainees_per_node: int              # as many as fit: the user-scheduler fills one node before the next
    trainees_on_each_node: list         # the fullest first
    cpu_each_when_all_run: float        # the fullest node's CPUs over its trainees, at most CPU_LIMIT
    measured_cpu_each_when_all_ran: float
    memory_limit_mib: int
    memory_limits_on_the_fullest_node_mib: int
    warnings: list


def cpu_per_trainee(fp: Footprint) -> float:
    """CPUs per trainee: CPU seconds (the max) over the run's wall time, rounded up to CPU_STEP."""
    rate = max(fp.cpu_seconds_median, fp.cpu_seconds_max) / fp.wall_s
    return _round_up(rate, CPU_STEP)


def memory_mib_per_trainee(fp: Footprint) -> int:
    """MiB per trainee: the larger peak (PSS or working set), plus MEMORY_MARGIN, rounded up.
    In the shared mode the PSS measured includes the trainee's backends on the shared server,
    which are not in their pod: their peak is taken off."""
    backends = (fp.backend_memory_mb_max or 0.0) if fp.mode == "shared" else 0.0
    peak = max(fp.peak_memory_mb_max - backends, fp.working_set_mb_max or 0.0)
    return int(_round_up(peak * (1 + MEMORY_MARGIN), MEMORY_STEP_MIB))


def _round_up(value: float, step: float) -> float:
    return round(math.ceil(round(value / step, 9)) * step, 6)


def plan(*, trainees: int, node_cpus: float, node_memory: int, fp: Footprint,
         allocatable: bool = False) -> Plan:
    """How many nodes of ``node_cpus`` CPUs and ``node_memory`` bytes a room of ``trainees`` needs."""
    number("--trainees", trainees, low=1, high=MAX_TRAINEES, whole=True, example=40)
    cpu = cpu_per_trainee(fp)
    mib = memory_mib_per_trainee(fp)
    node_mib = node_memory / MIB
    alloc_cpus = node_cpus - (0 if allocatable else reserved_cpu(node_cpus)) - DAEMONSET_CPU
    alloc_mib = node_mib - (0 if allocatable else reserved_memory(node_memory) / MIB) - DAEMONSET_MIB
    by_cpu = math.floor(round(alloc_cpus / cpu, 9)) if alloc_cpus > 0 else 0
    by_mem = math.floor(alloc_mib / mib) if alloc_mib > 0 else 0
    if by_cpu < 1 or by_mem < 1:
        short = "CPUs" if by_cpu < 1 else "memory"
        raise LabkitError(f"A node of {_cpus(node_cpus)} and {_gib(node_mib)} cannot hold one trainee "
                          f"({cpu:g} CPU and {mib} MiB each, after what Kubernetes keeps: "
                          f"{max(alloc_cpus, 0):.2f} CPU and {max(alloc_mib, 0):.0f} MiB left).",
                          f"give a node with more {short} (--node-cpus, --node-memory).")
    nodes_cpu, nodes_mem = math.ceil(trainees / by_cpu), math.ceil(trainees / by_mem)
    nodes = max(nodes_cpu, nodes_mem)
    # The chart's user-scheduler packs pods onto the busiest node that has room: every node
    # but the last is full.
    fit = min(by_cpu, by_mem)
    on_each = [fit] * (nodes - 1) + [trainees - fit * (nodes - 1)]
    fullest = on_each[0]
    limits_mib = fullest * MEMORY_LIMIT_MIB
    warnings = []
    if limits_mib > alloc_mib:
        warnings.append(
            f"memory is overcommitted: the fullest node's {fullest} trainees may take up to "
            f"{fullest} x {MEMORY_LIMIT_MIB} MiB (the memory limit) = {limits_mib} MiB, and it has "
            f"{alloc_mib:.0f} MiB for them. The guarantees fit; if the trainees use more than their "
            f"guarantee ({mib} MiB) at the same moment ("
            + ("" if fp.measures_the_convoy else
               "a notebook not in this footprint, such as 02 with its worker processes, or ")
            + "a trainee's own experiment), the node runs short of memory and the kubelet evicts pods that use "
            "more than they asked for (their servers stop; their volumes stay). Measure the notebooks your "
            "room runs and plan with --footprint FILE, or give nodes more memory.")
    return Plan(trainees=trainees, mode=fp.mode, node_cpus=node_cpus, node_memory_mib=round(node_mib),
                allocatable_cpus=round(alloc_cpus, 3), allocatable_mib=round(alloc_mib),
                cpu_per_trainee=cpu, memory_mib_per_trainee=mib, per_node_by_cpu=by_cpu,
                per_node_by_memory=by_mem, nodes_by_cpu=nodes_cpu, nodes_by_memory=nodes_mem, nodes=nodes,
                bound_by="CPU" if nodes_cpu >= nodes_mem else "memory", trainees_per_node=fit,
                trainees_on_each_node=on_each,
                cpu_each_when_all_run=round(min(alloc_cpus / fullest, CPU_LIMIT), 3),
                measured_cpu_each_when_all_ran=round(fp.cpus / fp.trainees, 3),
                memory_limit_mib=MEMORY_LIMIT_MIB, memory_limits_on_the_fullest_node_mib=limits_mib,
                warnings=warnings)


# -- the command --------------------------------------------------------------------------

def text(p: Plan, fp: Footprint, allocatable: bool) -> str:
    nb = and_list([n.split("_")[0] for n in fp.notebooks])
    lines = [f"a room of {p.trainees} {_plural(p.trainees, 'trainee')} ({p.mode} mode) needs {p.nodes} "
             f"{_plural(p.nodes, 'node')} of {_cpus(p.node_cpus)} and {_gib(p.node_memory_mib)} "
             f"(bound by {p.bound_by}: {p.nodes_by_cpu} by CPU, {p.nodes_by_memory} by memory)"]
    lines += [f"warning: {w}" for w in p.warnings]
    lines += ["",
              f"measured ({fp.source}, {fp.date}: {fp.machine}):",
              f"  {fp.trainees} {_plural(fp.trainees, 'trainee')} at once ran {_plural(len(fp.notebooks), 'notebook')} "
              f"{nb} on {_cpus(fp.cpus)} in {fp.wall_s:g} s",
              f"  CPU time per trainee: median {fp.cpu_seconds_median:g} s, at most {fp.cpu_seconds_max:g} s",
              f"  memory per trainee, peak: PSS median {fp.peak_memory_mb_median:g} MiB, at most "
              f"{fp.peak_memory_mb_max:g} MiB" + (f"; working set at most {fp.working_set_mb_max:g} MiB"
                                                  if fp.working_set_mb_max else "")]
    if fp.mode == "shared":
        lines.append(f"  on the shared server, per trainee (not in the pods): CPU "
                     f"{_or_unknown(fp.server_cpu_seconds_per_trainee, 's')} (the server's, divided by the "
                     f"room), memory at most {_or_unknown(fp.backend_memory_mb_max, 'MiB')}")
    if fp.hub_and_proxy_mb:
        lines.append(f"  the hub and its proxy: {fp.hub_and_proxy_mb:g} MiB (their own pods, not counted above)")
    reserve = ("none (--allocatable: the sizes given are the node's Allocatable)" if allocatable else
               f"the kubelet's and the system's, by GKE's tiers, and the eviction threshold: "
               f"{reserved_cpu(p.node_cpus):.2f} CPU, {reserved_memory(int(p.node_memory_mib * MIB)) / MIB:.0f} MiB")
    share = fp.cpus / fp.trainees
    fullest, each = p.trainees_on_each_node[0], p.cpu_each_when_all_run
    capped = p.allocatable_cpus / fullest > CPU_LIMIT
    when = ("the one trainee on a node has" if fullest == 1 else
            f"when all {fullest} on the fullest node run a cell at the same moment, each has")
    lines += [
        "assumed:",
        f"  per node, kept by Kubernetes: {reserve}",
        f"  per node, DaemonSets: {DAEMONSET_CPU:g} CPU, {DAEMONSET_MIB} MiB",
        "  not counted: the hub, the proxy and the user-scheduler (the chart's own pods, on a node of their "
        "own or beside the trainees')" + ("; the shared database server" if fp.mode == "shared" else ""),
        f"  memory per trainee = the larger peak x {1 + MEMORY_MARGIN:g}, rounded up to {MEMORY_STEP_MIB} MiB "
        f"(PSS splits shared pages; a pod shares its memory with no one)"
        + ("; the PSS less the trainee's backends, which are the shared server's" if fp.mode == "shared" else ""),
        f"  CPU per trainee = CPU seconds (max) / wall time, rounded up to {CPU_STEP:g}; the measured rate cannot "
        f"exceed the test machine's share ({fp.trainees} {_plural(fp.trainees, 'trainee')} on {_cpus(fp.cpus)}: "
        f"{share:.3g} each), so it is a floor of what was measured, not what the notebooks would take on an idle node",
        f"  the notebooks measured are the only load: {nb}"
        + ("" if fp.measures_the_convoy else
           " (not notebook 02, the convoy, with its worker processes: `labkit hub loadtest --notebooks "
           "02_the_convoy --footprint-out FILE` measures it)"),
        "computed:",
        f"  each trainee's pod asks for {p.cpu_per_trainee:g} CPU and {p.memory_mib_per_trainee} MiB "
        f"({'values-shared' if p.mode == 'shared' else 'values'}.yaml: singleuser.cpu.guarantee, "
        "singleuser.memory.guarantee)",
        f"  a node has {p.allocatable_cpus:g} CPU and {p.allocatable_mib:.0f} MiB for trainees: "
        f"{p.per_node_by_cpu} by CPU, {p.per_node_by_memory} by memory",
        f"  the chart's user-scheduler fills the busiest node that has room first, so a node holds as many as "
        f"fit: {p.trainees_per_node}; {p.trainees} on {p.nodes} {_plural(p.nodes, 'node')}: "
        f"{and_list([str(n) for n in p.trainees_on_each_node])}",
        f"  {when} {each:g} CPU"
        + (f" (its limit: the node's {p.allocatable_cpus:g} CPU are more than {fullest} can use)" if capped else "")
        + f"; the measured room had {p.measured_cpu_each_when_all_ran:g} each: "
        + ("as fast or faster than measured" if each >= p.measured_cpu_each_when_all_ran
           else "slower than measured") + f". A trainee alone may use up to {CPU_LIMIT:g} CPU (the limit)",
        f"  the fullest node's memory limits: {fullest} x {p.memory_limit_mib} MiB = "
        f"{p.memory_limits_on_the_fullest_node_mib} MiB, against {p.allocatable_mib:.0f} MiB for trainees"
        + (" (overcommitted: see the warning above)" if p.warnings else ""),
    ]
    return "\n".join(lines)


def _plural(count: float, word: str) -> str:
    return word if count == 1 else word + "s"


def _cpus(count: float) -> str:
    return f"{count:g} {_plural(count, 'CPU')}"


def _gib(mib: float) -> str:
    gib = mib / 1024
    return f"{gib:.3g} GiB" if gib < 1000 else f"{gib:.0f} GiB"


def _or_unknown(value: float | None, unit: str) -> str:
    return "not measured" if value is None else f"{value:g} {unit}"


def plan_command(*, trainees: str | int, node_cpus: str, node_memory: str, mode: str = "embedded",
                 footprint: Path | None = None, allocatable: bool = False, as_json: bool = False) -> int:
    if mode not in MODES:
        raise LabkitError(f"--mode {mode!r} is not a mode of the room.", "use --mode embedded or --mode shared.")
    count = _whole(trainees)
    cpus, memory = parse_cpus(node_cpus), parse_memory(node_memory)
    fp = load_footprint(footprint, mode)
    p = plan(trainees=count, node_cpus=cpus, node_memory=memory, fp=fp, allocatable=allocatable)
    if as_json:
        print(json.dumps({"plan": asdict(p), "footprint": asdict(fp),
                          "assumed": {"memory_margin": MEMORY_MARGIN, "daemonset_cpu": DAEMONSET_CPU,
                                      "daemonset_mib": DAEMONSET_MIB, "allocatable_given": allocatable,
                                      "reserved_cpu": 0 if allocatable else round(reserved_cpu(cpus), 4),
                                      "reserved_mib": 0 if allocatable else round(reserved_memory(memory) / MIB)}},
                         indent=1))
    else:
        print(text(p, fp, allocatable))
    return 0


def _whole(value: str | int) -> int:
    try:
        count = int(str(value).strip())
    except ValueError:
        raise LabkitError(f"--trainees {value!r} is not a whole number.",
                          "give how many trainees the room has: --trainees 40.") from None
    return int(number("--trainees", count, low=1, high=MAX_TRAINEES, whole=True, example=40))
