"""``GET /dashboard``: the headline numbers per model as one self-refreshing HTML page
(``?snapshot``: the same page to save, without the refresh).

For people without Grafana: hallucination rate, channel mix, repair success, budget ladder and the
invented names, read from the same Prometheus registry the metrics export (counts since the proxy
started). Server-rendered, inline SVG and CSS, no JavaScript.
"""

from __future__ import annotations

import html
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["DashboardSource", "ModelSummary", "Summary", "render_dashboard", "summarize"]


class DashboardSource(Protocol):
    """What the page reads: one process's ``Metrics``, or every worker's samples summed
    (``observe.multiprocess.AggregatedView``)."""

    @property
    def registry(self) -> CollectorRegistry: ...

    @property
    def ladder(self) -> tuple[int, ...]: ...


REFRESH_SECONDS = 5
TOP_NAMES = 10
THIN_MARGIN = 0.5  # nats: margins below this are where quantization flips tool choices
UPSTREAM_TILE = "upstream time, median"
MARGIN_TILE = "thin tool-name margins"
TILE_HINTS = {
    "hallucination rate": (
        "tool calls naming a tool the request did not declare (structured or written as text), "
        "per tool call"
    ),
    "repair success": (
        "repairs that ended in valid calls (promoted, or re-asked and answered with calls), per "
        "repair; a re-ask answered in prose is 'declined', not a success"
    ),
    "re-asks declined": "repairs whose re-ask the model answered in prose: no call, no fix",
    "tool calls": "calls in the model's first answers, text calls included",
    "episodes": "conversations seen (by episode header or conversation chaining)",
    "budget exhausted": "episodes whose error budget reached 0",
    "promoted text calls": "calls the model wrote as text, turned into real tool calls",
    UPSTREAM_TILE: (
        "the histogram bucket holding the median time the upstream took per request (a range: "
        "the page has no exact times)"
    ),
    MARGIN_TILE: (
        f"share of tool names chosen by less than {THIN_MARGIN} nats over the next declared name "
        "(--margin-probe): where quantization flips which tool is called"
    ),
}
_LEGEND = (
    '<p class="legend">Hover a tile for what it counts. Thin margins: the log-probability gap '
    f"between the tool the model named and the nearest other declared tool was under {THIN_MARGIN} "
    "nats. Times are the histogram buckets that hold the median.</p>"
)


@dataclass
class ModelSummary:
    """Counts for one model label since the proxy started."""

    model: str
    served: str | None = None  # the model that answered, as the upstream names it
    requests: dict[str, float] = field(default_factory=dict)  # outcome -> count
    tool_calls: float = 0.0
    errors: dict[tuple[str, str], float] = field(default_factory=dict)  # (source, channel)
    invented: dict[str, float] = field(default_factory=dict)
    repairs: dict[str, float] = field(default_factory=dict)  # result -> count
    promoted: float = 0.0
    episodes: float = 0.0
    over_budget: dict[int, float] = field(default_factory=dict)
    exhausted: float = 0.0
    margins: list[tuple[float, float]] = field(default_factory=list)  # (le, cumulative count)
    upstream: list[tuple[float, float]] = field(default_factory=list)
    asked_as: list[str] = field(default_factory=list)  # the model labels summed into this card

    @property
    def hallucination_rate(self) -> float | None:
        """Every call naming an undeclared tool, the ones written as text included (those are
        caught as ``tool_call_in_content``; the invented-name counter holds them all)."""
        invented = sum(self.invented.values())
        return invented / self.tool_calls if self.tool_calls else None

    @property
    def repair_success(self) -> float | None:
        total = sum(self.repairs.values())
        return self.repairs.get("fixed", 0.0) / total if total else None

    def ladder_share(self, k: int) -> float | None:
        return self.over_budget.get(k, 0.0) / self.episodes if self.episodes else None

    @property
    def thin_margin_share(self) -> float | None:
        total = self.margins[-1][1] if self.margins else 0.0
        if not total:
            return None
        below = max((count for le, count in self.margins if le <= THIN_MARGIN), default=0.0)
        return below / total


@dataclass
class Summary:
    models: dict[str, ModelSummary]
    active_episodes: float
    overhead: list[tuple[float, float]]  # (le, cumulative count)


def _le(value: str) -> float:
    return float("inf") if value == "+Inf" else float(value)


