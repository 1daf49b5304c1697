"""ASGI plumbing shared by the routes: the type aliases, a responder that remembers whether the
response started, body reading under a limit, and cancelling work when the client leaves."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping

from repairproxy.errors import PayloadTooLargeError
from repairproxy.types import HeaderList, Receive, Scope, Send

__all__ = [
    "DISCONNECT_EXTENSION",
    "ClientDisconnectedError",
    "Responder",
    "cancel_on_disconnect",
    "header_map",
    "read_body",
]


class ClientDisconnectedError(Exception):
    """The client went away; nothing is left to answer."""


class Responder:
    """Wraps ``send``, remembering whether the response started (later errors go in-band)."""

    __slots__ = ("_send", "first_byte_at", "started", "status")

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started = False
        self.status = 0
        self.first_byte_at: float | None = None

    async def start(self, status: int, headers: HeaderList) -> None:
        self.started = True
        self.status = status
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def body(self, chunk: bytes, *, more: bool = True) -> None:
        await self._send({"type": "http.response.body", "body": chunk, "more_body": more})

    async def whole(self, status: int, headers: HeaderList, content: bytes) -> None:
        headers.append((b"content-length", str(len(content)).encode()))
        await self.start(status, headers)
        await self.body(content, more=False)


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
# does): ``{"watch": watch}``, where ``watch(callback)`` arranges for ``callback()`` to run once
# if the client goes away before the response is complete, and returns the function that stops
# watching. Without it, a task waits in ``receive()`` for ``http.disconnect`` instead.
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
    current = asyncio.current_task()
    assert current is not None
    disconnected = False

    def on_disconnect() -> None:
        nonlocal disconnected
        disconnected = True
        current.cancel()

    extension = (scope.get("extensions") or {}).get(DISCONNECT_EXTENSION)
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
