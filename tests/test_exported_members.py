"""The public surface, as httpx's ``tests/test_exported_members.py`` checks it: every name in a
package's ``__all__`` exists, and ``__all__`` lists each public name the package defines."""

from __future__ import annotations

import importlib

import pytest

import repairproxy

PACKAGES = [
    "repairproxy",
    "repairproxy.asgi",
    "repairproxy.wire",
    "repairproxy.episodes",
    "repairproxy.upstream",
    "repairproxy.observe",
    "repairproxy.errors",
    "repairproxy.types",
]


def test_top_level_surface() -> None:
    assert sorted(repairproxy.__all__) == repairproxy.__all__
    assert set(repairproxy.__all__) == {"Settings", "__version__", "create_app"}
    for name in repairproxy.__all__:
        assert getattr(repairproxy, name) is not None


@pytest.mark.parametrize("name", PACKAGES)
def test_all_names_exist_and_are_sorted(name: str) -> None:
    module = importlib.import_module(name)
    exported = module.__all__
    assert exported == sorted(exported), f"{name}.__all__ is not sorted"
    assert len(set(exported)) == len(exported)
    for attr in exported:
        assert hasattr(module, attr), f"{name}.__all__ names {attr!r}, which it lacks"


def test_version_has_one_source() -> None:
    from importlib.metadata import version

    assert repairproxy.__version__ == version("repairproxy")
