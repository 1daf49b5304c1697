"""Prometheus in multi-process mode (``--workers N``): every worker writes its samples to files in
``PROMETHEUS_MULTIPROC_DIR`` (set before any worker imports prometheus_client), and whichever
worker answers a scrape sums them all (``MultiProcessMetrics``), for ``/metrics`` and
``/dashboard`` alike. The ``active_episodes`` gauge is the store's count, not a sum. A worker
writes its requests' increments to its files at the end of the event-loop iteration that finished
them (another worker may answer the next scrape, and nothing would flush this one's pending sums
first; within one iteration the requests that finished together share one write per sample,
where a write per request made each sample's file lock and mmap update once per request)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from typing import Any, cast

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

from repairproxy.observe.metrics import Metrics
from repairproxy.observe.record import RequestRecord
from repairproxy.settings import Settings

__all__ = ["MULTIPROC_ENV", "AggregatedView", "MultiProcessMetrics", "multiprocess_mode"]

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_ACTIVE = "repairproxy_active_episodes"


def multiprocess_mode() -> bool:
    """Whether this process writes its metrics for a multi-process scrape."""
    return bool(os.environ.get(MULTIPROC_ENV))


class _Aggregated:
    """Every worker's samples, summed, with the store's episode count as ``active_episodes``."""

    def __init__(self, directory: str, active: Callable[[], int] | None) -> None:
        self._workers: Any = cast(Any, MultiProcessCollector)(None, directory)
        self._active = active

    def collect(self) -> Iterator[Metric]:
        for metric in self._workers.collect():
            if metric.name != _ACTIVE:  # per-pid copies of a gauge that is not a sum
                yield metric
        if self._active is not None:
            yield GaugeMetricFamily(_ACTIVE, "Episodes the store holds now.", self._active())


class AggregatedView:
    """What ``/dashboard`` reads (``registry``, ``ladder``): every worker's samples, summed."""

    def __init__(self, registry: CollectorRegistry, ladder: tuple[int, ...]) -> None:
        self.registry = registry
        self.ladder = ladder


class MultiProcessMetrics(Metrics):
    """``Metrics`` whose exposition sums the samples of every worker process."""

    def __init__(self, settings: Settings, registry: CollectorRegistry | None = None) -> None:
        super().__init__(settings, registry)
        self._active: Callable[[], int] | None = None
        self._flush_scheduled = False

    def request_finished(self, record: RequestRecord) -> None:
        super().request_finished(record)  # pending until the flush below (or FLUSH_EVERY)
        if self._flush_scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # outside a loop: nothing runs later, write now
            self.flush()
            return
        self._flush_scheduled = True
        loop.call_soon(self._flush_soon)

    def _flush_soon(self) -> None:
        self._flush_scheduled = False
        self.flush()

    def bind_active_episodes(self, count: Callable[[], int]) -> None:
        super().bind_active_episodes(count)
        self._active = count

    def dashboard_view(self) -> AggregatedView:
        return self.aggregated()

    def aggregated(self) -> AggregatedView:
        self.flush()  # this worker's own pending increments are in its files before the read
        return AggregatedView(self._aggregated_registry(), self.ladder)

    def _aggregated_registry(self) -> CollectorRegistry:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Aggregated(os.environ[MULTIPROC_ENV], lambda: self._count()))
        return registry

    def _count(self) -> int:
        return self._active() if self._active is not None else 0

    def exposition(self, accept: str | None) -> tuple[bytes, str]:
        self.flush()  # this worker's own pending increments are in its files before the read
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self._aggregated_registry()), content_type
