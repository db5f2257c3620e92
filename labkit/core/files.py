"""Where labkit's own files are: everything a command reads ships inside the package.

``labkit/sql/``   SQL the reader reads (read_sql gives one file's text);
``labkit/data/``  the question bank, the reference measurements, the grader's sample answers
                  and the isolation specs.

Both are read through importlib.resources, so a plain ``pip install .`` works from any
folder.  Only the notebooks themselves (``labkit student``, ``labkit slides``) need a checkout.

What a user does is kept outside the package, in :func:`state_dir` (the drill's mock-interview
scores); the embedded server's files are in ``core/server.py: data_root()``.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from .errors import LabkitError

STATE_ENV = "LABKIT_STATE_DIR"


def package_file(*parts: str) -> Path:
    """A file or folder inside the installed labkit package, e.g. ``package_file("data", "specs")``."""
    return Path(str(resources.files("labkit").joinpath(*parts)))


def data_file(*parts: str) -> Path:
    """A file or folder under ``labkit/data/``."""
    return package_file("data", *parts)


def read_sql(name: str) -> str:
    """The text of one of labkit's .sql files (``labkit/sql/NAME``)."""
    return package_file("sql", name).read_text()


def state_dir() -> Path:
    """The folder where labkit keeps what a user did (the mock interview's scores): the one
    ``LABKIT_STATE_DIR`` names, or the platform's per-user state folder (on Linux
    ``~/.local/state/labkit``).  Not created here: the first file written creates it."""
    import platformdirs

    override = os.environ.get(STATE_ENV, "")
    if override.strip():
        path = Path(override).expanduser()
        if path.exists() and not path.is_dir():
            raise LabkitError(f"{STATE_ENV}={override!r} is a file, not a folder.",
                              f"point {STATE_ENV} at a folder (labkit creates it if it is missing), "
                              "or unset it to use the default place.")
        return path.absolute()
    return Path(platformdirs.user_state_dir("labkit"))
