"""Where the proxy's CPU per request goes: the real server under cProfile, driven by the overhead
benchmark's client against the fast upstream, then the top functions printed.

    python -m benchmarks.profile_request [--requests 3000] [--concurrency 16] [--top 30]

The server runs as ``python -m cProfile -o FILE -m repairproxy serve`` with every feature on
(validation, metrics, chaining: no episode header; its log read from a pipe), and stops on
SIGINT so the profile is written. cProfile itself slows Python code ~2x: read the shares, not
the absolute times (``benchmarks.overhead`` measures CPU per request without a profiler).
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

from benchmarks.overhead import REQUEST_BODY, _free_port, _http_request, _Target, _wait_port


def _drain(stream: object) -> None:
    for _ in stream:  # type: ignore[attr-defined]
        pass


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--sort", default="tottime", choices=["tottime", "cumulative"])
    args = parser.parse_args(argv)
    upstream_port, proxy_port = _free_port(), _free_port()
    upstream = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.fast_upstream", "--port", str(upstream_port)],
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
            _wait_port(upstream_port)
            _wait_port(proxy_port)
            request = _http_request(proxy_port, orjson.dumps(REQUEST_BODY))
            target = _Target("proxy", proxy_port, request)

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
        calls = target.count.get(args.concurrency, args.requests) + 200
        print(f"{calls} requests at concurrency {args.concurrency}; profile sorted by {args.sort}")
        stats.strip_dirs().sort_stats(args.sort).print_stats(args.top)


if __name__ == "__main__":
    main()
