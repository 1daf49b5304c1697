"""Make a further-quantized arm from the shipped Q4_K_M with ``llama_model_quantize``.

The result is a requantization (Q4_K_M -> Q3_K_M or Q2_K, ``allow_requantize``), not a quantization
from full precision: it stacks a second rounding on the first, which is what this arm measures.
llama.cpp's per-tensor log goes to ``<cache>/logs/quantize-<arm>.log``, not the terminal.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def _native_output_to(log_path: Path) -> Iterator[None]:
    """Send what C code writes to fds 1 and 2 (llama.cpp's per-tensor log) to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with log_path.open("wb") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


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
    source = arm_path(ARMS[arm.base], cache_dir)
    target = arm_path(arm, cache_dir, must_exist=False)
    start = time.perf_counter()
    made = False
    if not target.is_file():
        partial = target.with_name(target.name + ".partial")
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = arm.ftype
        params.allow_requantize = True
        params.nthread = threads or os.cpu_count() or 1
        log_path = cache_dir / "logs" / f"quantize-{arm.name}.log"
        with _native_output_to(log_path):
            code = llama_cpp.llama_model_quantize(
                str(source).encode(), str(partial).encode(), params
            )
        if code != 0 or not partial.is_file():
            partial.unlink(missing_ok=True)
            raise QuantizeError(
                f"llama_model_quantize returned {code} for {arm.name}; see {log_path}"
            )
        partial.replace(target)
        made = True
    if not _loads(target):
        raise QuantizeError(f"{target} was written but does not load")
    return QuantizeResult(
        target, target.stat().st_size, source.stat().st_size, time.perf_counter() - start, made
    )
