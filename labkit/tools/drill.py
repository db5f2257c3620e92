"""The interview drill (notebook 20): the question bank, the answers that cost you the
question, flashcards, and self-check exercises run on the real server.

Everything here prints as plain text (GitHub, nbval, handouts) and, in JupyterLab, also
comes as a small widget:

* :func:`load_bank` reads ``data/questions.yaml``; :func:`validate_bank` lists what is
  wrong with it (the test suite and ``labkit drill check`` use it);
* :func:`print_study_sheet` prints the static study sheet, :func:`flashcards` shows the
  reveal / next widget;
* :func:`load_costly` reads ``data/costly_answers.yaml``; :func:`print_quiz` prints the
  quiz (its key only when asked for), :func:`quiz` is the pick-an-answer widget (each choice
  a block of large text beside its letter button, the choices shuffled per attempt),
  :func:`grade_quiz` marks a dict of answers;
* :func:`load_capstone` reads ``data/capstone.yaml``, the seed question with a layered
  answer, a rubric by level, deductions and follow-ups; :func:`capstone_text` prints it
  (the timed mock interview that asks it is :mod:`labkit.tools.interview`);
* :func:`check_claim`, :func:`check_report_count` and :func:`check_reaper` run the
  reader's SQL in a scratch schema with real sessions and say what is right and wrong.

Command line (``drill_command``): ``labkit drill sheet|quiz|capstone|check``.
"""

from __future__ import annotations

import html
import random
import re
import sys
import textwrap
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.errors import LabkitError
from ..core.files import data_file
from ..core.lab import Lab, read_sql
from ..core.plots import static_box
from ..core.queries import query as named_query  # ``query`` is the reader's SQL below
from ..core.sessions import Sessions
from ..core.text import fill
from .exercises import Check
from .exercises import Solo as _Solo
from .exercises import bind as _bind
from .exercises import scratch as _scratch

if TYPE_CHECKING:
    import ipywidgets

DATA = data_file()
QUESTIONS_FILE = DATA / "questions.yaml"
COSTLY_FILE = DATA / "costly_answers.yaml"
CAPSTONE_FILE = DATA / "capstone.yaml"

LEVELS = ("junior", "middle", "senior", "principal")
# The workbook's notebooks the bank may name, by file name; a test checks the names against
# the real files.
NOTEBOOKS = (
    "00_start_here.ipynb",
    "01_one_lock_three_policies.ipynb",
    "02_the_convoy.ipynb",
    "03_claim_mark_commit.ipynb",
    "04_leases_and_reapers.ipynb",
    "05_indexes_ordering_batches.ipynb",
    "06_outbox_relay.ipynb",
    "07_notification_drain.ipynb",
    "08_fencing_tokens.ipynb",
    "09_relay_vs_drain.ipynb",
    "10_the_mvcc_horizon.ipynb",
    "11_failures_heartbeats_schedules.ipynb",
    "12_wakeups_and_poolers.ipynb",
    "13_outbox_cursors_and_order.ipynb",
    "14_change_data_capture.ipynb",
    "15_outbox_size_and_inbox.ipynb",
    "16_how_fast.ipynb",
    "17_prove_it.ipynb",
    "18_the_incident_file.ipynb",
    "19_when_the_server_goes_away.ipynb",
    "20_interview_drill.ipynb",
    "21_other_engines.ipynb",
)
# every notebook with a lesson needs a question: all but 00 and 20 (about the workbook itself)
# and 17 (it proves with torture runs what 03-08 teach)
MUST_COVER = tuple(n for n in NOTEBOOKS
                   if n not in ("00_start_here.ipynb", "20_interview_drill.ipynb", "17_prove_it.ipynb"))
MIN_QUESTIONS = 30
MIN_PER_LEVEL = 4
WIDTH = 88
QUESTION_FIELDS = ("id", "level", "topic", "notebook", "question", "answer_20s", "answer_60s",
                   "follow_ups", "shown_in")
EVIDENCE_FIELDS = ("notebook", "section", "shows")
# What a candidate says names no notebook and no part of this workbook (the evidence lives in
# shown_in), and speaks in the first person without an invented biography: the rule is
# written out in the header of questions.yaml.
NOT_SAYABLE = re.compile(r"\bnotebooks?\b|\bworkbook\b|\bthe lab\b|§|\b\d\d_[a-z0-9_]+\.ipynb", re.I)
FIRST_PERSON = re.compile(r"\b(?:I|I'd|I'll|I'm|I've|[Mm]e|[Mm]y|[Ww]e|[Ww]e'd|[Ww]e'll|[Ww]e're|[Ww]e've|[Uu]s|[Oo]ur)\b")
BIOGRAPHY = re.compile(r"\b(?:in|at) my (?:last|previous|current|old) (?:job|system|company|team|role|project)\b"
                       r"|\b(?:I|we) once\b|\bwhen I worked\b", re.I)
COSTLY_FIELDS = ("id", "topic", "notebook", "statement", "choices", "answer", "why")
LETTERS = "abcd"


# -- the data ------------------------------------------------------------------------------

@dataclass(frozen=True)
class FollowUp:
    question: str
    answer: str


@dataclass(frozen=True)
class Evidence:
    """Where the workbook shows an answer on a real server: a notebook, the heading of its
    section and (optionally) what it shows there."""

    notebook: str
    section: str
    shows: str = ""

    def __str__(self) -> str:
        return f"{self.notebook[:2]} § {self.section}" + (f": {self.shows}" if self.shows else "")


@dataclass(frozen=True)
class Question:
    id: str
    level: str
    topic: str
    notebook: str
    question: str
    answer_20s: str
    answer_60s: str
    follow_ups: tuple[FollowUp, ...]
    shown_in: tuple[Evidence, ...] = ()
    same_as: str | None = None          # the id of the capstone follow-up it duplicates


@dataclass(frozen=True)
class Topic:
    key: str
    title: str
    notebook: str


@dataclass
class Bank:
    topics: dict[str, Topic]
    questions: list[Question]

    def __len__(self) -> int:
        return len(self.questions)

    def __getitem__(self, qid: str) -> Question:
        for q in self.questions:
            if q.id == qid:
                return q
        raise KeyError(qid)

    def __repr__(self) -> str:
        return f"Bank({len(self.questions)} questions, {len(self.topics)} topics)"

    def select(self, level: str | None = None, topic: str | None = None) -> list[Question]:
        """The questions of one level and/or topic (None: all), in bank order."""
        if level is not None and level not in LEVELS:
            raise LabkitError(f"There is no level {level!r}.", f"use one of {', '.join(LEVELS)}.")
        if topic is not None and topic not in self.topics:
            raise LabkitError(f"There is no topic {topic!r}.",
                              f"use one of {', '.join(self.topics)}.")
        return [q for q in self.questions
                if (level is None or q.level == level) and (topic is None or q.topic == topic)]


@dataclass(frozen=True)
class Costly:
    id: str
    topic: str
    notebook: str
    statement: str
    choices: tuple[str, ...]
    answer: str
    why: str


def _read_yaml(path: Path) -> dict:
    import yaml

    if not path.exists():
        raise LabkitError(f"The drill's data file {path} is missing.",
                          "restore it in data/, or reinstall labkit (the file ships in labkit/data/).")
    try:
        # libyaml's safe loader where PyYAML was built with it (ten times faster), else PyYAML's own
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise LabkitError(f"{path.name} is not valid YAML ({exc}).",
                          "fix the line the parser names; `labkit drill check` re-checks it.") from None
    return data if isinstance(data, dict) else {}


def _blank(value) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _check_notebook(where: str, name, problems: list[str]) -> None:
    if _blank(name):
        return
    if not re.fullmatch(r"\d\d_[a-z0-9_]+\.ipynb", str(name)):
        problems.append(f"{where}: notebook {name!r} is not a notebook file name (NN_name.ipynb)")
    elif name not in NOTEBOOKS:
        problems.append(f"{where}: notebook {name!r} is not one of the workbook's notebooks")


def sayable_problems(where: str, text: str) -> list[str]:
    """Why ``text`` is not an answer a candidate can say out loud (empty list: it is): it names
    a notebook or the workbook, speaks in no first person (I, I'd, my, we, our, ...), or
    invents a biography ("in my last job")."""
    problems = []
    named = NOT_SAYABLE.search(text)
    if named:
        problems.append(f"{where} names {named.group(0)!r}: say the point, and put the evidence in shown_in")
    if not FIRST_PERSON.search(text):
        problems.append(f"{where} is not in the first person: say what I would do or claim (I, I'd, we, my ...)")
    invented = BIOGRAPHY.search(text)
    if invented:
        problems.append(f"{where} invents a biography ({invented.group(0)!r}): give the reasoning instead")
    return problems


def _check_unnamed(where: str, text, problems: list[str]) -> None:
    """A follow-up's answer is said too: it names no notebook (its evidence is named apart)."""
    named = NOT_SAYABLE.search(text) if isinstance(text, str) else None
    if named:
        problems.append(f"{where} names {named.group(0)!r}: say the point; the evidence is named apart")


