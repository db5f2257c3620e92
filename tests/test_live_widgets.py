"""The widgets stay live in JupyterLab: a real JupyterLab, driven from headless
Chromium over the DevTools protocol (labkit/tools/browser.py).

* Every notebook opens (with its kernel, as a reader opens it) without a JavaScript error in the
  console and without a widget's repr (``VBox(children=...``) on the page.
* Notebook 06 runs top to bottom in JupyterLab; its step-through replays render as live widgets,
  and pressing the replay's step control (the "step" slider, from the keyboard) and its Play
  button changes the step the replay shows.
* Notebook 20's quiz on a 1280×720 screen: every choice of every statement, clicked with the
  mouse, is the one the kernel records, and no two choices overlap.
* No slide deck (``labkit slides``) and no handout page (``labkit book``, from the committed
  outputs and from a fresh run) contains a widget's repr; a planted repr is caught, so the check
  can fail.  (These need neither JupyterLab nor Chromium.)

JupyterLab serves a temporary copy of notebooks/ (nothing committed is opened, run or saved), with
its own config, runtime, settings and workspace folders, and its kernels work in lab schemas of
their own (LABKIT_USER), dropped at the end.  The server, its kernels and Chromium are stopped by
the fixtures' finalizers whatever happens.  Without Chromium the tests skip, or fail under
LABKIT_REQUIRE_BROWSER (tests/browser.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest
from conftest import WIDGET_REPR, reprs_in
from browser import Browser, find_chromium

from labkit.core.text import TEXT_WIDTH
from labkit.tools import training

# The front end is the same on every server: checked without LABKIT_DSN (tests/conftest.py).
pytestmark = pytest.mark.default_leg

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
ALL = sorted(p.name for p in NOTEBOOKS.glob("[0-9]*.ipynb"))
RELAY = "06_outbox_relay.ipynb"

START_TIMEOUT_S = 120      # JupyterLab answering on its port (a busy 2-CPU machine)
OPEN_TIMEOUT_S = 90        # one notebook rendered and its kernel idle
RUN_TIMEOUT_S = 420        # notebook 06, all cells (30-60 s on an idle laptop)
STEP_TIMEOUT_S = 30        # a key press's round trip through the kernel
SETTLE_S = 1.0             # quiet time after a notebook is open, for late errors to arrive


# Console errors of the headless set-up itself, not of the workbook, as (pattern, proof) pairs:
# only an error proven to come from the environment may be listed here.  None is needed today
# (news and update checks, the one source of network fetches, are turned off in JupyterLab's
# arguments below instead).
ENVIRONMENT_ERRORS: list[tuple[re.Pattern, str]] = []


# -- JupyterLab ----------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JupyterLab:
    """``jupyter lab`` on a free port with a token, over a temporary copy of notebooks/."""

    def __init__(self) -> None:
        self.home = Path(tempfile.mkdtemp(prefix="labkit-jlab-"))
        self.work = self.home / "notebooks"
        shutil.copytree(NOTEBOOKS, self.work,
                        ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
        self.runtime = self.home / "runtime"
        settings = self.home / "settings"
        # every cell in the DOM (no windowing), so every committed output is rendered on open
        tracker = settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
        tracker.parent.mkdir(parents=True)
        tracker.write_text(json.dumps({"windowingMode": "none"}))
        self.port, self.token = free_port(), f"widgets-{os.getpid()}"
        self.user = f"widgets{os.getpid()}"
        self.log = self.home / "jupyterlab.log"
        env = {**os.environ,
               "JUPYTER_CONFIG_DIR": str(self.home / "config"),
               "JUPYTER_DATA_DIR": str(self.home / "data"),
               "JUPYTER_RUNTIME_DIR": str(self.runtime),
               "LABKIT_USER": self.user}
        args = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1",
                f"--port={self.port}", "--ServerApp.port_retries=0",
                f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.work}",
                "--LabApp.expose_app_in_browser=True",
                f"--LabApp.user_settings_dir={settings}",
                f"--LabApp.workspaces_dir={self.home / 'workspaces'}",
                # no fetches to the internet for news or updates
                "--LabApp.news_url=None",
                "--LabApp.check_for_updates_class=jupyterlab.handlers.announcements.NeverCheckForUpdate"]
        if os.geteuid() == 0:
            args.append("--allow-root")     # as `make lab` does (ROOT_FLAG)
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(args, cwd=self.work, env=env, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def url(self, path: str) -> str:
        sep = "&" if "?" in path else "?"
        return f"http://127.0.0.1:{self.port}/{path}{sep}token={self.token}"

    def api(self, path: str, method: str = "GET", timeout: float = 10):
        req = urllib.request.Request(self.url("api/" + path), method=method)
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                self.api("status", timeout=2)
                return
            except OSError:
                time.sleep(0.3)
        raise AssertionError(f"JupyterLab did not answer within {START_TIMEOUT_S} s "
                             f"(exit code {self.proc.poll()}):\n{self.log_tail()}")

    def stop(self) -> None:
        """Kernels first (politely, through the server), then the server, then anything of
        ours still alive: kernels are started in sessions of their own, so they are found by
        their connection files, which live in this server's runtime folder only."""
        if self.proc.poll() is None:
            try:
                for kernel in self.api("kernels"):
                    try:
                        self.api(f"kernels/{kernel['id']}", method="DELETE", timeout=30)
                    except OSError:
                        pass
            except OSError:
                pass
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        for pid in self.leftover_pids():
            try:
                os.killpg(pid, signal.SIGKILL)      # the kernel and what it started
            except (ProcessLookupError, PermissionError):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        drop_schemas_of(self.user)
        shutil.rmtree(self.home, ignore_errors=True)

    def leftover_pids(self) -> list[int]:
        """Live processes whose command line names this server's runtime folder (its kernels)."""
        marker = str(self.runtime).encode()
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if marker in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                pass
        return pids


