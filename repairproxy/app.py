"""``create_app(settings)``: the proxy as one ASGI app whose lifespan owns the upstream pool.

Everything a request needs (upstream pool, tools cache, episode store, repair policies, the chat
pipeline, metrics, logger) is built here from the frozen Settings and handed to the routes;
nothing lives in module globals.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import IO, Any

from repairproxy.asgi import Message, Receive, Send
from repairproxy.events import NullObserver, PipelineObserver
from repairproxy.logging import configure_logging
from repairproxy.pipeline import ChatPipeline
from repairproxy.repair import DEFAULT_TEMPLATE, RepairMode, RepairPolicy, RepairTemplate
from repairproxy.routes import Proxy
from repairproxy.sessions import ErrorBudget, MemoryEpisodeStore
from repairproxy.settings import Settings
from repairproxy.upstream import Transport, Upstream
from repairproxy.validation import ToolsCache

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
        self._metrics_server: Any = None  # --metrics-port's own server, closed at shutdown

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
        store = MemoryEpisodeStore(settings.max_episodes, settings.episode_idle_ttl)
        budget = ErrorBudget(
            store,
            default_budget=settings.budget,
            tool_error_pattern=settings.tool_error_pattern,
            episode_header=settings.episode_header,
        )
        tools = ToolsCache(
            settings.tools_cache_size, forbid_extra_arguments=settings.forbid_extra_arguments
        )
        metrics = self._metrics(store.__len__)
        observer: PipelineObserver = metrics if metrics is not None else NullObserver()
        return Proxy(
            settings,
            upstream,
            ChatPipeline(settings, tools, budget, policies),
            observer,
            configure_logging(settings.log_level, self._log_stream),
            # With --metrics-port, /metrics lives on that port only.
            metrics if settings.metrics_port is None else None,
            dashboard=metrics,
        )

    def _metrics(self, active_episodes: Callable[[], int]) -> Any:
        """The Prometheus metrics (``repairproxy.metrics``), built once per app, or None."""
        if not self.settings.metrics:
            return None
        from repairproxy.metrics import Metrics

        metrics = Metrics(self.settings)
        metrics.bind_active_episodes(active_episodes)
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
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": repr(exc)})
                    return
                # Start-up objects (imports, compiled schemas) never die: keep them out of the
                # collector's scans, which otherwise show up in the latency tail.
                gc.freeze()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.proxy is not None:
                    await self.proxy.upstream.aclose()
                    self.proxy = None
                if self._metrics_server is not None:
                    self._metrics_server.close()
                    self._metrics_server = None
                await send({"type": "lifespan.shutdown.complete"})
                return


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
