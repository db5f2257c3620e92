"""Training mode: offline slide decks, the handout book, student copies without solutions."""

import json
import re

import nbformat
import pytest
from browser import Browser
from conftest import reprs_in

from labkit.tools import training
from labkit.tools.nbtools import NOTEBOOKS

# The decks and handouts are built from the committed outputs and checked in a browser; the
# student copies are made from the notebooks: none of it depends on which server answers.
pytestmark = pytest.mark.default_leg

ALL = sorted(NOTEBOOKS.glob("[0-9]*.ipynb"))


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """`labkit slides --check` over all decks, as CI runs it: its exit code, what it printed and
    the decks it built.  The deck tests read these decks, so they are built once."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from browser import find_chromium

    from labkit.cli import main

    find_chromium()
    out = tmp_path_factory.mktemp("slides")
    printed, said = io.StringIO(), io.StringIO()
    with redirect_stdout(printed), redirect_stderr(said):
        code = main(["slides", "--check", "--out", str(out)])
    return code, printed.getvalue(), said.getvalue(), [out / (p.stem + ".slides.html") for p in ALL]


@pytest.fixture(scope="module")
def decks(request, tmp_path_factory):
    """Every notebook's deck: the checked ones where a browser is installed, else built here."""
    try:
        return request.getfixturevalue("checked")[3]
    except pytest.skip.Exception:
        return training.slides(out=tmp_path_factory.mktemp("slides"), quiet=True)


@pytest.fixture(scope="module")
def pages(handouts):
    """Every notebook's handout page, from its committed outputs: the book `labkit book` built
    with no server and no kernel (the ``handouts`` fixture below), built once for both."""
    return [handouts / f"{p.stem}.html" for p in ALL]


@pytest.fixture(scope="module")
def browser():
    b = Browser()
    yield b
    b.close()


def test_every_cell_of_every_notebook_has_slide_metadata():
    for path in ALL:
        nb = nbformat.read(path, as_version=4)
        kinds = [c.metadata.get("slideshow", {}).get("slide_type") for c in nb.cells]
        assert None not in kinds, path.name
        assert kinds.count("slide") >= 2, f"{path.name}: a deck needs more than one slide"


def test_student_copies_are_up_to_date():
    assert training.student_copies(check=True) == [], "run `labkit student`"


def test_student_copies_hold_no_solutions_and_only_recorded_outputs():
    copies = sorted(training.STUDENT.glob("*.ipynb"))
    assert copies, "the exercise notebooks have student copies"
    for path in copies:
        nb = nbformat.read(path, as_version=4)
        text = "\n".join(c.source for c in nb.cells)
        assert "<summary>Answer</summary>" not in text
        assert "instructor's copy" in text
        for c in nb.cells:
            if c.cell_type != "code" or not c.get("outputs"):
                continue
            # only a recorded cell keeps its output, under the line that says it was recorded
            assert "recorded" in c.metadata.get("tags", []), (path.name, c.source[:60])
            assert c.outputs[0].text.startswith("[recorded when this notebook"), path.name


def test_a_stale_student_copy_is_detected(tmp_path, monkeypatch):
    monkeypatch.setattr(training, "STUDENT", tmp_path / "student")
    assert training.student_copies(check=True)  # nothing written there yet: all stale
    training.student_copies(quiet=True)
    assert training.student_copies(check=True) == []
    first = sorted((tmp_path / "student").glob("*.ipynb"))[0]
    first.write_text(first.read_text().replace("instructor's copy", "teacher's copy"))
    assert training.student_copies(check=True) == [first.name]


def test_slides_work_offline_in_a_browser(checked, browser):
    # `labkit slides --check` opened every deck from its file and failed on a console error or a
    # reveal.js that did not start (the test below); here: no deck asks the network for
    # anything, each has slides, and the index page opens.
    code, printed, said, decks = checked
    assert all(deck.exists() for deck in decks), printed + said
    for deck in decks:
        assert training.remote_references(deck.read_text()) == [], deck.name
    slides = dict(re.findall(r"^(\S+\.slides\.html): (\d+) slides", printed, re.M))
    assert sorted(slides) == sorted(d.name for d in decks), printed
    assert all(int(n) > 1 for n in slides.values()), printed
    index = decks[0].parent / "index.html"
    assert training.remote_references(index.read_text()) == []
    errors, _ = browser.open(index.as_uri())
    assert errors == []


