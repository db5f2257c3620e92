"""What a lab hands back: a small frozen dataclass, read by attribute.

A lab's result is a ``@dataclass(frozen=True)`` that derives from :class:`Result`.  Each field
says its unit in its name (``delete_ms``, ``table_bytes``, ``window_s``) or, where a name would
not hold it, in the class's docstring; a misspelt field is an ``AttributeError`` that names the
class, and an editor lists the fields.  ``as_dict()`` gives the fields as plain values -- a
nested result or a list of them as dicts too -- which is what a command's ``--json`` prints
(``to_json()``); a field that JSON cannot hold (a :class:`~labkit.core.trace.Trace`, a table, a
figure) is declared with :func:`not_json` and left out.

    @dataclass(frozen=True)
    class Shed(Result):
        \"\"\"Shedding the published rows one way.\"\"\"
        rows: int
        took_ms: float
        trace: Trace = not_json()

    shed = Shed(rows=10, took_ms=1.5, trace=t)
    shed.took_ms        # 1.5
    shed.to_json()      # {"rows": 10, "took_ms": 1.5}
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from typing import Any

_NOT_JSON = "labkit_not_json"


def not_json(*, default: Any = None) -> Any:
    """A field that ``as_dict()`` and ``to_json()`` leave out (a trace, a table, a figure);
    ``None`` unless ``default`` is given."""
    return dataclasses.field(default=default, metadata={_NOT_JSON: True}, compare=False)


def plain(value: Any) -> Any:
    """``value`` as JSON's plain values: results and other dataclasses as dicts (without their
    :func:`not_json` fields), tuples as lists, dict keys as text; anything else as it is."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)
                if not f.metadata.get(_NOT_JSON)}
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


@dataclasses.dataclass(frozen=True)
class Result:
    """The base of every lab's result (see the module's text)."""

    def as_dict(self, only: Iterable[str] | None = None) -> dict[str, Any]:
        """The fields as plain values, in their order; only those named in ``only`` if given
        (an unknown name is a ``KeyError`` naming it)."""
        every = plain(self)
        if only is None:
            return every
        names = list(only)
        unknown = [n for n in names if n not in every]
        if unknown:
            raise KeyError(f"{type(self).__name__} has no JSON field {', '.join(unknown)}")
        return {n: every[n] for n in names}

    def to_json(self, only: Iterable[str] | None = None, indent: int = 2) -> str:
        """:meth:`as_dict` as JSON text; a value JSON has no type for (a datetime) as its text."""
        return json.dumps(self.as_dict(only), indent=indent, default=str)
