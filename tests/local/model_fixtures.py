"""Fixtures for tests that need the embedded model: skip cleanly when it is not installed."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

from repairproxy.local import ARMS, resolve_cache_dir, start_embedded_upstream

__all__ = ["MODEL_PRESENT", "embedded_upstream", "requires_model"]

MODEL_PRESENT = (resolve_cache_dir() / "models" / ARMS["q4_k_m"].filename).is_file() and (
    importlib.util.find_spec("llama_cpp") is not None
)
requires_model = pytest.mark.skipif(
    not MODEL_PRESENT,
    reason="embedded model not installed: pip install -e '.[local]' && "
    "python -m repairproxy.local fetch",
)


@pytest.fixture(scope="session")
def embedded_upstream() -> Iterator[str]:
    """The base URL (``.../v1``) of the q4_k_m arm, started once per test session."""
    with start_embedded_upstream("q4_k_m", n_ctx=4096) as upstream:
        yield upstream.base_url
