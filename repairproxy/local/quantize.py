"""Make a further-quantized arm from the shipped Q4_K_M with ``llama_model_quantize``.

The result is a requantization (Q4_K_M -> Q3_K_M or Q2_K, ``allow_requantize``), not a quantization
from full precision: it stacks a second rounding on the first, which is what this arm measures.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from repairproxy.local.arms import ARMS, Arm, arm_path

__all__ = ["QuantizeError", "QuantizeResult", "quantize_arm"]


class QuantizeError(RuntimeError):
    """llama.cpp refused to quantize, or the result does not load."""


@dataclass(frozen=True, slots=True)
class QuantizeResult:
    path: Path
    size_bytes: int
    reference_size_bytes: int
    seconds: float
    made: bool


def _loads(path: Path) -> bool:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, vocab_only=False, verbose=False)
    try:
        return len(llm.tokenize(b"<tool_call>", add_bos=False, special=True)) >= 1
    finally:
        llm.close()


def quantize_arm(arm: Arm, cache_dir: Path, *, threads: int | None = None) -> QuantizeResult:
    """Write ``arm``'s GGUF next to the reference one (idempotent) and check that it loads."""
    import llama_cpp

    if arm.ftype is None:
        raise QuantizeError(
            f"{arm.name} is the shipped reference arm; fetch it, do not quantize it"
        )
    source = arm_path(ARMS["q4_k_m"], cache_dir)
    target = arm_path(arm, cache_dir, must_exist=False)
    start = time.perf_counter()
    made = False
    if not target.is_file():
        partial = target.with_name(target.name + ".partial")
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = arm.ftype
        params.allow_requantize = True
        params.nthread = threads or os.cpu_count() or 1
        code = llama_cpp.llama_model_quantize(str(source).encode(), str(partial).encode(), params)
        if code != 0 or not partial.is_file():
            partial.unlink(missing_ok=True)
            raise QuantizeError(f"llama_model_quantize returned {code} for {arm.name}")
        partial.replace(target)
        made = True
    if not _loads(target):
        raise QuantizeError(f"{target} was written but does not load")
    return QuantizeResult(
        target, target.stat().st_size, source.stat().st_size, time.perf_counter() - start, made
    )
