"""The tests' handle on headless Chromium: labkit's own harness (labkit/tools/browser.py), with
a missing browser a skip — or, under LABKIT_REQUIRE_BROWSER (as in CI), a failure."""

from __future__ import annotations

import os

import pytest

from labkit.tools import browser as _browser
from labkit.tools.browser import CHROMIUM_NAMES, NoBrowser  # noqa: F401  (re-exported)


def find_chromium() -> str:
    try:
        return _browser.find_chromium()
    except NoBrowser as exc:
        if os.environ.get("LABKIT_REQUIRE_BROWSER"):
            pytest.fail("LABKIT_REQUIRE_BROWSER is set but no Chromium is installed "
                        "(apt-get install chromium).")
        pytest.skip(f"no Chromium on this machine ({exc}): install it (apt-get install chromium / "
                    "brew install --cask chromium) to check the slides and handouts in a browser")


class Browser(_browser.Browser):
    def __init__(self, width: int | None = None, height: int | None = None):
        find_chromium()
        super().__init__(width, height)
