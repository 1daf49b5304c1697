"""``python -m evals.demo``: first the scenes (``evals.demo.scenes``: short requests, repair off
beside the default), then one τ²-bench Retail episode through the proxy, told as a transcript.

Starts the embedded CPU model (fetched on first use), puts ``repairproxy serve`` in front of it,
runs one task with the scripted user (deterministic, no second model; ``--user llm`` for the LLM
user simulator) and prints, per agent turn, what the model wrote, what the proxy did, which tools
ran and the error budget left; then the reward, a one-line verdict and where to look next.
By default the episode runs twice, repair off and then reflexive, and the first agent turn where
the two agents received different answers is shown; ``--repair MODE`` runs one mode.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from evals.demo.transcript import (
    CHANNEL_WORDS,
    TurnView,
    episode_counts,
    first_divergence,
    render_transcript,
    turn_views,
    verdict,
)
from evals.grid.launch import LaunchError, ManagedProcess, free_port, proxy_command
from evals.tau2.agents import ModelConfig
from evals.tau2.data import ChecksumError, DataNotFoundError, resolve_data_dir
from evals.tau2.run import RunConfig, run
from repairproxy.types import RepairMode

__all__ = ["main"]

# Retail: exchange a helmet. The earlier demo sweep's task where repair changed most (105888a);
# under today's promotion rules both modes leave its answer as text, and the re-run sweep
# (studies/demo-sweep: tasks 75 80 105 78 0) found no task where reflexive repair fixes a call.
DEFAULT_TASK = "70"
BUDGET = 10  # the proxy's default --budget and τ²-bench's max_errors
# τ²-bench's tools reject undeclared arguments; the first-ever turn may prefill for many minutes.
PROXY_ARGS = ("--forbid-extra-arguments", "--upstream-timeout", "3600")
STUDY_COMMAND = "make study"  # printed commands work as printed: no activated venv assumed


def _say(text: str) -> None:
    print(text, flush=True)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


async def _run_with_ticker(config: RunConfig, proxy_log: Path) -> Any:
    """Run the episode; meanwhile print one line per agent answer as the proxy logs it."""
    task = asyncio.ensure_future(run(config))
    seen = 0
    started = last = time.monotonic()
    while not task.done():
        await asyncio.wait({task}, timeout=1.0)
        events = [e for e in _read_jsonl(proxy_log) if e.get("path") == "/v1/chat/completions"]
        if time.monotonic() - last >= 60 and len(events) == seen:
            last = time.monotonic()
            _say(
                f"  ... the model is still working on answer {seen + 1} ({last - started:.0f} s in)"
            )
        for event in events[seen:]:
            seen += 1
            last = time.monotonic()
            caught = ", ".join(event.get("channels") or []) or "nothing"
            _say(
                f"  answer {seen}: {event.get('latency_ms', 0) / 1000:.1f} s, proxy caught "
                f"{caught}, outcome {event.get('outcome')} ({time.monotonic() - started:.0f} s in)"
            )
    return task.result()


def _model_id(base_url: str) -> str:
    import httpx

    models = httpx.get(f"{base_url}/models", timeout=10.0, trust_env=False).json()
    return str(models["data"][0]["id"])


def _declared_tools(domain: str, data_dir: Path, forbid_extra: bool) -> Any:
    from evals.tau2.domains import load_domain
    from repairproxy.validation import ToolsCache

    tools = load_domain(domain, data_dir).new_environment().agent_tools()
    return ToolsCache(forbid_extra_arguments=forbid_extra).compile({"tools": tools})


def _report(
    results: Any, args: argparse.Namespace, data_dir: Path, answers: Path
) -> list[TurnView]:
    [episode] = results.simulations
    tools = _declared_tools(args.domain, data_dir, "--forbid-extra-arguments" in PROXY_ARGS)
    views = turn_views(episode, tools, _read_jsonl(answers))
    counts = episode_counts(views)
    _say("")
    _say(f"== transcript: {args.domain} task {args.task_id}, repair {args.repair} ==")
    opening = next((m for m in episode.messages if m.role == "user"), None)
    if opening is not None and opening.content:
        _say(f"  user: {' '.join(opening.content.split())}")
    for line in render_transcript(views, repair=args.repair, budget=BUDGET):
        _say(line)
    seen = sorted({c for v in views for c in v.caught} | {c for v in views for c in v.delivered})
    if seen:
        _say("")
        _say("channels: " + "; ".join(f"{c} = {CHANNEL_WORDS.get(c, c)}" for c in seen))
    _say("")
    caught = ", ".join(f"{c} x{n}" for c, n in sorted(counts.caught.items())) or "none"
    _say(
        f"agent answers {counts.agent_turns}; caught by the proxy: {caught}; promoted "
        f"{counts.promoted}; re-asks {counts.reasks}; invalid answers delivered to the agent "
        f"{counts.invalid_delivered}; tool calls run {counts.tool_calls} "
        f"({counts.failed_tool_calls} failed); budget left "
        f"{'-' if counts.budget_remaining is None else counts.budget_remaining} of {BUDGET}"
    )
    info = episode.reward_info
    if info is not None and info.nl_assertions_scored is False:
        _say("reward: DB and the other scored components only (NL assertions need --judge)")
    _say(f"verdict: {verdict(episode, counts, repair=args.repair)}")
    return views


def _save_dashboard(port: int, path: Path) -> None:
    """The proxy's /dashboard page as the episode left it, saved beside the results."""
    import urllib.request

    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/dashboard?snapshot", timeout=10
        ) as page:
            path.write_bytes(page.read())
    except OSError as exc:  # informative only: the episode's results are already saved
        _say(f"(the dashboard page could not be saved: {exc})")


