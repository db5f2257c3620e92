"""Session plans: plans.yaml validated, every item timed from its slides, the presenter's guide's
tables equal to the data, and `labkit slides --plan` building exactly the plan's deck."""

import re

import nbformat
import pytest
import yaml

from labkit.core.errors import LabkitError
from labkit.tools import drill, plans, training
from labkit.tools.nbtools import NOTEBOOKS

# Built from the committed notebooks and plans.yaml: no server involved.
pytestmark = pytest.mark.default_leg

PLANS = plans.load_plans()
MEASURED = plans.run_seconds()


def test_the_guide_has_a_60_and_a_90_minute_plan_that_add_up_exactly():
    assert set(PLANS) == {"60", "90"}
    for name, plan in PLANS.items():
        parts = [plan.introduction, *(i.minutes for i in plan.items), plan.questions, plan.buffer]
        assert plan.minutes == int(name) == sum(parts), name
        assert plan.buffer >= plans.MIN_BUFFER and plan.introduction > 0 and plan.questions > 0, name
        assert all(i.fallback for i in plan.items if i.mode == "live"), name


def test_the_90_minute_plan_carries_what_a_senior_interview_asks():
    shown = {(i.notebook[:2], s.split(" · ")[0]) for i in PLANS["90"].items for s in i.sections}
    # the claim and the three policies, the durable claim, why it needs a lease, and the drill
    assert {("01", "The job table and the claim"), ("01", "1"), ("01", "2"), ("03", "1"), ("04", "1"),
            ("20", "3")} <= shown
    quiz, = [i for i in PLANS["90"].items if i.quiz]
    assert 3 <= len(quiz.quiz) <= 4 and quiz.mode == "shown"


@pytest.mark.parametrize("name", sorted(PLANS))
def test_every_item_has_at_least_the_minutes_its_slides_take(name):
    for item in PLANS[name].items:
        est = plans.item_estimate(item, MEASURED)
        assert est.slides > 0
        assert item.minutes >= est.minutes, (f"plan {name}, {item.label()}: {item.minutes} min planned, "
                                             f"{est.minutes:.1f} estimated from {est.slides} slides")


