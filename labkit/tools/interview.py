"""The timed mock interview (notebook 10): a question, its follow-ups one at a time against
the clock, then the model to score yourself against, 0 to 3; the scores are kept per topic
in a local file, so a learner sees which topics to revisit.

* :func:`draw` — the questions of one mock, in order: the capstone card first, then the bank
  shuffled by a seed (or only the questions of one level and/or topic);
* :class:`TerminalMock` — the terminal mock; it reads Enter, ``s``, ``q`` and the scores from
  a stream (the keyboard, or a pipe in a test) and keeps each score the moment it is given;
* :class:`MockInterview` and :func:`mock` — the same in JupyterLab, with buttons, and one
  paragraph of text wherever no widget front end runs;
* :class:`Scores` — the score file (one JSON object a line, in :func:`labkit.core.files.state_dir`
  unless told otherwise); :func:`report` — the average per topic and what to revisit.

Command line (``mock_command``): ``labkit drill mock [--minutes M] [--level L] [--topic T]
[--seed N] [--scores FILE]`` and ``labkit drill mock --report``.
"""

from __future__ import annotations

import json
import random
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Callable

from ..core.errors import LabkitError
from ..core.files import STATE_ENV, state_dir
from ..core.limits import number
from ..core.plots import static_box
from ..core.procs import describe_interrupt, signal_exit_code, signals_deferred
from ..core.server import home_short
from .drill import CAPSTONE_SCALE, Bank, Capstone, _pre, _wrap, capstone_text, load_bank, load_capstone

SCORES_NAME = "drill_scores.jsonl"
MAX_MINUTES = 180
REVISIT_BELOW = 2.0          # a topic whose average is under this is one to revisit
QUESTION_SCALE = ("0  missed it, or said an answer that costs the question",
                  "1  the point of the 20-second answer",
                  "2  the 60-second answer",
                  "3  that, and the follow-ups held up")


# -- what a mock asks ------------------------------------------------------------------------

@dataclass(frozen=True)
class Item:
    """One question of a mock: the capstone card or a card of the bank, with its follow-ups
    (question, answer, notebook) and the model to score against."""

    id: str
    level: str
    topic: str
    notebook: str
    question: str
    follow_ups: tuple[tuple[str, str, str], ...]
    model: str
    scale: tuple[str, ...]

    def head(self) -> str:
        asked = "asked at " if self.id == "capstone" else ""
        return f"{self.id} · {asked}{self.level} · {self.topic} · {self.notebook}"


def _capstone_item(card: Capstone) -> Item:
    rubric = capstone_text(card).split("\n\n", 1)[1]          # the rubric and the deductions
    return Item("capstone", card.asked_at, card.topic, card.notebook, card.question,
                tuple((f.question, f.answer, f.notebook) for f in card.follow_ups),
                rubric, CAPSTONE_SCALE)


def _bank_item(q) -> Item:
    model = "\n".join([_wrap(q.answer_20s, "      ", "20 s  "), _wrap(q.answer_60s, "      ", "60 s  ")])
    return Item(q.id, q.level, q.topic, q.notebook, q.question,
                tuple((f.question, f.answer, q.notebook) for f in q.follow_ups), model, QUESTION_SCALE)


def draw(bank: Bank | None = None, card: Capstone | None = None, *, level: str | None = None,
         topic: str | None = None, seed: int | None = None) -> tuple[list[Item], int]:
    """The questions of one mock, in the order it asks them, and the seed that ordered them
    (the same seed, level and topic give the same order).  Without a level or topic the
    capstone comes first, then the whole bank; with them, only the bank's questions of that
    level and/or topic (an unknown one is a LabkitError naming the choices)."""
    bank = bank or load_bank()
    pool = bank.select(level, topic)
    if not pool:
        topics = sorted({q.topic for q in bank.select(level=level)})
        raise LabkitError(f"No question of the bank is at level {level} on topic {topic}.",
                          f"drop --level, or pick a topic that has {level} questions: {', '.join(topics)}.")
    if seed is None:
        seed = random.SystemRandom().randrange(10_000)
    order = list(pool)
    random.Random(seed).shuffle(order)
    items = [_bank_item(q) for q in order]
    if level is None and topic is None:
        items.insert(0, _capstone_item(card or load_capstone()))
    return items, seed


