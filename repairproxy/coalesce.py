"""Socket writes held to the end of the event-loop iteration, so the writes of concurrent requests
leave one after another instead of one between each request's Python work.

Why: on one host (loopback, a Docker bridge), a ``send`` runs the receiver's TCP path in the
sender's system call and wakes the receiver if it sleeps in ``epoll_wait``; on a VM that wake is
an inter-processor interrupt, measured at ~11% of the proxy's CPU under 16 clients (``perf``:
``sock_def_readable`` → ``_raw_spin_unlock_irqrestore``). Written inline, each answer's
``send`` found its client (and each upstream request its upstream) asleep again after the
previous one, and paid that wake every time. Written together, the first wakes the peer and
the rest find it awake. ``python -m benchmarks.overhead`` reads the difference.

``CoalescingTransport`` wraps an asyncio transport: ``write`` keeps the bytes and schedules one
flush (``loop.call_soon``), which runs after the callbacks already queued (the steps of the
other requests that became ready in the same iteration); ``close`` and ``write_eof`` send what
is held first (bytes written before a close still leave, as with any transport), ``abort`` and
``drop_pending`` discard it. Order on one transport is kept: every write goes through the
wrapper. The server's writes are held only while other requests are in flight (``in_flight``): a
lone request has nothing to be coalesced with, and holding its answer cost ~40 µs of latency
at one client. A request yields once after its answer is written (``asgi.routes``) so that
work done after the answer (the log line, metrics) does not hold the write back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sized
from typing import Any

__all__ = ["CoalescingTransport"]


class CoalescingTransport:
    """An asyncio transport whose writes leave once per event-loop iteration."""

    __slots__ = ("_in_flight", "_loop", "_pending", "raw")

    def __init__(
        self,
        transport: asyncio.Transport,
        loop: asyncio.AbstractEventLoop,
        *,
        in_flight: Sized | None = None,
    ) -> None:
        self.raw = transport  # the transport written to (start_tls needs it)
        self._loop = loop
        self._pending: bytes | list[bytes] | None = None
        # The requests in flight (the writer's among them): when it is alone, nothing could
        # join its write, and holding it would only delay it (~40 us at 1 client, measured).
        self._in_flight = in_flight

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if type(data) is not bytes:
            data = bytes(data)  # the caller may reuse its buffer before the flush
        pending = self._pending
        if pending is None:
            if self._in_flight is not None and len(self._in_flight) <= 1:
                self.raw.write(data)
                return
            self._pending = data
            self._loop.call_soon(self.flush)
        elif isinstance(pending, list):
            pending.append(data)
        else:
            self._pending = [pending, data]

    def writelines(self, chunks: Any) -> None:
        for chunk in chunks:
            self.write(chunk)

    def flush(self) -> None:
        """Send what is held now (a closing transport's held bytes are dropped)."""
        pending, self._pending = self._pending, None
        if pending is None or self.raw.is_closing():
            return
        self.raw.write(pending if isinstance(pending, bytes) else b"".join(pending))

    def drop_pending(self) -> None:
        """Forget what is held: nothing written since the last flush leaves."""
        self._pending = None

    @property
    def pending_size(self) -> int:
        pending = self._pending
        if pending is None:
            return 0
        return len(pending) if isinstance(pending, bytes) else sum(map(len, pending))

    # -- the rest of asyncio.Transport, forwarded ------------------------------------------------

    def close(self) -> None:
        self.flush()
        self.raw.close()

    def abort(self) -> None:
        self._pending = None
        self.raw.abort()

    def write_eof(self) -> None:
        self.flush()
        self.raw.write_eof()

    def can_write_eof(self) -> bool:
        return self.raw.can_write_eof()

    def is_closing(self) -> bool:
        return self.raw.is_closing()

    def is_reading(self) -> bool:
        return self.raw.is_reading()

    def pause_reading(self) -> None:
        self.raw.pause_reading()

    def resume_reading(self) -> None:
        self.raw.resume_reading()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.raw.get_extra_info(name, default)

    def get_write_buffer_size(self) -> int:
        return self.raw.get_write_buffer_size() + self.pending_size

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self.raw.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.raw.set_write_buffer_limits(high, low)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self.raw.get_protocol()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.raw.set_protocol(protocol)
