"""The notebooks' time labels, computed: the model term by term on small notebooks, the run
time `labkit execute` records, `labkit minutes` on copies, and the labels of the real
notebooks against the model."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from labkit import cli
from labkit.core.errors import LabkitError
from labkit.core.text import TEXT_WIDTH
from labkit.tools import nbtools, timing
from labkit.tools.nbtools import jupyter_text, recorded_run_seconds
from labkit.tools.timing import estimate, prose_words

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))


def words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


def notebook(*cells, run_seconds=None, minutes=None):
    """A notebook of ``cells``: a str is a markdown cell, ("code", src) a code cell."""
    nb = nbformat.v4.new_notebook()
    for c in cells:
        nb.cells.append(nbformat.v4.new_code_cell(c[1]) if isinstance(c, tuple)
                        else nbformat.v4.new_markdown_cell(c))
    meta = {}
    if run_seconds is not None:
        meta["run_seconds"] = run_seconds
    if minutes is not None:
        meta["minutes"] = minutes
    if meta:
        nb.metadata["claimlab"] = meta
    return nb


def code(src: str = "x = 1") -> tuple[str, str]:
    return ("code", src)


# -- the model, term by term ----------------------------------------------------------------------

def test_reading_counts_words_at_the_reading_rate_and_rounds_up_to_five():
    est = estimate(notebook(words(timing.WORDS_PER_MINUTE * 2)))
    assert (est.prose_words, est.code_cells, est.exercises, est.checked_exercises, est.run_seconds) == \
        (timing.WORDS_PER_MINUTE * 2, 0, 0, 0, 0)
    assert est.minutes == 5                                   # 2 minutes, rounded up
    exactly = timing.WORDS_PER_MINUTE * timing.ROUND_TO_MINUTES
    assert estimate(notebook(words(exactly))).minutes == 5    # a multiple of 5 stays as it is
    assert estimate(notebook(words(exactly + 1))).minutes == 10
    assert estimate(notebook()).minutes == 0


def test_words_are_counted_across_markdown_cells_only_and_markup_is_no_word():
    nb = notebook("## 1 · A heading", "| a | b |\n|---|---|\n| c | d |", "> a quote — here", code("# w w w"))
    assert prose_words(nb) == 3 + 4 + 3


def test_each_code_cell_with_code_is_a_minute_and_a_quarter():
    assert estimate(notebook(*[code()] * 4)).minutes == 5
    five = estimate(notebook(*[code()] * 5, code("   \n")))
    assert five.code_cells == 5 and five.minutes == 10        # 6.25; the empty cell is not counted


def test_each_exercise_is_four_minutes():
    one = estimate(notebook("**Exercise 1.** Try it."))
    assert (one.exercises, one.prose_words) == (1, 4)
    assert dict((w.split()[1], m) for w, m in one.parts())["exercises"] == timing.EXERCISE_MINUTES == 4
    assert one.minutes == 5                                   # 4 + 4/70
    two = estimate(notebook("**Exercise 1.** Try it.", "  **Exercise 2.** And this.",
                            "Not an **Exercise**: prose that names one."))
    assert two.exercises == 2 and two.minutes == 10           # 8 + a few words


def test_an_exercise_whose_next_code_cells_call_a_check_is_checked():
    nb = notebook(
        "**Exercise 4 — the claim.** Write it.", code('MY_CLAIM = "SELECT 1"'),
        code("mine = drill.check_claim(lab, MY_CLAIM)\nprint(mine)"),            # checked
        "**Exercise 5.** Write it.", code("%time print(check_reaper(lab, X))"),   # checked
        "**Exercise 6.** Write it.", code("def check_mine(x):\n    return x"),   # a definition
        "**Exercise 7.** Write it.", "The answer:", code("drill.check_claim(lab, Q)"),  # not next
        "**Exercise 8.** Write it.", code("print('check_claim(lab)')"),           # a string
    )
    est = estimate(nb)
    assert (est.exercises, est.checked_exercises) == (5, 2)
    # the same notebook with every code cell plain: the two checked exercises cost 3 more each
    base = estimate(notebook(*[c.source if c.cell_type == "markdown" else code() for c in nb.cells]))
    assert (base.exercises, base.checked_exercises, base.code_cells) == (5, 0, est.code_cells)
    extra = sum(m for _, m in est.parts()) - sum(m for _, m in base.parts())
    assert extra == pytest.approx(2 * timing.CHECKED_EXERCISE_MINUTES)


def test_the_interview_drills_checked_exercises_are_found():
    drill = [p for p in NOTEBOOKS if p.name.endswith("interview_drill.ipynb")]
    assert drill, "the interview drill notebook is missing"
    assert estimate(nbformat.read(drill[0], as_version=4)).checked_exercises == 3


def test_answers_in_details_are_not_counted():
    nb = notebook("Try it first.\n\n<details><summary>Answer</summary>\n\n" + words(40) +
                  "\n\n<details>nested " + words(9) + "</details>\n" + words(5) + "\n</details>\n\nThen go on.")
    assert prose_words(nb) == 6


def test_code_fences_html_tags_comments_and_link_targets_are_not_counted():
    nb = notebook("Run this:\n\n```sql\nSELECT id FROM job\n FOR UPDATE\n```\n\nand ~~~ this:\n~~~\nw w\n~~~\n",
                  "> Quoted:\n> ```python\n> x = 1\n> ```\n> done",
                  "<b>bold</b> <!-- a note\nover lines --> text, [the docs](https://example.org/a/b)",
                  "<details><summary>Answer</summary>\n\n```\n</details>\n```\nstill folded\n</details>\nafter")
    assert [prose_words(notebook(c.source)) for c in nb.cells] == [4, 2, 4, 1]


def test_the_run_time_is_added_in_minutes_and_absent_counts_as_zero():
    assert estimate(notebook(*[code()] * 2, run_seconds=120)).minutes == 5     # 2.5 + 2
    assert estimate(notebook(*[code()] * 2, run_seconds=180)).minutes == 10    # 2.5 + 3
    assert estimate(notebook(*[code()] * 3)).run_seconds == 0
    for bad in ("90", -10, True, 10 ** 9):
        with pytest.raises(LabkitError, match="labkit execute"):
            estimate(notebook(run_seconds=bad))


def test_every_term_adds_up_and_the_text_says_how():
    nb = notebook(words(300), *[code()] * 4, "**Exercise 1.** Go.", code("check_claim(lab, X)"),
                  run_seconds=120)
    est = estimate(nb)
    # 300 + 3 words, 5 code cells, one exercise checked, two minutes of running
    total = 303 / 70 + 5 * 1.25 + 4 + 4 + 2
    assert sum(m for _, m in est.parts()) == pytest.approx(total)
    assert est.minutes == 25
    text = str(est)
    assert all(len(line) <= TEXT_WIDTH for line in text.splitlines())
    for part in ("303 words", "5 code cells", "1 exercises", "1 checked", "120 s", "rounded up to 25 min"):
        assert part in text.replace("\n    ", " "), text
    with pytest.raises(AttributeError):
        est.minutes = 5                                       # frozen


def _model_minutes(n_words, n_code, n_exercises, n_checked, run_s):
    cells = [words(n_words - 2 * n_exercises), *[code()] * (n_code - n_checked)]
    for i in range(n_exercises):
        cells.append(f"**Exercise {i}.**")
        if i < n_checked:
            cells.append(code("print(check_it(lab, MINE))"))
    est = estimate(notebook(*cells, run_seconds=run_s))
    assert (est.prose_words, est.code_cells, est.exercises, est.checked_exercises) == \
        (n_words, n_code, n_exercises, n_checked)
    return est


def test_every_notebook_read_cold_is_within_a_third_of_its_readers_mean():
    """A label promises a typical learner's time within a third: for every notebook read cold,
    the model (each reading's notebook rebuilt as it stood when it was read) is within a third
    of the mean of its readings."""
    by_notebook: dict[str, list[tuple]] = {}
    for name, *held, took in timing.COLD_READS:
        by_notebook.setdefault(name, []).append((held, took))
    assert len(by_notebook) >= 5 and len(timing.COLD_READS) >= 10
    for name, reads in by_notebook.items():
        mean = sum(took for _, took in reads) / len(reads)
        for held, _ in reads:
            est = _model_minutes(*held)
            assert abs(est.minutes - mean) <= mean / 3, (name, mean, str(est))


def test_the_cold_readings_are_those_of_notebooks_in_the_workbook():
    names = {path.stem for path in NOTEBOOKS}
    assert {name for name, *_ in timing.COLD_READS} <= names


def test_bad_input_names_the_fix(tmp_path):
    with pytest.raises(LabkitError, match="nbformat.read"):
        estimate(42)
    with pytest.raises(LabkitError, match="No notebook at .*Fix: pass notebook files"):
        estimate(tmp_path / "nope.ipynb")
    (tmp_path / "broken.ipynb").write_text("{ not json")
    with pytest.raises(LabkitError, match="cannot be read as a notebook"):
        estimate(tmp_path / "broken.ipynb")


# -- the run time labkit execute records ---------------------------------------------------------

def test_a_run_time_is_rounded_up_to_ten_seconds():
    assert [recorded_run_seconds(s) for s in (0, 0.3, 10, 10.01, 123, 599.5)] == [0, 10, 10, 20, 130, 600]


def test_a_run_time_within_a_quarter_of_the_old_one_keeps_the_old_one():
    assert recorded_run_seconds(119, old=100) == 100         # 120 is within 25 %
    assert recorded_run_seconds(75, old=100) == 100          # 80 is within 25 %
    assert recorded_run_seconds(121, old=100) == 130         # 130 is 30 % more
    assert recorded_run_seconds(70, old=100) == 70           # 30 % less
    assert recorded_run_seconds(50, old=40) == 40            # exactly 25 % more: kept
    assert recorded_run_seconds(51, old=40) == 60
    for old in (None, 0, "100", True, float("nan")):
        assert recorded_run_seconds(119, old=old) == 120     # nothing sound to keep
    for bad in (-1, float("inf"), "5", None):
        with pytest.raises(LabkitError, match="wall time"):
            recorded_run_seconds(bad)


def test_execute_records_the_run_time_in_a_real_kernel(tmp_path):
    path = tmp_path / "tiny.ipynb"
    nb = notebook("# Tiny", code("print(6 * 7)"), minutes=5)
    path.write_text(jupyter_text(nb))
    nbtools.execute(path)
    ran = nbformat.read(path, as_version=4)
    first = ran.metadata.claimlab.run_seconds
    assert first > 0 and first % nbtools.RUN_STEP_S == 0 and ran.metadata.claimlab.minutes == 5
    assert ran.cells[1].outputs[0]["text"] == "42\n"
    ran.metadata.claimlab.run_seconds = 5_000                 # far off: recorded anew
    path.write_text(jupyter_text(ran))
    nbtools.execute(path)
    assert nbformat.read(path, as_version=4).metadata.claimlab.run_seconds < 5_000


# -- labkit minutes -------------------------------------------------------------------------------

def test_minutes_writes_only_the_label_then_check_passes_then_a_changed_label_fails(tmp_path, capsys):
    copies = []
    for src in NOTEBOOKS[:3]:
        nb = nbformat.read(src, as_version=4)
        nb.metadata.setdefault("claimlab", {})["minutes"] = 1          # surely wrong
        copy = tmp_path / src.name
        copy.write_text(jupyter_text(nb), encoding="utf-8")
        copies.append(copy)
    before = {p: p.read_text(encoding="utf-8") for p in copies}

    assert cli.main(["minutes", *map(str, copies)]) == 0
    out = capsys.readouterr().out
    assert all(len(line) <= TEXT_WIDTH for line in out.splitlines())
    assert f"relabelled {len(copies)} of {len(copies)}" in out
    for p in copies:
        want = estimate(p).minutes
        assert f" {want} " in next(line for line in out.splitlines() if line.startswith(p.name)) + " "
        after = p.read_text(encoding="utf-8")
        old, new = json.loads(before[p]), json.loads(after)
        assert new["metadata"]["claimlab"]["minutes"] == want
        old["metadata"]["claimlab"]["minutes"] = want
        assert old == new                                       # nothing else changed ...
        changed = [(a, b) for a, b in zip(before[p].splitlines(), after.splitlines()) if a != b]
        assert len(before[p].splitlines()) == len(after.splitlines())
        assert changed == [('   "minutes": 1,', f'   "minutes": {want},')] or \
            changed == [('   "minutes": 1', f'   "minutes": {want}')], changed   # ... line for line

    written = {p: p.read_text(encoding="utf-8") for p in copies}
    assert cli.main(["minutes", "--check", *map(str, copies)]) == 0
    assert capsys.readouterr().err == ""

    nb = nbformat.read(copies[1], as_version=4)
    nb.metadata.claimlab.minutes += 5
    copies[1].write_text(jupyter_text(nb), encoding="utf-8")
    written[copies[1]] = copies[1].read_text(encoding="utf-8")
    assert cli.main(["minutes", "--check", *map(str, copies)]) == 1
    err = capsys.readouterr().err
    assert copies[1].name in err and "`labkit minutes`" in err
    assert copies[0].name not in err and copies[2].name not in err
    assert {p: p.read_text(encoding="utf-8") for p in copies} == written   # --check writes nothing


def test_minutes_refuses_a_missing_notebook_before_writing_any(tmp_path, capsys):
    good = tmp_path / "a.ipynb"
    good.write_text(jupyter_text(notebook("text", minutes=1)))
    text = good.read_text()
    assert cli.main(["minutes", str(good), str(tmp_path / "missing.ipynb")]) == 2
    assert "No notebook at" in capsys.readouterr().err and good.read_text() == text


# -- the real notebooks ----------------------------------------------------------------------------

@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_notebooks_label_is_its_estimate(path):
    nb = nbformat.read(path, as_version=4)
    est = estimate(nb)
    assert nb.metadata.get("claimlab", {}).get("minutes") == est.minutes, \
        f"{path.name} is labelled {timing.label(nb)} min; the estimate is {est}. Run `labkit minutes`."


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_notebook_is_longer_than_its_sittings(path):
    """At most 5,000 words of prose, and no sitting over an hour: a notebook estimated above
    an hour says where to pause, so that each part is one sitting."""
    nb = nbformat.read(path, as_version=4)
    est = estimate(nb)
    assert est.prose_words <= 5_000, f"{path.name}: {est.prose_words:,} words of prose; split it"
    for n, part in enumerate(timing.sittings(nb), 1):
        assert part.minutes <= timing.MAX_SITTING_MINUTES, \
            f"{path.name}, sitting {n}: {part}; add a pause ({timing.PAUSE}) at a section, or trim it"


def test_a_pause_cuts_a_notebook_into_sittings_and_shares_out_the_run_time():
    v4 = nbformat.v4
    words = " ".join(["word"] * 840)                           # 12 minutes of reading
    cells = [v4.new_markdown_cell(words), v4.new_code_cell("a()"), v4.new_code_cell("b()"),
             v4.new_markdown_cell(timing.PAUSE + " Run the cells above again when you come back."),
             v4.new_markdown_cell(words), v4.new_code_cell("c()")]
    nb = v4.new_notebook(cells=cells, metadata={"claimlab": {"run_seconds": 180}})
    one, two = timing.sittings(nb)
    assert (one.code_cells, two.code_cells) == (2, 1)
    assert (one.run_seconds, two.run_seconds) == (120, 60)         # shared by code cells
    # 840 words, 2 code cells, 2 minutes of run; then 840 + 14 words, 1 code cell, 1 minute
    assert one.minutes == 20 and two.minutes == 15                 # 12 + 2.5 + 2; 12.2 + 1.25 + 1
    assert len(timing.sittings(v4.new_notebook(cells=cells[:3]))) == 1
    lead = v4.new_notebook(cells=[v4.new_markdown_cell(timing.PAUSE), *cells[:2]])
    assert len(timing.sittings(lead)) == 1                          # a pause first cuts nothing off


def test_the_real_notebooks_are_found():
    assert len(NOTEBOOKS) >= 10                   # the two tests above run over each of them
