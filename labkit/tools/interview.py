"""The timed mock interview (notebook 20): a question, its follow-ups one at a time against
the clock, then the model to score yourself against — a bank question 0 to 3, the capstone
0 to 4 by its rubric; the scores are kept in a local file, so a learner sees which topics to
revisit.

* :func:`draw` — the questions of one mock, in order: the capstone card first, then the bank
  shuffled by a seed, without the bank's questions that ask a capstone follow-up again (or
  only the questions of one level and/or topic);
* :class:`Clock` — the time left, the two-minute warning and the time-up, on a time source
  a test controls;
* :class:`TerminalMock` — the terminal mock; it reads Enter, ``s``, ``q`` and the scores from
  a stream (the keyboard, or a pipe in a test) and keeps each score the moment it is given.
  While it waits for a key the clock ticks: redrawn every second on a terminal, a line a
  minute otherwise; when the time runs out the question ends then, not at the next key;
* :class:`MockInterview` and :func:`mock` — the same in JupyterLab, with buttons and a clock
  label a thread ticks every second while the mock runs, and one paragraph of text wherever
  no widget front end runs;
* :class:`Scores` — the score file (one JSON object a line, in :func:`labkit.core.files.state_dir`
  unless told otherwise); :func:`report` — the average per topic and what to revisit.

Command line (``mock_command``): ``labkit drill mock [--minutes M] [--level L] [--topic T]
[--seed N] [--scores FILE]`` and ``labkit drill mock --report``.
"""

from __future__ import annotations

import json
import os
import random
import select
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO

from ..core.errors import LabkitError
from ..core.files import STATE_ENV, state_dir
from ..core.limits import number
from ..core.plots import static_box
from ..core.procs import describe_interrupt, signal_exit_code, signals_deferred
from ..core.server import home_short
from .drill import (
    CAPSTONE_SCALE,
    LEVELS,
    Bank,
    Capstone,
    _pre,
    _wrap,
    capstone_model,
    evidence_text,
    load_bank,
    load_capstone,
)

SCORES_NAME = "drill_scores.jsonl"
MAX_MINUTES = 180
REVISIT_BELOW = 2.0          # a topic whose average (0-3) is under this is one to revisit
TICK_SECONDS = 1.0           # how often the clock is redrawn while the mock waits
WARN_SECONDS = 120           # the warning comes with two minutes left
WARNING = "Two minutes left: bring this answer to its point."
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
    model = "\n".join([_wrap(card.answer_20s, "      ", "20 s  "), capstone_model(card)])
    return Item("capstone", card.asked_at, card.topic, card.notebook, card.question,
                tuple((f.question, f.answer, f.notebook) for f in card.follow_ups),
                model, CAPSTONE_SCALE)


def _bank_item(q) -> Item:
    model = "\n".join([_wrap(q.answer_20s, "      ", "20 s  "), _wrap(q.answer_60s, "      ", "60 s  "),
                       evidence_text(q)])
    return Item(q.id, q.level, q.topic, q.notebook, q.question,
                tuple((f.question, f.answer, q.notebook) for f in q.follow_ups), model, QUESTION_SCALE)


def draw(bank: Bank | None = None, card: Capstone | None = None, *, level: str | None = None,
         topic: str | None = None, seed: int | None = None) -> tuple[list[Item], int]:
    """The questions of one mock, in the order it asks them, and the seed that ordered them
    (the same seed, level and topic give the same order).  Without a level or topic the
    capstone comes first, then the bank less the questions whose ``same_as`` names a
    capstone follow-up (the capstone asks those already); with them, only the bank's
    questions of that level and/or topic (an unknown one is a LabkitError naming the
    choices)."""
    bank = bank or load_bank()
    pool = bank.select(level, topic)
    if not pool:
        topics = sorted({q.topic for q in bank.select(level=level)})
        raise LabkitError(f"No question of the bank is at level {level} on topic {topic}.",
                          f"drop --level, or pick a topic that has {level} questions: {', '.join(topics)}.")
    if seed is None:
        seed = random.SystemRandom().randrange(10_000)
    with_capstone = level is None and topic is None
    order = [q for q in pool if not (with_capstone and q.same_as)]
    random.Random(seed).shuffle(order)
    items = [_bank_item(q) for q in order]
    if with_capstone:
        items.insert(0, _capstone_item(card or load_capstone()))
    return items, seed


