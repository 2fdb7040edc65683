"""`fleet-tui serve [--bind ADDR] [--port P] [--public] [--repo PATH] [--no-scheduler]`:
the panel in a browser.

textual-serve runs a Textual app as a process of its own for each browser session and
relays its screen and keys over a websocket (``AppService``); its page draws them with
xterm.js. Here a small aiohttp app of ours stands in front of that relay so that nobody
without the link gets in:

- the link carries a secret token (new at each start, or ``[serve] token`` in config.toml);
  the page that the link opens trades it for a cookie (HttpOnly, SameSite=Strict) that the
  websocket and the assets then carry; anything else is answered 401 before any handler
  runs, so no panel process starts for it. Tokens are compared in constant time and never
  logged (there is no access log: it would write the link's query);
- each websocket is one panel, started as `fleet-tui` is (``--served`` tells it that it is
  in a browser: the shell and the editor would open on this machine, so they are off, with
  the reason), over the same store and engine as every other panel and the CLI;
- the websocket and any request that could change something (not GET or HEAD) answer only
  the server's own page: their Origin must be the origin the request came to (or one of
  ``[serve] origins``, for a reverse proxy), else 403. SameSite=Strict does not tell the
  ports of 127.0.0.1 apart, so without this a page of another local server (a worker's
  dev server) in the same browser would carry the cookie and drive the panel;
- loopback only, unless ``--public`` says otherwise: the token and the panel then cross
  the network in the clear unless TLS is put in front (an SSH tunnel, a tunnel service, a
  reverse proxy).

The page is ours too (``serve_page.html``): relative addresses, so that it works behind a
tunnel or a proxy whatever host and port it gets, no font from the internet, the bell heard.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Awaitable, Callable
    from pathlib import Path

    from aiohttp import web
    from textual_serve.download_manager import DownloadManager

    from fleet_tui.settings.serve import ServeSettings

LOOPBACK_NAMES = ("localhost",)
COOKIE_PREFIX = "fleet_tui_"
REFUSED = ("fleet-tui serve: this panel needs the link that `fleet-tui serve` printed "
           "(with its token).\n")
FOREIGN = ("fleet-tui serve: this request came from a page of another origin; the panel "
           "answers only its own page (behind a reverse proxy: name the page's origin in "
           "[serve] origins of config.toml).\n")
SAFE_METHODS = ("GET", "HEAD")
PAGE = "serve_page.html"


def _parser() -> argparse.ArgumentParser:
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(
        prog="fleet-tui serve",
        description="Serve the panel to a browser: each browser session is a panel of its "
                    "own over the same tasks. Prints the link, with its secret token.")
    parser.add_argument("--bind", default="127.0.0.1", metavar="ADDR",
                        help="the address to listen on (default 127.0.0.1: this machine "
                             "only; reach it from elsewhere through an SSH tunnel)")
    parser.add_argument("--port", type=int, default=None, metavar="P",
                        help="the port (default: [serve] port of config.toml, else 8421; "
                             "0: any free port)")
    parser.add_argument("--public", action="store_true",
                        help="allow an address beyond loopback (put TLS in front: a tunnel "
                             "or a reverse proxy)")
    parser.add_argument("--repo", type=Path, default=None,
                        help="the repository new tasks start in (default: the one around "
                             "the current directory)")
    parser.add_argument("--no-scheduler", action="store_true",
                        help="the browser's panels only watch: they start no queued task")
    return parser


def _fail(message: str, code: int = 2) -> int:
    sys.stderr.write(f"fleet-tui serve: {message}\n")
    return code


def is_loopback(bind: str) -> bool:
    """Whether ``bind`` keeps the server on this machine (an IP literal or localhost)."""
    import ipaddress

    if bind.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(bind.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve beyond loopback


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if not is_loopback(args.bind) and not args.public:
        return _fail(f"--bind {args.bind} reaches beyond this machine: the link's token "
                     "and the panel would cross the network in the clear. Keep the default "
                     "(127.0.0.1) and reach it through an SSH tunnel (`ssh -L "
                     "8421:127.0.0.1:8421 HOST`) or a tunnel service, or add --public and "
                     "put TLS in front (a reverse proxy).")
    if args.port is not None and not 0 <= args.port <= 65535:
        return _fail(f"--port {args.port}: expected 0 to 65535")
    from fleet_tui.settings.config import ConfigError, config_file_path
    from fleet_tui.settings.serve import read_serve_settings

    try:
        config = read_serve_settings(str(config_file_path()))
    except ConfigError as exc:
        return _fail(str(exc))
    repo = args.repo
    if repo is not None:
        from fleet_tui.vcs import git

        try:
            repo = git.main_worktree(repo)
        except git.GitError as exc:
            return _fail(f"--repo {args.repo}: {exc}")
    port = config.port if args.port is None else args.port
    import asyncio

    try:
        return asyncio.run(_serve(args.bind, port, args.public, config,
                                  panel_command(repo, args.no_scheduler)))
    except OSError as exc:
        return _fail(f"cannot listen on {args.bind}:{port}: {exc.strerror or exc}", 1)


def panel_command(repo: Path | None, no_scheduler: bool) -> str:
    """The shell command that starts one panel for one browser session: `fleet-tui` as
    this Python runs it, told that it is served."""
    import shlex

    argv = [sys.executable, "-m", "fleet_tui.cli", "--served"]
    if repo is not None:
        argv += ["--repo", str(repo)]
    if no_scheduler:
        argv.append("--no-scheduler")
    return shlex.join(argv)


class Gate:
    """Who may in: the link's token once, then the cookie it was traded for."""

    def __init__(self, token: str, port: int) -> None:
        import hashlib
        import hmac

        self._token = token.encode()
        # the cookie holds a value derived from the token, not the token: a cookie read
        # out of a browser's store is not the link
        self.cookie_value = hmac.new(self._token, b"fleet-tui serve session",
                                     hashlib.sha256).hexdigest()
        self.cookie_name = f"{COOKIE_PREFIX}{port}"  # cookies are per host, not per port

    def __repr__(self) -> str:
        return f"Gate(cookie={self.cookie_name})"

    @staticmethod
    def _same(given: str | None, expected: bytes) -> bool:
        import hmac

        return given is not None and hmac.compare_digest(given.encode(), expected)

    def has_cookie(self, request: web.Request) -> bool:
        return self._same(request.cookies.get(self.cookie_name), self.cookie_value.encode())

    def has_token(self, request: web.Request) -> bool:
        return self._same(request.query.get("token"), self._token)


