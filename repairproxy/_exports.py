"""Lazy package contracts: a folder's ``__init__`` names what it offers without importing it, so
importing one module of a layer never loads the whole layer (``import repairproxy`` stays light)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, homes: Mapping[str, str]
) -> tuple[list[str], Callable[[str], object]]:
    """``__all__`` and a module ``__getattr__`` for ``package``: ``homes`` maps each exported
    name to the submodule (relative to the package) that defines it."""

    def __getattr__(name: str) -> object:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{home}"), name)

    return sorted(homes), __getattr__
