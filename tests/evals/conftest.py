"""Fixtures for the evals tests: where the τ²-bench data folder is."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def tau2_data_path() -> Path:
    """``TAU2_DATA_DIR`` if set, else ``../shared/tau2-data`` next to the repository."""
    configured = os.environ.get("TAU2_DATA_DIR")
    return Path(configured) if configured else REPO_ROOT.parent / "shared" / "tau2-data"


@pytest.fixture(scope="session")
def tau2_data_dir() -> Path:
    path = tau2_data_path()
    if not (path / "tau2" / "domains").is_dir():
        pytest.skip(f"no τ²-bench data at {path} (set TAU2_DATA_DIR)")
    return path
