"""Errors that tell the reader what went wrong and what to do about it."""

from __future__ import annotations


class LabkitError(RuntimeError):
    """A problem the user can fix.  The message always names the fix."""

    def __init__(self, what: str, fix: str):
        self.what = what.strip()
        self.fix = fix.strip()
        super().__init__(self._render())

    def _render(self) -> str:
        # One paragraph: what happened, then what to do.
        return f"{self.what} Fix: {self.fix}"


class ServerError(LabkitError):
    """The PostgreSQL server could not be found, started or reached."""


class BackendError(LabkitError):
    """The requested backend (docker, dsn, embedded) cannot be used."""


class SpecError(LabkitError):
    """A malformed isolation spec or lab script (``filename``, ``line``, ``column``: where, when
    the parser knows)."""

    filename: str | None = None
    line: int | None = None
    column: int | None = None
