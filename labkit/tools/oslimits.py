"""What one trainee may take of the hub machine: memory, processes, a share of the CPUs.

JupyterHub's LocalProcessSpawner starts a trainee's server with no limit of its own: one
trainee's runaway cell (a fork loop, a DataFrame of everything, thirty-two convoy workers
left spinning) would slow or starve the whole room.  Each trainee's server therefore starts
inside a control group of its own, made by the hub as root before the server drops to the
trainee's user, so that everything the trainee starts (kernels, worker processes, their
embedded PostgreSQL) counts against it:

- memory: ``MEMORY_BYTES``, about four times what a trainee was measured to take at the
  peak (8 trainees at once on 2 CPUs, ``labkit hub loadtest``: at most 352 MiB of PSS over
  notebooks 00, 01 and 03, and a working set of at most 337 MiB over notebook 02, the
  convoy, with its worker processes), so that a trainee's own experiments fit, swap included (on a
  machine with swap, a group limited in RAM alone would page out without bound and slow the
  whole room); past it the kernel reclaims, then ends a process of that trainee's only;
- processes: ``PIDS``;
- CPU: an equal share (``cpu.weight`` on cgroup v2, ``cpu.shares`` on v1): a trainee may use
  every idle CPU, and when all are busy each trainee gets the same slice.

Both cgroup layouts are handled (v2, unified; v1, one hierarchy per controller).  Where
neither can be written (a container without cgroup delegation, macOS), the limit on the
number of processes of the trainee's user (RLIMIT_NPROC) is still set, and :func:`describe`
says what was not.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
GROUP = "claimlab"                         # the hub's parent group: claimlab/<trainee>
MEMORY_BYTES = 1536 * 1024 * 1024          # as the Kubernetes limit in the README
PIDS = 512
CPU_WEIGHT = 100                           # v2's default weight: every trainee alike
CPU_SHARES = 1024                          # v1's default shares: every trainee alike


@dataclass
class Place:
    """Where one trainee's group lives: a folder per controller (one folder on v2)."""
    layout: str                                # "v2", "v1" or "none"
    folders: dict[str, Path]                   # controller -> its folder for this trainee
    memory_bytes: int = MEMORY_BYTES           # the limits prepare() set (and join() caps with)
    pids: int = PIDS

    @property
    def limited(self) -> bool:
        return bool(self.folders)


def _layout(root: Path) -> str:
    if (root / "cgroup.controllers").is_file():
        return "v2"
    if (root / "memory" / "cgroup.procs").is_file():
        return "v1"
    return "none"


def place(trainee: str, root: Path = CGROUP_ROOT) -> Place:
    layout = _layout(root)
    if layout == "v2":
        return Place("v2", {"all": root / GROUP / trainee})
    if layout == "v1":
        return Place("v1", {c: root / c / GROUP / trainee for c in ("memory", "pids", "cpu", "cpuacct")
                            if (root / c / "cgroup.procs").is_file()})
    return Place("none", {})


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def prepare(trainee: str, root: Path = CGROUP_ROOT, *, memory_bytes: int = MEMORY_BYTES,
            pids: int = PIDS) -> Place:
    """Make the trainee's group and set its limits (as root).  A layout that cannot be
    written here gives ``Place("none", {})``: the process limit alone is then in force.
    ``memory_bytes`` and ``pids`` are the room's limits unless given (a test's small group)."""
    where = place(trainee, root)
    where.memory_bytes, where.pids = memory_bytes, pids
    try:
        if where.layout == "v2":
            parent = root / GROUP
            parent.mkdir(mode=0o755, exist_ok=True)
            wanted = {"memory", "pids", "cpu"} & set((root / "cgroup.controllers").read_text().split())
            for level in (root, parent):
                _write(level / "cgroup.subtree_control", " ".join(f"+{c}" for c in sorted(wanted)))
            folder = where.folders["all"]
            folder.mkdir(mode=0o755, exist_ok=True)
            limits = {"memory.max": str(memory_bytes), "memory.swap.max": "0",
                      "pids.max": str(pids), "cpu.weight": str(CPU_WEIGHT)}
            for name, value in limits.items():
                if (folder / name).exists():
                    _write(folder / name, value)
        elif where.layout == "v1":
            # cpuacct (a hierarchy of its own where it is not mounted with cpu) limits nothing:
            # its group is there to count the trainee's CPU time (cpu_seconds).
            # memory+swap (memsw, where the kernel accounts swap) may never be below the memory
            # limit: lifted first, then set equal to it, so that a group made again with a
            # larger limit is not refused
            files = {"memory": [("memory.memsw.limit_in_bytes", "-1"),
                                ("memory.limit_in_bytes", str(memory_bytes)),
                                ("memory.memsw.limit_in_bytes", str(memory_bytes))],
                     "pids": [("pids.max", str(pids))], "cpu": [("cpu.shares", str(CPU_SHARES))]}
            for controller, folder in where.folders.items():
                folder.mkdir(mode=0o755, parents=True, exist_ok=True)
                for name, value in files.get(controller, []):
                    if name.startswith("memory.memsw.") and not (folder / name).exists():
                        continue                   # swap not accounted here (swapaccount=0)
                    _write(folder / name, value)
    except OSError:
        remove(trainee, root)
        return Place("none", {}, memory_bytes, pids)
    return where