def _check_evidence(where: str, shown, problems: list[str]) -> None:
    if not isinstance(shown, list):
        problems.append(f"{where}: shown_in must be a list of {{notebook, section, shows}}")
        return
    for j, e in enumerate(shown, 1):
        if not isinstance(e, dict) or _blank(e.get("notebook")) or _blank(e.get("section")):
            problems.append(f"{where}: shown_in {j} needs a notebook and a section")
            continue
        if set(e) - set(EVIDENCE_FIELDS):
            problems.append(f"{where}: shown_in {j} has unknown field(s) {', '.join(sorted(set(e) - set(EVIDENCE_FIELDS)))}")
        _check_notebook(f"{where}: shown_in {j}", e["notebook"], problems)


def _broken(where: str, rules: Iterable[tuple[object, str]]) -> list[str]:
    """The message of each (condition, message) rule whose condition holds, in order, each
    told after ``where`` (when there is one)."""
    return [f"{where}: {message}" if where else message for failed, message in rules if failed]


def validate_bank(data: dict, capstone_follow_ups: Collection[str] = ()) -> list[str]:
    """Everything wrong with the raw contents of questions.yaml (empty list: fine).
    ``capstone_follow_ups``: the ids of the capstone's follow-ups a ``same_as`` may name
    (empty: same_as is checked for its form only)."""
    problems: list[str] = []
    topics = _bank_topics(data, problems)
    questions = data.get("questions") if isinstance(data, dict) else None
    if not isinstance(questions, list):
        return problems + ["no questions: the file needs a `questions:` list"]
    for where, q in _entries(questions, "question", QUESTION_FIELDS, "follow_ups", "q", problems,
                             optional=("same_as",)):
        _check_question(where, q, topics, capstone_follow_ups, problems)
    return problems + _bank_size_problems(questions)


def _bank_topics(data: dict, problems: list[str]) -> dict:
    """The bank's ``topics:`` mapping (empty when there is none), each topic checked for a
    title and a known notebook."""
    topics = data.get("topics") if isinstance(data, dict) else None
    if not isinstance(topics, dict) or not topics:
        problems.append("no topics: the file needs a `topics:` mapping")
        return {}
    for key, t in topics.items():
        if not isinstance(t, dict) or _blank(t.get("title")) or _blank(t.get("notebook")):
            problems.append(f"topic {key}: needs a title and a notebook")
        else:
            _check_notebook(f"topic {key}", t["notebook"], problems)
    return topics


def _check_question(where: str, q: dict, topics: Collection[str], capstone_follow_ups: Collection[str],
                    problems: list[str]) -> None:
    """One question's own checks, after those every entry gets: its level, topic and
    notebook, its answers, its evidence, its same_as and its follow-ups."""
    problems += _broken(where, (
        (not _blank(q.get("level")) and q["level"] not in LEVELS,
         f"level {q.get('level')!r} is not one of {', '.join(LEVELS)}"),
        (not _blank(q.get("topic")) and q["topic"] not in topics,
         f"topic {q.get('topic')!r} is not under `topics:`"),
    ))
    _check_notebook(where, q.get("notebook"), problems)
    _check_answers(where, q, problems)
    if q.get("shown_in"):
        _check_evidence(where, q["shown_in"], problems)
    problems += _same_as_problems(where, q.get("same_as"), capstone_follow_ups)
    _check_follow_ups(where, q.get("follow_ups"), problems)


def _check_answers(where: str, q: dict, problems: list[str]) -> None:
    """A question's texts are text, its 60-second answer is longer than its 20-second one,
    and both answers can be said out loud."""
    rules = [(not _blank(q.get(name)) and not isinstance(q[name], str), f"{name} must be text")
             for name in ("question", "answer_20s", "answer_60s")]
    rules.append((not _blank(q.get("answer_20s")) and not _blank(q.get("answer_60s"))
                  and len(str(q["answer_20s"])) >= len(str(q["answer_60s"])),
                  "the 60-second answer should be longer than the 20-second one"))
    problems += _broken(where, rules)
    for field_name in ("answer_20s", "answer_60s"):
        if isinstance(q.get(field_name), str) and q[field_name].strip():
            problems += sayable_problems(f"{where}: {field_name}", _clean(q[field_name]))


def _same_as_problems(where: str, same, capstone_follow_ups: Collection[str]) -> list[str]:
    """What is wrong with a question's same_as (None: it has none): not an id like f01, or
    (when the capstone's ids are known) not the id of one of its follow-ups."""
    if same is None:
        return []
    if not isinstance(same, str) or not re.fullmatch(r"f\d\d", same):
        return [f"{where}: same_as {same!r} should be the id of a capstone follow-up, like f01"]
    if capstone_follow_ups and same not in capstone_follow_ups:
        return [f"{where}: same_as {same!r} is not the id of a follow-up of capstone.yaml"]
    return []


def _check_follow_ups(where: str, follow, problems: list[str]) -> None:
    """A question's follow-ups: a list, each with a question and an answer that names no
    notebook."""
    if follow and not isinstance(follow, list):
        problems.append(f"{where}: follow_ups must be a list of {{q, a}}")
        return
    for j, f in enumerate(follow or [], 1):
        if not isinstance(f, dict) or _blank(f.get("q")) or _blank(f.get("a")):
            problems.append(f"{where}: follow-up {j} needs a question (q) and an answer (a)")
        else:
            _check_unnamed(f"{where}: follow-up {j}", f["a"], problems)


def _bank_size_problems(questions: list) -> list[str]:
    """The bank as a whole: enough questions, enough at each level, and a question naming
    every notebook that teaches a lesson."""
    valid = [q for q in questions if isinstance(q, dict)]
    per_level = {level: sum(q.get("level") == level for q in valid) for level in LEVELS}
    covered = {q.get("notebook") for q in valid}
    return _broken("", [(len(valid) < MIN_QUESTIONS,
                         f"only {len(valid)} questions; the bank needs at least {MIN_QUESTIONS}")]
                   + [(n < MIN_PER_LEVEL, f"level {level}: {n} question(s); needs at least {MIN_PER_LEVEL}")
                      for level, n in per_level.items()]
                   + [(nb not in covered, f"notebook {nb}: no question names it") for nb in MUST_COVER])


def _entries(items: list, kind: str, fields: tuple[str, ...], list_field: str, id_letter: str,
             problems: list[str], optional: tuple[str, ...] = ()) -> Iterator[tuple[str, dict]]:
    """Each entry of a data file's list that is a mapping, with the name its problems are
    told by ("question q07"), once the checks every entry gets have run; an entry that is
    not a mapping is a problem itself."""
    seen: set[str] = set()
    for i, entry in enumerate(items):
        if not isinstance(entry, dict):
            problems.append(f"{kind} #{i + 1}: is not a mapping")
            continue
        where = f"{kind} {entry.get('id') or '#' + str(i + 1)}"
        _check_entry(entry, where, fields, list_field, id_letter, seen, problems, optional)
        yield where, entry


def _check_entry(entry: dict, where: str, fields: tuple[str, ...], list_field: str, id_letter: str,
                 seen: set, problems: list[str], optional: tuple[str, ...] = ()) -> None:
    """The checks a question and a costly answer share: every field present and non-empty
    (``list_field`` must also hold items), no unknown field (``optional`` ones may be left
    out), an id like q01 / c01 used once."""
    for name in fields:
        if _blank(entry.get(name)) or (name == list_field and not entry.get(name)):
            problems.append(f"{where}: {name} is missing or empty")
    extra = set(entry) - set(fields) - set(optional)
    if extra:
        problems.append(f"{where}: unknown field(s) {', '.join(sorted(extra))}")
    eid = entry.get("id")
    if not _blank(eid):
        if not re.fullmatch(id_letter + r"\d\d+", str(eid)):
            problems.append(f"{where}: id should look like {id_letter}01")
        if eid in seen:
            problems.append(f"{where}: the id is used twice")
        seen.add(eid)


def validate_costly(data: dict, topics: Collection[str] = ()) -> list[str]:
    """Everything wrong with the raw contents of costly_answers.yaml.

    Besides each entry's fields, it checks that the quiz cannot be scored without reading it
    (:func:`quiz_balance` counts what the rule needs, over the well-formed entries):

    * **length**: the right answer may be the strictly longest choice — in characters, after
      collapsing whitespace; a tie is not longest — in at most half of the statements;
    * **position**: every letter must be the right answer in at least 20 % of the
      statements that offer it. a, b and c, which every statement offers, count over all
      statements; d, which only four-choice statements offer, counts over those alone
      (with six four-choice statements, d must be right in at least two of them);
    * **no concession**: every statement is wrong, so no choice may agree with it ("It
      holds…", "It is safe…", "Nothing is wrong…", see :data:`CONCEDING`): a reader rules
      such a choice out unread.  A wrong choice is a confident, specific, wrong diagnosis.

    Each problem names the figure and the fix."""
    problems: list[str] = []
    items = data.get("answers") if isinstance(data, dict) else None
    if not isinstance(items, list) or not items:
        return ["no answers: the file needs an `answers:` list"]
    for where, c in _entries(items, "answer", COSTLY_FIELDS, "choices", "c", problems):
        if topics and not _blank(c.get("topic")) and c["topic"] not in topics:
            problems.append(f"{where}: topic {c['topic']!r} is not a topic of questions.yaml")
        _check_notebook(where, c.get("notebook"), problems)
        problems += _choices_problems(where, c.get("choices"), c.get("answer"))
    return problems + _balance_problems(quiz_balance(items))


