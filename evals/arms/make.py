"""``make_arm``: run one back-end into an arm folder and write its ``arm.json``.

Back-ends are registered by method in ``BACKENDS`` (the llm-compressor, AutoAWQ and llama.cpp
ones, and vLLM's on-the-fly FP8 which writes no weights at all); this module adds what every arm
records the same way: wall time, size on disk, date, the project's commit and the host.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Mapping
from pathlib import Path

from evals.arms.backend import Backend, Made, MakeOptions, source_identity
from evals.arms.record import (
    ArmError,
    ArmRecord,
    git_state,
    host_info,
    size_on_disk,
    tree_digest,
    utc_now,
)

__all__ = ["BACKENDS", "make_arm"]

# What ``make`` may remove from an existing arm folder with ``force=True`` (nothing else).
_MADE_ENTRIES = ("arm.json", "checkpoint", "models", "logs")


def _awq(options: MakeOptions, folder: Path) -> Made:
    if options.awq_library == "autoawq":
        from evals.arms.autoawq import make_autoawq

        return make_autoawq(options, folder)
    from evals.arms.compressor import make_awq

    return make_awq(options, folder)


def _fp8(options: MakeOptions, folder: Path) -> Made:
    if options.on_the_fly:
        return _fp8_on_the_fly(options, folder)
    from evals.arms.compressor import make_fp8

    return make_fp8(options, folder)


def _fp8_on_the_fly(options: MakeOptions, folder: Path) -> Made:
    """vLLM quantizes the BF16 weights to FP8 while loading them: a serving flag, no checkpoint."""
    if options.fp8_activations != "dynamic":
        raise ArmError(
            "--on-the-fly FP8 is vLLM's dynamic scheme; --fp8-activations static needs a checkpoint"
        )
    return Made(
        form="serving-flag",
        library={"name": "vllm", "version": None, "note": "the version is the serving vLLM's"},
        source=source_identity(options.source, options.revision),
        settings={
            "scheme": "vLLM --quantization fp8 (on the fly)",
            "weights": "float8 e4m3, per-tensor scales computed when the weights load",
            "activations": "float8, dynamic per-tensor scales",
        },
        serve={"engine": "vllm", "model": options.source, "quantization": "fp8"},
        device="serving GPU",
    )


def _w8a8(options: MakeOptions, folder: Path) -> Made:
    from evals.arms.compressor import make_w8a8

    return make_w8a8(options, folder)


def _gguf(options: MakeOptions, folder: Path) -> Made:
    from evals.arms.gguf import make_gguf_requant

    return make_gguf_requant(options, folder)


BACKENDS: Mapping[str, Backend] = {
    "awq": _awq,
    "fp8": _fp8,
    "w8a8": _w8a8,
    "gguf-requant": _gguf,
}


def _prepare(folder: Path, force: bool) -> None:
    if folder.exists() and not folder.is_dir():
        raise ArmError(f"--out {folder} is a file")
    if folder.is_dir() and any(folder.iterdir()):
        if not force:
            raise ArmError(f"--out {folder} is not empty; pass --force to remake the arm there")
        for name in _MADE_ENTRIES:
            entry = folder / name
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            elif entry.exists() or entry.is_symlink():
                entry.unlink()
    folder.mkdir(parents=True, exist_ok=True)


def make_arm(options: MakeOptions, *, force: bool = False) -> ArmRecord:
    """Make the arm ``options`` describe in ``options.out`` and write ``arm.json`` there."""
    backend = BACKENDS.get(options.method)
    if backend is None:
        raise ArmError(f"--method {options.method!r}: expected one of {sorted(BACKENDS)}")
    folder = options.out
    created = not folder.exists()
    _prepare(folder, force)
    started = time.perf_counter()
    try:
        made = backend(options, folder)
    except BaseException:
        if created:  # leave no half-made arm behind where there was nothing
            shutil.rmtree(folder, ignore_errors=True)
        raise
    seconds = time.perf_counter() - started
    artifact = None
    if made.artifact is not None:
        path = folder / made.artifact
        artifact = {"path": made.artifact, "size_bytes": size_on_disk(path), **tree_digest(path)}
    record = ArmRecord(
        name=options.name or folder.resolve().name,
        method=options.method,
        form=made.form,
        library=made.library,
        source=made.source,
        settings=made.settings,
        serve=made.serve,
        calibration=made.calibration,
        artifact=artifact,
        wall_seconds=round(seconds, 3),
        created_at=utc_now(),
        git=git_state(),
        host={**host_info(made.device), **made.extra},
        folder=folder.resolve(),
    )
    record.write(folder)
    return record
