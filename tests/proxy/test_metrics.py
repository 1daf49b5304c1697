"""Metrics fed RequestRecords: exact values for a workload with known truth, bounded labels."""

from __future__ import annotations

import math
import threading
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.parser import text_string_to_metric_families

from repairproxy.observe.metrics import FLUSH_EVERY, OTHER, UNKNOWN_MODEL, Metrics
from repairproxy.observe.record import CaughtCall, EpisodeRecord, RequestRecord
from repairproxy.settings import Settings
from repairproxy.types import API, Outcome
from tests.support.metrics_workload import Truth, scripted_workload

MODEL = "qwen2.5-7b-awq"


def fed(settings: Settings | None = None) -> Metrics:
    metrics = Metrics(settings or Settings())
    for record in scripted_workload(MODEL):
        metrics.request_finished(record)
    return metrics


def value(metrics: Metrics, name: str, **labels: str) -> float:
    found = metrics.registry.get_sample_value(f"repairproxy_{name}", labels)
    assert found is not None, (name, labels)
    return found


def label_values(metrics: Metrics, sample: str, label: str) -> set[str]:
    return {
        s.labels[label]
        for family in metrics.registry.collect()
        for s in family.samples
        if s.name == sample
    }


def test_workload_counts_equal_the_truth() -> None:
    truth, m = Truth(), fed()
    assert value(m, "tool_calls_total", model=MODEL) == truth.tool_calls
    for channel, count in truth.answer_errors.items():
        got = value(m, "tool_call_errors_total", model=MODEL, channel=channel, source="answer")
        assert got == count
    env = value(
        m, "tool_call_errors_total", model=MODEL, channel="env_argument_error", source="environment"
    )
    assert env == truth.env_errors
    assert (
        value(m, "tool_call_errors_total", model=MODEL, channel="invalid_json", source="answer")
        == 0
    )
    for name, count in truth.invented_by_name.items():
        assert value(m, "hallucinated_tool_calls_total", model=MODEL, tool=name) == count
    fixed = sum(
        value(m, "repairs_total", model=MODEL, channel=c, result="fixed")
        for c in truth.answer_errors
    )
    assert fixed == truth.repairs_fixed
    assert value(m, "repairs_total", model=MODEL, channel="unknown_tool", result="failed") == 2
    assert value(m, "promoted_tool_calls_total", model=MODEL) == truth.promoted
    for outcome, count in truth.outcomes.items():
        assert value(m, "requests_total", model=MODEL, api="chat", outcome=outcome) == count
    assert value(m, "requests_total", model=MODEL, api="chat", outcome="upstream_error") == 0
    assert value(m, "episodes_total", model=MODEL) == truth.episodes
    for k, count in truth.over_budget.items():
        assert value(m, "episodes_over_budget_total", model=MODEL, k=str(k)) == count
    assert value(m, "episodes_budget_exhausted_total", model=MODEL) == truth.exhausted
    # Re-asks: 9 structured calls fixed in one attempt, 2 failed after two; the promoted one: 0.
    assert value(m, "repair_attempts_count", model=MODEL) == 12
    assert value(m, "repair_attempts_sum", model=MODEL) == 9 + 2 * 2
    assert value(m, "repair_extra_tokens_total", model=MODEL, kind="prompt") == 300 * 13
    assert value(m, "repair_extra_tokens_total", model=MODEL, kind="completion") == 20 * 13
    assert value(m, "repair_extra_seconds_count", model=MODEL) == 11
    assert value(m, "budget_remaining_count", model=MODEL) == 40
    assert value(m, "upstream_request_duration_seconds_count", model=MODEL) == 40
    assert value(m, "stream_first_byte_seconds_count", model=MODEL) == 8
    assert value(m, "tool_name_margin_count", model=MODEL) == 40
    assert value(m, "tool_name_margin_sum", model=MODEL) == pytest.approx(
        5 * sum(0.5 + n for n in range(8))
    )
    assert value(m, "overhead_seconds_count") == 40


def test_ladder_rung_counts_once_when_a_request_jumps_several() -> None:
    m = Metrics(Settings())
    jump = EpisodeRecord(
        new=True, explicit=True, errors_before=0, errors_after=6, budget=5, exhausted=True
    )
    m.request_finished(RequestRecord(model="m", episode=jump))
    again = EpisodeRecord(
        new=False, explicit=True, errors_before=6, errors_after=7, budget=5, exhausted=True
    )
    m.request_finished(RequestRecord(model="m", episode=again))
    assert [value(m, "episodes_over_budget_total", model="m", k=str(k)) for k in (1, 2, 5, 10)] == [
        1,
        1,
        1,
        0,
    ]
    assert value(m, "episodes_budget_exhausted_total", model="m") == 1
    assert value(m, "budget_remaining_bucket", model="m", le="0.0") == 2


