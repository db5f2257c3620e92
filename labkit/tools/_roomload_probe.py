"""Can this trainee reach another's files?  Run by ``labkit hub loadtest`` as a trainee, its
source given with ``-c`` (``python -c SOURCE OTHER_HOME ENVIRON_FILE...``, roomload.probe_argv),
so that the trainee needs no right to read the checkout: it tries to list the other
trainee's home and to read a process's environment file, and prints one line for each it
reaches (nothing when both are closed).  The other trainee's processes come and go while it
runs (a kernel shut down, a psql ended), so it is given several environment files and reads
the first whose process still exists.  The standard library only: any Python the trainees
may run can run it."""

from __future__ import annotations

import os
import sys


def _reach(what: str, path: str) -> None:
    """Open ``path`` (list a home, read a file); PermissionError means it is closed to us."""
    if what == "home":
        os.listdir(path)
    else:
        with open(path) as f:
            f.read()


def main(argv: list[str]) -> None:
    """Print one line per place of another trainee this user reaches."""
    try:
        _reach("home", argv[1])
    except PermissionError:
        pass
    else:
        print(f"reached home of another trainee: {argv[1]}")
    for environ in argv[2:]:
        try:
            _reach("environ", environ)
        except (FileNotFoundError, ProcessLookupError):
            continue                    # that process has ended since it was listed: the next
        except PermissionError:
            return
        print(f"reached a process's environment of another trainee: {environ}")
        return
    print(f"checked no process's environment: every one listed had ended ({' '.join(argv[2:])})")


if __name__ == "__main__":
    main(sys.argv)
