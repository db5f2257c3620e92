"""labkit: the helper package behind the Claim Lab workbook.

Three rooms, importing one way (``tools`` -> ``labs`` -> ``core``):

* ``labkit.core``  the engine every notebook needs: the server, connections, lab schemas,
  sessions and their transcripts, worker processes, traces, plots;
* ``labkit.labs``  one module per story the notebooks tell (convoy, claims, relay, broker,
  drain, fencing);
* ``labkit.tools`` what no lesson imports to learn from: bench, torture, spec, drill, grade,
  training, nbtools.

This facade is what ``import labkit as lk`` gives a notebook: the names notebooks use from
the engine (a notebook imports the facade and ``labkit.labs``, never ``labkit.core``):
a lab and its sessions, a named query (``query``), a trace (``Trace``), text laid out for
print (``fill``, ``table``), the plots' colours and shared legend (``PALETTE``,
``legend_below``), and the cross-engine appendix's ``mysql`` and ``MySessions``.
``cli.py`` sits on top of all three rooms.
"""

from .core import mysql
from .core.db import Database, connect
from .core.errors import LabkitError
from .core.lab import Lab, read_sql, schema_name
from .core.load import shape
from .core.mysessions import MySessions
from .core.plots import PALETTE, legend_below, setup_matplotlib
from .core.queries import query
from .core.replica import ReplicaPair
from .core.sessions import Sessions, Step
from .core.text import fill, table
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


__all__ = ["PALETTE", "Database", "Lab", "LabkitError", "MySessions", "ReplicaPair", "Sessions", "Step", "Trace",
           "connect", "fill", "lab", "legend_below", "mysql", "query", "read_sql", "schema_name",
           "setup", "shape", "table", "workbook_map", "__version__"]
