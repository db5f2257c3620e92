"""Committed notebooks are executed top to bottom, carry outputs and no widget state, and are
saved byte for byte as JupyterLab saves them: opening and saving one changes nothing."""

import json
import shutil
from pathlib import Path

import nbformat
import pytest

from labkit.tools.nbtools import jupyter_text, merge_streams, problems

ROOT = Path(__file__).parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
COMMITTED = NOTEBOOKS + sorted((ROOT / "student").glob("*.ipynb"))


def test_there_are_notebooks():
    names = [p.name for p in NOTEBOOKS]
    assert "00_start_here.ipynb" in names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_executed_and_clean(path):
    text = path.read_text(encoding="utf-8")
    nb = nbformat.reads(text, as_version=4)
    assert problems(nb, text) == []
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


# -- saved as Jupyter saves ---------------------------------------------------------------------
def contents_manager(root: Path):
    """jupyter_server's own contents manager (what JupyterLab opens and saves through) over
    ``root``, its notebook signatures kept there too."""
    from jupyter_server.services.contents.filemanager import FileContentsManager
    from traitlets.config import Config

    return FileContentsManager(root_dir=str(root), config=Config({"NotebookNotary": {"data_dir": str(root)}}))


def test_opening_and_saving_in_jupyter_changes_no_committed_notebook(tmp_path):
    # Each committed notebook (notebooks/ and student/) opened and saved back unchanged, as
    # JupyterLab does, through jupyter_server's contents manager: the bytes stay the same.
    changed = []
    cm = contents_manager(tmp_path)
    for path in COMMITTED:
        name = f"{path.parent.name}-{path.name}"
        shutil.copyfile(path, tmp_path / name)
        cm.save(cm.get(name), name)
        if (tmp_path / name).read_bytes() != path.read_bytes():
            changed.append(name)
    assert len(COMMITTED) > len(NOTEBOOKS) > 10
    assert changed == [], f"JupyterLab would rewrite {changed} on opening and saving them"


def test_jupyter_text_is_what_jupyter_server_writes(tmp_path):
    # A notebook with what an editor might write otherwise: non-ASCII text, keys out of order,
    # sources as one string: jupyter_text gives the very bytes the contents manager saves.
    nb = nbformat.v4.new_notebook(metadata={"zeta": 1, "kernelspec": {"name": "python3",
                                                                       "display_name": "Python 3 (ipykernel)"}})
    nb.cells = [nbformat.v4.new_markdown_cell("# Die Warteschlange — “claim” ✓\nzweite Zeile"),
                nbformat.v4.new_code_cell("x = 'ü'\nprint(x)", execution_count=1,
                                          outputs=[nbformat.v4.new_output("stream", text="ü\n")])]
    cm = contents_manager(tmp_path)
    cm.save({"type": "notebook", "content": json.loads(json.dumps(nb))}, "n.ipynb")
    saved = (tmp_path / "n.ipynb").read_text(encoding="utf-8")
    assert jupyter_text(nb) == saved
    assert "— “claim” ✓" in saved and saved.endswith("}\n")
    assert problems(nbformat.reads(saved, as_version=4), saved) == problems(nb)


@pytest.mark.parametrize("rewrite", [
    lambda d: json.dumps(d, indent=2, sort_keys=True, ensure_ascii=False) + "\n",
    lambda d: json.dumps(d, indent=1, sort_keys=True, ensure_ascii=True) + "\n",
    lambda d: json.dumps(d, indent=1, sort_keys=True, ensure_ascii=False),
    lambda d: json.dumps(dict(reversed(list(d.items()))), indent=1, ensure_ascii=False) + "\n",
], ids=["indent-2", "ascii-escapes", "no-final-newline", "keys-unsorted"])
def test_a_notebook_not_saved_as_jupyter_saves_is_a_problem(rewrite):
    text = NOTEBOOKS[0].read_text(encoding="utf-8")
    other = rewrite(json.loads(text))
    assert other != text
    nb = nbformat.reads(other, as_version=4)
    assert problems(nb) == []                   # the same notebook, written another way
    assert [p for p in problems(nb, other) if p.startswith("not saved as Jupyter saves it")], other[:200]