def drop_schemas_of(user: str) -> None:
    import labkit
    from labkit.core.lab import drop_schemas

    with labkit.connect(quiet=True).connect() as conn:
        drop_schemas(conn, "lab\\_%\\_" + user)


# -- the browser, on JupyterLab's page -------------------------------------------------------------
class LabBrowser(Browser):
    """The tests' Chromium, with a few moves for JupyterLab's page."""

    def take_errors(self) -> list[str]:
        """The console errors since the last call (environment errors filtered, see above)."""
        self.evaluate("0")      # reads what the page said up to now
        errors = [e for e in self.errors()
                  if not any(pattern.search(e) for pattern, _ in ENVIRONMENT_ERRORS)]
        self._events = []
        return errors

    def wait_for(self, expression: str, timeout: float, what: str, every: float = 0.25):
        """Poll a JavaScript expression until it is truthy; its value."""
        deadline = time.monotonic() + timeout
        value = None
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(every)
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {value!r})")

    def start_lab(self, lab: JupyterLab) -> list[str]:
        """Load JupyterLab's page and wait for it to be restored; the errors on the way."""
        self.open(lab.url("lab"), settle_s=0.5)
        self.wait_for("!!window.jupyterapp", 60, "window.jupyterapp")
        self.evaluate("window.__restored = false; jupyterapp.restored.then(() => window.__restored = true)")
        self.wait_for("window.__restored", 60, "JupyterLab to restore its layout")
        return self.take_errors()

    def open_notebook(self, name: str) -> dict:
        """Open a notebook (starting its kernel, as a reader would) and wait until every cell is
        in the page, every committed output rendered and the kernel idle."""
        self.evaluate(f"""window.__panel = null;
            jupyterapp.commands.execute('docmanager:open', {{path: {json.dumps(name)}, factory: 'Notebook'}})
              .then(w => window.__panel = w, e => window.__panel = {{error: String(e)}})""")
        self.wait_for("!!window.__panel", OPEN_TIMEOUT_S, f"{name} to open")
        failed = self.evaluate("window.__panel.error || ''")
        assert not failed, f"{name}: {failed}"
        state = self.wait_for("""(() => {
            const w = window.__panel;
            if (!w.context.isReady) return null;
            const cells = w.content.widgets;
            const outputs = cells.reduce((n, c) => n + (c.model.type === 'code' ? c.model.outputs.length : 0), 0);
            const shown = w.node.querySelectorAll('.jp-Cell').length;
            const rendered = w.node.querySelectorAll('.jp-OutputArea-child').length;
            const kernel = w.sessionContext.session && w.sessionContext.session.kernel;
            const status = kernel ? kernel.status : 'none';
            if (shown < cells.length || rendered < outputs || status !== 'idle') return null;
            return {cells: cells.length, outputs, status, text: w.node.innerText};
        })()""", OPEN_TIMEOUT_S, f"{name} to render with an idle kernel")
        self.evaluate("jupyterapp.shell.activateById(window.__panel.id)")
        return state

    def close_notebook(self) -> None:
        """Shut the open notebook's kernel down and close it, unsaved."""
        self.evaluate("""window.__closed = false;
            (async () => { const w = window.__panel;
                try { await w.sessionContext.shutdown(); } finally {
                    w.context.model.dirty = false; w.dispose(); window.__closed = true; } })()""")
        self.wait_for("window.__closed", 60, "the notebook to close")

    def press_key(self, key: str, code: int) -> None:
        for kind in ("keyDown", "keyUp"):
            self.call("Input.dispatchKeyEvent", type=kind, key=key, code=key,
                      windowsVirtualKeyCode=code, nativeVirtualKeyCode=code)

    def click(self, selector_js: str) -> None:
        """A real mouse click at the centre of the element ``selector_js`` evaluates to."""
        box = self.evaluate(f"""(() => {{ const el = {selector_js};
            el.scrollIntoView({{block: 'center'}});
            const r = el.getBoundingClientRect();
            return {{x: r.left + r.width / 2, y: r.top + r.height / 2}}; }})()""")
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=box["x"], y=box["y"],
                      button="left", clickCount=1)


