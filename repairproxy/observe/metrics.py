"""Every Prometheus metric of the proxy, fed one ``RequestRecord`` per request.

``Metrics`` implements the pipeline's ``PipelineObserver``. Label values are bounded: at most
``max_model_labels`` models and ``max_tool_labels`` invented tool names per model get their own
value (the rest share ``_other``), every value is cut to 64 characters, and labelled children are
cached per model.

``request_finished`` adds to plain numbers (``_Pending``: one lock per request instead of one per
counter increment or histogram observation), and the sums reach prometheus-client's children when
anything reads the registry (a collector registered first flushes them) or every ``FLUSH_EVERY``
requests. Sums are added one observation at a time, in order, so every exposed value is the one
direct increments would have made, bit for bit. In multi-process mode another worker's scrape
reads this one's files, not its registry: there each request writes its increments at once.
"""

from __future__ import annotations

import hmac
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder

from repairproxy.episodes.budget import DEFAULT_ENV_ERROR_TABLE, ENV_OTHER_ERROR
from repairproxy.native import FAMILIES
from repairproxy.observe.record import RepairResultKind, RequestRecord
from repairproxy.settings import Settings
from repairproxy.structured import OutputChannel
from repairproxy.types import API, Outcome
from repairproxy.validation import Channel

if TYPE_CHECKING:
    from repairproxy.observe.dashboard import DashboardSource

__all__ = [
    "ANSWER_CHANNELS",
    "ENV_CHANNELS",
    "FLUSH_EVERY",
    "MAX_LABEL_CHARS",
    "OTHER",
    "UNKNOWN_MODEL",
    "Metrics",
    "MetricsServer",
]

MAX_LABEL_CHARS = 64
FLUSH_EVERY = 512  # requests whose increments may wait for a scrape (bounds what is held)
OTHER = "_other"  # the shared label value beyond the bound
UNKNOWN_MODEL = "_unknown"  # requests that never named a model (e.g. an unreadable body)

# The vocabulary the ``channel`` label takes, created at zero for each model so that rates and
# ratios over a window are defined (and exact) from the model's first request on.
ANSWER_CHANNELS: tuple[str, ...] = tuple(c.value for c in Channel if c is not Channel.VALID)
ENV_CHANNELS: tuple[str, ...] = (*(label for label, _ in DEFAULT_ENV_ERROR_TABLE), ENV_OTHER_ERROR)

_SECONDS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)
_OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1)
_ATTEMPT_BUCKETS = (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 8.0)
_REMAINING_BUCKETS = (0.0, 1.0, 2.0, 3.0, 5.0, 7.0, 10.0, 15.0, 20.0, 50.0)
# Log-prob margins: below ~0.5 nats a small perturbation (quantization) can flip the choice.
_MARGIN_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)


def _label(value: str) -> str:
    return value if len(value) <= MAX_LABEL_CHARS else value[:MAX_LABEL_CHARS]


class _Pending:
    """Increments not yet made on prometheus-client's children: counter deltas, and each
    histogram's observations in order. Bounded: at most ``FLUSH_EVERY`` requests' worth."""

    __slots__ = ("counts", "observed", "requests")

    def __init__(self) -> None:
        self.counts: dict[Any, float] = {}
        self.observed: dict[Any, list[float]] = {}
        self.requests = 0

    def inc(self, child: Any, amount: float = 1) -> None:
        counts = self.counts
        counts[child] = counts.get(child, 0) + amount

    def observe(self, child: Any, amount: float) -> None:
        found = self.observed.get(child)
        if found is None:
            self.observed[child] = [amount]
        else:
            found.append(amount)

    def apply(self) -> None:
        for child, amount in self.counts.items():
            child.inc(amount)
        for child, amounts in self.observed.items():
            _observe_all(child, amounts)


class _Direct:
    """``_Pending``'s two calls, made on the children at once (multi-process mode)."""

    __slots__ = ()

    @staticmethod
    def inc(child: Any, amount: float = 1) -> None:
        child.inc(amount)

    @staticmethod
    def observe(child: Any, amount: float) -> None:
        child.observe(amount)


_DIRECT = _Direct()  # stateless


