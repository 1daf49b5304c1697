"""repairproxy vs LiteLLM proxy: the same fast upstream, direct vs through each, interleaved.

Starts a fast OpenAI-shaped upstream (JSON, or SSE when the request says ``"stream": true``),
``python -m repairproxy serve`` and ``litellm --config ...`` (``litellm[proxy]==1.82.6`` in its own
virtualenv, created on first use under ``--litellm-venv``; nothing of it enters the project's
venv), then drives all three with one minimal keep-alive client (uvloop + httptools) at each
concurrency, non-streaming (whole answer) and streaming (time to first body byte), rotating the
order of the three in every round so drift hits them alike. Prints added p50/p99 over direct,
requests/s, and LiteLLM's added latency over repairproxy's (the ratio).

It also prints the cost of one round trip in three upstream clients: repairproxy's own pool
(``repairproxy.http1``), aiohttp's client and httpx's, the case for keeping the hand-written pool.

    python -m benchmarks.vs_litellm [--requests 300] [--rounds 4] [--concurrency 1 16]
    python -m benchmarks.vs_litellm --clients-only     # just the pool vs aiohttp vs httpx line
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httptools
import orjson
import uvloop

from benchmarks.overhead import REQUEST_BODY

__all__ = ["main"]

LITELLM_REQUIREMENT = "litellm[proxy]==1.82.6"  # 1.82.7 and 1.82.8 were compromised on PyPI
DEFAULT_LITELLM_VENV = Path(tempfile.gettempdir()) / "litellm-venv"


# -- the load client ------------------------------------------------------------------------------


class _Connection(asyncio.Protocol):
    """One keep-alive connection: send prebuilt bytes, time the first body byte and the end."""

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._done: asyncio.Future[None] | None = None
        self._first: float | None = None
        self.status = 0
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
        started = time.perf_counter()
        self.transport.write(data)
        await self._done
        ended = time.perf_counter()
        if self.status != 200:
            raise RuntimeError(f"answer {self.status}")
        return (self._first or ended) - started, ended - started


@dataclass
class _Target:
    name: str
    port: int
    pools: dict[int, list[_Connection]] = field(default_factory=dict)
    # (stream, concurrency) -> latencies (ttfb for streams, whole answer otherwise), busy time
    samples: dict[tuple[bool, int], list[float]] = field(default_factory=dict)
    busy: dict[tuple[bool, int], float] = field(default_factory=dict)

    def payload(self, stream: bool) -> bytes:
        body = orjson.dumps({**REQUEST_BODY, "stream": True} if stream else REQUEST_BODY)
        return (
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:%d\r\n"
            b"content-type: application/json\r\nauthorization: Bearer sk-bench\r\n"
            b"content-length: %d\r\n\r\n%s" % (self.port, len(body), body)
        )

    async def round(self, stream: bool, concurrency: int, requests: int, record: bool) -> None:
        # Servers close keep-alive connections idle for a few seconds (uvicorn: 5 s) while the
        # other targets run their rounds: reopen those before the round, outside its clock.
        loop = asyncio.get_running_loop()
        pool = self.pools.setdefault(concurrency, [])
        pool[:] = [c for c in pool if c.transport is not None and not c.transport.is_closing()]
        while len(pool) < concurrency:
            pool.append((await loop.create_connection(_Connection, "127.0.0.1", self.port))[1])
        data = self.payload(stream)
        taken: list[float] = []

        async def worker(conn: _Connection) -> None:
            for _ in range(max(1, requests // concurrency)):
                first, whole = await conn.request(data)
                taken.append(first if stream else whole)

        started = time.perf_counter()
        await asyncio.gather(*(worker(conn) for conn in self.pools[concurrency]))
        if record:
            key = (stream, concurrency)
            self.samples.setdefault(key, []).extend(taken)
            self.busy[key] = self.busy.get(key, 0.0) + time.perf_counter() - started


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _compare(targets: list[_Target], args: argparse.Namespace) -> None:
    direct = targets[0]
    names = [t.name for t in targets[1:]]
    header = f"{'mode':<10}{'conc':>5}{'direct p50':>12}"
    for name in names:
        header += f"{name + ' +p50':>20}{'+p99':>12}{'req/s':>8}"
    if len(names) == 2:
        header += f"{'ratio p50':>11}{'ratio p99':>11}"
    print(header, flush=True)
    for stream in (False, True):
        for concurrency in args.concurrency:
            requests = args.requests * (1 if concurrency == 1 else 4)
            for target in targets:
                await target.round(stream, concurrency, min(requests, 100), record=False)
            for index in range(args.rounds):
                shift = index % len(targets)
                for target in targets[shift:] + targets[:shift]:
                    await target.round(stream, concurrency, requests, record=True)
            key = (stream, concurrency)
            base = direct.samples[key]
            line = f"{'stream' if stream else 'json':<10}{concurrency:>5}"
            line += f"{_pct(base, 0.5) * 1e3:>10.3f}ms"
            added: list[tuple[float, float]] = []
            for target in targets[1:]:
                got = target.samples[key]
                p50 = (_pct(got, 0.5) - _pct(base, 0.5)) * 1e3
                p99 = (_pct(got, 0.99) - _pct(base, 0.99)) * 1e3
                added.append((p50, p99))
                rate = len(got) / target.busy[key]
                line += f"{p50:>18.3f}ms{p99:>10.3f}ms{rate:>8.0f}"
            if len(added) == 2:
                (ours50, ours99), (theirs50, theirs99) = added
                line += (
                    f"{theirs50 / max(ours50, 1e-3):>10.1f}x{theirs99 / max(ours99, 1e-3):>10.1f}x"
                )
            print(line, flush=True)
    print(
        "ttfb = time to the first body byte (streams); json = whole answer. "
        "+p50/+p99: added over direct (pXX through it minus pXX direct); ratio = litellm / ours."
    )


# -- upstream clients: repairproxy's pool vs aiohttp vs httpx -------------------------------------


async def _clients(port: int, requests: int, rounds: int) -> None:
    import aiohttp
    import httpx

    from repairproxy.http1 import ConnectionPool

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

    runs = {"repairproxy.http1": via_pool, "aiohttp": via_aiohttp, "httpx": via_httpx}
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
    ours = cpu["repairproxy.http1"] / total
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


def ensure_litellm(venv: Path) -> Path:
    """The ``litellm`` executable of its own virtualenv, created (with progress) on first use."""
    executable = venv / "bin" / "litellm"
    if executable.exists():
        return executable
    print(f"creating {venv} with {LITELLM_REQUIREMENT} (once; a few minutes)...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--progress-bar", "on", LITELLM_REQUIREMENT],
        check=True,
    )
    return executable


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=300, help="per round at concurrency 1")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--repair", default="reflexive")
    parser.add_argument("--litellm-venv", type=Path, default=DEFAULT_LITELLM_VENV)
    parser.add_argument("--skip-litellm", action="store_true")
    parser.add_argument("--clients-only", action="store_true")
    args = parser.parse_args(argv)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    upstream_port = _free_port()
    processes: list[subprocess.Popen[bytes]] = []
    try:
        upstream = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.fast_upstream", "--port", str(upstream_port)],
            env=env,
        )
        processes.append(upstream)
        _wait_port(upstream_port, upstream, 20)
        print(
            f"machine: {os.cpu_count()} cpus, load average {os.getloadavg()[0]:.1f} "
            "(other processes share the cpus)",
            flush=True,
        )
        if not args.clients_only:
            targets = [_Target("direct", upstream_port)]
            port = _free_port()
            ours = subprocess.Popen(
                [
                    *(sys.executable, "-m", "repairproxy", "serve", "--port", str(port)),
                    *("--upstream", f"http://127.0.0.1:{upstream_port}/v1"),
                    *("--repair", args.repair),
                ],
                env=env,
                stdout=subprocess.DEVNULL,
            )
            processes.append(ours)
            _wait_port(port, ours, 30)
            targets.append(_Target("repairproxy", port))
            if not args.skip_litellm:
                litellm = ensure_litellm(args.litellm_venv)
                port = _free_port()
                workdir = Path(tempfile.mkdtemp(prefix="vs-litellm-"))
                theirs = subprocess.Popen(
                    [
                        *(str(litellm), "--config", str(_litellm_config(upstream_port, workdir))),
                        *("--port", str(port), "--host", "127.0.0.1", "--num_workers", "1"),
                    ],
                    env={**env, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"},
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    cwd=workdir,
                )
                processes.append(theirs)
                print("waiting for the LiteLLM proxy to start...", flush=True)
                _wait_port(port, theirs, 180)
                targets.append(_Target("litellm", port))
            print(
                f"request {len(orjson.dumps(REQUEST_BODY))} B with 3 tools, answer 1 tool call, "
                f"repairproxy --repair {args.repair}, {args.rounds} rotated rounds",
                flush=True,
            )
            uvloop.run(_compare(targets, args))
        uvloop.run(_clients(upstream_port, max(args.requests, 500), max(args.rounds, 3)))
    finally:
        for process in reversed(processes):
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


if __name__ == "__main__":
    main()
