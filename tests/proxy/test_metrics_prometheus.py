"""The dashboard's and the alerts' PromQL, evaluated by a real Prometheus on a scripted workload.

A ``Metrics`` fed the workload of ``tests/support/metrics_workload.py`` (known truth) is served on
its own port; Prometheus scrapes it every second. Every expression of
``grafana/dashboards/repairproxy.json`` and every alert signal (the expression without its final
comparison) must parse and return data, and the headline ones must equal the truth.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from repairproxy.observe.metrics import Metrics
from repairproxy.settings import Settings
from repairproxy.types import RepairMode
from tests.support.metrics_workload import Truth, scripted_workload, warmup_record
from tests.support.prometheus import Prometheus, prometheus_binary, running_prometheus

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "grafana" / "dashboards" / "repairproxy.json"
ALERTS = ROOT / "grafana" / "alerts.yaml"
MODEL = "qwen2.5-7b-instruct-awq"
# Grafana's variables as a range query over the whole test would set them.
VARIABLES = {
    "$__rate_interval": "1h",
    "$__range": "1h",
    "$__interval": "15s",
    "$model": ".*",
    "$instance": ".*",
}
_FINAL_COMPARISON = re.compile(r"\s*(>|<|>=|<=|==|!=)\s*-?[0-9.]+(e[+-]?[0-9]+)?\s*$")


def substitute(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, expr
    return expr


def signal(alert_expr: str) -> str:
    """An alert expression without its final ``> threshold``."""
    stripped = _FINAL_COMPARISON.sub("", alert_expr.strip())
    assert stripped != alert_expr.strip(), f"no final comparison in {alert_expr}"
    return stripped


def dashboard_targets() -> list[tuple[str, str]]:
    """(panel title, expr) for every query of every panel."""
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]


def panel_expr(title: str) -> str:
    found = [expr for panel_title, expr in dashboard_targets() if panel_title == title]
    assert len(found) == 1, (title, found)
    return substitute(found[0])


def alert_exprs() -> dict[str, str]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return {rule["alert"]: rule["expr"] for group in groups for rule in group["rules"]}


def by_labels(result: list[dict[str, Any]], *labels: str) -> dict[tuple[str, ...], float]:
    return {
        tuple(sample["metric"].get(label, "") for label in labels): float(sample["value"][1])
        for sample in result
    }


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prometheus, float]]:
    """Prometheus after scraping the workload; the time of its last scrape (evaluate there)."""
    prometheus_binary()
    metrics = Metrics(Settings())
    metrics.bind_active_episodes(lambda: 3)
    # The model's series exist at zero before the load, as after its first request in production.
    metrics.request_finished(warmup_record(MODEL))
    server = metrics.start_server(0, "127.0.0.1")
    workdir = tmp_path_factory.mktemp("prometheus")
    try:
        with running_prometheus([f"127.0.0.1:{server.port}"], workdir, [ALERTS]) as prom:
            prom.wait_for(
                "count_over_time(repairproxy_tool_calls_total[1h])",
                lambda r: bool(r) and float(r[0]["value"][1]) >= 2,
            )
            for record in scripted_workload(MODEL):
                metrics.request_finished(record)
            truth = Truth()
            prom.wait_for(
                "repairproxy_tool_calls_total",
                lambda r: bool(r) and float(r[0]["value"][1]) == truth.tool_calls,
            )
            stamp = prom.query(f'timestamp(repairproxy_tool_calls_total{{model="{MODEL}"}})')
            yield prom, float(stamp[0]["value"][1])
    finally:
        server.close()


def test_every_dashboard_expression_parses_and_returns_data(
    scraped: tuple[Prometheus, float],
) -> None:
    prom, at = scraped
    targets = dashboard_targets()
    assert len(targets) >= 20
    for title, expr in targets:
        result = prom.query(substitute(expr), at=at)
        assert result, f"{title}: no data for {expr}"


def test_template_variable_queries_return_values(scraped: tuple[Prometheus, float]) -> None:
    prom, at = scraped
    variables = json.loads(DASHBOARD.read_text())["templating"]["list"]
    for variable in variables:
        match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variable["definition"])
        assert match, variable["definition"]
        result = prom.query(substitute(match.group(1)), at=at)
        assert {sample["metric"][match.group(2)] for sample in result}, variable["name"]
    models = prom.query(substitute("repairproxy_requests_total"), at=at)
    assert {sample["metric"]["model"] for sample in models} == {MODEL}


def test_every_alert_signal_parses_and_returns_data(scraped: tuple[Prometheus, float]) -> None:
    prom, at = scraped
    for name, expr in alert_exprs().items():
        assert prom.query(signal(expr), at=at), f"{name}: no data"
    rules = prom.api("rules")["groups"][0]["rules"]
    assert {rule["name"] for rule in rules} == set(alert_exprs())
    assert all(rule["health"] != "err" for rule in rules), rules


def test_headline_numbers_equal_the_truth(scraped: tuple[Prometheus, float]) -> None:
    prom, at = scraped
    truth = Truth()

    def per_model(title: str) -> float:
        values = by_labels(prom.query(panel_expr(title), at=at), "model")
        return values[(MODEL,)]

    for title in ("Hallucination rate", "Hallucination rate over time"):
        assert per_model(title) == pytest.approx(truth.hallucination_rate, abs=1e-9)
    fixed, failed = truth.repairs_fixed, truth.repairs_failed
    for title in ("Repair success rate", "Repair success rate over time"):
        assert per_model(title) == pytest.approx(fixed / (fixed + failed), abs=1e-9)
    assert per_model("Repairs fixed") == pytest.approx(fixed, abs=1e-9)
    assert per_model("Episodes started") == pytest.approx(truth.episodes, abs=1e-9)
    title = "Budget ladder: share of episodes a budget of k would have ended"
    share = by_labels(prom.query(panel_expr(title), at=at), "model", "k")
    over = by_labels(prom.query(panel_expr("Episodes over k"), at=at), "model", "k")
    for k, count in truth.over_budget.items():
        assert over[MODEL, str(k)] == pytest.approx(count, abs=1e-9)
        assert share[MODEL, str(k)] == pytest.approx(count / truth.episodes, abs=1e-9)
    names = by_labels(
        prom.query(panel_expr("Top hallucinated tool names (since proxy start)"), at=at), "tool"
    )
    assert names == {(name,): float(n) for name, n in truth.invented_by_name.items()}
    active = prom.query(panel_expr("Active episodes"), at=at)
    assert float(active[0]["value"][1]) == 3
    rate = by_labels(
        prom.query(signal(alert_exprs()["RepairproxyHallucinationRateHigh"]), at=at), "model"
    )
    assert rate[(MODEL,)] == pytest.approx(truth.hallucination_rate, abs=1e-9)


def test_a_broken_expression_is_caught(scraped: tuple[Prometheus, float]) -> None:
    """The checks above would notice a typo: Prometheus refuses what does not parse."""
    prom, at = scraped
    with pytest.raises(OSError):  # urllib's HTTPError (400 bad_data) is an OSError
        prom.query("sum by (model) (rate(repairproxy_tool_calls_total[1h])", at=at)
    assert prom.query("repairproxy_no_such_metric_total", at=at) == []


# --- end to end: the real proxy in front of the scripted upstream ------------------------------

E2E_MODEL = "scripted-model"
E2E_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_order_details",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}},
                "required": ["order_id"],
            },
        },
    }
]
# Per episode, the invented names of its five first answers (None: a valid call), and whether the
# re-ask fixes them: 40 calls, 10 invented, over 8 episodes (plus a warm-up episode without calls).
# Episode 4's first call comes back from the environment as an error (seen in its second request).
ENV_ERROR = "Error: get_order_details() missing 1 required positional argument: 'order_id'"
E2E_EPISODES: list[list[tuple[str, bool] | None]] = [
    [("lookup_order", True)] * 2 + [("lookup_order", False)] * 2 + [None],
    [("find_user", True)] * 3 + [None] * 2,
    [("cancel", True)] * 2 + [None] * 3,
    [("refund_all", True)] + [None] * 4,
    [None] * 5,
    [None] * 5,
    [None] * 5,
    [None] * 5,
]


@pytest.fixture(scope="module")
def proxied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prometheus, float, str]]:
    """Prometheus scraping the real proxy's /metrics after the workload; (prom, time, proxy url)."""
    prometheus_binary()
    import httpx

    from tests.support.proxy_server import running_proxy
    from tests.support.scripted_upstream import ScriptedUpstream, completion, tool_call

    valid = tool_call("get_order_details", {"order_id": "#W1"})
    env_call = tool_call("get_order_details", {"order_id": "#W1"}, call_id="call_env")
    with ScriptedUpstream() as upstream:
        settings = Settings(
            upstream=upstream.base_url, repair=RepairMode.REFLEXIVE, max_repairs=1, budget=3
        )
        with running_proxy(settings) as proxy, httpx.Client(base_url=proxy.root_url) as client:

            def ask(episode: str, turn: int) -> None:
                messages: list[dict[str, Any]] = [
                    {"role": "user", "content": f"episode {episode}, turn {turn}"}
                ]
                if episode == "episode-4" and turn == 1:  # the environment refused turn 0's call
                    messages += [
                        {"role": "assistant", "content": None, "tool_calls": [env_call]},
                        {"role": "tool", "tool_call_id": "call_env", "content": ENV_ERROR},
                    ]
                body = {"model": E2E_MODEL, "messages": messages, "tools": E2E_TOOLS}
                reply = client.post(
                    "/v1/chat/completions", json=body, headers={"x-episode-id": episode}
                )
                assert reply.status_code == 200, reply.text

            upstream.push(completion(content="Hello, how can I help?", model=E2E_MODEL))
            ask("warm-up", 0)
            workdir = tmp_path_factory.mktemp("prometheus-e2e")
            with running_prometheus([f"127.0.0.1:{proxy.port}"], workdir, [ALERTS]) as prom:
                prom.wait_for(
                    "count_over_time(repairproxy_tool_calls_total[1h])",
                    lambda r: bool(r) and float(r[0]["value"][1]) >= 2,
                )
                for number, steps in enumerate(E2E_EPISODES):
                    for turn, step in enumerate(steps):
                        if step is None:
                            first = env_call if (number, turn) == (4, 0) else valid
                            upstream.push(completion(tool_calls=[first], model=E2E_MODEL))
                        else:
                            name, fixed = step
                            invented = tool_call(name, {"order_id": "#W1"})
                            again = valid if fixed else tool_call(name, {"order_id": "#W1"})
                            upstream.push(
                                completion(tool_calls=[invented], model=E2E_MODEL),
                                completion(tool_calls=[again], model=E2E_MODEL),
                            )
                        ask(f"episode-{number}", turn)
                assert upstream.pending == 0
                prom.wait_for(
                    "sum(repairproxy_requests_total)",
                    lambda r: bool(r) and float(r[0]["value"][1]) == 41,
                )
                stamp = prom.query(
                    f'timestamp(repairproxy_tool_calls_total{{model="{E2E_MODEL}"}})'
                )
                yield prom, float(stamp[0]["value"][1]), proxy.root_url


