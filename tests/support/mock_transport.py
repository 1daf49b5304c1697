"""An in-process ``upstream.Transport`` that plays scripted answers, as httpx's ``MockTransport``.

It speaks the vocabulary of ``scripted_upstream`` (``Reply``, ``completion(...)``, ``error_reply``)
so a test can move from the real loopback server to this one by changing the fixture only:

    transport = MockTransport()
    transport.push(completion(tool_calls=[tool_call("get_order", {"order_id": "#W1"})]))
    upstream = Upstream("http://mock/v1", transport=transport)

A chat request with ``"stream": true`` gets the reply as SSE events, like ``ScriptedUpstream``.
Faults (``Reply.fault``) raise what ``http1.ConnectionPool`` raises:

    "close" / "refused"   ConnectionResetError / ConnectionRefusedError, no answer at all
    "timeout"             TimeoutError before the head (the pool's read timeout)
    "reset-mid-body"      the head and half the body, then ConnectionResetError
    "timeout-mid-body"    the head and half the body, then TimeoutError

``GET .../models`` always answers; any other path echoes what it received (as the real one does).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from repairproxy.types import HeaderList
from repairproxy.upstream.client import TransportResponse
from tests.support.scripted_upstream import RecordedRequest, Reply, error_reply, sse_events

__all__ = ["MockResponse", "MockTransport"]

_MID_BODY = {"reset-mid-body": ConnectionResetError, "timeout-mid-body": TimeoutError}
_BEFORE_HEAD: dict[str, Callable[[str], BaseException]] = {
    "close": ConnectionResetError,
    "refused": ConnectionRefusedError,
    "timeout": TimeoutError,
}


@dataclass
class MockResponse:
    """A scripted response: head now, body chunks (and maybe a fault) when iterated."""

    status_code: int
    headers: HeaderList
    chunks: list[bytes]
    fault: BaseException | None = None
    chunk_delay: float = 0.0
    consumed: bool = False
    closed_early: bool = False
    _closed: bool = field(default=False, repr=False)

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    async def iter_body(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            if self._closed:
                return
            if self.chunk_delay:
                await asyncio.sleep(self.chunk_delay)
            yield chunk
        if self.fault is not None:
            raise self.fault
        self.consumed = True

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.iter_body()])

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self.closed_early = not self.consumed


class MockTransport:
    """Plays pushed ``Reply`` objects to chat requests, in order; records every request."""

    def __init__(self, *replies: Reply) -> None:
        self.script: deque[Reply] = deque(replies)
        self.requests: list[RecordedRequest] = []
        self.responses: list[MockResponse] = []
        self.closed = False

    def push(self, *replies: Reply) -> None:
        self.script.extend(replies)

    @property
    def chat_requests(self) -> list[dict[str, Any]]:
        return [r.json() for r in self.requests if "/chat/completions" in r.path]

    @property
    def aborted_streams(self) -> int:
        """Responses closed before their body was read to the end (a cancelled generation)."""
        return sum(1 for response in self.responses if response.closed_early)

    async def request(
        self,
        method: str,
        target: str,
        headers: HeaderList,
        body: bytes = b"",
        timeout: float | None = None,
    ) -> TransportResponse:
        recorded = RecordedRequest(
            method,
            target,
            {name.decode("latin-1"): value.decode("latin-1") for name, value in headers},
            body,
        )
        self.requests.append(recorded)
        path = target.split("?", 1)[0]
        if path.endswith("/chat/completions"):
            reply = self.script.popleft() if self.script else error_reply(500, "script exhausted")
            response = await self._play(reply, body)
        elif path.endswith("/models"):
            listing = {"object": "list", "data": [{"id": "scripted-model", "object": "model"}]}
            response = _json(200, orjson.dumps(listing), ())
        else:
            echo = {"method": method, "path": target, "body": body.decode("utf-8", "replace")}
            response = _json(200, orjson.dumps(echo), ())
        self.responses.append(response)
        return response

    async def _play(self, reply: Reply, request_body: bytes) -> MockResponse:
        if reply.delay:
            await asyncio.sleep(reply.delay)
        before = _BEFORE_HEAD.get(reply.fault or "")
        if before is not None:
            raise before(f"scripted fault: {reply.fault}")
        try:
            request = orjson.loads(request_body)
        except orjson.JSONDecodeError:
            request = {}
        wants_stream = isinstance(request, dict) and request.get("stream") is True
        if wants_stream and reply.status == 200 and isinstance(reply.body, dict) and not reply.raw:
            options = request.get("stream_options") or {}
            events = sse_events(reply.body, bool(options.get("include_usage")))
            headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
            response = MockResponse(200, headers, events, chunk_delay=reply.event_delay)
        else:
            payload = reply.raw if reply.raw is not None else orjson.dumps(reply.body)
            response = _json(reply.status, payload, reply.headers)
        mid_body = _MID_BODY.get(reply.fault or "")
        if mid_body is not None:
            whole = b"".join(response.chunks)
            response.chunks = [whole[: len(whole) // 2]]
            response.fault = mid_body(f"scripted fault: {reply.fault}")
        return response

    async def aclose(self) -> None:
        self.closed = True


def _json(status: int, payload: bytes, extra: tuple[tuple[str, str], ...]) -> MockResponse:
    headers: HeaderList = [(name.lower().encode(), value.encode()) for name, value in extra]
    if not any(name == b"content-type" for name, _ in headers):
        headers.insert(0, (b"content-type", b"application/json"))
    headers.append((b"content-length", str(len(payload)).encode()))
    return MockResponse(status, headers, [payload] if payload else [])
