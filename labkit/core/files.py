"""Where labkit's own files are: the SQL inside the package, the workbook's data beside it.

``labkit/sql/``   SQL the reader reads (read_sql gives one file's text), read through
                  importlib.resources;
``data/``         the question bank, the capstone card, the reference measurements, the grader's
                  sample answers, the isolation specs, the training plans and the costly
                  answers.  It sits at the top of the checkout, beside ``notebooks/`` and
                  ``labkit/``; the package build carries it into the wheel as ``labkit/data/``.
                  :func:`data_file` is the one place that knows which of the two is read.

So a plain ``pip install .`` works from any folder, and an editable install reads ``data/`` in
place.  Only the notebooks themselves (``labkit student``, ``labkit slides``) need a checkout.

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
    """A file or folder inside the installed labkit package, e.g. ``package_file("templates")``."""
    return Path(str(resources.files("labkit").joinpath(*parts)))


def data_dir() -> Path:
    """The folder the workbook's data is read from.

    In a checkout (the package's folder has ``pyproject.toml`` and ``data/`` beside it, as with
    ``pip install -e .`` or ``make setup``) it is that ``data/``, read in place: an edit of
    ``data/questions.yaml`` shows in ``labkit drill`` without reinstalling.  An editable install
    cannot map ``labkit.data`` onto ``data/`` (setuptools' editable finder leaves a folder without
    ``__init__.py`` that lives outside the package unimportable), hence this look beside the
    package.  Anywhere else, in an installed wheel, it is the package's own ``labkit/data/``,
    where the build put a copy of ``data/``."""
    package = package_file()
    checkout = package.parent
    if (checkout / "pyproject.toml").is_file() and (checkout / "data").is_dir():
        return checkout / "data"
    return package / "data"


def data_file(*parts: str) -> Path:
    """A file or folder of the workbook's data, e.g. ``data_file("specs", "wait.spec")``: under
    the checkout's ``data/``, or the installed package's ``labkit/data/`` (see :func:`data_dir`)."""
    return data_dir().joinpath(*parts)


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
