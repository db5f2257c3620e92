"""Training mode: offline slide decks, the handout book, student copies without solutions."""

import json

import nbformat
import pytest
from browser import Browser

from labkit.tools import training
from labkit.tools.nbtools import NOTEBOOKS

ALL = sorted(NOTEBOOKS.glob("[0-9]*.ipynb"))


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


def test_slides_work_offline_in_a_browser(tmp_path, browser):
    decks = training.slides(out=tmp_path, quiet=True)
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
