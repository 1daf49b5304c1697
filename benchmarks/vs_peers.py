"""repairproxy beside LiteLLM's proxy and the Portkey AI gateway: one fast upstream, interleaved.

A claim like "N× cheaper than the alternatives" is only worth the run that shows it, side by side on
the same machine and upstream. This starts the fast upstream (``benchmarks.support.fast_upstream``:
JSON, or SSE when the request says ``"stream": true``), ``python -m repairproxy serve`` with every
feature on (validation and repair, metrics, conversation chaining: no episode header, client auth,
its log line per request read by a thread here rather than sent to /dev/null), the LiteLLM proxy
(``litellm[proxy]==1.82.6``, the project's pin, in its own virtualenv under
``~/.cache/repairproxy/bench-venvs/``, created on first use) and the Portkey gateway
(``npm install @portkey-ai/gateway@1.15.2`` into ``~/.cache/repairproxy/``, run with node, its
listening socket held to 127.0.0.1, and a small fix for its streams: see ``_NODE_PRELOAD``).
One minimal keep-alive client (uvloop + httptools) drives direct-to-upstream and each server at
each client count, JSON (whole answer) and streamed (time to the first body byte), rotating the
order of the targets in every round so drift hits them alike. Every target is measured for the
same time per round (``--seconds``, as wrk's ``-d``), not for the same number of requests: with a
fixed count the fastest server had the shortest window (repairproxy ~0.15-0.3 s a round against
LiteLLM's 3-11 s), where one host hiccup of ~10 ms was ~1% of its requests and set its p99.
Before each cell every target runs unrecorded for ``--warmup`` seconds: the Portkey gateway's
CPU per request falls from ~4,400 to ~1,700 µs over its first ~2,500 requests as node's JIT
compiles its path (one JSON client, 1 s rounds, 2026-12-03), and the run is to compare steady
states. (Before 2026-12-03's last change the warm-up was 100 requests: Portkey part-cold.)
Each server's idle CPU is read first (a peer busy while idle would tax whichever server is
measured; on 2026-12-03 all three read 0.1-0.2% of a core, also in the 2 s after a round of 1,200
requests, and stopping the idle peers with SIGSTOP during each round changed no figure beyond the
run-to-run noise).

Per cell it prints the added p50/p99 over direct, requests/s, and each server's CPU per request
read from /proc for its whole process tree (utime+stime, in clock ticks; and the per-thread
schedstat run time, in ns, which stays exact at small runs), then the peers' ratios to repairproxy
and the command line and environment each server ran with. Everything listens on loopback.

    python -m benchmarks.vs_peers [--seconds 2] [--warmup 5] [--rounds 4] [--clients 1 16]
        [--requests N] [--peers litellm portkey] [--json-out FILE] [--python PATH]
    python -m benchmarks.vs_peers --pool-only   # upstream clients: our pool vs aiohttp vs httpx
    python -m benchmarks.vs_peers --peers --floors nginx relay   # the floor only

Beside the peers, the floor (``--floors``): nginx as a reverse proxy (``proxy_pass`` with upstream
keep-alive, one worker, no access log) and the byte relay (``benchmarks.support.relay_floor``),
so each run shows how far repairproxy is from what a proxy process costs at all. Every same-run
ratio is also printed as the median of its rounds' ratios, with their range. A peer that is not
installed here is named and left out (``--install-peers`` installs it first).

The interpreter changes the two Python servers' CPU by ~20% (``benchmarks.support.interpreters``):
an optimised build (the Docker image's is configured ``--enable-optimizations --with-lto``; Debian's
``python3`` measures alike) against pyenv's default build.
``--python`` runs repairproxy and LiteLLM on the same one; the run prints which.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httptools
import orjson
import uvloop

from benchmarks.support.host import (
    StealWindow,
    add_halt_polling_flag,
    enter_halt_polling,
    idle_policy,
)
from benchmarks.support.interpreters import interpreter_build
from benchmarks.support.load import REQUEST_BODY
from benchmarks.support.results import run_recorded

__all__ = ["main"]

QUESTION = "How much CPU and latency does repairproxy add beside LiteLLM, Portkey and the floor?"

LITELLM_REQUIREMENT = "litellm[proxy]==1.82.6"  # the project's pin; 1.82.7/1.82.8 were compromised
PORTKEY_PACKAGE = "@portkey-ai/gateway@1.15.2"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "repairproxy"
DEFAULT_LITELLM_VENV = CACHE / "bench-venvs" / "litellm-1.82.6"
DEFAULT_PORTKEY_DIR = CACHE / "portkey-gateway-1.15.2"
PEERS = ("litellm", "portkey")
# The floor beside the peers: nginx (C, proxy_pass with upstream keep-alive, one worker) and a
# byte relay that parses nothing (benchmarks.support.relay_floor): what no proxy goes below.
FLOORS = ("nginx", "relay")

# nginx as a plain reverse proxy: one worker, keep-alive to the upstream, no logs, no buffering
# of the answer (as the proxy streams it).
_NGINX_CONF = """\
daemon off;
master_process on;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log error;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body;
  proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fastcgi;
  uwsgi_temp_path {dir}/uwsgi;
  scgi_temp_path {dir}/scgi;
  upstream fast_upstream {{ server 127.0.0.1:{upstream}; keepalive 64; }}
  server {{
    listen 127.0.0.1:{port};
    keepalive_requests 1000000;
    location / {{
      proxy_pass http://fast_upstream;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
"""
REQUEST_TIMEOUT = 30.0  # one answer; a stuck server fails the run instead of hanging it
NODE_MAJOR_MIN = 18

# Preloaded into node before the gateway. (1) hono's node server listens on every interface: pin
# each listen to loopback. (2) The gateway appends its x-portkey-* headers to the upstream's
# streamed Response, whose headers fetch makes immutable, and answers every stream 500 "Something
# went wrong" (Portkey-AI/gateway issues 1389 and 1550, open): hand it a copy with mutable
# headers, for streams only (one Response object per streamed request; JSON is untouched).
_NODE_PRELOAD = """\
import net from "node:net";
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  if (typeof args[0] === "number") {
    return listen.call(this, args[0], "127.0.0.1", ...args.filter((a) => typeof a === "function"));
  }
  return listen.apply(this, args);
};
const upstreamFetch = globalThis.fetch;
globalThis.fetch = async (...args) => {
  const response = await upstreamFetch(...args);
  if (!(response.headers.get("content-type") ?? "").startsWith("text/event-stream")) {
    return response;
  }
  const init = { status: response.status, statusText: response.statusText };
  return new Response(response.body, { ...init, headers: new Headers(response.headers) });
};
"""


# -- CPU of a process tree, from /proc ------------------------------------------------------------


def _tree(root: int) -> list[int]:
    """``root`` and every descendant, from the ppid field of each /proc/PID/stat."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found: list[int] = []
    todo = [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


@dataclass(frozen=True)
class CpuSample:
    ticks_seconds: float  # utime+stime of every process, clock-tick resolution
    sched_seconds: float  # schedstat run time of every live thread, ns resolution


def tree_cpu(root: int) -> CpuSample:
    hertz = os.sysconf("SC_CLK_TCK")
    ticks = 0
    sched = 0
    for pid in _tree(root):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
            for task in os.listdir(f"/proc/{pid}/task"):
                sched += int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # exited between the listing and the read
    return CpuSample(ticks / hertz, sched / 1e9)


# -- the load client ------------------------------------------------------------------------------


class _Connection(asyncio.Protocol):
    """One keep-alive connection: send prebuilt bytes, time the first body byte and the end."""

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._done: asyncio.Future[None] | None = None
        self._first: float | None = None
        self.status = 0
        self.body = b""  # kept only for a failed answer, to say why
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if self._first is None:
            self._first = time.perf_counter()
        if self.status != 200:
            self.body += body

    def on_message_complete(self) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_exception(exc or ConnectionError("closed"))

    async def request(self, data: bytes) -> tuple[float, float]:
        """(seconds to the first body byte, seconds to the end)."""
        assert self.transport is not None
        self._done = asyncio.get_running_loop().create_future()
        self._first = None
        self.body = b""
        started = time.perf_counter()
        self.transport.write(data)
        await asyncio.wait_for(self._done, REQUEST_TIMEOUT)
        ended = time.perf_counter()
        if self.status != 200:
            raise RuntimeError(f"answer {self.status}: {self.body[:500]!r}")
        return (self._first or ended) - started, ended - started


Cell = tuple[bool, int]  # (streamed, clients)


@dataclass
class _Target:
    name: str
    port: int
    pid: int | None = None  # the server's root process; None for direct-to-upstream
    headers: bytes = b""
    sent: int = 0  # every request, warm-up included
    pools: dict[int, list[_Connection]] = field(default_factory=dict)
    samples: dict[Cell, list[float]] = field(default_factory=dict)  # ttfb (streams) or whole
    busy: dict[Cell, float] = field(default_factory=dict)
    cpu_ticks: dict[Cell, float] = field(default_factory=dict)
    cpu_sched: dict[Cell, float] = field(default_factory=dict)
    # Each recorded round's (requests, schedstat CPU µs a request, p99 ms): a server still
    # warming up shows as a falling CPU figure from round to round.
    per_round: dict[Cell, list[tuple[int, float, float]]] = field(default_factory=dict)

    def payload(self, stream: bool) -> bytes:
        body = orjson.dumps({**REQUEST_BODY, "stream": True} if stream else REQUEST_BODY)
        return (
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:%d\r\n"
            b"content-type: application/json\r\nauthorization: Bearer sk-bench\r\n"
            b"%scontent-length: %d\r\n\r\n%s" % (self.port, self.headers, len(body), body)
        )

    async def round(
        self, stream: bool, clients: int, requests: int, record: bool, seconds: float = 0.0
    ) -> None:
        """``requests`` over ``clients`` connections, or, with ``seconds``, as many as the
        connections complete in that long (each finishes the request it is in)."""
        # Servers close keep-alive connections left idle while the other targets run their
        # rounds (uvicorn and node: 5 s), and a close can cross the next request on the wire:
        # open fresh connections for every round, outside its clock, for every target alike.
        loop = asyncio.get_running_loop()
        pool = self.pools.setdefault(clients, [])
        for old in pool:
            if old.transport is not None:
                old.transport.close()
        pool.clear()
        while len(pool) < clients:
            pool.append((await loop.create_connection(_Connection, "127.0.0.1", self.port))[1])
        data = self.payload(stream)
        taken: list[float] = []

        async def worker(conn: _Connection) -> None:
            count = max(1, requests // clients)
            while count > 0 if not seconds else time.perf_counter() < deadline:
                count -= 1
                try:
                    first, whole = await conn.request(data)
                except (RuntimeError, OSError, TimeoutError) as exc:
                    raise RuntimeError(f"{self.name}: {exc}") from exc
                self.sent += 1
                taken.append(first if stream else whole)

        before = tree_cpu(self.pid) if self.pid is not None else None
        started = time.perf_counter()
        deadline = started + seconds
        await asyncio.gather(*(worker(conn) for conn in pool))
        elapsed = time.perf_counter() - started
        if not record:
            return
        key = (stream, clients)
        self.samples.setdefault(key, []).extend(taken)
        self.busy[key] = self.busy.get(key, 0.0) + elapsed
        if self.pid is not None and before is not None:
            after = tree_cpu(self.pid)
            ticks = after.ticks_seconds - before.ticks_seconds
            sched = after.sched_seconds - before.sched_seconds
            self.cpu_ticks[key] = self.cpu_ticks.get(key, 0.0) + ticks
            self.cpu_sched[key] = self.cpu_sched.get(key, 0.0) + sched
            self.per_round.setdefault(key, []).append(
                (len(taken), sched / max(len(taken), 1) * 1e6, _pct(taken, 0.99) * 1e3)
            )


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _cell_figures(target: _Target, direct: _Target, key: Cell) -> dict[str, Any]:
    got, base = target.samples[key], direct.samples[key]
    figures: dict[str, Any] = {
        "p50_ms": _pct(got, 0.5) * 1e3,
        "p99_ms": _pct(got, 0.99) * 1e3,
        "added_p50_ms": (_pct(got, 0.5) - _pct(base, 0.5)) * 1e3,
        "added_p99_ms": (_pct(got, 0.99) - _pct(base, 0.99)) * 1e3,
        "requests_per_s": len(got) / target.busy[key],
        "requests": float(len(got)),
    }
    if key in target.cpu_sched:
        figures["cpu_us_per_request"] = target.cpu_ticks[key] / len(got) * 1e6
        figures["cpu_sched_us_per_request"] = target.cpu_sched[key] / len(got) * 1e6
        figures["rounds"] = [
            {"requests": n, "cpu_sched_us_per_request": cpu, "p99_ms": p99}
            for n, cpu, p99 in target.per_round[key]
        ]
    return figures


def idle_cpu(targets: list[_Target], seconds: float) -> dict[str, float]:
    """Each server's CPU while nobody sends it anything, in % of one core (a server that kept
    working while idle would take the CPU from whichever one is being measured)."""
    before = {t.name: tree_cpu(t.pid) for t in targets if t.pid is not None}
    time.sleep(seconds)
    return {
        t.name: (tree_cpu(t.pid).sched_seconds - before[t.name].sched_seconds) / seconds * 100
        for t in targets
        if t.pid is not None
    }


async def _compare(targets: list[_Target], args: argparse.Namespace) -> dict[str, Any]:
    direct = targets[0]
    results: dict[str, Any] = {}
    for stream in (False, True):
        for clients in args.clients:
            requests = (args.requests or 0) * (1 if clients == 1 else 4)
            seconds = 0.0 if args.requests else args.seconds
            for target in targets:  # warm-up, unrecorded: to steady state (node's JIT)
                await target.round(stream, clients, 100, False, args.warmup)
            for index in range(args.rounds):
                shift = index % len(targets)
                for target in targets[shift:] + targets[:shift]:
                    await target.round(stream, clients, requests, True, seconds)
            key = (stream, clients)
            cell = f"{'stream' if stream else 'json'}/{clients}"
            results[cell] = {t.name: _cell_figures(t, direct, key) for t in targets}
            print(f"  done: {cell}", flush=True)
    return results


def _print_tables(results: dict[str, Any], names: list[str]) -> None:
    print(
        "\n| mode | clients | server | added p50 / p99 | requests/s | CPU µs/request "
        "(utime+stime) | CPU µs/request (schedstat) |"
    )
    print("|---|---|---|---|---|---|---|")
    for cell, figures in results.items():
        mode, clients = cell.split("/")
        base = figures["direct"]
        print(
            f"| {mode} | {clients} | direct | p50 {base['p50_ms']:.3f} / p99 {base['p99_ms']:.3f} "
            f"ms (absolute) | {base['requests_per_s']:,.0f} | | |"
        )
        for name in names:
            got = figures[name]
            print(
                f"| {mode} | {clients} | {name} | {got['added_p50_ms']:.2f} / "
                f"{got['added_p99_ms']:.2f} ms | {got['requests_per_s']:,.0f} | "
                f"{got['cpu_us_per_request']:,.0f} | {got['cpu_sched_us_per_request']:,.0f} |"
            )
    print("\nCPU µs a request (schedstat), round by round: a falling figure is still warming up")
    for cell, figures in results.items():
        for name in names:
            rounds = " ".join(
                f"{r['cpu_sched_us_per_request']:,.0f}" for r in figures[name]["rounds"]
            )
            print(f"  {cell:9} {name:11} {rounds}")
    _print_round_ratios(results, names)
    peers = [n for n in names if n != "repairproxy" and n not in FLOORS]
    if not peers:
        return
    print(
        "\nratios, peer ÷ repairproxy (requests/s: repairproxy ÷ peer), so > 1 means repairproxy "
        "is ahead:\n"
    )
    print("| mode | clients | peer | added p50 | added p99 | requests/s | CPU (schedstat) |")
    print("|---|---|---|---|---|---|---|")
    for cell, figures in results.items():
        mode, clients = cell.split("/")
        ours = figures["repairproxy"]
        for name in peers:
            got = figures[name]
            p50 = got["added_p50_ms"] / max(ours["added_p50_ms"], 1e-3)
            p99 = got["added_p99_ms"] / max(ours["added_p99_ms"], 1e-3)
            rate = ours["requests_per_s"] / got["requests_per_s"]
            cpu = got["cpu_sched_us_per_request"] / max(ours["cpu_sched_us_per_request"], 1e-3)
            print(
                f"| {mode} | {clients} | {name} | {p50:.1f}× | {p99:.1f}× | {rate:.1f}× "
                f"| {cpu:.1f}× |"
            )


def round_ratios(ours: dict[str, Any], theirs: dict[str, Any], figure: str) -> list[float]:
    """``theirs ÷ ours`` of one per-round figure, round by round (the rounds of a cell ran
    rotated, each target once per round: a ratio of one round is a same-run ratio)."""
    return [
        b[figure] / a[figure]
        for a, b in zip(ours["rounds"], theirs["rounds"], strict=False)
        if a[figure] > 0
    ]


def _print_round_ratios(results: dict[str, Any], names: list[str]) -> None:
    """Every same-run ratio as the median of its rounds' ratios (min-max beside it): the peers
    ÷ repairproxy, and repairproxy ÷ each floor (nginx, the byte relay)."""
    others = [n for n in names if n != "repairproxy"]
    if "repairproxy" not in names or not others:
        return
    print(
        "\nsame-run ratios, the median over the rounds of each round's ratio (min-max): "
        "peer ÷ repairproxy, and repairproxy ÷ floor\n"
    )
    print("| mode | clients | ratio | CPU (schedstat) | p99 |")
    print("|---|---|---|---|---|")
    for cell, figures in results.items():
        mode, clients = cell.split("/")
        ours = figures["repairproxy"]
        for name in others:
            theirs = figures[name]
            if name in FLOORS:
                label, pair = f"repairproxy ÷ {name}", (theirs, ours)
            else:
                label, pair = f"{name} ÷ repairproxy", (ours, theirs)
            cells = []
            for figure in ("cpu_sched_us_per_request", "p99_ms"):
                ratios = round_ratios(*pair, figure)
                cells.append(
                    f"{statistics.median(ratios):.2f}× ({min(ratios):.2f}-{max(ratios):.2f}, "
                    f"{len(ratios)} rounds)"
                    if ratios
                    else "-"
                )
            print(f"| {mode} | {clients} | {label} | {cells[0]} | {cells[1]} |")


# -- upstream clients: repairproxy's pool vs aiohttp vs httpx -------------------------------------


async def _pool_vs_clients(port: int, requests: int, rounds: int) -> None:
    import aiohttp
    import httpx

    from repairproxy.upstream.http1 import ConnectionPool

    url = f"http://127.0.0.1:{port}"
    body = orjson.dumps(REQUEST_BODY)
    headers = [(b"content-type", b"application/json")]
    pool = ConnectionPool(url)
    session = aiohttp.ClientSession()
    client = httpx.AsyncClient(trust_env=False)

    async def via_pool() -> None:
        response = await pool.request("POST", "/v1/chat/completions", headers, body)
        await response.read()

    async def via_aiohttp() -> None:
        async with session.post(
            url + "/v1/chat/completions", data=body, headers={"content-type": "application/json"}
        ) as response:
            await response.read()

    async def via_httpx() -> None:
        response = await client.post(
            url + "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
        )
        response.read()

    runs = {"repairproxy.upstream.http1": via_pool, "aiohttp": via_aiohttp, "httpx": via_httpx}
    wall = dict.fromkeys(runs, 0.0)
    cpu = dict.fromkeys(runs, 0.0)
    for run in runs.values():  # warm-up
        for _ in range(50):
            await run()
    for index in range(rounds):
        order = list(runs.items())
        order = order[index % len(order) :] + order[: index % len(order)]
        for name, run in order:
            started, started_cpu = time.perf_counter(), time.process_time()
            for _ in range(requests):
                await run()
            wall[name] += time.perf_counter() - started
            cpu[name] += time.process_time() - started_cpu
    await session.close()
    await client.aclose()
    await pool.aclose()
    total = requests * rounds
    ours = cpu["repairproxy.upstream.http1"] / total
    print(f"\nupstream client, one sequential round trip ({total} each, interleaved):")
    print(f"{'client':<20}{'wall us':>10}{'client CPU us':>15}{'CPU vs ours':>13}")
    for name in runs:
        per_cpu = cpu[name] / total
        print(
            f"{name:<20}{wall[name] / total * 1e6:>10.0f}{per_cpu * 1e6:>15.0f}"
            f"{per_cpu / ours:>12.1f}x"
        )


# -- processes ------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _wait_port(port: int, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on port {port} after {timeout:g} s")


class _LogReader:
    """Reads a server's output on a thread, as a log shipper would, counting lines."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.lines = 0
        self.tail: list[bytes] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[bytes]) -> None:
        for line in stream:
            self.lines += 1
            self.tail = [*self.tail[-19:], line]


def litellm_venv_for(python: str) -> Path:
    """The default LiteLLM venv for an interpreter: this one's, or one per other interpreter."""
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        return DEFAULT_LITELLM_VENV
    tag = hashlib.sha256(os.path.realpath(python).encode()).hexdigest()[:8]
    return DEFAULT_LITELLM_VENV.with_name(f"{DEFAULT_LITELLM_VENV.name}-{tag}")


def ensure_litellm(venv: Path, python: str = sys.executable) -> Path:
    """The ``litellm`` executable of its own virtualenv on ``python``, created (with progress)
    on first use."""
    executable = venv / "bin" / "litellm"
    if executable.exists():
        return executable
    print(f"creating {venv} with {LITELLM_REQUIREMENT} (once; a few minutes)...", flush=True)
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--progress-bar", "on", LITELLM_REQUIREMENT],
        check=True,
    )
    return executable


def ensure_portkey(directory: Path) -> tuple[str, Path]:
    """(node executable, the gateway's start-server.js), installed with npm on first use."""
    node = shutil.which("node")
    if node is None:
        raise RuntimeError(
            "the Portkey gateway needs node (>= 18) on PATH; or pass --peers litellm"
        )
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True)
    if int(version.stdout.strip().lstrip("v").split(".")[0]) < NODE_MAJOR_MIN:
        raise RuntimeError(f"node {version.stdout.strip()} is too old; the gateway needs >= 18")
    script = directory / "node_modules" / "@portkey-ai" / "gateway" / "build" / "start-server.js"
    if not script.exists():
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError("npm is needed once to install the Portkey gateway")
        print(f"installing {PORTKEY_PACKAGE} into {directory} (once)...", flush=True)
        directory.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                npm,
                "install",
                "--no-audit",
                "--no-fund",
                "--prefix",
                str(directory),
                PORTKEY_PACKAGE,
            ],
            check=True,
        )
    return node, script


def _litellm_config(upstream_port: int, directory: Path) -> Path:
    config = directory / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: bench-model\n"
        "    litellm_params:\n"
        "      model: openai/bench-model\n"
        f"      api_base: http://127.0.0.1:{upstream_port}/v1\n"
        "      api_key: sk-bench\n"
        "litellm_settings:\n"
        "  drop_params: true\n"
        "  telemetry: false\n"
    )
    return config


