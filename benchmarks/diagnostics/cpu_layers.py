"""Where a request's CPU time goes, layer by layer, in one interleaved run.

    python -m benchmarks.diagnostics.cpu_layers [--requests 3000] [--repeats 5] [--clients 1 16]

Four servers on loopback, each hit with ``benchmarks.overhead``'s request, their CPU time per
request read from ``/proc/PID/task/*/schedstat`` (user and system, not instructions):

- ``bare``: ``benchmarks.support.fast_upstream``, an httptools server answering canned bytes (the
floor
  of any Python server on uvloop);
- ``server``: this proxy's server (uvicorn's loop, ``server.LimitedProtocol``, ``_Cycle``, the
  app's lifespan) whose app answers the canned completion at once;
- ``server+client``: the same, the app forwarding each request through the upstream pool
  (``upstream.client.Upstream``) to ``bare``;
- ``proxy``: ``python -m repairproxy serve`` with every feature on (validation, metrics, chaining,
  the log line, reflexive repair).

What ``proxy`` costs above ``server+client`` is the routes, the decision and the features as
they run inside the server; ``benchmarks.diagnostics.decision_cost`` measures the same work in
process.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from typing import Any

import orjson
import uvloop

from benchmarks.support.fast_upstream import CANNED_COMPLETION
from benchmarks.support.load import REQUEST_BODY, Target, free_port, http_request, wait_port
from benchmarks.vs_peers import tree_cpu

CANNED = orjson.dumps(CANNED_COMPLETION)


def _serve_layer(port: int, upstream_port: int, forward: bool) -> None:
    """The proxy's server and app, its request handler replaced by a canned or forwarded one."""
    import uvicorn

    from repairproxy.app import create_app
    from repairproxy.asgi.responder import RESPONSE_EXTENSION
    from repairproxy.server import server_options
    from repairproxy.settings import Settings
    from repairproxy.upstream.client import UpstreamTimer

    settings = Settings(upstream=f"http://127.0.0.1:{upstream_port}/v1", port=port)
    app: Any = create_app(settings)
    build = app._build

    def layered() -> Any:
        proxy = build()
        upstream = proxy.upstream

        async def handle(scope: Any, receive: Any, send: Any) -> None:
            body = (await receive())["body"]
            content = CANNED
            if forward:
                headers = upstream.outbound_headers(scope["headers"], keep_encoding=False)
                path = "/v1/chat/completions"
                reply = await upstream.request("POST", path, headers, body, UpstreamTimer())
                content = reply.content
            head = [(b"content-type", b"application/json")]
            head.append((b"content-length", b"%d" % len(content)))
            scope["extensions"][RESPONSE_EXTENSION].whole(200, head, content)

        proxy.handle = handle
        return proxy

    app._build = layered
    uvicorn.Server(uvicorn.Config(app, **server_options(settings))).run()


async def _measure(args: argparse.Namespace) -> None:
    python = sys.executable
    upstream_port = free_port()
    servers: list[tuple[str, subprocess.Popen[bytes], int]] = []
    upstream = subprocess.Popen(
        [python, "-m", "benchmarks.support.fast_upstream", "--port", str(upstream_port)]
    )
    servers.append(("bare", upstream, upstream_port))
    try:
        wait_port(upstream_port)
        for label, layer in (("server", "server"), ("server+client", "client")):
            port = free_port()
            command = [python, "-m", "benchmarks.diagnostics.cpu_layers", "--serve", layer]
            command += ["--port", str(port), "--upstream-port", str(upstream_port)]
            servers.append((label, subprocess.Popen(command, stderr=subprocess.DEVNULL), port))
        port = free_port()
        command = [python, "-m", "repairproxy", "serve", "--port", str(port), "--repair"]
        command += ["reflexive", "--upstream", f"http://127.0.0.1:{upstream_port}/v1"]
        proxy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        servers.append(("proxy", proxy, port))
        for _, _, port in servers:
            wait_port(port)
        body = orjson.dumps(REQUEST_BODY)
        targets = [
            (f"{label} @{clients}", process.pid, Target(label, port, http_request(port, body)))
            for label, process, port in servers
            for clients in args.clients
        ]
        clients_of = {name: int(name.rsplit("@", 1)[1]) for name, _, _ in targets}
        for name, _, target in targets:  # warm-up: connections, caches, lazy imports
            await target.round(clients_of[name], 1000, record=False)
        samples: dict[str, list[float]] = {name: [] for name, _, _ in targets}
        for index in range(args.repeats):
            shift = index % len(targets)
            for name, pid, target in targets[shift:] + targets[:shift]:
                before = tree_cpu(pid).sched_seconds
                await target.round(clients_of[name], args.requests, record=False)
                samples[name].append((tree_cpu(pid).sched_seconds - before) / args.requests * 1e6)
        print(
            f"CPU time per request (schedstat), {args.requests} requests a sample, "
            f"x{args.repeats} interleaved; load average {os.getloadavg()[0]:.1f}"
        )
        for name, values in samples.items():
            print(
                f"{name:>18}: median {statistics.median(values):6.1f} us "
                f"(min {min(values):.1f}, max {max(values):.1f})",
                flush=True,
            )
    finally:
        for _, process, _ in reversed(servers):
            process.terminate()
            process.wait(timeout=10)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--serve", choices=["server", "client"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--upstream-port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        _serve_layer(args.port, args.upstream_port, forward=args.serve == "client")
        return
    uvloop.run(_measure(args))


if __name__ == "__main__":
    main()