def _next_steps(save_to: Path, proxy_log: Path, other_mode: str) -> None:
    _say("")
    _say("where to look next:")
    _say(f"  results (τ²-bench layout):  {save_to / 'results.json'}")
    _say(f"  proxy log (one JSON line per request):  {proxy_log}")
    _say(f"  the same episode, repair {other_mode}:  make demo-{other_mode}")
    _say(f"  the proxy's page at the end (a snapshot):  {save_to / 'dashboard.html'}")
    _say("  a live dashboard:  make serve  then open http://127.0.0.1:8080/dashboard")
    _say(f"  the study (two arms, repair off vs on):  {STUDY_COMMAND}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m evals.demo", description=__doc__)
    parser.add_argument("--task-id", default=DEFAULT_TASK)
    parser.add_argument("--domain", default="retail", choices=["retail", "telecom"])
    parser.add_argument("--arm", default="q4_k_m", help="embedded model arm")
    parser.add_argument(
        "--repair",
        type=RepairMode,
        default=None,
        choices=list(RepairMode),
        help="one mode; default: the episode twice, repair off then reflexive, and their first "
        "divergence",
    )
    parser.add_argument("--user", default="scripted", choices=["scripted", "llm"])
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--max-tokens", type=int, default=384, help="bound on each model answer")
    parser.add_argument("--seed", type=int, default=7, help="sampling seed of the episode")
    parser.add_argument("--threads", type=int, default=None, help="model threads (all cores)")
    parser.add_argument(
        "--save-to", type=Path, default=None, help="default: runs/demo-<repair mode>"
    )
    parser.add_argument("--tau2-data", type=Path, default=None)
    parser.add_argument(
        "--part",
        default="all",
        choices=["all", "scenes", "episode"],
        help="the scenes (evals/demo/scenes.toml, about a minute), the episode, or both (default)",
    )
    return parser