@dataclass
class _Server:
    name: str
    argv: list[str]
    env: dict[str, str]  # what the run sets on top of the inherited environment
    port: int
    start_timeout: float
    cwd: Path | None = None
    headers: bytes = b""


def missing_peers(args: argparse.Namespace) -> dict[str, str]:
    """The peers asked for that are not installed here (and ``--install-peers`` not given):
    name -> what is missing. The run measures the rest and says so."""
    if args.install_peers:
        return {}
    missing = {}
    venv = args.litellm_venv or litellm_venv_for(args.python)
    if "litellm" in args.peers and not (venv / "bin" / "litellm").exists():
        missing["litellm"] = f"no virtualenv at {venv}"
    script = args.portkey_dir / "node_modules" / "@portkey-ai" / "gateway" / "build"
    if "portkey" in args.peers and not (script / "start-server.js").exists():
        missing["portkey"] = f"not installed in {args.portkey_dir}"
    if "nginx" in args.floors and shutil.which("nginx") is None:
        missing["nginx"] = "no nginx on PATH (apt-get install nginx)"
    return missing


def _floors(args: argparse.Namespace, upstream_port: int, workdir: Path) -> list[_Server]:
    servers = []
    if "nginx" in args.floors:
        port = _free_port()
        conf = workdir / "nginx.conf"
        conf.write_text(_NGINX_CONF.format(dir=workdir, upstream=upstream_port, port=port))
        nginx = shutil.which("nginx") or "nginx"
        argv = [nginx, "-e", str(workdir / "error.log"), "-c", str(conf), "-p", str(workdir)]
        servers.append(_Server("nginx", argv, {}, port, 20))
    if "relay" in args.floors:
        port = _free_port()
        argv = [sys.executable, "-m", "benchmarks.support.relay_floor", "--port", str(port)]
        servers.append(
            _Server("relay", [*argv, "--upstream-port", str(upstream_port)], {}, port, 20)
        )
    return servers