def check_minutes(minutes, name: str = "minutes") -> float:
    """``minutes`` if it is a number above 0 and at most MAX_MINUTES; otherwise a LabkitError
    that names the fix."""
    return number(name, minutes, low=0, above=True, high=MAX_MINUTES, unit=" minutes", example=20)


class Clock:
    """The mock's time: ``minutes`` from the moment it was made; ``now`` is replaceable (tests)."""

    def __init__(self, minutes: float, now: Callable[[], float] = time.monotonic):
        self.now = now
        self.end = now() + minutes * 60

    def left(self) -> float:
        return max(0.0, self.end - self.now())

    @property
    def up(self) -> bool:
        return self.left() <= 0

    def text(self) -> str:
        s = int(self.left() + 0.999)
        return "time is up" if s <= 0 else f"{s // 60}:{s % 60:02d} left"


# -- the score file --------------------------------------------------------------------------

def scores_path(path: str | Path | None = None) -> Path:
    """The score file: ``path`` if given, else drill_scores.jsonl in labkit's state folder
    (``LABKIT_STATE_DIR`` moves it)."""
    return Path(path).expanduser() if path else state_dir() / SCORES_NAME


@dataclass
class Scores:
    """The scores of every mock, one JSON object a line: when, which question, its topic and
    level, and the score (0-3).  A line is written whole or not at all."""

    path: Path = field(default_factory=scores_path)

    def __post_init__(self) -> None:
        self.path = scores_path(self.path)

    def check(self) -> None:
        """Before a mock starts: the file can be written (labkit's own folder is created)."""
        folder = self.path.parent
        fix = (f"pass --scores a file in a folder you may write to (or set {STATE_ENV} to such "
               "a folder).")
        if folder == state_dir() and not folder.exists():
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise LabkitError(f"labkit's state folder {home_short(folder)} cannot be created "
                                  f"({exc.strerror or exc}).", fix) from None
        if self.path.is_dir():
            raise LabkitError(f"The score file {home_short(self.path)} is a folder.", fix)
        if not folder.is_dir():
            raise LabkitError(f"The folder of the score file, {home_short(folder)}, does not exist.",
                              f"create it (mkdir -p {home_short(folder)}), or {fix}")
        try:
            with open(self.path, "a", encoding="utf-8"):
                pass
        except OSError as exc:
            raise LabkitError(f"The score file {home_short(self.path)} cannot be written "
                              f"({exc.strerror or exc}).", fix) from None

    def add(self, item: Item, score: int) -> dict:
        if score not in range(4):
            raise LabkitError(f"A score of {score!r} is not on the scale.", "score 0, 1, 2 or 3.")
        record = {"at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "question": item.id,
                  "topic": item.topic, "level": item.level, "score": score}
        line = json.dumps(record, ensure_ascii=False) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with signals_deferred(), open(self.path, "a", encoding="utf-8") as f:   # Ctrl-C waits for it
            f.write(line)
        return record

    def read(self) -> tuple[list[dict], int]:
        """The records, and how many lines could not be read (they are left out)."""
        if not self.path.exists():
            return [], 0
        records, bad = [], 0
        for line in self.path.read_text(encoding="utf-8", errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                ok = (isinstance(r, dict) and isinstance(r.get("topic"), str)
                      and isinstance(r.get("score"), int) and r["score"] in range(4))
            except ValueError:
                ok = False
            if ok:
                records.append(r)
            else:
                bad += 1
        return records, bad


def report(path: str | Path | None = None, *, bank: Bank | None = None) -> str:
    """Per topic: how many answers were scored, their average and the latest score; the topics
    to revisit (average under 2, weakest first, with the notebook that teaches each) and the
    ones not practised yet."""
    records, bad = Scores(scores_path(path)).read()
    skipped = f"\n({bad} unreadable line(s) of the score file left out)" if bad else ""
    if not records:
        return ("No mock interview scored yet: `labkit drill mock --minutes 20` (or "
                "interview.mock() in notebook 10) asks the capstone first." + skipped)
    bank = bank or load_bank()
    by_topic: dict[str, list[int]] = {}
    for r in records:
        by_topic.setdefault(r["topic"], []).append(r["score"])
    order = list(bank.topics)
    rows = sorted(by_topic.items(), key=lambda kv: (sum(kv[1]) / len(kv[1]),
                                                    order.index(kv[0]) if kv[0] in order else len(order)))
    n = len(records)
    lines = [f"Mock interviews · {n} answer{'s' * (n != 1)} scored, 0-3 each, on "
             f"{len(by_topic)} topic{'s' * (len(by_topic) != 1)}",
             f"  {'topic':14}{'answers':>8}{'average':>9}{'latest':>8}"]
    for t, s in rows:
        lines.append(f"  {t:14}{len(s):>8}{sum(s) / len(s):>9.1f}{s[-1]:>8}")
    weak = [t for t, s in rows if sum(s) / len(s) < REVISIT_BELOW]
    if weak:
        named = [f"{t} ({bank.topics[t].notebook})" if t in bank.topics else t for t in weak]
        lines.append(_wrap("revisit: " + ", ".join(named), "  ", ""))
    else:
        lines.append(f"revisit: nothing averages under {REVISIT_BELOW:g}; try a level higher (--level)")
    untried = [t for t in order if t not in by_topic]
    if untried:
        lines.append(_wrap("not practised yet: " + ", ".join(untried), "  ", ""))
    return "\n".join(lines) + skipped


# -- the terminal mock -------------------------------------------------------------------------

def _is_tty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class _Stop(Exception):
    """The learner typed q, or the input ended."""


class TerminalMock:
    """A mock interview in a terminal.  ``run()`` asks; every score is kept the moment it is
    typed, so an interruption loses nothing that was scored."""

    def __init__(self, minutes: float = 20, *, level: str | None = None, topic: str | None = None,
                 seed: int | None = None, scores: str | Path | None = None,
                 stdin: IO[str] | None = None, out: IO[str] | None = None,
                 now: Callable[[], float] = time.monotonic, minutes_name: str = "minutes"):
        self.minutes = check_minutes(minutes, minutes_name)
        self.items, self.seed = draw(level=level, topic=topic, seed=seed)
        self.scores = Scores(scores_path(scores))
        self.scores.check()
        self.stdin = stdin or sys.stdin
        self.out = out or sys.stdout
        self.now = now
        self.clock: Clock | None = None
        self.kept: list[tuple[Item, int]] = []

    def say(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def ask(self, prompt: str) -> str:
        self.out.write(prompt + " › ")
        self.out.flush()
        line = self.stdin.readline()
        if not line or not _is_tty(self.stdin):
            self.say()                    # what a keyboard's Enter would have echoed
        if not line:
            raise _Stop
        answer = line.strip().lower()
        if answer == "q":
            raise _Stop
        return answer

    def run(self) -> list[tuple[Item, int]]:
        self.clock = Clock(self.minutes, self.now)
        self.say(f"Mock interview · {self.minutes:g} minutes · seed {self.seed} · scores kept in "
                 f"{home_short(self.scores.path)}")
        self.say(_wrap("Answer each question out loud, as in the room. Enter shows the next follow-up; "
                       "s goes straight to the model answer; q stops (what you scored is kept)."))
        try:
            for n, item in enumerate(self.items, 1):
                self.ask_one(n, item)
                if self.clock.up:
                    self.say("\nTime is up.")
                    break
                if n < len(self.items):
                    self.ask(f"\n{self.clock.text()} · Enter: the next question · q: stop")
        except _Stop:
            pass
        self.say(self.summary())
        return self.kept

    def ask_one(self, n: int, item: Item) -> None:
        self.say(f"\n── {n} · {item.head()} · {self.clock.text()}")
        self.say(_wrap(item.question, "  ", "Q "))
        total = len(item.follow_ups)
        for i, (question, _, notebook) in enumerate(item.follow_ups, 1):
            if self.clock.up:
                self.say("\nTime is up: the model, and your score.")
                break
            if self.ask(f"  Enter: follow-up {i} of {total} · s: the model · q: stop") == "s":
                break
            self.say(f"\n── follow-up {i} of {total} · {notebook} · {self.clock.text()}")
            self.say(_wrap(question, "  ", "  "))
        else:
            self.ask("  Enter: the model to score yourself against · q: stop")
        self.say(f"\n── the model · {self.clock.text()}")
        self.say(item.model)
        self.say("The follow-ups:")
        for question, answer, _ in item.follow_ups:
            self.say(_wrap(question, "        ", "    Q   "))
            self.say(_wrap(answer, "        ", "        "))
        self.say("Score yourself:")
        for line in item.scale:
            self.say("  " + line)
        while True:
            got = self.ask("Your score, 0 to 3 (Enter: no score)")
            if got == "":
                self.say("not scored")
                return
            if got in ("0", "1", "2", "3"):
                self.scores.add(item, int(got))
                self.kept.append((item, int(got)))
                self.say(f"kept: {item.topic} {got}/3 ({item.id})")
                return
            self.say("a score is 0, 1, 2 or 3; Enter leaves this question unscored")

    def summary(self) -> str:
        if not self.kept:
            return "\nNo score given this time."
        mine = " · ".join(f"{i.id} {s}" for i, s in self.kept)
        return "\n" + _wrap(f"This mock: {mine}. `labkit drill mock --report` shows every topic and "
                            f"what to revisit; --seed {self.seed} asks the same questions again.")


# -- the notebook mock -------------------------------------------------------------------------

class MockInterview:
    """The mock interview as a widget: *next follow-up* reveals one at a time, *show the model*
    shows what to score against, the score buttons keep 0-3 for the question's topic, *next
    question* draws on.  The time left shows on every step.  ``.box`` is the widget; its text
    form (GitHub, handouts, nbval) is :meth:`describe`."""

    def __init__(self, minutes: float = 20, *, level: str | None = None, topic: str | None = None,
                 seed: int | None = None, scores: str | Path | None = None,
                 now: Callable[[], float] = time.monotonic):
        import ipywidgets as w

        self.minutes = check_minutes(minutes)
        self.items, self.seed = draw(level=level, topic=topic, seed=seed)
        self.scores = Scores(scores_path(scores))
        self.clock = Clock(self.minutes, now)
        self.index, self.shown, self.model_shown = 0, 0, False
        self.kept: list[tuple[Item, int]] = []
        self.clock_label = w.Label()
        self.card = w.HTML()
        self.follow_button = w.Button(description="next follow-up", button_style="info")
        self.model_button = w.Button(description="show the model")
        self.score_buttons = [w.Button(description=str(n), layout={"width": "48px"}) for n in range(4)]
        self.next_button = w.Button(description="next question")
        self.follow_button.on_click(lambda _: self.reveal())
        self.model_button.on_click(lambda _: self.show_model())
        for n, b in enumerate(self.score_buttons):
            b.on_click(lambda _, n=n: self.score(n))
        self.next_button.on_click(lambda _: self.next_question())
        controls = w.HBox([self.follow_button, self.model_button, w.Label("score:"), *self.score_buttons,
                           self.next_button, self.clock_label])
        self.box = static_box([controls, self.card], self.describe)
        self._render()

    @property
    def current(self) -> Item | None:
        return self.items[self.index] if self.index < len(self.items) else None

    def describe(self) -> str:
        """One line (a widget's text form is cut at 110 characters): what the mock asks now."""
        item = self.current or self.items[-1]
        return (f"Mock interview: {self.minutes:g} min · {item.id} ({item.level}, {item.topic}) · "
                f"{len(item.follow_ups)} follow-ups one at a time, then score 0-3")

    def reveal(self) -> None:
        """The next follow-up (when the time is up: the model instead)."""
        item = self.current
        if item is None or self.model_shown:
            return
        if self.clock.up:
            self.show_model()
            return
        self.shown = min(self.shown + 1, len(item.follow_ups))
        self._render()

    def show_model(self) -> None:
        self.model_shown = True
        self._render()

    def score(self, n: int) -> dict | None:
        """Keep ``n`` (0-3) for the current question's topic; shows the model if it was not."""
        item = self.current
        if item is None or any(i is item for i, _ in self.kept):
            return None
        self.model_shown = True
        record = self.scores.add(item, n)
        self.kept.append((item, n))
        self._render()
        return record

    def next_question(self) -> None:
        if self.current is not None:
            self.index += 1
            self.shown, self.model_shown = 0, False
        self._render()

    def text(self) -> str:
        item = self.current
        if item is None:
            return "Every question of this mock was asked. interview.report() shows your topics."
        lines = [f"{self.index + 1} · {item.head()} · {self.clock.text()}", _wrap(item.question, "  ", "Q ")]
        for i, (question, _, notebook) in enumerate(item.follow_ups[:self.shown], 1):
            lines.append(_wrap(f"{question} ({notebook})", "        ", f"  {i:>2}.  "))
        if self.model_shown:
            lines += ["", "The model:", item.model, "The follow-ups:"]
            for question, answer, _ in item.follow_ups:
                lines += [_wrap(question, "        ", "    Q   "), _wrap(answer, "        ", "        ")]
            lines += ["Score yourself:"] + ["  " + s for s in item.scale]
        scored = [s for i, s in self.kept if i is item]
        if scored:
            lines.append(f"kept: {item.topic} {scored[0]}/3")
        if self.clock.up:
            lines.append("Time is up: score this one, and stop there.")
        return "\n".join(lines)

    def _render(self) -> None:
        item = self.current
        done = item is None
        scored = not done and any(i is item for i, _ in self.kept)
        self.clock_label.value = self.clock.text()
        self.follow_button.disabled = done or self.model_shown or self.shown >= len(item.follow_ups)
        self.model_button.disabled = done or self.model_shown
        for b in self.score_buttons:
            b.disabled = done or not self.model_shown or scored
        self.next_button.disabled = done or self.clock.up
        self.card.value = _pre(self.text())


def mock(minutes: float = 20, *, level: str | None = None, topic: str | None = None,
         seed: int | None = None, scores: str | Path | None = None) -> MockInterview:
    """Show the mock interview widget (live kernel); prints one line."""
    from IPython.display import display

    interview = MockInterview(minutes, level=level, topic=topic, seed=seed, scores=scores)
    print(f"No widget below? In a terminal: labkit drill mock --minutes {interview.minutes:g}")
    display(interview.box)
    return interview


# -- command line: labkit drill mock -----------------------------------------------------------

def mock_command(*, minutes: float = 20, level: str | None = None, topic: str | None = None,
                 seed: int | None = None, scores: str | None = None, show_report: bool = False,
                 stdin: IO[str] | None = None, out: IO[str] | None = None) -> int:
    """``labkit drill mock [--minutes M] [--level L] [--topic T] [--seed N] [--scores FILE]``
    runs a mock; ``--report`` prints the averages per topic instead.  Ctrl-C stops it
    cleanly: the scores given so far are kept (exit 130)."""
    out = out or sys.stdout
    if show_report:
        path = scores_path(scores)
        out.write(report(path) + f"\nscores: {home_short(path)}\n")
        return 0
    session = TerminalMock(minutes, level=level, topic=topic, seed=seed, scores=scores,
                           stdin=stdin, out=out, minutes_name="--minutes")
    try:
        session.run()
    except KeyboardInterrupt as exc:
        kept = len(session.kept)
        out.write(f"\n{describe_interrupt(exc)}: {kept} score{'s' * (kept != 1)} kept in "
                  f"{home_short(session.scores.path)}; `labkit drill mock --report` shows them\n")
        out.flush()
        return signal_exit_code(exc)
    return 0


__all__ = ["Clock", "Item", "MockInterview", "Scores", "TerminalMock", "draw", "mock",
           "mock_command", "report", "scores_path"]
