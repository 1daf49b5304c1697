"""``python -m evals.arms make SOURCE --method awq|fp8|w8a8|gguf-requant --out DIR``, and
``python -m evals.arms check DIR --upstream URL``.

Exit status: 0 done; 1 the check failed a step; 2 the arm cannot be made or read as asked (the
message says why, and for a missing back-end which extra to install).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from evals.arms.backend import MakeOptions
from evals.arms.check import StepResult, check_upstream
from evals.arms.make import make_arm
from evals.arms.record import ArmError, load_arm

__all__ = ["main"]


def _make(args: argparse.Namespace) -> int:
    options = MakeOptions(
        source=args.source,
        method=args.method,
        out=args.out,
        name=args.name,
        revision=args.revision,
        device=args.device,
        awq_library=args.awq_library,
        bits=args.bits,
        group_size=args.group_size,
        zero_point=not args.no_zero_point,
        fp8_activations=args.fp8_activations,
        on_the_fly=args.on_the_fly,
        tau2_data=args.tau2_data,
        calibration_samples=args.calibration_samples,
        calibration_seed=args.calibration_seed,
        max_seq_length=args.max_seq_length,
        ftype=args.ftype,
        cache_dir=args.cache_dir,
        threads=args.threads,
    )
    record = make_arm(options, force=args.force)
    print(f"made {record.summary()} in {record.wall_seconds:.1f} s")
    print(f"wrote {args.out / 'arm.json'}")
    return 0


def _print_step(step: StepResult) -> None:
    verdict = "ok" if step.ok else "FAILED"
    print(f"{step.name:10} {verdict:6} {step.seconds:6.1f} s  {step.detail}", flush=True)


def _check(args: argparse.Namespace) -> int:
    record = load_arm(args.arm)
    print(f"arm {record.summary()}")
    print(f"upstream {args.upstream}")
    api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
    result = check_upstream(
        args.upstream,
        model=args.model,
        api_key=api_key,
        timeout=args.timeout,
        max_tokens=args.max_tokens,
        on_step=_print_step,
    )
    print("check passed" if result.ok else "check FAILED")
    return 0 if result.ok else 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m evals.arms", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("make", help="make one precision arm and its arm.json")
    make.add_argument(
        "source",
        help="awq/fp8/w8a8: a checkpoint folder (or hub id with --revision); "
        "gguf-requant: q4_k_m (the embedded model) or its GGUF file",
    )
    make.add_argument(
        "--method",
        required=True,
        choices=["awq", "fp8", "w8a8", "gguf-requant"],
        help="awq: INT4 AWQ (llm-compressor or AutoAWQ, calibrated); fp8: FP8 (llm-compressor, "
        "or vLLM's on-the-fly flag); w8a8: INT8 weights per channel and dynamic per-token INT8 "
        "activations (llm-compressor, no calibration: the integer scheme vLLM for CPU serves); "
        "gguf-requant: llama.cpp re-quantization of the embedded GGUF",
    )
    make.add_argument("--out", type=Path, required=True, help="the arm folder")
    make.add_argument("--name", default=None, help="the arm's name (default: the folder's)")
    make.add_argument("--force", action="store_true", help="remake an arm already in --out")
    make.add_argument("--revision", default=None, help="the source's revision (hub ids)")
    make.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    awq = make.add_argument_group("awq")
    awq.add_argument("--awq-library", default="llmcompressor", choices=["llmcompressor", "autoawq"])
    awq.add_argument("--bits", type=int, default=4)
    awq.add_argument("--group-size", type=int, default=128)
    awq.add_argument("--no-zero-point", action="store_true", help="symmetric weights")
    fp8 = make.add_argument_group("fp8")
    fp8.add_argument(
        "--fp8-activations",
        default="dynamic",
        choices=["dynamic", "static"],
        help="dynamic: FP8_DYNAMIC (per-channel weight scales, per-token activation scales); "
        "static: FP8 (static per-tensor scales from the calibration text)",
    )
    fp8.add_argument(
        "--on-the-fly",
        action="store_true",
        help="no checkpoint: the arm is vLLM's --quantization fp8 on the source weights",
    )
    calibration = make.add_argument_group("calibration (awq, static fp8)")
    calibration.add_argument(
        "--tau2-data", type=Path, default=None, help="τ²-bench data (default: $TAU2_DATA_DIR)"
    )
    calibration.add_argument("--calibration-samples", type=int, default=128)
    calibration.add_argument("--calibration-seed", type=int, default=0)
    calibration.add_argument("--max-seq-length", type=int, default=512)
    gguf = make.add_argument_group("gguf-requant")
    gguf.add_argument(
        "--ftype", default="q3_k_m-requant", help="the repairproxy.local arm to make (q3_k_m, q2_k)"
    )
    gguf.add_argument("--cache-dir", type=Path, default=None, help="where q4_k_m is cached")
    gguf.add_argument("--threads", type=int, default=None)
    make.set_defaults(run=_make)

    check = sub.add_parser("check", help="smoke-test an arm behind an OpenAI-compatible server")
    check.add_argument("arm", type=Path, help="the arm folder (its arm.json)")
    check.add_argument("--upstream", required=True, help="base URL, e.g. http://host:8000/v1")
    check.add_argument("--model", default=None, help="model id (default: the first served)")
    check.add_argument("--api-key-env", default=None, help="environment variable with the key")
    check.add_argument("--timeout", type=float, default=300.0, help="seconds per request")
    check.add_argument("--max-tokens", type=int, default=128)
    check.set_defaults(run=_check)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        code: int = args.run(args)
    except ArmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
