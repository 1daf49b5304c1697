"""INT4-AWQ, INT8 W8A8 and FP8 checkpoints with llm-compressor's ``oneshot`` (the path vLLM
documents).

AWQ: ``AWQModifier`` (activation-aware scales from the calibration text) followed by a
``QuantizationModifier`` with one explicit W4 group scheme (group size and zero point as asked,
``lm_head`` kept), saved as compressed-tensors ``pack-quantized``. FP8: the ``FP8_DYNAMIC`` scheme
(per-channel weight scales, dynamic per-token activation scales; no calibration) or ``FP8``
(per-tensor static activation scales from the calibration text), saved ``float-quantized``.
W8A8: the ``W8A8`` scheme (int8 weights with symmetric per-channel scales, rounded to nearest;
int8 activations with dynamic per-token scales; no calibration), saved ``int-quantized``: the
integer format vLLM's CPU build has kernels for, where its FP8 operators have none.
vLLM reads either checkpoint as it is (``quant_method: compressed-tensors`` in config.json).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from evals.arms.backend import (
    Made,
    MakeOptions,
    check_call,
    checked_call,
    library_info,
    require,
    resolve_device,
    source_identity,
)
from evals.arms.calibration import CalibrationSet, calibration_data_dir, load_calibration
from evals.arms.record import ArmError

__all__ = [
    "awq_recipe",
    "fp8_recipe",
    "make_awq",
    "make_fp8",
    "make_w8a8",
    "oneshot_arguments",
    "w8a8_recipe",
]

EXTRA = "quantize"
CHECKPOINT = "checkpoint"  # the quantized model's folder inside the arm folder
_LIBRARIES = ("compressed-tensors", "torch", "transformers", "accelerate")


def awq_recipe(options: MakeOptions) -> list[Any]:
    """AWQ scales, then W{bits} weights in groups of ``group_size`` (with a zero point or not)."""
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from llmcompressor.modifiers.transform.awq import AWQModifier

    weights = checked_call(
        QuantizationArgs,
        num_bits=options.bits,
        type="int",
        strategy="group",
        group_size=options.group_size,
        symmetric=not options.zero_point,
        dynamic=False,
    )
    scheme = checked_call(QuantizationScheme, targets=["Linear"], weights=weights)
    return [
        checked_call(AWQModifier),
        checked_call(
            QuantizationModifier,
            config_groups={"group_0": scheme},
            ignore=list(options.ignore),
        ),
    ]


def fp8_recipe(options: MakeOptions) -> list[Any]:
    """``FP8_DYNAMIC`` (dynamic activations) or ``FP8`` (static activation scales)."""
    from llmcompressor.modifiers.quantization import QuantizationModifier

    scheme = "FP8_DYNAMIC" if options.fp8_activations == "dynamic" else "FP8"
    return [
        checked_call(
            QuantizationModifier, targets=["Linear"], scheme=scheme, ignore=list(options.ignore)
        )
    ]


def w8a8_recipe(options: MakeOptions) -> list[Any]:
    """``W8A8``: int8 per-channel weights (round to nearest), dynamic per-token int8 activations."""
    from llmcompressor.modifiers.quantization import QuantizationModifier

    return [
        checked_call(
            QuantizationModifier, targets=["Linear"], scheme="W8A8", ignore=list(options.ignore)
        )
    ]


def oneshot_arguments(
    model: Any, tokenizer: Any, recipe: list[Any], calibration: CalibrationSet | None, seq: int
) -> dict[str, Any]:
    """The keyword arguments ``oneshot`` gets; the dataset is built from the local texts."""
    arguments: dict[str, Any] = {"model": model, "recipe": recipe, "processor": tokenizer}
    if calibration is not None:
        import datasets

        arguments |= {
            "dataset": datasets.Dataset.from_dict({"text": list(calibration.texts)}),
            "num_calibration_samples": len(calibration.texts),
            "max_seq_length": seq,
            "shuffle_calibration_samples": False,  # the seed already chose and ordered them
            "text_column": "text",
        }
    return arguments


@contextlib.contextmanager
def _cpu_without_pinned_memory(torch: Any) -> Iterator[None]:
    """On a host with no accelerator, skip llm-compressor's pinning of cached activations.

    AWQ pins each cached batch before its grid search to speed up host-to-device copies; with
    no accelerator ``Tensor.pin_memory()`` raises (torch CPU builds), and there is no copy to
    speed up, so the pinning is skipped while ``oneshot`` runs. Nothing changes where a GPU is.
    """
    if torch.cuda.is_available():
        yield
        return
    from llmcompressor.pipelines.cache import IntermediatesCache

    original = IntermediatesCache.pin_memory

    def no_pin(self: Any, *args: Any, **kwargs: Any) -> None:
        return None

    IntermediatesCache.pin_memory = no_pin
    try:
        yield
    finally:
        IntermediatesCache.pin_memory = original


def _run(options: MakeOptions, folder: Path, method: str, recipe_of: Any, calibrate: bool) -> Made:
    require("llmcompressor", extra=EXTRA, method=method)
    torch = require("torch", extra=EXTRA, method=method)
    transformers = require("transformers", extra=EXTRA, method=method)
    from llmcompressor import oneshot

    device = resolve_device(options.device, method)
    source = source_identity(options.source, options.revision)
    calibration = (
        load_calibration(
            calibration_data_dir(options.tau2_data),
            options.calibration_samples,
            seed=options.calibration_seed,
        )
        if calibrate
        else None
    )
    load = {"dtype": "auto", "revision": options.revision or "main"}
    if device == "cuda":
        load["device_map"] = "auto"
    model = transformers.AutoModelForCausalLM.from_pretrained(options.source, **load)
    tokenizer = transformers.AutoTokenizer.from_pretrained(
        options.source, revision=options.revision or "main"
    )
    recipe = recipe_of(options)
    arguments = oneshot_arguments(model, tokenizer, recipe, calibration, options.max_seq_length)
    check_call(oneshot, arguments)
    with _cpu_without_pinned_memory(torch):
        oneshot(**arguments)
    target = folder / CHECKPOINT
    model.save_pretrained(target, save_compressed=True)
    tokenizer.save_pretrained(target)
    written = json.loads((target / "config.json").read_text(encoding="utf-8"))
    quantization = written.get("quantization_config")
    if (
        not isinstance(quantization, dict)
        or quantization.get("quant_method") != "compressed-tensors"
    ):
        raise ArmError(f"{target}/config.json has no compressed-tensors quantization_config")
    return Made(
        form="checkpoint",
        library=library_info("llmcompressor", *_LIBRARIES),
        source={**source, "dtype": str(getattr(model.config, "torch_dtype", None) or "")},
        settings={
            "recipe": [_modifier_settings(m) for m in recipe],
            "recipe_file": f"{CHECKPOINT}/recipe.yaml",  # llm-compressor's own full record
            "ignore": list(options.ignore),
            "quantization_config": quantization,
        },
        serve={"engine": "vllm", "model": CHECKPOINT, "quantization": None},
        artifact=CHECKPOINT,
        calibration=(
            None
            if calibration is None
            else {**calibration.describe(), "max_seq_length": options.max_seq_length}
        ),
        device=device,
    )


def _modifier_settings(modifier: Any) -> dict[str, Any]:
    named: dict[str, Any] = {"modifier": type(modifier).__name__}
    for field in ("duo_scaling", "n_grid", "scheme", "targets"):
        value = getattr(modifier, field, None)
        if isinstance(value, str | int | float | bool | list):
            named[field] = value
    return named


def make_awq(options: MakeOptions, folder: Path) -> Made:
    made = _run(options, folder, "awq", awq_recipe, calibrate=True)
    settings = {
        "scheme": f"W{options.bits}A16, group size {options.group_size}, "
        + ("asymmetric with zero point" if options.zero_point else "symmetric"),
        "bits": options.bits,
        "group_size": options.group_size,
        "zero_point": options.zero_point,
        **made.settings,
    }
    return dataclasses.replace(made, settings=settings)


def make_fp8(options: MakeOptions, folder: Path) -> Made:
    static = options.fp8_activations == "static"
    made = _run(options, folder, "fp8", fp8_recipe, calibrate=static)
    settings = {
        "scheme": "FP8" if static else "FP8_DYNAMIC",
        "weights": "float8 e4m3, " + ("per-tensor" if static else "per-channel") + " static scales",
        "activations": "float8, per-tensor static scales"
        if static
        else "float8, dynamic per-token scales",
        **made.settings,
    }
    return dataclasses.replace(made, settings=settings)


def make_w8a8(options: MakeOptions, folder: Path) -> Made:
    made = _run(options, folder, "w8a8", w8a8_recipe, calibrate=False)
    settings = {
        "scheme": "W8A8",
        "weights": "int8, per-channel symmetric static scales (round to nearest, no calibration)",
        "activations": "int8, dynamic per-token symmetric scales",
        **made.settings,
    }
    return dataclasses.replace(made, settings=settings)
