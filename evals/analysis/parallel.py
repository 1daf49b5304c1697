"""Pure calls run in forked worker processes when the machine has idle CPUs, else here.

The analysis's big steps are Python bound and per item: reading and summarising one results
file (~90 ms at the paper grid's size, 120 files), drawing one figure page (~0.4 s, 26 pages).
Each is a pure function of its arguments, so the results are the same either way. On a busy
machine the workers only share the CPU time one process would get (the scheduler splits it per
session), so there the calls run in this process.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

__all__ = ["MAX_WORKERS", "Call", "idle_workers", "run_calls"]

MAX_WORKERS = 4

# (function, its arguments): one call to make.
Call = tuple[Callable[..., Any], tuple[Any, ...]]


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on every platform
        return os.cpu_count() or 1


def _can_fork() -> bool:
    """Forking copies no other thread, so a lock another thread holds would stay held in the
    child: fork only a single-threaded Linux process (the CLI and the grid's analysis step).
    Forked workers start at once with everything already imported and loaded; spawned ones
    would import it again (~1 s each) and re-run a caller's script that lacks a ``__main__``
    guard."""
    return sys.platform.startswith("linux") and threading.active_count() == 1


def idle_workers() -> int:
    """Workers worth starting: the CPUs the last minute left idle, this process's own one not
    counted as busy, at most ``MAX_WORKERS``."""
    try:
        busy = os.getloadavg()[0]
    except OSError:  # no load average on this platform
        return 0
    return min(max(0, int(_cpus() - max(busy - 1.0, 0.0))), MAX_WORKERS)


def run_calls(calls: Sequence[Call], workers: int) -> list[Any]:
    """Each call's result, in order: in ``workers`` forked processes when that is 2 or more
    and this is a single-threaded Linux process; else here. A pool that cannot start or
    breaks falls back to running the calls here."""
    if workers < 2 or not _can_fork():
        return [function(*arguments) for function, arguments in calls]
    try:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            futures = [pool.submit(function, *arguments) for function, arguments in calls]
            return [future.result() for future in futures]
    except (OSError, BrokenProcessPool):
        return [function(*arguments) for function, arguments in calls]
