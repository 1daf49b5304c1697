"""Proxy overhead: direct vs through-proxy against a fast local upstream, interleaved in one run.

Starts ``benchmarks.support.fast_upstream`` and ``python -m repairproxy serve`` as subprocesses,
then drives both with a minimal keep-alive HTTP/1.1 client (uvloop + httptools) at concurrency 1,
16 and 64, alternating direct and proxied rounds so drift hits both alike. Prints added p50/p99
latency, requests/s, the proxy's RSS, and the validation cost per tool call. Then the server's CPU
time per request: utime + stime of each proxy process and its children (``--workers``), read from
/proc before and after a fixed count of requests, interleaved across variants; wall-clock
latency is noisy on shared cores, CPU time much less so.

    python -m benchmarks.overhead [--rounds 6] [--requests 500] [--repair reflexive] [--stream]
    python -m benchmarks.overhead --episode-store redis://127.0.0.1:6379/0   # every proxy on Redis
    python -m benchmarks.overhead --floor   # + a byte relay, + the proxy on an unjudged route
    python -m benchmarks.overhead --redis   # the in-process store beside Redis, one run

``--redis`` starts a ``redis-server``, measures the proxy twice in one interleaved run (the
in-process episode store, and ``--episode-store redis://``), every request with an episode header
(the common request: a valid answer, no new tool error), prints the CPU ratio (the median of each
repetition's same-run ratio) and the Redis round trips and commands each request sent (counted
with MONITOR: calls sent together are one ``MULTI`` / ``EXEC`` block, one round trip; commands
that the store's scripts run inside Redis are not round trips and are shown apart). The Responses
and thread stores' round trips are counted in ``tests/proxy/test_redis_round_trips.py``.

``--floor`` splits the proxy's CPU per request into the floor any proxy process pays (a uvloop
relay: the loop and four socket calls), the HTTP layers (the proxy on a route it relays without
judging: our server, the upstream client, the relay route and its log line) and the rest (the
decision: validation, episode, repair instruction, verdict headers, metrics).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field

import orjson
import uvloop

from benchmarks.support.fast_upstream import CANNED_COMPLETION
from benchmarks.support.host import (
    StealWindow,
    add_halt_polling_flag,
    enter_halt_polling,
    idle_policy,
)
from benchmarks.support.interpreters import interpreter_build
from benchmarks.support.load import (
    REQUEST_BODY,
    UNCHECKED_PATH,
    Target,
    free_port,
    http_request,
    pct,
    rss_mib,
    wait_port,
)
from benchmarks.support.redis_probe import CommandMonitor, redis_process
from benchmarks.support.results import run_recorded

__all__ = ["main"]

QUESTION = "What latency and CPU does the proxy add per request over calling the upstream directly?"


def _family(pid: int) -> list[int]:
    """``pid`` and every process below it (uvicorn's workers), from /proc's parent links."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # exited meanwhile
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, ()))
    return found