def test_book_executes_notebooks_and_pages_open_without_errors(tmp_path, pages, browser):
    # Executing every notebook is what `labkit book` does; nbval already executes them all in
    # this suite, so here one notebook is executed for real and the rest use their outputs.
    training.book([str(ALL[0])], out=tmp_path, execute=True, quiet=True)
    page = tmp_path / (ALL[0].stem + ".html")
    assert "PostgreSQL" in page.read_text()
    # the kernels worked in schemas of their own, not in the reader's open notebooks' schemas
    import labkit
    from labkit.core.db import current_user_tag

    book_schema = labkit.schema_name("00_start_here", f"{current_user_tag()}_book")
    with labkit.connect(quiet=True).connect() as conn:
        assert conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (book_schema,)).fetchone()
    rest = pages[0].parent
    for html_page in [page, tmp_path / "index.html", *pages[1:], rest / "index.html"]:
        assert training.remote_references(html_page.read_text()) == [], html_page.name
        errors, _ = browser.open(html_page.as_uri())
        assert errors == [], f"{html_page.name}: {errors}"
    index = (rest / "index.html").read_text()
    for p in ALL:
        assert p.stem in index


def test_no_deck_or_handout_page_shows_a_widgets_repr(decks, pages):
    # a replay or a quiz shows its static view there; test_live_widgets shows this check failing
    # on a deck and a page built from a notebook whose replay output is the bare repr
    assert len(decks) == len(pages) == len(ALL)
    assert reprs_in(decks) == [], "decks showing a widget's repr (VBox(children=...))"
    assert reprs_in(pages) == [], "handout pages showing a widget's repr (VBox(children=...))"


def test_presenters_guide_lists_every_notebook_with_its_own_minutes():
    import re

    guide = (NOTEBOOKS / "README.md").read_text()
    rows = re.findall(r"^\| \d+ \| (\d\d_[a-z0-9_]+) \| (\d+) \|", guide, re.M)
    listed = {name: int(minutes) for name, minutes in rows}
    for path in ALL:
        meta = json.loads(path.read_text())["metadata"]["claimlab"]
        assert path.stem in listed, f"{path.stem} is missing from notebooks/README.md"
        assert listed[path.stem] == meta["minutes"], f"{path.stem}: guide and metadata disagree"


# -- decks a room can use: every heading starts a slide, every slide fits, notes for the presenter --
def test_a_heading_after_text_starts_a_cell_of_its_own():
    from labkit.tools.nbtools import split_markdown_at_headings

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(
        "Some text.\n\n```sql\n## not a heading: in a fence\n```\n\n> **Say it in an interview.** *\"x\"*\n\n"
        "**Exercise 1.** Why?\n\n<details><summary>Answer</summary>\n\n## inside the answer\n</details>\n\n"
        "## 2 · The next section\n\nIts text.\n\n### 2b · A part of it"), nbformat.v4.new_code_cell("1")]
    for cell in nb.cells:
        cell.metadata["slideshow"] = {"slide_type": "-"}
    assert split_markdown_at_headings(nb) == 4
    firsts = [c.source.split("\n", 1)[0] for c in nb.cells]
    assert firsts == ["Some text.", '> **Say it in an interview.** *"x"*', "**Exercise 1.** Why?",
                      "## 2 · The next section", "### 2b · A part of it", "1"]
    kinds = [c.metadata["slideshow"]["slide_type"] for c in nb.cells]
    assert kinds == ["-", "subslide", "subslide", "slide", "subslide", "-"]
    assert "## inside the answer" in nb.cells[2].source
    assert len({c.id for c in nb.cells}) == len(nb.cells)
    nbformat.validate(nb)


def test_no_committed_notebook_hides_a_heading_inside_a_cell():
    from labkit.tools.nbtools import split_points

    for path in ALL:
        nb = nbformat.read(path, as_version=4)
        hidden = [i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and split_points(c.source)]
        assert hidden == [], (f"{path.name}: cells {hidden} have a heading, interview box or exercise after "
                              "other text; split them (labkit.tools.nbtools.split_markdown_at_headings)")


def test_minutes_are_spread_over_the_sections_in_full():
    assert training.spread_minutes(35, [10, 30, 20, 40]) == [4, 10, 7, 14]
    assert sum(training.spread_minutes(25, [1, 1, 1, 200, 3])) == 25
    assert min(training.spread_minutes(25, [1, 1, 1, 200, 3])) == 1