def test_budget_ladder_comes_from_settings() -> None:
    m = Metrics(Settings(budget_ladder=(3, 1)))
    assert label_values(m, "repairproxy_episodes_over_budget_total", "k") == set()
    m.request_finished(RequestRecord(model="m"))
    assert label_values(m, "repairproxy_episodes_over_budget_total", "k") == {"1", "3"}


def test_invented_names_are_bounded_per_model() -> None:
    m = Metrics(Settings(max_tool_labels=50))
    for i in range(10_000):
        caught = [CaughtCall("unknown_tool", tool=f"invented_tool_{i}")]
        m.request_finished(RequestRecord(model="m", tool_calls=1, caught_calls=caught))
    tools = label_values(m, "repairproxy_hallucinated_tool_calls_total", "tool")
    assert len(tools) == 51 and OTHER in tools
    assert value(m, "hallucinated_tool_calls_total", model="m", tool=OTHER) == 10_000 - 50
    assert value(m, "hallucinated_tool_calls_total", model="m", tool="invented_tool_7") == 1


def test_models_are_bounded_and_labels_truncated() -> None:
    m = Metrics(Settings(max_model_labels=3))
    for i in range(100):
        m.request_finished(RequestRecord(model=f"model-{i}-" + "x" * 100))
    m.request_finished(RequestRecord(model=None, outcome=Outcome.CLIENT_ERROR))
    models = label_values(m, "repairproxy_requests_total", "model")
    assert len(models) == 4 and OTHER in models and UNKNOWN_MODEL not in models
    assert all(len(name) <= 64 for name in models)
    assert value(m, "requests_total", model=OTHER, api="chat", outcome="ok") == 97
    assert value(m, "requests_total", model=OTHER, api="chat", outcome="client_error") == 1
    long_tool = Metrics(Settings())
    long_tool.request_finished(
        RequestRecord(model="m", caught_calls=[CaughtCall("unknown_tool", tool="t" * 500)])
    )
    assert label_values(long_tool, "repairproxy_hallucinated_tool_calls_total", "tool") == {
        "t" * 64
    }


def test_api_label_and_unknown_model() -> None:
    m = Metrics(Settings())
    m.request_finished(RequestRecord(api=API.RESPONSES, model=None, outcome=Outcome.UPSTREAM_ERROR))
    assert (
        value(m, "requests_total", model=UNKNOWN_MODEL, api="responses", outcome="upstream_error")
        == 1
    )


def test_active_episodes_reads_the_bound_function() -> None:
    m = Metrics(Settings())
    assert value(m, "active_episodes") == 0
    episodes = [1, 2, 3]
    m.bind_active_episodes(lambda: len(episodes))
    assert value(m, "active_episodes") == 3
    episodes.append(4)
    assert value(m, "active_episodes") == 4


def test_exposition_text_and_openmetrics() -> None:
    m = fed()
    body, content_type = m.exposition(None)
    assert content_type.startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert "repairproxy_tool_calls" in families
    assert "repairproxy_episodes_over_budget" in families
    body, content_type = m.exposition("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    assert body.endswith(b"# EOF\n")
    assert (
        b'repairproxy_hallucinated_tool_calls_total{model="qwen2.5-7b-awq",tool="cancel"} 2.0'
        in body
    )


def test_metrics_port_server_requires_its_key() -> None:
    m = fed(Settings(metrics_api_key="scrape-key"))
    server = m.start_server(0, "127.0.0.1")
    try:
        url = f"http://127.0.0.1:{server.port}/metrics"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=5)
        assert refused.value.code == 401
        refused.value.close()
        request = urllib.request.Request(url, headers={"Authorization": "Bearer scrape-key"})
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.status == 200
            assert b"repairproxy_tool_calls_total" in response.read()
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/other", timeout=5)
        assert missing.value.code == 404
        missing.value.close()
    finally:
        server.close()


