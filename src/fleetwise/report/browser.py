"""Load a page in headless Chromium: its console messages, and a screenshot or the rendered DOM.

Used to check that reports and the live page load cleanly in a real browser (tests) and to
take the screenshots kept in docs/img/. Chromium runs isolated: a fresh profile directory,
no sandbox (containers), no GPU, no background networking, updates or sync.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
         "--enable-logging=stderr", "--v=0", "--log-level=0")
CONSOLE = re.compile(r":CONSOLE[:(]\d*\)?\]\s*(.*)$")
"""A page's console message as Chromium logs it to stderr: `[...:INFO:CONSOLE:12] "text", source: ...`."""


def find_browser() -> str | None:
    """Path of a Chromium-family browser on PATH, or None."""
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class PageLoad:
    """What loading a page produced: console messages (any is a failure for our pages) and the DOM."""

    console: list[str]
    dom: str
    returncode: int


def load(url: str, screenshot: Path | None = None, dump_dom: bool = False, size: tuple[int, int] = (1280, 900),
         wait_ms: int = 500, timeout_s: float = 60.0, browser: str | None = None) -> PageLoad:
    """Open `url` headless for `wait_ms` of page time; write a PNG screenshot or return the DOM."""
    exe = browser or find_browser()
    if exe is None:
        raise FileNotFoundError("no chromium on PATH (Debian: apt-get install -y chromium)")
    with tempfile.TemporaryDirectory(prefix="fleetwise-chromium-") as profile:
        cmd = [exe, *FLAGS, f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}",
               f"--virtual-time-budget={wait_ms}"]
        if screenshot is not None:
            cmd.append(f"--screenshot={screenshot}")
        if dump_dom:
            cmd.append("--dump-dom")
        proc = subprocess.run([*cmd, url], capture_output=True, text=True, timeout=timeout_s, check=False)
    console = [m.group(1) for line in proc.stderr.splitlines() if (m := CONSOLE.search(line))]
    return PageLoad(console, proc.stdout if dump_dom else "", proc.returncode)
