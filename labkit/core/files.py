"""Where labkit's own files are: everything a command reads ships inside the package.

``labkit/sql/``   SQL the reader reads (read_sql gives one file's text);
``labkit/data/``  the question bank, the reference measurements, the grader's sample answers
                  and the isolation specs.

Both are read through importlib.resources, so a plain ``pip install .`` works from any
folder.  Only the notebooks themselves (``labkit student``, ``labkit slides``) need a checkout.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def package_file(*parts: str) -> Path:
    """A file or folder inside the installed labkit package, e.g. ``package_file("data", "specs")``."""
    return Path(str(resources.files("labkit").joinpath(*parts)))


def data_file(*parts: str) -> Path:
    """A file or folder under ``labkit/data/``."""
    return package_file("data", *parts)


def read_sql(name: str) -> str:
    """The text of one of labkit's .sql files (``labkit/sql/NAME``)."""
    return package_file("sql", name).read_text()