def test_every_deck_has_speaker_notes_with_minutes_and_answers(decks):
    import re

    for path, deck in zip(ALL, decks):
        nb = nbformat.read(path, as_version=4)
        minutes = nb.metadata["claimlab"]["minutes"]
        text = deck.read_text()
        notes = re.findall(r'<aside class="notes">(.*?)</aside>', text, re.S)
        assert notes, f"{deck.name}: no speaker notes"
        assert f"{minutes} minutes in all" in notes[0], deck.name
        sections = sum(1 for c in nb.cells if c.cell_type == "markdown" and c.source.startswith("## "))
        assert sum("min</strong> for this section" in n for n in notes) == sections, deck.name
        answers = sum(len(training.ANSWER_RE.findall(c.source)) for c in nb.cells if c.cell_type == "markdown")
        assert sum(n.count("Expected answer:") for n in notes) == answers, deck.name
        boxes = sum(1 for c in nb.cells if c.cell_type == "markdown"
                    and c.source.startswith("> **Say it in an interview"))
        assert sum("Ask first:" in n for n in notes) == boxes, deck.name


def _deck(cells, slide_types=None):
    nb = nbformat.v4.new_notebook()
    nb.metadata["claimlab"] = {"minutes": 5, "title": "t"}
    nb.cells = cells
    for cell, kind in zip(cells, slide_types or ["slide"] * len(cells)):
        cell.metadata["slideshow"] = {"slide_type": kind}
    return nb


def _stream(text):
    return nbformat.v4.new_output("stream", name="stdout", text=text)


def _shown(nb):
    kinds = [c.metadata.get("slideshow", {}).get("slide_type", "-") for c in nb.cells]
    return [c for c, k in zip(nb.cells, kinds) if k not in ("notes", "skip")]


def test_setup_and_assert_only_cells_are_left_out_of_the_deck_and_markers_stripped():
    setup = nbformat.v4.new_code_cell('import labkit as lk\n\nlab = lk.setup("x")')
    setup.outputs = [_stream("PostgreSQL 18.6 · embedded: socket /tmp port 5432\n")]
    work = nbformat.v4.new_code_cell("# NBVAL_IGNORE_OUTPUT\nprint(lab.ping())")
    work.outputs = [_stream("pong\n")]
    checks = nbformat.v4.new_code_cell("assert lab.rows == 3   # all three rows came back\nassert lab.ok")
    shown_setup = nbformat.v4.new_code_cell('import labkit as lk\nlab = lk.setup("x")\nprint(1)')
    deck = training.deck_cells(_deck([nbformat.v4.new_markdown_cell("# T\n\nText."), setup, work, checks,
                                      shown_setup], ["slide", "-", "-", "-", "-"]))
    kinds = {c.source: c.metadata["slideshow"]["slide_type"] for c in deck.cells}
    assert kinds[setup.source] == "skip" and kinds[checks.source] == "skip"
    assert kinds[shown_setup.source] == "-"        # more than the setup: it stays
    assert "print(lab.ping())" in kinds and not any("NBVAL" in c.source for c in deck.cells)
    notes = [c.source for c in deck.cells if c.metadata["slideshow"]["slide_type"] == "notes"]
    assert notes == ["The cell under this asserts: all three rows came back; `lab.ok`."]


def test_long_code_loses_its_header_to_the_notes_and_is_cut_at_statements():
    header = "# How the claim works:\n# it locks a row,\n# and marks it.\n"
    body = "\n\n".join(f"x{i} = claim({i})\nprint(x{i})" for i in range(30))
    cell = nbformat.v4.new_code_cell(header + body)
    deck = training.deck_notebook(_deck([nbformat.v4.new_markdown_cell("## Code"), cell], ["slide", "-"]))
    parts = [c for c in _shown(deck) if c.cell_type == "code"]
    assert len(parts) > 1 and all(not p.source.startswith("#") for p in parts)
    assert "".join(p.source for p in parts).replace("\n", "") == body.replace("\n", "")
    assert all(p.source.split("\n")[0].startswith("x") for p in parts)        # each part starts a statement
    assert all(p.metadata["slideshow"]["slide_type"] == "subslide" for p in parts[1:])
    notes = [c.source for c in deck.cells if c.metadata["slideshow"]["slide_type"] == "notes"]
    assert any("How the claim works: it locks a row, and marks it." in n for n in notes)


