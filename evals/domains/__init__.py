"""τ²-bench domains by name: ``load_domain("retail" | "telecom", data_dir)``.

Each domain package exposes ``load(data_dir) -> Domain``; it is imported only when asked for.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from evals.domains.base import Domain

__all__ = ["DOMAINS", "load_domain"]

DOMAINS = ("retail", "telecom")


def load_domain(name: str, data_dir: Path) -> Domain:
    """Load a domain from a τ²-bench ``data/`` folder."""
    if name not in DOMAINS:
        raise ValueError(f"unknown domain {name!r}; known: {', '.join(DOMAINS)}")
    module = importlib.import_module(f"evals.domains.{name}")
    domain: Domain = module.load(data_dir)
    return domain
