"""The /dashboard page: numbers read back from the registry, the HTML, and headless Chromium."""

from __future__ import annotations

import re
import struct
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from repairproxy.observe.dashboard import median_bucket, quantile, render_dashboard, summarize
from repairproxy.observe.metrics import Metrics
from repairproxy.observe.record import CaughtCall, RepairResult, RepairResultKind, RequestRecord
from repairproxy.settings import Settings
from tests.support.chromium import chromium_binary, dump_dom, screenshot, serving
from tests.support.metrics_workload import Truth, scripted_workload
from tests.support.proxy_server import running_proxy
from tests.support.scripted_upstream import ScriptedUpstream

MODEL = "qwen2.5-7b-instruct-awq"


def fed() -> Metrics:
    metrics = Metrics(Settings())
    metrics.bind_active_episodes(lambda: 5)
    for record in scripted_workload(MODEL):
        metrics.request_finished(record)
    return metrics


def test_summary_equals_the_truth() -> None:
    truth = Truth()
    summary = summarize(fed())
    assert summary.active_episodes == 5
    model = summary.models[MODEL]
    assert model.hallucination_rate == truth.hallucination_rate
    assert model.repair_success == truth.repairs_fixed / (
        truth.repairs_fixed + truth.repairs_failed
    )
    assert {k: model.ladder_share(k) for k in truth.over_budget} == {
        k: n / truth.episodes for k, n in truth.over_budget.items()
    }
    assert model.invented == {name: float(n) for name, n in truth.invented_by_name.items()}
    assert model.exhausted == truth.exhausted
    assert model.thin_margin_share == 5 / 40  # episode 0's margins are 0.5, the rest larger


def test_page_shows_the_headline_numbers() -> None:
    page = render_dashboard(fed(), now=0).decode()
    assert '<meta http-equiv="refresh" content="5">' in page
    assert "<script" not in page and page.count("<svg") >= 4
    assert "1970-01-01 00:00:00 UTC" in page
    text = re.sub(r"<[^>]+>", " ", page)
    assert re.search(r"25\.0%\s+hallucination rate", text)
    assert re.search(r"83\.3%\s+repair success", text)
    assert re.search(r"75\.0%.*k = 1.*37\.5%.*k = 2", text)
    assert re.search(r"lookup_order\s+4\s+find_user\s+3\s+cancel\s+2\s+refund_all\s+1", text)
    assert re.search(r"unknown_tool\s+10 · 25\.0%", text)


def test_an_invented_name_written_as_text_counts_as_hallucinated_and_a_decline_is_no_success() -> (
    None
):
    """One meaning per tile: a text call to ``lookup_order`` is caught as
    ``tool_call_in_content``, and it names an undeclared tool all the same; a re-ask the model
    answered in prose is ``declined``, not a repair success."""
    metrics = Metrics(Settings())
    text_call = [CaughtCall("tool_call_in_content", form="text", tool="lookup_order")]
    declined = [RepairResult("tool_call_in_content", RepairResultKind.DECLINED)]
    fixed = [RepairResult("tool_call_in_content", RepairResultKind.FIXED)]
    for repairs in (declined, fixed):
        metrics.request_finished(
            RequestRecord(model="m", tool_calls=1, caught_calls=text_call, repair_results=repairs)
        )
    [model] = summarize(metrics).models.values()
    assert model.hallucination_rate == 1.0
    assert model.repair_success == 0.5
    text = re.sub(r"<[^>]+>", " ", render_dashboard(metrics).decode())
    assert re.search(r"100\.0%\s+hallucination rate", text)
    assert re.search(r"50\.0%\s+repair success", text)
    assert re.search(r"\b1\s+re-asks declined", text)


def test_the_snapshot_says_it_is_one_and_does_not_refresh() -> None:
    live = render_dashboard(fed(), now=0).decode()
    saved = render_dashboard(fed(), now=0, snapshot=True).decode()
    assert 'http-equiv="refresh"' in live and "refreshes every" in live
    assert 'http-equiv="refresh"' not in saved and "refreshes" not in saved
    assert "a snapshot: it does not refresh" in saved


