"""ASGI plumbing shared by the routes: the type aliases, a responder that remembers whether the
response started, body reading under a limit, and cancelling work when the client leaves."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from repairproxy.errors import PayloadTooLargeError
from repairproxy.types import HeaderList, Receive, Scope, Send

__all__ = [
    "DISCONNECT_EXTENSION",
    "RESPONSE_EXTENSION",
    "ClientDisconnectedError",
    "Responder",
    "ResponseWriter",
    "cancel_on_disconnect",
    "header_map",
    "read_body",
    "response_writer",
]


class ClientDisconnectedError(Exception):
    """The client went away; nothing is left to answer."""


# The response extension a server may offer in ``scope["extensions"]`` (``repairproxy.server``
# does): a ``ResponseWriter``, which writes the answer as ``send`` would without an ASGI message
# dict (and a coroutine) per write, and a whole answer in one call.
RESPONSE_EXTENSION = "repairproxy:response"


class ResponseWriter(Protocol):
    """The server's side of ``RESPONSE_EXTENSION``: ``send``'s writes, as plain calls (each
    raises what ``send`` would raise for the same message, and does nothing once the client
    is gone); ``blocked()`` is what to await before a write, or None."""

    def blocked(self) -> Awaitable[None] | None: ...

    def start(self, status: int, headers: HeaderList) -> None: ...

    def body(self, chunk: bytes, more: bool) -> None: ...

    def whole(self, status: int, headers: HeaderList, content: bytes) -> None: ...


def response_writer(scope: Scope) -> ResponseWriter | None:
    extensions: dict[str, Any] | None = scope.get("extensions")
    return extensions.get(RESPONSE_EXTENSION) if extensions else None


class Responder:
    """Wraps ``send``, remembering whether the response started (later errors go in-band).
    With the server's ``ResponseWriter`` it writes through that instead."""

    __slots__ = ("_send", "_writer", "first_byte_at", "started", "status")

    def __init__(self, send: Send, writer: ResponseWriter | None = None) -> None:
        self._send = send
        self._writer = writer
        self.started = False
        self.status = 0
        self.first_byte_at: float | None = None

    async def start(self, status: int, headers: HeaderList) -> None:
        self.started = True
        self.status = status
        writer = self._writer
        if writer is None:
            await self._send({"type": "http.response.start", "status": status, "headers": headers})
            return
        blocked = writer.blocked()
        if blocked is not None:
            await blocked
        writer.start(status, headers)

    async def body(self, chunk: bytes, *, more: bool = True) -> None:
        writer = self._writer
        if writer is None:
            await self._send({"type": "http.response.body", "body": chunk, "more_body": more})
            return
        blocked = writer.blocked()
        if blocked is not None:
            await blocked
        writer.body(chunk, more)

    async def whole(self, status: int, headers: HeaderList, content: bytes) -> None:
        headers.append((b"content-length", str(len(content)).encode()))
        writer = self._writer
        if writer is None:
            await self.start(status, headers)
            await self.body(content, more=False)
            return
        self.started = True
        self.status = status
        blocked = writer.blocked()
        if blocked is not None:
            await blocked
        writer.whole(status, headers, content)


def header_map(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}


async def read_body(receive: Receive, headers: Mapping[str, str], limit: int) -> bytes:
    declared = headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLargeError(f"request body over the limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnectedError
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLargeError(f"request body over the limit of {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


# The disconnect extension a server may offer in ``scope["extensions"]`` (``repairproxy.server``
# does): ``{"watch": watch, "loop": loop}``, where ``watch(callback)`` arranges for ``callback()``
# to run once if the client goes away before the response is complete, and returns the function
# that stops watching; ``loop`` is the running loop (``asyncio.current_task(loop)`` skips the
# ``getpid`` system call CPython 3.11's running-loop lookup makes). Without the extension, a task
# waits in ``receive()`` for ``http.disconnect`` instead.
DISCONNECT_EXTENSION = "repairproxy:disconnect"


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _watch_with_a_task(receive: Receive, on_disconnect: Callable[[], None]) -> Callable[[], None]:
    """Any ASGI server: a task waits in ``receive()`` (it runs twice: to the wait, then to its
    cancellation when the work is done)."""

    def done(watcher: asyncio.Future[None]) -> None:
        if not watcher.cancelled() and watcher.exception() is None:
            on_disconnect()

    watcher = asyncio.ensure_future(_until_disconnect(receive))
    watcher.add_done_callback(done)

    def stop() -> None:
        watcher.remove_done_callback(done)
        watcher.cancel()

    return stop


async def cancel_on_disconnect(work: Awaitable[None], receive: Receive, scope: Scope) -> None:
    """Run ``work`` in this task; if the client disconnects first, cancel it (closing the
    upstream request, stopping re-asks, so nobody is charged for an answer nobody saw).

    The work runs inline rather than as a second task: the log line that follows it is written
    in the same step as the last byte, and no task is created per request for the work. Under
    this project's server the disconnect comes as a callback from the connection
    (``DISCONNECT_EXTENSION``), so no task is created to watch either.
    """
    extension = (scope.get("extensions") or {}).get(DISCONNECT_EXTENSION)
    current = asyncio.current_task(extension.get("loop") if extension is not None else None)
    assert current is not None
    disconnected = False

    def on_disconnect() -> None:
        nonlocal disconnected
        disconnected = True
        current.cancel()

    if extension is not None:
        stop: Callable[[], None] = extension["watch"](on_disconnect)
    else:
        stop = _watch_with_a_task(receive, on_disconnect)
    try:
        await work
    except asyncio.CancelledError:
        if disconnected:
            current.uncancel()
            raise ClientDisconnectedError from None
        raise
    finally:
        stop()
    if disconnected:  # the client left in the same step the work ended: nothing to undo
        current.uncancel()
