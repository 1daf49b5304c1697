"""One request and its answer on a connection: ``_Cycle``, uvicorn's ``RequestResponseCycle``
written lean, and the response header checks only it uses.

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
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    HttpToolsProtocol,
)
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

from repairproxy.types import HeaderList

__all__ = ["bad_header_name", "bad_header_value"]


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
        "queued",
        "ready",
        "received",
        "received_bytes",
        "response_complete",
        "response_started",
        "scope",
        "taken",
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
        self.queued = False  # waits in the pipeline behind an earlier request's answer
        self.taken = False  # the app asked for the body (receive)
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
        self.taken = True
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
        if self.more_body:
            # An answer before the whole body was read (401, 413, a refused 100-continue): the
            # connection closes rather than read a body nobody wants (whose bytes, were the
            # client to skip it, would be read as its next request).
            self.keep_alive = False
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