def _cpu_seconds(pids: list[int]) -> float:
    """utime + stime of these processes (all their threads), in seconds."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / ticks


async def _measure_cpu(
    args: argparse.Namespace, proxies: list[tuple[Target, int]]
) -> dict[str, list[float]]:
    """Microseconds of server CPU per request, one sample per interleaved repetition."""
    families = {target.name: _family(pid) for target, pid in proxies}
    samples: dict[str, list[float]] = {target.name: [] for target, _ in proxies}
    for index in range(args.cpu_repeats):
        shift = index % len(proxies)
        for target, _ in proxies[shift:] + proxies[:shift]:
            pids = families[target.name]
            before = _cpu_seconds(pids)
            await target.round(args.cpu_concurrency, args.cpu_requests, record=False)
            used = _cpu_seconds(pids) - before
            sent = max(1, args.cpu_requests // args.cpu_concurrency) * args.cpu_concurrency
            samples[target.name].append(used / sent * 1e6)
    return samples


def _speed_marker_us() -> float:
    """A CPU-speed marker, so figures from a busy machine can be read as such."""
    import timeit

    return min(timeit.repeat("sum(range(1000))", number=2000, repeat=5)) / 2000 * 1e6


def _validation_us(iterations: int = 20_000) -> float:
    from repairproxy.validation import ToolsCache

    tools = ToolsCache().compile(REQUEST_BODY)
    assert tools is not None
    message = CANNED_COMPLETION["choices"][0]["message"]
    calls = len(message["tool_calls"])
    verdict = tools.check_message(message)
    assert verdict.ok, verdict
    started = time.perf_counter()
    for _ in range(iterations):
        tools.check_message(message)
    return (time.perf_counter() - started) / iterations / calls * 1e6


@dataclass
class _Variant:
    """One proxy to measure: a label, the source tree it runs from, the interpreter it runs on,
    extra serve flags."""

    label: str
    source: str | None = None  # a checkout (e.g. a git worktree of an older commit)
    extra: list[str] = field(default_factory=list)
    python: str | None = None  # another venv's interpreter (None: this one's)

    @classmethod
    def parse(cls, text: str) -> _Variant:
        """``LABEL[@DIR][#PYTHON][=FLAGS]``, e.g. ``base@/tmp/base``, ``no-metrics=--metrics
        false``, ``pgo#/tmp/venv-pgo/bin/python`` (a venv with the project installed)."""
        head, _, flags = text.partition("=")
        head, _, python = head.partition("#")
        label, _, source = head.partition("@")
        return cls(label, source or None, flags.split(), python or None)

    def describe(self) -> str:
        where = f"@{self.source}" if self.source else ""
        python = f" on {self.python}" if self.python else ""
        return f"{self.label}{where}{python} {' '.join(self.extra)}".rstrip()


async def _measure(
    args: argparse.Namespace, direct: Target, proxies: list[tuple[Target, int]]
) -> None:
    print(
        f"{'conc':>4} {'variant':>12} {'p50':>9} {'added p50':>10} {'added p99':>10} "
        f"{'rps':>7} {'RSS':>9}"
    )
    targets = [direct, *(target for target, _ in proxies)]
    window = StealWindow()
    for concurrency in args.concurrency:
        requests = args.requests if concurrency == 1 else args.requests * 4
        for target in targets:  # warm-up: connections, caches, JIT-free but lazy imports
            await target.round(concurrency, min(requests, 200), record=False)
        for index in range(args.rounds):
            shift = index % len(targets)  # rotate the order so drift hits every target alike
            for target in targets[shift:] + targets[:shift]:
                await target.round(concurrency, requests)
        d = direct.latencies[concurrency]
        print(
            f"{concurrency:>4} {'direct':>12} {pct(d, 0.5) * 1e3:>7.3f}ms {'':>10} {'':>10} "
            f"{direct.count[concurrency] / direct.elapsed[concurrency]:>7.0f}"
        )
        for proxy, pid in proxies:
            p = proxy.latencies[concurrency]
            print(
                f"{concurrency:>4} {proxy.name:>12} {pct(p, 0.5) * 1e3:>7.3f}ms "
                f"{(pct(p, 0.5) - pct(d, 0.5)) * 1e3:>8.3f}ms "
                f"{(pct(p, 0.99) - pct(d, 0.99)) * 1e3:>8.3f}ms "
                f"{proxy.count[concurrency] / proxy.elapsed[concurrency]:>7.0f} "
                f"{rss_mib(pid):>6.1f}MiB",
                flush=True,
            )
    window.stop()
    print(f"latency rounds: {window.describe()}")
    if args.cpu_requests > 0:
        window = StealWindow()
        cpu = await _measure_cpu(args, proxies)
        window.stop()
        resolution = 1e6 / os.sysconf("SC_CLK_TCK") / args.cpu_requests
        print(
            f"server CPU per request (utime+stime of the proxy and its children, "
            f"{args.cpu_requests} requests at concurrency {args.cpu_concurrency}, "
            f"x{args.cpu_repeats} interleaved; resolution {resolution:.1f} us; "
            f"{window.describe()}):"
        )
        for proxy, _ in proxies:
            values = cpu[proxy.name]
            print(
                f"{proxy.name:>12}: median {statistics.median(values):.1f} us/request "
                f"(min {min(values):.1f}, max {max(values):.1f})",
                flush=True,
            )
        base = proxies[0][0].name
        for proxy, _ in proxies[1:]:
            ratios = [a / b for a, b in zip(cpu[proxy.name], cpu[base], strict=True) if b > 0]
            if ratios:
                print(
                    f"{proxy.name:>12}: {statistics.median(ratios):.2f}x {base}'s CPU per request "
                    f"(median of {len(ratios)} same-run ratios; "
                    f"min {min(ratios):.2f}, max {max(ratios):.2f})"
                )
    if args.redis_port:
        await _count_redis_commands(args, proxies)
    seq_d = direct.latencies.get(1)
    for proxy, _ in proxies:
        seq_p = proxy.latencies.get(1)
        if seq_d and seq_p:
            print(
                f"{proxy.name}: sequential mean added "
                f"{(statistics.mean(seq_p) - statistics.mean(seq_d)) * 1e3:.3f} ms"
            )


async def _count_redis_commands(
    args: argparse.Namespace, proxies: list[tuple[Target, int]]
) -> None:
    """Round trips to Redis per request of each proxy on it, counted with MONITOR."""
    requests = 1000
    with CommandMonitor(args.redis_port) as monitor:
        for target, _ in proxies:
            if not target.name.startswith("redis"):
                continue
            monitor.reset()
            await target.round(args.cpu_concurrency, requests, record=False)
            sent = monitor.settle()
            scripted = dict(monitor.scripted)
            round_trips = monitor.round_trips - sent.get("scan", 0)  # the gauge's, not per request
            requests_sent = max(1, requests // args.cpu_concurrency) * args.cpu_concurrency
            named = ", ".join(f"{name} {count / requests_sent:.2f}" for name, count in sent.items())
            inside = ", ".join(f"{k} {v / requests_sent:.2f}" for k, v in sorted(scripted.items()))
            with urllib.request.urlopen(f"http://127.0.0.1:{target.port}/metrics") as reply:
                metrics = reply.read().decode()
            errors = sum(
                float(line.rsplit(" ", 1)[1])
                for line in metrics.splitlines()
                if line.startswith("repairproxy_store_errors_total{")
            )
            print(
                f"{target.name:>12}: store calls failed or skipped over the whole run: {errors:.0f}"
            )
            print(
                f"{target.name:>12}: {round_trips / requests_sent:.2f} Redis round trips per "
                f"request (commands: {named}; inside its scripts: {inside}; {requests_sent} "
                f"requests at concurrency {args.cpu_concurrency}, one episode header; concurrent "
                "requests' reads share a round trip)"
            )


def _start_proxy(
    variant: _Variant, upstream_port: int, port: int, repair: str
) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if variant.source:
        env["PYTHONPATH"] = variant.source
    command = [variant.python or sys.executable, "-m", "repairproxy", "serve"]
    command += ["--upstream", f"http://127.0.0.1:{upstream_port}/v1", "--port", str(port)]
    command += ["--repair", repair, *variant.extra]
    return subprocess.Popen(command, env=env, cwd=variant.source or None, stdout=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=f"{QUESTION}\n\n{__doc__}", formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument(
        "--requests", type=int, default=500, help="per round at concurrency 1 (x4 above)"
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--repair", default="reflexive")
    parser.add_argument(
        "--stream", action="store_true", help="ask for SSE streams (each timed to its end)"
    )
    parser.add_argument(
        "--cpu-requests",
        type=int,
        default=5000,
        help="requests per server-CPU sample (0: skip the CPU measurement)",
    )
    parser.add_argument("--cpu-concurrency", type=int, default=16)
    parser.add_argument("--cpu-repeats", type=int, default=5)
    parser.add_argument(
        "--variant",
        action="append",
        type=_Variant.parse,
        help="a proxy to measure, LABEL[@DIR][#PYTHON][=FLAGS] (repeatable; interleaved in one "
        "run), e.g. --variant now --variant base@/tmp/base --variant no-metrics='--metrics "
        "false' --variant pgo#/tmp/venv-pgo/bin/python",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also measure a byte relay (benchmarks.support.relay_floor: the loop and the four "
        "socket calls) and the first proxy on a route it relays unjudged (server + upstream "
        "client)",
    )
    parser.add_argument(
        "--episode-store", default=None, help="passed to every proxy (e.g. redis://HOST:PORT/DB)"
    )
    parser.add_argument(
        "--redis",
        action="store_true",
        help="start a redis-server and measure each proxy on the in-process store and on Redis "
        "in one run (an episode header on every request), with Redis commands per request",
    )
    add_halt_polling_flag(parser)
    args = parser.parse_args(argv)
    variants: list[_Variant] = args.variant or [_Variant("proxy")]
    if args.episode_store:
        for variant in variants:
            variant.extra += ["--episode-store", args.episode_store]
    args.redis_port = 0
    args.header = b""

    with contextlib.ExitStack() as host:
        enter_halt_polling(host, args.guest_halt_poll_ns, parser)
        if args.redis:
            args.redis_port = host.enter_context(redis_process())
            url = f"redis://127.0.0.1:{args.redis_port}/0"
            variants = [
                *(
                    _Variant(f"memory:{v.label}"[:12], v.source, v.extra, v.python)
                    for v in variants
                ),
                *(
                    _Variant(
                        f"redis:{v.label}"[:12],
                        v.source,
                        [*v.extra, "--episode-store", url],
                        v.python,
                    )
                    for v in variants
                ),
            ]
            args.header = b"x-episode-id: bench-episode\r\n"
        _run(args, variants)


def _run(args: argparse.Namespace, variants: list[_Variant]) -> None:
    upstream_port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    upstream = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.support.fast_upstream", "--port", str(upstream_port)],
        env=env,
    )
    ports = [free_port() for _ in variants]
    processes = [
        _start_proxy(v, upstream_port, port, args.repair)
        for v, port in zip(variants, ports, strict=True)
    ]
    relay_port = free_port()
    if args.floor:
        command = [
            sys.executable,
            "-m",
            "benchmarks.support.relay_floor",
            "--port",
            str(relay_port),
        ]
        processes.append(subprocess.Popen([*command, "--upstream-port", str(upstream_port)]))
    try:
        wait_port(upstream_port)
        for port in ports:
            wait_port(port)
        body = orjson.dumps({**REQUEST_BODY, "stream": True} if args.stream else REQUEST_BODY)
        direct = Target("direct", upstream_port, http_request(upstream_port, body))
        proxies = [
            (Target(v.label, port, http_request(port, body, extra=args.header)), process.pid)
            for v, port, process in zip(variants, ports, processes, strict=False)
        ]
        if args.floor:
            wait_port(relay_port)
            relayed = http_request(upstream_port, body)  # the relay passes the Host on as is
            proxies.append((Target("relay", relay_port, relayed), processes[-1].pid))
            unchecked = http_request(ports[0], body, UNCHECKED_PATH)
            label = f"{variants[0].label}:unchecked"
            proxies.append((Target(label, ports[0], unchecked), processes[0].pid))
        print(
            f"machine: {os.cpu_count()} cpus, load average {os.getloadavg()[0]:.1f}, "
            f"speed probe {_speed_marker_us():.1f} us (other processes share the cpus)"
        )
        print(idle_policy())
        print(
            f"request {len(body)} B, answer with 1 tool call"
            f"{' streamed (SSE, timed to its end)' if args.stream else ''}, repair={args.repair}, "
            f"{args.rounds} interleaved rounds, variants: "
            + ", ".join(v.describe() for v in variants)
        )
        for python in sorted({v.python or sys.executable for v in variants}):
            print(f"interpreter {python}: {interpreter_build(python)}")
        uvloop.run(_measure(args, direct, proxies))
        print(f"validation: {_validation_us():.2f} us per tool call (check_message, warm cache)")
    finally:
        for process in [*processes, upstream]:
            process.terminate()
            process.wait(timeout=10)


if __name__ == "__main__":
    raise SystemExit(run_recorded("overhead", main))
