"""labkit's pytest plugin: what pytest needs to know about tests/ and notebooks/ alike.

pyproject.toml loads it for every run in the repository (``-p labkit.tools.pytest_plugin``),
so ``pytest tests``, ``pytest notebooks`` and ``make test`` all see it.  (A conftest.py at
the top of the repository would do the same, but the tests import their helpers with
``from conftest import ...``, which a second conftest module would shadow.)

The cross-engine appendix -- notebook 16 and the tests marked ``needs_mysql`` -- runs on a
MySQL-compatible server (labkit.core.mysql.find).  Without one, they are reported as ONE
skip line that says why and how to run them, and nothing else in the workbook changes.
"""

from __future__ import annotations

import pytest

APPENDIX = "16_other_engines.ipynb"


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "needs_mysql: runs on the cross-engine appendix's MySQL-compatible "
                                       "server; skipped, in one line, without one")


def _wants_mysql(item) -> bool:
    return item.get_closest_marker("needs_mysql") is not None or item.path.name == APPENDIX


def pytest_collection_modifyitems(config, items) -> None:
    wanting = [item for item in items if _wants_mysql(item)]
    if not wanting:
        return
    from ..core.mysql import skip_reason

    reason = skip_reason()
    if reason is None:
        return
    cells = sum(1 for item in wanting if item.path.name == APPENDIX)
    tests = len(wanting) - cells
    what = " and ".join(part for part in (f"{tests} test(s)" if tests else "",
                                          f"notebook 16's {cells} cell(s)" if cells else "") if part)
    wanting[0].add_marker(pytest.mark.skip(reason=f"{reason} (not run: {what})"))
    rest = set(wanting[1:])
    if rest:
        config.hook.pytest_deselected(items=list(rest))
        items[:] = [item for item in items if item not in rest]
