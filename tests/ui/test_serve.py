"""`fleet-tui serve`: the panel in a real browser (Debian's headless chromium),
the gate in front of it, and what a served panel turns off.

The browser reads what the terminal shows from xterm.js's own buffer in the page
(serve_support.screen), and types through WebDriver key events, as a user does. One
browser serves the module's tests (they share an xdist group, so a worker); each test
has its own server over its own store.
"""

from __future__ import annotations

import dataclasses
import http.client
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from endpoint_helpers import run_cli
from serve_support import (
    Served,
    browser_missing,
    click_text,
    ctrl,
    descendants,
    new_browser,
    panels,
    press,
    screen,
    serve,
    wait_for,
    wait_screen,
)
from test_ui_support import QUICK_SCRIPTS, TEST_KEY

from fleet_tui.commands.serve import is_loopback, page_keys
from fleet_tui.demo.endpoint import ScriptedEndpoint
from fleet_tui.engine.fleet import Fleet
from fleet_tui.settings.config import load_settings
from fleet_tui.store.db import Task, TaskSpec, TaskState
from fleet_tui.ui.actions import IN_BROWSER_EDITOR, IN_BROWSER_SHELL, Context, find

_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
pytestmark = pytest.mark.xdist_group("serve-browser")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless chromium for the module; missing: skip with the reason (fail in CI,
    where scripts/test installs it as root)."""
    why = browser_missing()
    if why is not None:
        if _CI:
            pytest.fail(why)
        pytest.skip(why)
    driver = new_browser()
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def fresh(browser: Any) -> Iterator[Any]:
    """The module's browser with no cookie and one tab, at the test's start and end."""
    def reset() -> None:
        for handle in browser.window_handles[1:]:
            browser.switch_to.window(handle)
            browser.close()
        browser.switch_to.window(browser.window_handles[0])
        browser.get("about:blank")
        browser.delete_all_cookies()

    reset()
    yield browser
    reset()


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    host, _, rest = url.removeprefix("http://").partition("/")
    name, _, port = host.partition(":")
    conn = http.client.HTTPConnection(name, int(port), timeout=10)
    try:
        conn.request("GET", "/" + rest, headers=headers or {})
        reply = conn.getresponse()
        return reply.status, reply.read().decode(errors="replace")
    finally:
        conn.close()


# --- without a browser: the refusals ----------------------------------------------------------
def test_binding_beyond_loopback_needs_public(git_repo: Path) -> None:
    env = dict(os.environ)
    out = run_cli(env, git_repo, "serve", "--bind", "0.0.0.0", "--port", "0")
    assert out.returncode == 2
    assert "--public" in out.stderr and "TLS" in out.stderr and "ssh -L" in out.stderr
    assert out.stdout == ""  # nothing listened, no link printed
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5")
    assert not is_loopback("myhost.example")


def test_a_bad_serve_table_is_said_with_its_line(git_repo: Path, tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('model = "m"\n[serve]\ntoken = "short"\n')
    env = {**os.environ, "FLEET_TUI_CONFIG": str(config)}
    out = run_cli(env, git_repo, "serve", "--port", "0")
    assert out.returncode == 2
    assert f"{config}, line 3: [serve] token: expected a string of at least 16" in out.stderr
    assert "short" not in out.stderr  # never the token itself


def test_the_served_panel_says_why_shell_and_editor_are_off() -> None:
    task = Task(id="t1", prompt="p", repo=Path("/r"), title="t", state=TaskState.SUCCEEDED,
                worktree=Path("/r/wt"), branch="fleet/t1")
    ctx = Context(targets=[task], cursor=task, selected=task, marked=0, unmarked_shown=False,
                  diff_file="a.txt", filtering=False)
    shell, edit = find("shell"), find("edit")
    assert shell is not None and edit is not None
    assert shell.verdict(ctx) is True and edit.verdict(ctx) is True  # in a terminal
    served = dataclasses.replace(ctx, served=True)
    assert shell.verdict(served) == IN_BROWSER_SHELL  # dimmed, with the reason
    assert edit.verdict(served) == IN_BROWSER_EDITOR
    assert "open on the machine that serves it" in IN_BROWSER_SHELL


def test_the_pages_escape_key_reaches_the_panel_without_the_parsers_wait() -> None:
    from textual._xterm_parser import XTermParser

    # a lone ESC as the page sends it: Textual's parser cannot tell it from the start of a
    # sequence and reports nothing until its ESCAPE_DELAY has passed
    assert list(XTermParser().feed("\x1b")) == []
    # what the relay sends instead is the Escape key at once
    keys = list(XTermParser().feed(page_keys("\x1b")))
    assert [key.key for key in keys] == ["escape"]
    # whole sequences and other keys go as they came
    for data in ("\x1b[A", "\x1bx", "q", "\x1b\x1b", "\x1b[200~\x1b\x1b[201~"):
        assert page_keys(data) == data


def _cookie_of(srv: Served) -> str:
    """The session cookie the link trades its token for (name=value)."""
    host, _, rest = srv.link.removeprefix("http://").partition("/")
    name, _, port = host.partition(":")
    conn = http.client.HTTPConnection(name, int(port), timeout=10)
    try:
        conn.request("GET", "/" + rest)
        reply = conn.getresponse()
        reply.read()
        assert reply.status == 200
        return reply.getheader("Set-Cookie", "").split(";", 1)[0]
    finally:
        conn.close()


async def _ws_status(url: str, cookie: str, origin: str | None) -> int:
    """The websocket handshake's status (101: accepted, the socket closed at once)."""
    import aiohttp

    headers = {"Cookie": cookie, **({"Origin": origin} if origin is not None else {})}
    async with aiohttp.ClientSession() as http_session:
        try:
            async with http_session.ws_connect(url, headers=headers, autoclose=True):
                return 101
        except aiohttp.WSServerHandshakeError as exc:
            return exc.status


