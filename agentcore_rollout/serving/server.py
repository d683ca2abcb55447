"""`Server`, what the gateway, the policy server and the runtime emulator share: each runs in
an event loop it does not own (the engine's, a test's, a child's), so an aiohttp `AppRunner`, not
`web.run_app`; what it does around its requests (a reaper, closing its backend) hangs on its app
as aiohttp's `on_startup`, `on_shutdown` and `cleanup_ctx` hooks, which start and stop run."""

from __future__ import annotations

import ssl
from typing import Any, Self

from aiohttp import web


class Server:
    """An aiohttp app on `host:port`; `async with server: server.url`.

    Binds 127.0.0.1 by default; port 0 picks a free port (read `.port` / `.url` after start).
    With an `ssl_context` it serves HTTPS, and `url` says so.
    """

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, *, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        self.host, self.port = host, port
        self.ssl_context = ssl_context
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        """The aiohttp application: routes, middlewares, lifecycle hooks."""
        raise NotImplementedError

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 literal
        scheme = "https" if self.ssl_context is not None else "http"
        return f"{scheme}://{host}:{self.port}"

    @property
    def urls(self) -> tuple[str, ...]:
        """Every URL it listens at, `url` first: the line a child prints for its parent."""
        return (self.url,)

    def handler_options(self) -> dict[str, Any]:
        """Options of aiohttp's request handler (`keepalive_timeout`, ...): its defaults."""
        return {}

    async def start(self) -> None:
        """Run the app's startup hooks, then listen."""
        options = self.handler_options()
        self._runner = web.AppRunner(self.app(), access_log=None, **options)  # no request lines
        try:
            await self._runner.setup()
            site = web.TCPSite(self._runner, self.host, self.port, ssl_context=self.ssl_context)
            await site.start()
        except BaseException:
            await self.stop()  # a port in use must not leave the startup hooks' work running
            raise
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        """Stop listening, run the shutdown hooks, await the requests in flight, clean up."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    """A server's TLS from a PEM certificate (chain) file and its private key file; a file that
    cannot be read, or a key that does not fit the certificate, is a ValueError in one line."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)  # TLS 1.2+, safe ciphers
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"TLS certificate {cert!r} and key {key!r}: {exc}") from None
    return context
