"""The framework matrix as a test (marker ``frameworks``, deselected by default: it runs every
installed framework several times, ~3 minutes): every cell that ran must pass."""

from __future__ import annotations

import pytest

from tests.frameworks.matrix import run_matrix

pytestmark = pytest.mark.frameworks


def test_every_installed_framework_passes_every_check() -> None:
    cells, _ = run_matrix()
    assert cells, "no framework installed"
    failed = [f"{c.framework} {c.api} {c.check}: {c.detail}" for c in cells if not c.ok]
    assert failed == []
