"""`fleet-tui serve` and a real browser for the tests and the bench: the server as a process of
this checkout, Debian's headless chromium through its chromedriver (selenium), and the
terminal's text read out of the page's xterm.js buffer (``window.fleetTerminal``, kept by
the page: xterm.js draws on a canvas, so there is no text in the page's DOM to read).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHROMIUM = os.environ.get("FLEET_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("FLEET_TEST_CHROMEDRIVER", "/usr/bin/chromedriver")
URL_RE = re.compile(r"the panel is at (http://\S+/\?token=(\S+))")

# the rows of the terminal as xterm.js holds them (what is on the screen, in cells)
SCREEN_JS = """
const t = window.fleetTerminal;
if (!t) { return null; }
const b = t.buffer.active, rows = [];
for (let i = 0; i < t.rows; i++) {
  const line = b.getLine(b.viewportY + i);
  rows.push(line ? line.translateToString(true) : "");
}
return rows.join("\\n");
"""


def browser_missing() -> str | None:
    """Why the browser tests cannot run here (None: they can)."""
    if not (shutil.which(CHROMIUM) or Path(CHROMIUM).exists()):
        return f"no chromium at {CHROMIUM} (scripts/test installs Debian's as root)"
    if not Path(CHROMEDRIVER).exists():
        return f"no chromedriver at {CHROMEDRIVER} (Debian's chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    return None


def new_browser() -> Any:
    """Headless chromium, driven through the system's chromedriver (nothing downloaded)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,800", "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


@dataclass
class Served:
    """A running `fleet-tui serve`."""

    proc: subprocess.Popen[str]
    link: str  # with the token
    token: str
    output: list[str]

    @property
    def base(self) -> str:
        return self.link.split("?", 1)[0]


def wait_for(predicate: Callable[[], Any], *, timeout: float = 30.0,
             what: str = "the condition", interval: float = 0.05) -> Any:
    """``predicate()``'s first true answer (AssertionError naming ``what`` after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        answer = predicate()
        if answer:
            return answer
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


@contextmanager
def serve(env: dict[str, str], cwd: Path, *args: str, timeout: float = 30.0
          ) -> Iterator[Served]:
    """`fleet-tui serve --port 0 ARGS` until the block ends (then SIGINT, as Ctrl+C)."""
    proc = subprocess.Popen([sys.executable, "-m", "fleet_tui.cli", "serve", "--port", "0",
                             *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    output: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout
        match = None
        while match is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            output.append(line)
            match = URL_RE.search(line)
        assert match is not None, f"no link printed: {''.join(output)}"
        yield Served(proc, match.group(1), match.group(2), output)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if proc.stdout is not None:
            output.extend(proc.stdout.readlines())
            proc.stdout.close()


def descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (from /proc: children of children)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def panels(pid: int) -> list[int]:
    """The panel processes a server started (`fleet_tui.cli --served`)."""
    found = []
    for child in descendants(pid):
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--served" in argv and b"fleet_tui.cli" in argv:
            found.append(child)
    return found


def screen(driver: Any) -> str:
    """What the page's terminal shows now ("" before the terminal exists)."""
    return driver.execute_script(SCREEN_JS) or ""


def wait_screen(driver: Any, text: str, *, timeout: float = 30.0) -> str:
    """The page's terminal text once it shows ``text``."""
    try:
        return str(wait_for(lambda: (s := screen(driver)) and text in s and s,
                            timeout=timeout, what=repr(text)))
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the page's terminal shows:\n{screen(driver)}") from None


def press(driver: Any, *keys: str) -> None:
    """Keys typed into the page's terminal as a user types them (WebDriver key events into
    xterm.js's input, which sends them over the websocket)."""
    from selenium.webdriver.common.action_chains import ActionChains

    driver.execute_script("window.fleetTerminal.focus()")
    ActionChains(driver).send_keys(*keys).perform()


def ctrl(driver: Any, key: str) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    driver.execute_script("window.fleetTerminal.focus()")
    ActionChains(driver).key_down(Keys.CONTROL).send_keys(key).key_up(Keys.CONTROL).perform()


def click_text(driver: Any, text: str) -> None:
    """A click on the first cell of ``text`` where the terminal shows it (the last row that
    holds it: the key bar is at the bottom), through the page's mouse events."""
    from selenium.webdriver.common.action_chains import ActionChains

    rows = screen(driver).split("\n")
    row = max(i for i, line in enumerate(rows) if text in line)
    col = rows[row].index(text)
    element = driver.find_element("css selector", ".xterm-screen")
    cols, lines = driver.execute_script(
        "return [window.fleetTerminal.cols, window.fleetTerminal.rows]")
    width, height = element.size["width"], element.size["height"]
    x = (col + 0.5) * width / cols - width / 2  # offsets from the element's centre
    y = (row + 0.5) * height / lines - height / 2
    ActionChains(driver).move_to_element_with_offset(element, int(x), int(y)).click().perform()
