"""The only code that talks to the upstream: one keep-alive connection pool, and header hygiene.

Transport failures become ``errors.UpstreamUnavailableError`` (502) or ``UpstreamTimeoutError``
(504); upstream 4xx/5xx *responses* are data, returned to the caller to pass through as they are.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson

from repairproxy.errors import UpstreamTimeoutError, UpstreamUnavailableError
from repairproxy.http1 import ConnectionPool, PoolTimeoutError, Response

__all__ = [
    "HeaderList",
    "Upstream",
    "UpstreamReply",
    "UpstreamStatusError",
    "UpstreamTimer",
    "response_headers",
    "timed",
    "upstream_root",
]

HeaderList = list[tuple[bytes, bytes]]

# Hop-by-hop headers (RFC 9110 7.6.1) plus those the transport recomputes.
_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
    }
)
# Our own control headers are consumed by the proxy, never forwarded.
_OWN_PREFIX = b"x-repairproxy-"


def upstream_root(url: str) -> str:
    """``http://h:8000/v1`` and ``http://h:8000`` → ``http://h:8000``; paths keep ``/v1``."""
    root = url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


@dataclass(frozen=True, slots=True)
class UpstreamReply:
    """A buffered upstream answer (body already decoded from any content-encoding)."""

    status_code: int
    headers: HeaderList
    content: bytes


class UpstreamStatusError(Exception):
    """A repair re-ask got a non-2xx answer; the route passes ``reply`` through to the client."""

    def __init__(self, reply: UpstreamReply) -> None:
        super().__init__(f"upstream answered {reply.status_code}")
        self.reply = reply


@dataclass(slots=True)
class UpstreamTimer:
    """Seconds spent waiting on the upstream within one request (so overhead = total - this)."""

    seconds: float = 0.0
    calls: int = field(default=0)


async def timed(chunks: AsyncIterator[bytes], timer: UpstreamTimer) -> AsyncIterator[bytes]:
    """Re-yield ``chunks``, adding the time spent waiting for each one to ``timer``."""
    iterator = chunks.__aiter__()
    while True:
        started = time.perf_counter()
        try:
            chunk = await iterator.__anext__()
        except StopAsyncIteration:
            return
        finally:
            timer.seconds += time.perf_counter() - started
        yield chunk


def response_headers(raw: Iterable[tuple[bytes, bytes]]) -> HeaderList:
    """Upstream response headers fit to send on (bodies are relayed as they came, encoding kept).

    An upstream's own ``x-repairproxy-*`` headers (a chained proxy) are dropped: ours replace them.
    """
    return [
        (name, value)
        for name, value in raw
        if name not in _HOP_BY_HOP and not name.startswith(_OWN_PREFIX)
    ]


@contextmanager
def _translate_errors() -> Iterator[None]:
    try:
        yield
    except PoolTimeoutError as exc:  # before OSError: TimeoutError is one
        raise UpstreamTimeoutError(f"the upstream did not answer in time ({exc})") from exc
    except (ConnectionError, OSError) as exc:
        raise UpstreamUnavailableError(
            f"the upstream could not be reached ({type(exc).__name__}: {exc})"
        ) from exc


class Upstream:
    """A pooled client for one upstream base URL; create and close it inside the app lifespan."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        drop_client_auth: bool = False,
        timeout: float = 600.0,
        max_connections: int = 512,
    ) -> None:
        self.root = upstream_root(base_url)
        self._auth = (b"authorization", b"Bearer " + api_key.encode()) if api_key else None
        self._drop_client_auth = drop_client_auth or api_key is not None
        self._pool = ConnectionPool(
            self.root,
            max_connections=max_connections,
            connect_timeout=min(timeout, 10.0),
            read_timeout=timeout,
        )

    async def aclose(self) -> None:
        await self._pool.aclose()

    def outbound_headers(
        self, client_headers: Iterable[tuple[bytes, bytes]], *, keep_encoding: bool
    ) -> HeaderList:
        """Client headers minus hop-by-hop and our own; Authorization replaced or dropped.

        Without ``keep_encoding`` the proxy asks for an uncompressed body: it must read it.
        """
        out: HeaderList = []
        for name, value in client_headers:
            if name in _HOP_BY_HOP or name.startswith(_OWN_PREFIX):
                continue
            if name == b"authorization" and self._drop_client_auth:
                continue
            if name == b"accept-encoding" and not keep_encoding:
                continue
            out.append((name, value))
        if not keep_encoding:
            out.append((b"accept-encoding", b"identity"))
        if self._auth is not None:
            out.append(self._auth)
        return out

    async def request(
        self,
        method: str,
        path: str,
        headers: HeaderList,
        content: bytes,
        timer: UpstreamTimer,
        query: bytes = b"",
    ) -> UpstreamReply:
        """Send one request and buffer the whole answer."""
        target = path + ("?" + query.decode("latin-1") if query else "")
        started = time.perf_counter()
        try:
            with _translate_errors():
                response = await self._pool.request(method, target, headers, content)
                body = await response.read()
        finally:
            timer.seconds += time.perf_counter() - started
            timer.calls += 1
        return UpstreamReply(response.status_code, response.headers, body)

    async def complete(
        self, body: dict[str, Any], headers: HeaderList, timer: UpstreamTimer
    ) -> dict[str, Any]:
        """A non-streaming completion for the repair loop; non-2xx raises UpstreamStatusError."""
        reply = await self.request(
            "POST", "/v1/chat/completions", headers, orjson.dumps(body), timer
        )
        if not 200 <= reply.status_code < 300:
            raise UpstreamStatusError(reply)
        try:
            parsed = orjson.loads(reply.content)
        except orjson.JSONDecodeError:
            raise UpstreamStatusError(reply) from None
        if not isinstance(parsed, dict):
            raise UpstreamStatusError(reply)
        return parsed

    @asynccontextmanager
    async def stream(
        self,
        method: str,
        path: str,
        headers: HeaderList,
        content: bytes,
        timer: UpstreamTimer,
        query: bytes = b"",
    ) -> AsyncIterator[Response]:
        """Open a streamed request; leaving the block early (or cancellation) drops the connection,
        which is how the upstream learns to stop generating."""
        target = path + ("?" + query.decode("latin-1") if query else "")
        started = time.perf_counter()
        try:
            with _translate_errors():
                response = await self._pool.request(method, target, headers, content)
        finally:
            timer.seconds += time.perf_counter() - started
            timer.calls += 1
        try:
            yield response
        finally:
            await response.aclose()

    @staticmethod
    @contextmanager
    def reading() -> Iterator[None]:
        """Wrap reads of a streamed body so mid-stream failures map to our errors too."""
        with _translate_errors():
            yield

    async def ready(self) -> bool:
        """Whether ``GET /v1/models`` answers 2xx within a few seconds."""
        headers = [self._auth] if self._auth is not None else []
        try:
            response = await self._pool.request("GET", "/v1/models", headers, timeout=5.0)
            await response.read()
        except (ConnectionError, OSError):
            return False
        return 200 <= response.status_code < 300
