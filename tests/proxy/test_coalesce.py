"""Writes held to the end of the loop iteration (``repairproxy.coalesce``): at the transport seam,
what is written leaves once, in order, before a close and never after an abort; through the real
server, the answer leaves before the request's log line is written."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import httpx
import pytest

from repairproxy.coalesce import CoalescingTransport
from tests.support.proxy_server import RunningProxy
from tests.support.scripted_upstream import ScriptedUpstream, completion, tool_call

_anyio = pytest.mark.anyio


class _Raw:
    """A transport that records what reaches it, in one list shared by several."""

    def __init__(self, name: str, events: list[Any]) -> None:
        self.name = name
        self.events = events
        self.closing = False

    def write(self, data: bytes) -> None:
        assert not self.closing, "written after close"
        self.events.append((self.name, "write", data))

    def close(self) -> None:
        self.closing = True
        self.events.append((self.name, "close"))

    def abort(self) -> None:
        self.closing = True
        self.events.append((self.name, "abort"))

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return 0


def _coalescing(name: str, events: list[Any]) -> tuple[CoalescingTransport, _Raw]:
    raw = _Raw(name, events)
    return CoalescingTransport(raw, asyncio.get_running_loop()), raw  # type: ignore[arg-type]


@_anyio
async def test_writes_leave_once_at_the_end_of_the_iteration_in_order() -> None:
    events: list[Any] = []
    transport, _ = _coalescing("a", events)
    transport.write(b"HTTP/1.1 200 OK\r\n")
    transport.write(b"")  # nothing to send: nothing held, nothing scheduled
    transport.write(memoryview(b"content-length: 2\r\n\r\n"))
    transport.writelines([b"o", b"k"])
    assert events == []
    assert transport.get_write_buffer_size() == 40
    await asyncio.sleep(0)
    assert events == [("a", "write", b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")]
    assert transport.get_write_buffer_size() == 0
    transport.write(b"next")
    await asyncio.sleep(0)
    assert events[1:] == [("a", "write", b"next")]


@_anyio
async def test_the_writes_of_one_iteration_leave_together_before_later_work() -> None:
    """Written during one iteration on three connections, the answers go out back to back, before
    any work that became ready after them (the next requests' steps)."""
    events: list[Any] = []
    transports = [_coalescing(name, events)[0] for name in "abc"]
    for transport in transports:
        transport.write(b"answer")
    asyncio.get_running_loop().call_soon(events.append, "later work")
    await asyncio.sleep(0)
    assert events == [
        ("a", "write", b"answer"),
        ("b", "write", b"answer"),
        ("c", "write", b"answer"),
        "later work",
    ]


@_anyio
async def test_a_reused_buffer_is_copied_when_written() -> None:
    events: list[Any] = []
    transport, _ = _coalescing("a", events)
    buffer = bytearray(b"first")
    transport.write(buffer)
    buffer[:] = b"XXXXX"
    await asyncio.sleep(0)
    assert events == [("a", "write", b"first")]


@_anyio
async def test_close_sends_what_is_held_first() -> None:
    events: list[Any] = []
    transport, raw = _coalescing("a", events)
    transport.write(b"bye")
    transport.close()
    assert events == [("a", "write", b"bye"), ("a", "close")]
    await asyncio.sleep(0)  # the scheduled flush finds nothing left
    assert events == [("a", "write", b"bye"), ("a", "close")]
    assert transport.is_closing() and raw.closing


@_anyio
async def test_abort_and_drop_pending_discard_what_is_held() -> None:
    events: list[Any] = []
    dropped, _ = _coalescing("a", events)
    dropped.write(b"never")
    dropped.drop_pending()
    dropped.close()
    aborted, _ = _coalescing("b", events)
    aborted.write(b"never")
    aborted.abort()
    await asyncio.sleep(0)
    assert events == [("a", "close"), ("b", "abort")]


@_anyio
async def test_bytes_held_for_a_transport_that_closed_meanwhile_are_dropped() -> None:
    """The connection was lost before the iteration ended: nothing is written to it (no error)."""
    events: list[Any] = []
    transport, raw = _coalescing("a", events)
    transport.write(b"late")
    raw.closing = True
    await asyncio.sleep(0)
    assert events == []


@pytest.mark.parametrize("stream", [False, True])
def test_the_answer_leaves_before_the_log_line_is_written(
    monkeypatch: pytest.MonkeyPatch,
    upstream: ScriptedUpstream,
    proxy: RunningProxy,
    stream: bool,
) -> None:
    """Through the real server, with another request in flight (so the answer is held for the
    iteration's end): the answer's last write reaches the socket before the request's log line
    is written (the request yields once after answering), so the work done after the answer
    (the log line, metrics) never holds it back."""
    logged_at_answer: list[int] = []
    assert proxy.server is not None
    tasks = proxy.server.server_state.tasks
    waiting = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    # Its headers are complete, its body is not: its request is in flight until the end.
    waiting.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: 1000\r\n\r\n{"
    )
    deadline = time.monotonic() + 10
    while not tasks and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(tasks) == 1
    flush = CoalescingTransport.flush

    def recording_flush(self: CoalescingTransport) -> None:
        pending = self._pending
        held = pending if isinstance(pending, bytes) else b"".join(pending or [])
        if held.startswith(b"HTTP/1.1 200") or held.endswith(b"0\r\n\r\n"):
            logged_at_answer.append(_request_lines(proxy))
        flush(self)

    monkeypatch.setattr(CoalescingTransport, "flush", recording_flush)
    upstream.push(completion(tool_calls=[tool_call("get_order", {"order_id": "#W1"})]))
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    with waiting, httpx.Client(trust_env=False, timeout=30) as client:
        answer = client.post(proxy.base_url + "/chat/completions", json=body)
    assert answer.status_code == 200
    assert b"get_order" in answer.content
    deadline = time.monotonic() + 10
    while _request_lines(proxy) == 0 and time.monotonic() < deadline:
        time.sleep(0.01)  # written just after the answer, on the server's thread
    assert _request_lines(proxy) == 1
    assert logged_at_answer and logged_at_answer[-1] == 0, logged_at_answer


def _request_lines(proxy: RunningProxy) -> int:
    """The log lines of answered requests (the waiting one, cut off, logs a 499 at the end),
    read at once: the waiting request stays in flight, and one call is on the server's thread."""
    return sum(
        line.get("event") == "request" and line.get("status") == 200
        for line in proxy.log_lines(settle=0)
    )


@_anyio
async def test_a_lone_request_writes_at_once_and_never_ahead_of_what_is_held() -> None:
    """With no other request in flight, a write leaves at once (nothing could join it); bytes
    already held still leave first."""
    events: list[Any] = []
    in_flight = {"this request", "another"}
    raw = _Raw("a", events)
    transport = CoalescingTransport(
        raw,  # type: ignore[arg-type]
        asyncio.get_running_loop(),
        in_flight=in_flight,
    )
    transport.write(b"held")
    in_flight.discard("another")
    transport.write(b" then this")  # joins what is held: order before speed
    assert events == []
    await asyncio.sleep(0)
    assert events == [("a", "write", b"held then this")]
    transport.write(b"at once")
    assert events[1:] == [("a", "write", b"at once")]