def own_origin(request: web.Request) -> str:
    """The origin the request came to: its scheme and the Host it was sent to."""
    scheme = "https" if _came_over_tls(request) else "http"
    return f"{scheme}://{request.host}".lower()


def origin_allowed(request: web.Request, allowed: tuple[str, ...] = ()) -> bool:
    """Whether a request may reach the panel: no Origin (not a browser's cross-site request:
    a browser sends one with every websocket and every POST), or the page's own, or one the
    user named; "null" (a sandboxed or file page) is none of them."""
    origin = request.headers.get("Origin")
    if origin is None:
        return True
    origin = origin.strip().lower().rstrip("/")
    return origin == own_origin(request) or origin in allowed


def make_app(command: str, gate: Gate, *, font_size: int = 16,
             origins: tuple[str, ...] = ()) -> web.Application:
    """The aiohttp app: the gate (a middleware, before every handler), the page, the
    websocket that starts a panel per session, textual-serve's assets."""
    from importlib import resources
    from pathlib import Path

    import textual_serve
    from aiohttp import web
    from textual_serve.download_manager import DownloadManager

    page = (resources.files("fleet_tui.commands") / PAGE).read_text(encoding="utf-8")
    page = page.replace("__FONT_SIZE__", str(font_size))
    statics = Path(textual_serve.__file__).parent / "static"
    sessions: set[web.WebSocketResponse] = set()
    downloads = DownloadManager()

    @web.middleware
    async def gatekeeper(request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                         ) -> web.StreamResponse:
        if (request.path == "/ws" or request.method not in SAFE_METHODS) \
                and not origin_allowed(request, origins):
            return web.Response(status=403, text=FOREIGN,
                                headers={"Cache-Control": "no-store"})
        if gate.has_cookie(request):
            return await handler(request)
        if request.path == "/" and gate.has_token(request):
            response = await handler(request)
            response.set_cookie(gate.cookie_name, gate.cookie_value, httponly=True,
                                samesite="Strict", path="/", secure=_came_over_tls(request))
            return response
        return web.Response(status=401, text=REFUSED,
                            headers={"Cache-Control": "no-store"})

    async def index(request: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/html",
                            headers={"Cache-Control": "no-store",
                                     "X-Frame-Options": "DENY",
                                     "Referrer-Policy": "no-referrer"})

    async def session(request: web.Request) -> web.WebSocketResponse:
        websocket = web.WebSocketResponse(heartbeat=15)
        await websocket.prepare(request)
        sessions.add(websocket)
        try:
            await _relay(websocket, request, command, downloads)
        finally:
            sessions.discard(websocket)
        return websocket

    async def close_sessions(app: web.Application) -> None:
        from aiohttp import WSCloseCode

        for websocket in list(sessions):
            await websocket.close(code=WSCloseCode.GOING_AWAY, message=b"server stopped")

    app = web.Application(middlewares=[gatekeeper])
    app.add_routes([web.get("/", index), web.get("/ws", session),
                    web.static("/static", statics)])
    app.on_shutdown.append(close_sessions)
    return app