def test_end_to_end_dashboard_and_alerts_through_the_proxy(
    proxied: tuple[Prometheus, float, str],
) -> None:
    prom, at, _ = proxied
    for title, expr in dashboard_targets():
        assert prom.query(substitute(expr), at=at), f"{title}: no data for {expr}"
    for name, expr in alert_exprs().items():
        assert prom.query(signal(expr), at=at), f"{name}: no data"

    def per_model(title: str, *labels: str) -> dict[tuple[str, ...], float]:
        result = by_labels(prom.query(panel_expr(title), at=at), "model", *labels)
        return {key[1:]: value for key, value in result.items() if key[0] == E2E_MODEL}

    assert per_model("Hallucination rate")[()] == pytest.approx(0.25, abs=1e-9)
    assert per_model("Repairs fixed")[()] == pytest.approx(8, abs=1e-9)
    assert per_model("Repair success rate")[()] == pytest.approx(8 / 10, abs=1e-9)
    # Errors per episode as they would have been without the proxy: 4, 3, 2, 1, 1, then none.
    over = per_model("Episodes over k", "k")
    assert {k: over[(k,)] for k in ("1", "2", "5", "10")} == {"1": 5, "2": 3, "5": 0, "10": 0}
    errors = per_model("Per-channel error rates by source", "source", "channel")
    assert errors[("environment", "env_argument_error")] == pytest.approx(1 / 40, abs=1e-9)
    assert errors[("answer", "unknown_tool")] == pytest.approx(10 / 40, abs=1e-9)
    assert errors[("environment", "env_unknown_tool")] == 0
    names = by_labels(
        prom.query(panel_expr("Top hallucinated tool names (since proxy start)"), at=at), "tool"
    )
    assert names == {("lookup_order",): 4, ("find_user",): 3, ("cancel",): 2, ("refund_all",): 1}


def test_end_to_end_episodes_counted_once(proxied: tuple[Prometheus, float, str]) -> None:
    prom, at, _ = proxied
    started = by_labels(prom.query(panel_expr("Episodes started"), at=at), "model")
    assert started[(E2E_MODEL,)] == pytest.approx(9, abs=1e-9)  # eight and the warm-up
    title = "Budget ladder: share of episodes a budget of k would have ended"
    share = by_labels(prom.query(panel_expr(title), at=at), "model", "k")
    assert share[E2E_MODEL, "2"] == pytest.approx(3 / 9, abs=1e-9)


def test_end_to_end_dashboard_page(proxied: tuple[Prometheus, float, str]) -> None:
    import urllib.request

    _, _, root = proxied
    with urllib.request.urlopen(f"{root}/dashboard", timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/html")
        text = re.sub(r"<[^>]+>", " ", response.read().decode())
    assert re.search(r"25\.0%\s+hallucination rate", text)
    assert re.search(r"80\.0%\s+repair success", text)
    assert re.search(r"lookup_order\s+4\s+find_user\s+3", text)
