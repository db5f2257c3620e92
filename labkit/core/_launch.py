"""The process between labkit and a server it starts (PgBouncer, a replica pair's
PostgreSQL), run as ``python -I -S _launch.py PARENT UID GID SIGNAL PROGRAM ARGS...`` (by
path, isolated, so that it imports nothing a user could plant: the standard library only).

It drops root (as root: UID and GID are -1 otherwise), asks the kernel to send it SIGNAL when
PARENT dies (Linux, PR_SET_PDEATHSIG: also when PARENT is killed outright and no clean-up of
its runs; PARENT 0 asks for nothing), then becomes PROGRAM (same pid).  SIGNAL is the
program's own clean stop: SIGTERM for PgBouncer, SIGQUIT (an immediate shutdown) for a
postmaster.  ctypes is loaded before root is dropped: the interpreter's files may be readable
by root only.
"""

from __future__ import annotations

import os
import sys

PR_SET_PDEATHSIG = 1
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
    """Drop root, tie our life to the parent's, and exec the program."""
    parent, uid, gid, death = int(argv[1]), int(argv[2]), int(argv[3]), int(argv[4])
    prctl = _load_prctl(parent)
    _drop_root(uid, gid)
    if prctl is not None:
        prctl(PR_SET_PDEATHSIG, death, 0, 0, 0)
    if parent and os.getppid() != parent:
        sys.exit(PARENT_GONE)
    os.execv(argv[5], argv[5:])


if __name__ == "__main__":
    main(sys.argv)
