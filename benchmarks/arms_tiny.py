"""The AWQ and FP8 back-ends of ``evals.arms`` end to end on CPU, on a tiny random-weight Qwen2.

No hub: the model is ``AutoModelForCausalLM.from_config`` on a tiny ``Qwen2Config`` and the
tokenizer a byte-level BPE trained here on the τ²-bench policies. Each arm is made through
``make_arm`` exactly as the CLI does, then its checkpoint is opened and checked for the layout
vLLM expects (compressed-tensors ``quantization_config``; packed int4 weights, group scales and
zero points; float8 weights and their scales), loaded back with transformers, and run.

Needs the ``quantize`` extra (torch, transformers, llm-compressor), which the test suite does not
install; run it in its own environment:

    python -m venv /tmp/arms-venv && /tmp/arms-venv/bin/pip install -e '.[quantize]'
    TAU2_DATA_DIR=../shared/tau2-data /tmp/arms-venv/bin/python benchmarks/arms_tiny.py

``--autoawq`` also runs the AutoAWQ back-end (the ``quantize-autoawq`` extra).

Measured 2026-11-30 on the shared 2-core machine (load average 10-15, so read the CPU seconds),
torch 2.13.0+cpu, transformers 5.17.0, llmcompressor 0.14.0.1, compressed-tensors 0.19.0,
autoawq 0.2.9, 16 calibration samples of at most 256 tokens; every layout check passed:

    arm                     wall s   CPU s  folder MB  weights MB  /bf16
    bf16 source                                             2.891   1.00
    awq (llm-compressor)     462.8    86.8      1.175       1.149   0.40
    fp8 dynamic                2.8     0.7      1.746       1.721   0.60
    fp8 static                39.3     8.9      1.740       1.714   0.59
    awq (autoawq)            189.2    35.5      1.171       1.147   0.40

(The embedding and ``lm_head`` stay BF16 and dominate so tiny a model; on a real one the linear
layers do.) No GPU run was possible for this task.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.support.results import run_recorded
from evals.arms import ArmRecord, MakeOptions, make_arm
from evals.arms.backend import check_call
from evals.arms.calibration import calibration_data_dir, load_calibration
from evals.arms.record import ArmError

QUESTION = (
    "Do the AWQ and FP8 back-ends of evals.arms make, record and check an arm end to end on CPU?"
)

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
HIDDEN, INTERMEDIATE, LAYERS = 256, 512, 2
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def build_tiny_source(folder: Path, texts: tuple[str, ...]) -> dict[str, Any]:
    """A random-weight Qwen2 (2 layers, hidden 256) and a BPE tokenizer, saved like a hub folder."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(texts, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tokenizer.chat_template = CHATML
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return {"vocab": len(tokenizer), "parameters": sum(p.numel() for p in model.parameters())}


