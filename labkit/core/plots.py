"""Plot helpers shared by the notebooks: one palette, readable when projected."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .text import TEXT_WIDTH

# Okabe & Ito's colour-blind-safe palette.
PALETTE = ["#0072B2", "#E69F00", "#D55E00", "#009E73", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]


def setup_matplotlib() -> None:
    """Large fonts and the colour-blind-safe palette, for screens and projectors; a table
    wider than the page printed in blocks of columns that fit it."""
    import matplotlib as mpl
    import pandas as pd

    pd.set_option("display.width", TEXT_WIDTH)
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


def plain_log_ticks(axis) -> None:
    """Label a log axis with plain numbers (0.1, 1, 10, 1,000), never ``6×10^-1``, and leave the
    in-between ticks unlabelled: readable from the back of a room."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.10g}"))
    axis.set_minor_formatter(NullFormatter())


def static_box(children: list, describe: Callable[[], str]) -> Any:
    """A VBox whose text form is ``describe()``: what nbval, GitHub, the handouts and a kernel
    without the widget front end show instead of ``VBox(children=...)``."""
    import ipywidgets as w

    class Box(w.VBox):
        def __repr__(self) -> str:
            return describe()

    return Box(children)