def test_long_output_is_cut_at_whole_rows_repeating_its_header():
    rows = "".join(f"step {i}/40 · worker: claim\n    state: pending={i}\n" for i in range(1, 41))
    cell = nbformat.v4.new_code_cell("trace.print()")
    cell.outputs = [_stream("A trace of forty steps\n======================\n" + rows)]
    deck = training.deck_notebook(_deck([nbformat.v4.new_markdown_cell("## Trace"), cell], ["slide", "-"]))
    parts = [c for c in _shown(deck) if c.cell_type == "code"]
    texts = [p.outputs[0]["text"] for p in parts]
    assert len(texts) > 1
    for text in texts:
        lines = text.rstrip("\n").split("\n")
        assert lines[:2] == ["A trace of forty steps", "======================"]
        assert lines[2].startswith("step ") and lines[-1].startswith("    state:")   # whole rows
    assert all(p.metadata.get("transient", {}).get("remove_source") for p in parts[1:])


def test_prose_output_is_rewrapped_and_columns_are_not():
    prose = "the relay " + "published every event it claimed " * 6
    columns = "relay    " + "   12   ".join(["x"] * 20)
    lines = training.deck_output_lines(prose + "\n" + columns + "\n-- " + prose)
    assert all(len(line) <= training.LINE_CHARS for line in lines if line != columns)
    assert columns in lines
    assert " ".join(lines[:lines.index(columns)]).split() == prose.split()
    assert all(line.startswith("-- ") for line in lines[lines.index(columns) + 1:])


def test_code_is_broken_inside_brackets_without_changing_what_it_does():
    import ast

    source = ('result = compute(first_argument_value, second_argument_value, third_argument_value, fourth_arg)'
              '  # the comment\nprint(f"a long message about {result} that goes on and on and on and on and on and on")')
    shown = training.deck_code(source)
    assert all(len(line) <= training.LINE_CHARS for line in shown.split("\n"))
    assert ast.dump(ast.parse(shown)) == ast.dump(ast.parse(source))
    assert "# the comment" in shown


def test_a_lone_heading_joins_the_slide_after_it_and_an_introduction_moves_with_its_code():
    tall = nbformat.v4.new_markdown_cell("\n\n".join(f"Paragraph {i} " + "words " * 10 for i in range(12)))
    intro = nbformat.v4.new_markdown_cell("The claim, run once:")
    code = nbformat.v4.new_code_cell("\n".join(f"step_{i}()" for i in range(14)))
    heading = nbformat.v4.new_markdown_cell("### A part alone")
    after = nbformat.v4.new_markdown_cell("What it says.")
    deck = training.deck_notebook(_deck([nbformat.v4.new_markdown_cell("## S"), tall, intro, code, heading, after],
                                        ["slide", "-", "-", "-", "subslide", "subslide"]))
    shown = _shown(deck)
    i = next(k for k, c in enumerate(shown) if c.source == intro.source)
    assert shown[i].metadata["slideshow"]["slide_type"] == "subslide"        # a new slide, intro first
    assert shown[i + 1].source.startswith("step_0()")
    j = next(k for k, c in enumerate(shown) if c.source == after.source)
    assert shown[j - 1].source == heading.source and shown[j].metadata["slideshow"]["slide_type"] == "-"


def test_every_slide_with_content_gets_a_note_on_what_to_point_at():
    intro = nbformat.v4.new_markdown_cell("We claim a job. **The claim skips locked rows.** Then we look.")
    code = nbformat.v4.new_code_cell("rows = claim()   # take one job\nassert rows == [1]  # job 1 came back\nprint(rows)")
    code.outputs = [_stream("[1]\n")]
    deck = training.deck_notebook(_deck([intro, code], ["slide", "subslide"]))
    notes = [c.source for c in deck.cells if c.metadata["slideshow"]["slide_type"] == "notes"]
    assert any("The claim skips locked rows." in n for n in notes)
    assert any("Take one job." in n for n in notes) and not any("It starts with" in n for n in notes)
    assert any("Point at what the cell checks: job 1 came back." in n for n in notes)


def _transcript(rows, header=("#   A               B               note", )):
    """A transcript as ``Transcript.print`` writes it: header line(s), a dashed rule, rows."""
    rule = "--  --------------  --------------  --------------------"
    body = [f"{i:<3} {'claim  → id=' + str(i):<15} {'':<15} {'BLOCKS (waits for A)' if i == 3 else ''}".rstrip()
            for i in range(1, rows + 1)]
    return "\n".join([*header, rule, *body]) + "\n"


