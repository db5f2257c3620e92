"""Open a page in headless Chromium and collect what its console says (Chrome DevTools Protocol)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request

import pytest

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("LABKIT_REQUIRE_BROWSER"):
        pytest.fail("LABKIT_REQUIRE_BROWSER is set but no Chromium is installed "
                    "(apt-get install chromium).")
    pytest.skip("no Chromium on this machine: install it (apt-get install chromium / brew install "
                "--cask chromium) to check the slides and handouts in a browser")


class Browser:
    def __init__(self):
        import websocket

        self._websocket = websocket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.profile = tempfile.mkdtemp(prefix="labkit-chromium-")
        self.proc = subprocess.Popen(
            [find_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
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
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError("Chromium did not open its debugging port")
            time.sleep(0.1)
        self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=30,
                                              suppress_origin=True)
        self._id = 0
        for method in ("Runtime.enable", "Log.enable", "Page.enable"):
            self.call(method)

    def call(self, method: str, **params):
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self._id:
                return msg.get("result", {})
            self._events.append(msg) if hasattr(self, "_events") else None

    def open(self, url: str, settle_s: float = 1.0) -> tuple[list[str], "Browser"]:
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
        return errors, self

    def evaluate(self, expression: str):
        res = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
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