def check_minutes(minutes, name: str = "minutes") -> float:
    """``minutes`` if it is a number above 0 and at most MAX_MINUTES; otherwise a LabkitError
    that names the fix."""
    return number(name, minutes, low=0, above=True, high=MAX_MINUTES, unit=" minutes", example=20)


class Clock:
    """The mock's time: ``minutes`` from the moment it was made; ``now`` is replaceable (tests).
    A mock longer than two minutes is warned once when two are left (:meth:`news`)."""

    def __init__(self, minutes: float, now: Callable[[], float] = time.monotonic):
        self.now = now
        self.end = now() + minutes * 60
        self.warn = minutes * 60 > WARN_SECONDS
        self.told: set[str] = set()

    def news(self) -> str | None:
        """"up" the first time the time is found up, "warning" the first time two minutes or
        less are left; each is told once, and None otherwise."""
        left = self.left()
        new = "up" if left <= 0 else "warning" if self.warn and left <= WARN_SECONDS else None
        if new is None or new in self.told:
            return None
        self.told.add(new)
        return new

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
    level, the score and the top of its scale (``out_of``: 3 for a bank question, 4 for the
    capstone).  A line is written whole or not at all."""

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
        top = len(item.scale) - 1
        if score not in range(top + 1):
            raise LabkitError(f"A score of {score!r} is not on the scale of {item.id}.", f"score 0 to {top}.")
        record = {"at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "question": item.id,
                  "topic": item.topic, "level": item.level, "score": score, "out_of": top}
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
                      and isinstance(r.get("score"), int) and r["score"] in range(_out_of(r) + 1))
            except ValueError:
                ok = False
            if ok:
                records.append(r)
            else:
                bad += 1
        return records, bad


def _out_of(record: dict) -> int:
    """The top of a record's scale: written since the capstone is scored 0-4; before, the
    capstone's 0-3 meant the same levels up to senior."""
    top = record.get("out_of")
    return top if isinstance(top, int) and top in (3, 4) else 4 if record.get("question") == "capstone" else 3


def report(path: str | Path | None = None, *, bank: Bank | None = None) -> str:
    """Per topic: how many bank answers were scored (0-3), their average and the latest score;
    the capstone's own line (0-4, the level reached); the topics to revisit (average under 2,
    weakest first, with the notebook that teaches each) and the ones not practised yet."""
    records, bad = Scores(scores_path(path)).read()
    skipped = f"\n({bad} unreadable line(s) of the score file left out)" if bad else ""
    if not records:
        return ("No mock interview scored yet: `labkit drill mock --minutes 20` (or "
                "interview.mock() in notebook 20) asks the capstone first." + skipped)
    bank = bank or load_bank()
    capstone = [r["score"] for r in records if r.get("question") == "capstone"]
    records = [r for r in records if r.get("question") != "capstone"]
    rows = _topic_rows(records, list(bank.topics))
    n = len(records)
    lines = [f"Mock interviews · {n} answer{'s' * (n != 1)} scored, 0-3 each, on "
             f"{len(rows)} topic{'s' * (len(rows) != 1)}",
             f"  {'topic':14}{'answers':>8}{'average':>9}{'latest':>8}"]
    for t, s in rows:
        lines.append(f"  {t:14}{len(s):>8}{sum(s) / len(s):>9.1f}{s[-1]:>8}")
    if capstone:
        lines.append(_capstone_line(capstone))
    return "\n".join(lines + _advice(rows, bank)) + skipped


def _topic_rows(records: list[dict], order: list[str]) -> list[tuple[str, list[int]]]:
    """(topic, its scores in the order given) per topic, weakest average first; a tie goes in
    the bank's order of topics (``order``), topics not in the bank last."""
    by_topic: dict[str, list[int]] = {}
    for r in records:
        by_topic.setdefault(r["topic"], []).append(r["score"])
    return sorted(by_topic.items(), key=lambda kv: (sum(kv[1]) / len(kv[1]),
                                                    order.index(kv[0]) if kv[0] in order else len(order)))


