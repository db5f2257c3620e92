"""Student copies give no exercise's answer away: not in the markdown (the hidden answers),
and not in the code cells next to an exercise, which the notebooks tag ``answer`` (a cell that
gives the answer away) or ``solution`` (the code the learner writes) for the copy to blank."""

import re

import nbformat
import pytest

from labkit.tools import training
from labkit.tools.nbtools import NOTEBOOKS

# Made from the notebooks' sources and tags: nothing here depends on which server answers.
pytestmark = pytest.mark.default_leg

ALL = sorted(NOTEBOOKS.glob("[0-9]*.ipynb"))
EXERCISE_RE = re.compile(r"^(?:\*\*Exercise|#{1,6} .*\bExercise\b)", re.M)
ASSERT_RE = re.compile(r"^\s*assert\b|\blk\.shape\(", re.M)          # what nbval checks a claim with
SQL_FILE_RE = re.compile(r"[\w.-]+\.sql\b")
ANSWER_FILE_RE = re.compile(r"[\w.-]*(?:answer|solution)[\w.-]*\.sql\b", re.I)
FENCED_RE = re.compile(r"```[^\n]*\n(.*?)```", re.S)
INLINE_RE = re.compile(r"`([^`\n]+)`")
STATEMENT_RE = re.compile(r"(?:SELECT|UPDATE|INSERT|DELETE|WITH)\b", re.I)
SHOWS_KEY_RE = re.compile(r"\bkey\s*=\s*True\b")       # drill.print_quiz(key=True) prints the quiz's key


def _heading(cell) -> bool:
    return cell.cell_type == "markdown" and cell.source.lstrip().startswith("#")


def _exercise(cell) -> bool:
    return cell.cell_type == "markdown" and bool(EXERCISE_RE.search(cell.source))


def exercises(nb) -> list[tuple[int, range]]:
    """Each exercise prompt's cell index, and the cells after it up to the next heading or
    the next exercise: its answer, and the code cells before and just after it."""
    found = []
    for i, cell in enumerate(nb.cells):
        if _exercise(cell):
            end = next((j for j in range(i + 1, len(nb.cells))
                        if _heading(nb.cells[j]) or _exercise(nb.cells[j])), len(nb.cells))
            found.append((i, range(i + 1, end)))
    return found


def _normal(code: str) -> str:
    return re.sub(r"\s+", " ", code).strip().rstrip(";").strip().lower()


def answer_clues(nb, i: int, after: range) -> tuple[set[str], list[str]]:
    """The SQL files the exercise's hidden answer names (a file its prompt names is the
    exercise's material, not its answer), and the statements it gives."""
    cells = [nb.cells[k] for k in (i, *after) if nb.cells[k].cell_type == "markdown"]
    answers = "\n".join(m.group(0) for c in cells for m in training.ANSWER_RE.finditer(c.source))
    prompt = training.ANSWER_RE.sub("", nb.cells[i].source)
    files = set(SQL_FILE_RE.findall(answers)) - set(SQL_FILE_RE.findall(prompt))
    inline = INLINE_RE.findall(FENCED_RE.sub("", answers))
    code = FENCED_RE.findall(answers) + [s for s in inline if STATEMENT_RE.match(s)]
    return files, [_normal(c) for c in code if len(_normal(c)) >= 20]


def revealing(nb, copy, name: str) -> list[str]:
    """Where the student copy ``copy`` of ``nb`` gives an exercise's answer away: a code cell
    after the exercise that asserts its expected result, reads or prints an answer file,
    holds the answer's code or shows a key; and any cell tagged ``answer`` or ``solution``
    that was not blanked."""
    found = []
    for k, cell in enumerate(copy.cells):
        tags = sorted(training.BLANKED.keys() & set(cell.metadata.get("tags", [])))
        blanks = {training.BLANKED[t].format(name=name) for t in tags}
        if tags and cell.cell_type == "code" and cell.source not in blanks:
            found.append(f"{name} cell {k}: tagged {' and '.join(map(repr, tags))} but not blanked")
    for i, after in exercises(nb):
        files, code = answer_clues(nb, i, after)
        for k in after:
            cell = copy.cells[k]
            if cell.cell_type != "code":
                continue
            src = cell.source
            why = [what for what, hit in [
                ("asserts the expected result", ASSERT_RE.search(src)),
                ("reads the answer's file", any(f in src for f in files) or ANSWER_FILE_RE.search(src)),
                ("holds the answer's code", any(c in _normal(src) for c in code)),
                ("shows a key", SHOWS_KEY_RE.search(src))] if hit]
            if why:
                found.append(f"{name} cell {k} (exercise in cell {i}): {', '.join(why)}")
    return found


@pytest.fixture(scope="module")
def notebooks():
    return [(p.name, nbformat.read(p, as_version=4)) for p in ALL]


def test_no_student_copy_gives_an_answer_away(notebooks):
    found = []
    for name, nb in notebooks:
        if training.is_exercise_notebook(nb):
            found += revealing(nb, training.student_copy(nb, name), name)
    assert found == [], "tag these cells 'answer', or move what they reveal out of them:\n" + "\n".join(found)


def test_every_hidden_answer_belongs_to_an_exercise_the_check_reads(notebooks):
    """Else an exercise written some other way would escape the check above."""
    answers = scanned = 0
    for name, nb in notebooks:
        cells = {k for i, after in exercises(nb) for k in (i, *after)}
        hidden = {k for k, c in enumerate(nb.cells)
                  if c.cell_type == "markdown" and training.ANSWER_RE.search(c.source)}
        assert hidden <= cells, f"{name}: the answers in cells {sorted(hidden - cells)} follow no exercise"
        answers += len(hidden)
        scanned += len(exercises(nb))
    assert scanned >= answers > 0


