"""Values the labs take as given, taken with a check: :mod:`labkit.core.checked` (the labs
import them from here as well as from there)."""

from __future__ import annotations

from ..core.checked import one_row, one_row_named, started_pid

__all__ = ["one_row", "one_row_named", "started_pid"]
