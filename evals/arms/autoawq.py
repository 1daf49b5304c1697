"""INT4-AWQ with AutoAWQ, the alternative to llm-compressor (``--awq-library autoawq``).

AutoAWQ is deprecated upstream (last tested with torch 2.6 and transformers 4.51) and cannot share
an environment with llm-compressor (transformers 5), hence its own extra, ``quantize-autoawq``.
It writes the classic AWQ ``GEMM`` checkpoint (``quant_method: awq``), which vLLM serves with
``--quantization awq`` (or detects). The calibration text is the same local τ²-bench text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from evals.arms.backend import (
    Made,
    MakeOptions,
    checked_call,
    library_info,
    require,
    resolve_device,
    source_identity,
)
from evals.arms.calibration import calibration_data_dir, load_calibration
from evals.arms.compressor import CHECKPOINT
from evals.arms.record import ArmError

__all__ = ["autoawq_config", "make_autoawq"]

EXTRA = "quantize-autoawq"


def autoawq_config(options: MakeOptions) -> dict[str, Any]:
    return {
        "w_bit": options.bits,
        "q_group_size": options.group_size,
        "zero_point": options.zero_point,
        "version": "GEMM",
    }


def make_autoawq(options: MakeOptions, folder: Path) -> Made:
    awq = require("awq", extra=EXTRA, method="awq --awq-library autoawq")
    transformers = require("transformers", extra=EXTRA, method="awq --awq-library autoawq")
    device = resolve_device(options.device, "awq --awq-library autoawq")
    source = source_identity(options.source, options.revision)
    calibration = load_calibration(
        calibration_data_dir(options.tau2_data),
        options.calibration_samples,
        seed=options.calibration_seed,
    )
    model = checked_call(
        awq.AutoAWQForCausalLM.from_pretrained, model_path=options.source, safetensors=True
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(options.source)
    config = autoawq_config(options)
    checked_call(
        model.quantize,
        tokenizer=tokenizer,
        quant_config=config,
        calib_data=list(calibration.texts),
        max_calib_samples=len(calibration.texts),
        max_calib_seq_len=options.max_seq_length,
    )
    target = folder / CHECKPOINT
    checked_call(model.save_quantized, save_dir=str(target))
    tokenizer.save_pretrained(target)
    written = json.loads((target / "config.json").read_text(encoding="utf-8"))
    quantization = written.get("quantization_config")
    if not isinstance(quantization, dict) or quantization.get("quant_method") != "awq":
        raise ArmError(f"{target}/config.json has no AWQ quantization_config")
    return Made(
        form="checkpoint",
        library=library_info("autoawq", "torch", "transformers"),
        source=source,
        settings={
            "scheme": f"W{options.bits}A16, group size {options.group_size}, "
            + ("asymmetric with zero point" if options.zero_point else "symmetric"),
            "bits": options.bits,
            "group_size": options.group_size,
            "zero_point": options.zero_point,
            "quant_config": config,
            "quantization_config": quantization,
        },
        serve={"engine": "vllm", "model": CHECKPOINT, "quantization": "awq"},
        artifact=CHECKPOINT,
        calibration={**calibration.describe(), "max_seq_length": options.max_seq_length},
        device=device,
    )