def _servers(args: argparse.Namespace, upstream_port: int, workdir: Path) -> list[_Server]:
    upstream = f"http://127.0.0.1:{upstream_port}/v1"
    port = _free_port()
    servers = [
        _Server(
            "repairproxy",
            [
                *(args.python, "-m", "repairproxy", "serve", "--host", "127.0.0.1"),
                *("--port", str(port), "--upstream", upstream, "--api-key", "sk-bench"),
                *("--repair", args.repair, "--metrics", "true"),
            ],
            {},
            port,
            30,
        )
    ]
    if "litellm" in args.peers:
        litellm = ensure_litellm(args.litellm_venv or litellm_venv_for(args.python), args.python)
        port = _free_port()
        servers.append(
            _Server(
                "litellm",
                [
                    *(str(litellm), "--config", str(_litellm_config(upstream_port, workdir))),
                    *("--port", str(port), "--host", "127.0.0.1", "--num_workers", "1"),
                ],
                {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"},
                port,
                180,
                cwd=workdir,
            )
        )
    if "portkey" in args.peers:
        node, script = ensure_portkey(args.portkey_dir)
        preload = workdir / "preload.mjs"
        preload.write_text(_NODE_PRELOAD)
        port = _free_port()
        servers.append(
            _Server(
                "portkey",
                [node, "--import", preload.as_uri(), str(script), f"--port={port}", "--headless"],
                {"NODE_ENV": "production"},
                port,
                60,
                headers=(
                    b"x-portkey-provider: openai\r\nx-portkey-custom-host: %s\r\n"
                    % upstream.encode()
                ),
            )
        )
    return servers


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=f"{QUESTION}\n\n{__doc__}", formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=2.0,
        help="each target's measured time per round (as wrk's -d): every server is exposed to "
        "the host's hiccups for equally long",
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=5.0,
        help="seconds each target runs unrecorded before each cell's rounds (Portkey's CPU per "
        "request falls ~2.5x over its first ~2,500 requests as node's JIT warms up)",
    )
    parser.add_argument(
        "--requests",
        type=int,
        help="instead of --seconds: this many requests per round at 1 client (x4 above)",
    )
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--peers", nargs="*", choices=PEERS, default=list(PEERS))
    parser.add_argument(
        "--floors",
        nargs="*",
        choices=FLOORS,
        default=list(FLOORS),
        help="the floor rows beside the peers: nginx (proxy_pass, upstream keep-alive, one "
        "worker) and the byte relay",
    )
    parser.add_argument(
        "--install-peers",
        action="store_true",
        help="install the peers that are missing (LiteLLM's venv, Portkey with npm: minutes, "
        "network); without it a missing peer is left out of the run and named",
    )
    parser.add_argument("--json-out", type=Path, help="write every figure and flag here")
    parser.add_argument("--repair", default="reflexive")
    parser.add_argument(
        "--python",
        default=sys.executable,
        help="the interpreter repairproxy runs on (a venv with it installed; see "
        "benchmarks.support.interpreters) and LiteLLM's venv is made on (default: this one)",
    )
    parser.add_argument(
        "--litellm-venv",
        type=Path,
        help=f"default: {DEFAULT_LITELLM_VENV} for this interpreter, a sibling per other --python",
    )
    parser.add_argument("--portkey-dir", type=Path, default=DEFAULT_PORTKEY_DIR)
    parser.add_argument("--pool-only", action="store_true", help="only the upstream-client line")
    parser.add_argument(
        "--idle-seconds", type=float, default=5.0, help="each server's idle CPU is read this long"
    )
    add_halt_polling_flag(parser)
    args = parser.parse_args(argv)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    processes: list[subprocess.Popen[bytes]] = []
    workdir = Path(tempfile.mkdtemp(prefix="vs-peers-"))
    host = contextlib.ExitStack()
    try:
        enter_halt_polling(host, args.guest_halt_poll_ns, parser)
        upstream_port = _free_port()
        upstream = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.support.fast_upstream",
                "--port",
                str(upstream_port),
            ],
            env=env,
        )
        processes.append(upstream)
        _wait_port(upstream_port, upstream, 20)
        load = os.getloadavg()[0]
        print(f"machine: {os.cpu_count()} cpus, load average {load:.1f} at the start", flush=True)
        idle_words = idle_policy()
        print(idle_words, flush=True)
        builds = {
            "repairproxy and litellm": f"{args.python}: {interpreter_build(args.python)}",
            "client and upstream": f"{sys.executable}: {interpreter_build(sys.executable)}",
        }
        for role, build in builds.items():
            print(f"interpreter of {role}: {build}", flush=True)
        if args.pool_only:
            uvloop.run(_pool_vs_clients(upstream_port, max(args.requests or 0, 500), args.rounds))
            return
        targets = [_Target("direct", upstream_port)]
        readers: dict[str, _LogReader] = {}
        missing = missing_peers(args)
        for name, why in missing.items():
            print(f"missing: {name} ({why}); its rows are left out of this run", flush=True)
        args.peers = [p for p in args.peers if p not in missing]
        args.floors = [f for f in args.floors if f not in missing]
        servers = _servers(args, upstream_port, workdir) + _floors(args, upstream_port, workdir)
        for server in servers:
            process = subprocess.Popen(
                server.argv,
                env={**env, **server.env},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                cwd=server.cwd,
            )
            processes.append(process)
            assert process.stdout is not None
            readers[server.name] = _LogReader(process.stdout)
            print(f"starting {server.name}: {' '.join(server.argv)}", flush=True)
            try:
                _wait_port(server.port, process, server.start_timeout)
            except RuntimeError:
                sys.stdout.write(b"".join(readers[server.name].tail).decode(errors="replace"))
                raise
            targets.append(_Target(server.name, server.port, process.pid, server.headers))
        print(
            f"request {len(orjson.dumps(REQUEST_BODY))} B with 3 tools, answer 1 valid tool call, "
            f"{args.rounds} rotated rounds of "
            + (
                f"{args.requests} requests (×4 above 1 client)"
                if args.requests
                else f"{args.seconds:g} s per target"
            ),
            flush=True,
        )
        idle = idle_cpu(targets, args.idle_seconds) if args.idle_seconds > 0 else {}
        if idle:
            print(
                f"idle CPU over {args.idle_seconds:.0f} s, % of a core: "
                + ", ".join(f"{name} {share:.1f}%" for name, share in idle.items()),
                flush=True,
            )
        started = time.monotonic()
        window = StealWindow()
        results = uvloop.run(_compare(targets, args))
        window.stop()
        steal = window.percent()
        names = [s.name for s in servers]
        _print_tables(results, names)
        sent = {t.name: t.sent for t in targets[1:]}
        print("\nflags each server ran with (log lines read by the reader thread / requests sent):")
        for server in servers:
            extra = " ".join(f"{k}={v}" for k, v in server.env.items())
            print(f"  {server.name}: {extra + ' ' if extra else ''}{' '.join(server.argv)}")
            print(f"    log lines {readers[server.name].lines} / {sent[server.name]} requests")
        print(
            f"\n{time.monotonic() - started:.0f} s measuring; load average "
            f"{load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end; {window.describe()}. "
            "json: whole answer; "
            "stream: time to the first body byte. added = pXX through it minus pXX direct. CPU: "
            "the server's process tree over the recorded rounds, from /proc."
        )
        if args.json_out is not None:
            args.json_out.write_text(
                orjson.dumps(
                    {
                        "cpus": os.cpu_count(),
                        "load_start": load,
                        "load_end": os.getloadavg()[0],
                        "host_steal_percent": steal,
                        "idle_policy": idle_words,
                        "requests": args.requests,
                        "seconds": None if args.requests else args.seconds,
                        "warmup_seconds": args.warmup,
                        "rounds": args.rounds,
                        "clients": args.clients,
                        "interpreters": builds,
                        "idle_cpu_percent": idle,
                        "servers": {
                            s.name: {
                                "argv": s.argv,
                                "env": s.env,
                                "log_lines": readers[s.name].lines,
                                "requests_sent": sent[s.name],
                                "headers": s.headers.decode(),
                            }
                            for s in servers
                        },
                        "results": results,
                        "missing": missing,
                    },
                    option=orjson.OPT_INDENT_2,
                ).decode()
            )
            print(f"wrote {args.json_out}")
    finally:
        for process in reversed(processes):
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
        shutil.rmtree(workdir, ignore_errors=True)
        host.close()


if __name__ == "__main__":
    raise SystemExit(run_recorded("vs_peers", main))
