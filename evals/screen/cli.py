"""``python -m evals.screen``: draw the points, ask every arm, write screen.json, report and plot.

    python -m evals.screen --arm bf16=http://127.0.0.1:8000/v1 --arm awq=http://127.0.0.1:8001/v1 \
        --reference bf16 --domain retail telecom --points 200 --seed 7 --out runs/screen
    python -m evals.screen --report runs/screen      # re-derive everything from answers.jsonl

The output folder holds ``points.json`` (the drawn points and each domain's tools, fixed on the
first run), ``run.json`` (the arms and the reference), ``answers.jsonl`` (every raw answer) and
what is derived from them. Running again with the same folder resumes: answered points are skipped,
new arms are asked the same points, and different ``--points/--seed/--domain`` are refused.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from evals.screen.answers import ANSWERS_FILE, AnswerLog, read_answers
from evals.screen.ask import ArmSpec, AskOptions, ScreenError, ask_arm, parse_arm, served
from evals.screen.points import DecisionPoint, replay_domain, select_points
from evals.screen.report import render_markdown, render_plot
from evals.screen.summary import PointLabel, summarize
from evals.tau2.data import DataNotFoundError, resolve_data_dir

__all__ = ["main", "prepare", "rebuild", "run_screen"]

POINTS_FILE = "points.json"
RUN_FILE = "run.json"
SCREEN_FILE = "screen.json"
REPORT_FILE = "report.md"
PLOT_FILE = "screen.png"
SPLIT = "base"


def _dump(path: Path, value: Any) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    partial.replace(path)


def _load(path: Path) -> Any:
    return orjson.loads(path.read_bytes())


def _points_record(
    points: Sequence[DecisionPoint],
    tools: Mapping[str, list[dict[str, Any]]],
    *,
    seed: int,
    count: int,
    domains: Sequence[str],
) -> dict[str, Any]:
    return {
        "format": 1,
        "seed": seed,
        "count": count,
        "domains": list(domains),
        "split": SPLIT,
        "tools": dict(tools),
        "points": [point.label() for point in points],
    }


def _check_same_points(previous: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    for key in ("seed", "count", "domains", "split"):
        if previous.get(key) != current.get(key):
            raise ScreenError(
                f"this folder screened {key}={previous.get(key)!r}, not {current.get(key)!r}; "
                "use another --out to screen other points"
            )
    if previous["points"] != current["points"] or previous["tools"] != current["tools"]:
        raise ScreenError(
            "the τ²-bench data gives other prompts than this folder was screened on; "
            "use another --out"
        )


def _parse_pair(text: str) -> tuple[str, str]:
    arm, sep, own = text.partition("=")
    if not sep or not arm or not own:
        raise ScreenError(f"--pair {text!r}: expected ARM=REFERENCE, e.g. s05q2=s05")
    return arm, own


def record_pairs(out: Path, pairs: Sequence[tuple[str, str]]) -> None:
    """Add ``pairs`` to the folder's run.json (kept in the order first given; no duplicates)."""
    run_path = out / RUN_FILE
    run = _load(run_path)
    names = {entry["name"] for entry in run["arms"]}
    known = [tuple(pair) for pair in run.get("pairs", [])]
    for arm, own in pairs:
        if arm not in names or own not in names or arm == own:
            raise ScreenError(f"--pair {arm}={own}: both must be arms of this screen, and differ")
        if (arm, own) not in known:
            known.append((arm, own))
    _dump(run_path, {**run, "pairs": [list(pair) for pair in known]})


def rebuild(out: Path) -> dict[str, Any]:
    """Write screen.json, report.md and screen.png from the folder's files; no model needed."""
    points_record = _load(out / POINTS_FILE)
    run = _load(out / RUN_FILE)
    labels = [
        PointLabel(p["key"], p["domain"], p["gold_name"], p["gold_arguments"])
        for p in points_record["points"]
    ]
    screen = summarize(
        points=labels,
        tools=points_record["tools"],
        answers=read_answers(out / ANSWERS_FILE),
        arms=[entry["name"] for entry in run["arms"]],
        reference=run["reference"],
        pairs=[(arm, own) for arm, own in run.get("pairs", [])],
        config={
            "seed": points_record["seed"],
            "domains": points_record["domains"],
            "split": points_record["split"],
            "arms": run["arms"],
        },
    )
    _dump(out / SCREEN_FILE, screen)
    (out / REPORT_FILE).write_text(render_markdown(screen), encoding="utf-8")
    render_plot(screen, out / PLOT_FILE)
    return screen


