"""Plot helpers shared by the notebooks: one palette, readable when projected."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Okabe & Ito's colour-blind-safe palette.
PALETTE = ["#0072B2", "#E69F00", "#D55E00", "#009E73", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]


def setup_matplotlib() -> None:
    """Large fonts and the colour-blind-safe palette, for screens and projectors;
    tables wide enough not to wrap."""
    import matplotlib as mpl
    import pandas as pd

    pd.set_option("display.width", 140)
    pd.set_option("display.max_colwidth", 80)
    from cycler import cycler

    mpl.rcParams.update({
        "figure.dpi": 100,
        "font.size": 12,
        "axes.titlesize": 14,
        "axes.labelsize": 12,
        "axes.prop_cycle": cycler(color=PALETTE),
        "axes.spines.top": False,
        "axes.spines.right": False,
        "svg.hashsalt": "labkit",
    })


def static_box(children: list, describe: Callable[[], str]) -> Any:
    """A VBox whose text form is ``describe()``: what nbval, GitHub, the handouts and a kernel
    without the widget front end show instead of ``VBox(children=...)``."""
    import ipywidgets as w

    class Box(w.VBox):
        def __repr__(self) -> str:
            return describe()

    return Box(children)