def _slides(deck):
    """The deck's slides: per slide, its shown cells and its notes' text."""
    slides = []
    for cell in deck.cells:
        kind = cell.metadata.get("slideshow", {}).get("slide_type", "-")
        if kind == "skip":
            continue
        if kind in ("slide", "subslide") or not slides:
            slides.append(([], []))
        slides[-1][1 if kind == "notes" else 0].append(cell.source if kind == "notes" else cell)
    return slides


def test_a_transcript_that_fits_a_slide_moves_there_whole_instead_of_being_split():
    text = nbformat.v4.new_markdown_cell("\n\n".join(f"Paragraph {i} " + "words " * 12 for i in range(6)))
    run = nbformat.v4.new_code_cell("run.transcript().print()")
    run.outputs = [_stream(_transcript(16))]
    deck = training.deck_notebook(_deck([nbformat.v4.new_markdown_cell("## S"), text, run], ["slide", "-", "-"]))
    parts = [c for c in _shown(deck) if c.cell_type == "code"]
    shown = [line for p in parts for o in p.outputs for line in o["text"].rstrip("\n").split("\n")]
    assert len([p for p in parts if p.outputs]) == 1 and len(shown) == 18       # all 16 rows on one slide
    slide = next(cells for cells, _ in _slides(deck) if any(c.get("outputs") for c in cells))
    assert all(c.cell_type == "code" for c in slide)                             # on a slide of its own
    notes = " ".join(n for _, ns in _slides(deck) for n in ns)
    assert "Point at row 3: A claim  → id=3 — BLOCKS (waits for A)." in notes


def test_a_transcript_too_tall_for_a_slide_repeats_its_two_line_header_and_never_leaves_it_alone():
    header = ("#   A               B               note", "                                    (locked rows)")
    run = nbformat.v4.new_code_cell("run.transcript().print()")
    run.outputs = [_stream(_transcript(40, header))]
    deck = training.deck_notebook(_deck([nbformat.v4.new_markdown_cell("## S"), run], ["slide", "-"]))
    texts = [o["text"].rstrip("\n").split("\n") for c in _shown(deck) if c.cell_type == "code" for o in c.outputs]
    assert len(texts) > 1
    for lines in texts:
        assert lines[:3] == [*header, lines[2]] and set(lines[2]) <= set("- ")    # the whole header, every time
        assert len(lines) - 3 >= training.MIN_PIECE_LINES                          # rows under it
    assert [line for lines in texts for line in lines[3:]] == _transcript(40, header).rstrip("\n").split("\n")[3:]
    notes = [" ".join(ns) for cells, ns in _slides(deck) if any(c.get("outputs") for c in cells)]
    assert all(n.startswith("Continued: rows ") for n in notes[1:]), notes
    assert len(set(notes)) == len(notes)                                          # no note copied


def test_a_short_output_is_never_cut():
    lead = nbformat.v4.new_markdown_cell("\n\n".join(f"Paragraph {i} " + "words " * 12 for i in range(13)))
    run = nbformat.v4.new_code_cell("report()")
    run.outputs = [_stream("first\nsecond\nthe key line\n")]
    deck = training.deck_notebook(_deck([lead, run], ["slide", "-"]))
    outputs = [o["text"] for c in _shown(deck) if c.cell_type == "code" for o in c.outputs]
    assert outputs == ["first\nsecond\nthe key line\n"]


def test_no_piece_of_cut_code_is_a_two_line_fragment():
    lead = nbformat.v4.new_markdown_cell("\n\n".join(f"Paragraph {i} " + "words " * 12 for i in range(9)))
    body = "\n\n".join(f"x{i} = claim({i})\nprint(x{i})" for i in range(12))
    for cells in ([lead, nbformat.v4.new_code_cell(body)],
                  [nbformat.v4.new_code_cell(body + "\n\n" + body.replace("x", "y"))]):
        deck = training.deck_notebook(_deck([nbformat.v4.new_markdown_cell("## S"), *cells],
                                            ["slide", *["-"] * len(cells)]))
        parts = [c.source for c in _shown(deck) if c.cell_type == "code"]
        assert all(len([x for x in p.split("\n") if x.strip()]) >= training.MIN_PIECE_LINES for p in parts), parts


