"""Limits uvicorn does not have, held at the HTTP protocol before the app sees a byte.

uvicorn's httptools protocol hands every byte a client sends to the parser, and httptools keeps a
header's name and value until the header ends: one unauthenticated 48 MiB header is buffered
whole (twice: the parser's copy and the scope's), and a connection that never finishes its headers
is held forever (with the fd limit at 128, 150 such sockets starve ``/healthz``).
``LimitedProtocol`` subclasses that protocol and adds, per connection:

- **header bytes**: the request line and headers of one request may take ``--max-header-bytes``
  (default 64 KiB); the parser is fed at most that many bytes before the headers end, so what it
  holds is bounded, and the client gets ``431`` and a closed connection (each refusal's body is
  one JSON error that OpenAI and Anthropic clients both read). (A pipelined request that
  starts in the same read as the previous one's end may carry one read, <= 256 KiB, uncounted.)
- **header-read timeout**: from the first byte of a request (or the connection's start) its headers
  must arrive within ``--header-timeout`` seconds, else ``408`` (or a silent close if nothing came).
- **connections**: beyond ``--max-client-connections`` open connections, a new one is answered
  ``503`` at once and closed, before it can hold a file descriptor for long.

For CPU rather than limits, the request and its answer run through ``_Cycle``, uvicorn's
``RequestResponseCycle`` written lean (same bytes, errors and states for the same messages):
the scope built in one step, no ``asyncio.Event`` per request, the request body handed over
without copies, a response's header names checked in one byte deletion and its values in
another (uvicorn: two regular-expression searches per header), and the status line and headers
held until the body's first write, so an answer costs one ``send`` system call, not two; while
other requests are in flight, that ``send`` waits for the end of the loop iteration and leaves
with the other connections' (``coalesce.py``). The app may skip the ASGI message dicts:
``scope["extensions"]`` holds the cycle as an ``asgi.responder.ResponseWriter``
(``RESPONSE_EXTENSION``; a whole answer is one call, one write) and the disconnect callback
(``DISCONNECT_EXTENSION``).

Idle keep-alive connections close after ``--keep-alive-timeout`` (uvicorn's timer, armed once
per connection rather than once per request). Each refusal
is counted in ``repairproxy_connections_refused_total{reason}``. The limits are read from the app's
Settings (the protocol finds the app below uvicorn's wrappers), so ``--workers`` needs no extra
plumbing. Without httptools, uvicorn's h11 protocol runs with ``h11_max_incomplete_event_size`` set
to the same header cap (h11 answers such a request 400, not 431).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, cast
from urllib.parse import unquote

import httptools
import orjson
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT, service_unavailable
from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    HttpToolsProtocol,
)
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

from repairproxy.asgi.responder import DISCONNECT_EXTENSION, RESPONSE_EXTENSION
from repairproxy.coalesce import CoalescingTransport
from repairproxy.settings import Settings
from repairproxy.types import HeaderList

__all__ = ["LimitedProtocol", "RefusalCounter", "server_options"]


class RefusalCounter(Protocol):
    """What the protocol reports refusals to (``Metrics.connection_refused``)."""

    def connection_refused(self, reason: str) -> None: ...


def _refusal(status: bytes, kind: str, code: str, message: str) -> bytes:
    """A refusal written before any route is known, as a JSON error both API families read: the
    OpenAI shape (``error.message``, ``type``, ``code``) and Anthropic's (``"type": "error"``,
    ``error.type``, ``error.message``) in one body."""
    error = {"type": kind, "message": message, "code": code, "param": None}
    body = orjson.dumps({"type": "error", "error": error})
    return (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode("ascii") + b"\r\nconnection: close\r\n\r\n"
    ) + body


_TOO_LARGE = _refusal(
    b"431 Request Header Fields Too Large",
    "invalid_request_error",
    "request_header_fields_too_large",
    "request line and headers too large",
)
_TIMEOUT = _refusal(
    b"408 Request Timeout",
    "invalid_request_error",
    "request_timeout",
    "request headers not received in time",
)
_BUSY = _refusal(
    b"503 Service Unavailable",
    "overloaded_error",
    "too_many_connections",
    "too many open connections",
)


def _find_settings(app: Any) -> tuple[Settings, Any]:
    """The Settings (and the app holding them) below uvicorn's middleware wrappers."""
    for _ in range(8):
        settings = getattr(app, "settings", None)
        if isinstance(settings, Settings):
            return settings, app
        app = getattr(app, "app", None)
        if app is None:
            break
    return Settings(upstream="-"), None  # a foreign app: the defaults


class LimitedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol plus a header-byte cap, a header timeout, a connection cap."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings, self._owner = _find_settings(self.app)
        self._max_header_bytes = settings.max_header_bytes
        self._header_timeout = settings.header_timeout
        self._max_connections = settings.max_client_connections
        self._in_headers = True  # between one request's first byte and its headers' end
        self._header_bytes = 0
        self._header_timer: asyncio.TimerHandle | None = None
        self._idle_since: float | None = None  # loop time of the last answer while idle

    def _refused(self, reason: str, answer: bytes) -> None:
        metrics = getattr(self._owner, "metrics", None)
        if metrics is not None:
            metrics.connection_refused(reason)
        if not self.transport.is_closing():
            self.transport.write(answer)
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        busy = len(self.connections) >= self._max_connections
        # While other requests are in flight, writes leave at the end of the loop iteration, with
        # the other connections' (coalesce.py).
        coalescing = CoalescingTransport(transport, self.loop, in_flight=self.tasks)
        super().connection_made(cast(asyncio.Transport, coalescing))
        if busy:
            self._refused("max_connections", _BUSY)
            return
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        if self.timeout_keep_alive_task is not None:
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = None
        self.connections.discard(self)
        cycle = cast("_Cycle | None", self.cycle)
        if cycle is not None:
            if not cycle.response_complete:
                cycle.disconnected = True
            cycle.wake()
        if self.flow is not None:
            self.flow.resume_writing()
        if exc is None:
            self.transport.close()
        self.parser = None  # type: ignore[assignment]
        if cycle is not None and cycle.disconnected:
            cycle.disconnect_seen()
        # The protocol and its last cycle hold each other (so do the requests a pipeline still
        # queues): dropped here, a closed connection goes without the cycle collector.
        self.cycle = None  # type: ignore[assignment]
        self.pipeline.clear()

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self._header_timeout, self._header_timed_out)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timed_out(self) -> None:
        self._header_timer = None
        if not self._in_headers or self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            return  # an answer is being made: the keep-alive timer takes over after it
        if self._header_bytes:
            self._refused("header_timeout", _TIMEOUT)
        else:  # an idle connection that never sent a request: nothing to answer
            self._refused("header_timeout", b"")

    def data_received(self, data: bytes) -> None:
        if not self._in_headers or self.parser is None:
            super().data_received(data)
            return
        room = self._max_header_bytes - self._header_bytes
        if len(data) <= room:
            self._header_bytes += len(data)
            super().data_received(data)
            # A timer only for headers still incomplete after this read (most requests arrive
            # whole in one read: no timer to arm and cancel on the hot path).
            # (A read that completed a request resets the count: no request is then started,
            # and a timer would cut the answer still being made.)
            if self._in_headers and self._header_bytes and self._header_timer is None:
                self._arm_header_timer()
            return
        # Feed only what the cap allows; if the headers end within it, feed the rest as body.
        view = memoryview(data)
        self._header_bytes += room
        super().data_received(bytes(view[:room]))
        if self._in_headers:
            self._refused("header_bytes", _TOO_LARGE)
            return
        if self.parser is not None and not self.transport.is_closing():
            super().data_received(bytes(view[room:]))

    def on_message_begin(self) -> None:
        # uvicorn's also builds a scope (and copies the app state) that on_headers_complete
        # below replaces whole: only the per-request fields are reset here.
        self.url = b""
        self.expect_100_continue = False
        self.headers = []

    def on_headers_complete(self) -> None:
        self._in_headers = False
        if self._header_timer is not None:
            self._disarm_header_timer()
        parser = self.parser
        http_version = parser.get_http_version()
        url = self.url
        if url[:1] == b"/" and b"?" not in url and b"#" not in url:
            raw_path, query = url, b""  # what parse_url answers for a bare path, without it
        else:
            parsed = httptools.parse_url(url)
            raw_path, query = parsed.path, parsed.query or b""
        path = raw_path.decode("ascii")
        if "%" in path:
            path = unquote(path)
        root = self.root_path
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
            "http_version": http_version,
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "root_path": root,
            "headers": self.headers,
            "state": self.app_state.copy(),
            "method": parser.get_method().decode("ascii"),
            "path": root + path if root else path,
            "raw_path": root.encode("ascii") + raw_path if root else raw_path,
            "query_string": query,
        }
        self.scope = scope  # type: ignore[assignment]
        if parser.should_upgrade() and self._should_upgrade():
            return  # uvicorn's websocket hand-over follows (data_received)
        app = self.app
        if self.limit_concurrency is not None and (
            len(self.connections) >= self.limit_concurrency
            or len(self.tasks) >= self.limit_concurrency
        ):
            app = service_unavailable
            self.logger.warning("Exceeded concurrency limit.")
        existing = self.cycle
        cycle = _Cycle(
            self,
            scope,
            keep_alive=http_version != "1.0" and parser.should_keep_alive(),
            expect_100_continue=self.expect_100_continue,
        )
        scope["extensions"] = {
            DISCONNECT_EXTENSION: {"watch": cycle.watch_disconnect, "loop": self.loop},
            RESPONSE_EXTENSION: cycle,
        }
        self.cycle = cycle  # type: ignore[assignment]
        if existing is None or existing.response_complete:
            self._start_asgi_task(cycle, app)  # type: ignore[arg-type]
        else:  # a pipelined request waits for the answer before it
            self.flow.pause_reading()
            self.pipeline.appendleft((cycle, app))  # type: ignore[arg-type]

    def on_body(self, body: bytes) -> None:
        cycle = cast(_Cycle, self.cycle)
        if cycle.response_complete or (self.parser.should_upgrade() and self._should_upgrade()):
            return
        cycle.received.append(body)
        cycle.received_bytes += len(body)
        if cycle.received_bytes > HIGH_WATER_LIMIT:
            self.flow.pause_reading()
        cycle.wake()

    # The keep-alive timer, armed lazily: uvicorn cancels it on every read and arms a new one
    # after every answer (a timer made and cancelled per request). Here one timer stays armed
    # while the connection is used, and when it fires it closes the connection only if it has
    # been idle for the whole timeout since the last answer, else it re-arms for what is left.

    def _unset_keepalive_if_required(self) -> None:
        self._idle_since = None  # bytes came: busy until the next answer completes

    def on_response_complete(self) -> None:
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            self._idle_since = None
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self._idle_since = self.loop.time()
        if self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self._keep_alive_expired
            )

    def _keep_alive_expired(self) -> None:
        self.timeout_keep_alive_task = None
        idle_since = self._idle_since
        if idle_since is None:
            return  # a request is in progress: its answer arms the timer again
        left = idle_since + self.timeout_keep_alive - self.loop.time()
        if left > 0:
            self.timeout_keep_alive_task = self.loop.call_later(left, self._keep_alive_expired)
        else:
            self.timeout_keep_alive_handler()

    def on_message_complete(self) -> None:
        cycle = cast(_Cycle, self.cycle)
        if not cycle.response_complete and not (
            self.parser.should_upgrade() and self._should_upgrade()
        ):
            cycle.more_body = False
            cycle.wake()
        self._in_headers = True  # the next bytes on this connection start the next request
        self._header_bytes = 0