def _capstone_line(capstone: list[int]) -> str:
    """The capstone's line of the report: how many scored, the latest and the best, with their levels."""
    level_names = ("none",) + LEVELS
    return (f"  capstone, 0-4: {len(capstone)} scored, latest {capstone[-1]} "
            f"({level_names[capstone[-1]]}), best {max(capstone)} ({level_names[max(capstone)]})")


def _advice(rows: list[tuple[str, list[int]]], bank: Bank) -> list[str]:
    """The report's last lines: the topics to revisit (with the notebook that teaches each),
    or a level higher to try, and the topics not practised yet."""
    lines = []
    weak = [t for t, s in rows if sum(s) / len(s) < REVISIT_BELOW]
    if weak:
        named = [f"{t} ({bank.topics[t].notebook})" if t in bank.topics else t for t in weak]
        lines.append(_wrap("revisit: " + ", ".join(named), "  ", ""))
    elif rows:
        lines.append(f"revisit: nothing averages under {REVISIT_BELOW:g}; try a level higher (--level)")
    practised = {t for t, _ in rows}
    untried = [t for t in bank.topics if t not in practised]
    if untried:
        lines.append(_wrap("not practised yet: " + ", ".join(untried), "  ", ""))
    return lines


# -- the terminal mock -------------------------------------------------------------------------

def _is_tty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _fileno(stream) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, ValueError, OSError):
        return None


class _Stop(Exception):
    """The learner typed q, or the input ended."""


class _TimeUp(Exception):
    """The mock's time ran out while it waited for a key."""