def test_a_figure_stays_with_its_code_when_both_fit():
    lead = nbformat.v4.new_markdown_cell("\n\n".join(f"Paragraph {i} " + "words " * 12 for i in range(13)))
    code = nbformat.v4.new_code_cell("fig = plot(run)\nfig.show()")
    code.outputs = [nbformat.v4.new_output("display_data", data={"image/png": _png(600, 300)})]
    deck = training.deck_notebook(_deck([lead, code], ["slide", "-"]))
    assert training.estimated_height(lead) + training.estimated_height(code) > training.SLIDE_BUDGET_PX
    parts = [c for c in _shown(deck) if c.cell_type == "code"]
    assert len(parts) == 1 and parts[0].source == code.source and parts[0].outputs     # moved whole
    notes = " ".join(n for _, ns in _slides(deck) for n in ns)
    assert "Defines `fig` and calls `plot`, `fig.show`." in notes


def test_notes_are_never_cut_inside_a_word():
    long = "The claim " + "skips every locked row it meets " * 12 + "and ends."
    assert training._short(long, 100).endswith("…") and training._short(long, 100)[:-1] in long
    cut = training._short(long, 100)[:-1]
    assert long[len(cut)] == " "                                          # cut at a word boundary
    first = "A first sentence that is long enough to be said on its own, and then some more. "
    assert training._short(first + long, 120) == first.strip()                 # or at a sentence's end
    deck = training.deck_notebook(_deck([nbformat.v4.new_markdown_cell(long)]))
    note = [n for _, ns in _slides(deck) for n in ns if n.startswith("The claim")][0]
    assert note.endswith("…") and long.startswith(note[:-1]) and long[len(note) - 1] == " "


def test_an_interview_box_gets_a_slide_of_its_own_and_the_slide_before_says_to_ask_first():
    before = nbformat.v4.new_markdown_cell("SKIP LOCKED passes rows another session holds.")
    box = nbformat.v4.new_markdown_cell('> **Say it in an interview.** *"SKIP LOCKED hands each worker its own row."*')
    after = nbformat.v4.new_markdown_cell("**Exercise 1.** Why?")
    deck = training.deck_notebook(_deck([before, box, after], ["slide", "-", "-"]))
    slides = _slides(deck)
    i = next(k for k, (cells, _) in enumerate(slides) if any(c.source == box.source for c in cells))
    assert [c.source for c in slides[i][0]] == [box.source]                        # alone on its slide
    assert any(n == training.NEXT_ASK_NOTE for n in slides[i - 1][1])             # ask before it shows
    assert not any(n == training.NEXT_ASK_NOTE for n in slides[i][1])
    assert any(c.source == after.source for c in slides[i + 1][0])


def test_a_prompt_to_predict_ends_its_slide_so_the_answer_comes_after():
    ask = nbformat.v4.new_markdown_cell("What if A rolls back instead? Predict, then run:")
    run = nbformat.v4.new_code_cell("print(claim())")
    run.outputs = [_stream("id=1\n")]
    deck = training.deck_notebook(_deck([ask, run], ["slide", "-"]))
    slides = _slides(deck)
    assert [c.source for c in slides[0][0]] == [ask.source]
    assert slides[1][0][0].source == run.source and slides[1][0][0].outputs


def test_a_lone_short_paragraph_joins_the_slide_before():
    code = nbformat.v4.new_code_cell("\n".join(f"step_{i}()" for i in range(8)))
    tail = nbformat.v4.new_markdown_cell("Two short lines that close the part.")
    deck = training.deck_notebook(_deck([nbformat.v4.new_markdown_cell("## S"), code, tail],
                                        ["slide", "-", "subslide"]))
    assert len(_slides(deck)) == 1


def test_a_deck_is_titled_with_its_notebooks_short_name():
    deck = training.deck_notebook(_deck([nbformat.v4.new_markdown_cell("# 01 · One *lock*\n\nText.")]))
    assert deck.metadata["title"] == "01 · One lock"


# A slide of each kind the check must fail on, planted in a deck of its own.
PLANTED = {
    "hidden": '<div style="max-height:100px;overflow:auto"><pre style="font-size:20px">' + "line\n" * 30 + "</pre></div>",
    "wrapped": "<pre style=\"white-space:pre-wrap;font-size:20px\">" + "word " * 80 + "</pre>",
    "small text": '<p style="font-size:15px">Fifteen-pixel text.</p>',
    "shrunk figure": '<img style="width:100px" src="data:image/png;base64,{png}">',
    "no notes": "<p>Content, and nothing for the presenter.</p>",
}


def _png(width, height):
    import base64
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    raw = b"".join(b"\x00" + b"\xff\xff\xff" * width for _ in range(height))
    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
    return base64.b64encode(png).decode()