def summarize(metrics: DashboardSource) -> Summary:
    """The registry's current values, grouped per model."""
    models: dict[str, ModelSummary] = {}
    active = 0.0
    overhead: list[tuple[float, float]] = []
    buckets: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)

    def of(labels: dict[str, str]) -> ModelSummary:
        name = labels["model"]
        if name not in models:
            models[name] = ModelSummary(name)
        return models[name]

    for family in metrics.registry.collect():
        for sample in family.samples:
            name, labels, value = sample.name[len("repairproxy_") :], sample.labels, sample.value
            if name == "requests_total":
                summary = of(labels)
                outcome = labels["outcome"]
                summary.requests[outcome] = summary.requests.get(outcome, 0.0) + value
            elif name == "tool_calls_total":
                of(labels).tool_calls = value
            elif name == "tool_call_errors_total":
                of(labels).errors[labels["source"], labels["channel"]] = value
            elif name == "hallucinated_tool_calls_total":
                of(labels).invented[labels["tool"]] = value
            elif name == "repairs_total":
                summary = of(labels)
                result = labels["result"]
                summary.repairs[result] = summary.repairs.get(result, 0.0) + value
            elif name == "promoted_tool_calls_total":
                of(labels).promoted = value
            elif name == "episodes_total":
                of(labels).episodes = value
            elif name == "episodes_over_budget_total":
                of(labels).over_budget[int(labels["k"])] = value
            elif name == "episodes_budget_exhausted_total":
                of(labels).exhausted = value
            elif name == "served_model_info" and value:
                of(labels).served = labels["served"]
            elif name == "active_episodes":
                active = value
            elif name == "overhead_seconds_bucket":
                overhead.append((_le(labels["le"]), value))
            elif name in ("tool_name_margin_bucket", "upstream_request_duration_seconds_bucket"):
                buckets[name, labels["model"]].append((_le(labels["le"]), value))
    for (name, model), points in buckets.items():
        if model in models:
            target = "margins" if name.startswith("tool_name") else "upstream"
            setattr(models[model], target, sorted(points))
    return Summary(_by_served_model(models), active, sorted(overhead))


def _by_served_model(models: dict[str, ModelSummary]) -> dict[str, ModelSummary]:
    """One card per model that answered: labels that clients spelled differently ("anything",
    "x") but the same upstream model served are summed under the served name."""
    groups: dict[str, list[ModelSummary]] = {}
    for summary in models.values():
        groups.setdefault(summary.served or summary.model, []).append(summary)
    return {name: _merged(name, parts) for name, parts in groups.items()}


def _sum_into(target: dict[Any, float], source: dict[Any, float]) -> None:
    for key, value in source.items():
        target[key] = target.get(key, 0.0) + value


def _sum_buckets(parts: list[list[tuple[float, float]]]) -> list[tuple[float, float]]:
    total: dict[float, float] = {}
    for points in parts:
        _sum_into(total, dict(points))
    return sorted(total.items())


def _merged(name: str, parts: list[ModelSummary]) -> ModelSummary:
    if len(parts) == 1 and parts[0].model == name:
        return parts[0]
    out = ModelSummary(name, served=parts[0].served)
    out.asked_as = sorted(part.model for part in parts)
    for part in parts:
        for mine, theirs in (
            (out.requests, part.requests),
            (out.errors, part.errors),
            (out.invented, part.invented),
            (out.repairs, part.repairs),
            (out.over_budget, part.over_budget),
        ):
            _sum_into(mine, theirs)
        out.tool_calls += part.tool_calls
        out.promoted += part.promoted
        out.episodes += part.episodes
        out.exhausted += part.exhausted
    out.margins = _sum_buckets([part.margins for part in parts])
    out.upstream = _sum_buckets([part.upstream for part in parts])
    return out


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus' histogram_quantile over cumulative (le, count) buckets."""
    if not buckets or buckets[-1][1] == 0:
        return None
    rank = q * buckets[-1][1]
    lower_le, lower_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if le == float("inf"):
                return lower_le
            if count == lower_count:
                return le
            return lower_le + (le - lower_le) * (rank - lower_count) / (count - lower_count)
        lower_le, lower_count = le, count
    return None


# --- rendering ---------------------------------------------------------------------------------