def _observe_all(child: Any, amounts: list[float]) -> None:
    """``child.observe(a)`` for each amount, in order, with one update of each value touched.

    Uses the histogram's value holders (``_sum``, ``_buckets``, ``_upper_bounds``) as
    prometheus-client 0.26's ``Histogram.observe`` does; tests pin the result against it."""
    bounds = child._upper_bounds
    counts = [0] * len(bounds)
    total = child._sum.get()
    for amount in amounts:
        total += amount
        if amount == amount:  # NaN falls in no bucket (amount <= bound is false for +Inf too)
            counts[bisect_left(bounds, amount)] += 1
    child._sum.set(total)
    for index, count in enumerate(counts):
        if count:
            child._buckets[index].inc(count)


class _FlushBeforeCollect:
    """Registered first in the registry: every scrape (and ``get_sample_value``) flushes the
    pending increments before the families are read."""

    def __init__(self, flush: Callable[[], None]) -> None:
        self._flush = flush

    def describe(self) -> list[Any]:
        return []  # no metric of its own

    def collect(self) -> list[Any]:
        self._flush()
        return []


class _Family:
    """The metric families, registered once in one registry."""

    def __init__(self, registry: CollectorRegistry, ladder: Iterable[int]) -> None:
        def counter(name: str, doc: str, labels: tuple[str, ...]) -> Counter:
            return Counter(f"repairproxy_{name}", doc, labels, registry=registry)

        def histogram(
            name: str, doc: str, labels: tuple[str, ...], buckets: tuple[float, ...]
        ) -> Histogram:
            return Histogram(f"repairproxy_{name}", doc, labels, registry=registry, buckets=buckets)

        self.ladder = tuple(sorted(set(ladder)))
        self.requests = counter(
            "requests", "Requests by how they ended.", ("model", "api", "outcome")
        )
        self.tool_calls = counter(
            "tool_calls", "Tool calls seen in first answers, text calls included.", ("model",)
        )
        self.tool_call_errors = counter(
            "tool_call_errors",
            "Invalid tool calls: caught in the answer, or met later as an environment error.",
            ("model", "channel", "source"),
        )
        self.hallucinated = counter(
            "hallucinated_tool_calls",
            "Calls of undeclared tools, by the invented name (bounded; the rest are _other).",
            ("model", "tool"),
        )
        # Per model only, so its series exists (at zero) from the model's first request: a rate
        # over the per-name counter above would miss each name's first calls (a new series).
        self.invented_calls = counter(
            "invented_tool_calls",
            "Calls naming an undeclared tool, structured or written as text: the hallucination "
            "rate's numerator (names in hallucinated_tool_calls).",
            ("model",),
        )
        self.repairs = counter(
            "repairs",
            "Repairs of invalid calls by channel and result.",
            ("model", "channel", "result"),
        )
        self.promoted = counter(
            "promoted_tool_calls", "Text calls promoted to structured tool_calls.", ("model",)
        )
        self.promoted_formats = counter(
            "promoted_tool_call_formats",
            "Text calls promoted, by the format they were written in (a model family's native "
            "format: native.FAMILIES, or other).",
            ("model", "format"),
        )
        self.repair_attempts = histogram(
            "repair_attempts",
            "Re-asks per answer that needed repair.",
            ("model",),
            _ATTEMPT_BUCKETS,
        )
        self.repair_tokens = counter(
            "repair_extra_tokens", "Tokens spent in re-asks.", ("model", "kind")
        )
        self.repair_seconds = histogram(
            "repair_extra_seconds",
            "Seconds spent in re-asks per repaired answer.",
            ("model",),
            _SECONDS_BUCKETS,
        )
        self.output_errors = counter(
            "structured_output_errors",
            "Answers that broke the request's response_format (never charged to a budget).",
            ("model", "channel"),
        )
        self.output_repairs = counter(
            "structured_output_repairs",
            "Re-asked structured outputs by result.",
            ("model", "result"),
        )
        self.episodes = counter("episodes", "Episodes started.", ("model",))
        self.over_budget = counter(
            "episodes_over_budget",
            "Episodes whose error count reached k (counted once per episode and k).",
            ("model", "k"),
        )
        self.exhausted = counter(
            "episodes_budget_exhausted", "Episodes that spent their whole error budget.", ("model",)
        )
        self.budget_remaining = histogram(
            "budget_remaining",
            "Errors an episode may still make, observed at each answer.",
            ("model",),
            _REMAINING_BUCKETS,
        )
        self.upstream = histogram(
            "upstream_request_duration_seconds",
            "Seconds waiting on the upstream, re-asks included.",
            ("model",),
            _SECONDS_BUCKETS,
        )
        self.first_byte = histogram(
            "stream_first_byte_seconds",
            "Seconds until the first byte of a streamed answer reached the client.",
            ("model",),
            _SECONDS_BUCKETS,
        )
        self.margin = histogram(
            "tool_name_margin",
            "Log-prob margin between the chosen first token of a tool name and its best rival.",
            ("model",),
            _MARGIN_BUCKETS,
        )
        self.overhead = Histogram(
            "repairproxy_overhead_seconds",
            "Seconds spent in the proxy itself per request (upstream time excluded).",
            registry=registry,
            buckets=_OVERHEAD_BUCKETS,
        )
        self.active_episodes = Gauge(
            "repairproxy_active_episodes", "Episodes the store holds now.", registry=registry
        )
        self.served_model = Gauge(
            "repairproxy_served_model_info",
            "1 for each (model label, model the upstream's answer named) pair seen: which model "
            "answered a client's model string (the dashboard names its cards by it).",
            ("model", "served"),
            registry=registry,
            multiprocess_mode="max",
        )
        self.loop_lag = Histogram(
            "repairproxy_event_loop_lag_seconds",
            "How late the event loop ran a timer due every 50 ms: the time one client's input "
            "held every other client (repairproxy.observe.looplag).",
            registry=registry,
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
        )
        self.loop_lag_max = Gauge(
            "repairproxy_event_loop_lag_max_seconds",
            "The largest event-loop lag seen since start.",
            registry=registry,
            multiprocess_mode="max",
        )
        self.connections_refused = counter(
            "connections_refused",
            "Client connections the server closed before the app saw a request "
            "(max_connections: 503, header_bytes: 431, header_timeout: 408 or a silent close).",
            ("reason",),
        )