@pytest.mark.parametrize("kind", list(PLANTED))
def test_slides_check_fails_on_each_kind_of_bad_slide(tmp_path, kind):
    import re

    from browser import find_chromium

    find_chromium()
    path = tmp_path / "99_planted.ipynb"
    nbformat.write(_deck([nbformat.v4.new_markdown_cell("# A deck\n\nIts first slide."),
                          nbformat.v4.new_markdown_cell("## Planted\n\nFine.")]), path)
    deck = training.slides([str(path)], out=tmp_path / "out", quiet=True)[0]
    good = training.check_decks([deck])
    assert good.problems == [] and len(good.slides[deck.name]) == 2, good.problems
    page = deck.read_text()
    first, planted = page.split("Planted", 1)
    if kind == "no notes":
        planted = re.sub(r'<aside class="notes">.*?</aside>', "", planted, flags=re.S)
    else:
        planted = planted.replace("<p>Fine.</p>", PLANTED[kind].format(png=_png(600, 300)))
    assert planted != page.split("Planted", 1)[1]
    deck.write_text(first + "Planted" + planted)
    report = training.check_decks([deck])
    assert report.totals()[kind] == 1 and sum(report.totals().values()) == 1, report.problems
    assert report.problems[0].startswith(f'{deck.name}: slide 2 (#/1/0, "Planted") {kind}: '), report.problems


def test_slides_check_names_a_slide_that_does_not_fit(tmp_path):
    from browser import find_chromium

    from labkit.cli import main

    find_chromium()
    nb = nbformat.v4.new_notebook()
    nb.metadata["claimlab"] = {"minutes": 5, "title": "t"}
    nb.cells = [nbformat.v4.new_markdown_cell("# A deck\n\nIts first slide."),
                nbformat.v4.new_markdown_cell("## Far too long\n<div>" + "<br>".join(f"item {i}" for i in range(60))
                                              + "</div>"),
                nbformat.v4.new_markdown_cell("## Short\n\nFits.")]
    for cell in nb.cells:
        cell.metadata["slideshow"] = {"slide_type": "slide"}
    path = tmp_path / "99_too_long.ipynb"
    nbformat.write(nb, path)
    report = training.check_decks(training.slides([str(path)], out=tmp_path / "out", quiet=True))
    assert len(report.problems) == 1, report.problems
    assert report.problems[0].startswith('99_too_long.slides.html: slide 2 (#/1/0, "Far too long") hidden: ')
    assert "px of content in a 720 px slide" in report.problems[0]
    assert main(["slides", "--check", str(path), "--out", str(tmp_path / "cli")]) == 1


def test_slides_check_without_chromium_names_the_fix(tmp_path, monkeypatch, capsys):
    from labkit.cli import main

    monkeypatch.setenv("LABKIT_CHROMIUM", str(tmp_path / "no-such-browser"))
    assert main(["slides", "--check", str(ALL[0]), "--out", str(tmp_path)]) == 2
    assert "apt-get install chromium" in capsys.readouterr().err
    assert not (tmp_path / "index.html").exists()


def test_every_slide_of_every_deck_fits_a_1280x720_projector(checked):
    """`labkit slides --check` over all decks, as CI runs it (this test is how CI runs it): no
    slide hides content, wraps a line, shrinks text or a figure, or lacks speaker notes; no
    deck logs a console error or fails to start reveal.js."""
    code, printed, said, _ = checked
    assert code == 0, said
    seen = re.search(r"(\d+) decks, (\d+) slides at", printed)
    assert seen and int(seen.group(1)) == len(ALL), printed
    assert int(seen.group(2)) > 10 * len(ALL), printed        # the decks were cut into slides
    assert "0 problem(s)" in printed
    assert "hidden 0 · wrapped 0 · small text 0 · shrunk figure 0 · no notes 0" in printed


# -- the handout book: from the committed outputs, a one-page summary beside each page ------------
def _words(text: str) -> str:
    """A page's or a markdown text's words, lower case, one space apart (no tags, no markup)."""
    import html
    import re

    text = re.sub(r"<(style|script)\b.*?</\1>", " ", text, flags=re.S | re.I)
    return " ".join(re.findall(r"\w+", html.unescape(re.sub(r"<[^>]+>", " ", text)).lower()))


# `labkit book` in a process that may start no other process (a kernel is one) and whose database
# is a closed port: the handouts are written from the committed outputs alone.
NO_PROCESS = ("import sys\n"
              "def deny(event, args):\n"
              "    if event in ('subprocess.Popen', 'os.posix_spawn', 'os.exec', 'os.fork'):\n"
              "        raise RuntimeError(f'started a process: {event} {args!r:.120}')\n"
              "sys.addaudithook(deny)\n"
              "from labkit.cli import main\n"
              "sys.exit(main(sys.argv[1:]))\n")


