"""The only code that talks to the upstream: a transport behind a small protocol; header hygiene.

Transport failures become ``errors.UpstreamUnavailableError`` (502) or ``UpstreamTimeoutError``
(504); upstream 4xx/5xx *responses* are data, returned to the caller to pass through as they are.

Where requests go. The upstream base URL is what the OpenAI SDK takes as ``base_url``: a route's
``/v1/X`` goes to ``<base path>/X``. A bare origin (no path) means its ``/v1``. So
``http://h:8000`` and ``http://h:8000/v1`` both send ``/v1/chat/completions``, and
``http://h/v1beta/openai/`` sends ``/v1beta/openai/chat/completions``. The base URL's query is put
before the request's own; its userinfo becomes ``Authorization: Basic`` (``--upstream-api-key``,
a Bearer key, takes precedence).

Proxies: ``HTTP_PROXY`` / ``HTTPS_PROXY`` / ``NO_PROXY`` (either case; lower case wins, as curl and
urllib read them) choose an ``http://`` forward proxy for the upstream; loopback upstreams never go
through one (as Go's net/http decides). ``Upstream(..., trust_env=False)`` ignores the environment.

The seam: ``Upstream(base_url, transport=...)`` takes any ``Transport`` (what it needs from the
pool: send a request, get status, headers, a body iterator, close). Tests script one
(``tests/support/mock_transport.py``); production uses ``http1.ConnectionPool``. A transport raises
``TimeoutError`` for timeouts and ``OSError`` (``ConnectionError``) for everything else that broke.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, cast
from urllib.parse import urlsplit

import orjson

from repairproxy.credentials import DROPPED_HEADERS
from repairproxy.errors import (
    BadRequestError,
    UpstreamBadAnswerError,
    UpstreamStatusError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from repairproxy.types import HeaderList
from repairproxy.upstream.http1 import ConnectionPool, InvalidTargetError, basic_auth
from repairproxy.wire.openai import ChatCompletion

__all__ = [
    "Transport",
    "TransportResponse",
    "Upstream",
    "UpstreamReply",
    "UpstreamStatusError",
    "UpstreamTimer",
    "UpstreamURL",
    "chat_completion_of",
    "proxy_from_environment",
    "response_headers",
    "timed",
]


# Hop-by-hop headers (RFC 9110 7.6.1), ``expect`` (its 100-continue is between the client and
# us), plus those the transport recomputes. Headers a ``connection`` header names are dropped too.
_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"expect",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
    }
)
# Headers that describe the body's bytes: wrong once the proxy rewrote the body.
_BODY_DESCRIBING = frozenset({b"content-encoding", b"content-md5", b"digest", b"etag"})
_PROXY_PREFIX = b"proxy-"  # proxy-authorization, proxy-connection, ...: for the client's proxy
# Our own control headers are consumed by the proxy, never forwarded.
_OWN_PREFIX = b"x-repairproxy-"
_CONNECT_TIMEOUT = 10.0  # seconds, at most (the upstream timeout when it is shorter)
_READY_TIMEOUT = 5.0


class TransportResponse(Protocol):
    """A response whose head has arrived; the body is read once, then ``aclose``."""

    status_code: int
    headers: HeaderList

    def header(self, name: bytes) -> bytes | None: ...

    def iter_body(self) -> AsyncIterator[bytes]: ...

    async def read(self) -> bytes: ...

    async def aclose(self) -> None: ...


class Transport(Protocol):
    """What ``Upstream`` needs from a connection pool; ``target`` is origin-form, query included."""

    async def request(
        self,
        method: str,
        target: str,
        headers: HeaderList,
        body: bytes = b"",
        timeout: float | None = None,
    ) -> TransportResponse: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True, slots=True)
class UpstreamURL:
    """The upstream base URL, split once: where to connect and how route paths map onto it."""

    origin: str  # scheme://host[:port]
    base_path: str  # "/v1", "/v1beta/openai", ... (never empty, no trailing slash)
    query: str  # the base URL's own query, without "?"
    credentials: bytes | None  # "Basic ..." from the userinfo

    @classmethod
    def parse(cls, url: str) -> UpstreamURL:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"upstream must be an http(s) URL, got {url!r}")
        userinfo, _, hostport = parts.netloc.rpartition("@")
        return cls(
            origin=f"{parts.scheme}://{hostport}",
            base_path=parts.path.rstrip("/") or "/v1",
            query=parts.query,
            credentials=basic_auth(userinfo) if userinfo else None,
        )

    def target(self, path: str, query: bytes = b"") -> str:
        """``/v1/X`` → ``<base path>/X``, with the base query and then the request's."""
        if path == "/v1" or path.startswith("/v1/"):
            path = self.base_path + path[3:]
        if not query and not self.query:
            return path
        queries = [q for q in (self.query, query.decode("latin-1")) if q]
        return path + "?" + "&".join(queries) if queries else path


