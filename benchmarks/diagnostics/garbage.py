"""What a request leaves to Python's cycle collector, and the latency tail that makes.

Objects freed by reference counting go as the request ends; objects in a reference cycle wait for
the collector, which under load runs in pauses of milliseconds with every in-flight request
waiting (until 2026-12-03 each request left ~11 such objects: the server's response cycle and its
scope held each other; a collection of ~9,600 of them took 2-5.6 ms). Two measurements, each
proxy a real ``repairproxy serve`` on loopback beside ``benchmarks.support.fast_upstream``:

- **garbage**: per kind of request (a JSON answer, a stream, a 400 for a body that is not an
  object, a call to an undeclared tool (the repair path), a Responses and a Messages request
  translated to chat, and a JSON request on a connection of its own), the objects the
  collector finds unreachable per request, by type. A hook loaded into the proxy (a
  ``sitecustomize`` in a temp dir on its ``PYTHONPATH``) collects, keeps what the next
  collection finds (``gc.DEBUG_SAVEALL``) over ``--requests`` requests, and writes it out on
  ``SIGUSR1``.
- **tail**: added latency percentiles to p99.9 and the maximum at ``--clients`` clients, over
  ``--rounds`` interleaved rounds of ``--tail-requests`` requests per variant.

    python -m benchmarks.diagnostics.garbage [--requests 1000] [--rounds 6] [--tail-requests 4000]
        [--clients 16] [--variant LABEL[@DIR] ...] [--stream]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import uvloop

from benchmarks.support.load import REQUEST_BODY, Target, free_port, http_request, pct, wait_port

CHAT = b"/v1/chat/completions"
FRESH = "connection"  # the kind sent on a new connection per request

__all__ = ["main"]

# Loaded into the proxy: the first SIGUSR1 collects and starts keeping what the collector finds,
# the second collects again and writes the kept objects' types, then stops keeping them.
_HOOK = """
import collections, gc, json, os, signal
_keeping = [False]
def _usr1(signum, frame):
    if not _keeping[0]:
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        _keeping[0] = True
        return
    gc.collect()
    kinds = collections.Counter(type(o).__qualname__ for o in gc.garbage)
    out = os.environ["REPAIRPROXY_GARBAGE_OUT"]
    with open(out + ".tmp", "w") as f:
        json.dump(dict(kinds), f)
    os.replace(out + ".tmp", out)
    gc.set_debug(0)
    gc.garbage.clear()
    _keeping[0] = False