def _post_status(base: str, cookie: str, origin: str) -> int:
    host, _, _ = base.removeprefix("http://").partition("/")
    name, _, port = host.partition(":")
    conn = http.client.HTTPConnection(name, int(port), timeout=10)
    try:
        conn.request("POST", "/ws", body=b"{}", headers={"Cookie": cookie, "Origin": origin})
        reply = conn.getresponse()
        reply.read()
        return reply.status
    finally:
        conn.close()


async def test_the_panel_answers_its_own_page_only(git_repo: Path, tmp_path: Path) -> None:
    """A page of another origin (a worker's dev server on another local port: SameSite
    does not tell ports apart) carries the cookie, yet its websocket and its POST get 403
    and start no panel; the page's own origin, and one named in [serve] origins for a
    reverse proxy, get in."""
    import asyncio

    config = tmp_path / "config.toml"
    config.write_text('[serve]\norigins = ["https://panel.example.com"]\n')
    env = {**os.environ, "FLEET_TUI_CONFIG": str(config)}
    with serve(env, git_repo, "--repo", str(git_repo), "--no-scheduler") as srv:
        cookie = await asyncio.to_thread(_cookie_of, srv)
        ws = srv.base.replace("http://", "ws://") + "ws"
        own = srv.base.rstrip("/")
        for evil in ("http://evil.example", "http://127.0.0.1:1", "null",
                     own.replace("http://", "https://")):
            assert await _ws_status(ws, cookie, evil) == 403, evil
            assert await asyncio.to_thread(_post_status, srv.base, cookie, evil) == 403
        assert descendants(srv.proc.pid) == []  # no panel was started for them
        assert await _ws_status(ws, "", own) == 401  # its own page still needs the cookie
        assert await _ws_status(ws, cookie, own) == 101
        assert await _ws_status(ws, cookie, "https://panel.example.com") == 101
        assert await _ws_status(ws, cookie, None) == 101  # not a browser: the cookie is all


