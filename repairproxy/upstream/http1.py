"""A small keep-alive HTTP/1.1 client pool on asyncio protocols and httptools (uvicorn's parser).

Why not httpx or aiohttp: one round trip to a local server costs this pool about 18 µs of CPU on
this 2-core machine, aiohttp's client about 95 µs and httpx's about 600 µs
(``python -m benchmarks.vs_peers --pool-only``). It does only what a proxy to one upstream
needs, and is held to ``tests/proxy/test_conformance.py``:

- one origin, pooled connections, a request sent in one write at the end of the loop iteration
  (with the other connections' requests: ``repairproxy.coalesce``), response bodies streamed
  (de-chunked, never decompressed), connect/read timeouts;
- framing headers (host, content-length, transfer-encoding, connection, expect, te, upgrade,
  keep-alive, trailer) are the pool's alone: any the caller passes are dropped, so a client's
  ``Expect: 100-continue`` never reaches the upstream from here;
- ``1xx`` interim responses are skipped (llhttp parses them as messages of their own; their
  completion is not ours), ``101`` makes the connection unusable (an error);
- a body delimited by the connection's close (no content-length, not chunked) is read to the close;
  a body cut before its content-length or its last chunk is an error, never a short answer;
- a connection goes back to the pool only after its response was read to the end, with nothing
  unexpected after it; a HEAD's connection is never reused (a stray body could be read as the
  next client's answer);
- an ``http://`` proxy: absolute-form targets for an http origin, a ``CONNECT`` tunnel for https;
- one retry when a reused idle connection turns out to be closed before any answer byte arrived;
- an answer is checked before it is believed: a status outside 100-599, a head over
  ``max_head_bytes`` (status line and headers, fed to the parser at most that many bytes) or
  trailers over the same cap fail the request and close the connection;
- a connection with any byte outside a framed answer is closed, never reused: bytes while idle
  (seen by the loop), bytes after the answer's end in the same read, and bytes waiting in the
  kernel's buffer when the connection is taken from the pool (``FIONREAD``: a late duplicate
  answer the loop has not read yet would otherwise become the next client's answer);
- a ``GET``/``HEAD`` request never carries a body (``InvalidTargetError``): an upstream that does
  not read one would take it for a second request, whose answer goes to the next client.

A request target is refused (``InvalidTargetError``) unless it is printable ASCII without spaces:
a request line is never built from text that could end it.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import fcntl
import ssl
import termios
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

import httptools

from repairproxy.coalesce import CoalescingTransport

__all__ = [
    "ConnectionPool",
    "InvalidTargetError",
    "Origin",
    "PoolTimeoutError",
    "Response",
    "basic_auth",
]

_PAUSE_AT = 1 << 20  # bytes buffered before we stop reading from the upstream socket
_DONE = b""  # sentinel in the body queue (real chunks are never empty)
# Headers that frame the message on this connection: written by the pool only.
_FRAMING = frozenset(
    {
        b"host",
        b"content-length",
        b"transfer-encoding",
        b"connection",
        b"expect",
        b"te",
        b"upgrade",
        b"keep-alive",
        b"trailer",
        b"proxy-connection",
    }
)
DEFAULT_MAX_HEAD_BYTES = 64 * 1024  # an answer's status line + headers (and its trailers)
_FOUR_ZEROS = bytes(4)  # FIONREAD's int, as the ioctl's in/out buffer
# Connection states: no request outstanding / a response being read / read to its end.
_IDLE, _READING, _DONE_STATE = 0, 1, 2


class PoolTimeoutError(TimeoutError):
    """Connect or read took longer than allowed."""


class InvalidTargetError(ValueError):
    """A request target holding bytes a request line cannot carry (controls, space, non-ASCII)."""


def _check_target(target: str) -> None:
    if not target.isascii() or not target.isprintable() or " " in target:
        raise InvalidTargetError(f"refusing to send a request target with unsafe bytes: {target!r}")


def basic_auth(userinfo: str) -> bytes:
    """``user:password`` (percent-encoded, as in a URL) → a ``Basic`` credentials value."""
    user, _, password = userinfo.partition(":")
    raw = f"{unquote(user)}:{unquote(password)}".encode()
    return b"Basic " + base64.b64encode(raw)


@dataclass(frozen=True, slots=True)
class Origin:
    """Where the pool connects, parsed once from the upstream URL."""

    scheme: str
    host: str
    port: int
    base_path: str  # prefix every request target starts with ("" or "/something")
    host_header: bytes

    @classmethod
    def parse(cls, url: str) -> Origin:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"upstream must be an http(s) URL, got {url!r}")
        default = 443 if parts.scheme == "https" else 80
        port = parts.port or default
        host = parts.hostname
        shown = f"[{host}]" if ":" in host else host
        header = shown if port == default else f"{shown}:{port}"
        base_path = parts.path.rstrip("/")
        if base_path:
            _check_target(base_path)
        return cls(parts.scheme, host, port, base_path, header.encode("idna"))

    @property
    def authority(self) -> str:
        """``host:port`` as a CONNECT request names it."""
        shown = f"[{self.host}]" if ":" in self.host else self.host
        return f"{shown}:{self.port}"


class _Connection(asyncio.Protocol):
    """One TCP connection; at most one response in flight."""

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool
        self._loop = pool.loop
        self.transport: CoalescingTransport | None = None
        self.closed = False
        self.reused = False
        self._state = _IDLE
        self._parser: httptools.HttpResponseParser | None = None
        self._headers: list[tuple[bytes, bytes]] = []
        self.trailers: list[tuple[bytes, bytes]] = []
        self._head: asyncio.Future[None] | None = None
        self._head_done = False
        self._interim = False
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self._got_bytes = False
        self._keep_alive = False
        self._until_close = False
        self._expect_body = True
        self.status_code = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0  # loop time the timer fires at
        self._deadline = 0.0  # of the wait in progress
        self._timeout = 0.0
        self._waiting: asyncio.Future[None] | None = None
        self._max_head = pool.max_head_bytes
        self._fd = -1  # the socket's descriptor, for dirty() (plain TCP only)
        self._head_fed = 0  # bytes fed to the parser since the request was sent, head not done
        self._trailer_bytes = 0

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # The request leaves at the end of the loop iteration, with the other connections'
        # (coalesce.py).
        self.transport = CoalescingTransport(transport, self._loop)  # type: ignore[arg-type]
        sock = transport.get_extra_info("socket")
        self._fd = sock.fileno() if sock is not None and self._pool._ssl is None else -1

    def data_received(self, data: bytes) -> None:
        if self._state != _READING or self._parser is None:
            # Bytes nobody asked for: whatever they are, they must never become an answer.
            self._fail(ConnectionError("unexpected data from the upstream"))
            return
        self._got_bytes = True
        try:
            if self._head_done:
                self._parser.feed_data(data)
                return
            # Until the head ends the parser is fed at most max_head_bytes (it keeps a header
            # whole until it ends); what follows a complete head is the body.
            room = self._max_head - self._head_fed
            if len(data) <= room:
                self._head_fed += len(data)
                self._parser.feed_data(data)
                return
            self._head_fed += room
            self._parser.feed_data(data[:room])
            if not self._head_done and self._state == _READING and self._error is None:
                self._fail(ConnectionError("the upstream's response head is too large"))
                return
            if self._state == _READING and self._error is None:
                self._parser.feed_data(data[room:])
        except httptools.HttpParserUpgrade:
            self._fail(ConnectionError("the upstream switched protocols; a proxy cannot relay it"))
        except httptools.HttpParserError as exc:
            self._fail(ConnectionError(f"malformed HTTP response from the upstream: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._timer is not None:  # a wait still in progress is failed below, not by the timer
            self._timer.cancel()
            self._timer = None
        if self._state != _READING:
            return
        if exc is None and self._head_done and self._until_close:
            self.on_message_complete()  # a body delimited by the close ends here (RFC 9112 6.3)
        else:
            self._fail(
                exc or ConnectionResetError("the upstream closed the connection mid-response")
            )

    # -- httptools callbacks -------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._head_done:  # a second response after ours: nobody asked for it
            self._fail(ConnectionError("unexpected data after the upstream's response"))
            return
        self._headers = []

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._head_done:
            self._trailer_bytes += len(name) + len(value) + 4
            if self._trailer_bytes > self._max_head:
                self._fail(ConnectionError("the upstream's trailers are too large"))
                return
            self.trailers.append((name.lower(), value))
        else:
            self._headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        assert self._parser is not None
        status = self._parser.get_status_code()
        if not 100 <= status <= 599:
            self._fail(ConnectionError(f"the upstream answered status {status}"))
            return
        if status < 200:
            if status == 101:
                self._fail(ConnectionError("the upstream answered 101 Switching Protocols"))
            else:
                self._interim = True  # 100 Continue, 103 Early Hints: the answer follows
            return
        self.status_code = status
        self._head_done = True
        self._keep_alive = self._parser.should_keep_alive()
        if self._expect_body and status not in (204, 304) and self._close_delimited():
            self._until_close = True
            self._keep_alive = False
        if self._head is not None and not self._head.done():
            self._head.set_result(None)
        if not self._expect_body:  # HEAD: httptools cannot know there is no body
            self._keep_alive = False
            self.on_message_complete()

    def _close_delimited(self) -> bool:
        coding: bytes | None = None
        length = False
        for name, value in self._headers:
            if name == b"content-length":
                length = True
            elif name == b"transfer-encoding":
                coding = value
        if coding is not None:
            return not coding.rstrip().lower().endswith(b"chunked")
        return not length

    def on_body(self, body: bytes) -> None:
        if not body or self._state != _READING:
            return
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > _PAUSE_AT and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        if self._state != _READING or not self._head_done:
            return
        self._state = _DONE_STATE
        self._chunks.append(_DONE)
        self._wake()

    # -- used by the pool and Response ---------------------------------------------------------

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
        self.closed = True
        if self._state == _READING:  # nothing of a failed answer is handed on
            self._chunks.clear()
            self._state = _IDLE
        if self._head is not None and not self._head.done():
            self._head.set_exception(exc)
            self._head.exception()  # retrieved: no "never retrieved" noise if nobody waits
        self._wake()
        if self.transport is not None:
            self.transport.drop_pending()
            self.transport.close()

    async def send(self, request: bytes, expect_body: bool, timeout: float) -> None:
        """Write ``request`` and wait until the (final) response head arrived."""
        assert self.transport is not None
        if self.closed or self.transport.is_closing():
            raise ConnectionResetError("the connection closed while idle")
        if self._parser is None:  # one parser per connection: llhttp reads message after message
            self._parser = httptools.HttpResponseParser(self)
        self._headers = []
        self.trailers = []
        self._chunks.clear()
        self._buffered = 0
        self._head_done = False
        self._interim = False
        self._until_close = False
        self._got_bytes = False
        self._error = None
        self._head_fed = 0
        self._trailer_bytes = 0
        self._expect_body = expect_body
        self._state = _READING
        self._head = self._loop.create_future()
        self.transport.write(request)
        await self._wait(self._head, timeout)

    def rearm(self, transport: asyncio.Transport) -> None:
        """After a CONNECT tunnel: speak on ``transport`` (TLS) as a fresh connection."""
        self.transport = CoalescingTransport(transport, self._loop)
        self._fd = -1
        self._state = _IDLE
        self._parser = None

    @property
    def answered(self) -> bool:
        """Whether any byte of a response came back (else a retry cannot duplicate work)."""
        return self._got_bytes

    async def next_chunk(self, timeout: float) -> bytes:
        while not self._chunks:
            if self._error is not None:
                raise self._error
            self._waiter = self._loop.create_future()
            await self._wait(self._waiter, timeout)
        chunks = self._chunks
        chunk = chunks.popleft()
        if chunks and chunk and chunks[0]:
            # Several chunks arrived in one read (an SSE answer sent whole): hand them over as
            # one, as a socket read would have given them, so the relay runs once, not per
            # chunk. Bounded: reading pauses once _PAUSE_AT bytes are buffered.
            parts = [chunk]
            while chunks and chunks[0]:
                parts.append(chunks.popleft())
            chunk = b"".join(parts)
        self._buffered -= len(chunk)
        if self._paused and self._buffered < _PAUSE_AT // 2 and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return chunk

    def dirty(self) -> bool:
        """Whether bytes wait unread in the kernel's buffer of this idle connection (or it cannot
        be asked): an answer nobody asked for, which must never reach the next client. One
        ``ioctl`` (~3 us on the 2-core dev VM, where a system call is dear)."""
        fd = self._fd
        if fd < 0:
            return False  # a TLS or tunnelled transport: its own buffer, read by the loop
        try:
            waiting = fcntl.ioctl(fd, termios.FIONREAD, _FOUR_ZEROS)
        except OSError:
            return True
        return waiting != _FOUR_ZEROS

    @property
    def reusable(self) -> bool:
        return (
            self._state == _DONE_STATE
            and self._keep_alive
            and not self.closed
            and self._error is None
        )

    def close(self) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.transport is not None:
            self.transport.drop_pending()  # a request not sent yet is never sent
            self.transport.close()

    # The read timeout: one timer per connection, not one made and cancelled per wait. Each wait
    # sets its deadline; the timer, when it fires, fails the wait in progress if that wait is
    # past its deadline, else re-arms for what is left (or lapses when nothing waits).

    async def _wait(self, future: asyncio.Future[None], timeout: float) -> None:
        deadline = self._loop.time() + timeout
        self._deadline = deadline
        self._timeout = timeout
        self._waiting = future
        if self._timer is None or deadline < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = deadline
            self._timer = self._loop.call_at(deadline, self._expire)
        try:
            await future
        finally:
            self._waiting = None

    def _expire(self) -> None:
        self._timer = None
        future = self._waiting
        if future is None or future.done():
            return
        if self._loop.time() < self._deadline:
            self._timer_at = self._deadline
            self._timer = self._loop.call_at(self._deadline, self._expire)
            return
        future.set_exception(PoolTimeoutError(f"no answer within {self._timeout:g} s"))


class Response:
    """A response whose head has arrived; read or iterate the body, then ``aclose``."""

    __slots__ = ("_conn", "_pool", "_released", "headers", "status_code")

    def __init__(self, pool: ConnectionPool, conn: _Connection) -> None:
        self._pool = pool
        self._conn = conn
        self._released = False
        self.status_code = conn.status_code
        self.headers: list[tuple[bytes, bytes]] = conn._headers

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    @property
    def trailers(self) -> list[tuple[bytes, bytes]]:
        """Trailer fields of a chunked body (complete once the body was read)."""
        return self._conn.trailers

    def iter_body(self) -> AsyncIterator[bytes]:
        """The body's chunks. Read to the end: the connection goes back to the pool. Stopped
        early (error, timeout, cancellation, ``aclose``): it is closed, so the pool never
        leaks a slot. (A plain iterator, not an async generator: one of those is registered
        with the loop's asyncgen hooks, a WeakSet, and finalised on every streamed request.)"""
        return _Body(self)

    async def read(self) -> bytes:
        # iter_body's loop without the async generator (made, registered with the loop's
        # asyncgen hooks and finalised on every buffered request otherwise).
        parts: list[bytes] = []
        try:
            while True:
                chunk = await self._conn.next_chunk(self._pool.read_timeout)
                if chunk is _DONE or not chunk:
                    break
                parts.append(chunk)
        finally:
            self.release()  # as iter_body: read to the end -> pooled; stopped early -> closed
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def release(self) -> None:
        """Give the connection back (kept alive only when the body was read to its end)."""
        if not self._released:
            self._released = True
            self._pool._release(self._conn)

    async def aclose(self) -> None:
        self.release()


class _Body:
    """``Response.iter_body``'s iterator."""

    __slots__ = ("_response",)

    def __init__(self, response: Response) -> None:
        self._response = response

    def __aiter__(self) -> _Body:
        return self

    async def __anext__(self) -> bytes:
        response = self._response
        try:
            chunk = await response._conn.next_chunk(response._pool.read_timeout)
        except BaseException:
            response.release()
            raise
        if chunk is _DONE or not chunk:
            response.release()
            raise StopAsyncIteration
        return chunk

    async def aclose(self) -> None:
        self._response.release()


class ConnectionPool:
    """Keep-alive connections to one origin, at most ``max_connections`` open at a time.

    ``proxy``: an ``http://[user:pass@]host:port`` forward proxy to go through (none by default;
    ``repairproxy.upstream.client`` decides from the environment).
    """

    def __init__(
        self,
        url: str,
        *,
        max_connections: int = 512,
        connect_timeout: float = 10.0,
        read_timeout: float = 600.0,
        proxy: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        max_head_bytes: int = DEFAULT_MAX_HEAD_BYTES,
    ) -> None:
        self.origin = Origin.parse(url)
        self.max_head_bytes = max_head_bytes
        self.max_connections = max_connections
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._ssl: ssl.SSLContext | None = None
        if self.origin.scheme == "https":
            self._ssl = ssl_context or ssl.create_default_context()
        self.proxy: Origin | None = None
        self._proxy_headers: list[tuple[bytes, bytes]] = []
        self._absolute_prefix = ""  # request targets in absolute form (http through a proxy)
        if proxy is not None:
            self._use_proxy(proxy)
        self._idle: list[_Connection] = []
        self._open = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.loop = asyncio.get_running_loop()

    def _use_proxy(self, url: str) -> None:
        parts = urlsplit(url if "://" in url else "http://" + url)
        if parts.scheme != "http":
            raise ValueError(f"only http:// proxies are supported, got {url!r}")
        self.proxy = Origin.parse(parts._replace(path="", query="", fragment="").geturl())
        if parts.username is not None:
            userinfo = parts.netloc.rpartition("@")[0]
            self._proxy_headers.append((b"proxy-authorization", basic_auth(userinfo)))
        if self.origin.scheme == "http":
            self._absolute_prefix = "http://" + self.origin.host_header.decode("ascii")

    def _head(
        self, method: str, target: str, headers: list[tuple[bytes, bytes]], length: int
    ) -> bytes:
        _check_target(target)
        if length and method in ("GET", "HEAD"):
            # An upstream that does not read a GET body takes it for the next request: its
            # answer would reach another client (the server refuses such requests too).
            raise InvalidTargetError(f"refusing to send a body with {method}")
        line = f"{method} {self._absolute_prefix}{self.origin.base_path}{target} HTTP/1.1\r\n"
        lines = [line.encode("ascii")]
        lines.append(b"host: " + self.origin.host_header + b"\r\n")
        for name, value in headers:
            if name not in _FRAMING:
                lines.append(name + b": " + value + b"\r\n")
        if self._absolute_prefix:
            for name, value in self._proxy_headers:
                lines.append(name + b": " + value + b"\r\n")
        if length or method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
            lines.append(b"content-length: %d\r\n" % length)
        lines.append(b"\r\n")
        return b"".join(lines)

    async def request(
        self,
        method: str,
        target: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes = b"",
        timeout: float | None = None,
    ) -> Response:
        """Send a request; returns once the response head arrived (the body streams after)."""
        wire = self._head(method, target, headers, len(body)) + body
        read_timeout = self.read_timeout if timeout is None else timeout
        for attempt in (0, 1):
            conn = await self._acquire()
            try:
                await conn.send(wire, method != "HEAD", read_timeout)
            except PoolTimeoutError:
                self._discard(conn)
                raise
            except (ConnectionError, OSError):
                stale = conn.reused and not conn.answered
                self._discard(conn)
                if stale and attempt == 0:
                    continue  # an idle connection the upstream had closed: one fresh try
                raise
            except BaseException:
                self._discard(conn)
                raise
            return Response(self, conn)
        raise AssertionError("unreachable")

    async def _acquire(self) -> _Connection:
        while True:
            while self._idle:
                conn = self._idle.pop()
                if not conn.closed and not conn.dirty():
                    conn.reused = True
                    return conn
                conn.close()
                self._open -= 1
            if self._open < self.max_connections:
                self._open += 1
                try:
                    return await self._connect()
                except BaseException:
                    self._open -= 1
                    self._wake_one()
                    raise
            waiter = self.loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # we were woken but will not use the slot: pass it on
                raise
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)

    async def _connect(self) -> _Connection:
        try:
            return await asyncio.wait_for(self._open_connection(), self.connect_timeout)
        except TimeoutError as exc:
            raise PoolTimeoutError(f"could not connect within {self.connect_timeout:g} s") from exc

    async def _open_connection(self) -> _Connection:
        origin = self.origin
        if self.proxy is None:
            _, conn = await self.loop.create_connection(
                lambda: _Connection(self),
                origin.host,
                origin.port,
                ssl=self._ssl,
                server_hostname=origin.host if self._ssl else None,
            )
            return conn
        _, conn = await self.loop.create_connection(
            lambda: _Connection(self), self.proxy.host, self.proxy.port
        )
        if self._ssl is None:
            return conn  # plain http: absolute-form targets on the proxy connection
        try:
            await self._tunnel(conn, self._ssl)
        except BaseException:
            conn.close()
            raise
        return conn

    async def _tunnel(self, conn: _Connection, context: ssl.SSLContext) -> None:
        authority = self.origin.authority.encode("ascii")
        lines = [b"CONNECT " + authority + b" HTTP/1.1\r\n", b"host: " + authority + b"\r\n"]
        lines.extend(name + b": " + value + b"\r\n" for name, value in self._proxy_headers)
        await conn.send(b"".join([*lines, b"\r\n"]), False, self.connect_timeout)
        if not 200 <= conn.status_code < 300:
            raise ConnectionRefusedError(f"the proxy refused the tunnel ({conn.status_code})")
        assert conn.transport is not None
        secure = await self.loop.start_tls(
            conn.transport.raw, conn, context, server_hostname=self.origin.host
        )
        if secure is None:
            raise ConnectionError("the proxy tunnel closed during the TLS handshake")
        conn.rearm(secure)

    def _release(self, conn: _Connection) -> None:
        if conn.reusable:
            self._idle.append(conn)
        else:
            conn.close()
            self._open -= 1
        self._wake_one()

    def _discard(self, conn: _Connection) -> None:
        conn.close()
        self._open -= 1
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def aclose(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()