def test_the_upstream_median_is_shown_as_its_bucket_not_a_made_up_point() -> None:
    """Answers of 22-35 s all fall in one bucket: the page says that bucket, not a point in it."""
    metrics = Metrics(Settings())
    for seconds in (22.0, 30.0, 35.0):
        metrics.request_finished(RequestRecord(model="m", upstream_seconds=seconds))
    [model] = summarize(metrics).models.values()
    assert median_bucket(model.upstream) == "20 s–40 s"
    text = re.sub(r"<[^>]+>", " ", render_dashboard(metrics).decode())
    assert re.search(r"20 s–40 s\s+upstream time, median", text)


def test_page_escapes_what_clients_and_models_named() -> None:
    metrics = Metrics(Settings())
    caught = [CaughtCall("unknown_tool", tool="<img src=x onerror=alert(1)>")]
    metrics.request_finished(
        RequestRecord(model="<script>m</script>", tool_calls=1, caught_calls=caught)
    )
    page = render_dashboard(metrics).decode()
    assert "<script>" not in page and "<img" not in page
    assert "&lt;script&gt;m&lt;/script&gt;" in page and "&lt;img src=x" in page


def test_empty_page() -> None:
    page = render_dashboard(Metrics(Settings())).decode()
    assert "No requests yet." in page


@pytest.mark.parametrize(
    ("q", "buckets", "expected"),
    [
        (0.5, [(1.0, 0.0), (2.0, 10.0), (float("inf"), 10.0)], 1.5),
        (0.99, [(0.002, 50.0), (0.005, 100.0), (float("inf"), 100.0)], 0.00494),
        (0.5, [(1.0, 0.0), (float("inf"), 4.0)], 1.0),  # in the +Inf bucket: its lower bound
        (0.5, [(1.0, 0.0), (float("inf"), 0.0)], None),
    ],
)
def test_quantile_follows_prometheus(
    q: float, buckets: list[tuple[float, float]], expected: float | None
) -> None:
    assert quantile(q, buckets) == (expected if expected is None else pytest.approx(expected))


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def test_headless_chromium_renders_the_page(tmp_path: Path) -> None:
    if chromium_binary() is None:
        pytest.skip("chromium is not installed (Debian package: apt-get install chromium)")
    metrics = fed()
    with serving(lambda: render_dashboard(metrics)) as url:
        dom = dump_dom(url)
        shot = tmp_path / "dashboard.png"
        screenshot(url, shot, width=1280, height=900)
    text = re.sub(r"<[^>]+>", " ", dom)
    assert re.search(r"25\.0%\s+hallucination rate", text)
    assert "lookup_order" in text and "k = 10" in text
    assert _png_size(shot) == (1280, 900)
    assert shot.stat().st_size > 20_000  # a blank page compresses to a few kB


def _status(url: str, key: str | None = None) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        exc.close()
        return int(exc.code)


def test_proxy_serves_the_page_and_metrics_with_their_keys() -> None:
    with ScriptedUpstream() as upstream:
        settings = Settings(upstream=upstream.base_url, api_keys=("client",), metrics_api_key="m")
        with running_proxy(settings) as proxy:
            page, metrics = f"{proxy.root_url}/dashboard", f"{proxy.root_url}/metrics"
            # Every tenant's numbers: the metrics key, never a client key (test_tenancy_credentials)
            assert (_status(page), _status(page, "client"), _status(page, "m")) == (401, 401, 200)
            assert (_status(metrics), _status(metrics, "client"), _status(metrics, "m")) == (
                401,
                401,
                200,
            )
        with running_proxy(Settings(upstream=upstream.base_url)) as proxy:
            assert _status(f"{proxy.root_url}/metrics") == 200  # open by default
            assert _status(f"{proxy.root_url}/dashboard") == 200


def test_cards_are_named_by_the_served_model_and_tiles_explain_themselves() -> None:
    metrics = Metrics(Settings())
    for asked in ("anything", "x"):
        for record in scripted_workload(asked):
            record.served_model = MODEL  # what the upstream's answers name
            metrics.request_finished(record)
    summary = summarize(metrics)
    assert list(summary.models) == [MODEL]  # one card, not one per client spelling
    card = summary.models[MODEL]
    assert card.asked_as == ["anything", "x"]
    assert card.hallucination_rate == Truth().hallucination_rate  # sums keep the ratio
    assert card.tool_calls == 2 * summarize(fed()).models[MODEL].tool_calls
    page = render_dashboard(metrics, now=0).decode()
    assert f"<h2>{MODEL}</h2>" in page and "clients asked for" in page
    assert 'title="tool calls naming a tool the request did not declare' in page
    assert "(buckets)" not in page and "nats</span>" not in page
    assert 'class="legend"' in page
