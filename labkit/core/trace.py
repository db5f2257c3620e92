"""Step-by-step traces: what happened, in order, with the state after each step.

A trace is a list of steps.  Each step says who acted, what it did, a one-line
explanation, and a snapshot taken from the real systems afterwards (database
rows, locks from ``pg_locks``, the broker's messages...).  It renders as a text
transcript (for static readers, nbval and handouts), as a step-through widget
(Play + slider) that prints the same text, and as a chart of what was sent against
what the database records as sent (:func:`divergence`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from .plots import PALETTE, static_box
from .text import TEXT_WIDTH, wrap


@dataclass
class TraceStep:
    actor: str                    # who acted: "relay 1", "drain", "reaper", "clock"...
    action: str                   # what it did, short: "claim 100 rows", "SIGKILL"
    explain: str                  # one line: why this matters
    state: dict[str, Any] = field(default_factory=dict)   # snapshot after the step
    kind: str = "step"            # step, crash, freeze, error, check

    def state_line(self) -> str:
        return ", ".join(f"{k}={_fmt(v)}" for k, v in self.state.items())


@dataclass
class Trace:
    title: str
    steps: list[TraceStep] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    actors: list[str] = field(default_factory=list)

    def add(self, actor: str, action: str, explain: str, state: dict | None = None,
            kind: str = "step") -> TraceStep:
        if actor not in self.actors:
            self.actors.append(actor)
        st = TraceStep(actor, action, explain, dict(state or {}), kind)
        self.steps.append(st)
        return st

    # -- text ---------------------------------------------------------------------
    def step_text(self, i: int, width: int = TEXT_WIDTH) -> str:
        """Step ``i``: who did what, why it matters, the state after it; each part wrapped
        within ``width``, its continuation lines indented under it."""
        st = self.steps[i]
        mark = {"crash": "  ✗ CRASH", "freeze": "  ⏸ FROZEN", "error": "  ! ERROR"}.get(st.kind, "")
        lines = wrap(f"step {i + 1}/{len(self.steps)} · {st.actor}: {st.action}{mark}", width, "    ")
        if st.explain:
            lines += wrap(st.explain, width, "      ", first="    ")
        if st.state:
            lines += wrap(f"state: {st.state_line()}", width, "      ", first="    ")
        return "\n".join(lines)

    def to_text(self, width: int = TEXT_WIDTH) -> str:
        title = wrap(self.title, width)
        out = title + ["=" * max(map(len, title))]
        out += [self.step_text(i, width) for i in range(len(self.steps))]
        if self.summary:
            out += wrap("summary: " + ", ".join(f"{k}={_fmt(v)}" for k, v in self.summary.items()),
                        width, "    ")
        return "\n".join(out)

    def __str__(self) -> str:
        return self.to_text()

    def print(self) -> None:
        print(self.to_text())

    def to_json(self) -> str:
        return json.dumps({"title": self.title, "steps": [asdict(s) for s in self.steps],
                           "summary": self.summary}, indent=1, default=str)

    def report(self, as_json: bool, **extra: Any) -> str:
        """What a ``labkit trace ...`` command prints: the text transcript, or JSON with
        the summary's keys at the top level (and under ``summary``), the title and the steps."""
        if not as_json:
            return self.to_text()
        data = {**self.summary, "title": self.title, **extra, "summary": self.summary,
                "steps": [{**asdict(s), "text": self.step_text(i)} for i, s in enumerate(self.steps)]}
        return json.dumps(data, indent=1, default=str)

    # -- widget -------------------------------------------------------------------
    def replay(self, interval_ms: int = 1200, print_text: bool = True):
        """A Play + slider step-through.  The whole trace is printed as text too, so a
        static reader (GitHub, nbval, a printed handout) sees everything."""
        import ipywidgets as widgets
        from IPython.display import display

        if print_text:
            print(self.to_text())
        n = len(self.steps)
        play = widgets.Play(min=0, max=max(n - 1, 0), interval=interval_ms, description="play")
        slider = widgets.IntSlider(min=0, max=max(n - 1, 0), description="step",
                                   continuous_update=True)
        widgets.jslink((play, "value"), (slider, "value"))
        out = widgets.Output(layout={"border": "1px solid #ccc", "padding": "4px"})

        def show(change=None):
            # Written into the widget's own model, not printed: a printed line would land
            # in the cell's output under a kernel that does not capture into widgets
            # (nbval), and the printed transcript above already has every step.
            out.outputs = ()
            out.append_stdout(self.step_text(slider.value) + "\n")

        slider.observe(show, names="value")
        show()

        box = static_box([widgets.HBox([play, slider]), out],
                         lambda: f"step-through replay of {n} steps (every step is in the transcript above)")
        display(box)
        return box

    # -- pictures -------------------------------------------------------------------
    def divergence(self, sent, recorded, **kw):
        """See :func:`divergence`: sent against recorded, step by step."""
        return divergence(self, sent, recorded, **kw)