# -- fixtures ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def jupyterlab():
    find_chromium()     # no Chromium: skip (or fail under LABKIT_REQUIRE_BROWSER) before starting anything
    lab = JupyterLab()
    try:
        lab.wait_ready()
        yield lab
    finally:
        lab.stop()


@pytest.fixture(scope="module")
def lab_page(jupyterlab):
    """Chromium on JupyterLab's page (closed before the server stops)."""
    browser = LabBrowser(1280, 900)
    try:
        errors = browser.start_lab(jupyterlab)
        yield browser, errors
    finally:
        browser.close()


# -- tests ----------------------------------------------------------------------------------------
def test_every_notebook_opens_in_jupyterlab_without_console_errors_or_widget_reprs(jupyterlab, lab_page):
    browser, startup_errors = lab_page
    found = {"(JupyterLab's page)": startup_errors} if startup_errors else {}
    reprs = []
    for name in ALL:
        state = browser.open_notebook(name)
        time.sleep(SETTLE_S)
        if WIDGET_REPR.search(state["text"]):
            reprs.append(name)
        browser.close_notebook()
        errors = browser.take_errors()
        if errors:
            found[name] = errors
    assert found == {}, "JavaScript console errors:\n" + "\n".join(
        f"  {name}: {err}" for name, errs in found.items() for err in errs)
    assert reprs == [], f"a widget's repr shows in JupyterLab in {reprs}"


def test_notebook_06_runs_and_its_replay_steps_when_its_controls_are_pressed(jupyterlab, lab_page):
    browser, _ = lab_page
    browser.take_errors()       # anything earlier belongs to the test above (or the page's start)
    browser.open_notebook(RELAY)
    browser.evaluate("""window.__run = null;
        jupyterapp.commands.execute('notebook:run-all-cells')
          .then(r => window.__run = {done: String(r)}, e => window.__run = {error: String(e)})""")
    # done when the command's promise settles and no cell is queued or running
    browser.wait_for("""(() => { const w = window.__panel;
        const busy = w.content.widgets.some(c => c.model.type === 'code' && c.node.querySelector('.jp-InputPrompt')
                                                  && c.node.querySelector('.jp-InputPrompt').innerText.includes('*'));
        return window.__run && !busy; })()""", RUN_TIMEOUT_S, f"{RELAY} to run all its cells", every=1.0)
    failures = browser.evaluate("""window.__panel.content.widgets.flatMap((c, i) =>
        c.model.type !== 'code' ? [] : [...Array(c.model.outputs.length).keys()]
          .map(k => c.model.outputs.get(k).toJSON())
          .filter(o => o.output_type === 'error')
          .map(o => `cell ${i}: ${o.ename}: ${o.evalue}`))""")
    assert failures == [], f"{RELAY} failed in JupyterLab: {failures}\n{jupyterlab.log_tail()}"
    unrun = browser.evaluate("""window.__panel.content.widgets.flatMap((c, i) =>
        c.model.type === 'code' && c.model.sharedModel.source.trim() && c.model.executionCount === null ? [i] : [])""")
    assert unrun == [], f"cells left unrun: {unrun} (run-all-cells: {browser.evaluate('window.__run')})"

    # The replays are live widgets: a Play button and a "step" slider above the step shown.
    replays = """[...window.__panel.node.querySelectorAll('.widget-vbox')].filter(b =>
        b.querySelector('.widget-play') && b.querySelector('.widget-slider') && b.querySelector('.widget-output'))"""
    count = browser.wait_for(f"{replays}.length", 30, "the replay widgets to render")
    assert count >= 1
    text = browser.evaluate("window.__panel.node.innerText")
    assert not WIDGET_REPR.search(text), "a widget's repr is shown in the live notebook"
    shown = f"{replays}[0].querySelector('.widget-output').innerText.trim()"
    first = browser.wait_for(f"/^step 1\\/\\d+ /.test({shown}) && {shown}", STEP_TIMEOUT_S,
                             "the replay to show its first step")
    total = int(re.match(r"step 1/(\d+) ", first).group(1))
    assert total > 2

    # The step control, from the keyboard: focus the slider's handle and press the right arrow.
    browser.evaluate(f"""(() => {{ const h = {replays}[0].querySelector('.widget-slider .noUi-handle');
        h.scrollIntoView({{block: 'center'}}); h.focus(); }})()""")
    browser.press_key("ArrowRight", 39)
    second = browser.wait_for(f"/^step 2\\/\\d+ /.test({shown}) && {shown}", STEP_TIMEOUT_S,
                              "the replay to show step 2 after the step control was pressed")
    assert second != first and second.startswith(f"step 2/{total} ")

    # Play moves on from there by itself, step after step.
    browser.click(f"{replays}[0].querySelector('.widget-play button')")
    third = browser.wait_for(f"/^step [3-9]\\d*\\/\\d+ /.test({shown}) && {shown}", STEP_TIMEOUT_S,
                             "Play to move the replay on")
    assert third not in (first, second)
    # Pause before the kernel goes: a Play left running keeps ticking in the page after its
    # kernel is shut down, and every tick it cannot send is a console error in the next test.
    browser.click(f"{replays}[0].querySelectorAll('.widget-play button')[1]")
    time.sleep(1.5)                         # a tick already on its way lands
    paused = browser.evaluate(shown)
    time.sleep(1.5)
    assert browser.evaluate(shown) == paused, "Pause did not stop the replay"
    errors = browser.take_errors()
    assert errors == [], f"JavaScript console errors while {RELAY} opened, ran and stepped: {errors}"
    browser.close_notebook()