signal.signal(signal.SIGUSR1, _usr1)
"""

_TOOLS = [tool["function"] for tool in REQUEST_BODY["tools"]]
_QUESTION = REQUEST_BODY["messages"][-1]["content"]
_SYSTEM = REQUEST_BODY["messages"][0]["content"]

# kind: (path, body). Responses and Messages are translated to chat (``--upstream-apis chat``).
_KINDS: dict[str, tuple[bytes, bytes]] = {
    "json": (CHAT, orjson.dumps(REQUEST_BODY)),
    "stream": (CHAT, orjson.dumps({**REQUEST_BODY, "stream": True})),
    "400": (CHAT, orjson.dumps({"model": "bench-model", "messages": 5})),
    # the canned call's tool is not declared: a hallucinated name, the repair path
    "hallucinated": (
        CHAT,
        orjson.dumps(
            {
                **REQUEST_BODY,
                "tools": [
                    tool
                    for tool in REQUEST_BODY["tools"]
                    if tool["function"]["name"] != "get_order_details"
                ],
            }
        ),
    ),
    "responses": (
        b"/v1/responses",
        orjson.dumps(
            {
                "model": "bench-model",
                "instructions": _SYSTEM,
                "input": _QUESTION,
                "tools": [{"type": "function", **tool} for tool in _TOOLS],
            }
        ),
    ),
    "messages": (
        b"/v1/messages",
        orjson.dumps(
            {
                "model": "bench-model",
                "max_tokens": 256,
                "system": _SYSTEM,
                "messages": [{"role": "user", "content": _QUESTION}],
                "tools": [
                    {
                        "name": tool["name"],
                        "description": tool.get("description", ""),
                        "input_schema": tool["parameters"],
                    }
                    for tool in _TOOLS
                ],
            }
        ),
    ),
}


class _Proxy:
    def __init__(self, label: str, source: str | None, upstream_port: int, hook_dir: Path) -> None:
        self.label = label
        self.port = free_port()
        self.out = hook_dir / f"{label}.garbage"
        paths = [str(hook_dir), *([source] if source else [])]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(paths),
            "REPAIRPROXY_GARBAGE_OUT": str(self.out),
        }
        command = [sys.executable, "-m", "repairproxy", "serve", "--repair", "reflexive"]
        command += ["--upstream-apis", "chat"]
        command += ["--upstream", f"http://127.0.0.1:{upstream_port}/v1", "--port", str(self.port)]
        self.process = subprocess.Popen(
            command, env=env, cwd=source or None, stdout=subprocess.DEVNULL
        )

    async def garbage(self, kind: str, requests: int) -> dict[str, int]:
        if kind == FRESH:  # a JSON request on a connection of its own, closed after the answer
            payload = http_request(self.port, _KINDS["json"][1], CHAT, b"connection: close\r\n")
            await _fresh_connections(self.port, payload, 400)
        else:
            path, body = _KINDS[kind]
            target = Target(self.label, self.port, http_request(self.port, body, path))
            await target.round(16, 400, record=False)  # warm: caches, pools, lazy imports
        self.out.unlink(missing_ok=True)
        self.process.send_signal(signal.SIGUSR1)
        await asyncio.sleep(0.3)
        if kind == FRESH:
            await _fresh_connections(self.port, payload, requests)
            await asyncio.sleep(0.3)  # the last connections' ends reach the proxy
        else:
            await target.round(16, requests, record=False)
        self.process.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 30
        while not self.out.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.label}: the garbage hook wrote nothing")
            await asyncio.sleep(0.05)
        kinds: dict[str, int] = orjson.loads(self.out.read_bytes())
        return kinds


async def _fresh_connections(port: int, payload: bytes, requests: int, clients: int = 16) -> None:
    """``requests`` requests from ``clients`` clients, each on a new connection read to its end."""

    async def client(count: int) -> None:
        for _ in range(count):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(payload)
            await reader.read()  # the proxy closes after the answer
            writer.close()
            await writer.wait_closed()

    await asyncio.gather(*(client(requests // clients) for _ in range(clients)))


async def _run(args: argparse.Namespace, proxies: list[_Proxy], upstream_port: int) -> None:
    requests = args.requests // 16 * 16
    print(f"objects left to the collector per request ({requests} requests at 16 clients):")
    for kind in [*_KINDS, FRESH]:
        for proxy in proxies:
            kinds = await proxy.garbage(kind, requests)
            total = sum(kinds.values())
            top = ", ".join(
                f"{name} {count / requests:.2f}"
                for name, count in sorted(kinds.items(), key=lambda item: -item[1])[:6]
            )
            detail = f"  ({top})" if top else ""
            print(f"  {kind:>12} {proxy.label:>10}: {total / requests:6.2f}{detail}", flush=True)
    if args.rounds <= 0:
        return
    _, body = _KINDS["stream" if args.stream else "json"]
    direct = Target("direct", upstream_port, http_request(upstream_port, body))
    targets = [direct, *(Target(p.label, p.port, http_request(p.port, body)) for p in proxies)]
    for target in targets:
        await target.round(args.clients, 2000, record=False)
    for index in range(args.rounds):
        shift = index % len(targets)
        for target in targets[shift:] + targets[:shift]:
            await target.round(args.clients, args.tail_requests)
    kind = "streamed to its end" if args.stream else "JSON"
    print(f"\nadded latency at {args.clients} clients, {kind}, ms (pXX through it minus direct):")
    print(f"  {'':>10} {'p50':>7} {'p90':>7} {'p99':>7} {'p99.9':>7} {'max':>7}   n")
    base = direct.latencies[args.clients]
    for target in targets[1:]:
        values = target.latencies[args.clients]
        cells = [(pct(values, q) - pct(base, q)) * 1e3 for q in (0.5, 0.9, 0.99, 0.999)] + [
            (max(values) - max(base)) * 1e3
        ]
        print(f"  {target.name:>10} " + " ".join(f"{c:>7.2f}" for c in cells) + f"   {len(values)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=1000, help="per kind, for the garbage")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--tail-requests", type=int, default=4000, help="per round and variant")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--stream", action="store_true", help="the tail of streamed answers")
    parser.add_argument(
        "--variant", action="append", help="LABEL[@DIR]: a checkout to run (repeatable)"
    )
    args = parser.parse_args(argv)
    variants = [(v.partition("@")[0], v.partition("@")[2] or None) for v in args.variant or ["now"]]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    upstream_port = free_port()
    upstream = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.support.fast_upstream", "--port", str(upstream_port)],
        env=env,
    )
    with tempfile.TemporaryDirectory(prefix="garbage-") as hook_dir:
        (Path(hook_dir) / "sitecustomize.py").write_text(_HOOK)
        proxies = [
            _Proxy(label, source, upstream_port, Path(hook_dir)) for label, source in variants
        ]
        try:
            wait_port(upstream_port)
            for proxy in proxies:
                wait_port(proxy.port)
            print(f"machine: {os.cpu_count()} cpus, load average {os.getloadavg()[0]:.1f}")
            uvloop.run(_run(args, proxies, upstream_port))
        finally:
            for process in [*(p.process for p in proxies), upstream]:
                process.terminate()
                process.wait(timeout=10)


if __name__ == "__main__":
    main()
