"""Plot helpers shared by the notebooks: one palette, readable when projected."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .text import TEXT_WIDTH

# Okabe & Ito's colour-blind-safe palette.
PALETTE = ["#0072B2", "#E69F00", "#D55E00", "#009E73", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]


# Every font at least 15 pt: at 100 dpi that is 21 px, readable from the back row of a room
# when a figure is shown at its natural size on a 1280×720 slide (at most 12.24 × 6.64 inches).
FONT_PT = 15


def setup_matplotlib() -> None:
    """Large fonts and the colour-blind-safe palette, for screens and projectors; figures laid
    out to stay within their size (legends included); a table wider than the page printed in
    blocks of columns that fit it."""
    import matplotlib as mpl
    import pandas as pd

    pd.set_option("display.width", TEXT_WIDTH)
    pd.set_option("display.max_colwidth", 80)
    from cycler import cycler

    mpl.rcParams.update({
        "figure.dpi": 100,
        "figure.constrained_layout.use": True,
        "font.size": FONT_PT,
        "axes.titlesize": FONT_PT + 1,
        "axes.labelsize": FONT_PT,
        "xtick.labelsize": FONT_PT,
        "ytick.labelsize": FONT_PT,
        "legend.fontsize": FONT_PT,
        "legend.title_fontsize": FONT_PT,
        "figure.titlesize": FONT_PT + 2,
        "axes.prop_cycle": cycler(color=PALETTE),
        "axes.spines.top": False,
        "axes.spines.right": False,
        "svg.hashsalt": "labkit",
    })


def legend_beside(ax, **kwargs) -> Any:
    """The legend to the right of ``ax``, top-aligned, without a frame."""
    return ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, **kwargs)


def legend_below(fig, ax, ncol: int = 3) -> Any:
    """One legend for a figure of panels side by side, under them: ``ax``'s entries (the
    panels share their colours); every panel's own legend removed."""
    legend = ax.get_legend() or ax.legend()
    handles, labels = legend.legend_handles, [t.get_text() for t in legend.get_texts()]
    for panel in fig.axes:
        if panel.get_legend():
            panel.get_legend().remove()
    return fig.legend(handles, labels, loc="outside lower center", ncol=ncol, frameon=False)


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