# -- the quiz on a projector -------------------------------------------------------------------------
QUIZ = "quiz_clicks.ipynb"      # one cell, written into the server's copy: notebook 20's quiz widget
QUIZ_ROOT = "document.querySelector('.labkit-quiz-statement').parentElement"
QUIZ_ROWS = f"[...{QUIZ_ROOT}.querySelectorAll('.labkit-quiz-choice')].filter(r => r.offsetParent !== null)"
QUIZ_PICKED = f"{QUIZ_ROWS}.findIndex(r => r.querySelector('button').classList.contains('mod-primary'))"


def kernel_json(browser: LabBrowser, code: str):
    """Run ``code`` (which prints one JSON value) in the open notebook's kernel; its value."""
    out = browser.evaluate(f"""(async () => {{
        const future = window.__panel.sessionContext.session.kernel.requestExecute(
            {{code: {json.dumps(code)}, store_history: false}});
        let text = '';
        future.onIOPub = m => {{ if (m.header.msg_type === 'stream') text += m.content.text;
                                 if (m.header.msg_type === 'error') text += 'ERROR ' + m.content.evalue; }};
        await future.done;
        return text; }})()""", await_promise=True)
    assert out and not out.startswith("ERROR"), f"the kernel answered {out!r} to {code!r}"
    return json.loads(out)


def quiz_layout(browser: LabBrowser) -> list[dict]:
    """Each visible choice row: its box, its letter button's, the box of its text as laid out
    (a range over the text, so text that overflows its box shows), the text and its size."""
    return browser.evaluate(f"""{QUIZ_ROWS}.map(r => {{
        const box = e => {{ const b = e.getBoundingClientRect(); return [b.left, b.top, b.right, b.bottom]; }};
        const html = r.querySelector('.widget-html-content');
        const range = document.createRange(); range.selectNodeContents(html);
        return {{row: box(r), button: box(r.querySelector('button')), text: box(range),
                 letter: r.querySelector('button').innerText.trim(), words: html.innerText.trim(),
                 size: parseFloat(getComputedStyle(html.firstElementChild).fontSize)}}; }})""")


def overlaps(a: list[float], b: list[float]) -> bool:
    return a[0] < b[2] - 0.5 and b[0] < a[2] - 0.5 and a[1] < b[3] - 0.5 and b[1] < a[3] - 0.5


def inside(inner: list[float], outer: list[float]) -> bool:
    return (inner[0] >= outer[0] - 0.5 and inner[1] >= outer[1] - 0.5
            and inner[2] <= outer[2] + 0.5 and inner[3] <= outer[3] + 0.5)


def check_quiz_layout(browser: LabBrowser, cid: str, shown: list[str]) -> int:
    """The statement on screen shows the kernel's choices, each a full-width block of 20 px
    text inside its own row, no two rows (nor their laid-out text) overlapping, and nothing
    wider than the output area; the number of choices."""
    rows = quiz_layout(browser)
    assert [r["letter"] for r in rows] == [f"{x})" for x in "abcd"[:len(shown)]], cid
    assert [r["words"] for r in rows] == shown, f"{cid}: the page shows other choices than the kernel"
    wide = browser.evaluate(f"(o => [o.scrollWidth, o.clientWidth])({QUIZ_ROOT}.closest('.jp-OutputArea-output'))")
    assert wide[0] <= wide[1] + 1, f"{cid}: the quiz is wider than its output area: {wide}"
    for i, r in enumerate(rows):
        where = f"{cid} {r['letter']}"
        assert r["size"] >= 20, f"{where} is set in {r['size']} px"
        assert inside(r["text"], r["row"]) and inside(r["button"], r["row"]), \
            f"{where}: its text or button spills out of its box: {r}"
        assert r["text"][2] - r["text"][0] > 0.5 * (r["row"][2] - r["row"][0]), f"{where} is not full width"
        for other in rows[i + 1:]:
            assert not overlaps(r["row"], other["row"]) and not overlaps(r["text"], other["text"]), \
                f"{cid}: choices {r['letter']} and {other['letter']} overlap: {r} {other}"
    return len(rows)


