"""ASGI plumbing shared by the routes: the type aliases, a responder that remembers whether the
response started, body reading under a limit, and cancelling work when the client leaves."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping

from repairproxy.errors import PayloadTooLargeError
from repairproxy.types import HeaderList, Receive, Scope, Send

__all__ = [
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


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def cancel_on_disconnect(work: Awaitable[None], receive: Receive) -> None:
    """Run ``work`` in this task; if the client disconnects first, cancel it (closing the
    upstream request, stopping re-asks, so nobody is charged for an answer nobody saw).

    The work runs inline rather than as a second task: the log line that follows it is written
    in the same step as the last byte, and no task is created per request for the work.
    """
    current = asyncio.current_task()
    assert current is not None
    disconnected = False

    def on_disconnect(watcher: asyncio.Future[None]) -> None:
        nonlocal disconnected
        if not watcher.cancelled() and watcher.exception() is None:
            disconnected = True
            current.cancel()

    watcher = asyncio.ensure_future(_until_disconnect(receive))
    watcher.add_done_callback(on_disconnect)
    try:
        await work
    except asyncio.CancelledError:
        if disconnected:
            current.uncancel()
            raise ClientDisconnectedError from None
        raise
    finally:
        watcher.remove_done_callback(on_disconnect)
        watcher.cancel()
    if disconnected:  # the client left in the same step the work ended: nothing to undo
        current.uncancel()