class _ModelMetrics:
    """The labelled children of one model label value, created once and then only incremented."""

    def __init__(self, family: _Family, model: str, max_tools: int) -> None:
        self.max_tools = max_tools
        self._family = family
        self._model = model
        self.label = model
        self.served: str | None = None  # the first served model seen under this label
        self.requests = {
            (api, outcome): family.requests.labels(model, api.value, outcome.value)
            for api in API
            for outcome in Outcome
        }
        self.tool_calls = family.tool_calls.labels(model)
        self.invented_calls = family.invented_calls.labels(model)
        self.errors: dict[tuple[str, str], Any] = {}
        for channel in ANSWER_CHANNELS:
            self.errors[channel, "answer"] = family.tool_call_errors.labels(
                model, channel, "answer"
            )
        for channel in ENV_CHANNELS:
            self.errors[channel, "environment"] = family.tool_call_errors.labels(
                model, channel, "environment"
            )
        self.repairs: dict[tuple[str, RepairResultKind], Any] = {
            (channel, result): family.repairs.labels(model, channel, result.value)
            for channel in ANSWER_CHANNELS
            for result in RepairResultKind
        }
        self.hallucinated: dict[str, Any] = {}
        self.hallucinated_other: Any = None
        self.promoted = family.promoted.labels(model)
        self.promoted_formats: dict[str, Any] = {}  # created on first use: 32 labels at most
        self.repair_attempts = family.repair_attempts.labels(model)
        self.prompt_tokens = family.repair_tokens.labels(model, "prompt")
        self.completion_tokens = family.repair_tokens.labels(model, "completion")
        self.repair_seconds = family.repair_seconds.labels(model)
        self.output_errors = {
            channel.value: family.output_errors.labels(model, channel.value)
            for channel in OutputChannel
            if channel is not OutputChannel.VALID
        }
        self.output_repairs = {
            result: family.output_repairs.labels(model, result.value) for result in RepairResultKind
        }
        self.episodes = family.episodes.labels(model)
        self.over_budget = tuple(
            (k, family.over_budget.labels(model, str(k))) for k in family.ladder
        )
        self.exhausted = family.exhausted.labels(model)
        self.budget_remaining = family.budget_remaining.labels(model)
        self.upstream = family.upstream.labels(model)
        self.first_byte = family.first_byte.labels(model)
        self.margin = family.margin.labels(model)

    def error(self, channel: str, source: str) -> Any:
        child = self.errors.get((channel, source))
        if child is None:  # a label outside the known vocabulary (e.g. a custom env table)
            child = self.errors[channel, source] = self._family.tool_call_errors.labels(
                self._model, _label(channel), source
            )
        return child

    def repair(self, channel: str, result: RepairResultKind) -> Any:
        child = self.repairs.get((channel, result))
        if child is None:
            child = self.repairs[channel, result] = self._family.repairs.labels(
                self._model, _label(channel), result.value
            )
        return child

    def invented(self, name: str) -> Any:
        name = _label(name)
        child = self.hallucinated.get(name)
        if child is not None:
            return child
        if len(self.hallucinated) < self.max_tools and name != OTHER:
            child = self.hallucinated[name] = self._family.hallucinated.labels(self._model, name)
            return child
        if self.hallucinated_other is None:
            self.hallucinated_other = self._family.hallucinated.labels(self._model, OTHER)
        return self.hallucinated_other


