"""Figures a room can read on a slide: every font at least 20 px at the workbook's 100 dpi, and
every figure the notebooks store small enough to be shown at its natural size on a 1280×720
slide (1224×664 px), so that no figure is shrunk and its text stays at least 20 px."""

import base64
import io
import json
import re
import struct
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.font_manager import FontProperties

from labkit.core.plots import setup_matplotlib
from labkit.core.trace import Trace
from labkit.labs import convoy
from labkit.tools.training import IMG_MAX_PX, SLIDE_WIDTH_PX

ROOT = Path(__file__).resolve().parents[1]
MIN_PX = 20
FONT_KEYS = ["font.size", "axes.titlesize", "axes.labelsize", "xtick.labelsize", "ytick.labelsize",
             "legend.fontsize", "legend.title_fontsize", "figure.titlesize"]
# fontsize=9, labelsize=10, size=12: an explicit font size in plotting code
SIZE_RE = re.compile(r"\b(fontsize|labelsize|size)\s*=\s*(\d+(?:\.\d+)?)")


def png_size(png: bytes) -> tuple[int, int]:
    """Width and height from a PNG's header (its IHDR chunk)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", png[16:24])


def stored_pngs(notebooks: list[Path]) -> list[tuple[str, int, int, int]]:
    """(notebook, cell, width, height) of every PNG stored in the notebooks' outputs."""
    found = []
    for nb in notebooks:
        for i, cell in enumerate(json.loads(nb.read_text())["cells"]):
            for out in cell.get("outputs", []):
                data = out.get("data", {}).get("image/png")
                if data:
                    png = base64.b64decode("".join(data) if isinstance(data, list) else data)
                    found.append((nb.name, i, *png_size(png)))
    return found


def oversize(notebooks: list[Path]) -> list[tuple[str, int, int, int]]:
    return [f for f in stored_pngs(notebooks) if f[2] > SLIDE_WIDTH_PX or f[3] > IMG_MAX_PX]


def small_sizes(source: str) -> list[str]:
    return [m.group(0) for m in SIZE_RE.finditer(source) if float(m.group(2)) < 15]


def figure_png(fig) -> bytes:
    """The PNG the notebook's inline backend stores: cropped to what is drawn."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def notebook(tmp_path: Path, png: bytes) -> Path:
    path = tmp_path / "99_big.ipynb"
    path.write_text(json.dumps({"cells": [{"cell_type": "code", "source": "", "outputs": [
        {"output_type": "display_data", "data": {"image/png": base64.b64encode(png).decode()}}]}]}))
    return path


# -- (a) the fonts -------------------------------------------------------------------------------

def test_every_font_is_at_least_20_px_at_100_dpi():
    setup_matplotlib()
    rc = matplotlib.rcParams
    assert rc["figure.dpi"] == 100
    for key in FONT_KEYS:
        px = FontProperties(size=rc[key]).get_size_in_points() * rc["figure.dpi"] / 72
        assert px >= MIN_PX, f"{key}: {px:.1f} px"


# -- (b) no stored figure is shrunk on a slide -------------------------------------------------

def test_every_stored_figure_fits_a_slide_at_its_natural_size():
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    assert len(stored_pngs(notebooks)) >= 15        # the workbook's figures are all looked at
    assert oversize(notebooks) == []


def test_an_oversize_figure_is_found(tmp_path):
    setup_matplotlib()
    fig, ax = plt.subplots(figsize=(8, 8.5))        # taller than a slide
    ax.plot([1, 2], [1, 2])
    path = notebook(tmp_path, figure_png(fig))
    [(name, cell, width, height)] = oversize([path])
    assert (name, cell) == ("99_big.ipynb", 0) and height > IMG_MAX_PX


def test_labkit_figures_fit_a_slide_and_keep_references_apart():
    setup_matplotlib()
    ref = pd.read_csv(convoy.reference_path())
    ref = ref[ref["variant"] != "hold, backoff"].assign(variant="hold")   # all three policies
    sweep = ref.assign(jobs_per_s=ref["jobs_per_s"] * 0.9)
    figs = [convoy.plot_sweep(sweep, ref)]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 6.4))
    convoy.plot_throughput(sweep, ref, ax=left)
    convoy.plot_efficiency(sweep, ax=right)
    refs = [line for line in left.get_lines() if line.get_label().endswith(", reference")]
    assert len(refs) == 3
    # the references differ in colour and in shape, drawn opaque: never two pale tints
    assert len({line.get_color() for line in refs}) == len({line.get_marker() for line in refs}) == 3
    assert all(line.get_alpha() is None for line in refs)
    figs.append(fig)
    tr = Trace("Relay crash mid-batch")
    for i in range(8):
        tr.add(f"relay {i % 2 + 1}", "publish", "one more", {"sent": i + 1, "marked": i // 2})
    figs.append(tr.divergence("sent", "marked").figure)
    for fig in figs:
        width, height = png_size(figure_png(fig))
        assert width <= SLIDE_WIDTH_PX and height <= IMG_MAX_PX, (width, height)


# -- (c) no explicit small font in the plotting code ------------------------------------------

def test_no_font_smaller_than_15_pt_in_plotting_code():
    assert small_sizes("ax.legend(fontsize=9); ax.tick_params(labelsize=10.5); t.set(size=14)") == [
        "fontsize=9", "labelsize=10.5", "size=14"]
    assert small_sizes("markersize=6, batch_size=3, fontsize=16") == []
    found = {}
    for path in sorted((ROOT / "labkit").rglob("*.py")):
        text = path.read_text()
        if "matplotlib" in text and small_sizes(text):
            found[str(path.relative_to(ROOT))] = small_sizes(text)
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(nb.read_text())["cells"]):
            if cell["cell_type"] == "code" and small_sizes("".join(cell["source"])):
                found[f"{nb.name} cell {i}"] = small_sizes("".join(cell["source"]))
    assert found == {}
