"""Working copies (labkit/tools/workcopy.py): `make lab` and `make study` open copies in work/,
so a presenter's evening-before run and a learner's session never write notebooks/ or student/.

* In a temporary workbook: copies are made once; a copy that exists (someone's work) is never
  written over; a copy whose notebook changed since it was copied is named with the command that
  replaces it; ``--fresh`` says what it replaces and keeps the replaced copy beside it; bad input
  is refused with the fix.
* The trainer's evening before, for real: ``make lab`` in a snapshot of this workbook (its own git
  repository) serves the working copies on a free port; every copy is opened and saved back
  through the contents API (as JupyterLab does), notebook 00 runs in a kernel the server starts
  and is saved with its outputs; afterwards ``git status`` is empty and ``labkit student --check``
  passes there.  The server, its kernels, their lab schemas and the snapshot are removed by
  test_live_widgets' JupyterLab.stop whatever happens.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import nbformat
import pytest
from test_live_widgets import JupyterLab, free_port

from labkit import cli
from labkit.core.errors import LabkitError
from labkit.tools import workcopy
from labkit.tools.nbtools import merge_streams, problems

ROOT = Path(__file__).resolve().parent.parent
RUN = "notebooks/00_start_here.ipynb"      # the notebook the trainer runs: the fastest
CELL_TIMEOUT_S = 300


# -- a small workbook ---------------------------------------------------------------------------
def notebook(text: str) -> str:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(text), nbformat.v4.new_code_cell("1 + 1")]
    return nbformat.writes(nb) + "\n"


@pytest.fixture
def book(tmp_path, monkeypatch):
    """notebooks/00_a, notebooks/01_b and student/01_b, in a folder of their own (also the
    current folder)."""
    for rel in ("notebooks/00_a.ipynb", "notebooks/01_b.ipynb", "student/01_b.ipynb"):
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        (tmp_path / rel).write_text(notebook(rel))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_copies_are_made_once_and_a_copy_that_exists_is_never_written_over(book):
    said = []
    copied, stale = workcopy.copy_missing(book, out=said.append)
    assert [p.as_posix() for p in copied] == ["notebooks/00_a.ipynb", "notebooks/01_b.ipynb", "student/01_b.ipynb"]
    assert stale == [] and "2 from notebooks/ and 1 from student/" in said[0]
    for rel in copied:
        assert (book / "work" / rel).read_bytes() == (book / rel).read_bytes()

    # The learner runs and saves a copy; the next `make lab` leaves it alone and says nothing.
    mine = book / "work/notebooks/00_a.ipynb"
    mine.write_text(notebook("my run, my notes"))
    said.clear()
    assert workcopy.copy_missing(book, out=said.append) == ([], [])
    assert said == [] and "my notes" in mine.read_text()

    # `git pull` brings a newer 00_a: the copy is kept and named, with the command that replaces it.
    (book / "notebooks/00_a.ipynb").write_text(notebook("notebooks/00_a.ipynb, second edition"))
    (book / "work/student/01_b.ipynb").unlink()               # and a copy deleted is made again
    copied, stale = workcopy.copy_missing(book, out=said.append)
    assert [p.as_posix() for p in copied] == ["student/01_b.ipynb"]
    assert [p.as_posix() for p in stale] == ["notebooks/00_a.ipynb"]
    assert "my notes" in mine.read_text()
    assert any("work/notebooks/00_a.ipynb was copied before notebooks/00_a.ipynb changed" in line
               and line.endswith("labkit workcopy --fresh notebooks/00_a.ipynb") for line in said), said


def test_fresh_says_what_it_replaces_and_keeps_the_replaced_copy_beside_it(book, capsys):
    workcopy.copy_missing(book, out=lambda line: None)
    mine = book / "work/notebooks/00_a.ipynb"
    mine.write_text(notebook("my run, my notes"))
    (book / "notebooks/00_a.ipynb").write_text(notebook("second edition"))

    # Named by its copy's path, from inside work/notebooks (a terminal in JupyterLab).
    os.chdir(book / "work/notebooks")
    assert workcopy.workcopy_command(notebooks=["00_a.ipynb"], fresh=True, every=False, root=book) == 0
    said = capsys.readouterr().out
    backups = sorted((book / "work/notebooks").glob("00_a.replaced-*.ipynb"))
    assert len(backups) == 1 and "my notes" in backups[0].read_text()
    assert f"replacing work/notebooks/00_a.ipynb with a fresh copy of notebooks/00_a.ipynb; the one " \
           f"replaced is kept as work/notebooks/{backups[0].name}" in said
    assert mine.read_bytes() == (book / "notebooks/00_a.ipynb").read_bytes()
    assert workcopy.copy_missing(book, out=lambda line: None) == ([], [])     # fresh now

    # --all: twice in the same second, each replaced copy kept under a name of its own.
    for text in ("notes, take 2", "notes, take 3"):
        mine.write_text(notebook(text))
        workcopy.workcopy_command(notebooks=[], fresh=True, every=True, root=book)
    said = capsys.readouterr().out
    kept = sorted(p.read_text() for p in (book / "work/notebooks").glob("00_a.replaced-*.ipynb"))
    assert len(kept) == 3 and sum("take 2" in t or "take 3" in t for t in kept) == 2
    assert "work/student/01_b.ipynb is already a fresh copy of student/01_b.ipynb" in said
    assert sorted(p.name for p in (book / "notebooks").iterdir()) == ["00_a.ipynb", "01_b.ipynb"]


def test_bad_input_is_refused_with_the_fix(book, tmp_path_factory):
    def refused(**kw) -> str:
        with pytest.raises(LabkitError) as err:
            workcopy.workcopy_command(**{"notebooks": [], "fresh": True, "every": False, "root": book, **kw})
        return str(err.value)

    assert "There is no notebook 'notebooks/nope' in notebooks/ or student/. Fix: name it as " \
           "notebooks/NAME.ipynb" in refused(notebooks=["notebooks/nope"])
    assert "Fix: name it as" in refused(notebooks=["00_a"])          # a bare name: which folder?
    assert "Fix: name them" in refused()
    assert "Fix: name them" in refused(notebooks=["notebooks/00_a.ipynb"], every=True)
    assert "Fix: add --fresh" in refused(notebooks=["notebooks/00_a.ipynb"], fresh=False)

    # work/ as a file, or a link to somewhere else: nothing is written, the fix is named.
    (book / "work").write_text("a file")
    assert "work is a file, not a folder" in refused(notebooks=["notebooks/00_a.ipynb"])
    with pytest.raises(LabkitError, match=r"Fix: move it away \(`mv work work.old`\)"):
        workcopy.copy_missing(book, out=print)
    (book / "work").unlink()
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    (book / "work").symlink_to(elsewhere)
    with pytest.raises(LabkitError, match=r"work is a link to .*elsewhere.* Fix: remove the link \(`rm work`"):
        workcopy.copy_missing(book, out=print)
    assert list(elsewhere.iterdir()) == []
    (book / "work").unlink()

    # A copy that is a link to the committed notebook: saving it would write notebooks/.
    (book / "work/notebooks").mkdir(parents=True)
    (book / "work/notebooks/00_a.ipynb").symlink_to(book / "notebooks/00_a.ipynb")
    before = (book / "notebooks/00_a.ipynb").read_bytes()
    with pytest.raises(LabkitError, match=r"work/notebooks/00_a.ipynb is a link or a folder.*Fix: move it away"):
        workcopy.workcopy_command(notebooks=["notebooks/00_a.ipynb"], fresh=True, every=False, root=book)
    assert (book / "notebooks/00_a.ipynb").read_bytes() == before


def test_the_command_line_reports_an_unknown_notebook_in_one_line(capsys):
    assert cli.main(["workcopy", "--fresh", "notebooks/no_such_notebook.ipynb"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("labkit: There is no notebook 'notebooks/no_such_notebook.ipynb'") and "Fix:" in err


# -- the trainer's evening before, on a real server -----------------------------------------------
def snapshot(dest: Path) -> Path:
    """This workbook as it is now (tracked files and new ones git does not ignore), committed in
    a git repository of its own at ``dest``."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file():                       # a tracked file deleted in the tree is left out
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(src.read_bytes())
    git = ["git", "-c", "user.name=trainer", "-c", "user.email=trainer@example.invalid"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "the workbook"]):
        subprocess.run([*git, *args], cwd=dest, check=True, capture_output=True)
    return dest


