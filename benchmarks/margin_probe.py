"""Tool-name margins of the embedded model, per precision arm (the ``--margin-probe`` mechanism).

``python -m benchmarks.margin_probe [--arms q4_k_m q3_k_m-requant] [--limit 12]``

Sends the first ``--limit`` of ``benchmarks.local_channels``' fixed agent prompts to each arm with
the probe's ``logprobs`` / ``top_logprobs`` added (``repairproxy.margin.with_probe``) and prints,
per prompt, the tool named (``*``: written as text) and the log-prob margin of its first token
over the best rival, then a summary per arm. Thin margins are where a lower precision flips a tool
choice. Asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from pathlib import Path

import httpx

from benchmarks.support.agent_prompts import DEFAULT_DATA_DIR, build_prompts
from benchmarks.support.results import run_recorded
from repairproxy.local import start_embedded_upstream
from repairproxy.margin import tool_name_margins, with_probe
from repairproxy.textcalls import find_text_calls

QUESTION = "How close does the embedded model come to writing another tool's name, per arm?"

THIN = 0.5


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=QUESTION)
    parser.add_argument("--arms", nargs="+", default=["q4_k_m", "q3_k_m-requant"])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--limit", type=int, default=12, help="first N prompts")
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--threads", type=int, default=None, help="model threads (default: cores)")
    args = parser.parse_args(argv)
    prompts = build_prompts(args.data_dir)[: args.limit]
    chosen: dict[str, dict[str, str | None]] = {}
    summary: dict[str, list[float]] = {}
    for arm in args.arms:
        print(f"\n-- arm {arm}: {len(prompts)} prompts, temperature 0", flush=True)
        margins: list[float] = []
        names: dict[str, str | None] = {}
        with (
            start_embedded_upstream(arm, n_ctx=8192, n_threads=args.threads) as upstream,
            httpx.Client(base_url=upstream.base_url, timeout=900) as client,
        ):
            for prompt in prompts:
                body, _ = with_probe(
                    {
                        "model": "local",
                        "messages": prompt.messages,
                        "tools": prompt.tools,
                        "temperature": 0.0,
                        "seed": 0,
                        "max_tokens": args.max_tokens,
                    }
                )
                answer = client.post("/chat/completions", json=body).json()
                message = answer["choices"][0]["message"]
                calls = message.get("tool_calls") or []
                written = find_text_calls(message.get("content") or "")
                # The first call's name, structured or written as text (marked with a *).
                name = (
                    calls[0]["function"]["name"]
                    if calls
                    else (f"*{written[0].name}" if written else None)
                )
                found = tool_name_margins(answer)
                margins.extend(found)
                names[prompt.id] = name
                shown = ", ".join(f"{m:.3f}" for m in found) or "-"
                print(f"  {prompt.id:28} {name or 'text':28} margin {shown}", flush=True)
        chosen[arm] = names
        summary[arm] = margins
    print("\narm                 calls  median    p10   min   share < 0.5 nats")
    for arm, margins in summary.items():
        if not margins:
            print(f"{arm:18} {0:6}")
            continue
        ordered = sorted(margins)
        p10 = ordered[max(int(0.1 * len(ordered)) - 1, 0)]
        thin = sum(m < THIN for m in margins) / len(margins)
        print(
            f"{arm:18} {len(margins):6} {statistics.median(margins):7.3f} {p10:6.3f} "
            f"{ordered[0]:6.3f} {100 * thin:8.1f}%"
        )
    if len(chosen) == 2:
        first, second = chosen.values()
        flipped = [p for p in first if first[p] != second.get(p)]
        print(f"\nprompts whose first tool differs between the arms: {len(flipped)} {flipped}")


if __name__ == "__main__":
    raise SystemExit(run_recorded("margin_probe", main))