def _choices_problems(where: str, choices, ans) -> list[str]:
    """What is wrong with a statement's choices and its answer: three or four different,
    non-empty choices, an answer that is the letter of one, and no choice that concedes."""
    if not isinstance(choices, list) or not choices:
        return [f"{where}: choices must be a list"] if choices else []
    rules = [
        (not 3 <= len(choices) <= len(LETTERS), f"needs 3 or 4 choices, has {len(choices)}"),
        (any(_blank(x) for x in choices), "a choice is empty"),
        (len(set(choices)) != len(choices), "two choices are the same"),
        (not _blank(ans) and (not isinstance(ans, str) or ans not in LETTERS
                              or LETTERS.index(ans) >= len(choices)),
         f"answer {ans!r} is not the letter of a choice"),
    ]
    rules += [(_concedes(x),
               f"choice {letter}) concedes the statement (“{_clean(x)[:40]}…”): "
               "every statement here is wrong, so a reader rules it out without reading. "
               "Rewrite it as a confident wrong diagnosis — a specific, plausible reason "
               "that is wrong, as long as the right one")
              for letter, x in zip(LETTERS, choices)]
    return _broken(where, rules)


# The quiz must not be solvable without reading it: see validate_costly and the header of
# costly_answers.yaml.  Shares are compared in whole numbers (no float rounding at the edge).
MAX_LONGEST = (1, 2)        # the right answer strictly longest in at most 1/2 of the statements
MIN_POSITION = (1, 5)       # every letter right in at least 1/5 of the statements offering it
# A choice that agrees with the statement instead of diagnosing it: its opening words, or
# a phrase that says the statement is fine.  Every statement of the quiz is wrong, so such a
# choice is never the answer and a reader can skip it unread.
CONCEDING = re.compile(r"""
    ^(?:it|this|that|they|yes|the\ (?:statement|claim|design|plan|idea))\b[\s,]*   # It / That ...
     (?:(?:is|was|'s|are)\s+(?:(?:all|perfectly|basically|mostly|essentially|quite)\s+)?
        (?:safe|sound|right|fine|correct|true|ok|okay|valid|accurate)\b    # ... is safe, is right
      | (?:is|'s)\s+the\ (?:right|correct|safe)\b                          # ... is the right way
      | (?:still\s+)?(?:holds?|works?|closes\ the\ gap)\b                  # ... holds, works
      | \w+\ only\ (?:with|when|if|once|until|at|under|for)\b)            # ... breaks only with
  | ^(?:correct|agreed|true|right|fine|exactly)\b                          # Correct: ...
  | \b(?:is|are)\ (?:safe|sound|fine|right|correct)                        # ... is safe as long as
     \ (?:too|as\ long\ as|once|if|when|while|until|as\ stated)\b
  | \bnothing\ (?:is|goes)\ (?:wrong|lost)\b | \bnothing\ wrong\b | \bno\ problem\b
""", re.IGNORECASE | re.VERBOSE)


@dataclass(frozen=True)
class QuizBalance:
    """What gives a quiz's answers away: over ``statements`` well-formed statements, in how
    many the right answer is the strictly longest choice, and per letter how many
    statements offer it and how many have their right answer there."""

    statements: int
    longest: int
    offered: dict[str, int]
    right: dict[str, int]
    conceding: int = 0          # choices that agree with their statement (CONCEDING)
    guess: float = 0.0          # a blind guess's expected score that skips conceding choices

    def __str__(self) -> str:
        where = ", ".join(f"{x}) {self.right[x]}/{self.offered[x]}" for x in self.offered)
        return (f"{self.statements} statements; the right answer is the longest choice in "
                f"{self.longest}; right answers by position: {where}; {self.conceding} "
                f"conceding choices, a blind guess that skips them scores {self.guess:.0%}")


def _concedes(choice) -> bool:
    return isinstance(choice, str) and bool(CONCEDING.search(_clean(choice)))


def _is_longest(choices: list[str], index: int) -> bool:
    lengths = [len(_clean(x)) for x in choices]
    return all(lengths[index] > n for i, n in enumerate(lengths) if i != index)


def quiz_balance(items: list) -> QuizBalance:
    """The length and position figures of a quiz: ``items`` are the raw entries of
    costly_answers.yaml (mappings) or :class:`Costly` statements.  Entries that are not
    well formed (not 3 or 4 text choices, an answer that is not one of their letters) are
    left out: validate_costly reports them on their own.  ``guess`` is what a reader who
    picks at random among the choices that do not concede (:data:`CONCEDING`) scores."""
    statements = longest = conceding = 0
    guess = 0.0
    offered = dict.fromkeys(LETTERS, 0)
    right = dict.fromkeys(LETTERS, 0)
    for c in items:
        choices: object                 # from YAML: checked below before it is used
        answer: object
        if isinstance(c, Costly):
            choices, answer = list(c.choices), c.answer
        elif isinstance(c, dict):
            choices, answer = c.get("choices"), c.get("answer")
        else:
            continue
        if (not isinstance(choices, list) or not 3 <= len(choices) <= len(LETTERS)
                or any(_blank(x) for x in choices) or not isinstance(answer, str)
                or answer not in LETTERS[:len(choices)]):
            continue
        statements += 1
        index = LETTERS.index(answer)
        longest += _is_longest(choices, index)
        right[answer] += 1
        for letter in LETTERS[:len(choices)]:
            offered[letter] += 1
        kept = [i for i, x in enumerate(choices) if not _concedes(x)] or list(range(len(choices)))
        conceding += len(choices) - len(kept) if len(kept) < len(choices) else 0
        guess += (index in kept) / len(kept)
    return QuizBalance(statements, longest, {x: n for x, n in offered.items() if n},
                       {x: right[x] for x, n in offered.items() if n},
                       conceding, guess / statements if statements else 0.0)