def test_every_quiz_choice_clicked_on_a_1280x720_screen_is_the_one_recorded(jupyterlab, lab_page):
    # A trainer's projector: the quiz's choices were radio labels 20 px high holding two lines
    # of text, so they overlapped and a click on b) was recorded as c).  Here every choice of
    # every statement is clicked with the mouse at its letter's centre, and the kernel says
    # which choice it recorded; no two choices' boxes (nor their laid-out text) overlap.
    browser, _ = lab_page
    browser.take_errors()
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell("from labkit.tools import drill\nqz = drill.quiz(seed=2024)")]
    nbformat.write(nb, jupyterlab.work / QUIZ)
    browser.call("Emulation.setDeviceMetricsOverride", width=1280, height=720, deviceScaleFactor=1, mobile=False)
    try:
        assert browser.evaluate("[innerWidth, innerHeight]") == [1280, 720]
        browser.open_notebook(QUIZ)
        browser.evaluate("jupyterapp.commands.execute('notebook:run-all-cells')")
        browser.wait_for(f"document.querySelector('.labkit-quiz-statement') && {QUIZ_ROWS}.length >= 3",
                         OPEN_TIMEOUT_S, "the quiz widget to render")
        ids = kernel_json(browser, "import json; print(json.dumps([c.id for c in qz.items]))")
        assert len(ids) >= 30
        clicked = 0
        for n, cid in enumerate(ids):
            head = f"document.querySelector('.labkit-quiz-statement').innerText.startsWith({json.dumps(cid + ' ·')})"
            browser.wait_for(f"{head} && {QUIZ_PICKED} === -1", STEP_TIMEOUT_S, f"statement {cid} on screen")
            shown = kernel_json(browser, "print(json.dumps(qz.shown))")
            before = -1
            for k in range(check_quiz_layout(browser, cid, shown)):
                browser.click(f"{QUIZ_ROWS}[{k}].querySelector('button')")
                # the letter the kernel highlights moves: wait for that, then ask the kernel
                now = browser.wait_for(f"(i => i !== {before} && i >= 0 && i + 1)({QUIZ_PICKED})", STEP_TIMEOUT_S,
                                       f"{cid}: the click on {'abcd'[k]}) to register", every=0.05) - 1
                got = kernel_json(browser, "print(json.dumps([qz.current.id, qz.selected, qz.selection]))")
                assert got == [cid, k, shown[k]] and now == k, \
                    f"{cid}: clicked {'abcd'[k]}), recorded {got} (highlighted: {'abcd'[now]})"
                clicked, before = clicked + 1, now
            if n + 1 < len(ids):
                browser.click(f"[...{QUIZ_ROOT}.querySelectorAll('button')].find(b => b.innerText.trim() === 'next')")
        print(f"quiz at 1280x720: {len(ids)} statements, {clicked} choices clicked, each recorded as clicked")
        assert clicked >= 3 * len(ids)
        errors = browser.take_errors()
        assert errors == [], f"JavaScript console errors while the quiz was clicked through: {errors}"
    finally:
        browser.call("Emulation.setDeviceMetricsOverride", width=1280, height=900, deviceScaleFactor=1, mobile=False)
        if browser.evaluate("!!(window.__panel && !window.__panel.isDisposed)"):
            browser.close_notebook()


# -- the scheduler's seat on a projector ---------------------------------------------------------------
SEAT = "seat_clicks.ipynb"     # one cell, written into the server's copy: notebook 20's seat
SEAT_ROOT = "document.querySelector('.labkit-seat')"
SEAT_BUTTONS = f"[...{SEAT_ROOT}.querySelectorAll('button')]"


def seat_button(label: str) -> str:
    return f"{SEAT_BUTTONS}.find(b => b.innerText.trim() === {json.dumps(label)})"


