"""Where the proxy's CPU per request goes: the real server under cProfile, driven by the overhead
benchmark's client against the fast upstream, then the top functions printed.

    python -m benchmarks.diagnostics.profile_request [--requests 3000] [--concurrency 16] [--top 30]
        [--sort tottime|cumulative|ncalls] [--save FILE] [--stream]

The server runs as ``python -m cProfile -o FILE -m repairproxy serve`` with every feature on
(validation, metrics, chaining: no episode header; its log read from a pipe), and stops on
SIGINT so the profile is written. cProfile itself slows Python code ~2x: read the shares, not
the absolute times (``benchmarks.overhead`` measures CPU per request without a profiler). Before
the top functions it prints each package's share of the profiled time (own time, summed by the
module's package: ``repairproxy.asgi.chat``, ``uvicorn``, ``prometheus_client``, builtins...;
the loop's idle poll and start-up imports left out).
"""

from __future__ import annotations

import argparse
import asyncio
import pstats
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import orjson

from benchmarks.support.load import REQUEST_BODY, Target, free_port, http_request, wait_port


def _drain(stream: object) -> None:
    for _ in stream:  # type: ignore[attr-defined]
        pass


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--sort", default="tottime", choices=["tottime", "cumulative", "ncalls"])
    parser.add_argument("--save", type=Path, help="also keep the raw profile (pstats) here")
    parser.add_argument("--stream", action="store_true", help="streamed answers (SSE), not JSON")
    args = parser.parse_args(argv)
    upstream_port, proxy_port = free_port(), free_port()
    upstream = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.support.fast_upstream", "--port", str(upstream_port)],
        stdout=subprocess.DEVNULL,
    )
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "proxy.prof"
        proxy = subprocess.Popen(
            [
                *(sys.executable, "-m", "cProfile", "-o", str(out), "-m", "repairproxy", "serve"),
                *("--upstream", f"http://127.0.0.1:{upstream_port}/v1", "--port", str(proxy_port)),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        threading.Thread(target=_drain, args=(proxy.stdout,), daemon=True).start()
        try:
            wait_port(upstream_port)
            wait_port(proxy_port)
            body = {**REQUEST_BODY, "stream": True} if args.stream else REQUEST_BODY
            request = http_request(proxy_port, orjson.dumps(body))
            target = Target("proxy", proxy_port, request)

            async def drive() -> None:
                await target.round(args.concurrency, 200, record=False)  # warm up
                await target.round(args.concurrency, args.requests)

            asyncio.run(drive())
        finally:
            proxy.send_signal(signal.SIGINT)
            proxy.wait(30)
            upstream.terminate()
            upstream.wait(10)
        stats = pstats.Stats(str(out))
        if args.save is not None:
            stats.dump_stats(str(args.save))
        calls = target.count.get(args.concurrency, args.requests) + 200
        kind = "streamed" if args.stream else "JSON"
        print(f"{calls} {kind} requests at concurrency {args.concurrency}")
        _print_shares(stats, calls)
        print(f"profile sorted by {args.sort}")
        stats.strip_dirs().sort_stats(args.sort).print_stats(args.top)


def _group(filename: str, function: str) -> str:
    """The package a profiled function belongs to (two levels inside repairproxy); a C
    function (orjson, hashlib, re, a socket call) by its own name."""
    if filename.startswith("~") or filename.startswith("<"):
        return f"C {function}"
    path = Path(filename)
    parts = path.parts
    if "repairproxy" in parts:
        inner = parts[parts.index("repairproxy") + 1 :]
        name = ".".join(p.removesuffix(".py") for p in inner[:2])
        return f"repairproxy.{name}"
    if "site-packages" in parts:
        return parts[parts.index("site-packages") + 1].removesuffix(".py")
    return f"stdlib {path.stem}"


# Own time that is waiting (the loop's poll inside uvloop's run) or start-up (imports), not work.
_NOT_WORK = ("run_until_complete", "run_forever", "poll", "select", "importlib", "exec")


def _print_shares(stats: pstats.Stats, calls: int) -> None:
    own: dict[str, float] = {}
    for (filename, _, function), (_, _, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        if any(word in function or word in filename for word in _NOT_WORK):
            continue
        group = _group(filename, function)
        own[group] = own.get(group, 0.0) + tottime
    total = sum(own.values())
    print(f"profiled time {total:.2f} s, {total / calls * 1e6:.0f} us a request under cProfile")
    # Calls do not depend on the machine's load, times do (start-up's calls included).
    function_calls = stats.total_calls  # type: ignore[attr-defined]
    print(f"{function_calls} function calls, {function_calls / calls:.0f} a request")
    for group, seconds in sorted(own.items(), key=lambda item: -item[1])[:30]:
        print(f"  {seconds / total:6.1%}  {seconds / calls * 1e6:7.1f} us/request  {group}")


if __name__ == "__main__":
    main()