# uvicorn's checks of response header names and values (``HEADER_RE``, ``HEADER_VALUE_RE``) as
# byte deletions: what is left after deleting every byte the regular expression does not match is
# what it would have found. One table lookup a byte, where the regex's character-set loop took
# ~25 instructions a byte over the ~500 bytes of a verdict's header names (tests/proxy/
# test_server_cycle.py compares both on every byte value).
_HEADER_NAME_OK = bytes(b for b in range(256) if not HEADER_RE.match(bytes([b])))
_HEADER_VALUE_OK = bytes(b for b in range(256) if not HEADER_VALUE_RE.match(bytes([b])))


def bad_header_name(names: bytes) -> bool:
    """Whether ``names`` holds a byte ``HEADER_RE`` matches (a control or a separator)."""
    return bool(names.translate(None, _HEADER_NAME_OK))


def bad_header_value(values: bytes) -> bool:
    """Whether ``values`` holds a byte ``HEADER_VALUE_RE`` matches (a control but tab)."""
    return bool(values.translate(None, _HEADER_VALUE_OK))


# The response headers that decide the framing (uvicorn's send reads these three).
_FRAMING = frozenset({b"content-length", b"transfer-encoding", b"connection"})


def _content_length(value: bytes) -> int:
    return int(value.decode())


