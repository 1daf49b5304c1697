"""Fuzzing the request path through the real proxy: a few hundred generated cases here,
10,000+ in ``python -m benchmarks.fuzz``. No crash, no proxy-made 5xx for client input, and no
client ever receives another client's answer."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings

from tests.support.fuzzing import Case, FuzzRig, cases, fuzz_rig


@pytest.fixture(scope="module")
def rig() -> Iterator[FuzzRig]:
    with fuzz_rig() as running:
        yield running


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,  # CI sees the same cases every run; the benchmark explores further
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=cases())
def test_generated_exchanges(rig: FuzzRig, case: Case) -> None:
    rig.run(case)
