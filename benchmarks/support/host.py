"""How much of the machine the host took while a benchmark ran: the ``steal`` share of the CPUs
from ``/proc/stat`` (time a virtual CPU was ready to run and the hypervisor ran something else);
and how an idle CPU of this machine waits (``idle_policy``), which sets what a request costs when
it starts from a sleep, as every request at one client does.

CPU-time figures on a shared VM move with it: on 2026-12-03 the same code read 146 µs a JSON
request at 16 clients in ``benchmarks.vs_peers`` with ~2% of the CPUs stolen and 252 µs with
~8%. A figure printed beside its window's steal can be read as what it is.

    window = StealWindow()
    ...  # the measurement
    window.stop()
    print(window.describe())   # "host steal 0.4% of the CPUs over 12.3 s"

On a VM whose idle CPUs halt at once (the guest's ``haltpoll`` cpuidle driver with
``guest_halt_poll_ns`` 0, as on the Firecracker VMs of 2026-12-03), every wait for the next
request is an exit to the hypervisor, and the work after it runs cold: one JSON client through
``benchmarks.vs_peers`` read repairproxy at 362 µs a request and the Portkey gateway at 1,520,
and with the guest polling up to 200 µs before it halts, 192 and 1,162, the same code, minutes
apart (docs/measurements.md). ``HaltPolling`` sets that window for one run and puts it back.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = [
    "HaltPolling",
    "StealWindow",
    "add_halt_polling_flag",
    "cpu_times",
    "enter_halt_polling",
    "idle_policy",
]

_STAT = Path("/proc/stat")
_CPUIDLE_DRIVER = Path("/sys/devices/system/cpu/cpuidle/current_driver")
_HALT_POLL_NS = Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns")


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


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def idle_policy(driver: Path = _CPUIDLE_DRIVER, halt_poll: Path = _HALT_POLL_NS) -> str:
    """How an idle CPU waits here, in words: the cpuidle driver, and for the guest's ``haltpoll``
    driver how long it polls before it halts (a halt is an exit to the hypervisor)."""
    name = _read(driver)
    if name is None:
        return "idle CPUs: no cpuidle driver listed"
    words = f"idle CPUs: cpuidle driver {name}"
    poll = _read(halt_poll)
    if poll is None or not poll.isdigit():
        return words
    if int(poll) == 0:
        return f"{words}, guest halt polling 0 ns (each idle wait halts: an exit to the hypervisor)"
    return f"{words}, guest halt polling {int(poll):,} ns (an idle CPU polls this long, then halts)"


class HaltPolling:
    """``guest_halt_poll_ns`` set to ``ns`` inside the block, the old value put back after it
    (also when the block raises, and on SIGTERM or SIGHUP, which raise ``SystemExit`` inside the
    block so that it unwinds: a run stopped by ``timeout`` must not leave the host polling).
    Root on a guest with the ``haltpoll`` driver only: elsewhere entering raises
    ``RuntimeError`` saying why, and nothing is changed."""

    _SIGNALS = (signal.SIGTERM, signal.SIGHUP)

    def __init__(self, ns: int, path: Path = _HALT_POLL_NS) -> None:
        if ns < 0:
            raise ValueError("--guest-halt-poll-ns must be >= 0")
        self.ns = ns
        self._path = path
        self._old: str | None = None
        self.previous: int | None = None  # the value found on entering, put back on leaving
        self._handlers: dict[int, Any] = {}

    def __enter__(self) -> HaltPolling:
        old = _read(self._path)
        if old is None or not old.isdigit():
            raise RuntimeError(f"no guest halt polling to set here ({self._path} unreadable)")
        try:
            self._path.write_text(f"{self.ns}\n")
        except OSError as exc:
            raise RuntimeError(f"cannot set {self._path}: {exc}") from exc
        self._old = old
        self.previous = int(old)
        if threading.current_thread() is threading.main_thread():
            for number in self._SIGNALS:
                self._handlers[number] = signal.signal(number, _exit_on_signal)
        return self

    def describe(self) -> str:
        return (
            f"guest halt polling set to {self.ns:,} ns for this run (it was {self.previous:,} ns; "
            "put back at the end)"
        )

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for number, handler in self._handlers.items():
            signal.signal(number, handler)
        self._handlers.clear()
        if self._old is not None:
            self._path.write_text(f"{self._old}\n")
            self._old = None


def _exit_on_signal(number: int, frame: object) -> None:
    raise SystemExit(128 + number)


def add_halt_polling_flag(parser: argparse.ArgumentParser) -> None:
    """A benchmark's ``--guest-halt-poll-ns NS`` (``enter_halt_polling`` applies it)."""
    parser.add_argument(
        "--guest-halt-poll-ns",
        type=int,
        help="a diagnosis, not a default: on a VM guest with the haltpoll cpuidle driver (root), "
        "let idle CPUs poll this long before they halt for the run, then put the old value back "
        "(benchmarks.support.host.HaltPolling); 0 halts at once",
    )


def enter_halt_polling(
    stack: contextlib.ExitStack, ns: int | None, parser: argparse.ArgumentParser
) -> None:
    """Set ``--guest-halt-poll-ns`` for the rest of ``stack`` and say so; a window that cannot
    be set is a usage error. Nothing without the flag."""
    if ns is None:
        return
    try:
        polling = stack.enter_context(HaltPolling(ns))
    except (ValueError, RuntimeError) as exc:
        parser.error(str(exc))
    print(polling.describe(), flush=True)
