"""GGUF re-quantizations of the embedded model, made by ``repairproxy.local`` (llama.cpp).

The arm folder is laid out as a ``repairproxy.local`` cache holding one arm: ``models/`` has a link
to the shipped Q4_K_M and the re-quantized file, ``logs/`` llama.cpp's per-tensor log. So the
quantization really runs into the folder (the user's cache is never short-circuited or changed),
and ``python -m repairproxy.local serve --arm A --cache-dir DIR`` serves exactly these weights.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from evals.arms.backend import Made, MakeOptions, library_info
from evals.arms.record import ArmError, BackendUnavailableError, sha256_of

__all__ = ["make_gguf_requant"]

# llama.h's LLAMA_FTYPE_MOSTLY_* names of the ids repairproxy.local's arms use.
_FTYPE_NAMES = {10: "Q2_K", 12: "Q3_K_M", 15: "Q4_K_M"}


def _reference_file(options: MakeOptions, expected_sha256: str, filename: str) -> Path:
    from repairproxy.local.arms import ARMS, ModelNotFetchedError, arm_path, resolve_cache_dir

    if options.source in ("q4_k_m", "embedded"):
        try:
            return arm_path(ARMS["q4_k_m"], resolve_cache_dir(options.cache_dir))
        except ModelNotFetchedError as exc:
            raise ArmError(str(exc)) from exc
    path = Path(options.source).expanduser()
    if not path.is_file():
        raise ArmError(
            f"--method gguf-requant: SOURCE is 'q4_k_m' (the embedded model in the cache) or its "
            f"GGUF file ({filename}); {options.source!r} is neither"
        )
    if sha256_of(path) != expected_sha256:
        raise ArmError(
            f"{path} is not the embedded model's shipped Q4_K_M (sha256 differs); gguf-requant "
            "re-quantizes that file only, whose arms repairproxy.local names"
        )
    return path


def make_gguf_requant(options: MakeOptions, folder: Path) -> Made:
    if importlib.util.find_spec("llama_cpp") is None:
        raise BackendUnavailableError(
            "--method gguf-requant needs llama-cpp-python: pip install 'repairproxy[local]'"
        )
    from repairproxy.local.arms import MODEL_SOURCE, arm_named, arm_path
    from repairproxy.local.quantize import QuantizeError, quantize_arm

    try:
        arm = arm_named(options.ftype)
    except KeyError as exc:
        raise ArmError(str(exc.args[0])) from exc
    if arm.ftype is None:
        raise ArmError(
            f"--ftype {options.ftype}: that is the shipped reference, not a re-quantization"
        )
    reference = _reference_file(options, MODEL_SOURCE.sha256, MODEL_SOURCE.filename)
    models = folder / "models"
    models.mkdir(parents=True, exist_ok=True)
    link = models / MODEL_SOURCE.filename
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(reference.resolve())
    threads = options.threads or os.cpu_count() or 1
    try:
        result = quantize_arm(arm, folder, threads=threads)
    except QuantizeError as exc:
        raise ArmError(str(exc)) from exc
    import llama_cpp

    made_path = arm_path(arm, folder)
    log = folder / "logs" / f"quantize-{arm.name}.log"
    return Made(
        form="gguf",
        library={**library_info("llama-cpp-python"), "llama_cpp": llama_cpp.__version__},
        source={
            "model": MODEL_SOURCE.description,
            "file": str(reference.resolve()),
            "sha256": MODEL_SOURCE.sha256,  # checked on fetch, or above for a file given
            "packages": f"{MODEL_SOURCE.package_prefix}1..{MODEL_SOURCE.parts}"
            f"=={MODEL_SOURCE.version}",
            "size_bytes": result.reference_size_bytes,
        },
        settings={
            "arm": arm.name,
            "ftype": _FTYPE_NAMES.get(arm.ftype, str(arm.ftype)),
            "ftype_id": arm.ftype,
            "allow_requantize": True,
            "threads": threads,
            "note": "re-quantized from Q4_K_M: two rounds of rounding, not one from BF16",
        },
        serve={"engine": "embedded", "embedded_arm": arm.name, "cache_dir": "."},
        artifact=str(made_path.relative_to(folder)),
        device="cpu",
        # llama.cpp's per-tensor log, when llama-cpp-python let it through to the file.
        extra={"log": str(log.relative_to(folder))} if log.is_file() and log.stat().st_size else {},
    )
