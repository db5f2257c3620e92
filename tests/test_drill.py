"""The interview drill: the question bank and the quiz are validated; the flashcards and
the quiz widget work without a browser; the self-checks run the reader's SQL on the real
server and tell right from wrong."""

import copy
import os
import re
from pathlib import Path

import pytest
import yaml

from labkit import cli
from labkit.core.errors import LabkitError
from labkit.tools import drill

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


def test_every_topic_is_used_and_names_a_known_notebook(bank):
    used = {q.topic for q in bank.questions}
    assert used == set(bank.topics)
    assert all(t.notebook in drill.NOTEBOOKS for t in bank.topics.values())


def test_the_bank_names_the_notebooks_that_exist():
    """Notebooks 02-09 may not be written yet. For those that are, the bank's names must be
    their real file names, and each one needs at least one question."""
    present = sorted(p.name for p in NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
    assert "01_one_lock_three_policies.ipynb" in present
    named = {q.notebook for q in drill.load_bank().questions} | {c.notebook for c in drill.load_costly()}
    for name in present:
        if name[:2] in {f"{i:02d}" for i in range(1, 10)}:
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
])
def test_validation_catches_a_broken_bank(raw_bank, breakage, expected):
    broken = copy.deepcopy(raw_bank)
    breakage(broken)
    problems = drill.validate_bank(broken)
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


def test_the_quiz_holds_the_classic_costly_answers_and_more(costly):
    assert len(costly) >= 12
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
])
def test_validation_catches_a_broken_quiz(raw_costly, raw_bank, breakage, expected):
    broken = copy.deepcopy(raw_costly)
    breakage(broken)
    problems = drill.validate_costly(broken, raw_bank["topics"])
    assert any(expected in p for p in problems), problems


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


def test_quiz_widget_checks_and_scores(costly):
    q = drill.Quiz(costly[:3])
    assert q.check() is None and "Pick one" in q.verdict.value
    first = costly[0]
    q.choice.index = "abcd".index(first.answer)
    assert q.check() is True and "Right." in q.verdict.value
    q.next_button.click()
    second = costly[1]
    q.choice.index = ("abcd".index(second.answer) + 1) % len(second.choices)
    assert q.check() is False and f"the answer is {second.answer})" in q.verdict.value
    assert "score: 1 right of 2 checked (3 in all)" in q.verdict.value
    assert repr(q.box).startswith("Quiz: 3 statements")


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
