"""The console in a browser: :class:`ConsoleServer` serves ``specdeck ui PLAN`` through
textual-serve (each browser tab gets its own console process, as each terminal does), and
lets in only the requests that carry its token.

The token is checked by an aiohttp middleware put on textual-serve's own application: the
first page is opened as ``/?token=T``; that answer sets a cookie holding the token (HttpOnly,
SameSite=Lax, its name carries the port) and sends the browser on to ``/`` without it, so the
page's scripts, its websocket and a reload carry the cookie instead. A request with neither,
or a wrong one, is refused (403). A websocket opened from another site's page is refused too
(its ``Origin`` is not this server): a page on the web cannot drive the console.

The token lives in this process only: the console processes textual-serve starts get a
command line and an environment without it, the access log (which would print each request's
URL) is off, and every answer says ``Referrer-Policy: no-referrer``.

Loaded by ``specdeck serve`` only (:mod:`console.cli.ui`): it imports aiohttp and textual-serve.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
from urllib.parse import urlencode, urlsplit

from aiohttp import web
from rich.console import Console
from textual_serve.server import Server

TOKEN_PARAM = "token"
"""The query parameter of the first page's URL that carries the token."""


def new_token() -> str:
    """A fresh token: 32 random bytes, URL-safe."""
    return secrets.token_urlsafe(32)


class ConsoleServer(Server):
    """textual-serve's :class:`~textual_serve.server.Server` behind a token.

    Args:
        command: the shell command that opens the console (run once per browser tab); it
            must not hold the token.
        host: the address to bind.
        port: the port to bind.
        public_url: the URL the browser reaches this server at (the page's websocket and
            scripts are addressed to it).
        title: the page's title.
        token: the secret every request must carry.
    """

    def __init__(self, command: str, *, host: str, port: int, public_url: str, title: str,
                 token: str) -> None:
        super().__init__(command, host=host, port=port, title=title, public_url=public_url)
        self.token = token
        self.cookie = f"specdeck_serve_{port}"
        """Cookies are not kept apart by port: two servers on one machine need two names."""
        self.console = Console(stderr=True)  # its log on stderr; stdout holds the URL only
        self._tabs: set[asyncio.Task] = set()
        """The requests serving an open tab's websocket (each drives one console)."""

    @property
    def url(self) -> str:
        """The URL to open: the first page with the token."""
        return f"{self.public_url}/?{urlencode({TOKEN_PARAM: self.token})}"

    def initialize_logging(self) -> None:
        super().initialize_logging()
        # aiohttp's access log prints each request's URL: the first one holds the token
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)

    async def _make_app(self) -> web.Application:
        app = await super()._make_app()
        app.middlewares.append(self.guard)
        return app

    async def on_startup(self, app: web.Application) -> None:
        """No banner: ``specdeck serve`` printed the URL before the server started."""

    async def on_shutdown(self, app: web.Application) -> None:
        """Stopping: end each open tab's session now, so its console quits (runs keep
        going on their hosts) instead of the server waiting for the tab to close."""
        for task in list(self._tabs):
            task.cancel()  # textual-serve's handler then closes the socket, stops the console

    def _matches(self, value: str | None) -> bool:
        return value is not None and hmac.compare_digest(value.encode(), self.token.encode())

    @web.middleware
    async def guard(self, request: web.Request, handler) -> web.StreamResponse:
        """Refuse (403) a request without the token or the cookie, and a websocket opened
        by another site's page; the first page's token becomes the cookie."""
        given = request.query.get(TOKEN_PARAM)
        if not (self._matches(given) or self._matches(request.cookies.get(self.cookie))):
            raise web.HTTPForbidden(text="specdeck serve: this URL needs the token that "
                                         "`specdeck serve` printed when it started\n")
        origin = request.headers.get("Origin")
        if request.path == "/ws" and origin is not None and \
                urlsplit(origin).netloc not in (request.host, urlsplit(self.public_url).netloc):
            raise web.HTTPForbidden(text="specdeck serve: a websocket from another site\n")
        if given is not None:  # the first page: the token moves into the cookie
            rest = [(k, v) for k, v in request.query.items() if k != TOKEN_PARAM]
            moved = web.HTTPSeeOther(request.path + (f"?{urlencode(rest)}" if rest else ""))
            moved.set_cookie(self.cookie, self.token, httponly=True, samesite="Lax", path="/")
            moved.headers["Referrer-Policy"] = "no-referrer"
            raise moved
        if request.path == "/ws":
            task = asyncio.current_task()
            self._tabs.add(task)
            try:
                return await handler(request)
            finally:
                self._tabs.discard(task)
        response = await handler(request)
        if not response.prepared:  # a websocket or a download is under way: headers are sent
            response.headers["Referrer-Policy"] = "no-referrer"
        return response