def test_the_seats_moves_clicked_on_a_1280x720_screen_are_the_moves_played(jupyterlab, lab_page):
    # The buttons a room calls out, clicked with the mouse on a projector's screen: each click
    # is the move the kernel plays, the labels follow the programs, and the verdict the
    # server gave shows under them.  No two buttons overlap and none leaves the output area.
    browser, _ = lab_page
    browser.take_errors()
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(
        "import os\nos.environ['LABKIT_USER'] = 'seatclicks'\n"
        "import labkit as lk\nfrom labkit.labs import puzzles\n"
        "seat_lab = lk.lab('seat_clicks', quiet=True)\nseat = puzzles.seat(seat_lab, 'held_lock_drain')")]
    nbformat.write(nb, jupyterlab.work / SEAT)
    browser.call("Emulation.setDeviceMetricsOverride", width=1280, height=720, deviceScaleFactor=1, mobile=False)
    try:
        browser.open_notebook(SEAT)
        browser.evaluate("jupyterapp.commands.execute('notebook:run-all-cells')")
        browser.wait_for(f"{SEAT_ROOT} && {SEAT_BUTTONS}.length === 5", OPEN_TIMEOUT_S, "the seat to render")
        boxes = browser.evaluate(f"""{SEAT_BUTTONS}.map(b => {{ const r = b.getBoundingClientRect();
            return [r.left, r.top, r.right, r.bottom]; }})""")
        area = browser.evaluate(f"(o => {{ const r = o.getBoundingClientRect(); return [r.left, r.top, r.right, "
                                f"r.bottom + 10000]; }})({SEAT_ROOT}.closest('.jp-OutputArea-output'))")
        for i, b in enumerate(boxes):
            assert inside(b, area), f"button {i} leaves the output area: {b} {area}"
            assert all(not overlaps(b, other) for other in boxes[i + 1:]), f"buttons overlap: {boxes}"
        for label, played in (("D1: claim", ["D1"]), ("D1: push", ["D1", "D1"]), ("kill D1", ["D1", "D1", "D1!"])):
            browser.wait_for(f"{seat_button(label)} && !{seat_button(label)}.disabled", STEP_TIMEOUT_S,
                             f"the button {label!r}")
            browser.click(seat_button(label))
            browser.wait_for(f"{SEAT_ROOT}.innerText.includes('holds after {len(played)} moves') || "
                             f"{SEAT_ROOT}.innerText.includes('BROKEN after move')", STEP_TIMEOUT_S,
                             f"the move {label!r} to be played")
            assert kernel_json(browser, "import json; print(json.dumps(seat.board.moves))") == played
        assert "BROKEN after move 3: D1,D1,D1!" in browser.evaluate(f"{SEAT_ROOT}.innerText")
        assert browser.evaluate(f"{seat_button('kill D1')}.disabled")
        errors = browser.take_errors()
        assert errors == [], f"JavaScript console errors while the seat was clicked: {errors}"
    finally:
        if browser.evaluate("!!(window.__panel && !window.__panel.isDisposed)"):
            kernel_json(browser, "import json\nseat.close()\nseat_lab.admin.execute("
                                 "'DROP SCHEMA IF EXISTS ' + puzzles.record_schema() + ' CASCADE')\n"
                                 "seat_lab.drop()\nprint(json.dumps(True))")
            browser.close_notebook()
        browser.call("Emulation.setDeviceMetricsOverride", width=1280, height=900, deviceScaleFactor=1, mobile=False)


# -- decks and handouts: static views, never a widget's repr ----------------------------------------
# Every deck and handout page of the workbook is searched for a repr in test_training.py, where
# they are built once; here, that search is shown to find one.
def test_a_widgets_repr_in_a_notebook_shows_in_its_deck_and_is_caught(tmp_path):
    # test_training's check can fail: a replay's output put back to what it was before the static
    # views (the bare repr) reaches the deck and the handout page, and is found there.
    nb = nbformat.read(NOTEBOOKS / RELAY, as_version=4)
    replay = next(c for c in nb.cells if c.cell_type == "code" and ".replay()" in c.source
                  and any("step-through replay" in str(o.get("data", {})) for o in c.outputs))
    for out in replay.outputs:
        if "step-through replay" in str(out.get("data", {})):
            out["data"]["text/plain"] = "VBox(children=(HBox(children=(Play(value=0), IntSlider(value=0))), Output()))"
    planted = tmp_path / RELAY
    nbformat.write(nb, planted)
    decks = training.slides([str(planted)], out=tmp_path / "slides", quiet=True)
    pages = training.book([str(planted)], out=tmp_path / "book", execute=False, quiet=True)
    assert reprs_in(decks) == [decks[0].name] and reprs_in(pages) == [pages[0].name]


