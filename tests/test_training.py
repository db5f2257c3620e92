"""Training mode: offline slide decks, the handout book, student copies without solutions."""

import json

import nbformat
import pytest
from browser import Browser

from labkit.tools import training
from labkit.tools.nbtools import NOTEBOOKS

# The decks and handouts are built from the committed outputs and checked in a browser; the
# student copies are made from the notebooks: none of it depends on which server answers.
pytestmark = pytest.mark.default_leg

ALL = sorted(NOTEBOOKS.glob("[0-9]*.ipynb"))


@pytest.fixture(scope="module")
def decks(tmp_path_factory):
    return training.slides(out=tmp_path_factory.mktemp("slides"), quiet=True)


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


def test_student_copies_hold_no_solutions_and_no_outputs():
    copies = sorted(training.STUDENT.glob("*.ipynb"))
    assert copies, "the exercise notebooks have student copies"
    for path in copies:
        nb = nbformat.read(path, as_version=4)
        text = "\n".join(c.source for c in nb.cells)
        assert "<summary>Answer</summary>" not in text
        assert "instructor's copy" in text
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")


def test_a_stale_student_copy_is_detected(tmp_path, monkeypatch):
    monkeypatch.setattr(training, "STUDENT", tmp_path / "student")
    assert training.student_copies(check=True)  # nothing written there yet: all stale
    training.student_copies(quiet=True)
    assert training.student_copies(check=True) == []
    first = sorted((tmp_path / "student").glob("*.ipynb"))[0]
    first.write_text(first.read_text().replace("instructor's copy", "teacher's copy"))
    assert training.student_copies(check=True) == [first.name]


def test_slides_work_offline_in_a_browser(decks, browser):
    tmp_path = decks[0].parent
    assert [d.name for d in decks] == [p.stem + ".slides.html" for p in ALL]
    for deck in decks:
        text = deck.read_text()
        assert training.remote_references(text) == [], deck.name
        errors, _ = browser.open(deck.as_uri())
        assert errors == [], f"{deck.name}: {errors}"
        assert browser.evaluate("typeof Reveal !== 'undefined' && Reveal.isReady()") is True
        assert browser.evaluate("Reveal.getTotalSlides()") > 1
    errors, _ = browser.open((tmp_path / "index.html").as_uri())
    assert errors == []


def test_book_executes_notebooks_and_pages_open_without_errors(tmp_path, browser):
    # Executing every notebook is what `labkit book` does; nbval already executes them all in
    # this suite, so here one notebook is executed for real and the rest use their outputs.
    training.book([str(ALL[0])], out=tmp_path, execute=True, quiet=True)
    training.book([str(p) for p in ALL[1:]], out=tmp_path / "rest", execute=False, quiet=True)
    page = tmp_path / (ALL[0].stem + ".html")
    assert "PostgreSQL" in page.read_text()
    # the kernels worked in schemas of their own, not in the reader's open notebooks' schemas
    import labkit
    from labkit.core.db import current_user_tag

    book_schema = labkit.schema_name("00_start_here", f"{current_user_tag()}_book")
    with labkit.connect(quiet=True).connect() as conn:
        assert conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (book_schema,)).fetchone()
    for html_page in [page, tmp_path / "index.html"] + sorted((tmp_path / "rest").glob("*.html")):
        assert training.remote_references(html_page.read_text()) == [], html_page.name
        errors, _ = browser.open(html_page.as_uri())
        assert errors == [], f"{html_page.name}: {errors}"
    index = (tmp_path / "rest" / "index.html").read_text()
    for p in ALL[1:]:
        assert p.stem in index


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


def test_slides_check_names_a_slide_that_does_not_fit(tmp_path):
    from browser import find_chromium

    from labkit.cli import main

    find_chromium()
    nb = nbformat.v4.new_notebook()
    nb.metadata["claimlab"] = {"minutes": 5, "title": "t"}
    nb.cells = [nbformat.v4.new_markdown_cell("# A deck\n\nIts first slide."),
                nbformat.v4.new_markdown_cell("## Far too long\n" + "\n".join(f"- item {i}" for i in range(60))),
                nbformat.v4.new_markdown_cell("## Short\n\nFits.")]
    for cell in nb.cells:
        cell.metadata["slideshow"] = {"slide_type": "slide"}
    path = tmp_path / "99_too_long.ipynb"
    nbformat.write(nb, path)
    report = training.check_decks(training.slides([str(path)], out=tmp_path / "out", quiet=True))
    assert len(report.problems) == 1, report.problems
    assert report.problems[0].startswith('99_too_long.slides.html: slide 2 (#/1/0, "Far too long") does not fit')
    assert main(["slides", "--check", str(path), "--out", str(tmp_path / "cli")]) == 1


def test_slides_check_without_chromium_names_the_fix(tmp_path, monkeypatch, capsys):
    from labkit.cli import main

    monkeypatch.setenv("LABKIT_CHROMIUM", str(tmp_path / "no-such-browser"))
    assert main(["slides", "--check", str(ALL[0]), "--out", str(tmp_path)]) == 2
    assert "apt-get install chromium" in capsys.readouterr().err
    assert not (tmp_path / "index.html").exists()


def test_every_slide_of_every_deck_fits_a_1280x720_projector(tmp_path, capsys):
    """`labkit slides --check` over all decks, as CI runs it (this test is how CI runs it)."""
    from browser import find_chromium

    from labkit.cli import main

    find_chromium()
    code = main(["slides", "--check", "--out", str(tmp_path)])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert f"{len(ALL)} decks" in out.out and "0 problem(s)" in out.out
