"""labkit: the helper package behind the Claim Lab workbook.

Three rooms, importing one way (``tools`` -> ``labs`` -> ``core``):

* ``labkit.core``  the engine every notebook needs: the server, connections, lab schemas,
  sessions and their transcripts, worker processes, traces, plots;
* ``labkit.labs``  one module per story the notebooks tell (convoy, claims, relay, broker,
  drain, fencing);
* ``labkit.tools`` what no lesson imports to learn from: bench, torture, spec, drill, grade,
  training, nbtools.

This facade is what ``import labkit as lk`` gives a notebook: the few names every notebook
uses.  ``cli.py`` sits on top of all three rooms.
"""

from .core.db import Database, connect
from .core.errors import LabkitError
from .core.lab import Lab, read_sql, schema_name
from .core.load import shape
from .core.plots import setup_matplotlib
from .core.sessions import Sessions, Step
from .core.trace import Trace
from .tools.nbtools import workbook_map

__version__ = "0.1.0"


def lab(name: str, *, quiet: bool = False) -> Lab:
    """Connect (saying to which server) and give back a fresh lab schema called ``name``."""
    return Lab.open(connect(quiet=quiet), name)


def setup(notebook: str) -> Lab:
    """The one setup cell of every notebook: plot style, a server (named in one line),
    and a fresh lab schema for this notebook."""

    setup_matplotlib()
    return Lab.open(connect(), notebook)


__all__ = ["Database", "Lab", "LabkitError", "Sessions", "Step", "Trace", "connect", "lab",
           "read_sql", "schema_name", "setup", "shape", "workbook_map", "__version__"]
