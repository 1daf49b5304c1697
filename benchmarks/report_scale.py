"""The study's report at the paper grid's size: ``python -m benchmarks.report_scale``.

Writes synthetic results files in τ²-bench's layout at the paper grid's full size (4 models × 3
precisions × 2 domains × 5 repair modes = 120 files, 114 tasks × 4 trials each, laid out as
``<cell>/<mode>/results.json`` like ``evals.repair_ablation``), runs the analysis and the report on
them, and prints the wall time, the HTML's size, each PNG's pixel size and report.md's length.
Smaller grids (``--models 1 --tasks 10``) are what the tests use to check sizes, never times.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import struct
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.support.results import run_recorded
from tests.evals.fixtures_tau2 import Call, Turn, episode, not_found, results, write

__all__ = ["MODELS", "MODES", "PRECISIONS", "main", "paper_pairs", "png_size", "write_grid"]

QUESTION = "How long and how large is the study's report at the paper grid's size?"

MODELS = ("gemma4-dense", "gemma4-moe", "qwen36-dense", "qwen35-moe")
PRECISIONS = ("bf16", "fp8", "int4")
DOMAINS = ("retail", "telecom")
MODES = ("off", "prompt", "promote", "reflexive", "constrained")
_DECLARED = (
    "get_order_details",
    "get_user_details",
    "get_product_details",
    "find_user_id_by_email",
    "find_user_id_by_name_zip",
    "cancel_pending_order",
    "modify_pending_order_items",
)
_INVENTED = (
    "get_order_status",
    "get_user_info",
    "find_user_id_by_phone",
    "lookup_order",
    "search_orders",
    "get_product_info",
    "cancel_order",
)
_ARGUMENT = (
    "Error: RetailTools.cancel_pending_order() missing 1 required positional argument: 'reason'"
)


def _episode(
    rng: random.Random, task: int, trial: int, *, success: float, invent: float, mode: str
) -> dict[str, Any]:
    turns = []
    for _ in range(rng.randint(2, 5)):
        draw = rng.random()
        name = rng.choice(_DECLARED)
        written = name
        proxy: dict[str, Any]
        if draw < invent:
            wrong = written = rng.choice(_INVENTED)
            if mode == "off":
                proxy = {"tool_errors": ["unknown_tool"], "repairs": 0, "unknown_tools": [wrong]}
                call = Call(wrong, not_found(wrong))
            else:
                proxy = {
                    "tool_errors": ["unknown_tool"],
                    "repairs": 1,
                    "unknown_tools": [wrong],
                    "upstream_calls": 2,
                    "repair_prompt_tokens": rng.randint(800, 2400),
                    "repair_completion_tokens": rng.randint(10, 60),
                    "repair_seconds": round(rng.uniform(0.3, 2.0), 3),
                }
                call = Call(name)
        elif draw < invent + 0.04:
            proxy, call = {"tool_errors": [], "repairs": 0}, Call(name, _ARGUMENT)
        elif draw < invent + 0.08:
            proxy, call = {"tool_errors": [], "repairs": 0}, Call(name, "Error: Order not found")
        else:
            proxy, call = {"tool_errors": [], "repairs": 0, "upstream_calls": 1}, Call(name)
        # The probe's margin (paper.toml turns it on): invented names sit thinner.
        centre = 0.4 if written != name else 2.0
        proxy["tool_name_margins"] = f"{written}={rng.gauss(centre, 0.8):.3f}"
        turns.append(Turn((call,), proxy=proxy))
    reward = 1.0 if rng.random() < success else 0.0
    return episode(f"task_{task:03d}", trial, turns, reward=reward)


def write_grid(
    root: Path,
    *,
    models: Sequence[str] = MODELS,
    precisions: Sequence[str] = PRECISIONS,
    domains: Sequence[str] = DOMAINS,
    modes: Sequence[str] = MODES,
    tasks: int = 114,
    trials: int = 4,
    seed: int = 20261201,
) -> list[Path]:
    """One results file per model × precision × domain × mode under ``root``; their paths."""
    rng = random.Random(seed)
    paths = []
    for domain in domains:
        for m, model in enumerate(models):
            for p, precision in enumerate(precisions):
                cell = f"{domain}-{model}-{precision}-gpt41-k10"
                for mode in modes:
                    invent = 0.05 + 0.03 * p + 0.01 * m
                    success = 0.55 - 0.02 * p + (0.03 if mode != "off" else 0.0)
                    simulations = [
                        _episode(rng, t, k, success=success, invent=invent, mode=mode)
                        for t in range(tasks)
                        for k in range(trials)
                    ]
                    content = results(
                        simulations, agent_model=f"openai/{model}-{precision}", domain=domain
                    )
                    paths.append(write(root / cell / mode / "results.json", content))
    return paths


def paper_pairs(
    models: Sequence[str] = MODELS,
    precisions: Sequence[str] = PRECISIONS,
    domains: Sequence[str] = DOMAINS,
    modes: Sequence[str] = MODES,
) -> list[tuple[str, str]]:
    """The paper grid's comparisons, as ``evals.repair_ablation.analysis_pairs`` makes them:
    in each cell, mode off against every other mode (24 cells x 4 = 96), and each quantized
    precision against the reference precision (the first) at every mode (4 x 2 x 2 x 5 = 80):
    176 pairs, which the built-in rule puts into the precision, repair-mode and other families."""
    reference, *quantized = precisions
    pairs = []
    for domain in domains:
        for model in models:
            for precision in precisions:
                cell = f"{domain}-{model}-{precision}-gpt41-k10"
                pairs += [(f"{cell}/off", f"{cell}/{mode}") for mode in modes if mode != "off"]
            for precision in quantized:
                for mode in modes:
                    base = f"{domain}-{model}-{reference}-gpt41-k10/{mode}"
                    pairs.append((base, f"{domain}-{model}-{precision}-gpt41-k10/{mode}"))
    return pairs


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) in pixels from a PNG's IHDR chunk."""
    head = path.read_bytes()[:24]
    width, height = struct.unpack(">II", head[16:24])
    return int(width), int(height)