def _balance_problems(b: QuizBalance) -> list[str]:
    problems: list[str] = []
    if not b.statements:
        return problems
    most, of = MAX_LONGEST
    if b.longest * of > b.statements * most:
        allowed = b.statements * most // of
        problems.append(
            f"the right answer is the strictly longest choice in {b.longest} of {b.statements} statements "
            f"(more than half): a reader scores by picking the longest without reading. Make "
            f"the wrong choices as long and specific as the right one (or say the right one more "
            f"briefly) until it is the longest in at most {allowed}")
    least, per = MIN_POSITION
    for letter, offered in b.offered.items():
        held = b.right[letter]
        if held * per < offered * least:
            need = -(-offered * least // per)
            among = (f"{offered} statements" if offered == b.statements
                     else f"the {offered} statements that offer it")
            problems.append(
                f"position {letter}) is the right answer in {held} of {among} "
                f"({100 * held // offered} %, under {100 * least // per} %): a reader can rule it "
                f"out without reading. Move right answers to {letter}) — reorder the choices "
                f"and change `answer` — until it holds at least {need}")
    return problems


def load_bank(path: Path | str | None = None) -> Bank:
    """The question bank, validated (a LabkitError lists the problems)."""
    path = Path(path) if path else QUESTIONS_FILE
    data = _read_yaml(path)
    problems = validate_bank(data, _capstone_follow_up_ids(_read_yaml(CAPSTONE_FILE)))
    if problems:
        raise LabkitError(f"{path.name} has {len(problems)} problem(s): " + "; ".join(problems[:8]),
                          "fix them; `labkit drill check` lists them all.")
    topics = {k: Topic(k, v["title"], v["notebook"]) for k, v in data["topics"].items()}
    questions = [
        Question(q["id"], q["level"], q["topic"], q["notebook"], _clean(q["question"]),
                 _clean(q["answer_20s"]), _clean(q["answer_60s"]),
                 tuple(FollowUp(_clean(f["q"]), _clean(f["a"])) for f in q["follow_ups"]),
                 tuple(Evidence(e["notebook"], _clean(e["section"]), _clean(e.get("shows") or ""))
                       for e in q["shown_in"]),
                 q.get("same_as"))
        for q in data["questions"]]
    return Bank(topics, questions)


def load_costly(path: Path | str | None = None, *, topics: Collection[str] | None = None) -> list[Costly]:
    """The answers that cost you the question, validated."""
    path = Path(path) if path else COSTLY_FILE
    data = _read_yaml(path)
    if topics is None:
        topics = _read_yaml(QUESTIONS_FILE).get("topics") or {}
    problems = validate_costly(data, topics)
    if problems:
        raise LabkitError(f"{path.name} has {len(problems)} problem(s): " + "; ".join(problems[:8]),
                          "fix them; `labkit drill check` lists them all.")
    return [Costly(c["id"], c["topic"], c["notebook"], _clean(c["statement"]),
                   tuple(_clean(x) for x in c["choices"]), c["answer"], _clean(c["why"]))
            for c in data["answers"]]


def _clean(text) -> str:
    return " ".join(str(text).split())


# -- the capstone card ---------------------------------------------------------------------------

CAPSTONE_FIELDS = ("topic", "notebook", "asked_at", "question", "answer_20s", "levels", "deductions",
                   "follow_ups")
CAPSTONE_LEVEL_FIELDS = ("answer", "rubric", "shown_in")
CHAIN_FIELDS = ("id", "level", "notebook", "q", "a")
RUBRIC_ITEMS = 5            # every level of the capstone's rubric lists five things to listen for
RUBRIC_PASS = 4             # and a level is reached when four of them are heard


@dataclass(frozen=True)
class Layer:
    """One level of the capstone: what its answer adds to the level below, what must be
    present to score at it, and the notebooks that show it."""

    level: str
    answer: str
    rubric: tuple[str, ...]
    shown_in: tuple[str, ...]


@dataclass(frozen=True)
class Deduction:
    costly: str         # the id of a statement in costly_answers.yaml
    says: str


@dataclass(frozen=True)
class ChainedFollowUp:
    id: str
    level: str
    notebook: str
    question: str
    answer: str


@dataclass(frozen=True)
class Capstone:
    """The seed question with a layered answer (junior to principal), a rubric by level,
    the costly answers as deductions and the follow-ups an interviewer chains from it."""

    topic: str
    notebook: str
    asked_at: str
    question: str
    answer_20s: str
    layers: tuple[Layer, ...]
    deductions: tuple[Deduction, ...]
    follow_ups: tuple[ChainedFollowUp, ...]
    id: str = "capstone"

    def layer(self, level: str) -> Layer:
        return next(x for x in self.layers if x.level == level)

    def answer(self, level: str) -> str:
        """The layered answer up to ``level``: each level's answer after the one below."""
        return " ".join(x.answer for x in self.layers[:LEVELS.index(level) + 1])


def capstone_score(heard: dict[str, int], deductions: int = 0) -> int:
    """The capstone's score, 0 to 4, from how many rubric items of each level were heard —
    in the answer or in the answers to the follow-ups: 1 junior, 2 middle, 3 senior, 4
    principal.  A level is reached with RUBRIC_PASS of its RUBRIC_ITEMS items and every level
    below it reached; each costly answer said and not corrected takes a point off (not
    below 0)."""
    reached = 0
    for level in LEVELS:
        if heard.get(level, 0) < RUBRIC_PASS:
            break
        reached += 1
    return max(0, reached - deductions)


def _capstone_follow_up_ids(data: dict) -> list[str]:
    chain = data.get("follow_ups") if isinstance(data, dict) else None
    return [f["id"] for f in chain or [] if isinstance(f, dict) and isinstance(f.get("id"), str)]


def validate_capstone(data: dict, costly_ids: Collection[object] = (), topics: Collection[str] = ()) -> list[str]:
    """Everything wrong with the raw contents of capstone.yaml: every field present, the four
    levels in order (each with an answer, a rubric of at least two items and the notebooks
    that show it), every deduction naming a statement of costly_answers.yaml (``costly_ids``)
    once, every follow-up with a level, a known notebook, a question and an answer."""
    problems: list[str] = []
    if not isinstance(data, dict) or not data:
        return ["the file needs the card's fields: " + ", ".join(CAPSTONE_FIELDS)]
    _check_card(data, topics, problems)
    _check_levels(data.get("levels"), problems)
    _check_deductions(data.get("deductions"), costly_ids, problems)
    _check_chain(data.get("follow_ups"), problems)
    return problems


def _check_card(data: dict, topics: Collection[str], problems: list[str]) -> None:
    """The card's own fields: each present and known, its texts text, its 20-second answer
    sayable, its topic, notebook and level known."""
    lists = ("levels", "deductions", "follow_ups")
    extra = set(data) - set(CAPSTONE_FIELDS)
    problems += _broken("", [(_blank(data.get(name)) or (name in lists and not data.get(name)),
                              f"{name} is missing or empty") for name in CAPSTONE_FIELDS]
                        + [(extra, f"unknown field(s) {', '.join(sorted(extra))}")]
                        + [(not _blank(data.get(name)) and not isinstance(data[name], str), f"{name} must be text")
                           for name in ("question", "answer_20s")])
    if isinstance(data.get("answer_20s"), str) and data["answer_20s"].strip():
        problems += sayable_problems("answer_20s", _clean(data["answer_20s"]))
    problems += _broken("", [(topics and not _blank(data.get("topic")) and data["topic"] not in topics,
                              f"topic {data.get('topic')!r} is not a topic of questions.yaml")])
    _check_notebook("the card", data.get("notebook"), problems)
    problems += _broken("", [(not _blank(data.get("asked_at")) and data["asked_at"] not in LEVELS,
                              f"asked_at {data.get('asked_at')!r} is not one of {', '.join(LEVELS)}")])


def _check_levels(levels, problems: list[str]) -> None:
    """The card's levels: junior to principal in that order, each a layer of the answer."""
    if not isinstance(levels, dict) or not levels:
        if levels:
            problems.append("levels must map junior, middle, senior and principal to their answers")
        return
    if list(levels) != list(LEVELS):
        problems.append(f"levels must be {', '.join(LEVELS)}, in that order (found {', '.join(map(str, levels))})")
    for name, layer in levels.items():
        _check_layer(f"level {name}", layer, problems)


def _check_layer(where: str, layer, problems: list[str]) -> None:
    """One level of the capstone: an answer that can be said, a rubric of RUBRIC_ITEMS lines
    and the notebooks that show it."""
    if not isinstance(layer, dict):
        problems.append(f"{where}: needs answer, rubric and shown_in")
        return
    extra = set(layer) - set(CAPSTONE_LEVEL_FIELDS)
    problems += _broken(where, [(_blank(layer.get(f)) or (f != "answer" and not layer.get(f)),
                                 f"{f} is missing or empty") for f in CAPSTONE_LEVEL_FIELDS]
                        + [(extra, f"unknown field(s) {', '.join(sorted(extra))}")])
    problems += _rubric_problems(where, layer.get("rubric"))
    if isinstance(layer.get("answer"), str) and layer["answer"].strip():
        problems += sayable_problems(f"{where}: answer", _clean(layer["answer"]))
    shown = layer.get("shown_in")
    if shown and not isinstance(shown, list):
        problems.append(f"{where}: shown_in must be a list of notebooks")
        return
    for nb in shown or []:
        _check_notebook(where, nb, problems)


def _rubric_problems(where: str, rubric) -> list[str]:
    """What is wrong with a level's rubric: not a list of non-empty lines, or not exactly
    RUBRIC_ITEMS of them."""
    if rubric and (not isinstance(rubric, list) or any(_blank(x) or not isinstance(x, str) for x in rubric)):
        return [f"{where}: rubric must be a list of non-empty lines"]
    if isinstance(rubric, list) and len(rubric) != RUBRIC_ITEMS:
        return [f"{where}: the rubric lists {len(rubric)} things to listen for; it needs "
                f"exactly {RUBRIC_ITEMS} (a level is reached with {RUBRIC_PASS} of them)"]
    return []


def _check_deductions(deductions, costly_ids: Collection[object], problems: list[str]) -> None:
    """The card's deductions: each names a statement of costly_answers.yaml, once, and says
    what it costs."""
    if deductions and not isinstance(deductions, list):
        problems.append("deductions must be a list of {costly, says}")
        return
    seen: set[str] = set()
    for i, d in enumerate(deductions or [], 1):
        if not isinstance(d, dict) or _blank(d.get("costly")) or _blank(d.get("says")):
            problems.append(f"deduction {i}: needs costly (an id of costly_answers.yaml) and says")
            continue
        extra = set(d) - {"costly", "says"}
        problems += _broken(f"deduction {i}", (
            (extra, f"unknown field(s) {', '.join(sorted(extra))}"),
            (costly_ids and d["costly"] not in costly_ids, f"{d['costly']!r} is not an id of costly_answers.yaml"),
            (d["costly"] in seen, f"{d['costly']} is deducted twice"),
        ))
        seen.add(d["costly"])


def _check_chain(chain, problems: list[str]) -> None:
    """The card's chain of follow-ups: a list of entries with an id used once."""
    if chain and not isinstance(chain, list):
        problems.append("follow_ups must be a list of {level, notebook, q, a}")
        return
    ids: set = set()
    for i, f in enumerate(chain or [], 1):
        _check_chain_entry(f"follow-up {i}", f, ids, problems)


def _check_chain_entry(where: str, f, ids: set, problems: list[str]) -> None:
    """One follow-up of the chain: an id like f01 not used before (``ids``: those seen), an
    answer that names no notebook, every field present and known, a known level and notebook."""
    if not isinstance(f, dict):
        problems.append(f"{where}: is not a mapping")
        return
    if not _blank(f.get("id")) and not re.fullmatch(r"f\d\d", str(f["id"])):
        problems.append(f"{where}: id {f['id']!r} should look like f01")
    elif f.get("id") in ids:
        problems.append(f"{where}: the id {f['id']} is used twice")
    ids.add(f.get("id"))
    _check_unnamed(f"{where}: a", f.get("a"), problems)
    extra = set(f) - set(CHAIN_FIELDS)
    problems += _broken(where, [(_blank(f.get(name)), f"{name} is missing or empty") for name in CHAIN_FIELDS]
                        + [(extra, f"unknown field(s) {', '.join(sorted(extra))}"),
                           (not _blank(f.get("level")) and f["level"] not in LEVELS,
                            f"level {f.get('level')!r} is not one of {', '.join(LEVELS)}")])
    _check_notebook(where, f.get("notebook"), problems)


def load_capstone(path: Path | str | None = None) -> Capstone:
    """The capstone card, validated against itself, the quiz's ids and the bank's topics."""
    path = Path(path) if path else CAPSTONE_FILE
    data = _read_yaml(path)
    costly_ids = [c.get("id") for c in _read_yaml(COSTLY_FILE).get("answers") or [] if isinstance(c, dict)]
    problems = validate_capstone(data, costly_ids, _read_yaml(QUESTIONS_FILE).get("topics") or {})
    if problems:
        raise LabkitError(f"{path.name} has {len(problems)} problem(s): " + "; ".join(problems[:8]),
                          "fix them; `labkit drill check` lists them all.")
    return Capstone(
        data["topic"], data["notebook"], data["asked_at"], _clean(data["question"]), _clean(data["answer_20s"]),
        tuple(Layer(lvl, _clean(x["answer"]), tuple(_clean(r) for r in x["rubric"]), tuple(x["shown_in"]))
              for lvl, x in data["levels"].items()),
        tuple(Deduction(d["costly"], _clean(d["says"])) for d in data["deductions"]),
        tuple(ChainedFollowUp(f["id"], f["level"], f["notebook"], _clean(f["q"]), _clean(f["a"]))
              for f in data["follow_ups"]))


# -- text rendering ------------------------------------------------------------------------------

def _wrap(text: str, indent: str = "", first: str | None = None) -> str:
    return fill(text, WIDTH, indent, indent if first is None else first)


def card_text(q: Question, reveal: int = 3) -> str:
    """One flashcard as text.  reveal: 0 the question only, 1 + the 20-second answer,
    2 + the 60-second answer, 3 + the follow-ups."""
    lines = [f"{q.id} · {q.level} · {q.topic} · {q.notebook}", _wrap(q.question, "  ", "Q ")]
    if reveal >= 1:
        lines.append(_wrap(q.answer_20s, "      ", "20 s  "))
    if reveal >= 2:
        lines.append(_wrap(q.answer_60s, "      ", "60 s  "))
    if reveal >= 3:
        for f in q.follow_ups:
            lines.append(_wrap(f.question, "        ", "  then  "))
            lines.append(_wrap(f.answer, "        ", "        "))
        lines.append(evidence_text(q))
    return "\n".join(lines)


def evidence_text(q: Question) -> str:
    """Where the workbook shows the answer: ``shown  10 § 1 · The MVCC horizon …: what it shows``."""
    return "\n".join(_wrap(str(e), "        ", "  shown ") for e in q.shown_in)


def study_sheet(bank: Bank | None = None, level: str | None = None, topic: str | None = None,
                *, short: bool = False) -> str:
    """The static study sheet: every selected question with its answers (short=True:
    the question and the 20-second answer only)."""
    bank = bank or load_bank()
    chosen = bank.select(level, topic)
    title = f"Study sheet · {level or 'every level'} · {topic or 'every topic'} · {len(chosen)} questions"
    blocks = [title, "=" * len(title)]
    for lvl in LEVELS:
        mine = [q for q in chosen if q.level == lvl]
        if not mine:
            continue
        if level is None:
            blocks.append(f"\n## {lvl}")
        for q in mine:
            blocks.append("")
            blocks.append(card_text(q, reveal=1 if short else 3))
    if not chosen:
        blocks.append("(no questions match)")
    return "\n".join(blocks)


def print_study_sheet(level: str | None = None, topic: str | None = None, *,
                      short: bool = False, bank: Bank | None = None) -> None:
    """Print the study sheet for one level and/or topic (None: all of them)."""
    print(study_sheet(bank, level, topic, short=short))


def coverage(bank: Bank | None = None) -> str:
    """How many questions each notebook has, per level, as a small text table."""
    bank = bank or load_bank()
    names = [nb for nb in NOTEBOOKS if any(q.notebook == nb for q in bank.questions)]
    head = f"{'notebook':36}" + "".join(f"{lvl:>10}" for lvl in LEVELS) + f"{'all':>6}"
    lines = [head, "-" * len(head)]
    for nb in names:
        counts = [sum(q.notebook == nb and q.level == lvl for q in bank.questions) for lvl in LEVELS]
        lines.append(f"{nb:36}" + "".join(f"{c or '':>10}" for c in counts) + f"{sum(counts):>6}")
    totals = [sum(q.level == lvl for q in bank.questions) for lvl in LEVELS]
    lines.append(f"{'in all':36}" + "".join(f"{c:>10}" for c in totals) + f"{len(bank):>6}")
    return "\n".join(lines)


def costly_text(item: Costly, *, key: bool = True) -> str:
    """One statement of the quiz: the statement, the choices and (key=True) the answer and why."""
    lines = [f"{item.id} · {item.topic} · {item.notebook}", _wrap(f"“{item.statement}”", "  ", "  ")]
    for letter, choice in zip(LETTERS, item.choices):
        lines.append(_wrap(choice, "       ", f"   {letter})  "))
    if key:
        lines.append(_wrap(f"{item.answer}) — {item.why}", "          ", "  Answer  "))
    return "\n".join(lines)


def quiz_text(items: list[Costly] | None = None, *, key: bool = True, limit: int | None = None) -> str:
    """The quiz as text: each statement with its choices, and with key=True the answer and
    why under each one.  ``limit``: only the first that many statements, and a line that
    says how to print the rest."""
    items = load_costly() if items is None else items
    shown = items if limit is None else items[:max(limit, 0)]
    count = f"{len(items)} statements" if len(shown) == len(items) else f"{len(shown)} of {len(items)} statements"
    head = f"The answers that cost you the question · {count} · what is wrong?"
    blocks = [head + "\n" + "=" * len(head)] + [costly_text(c, key=key) for c in shown]
    if len(shown) < len(items):
        blocks.append(f"… and {len(items) - len(shown)} more: drill.print_quiz() prints them all"
                      + (", with the key" if key else "; key=True adds the answers"))
    return "\n\n".join(blocks)


def print_quiz(topic: str | None = None, *, key: bool = False, limit: int | None = None) -> None:
    """Print the quiz (every statement, or one topic's; ``limit``: the first few).  The
    answers and why are printed only when asked for (key=True): a quiz whose key is printed
    under it cannot be taken."""
    items = [c for c in load_costly() if topic is None or c.topic == topic]
    print(quiz_text(items, key=key, limit=limit))


def _id_ranges(ids: list[str]) -> str:
    """``c04, c05, c06, c09`` as ``c04–c06, c09``."""
    runs: list[list[str]] = []
    for i in ids:
        m = re.fullmatch(r"([a-z]+)(\d+)", i)
        prev = runs[-1][-1] if runs else None
        pm = re.fullmatch(r"([a-z]+)(\d+)", prev) if prev else None
        if m and pm and m.group(1) == pm.group(1) and int(m.group(2)) == int(pm.group(2)) + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ", ".join(r[0] if len(r) == 1 else f"{r[0]}–{r[-1]}" for r in runs)


CAPSTONE_SCALE = (f"0  fewer than {RUBRIC_PASS} of the junior items",
                  f"1  junior: {RUBRIC_PASS} of its {RUBRIC_ITEMS} items",
                  f"2  middle: {RUBRIC_PASS} of its {RUBRIC_ITEMS}, and junior reached",
                  f"3  senior: {RUBRIC_PASS} of its {RUBRIC_ITEMS}, and middle reached",
                  f"4  principal: {RUBRIC_PASS} of its {RUBRIC_ITEMS}, and senior reached")
CAPSTONE_WIDTH = 96         # the capstone's model answer and rubric side by side fit this width
_SIDE_BY_SIDE = 80          # narrower than this, each level's rubric follows its answer


def _short_nb(name: str) -> str:
    return name.split("_", 1)[0]


def _columns(left: list[str], right: list[str], width: int) -> list[str]:
    """Two lists of lines side by side, the left padded to ``width``."""
    rows = max(len(left), len(right))
    return [f"{a:<{width}}  {b}".rstrip() for a, b in zip(left + [""] * (rows - len(left)),
                                                          right + [""] * (rows - len(right)))]


def capstone_model(card: Capstone | None = None, *, level: str | None = None, rubric: bool = True,
                   width: int = CAPSTONE_WIDTH) -> str:
    """The capstone's model: the layered answer from junior up to ``level`` (None: principal),
    each level beside its rubric (one column under the other when ``width`` is under 80), then
    the scale, the deductions and how the follow-ups count.  rubric=False: the answers alone."""
    card = card or load_capstone()
    if level is not None and level not in LEVELS:
        raise LabkitError(f"There is no level {level!r}.", f"use one of {', '.join(LEVELS)}.")
    layers = card.layers[:LEVELS.index(level or LEVELS[-1]) + 1]
    side = rubric and width >= _SIDE_BY_SIDE
    text_width = (width - 14) * 3 // 5 if side else width - 12
    rubric_width = width - 14 - text_width if side else text_width
    lines = [_model_head(layers, side=side, rubric=rubric, width=width)]
    for layer in layers:
        lines.append("")
        lines += _layer_lines(layer, side=side, rubric=rubric, text_width=text_width,
                              rubric_width=rubric_width)
    if rubric:
        lines += _scale_lines(card, width)
    return "\n".join(lines)


def _model_head(layers: tuple[Layer, ...], *, side: bool, rubric: bool, width: int) -> str:
    """The model answer's heading: which levels it spans and how the rubric is read."""
    head = ("The model answer at junior level" if len(layers) == 1 else
            f"The model answer, junior to {layers[-1].level} (each level adds to the one before)")
    return textwrap.fill(head + (f", {'beside' if side else 'with'} the rubric: a level is reached with "
                                 f"{RUBRIC_PASS} of its {RUBRIC_ITEMS} items and every level below it "
                                 "reached" if rubric else "") + ":", width)


def _layer_lines(layer: Layer, *, side: bool, rubric: bool, text_width: int, rubric_width: int) -> list[str]:
    """One level of the model answer, its name in the margin: the answer and where it is
    shown, with its rubric beside it (``side``), under it, or not at all."""
    shown = ", ".join(_short_nb(n) for n in layer.shown_in)
    answer = textwrap.wrap(f"{layer.answer} [shown in {shown}]", text_width, break_on_hyphens=False)
    items = [line for r in layer.rubric
             for line in textwrap.wrap(r, rubric_width, initial_indent="□ ", subsequent_indent="  ")]
    body = (_columns(answer, items, text_width) if side
            else answer + ([""] + items if rubric else []))
    return [((f"  {layer.level:<10}" if i == 0 else " " * 12) + row).rstrip() for i, row in enumerate(body)]


def _scale_lines(card: Capstone, width: int) -> list[str]:
    """Under the rubric: the 0-4 scale, the deductions and how the follow-ups count."""
    return (["", "Score:"] + ["  " + x for x in CAPSTONE_SCALE]
            + [textwrap.fill(" · ".join(f"{d.costly} {d.says}" for d in card.deductions), width,
                             initial_indent="  −1 each   ", subsequent_indent=" " * 12),
               textwrap.fill("What the candidate says in answer to the follow-ups counts toward the "
                             "rubric as much as the first answer.", width, initial_indent="  ",
                             subsequent_indent="  ")])


def capstone_text(card: Capstone | None = None, *, level: str | None = None,
                  follow_ups: bool = False, rubric: bool = True, width: int = CAPSTONE_WIDTH) -> str:
    """The capstone card as text: the question, the answer in 20 seconds, then the layered
    model answer beside its rubric (``level``: junior up to that level only; rubric=False:
    the answers alone), the 0-4 scale and the deductions.  ``follow_ups``: the chain of
    follow-ups with their answers and the notebooks that show them."""
    card = card or load_capstone()
    narrow = min(width, WIDTH)
    lines = [f"Capstone · asked at {card.asked_at} · {card.topic} · {card.notebook}",
             fill(card.question, narrow, "  ", "Q "),
             fill(card.answer_20s, narrow, " " * 6, "20 s  "), "",
             capstone_model(card, level=level, rubric=rubric, width=width)]
    if follow_ups:
        lines.append(f"\nFollow-ups, in the order they usually come ({len(card.follow_ups)}):")
        for i, f in enumerate(card.follow_ups, 1):
            lines.append(_wrap(f"{f.question} [{f.level} · {f.notebook}]", "      ", f"  {i:>2}. "))
            lines.append(_wrap(f.answer, "      ", "      "))
    return "\n".join(lines)


def print_capstone(level: str | None = None, *, follow_ups: bool = False) -> None:
    """Print the capstone card: the question, the 20-second answer, and the layered model
    answer beside its rubric (``level``: up to that level)."""
    print(capstone_text(level=level, follow_ups=follow_ups))


@dataclass
class QuizGrade:
    right: list[str] = field(default_factory=list)
    wrong: list[tuple[Costly, str]] = field(default_factory=list)
    unanswered: list[str] = field(default_factory=list)

    @property
    def score(self) -> str:
        return f"{len(self.right)}/{len(self.right) + len(self.wrong)}"

    def __str__(self) -> str:
        return self.text()

    def text(self, *, key: bool = True) -> str:
        """The score, what was not answered and each wrong answer: with key=True its right
        answer and why, with key=False only the notebook that shows it (the key stays
        hidden, so the quiz can be taken again)."""
        answered = len(self.right) + len(self.wrong)
        lines = [(f"{self.score} right" if answered else "nothing answered yet")
                 + (f" · not answered: {_id_ranges(self.unanswered)}" if self.unanswered else "")]
        for c, picked in self.wrong:
            if key:
                lines.append(_wrap(f"{c.id}: you picked {picked}, the answer is {c.answer} — {c.why} "
                                   f"(see {c.notebook})", "    ", "  "))
            else:
                lines.append(_wrap(f"{c.id}: not {picked} — {c.notebook} shows why (key=True: the answer)",
                                   "    ", "  "))
        return "\n".join(lines)


def grade_quiz(answers: dict[str, str], items: list[Costly] | None = None) -> QuizGrade:
    """Mark ``{"c01": "b", ...}``; statements left out are listed as not answered."""
    items = load_costly() if items is None else items
    known = {c.id: c for c in items}
    unknown = sorted(set(answers) - set(known))
    if unknown:
        raise LabkitError(f"No statement with id {', '.join(unknown)}.",
                          f"use the ids printed with the quiz ({items[0].id} to {items[-1].id}).")
    grade = QuizGrade()
    for c in items:
        picked = answers.get(c.id)
        if _blank(picked):
            grade.unanswered.append(c.id)
            continue
        picked = str(picked).strip().lower().rstrip(")")
        if picked not in LETTERS[:len(c.choices)]:
            raise LabkitError(f"{c.id}: {answers[c.id]!r} is not one of the choices.",
                              f"answer with a letter, a to {LETTERS[len(c.choices) - 1]}.")
        if picked == c.answer:
            grade.right.append(c.id)
        else:
            grade.wrong.append((c, picked))
    return grade


# -- widgets ----------------------------------------------------------------------------------

def _pre(text: str) -> str:
    return ("<pre style='white-space: pre-wrap; font-size: 13px; margin: 0'>"
            + html.escape(text) + "</pre>")


class _Stepper:
    """What the flashcards and the quiz share: previous / <action> / next buttons and a
    position label; ``move(step)`` goes to another item."""

    def _controls(self, action: str, on_action: Callable[[], object]) -> tuple[ipywidgets.Button, ipywidgets.HBox]:
        """The action's button, and the row of buttons and position label."""
        import ipywidgets as w

        button = w.Button(description=action, button_style="info")
        self.next_button = w.Button(description="next")
        self.prev_button = w.Button(description="previous")
        self.position = w.Label()
        button.on_click(lambda _: on_action())
        self.next_button.on_click(lambda _: self.move(+1))
        self.prev_button.on_click(lambda _: self.move(-1))
        return button, w.HBox([self.prev_button, button, self.next_button, self.position])

    def move(self, step: int) -> None:
        """Go ``step`` items on (back when negative)."""
        raise NotImplementedError


class Flashcards(_Stepper):
    """Reveal / next flashcards, filtered by level and topic.  ``.box`` is the widget."""

    def __init__(self, bank: Bank | None = None, level: str | None = None,
                 topic: str | None = None):
        import ipywidgets as w

        self.bank = bank or load_bank()
        self.bank.select(level, topic)        # refuses an unknown level or topic
        self.level_pick = w.Dropdown(options=[("every level", None)] + [(x, x) for x in LEVELS],
                                     value=level, description="level")
        self.topic_pick = w.Dropdown(
            options=[("every topic", None)] + [(f"{k}: {t.title}", k) for k, t in self.bank.topics.items()],
            value=topic, description="topic", layout={"width": "420px"})
        self.reveal_button, controls = self._controls("reveal", self.reveal)
        self.card = w.HTML()
        self.level_pick.observe(lambda _: self.refilter(), names="value")
        self.topic_pick.observe(lambda _: self.refilter(), names="value")
        self.box = static_box([w.HBox([self.level_pick, self.topic_pick]), controls, self.card],
                              self.describe)
        self.refilter()

    @property
    def cards(self) -> list[Question]:
        return self._cards

    @property
    def current(self) -> Question | None:
        return self._cards[self.index] if self._cards else None

    def describe(self) -> str:
        lv = self.level_pick.value or "every level"
        tp = self.topic_pick.value or "every topic"
        return f"Flashcards: {len(self._cards)} cards ({lv}, {tp}) — reveal shows the answers step by step"

    def refilter(self) -> None:
        self._cards = self.bank.select(self.level_pick.value, self.topic_pick.value)
        self.index, self.shown = 0, 0
        self._render()

    def reveal(self) -> None:
        self.shown = min(self.shown + 1, 3)
        self._render()

    def move(self, step: int) -> None:
        if self._cards:
            self.index = (self.index + step) % len(self._cards)
        self.shown = 0
        self._render()

    def text(self) -> str:
        q = self.current
        return card_text(q, self.shown) if q else "(no card matches this level and topic)"

    def _render(self) -> None:
        n = len(self._cards)
        self.position.value = f"card {self.index + 1 if n else 0} of {n}"
        self.reveal_button.disabled = self.shown >= 3 or not n
        self.reveal_button.description = ["show 20 s answer", "show 60 s answer",
                                          "show follow-ups", "all shown"][self.shown]
        self.card.value = _pre(self.text())


def flashcards(level: str | None = None, topic: str | None = None) -> Flashcards:
    """Show the flashcard widget (live kernel) and print one line that says what it holds.
    The static version is :func:`print_study_sheet`."""
    from IPython.display import display

    cards = Flashcards(level=level, topic=topic)
    print("No widget below? drill.print_study_sheet(level=..., topic=...) prints the same cards.")
    display(cards.box)
    return cards


# the quiz is read from a projector too: its statement and choices at 20 px, each choice a
# block of wrapped text beside its letter button (a row grows with its text)
QUIZ_TEXT = "font-size: 20px; line-height: 1.4; white-space: normal; overflow-wrap: anywhere"
QUIZ_MARKS = {None: ("transparent", "transparent"), "picked": ("#2563eb", "rgba(37, 99, 235, 0.14)"),
              "right": ("#15803d", "rgba(21, 128, 61, 0.16)"), "wrong": ("#b91c1c", "rgba(185, 28, 28, 0.14)")}
QUIZ_BUTTONS = {None: "", "picked": "primary", "right": "success", "wrong": "danger"}


class Quiz(_Stepper):
    """Pick what is wrong with each statement, check, see why; ``.box`` is the widget.

    Each statement's choices are shown in an order drawn once per quiz (``seed``: the same
    order every time, for tests); the letters on screen are those positions.  ``picked``
    and :func:`grade_quiz` use the statement's own letters, as in costly_answers.yaml."""

    def __init__(self, items: list[Costly] | None = None, *, seed: int | None = None):
        import ipywidgets as w

        self.items = load_costly() if items is None else list(items)
        if not self.items:
            raise LabkitError("The quiz has no statements to show.", "pick another topic.")
        rng = random.Random(seed)
        self.orders = {c.id: rng.sample(range(len(c.choices)), len(c.choices)) for c in self.items}
        self.index = 0
        self.picked: dict[str, str] = {}
        self.selected: int | None = None        # the position on screen picked, not yet checked
        self.statement = w.HTML()
        self.statement.add_class("labkit-quiz-statement")
        self.letters, self.texts, self.rows = [], [], []
        for position, letter in enumerate(LETTERS):
            button = w.Button(description=f"{letter})", layout={"width": "64px", "height": "44px",
                                                                 "flex": "0 0 auto"},
                              style={"font_size": "20px", "font_weight": "bold"})
            button.add_class("labkit-quiz-letter")
            button.on_click(lambda _, position=position: self.select(position))
            text = w.HTML(layout={"flex": "1 1 0%", "width": "auto", "min_width": "0"})
            row = w.HBox([button, text], layout={"align_items": "flex-start", "margin": "0 0 6px 0"})
            row.add_class("labkit-quiz-choice")
            self.letters.append(button)
            self.texts.append(text)
            self.rows.append(row)
        self.check_button, controls = self._controls("check", self.check)
        self.verdict = w.HTML()
        self.box = static_box([self.statement, *self.rows, controls, self.verdict], self.describe)
        self._render()

    def describe(self) -> str:
        return (f"Quiz: {len(self.items)} statements — pick what is wrong with each one, "
                "then check")

    @property
    def current(self) -> Costly:
        return self.items[self.index]

    @property
    def shown(self) -> list[str]:
        """The current statement's choices in the order on screen (a, b, ...)."""
        c = self.current
        return [c.choices[i] for i in self.orders[c.id]]

    def shown_letter(self, letter: str) -> str:
        """Where the current statement's own choice ``letter`` is on screen."""
        return LETTERS[self.orders[self.current.id].index(LETTERS.index(letter))]

    @property
    def selection(self) -> str | None:
        """The text of the choice picked on the current statement (None: none yet)."""
        return None if self.selected is None else self.shown[self.selected]

    def select(self, position: int) -> None:
        """Pick the choice at ``position`` on screen (0 is a)); the letter's button says so."""
        n = len(self.current.choices)
        if not 0 <= position < n:
            raise LabkitError(f"This statement has {n} choices; there is none at position {position}.",
                              f"pick a position from 0 (a) to {n - 1} ({LETTERS[n - 1]})).")
        self.selected = position
        self.verdict.value = ""
        self._mark()

    def check(self) -> bool | None:
        c = self.current
        if self.selected is None:
            self.verdict.value = self._say("Pick one of the choices first.")
            return None
        self.picked[c.id] = LETTERS[self.orders[c.id][self.selected]]
        ok = self.picked[c.id] == c.answer
        head = "Right." if ok else f"Not quite — the answer is {self.shown_letter(c.answer)})."
        self.verdict.value = self._say(f"{head} {c.why} Shown in {c.notebook}.", self.score())
        self._mark(checked=True)
        return ok

    def score(self) -> str:
        right = sum(self.picked[c.id] == c.answer for c in self.items if c.id in self.picked)
        return f"score: {right} right of {len(self.picked)} checked ({len(self.items)} in all)"

    def move(self, step: int) -> None:
        self.index = (self.index + step) % len(self.items)
        self._render()

    def _render(self) -> None:
        c = self.current
        self.statement.value = (
            f"<div style='{QUIZ_TEXT}'><div style='font-size: 14px; opacity: 0.75'>"
            f"{html.escape(f'{c.id} · {c.topic} · {c.notebook}')}</div>"
            f"<div style='margin: 4px 0'>“{html.escape(c.statement)}”</div>"
            "<div style='font-weight: bold'>What is wrong with it?</div></div>")
        self.selected = None
        self.verdict.value = ""
        self.position.value = f"{self.index + 1} of {len(self.items)}"
        for position, row in enumerate(self.rows):
            row.layout.display = None if position < len(c.choices) else "none"
        self._mark()

    @staticmethod
    def _say(*lines: str) -> str:
        """The verdict's lines, as large as the choices."""
        return "".join(f"<div style='{QUIZ_TEXT}; margin: 4px 0'>{html.escape(x)}</div>" for x in lines)

    def _mark(self, checked: bool = False) -> None:
        """Each choice's text and letter button, the one picked highlighted; once checked,
        the right one green and a wrong pick red."""
        right = self.shown_letter(self.current.answer)
        for position, text in enumerate(self.shown):
            mark = "picked" if position == self.selected else None
            if checked and LETTERS[position] == right:
                mark = "right"
            elif checked and mark:
                mark = "wrong"
            border, background = QUIZ_MARKS[mark]
            self.texts[position].value = (
                f"<div style='{QUIZ_TEXT}; padding: 4px 10px; border-radius: 4px; "
                f"border-left: 5px solid {border}; background: {background}'>{html.escape(text)}</div>")
            self.letters[position].button_style = QUIZ_BUTTONS[mark]


def quiz(topic: str | None = None, *, seed: int | None = None) -> Quiz:
    """Show the quiz widget; prints one line.  The static version is :func:`print_quiz`.
    ``seed``: the same order of choices every time."""
    from IPython.display import display

    q = Quiz([c for c in load_costly() if topic is None or c.topic == topic], seed=seed)
    print("No widget below? drill.print_quiz() prints the statements; key=True adds the answers.")
    display(q.box)
    return q


# -- self-check exercises on the real server ---------------------------------------------------

def _jobs_newest_first(scratch: Lab, n: int) -> None:
    """The job table with ``n`` pending jobs numbered newest first (job n is the oldest)
    and without its index, so that rows come back in storage order — newest first —
    unless the claim says ORDER BY created_at."""
    scratch.run_file("job_table.sql")
    scratch.execute("DROP INDEX job_pending_created_idx")
    scratch.execute(named_query("drill.sql", "jobs_newest_first").sql, {"n": n})


CLAIM_HINT = ("A claim that works in parallel must not wait for rows other workers hold, must take "
              "the oldest pending job, and must mark it as its own in the same statement, so that "
              "once the sessions commit nothing is left for the next claim to take again.")


def check_claim(lab: Lab, query: str, *, workers: int = 3) -> Check:
    """Run ``query`` (one statement taking ``%(worker_id)s`` — and, if it likes,
    ``%(batch)s``, which is 1 — and returning the claimed job ids in its first column) in
    ``workers`` sessions at once, each inside its own open
    transaction, over six pending jobs.  It passes when no session waits or fails, each
    claims exactly one job, the jobs differ and are the oldest ones, and after the
    commits each job is IN_PROGRESS under the worker that claimed it."""

    if not 2 <= workers <= 5:
        raise LabkitError(f"check_claim runs 2 to 5 workers, not {workers}.", "use workers=3 (the default).")
    names = [chr(ord("A") + i) for i in range(workers)]
    jobs = workers + 3
    check = Check(f"{workers} sessions claim at the same moment", hint=CLAIM_HINT)
    scratch = _scratch(lab)
    try:
        _jobs_newest_first(scratch, jobs)
        steps = _claim_at_once(scratch, query, names)
        failed = {n: s.error.short() for n, s in steps.items() if s.error and s.error.kind != "lock_timeout"}
        if failed:
            check.add(False, "the claim failed: " + "; ".join(f"{n}: {e}" for n, e in failed.items()))
            return check
        waited = [n for n, s in steps.items() if s.waited]
        check.add(not waited, "no session waited" if not waited else
                  f"session(s) {', '.join(waited)} waited for another one's lock: a convoy")
        got = {n: [r[0] for r in s.rows] for n, s in steps.items()}
        _judge_claimed(check, got, jobs, workers)
        _judge_marked(check, scratch, got)
        return check
    finally:
        scratch.drop()


def _claim_at_once(scratch: Lab, query: str, names: list[str]) -> dict:
    """Each session begins and runs the reader's claim, all before any commits; then all
    commit.  The claim's step of each session, by its name."""
    texts = {n: _bind(scratch, query, {"worker_id": n, "batch": 1}) for n in names}
    with Sessions(scratch, *names, watch={"job": "id"}, lock_timeout="3s") as run:
        steps = {}
        for n in names:
            run.step(n, "BEGIN")
            steps[n] = run.step(n, texts[n], label="claim")
        for n in names:
            run.step(n, "COMMIT")
    return steps


def _judge_claimed(check: Check, got: dict[str, list], jobs: int, workers: int) -> None:
    """What the sessions claimed (``got``: the job ids by session): one job each, no job
    twice, and the oldest ones."""
    shown = ", ".join(f"{n} {'+'.join(map(str, v)) or '-'}" for n, v in got.items())
    check.add(all(len(v) == 1 for v in got.values()),
              f"each session claimed exactly one job (claimed: {shown})")
    flat = [j for v in got.values() for j in v]
    check.add(len(flat) == len(set(flat)), "no job was claimed twice" if len(flat) == len(set(flat))
              else "a job was handed to more than one session")
    oldest = set(range(jobs, jobs - workers, -1))
    check.add(set(flat) == oldest, f"the oldest jobs went first (jobs {', '.join(map(str, sorted(oldest, reverse=True)))};"
              " the checker numbers jobs newest first)")


def _judge_marked(check: Check, scratch: Lab, got: dict[str, list]) -> None:
    """After the commits, each claimed job reads IN_PROGRESS under the worker that claimed it."""
    flat = [j for v in got.values() for j in v]
    rows = scratch.execute("SELECT id, status, worker_id FROM job WHERE id = ANY(%s) ORDER BY id", (flat,))
    marked = all(status == "IN_PROGRESS" and worker == n
                 for n, v in got.items() for (jid, status, worker) in rows if jid in v)
    check.add(marked and bool(rows), "after COMMIT each claimed job reads IN_PROGRESS with its worker's id"
              if marked and rows else "after COMMIT the claimed jobs are not marked IN_PROGRESS by their "
              "worker: the next claim will take them again")


COUNT_HINT = ("A report wants the last committed state, and must neither wait behind a worker's row "
              "locks nor leave out the rows a worker holds: which kind of read takes no row lock at all?")


def check_report_count(lab: Lab, query: str) -> Check:
    """Run ``query`` (returning one number: the pending jobs) while a worker's claim of two
    of six jobs is in flight (locked, marked, not yet committed), and again after it
    committed.  It passes when it never waits and says 6, then 4."""

    check = Check("a dashboard counts pending jobs while a worker claims", hint=COUNT_HINT)
    scratch = _scratch(lab)
    try:
        scratch.create_jobs(6)
        claim = _bind(scratch, read_sql("claim_skip_locked.sql"), {"batch": 2, "worker_id": "W"})
        text = _bind(scratch, query, {})
        with Sessions(scratch, "W", "R", watch={"job": "id"}, lock_timeout="3s") as run:
            run.W("BEGIN")
            run.W(claim, label="claim 2")
            during = run.R(text, label="count")
            run.W("COMMIT")
            if during.waited:
                run.wait("R")
            after = run.R(text, label="count")
        for step, moment, truth in ((during, "while the claim is in flight", 6),
                                    (after, "after the claim committed", 4)):
            if step.error:
                check.add(False, f"{moment}: the count failed: {step.error.short()}")
                continue
            value = step.rows[0][0] if step.rows and step.rows[0] else None
            ok = value == truth and not step.waited
            waited = " and had to wait for the worker's lock" if step.waited else ""
            check.add(ok, f"{moment}: it says {value}, the committed truth is {truth}{waited}")
        return check
    finally:
        scratch.drop()


REAPER_HINT = ("Only claims older than the lease are stale. Hand those back so that each row reads like "
               "a fresh pending job again, and leave a claim younger than the lease to its worker.")


def check_reaper(lab: Lab, query: str, *, lease: str = "5 minutes") -> Check:
    """Run ``query`` (taking ``%(lease)s``, an interval as text) over six jobs: two claims
    older than the lease, one fresh claim, one finished job and two pending ones.  It passes
    when exactly the two stale claims are PENDING again, with worker_id and claimed_at
    cleared, and the others are untouched."""
    import psycopg

    try:
        positive = lab.execute("SELECT %s::interval > interval '0'", (lease,))[0][0]
    except psycopg.Error:
        positive = False
    if not positive:
        raise LabkitError(f"The lease {lease!r} is not a positive interval.",
                          "pass one the server understands, for example lease='5 minutes'.")
    check = Check(f"a reaper with a lease of {lease}", hint=REAPER_HINT)
    scratch = _scratch(lab)
    try:
        scratch.create_jobs(6)
        scratch.execute(named_query("drill.sql", "reaper_scene").sql)
        before = {r[0]: r[1:] for r in scratch.execute("SELECT id, status, worker_id, claimed_at FROM job")}
        text = _bind(scratch, query, {"lease": lease})
        with _Solo(scratch) as conn:
            try:
                conn.execute(text)
            except Exception as exc:  # noqa: BLE001 - the reader's SQL may fail in any way
                check.add(False, f"the reaper failed: {type(exc).__name__}: {str(exc).strip().splitlines()[0]}")
                return check
        after = {r[0]: r[1:] for r in scratch.execute("SELECT id, status, worker_id, claimed_at FROM job")}
        stale_ok = all(after[i] == ("PENDING", None, None) for i in (2, 5))
        check.add(stale_ok, "the two claims older than the lease (jobs 2 and 5) are PENDING again, "
                  "worker and claim time cleared" if stale_ok else
                  "the claims older than the lease (jobs 2 and 5) should read PENDING with no worker "
                  f"and no claim time; they read {_state(after[2])} and {_state(after[5])}")
        check.add(after[3] == before[3], "the fresh claim (job 3) still belongs to its worker"
                  if after[3] == before[3] else "the fresh claim (job 3) was taken from a worker "
                  "that is still running it: that job will run twice")
        untouched = all(after[i] == before[i] for i in (1, 4, 6))
        check.add(untouched, "the finished job and the pending ones are untouched" if untouched
                  else "a finished or pending job was changed (jobs 1, 4, 6 must stay as they were)")
        return check
    finally:
        scratch.drop()


def _state(row) -> str:
    return f"{row[0]}/{row[1] or 'no worker'}"


# -- command line: labkit drill ---------------------------------------------------------------

def drill_command(*, what: str, level: str | None = None, topic: str | None = None,
                  short: bool = False, key: bool = True, follow_ups: bool = False) -> int:
    """``labkit drill sheet [--level L] [--topic T] [--short]`` · ``labkit drill quiz
    [--topic T] [--no-key]`` · ``labkit drill capstone [--level L] [--follow-ups]`` ·
    ``labkit drill check`` (validate the three data files; exit 1 on a problem)."""
    try:
        if what == "sheet":
            print_study_sheet(level, topic, short=short)
        elif what == "quiz":
            print_quiz(topic, key=key)
        elif what == "capstone":
            print_capstone(level, follow_ups=follow_ups)
        else:
            qdata, cdata, kdata = _read_yaml(QUESTIONS_FILE), _read_yaml(COSTLY_FILE), _read_yaml(CAPSTONE_FILE)
            topics = qdata.get("topics") or {}
            costly_ids = [c.get("id") for c in cdata.get("answers") or [] if isinstance(c, dict)]
            problems = ([f"questions.yaml: {p}" for p in validate_bank(qdata, _capstone_follow_up_ids(kdata))]
                        + [f"costly_answers.yaml: {p}" for p in validate_costly(cdata, topics)]
                        + [f"capstone.yaml: {p}" for p in validate_capstone(kdata, costly_ids, topics)])
            for p in problems:
                print(p)
            if problems:
                return 1
            bank = load_bank()
            same = sum(q.same_as is not None for q in bank.questions)
            print(f"questions.yaml: {len(bank)} questions ({same} the same as a capstone follow-up), "
                  f"{len(bank.topics)} topics — ok")
            quiz_figures = quiz_balance(load_costly())
            print(f"costly_answers.yaml: {quiz_figures.statements} statements, no choice concedes, "
                  f"a blind guess scores {quiz_figures.guess:.0%} — ok")
            card = load_capstone()
            print(f"capstone.yaml: {len(card.layers)} levels of {RUBRIC_ITEMS} rubric items, "
                  f"{len(card.deductions)} deductions, {len(card.follow_ups)} follow-ups — ok")
    except LabkitError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0
