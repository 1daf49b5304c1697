"""What validating one assistant answer costs, per kind of answer, across source trees in one run.

The text-call check (call shapes in the text, the promotion-safety rules, each model family's
native format) runs on every answer with text. This times ``ToolsCache.check_message`` (with
the request's ``CallRules`` where the tree has them: the pipeline's path) on a fixed set of
answers: a valid structured call, plain prose, a JSON call written as text, one native call per
family (taken from ``tests/data/textcalls/native/``), and hostile prose (a declined call, a
narrated one, a long text naming markers). Each tree runs in its own subprocess with its own
``repairproxy`` on the path; rounds alternate between trees so load drift hits all alike; the
figures are medians over rounds of the best of a few repeats, in microseconds per answer.

    python -m benchmarks.diagnostics.textcalls_cost --variant now --variant base@/tmp/base
    [--rounds 5]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import timeit
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["main"]

ROOT = Path(__file__).resolve().parent.parent
NATIVE = ROOT / "tests" / "data" / "textcalls" / "native"
HOSTILE = ROOT / "tests" / "data" / "textcalls" / "hostile.jsonl"
NATIVE_FAMILIES = (
    "gemma4",
    "mistral",
    "kimi_k2",
    "openai_harmony",
    "deepseek_v3",
    "minimax_m2",
    "qwen3coder",
    "llama4_pythonic",
    "granite_pythonic",
    "glm45",
)

ORDER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_order_details",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
        },
    },
}
USER = [{"role": "user", "content": "Where is my order #W2378156?"}]
JSON_CALL = '{"name": "get_order_details", "arguments": {"order_id": "#W2378156"}}'
MARKER_PROSE = (
    "Models write calls in many ways: a <tool_call> tag, Mistral's [TOOL_CALLS] marker, Gemma's "
    "call: prefix, or functions.NAME in harmony; recall: none of them is a call here (see "
    "the docs [section 3] for get_order_details(order_id) and friends). "
) * 12


@dataclass(frozen=True)
class _Variant:
    """One tree to measure: a label and the checkout it imports ``repairproxy`` from."""

    label: str
    source: Path

    @classmethod
    def parse(cls, text: str) -> _Variant:
        """``LABEL`` (this tree) or ``LABEL@DIR`` (e.g. a git worktree of an older commit)."""
        label, _, source = text.partition("@")
        return cls(label, Path(source) if source else ROOT)


def _first_positive(family: str) -> dict[str, Any]:
    with (NATIVE / f"{family}.jsonl").open(encoding="utf-8") as handle:
        for line in handle:
            case: dict[str, Any] = json.loads(line)
            if case["expected_calls"] and not case.get("marker_stripped"):
                return case
    raise LookupError(family)


def _hostile(category: str) -> dict[str, Any]:
    with HOSTILE.open(encoding="utf-8") as handle:
        for line in handle:
            case: dict[str, Any] = json.loads(line)
            if case["category"] == category:
                return case
    raise LookupError(category)


def cases() -> list[dict[str, Any]]:
    """The answers timed: name, request body (tools, messages) and the assistant message."""
    order = {"tools": [ORDER_TOOL], "messages": USER}
    valid = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_order_details", "arguments": '{"order_id": "#W1"}'},
            }
        ],
    }
    prose = "Your order #W2378156 was delivered on Monday; it held 2 items. " * 5
    chosen = [
        ("valid structured call", order, valid),
        ("plain prose", order, {"role": "assistant", "content": prose}),
        (
            "JSON text call",
            order,
            {"role": "assistant", "content": "I will look that up now.\n" + JSON_CALL},
        ),
    ]
    for family in NATIVE_FAMILIES:
        case = _first_positive(family)
        body = {"tools": case["tools"], "messages": USER}
        chosen.append((f"native {family}", body, {"role": "assistant", "content": case["text"]}))
    for category in ("declined", "quoted_past_call", "native_format_hostile"):
        case = _hostile(category)
        body = {**case["request"], "messages": case["messages"]}
        chosen.append(
            (f"hostile {category}", body, {"role": "assistant", "content": case["content"]})
        )
    chosen.append(("hostile long prose", order, {"role": "assistant", "content": MARKER_PROSE}))
    return [{"name": n, "body": b, "message": m} for n, b, m in chosen]


def _child(repeats: int, budget_s: float) -> None:
    """Time every case read from stdin with the ``repairproxy`` on the path; print JSON."""
    from repairproxy.validation import ToolsCache

    try:
        from repairproxy.validation import CallRules
    except ImportError:  # a tree from before the request's rules
        rules_of = None
    else:
        rules_of = CallRules.of_request
    results = {}
    cache = ToolsCache()
    for case in json.load(sys.stdin):
        tools = cache.compile(case["body"])
        assert tools is not None, case["name"]  # every case declares tools
        message = case["message"]
        if rules_of is None:
            run = functools.partial(tools.check_message, message)
        else:
            run = functools.partial(tools.check_message, message, rules=rules_of(case["body"]))
        run()
        number = max(1, int(budget_s / max(timeit.timeit(run, number=20) / 20, 1e-7)))
        best = min(timeit.repeat(run, number=number, repeat=repeats)) / number
        results[case["name"]] = best * 1e6
    json.dump(results, sys.stdout)


def _measure(variant: _Variant, payload: bytes, repeats: int, budget_s: float) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(variant.source)}
    command = [sys.executable, "-P", str(Path(__file__).resolve()), "--child"]
    command += ["--repeats", str(repeats), "--budget", str(budget_s)]
    done = subprocess.run(
        command, input=payload, env=env, cwd=variant.source, capture_output=True, check=True
    )
    return {str(k): float(v) for k, v in json.loads(done.stdout).items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--variant",
        type=_Variant.parse,
        action="append",
        help="LABEL or LABEL@DIR, e.g. --variant now --variant base@/tmp/base (repeatable)",
    )
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per variant")
    parser.add_argument("--repeats", type=int, default=5, help="timing repeats per round (best)")
    parser.add_argument("--budget", type=float, default=0.05, help="seconds per repeat")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.repeats, args.budget)
        return
    variants: list[_Variant] = args.variant or [_Variant("now", ROOT)]
    chosen = cases()
    payload = json.dumps(chosen).encode()
    samples: dict[str, dict[str, list[float]]] = {v.label: {} for v in variants}
    for _ in range(args.rounds):
        for variant in variants:
            for name, value in _measure(variant, payload, args.repeats, args.budget).items():
                samples[variant.label].setdefault(name, []).append(value)
    labels = [v.label for v in variants]
    print(
        f"check_message, us per answer: median over {args.rounds} interleaved rounds "
        f"(best of {args.repeats} repeats each)"
    )
    for variant in variants:
        print(f"  {variant.label}: {variant.source}")
    header = f"{'answer':<32}" + "".join(f"{label:>12}" for label in labels)
    if len(labels) > 1:
        header += "".join(f"{label + '/' + labels[-1]:>16}" for label in labels[:-1])
    print(header)
    for case in chosen:
        name = case["name"]
        medians = [statistics.median(samples[label].get(name, [float("nan")])) for label in labels]
        row = f"{name:<32}" + "".join(f"{m:>12.1f}" for m in medians)
        if len(labels) > 1:
            row += "".join(f"{m / medians[-1]:>15.2f}x" for m in medians[:-1])
        print(row)


if __name__ == "__main__":
    main()
