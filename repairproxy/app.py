"""``create_app(settings)``: the proxy as one ASGI app whose lifespan owns the upstream pool and
the episode store.

Everything a request needs (upstream pool, tools cache, episode store, repair policies, the chat
pipeline, metrics, logger) is built here from the frozen Settings and handed to the routes;
nothing lives in module globals. On SIGTERM the app turns unready at once (``/readyz`` 503) while
uvicorn stops accepting and lets in-flight requests, streams and re-asks finish within
``--drain-timeout``.
"""

from __future__ import annotations

import asyncio
import gc
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import IO, TYPE_CHECKING, Any

from repairproxy.asgi.routes import Proxy
from repairproxy.episodes.budget import ErrorBudget, TenantKeys
from repairproxy.episodes.store import Stores, open_stores
from repairproxy.observe.logging import configure_logging
from repairproxy.observe.record import NullObserver, PipelineObserver
from repairproxy.pipeline import ChatPipeline
from repairproxy.repair import DEFAULT_TEMPLATE, RepairPolicy, RepairTemplate
from repairproxy.settings import Settings
from repairproxy.types import Message, Receive, RepairMode, Send
from repairproxy.upstream.client import Transport, Upstream
from repairproxy.validation import ToolsCache

# The collector's youngest generation is scanned after this many net container allocations
# (CPython's default: 700). A request leaves a few hundred behind for a moment, so at 700 the
# collector ran every two or three requests and scanned the in-flight requests' objects each
# time; at 10,000 it runs ~14x less often for the same scan, and at most 10,000 young objects (~1
# MB) wait for it. Whole server under callgrind, JSON: 757.6k -> 749.3k instructions a request.
YOUNG_GC_THRESHOLD = 10_000

if TYPE_CHECKING:
    from repairproxy.observe.metrics import Metrics

__all__ = ["RepairProxyApp", "create_app"]


def _load_template(settings: Settings) -> RepairTemplate:
    if settings.repair_template is None:
        return DEFAULT_TEMPLATE
    return RepairTemplate.from_file(settings.repair_template)