def _tensors(checkpoint: Path) -> dict[str, tuple[str, list[int]]]:
    from safetensors import safe_open

    found: dict[str, tuple[str, list[int]]] = {}
    for path in sorted(checkpoint.glob("*.safetensors")):
        with safe_open(str(path), "pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                piece = handle.get_slice(key)
                found[key] = (piece.get_dtype(), list(piece.get_shape()))
    return found


def _shape(name: str) -> tuple[int, int]:
    """(out_features, in_features) of one Linear of the tiny model."""
    kv = HIDDEN // 4 * 2
    return {
        "q_proj": (HIDDEN, HIDDEN),
        "k_proj": (kv, HIDDEN),
        "v_proj": (kv, HIDDEN),
        "o_proj": (HIDDEN, HIDDEN),
        "gate_proj": (INTERMEDIATE, HIDDEN),
        "up_proj": (INTERMEDIATE, HIDDEN),
        "down_proj": (HIDDEN, INTERMEDIATE),
    }[name]


def _linears() -> list[tuple[str, str]]:
    out = []
    for layer in range(LAYERS):
        for name in LINEARS:
            part = "mlp" if name.endswith(("gate_proj", "up_proj", "down_proj")) else "self_attn"
            out.append((f"model.layers.{layer}.{part}.{name}", name))
    return out


def _cpu_seconds() -> float:
    """This process's CPU time: a figure the other jobs on a shared machine do not inflate."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _weights_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def expect(condition: bool, what: str, failures: list[str]) -> None:
    print(f"    {'ok  ' if condition else 'FAIL'} {what}")
    if not condition:
        failures.append(what)


def check_awq_layout(record: ArmRecord, group: int, failures: list[str]) -> None:
    checkpoint = record.artifact_path()
    assert checkpoint is not None
    config = json.loads((checkpoint / "config.json").read_text())["quantization_config"]
    weights = config["config_groups"]["group_0"]["weights"]
    expect(
        config["quant_method"] == "compressed-tensors", "quant_method compressed-tensors", failures
    )
    expect(config["format"] == "pack-quantized", "format pack-quantized", failures)
    expect(
        (weights["num_bits"], weights["type"], weights["strategy"], weights["group_size"])
        == (4, "int", "group", group),
        f"weights int4, strategy group, group_size {group}",
        failures,
    )
    expect(weights["symmetric"] is False, "asymmetric (zero point)", failures)
    expect(config["ignore"] == ["lm_head"], "lm_head not quantized", failures)
    tensors = _tensors(checkpoint)
    ok_packed = ok_scale = ok_zero = True
    for prefix, name in _linears():
        out_f, in_f = _shape(name)
        ok_packed &= tensors.get(f"{prefix}.weight_packed") == ("I32", [out_f, in_f // 8])
        ok_scale &= tensors.get(f"{prefix}.weight_scale", ("", []))[1] == [out_f, in_f // group]
        ok_zero &= tensors.get(f"{prefix}.weight_zero_point") == (
            "I32",
            [out_f // 8, in_f // group],
        )
        ok_packed &= f"{prefix}.weight" not in tensors
    n = len(_linears())
    expect(ok_packed, f"{n} Linear weights packed 8 int4 per int32 [out, in/8]", failures)
    expect(ok_scale, f"group scales [out, in/{group}]", failures)
    expect(ok_zero, f"packed int4 zero points [out/8, in/{group}]", failures)
    expect(tensors.get("lm_head.weight", ("",))[0] == "BF16", "lm_head.weight BF16", failures)


def check_fp8_layout(record: ArmRecord, static: bool, failures: list[str]) -> None:
    checkpoint = record.artifact_path()
    assert checkpoint is not None
    config = json.loads((checkpoint / "config.json").read_text())["quantization_config"]
    group = config["config_groups"]["group_0"]
    weights, inputs = group["weights"], group["input_activations"]
    expect(config["format"] == "float-quantized", "format float-quantized", failures)
    expect((weights["num_bits"], weights["type"]) == (8, "float"), "weights float8", failures)
    strategy = "tensor" if static else "channel"
    expect(weights["strategy"] == strategy, f"weight scales per {strategy}", failures)
    expect(
        inputs["dynamic"] is (not static)
        and inputs["strategy"] == ("tensor" if static else "token"),
        "activations " + ("static per tensor" if static else "dynamic per token"),
        failures,
    )
    tensors = _tensors(checkpoint)
    ok_weight = ok_scale = ok_input = True
    for prefix, name in _linears():
        out_f, in_f = _shape(name)
        ok_weight &= tensors.get(f"{prefix}.weight") == ("F8_E4M3", [out_f, in_f])
        scale = tensors.get(f"{prefix}.weight_scale", ("", [-1]))[1]
        ok_scale &= (scale in ([], [1])) if static else scale == [out_f, 1]
        ok_input &= (f"{prefix}.input_scale" in tensors) is static
    n = len(_linears())
    expect(ok_weight, f"{n} Linear weights F8_E4M3 [out, in]", failures)
    expect(ok_scale, "weight scales " + ("one per tensor" if static else "[out, 1]"), failures)
    expect(ok_input, "input_scale " + ("stored" if static else "absent (dynamic)"), failures)


def check_autoawq_layout(record: ArmRecord, group: int, failures: list[str]) -> None:
    checkpoint = record.artifact_path()
    assert checkpoint is not None
    config = json.loads((checkpoint / "config.json").read_text())["quantization_config"]
    expect(config.get("quant_method") == "awq", "quant_method awq", failures)
    expect(config.get("group_size") == group and config.get("bits") == 4, "w4 g128", failures)
    tensors = _tensors(checkpoint)
    ok = True
    for prefix, name in _linears():
        out_f, in_f = _shape(name)
        ok &= tensors.get(f"{prefix}.qweight") == ("I32", [in_f, out_f // 8])
        ok &= tensors.get(f"{prefix}.qzeros") == ("I32", [in_f // group, out_f // 8])
        ok &= tensors.get(f"{prefix}.scales", ("", []))[1] == [in_f // group, out_f]
    expect(ok, "qweight [in, out/8], qzeros [in/g, out/8], scales [in/g, out]", failures)


def runs_back(record: ArmRecord, failures: list[str]) -> None:
    """Load the checkpoint with transformers (compressed-tensors decompresses it) and run it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    checkpoint = record.artifact_path()
    assert checkpoint is not None
    started = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    ids = tokenizer("Cancel my order #W2378156", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
    finite = bool(torch.isfinite(logits).all())
    expect(
        finite,
        f"loads back and runs: logits {list(logits.shape)} finite "
        f"({time.perf_counter() - started:.1f} s)",
        failures,
    )


def signature_checks(failures: list[str]) -> None:
    """The calls the back-end makes bind against the installed signatures; a wrong one does not."""
    from llmcompressor import oneshot

    from evals.arms.compressor import awq_recipe, fp8_recipe, oneshot_arguments

    options = MakeOptions(source="x", method="awq", out=Path("x"))
    recipes = [awq_recipe(options), fp8_recipe(options)]  # checked_call inside
    expect(all(len(r) >= 1 for r in recipes), "recipes built through checked_call", failures)
    check_call(oneshot, oneshot_arguments(None, None, recipes[0], None, 128))
    expect(True, "oneshot(model, recipe, processor) binds", failures)
    try:
        check_call(oneshot, {"model": None, "num_calibration_sample": 8})
    except ArmError as exc:
        expect(
            "num_calibration_sample" in str(exc), "a misspelt oneshot keyword is refused", failures
        )
    else:
        expect(False, "a misspelt oneshot keyword is refused", failures)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=QUESTION)
    parser.add_argument("--work", type=Path, default=None, help="keep the arms here")
    parser.add_argument("--samples", type=int, default=16, help="calibration samples")
    parser.add_argument("--autoawq", action="store_true", help="also the AutoAWQ back-end")
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    work = args.work or Path(tempfile.mkdtemp(prefix="arms-tiny-"))
    work.mkdir(parents=True, exist_ok=True)
    failures: list[str] = []
    print(f"work folder {work}")
    print("signature checks (installed llm-compressor):")
    signature_checks(failures)
    texts = load_calibration(calibration_data_dir(None), 10_000).texts
    source = work / "tiny-qwen2"
    started = time.perf_counter()
    info = build_tiny_source(source, texts)
    print(
        f"tiny Qwen2 from_config: {info['parameters']:,} parameters, vocab {info['vocab']}, "
        f"built in {time.perf_counter() - started:.1f} s"
    )
    base = {"source": str(source), "calibration_samples": args.samples, "max_seq_length": 256}
    cases: list[tuple[str, MakeOptions, Any]] = [
        (
            "awq (llm-compressor)",
            MakeOptions(method="awq", out=work / "awq", **base),
            lambda r, f: check_awq_layout(r, 128, f),
        ),
        (
            "fp8 dynamic",
            MakeOptions(method="fp8", out=work / "fp8", **base),
            lambda r, f: check_fp8_layout(r, False, f),
        ),
        (
            "fp8 static",
            MakeOptions(method="fp8", out=work / "fp8-static", fp8_activations="static", **base),
            lambda r, f: check_fp8_layout(r, True, f),
        ),
    ]
    if args.autoawq:
        cases.append(
            (
                "awq (autoawq)",
                MakeOptions(method="awq", out=work / "autoawq", awq_library="autoawq", **base),
                lambda r, f: check_autoawq_layout(r, 128, f),
            )
        )
    rows = []
    for label, options, check in cases:
        print(f"{label}:")
        cpu_before = _cpu_seconds()
        record = make_arm(options, force=True)
        cpu = _cpu_seconds() - cpu_before
        artifact = record.artifact or {}
        print(
            f"    made in {record.wall_seconds:.1f} s wall, {cpu:.1f} s CPU, "
            f"{artifact.get('size_bytes', 0) / 1e6:.2f} MB,"
            f" {record.library['name']} {record.library['version']}"
        )
        check(record, failures)
        if options.awq_library != "autoawq":  # transformers needs gptqmodel to load AWQ GEMM
            runs_back(record, failures)
        weights = _weights_bytes(record.artifact_path() or work)
        rows.append((label, record.wall_seconds, cpu, artifact.get("size_bytes", 0), weights))
    source_weights = _weights_bytes(source)
    print(
        f"\n{'arm':22} {'wall s':>7} {'CPU s':>7} {'folder MB':>10} {'weights MB':>11} {'/bf16':>6}"
    )
    print(f"{'bf16 source':22} {'':>7} {'':>7} {'':>10} {source_weights / 1e6:11.3f} {1.0:6.2f}")
    for label, seconds, cpu, size, weights in rows:
        print(
            f"{label:22} {seconds:7.1f} {cpu:7.1f} {size / 1e6:10.3f} {weights / 1e6:11.3f} "
            f"{weights / source_weights:6.2f}"
        )
    print(f"\n{'all layout checks passed' if not failures else f'{len(failures)} FAILED'}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(run_recorded("arms_tiny", main))
