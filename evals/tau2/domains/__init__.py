"""τ²-bench domains by name: ``load_domain("retail" | "telecom", data_dir)``.

Each domain package exposes ``load(data_dir, **options) -> Domain``; it is imported only when
asked for. Options change a domain's behaviour away from τ²-bench v1.0.1 and are named in
``DOMAIN_OPTIONS`` (off by default; a run records the ones it used).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path

from evals.tau2.domains.base import Domain

__all__ = ["DOMAINS", "DOMAIN_OPTIONS", "load_domain"]

DOMAINS = ("retail", "telecom")

# Option name -> (domain, keyword of the domain's ``load``): documented deviations from v1.0.1.
DOMAIN_OPTIONS: dict[str, tuple[str, str]] = {
    # Each item modified by ``modify_pending_order_items`` gets its own variant's price and
    # options (v1.0.1 gives them all the last item's).
    "retail_modify_items_fix": ("retail", "modify_items_fix"),
}


def load_domain(name: str, data_dir: Path, options: Mapping[str, bool] | None = None) -> Domain:
    """Load a domain from a τ²-bench ``data/`` folder, with named options (see DOMAIN_OPTIONS)."""
    if name not in DOMAINS:
        raise ValueError(f"unknown domain {name!r}; known: {', '.join(DOMAINS)}")
    keywords: dict[str, bool] = {}
    for option, value in (options or {}).items():
        if option not in DOMAIN_OPTIONS:
            raise ValueError(f"unknown domain option {option!r}; known: {sorted(DOMAIN_OPTIONS)}")
        owner, keyword = DOMAIN_OPTIONS[option]
        if owner == name:
            keywords[keyword] = value
    module = importlib.import_module(f"evals.tau2.domains.{name}")
    domain: Domain = module.load(data_dir, **keywords)
    return domain
