"""Can this trainee reach another's files?  Run by ``labkit hub loadtest`` as a trainee, its
source given with ``-c`` (``python -c SOURCE OTHER_HOME ENVIRON_FILE``, roomload.probe_argv),
so that the trainee needs no right to read the checkout: it tries to list the other
trainee's home and to read a process's environment file, and prints one line for each it
reaches (nothing when both are closed).  The standard library only: any Python the trainees
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
    for what, path in (("home", argv[1]), ("a process's environment", argv[2])):
        try:
            _reach(what, path)
        except PermissionError:
            continue
        print(f"reached {what} of another trainee: {path}")


if __name__ == "__main__":
    main(sys.argv)