class RepairProxyApp:
    """The ASGI callable: lifespan builds the Proxy, HTTP requests go to it."""

    def __init__(
        self,
        settings: Settings,
        *,
        log_stream: IO[bytes] | None = None,
        transport: Transport | None = None,
    ) -> None:
        if not settings.upstream:
            raise ValueError(
                "create_app needs settings.upstream (the CLI starts the embedded model)"
            )
        self.settings = settings
        self._log_stream = log_stream
        self._transport = transport  # tests: a scripted upstream in process (else the pool)
        self._template = _load_template(settings)  # a bad template file fails here, at start
        self.proxy: Proxy | None = None
        self.stores: Stores | None = None
        self.draining = False
        self._sigterm: tuple[Any, Any] | None = None  # (our handler, the one it chains to)
        self._gc_threshold: tuple[int, int, int] | None = None  # the collector's, before start
        self._metrics_server: Any = None  # --metrics-port's own server, closed at shutdown
        self._loop_lag: Any = None  # the event-loop lag timer (observe/looplag.py)
        self.metrics: Any = None  # built with the Proxy; None with --metrics false

    def begin_drain(self) -> None:
        """From now on ``/readyz`` answers 503 (load balancers stop sending new requests)."""
        self.draining = True
        if self.proxy is not None:
            self.proxy.draining = True

    def _build(self) -> Proxy:
        settings = self.settings
        assert settings.upstream is not None
        upstream = Upstream(
            settings.upstream,
            api_key=settings.upstream_api_key,
            drop_client_auth=bool(settings.api_keys),
            timeout=settings.upstream_timeout,
            max_connections=settings.max_connections,
            transport=self._transport,
        )
        template = self._template
        policies = {
            mode: RepairPolicy(
                mode=mode,
                max_repairs=settings.max_repairs,
                on_exhausted=settings.on_exhausted,
                template=template,
            )
            for mode in RepairMode
        }
        logger = configure_logging(settings.log_level, self._log_stream)
        metrics = self._metrics()
        self.metrics = metrics  # the server layer counts its refusals here (repairproxy.server)
        stores = self.stores = open_stores(
            settings,
            log=logger,
            count_error=_store_error_counter(metrics, settings),
            count_eviction=_eviction_counter(metrics, settings),
        )
        if metrics is not None:
            metrics.bind_active_episodes(stores.active_episodes)
        tenants = TenantKeys(settings.tenant_secret) if settings.api_keys else None
        if tenants is not None and tenants.generated and len(settings.api_keys) > 1:
            logger.warning(
                "tenant_secret_generated",
                detail="no --tenant-secret: tenants are derived under a per-process secret, so "
                "replicas (or a restart) would not agree on them; set the same on every replica",
            )
        budget = ErrorBudget(
            stores.episodes,
            default_budget=settings.budget,
            tool_error_pattern=settings.tool_error_pattern,
            chains=stores.chains,
            episode_header=settings.episode_header,
            tenants=tenants,
        )
        tools = ToolsCache(
            settings.tools_cache_size,
            max_bytes=settings.tools_cache_bytes,
            max_tools=settings.max_tools,
            max_tools_bytes=settings.max_tools_bytes,
            forbid_extra_arguments=settings.forbid_extra_arguments,
        )
        observer: PipelineObserver = metrics if metrics is not None else NullObserver()
        proxy = Proxy(
            settings,
            upstream,
            ChatPipeline(settings, tools, budget, policies),
            observer,
            logger,
            # With --metrics-port, /metrics lives on that port only.
            metrics if settings.metrics_port is None else None,
            # Several workers: the page sums them all, as /metrics does.
            dashboard=metrics.dashboard_view() if metrics is not None else None,
            responses_store=stores.responses,
            threads_store=stores.threads,
        )
        proxy.draining = self.draining
        return proxy

    def _metrics(self) -> Metrics | None:
        """The Prometheus metrics (``repairproxy.observe.metrics``), built once per app, or None;
        summed over every worker process when ``--workers`` runs several
        (``repairproxy.workers``)."""
        if not self.settings.metrics:
            return None
        from repairproxy.observe.metrics import Metrics
        from repairproxy.observe.multiprocess import MultiProcessMetrics, multiprocess_mode

        kind = MultiProcessMetrics if multiprocess_mode() else Metrics
        metrics = kind(self.settings)
        if self.settings.metrics_port is not None:
            self._metrics_server = metrics.start_server(
                self.settings.metrics_port, self.settings.host
            )
        return metrics

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            if self.proxy is None:  # a server that skipped the lifespan protocol
                self.proxy = self._build()
            await self.proxy.handle(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        else:  # websockets are not part of the OpenAI API
            raise RuntimeError(f"unsupported ASGI scope type {kind!r}")

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    self.proxy = self._build()
                    if self.stores is not None:
                        await self.stores.start()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": repr(exc)})
                    return
                self._watch_sigterm()
                if self.metrics is not None:
                    from repairproxy.observe.looplag import LoopLagMonitor

                    self._loop_lag = LoopLagMonitor(
                        asyncio.get_running_loop(), self.metrics.loop_lagged
                    )
                    self._loop_lag.start()
                # Start-up objects (imports, compiled schemas) never die: keep them out of the
                # collector's scans, which otherwise show up in the latency tail.
                gc.freeze()
                self._gc_threshold = gc.get_threshold()
                gc.set_threshold(YOUNG_GC_THRESHOLD, *self._gc_threshold[1:])
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._gc_threshold is not None:  # an app in a test's process: as it was
                    gc.set_threshold(*self._gc_threshold)
                    self._gc_threshold = None
                self._unwatch_sigterm()
                if self._loop_lag is not None:
                    self._loop_lag.stop()
                    self._loop_lag = None
                if self.proxy is not None:
                    await self.proxy.upstream.aclose()
                    self.proxy = None
                if self.stores is not None:
                    await self.stores.aclose()
                    self.stores = None
                if self._metrics_server is not None:
                    self._metrics_server.close()
                    self._metrics_server = None
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _watch_sigterm(self) -> None:
        """Chain ahead of the server's SIGTERM handler (uvicorn's stops accepting and drains),
        so ``/readyz`` turns unready the moment the signal arrives."""
        if threading.current_thread() is not threading.main_thread():
            return  # an embedded server in a thread (tests): the host owns the signals
        previous = signal.getsignal(signal.SIGTERM)

        def on_sigterm(signum: int, frame: FrameType | None) -> None:
            self.begin_drain()
            if callable(previous):
                previous(signum, frame)
            elif previous == signal.SIG_DFL:
                raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, on_sigterm)
        self._sigterm = (on_sigterm, previous)

    def _unwatch_sigterm(self) -> None:
        """Put the previous handler back (apps started and stopped in one process, tests)."""
        if self._sigterm is None or threading.current_thread() is not threading.main_thread():
            return
        ours, previous = self._sigterm
        self._sigterm = None
        if signal.getsignal(signal.SIGTERM) is ours:
            signal.signal(signal.SIGTERM, previous)


def _store_error_counter(metrics: Any, settings: Settings) -> Callable[[str], None] | None:
    """``repairproxy_store_errors_total{operation}``: store calls a request went without."""
    if metrics is None or settings.episode_store == "memory":
        return None
    from prometheus_client import Counter

    counter = Counter(
        "repairproxy_store_errors",
        "Episode-store calls that failed or were skipped while the store was away "
        "(the request went on with its budget unknown).",
        ("operation",),
        registry=metrics.registry,
    )
    operations = ("update", "get", "link", "lookup", "response_put", "response_get")
    children = {op: counter.labels(op) for op in (*operations, "response_delete")}
    return lambda operation: children[operation].inc()


def _eviction_counter(metrics: Any, settings: Settings) -> Callable[[str], None] | None:
    """``repairproxy_episode_evictions_total{reason}``: episodes the memory store let go."""
    if metrics is None or settings.episode_store != "memory":
        return None
    from prometheus_client import Counter

    counter = Counter(
        "repairproxy_episode_evictions",
        "Episodes the in-process store evicted (reason: memory, tenant_quota, count); one that "
        "had spent anything leaves a tombstone of its counts.",
        ("reason",),
        registry=metrics.registry,
    )
    children = {reason: counter.labels(reason) for reason in ("memory", "tenant_quota", "count")}
    return lambda reason: children[reason].inc()


def create_app(
    settings: Settings,
    *,
    log_stream: IO[bytes] | None = None,
    transport: Transport | None = None,
) -> RepairProxyApp:
    """The proxy ASGI app; ``log_stream`` (default stdout) receives the JSON log lines.

    ``transport`` replaces the upstream connection pool (tests: ``tests/support/mock_transport``).
    """
    return RepairProxyApp(settings, log_stream=log_stream, transport=transport)