def _book_without_processes(*args: str):
    import os
    import subprocess
    import sys

    env = {**os.environ, "LABKIT_DSN": "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1"}
    return subprocess.run([sys.executable, "-c", NO_PROCESS, "book", *args], env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def handouts(tmp_path_factory):
    out = tmp_path_factory.mktemp("book")
    run = _book_without_processes("--out", str(out))
    assert run.returncode == 0, run.stderr[-2000:]
    return out


def test_each_handout_has_a_summary_with_boxes_and_prompts_and_no_answers(handouts, browser):
    import re

    index = (handouts / "index.html").read_text()
    for path in ALL:
        nb = nbformat.read(path, as_version=4)
        meta = nb.metadata["claimlab"]
        page = (handouts / f"{path.stem}.summary.html").read_text()
        assert f'href="{path.stem}.summary.html"' in index, path.stem
        said = _words(page)
        for what in (meta["title"], meta["teaches"], f"{meta['minutes']} minutes"):
            assert _words(what) in said, (path.stem, what)
        markdown = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
        for heading in re.findall(r"^## (.+)$", markdown, re.M):
            assert _words(heading) in said, (path.stem, heading)
        boxes = re.findall(r"^> \*\*Say it in an interview.*?(?=\n(?!>)|\Z)", markdown, re.S | re.M)
        assert page.count("Say it in an interview.") == len(boxes), path.stem
        for box in boxes:
            assert _words(box) in said, (path.stem, box[:60])
        for label in re.findall(r"^\*\*(Exercise[^*]*)\*\*", markdown, re.M):
            assert _words(label) in said, (path.stem, label)
        full = _words((handouts / f"{path.stem}.html").read_text())
        for answer in training.ANSWER_RE.findall(markdown):
            shown = re.sub(r"```\w*", "", training._answer_text(answer))   # a fence's language is not shown
            start = " ".join(_words(shown).split()[:8])
            assert start in full, (path.stem, start)      # the full page has it ...
            assert start not in said, (path.stem, start)  # ... the summary does not
        assert "<details" not in page and training.remote_references(page) == []
    fencing = _words((handouts / "08_fencing_tokens.summary.html").read_text())
    assert "exercise checked make the drain s completion write fenced below is the drain s" in fencing
    for name in ("01_one_lock_three_policies", "08_fencing_tokens"):
        errors, _ = browser.open((handouts / f"{name}.summary.html").as_uri())
        assert errors == [], f"{name}: {errors}"


def test_the_book_from_committed_outputs_needs_no_server_and_no_kernel(handouts, tmp_path):
    """The handouts above were written by `labkit book` in a process that may start no other
    process and whose database is a closed port: every page is there all the same."""
    assert sorted(p.name for p in handouts.glob("*.html")) == sorted(
        ["index.html"] + [f"{p.stem}{kind}" for p in ALL for kind in (".html", ".summary.html")])
    # the same guard stops a fresh run at its first kernel, so it does guard
    fresh = _book_without_processes("--execute", str(ALL[0]), "--out", str(tmp_path / "fresh"))
    assert fresh.returncode != 0 and "started a process: subprocess.Popen" in fresh.stderr


def test_no_line_of_a_handout_wraps_when_printed_on_a4(handouts, browser):
    pages = sorted(p for p in handouts.glob("[0-9]*.html") if not p.name.endswith(".summary.html"))
    assert len(pages) == len(ALL)
    assert training.check_handouts(pages, browser) == []


def test_a_line_too_wide_for_a4_is_caught(tmp_path, browser):
    nb = nbformat.v4.new_notebook()
    wide = "step 1 · " + "  ".join(f"column{i:02d}" for i in range(12))        # 9 + 12 * 10 chars
    cell = nbformat.v4.new_code_cell('print("...")')
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=wide + "\nshort\n")]
    nb.cells = [nbformat.v4.new_markdown_cell("# A page"), cell]
    path = tmp_path / "99_wide.ipynb"
    nbformat.write(nb, path)
    training.book([str(path)], out=tmp_path / "book", quiet=True)
    problems = training.check_handouts([tmp_path / "book" / "99_wide.html"], browser)
    assert len(problems) == 1 and f"{len(wide)}-character line" in problems[0] and "column00" in problems[0]
