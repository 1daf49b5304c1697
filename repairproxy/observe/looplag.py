"""The event loop's lag: a timer due every ``interval`` seconds records how late it ran.

Everything a client's input costs on the loop (parsing, compiling its tools, validating its
arguments; jsonschema-rs holds the GIL, so a thread would not free the loop) delays every other
client by as much; this is the figure that shows it (``repairproxy_event_loop_lag_seconds``).
One timer per process, no task: ~2 µs of work every 50 ms.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["LoopLagMonitor"]


class LoopLagMonitor:
    """Calls ``record(lag_seconds)`` every ``interval`` seconds until ``stop``."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        record: Callable[[float], None],
        interval: float = 0.05,
    ) -> None:
        self._loop = loop
        self._record = record
        self._interval = interval
        self._due = 0.0
        self._handle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._due = self._loop.time() + self._interval
        self._handle = self._loop.call_at(self._due, self._tick)

    def _tick(self) -> None:
        now = self._loop.time()
        self._record(max(0.0, now - self._due))
        self._due = now + self._interval
        self._handle = self._loop.call_at(self._due, self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