_CSS = """
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1f2328;
background:#f6f8fa}
h1{font-size:20px;margin:0 0 4px}h2{font-size:17px;margin:0 0 12px}
h3{font-size:13px;margin:14px 0 6px;
color:#57606a;text-transform:uppercase;letter-spacing:.04em}
.sub{color:#57606a;margin:0 0 18px}
.legend{color:#57606a;font-size:12px;margin:4px 0 12px}
.model{background:#fff;border:1px solid #d0d7de;border-radius:8px;padding:16px 18px;margin:0 0 18px}
.tiles{display:flex;gap:12px;flex-wrap:wrap;margin:0 0 14px}
.tile{border:1px solid #d0d7de;border-radius:6px;padding:8px 10px;min-width:90px}
.tile b{display:block;font-size:24px}.tile span{color:#57606a;font-size:12px}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(300px,1fr));gap:18px}
table{border-collapse:collapse;width:100%}td,th{text-align:left;padding:3px 6px;
border-bottom:1px solid #eaeef2}td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
.bad b{color:#cf222e}.good b{color:#1a7f37}.none{color:#8c959f}
"""


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def _num(value: float) -> str:
    return f"{value:,.0f}"


def _ms(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value * 1000:.0f} ms" if value >= 0.01 else f"{value * 1000:.2f} ms"


def _tile(label: str, value: str, tone: str = "") -> str:
    text = f"<b>{html.escape(value)}</b><span>{html.escape(label)}</span>"
    hint = html.escape(TILE_HINTS.get(label, ""), quote=True)
    return f'<div class="tile {tone}" title="{hint}">{text}</div>'