def _cpu_seconds() -> float:
    """User + system time of this process and its waited-for children (the figure workers)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.report_scale",
        description=f"{QUESTION}\n\n{__doc__}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--models", type=int, default=len(MODELS))
    parser.add_argument("--tasks", type=int, default=114)
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None, help="keep the files here")
    parser.add_argument(
        "--runs",
        type=Path,
        default=None,
        help="the results files' folder: written there once, read from there on later runs "
        "(the same grid for the same sizes and seed), so runs compare the analysis alone",
    )
    args = parser.parse_args(argv)
    from evals.analyze import analyze

    with tempfile.TemporaryDirectory() as scratch:
        root = args.out or Path(scratch)
        started = time.perf_counter()
        runs = args.runs or root / "runs"
        paths = sorted(runs.rglob("results.json")) if args.runs else []
        reused = bool(paths)
        if not reused:
            paths = write_grid(
                runs, models=MODELS[: args.models], tasks=args.tasks, trials=args.trials
            )
        written = time.perf_counter() - started
        load = os.getloadavg()[0]
        cpu_before = _cpu_seconds()
        started = time.perf_counter()
        pairs = paper_pairs(MODELS[: args.models])
        summary = analyze(paths, pairs, root / "report", "synthetic paper grid")
        took = time.perf_counter() - started
        cpu = _cpu_seconds() - cpu_before
        report = root / "report"
        if reused:
            print(f"{len(paths)} results files found in {runs}")
        else:
            print(f"{len(paths)} results files written in {written:.1f} s")
        # On a shared machine the wall time is the neighbours' as much as ours: CPU time too.
        print(
            f"analysis + report of {len(paths)} files: {took:.1f} s wall, {cpu:.1f} s CPU "
            f"(this process and its figure workers), load average {load:.1f} at the start"
        )
        families: dict[str, int] = {}
        for pair in summary.pairs:
            families[pair.family] = families.get(pair.family, 0) + 1
        print(f"arms {len(summary.arms)}, pairs {len(summary.pairs)}")
        print("families: " + ", ".join(f"{name} {n}" for name, n in families.items()))
        html_bytes = (report / "report.html").stat().st_size
        print(f"report.html: {html_bytes / 1e6:.2f} MB")
        lines = (report / "report.md").read_text(encoding="utf-8").splitlines()
        print(f"report.md: {len(lines)} lines")
        pngs = sorted(report.rglob("*.png"))
        print(f"{len(pngs)} PNG files")
        for png in pngs:
            width, height = png_size(png)
            print(f"  {png.relative_to(report)}: {width} x {height} px")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_recorded("report_scale", main))