def test_a_handout_run_afresh_shows_the_replays_static_view(tmp_path):
    # `labkit book --execute` runs the notebooks afresh: the replay's text form comes from a live kernel
    # there, not from the committed file.  A bare ipywidgets box beside it shows its repr, so
    # the page is known to carry what the kernel gave.
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(
        "from labkit.core.trace import Trace\n"
        "t = Trace('demo')\n"
        "t.add('relay 1', 'claim 3 rows', 'locked')\n"
        "t.add('relay 1', 'publish', 'sent', kind='crash')\n"
        "_ = t.replay(print_text=False)"),
        nbformat.v4.new_code_cell("t.replay(print_text=False)"),
        nbformat.v4.new_code_cell("import ipywidgets\nipywidgets.VBox([ipywidgets.Label('bare')])")]
    for cell in nb.cells:
        cell.metadata["slideshow"] = {"slide_type": "slide"}
    path = tmp_path / "widgets.ipynb"
    nbformat.write(nb, path)
    page, = training.book([str(path)], out=tmp_path / "book", execute=True, quiet=True)
    text = page.read_text()
    assert text.count("step-through replay of 2 steps") == 3   # display() of both, and the last value
    import html

    found = WIDGET_REPR.findall(html.unescape(text))
    assert found == ["VBox(children="], found                 # the bare box only


# -- transcripts keep their columns in JupyterLab ---------------------------------------------------
# JupyterLab sets an output's <pre> in `white-space: pre-wrap` (and `word-break: break-all`): a
# line wider than the output area wraps mid-word and a transcript's or table's columns fall apart.
# labkit keeps what it prints within TEXT_WIDTH characters (labkit/core/text.py); this checks, in
# JupyterLab itself, that every stored text output of these notebooks shows whole on the screens
# that budget is meant for.
WRAP_NOTEBOOKS = ["01_one_lock_three_policies.ipynb", RELAY, "21_other_engines.ipynb"]
# (name, CSS viewport width, height, device pixel ratio, file browser open)
WRAP_LAYOUTS = [
    ("1280x720, file browser open", 1280, 720, 1, True),
    # Chromium's page zoom (Ctrl +) is not reachable over the DevTools protocol of a headless
    # Chromium (the Browser class has no zoom of its own): 150 % zoom of a 1280×720 window would
    # be emulated as what it is for the page, a CSS viewport of 1280/1.5 × 720/1.5 = 853×480 px
    # drawn at 1.5 device pixels per CSS pixel (Emulation.setDeviceMetricsOverride), with the
    # file browser closed: ("150 % zoom", 853, 480, 1.5, False).  It holds 83 characters of
    # output, fewer than labkit's width (core/text.py), so it is not among the layouts held.
]
WRAP_PLANTED = "wrap_planted.ipynb"     # a copy of notebook 01 with one line made too wide
WRAP_PLANTED_CELL = 12
WRAP_PLANTED_LINE = "planted: " + "the line a transcript must never print " * 4


def text_output_cells(nb) -> set[int]:
    """The code cells whose stored outputs JupyterLab shows as text in a <pre>."""
    return {i for i, c in enumerate(nb.cells) if c.cell_type == "code" and any(
        o.output_type in ("stream", "error")
        or (o.get("data") and set(o["data"]) <= {"text/plain"} and o["data"].get("text/plain"))
        for o in c.outputs)}


def set_wrap_layout(browser: LabBrowser, width: int, height: int, scale: float, browser_open: bool) -> dict:
    """The page at ``width``×``height`` CSS px and ``scale`` device px per CSS px, the left
    sidebar showing the file browser (or collapsed), the right one collapsed, the open notebook
    active; once its layout has settled, what the page measures."""
    browser.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                 deviceScaleFactor=scale, mobile=False)
    browser.evaluate(f"""(() => {{ const shell = jupyterapp.shell;
        if ({json.dumps(browser_open)}) shell.activateById('filebrowser'); else shell.collapseLeft();
        shell.collapseRight();
        shell.activateById(window.__panel.id); }})()""")
    probe = """JSON.stringify({viewport: [innerWidth, innerHeight], ratio: devicePixelRatio,
        left: !jupyterapp.shell.leftCollapsed && !!document.querySelector('#filebrowser')
              && document.querySelector('#filebrowser').offsetWidth > 0,
        sidebar: (document.querySelector('#jp-left-stack') || {offsetWidth: 0}).offsetWidth,
        notebook: window.__panel.content.node.clientWidth})"""
    want = {"viewport": [width, height], "ratio": scale, "left": browser_open}
    last = None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:      # settled: as asked, and the same twice in a row
        now = json.loads(browser.evaluate(probe))
        if now == last and all(now[k] == v for k, v in want.items()):
            return now
        last = now
        time.sleep(0.3)
    raise AssertionError(f"the page did not settle at {want}: {last}")