class TrainersLab(JupyterLab):
    """``make lab`` in a snapshot of the workbook, serving its work/ folder on a free port with a
    token, with config, runtime, settings and workspace folders of its own.  The snapshot's own
    labkit is the one imported (PYTHONPATH), by the command line and by the kernels; the
    Makefile runs this .venv's labkit and jupyter (BIN) and finds it set up (STAMP)."""

    def __init__(self) -> None:      # JupyterLab's own serves a bare copy of notebooks/ instead
        self.home = Path(tempfile.mkdtemp(prefix="labkit-workcopy-"))
        self.clone = snapshot(self.home / "claimlab")
        self.runtime = self.home / "runtime"
        self.port, self.token = free_port(), f"workcopy-{os.getpid()}"
        self.user = f"workcopy{os.getpid()}"
        self.log = self.home / "make-lab.log"
        (self.home / "ready").touch()
        self.env = {**os.environ, "PYTHONPATH": str(self.clone), "LABKIT_USER": self.user,
                    "JUPYTER_CONFIG_DIR": str(self.home / "config"),
                    "JUPYTER_DATA_DIR": str(self.home / "data"), "JUPYTER_RUNTIME_DIR": str(self.runtime)}
        args = (f"--no-browser --ip=127.0.0.1 --port={self.port} --ServerApp.port_retries=0 "
                f"--IdentityProvider.token={self.token} --ServerApp.root_dir={self.clone / 'work'} "
                f"--LabApp.user_settings_dir={self.home / 'settings'} "
                f"--LabApp.workspaces_dir={self.home / 'workspaces'} --LabApp.news_url=None "
                "--LabApp.check_for_updates_class=jupyterlab.handlers.announcements.NeverCheckForUpdate")
        self.launched = time.monotonic()
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                ["make", "-s", "lab", f"BIN={Path(sys.executable).parent}", f"STAMP={self.home / 'ready'}",
                 f"JUPYTER_ARGS={args}"], cwd=self.clone, env=self.env, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def send(self, path: str, method: str, body: dict, timeout: float = 60):
        req = urllib.request.Request(self.url("api/" + path), method=method, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.load(resp)

    def labkit(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "labkit", *args], cwd=self.clone, env=self.env,
                              capture_output=True, text=True, timeout=300)

    def git(self, *args: str) -> str:
        return subprocess.run(["git", *args], cwd=self.clone, capture_output=True, text=True, check=True).stdout

    def run_all(self, path: str) -> dict:
        """Run the notebook's code cells top to bottom in a kernel the server starts for it, over
        the kernel's websocket (as JupyterLab's Run All does); its content with their outputs."""
        import websocket

        content = self.api(f"contents/{path}")["content"]
        session = self.send("sessions", "POST", {"path": path, "name": Path(path).name, "type": "notebook",
                                                 "kernel": {"name": "python3"}})
        ws = websocket.create_connection(
            f"ws://127.0.0.1:{self.port}/api/kernels/{session['kernel']['id']}/channels?token={self.token}",
            timeout=CELL_TIMEOUT_S)
        client = uuid.uuid4().hex
        try:
            for cell in (c for c in content["cells"] if c["cell_type"] == "code"):
                msg_id = uuid.uuid4().hex
                ws.send(json.dumps({
                    "header": {"msg_id": msg_id, "msg_type": "execute_request", "session": client,
                               "username": "trainer", "date": "", "version": "5.3"},
                    "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
                    "content": {"code": cell["source"], "silent": False, "store_history": True,
                                "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}}))
                outputs, reply, idle = [], None, False
                while reply is None or not idle:
                    frame = ws.recv()
                    msg = json.loads(frame) if isinstance(frame, str) else {}
                    if msg.get("parent_header", {}).get("msg_id") != msg_id:
                        continue
                    kind = msg["header"]["msg_type"]
                    if kind == "execute_reply":
                        reply = msg["content"]
                    elif kind == "status":
                        idle = msg["content"]["execution_state"] == "idle"
                    elif kind == "clear_output":
                        outputs = []
                    elif kind in ("stream", "display_data", "execute_result", "error"):
                        outputs.append(nbformat.v4.output_from_msg(msg))
                cell["outputs"], cell["execution_count"] = merge_streams(outputs), reply["execution_count"]
        finally:
            ws.close()
            self.api(f"sessions/{session['id']}", method="DELETE", timeout=60)
        return content


@pytest.fixture(scope="module")
def trainers_lab():
    lab = TrainersLab()
    try:
        lab.wait_ready()
        yield lab
    finally:
        lab.stop()


def test_a_trainers_evening_before_runs_and_saves_copies_and_leaves_the_workbook_clean(trainers_lab):
    lab = trainers_lab
    started = time.monotonic()
    answered_s = started - lab.launched
    # The snapshot's labkit is the one under test, not this checkout's.
    where = subprocess.run([sys.executable, "-c", "import labkit; print(labkit.__file__)"], cwd=lab.home,
                           env=lab.env, capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(lab.clone)), where
    before = lab.labkit("student", "--check")
    assert before.returncode == 0, "the workbook's student copies were out of date before the session " \
                                   f"(`labkit student` writes them): {before.stderr}"

    # `make lab` made the copies and serves them: every committed notebook, in work/.
    committed = sorted(p.relative_to(lab.clone).as_posix() for part in ("notebooks", "student")
                       for p in (lab.clone / part).glob("*.ipynb"))
    served = sorted(f"{part}/{item['name']}" for part in ("notebooks", "student")
                    for item in lab.api(f"contents/{part}")["content"] if item["type"] == "notebook")
    assert served == committed and len(served) > 20
    assert "work/: working copies made, " in lab.log.read_text()

    # Open every copy and save it back, as JupyterLab does: the copy's bytes do not change.
    opened = time.monotonic()
    rewritten = []
    for path in served:
        model = lab.api(f"contents/{path}")
        lab.send(f"contents/{path}", "PUT", {"type": "notebook", "format": "json", "content": model["content"]})
        if (lab.clone / "work" / path).read_bytes() != (lab.clone / path).read_bytes():
            rewritten.append(path)
    open_s = time.monotonic() - opened
    assert rewritten == [], f"opening and saving in JupyterLab rewrote {rewritten}"

    # Run notebook 00 in a kernel of the server and save it with its outputs.
    ran = time.monotonic()
    content = lab.run_all(RUN)
    lab.send(f"contents/{RUN}", "PUT", {"type": "notebook", "format": "json", "content": content})
    run_s = time.monotonic() - ran
    text = (lab.clone / "work" / RUN).read_text(encoding="utf-8")
    saved = nbformat.reads(text, as_version=4)
    code = [c for c in saved.cells if c.cell_type == "code"]
    assert problems(saved, text) == [], f"{RUN} as run and saved in the working copy: {problems(saved, text)}"
    assert all(c.outputs for c in code[1:]) and "disjoint, and nobody waited" in str(code[-1].outputs)

    # The workbook is as committed: nothing to commit, nothing git refuses to pull over.
    assert lab.git("status", "--porcelain") == ""
    assert lab.git("status", "--porcelain", "--ignored", "work") == "!! work/\n"
    check = lab.labkit("student", "--check")
    assert check.returncode == 0, check.stdout + check.stderr
    print(f"\n`make lab` made the copies and answered in {answered_s:.1f} s; working copies: {len(served)} opened and saved back unchanged in {open_s:.1f} s; "
          f"{RUN} ({len(code)} code cells) run in a kernel and saved in {run_s:.1f} s; "
          f"whole check {time.monotonic() - started:.1f} s after the server answered")