def _came_over_tls(request: web.Request) -> bool:
    """The page was reached over https: directly, or through a proxy that says so (only
    the cookie's Secure flag follows from it)."""
    return request.secure or request.headers.get("X-Forwarded-Proto", "") == "https"


# A key press in the page reaches the relay whole, one websocket message each (xterm.js's
# onData): an arrow is "\x1b[A" in one message, Alt+x "\x1bx". So a message that is a lone
# ESC is the Escape key, never the start of a sequence still on its way; sent as it is,
# Textual's parser would wait its ESCAPE_DELAY (100 ms) for the rest before reporting it.
# The kitty keyboard protocol's unambiguous form of Escape is reported at once.
LONE_ESCAPE = "\x1b"
ESCAPE_KEY = "\x1b[27u"


def page_keys(data: str) -> str:
    """What the panel is sent for one stdin message of the page."""
    return ESCAPE_KEY if data == LONE_ESCAPE else data


def _size(request: web.Request, name: str, default: int) -> int:
    try:
        return max(10, min(1000, int(request.query.get(name, default))))
    except ValueError:
        return default


async def _relay(websocket: web.WebSocketResponse, request: web.Request, command: str,
                 downloads: DownloadManager) -> None:
    """One browser session: its panel process (textual-serve's AppService), the page's
    keys and size to it, its screen back."""
    import json

    from aiohttp import WSMsgType
    from textual_serve.app_service import AppService

    async def close() -> None:  # the panel quit (q): the page says the session ended
        await websocket.close()

    service = AppService(command, write_bytes=websocket.send_bytes,
                         write_str=websocket.send_str, close=close,
                         download_manager=downloads)
    await service.start(_size(request, "width", 80), _size(request, "height", 24))
    try:
        async for message in websocket:
            if message.type != WSMsgType.TEXT:
                continue
            try:
                kind, *rest = json.loads(message.data)
            except (ValueError, TypeError):
                continue  # not the page's: ignored
            if kind == "stdin" and rest and isinstance(rest[0], str):
                await service.send_bytes(page_keys(rest[0]).encode("utf-8"))
            elif kind == "resize" and rest and isinstance(rest[0], dict):
                size = rest[0]
                await service.set_terminal_size(int(size.get("width", 80)),
                                                int(size.get("height", 24)))
            elif kind == "ping" and rest:
                await websocket.send_json(["pong", rest[0]])
            elif kind == "blur":
                await service.blur()
            elif kind == "focus":
                await service.focus()
    finally:
        await service.stop()


async def _serve(bind: str, port: int, public: bool, config: ServeSettings,
                 command: str) -> int:
    """Listen until SIGINT or SIGTERM; the link is printed once the port is bound."""
    import asyncio
    import secrets
    import signal
    import socket

    from aiohttp import web

    token = config.token or secrets.token_urlsafe(24)
    # bound first, then the app: the cookie's name holds the port (--port 0: any free one)
    host = bind.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    bound = sock.getsockname()[1]
    app = make_app(command, Gate(token, bound), origins=config.origins)
    # no access log: it would write each request's query, the link's token with it
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=3.0)
    await runner.setup()
    site = web.SockSite(runner, sock)
    await site.start()
    shown = f"[{host}]" if ":" in host else host
    if host in ("0.0.0.0", "::"):
        shown = socket.gethostname()
    print(f"fleet-tui serve: the panel is at http://{shown}:{bound}/?token={token}\n"
          "  Anyone with this link gets in: share it as you would a password. "
          "Each browser session is a panel of its own; Ctrl+C stops them all.", flush=True)
    if public:
        print("  Listening beyond this machine: put TLS in front (a reverse proxy or a "
              "tunnel service), or the token travels in the clear.", flush=True)
    else:
        print(f"  From another device: `ssh -L {bound}:127.0.0.1:{bound} THIS-HOST`, then "
              f"open the link there with localhost:{bound}.", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()  # each session's panel is told to quit; workers run on
    print("fleet-tui serve: stopped (workers keep running; `fleet-tui` picks them up)",
          flush=True)
    return 0