def test_request_finished_creates_no_children_after_the_first_records() -> None:
    """Counted work, not time: once a model's children exist, a record only increments them
    (no new series, no label lookups that grow). Its time lives in benchmarks.overhead."""
    m = Metrics(Settings())
    records = scripted_workload(MODEL)
    for record in records:
        m.request_finished(record)  # every child this workload needs, created once
    series = sum(len(family.samples) for family in m.registry.collect())
    for record in records * 20:
        m.request_finished(record)
    assert sum(len(family.samples) for family in m.registry.collect()) == series


# -- increments batched per request, exact when read ----------------------------------------------


def test_a_finished_request_is_seen_by_the_next_read_and_scrape() -> None:
    m = Metrics(Settings())
    m.request_finished(RequestRecord(model="m", tool_calls=2, upstream_seconds=0.3))
    assert value(m, "tool_calls_total", model="m") == 2
    m.request_finished(RequestRecord(model="m", tool_calls=1, upstream_seconds=0.3))
    body, _ = m.exposition(None)
    assert b'repairproxy_tool_calls_total{model="m"} 3.0' in body
    assert b'repairproxy_upstream_request_duration_seconds_count{model="m"} 2.0' in body


def _first_byte_samples(registry: CollectorRegistry) -> dict[str, float]:
    return {
        f"{s.name}{sorted(s.labels.items())}": s.value
        for family in registry.collect()
        if family.name == "repairproxy_stream_first_byte_seconds"
        for s in family.samples
        if not s.name.endswith("_created")
    }


@pytest.mark.parametrize(
    "amounts",
    [
        # bounds hit exactly, values past the last bound, a float sum that reassociating the
        # two batches would change in its last digits (7000072.450000007 instead of ...003)
        [0.05, 0.1, 1e-9, 0.30000000000000004, 1e6, 0.1, 2.5, 0.0, 7.3] * 7,
        [0.2, float("nan"), 400.0],  # NaN falls in no bucket and makes the sum NaN
    ],
)
def test_batched_histograms_equal_direct_observations_bit_for_bit(amounts: list[float]) -> None:
    """The values a flush makes are those prometheus-client's own ``observe`` makes, in order."""
    m = Metrics(Settings())
    for index, amount in enumerate(amounts):
        m.request_finished(
            RequestRecord(model="m", upstream_seconds=1.0, first_byte_seconds=amount)
        )
        if index == len(amounts) // 2:
            m.flush()  # a second batch adds to a sum already made
    direct_registry = CollectorRegistry()
    direct = Histogram(
        "repairproxy_stream_first_byte_seconds",
        "direct",
        ("model",),
        registry=direct_registry,
        buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0),
    ).labels("m")
    for amount in amounts:
        direct.observe(amount)
    got, want = _first_byte_samples(m.registry), _first_byte_samples(direct_registry)
    assert len(got) == 16 and got.keys() == want.keys()
    for key, expected in want.items():
        same = got[key] == expected or (math.isnan(got[key]) and math.isnan(expected))
        assert same, (key, got[key], expected)


def test_pending_increments_are_bounded_without_any_scrape() -> None:
    m = Metrics(Settings())
    for _ in range(FLUSH_EVERY * 3 + 5):
        m.request_finished(RequestRecord(model="m", tool_calls=1))
    child = m._model("m").tool_calls
    assert child._value.get() == FLUSH_EVERY * 3  # applied without a read: three full batches
    assert value(m, "tool_calls_total", model="m") == FLUSH_EVERY * 3 + 5


def test_multi_process_mode_makes_each_requests_increments_at_once() -> None:
    """Another worker's scrape reads this one's files, not its registry: nothing would flush."""

    class Direct(Metrics):
        _direct = True

    m = Direct(Settings())
    m.request_finished(RequestRecord(model="m", tool_calls=3, upstream_seconds=0.2))
    assert m._model("m").tool_calls._value.get() == 3
    assert m._model("m").upstream._sum.get() == 0.2


def test_scrapes_from_another_thread_see_exact_monotonic_counts() -> None:
    m = Metrics(Settings())
    total = 20_000
    seen: list[float] = []
    done = threading.Event()

    def scrape() -> None:
        while not done.is_set():
            seen.append(
                m.registry.get_sample_value("repairproxy_tool_calls_total", {"model": "m"}) or 0.0
            )

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        for _ in range(total):
            m.request_finished(RequestRecord(model="m", tool_calls=1))
    finally:
        done.set()
        scraper.join(timeout=30)
    assert seen == sorted(seen) and all(v <= total for v in seen)
    assert value(m, "tool_calls_total", model="m") == total
