"""The interview drill: the question bank and the quiz are validated; the flashcards and
the quiz widget work without a browser; the self-checks run the reader's SQL on the real
server and tell right from wrong."""

import copy
import json
import os
import re
from pathlib import Path

import pytest
import yaml

from labkit import cli
from labkit.core.errors import LabkitError
from labkit.tools import drill, interview

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"


@pytest.fixture(scope="module")
def raw_bank():
    return yaml.safe_load(drill.QUESTIONS_FILE.read_text())


@pytest.fixture(scope="module")
def raw_costly():
    return yaml.safe_load(drill.COSTLY_FILE.read_text())


@pytest.fixture(scope="module")
def bank():
    return drill.load_bank()


@pytest.fixture(scope="module")
def costly():
    return drill.load_costly()


# -- the question bank ------------------------------------------------------------------------

def test_the_bank_is_valid(raw_bank):
    assert drill.validate_bank(raw_bank) == []


def test_the_bank_has_enough_questions_at_every_level_for_every_notebook(bank):
    assert len(bank) >= 30
    levels = {lvl: len(bank.select(level=lvl)) for lvl in drill.LEVELS}
    assert all(n >= 4 for n in levels.values()), levels
    assert {q.notebook for q in bank.questions} >= set(drill.MUST_COVER)
    ids = [q.id for q in bank.questions]
    assert len(ids) == len(set(ids))
    for q in bank.questions:
        assert q.question and q.answer_20s and q.answer_60s and q.topic and q.notebook, q.id
        assert q.follow_ups and all(f.question and f.answer for f in q.follow_ups), q.id
        assert re.fullmatch(r"\d\d_[a-z0-9_]+\.ipynb", q.notebook), q.id
        assert q.notebook in drill.NOTEBOOKS, q.id


def _headings(notebook: str) -> set[str]:
    """The section headings of a notebook, with and without their number ("1 · The …")."""
    cells = json.loads((NOTEBOOK_DIR / notebook).read_text())["cells"]
    found = {line.lstrip("#").strip() for c in cells if c["cell_type"] == "markdown"
             for line in "".join(c["source"]).splitlines() if re.match(r"##+ ", line)}
    return found | {h.split(" · ", 1)[-1] for h in found}


def test_every_answer_is_said_by_a_candidate_and_its_evidence_is_a_real_section(bank, card):
    """What a candidate says names no notebook, no § and not the workbook or the lab, and is
    in the first person (the rule of the header of questions.yaml); the evidence sits in
    shown_in, and every section it names is a heading of that notebook."""
    said = [(f"{q.id} {name}", getattr(q, name)) for q in bank.questions for name in ("answer_20s", "answer_60s")]
    said += [(f"capstone {x.level}", x.answer) for x in card.layers] + [("capstone 20 s", card.answer_20s)]
    for where, text in said:
        assert drill.sayable_problems(where, text) == [], (where, text)
        assert not re.search(r"notebook|workbook|§|\bthe lab\b", text, re.I), where
    for q in bank.questions:
        assert all(not drill.NOT_SAYABLE.search(f.answer) for f in q.follow_ups), q.id
        assert q.shown_in, q.id
        for e in q.shown_in:
            assert e.notebook in drill.NOTEBOOKS and (NOTEBOOK_DIR / e.notebook).exists(), q.id
            assert e.section in _headings(e.notebook) or e.section.split(" · ", 1)[-1] in _headings(e.notebook), \
                (q.id, e.notebook, e.section)
    moved = [q for q in bank.questions if any(e.shows for e in q.shown_in)]
    assert len(moved) >= 46                              # the narration moved out of the answers
    assert "I'd" in bank["q13"].answer_20s + bank["q22"].answer_20s


def test_the_rule_for_a_sayable_answer_at_its_edges():
    ok = drill.sayable_problems
    assert ok("x", "I'd claim with SKIP LOCKED.") == [] and ok("x", "My rule: locks end first.") == []
    assert ok("x", "We mark the row, then commit.") == []
    assert ok("x", "It waits.") and ok("x", "In my previous company I used NOWAIT.")
    assert ok("x", "I'd run 02_the_convoy.ipynb.") and ok("x", "I'd read notebook 5.")
    assert ok("x", "I'd label it well.") == []                     # "label" is not "the lab"


def test_the_corrected_answers(bank, costly):
    """q03 no longer says latency grows with the place in the convoy; q11 knows NOWAIT's place
    in a job system; c13's key says which dialect it holds for."""
    q03 = " ".join([bank["q03"].answer_20s, bank["q03"].answer_60s])
    assert "grows with its place" not in q03 and "place in the line" in q03
    assert "no promised order" in q03 and "lottery" in q03
    assert any("place in the line" in e.section for e in bank["q03"].shown_in)
    q11 = " ".join(f.question + " " + f.answer for f in bank["q11"].follow_ups)
    assert "never use NOWAIT" not in q11 and "cron scheduler" in q11 and "NOWAIT" in q11
    c13 = next(c for c in costly if c.id == "c13")
    assert "lease" in c13.statement and "rolled back when its worker dies" in c13.why


def test_every_topic_is_used_and_names_a_known_notebook(bank):
    used = {q.topic for q in bank.questions}
    assert used == set(bank.topics)
    assert all(t.notebook in drill.NOTEBOOKS for t in bank.topics.values())


