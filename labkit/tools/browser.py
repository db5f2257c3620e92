"""Open a page in headless Chromium and collect what its console says (Chrome DevTools Protocol).

Used by ``labkit slides --check`` and by the tests that open the decks and handouts.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request

from ..core.errors import LabkitError

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
INSTALL_HINT = "install it (apt-get install chromium / brew install --cask chromium)"


class NoBrowser(LabkitError):
    """No Chromium on this machine."""


def find_chromium() -> str:
    """The path of a Chromium (or Chrome) binary, or ``NoBrowser`` naming the fix."""
    override = os.environ.get("LABKIT_CHROMIUM")
    if override:
        found = shutil.which(override)
        if found:
            return found
        raise NoBrowser(f"LABKIT_CHROMIUM={override} is not an executable.",
                        "point it at a Chromium binary, or unset it and " + INSTALL_HINT + ".")
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    raise NoBrowser("No Chromium is installed on this machine (looked for "
                    + ", ".join(CHROMIUM_NAMES) + ").", INSTALL_HINT + ".")


class Browser:
    """One headless Chromium with one page, driven over its debugging websocket."""

    def __init__(self, width: int | None = None, height: int | None = None):
        import websocket

        self._websocket = websocket
        self._events: list[dict] = []
        binary = find_chromium()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.profile = tempfile.mkdtemp(prefix="labkit-chromium-")
        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--remote-allow-origins=*", f"--user-data-dir={self.profile}",
             f"--remote-debugging-port={self.port}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=1) as r:
                    pages = [p for p in json.load(r) if p.get("type") == "page"]
                if pages:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError("Chromium did not open its debugging port")
            time.sleep(0.1)
        self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=30,
                                              suppress_origin=True)
        self._id = 0
        for method in ("Runtime.enable", "Log.enable", "Page.enable"):
            self.call(method)
        if width and height:
            self.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                      deviceScaleFactor=1, mobile=False)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def call(self, method: str, **params):
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self._id:
                return msg.get("result", {})
            self._events.append(msg)

    def open(self, url: str, settle_s: float = 1.0) -> tuple[list[str], Browser]:
        """Navigate; return the console errors, uncaught exceptions and failed loads."""
        self._events = []
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + 30
        loaded_at = None
        self.ws.settimeout(0.2)
        while time.monotonic() < deadline:
            try:
                self._events.append(json.loads(self.ws.recv()))
            except self._websocket.WebSocketTimeoutException:
                pass
            if loaded_at is None and any(e.get("method") == "Page.loadEventFired" for e in self._events):
                loaded_at = time.monotonic()
            if loaded_at and time.monotonic() - loaded_at > settle_s:
                break
        self.ws.settimeout(30)
        return self.errors(), self

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and failed loads since the last ``open``."""
        errors = []
        for e in self._events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.exceptionThrown":
                errors.append("exception: " + p["exceptionDetails"].get("text", "")
                              + " " + str(p["exceptionDetails"].get("exception", {}).get("description", "")))
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                errors.append("console.error: " + " ".join(str(a.get("value", a.get("description", "")))
                                                            for a in p.get("args", [])))
            elif m == "Log.entryAdded" and p["entry"].get("level") == "error":
                errors.append(f"log: {p['entry'].get('text')} {p['entry'].get('url', '')}")
        return errors

    def evaluate(self, expression: str, await_promise: bool = False):
        res = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                        awaitPromise=await_promise)
        if "exceptionDetails" in res:
            raise RuntimeError(f"in the page: {res['exceptionDetails'].get('exception', {}).get('description') or res['exceptionDetails'].get('text')}")
        return res.get("result", {}).get("value")

    def close(self) -> None:
        try:
            self.ws.close()
        except Exception:
            pass
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.profile, ignore_errors=True)
