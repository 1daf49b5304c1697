"""Fixtures for the evals tests: where the τ²-bench data folder is."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def tau2_data_path() -> Path:
    """Where the τ²-bench data is, in the order a newcomer's machine has it: ``TAU2_DATA_DIR``,
    then ``../shared/tau2-data`` beside the checkout, then the cache ``make demo`` fills
    (``~/.cache/repairproxy/tau2``), fetched there first when ``TAU2_DATA_URL`` is set."""
    configured = os.environ.get("TAU2_DATA_DIR")
    if configured:
        return Path(configured)
    shared = REPO_ROOT.parent / "shared" / "tau2-data"
    if (shared / "tau2" / "domains").is_dir():
        return shared
    from evals.tau2.data import DATA_URL_ENV, default_cache_root, ensure_cached

    root = default_cache_root(os.environ)
    cached = root / "data"
    if (cached / "tau2" / "domains").is_dir() or not os.environ.get(DATA_URL_ENV):
        return cached
    return ensure_cached(root, base_url=os.environ[DATA_URL_ENV], progress=False)


@pytest.fixture(scope="session")
def tau2_data_dir() -> Path:
    path = tau2_data_path()
    if not (path / "tau2" / "domains").is_dir():
        pytest.skip(
            "no τ²-bench data: set TAU2_DATA_DIR to a copy (the folder holding tau2/domains), "
            "or TAU2_DATA_URL to a mirror to fill the cache (~/.cache/repairproxy/tau2); "
            "make demo-data says which is reachable"
        )
    return path
