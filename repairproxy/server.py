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

Two more things, for CPU rather than limits. uvicorn writes a response's status line and headers
and then its body as two socket writes; ``_CoalescedWrites`` holds the first write until the next
one (the body, in the same loop iteration for a JSON answer) or the end of the iteration (a stream
whose first chunk is not ready yet), so an answer costs one ``send`` system call, not two. And
uvicorn checks every response header's name and value with a regular expression each (two
searches per header, ~20 headers an answer here); ``_Cycle`` checks all names in one search and
all values in another (the forbidden bytes are single bytes, so joining adds no match and hides
none), and is otherwise uvicorn's ``send``.

Idle keep-alive connections close after ``--keep-alive-timeout`` (uvicorn's timer, armed once
per connection rather than once per request). Each refusal
is counted in ``repairproxy_connections_refused_total{reason}``. The limits are read from the app's
Settings (the protocol finds the app below uvicorn's wrappers), so ``--workers`` needs no extra
plumbing. Without httptools, uvicorn's h11 protocol runs with ``h11_max_incomplete_event_size`` set
to the same header cap (h11 answers such a request 400, not 431).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol, cast

import orjson
from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

from repairproxy.asgi.responder import DISCONNECT_EXTENSION
from repairproxy.settings import Settings

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
        super().connection_made(transport)
        if busy:
            self._refused("max_connections", _BUSY)
            return
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        if self.timeout_keep_alive_task is not None:
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = None
        super().connection_lost(exc)
        cycle = self.cycle
        if isinstance(cycle, _Cycle) and cycle.disconnected:
            cycle.disconnect_seen()

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

    def on_headers_complete(self) -> None:
        self._in_headers = False
        if self._header_timer is not None:
            self._disarm_header_timer()
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.transport is self.transport:
            # The request's task was created but has not run: nothing was written yet, and
            # ``run_asgi`` has not yet looked up ``send`` (so the class below is the one used).
            cycle.transport = _CoalescedWrites(self.transport, self.loop)  # type: ignore[assignment]
            if type(cycle) is RequestResponseCycle:
                cycle.__class__ = _Cycle
                ours = cast(_Cycle, cycle)
                extensions: dict[str, Any] = ours.scope.setdefault("extensions", {})
                extensions[DISCONNECT_EXTENSION] = {"watch": ours.watch_disconnect}

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
        super().on_message_complete()
        self._in_headers = True  # the next bytes on this connection start the next request
        self._header_bytes = 0


class _Cycle(RequestResponseCycle):
    """uvicorn 0.54's ``RequestResponseCycle`` whose ``send`` checks a response's header names
    in one regular-expression search and its values in another, instead of two per header. The
    rest is uvicorn's code, unchanged (tests compare both byte for byte on the same messages).

    It also offers the disconnect extension (``asgi.responder.DISCONNECT_EXTENSION``): the
    protocol calls back when the connection is lost before the answer is complete, so the app
    needs no task waiting in ``receive()`` to learn it (uvicorn's ``receive`` returns
    ``http.disconnect`` in exactly that case)."""

    _on_disconnect: Callable[[], None] | None = None

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

    async def send(self, message: Any) -> None:
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        if self.response_started:
            await self._send_body(message)
            return
        if message["type"] != "http.response.start":
            raise RuntimeError(
                f"Expected ASGI message 'http.response.start', but got '{message['type']}'."
            )
        self.response_started = True
        self.waiting_for_100_continue = False
        status_code = message["status"]
        headers = message.get("headers", [])
        if self.default_headers or type(headers) is not list:  # read more than once below
            headers = self.default_headers + list(headers)
        if self.access_log:
            self.access_logger.info(
                '%s - "%s %s HTTP/%s" %d',
                get_client_addr(self.scope),
                self.scope["method"],
                get_path_with_query_string(self.scope),
                self.scope["http_version"],
                status_code,
            )
        if HEADER_RE.search(b"".join([name for name, _ in headers])):
            raise RuntimeError("Invalid HTTP header name.")
        if HEADER_VALUE_RE.search(b"".join([value for _, value in headers])):
            raise RuntimeError("Invalid HTTP header value.")
        content = [STATUS_LINE[status_code]]
        has_connection_close = False
        for name, value in headers:
            name = name.lower()
            if name == b"content-length" and self.chunked_encoding is None:
                self.expected_content_length = int(value.decode())
                self.chunked_encoding = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.expected_content_length = 0
                self.chunked_encoding = True
            elif name == b"connection":
                connection = [token.lower().strip() for token in value.split(b",")]
                if b"close" in connection:
                    self.keep_alive = False
                    has_connection_close = True
            content.extend((name, b": ", value, b"\r\n"))
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
        self.transport.write(b"".join(content))

    async def _send_body(self, message: Any) -> None:
        if self.response_complete:
            raise RuntimeError(
                f"Unexpected ASGI message '{message['type']}' sent, after response already "
                "completed."
            )
        if message["type"] != "http.response.body":
            raise RuntimeError(
                f"Expected ASGI message 'http.response.body', but got '{message['type']}'."
            )
        body = message.get("body", b"")
        more_body = message.get("more_body", False)
        if self.scope["method"] == "HEAD":
            self.expected_content_length = 0
        elif self.chunked_encoding:
            content = [b"%x\r\n" % len(body), body, b"\r\n"] if body else []
            if not more_body:
                content.append(b"0\r\n\r\n")
            self.transport.write(b"".join(content))
        else:
            num_bytes = len(body)
            if num_bytes > self.expected_content_length:
                raise RuntimeError("Response content longer than Content-Length")
            self.expected_content_length -= num_bytes
            self.transport.write(body)
        if not more_body:
            if self.expected_content_length != 0:
                raise RuntimeError("Response content shorter than Content-Length")
            self.response_complete = True
            self.message_event.set()
            if not self.keep_alive:
                self.transport.close()
            self.on_response()


def _nothing() -> None:
    pass


class _CoalescedWrites:
    """One response's view of the connection: its first write (status line and headers) waits
    for the second (the body) or the end of the loop iteration, whichever comes first."""

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop  # given: asyncio.get_running_loop() costs a getpid() call on 3.11
        self._held: bytes | None = b""  # b"": nothing written yet; None: pass writes through

    def write(self, data: bytes) -> None:
        held = self._held
        if held is None:
            self._transport.write(data)
        elif held:
            self._held = None
            self._transport.write(held + data)
        else:
            self._held = bytes(data)
            self._loop.call_soon(self._release)

    def _release(self) -> None:
        held, self._held = self._held, None
        if held and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self._release()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


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