def prepare(
    *,
    arms: Sequence[tuple[str, str]],
    reference: str,
    domains: Sequence[str],
    count: int,
    seed: int,
    out: Path,
    data_dir: Path,
) -> tuple[list[DecisionPoint], dict[str, list[dict[str, Any]]]]:
    """Draw the points (checked against the folder's, if any) and record the arms (name, spec)."""
    names = [name for name, _ in arms]
    if len(set(names)) != len(names):
        raise ScreenError("arm names must be unique")
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    replayed = [replay_domain(name, data_dir, SPLIT) for name in domains]
    points = select_points(replayed, count, seed)
    tools = {domain.domain: domain.tools for domain in replayed}
    record = _points_record(points, tools, seed=seed, count=count, domains=domains)
    points_path = out / POINTS_FILE
    if points_path.is_file():
        _check_same_points(_load(points_path), orjson.loads(orjson.dumps(record)))
    else:
        _dump(points_path, record)
    print(
        f"{len(points)} decision points from the gold replay of {', '.join(domains)} "
        f"in {time.perf_counter() - started:.1f} s",
        file=sys.stderr,
    )
    run_path = out / RUN_FILE
    # A list, not a dict: the report keeps the order the arms were first given in.
    all_arms = [dict(arm) for arm in _load(run_path)["arms"]] if run_path.is_file() else []
    for name, spec in arms:
        known = next((entry for entry in all_arms if entry["name"] == name), None)
        if known is None:
            all_arms.append({"name": name, "spec": spec})
        else:
            known["spec"] = spec  # a URL may change between runs; the points do not
    if reference not in {entry["name"] for entry in all_arms}:
        raise ScreenError(f"--reference {reference!r} is not one of the arms")
    previous = _load(run_path) if run_path.is_file() else {}
    _dump(run_path, {**previous, "arms": all_arms, "reference": reference})
    return points, tools


def run_screen(
    *,
    arms: Sequence[ArmSpec],
    reference: str,
    domains: Sequence[str],
    count: int,
    seed: int,
    out: Path,
    data_dir: Path,
    options: AskOptions,
    pairs: Sequence[tuple[str, str]] = (),
) -> dict[str, Any]:
    """Draw (or reload) the points, ask each arm what it has not answered, then ``rebuild``."""
    points, tools = prepare(
        arms=[(arm.name, arm.spec) for arm in arms],
        reference=reference,
        domains=domains,
        count=count,
        seed=seed,
        out=out,
        data_dir=data_dir,
    )
    if pairs:
        record_pairs(out, pairs)
    with AnswerLog(out / ANSWERS_FILE) as log:
        for arm in arms:
            if all((arm.name, p.key) in log.done for p in points):
                continue
            with served(arm, options) as base_url:
                arm_started = time.perf_counter()
                asked = ask_arm(arm, base_url, points, tools, log, options)
                print(
                    f"{arm.name}: {asked} answers in {time.perf_counter() - arm_started:.1f} s",
                    file=sys.stderr,
                )
    return rebuild(out)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m evals.screen",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--arm", action="append", default=[], metavar="NAME=URL|ARM|DIR", help="an arm (repeat)"
    )
    parser.add_argument("--reference", help="the arm the others are compared with")
    parser.add_argument(
        "--pair",
        action="append",
        default=[],
        metavar="ARM=REFERENCE",
        help="also compare ARM with its own REFERENCE (repeat; e.g. a smaller model's Q2_K with "
        "its Q4_K_M); works with --report too",
    )
    parser.add_argument("--domain", nargs="+", default=["retail", "telecom"])
    parser.add_argument("--points", type=int, default=40, help="decision points, over all domains")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="output folder (resumed when it exists)")
    parser.add_argument("--report", type=Path, metavar="DIR", help="only re-derive DIR's outputs")
    parser.add_argument("--tau2-data", type=Path, default=None)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--concurrency", type=int, default=1, help="requests in flight per arm")
    parser.add_argument("--threads", type=int, default=None, help="embedded arms: CPU threads")
    parser.add_argument("--n-ctx", type=int, default=16384, help="embedded arms: context size")
    parser.add_argument("--model", default=None, help="model id sent (default: /models' first)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per answer")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        pairs = [_parse_pair(text) for text in args.pair]
        if args.report is not None:
            if pairs:
                record_pairs(args.report, pairs)
            screen = rebuild(args.report)
        else:
            if not args.arm or args.out is None:
                parser.error("--arm (at least one) and --out are required (or --report DIR)")
            arms = [parse_arm(text) for text in args.arm]
            reference = args.reference or arms[0].name
            data_dir = resolve_data_dir(args.tau2_data, os.environ)
            options = AskOptions(
                max_tokens=args.max_tokens,
                seed=args.seed,
                timeout_s=args.timeout,
                concurrency=args.concurrency,
                threads=args.threads,
                n_ctx=args.n_ctx,
                model=args.model,
            )
            screen = run_screen(
                arms=arms,
                reference=reference,
                domains=args.domain,
                count=args.points,
                seed=args.seed,
                out=args.out,
                data_dir=data_dir,
                options=options,
                pairs=pairs,
            )
    except (ScreenError, DataNotFoundError, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    flagged = screen["flagged"]
    verdict = "; ".join(f"{a}: {', '.join(c)}" for a, c in flagged.items()) or "none"
    print(f"screened {screen['points']} points x {len(screen['arms'])} arms; flagged: {verdict}")
    return 0
