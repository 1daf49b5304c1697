"""How much of the machine the host took while a benchmark ran: the ``steal`` share of the CPUs
from ``/proc/stat`` (time a virtual CPU was ready to run and the hypervisor ran something else).

CPU-time figures on a shared VM move with it: on 2026-12-03 the same code read 146 µs a JSON
request at 16 clients in ``benchmarks.vs_peers`` with ~2% of the CPUs stolen and 252 µs with
~8%. A figure printed beside its window's steal can be read as what it is.

    window = StealWindow()
    ...  # the measurement
    window.stop()
    print(window.describe())   # "host steal 0.4% of the CPUs over 12.3 s"
"""

from __future__ import annotations

import time
from pathlib import Path

__all__ = ["StealWindow", "cpu_times"]

_STAT = Path("/proc/stat")


def cpu_times(stat: Path = _STAT) -> tuple[int, int] | None:
    """(steal, total) clock ticks of all CPUs since boot, or None where ``/proc/stat`` has none."""
    try:
        with stat.open() as lines:
            first = lines.readline().split()
    except OSError:
        return None
    if len(first) < 9 or first[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal [guest guest_nice: already in user, nice]
    ticks = [int(value) for value in first[1:9]]
    return ticks[7], sum(ticks)


class StealWindow:
    """The host's steal share of the CPUs from construction until ``stop()`` (or until now)."""

    def __init__(self, stat: Path = _STAT) -> None:
        self._stat = stat
        self._start = cpu_times(stat)
        self._started = time.monotonic()
        self._end: tuple[int, int] | None = None
        self._ended: float | None = None

    def stop(self) -> None:
        """End the window here: later reads give the same figures."""
        self._end = cpu_times(self._stat)
        self._ended = time.monotonic()

    def percent(self) -> float | None:
        end = self._end if self._ended is not None else cpu_times(self._stat)
        if self._start is None or end is None or end[1] <= self._start[1]:
            return None
        return 100.0 * (end[0] - self._start[0]) / (end[1] - self._start[1])

    def describe(self) -> str:
        share = self.percent()
        seconds = (self._ended or time.monotonic()) - self._started
        if share is None:
            return "host steal unknown (no /proc/stat)"
        return f"host steal {share:.1f}% of the CPUs over {seconds:.1f} s"