def join(where: Place) -> None:
    """Put the calling process in the trainee's group and cap the trainee user's processes.
    Called in the child, as root, just before it becomes the trainee (a preexec function):
    everything it starts afterwards stays in the group."""
    pid = str(os.getpid())
    for folder in where.folders.values():
        try:
            _write(folder / "cgroup.procs", pid)
        except OSError:
            pass
    try:
        resource.setrlimit(resource.RLIMIT_NPROC, (where.pids, where.pids))
    except (ValueError, OSError):
        pass


def remove(trainee: str, root: Path = CGROUP_ROOT) -> None:
    """Remove the trainee's group (its processes must have ended first)."""
    for folder in place(trainee, root).folders.values():
        try:
            folder.rmdir()
        except OSError:
            pass


def members(where: Place) -> set[int]:
    """The processes in the trainee's group now."""
    found: set[int] = set()
    for folder in where.folders.values():
        try:
            found |= {int(p) for p in (folder / "cgroup.procs").read_text().split()}
        except OSError:
            pass
    return found


def cpu_seconds(where: Place) -> float | None:
    """The CPU time, user and system, of every process that has run in the trainee's group
    since it was made, those that have ended included (the kernel charges each tick to the
    group the task was in, so nothing is missed between two readings): ``cpuacct.usage`` on
    v1 (nanoseconds), ``usage_usec`` of ``cpu.stat`` on v2.  None where there is no group."""
    try:
        if where.layout == "v2":
            for line in (where.folders["all"] / "cpu.stat").read_text().splitlines():
                if line.startswith("usage_usec "):
                    return int(line.split()[1]) / 1e6
        elif "cpuacct" in where.folders:
            return int((where.folders["cpuacct"] / "cpuacct.usage").read_text()) / 1e9
    except (OSError, ValueError, KeyError):
        pass
    return None


def working_set_bytes(where: Place) -> int | None:
    """The group's memory as the kubelet counts a pod's against its limit (its *working set*):
    what the group is charged (anonymous pages, and page cache its processes brought in,
    PostgreSQL's files among them), less the file pages the kernel may drop first
    (``inactive_file``).  None where there is no memory group."""
    folder = where.folders.get("all" if where.layout == "v2" else "memory")
    if folder is None:
        return None
    usage_file, inactive = ("memory.current", "inactive_file") if where.layout == "v2" else \
        ("memory.usage_in_bytes", "total_inactive_file")
    try:
        usage = int((folder / usage_file).read_text())
        stat = dict(line.split() for line in (folder / "memory.stat").read_text().splitlines())
        return max(0, usage - int(stat.get(inactive, 0)))
    except (OSError, ValueError):
        return None


def describe(where: Place) -> str:
    """One line for the presenter: what a trainee may take here."""
    if where.limited:
        return (f"each trainee: at most {where.memory_bytes // (1024 * 1024)} MB of memory (swap "
                f"included), {where.pids} processes, an equal share of the CPUs (cgroup {where.layout})")
    return (f"each trainee: at most {where.pids} processes (RLIMIT_NPROC); memory and CPU are not limited "
            "here, as this machine's control groups cannot be written (a container without "
            "cgroup delegation?): one trainee's runaway cell can slow the room")