def test_bad_origins_are_said_with_their_line(git_repo: Path, tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[serve]\norigins = ["https://ok.example", "panel.example.com/x"]\n')
    out = run_cli({**os.environ, "FLEET_TUI_CONFIG": str(config)}, git_repo, "serve",
                  "--port", "0")
    assert out.returncode == 2 and out.stdout == ""
    assert f"{config}, line 2: [serve] origins: expected a list of origins" in out.stderr


# --- in the browser ---------------------------------------------------------------------------


def test_no_token_no_panel_then_the_link_shows_the_store(fresh: Any, git_repo: Path) -> None:
    fleet = Fleet(load_settings())
    titles = ["Tidy the readme", "Port the parser"]
    for title in titles:
        fleet.submit(TaskSpec(prompt=f"{title} please", title=title, repo=git_repo))
    with serve(dict(os.environ), git_repo, "--repo", str(git_repo), "--no-scheduler") as srv:
        # without the token: 401 everywhere, the websocket included, and no panel started
        for path in ("/", "/ws", "/static/js/textual.js", "/?token=not-the-token"):
            status, body = _get(srv.base + path.lstrip("/"), {
                "Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
                "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="} if path == "/ws" else None)
            assert status == 401, path
            assert "needs the link" in body
        fresh.get(srv.base)
        assert "needs the link" in fresh.find_element("tag name", "body").text
        assert descendants(srv.proc.pid) == []  # no panel, no shell: nothing was started

        # with it: the page, the cookie, the task list of the store as the terminal shows it
        fresh.get(srv.link)
        text = wait_screen(fresh, titles[1])
        assert titles[0] in text and "queued" in text
        assert srv.token not in fresh.current_url  # traded for the cookie, out of the bar
        cookies = fresh.get_cookies()
        assert len(cookies) == 1 and cookies[0]["httpOnly"] is True
        assert cookies[0]["sameSite"] == "Strict" and srv.token not in cookies[0]["value"]
        assert len(panels(srv.proc.pid)) == 1
        # the Escape key pressed in the page (sent on as the unambiguous form) closes the help
        press(fresh, "?")
        wait_screen(fresh, "Tasks and views")
        from selenium.webdriver.common.keys import Keys

        press(fresh, Keys.ESCAPE)
        wait_for(lambda: "Tasks and views" not in screen(fresh), what="the help closed")
        assert titles[0] in screen(fresh)
    assert srv.token not in "".join(srv.output[1:])  # printed once, in the link, never logged


@pytest.mark.real_claude
def test_launch_from_the_browser_in_two_sessions(fresh: Any, git_repo: Path, claude_bin: str
                                                 ) -> None:
    with ScriptedEndpoint(QUICK_SCRIPTS) as endpoint:
        env = {**os.environ, "FLEET_WORKER_BASE_URL": endpoint.url,
               "FLEET_WORKER_CLAUDE": claude_bin, "FLEET_WORKER_KEY_SOURCES": "env",
               "ANTHROPIC_AUTH_TOKEN": TEST_KEY, "CLAUDE_CODE_MAX_RETRIES": "0"}
        with serve(env, git_repo, "--repo", str(git_repo)) as srv:
            fresh.get(srv.link)
            wait_screen(fresh, "n New")
            first = fresh.current_window_handle
            fresh.switch_to.new_window("tab")  # the second session: same cookie, own panel
            fresh.get(srv.base)
            wait_screen(fresh, "n New")
            second = fresh.current_window_handle
            wait_for(lambda: len(panels(srv.proc.pid)) == 2, what="two panel processes")

            fresh.switch_to.window(first)
            press(fresh, "n")
            wait_screen(fresh, f"New task in {git_repo.name}")
            press(fresh, "Say hello from the browser")
            ctrl(fresh, "s")
            shown = wait_screen(fresh, "Write hello.txt", timeout=60)  # the stream, live
            assert TEST_KEY not in shown
            wait_screen(fresh, "done in", timeout=60)
            _check_served(srv, fresh, first)

            fresh.switch_to.window(second)  # the other session sees it through the store
            text = wait_screen(fresh, "Say hello from the browser")
            assert "succeeded" in wait_screen(fresh, "succeeded")
            assert TEST_KEY not in text
        wait_for(lambda: panels(srv.proc.pid) == [] or srv.proc.poll() is not None,
                 what="the panels to end with the server")


def _check_served(srv: Served, driver: Any, handle: str) -> None:
    """The bell of the finished task reached the page, the finish toast drew there, and the
    shell (the task has a worktree now) is off with the reason, as a click on it says."""
    driver.switch_to.window(handle)
    wait_for(lambda: driver.execute_script("return window.fleetBells") >= 1,
             what="the bell in the page")
    wait_screen(driver, "finished")
    wait_screen(driver, "o Shell")  # dimmed: a click says why
    click_text(driver, "o Shell")
    wait_screen(driver, "The panel is in a browser")
    assert srv.proc.poll() is None