def test_the_bank_names_the_notebooks_that_exist():
    """For the lesson notebooks the bank's names must be their real file names, and
    each one needs at least one question."""
    present = sorted(p.name for p in NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
    assert "01_one_lock_three_policies.ipynb" in present
    named = {q.notebook for q in drill.load_bank().questions} | {c.notebook for c in drill.load_costly()}
    must = {f"{i:02d}" for i in [*range(1, 17), 18, 19, 21]}
    assert must <= {name[:2] for name in present}, "a notebook the bank must cover is missing"
    for name in present:
        if name[:2] in must:
            assert name in drill.NOTEBOOKS, f"{name} exists but the drill expects another name for notebook {name[:2]}"
            assert name in named, f"{name} exists but no question or quiz statement names it"
    for name in named:
        number = name[:2]
        real = [p for p in present if p.startswith(number + "_")]
        if real:
            assert real == [name], f"the drill names {name}, the notebook is {real}"


@pytest.mark.parametrize("breakage, expected", [
    (lambda d: d["questions"][0].pop("answer_60s"), "answer_60s is missing"),
    (lambda d: d["questions"][0].update(answer_20s="  "), "answer_20s is missing or empty"),
    (lambda d: d["questions"][1].update(id=d["questions"][0]["id"]), "used twice"),
    (lambda d: d["questions"][0].update(level="expert"), "level 'expert'"),
    (lambda d: d["questions"][0].update(topic="kafka"), "topic 'kafka'"),
    (lambda d: d["questions"][0].update(notebook="3_claims.ipynb"), "not a notebook file name"),
    (lambda d: d["questions"][0].update(notebook="11_extra.ipynb"), "not one of the workbook's notebooks"),
    (lambda d: d["questions"][0].update(follow_ups=[]), "follow_ups is missing"),
    (lambda d: d["questions"][0].update(follow_ups=[{"q": "why?", "a": ""}]), "follow-up 1 needs"),
    (lambda d: d["questions"][0].update(colour="red"), "unknown field"),
    (lambda d: d["questions"][0].update(answer_60s="short"), "should be longer"),
    (lambda d: d.update(questions=d["questions"][:29]), "at least 30"),
    (lambda d: d.update(questions=[q for q in d["questions"] if q["level"] != "principal"]),
     "level principal: 0"),
    (lambda d: d.update(questions=[q for q in d["questions"] if q["notebook"] != "08_fencing_tokens.ipynb"]),
     "notebook 08_fencing_tokens.ipynb: no question"),
    (lambda d: d.pop("topics"), "no topics"),
    (lambda d: d["questions"][0].update(answer_60s=d["questions"][0]["answer_60s"] + " Notebook 14 shows it."),
     "answer_60s names 'Notebook'"),
    (lambda d: d["questions"][0].update(answer_20s="See the workbook, I'd say."), "answer_20s names 'workbook'"),
    (lambda d: d["questions"][0].update(answer_20s="As § 3 shows, I'd wait."), "names '§'"),
    (lambda d: d["questions"][0].update(answer_20s="In the lab, I'd wait."), "names 'the lab'"),
    (lambda d: d["questions"][0].update(answer_20s="It waits for the holder to commit or roll back."),
     "answer_20s is not in the first person"),
    (lambda d: d["questions"][0].update(answer_20s="In my last job we claimed with SKIP LOCKED."),
     "invents a biography ('In my last job')"),
    (lambda d: d["questions"][0]["follow_ups"][0].update(a="Notebook 01 counts them."), "follow-up 1 names 'Notebook'"),
    (lambda d: d["questions"][0].pop("shown_in"), "shown_in is missing"),
    (lambda d: d["questions"][0].update(shown_in=[{"notebook": "99_nowhere.ipynb", "section": "x"}]),
     "shown_in 1: notebook '99_nowhere.ipynb' is not one of the workbook's"),
    (lambda d: d["questions"][0].update(shown_in=[{"notebook": "01_one_lock_three_policies.ipynb"}]),
     "shown_in 1 needs a notebook and a section"),
    (lambda d: d["questions"][0].update(shown_in="01"), "shown_in must be a list"),
    (lambda d: d["questions"][0].update(same_as="capstone"), "same_as 'capstone' should be the id"),
    (lambda d: d["questions"][0].update(same_as="f99"), "same_as 'f99' is not the id of a follow-up"),
])
def test_validation_catches_a_broken_bank(raw_bank, breakage, expected):
    broken = copy.deepcopy(raw_bank)
    breakage(broken)
    problems = drill.validate_bank(broken, [f"f{i:02d}" for i in range(1, 10)])
    assert any(expected in p for p in problems), problems


def test_a_broken_file_is_refused_with_the_fix(tmp_path, raw_bank):
    broken = copy.deepcopy(raw_bank)
    broken["questions"][3]["level"] = "wizard"
    path = tmp_path / "questions.yaml"
    path.write_text(yaml.safe_dump(broken))
    with pytest.raises(LabkitError, match="wizard.*labkit drill check"):
        drill.load_bank(path)
    (tmp_path / "bad.yaml").write_text("questions: [\n")
    with pytest.raises(LabkitError, match="not valid YAML"):
        drill.load_bank(tmp_path / "bad.yaml")


# -- the answers that cost you the question ---------------------------------------------------

def test_the_costly_answers_are_valid(raw_costly, raw_bank):
    assert drill.validate_costly(raw_costly, raw_bank["topics"]) == []


def test_the_quiz_holds_the_classic_costly_answers_and_more(costly, bank):
    assert len(costly) >= 30
    assert {c.notebook for c in costly} >= {t.notebook for t in bank.topics.values()}   # every topic's notebook
    assert len({c.id for c in costly}) == len(costly)
    text = " ".join(c.statement for c in costly).lower()
    for phrase in ["runs the job, marks it done and commits", "strictly in the order", "dashboard",
                   "nowait", "does not need an index", "we don't need a reaper"]:
        assert phrase in text, phrase
    assert {c.notebook for c in costly} >= {"06_outbox_relay.ipynb", "07_notification_drain.ipynb",
                                            "08_fencing_tokens.ipynb"}
    for c in costly:
        assert 3 <= len(c.choices) <= 4 and c.answer in "abcd"[:len(c.choices)] and c.why


@pytest.mark.parametrize("breakage, expected", [
    (lambda d: d["answers"][0].update(answer="e"), "not the letter of a choice"),
    (lambda d: d["answers"][0].update(answer="d"), "not the letter of a choice"),
    (lambda d: d["answers"][0].update(choices=["only one", "two"]), "needs 3 or 4 choices"),
    (lambda d: d["answers"][0].update(choices=["same", "same", "other"]), "two choices are the same"),
    (lambda d: d["answers"][0].pop("why"), "why is missing"),
    (lambda d: d["answers"][1].update(id=d["answers"][0]["id"]), "used twice"),
    (lambda d: d["answers"][0].update(topic="nope"), "topic 'nope'"),
    (lambda d: d["answers"][0].update(notebook="06_outbox.ipynb"), "not one of the workbook's notebooks"),
    (lambda d: d["answers"][0]["choices"].__setitem__(0, "It holds while each claim takes one job."),
     "choice a) concedes the statement"),
])
def test_validation_catches_a_broken_quiz(raw_costly, raw_bank, breakage, expected):
    broken = copy.deepcopy(raw_costly)
    breakage(broken)
    problems = drill.validate_costly(broken, raw_bank["topics"])
    assert any(expected in p for p in problems), problems


def _rigged(raw, move=None, right_longest=None):
    """A copy of the quiz with the right answers moved (``move`` maps a letter to the one its
    right answers go to, the other choices keeping their order) and, with right_longest=True,
    every right answer padded to be the strictly longest choice, with False, every wrong
    choice padded past it."""
    rigged = copy.deepcopy(raw)
    for c in rigged["answers"]:
        choices = [" ".join(str(x).split()) for x in c["choices"]]
        right = choices.pop("abcd".index(c["answer"]))
        spot = "abcd".index((move or {}).get(c["answer"], c["answer"]))
        if right_longest:
            right += " —" + " and that is all" * ((max(map(len, choices)) - len(right)) // 16 + 1)
        elif right_longest is False:
            choices = [x + " —" + " in every case" * ((len(right) - len(x)) // 14 + 1) for x in choices]
        choices.insert(spot, right)
        c["choices"], c["answer"] = choices, "abcd"[spot]
    return rigged


def test_the_quiz_does_not_give_its_answers_away(costly):
    """Neither picking the longest choice nor ruling a letter out scores: the right answer is
    the longest in at most half the statements, and every letter is right in at least 20 %
    of the statements that offer it (d: of the four-choice ones)."""
    b = drill.quiz_balance(costly)
    assert b.statements == len(costly) and 2 * b.longest <= b.statements, str(b)
    assert set(b.offered) >= set("abc") and b.offered["a"] == len(costly), str(b)
    for letter, offered in b.offered.items():
        assert 5 * b.right[letter] >= offered, f"{letter}: {b}"
    assert sum(b.right.values()) == len(costly)


def test_the_balance_check_fails_a_gamed_quiz(raw_costly, raw_bank):
    """The quiz as it was: the right answer always the longest, and never c (nor d)."""
    gamed = _rigged(raw_costly, {"c": "a", "d": "b"}, right_longest=True)
    b = drill.quiz_balance(gamed["answers"])
    assert b.longest == b.statements == len(raw_costly["answers"]) and b.right["c"] == 0
    problems = drill.validate_costly(gamed, raw_bank["topics"])
    longest = [p for p in problems if "strictly longest choice" in p]
    assert len(longest) == 1 and f"in {b.statements} of {b.statements} statements" in longest[0]
    assert "as long and specific as the right one" in longest[0]            # the fix
    c_never = [p for p in problems if p.startswith("position c)")]
    assert len(c_never) == 1 and f"right answer in 0 of {b.statements} statements" in c_never[0]
    assert "under 20 %" in c_never[0] and "reorder the choices and change `answer`" in c_never[0]
    if "d" in b.offered:                                       # d counts over its own statements
        assert any(p.startswith(f"position d) is the right answer in 0 of the {b.offered['d']} "
                                "statements that offer it") for p in problems)
    assert len(problems) == 2 + ("d" in b.offered)


@pytest.mark.parametrize("move, right_longest, expected", [
    (None, True, "the right answer is the strictly longest choice in"),   # length gives it away
    ({"c": "b"}, False, "position c) is the right answer in 0 of"),        # c is never right
    ({"a": "c", "b": "c"}, None, "position a) is the right answer in 0 of"),  # nor a, nor b
    (None, False, None),                           # the real positions, no right answer longest
])
def test_the_balance_check_catches_each_giveaway(raw_costly, raw_bank, move, right_longest, expected):
    problems = drill.validate_costly(_rigged(raw_costly, move, right_longest), raw_bank["topics"])
    if expected is None:
        assert problems == []
    else:
        assert problems and problems[0].startswith(expected), problems
        assert all("a reader" in p and "until it" in p for p in problems)     # why, and the fix


def _quiz(*items):
    """The answers of a quiz of (number of choices, right letter, right answer longest?)."""
    answers = []
    for i, (n, answer, longest) in enumerate(items):
        choices = [f"wrong answer number {j} of statement {i}" for j in range(n)]
        right = "the right one" + (" and a long tail to make it the longest of all" if longest else "")
        choices["abcd".index(answer)] = right
        answers.append({"choices": choices, "answer": answer})
    return answers


def _balance_problems(*items):
    """What validate_costly says about the balance of such a quiz (its entries lack the other
    fields on purpose)."""
    return [p for p in drill.validate_costly({"answers": _quiz(*items)}) if not p.startswith("answer #")]


def test_the_balance_rule_at_its_edges():
    # the right answer longest in exactly half the statements passes; one more fails
    half = [(3, "a", True), (3, "b", True), (3, "c", False), (3, "a", False)]
    assert drill.quiz_balance(_quiz(*half)).longest == 2 and _balance_problems(*half) == []
    half[2] = (3, "c", True)
    assert [p[:40] for p in _balance_problems(*half)] == ["the right answer is the strictly longest"]
    # a tie with another choice is not "longest" (whitespace does not count)
    tie = _quiz((3, "a", False))
    tie[0]["choices"] = ["same  length", "same length!", "short"]
    assert drill.quiz_balance(tie).longest == 0
    # 20 % exactly passes (c: 1 of 5); d counts over the two statements that offer it (1 of 2)
    five = [(4, "d", False), (4, "a", False), (3, "b", False), (3, "c", False), (3, "b", False)]
    b = drill.quiz_balance(_quiz(*five))
    assert b.offered == {"a": 5, "b": 5, "c": 5, "d": 2} and b.right == {"a": 1, "b": 2, "c": 1, "d": 1}
    assert _balance_problems(*five) == []
    five[0] = (4, "a", False)
    assert [p[:70] for p in _balance_problems(*five)] == [
        "position d) is the right answer in 0 of the 2 statements that offer it"]
    # a statement that is not well formed is reported on its own, not counted
    assert drill.quiz_balance(_quiz(*five) + [{"choices": ["x", "y"], "answer": "a"}]).statements == 5


def test_drill_check_fails_on_a_gamed_quiz(raw_costly, tmp_path, monkeypatch, capsys):
    gamed = tmp_path / "costly_answers.yaml"
    rigged = _rigged(raw_costly, {"c": "a", "d": "b"}, right_longest=True)
    gamed.write_text(yaml.safe_dump(rigged, allow_unicode=True), encoding="utf-8")
    monkeypatch.setattr(drill, "COSTLY_FILE", gamed)
    assert cli.main(["drill", "check"]) == 1
    out = capsys.readouterr().out
    assert "costly_answers.yaml: the right answer is the strictly longest choice in" in out
    assert "costly_answers.yaml: position c) is the right answer in 0 of" in out
    with pytest.raises(LabkitError, match="longest choice.*labkit drill check"):
        drill.load_costly(gamed)


def test_grading_the_quiz(costly):
    key = {c.id: c.answer for c in costly}
    assert drill.grade_quiz(key).score == f"{len(costly)}/{len(costly)}"
    wrong = dict(key, c01="a" if key["c01"] != "a" else "b")
    del wrong["c02"]
    grade = drill.grade_quiz(wrong)
    assert grade.score == f"{len(costly) - 2}/{len(costly) - 1}"
    assert grade.unanswered == ["c02"]
    text = str(grade)
    assert "c01: you picked" in text and "not answered: c02" in text
    assert drill.grade_quiz({"c03": key["c03"].upper() + ")"}).right == ["c03"]
    with pytest.raises(LabkitError, match="no statement|No statement"):
        drill.grade_quiz({"c99": "a"})
    with pytest.raises(LabkitError, match="a letter"):
        drill.grade_quiz({"c01": "z"})


# A choice that agrees with its statement: every statement is wrong, so it is never the answer.
CONCESSIONS = [
    "It holds while each claim takes one job: jobs then start in creation order.",
    "It is safe once the lease is longer than the slowest honest job.",
    "It works as long as a single relay runs.",
    "Nothing is lost but a round trip: NOWAIT fails before it takes any lock.",
    "That is correct: the claim commits before the job runs.",
    "It is the right instinct: locks end where network calls begin.",
    "It swaps losses for duplicates, so it is safe as long as consumers deduplicate.",
    "It closes the gap, because the new owner's claim changed the status.",
    "It breaks only with two relays: a second relay takes the same rows.",
    "Correct, and the lock is held until COMMIT.",
    "Nothing wrong with it, provided the index exists.",
]
DIAGNOSES = [
    "The lock does not last that long: a row lock ends with the statement.",
    "It misses the locking: without an index the claim locks every pending row it scans.",
    "It ignores the transactional hand-off: a job in a table commits with its data.",
    "Only if the claim does not convoy and the database is not the limit.",
    "It ends only a relay that sits idle: one kept busy never trips it.",
    "The right answer is the longest one in fewer than half of the statements.",
]


@pytest.mark.parametrize("text", CONCESSIONS)
def test_a_conceding_choice_is_refused_with_the_fix(raw_costly, raw_bank, text):
    assert drill._concedes(text)
    conceding = copy.deepcopy(raw_costly)
    entry = conceding["answers"][4]
    wrong = next(i for i in range(len(entry["choices"])) if "abcd"[i] != entry["answer"])
    entry["choices"][wrong] = text
    problems = drill.validate_costly(conceding, raw_bank["topics"])
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"answer {entry['id']}: choice {'abcd'[wrong]}) concedes the statement")
    assert "rules it out without reading" in problems[0] and "confident wrong diagnosis" in problems[0]


@pytest.mark.parametrize("text", DIAGNOSES)
def test_a_diagnosis_is_not_a_concession(text):
    assert not drill._concedes(text)


def test_no_choice_concedes_and_a_blind_guess_stays_at_chance(costly, raw_costly, capsys):
    """Skipping the choices that agree with their statement gains a blind guesser nothing:
    there are none, so a guess scores the mean of 1/(number of choices); the quiz as it was
    (22 of its 37 wrong choices conceding) let the same guesser score 50 %."""
    b = drill.quiz_balance(costly)
    assert b.conceding == 0 and not any(drill._concedes(x) for c in costly for x in c.choices)
    chance = sum(1 / len(c.choices) for c in costly) / len(costly)
    assert abs(b.guess - chance) < 1e-9 and b.guess < 0.34
    assert cli.main(["drill", "check"]) == 0
    assert (f"costly_answers.yaml: {len(costly)} statements, no choice concedes, a blind guess "
            f"scores {b.guess:.0%} — ok") in capsys.readouterr().out
    # the same figure for a quiz whose wrong choices concede: three statements of three
    # choices, one conceding wrong choice each and one with both: (1/2 + 1/2 + 1) / 3
    three = copy.deepcopy(raw_costly["answers"][:3])
    for c, n in zip(three, (1, 1, 2)):
        for i in [i for i in range(3) if "abcd"[i] != c["answer"]][:n]:
            c["choices"][i] = CONCESSIONS[i]
    assert [len(c["choices"]) for c in three] == [3, 3, 3]
    b3 = drill.quiz_balance(three)
    assert b3.conceding == 4 and abs(b3.guess - 2 / 3) < 1e-9
    assert "4 conceding choices, a blind guess that skips them scores 67%" in str(b3)


def test_drill_check_names_a_conceding_choice(raw_costly, tmp_path, monkeypatch, capsys):
    conceding = copy.deepcopy(raw_costly)
    c = conceding["answers"][0]
    wrong = next(i for i in range(3) if "abcd"[i] != c["answer"])
    c["choices"][wrong] = "It is safe until a worker dies: the lock protects the job till then."
    path = tmp_path / "costly_answers.yaml"
    path.write_text(yaml.safe_dump(conceding, allow_unicode=True), encoding="utf-8")
    monkeypatch.setattr(drill, "COSTLY_FILE", path)
    assert cli.main(["drill", "check"]) == 1
    out = capsys.readouterr().out
    assert f"costly_answers.yaml: answer c01: choice {'abcd'[wrong]}) concedes the statement" in out
    assert "Rewrite it as a confident wrong diagnosis" in out


# -- text renderings ----------------------------------------------------------------------------

def test_the_study_sheet_prints_every_selected_card(bank, capsys):
    drill.print_study_sheet(level="senior")
    out = capsys.readouterr().out
    seniors = bank.select(level="senior")
    assert f"{len(seniors)} questions" in out.splitlines()[0]
    for q in seniors:
        assert f"{q.id} · senior" in out
        assert q.follow_ups[0].question.split()[0] in out
    assert "junior ·" not in out
    short = drill.study_sheet(bank, topic="fencing", short=True)
    assert "\n20 s  " in short and "\n60 s  " not in short and "\n  then  " not in short
    whole = drill.study_sheet(bank)
    assert all(f"## {lvl}" in whole for lvl in drill.LEVELS)
    assert max(len(line) for line in whole.splitlines()) <= drill.WIDTH + 2


def test_unknown_level_or_topic_names_the_choices(bank):
    with pytest.raises(LabkitError, match="junior, middle, senior, principal"):
        bank.select(level="expert")
    with pytest.raises(LabkitError, match="policies"):
        bank.select(topic="kafka")


def test_quiz_text_has_statement_choices_answer_and_why(costly):
    text = drill.quiz_text(costly)
    for c in costly:
        assert c.id in text and f"Answer  {c.answer})" in drill.costly_text(c)
    assert "Answer" not in drill.quiz_text(costly, key=False)


def test_coverage_counts_add_up(bank):
    table = drill.coverage(bank)
    last = table.splitlines()[-1].split()
    assert last[:2] == ["in", "all"] and int(last[-1]) == len(bank)


def test_cli(capsys):
    assert cli.main(["drill", "check"]) == 0
    assert "topics — ok" in capsys.readouterr().out
    assert cli.main(["drill", "sheet", "--level", "junior", "--short"]) == 0
    assert "junior" in capsys.readouterr().out
    assert cli.main(["drill", "quiz", "--topic", "fencing", "--no-key"]) == 0
    out = capsys.readouterr().out
    assert "c09" in out and "Answer" not in out
    assert cli.main(["drill", "sheet", "--topic", "kafka"]) == 1
    assert "no topic" in capsys.readouterr().err.lower()


# -- widgets, driven without a browser ----------------------------------------------------------

def test_flashcards_reveal_next_and_filter(bank):
    cards = drill.Flashcards(bank, level="junior")
    juniors = bank.select(level="junior")
    assert cards.cards == juniors and cards.current == juniors[0]
    assert juniors[0].question[:30] in cards.card.value and "20 s" not in cards.card.value
    cards.reveal_button.click()
    assert "20 s" in cards.card.value and "60 s" not in cards.card.value
    cards.reveal_button.click()
    cards.reveal_button.click()
    assert "then" in cards.card.value and cards.reveal_button.disabled
    cards.next_button.click()
    assert cards.current == juniors[1] and "20 s" not in cards.card.value
    cards.prev_button.click()
    cards.prev_button.click()
    assert cards.current == juniors[-1]
    cards.topic_pick.value = "fencing"
    assert cards.cards == bank.select(level="junior", topic="fencing") == []
    assert "no card matches" in cards.card.value and cards.position.value == "card 0 of 0"
    cards.level_pick.value = None
    assert cards.cards == bank.select(topic="fencing") and cards.position.value.startswith("card 1 of")
    assert repr(cards.box).startswith("Flashcards:") and "fencing" in repr(cards.box)


def _on_screen(q, position):
    """The text of the choice block at ``position`` on the widget, as the page shows it."""
    import html

    return html.unescape(re.sub(r"<[^>]+>", "", q.texts[position].value))


def test_quiz_widget_checks_and_scores(costly):
    q = drill.Quiz(costly[:3], seed=3)
    assert q.check() is None and "Pick one" in q.verdict.value
    first = costly[0]
    right = "abcd".index(q.shown_letter(first.answer))
    q.letters[right].click()
    assert q.letters[right].button_style == "primary" and "rgba(37, 99, 235" in q.texts[right].value
    assert q.check() is True and "Right." in q.verdict.value
    assert q.letters[right].button_style == "success"
    q.next_button.click()
    second = costly[1]
    shown = q.shown_letter(second.answer)
    wrong = ("abcd".index(shown) + 1) % len(second.choices)
    q.letters[wrong].click()
    assert q.check() is False and f"the answer is {shown})" in q.verdict.value
    assert q.letters[wrong].button_style == "danger" and q.letters["abcd".index(shown)].button_style == "success"
    assert "score: 1 right of 2 checked (3 in all)" in q.verdict.value
    assert drill.grade_quiz(q.picked, costly[:3]).score == "1/2"
    assert repr(q.box).startswith("Quiz: 3 statements")


def test_quiz_widget_shuffles_each_attempt_and_records_the_choice_clicked(costly):
    """The letters on screen are shuffled positions; a click on one records the choice shown
    there, and ``picked`` gives it in the statement's own letters, as grade_quiz marks it."""
    orders = [drill.Quiz(costly, seed=s).orders for s in range(5)]
    assert orders[0] == drill.Quiz(costly, seed=0).orders                    # a seed repeats
    assert len({tuple(tuple(o[c.id]) for c in costly) for o in orders}) == 5  # attempts differ
    q = drill.Quiz(costly, seed=11)
    moved = sum(q.orders[c.id] != sorted(q.orders[c.id]) for c in costly)
    assert moved >= len(costly) // 2, "most statements show their choices out of file order"
    for c in costly:
        assert q.current == c and q.position.value == f"{costly.index(c) + 1} of {len(costly)}"
        visible = [r.layout.display != "none" for r in q.rows]
        assert visible == [i < len(c.choices) for i in range(4)]
        for position in range(len(c.choices)):
            q.letters[position].click()
            assert q.selection == _on_screen(q, position) == c.choices[q.orders[c.id][position]]
            assert [b.button_style for b in q.letters[:len(c.choices)]] == [
                "primary" if i == position else "" for i in range(len(c.choices))]
            ok = q.check()
            mine = q.picked[c.id]
            assert c.choices["abcd".index(mine)] == _on_screen(q, position)
            assert ok is (mine == c.answer) is (drill.grade_quiz({c.id: mine}, costly).right == [c.id])
        assert _on_screen(q, "abcd".index(q.shown_letter(c.answer))) == c.choices["abcd".index(c.answer)]
        q.next_button.click()
    assert q.current == costly[0]
    with pytest.raises(LabkitError, match="there is none at position .* pick a position from 0"):
        q.select(len(costly[0].choices) if len(costly[0].choices) < 4 else 4)


def test_quiz_widget_text_is_readable_on_a_projector(costly):
    """Each choice is a block of wrapped text at 20 px beside a letter button, not a
    fixed-height radio label."""
    q = drill.Quiz(costly[:1], seed=0)
    assert [b.description for b in q.letters] == ["a)", "b)", "c)", "d)"]
    for text in q.texts[:len(costly[0].choices)]:
        assert "font-size: 20px" in text.value and "white-space: normal" in text.value
    assert "font-size: 20px" in q.statement.value and costly[0].statement[:40] in q.statement.value
    assert not any(type(w).__name__ == "RadioButtons" for w in q.box.children)


def test_after_run_all_the_first_flashcard_shows_its_question_only(bank):
    """Notebook 20 run top to bottom leaves the flashcard widget on its first card, the
    question alone: no later cell reveals or moves the card the reader sees."""
    import nbformat

    nb = nbformat.read(NB10, as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    start = next(i for i, src in enumerate(code) if "drill.flashcards(" in src)
    ns = {"drill": drill, "bank": bank}
    for src in code[start:]:
        if src is code[start] or re.search(r"\bcards\b", src):
            exec(compile(src, str(NB10), "exec"), ns)
    cards, first = ns["cards"], bank.select(level="senior")[0]
    assert cards.current == first and cards.shown == 0
    assert first.question[:30] in cards.card.value and "20 s" not in cards.card.value
    assert cards.reveal_button.description == "show 20 s answer"
    cards.reveal()                                  # the check can fail: a revealed card shows
    assert "20 s" in cards.card.value


# -- the self-checks, on the real server ----------------------------------------------------------

GOOD_CLAIM = """
WITH picked AS (
    SELECT id FROM job WHERE status = 'PENDING'
     ORDER BY created_at LIMIT 1
       FOR UPDATE SKIP LOCKED)
UPDATE job SET status = 'IN_PROGRESS', worker_id = %(worker_id)s, claimed_at = now()
  FROM picked WHERE job.id = picked.id
RETURNING job.id"""
PLAIN = "SELECT id FROM job WHERE status = 'PENDING' ORDER BY created_at LIMIT 1 FOR UPDATE"


def _failures(result) -> str:
    return " ".join(text for ok, text in result.findings if not ok)


def test_check_claim_passes_the_right_claim(lab):
    result = drill.check_claim(lab, GOOD_CLAIM)
    assert result.passed, str(result)
    assert "A 6, B 5, C 4" in str(result)


@pytest.mark.parametrize("query, wrong", [
    (PLAIN, ["waited", "more than one session", "not marked"]),               # convoy, and all get job 6
    (PLAIN + " NOWAIT", ["55P03"]),
    (PLAIN + " SKIP LOCKED", ["not marked"]),
    (GOOD_CLAIM.replace("ORDER BY created_at ", ""), ["oldest jobs went first"]),
    (GOOD_CLAIM.replace("LIMIT 1", "LIMIT 2"), ["exactly one job"]),
    ("SELEC id FROM job", ["42601"]),
])
def test_check_claim_fails_wrong_claims(lab, query, wrong):
    result = drill.check_claim(lab, query)
    assert not result.passed
    failed = _failures(result)
    for word in wrong:
        assert word in failed, str(result)
    assert "hint" in str(result)


def test_check_claim_leaves_nothing_behind(lab, db):
    from conftest import backends_gone

    drill.check_claim(lab, PLAIN)          # B and C were left waiting mid-script
    mine = f"lab_drill_check_{os.getpid()}_%"
    assert backends_gone(db, f"labkit:{mine}") == []
    with db.connect() as conn:
        left = conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname LIKE %s", (mine,)).fetchone()[0]
    assert left == 0


def test_check_claim_refuses_bad_parameters(lab):
    with pytest.raises(LabkitError, match="2 to 5 workers"):
        drill.check_claim(lab, GOOD_CLAIM, workers=0)
    with pytest.raises(LabkitError, match="empty"):
        drill.check_claim(lab, "  ")
    with pytest.raises(LabkitError, match=r"%%"):
        drill.check_claim(lab, "SELECT id FROM job WHERE payload LIKE 'job%' %(worker_id)s")
    for lease in ("-5 minutes", "soon"):
        with pytest.raises(LabkitError, match="positive interval"):
            drill.check_reaper(lab, "UPDATE job SET status = 'PENDING'", lease=lease)


def test_check_report_count(lab):
    plain = "SELECT count(*) FROM job WHERE status = 'PENDING'"
    assert drill.check_report_count(lab, plain).passed
    skip = drill.check_report_count(
        lab, "SELECT count(*) FROM (SELECT id FROM job WHERE status = 'PENDING' FOR UPDATE SKIP LOCKED) s")
    assert not skip.passed and "says 4, the committed truth is 6" in _failures(skip)
    locking = drill.check_report_count(
        lab, "SELECT count(*) FROM (SELECT id FROM job WHERE status = 'PENDING' FOR UPDATE) s")
    assert not locking.passed and "had to wait" in _failures(locking)


def test_check_reaper(lab):
    good = ("UPDATE job SET status = 'PENDING', worker_id = NULL, claimed_at = NULL "
            "WHERE status = 'IN_PROGRESS' AND claimed_at < now() - %(lease)s::interval")
    assert drill.check_reaper(lab, good).passed
    everything = drill.check_reaper(lab, "UPDATE job SET status = 'PENDING' WHERE status = 'IN_PROGRESS'")
    assert not everything.passed and "job 3) was taken" in _failures(everything)
    no_status = drill.check_reaper(lab, good.replace("status = 'IN_PROGRESS' AND ", ""))
    assert not no_status.passed and "finished or pending job was changed" in _failures(no_status)
    broken = drill.check_reaper(lab, "UPDATE jobs SET status = 'PENDING'")
    assert not broken.passed and "UndefinedTable" in _failures(broken)


# -- the answer key, only on request ------------------------------------------------------------

def test_the_quiz_prints_without_its_key_unless_asked(costly, capsys):
    drill.print_quiz()
    plain = capsys.readouterr().out
    assert all(c.id in plain for c in costly) and "Answer" not in plain
    assert not any(c.why[:40] in plain for c in costly)
    drill.print_quiz(topic="fencing", key=True)
    keyed = capsys.readouterr().out
    assert "Answer  " in keyed and "c09" in keyed and "c01" not in keyed
    first = drill.quiz_text(costly, key=False, limit=1)
    assert first.startswith(f"The answers that cost you the question · 1 of {len(costly)} statements")
    assert costly[0].id in first and costly[1].id not in first and "Answer" not in first
    assert first.splitlines()[-1] == f"… and {len(costly) - 1} more: drill.print_quiz() prints them all; key=True adds the answers"
    # in a terminal the key is what `labkit drill quiz` is asked for; --no-key leaves it out
    assert cli.main(["drill", "quiz"]) == 0 and capsys.readouterr().out.count("Answer  ") == len(costly)


def test_marking_without_the_key_names_the_notebook_not_the_answer(costly):
    key = {c.id: c.answer for c in costly}
    wrong = {c.id: next(x for x in "abc" if x != c.answer) for c in costly[:2]}
    grade = drill.grade_quiz({**wrong, costly[2].id: key[costly[2].id]})
    hidden = grade.text(key=False)
    assert hidden.startswith(f"1/3 right · not answered: {costly[3].id}–{costly[-1].id}")
    for c in costly[:2]:
        assert f"{c.id}: not {wrong[c.id]} — {c.notebook} shows why" in hidden
        assert c.why[:30] not in hidden
    assert "the answer is" not in hidden and "the answer is" in grade.text(key=True) == str(grade)
    blank = drill.grade_quiz({"c01": "", "c02": " "}).text(key=False)
    assert blank == f"nothing answered yet · not answered: c01–{costly[-1].id}"
    assert drill._id_ranges(["c01", "c02", "c04", "c06", "c07", "q10"]) == "c01–c02, c04, c06–c07, q10"


NB10 = NOTEBOOK_DIR / "20_interview_drill.ipynb"


def _outputs(path):
    import nbformat

    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            text = out.get("text") or "".join(out.get("data", {}).get("text/plain", ""))
            yield i, cell, text


def test_notebook_10_shows_the_quiz_without_its_key_and_no_wall_of_text(costly):
    import nbformat

    nb = nbformat.read(NB10, as_version=4)
    quiz_cells = [c for c in nb.cells if c.cell_type == "code" and "drill.quiz_text(" in c.source]
    assert quiz_cells and all("SHOW_KEY = False" in c.source and "key=SHOW_KEY" in c.source for c in quiz_cells)
    assert any("grade_quiz(MY_ANSWERS).text(key=SHOW_KEY)" in c.source for c in nb.cells)
    for i, cell, text in _outputs(NB10):
        assert not re.search(r"^\s*Answer\s+[a-d]\)", text, re.M), f"cell {i} prints the key"
        assert "the answer is" not in text, f"cell {i} gives an answer away"
        assert not any(c.why[:50] in text for c in costly), f"cell {i} prints a reason from the key"
        # The capstone card is a card: its question, the 20-second answer, one level beside its
        # rubric and the scale. Everything else stays short.
        most = 40 if "capstone_text(" in cell.source else 25
        assert len(text.splitlines()) <= most, f"cell {i} prints {len(text.splitlines())} lines"


def test_notebook_10_proves_no_single_letter_and_no_length_rule_passes(costly):
    from collections import Counter

    best = Counter(c.answer for c in costly).most_common(1)[0][1]
    assert 10 * best <= 4 * len(costly)             # the best single letter scores at most 40 %
    shown = [" ".join(t.split()) for _, cell, t in _outputs(NB10) if "best_letter" in cell.source]
    assert shown == [f"{len(costly)} statements: the same letter every time scores at most {best}/{len(costly)}, "
                     f"the longest choice every time {drill.quiz_balance(costly).longest}/{len(costly)}"]


# -- the capstone card ------------------------------------------------------------------------

SEED = ("You are implementing a job-queue table where many workers claim pending rows. Explain the "
        "difference between a locking read that waits, one that fails immediately (NOWAIT), and one "
        "that skips already-locked rows (SKIP LOCKED), and which one a queue claim should use and why.")


@pytest.fixture(scope="module")
def raw_capstone():
    return yaml.safe_load(drill.CAPSTONE_FILE.read_text())


@pytest.fixture(scope="module")
def card():
    return drill.load_capstone()


def test_the_capstone_is_valid_and_asks_the_seed_question_word_for_word(raw_capstone, raw_costly, raw_bank, card):
    assert drill.validate_capstone(raw_capstone, [c["id"] for c in raw_costly["answers"]], raw_bank["topics"]) == []
    assert card.question == SEED
    assert card.asked_at == "senior" and card.topic in raw_bank["topics"]
    assert [x.level for x in card.layers] == list(drill.LEVELS)
    for layer in card.layers:
        assert len(layer.rubric) == drill.RUBRIC_ITEMS == 5 and layer.answer and layer.shown_in
        assert all((NOTEBOOK_DIR / nb).exists() for nb in layer.shown_in), layer.level


def test_the_capstone_answer_is_layered(card):
    """Each level's answer is what it adds: the layered answer up to a level holds every
    level below it, in order, and the levels say different things."""
    answers = [card.answer(lvl) for lvl in drill.LEVELS]
    for lower, higher in zip(answers, answers[1:]):
        assert higher.startswith(lower) and len(higher) > len(lower) + 200
    assert len({x.answer for x in card.layers}) == 4
    junior, middle, senior, principal = (x.answer for x in card.layers)
    assert all(w in junior for w in ("waits", "NOWAIT", "SKIP LOCKED", "different one"))
    assert all(w in middle for w in ("Twenty workers", "error storm", "not a consistent view", "IN_PROGRESS"))
    assert all(w in senior for w in ("reaper", "idempotent", "claim version", "partial index", "NOWAIT"))
    assert all(w in principal for w in ("outbox", "lease", "Locks end where slow network calls begin", "broker"))


def test_the_capstone_deducts_the_seeds_costly_answers_and_chains_follow_ups(card, costly):
    ids = [d.costly for d in card.deductions]
    assert ids == ["c01", "c02", "c03", "c04", "c05", "c06"] and {c.id for c in costly} >= set(ids)
    assert len(card.follow_ups) >= 6
    assert [f.level for f in card.follow_ups] == sorted((f.level for f in card.follow_ups), key=drill.LEVELS.index)
    for f in card.follow_ups:
        assert f.notebook in drill.NOTEBOOKS and (NOTEBOOK_DIR / f.notebook).exists(), f.question
        assert f.question.endswith("?") and len(f.answer) > 80
    asked = " ".join(f.question for f in card.follow_ups)
    for subject in ("crashes", "NOWAIT", "order", "slower", "lease", "broker"):
        assert subject in asked, subject


@pytest.mark.parametrize("breakage, expected", [
    (lambda d: d["levels"].pop("middle"), "levels must be junior, middle, senior, principal"),
    (lambda d: d.update(levels=dict(reversed(list(d["levels"].items())))), "in that order"),
    (lambda d: d["levels"]["senior"].update(answer=" "), "level senior: answer is missing"),
    (lambda d: d["levels"]["junior"].update(rubric=["only one thing"]), "it needs exactly 5"),
    (lambda d: d["levels"]["middle"]["rubric"].append("a sixth thing"), "level middle: the rubric lists 6"),
    (lambda d: d.pop("answer_20s"), "answer_20s is missing"),
    (lambda d: d["levels"]["junior"].update(answer="All three take the same lock."), "level junior: answer is not in the first"),
    (lambda d: d["follow_ups"][1].update(id="f01"), "follow-up 2: the id f01 is used twice"),
    (lambda d: d["follow_ups"][1].update(id="k2"), "follow-up 2: id 'k2' should look like f01"),
    (lambda d: d["follow_ups"][1].update(a=d["follow_ups"][1]["a"] + " Notebook 01 shows it."), "follow-up 2: a names"),
    (lambda d: d["levels"]["principal"].update(shown_in=["99_nowhere.ipynb"]), "not one of the workbook's"),
    (lambda d: d["deductions"][0].update(costly="c99"), "'c99' is not an id of costly_answers.yaml"),
    (lambda d: d["deductions"][1].update(costly="c01"), "c01 is deducted twice"),
    (lambda d: d["deductions"][0].pop("says"), "deduction 1: needs costly"),
    (lambda d: d["follow_ups"][2].update(notebook="4_leases.ipynb"), "follow-up 3: notebook '4_leases.ipynb'"),
    (lambda d: d["follow_ups"][0].pop("a"), "follow-up 1: a is missing"),
    (lambda d: d["follow_ups"][0].update(level="guru"), "follow-up 1: level 'guru'"),
    (lambda d: d.update(asked_at="expert"), "asked_at 'expert'"),
    (lambda d: d.update(topic="kafka"), "topic 'kafka'"),
    (lambda d: d.update(colour="red"), "unknown field(s) colour"),
    (lambda d: d.pop("question"), "question is missing"),
])
def test_validation_catches_a_broken_capstone(raw_capstone, raw_costly, raw_bank, breakage, expected):
    broken = copy.deepcopy(raw_capstone)
    breakage(broken)
    problems = drill.validate_capstone(broken, [c["id"] for c in raw_costly["answers"]], raw_bank["topics"])
    assert any(expected in p for p in problems), problems


def test_drill_check_validates_the_capstone(raw_capstone, tmp_path, monkeypatch, capsys):
    assert cli.main(["drill", "check"]) == 0
    assert "capstone.yaml: 4 levels of 5 rubric items, 6 deductions, 9 follow-ups — ok" in capsys.readouterr().out
    broken = copy.deepcopy(raw_capstone)
    broken["deductions"][0]["costly"] = "c99"
    path = tmp_path / "capstone.yaml"
    path.write_text(yaml.safe_dump(broken, allow_unicode=True), encoding="utf-8")
    monkeypatch.setattr(drill, "CAPSTONE_FILE", path)
    assert cli.main(["drill", "check"]) == 1
    assert "capstone.yaml: deduction 1: 'c99' is not an id of costly_answers.yaml" in capsys.readouterr().out
    with pytest.raises(LabkitError, match="c99.*labkit drill check"):
        drill.load_capstone()


def test_the_capstone_card_as_text(card, capsys):
    """The question, the 20-second answer, then the layered model answer beside its rubric
    (96 characters at most), the 0-4 scale, the deductions and how the follow-ups count."""
    card_text = drill.capstone_text(card)
    flat = " ".join(card_text.split())
    assert card_text.startswith("Capstone · asked at senior · policies")
    assert "Q " + SEED in flat and "20 s " + card.answer_20s in flat
    assert len(card.answer_20s) < len(card.layers[0].answer) + len(card.layers[1].answer)
    for layer in card.layers:
        assert f"\n  {layer.level:<10}" in card_text
        for item in layer.rubric:                                      # beside the answer: its first words
            assert "□ " + " ".join(item.split()[:2]) in flat, item
    rows = card_text.splitlines()
    assert max(map(len, rows)) <= drill.CAPSTONE_WIDTH == 96
    junior = next(i for i, r in enumerate(rows) if r.startswith("  junior"))
    assert "□ " + card.layers[0].rubric[0][:20] in rows[junior]          # side by side: answer | rubric
    assert all(d.costly in card_text for d in card.deductions) and "−1 each" in card_text
    assert all(x in card_text for x in drill.CAPSTONE_SCALE) and "4  principal" in card_text
    assert "answer to the follow-ups counts toward the rubric" in flat
    narrow = drill.capstone_text(card, width=72)                       # one under the other
    assert max(map(len, narrow.splitlines())) <= 72
    block = narrow.split("\n  junior")[1].split("\n  middle")[0]
    assert block.index("□") > block.index("[shown in 01]")
    assert " ".join(card.layers[0].answer.split()) in " ".join(block.split())
    assert all("□ " + item in " ".join(narrow.split()) for layer in card.layers for item in layer.rubric)
    middle = drill.capstone_text(card, level="middle")
    assert "\n  middle" in middle and "\n  senior" not in middle
    first_words = [f"□ {' '.join(x.rubric[0].split()[:3])}" for x in card.layers]
    assert first_words[1] in " ".join(middle.split()) and first_words[2] not in " ".join(middle.split())
    answers_only = " ".join(drill.capstone_text(card, level="middle", rubric=False).split())
    assert card.layers[0].answer in answers_only and card.layers[1].answer in answers_only
    assert "□" not in answers_only and "Score" not in answers_only
    chained = " ".join(drill.capstone_text(card, follow_ups=True).split())
    assert all(f.question in chained and f.answer in chained and f.notebook in chained for f in card.follow_ups)
    with pytest.raises(LabkitError, match="junior, middle, senior, principal"):
        drill.capstone_text(card, level="staff")
    assert cli.main(["drill", "capstone"]) == 0
    assert "4  principal" in capsys.readouterr().out
    assert cli.main(["drill", "capstone", "--level", "junior", "--follow-ups"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert card.follow_ups[-1].question in out and card.layers[1].answer[:40] not in out


@pytest.mark.parametrize("heard, deductions, score", [
    ({}, 0, 0),
    ({"junior": 3, "middle": 5, "senior": 5, "principal": 5}, 0, 0),       # a level below missing stops it
    ({"junior": 4}, 0, 1),
    ({"junior": 5, "middle": 4, "senior": 3, "principal": 5}, 0, 2),
    ({"junior": 4, "middle": 4, "senior": 4}, 0, 3),
    ({"junior": 4, "middle": 4, "senior": 4, "principal": 4}, 0, 4),       # principal is its own score
    ({"junior": 4, "middle": 4, "senior": 4, "principal": 4}, 2, 2),
    ({"junior": 4}, 3, 0),
])
def test_the_capstone_is_scored_0_to_4_with_four_of_five_per_level(heard, deductions, score):
    assert drill.capstone_score(heard, deductions) == score
    assert drill.RUBRIC_PASS == 4 and len(drill.CAPSTONE_SCALE) == 5


def test_notebook_10_shows_the_capstone_card():
    shown = [t for _, cell, t in _outputs(NB10) if "capstone_text(" in cell.source]
    assert len(shown) == 1 and "rubric" in shown[0].lower() and "Q You are implementing a job-queue table" in shown[0]


# -- the timed mock interview ---------------------------------------------------------------------


@pytest.fixture
def scores(tmp_path, monkeypatch):
    """A score file of the test's own; LABKIT_STATE_DIR points elsewhere, so a test that
    forgets --scores does not touch the user's file either."""
    monkeypatch.setenv("LABKIT_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "scores.jsonl"


def test_the_state_folder_and_its_override(tmp_path, monkeypatch):
    from labkit.core.files import state_dir

    monkeypatch.setenv("LABKIT_STATE_DIR", str(tmp_path / "mine"))
    assert interview.scores_path() == tmp_path / "mine" / "drill_scores.jsonl"
    assert interview.scores_path(tmp_path / "x.jsonl") == tmp_path / "x.jsonl"
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("LABKIT_STATE_DIR", str(tmp_path / "file"))
    with pytest.raises(LabkitError, match="is a file, not a folder.*unset it"):
        state_dir()
    monkeypatch.delenv("LABKIT_STATE_DIR")
    assert state_dir().name == "labkit"


def test_a_mock_with_the_capstone_asks_none_of_its_follow_ups_again(bank, card):
    """The bank's questions that ask a capstone follow-up again are marked same_as it, and a
    mock that asks the capstone leaves them out; a mock by topic or level keeps them."""
    again = {q.id: q.same_as for q in bank.questions if q.same_as}
    ids = {f.id: f for f in card.follow_ups}
    assert len(again) == 9 and set(again.values()) <= set(ids)
    assert again["q25"] == "f07" and "zombie" in bank["q25"].question and "paused past its lease" in ids["f07"].question
    for seed in range(5):
        asked = [i.id for i in interview.draw(seed=seed)[0]]
        assert asked[0] == "capstone" and not set(asked) & set(again)
        follow = {q for q, _, _ in interview.draw(seed=seed)[0][0].follow_ups}
        assert all(bank[q].question not in follow for q in asked[1:])
    assert "q25" in [i.id for i in interview.draw(topic="fencing", seed=1)[0]]


def test_a_mock_draws_the_capstone_first_then_a_seeded_order(bank):
    items, seed = interview.draw(seed=7)
    assert items[0].id == "capstone" and items[0].scale == drill.CAPSTONE_SCALE
    assert "□ " in items[0].model and "−1 each" in items[0].model and "20 s  " in items[0].model
    again = {q.id for q in bank.questions if q.same_as}
    assert sorted(i.id for i in items[1:]) == sorted(q.id for q in bank.questions if q.id not in again)
    assert seed == 7
    assert [i.id for i in interview.draw(seed=7)[0]] == [i.id for i in items]
    orders = {tuple(i.id for i in interview.draw(seed=s)[0]) for s in range(5)}
    assert len(orders) > 1
    fencing, _ = interview.draw(topic="fencing", seed=3)
    assert {i.topic for i in fencing} == {"fencing"} and "capstone" not in [i.id for i in fencing]
    assert all(i.model.startswith("20 s  ") and "\n60 s  " in i.model for i in fencing)
    seniors, _ = interview.draw(level="senior", seed=3)
    assert {i.level for i in seniors} == {"senior"} and len(seniors) == len(bank.select(level="senior"))
    assert interview.draw()[1] in range(10_000)                  # a seed of its own, told to the learner


@pytest.mark.parametrize("kwargs, expected", [
    ({"minutes": 0}, r"minutes=0 is too small.*Fix: pass minutes=20"),
    ({"minutes": -5}, r"too small.*Fix:"),
    ({"minutes": 1000}, r"more than .*180 minutes at most.*Fix: pass minutes=20"),
    ({"minutes": "soon"}, r"not a number.*Fix:"),
    ({"topic": "kafka"}, r"no topic 'kafka'.*Fix: use one of policies, convoy"),
    ({"level": "junior", "topic": "fencing"}, r"No question .* junior on topic fencing.*Fix: drop --level"),
])
def test_a_mock_refuses_bad_input_with_the_fix(scores, kwargs, expected):
    with pytest.raises(LabkitError, match=expected) as refused:
        interview.TerminalMock(**{"minutes": 20, **kwargs}, scores=scores)
    assert "\n" not in str(refused.value)                          # one paragraph
    assert not scores.exists()


def test_a_terminal_mock_from_a_stream(scores):
    import io

    first = interview.draw(topic="fencing", seed=11)[0][0]
    n = len(first.follow_ups)
    answers = io.StringIO("\n" * n + "\n" + "7\n" + "2\n" + "q\n")     # every follow-up, the model, a bad score, 2
    out = io.StringIO()
    mock = interview.TerminalMock(20, topic="fencing", seed=11, scores=scores, stdin=answers, out=out)
    kept = mock.run()
    text = out.getvalue()
    assert [(i.id, s) for i, s in kept] == [(first.id, 2)]
    positions = [text.index(q) for q, _, _ in first.follow_ups]
    assert positions == sorted(positions) and text.index("── the model") > positions[-1]
    assert f"follow-up {n} of {n}" in text and "20:00 left" in text
    assert "a score is 0, 1, 2 or 3" in text and f"kept: fencing 2/3 ({first.id})" in text
    assert "[20:00 left] " in text                                   # the time left, in front of each prompt
    assert "--seed 11 asks the same questions again" in text
    records, bad = interview.Scores(scores).read()
    assert bad == 0 and [(r["question"], r["topic"], r["level"], r["score"]) for r in records] == [
        (first.id, "fencing", first.level, 2)]


def test_skipping_to_the_model_and_leaving_a_question_unscored(scores):
    import io

    out = io.StringIO()
    mock = interview.TerminalMock(5, seed=2, scores=scores, stdin=io.StringIO("s\n\n\ns\n3\n"), out=out)
    kept = mock.run()                        # the input ends after the second score: the mock stops
    text = out.getvalue()
    assert "capstone" in text.split("\n── 2 ·")[0] and "not scored" in text
    assert "── follow-up 1 of" not in text.split("\n── 2 ·")[0]       # s went straight to the model
    assert drill.CAPSTONE_SCALE[4] in text and "Your score, 0 to 4" in text   # the capstone: its rubric, 0-4
    assert [s for _, s in kept] == [3] and kept[0][0].id != "capstone"
    assert len(interview.Scores(scores).read()[0]) == 1


class _Ticks:
    """A clock that moves on ``step`` seconds each time it is read: the mock's time passes
    while it waits, with no real waiting and the same result on every run."""

    def __init__(self, step: float):
        self.t, self.step = 0.0, step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


def _pipe():
    """A stdin with a file descriptor, and the end the test writes the learner's keys to."""
    read, write = os.pipe()
    return os.fdopen(read, "r"), write


def _screen(write: int, score: bytes, tty: bool = False):
    """What the mock writes to; the learner types ``score`` into ``write`` once asked."""
    import io

    class Screen(io.StringIO):
        def isatty(self):
            return tty

        def write(self, text):
            if "Your score" in text:
                os.write(write, score)
            return super().write(text)

    return Screen()


def test_when_the_time_runs_out_while_it_waits_the_question_ends_then(scores):
    """The learner presses nothing: the clock ticks, warns at two minutes, and ends the
    question when the time is up; the score still waits for the learner."""
    first = interview.draw(topic="leases", seed=3)[0][0]
    stdin, write = _pipe()
    out = _screen(write, b"1\n")
    mock = interview.TerminalMock(3, topic="leases", seed=3, scores=scores, stdin=stdin, out=out,
                                  now=_Ticks(1.0), tick=0.001)
    try:
        kept = mock.run()
    finally:
        os.close(write)
        stdin.close()
    text = out.getvalue()
    waited = text.split("Time is up: the model, and your score.")[0]
    assert "── follow-up 1 of" not in waited                             # no key was pressed
    minutes = re.findall(r"\n(\d):\d\d left\n\[ *\d:\d\d left\] ", waited)   # a line a minute, not a tty
    assert text.count(interview.WARNING) == 1 and minutes == ["0"]
    assert waited.index(interview.WARNING) < waited.index("\n0:")
    assert len(re.findall(r"\[ *\d:\d\d left\] ", waited)) == 3     # the prompt, then once a minute
    assert "\n── the model" in text and f"kept: leases 1/3 ({first.id})" in text
    assert "\nTime is up.\n" in text and "\n── 2 ·" not in text
    assert [(i.id, s) for i, s in kept] == [(first.id, 1)]


def test_on_a_terminal_the_time_left_is_redrawn_in_place(scores):
    stdin, write = _pipe()
    out = _screen(write, b"\n", tty=True)                 # asked for a score, the learner leaves it out
    mock = interview.TerminalMock(1, topic="fencing", seed=1, scores=scores, stdin=stdin, out=out,
                                  now=_Ticks(1.0), tick=0.001)
    try:
        mock.run()
    finally:
        os.close(write)
        stdin.close()
    text = out.getvalue()
    redraws = re.findall(r"\0337\r\[ *(\d+:\d\d) left\] \0338", text)
    assert len(redraws) >= 10 and redraws == sorted(redraws, reverse=True)
    assert interview.WARNING not in text                                # a one-minute mock is not warned
    assert "Time is up: the model, and your score." in text


def test_the_terminal_clock_ticks_in_real_time(scores):
    """Once with real time: a mock of three seconds, nothing pressed, ends the question
    after about three seconds, having redrawn the clock on the way."""
    import time

    stdin, write = _pipe()
    out = _screen(write, b"q\n", tty=True)
    mock = interview.TerminalMock(0.05, topic="fencing", seed=1, scores=scores, stdin=stdin, out=out, tick=0.5)
    started = time.monotonic()
    try:
        mock.run()
    finally:
        os.close(write)
        stdin.close()
    took = time.monotonic() - started
    text = out.getvalue()
    assert 2.9 <= took < 6, took
    assert "Time is up: the model, and your score." in text
    assert len(re.findall(r"\0337\r\[", text)) >= 4


def test_the_report_averages_per_topic_and_names_what_to_revisit(scores, bank):
    book = interview.Scores(scores)
    assert interview.report(scores).startswith("No mock interview scored yet")
    items = {i.topic: i for i in interview.draw(seed=1)[0]}
    for topic, score in [("fencing", 1), ("fencing", 0), ("policies", 3), ("policies", 2), ("drain", 1),
                         ("drain", 3)]:
        book.add(items[topic], score)
    with open(scores, "a") as f:
        f.write('{"topic": "fencing", "score": 9}\nnot json\n')
    text = interview.report(scores)
    lines = text.splitlines()
    assert lines[0] == "Mock interviews · 6 answers scored, 0-3 each, on 3 topics"
    rows = [line.split() for line in lines[2:5]]
    assert rows == [["fencing", "2", "0.5", "0"], ["drain", "2", "2.0", "3"], ["policies", "2", "2.5", "2"]]
    assert "revisit: fencing (08_fencing_tokens.ipynb)" in text and "drain (" not in text
    assert "not practised yet: convoy, claim," in " ".join(text.split())
    assert "policies," not in text.split("not practised yet:")[1]
    assert lines[-1] == "(2 unreadable line(s) of the score file left out)"
    with pytest.raises(LabkitError, match="score 0 to 3"):
        book.add(items["fencing"], 4)
    capstone = interview.draw(seed=1)[0][0]
    assert book.add(capstone, 4)["out_of"] == 4                   # the capstone is scored 0-4
    with open(scores, "a") as f:                                  # a capstone line from before out_of
        f.write('{"question": "capstone", "topic": "policies", "score": 3}\n')
    text = interview.report(scores)
    assert "capstone, 0-4: 2 scored, latest 3 (senior), best 4 (principal)" in text
    assert text.splitlines()[0] == "Mock interviews · 6 answers scored, 0-3 each, on 3 topics"
    with pytest.raises(LabkitError, match="score 0 to 4"):
        book.add(capstone, 5)


def _labkit(*args, stdin="", env=None):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "labkit", *args], input=stdin, capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


def test_labkit_drill_mock_in_a_terminal_reads_its_answers_from_stdin(tmp_path):
    state = tmp_path / "state"
    first, second = interview.draw(topic="drain", seed=5)[0][:2]
    run = _labkit("drill", "mock", "--minutes", "10", "--topic", "drain", "--seed", "5",
                  stdin="s\n3\n\ns\n1\nq\n", env={"LABKIT_STATE_DIR": str(state)})
    assert run.returncode == 0, run.stderr
    assert f"── 1 · {first.id}" in run.stdout and f"── 2 · {second.id}" in run.stdout
    assert f"This mock: {first.id} 3 · {second.id} 1." in " ".join(run.stdout.split())
    records = [json.loads(line) for line in (state / "drill_scores.jsonl").read_text().splitlines()]
    assert [(r["question"], r["score"]) for r in records] == [(first.id, 3), (second.id, 1)]
    report = _labkit("drill", "mock", "--report", env={"LABKIT_STATE_DIR": str(state)})
    assert report.returncode == 0 and ["drain", "2", "2.0", "1"] in [x.split() for x in report.stdout.splitlines()]
    assert f"scores: {state / 'drill_scores.jsonl'}" in report.stdout
    own = tmp_path / "own.jsonl"
    assert _labkit("drill", "mock", "--topic", "drain", "--seed", "5", "--scores", str(own),
                   stdin="s\n2\n", env={"LABKIT_STATE_DIR": str(state)}).returncode == 0
    assert len(own.read_text().splitlines()) == 1 and len((state / "drill_scores.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize("args, expected", [
    (["--minutes", "0"], "--minutes=0 is too small: it must be above 0 to 180 minutes. Fix: pass --minutes=20"),
    (["--minutes", "-1"], "Fix: pass --minutes=20"),
    (["--topic", "kafka"], "There is no topic 'kafka'. Fix: use one of policies"),
    (["--scores", "/nonexistent/folder/s.jsonl"], "does not exist. Fix: create it"),
])
def test_labkit_drill_mock_refuses_bad_input_in_one_paragraph(tmp_path, args, expected):
    run = _labkit("drill", "mock", *args, env={"LABKIT_STATE_DIR": str(tmp_path)})
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and expected in run.stderr and "Traceback" not in run.stderr


def test_ctrl_c_stops_the_terminal_mock_cleanly_and_keeps_the_scores(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    path = tmp_path / "scores.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "labkit", "drill", "mock", "--topic", "fencing", "--seed", "3",
                             "--scores", str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        proc.stdin.write("s\n2\n")
        proc.stdin.flush()
        deadline = time.monotonic() + 60
        while not (path.exists() and path.read_text().endswith("\n")) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)                                    # now waiting at "the next question"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in out + err and "KeyboardInterrupt" not in out + err
    assert "interrupted: 1 score kept in" in out
    assert [json.loads(line)["score"] for line in path.read_text().splitlines()] == [2]


def test_the_mock_widget_reveals_scores_and_reads_as_text(scores):
    t = [0.0]
    mock = interview.MockInterview(20, topic="fencing", seed=1, scores=scores, now=lambda: t[0])
    first = mock.current
    assert repr(mock.box) == (f"Mock interview: 20 min · {first.id} ({first.level}, fencing) · "
                              f"{len(first.follow_ups)} follow-ups, one at a time; score 0-3")
    assert "VBox(children=" not in repr(mock.box) and len(repr(mock.box)) <= 96
    assert all(b.disabled for b in mock.score_buttons) and "20:00 left" in mock.clock_label.value
    mock.follow_button.click()
    assert mock.shown == 1 and first.follow_ups[0][0][:30] in " ".join(mock.text().split())
    assert "The model:" not in mock.text()
    mock.model_button.click()
    assert mock.model_shown and "The model:" in mock.text() and first.model.split("\n")[0] in mock.text()
    assert mock.follow_button.disabled and not any(b.disabled for b in mock.score_buttons)
    mock.score_buttons[2].click()
    assert all(b.disabled for b in mock.score_buttons) and "kept: fencing 2/3" in mock.text()
    assert [(r["question"], r["score"]) for r in interview.Scores(scores).read()[0]] == [(first.id, 2)]
    mock.next_button.click()
    assert mock.current is not first and mock.shown == 0 and not mock.model_shown
    t[0] = 20 * 60 + 1                                # the time runs out: the next reveal shows the model
    mock.follow_button.click()
    assert mock.model_shown and mock.shown == 0 and "Time is up" in mock.text()
    assert mock.clock_label.value == "time is up" and mock.next_button.disabled


def test_the_mock_widget_clock_ticks_warns_and_ends_the_question(scores):
    """tick() is what the clock's thread does each second: with a clock the test moves, the
    label follows, the warning comes at two minutes, and the time-up ends the question at
    once, with no button pressed; the capstone is scored 0-4."""
    t = [0.0]
    mock = interview.MockInterview(5, seed=1, scores=scores, now=lambda: t[0])
    assert mock.current.id == "capstone" and "; score 0-4" in repr(mock.box)
    assert [b.layout.display for b in mock.score_buttons] == [None] * 5
    mock.follow_button.click()
    labels = []
    for now in (1.0, 2.0, 59.5, 179.0, 181.0):
        t[0] = now
        mock.tick()
        labels.append(mock.clock_label.value)
    assert labels == ["4:59 left", "4:58 left", "4:01 left", "2:01 left", "1:59 left"]
    assert mock.warned and interview.WARNING in mock.text() and not mock.model_shown
    t[0] = 300.0
    mock.tick()
    assert mock.model_shown and "Time is up" in mock.text() and mock.follow_button.disabled
    assert mock.next_button.disabled and mock.finished and mock.clock_label.value == "time is up"
    mock.score_buttons[4].click()
    assert [(r["question"], r["score"], r["out_of"]) for r in interview.Scores(scores).read()[0]] == [("capstone", 4, 4)]
    bank_mock = interview.MockInterview(5, topic="fencing", seed=1, scores=scores, now=lambda: t[0])
    assert [b.layout.display for b in bank_mock.score_buttons] == [None] * 4 + ["none"]


def test_the_mock_widget_clock_thread_ticks_in_real_time_and_stops():
    """Once with real time: the thread redraws the label each tick, ends the question when
    the time is up and leaves no thread behind; closing the widget stops it too."""
    import threading
    import time

    mock = interview.MockInterview(0.05, topic="fencing", seed=1, tick=0.25)
    seen = []
    mock.clock_label.observe(lambda change: seen.append(change["new"]), "value")
    mock.start()
    mock.ticker.join(timeout=10)
    assert not mock.ticker.is_alive() and mock.model_shown and mock.finished
    assert seen[-1] == "time is up" and len(set(seen)) >= 3, seen
    closed = interview.MockInterview(20, topic="fencing", seed=1, tick=0.05)
    closed.start()
    time.sleep(0.2)
    closed.close()
    assert not closed.ticker.is_alive()
    assert not [th for th in threading.enumerate() if th.name == "labkit-mock-clock"]


def test_the_notebook_mock_shows_a_static_view():
    shown = [t for _, cell, t in _outputs(NB10) if "interview.mock(" in cell.source]
    assert any(t.startswith("Mock interview: 20 min · capstone (senior, policies)") for t in shown), shown
    assert all("VBox(children=" not in t for t in shown)
