"""``python -m evals.demo``: the zero-config demo, one short τ²-bench episode through the proxy.

Starts the embedded CPU model twice (agent and simulated user each get their own process, so each
keeps its own KV cache across turns), puts ``repairproxy serve`` in front of the agent's model, runs
one Retail task with an LLM agent and an LLM user, and prints what the proxy caught and repaired.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from evals.agents import ModelConfig
from evals.data import resolve_data_dir
from evals.run import RunConfig, run, summarize

__all__ = ["main"]

DEFAULT_TASK = "88"  # Retail: one cancellation; short enough for a 2-core CPU


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _wait_healthy(url: str, process: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the proxy exited with {process.returncode}")
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"the proxy did not answer {url} within {timeout:.0f} s")


def _model_id(base_url: str) -> str:
    models = httpx.get(f"{base_url}/models", timeout=10.0).json()
    return str(models["data"][0]["id"])


def _proxy_events(log_path: Path) -> list[dict[str, Any]]:
    events = []
    for line in log_path.read_text(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("event") == "request":
            events.append(event)
    return events


def _print_report(results: Any, events: list[dict[str, Any]], arm: str) -> None:
    print()
    print(f"model: Qwen2.5-Coder-1.5B-Instruct GGUF, arm {arm} (llama.cpp on CPU)")
    for sim in results.simulations:
        messages = sim.messages
        calls = sum(len(getattr(m, "tool_calls", None) or []) for m in messages)
        errors = sim.num_errors
        reward = sim.reward_info.reward if sim.reward_info else None
        print(
            f"task {sim.task_id}: {len(messages)} messages, {calls} tool calls, "
            f"{errors} failed tool calls, termination {sim.termination_reason}, reward {reward}"
        )
    channels: Counter[str] = Counter()
    repairs = 0
    for event in events:
        for channel in event.get("channels") or []:
            channels[channel] += 1
        repairs += int(event.get("repairs") or 0)
    print(f"proxy: {len(events)} agent requests, {repairs} repair attempts")
    print(f"proxy: channels caught {dict(channels) if channels else 'none'}")
    print(json.dumps(summarize(results), indent=2, default=str))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m evals.demo", description=__doc__)
    parser.add_argument("--task-id", default=DEFAULT_TASK)
    parser.add_argument("--domain", default="retail", choices=["retail", "telecom"])
    parser.add_argument("--arm", default="q4_k_m", help="embedded model arm")
    parser.add_argument("--repair", default="reflexive", help="proxy --repair mode")
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--max-tokens", type=int, default=384, help="bound on each model answer")
    parser.add_argument("--user-temperature", type=float, default=0.0)
    parser.add_argument("--save-to", type=Path, default=None)
    parser.add_argument("--tau2-data", type=Path, default=None)
    args = parser.parse_args(argv)

    from repairproxy.local import start_embedded_upstream

    data_dir = resolve_data_dir(args.tau2_data, os.environ)
    save_to = args.save_to or Path(tempfile.mkdtemp(prefix="repairproxy-demo-"))
    log_path = save_to / "proxy.log"
    print(f"starting two embedded models ({args.arm}) and the proxy ...", flush=True)
    with (
        start_embedded_upstream(args.arm) as agent_model,
        start_embedded_upstream(args.arm) as user_model,
        log_path.open("wb") as proxy_log,
    ):
        port = _free_port()
        command = [sys.executable, "-m", "repairproxy", "serve"]
        command += ["--upstream", agent_model.base_url, "--port", str(port)]
        command += ["--repair", args.repair]
        proxy = subprocess.Popen(
            command,
            stdout=proxy_log,
            stderr=subprocess.STDOUT,
        )
        try:
            _wait_healthy(f"http://127.0.0.1:{port}/healthz", proxy)
            model = _model_id(agent_model.base_url)
            config = RunConfig(
                domain=args.domain,
                data_dir=data_dir,
                save_to=save_to,
                agent_model=ModelConfig(
                    model=model,
                    base_url=f"http://127.0.0.1:{port}/v1",
                    max_tokens=args.max_tokens,
                ),
                user_model=ModelConfig(
                    model=model,
                    base_url=user_model.base_url,
                    max_tokens=args.max_tokens,
                    temperature=args.user_temperature,
                ),
                num_trials=1,
                max_steps=args.max_steps,
                task_ids=(args.task_id,),
            )
            print(f"running {args.domain} task {args.task_id} (a few minutes on 2 cores) ...")
            results = asyncio.run(run(config))
        finally:
            proxy.terminate()
            try:
                proxy.wait(10)
            except subprocess.TimeoutExpired:
                proxy.kill()
    _print_report(results, _proxy_events(log_path), args.arm)
    print(f"results: {config.results_path}; proxy log: {log_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
