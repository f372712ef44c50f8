"""A real browser for tests of pages people open: Debian's chromium, driven by Playwright.

`open_page(path)` loads a local file in headless Chromium and records what a person's browser would
show in its console and network panel. A test that needs the browser and cannot find it fails (with
how to install it): a page nobody opened in a browser is not tested. `.ci/run` installs the package.
"""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

INSTALL = "apt-get install -y chromium (Debian's package; .ci/run installs it) and pip install -e '.[test]'"


def chromium_path() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail(f"no chromium on PATH: {INSTALL}")


@dataclass
class Visit:
    page: object  # playwright.sync_api.Page
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)  # every URL the page asked for, files included

    @property
    def network_requests(self) -> list[str]:
        """Requests that would leave the machine (anything but file:, data: and the page's own blob: URLs)."""
        return [url for url in self.requests if not url.startswith(("file:", "data:", "blob:"))]


@contextlib.contextmanager
def open_page(path: Path, width: int = 1280, height: int = 900, accept_downloads: bool = False):
    """Yields a Visit of the local file `path`, loaded with its scripts run (downloads kept when asked)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail(f"playwright is not installed: {INSTALL}")
    executable = chromium_path()
    with sync_playwright() as playwright:
        # --no-sandbox: CI and these machines run the tests as root, where Chromium's sandbox refuses to start.
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": width, "height": height}, accept_downloads=accept_downloads)
            visit = Visit(page)
            page.on("console", lambda message: message.type == "error" and visit.console_errors.append(message.text))
            page.on("pageerror", lambda error: visit.page_errors.append(str(error)))
            page.on("request", lambda request: visit.requests.append(request.url))
            page.goto(Path(path).resolve().as_uri(), wait_until="load")
            yield visit
        finally:
            browser.close()


def blank(png: bytes) -> bool:
    """Whether a screenshot is one flat colour (nothing drawn)."""
    import io

    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        low, high = zip(*image.convert("RGB").getextrema())
    return all(a == b for a, b in zip(low, high))