class _Cycle:
    """One request and its answer on a connection: uvicorn 0.54's ``RequestResponseCycle``
    rewritten lean, the same bytes, errors and connection states for the same ASGI messages
    (``tests/proxy/test_server_cycle.py`` compares both).

    What differs is cost. The request body is handed over without copies; ``receive`` waits on
    a future only when nothing has arrived (no ``asyncio.Event`` per request); a response's
    header names are checked in one byte deletion and its values in another (uvicorn: two
    regular-expression searches per header); and the status line and headers are held until the
    first body bytes, so an answer leaves in one ``send`` system call: a stream whose first
    chunk is not ready yet gets its head at the end of the loop iteration.

    Besides ``send``/``receive`` it offers two extensions in ``scope["extensions"]``:
    ``asgi.responder.DISCONNECT_EXTENSION`` (a callback when the client leaves before the
    answer is complete, so the app needs no task waiting in ``receive()``) and
    ``asgi.responder.RESPONSE_EXTENSION`` (the cycle itself, an ``asgi.responder.ResponseWriter``:
    the answer written without an ASGI message dict per write, and a whole answer in one
    call)."""

    __slots__ = (
        "_finished",
        "_held",
        "_loop",
        "_on_disconnect",
        "_protocol",
        "_waiter",
        "chunked_encoding",
        "disconnected",
        "expected_content_length",
        "flow",
        "keep_alive",
        "more_body",
        "ready",
        "received",
        "received_bytes",
        "response_complete",
        "response_started",
        "scope",
        "transport",
        "waiting_for_100_continue",
    )

    def __init__(
        self,
        protocol: HttpToolsProtocol,
        scope: dict[str, Any],
        *,
        keep_alive: bool,
        expect_100_continue: bool,
    ) -> None:
        self._protocol = protocol
        self.scope = scope
        self.transport = protocol.transport
        self.flow = protocol.flow
        self._loop = protocol.loop
        self.keep_alive = keep_alive
        self.waiting_for_100_continue = expect_100_continue
        self.disconnected = False
        self.response_started = False
        self.response_complete = False
        self.chunked_encoding: bool | None = None
        self.expected_content_length = 0
        self.received: list[bytes] = []  # request body chunks not yet handed to the app
        self.received_bytes = 0
        self.more_body = True
        self.ready = False  # something for receive() to return (uvicorn's message_event)
        self._waiter: asyncio.Future[None] | None = None
        self._held: bytes | None = None  # the response head, until the body's first write
        self._on_disconnect: Callable[[], None] | None = None
        self._finished = False

    # -- the app ----------------------------------------------------------------------------------

    async def run_asgi(self, app: Any) -> None:
        logger = self._protocol.logger
        try:
            result = await app(self.scope, self.receive, self.send)
        except BaseException as exc:
            logger.error("Exception in ASGI application\n", exc_info=exc)
            if not self.response_started:
                await self.send_500_response()
            else:
                self._close()
        else:
            if result is not None:
                logger.error("ASGI callable should return None, but returned '%s'.", result)
                self._close()
            elif not self.response_started and not self.disconnected:
                logger.error("ASGI callable returned without starting response.")
                await self.send_500_response()
            elif not self.response_complete and not self.disconnected:
                logger.error("ASGI callable returned without completing response.")
                self._close()
        finally:
            self._finished = True
            # The scope's extensions hold this cycle (and a method bound to it), and the cycle
            # holds the scope: a reference cycle per request that only the collector frees,
            # in pauses of milliseconds with 16 requests waiting. Broken here, the request's
            # objects go when the last reference does.
            extensions = self.scope.get("extensions")
            if extensions is not None:
                extensions.clear()

    async def send_500_response(self) -> None:
        await self.send(
            {
                "type": "http.response.start",
                "status": 500,
                "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", b"21"),
                    (b"connection", b"close"),
                ],
            }
        )
        await self.send(
            {"type": "http.response.body", "body": b"Internal Server Error", "more_body": False}
        )

    # -- ASGI -------------------------------------------------------------------------------------

    async def receive(self) -> dict[str, Any]:
        if self.waiting_for_100_continue and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.waiting_for_100_continue = False
        if not self.disconnected and not self.response_complete:
            self.flow.resume_reading()
            if not self.ready:
                waiter = self._waiter = self._loop.create_future()
                try:
                    await waiter
                finally:
                    self._waiter = None
            self.ready = False
        if self.disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        received = self.received
        body = received[0] if len(received) == 1 else b"".join(received)
        self.received = []
        self.received_bytes = 0
        return {"type": "http.request", "body": body, "more_body": self.more_body}

    async def send(self, message: Any) -> None:
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        kind = message["type"]
        if not self.response_started:
            if kind != "http.response.start":
                raise RuntimeError(
                    f"Expected ASGI message 'http.response.start', but got '{kind}'."
                )
            self._hold(self._head(message["status"], message.get("headers", [])))
        elif not self.response_complete:
            if kind != "http.response.body":
                raise RuntimeError(f"Expected ASGI message 'http.response.body', but got '{kind}'.")
            self._body(message.get("body", b""), message.get("more_body", False))
        else:
            raise RuntimeError(
                f"Unexpected ASGI message '{kind}' sent, after response already completed."
            )

    # -- RESPONSE_EXTENSION: the same writes without message dicts --------------------------------

    def blocked(self) -> Awaitable[None] | None:
        """What to await before writing (the client reads slower than we write), or None."""
        if self.flow.write_paused and not self.disconnected:
            return self.flow.drain()
        return None

    def start(self, status: int, headers: HeaderList) -> None:
        if self.disconnected:
            return
        if self.response_started:
            raise RuntimeError(
                "Expected ASGI message 'http.response.body', but got 'http.response.start'."
            )
        self._hold(self._head(status, headers))

    def body(self, chunk: bytes, more: bool) -> None:
        if self.disconnected:
            return
        if not self.response_started:
            raise RuntimeError(
                "Expected ASGI message 'http.response.start', but got 'http.response.body'."
            )
        if self.response_complete:
            raise RuntimeError(
                "Unexpected ASGI message 'http.response.body' sent, after response already "
                "completed."
            )
        self._body(chunk, more)

    def whole(self, status: int, headers: HeaderList, content: bytes) -> None:
        """``start`` then ``body(content, more=False)``: one write, nothing held."""
        if self.disconnected:
            return
        if self.response_started:
            raise RuntimeError(
                "Expected ASGI message 'http.response.body', but got 'http.response.start'."
            )
        self._held = self._head(status, headers)
        try:
            self._body(content, False)
        except RuntimeError:  # the head goes out as send's would (a body it refused: not)
            self._release()
            raise

    # -- DISCONNECT_EXTENSION ---------------------------------------------------------------------

    def watch_disconnect(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` once if the client goes away before the response is complete;
        returns the function that stops watching."""
        if self.disconnected:  # gone already: what receive() would answer at once
            callback()
            return _nothing
        # A task waiting in receive() resumes reading (a pipelined request may have paused it),
        # so the connection's end is seen: do the same.
        self.flow.resume_reading()
        self._on_disconnect = callback
        return self._stop_watching

    def _stop_watching(self) -> None:
        self._on_disconnect = None

    def disconnect_seen(self) -> None:
        callback, self._on_disconnect = self._on_disconnect, None
        if callback is not None:
            callback()

    # -- the protocol's side ----------------------------------------------------------------------

    def wake(self) -> None:
        """Something for ``receive`` came (body, its end, the answer's end, a disconnect)."""
        self.ready = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- writing ----------------------------------------------------------------------------------

    def _head(self, status_code: int, headers: Any) -> bytes:
        """The status line and headers (checked as uvicorn checks them); the framing decided."""
        self.response_started = True
        self.waiting_for_100_continue = False
        protocol = self._protocol
        default_headers = protocol.server_state.default_headers
        if default_headers or type(headers) is not list:  # read more than once below
            headers = default_headers + list(headers)
        if protocol.access_log:
            scope = self.scope
            protocol.access_logger.info(
                '%s - "%s %s HTTP/%s" %d',
                get_client_addr(scope),  # type: ignore[arg-type]
                scope["method"],
                get_path_with_query_string(scope),  # type: ignore[arg-type]
                scope["http_version"],
                status_code,
            )
        names = b"".join([name for name, _ in headers])
        if bad_header_name(names):
            raise RuntimeError("Invalid HTTP header name.")
        if bad_header_value(b"".join([value for _, value in headers])):
            raise RuntimeError("Invalid HTTP header value.")
        if not names.islower():  # uvicorn writes every name in lower case
            headers = [(name.lower(), value) for name, value in headers]
        content = [STATUS_LINE[status_code]]
        has_connection_close = False
        for name, value in [header for header in headers if header[0] in _FRAMING]:
            if name == b"content-length" and self.chunked_encoding is None:
                self.expected_content_length = _content_length(value)
                self.chunked_encoding = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.expected_content_length = 0
                self.chunked_encoding = True
            elif name == b"connection":
                connection = [token.lower().strip() for token in value.split(b",")]
                if b"close" in connection:
                    self.keep_alive = False
                    has_connection_close = True
        if headers:
            content.append(b"\r\n".join([b": ".join(header) for header in headers]))
            content.append(b"\r\n")
        if not self.keep_alive and not has_connection_close:
            content.append(b"connection: close\r\n")
        if (
            self.chunked_encoding is None
            and self.scope["method"] != "HEAD"
            and status_code not in (204, 304)
        ):
            self.chunked_encoding = True  # neither content-length nor transfer-encoding given
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        return b"".join(content)

    def _hold(self, head: bytes) -> None:
        self._held = head
        self._loop.call_soon(self._release)

    def _release(self) -> None:
        held, self._held = self._held, None
        if held and not self.transport.is_closing():
            self.transport.write(held)

    def _body(self, body: bytes, more_body: bool) -> None:
        if self.scope["method"] == "HEAD":
            self.expected_content_length = 0
            data = b""
        elif self.chunked_encoding:
            if body:
                data = b"%x\r\n%b\r\n0\r\n\r\n" if not more_body else b"%x\r\n%b\r\n"
                data = data % (len(body), body)
            else:
                data = b"" if more_body else b"0\r\n\r\n"
        else:
            num_bytes = len(body)
            if num_bytes > self.expected_content_length:
                raise RuntimeError("Response content longer than Content-Length")
            self.expected_content_length -= num_bytes
            data = body
        held = self._held
        if held is not None:
            self._held = None
            data = held + data
        if data:
            self.transport.write(data)
        if not more_body:
            if self.expected_content_length != 0:
                raise RuntimeError("Response content shorter than Content-Length")
            self.response_complete = True
            self.wake()
            if not self.keep_alive:
                self.transport.close()
            if not self._finished:
                self._protocol.on_response_complete()

    def _close(self) -> None:
        self._release()
        self.transport.close()


def _nothing() -> None:
    pass


def server_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's options for this proxy: uvloop + the limited httptools protocol when present."""
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "loop": _best("uvloop", "asyncio"),
        "lifespan": "on",
        "access_log": False,  # our own canonical log line replaces it
        "log_level": "warning",
        "server_header": False,  # the upstream's Server/Date headers pass through instead
        "date_header": False,
        "proxy_headers": False,  # no X-Forwarded-* rewriting middleware on the hot path
        "timeout_graceful_shutdown": settings.drain_timeout,
        "timeout_keep_alive": settings.keep_alive_timeout,
    }
    if _best("httptools", "h11") == "httptools":
        options["http"] = LimitedProtocol
    else:
        options["http"] = "h11"
        options["h11_max_incomplete_event_size"] = settings.max_header_bytes
        options["limit_concurrency"] = settings.max_client_connections
    return options


def _best(module: str, fallback: str) -> str:
    try:
        __import__(module)
    except ImportError:
        return fallback
    return module
