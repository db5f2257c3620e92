"""Committed notebooks are executed top to bottom, carry outputs and no widget state."""

from pathlib import Path

import nbformat
import pytest

from labkit.tools.nbtools import merge_streams, problems

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("[0-9]*.ipynb"))


def test_there_are_notebooks():
    names = [p.name for p in NOTEBOOKS]
    assert "00_start_here.ipynb" in names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_executed_and_clean(path):
    nb = nbformat.read(path, as_version=4)
    assert problems(nb) == []
    assert nb.metadata.get("claimlab", {}).get("minutes"), "map metadata (title, minutes) missing"


def test_a_kernelspec_jupyterlab_would_rewrite_is_a_problem():
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    assert any("kernelspec display name 'Python 3'" in p for p in problems(nb))
    nb.metadata["kernelspec"]["display_name"] = "Python 3 (ipykernel)"
    assert not any("kernelspec" in p for p in problems(nb))


def test_problems_are_found_in_a_stale_notebook():
    nb = nbformat.v4.new_notebook()
    nb.metadata["widgets"] = {"state": {}}
    nb.cells = [nbformat.v4.new_code_cell("1 + 1"), nbformat.v4.new_code_cell("2")]
    nb.cells[1].execution_count = 1
    nb.cells.append(nbformat.v4.new_code_cell("print(path)"))
    nb.cells[2].execution_count = 2
    nb.cells[2].outputs = [nbformat.v4.new_output("stream", text="data in /home/alice/.cache/x\n")]
    nb.cells.append(nbformat.v4.new_code_cell("box"))
    nb.cells[3].execution_count = 3
    nb.cells[3].outputs = [nbformat.v4.new_output("execute_result", data={"text/plain": "VBox(children=(Play(),))"},
                                                  execution_count=3)]
    found = problems(nb)
    assert "cell 3 shows a widget's repr instead of a static view" in found
    assert "carries widget state metadata" in found
    assert any("home folder path (/home/alice/" in f for f in found), found
    assert "cell 0 was never executed" in found


def test_a_print_split_into_chunks_is_saved_as_one_output():
    out = nbformat.v4.new_output
    outputs = [out("stream", name="stdout", text="partitioned: ERROR"), out("stream", name="stdout", text="\n"),
               out("stream", name="stderr", text="warning\n"), out("stream", name="stdout", text="next\n")]
    merged = merge_streams(outputs)
    assert [(o["name"], o["text"]) for o in merged] == [
        ("stdout", "partitioned: ERROR\n"), ("stderr", "warning\n"), ("stdout", "next\n")]
