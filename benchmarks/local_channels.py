"""Per-channel error rates of the embedded model on 50 fixed agent prompts, for each precision arm.

``python -m benchmarks.local_channels [--arms q4_k_m q3_k_m-requant] [--proxy]``

The 50 agent prompts (35 Retail, 15 Telecom) are built deterministically at run time from
τ²-bench's data: user emails, names, zips and order ids from the Retail db, phone numbers and ids
from the Telecom db, the domain policies as system prompts, and the domains' agent tools. Each
answer is classified with ``repairproxy.validation`` into the proxy's channels (a call written as
text also by what was wrong inside it: an invented name, bad arguments). With ``--proxy``, the
first arm is also run through the proxy in each of ``--modes`` (off, promote, reflexive,
constrained; header ``X-Repairproxy-Repair``), counting the invalid answers that reach the client
and how many of them start with the right tool.
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai

from benchmarks.support.agent_prompts import DEFAULT_DATA_DIR, Prompt, build_prompts
from benchmarks.support.results import run_recorded
from repairproxy.local import start_embedded_upstream
from repairproxy.validation import ToolsCache

QUESTION = "How often does the embedded model make each kind of tool-call error, per precision arm?"

CHANNELS = (
    "valid",
    "unknown_tool",
    "invalid_json",
    "schema_violation",
    "tool_call_in_content",
    "empty_output",
)


@dataclass(slots=True)
class Outcome:
    prompt: Prompt
    channels: list[str]  # one per call, or one silent-failure channel, or [] for plain text
    first_call: str | None  # name of the first parsed tool call
    intended: str | None  # name of the first call in any form (parsed, or written in the text)
    seconds: float
    completion_tokens: int
    header_channels: str | None = None
    repairs: str | None = None
    promoted: str | None = None
    inner: list[str] = field(default_factory=list)  # what was wrong inside each text call
    invented: list[str] = field(default_factory=list)  # undeclared names, any form


def classify(
    prompt: Prompt, message: dict[str, Any], cache: ToolsCache
) -> tuple[list[str], str | None, list[str], list[str]]:
    """(channel of every call, or of the silent failure; the first call's name in any form;
    the inner channel of each text call; the undeclared names)."""
    compiled = cache.compile({"tools": prompt.tools})
    assert compiled is not None
    verdicts = compiled.check_message(message).calls
    inner = [str(v.inner) for v in verdicts if v.inner is not None]
    invented = [
        v.name
        for v in verdicts
        if v.name and compiled.schema_for(v.name) is None and v.channel != "empty_output"
    ]
    first = verdicts[0].name if verdicts else None
    return [str(v.channel) for v in verdicts], first, inner, invented


def run_prompts(
    client: openai.OpenAI,
    prompts: Sequence[Prompt],
    *,
    temperature: float,
    max_tokens: int,
    headers: dict[str, str] | None = None,
) -> list[Outcome]:
    cache = ToolsCache()
    outcomes = []
    for i, prompt in enumerate(prompts):
        start = time.perf_counter()
        raw = client.chat.completions.with_raw_response.create(
            model="local",
            messages=prompt.messages,
            tools=prompt.tools,
            temperature=temperature,
            seed=i,
            max_tokens=max_tokens,
            extra_headers=headers,
        )
        reply = raw.parse()
        message = reply.choices[0].message.model_dump(exclude_none=True)
        calls = message.get("tool_calls") or []
        channels, intended, inner, invented = classify(prompt, message, cache)
        outcomes.append(
            Outcome(
                prompt,
                channels,
                calls[0]["function"]["name"] if calls else None,
                intended,
                time.perf_counter() - start,
                reply.usage.completion_tokens if reply.usage else 0,
                raw.headers.get("x-repairproxy-tool-errors"),
                raw.headers.get("x-repairproxy-repairs"),
                raw.headers.get("x-repairproxy-promoted"),
                inner,
                invented,
            )
        )
        print(
            f"  {prompt.id:28} {','.join(outcomes[-1].channels) or 'text':24} "
            f"{outcomes[-1].intended or '-':28} {outcomes[-1].seconds:5.1f}s"
            + (
                f"  caught={outcomes[-1].header_channels!r} repairs={outcomes[-1].repairs}"
                if headers
                else ""
            ),
            flush=True,
        )
    return outcomes


def summarize(label: str, outcomes: Sequence[Outcome]) -> None:
    calls = Counter(c for o in outcomes for c in o.channels)
    answers = Counter(
        "text" if not o.channels else ("valid" if set(o.channels) == {"valid"} else "invalid")
        for o in outcomes
    )
    with_expected = [o for o in outcomes if o.prompt.expected_tool]
    right = sum(o.first_call == o.prompt.expected_tool for o in with_expected)
    intended = sum(o.intended == o.prompt.expected_tool for o in with_expected)
    n = len(outcomes)
    print(f"\n== {label}: {n} prompts, {sum(calls.values())} classified calls/answers")
    for channel in CHANNELS:
        print(f"  {channel:22} {calls[channel]:3d}  ({calls[channel] / n:6.1%} of prompts)")
    inner = Counter(i for o in outcomes for i in o.inner)
    if inner:
        print("  inside the text calls: " + ", ".join(f"{k} {v}" for k, v in inner.items()))
    invented = Counter(name for o in outcomes for name in o.invented)
    if invented:
        print("  invented names: " + ", ".join(f"{k} x{v}" for k, v in invented.most_common()))
    print(
        f"  answers: {answers['valid']} all-valid calls, {answers['invalid']} with an invalid "
        f"call, {answers['text']} plain text"
    )
    print(
        f"  right first tool: {right}/{len(with_expected)} as a parsed call, {intended}/"
        f"{len(with_expected)} in any form (including calls written in the text)"
    )
    seconds = [o.seconds for o in outcomes]
    print(f"  latency per prompt: mean {sum(seconds) / n:.1f}s, max {max(seconds):.1f}s")


@contextmanager
def proxy(upstream: str) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "repairproxy", "serve", "--upstream", upstream]
    command += ["--port", str(port), "--log-level", "warning"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        process.wait(10)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=QUESTION)
    parser.add_argument("--arms", nargs="+", default=["q4_k_m", "q3_k_m-requant"])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--limit", type=int, default=None, help="first N prompts only")
    parser.add_argument("--proxy", action="store_true", help="also: repair off vs reflexive")
    parser.add_argument("--skip-arms", action="store_true", help="only the --proxy comparison")
    parser.add_argument("--threads", type=int, default=None, help="model threads (default: cores)")
    parser.add_argument(
        "--modes",
        nargs="+",
        default=["off", "promote", "reflexive", "constrained"],
        help="with --proxy",
    )
    args = parser.parse_args(argv)
    prompts = build_prompts(args.data_dir)[: args.limit]
    print(f"{len(prompts)} prompts; temperature {args.temperature}; max_tokens {args.max_tokens}")
    settings: dict[str, Any] = {"temperature": args.temperature, "max_tokens": args.max_tokens}
    results: dict[str, list[Outcome]] = {}
    for arm in [] if args.skip_arms else args.arms:
        print(f"\n-- arm {arm}")
        with (
            start_embedded_upstream(arm, n_ctx=8192, n_threads=args.threads) as upstream,
            openai.OpenAI(base_url=upstream.base_url, api_key="x", timeout=600) as client,
        ):
            results[arm] = run_prompts(client, prompts, **settings)
    if args.proxy:
        with (
            start_embedded_upstream(args.arms[0], n_ctx=8192, n_threads=args.threads) as upstream,
            proxy(upstream.base_url) as url,
            openai.OpenAI(base_url=url, api_key="x", timeout=600) as client,
        ):
            for mode in args.modes:
                print(f"\n-- proxy repair={mode} on {args.arms[0]}")
                headers = {"X-Repairproxy-Repair": mode}
                results[f"proxy repair={mode}"] = run_prompts(
                    client, prompts, headers=headers, **settings
                )
    for label, outcomes in results.items():
        summarize(label, outcomes)
    for mode in args.modes:
        outcomes = results.get(f"proxy repair={mode}")
        if outcomes:
            reached = sum(c not in ("valid",) for o in outcomes for c in o.channels)
            invalid = sum(any(c != "valid" for c in o.channels) for o in outcomes)
            caught = sum(bool(o.header_channels) for o in outcomes)
            repairs = sum(int(o.repairs or 0) for o in outcomes)
            promoted = sum(int(o.promoted or 0) for o in outcomes)
            expected = [o for o in outcomes if o.prompt.expected_tool]
            right = sum(o.first_call == o.prompt.expected_tool for o in expected)
            print(
                f"proxy repair={mode}: invalid answers reaching the client {invalid}/"
                f"{len(outcomes)} ({reached} invalid calls/answers); right first tool delivered "
                f"{right}/{len(expected)}; caught in {caught} answers; promoted {promoted}; "
                f"repair attempts {repairs}"
            )


if __name__ == "__main__":
    raise SystemExit(run_recorded("local_channels", main))