class Metrics:
    """The proxy's Prometheus metrics; ``request_finished`` is the pipeline's observer call."""

    # Increments made on the children at once, request by request (a subclass may set it).
    _direct = False

    def __init__(self, settings: Settings, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        # Before the families, so a collect sees every request finished before it.
        self.registry.register(_FlushBeforeCollect(self.flush))
        self._pending = _Pending()
        self._pending_lock = threading.Lock()  # request_finished (loop) vs a scrape (any thread)
        self.settings = settings
        self.max_models = max(int(getattr(settings, "max_model_labels", 20)), 1)
        self.max_tools = max(int(getattr(settings, "max_tool_labels", 50)), 1)
        self.ladder: tuple[int, ...] = tuple(getattr(settings, "budget_ladder", (1, 2, 5, 10)))
        self._family = _Family(self.registry, self.ladder)
        self.ladder = self._family.ladder
        self._models: dict[str, _ModelMetrics] = {}
        self._lock = threading.Lock()  # only creating a model's children takes it
        self.max_loop_lag = 0.0

    def dashboard_view(self) -> DashboardSource:
        """What ``/dashboard`` shows: this process's numbers (every worker's when several run)."""
        return self

    def loop_lagged(self, seconds: float) -> None:
        """One sample of the event loop's lag (``repairproxy.observe.looplag``)."""
        family = self._family
        family.loop_lag.observe(seconds)
        if seconds > self.max_loop_lag:
            self.max_loop_lag = seconds
            family.loop_lag_max.set(seconds)

    def connection_refused(self, reason: str) -> None:
        """One connection the server layer refused (``repairproxy.server``); reason is bounded."""
        self._family.connections_refused.labels(reason).inc()

    def bind_active_episodes(self, count: Callable[[], int]) -> None:
        """Read the ``active_episodes`` gauge from ``count`` at each scrape (the store's len)."""
        self._family.active_episodes.set_function(lambda: float(count()))

    def _model(self, name: str | None) -> _ModelMetrics:
        key = UNKNOWN_MODEL if not name else _label(name)
        found = self._models.get(key)
        if found is not None:
            return found
        with self._lock:
            found = self._models.get(key)
            if found is None:
                if len(self._models) >= self.max_models and key != OTHER:
                    key = OTHER
                    found = self._models.get(key)
                if found is None:
                    found = _ModelMetrics(self._family, key, self.max_tools)
                    self._models[key] = found
            return found

    def request_finished(self, record: RequestRecord) -> None:
        m = self._model(record.model)
        if record.served_model is not None and m.served is None:
            m.served = _label(record.served_model)
            self._family.served_model.labels(m.label, m.served).set(1)
        if self._direct:
            self._add(_DIRECT, m, record)
            return
        with self._pending_lock:
            pending = self._pending
            self._add(pending, m, record)
            pending.requests += 1
            if pending.requests >= FLUSH_EVERY:
                self._flush_locked()

    def _add(self, pending: _Pending | _Direct, m: _ModelMetrics, record: RequestRecord) -> None:
        inc, observe = pending.inc, pending.observe
        inc(m.requests[record.api, record.outcome])
        if record.tool_calls:
            inc(m.tool_calls, record.tool_calls)
        for call in record.caught_calls:
            inc(m.error(call.channel, "answer"))
            if call.tool is not None:
                inc(m.invented(call.tool))
                inc(m.invented_calls)
        for label in record.env_errors:
            inc(m.error(label, "environment"))
        for repair in record.repair_results:
            inc(m.repair(repair.channel, repair.result))
        if record.promoted:
            inc(m.promoted, record.promoted)
        for label in record.promoted_formats:
            label = label if label in FAMILIES else "other"
            child = m.promoted_formats.get(label)
            if child is None:
                child = m.promoted_formats[label] = self._family.promoted_formats.labels(
                    m.label, label
                )
            inc(child)
        if record.repair_attempts:
            observe(m.repair_attempts, record.repair_attempts)
            observe(m.repair_seconds, record.repair_seconds)
        elif record.repair_results:
            observe(m.repair_attempts, 0)  # fixed without a re-ask (a promoted text call)
        if record.repair_prompt_tokens:
            inc(m.prompt_tokens, record.repair_prompt_tokens)
        if record.repair_completion_tokens:
            inc(m.completion_tokens, record.repair_completion_tokens)
        if record.output is not None:
            for channel in record.output.caught_channels:
                inc(m.output_errors[channel])
            if record.output.result is not None:
                inc(m.output_repairs[record.output.result])
        episode = record.episode
        if episode is not None:
            if episode.new:
                inc(m.episodes)
            before, after = episode.errors_before, episode.errors_after
            if after > before:
                for k, child in m.over_budget:
                    if before < k <= after:
                        inc(child)
                if episode.budget > 0 and before < episode.budget <= after:
                    inc(m.exhausted)
            observe(m.budget_remaining, episode.remaining)
        if record.outcome is not Outcome.CLIENT_ERROR:
            observe(self._family.overhead, record.overhead_seconds)
        if record.upstream_seconds > 0:
            observe(m.upstream, record.upstream_seconds)
        if record.first_byte_seconds is not None:
            observe(m.first_byte, record.first_byte_seconds)
        for margin in record.tool_name_margins:
            observe(m.margin, margin)

    def flush(self) -> None:
        """Make every pending increment on prometheus-client's children (any thread)."""
        with self._pending_lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        pending, self._pending = self._pending, _Pending()
        pending.apply()

    def exposition(self, accept: str | None) -> tuple[bytes, str]:
        """The scrape body and its content type (OpenMetrics when ``accept`` asks for it)."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type

    def start_server(self, port: int, host: str) -> MetricsServer:
        """Serve ``GET /metrics`` on its own port (``--metrics-port``), in a daemon thread."""
        return MetricsServer.start(self, port, host)


@dataclass
class MetricsServer:
    """A running ``--metrics-port`` server; ``close()`` stops it."""

    server: ThreadingHTTPServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @classmethod
    def start(cls, metrics: Metrics, port: int, host: str) -> MetricsServer:
        key = getattr(metrics.settings, "metrics_api_key", None)
        expected = f"Bearer {key}".encode() if key else None

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return None  # scrapes every few seconds would flood the log

            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] != "/metrics":
                    self._reply(404, b"not found\n", "text/plain; charset=utf-8")
                    return
                if expected is not None:
                    given = self.headers.get("Authorization", "").encode()
                    if not hmac.compare_digest(given, expected):
                        self._reply(401, b"unauthorized\n", "text/plain; charset=utf-8")
                        return
                body, content_type = metrics.exposition(self.headers.get("Accept"))
                self._reply(200, body, content_type)

            def _reply(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        server = ThreadingHTTPServer((host, port), Handler)
        server.daemon_threads = True
        thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
        thread.start()
        return cls(server, thread)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
