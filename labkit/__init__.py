"""labkit: the helper package behind the Claim Lab workbook."""

from .db import Database, connect
from .errors import LabkitError
from .lab import Lab, read_sql, schema_name
from .nbtools import workbook_map
from .sessions import Sessions, Step

__version__ = "0.1.0"


def lab(name: str, *, quiet: bool = False) -> Lab:
    """Connect (saying to which server) and give back a fresh lab schema called ``name``."""
    return connect(quiet=quiet).lab(name)


def setup(notebook: str) -> Lab:
    """The one setup cell of every notebook: plot style, a server (named in one line),
    and a fresh lab schema for this notebook."""
    from .plots import setup_matplotlib

    setup_matplotlib()
    return connect().lab(notebook)


__all__ = ["Database", "Lab", "LabkitError", "Sessions", "Step", "connect", "lab", "read_sql",
           "schema_name", "setup", "workbook_map", "__version__"]