def _deck(*cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = list(cells)
    return nb


def _md(text, kind="-"):
    cell = nbformat.v4.new_markdown_cell(text)
    cell.metadata["slideshow"] = {"slide_type": kind}
    return cell


def test_the_timing_model_counts_slides_words_code_and_live_runs():
    words = " ".join(f"w{i}" for i in range(plans.WORDS_PER_MIN))       # a minute's worth
    one = plans.estimate(_deck(_md(words, "slide")))
    assert (one.slides, one.seconds) == (1, plans.SLIDE_S + 60)
    # notes that repeat the slide add nothing; new words in them do
    assert plans.estimate(_deck(_md(words, "slide"), _md(words, "notes"))).seconds == one.seconds
    more = plans.estimate(_deck(_md(words, "slide"), _md(words.replace("w", "n"), "notes")))
    assert more.seconds == plans.SLIDE_S + 120
    code = nbformat.v4.new_code_cell("a = 1\n\nb = 2\n")
    code.metadata["slideshow"] = {"slide_type": "-"}
    code.outputs = [nbformat.v4.new_output("stream", text="x\n" * 500)]
    shown = plans.estimate(_deck(_md("## A heading", "slide"), code))
    assert shown.seconds == pytest.approx(plans.SLIDE_S + 60 * 2 / plans.WORDS_PER_MIN
                                          + 2 * plans.CODE_LINE_S + plans.OUTPUT_MAX_S)
    live = plans.estimate(_deck(_md("## A heading", "slide"), code), live=True, run_s=12.5)
    assert live.seconds == pytest.approx(shown.seconds + plans.LIVE_CELL_S + plans.SWITCH_S + 12.5)


def test_the_timing_model_prices_the_talk_around_the_slides():
    box = plans.estimate(_deck(_md("> **Say it in an interview.** *x*", "slide")))
    plain = plans.estimate(_deck(_md("> **Say so in an interview.** *x*", "slide")))
    assert box.seconds == pytest.approx(plain.seconds + plans.INTERVIEW_S)
    assert plans.estimate(_deck(_md("Predict, then run", "slide"))).seconds == pytest.approx(
        plans.estimate(_deck(_md("Guess, then run", "slide"))).seconds + plans.PREDICT_S)
    code = nbformat.v4.new_code_cell("t.print()")
    code.metadata["slideshow"] = {"slide_type": "-"}
    rows = "".join(f"{n}   BEGIN  → BEGIN\n" for n in range(1, 101))
    code.outputs = [nbformat.v4.new_output("stream", text="#   A   note\n--  ---  ----\n" + rows + "4'  done\n")]
    read = plans.estimate(_deck(_md("## T", "slide"), code))
    code.outputs[0].text = "a   note\n" + rows       # no transcript: a line a second, at most a minute
    assert read.seconds == pytest.approx(plans.estimate(_deck(_md("## T", "slide"), code)).seconds
                                         - plans.OUTPUT_MAX_S + 101 * plans.TRANSCRIPT_ROW_S)
    two = _deck(_md("## T", "slide"), code, copy_cell(code), _md("next", "subslide"), copy_cell(code))
    assert plans.estimate(two, live=True).seconds == pytest.approx(
        plans.estimate(two).seconds + 3 * plans.LIVE_CELL_S + 2 * plans.SWITCH_S)


def copy_cell(cell):
    return nbformat.from_dict(cell)


def test_an_item_takes_the_introduction_and_leaves_out_named_sub_sections():
    nb = nbformat.read(NOTEBOOKS / "01_one_lock_three_policies.ipynb", as_version=4)
    intro = plans.section_cells(nb, plans.INTRO)
    assert [c.cell_type for c in intro] == ["markdown"] and intro[0].source.startswith("# 01 · ")
    heading = plans.section_headings(nb)[2]
    whole = plans.section_cells(nb, heading)
    subs = plans._subheadings(whole)
    cut = plans.section_cells(nb, heading, skip=(subs[-1],))
    assert plans._subheadings(cut) == subs[:-1] and 0 < len(cut) < len(whole)
    assert not any("LOCK_1" in c.source for c in plans.section_cells(nb, heading, skip=tuple(subs)))


def test_section_run_seconds_come_from_the_cells_timing():
    nb = _deck(_md("## 1 · First"), nbformat.v4.new_code_cell("x"), _md("## 2 · Second"),
               nbformat.v4.new_code_cell("y"))
    nb.cells[1].metadata["execution"] = {"iopub.execute_input": "2026-01-01T10:00:00.000000Z",
                                         "shell.execute_reply": "2026-01-01T10:00:02.500000Z"}
    assert plans.section_run_seconds(nb) == {"1 · First": 2.5}


def _write(tmp_path, change):
    data = yaml.safe_load(plans.PLANS_FILE.read_text())
    change(data)
    path = tmp_path / "plans.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    return path


def _item(data, plan="90", n=0):
    return data["plans"][plan]["items"][n]


def _move_buffer(plan, buffer):
    """The plan with ``buffer`` minutes of buffer, its total kept by the questions' minutes."""
    plan.update(questions=plan["questions"] + plan["buffer"] - buffer, buffer=buffer)


BAD = {
    "a section that does not exist": (lambda d: _item(d).update(sections=[1, 9]),
                                      "01_one_lock_three_policies has no section 9"),
    "a heading that does not exist": (lambda d: _item(d).update(sections=["The wait"]),
                                      "has no section 'The wait'"),
    "minutes that do not add up": (lambda d: _item(d).update(minutes=_item(d)["minutes"] + 1),
                                   "add up to 91 minutes"),
    "a buffer under five minutes": (lambda d: _move_buffer(d["plans"]["60"], 3), "the buffer is 3"),
    "a live demo without a fallback": (lambda d: _item(d).pop("fallback"), "a live demo has no `fallback`"),
    "no such notebook": (lambda d: _item(d).update(notebook="01_one_lock"), "there is no notebook 01_one_lock"),
    "a mode that is neither": (lambda d: _item(d).update(mode="demo"), "`mode` is 'demo'"),
    "minutes that are not a number": (lambda d: _item(d).update(minutes="ten"), "`minutes` must be a whole"),
    "a section named twice": (lambda d: _item(d).update(sections=[1, "1 · Wait: the default"]), "named twice"),
    "no introduction": (lambda d: d["plans"]["90"].pop("introduction"), "plan 90, introduction: `minutes`"),
    "no expected answer": (lambda d: _item(d).pop("expect"), "`expect` must be some text"),
    "a sub-heading that does not exist": (lambda d: _item(d).update(skip=["Exercise 9"]),
                                          "no sub-heading 'Exercise 9'. Their sub-headings: One row lock"),
    "a quiz statement that does not exist": (lambda d: _item(d, n=3).update(quiz=["c01", "c99"]),
                                             "no quiz statement 'c99'"),
    "a question asked before the first section": (lambda d: _item(d, n=2).update(ask_before="introduction"),
                                                  "not one of the item's sections"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_plan_data_gets_an_error_naming_the_fix(tmp_path, case):
    change, said = BAD[case]
    with pytest.raises(LabkitError) as err:
        plans.load_plans(_write(tmp_path, change))
    assert said in str(err.value)
    assert err.value.fix


def test_unreadable_plan_files_get_an_error_naming_the_fix(tmp_path):
    broken = tmp_path / "plans.yaml"
    broken.write_text("plans: [unclosed\n")
    with pytest.raises(LabkitError, match="not valid YAML"):
        plans.load_plans(broken)
    broken.write_text("- a list\n")
    with pytest.raises(LabkitError, match="no `plans:` mapping"):
        plans.load_plans(broken)
    with pytest.raises(LabkitError, match="no session plan '45'.*choose one of: 60, 90"):
        plans.load_plan("45")


def test_the_presenters_guide_tables_are_the_data():
    guide = (NOTEBOOKS / "README.md").read_text()
    section = guide.split("## Session plans\n", 1)[1].split("\n## ", 1)[0]
    for plan in PLANS.values():
        assert plans.readme_table(plan) in section, (
            f"notebooks/README.md, Session plans: the {plan.name}-minute table is not plans.yaml's; "
            "paste labkit.tools.plans.readme_table(plan)")
    assert section.count("| minutes |") == len(PLANS)
    # the running-order parser must not mistake a plan's rows for notebooks
    assert set(training.presenters_guide()) == {p.stem for p in sorted(NOTEBOOKS.glob("[0-9]*.ipynb"))}


def _short_names():
    import nbformat

    from labkit.tools import training
    from labkit.tools.nbtools import NOTEBOOKS

    return [training.short_name(nbformat.read(p, as_version=4)) for p in sorted(NOTEBOOKS.glob("[0-9]*.ipynb"))]


# An item's first heading names its notebook: "03 · Claim, mark, commit — … — 1 · The durable claim".
ITEM_NAME = re.compile("^(?:" + "|".join(re.escape(n) for n in _short_names()) + ") — ")


def _headings(html, level, *, names=False):
    found = re.findall(rf"<h{level}[^>]*>(.*?)</h{level}>", html, re.S)
    shown = [re.sub(r"<[^>]+>|¶", "", h).strip() for h in found]
    return shown if names else [ITEM_NAME.sub("", h) for h in shown]


@pytest.fixture(scope="module")
def deck90(tmp_path_factory):
    from labkit.cli import main

    out = tmp_path_factory.mktemp("plan")
    assert main(["slides", "--plan", "90", "--out", str(out)]) == 0
    return out / "plan-90.slides.html"


def test_the_plan_deck_holds_exactly_the_plans_sections(deck90):
    plan = PLANS["90"]
    html = deck90.read_text()
    assert (deck90.parent / "reveal.js" / "dist").is_dir()
    assert training.remote_references(html) == []
    assert _headings(html, 2) == [s for i in plan.items for s in i.sections if s != plans.INTRO]
    named = [h for h in _headings(html, 2, names=True) if ITEM_NAME.match(h)]
    assert [h[:2] for h in named] == [i.notebook[:2] for i in plan.items if i.sections[0] != plans.INTRO]
    titles = [training.NOTEBOOKS and f"{i.notebook[:2]} · " for i in plan.items if plans.INTRO in i.sections]
    h1 = _headings(html, 1)
    assert h1[0] == "Claim Lab in 90 minutes" and h1[-2:] == ["Your questions", "What we saw"]
    assert [h[:5] for h in h1[1:-2]] == titles
    notes = [re.sub(r"<[^>]+>", "", n) for n in re.findall(r'<aside class="notes">(.*?)</aside>', html, re.S)]
    firsts = [n for n in notes if "Ask the room:" in n]
    assert len(firsts) == len(plan.items)
    for item, at, note in zip(plan.items, plans.starts(plan), firsts):
        assert f"At {plans.clock(at)} · " in note
        assert f"{item.minutes} min · {item.mode}" in note and item.label() in note
        assert " ".join(item.ask.split()[:6]) in note and " ".join(item.expect.split()[:6]) in note
        assert ("If the live run misbehaves:" in note) == (item.mode == "live")
        assert " ".join(item.fallback.split()[:5]) in note
        assert ("from the top" in note) == (item.mode == "live")
        assert all(f"“{s}”" in note for s in item.skip)
    assert "90 minutes in all" in notes[0] and f"buffer {plan.buffer}" in notes[0]
    title = html.split('<aside class="notes">', 1)[0]
    assert all(f"<strong>{plans.clock(at)}</strong>" in title for at in plans.starts(plan)[:-1])


def test_the_plan_deck_asks_before_the_slide_that_answers(deck90):
    html = re.sub(r"\s+", " ", deck90.read_text())
    asking = [i for i in PLANS["90"].items if i.ask_before]
    assert {i.notebook[:2] for i in asking} == {"01", "03", "04"}
    for item in asking:             # the question's own slide, then the section that answers it
        ask = html.index("<strong>Before we look:</strong> " + " ".join(item.ask.split()[:4]))
        heading = re.compile(r"<h2[^>]*>[^<]*" + re.escape(item.ask_before.split(" · ")[-1][:20]))
        answers = heading.search(html, ask).start()
        between = html[ask:answers]         # the question's slide and its notes, nothing shown
        assert "<pre" not in between and not re.search(r"<h[1-4]", between), (
            f"{item.label()}: something is shown between the question and the slide that answers it")


def test_the_quiz_slides_show_the_choices_in_the_files_order_and_the_key_in_the_notes(deck90):
    html = re.sub(r"\s+", " ", deck90.read_text())
    item, = [i for i in PLANS["90"].items if i.quiz]
    costly = {c.id: c for c in drill.load_costly()}
    for qid in item.quiz:
        c = costly[qid]
        slide = html.split(f"{qid} · what is wrong?", 1)[1].split("</section>", 1)[0]
        shown, notes = slide.split('<aside class="notes">', 1)
        at = [shown.index(f"<strong>{letter})</strong>") for letter in drill.LETTERS[:len(c.choices)]]
        assert at == sorted(at)
        for letter, choice in zip(drill.LETTERS, c.choices):
            assert " ".join(choice.split()[:6]) in re.sub(r"<[^>]+>", "", shown.split(f"{letter})</strong>", 1)[1])
        assert f"Answer: {c.answer})" in re.sub(r"<[^>]+>", "", notes) and c.why.split()[0] in notes
        assert f"Answer: {c.answer}" not in shown
        assert f"{qid}: {c.answer}" in item.expect
    assert "the notebook’s quiz widget shuffles" in html.replace("'", "’")


def test_plan_deck_slides_match_the_estimate_and_the_other_plan(deck90, tmp_path):
    html = deck90.read_text()
    leaves = len(re.findall(r"<section(?![^>]*>\s*<section)", html))
    built = plans.estimate(training.deck_notebook(plans.plan_notebook(PLANS["90"], MEASURED))).slides
    assert leaves == built == plans.OWN_SLIDES + sum(plans.item_estimate(i, MEASURED).slides for i in PLANS["90"].items)
    assert f"; {built} slides" in plans.summary(PLANS["90"], MEASURED)
    sixty = plans.plan_slides("60", tmp_path, quiet=True)
    assert _headings(sixty.read_text(), 2) == [s for i in PLANS["60"].items for s in i.sections]


def test_plan_deck_takes_no_notebooks(tmp_path, capsys):
    from labkit.cli import main

    assert main(["slides", "--plan", "90", str(NOTEBOOKS / "00_start_here.ipynb"), "--out", str(tmp_path)]) == 2
    assert "takes no notebooks" in capsys.readouterr().err
    assert main(["slides", "--plan", "45", "--out", str(tmp_path)]) == 2
    assert "choose one of: 60, 90" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_plan_deck_check_without_chromium_names_the_fix(tmp_path, monkeypatch, capsys):
    from labkit.cli import main

    monkeypatch.setenv("LABKIT_CHROMIUM", str(tmp_path / "no-such-browser"))
    out = tmp_path / "out"
    assert main(["slides", "--plan", "90", "--check", "--out", str(out)]) == 2
    assert "apt-get install chromium" in capsys.readouterr().err
    assert not out.exists()


def test_the_plan_deck_fits_a_1280x720_projector(tmp_path, capsys):
    """`labkit slides --plan 90 --check`: the browser check of the decks, on the plan's deck."""
    from browser import find_chromium

    from labkit.cli import main

    find_chromium()
    code = main(["slides", "--plan", "90", "--check", "--out", str(tmp_path)])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "1 decks" in out.out and "0 problem(s)" in out.out and "plan-90.slides.html" in out.out