def _scenes(arm: str) -> int:
    """The scenes: the embedded model (threads pinned by scenes.toml) behind one proxy with the
    default repair; each scene asks twice, ``X-Repairproxy-Repair: off`` and then the default."""
    from evals.demo.scenes import load_scenes, run_scenes
    from repairproxy.local import start_embedded_upstream

    book = load_scenes()
    started = time.monotonic()
    _say(
        f"== scenes: {len(book.scenes)} short requests to the embedded model through the proxy, "
        "each sent twice: repair off (left), then the proxy's default (right); temperature "
        f"{book.sampling.get('temperature')}, seed {book.sampling.get('seed')}, "
        f"{book.threads} threads"
    )
    with ExitStack() as stack:
        upstream = stack.enter_context(
            start_embedded_upstream(arm, n_ctx=4096, n_threads=book.threads, prompt_cache=False)
        )
        port = free_port()
        log = Path(upstream.log_path).with_suffix(".proxy.log")
        proxy = ManagedProcess(
            "proxy",
            proxy_command(upstream.base_url, port, []),
            f"http://127.0.0.1:{port}/healthz",
            log,
        )
        try:
            stack.enter_context(proxy)
        except LaunchError as exc:
            _say(f"error: {exc}")
            return 1
        _say(f"   (model and proxy up in {time.monotonic() - started:.0f} s)")
        _say("")
        results = run_scenes(
            f"http://127.0.0.1:{port}/v1",
            _model_id(upstream.base_url),
            book,
            _say,
            metrics_url=f"http://127.0.0.1:{port}/metrics",
        )
        log.unlink(missing_ok=True)
    _say(
        "headers: x-repairproxy-tool-errors names each channel the proxy saw in any answer of "
        "the exchange (first answer and re-asks) once; x-repairproxy-first-tool-errors the first "
        "answer's alone; the delivered answer is described by x-repairproxy-delivered-tool-errors "
        "where the proxy sends it, and the '=>' lines judge it here from the answer itself "
        "(declared names, the schema)."
    )
    shown = sum(1 for r in results if r.outcomes == dict(r.scene.want))
    _say(
        f"scenes done in {time.monotonic() - started:.0f} s: {shown} of {len(results)} "
        "reproduced what they are meant to show here"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    from repairproxy.local import ensure_model

    if args.part != "episode":
        ensure_model(args.arm)
        code = _scenes(args.arm)
        if code or args.part == "scenes":
            return code
        _say("")

    try:
        data_dir = resolve_data_dir(args.tau2_data, os.environ)
    except (ChecksumError, DataNotFoundError) as exc:
        parser.exit(2, f"error: τ²-bench data: {exc}\n")
    modes = [args.repair] if args.repair is not None else [RepairMode.OFF, RepairMode.REFLEXIVE]
    runs = []
    for mode in modes:
        one = {**vars(args), "repair": mode}
        if args.save_to is not None and len(modes) > 1:
            one["save_to"] = args.save_to / str(mode)
        runs.append(_episode(parser, argparse.Namespace(**one), data_dir))
        _say("")
    if len(runs) == 2:
        for line in first_divergence(*runs, labels=("repair off", "reflexive")):
            _say(line)
    return 0


def _episode(
    parser: argparse.ArgumentParser, args: argparse.Namespace, data_dir: Path
) -> list[TurnView]:
    """One episode in ``args.repair``: run, told, saved under runs/demo-<mode>; its turns."""
    from repairproxy.local import ensure_model, start_embedded_upstream

    save_to: Path = args.save_to or Path("runs") / f"demo-{args.repair}"
    save_to.mkdir(parents=True, exist_ok=True)
    for stale in ("results.json", "proxy.log", "model-answers.jsonl"):
        (save_to / stale).unlink(missing_ok=True)  # one episode per run of the demo
    proxy_log, answers = save_to / "proxy.log", save_to / "model-answers.jsonl"
    _say(
        f"repairproxy demo: one τ²-bench {args.domain} episode (task {args.task_id}); agent = "
        f"Qwen2.5-Coder-1.5B-Instruct ({args.arm}, llama.cpp on CPU) behind the proxy "
        f"(--repair {args.repair}); user = {args.user}"
    )
    ensure_model(args.arm)
    started = time.monotonic()
    with ExitStack() as stack:
        _say("starting the embedded model and the proxy ...")
        agent_model = stack.enter_context(
            start_embedded_upstream(args.arm, n_threads=args.threads, answer_log=answers)
        )
        model = _model_id(agent_model.base_url)
        port = free_port()
        proxy = ManagedProcess(
            "proxy",
            proxy_command(agent_model.base_url, port, ["--repair", args.repair, *PROXY_ARGS]),
            f"http://127.0.0.1:{port}/healthz",
            proxy_log,
        )
        try:
            stack.enter_context(proxy)
        except LaunchError as exc:
            parser.exit(1, f"error: {exc}\n")
        user_model = None
        if args.user == "llm":
            user_server = stack.enter_context(start_embedded_upstream(args.arm))
            user_model = ModelConfig(model=model, base_url=user_server.base_url, max_tokens=256)
        config = RunConfig(
            domain=args.domain,
            data_dir=data_dir,
            save_to=save_to,
            user="scripted" if args.user == "scripted" else "llm",
            agent_model=ModelConfig(
                model=model,
                base_url=f"http://127.0.0.1:{port}/v1",
                max_tokens=args.max_tokens,
                seed=args.seed,
                # The first-ever turn prefills the whole policy: many minutes on busy cores.
                timeout_s=3600.0,
            ),
            user_model=user_model,
            num_trials=1,
            max_errors=BUDGET,
            max_steps=args.max_steps,
            task_ids=(args.task_id,),
            split=None,
            progress=False,
        )
        _say(
            "running the episode (the first answer reads the ~5,000-token system turn, policy + "
            "tools: minutes the first time, seconds once it is cached; live page "
            f"http://127.0.0.1:{port}/dashboard)"
        )
        results = asyncio.run(_run_with_ticker(config, proxy_log))
        _save_dashboard(port, save_to / "dashboard.html")  # while the proxy still runs
    _say(f"episode done in {time.monotonic() - started:.0f} s")
    views = _report(results, args, data_dir, answers)
    other = RepairMode.OFF if args.repair != RepairMode.OFF else RepairMode.REFLEXIVE
    _next_steps(save_to, proxy_log, other)
    return views


if __name__ == "__main__":
    sys.exit(main())