# For every output <pre> of the open notebook (every cell scrolled into view first): its width
# as JupyterLab lays it out (pre-wrap) against its natural width on single lines (white-space:
# pre); those that would wrap, or stick out of the notebook's visible width.
MEASURE_PRES = """(async () => {
    const w = window.__panel;
    const frame = () => new Promise(r => requestAnimationFrame(() => r()));
    await document.fonts.ready;
    for (const c of w.content.widgets) { c.node.scrollIntoView({block: 'start'}); await frame(); }
    await frame();
    const view = w.content.node.getBoundingClientRect();
    const result = {pres: 0, cells: [], wraps: []};
    w.content.widgets.forEach((c, i) => {
        if (c.model.type !== 'code') return;
        const pres = c.node.querySelectorAll('.jp-OutputArea-output pre');
        if (pres.length) result.cells.push(i);
        pres.forEach(pre => {
            result.pres += 1;
            const room = pre.clientWidth;
            const saved = pre.style.whiteSpace;
            pre.style.whiteSpace = 'pre';
            const natural = pre.scrollWidth;
            const left = pre.getBoundingClientRect().left;
            pre.style.whiteSpace = saved;
            const lines = pre.textContent.replace(/\\n$/, '').split('\\n');
            const longest = lines.reduce((a, b) => b.length > a.length ? b : a, '');
            if (natural > room || left + natural > view.right + 0.5) {
                const px = natural / Math.max(longest.length, 1);
                result.wraps.push({cell: i, first: lines[0], longest, chars: longest.length,
                                   natural, room, fits: Math.floor(room / px)});
            }
        });
    });
    return result;
})()"""


def test_no_transcript_wraps_in_jupyterlab_on_a_1280x720_screen_with_the_file_browser_open(jupyterlab, lab_page):
    # Each notebook's stored outputs (nothing is run), at each layout of WRAP_LAYOUTS.  The check
    # can fail: a copy of notebook 01 with one line made too wide shows exactly that line more.
    browser, _ = lab_page
    nb01 = nbformat.read(jupyterlab.work / WRAP_NOTEBOOKS[0], as_version=4)
    cell = nb01.cells[WRAP_PLANTED_CELL]
    assert cell.outputs[0].output_type == "stream" and len(WRAP_PLANTED_LINE) > TEXT_WIDTH + 40
    cell.outputs[0].text += WRAP_PLANTED_LINE + "\n"
    nbformat.write(nb01, jupyterlab.work / WRAP_PLANTED)
    found: dict[tuple[str, str], list[dict]] = {}
    measured = []
    started = time.monotonic()
    try:
        for name in [*WRAP_NOTEBOOKS, WRAP_PLANTED]:
            nb = nbformat.read(jupyterlab.work / name, as_version=4)
            browser.open_notebook(name)
            try:
                for layout, width, height, scale, browser_open in WRAP_LAYOUTS:
                    page = set_wrap_layout(browser, width, height, scale, browser_open)
                    got = browser.evaluate(MEASURE_PRES, await_promise=True)
                    # every cell with a text output was in the page and measured
                    assert set(got["cells"]) == text_output_cells(nb), \
                        f"{name} at {layout}: measured cells {got['cells']}, text outputs in " \
                        f"{sorted(text_output_cells(nb))}"
                    found[name, layout] = got["wraps"]
                    measured.append(f"{name} at {layout} (sidebar {page['sidebar']} px, notebook "
                                    f"{page['notebook']} px): {got['pres']} pres, {len(got['wraps'])} wrap")
            finally:
                browser.close_notebook()
    finally:
        browser.call("Emulation.setDeviceMetricsOverride", width=1280, height=900, deviceScaleFactor=1, mobile=False)
    print(f"\n{len(measured)} views measured in {time.monotonic() - started:.0f} s:\n  " + "\n  ".join(measured))

    # the planted line is caught, at every layout, and nothing else differs from notebook 01
    for layout, *_ in WRAP_LAYOUTS:
        planted = [(w["cell"], w["longest"]) for w in found.pop((WRAP_PLANTED, layout))]
        real = [(w["cell"], w["longest"]) for w in found[WRAP_NOTEBOOKS[0], layout]]
        assert (WRAP_PLANTED_CELL, WRAP_PLANTED_LINE) in planted, f"the planted line was not caught at {layout}"
        assert sorted(planted) == sorted(real + [(WRAP_PLANTED_CELL, WRAP_PLANTED_LINE)]), \
            f"at {layout} the planted copy of notebook 01 differs from 01 in more than its one line"

    wraps = [f"  {name} cell {w['cell']} at {layout}: first line {w['first']!r}; its longest line, "
             f"{w['chars']} characters ({w['natural']} px, room for {w['fits']} in {w['room']} px): "
             f"{w['longest']!r}"
             for (name, layout), ws in found.items() for w in ws]
    assert wraps == [], "outputs that wrap in JupyterLab (their columns fall apart):\n" + "\n".join(wraps)
