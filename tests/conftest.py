"""Shared pytest configuration: async tests run on asyncio through anyio's plugin."""

import os
import tempfile
from typing import Any

import pytest

# A benchmark run from a test (its main, or `python -m benchmarks.X` in a subprocess) writes its
# figures here, never over the measurements in benchmarks/results/.
os.environ["BENCHMARK_RESULTS_DIR"] = tempfile.mkdtemp(prefix="benchmark-results-")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# Test modules that start a Debian service binary (installed by .ci/run); `make check` leaves
# them out with `-m "not service"`, `make test` runs them.
SERVICE_MODULES = frozenset(
    {
        "test_metrics_prometheus.py",  # prometheus
        "test_redis_store.py",  # redis-server
        "test_scale_out.py",  # redis-server, nginx
        "test_dashboard.py",  # chromium
        "test_ops.py",  # promtool
    }
)


class SkipSummary:
    """Skips grouped by reason, last before the counts: a test that did not run for want of
    data, a model or a Debian service is named there, not lost among the SKIPPED lines."""

    def __init__(self) -> None:
        self.by_reason: dict[str, list[str]] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped and isinstance(report.longrepr, tuple):
            reason = str(report.longrepr[2]).removeprefix("Skipped: ")
            self.by_reason.setdefault(reason, []).append(report.nodeid)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.by_reason:
            return
        terminalreporter.section("skipped, by reason")
        for reason, nodeids in sorted(self.by_reason.items(), key=lambda item: -len(item[1])):
            terminalreporter.line(f"{len(nodeids):4d}  {reason}")
            terminalreporter.line(f"      e.g. {nodeids[0]}")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SkipSummary(), "repairproxy-skip-summary")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in SERVICE_MODULES:
            item.add_marker(pytest.mark.service)