def _bars(rows: list[tuple[str, float, str]], scale: float, color: str) -> str:
    """Horizontal bars: (label, value, text) with ``value / scale`` of the width."""
    if not rows:
        return '<p class="none">nothing yet</p>'
    height, width, label_w = 22, 420, 160
    parts = [
        f'<svg role="img" width="100%" viewBox="0 0 {width} {height * len(rows)}" '
        f'xmlns="http://www.w3.org/2000/svg" font-size="12">'
    ]
    for i, (label, value, text) in enumerate(rows):
        y = i * height
        bar = 0.0 if scale <= 0 else (width - label_w - 70) * min(value / scale, 1.0)
        parts.append(
            f'<text x="0" y="{y + 15}" fill="#1f2328">{html.escape(label)}</text>'
            f'<rect x="{label_w}" y="{y + 4}" width="{bar:.1f}" height="14" rx="2" fill="{color}"/>'
            f'<text x="{label_w + bar + 6:.1f}" y="{y + 15}" fill="#57606a">'
            f"{html.escape(text)}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _ladder(summary: ModelSummary, ladder: tuple[int, ...]) -> str:
    """Vertical bars: the share of episodes a budget of k would already have ended."""
    if not summary.episodes:
        return '<p class="none">no episodes yet</p>'
    width, height, top, bottom = 420, 170, 18, 22
    step = width / max(len(ladder), 1)
    parts = [
        f'<svg role="img" width="100%" viewBox="0 0 {width} {height}" '
        f'xmlns="http://www.w3.org/2000/svg" font-size="12" text-anchor="middle">'
        f'<line x1="0" y1="{height - bottom}" x2="{width}" y2="{height - bottom}" '
        'stroke="#d0d7de"/>'
    ]
    for i, k in enumerate(ladder):
        share = summary.ladder_share(k) or 0.0
        bar = (height - top - bottom) * share
        x = i * step + step * 0.2
        parts.append(
            f'<rect x="{x:.1f}" y="{height - bottom - bar:.1f}" width="{step * 0.6:.1f}" '
            f'height="{bar:.1f}" rx="2" fill="#bc4c00"/>'
            f'<text x="{x + step * 0.3:.1f}" y="{height - bottom - bar - 4:.1f}" fill="#1f2328">'
            f"{_pct(share)}</text>"
            f'<text x="{x + step * 0.3:.1f}" y="{height - 6}" fill="#57606a">k = {k}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _asked_as(summary: ModelSummary) -> str:
    if not summary.asked_as:
        return ""
    names = ", ".join(f"<code>{html.escape(name)}</code>" for name in summary.asked_as)
    return f'<p class="sub">served model; clients asked for {names}</p>'


def _names(summary: ModelSummary) -> str:
    top = sorted(summary.invented.items(), key=lambda item: (-item[1], item[0]))[:TOP_NAMES]
    if not top:
        return '<p class="none">no invented names yet</p>'
    rows = "".join(
        f'<tr><td><code>{html.escape(name)}</code></td><td class="n">{_num(count)}</td></tr>'
        for name, count in top
    )
    return f'<table><tr><th>name</th><th class="n">calls</th></tr>{rows}</table>'


def _model_section(summary: ModelSummary, ladder: tuple[int, ...]) -> str:
    rate = summary.hallucination_rate
    success = summary.repair_success
    tiles = "".join(
        [
            _tile("hallucination rate", _pct(rate), "bad" if rate else ""),
            _tile("repair success", _pct(success), "good" if success else ""),
            _tile("tool calls", _num(summary.tool_calls)),
            _tile("episodes", _num(summary.episodes)),
            _tile("budget exhausted", _num(summary.exhausted)),
            _tile("promoted text calls", _num(summary.promoted)),
            _tile("re-asks declined", _num(summary.repairs.get("declined", 0.0))),
            _tile(UPSTREAM_TILE, median_bucket(summary.upstream)),
            _tile(MARGIN_TILE, _pct(summary.thin_margin_share)),
        ]
    )
    calls = summary.tool_calls
    # env_* channels are the environment's answers; the others were caught in the model's answer.
    channel_rows = [
        (channel, count, f"{_num(count)} · {_pct(count / calls if calls else None)}")
        for (_, channel), count in sorted(summary.errors.items(), key=lambda item: -item[1])
        if count
    ]
    channel_scale = max((count for _, count, _ in channel_rows), default=0.0)
    outcome_rows = [
        (outcome, count, _num(count))
        for outcome, count in sorted(summary.requests.items(), key=lambda item: -item[1])
        if count
    ]
    repair_rows = [
        (result, count, _num(count))
        for result, count in sorted(summary.repairs.items(), key=lambda item: -item[1])
        if count
    ]
    outcome_scale = max((count for _, count, _ in outcome_rows), default=0.0)
    repair_scale = max((count for _, count, _ in repair_rows), default=0.0)
    return (
        f'<section class="model"><h2>{html.escape(summary.model)}</h2>{_asked_as(summary)}'
        f'<div class="tiles">{tiles}</div>{_LEGEND}<div class="grid">'
        f"<div><h3>Channel mix (errors per tool call)</h3>"
        f"{_bars(channel_rows, channel_scale, '#cf222e')}"
        f"<h3>Repairs</h3>{_bars(repair_rows, repair_scale, '#1a7f37')}</div>"
        f"<div><h3>Budget ladder: episodes a budget of k would have ended</h3>"
        f"{_ladder(summary, ladder)}</div>"
        f"<div><h3>Top invented tool names</h3>{_names(summary)}"
        f"<h3>Request outcomes</h3>{_bars(outcome_rows, outcome_scale, '#0969da')}</div>"
        "</div></section>"
    )


def median_bucket(buckets: list[tuple[float, float]]) -> str:
    """The bucket that holds the median, as a range (``30–60 s``): buckets hold no exact
    values, and an interpolated point inside one reads as a measurement."""
    if not buckets or buckets[-1][1] == 0:
        return "–"
    rank = 0.5 * buckets[-1][1]
    lower = 0.0
    for le, count in buckets:
        if count >= rank:
            if le == float("inf"):
                return f"> {_seconds(lower)}"
            return f"{_seconds(lower)}–{_seconds(le)}"
        lower = le
    return "–"


def _seconds(value: float) -> str:
    return f"{value:g} s" if value >= 1 else f"{value * 1000:g} ms"


def render_dashboard(
    metrics: DashboardSource, *, now: float | None = None, snapshot: bool = False
) -> bytes:
    """The whole page, encoded; live, it reloads itself every few seconds; ``snapshot`` (the
    page saved to a file, ``/dashboard?snapshot``) carries no refresh and says it is one."""
    summary = summarize(metrics)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(time.time() if now is None else now))
    sections = "".join(
        _model_section(model, metrics.ladder)
        for model in summary.models.values()
        if sum(model.requests.values())
    )
    if not sections:
        sections = '<p class="none">No requests yet.</p>'
    overhead = (
        f"proxy overhead p50 {_ms(quantile(0.5, summary.overhead))}, "
        f"p99 {_ms(quantile(0.99, summary.overhead))}"
    )
    refresh = "" if snapshot else f'<meta http-equiv="refresh" content="{REFRESH_SECONDS}">'
    kind = "a snapshot: it does not refresh" if snapshot else f"refreshes every {REFRESH_SECONDS} s"
    title = "snapshot" if snapshot else "live"
    page = (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"{refresh}"
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>repairproxy dashboard</title><style>{_CSS}</style></head><body>"
        f"<h1>repairproxy: {title} tool-call diagnostics</h1>"
        f'<p class="sub">Since the proxy started · {html.escape(stamp)} · '
        f"active episodes {_num(summary.active_episodes)} · {overhead} · "
        f"{kind}</p>{sections}</body></html>"
    )
    return page.encode()