class TerminalMock:
    """A mock interview in a terminal.  ``run()`` asks; every score is kept the moment it is
    typed, so an interruption loses nothing that was scored.  While it waits for a key the
    clock ticks every ``tick`` seconds (on a terminal the time left is redrawn in place,
    otherwise a line is written each minute); the two-minute warning and the time-up come
    when they happen.  A stream without a file descriptor (a test's StringIO) is read at
    once, so the clock is only read between keys."""

    def __init__(self, minutes: float = 20, *, level: str | None = None, topic: str | None = None,
                 seed: int | None = None, scores: str | Path | None = None,
                 stdin: IO[str] | None = None, out: IO[str] | None = None,
                 now: Callable[[], float] = time.monotonic, minutes_name: str = "minutes",
                 tick: float = TICK_SECONDS):
        self.minutes = check_minutes(minutes, minutes_name)
        self.items, self.seed = draw(level=level, topic=topic, seed=seed)
        self.scores = Scores(scores_path(scores))
        self.scores.check()
        self.stdin = stdin or sys.stdin
        self.out = out or sys.stdout
        self.now = now
        self.tick = tick
        self.clock: Clock | None = None
        self.kept: list[tuple[Item, int]] = []
        self._pending = b""
        self._prompt = ""
        self._minute: int | None = None

    def say(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()

    @property
    def timer(self) -> Clock:
        """The clock of the interview under way (run() starts it)."""
        if self.clock is None:
            raise LabkitError("The mock interview has not started: its clock is not running.",
                              "call run(): it starts the clock, then asks the questions.")
        return self.clock

    def _stamp(self) -> str:
        return f"[{self.timer.text():>10}] "

    def ask(self, prompt: str, *, timed: bool = True) -> str:
        """Write ``prompt`` and read the answer; ``timed``: with the time left in front, the
        clock ticking while it waits, and _TimeUp when the time runs out."""
        if timed and self.timer.up:
            raise _TimeUp
        lead = prompt[:len(prompt) - len(prompt.lstrip("\n"))]
        self._prompt = prompt[len(lead):] + " › "
        self.out.write(lead + (self._stamp() if timed else "") + self._prompt)
        self.out.flush()
        line = self._read_line(timed)
        if not line or not _is_tty(self.stdin):
            self.say()                    # what a keyboard's Enter would have echoed
        if not line:
            raise _Stop
        answer = line.strip().lower()
        if answer == "q":
            raise _Stop
        return answer

    def _read_line(self, timed: bool) -> str:
        """One line of input ('' when it ended).  From a file descriptor it is read with a
        timeout of one tick, so that the clock ticks in between."""
        fd = _fileno(self.stdin)
        if fd is None:
            return self.stdin.readline()
        while b"\n" not in self._pending:
            wait = None
            if timed:
                self._tick()
                wait = max(0.0, min(self.tick, self.timer.left()))
            if select.select([fd], [], [], wait)[0]:
                chunk = os.read(fd, 4096)
                if not chunk:
                    rest, self._pending = self._pending, b""
                    return rest.decode(errors="replace")
                self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return line.decode(errors="replace") + "\n"

    def _tick(self) -> None:
        """The clock, once a tick while a timed answer is awaited."""
        news = self.timer.news()
        if news == "up":
            raise _TimeUp
        tty = _is_tty(self.out)
        minute = int(self.timer.left() // 60)
        if news == "warning" or (not tty and self._minute is not None and minute < self._minute):
            self.out.write(f"\n{WARNING if news == 'warning' else self.timer.text()}\n{self._stamp()}{self._prompt}")
        elif tty:                         # the time left, redrawn where the prompt began
            self.out.write(f"\0337\r{self._stamp()}\0338")
        self._minute = minute
        self.out.flush()

    def run(self) -> list[tuple[Item, int]]:
        self.clock = Clock(self.minutes, self.now)
        self.say(f"Mock interview · {self.minutes:g} minutes · seed {self.seed} · scores kept in "
                 f"{home_short(self.scores.path)}")
        self.say(_wrap("Answer each question out loud, as in the room. Enter shows the next follow-up; "
                       "s goes straight to the model answer; q stops (what you scored is kept)."))
        try:
            for n, item in enumerate(self.items, 1):
                self.ask_one(n, item)
                if self.timer.up:
                    raise _TimeUp
                if n < len(self.items):
                    self.ask("\nEnter: the next question · q: stop")
        except _TimeUp:
            self.say("\nTime is up.")
        except _Stop:
            pass
        self.say(self.summary())
        return self.kept

    def ask_one(self, n: int, item: Item) -> None:
        """One question: its follow-ups while the time lasts (the time-up ends it then), the
        model, and the score, which waits for the learner however late it is."""
        self.say(f"\n── {n} · {item.head()} · {self.timer.text()}")
        self.say(_wrap(item.question, "  ", "Q "))
        total = len(item.follow_ups)
        try:
            for i, (question, _, notebook) in enumerate(item.follow_ups, 1):
                if self.ask(f"  Enter: follow-up {i} of {total} · s: the model · q: stop") == "s":
                    break
                self.say(f"\n── follow-up {i} of {total} · {notebook} · {self.timer.text()}")
                self.say(_wrap(question, "  ", "  "))
            else:
                self.ask("  Enter: the model to score yourself against · q: stop")
        except _TimeUp:
            self.say("\nTime is up: the model, and your score.")
        self.say(f"\n── the model · {self.timer.text()}")
        self.say(item.model)
        self.say("The follow-ups:")
        for question, answer, _ in item.follow_ups:
            self.say(_wrap(question, "        ", "    Q   "))
            self.say(_wrap(answer, "        ", "        "))
        self.say("Score yourself:")
        for line in item.scale:
            self.say("  " + line)
        top = len(item.scale) - 1
        while True:
            got = self.ask(f"Your score, 0 to {top} (Enter: no score)", timed=False)
            if got == "":
                self.say("not scored")
                return
            if got.isdigit() and int(got) <= top:
                self.scores.add(item, int(got))
                self.kept.append((item, int(got)))
                self.say(f"kept: {item.topic} {got}/{top} ({item.id})")
                return
            self.say(f"a score is {', '.join(map(str, range(top)))} or {top}; Enter leaves this question unscored")

    def summary(self) -> str:
        if not self.kept:
            return "\nNo score given this time."
        mine = " · ".join(f"{i.id} {s}" for i, s in self.kept)
        return "\n" + _wrap(f"This mock: {mine}. `labkit drill mock --report` shows every topic and "
                            f"what to revisit; --seed {self.seed} asks the same questions again.")


# -- the notebook mock -------------------------------------------------------------------------

class MockInterview:
    """The mock interview as a widget: *next follow-up* reveals one at a time, *show the model*
    shows what to score against, the score buttons keep the score (0-3, the capstone 0-4),
    *next question* draws on.  :meth:`start` (which :func:`mock` calls) runs a thread that
    ticks the clock label every ``tick`` seconds, warns at two minutes and, when the time is
    up, ends the current question; it stops when the mock ends or :meth:`close` closes the
    widget.  ``.box`` is the widget; its text form (GitHub, handouts, nbval) is
    :meth:`describe`."""

    def __init__(self, minutes: float = 20, *, level: str | None = None, topic: str | None = None,
                 seed: int | None = None, scores: str | Path | None = None,
                 now: Callable[[], float] = time.monotonic, tick: float = TICK_SECONDS):
        import ipywidgets as w

        self.minutes = check_minutes(minutes)
        self.items, self.seed = draw(level=level, topic=topic, seed=seed)
        self.scores = Scores(scores_path(scores))
        self.clock = Clock(self.minutes, now)
        self.tick_seconds = tick
        self.warned = False
        self._halt = threading.Event()
        self.ticker: threading.Thread | None = None
        self.index, self.shown, self.model_shown = 0, 0, False
        self.kept: list[tuple[Item, int]] = []
        self.clock_label = w.Label()
        self.card = w.HTML()
        self.follow_button = w.Button(description="next follow-up", button_style="info")
        self.model_button = w.Button(description="show the model")
        self.score_buttons = [w.Button(description=str(n), layout={"width": "48px"}) for n in range(5)]
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

    @property
    def finished(self) -> bool:
        """Every question asked, or the time up: the clock has nothing more to do."""
        return self.current is None or self.clock.up

    def tick(self) -> None:
        """One tick of the clock: the label; the two-minute warning; at time-up the current
        question ends (its model shows, and no next question)."""
        news = self.clock.news()
        if news == "warning":
            self.warned = True
        elif news == "up" and self.current is not None:
            self.model_shown = True
        if news:
            self._render()
        else:
            self.clock_label.value = self.clock.text()

    def start(self) -> None:
        """Tick the clock every second in a thread of its own until the mock ends."""
        if self.ticker is None or not self.ticker.is_alive():
            self._halt.clear()
            self.ticker = threading.Thread(target=self._run_clock, name="labkit-mock-clock", daemon=True)
            self.ticker.start()

    def _run_clock(self) -> None:
        while not self._halt.wait(self.tick_seconds):
            if self.box.comm is None:               # the widget was closed
                return
            self.tick()
            if self.finished:
                return

    def stop(self) -> None:
        """Stop the clock's thread (it ends by itself when the mock does)."""
        self._halt.set()
        if self.ticker is not None and self.ticker is not threading.current_thread():
            self.ticker.join(timeout=5)

    def close(self) -> None:
        """Stop the clock and close the widget."""
        self.stop()
        self.box.close()

    def describe(self) -> str:
        """One line (at most 96 characters, the width of every printed line): what the mock asks now."""
        item = self.current or self.items[-1]
        return (f"Mock interview: {self.minutes:g} min · {item.id} ({item.level}, {item.topic}) · "
                f"{len(item.follow_ups)} follow-ups, one at a time; score 0-{len(item.scale) - 1}")

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
        """Keep ``n`` (0-3, the capstone 0-4) for the current question; shows the model if it
        was not."""
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
            lines.append(f"kept: {item.topic} {scored[0]}/{len(item.scale) - 1}")
        if self.clock.up:
            lines.append("Time is up: score this one, and stop there.")
        elif self.warned:
            lines.append(WARNING)
        return "\n".join(lines)

    def _render(self) -> None:
        item = self.current
        done = item is None
        scored = not done and any(i is item for i, _ in self.kept)
        self.clock_label.value = self.clock.text()
        self.follow_button.disabled = item is None or self.model_shown or self.shown >= len(item.follow_ups)
        self.model_button.disabled = done or self.model_shown
        for n, b in enumerate(self.score_buttons):
            b.layout.display = None if item is None or n < len(item.scale) else "none"
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
    interview.start()
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