def _series(trace: Trace, key) -> list[float]:
    """``key``'s value after every step: a state key, or a function of the state; a step whose
    state does not say (the key absent, or the function returning None) keeps the last value."""
    out, last = [], 0.0
    for st in trace.steps:
        v = key(st.state) if callable(key) else st.state.get(key)
        last = last if v is None else float(v)
        out.append(last)
    return out


def divergence(trace: Trace, sent, recorded, *, sent_label: str = "sent",
               recorded_label: str = "recorded", ylabel: str = "count",
               above: str = "sent, not recorded: sent again, so duplicates",
               below: str = "recorded, not sent: lost unless sent later", ax=None,
               title: str | None = None):
    """What went out against what the database records as gone out, after every step of
    ``trace``.  Above the line (sent, not recorded) is what will be sent again: duplicates.
    Below it (recorded, never sent) is what no one will send unless someone sends it: loss.
    Crashes and freezes are marked; ``above`` and ``below`` name the shaded regions.
    ``sent`` and ``recorded`` are state keys or functions of a step's state."""
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.transforms import ScaledTranslation

    if ax is None:
        _, ax = plt.subplots(figsize=(12, 5.6))
    x = np.arange(1, len(trace.steps) + 1)
    s, r = np.array(_series(trace, sent)), np.array(_series(trace, recorded))
    # a region's legend entry only where it is drawn
    ax.fill_between(x, r, s, where=s > r, interpolate=True, color=PALETTE[1], alpha=0.3,
                    label=above if (s > r).any() else None)
    ax.fill_between(x, r, s, where=s < r, interpolate=True, color=PALETTE[2], alpha=0.3,
                    label=below if (s < r).any() else None)
    ax.plot(x, s, "o-", color=PALETTE[0], lw=2, label=sent_label)
    ax.plot(x, r, "s--", color=PALETTE[7], lw=1.5, label=recorded_label)
    for i, st in enumerate(trace.steps):
        if st.kind in ("crash", "freeze"):
            ax.axvline(i + 1, color=PALETTE[2], ls=":", lw=1.5)
            ax.annotate("crash" if st.kind == "crash" else "frozen", (i + 1, 0.62),
                        xycoords=("data", "axes fraction"), xytext=(4, 0), textcoords="offset points",
                        rotation=90, color=PALETTE[2])
    ax.set_xticks(x, [f"{i + 1}\n{st.actor}" for i, st in enumerate(trace.steps)])
    ax.set_xlim(0.5, len(x) + 0.5)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title or trace.title)
    # the legend under the step labels (an inch below the axes), as wide as the chart
    under = ax.transAxes + ScaledTranslation(0, -1.0, ax.figure.dpi_scale_trans)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, 0), bbox_transform=under, ncol=2, frameon=False)
    return ax


def _fmt(v: Any) -> str:
    if isinstance(v, (list, tuple)) and len(v) > 8:
        return f"[{', '.join(map(str, v[:3]))}, … {len(v)} items]"
    return str(v)
