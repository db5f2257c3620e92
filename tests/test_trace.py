"""Traces render the same content as text, as a widget (which also prints it) and as a swimlane."""

import json

import matplotlib

matplotlib.use("Agg")

from labkit.core.trace import Trace


def sample() -> Trace:
    tr = Trace("Relay crash mid-batch")
    tr.add("relay 1", "claim 3 rows", "FOR UPDATE SKIP LOCKED locks them", {"locked": [1, 2, 3]})
    tr.add("relay 1", "SIGKILL", "the process dies mid-batch", {"locked": []}, kind="crash")
    tr.add("relay 2", "claim 3 rows", "the same rows again", {"locked": [1, 2, 3]})
    tr.summary = {"lost_events": []}
    return tr


def test_text_has_every_step_state_and_summary():
    text = sample().to_text()
    assert text.splitlines()[0] == "Relay crash mid-batch"
    assert "step 2/3 · relay 1: SIGKILL  ✗ CRASH" in text
    assert "state: locked=[1, 2, 3]" in text
    assert text.splitlines()[-1] == "summary: lost_events=[]"


def test_replay_prints_the_whole_trace_for_static_readers(capsys):
    tr = sample()
    box = tr.replay()
    printed = capsys.readouterr().out
    assert printed.startswith(tr.to_text() + "\n")
    play_row, out = box.children
    play, slider = play_row.children
    assert (play.max, slider.max) == (2, 2)
    assert out.outputs[-1]["text"].startswith("step 1/3")
    slider.value = 1  # moving the slider renders that step into the widget, printing nothing
    assert out.outputs[-1]["text"].startswith("step 2/3 · relay 1: SIGKILL")
    assert len(out.outputs) == 1
    assert capsys.readouterr().out == ""


def test_json_and_swimlane():
    tr = sample()
    data = json.loads(tr.to_json())
    assert [s["kind"] for s in data["steps"]] == ["step", "crash", "step"]
    ax = tr.swimlane()
    assert [t.get_text() for t in ax.get_yticklabels()] == ["relay 1", "relay 2"]
