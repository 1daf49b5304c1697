"""Shared pytest configuration: async tests run on asyncio through anyio's plugin."""

import pytest


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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in SERVICE_MODULES:
            item.add_marker(pytest.mark.service)
