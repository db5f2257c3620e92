"""The process between labkit and PgBouncer, run as ``python -I -S _pooler_launch.py PARENT
UID GID PGBOUNCER ARGS...`` (by path, isolated, so that it imports nothing a user could plant:
the standard library only).

It drops root (as root: UID and GID are -1 otherwise), asks the kernel to end it when PARENT
dies (Linux, PR_SET_PDEATHSIG: also when PARENT is killed outright and no clean-up of its
runs; PARENT 0 asks for nothing), then becomes PgBouncer (same pid).  ctypes is loaded
before root is dropped: the interpreter's files may be readable by root only.
"""

from __future__ import annotations

import os
import sys

PR_SET_PDEATHSIG = 1
DEATH_SIGNAL = 15                   # SIGTERM, what the kernel sends: PgBouncer's clean stop
PARENT_GONE = 70                    # the exit code when the parent died before we could ask


def _load_prctl(parent: int):
    """The C library's prctl, loaded while still root; None where there is none to ask."""
    if not parent or not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl
    except Exception:
        return None


def _drop_root(uid: int, gid: int) -> None:
    """Become UID:GID with no supplementary groups (nothing to do when UID is -1)."""
    if uid >= 0:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)


def main(argv: list[str]) -> None:
    """Drop root, tie our life to the parent's, and exec PgBouncer."""
    parent, uid, gid = int(argv[1]), int(argv[2]), int(argv[3])
    prctl = _load_prctl(parent)
    _drop_root(uid, gid)
    if prctl is not None:
        prctl(PR_SET_PDEATHSIG, DEATH_SIGNAL, 0, 0, 0)
    if parent and os.getppid() != parent:
        sys.exit(PARENT_GONE)
    os.execv(argv[4], argv[4:])


if __name__ == "__main__":
    main(sys.argv)