def _planted() -> nbformat.NotebookNode:
    """An exercise whose answer names a file and gives the statement, then one code cell for
    each way of giving it away, then a heading and an assert that belongs to another section."""
    v4 = nbformat.v4
    answer = ("**Exercise 1.** Write the reaper.\n\n<details><summary>Answer</summary>\n\n"
              "```sql\nUPDATE job SET status = 'PENDING', worker_id = NULL\n"
              " WHERE claimed_at < now() - %(lease)s\n```\n\n"
              "It is `labkit/sql/reaper.sql`.\n</details>")
    return v4.new_notebook(cells=[
        v4.new_code_cell("import labkit as lk"),                                              # 0
        v4.new_markdown_cell(answer),                                                         # 1
        v4.new_code_cell('MY_REAPER = "UPDATE job SET status = 1"\nprint(check(MY_REAPER))'),   # 2
        v4.new_code_cell('print(lk.read_sql("reaper.sql"))'),                                 # 3
        v4.new_code_cell("result = check(MY_REAPER)\nassert result.passed"),                  # 4
        v4.new_code_cell('REAPER = """UPDATE job SET status = \'PENDING\',\n       worker_id = NULL\n'
                         ' WHERE claimed_at < now() - %(lease)s"""'),                        # 5
        v4.new_code_cell('print(open("reaper_answer.sql").read())'),                          # 6
        v4.new_code_cell("drill.print_quiz(key=True)"),                                       # 7
        v4.new_markdown_cell("## 2 · Next section"),                                          # 8
        v4.new_code_cell("assert lk.read_sql('reaper.sql')"),                                 # 9
    ])


def test_a_planted_revealing_cell_is_caught():
    nb = _planted()
    found = revealing(nb, training.student_copy(nb, "99_planted.ipynb"), "99_planted.ipynb")
    assert [f.split(" (")[0] for f in found] == [f"99_planted.ipynb cell {k}" for k in (3, 4, 5, 6, 7)], found
    assert "reads the answer's file" in found[0] and "asserts" in found[1]
    assert "holds the answer's code" in found[2] and "reads the answer's file" in found[3]
    assert "shows a key" in found[4]


def test_tagged_cells_are_blanked_and_still_run():
    nb = _planted()
    for k in (3, 4, 5, 6, 7):
        nb.cells[k].metadata["tags"] = ["answer"]
    nb.cells[2].metadata["tags"] = ["solution"]
    nb.cells[4].outputs = [nbformat.v4.new_output("stream", text="PASS")]
    copy = training.student_copy(nb, "99_planted.ipynb")
    assert revealing(nb, copy, "99_planted.ipynb") == []
    assert copy.cells[3].source == "# Answer: in the instructor's copy, notebooks/99_planted.ipynb.\n"
    assert copy.cells[2].source == "# Your answer here\n"
    assert copy.cells[4].outputs == [] and nb.cells[4].outputs     # the instructor's copy keeps its own
    for cell in copy.cells:
        if cell.cell_type == "code":
            compile(cell.source, "cell", "exec")                        # a placeholder runs, doing nothing
    # the instructor's copy itself, offered as a student copy, is caught: tagged but not blanked
    assert "99_planted.ipynb cell 3: tagged 'answer' but not blanked" in revealing(nb, nb, "99_planted.ipynb")


def test_a_notebook_with_only_tagged_cells_gets_a_student_copy():
    v4 = nbformat.v4
    tagged = v4.new_code_cell("assert answer == 42", metadata={"tags": ["answer"]})
    assert training.is_exercise_notebook(v4.new_notebook(cells=[tagged]))
    assert not training.is_exercise_notebook(v4.new_notebook(cells=[v4.new_code_cell("x = 1")]))


def test_a_recorded_cell_keeps_its_output_labelled_and_an_answer_does_not():
    v4 = nbformat.v4
    out = v4.new_output("stream", name="stdout", text="pgbouncer: SET leaked into the next client\n")
    recorded = v4.new_code_cell("pooler.run(lab)", metadata={"tags": ["recorded"], "claimlab": {"needs": "PgBouncer"}},
                                outputs=[out])
    plain = v4.new_code_cell("print(1)", outputs=[v4.new_output("stream", name="stdout", text="1\n")])
    secret = v4.new_code_cell("assert answer == 42", metadata={"tags": ["recorded", "answer"]},
                              outputs=[v4.new_output("stream", name="stdout", text="42\n")])
    copy = training.student_copy(v4.new_notebook(cells=[recorded, plain, secret]), "99_recorded.ipynb")
    label, kept = copy.cells[0].outputs
    assert label.text == training.RECORDED.format(needs="PgBouncer") and "PgBouncer" in label.text
    assert kept.text == out.text and copy.cells[0].execution_count is None
    assert copy.cells[1].outputs == [] and copy.cells[2].outputs == []


def test_every_recorded_cell_has_output_to_show_and_says_what_it_needs(notebooks):
    """A cell tagged ``recorded`` is committed with its outputs (the student copy shows them
    in place of a run a learner may not be able to make) and names the service it needs."""
    problems, seen = [], set()
    for name, nb in notebooks:
        for k, cell in enumerate(nb.cells):
            if "recorded" not in cell.metadata.get("tags", []):
                continue
            seen.add(name[:2])
            if not cell.outputs:
                problems.append(f"{name} cell {k}: tagged recorded, committed without output")
            if not cell.metadata.get("claimlab", {}).get("needs"):
                problems.append(f"{name} cell {k}: tagged recorded without claimlab.needs")
    assert not problems, "\n".join(problems)
    # the pooler section (PgBouncer) and the appendix (a MySQL-compatible server)
    assert {"12", "21"} <= seen, f"recorded cells in notebooks {sorted(seen)} only"
