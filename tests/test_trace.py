"""Traces render the same content as text, as a widget (which also prints it) and as a chart of
what was sent against what was recorded."""

import json

import matplotlib

matplotlib.use("Agg")

from labkit.core.text import TEXT_WIDTH
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


def test_long_steps_wrap_within_the_width_every_word_whole_and_in_order():
    tr = Trace("Relay frozen mid-batch: 100 claimed, frozen after 40 publishes "
               "(idle_in_transaction_session_timeout = 2 s on its session)")
    tr.add("relay 1", "claim 100 rows FOR UPDATE SKIP LOCKED, publish 40 of them, then SIGSTOP: "
           "frozen mid-batch with its transaction open", "the server " + "keeps the locks " * 12,
           {"unpublished": 100, "relay_locks": "outbox RowShareLock + own transactionid ExclusiveLock "
            "+ 100 tuple locks", "ids": list(range(1, 101))}, kind="freeze")
    tr.summary = {f"key_{i}": "value " * 3 for i in range(12)}
    text = tr.to_text()
    lines = text.splitlines()
    assert max(map(len, lines)) <= TEXT_WIDTH
    st = tr.steps[0]
    wanted = (tr.title.split() + [f"step 1/1 · {st.actor}: {st.action}  ⏸ FROZEN", st.explain,
                                   f"state: {st.state_line()}"]
              + ["summary: " + ", ".join(f"{k}={v}" for k, v in tr.summary.items())])
    assert lines[2] == "=" * max(len(lines[0]), len(lines[1]))       # the title's two lines, underlined
    assert " ".join(lines[:2] + lines[3:]).split() == " ".join(wanted).split()
    # a step's continuation lines are indented under it, so the next step's first line stands out
    assert [line for line in lines if line.startswith("step ")] == [lines[3]]
    summary = next(i for i, line in enumerate(lines) if line.startswith("summary: "))
    assert summary < len(lines) - 1           # long enough to wrap
    assert all(line.startswith("    ") for line in lines[4:summary] + lines[summary + 1:])


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


def test_json():
    data = json.loads(sample().to_json())
    assert [s["kind"] for s in data["steps"]] == ["step", "crash", "step"]


def shipped() -> Trace:
    """Publishes and marks, as the relay's traces record them: a crash after two publishes,
    a second relay sending all four and marking them, then a relay that marks before it sends."""
    tr = Trace("sent against recorded")
    tr.add("relay 1", "publish 2", "", {"broker": 2, "marked": 0})
    tr.add("relay 1", "SIGKILL", "", {}, kind="crash")
    tr.add("relay 2", "publish 4, mark 4", "", {"broker": 6, "marked": 4})
    tr.add("relay 3", "mark 3 before sending", "", {"marked": 7})
    tr.add("consumer", "count", "", {"delivered": 6})
    return tr


def test_the_divergence_chart_shades_duplicates_above_and_loss_below():
    ax = shipped().divergence("broker", "marked")
    sent, recorded = (line.get_ydata().tolist() for line in ax.get_lines()[:2])
    # a step whose state does not name a key keeps the last value
    assert sent == [2, 2, 6, 6, 6] and recorded == [0, 0, 4, 7, 7]
    dup, loss = ax.collections[:2]
    assert dup.get_label() == "sent, not recorded: sent again, so duplicates"
    assert loss.get_label() == "recorded, not sent: lost unless sent later"
    assert len(dup.get_paths()) >= 1 and len(loss.get_paths()) >= 1     # both regions are drawn
    # the crash is marked where it happened, and each step is labelled with who acted
    assert [line.get_xdata()[0] for line in ax.get_lines()[2:]] == [2]
    assert [t.get_text() for t in ax.get_xticklabels()][1] == "2\nrelay 1"


def test_the_divergence_chart_takes_a_function_of_the_state():
    tr = Trace("t")
    tr.add("drain", "send", "", {"sent": 3, "failed": 1, "pushes": 6})
    tr.add("drain", "crash", "", {"pushes_by_drain_1": 2}, kind="crash")
    ax = tr.divergence(lambda st: st.get("pushes"), lambda st: st["sent"] + st["failed"] if "sent" in st else None,
                       ylabel="pushes")
    assert [line.get_ydata().tolist() for line in ax.get_lines()[:2]] == [[6, 6], [4, 4]]
    assert ax.get_ylabel() == "pushes"
    # no loss anywhere: its region has no entry in the legend
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "sent, not recorded: sent again, so duplicates", "sent", "recorded"]