def _is_loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def proxy_from_environment(url: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The forward proxy ``url`` should go through, per HTTP(S)_PROXY and NO_PROXY, or None."""
    env = os.environ if environ is None else environ
    parts = urlsplit(url)
    host = parts.hostname or ""
    if _is_loopback(host):
        return None

    def read(name: str) -> str:
        return env.get(name.lower()) or env.get(name.upper()) or ""

    proxy = read(f"{parts.scheme}_proxy").strip()
    if not proxy:
        return None
    netloc = parts.netloc.rpartition("@")[2].lower()
    for entry in read("no_proxy").split(","):
        if _bypasses(entry.strip().lower().lstrip("."), host.lower(), netloc):
            return None
    return proxy


def _bypasses(entry: str, host: str, netloc: str) -> bool:
    """One NO_PROXY entry: ``*``, a host or domain suffix (port optional), or an IP network."""
    if not entry:
        return False
    if entry == "*" or entry == netloc:
        return True
    if host == entry or host.endswith("." + entry):
        return True
    try:
        return ipaddress.ip_address(host) in ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return False


@dataclass(slots=True)  # per request; frozen=True would cost an object.__setattr__ a field
class UpstreamReply:
    """A buffered upstream answer (body as it came: content-encoding kept if it was asked for)."""

    status_code: int
    headers: HeaderList
    content: bytes


@dataclass(slots=True)
class UpstreamTimer:
    """Seconds spent waiting on the upstream within one request (so overhead = total - this)."""

    seconds: float = 0.0
    calls: int = field(default=0)

    def timing(self) -> _UpstreamCall:
        """Count one upstream call and the time spent in the block."""
        return _UpstreamCall(self, translate=False)


# How long a relay may hold the event loop with chunks that were already buffered.
RELAY_SLICE_SECONDS = 0.0005
# A wait for the next chunk at least this long was a real one: the loop ran other work meanwhile.
_WAITED_SECONDS = 0.00005


def timed(chunks: AsyncIterator[bytes], timer: UpstreamTimer) -> AsyncIterator[bytes]:
    """Re-yield ``chunks``, adding the time spent waiting for each one to ``timer``.

    It lets the event loop run once the relay has held it for ``RELAY_SLICE_SECONDS``: chunks
    already buffered arrive without a pause, so a long stream relayed in one go would otherwise
    hold every other request back until its end. (Not after every chunk: a long answer whose
    chunks are already buffered would pay a turn of the loop per chunk; a chunk that had to be
    waited for let the loop run already. The pool hands chunks that arrived in one read over
    as one piece.) A plain iterator, not an async generator (those
    are registered with the loop's asyncgen hooks and finalised on every streamed request).
    """
    return _Timed(chunks, timer)


class _Timed:
    __slots__ = ("_held_since", "_iterator", "_timer", "_yielded")

    def __init__(self, chunks: AsyncIterator[bytes], timer: UpstreamTimer) -> None:
        self._iterator = chunks.__aiter__()
        self._timer = timer
        self._held_since = time.perf_counter()
        self._yielded = False

    def __aiter__(self) -> _Timed:
        return self

    async def __anext__(self) -> bytes:
        if self._yielded and time.perf_counter() - self._held_since >= RELAY_SLICE_SECONDS:
            await asyncio.sleep(0)
            self._held_since = time.perf_counter()
        started = time.perf_counter()
        try:
            chunk = await self._iterator.__anext__()
        finally:
            now = time.perf_counter()
            self._timer.seconds += now - started
        if now - started >= _WAITED_SECONDS:
            self._held_since = now
        self._yielded = True
        return chunk

    async def aclose(self) -> None:
        close = getattr(self._iterator, "aclose", None)
        if close is not None:
            await close()


def chat_completion_of(content: bytes, status: int) -> ChatCompletion:
    """A 2xx body that must be a chat completion; anything else is the upstream's fault (502)."""
    try:
        completion = orjson.loads(content)
    except orjson.JSONDecodeError:
        completion = None
    if not isinstance(completion, dict) or not isinstance(completion.get("choices"), list):
        raise UpstreamBadAnswerError(
            f"the upstream answered {status} with a body that is not a chat completion"
        )
    return cast(ChatCompletion, completion)


def response_headers(
    raw: Iterable[tuple[bytes, bytes]], *, head: bool = False, rewritten: bool = False
) -> HeaderList:
    """Upstream response headers fit to send on (bodies are relayed as they came, encoding kept).

    An upstream's own ``x-repairproxy-*`` headers (a chained proxy) are dropped: ours replace them.
    ``head``: the answer to a HEAD, whose Content-Length describes a body that is not sent.
    ``rewritten``: the proxy sends a body of its own making, which the upstream's
    ``content-encoding`` (and digests of its bytes) would misdescribe: they are dropped.
    """
    return [
        (name, value)
        for name, value in raw
        if (name not in _HOP_BY_HOP or (head and name == b"content-length"))
        and not name.startswith(_OWN_PREFIX)
        and not (rewritten and name in _BODY_DESCRIBING)
    ]


def _connection_named(headers: Iterable[tuple[bytes, bytes]]) -> frozenset[bytes]:
    names: set[bytes] = set()
    for name, value in headers:
        if name == b"connection":
            names.update(token.strip().lower() for token in value.split(b","))
    return frozenset(names)


def _translated(exc: BaseException) -> Exception | None:
    """Our error for a transport failure (None: not one to translate)."""
    if isinstance(exc, TimeoutError):  # before OSError: TimeoutError is one
        return UpstreamTimeoutError(f"the upstream did not answer in time ({exc})")
    if isinstance(exc, OSError):  # ConnectionError included
        return UpstreamUnavailableError(
            f"the upstream could not be reached ({type(exc).__name__}: {exc})"
        )
    if isinstance(exc, InvalidTargetError):
        return BadRequestError(str(exc))
    return None


class _UpstreamCall:
    """One upstream call's block: its time added to the request's timer (when there is one),
    transport failures raised as our errors. A plain class, not two ``@contextmanager``
    generators: it is entered on every request."""

    __slots__ = ("_started", "_timer", "_translate")

    def __init__(self, timer: UpstreamTimer | None, *, translate: bool = True) -> None:
        self._timer = timer
        self._translate = translate
        self._started = 0.0

    def __enter__(self) -> None:
        if self._timer is not None:
            self._started = time.perf_counter()

    def __exit__(self, kind: object, exc: BaseException | None, traceback: object) -> None:
        timer = self._timer
        if timer is not None:
            timer.seconds += time.perf_counter() - self._started
            timer.calls += 1
        if exc is not None and self._translate:
            translated = _translated(exc)
            if translated is not None:
                raise translated from exc


class _Streamed:
    """``Upstream.stream``'s block as a plain class (entered on every streamed request; an
    ``@asynccontextmanager`` makes a generator and a wrapper each time)."""

    __slots__ = ("_content", "_headers", "_request", "_response", "_timer", "_transport", "_url")

    def __init__(
        self,
        transport: Transport,
        url: UpstreamURL,
        request: tuple[str, str, bytes],
        headers: HeaderList,
        content: bytes,
        timer: UpstreamTimer,
    ) -> None:
        self._transport = transport
        self._url = url
        self._request = request
        self._headers = headers
        self._content = content
        self._timer = timer
        self._response: TransportResponse | None = None

    async def __aenter__(self) -> TransportResponse:
        method, path, query = self._request
        with _UpstreamCall(self._timer):
            self._response = await self._transport.request(
                method, self._url.target(path, query), self._headers, self._content
            )
        return self._response

    async def __aexit__(self, kind: object, exc: BaseException | None, traceback: object) -> None:
        if self._response is not None:
            await self._response.aclose()


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
        transport: Transport | None = None,
        trust_env: bool = True,
    ) -> None:
        self.url = UpstreamURL.parse(base_url)
        credentials = b"Bearer " + api_key.encode() if api_key else self.url.credentials
        self._auth = (b"authorization", credentials) if credentials else None
        self._drop_client_auth = drop_client_auth or self._auth is not None
        self._transport: Transport = transport or ConnectionPool(
            self.url.origin,
            max_connections=max_connections,
            connect_timeout=min(timeout, _CONNECT_TIMEOUT),
            read_timeout=timeout,
            proxy=proxy_from_environment(self.url.origin) if trust_env else None,
        )

    async def aclose(self) -> None:
        await self._transport.aclose()

    def outbound_headers(
        self, client_headers: Iterable[tuple[bytes, bytes]], *, keep_encoding: bool
    ) -> HeaderList:
        """Client headers minus hop-by-hop and our own; Authorization replaced or dropped.

        Without ``keep_encoding`` the proxy asks for an uncompressed body: it must read it.
        """
        headers = client_headers if isinstance(client_headers, list) else list(client_headers)
        named = _connection_named(headers)
        out: HeaderList = []
        for name, value in headers:
            if (
                name in _HOP_BY_HOP
                or name.startswith(_OWN_PREFIX)
                or name.startswith(_PROXY_PREFIX)
                or name in named
            ):
                continue
            if name in DROPPED_HEADERS and self._drop_client_auth:
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
        with _UpstreamCall(timer):
            target = self.url.target(path, query)
            response = await self._transport.request(method, target, headers, content)
            body = await response.read()
        return UpstreamReply(response.status_code, response.headers, body)

    async def complete(
        self, body: dict[str, Any], headers: HeaderList, timer: UpstreamTimer
    ) -> dict[str, Any]:
        """A non-streaming completion for the repair loop.

        Non-2xx raises ``UpstreamStatusError`` (passed through); a 2xx that is not a JSON object
        is the upstream's fault: ``UpstreamBadAnswerError`` (502) naming it.
        """
        reply = await self.request(
            "POST", "/v1/chat/completions", headers, orjson.dumps(body), timer
        )
        if not 200 <= reply.status_code < 300:
            raise UpstreamStatusError(reply)
        try:
            parsed = orjson.loads(reply.content)
        except orjson.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, dict):
            raise UpstreamBadAnswerError(
                f"the upstream answered {reply.status_code} with a body that is not a JSON "
                f"object ({len(reply.content)} bytes)"
            )
        return parsed

    def stream(
        self,
        method: str,
        path: str,
        headers: HeaderList,
        content: bytes,
        timer: UpstreamTimer,
        query: bytes = b"",
    ) -> AbstractAsyncContextManager[TransportResponse]:
        """Open a streamed request; leaving the block early (or cancellation) drops the connection,
        which is how the upstream learns to stop generating."""
        return _Streamed(self._transport, self.url, (method, path, query), headers, content, timer)

    @staticmethod
    def reading() -> AbstractContextManager[None]:
        """Wrap reads of a streamed body so mid-stream failures map to our errors too."""
        return _UpstreamCall(None)

    async def ready(self) -> bool:
        """Whether ``GET /v1/models`` answers 2xx within a few seconds."""
        headers = [self._auth] if self._auth is not None else []
        target = self.url.target("/v1/models")
        try:
            response = await self._transport.request("GET", target, headers, timeout=_READY_TIMEOUT)
            await response.read()
        except (ConnectionError, OSError):
            return False
        return 200 <= response.status_code < 300
