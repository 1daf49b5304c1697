"""Real servers as child processes on loopback ports: ``redis-server``, ``nginx`` and the proxy
itself (``python -m repairproxy serve``), for the scale-out tests.

    with redis_server() as redis_url, proxy_process(upstream, "--episode-store", redis_url) as a:
        httpx.post(a.base_url + "/chat/completions", ...)

Each waits until its server answers and stops it at the end (SIGTERM, then SIGKILL). The
binaries come from Debian (``.ci/run`` installs them); a test calls ``need(binary)`` to skip
with a reason where one is missing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

__all__ = [
    "ProxyProcess",
    "RedisServer",
    "free_port",
    "need",
    "nginx",
    "proxy_process",
    "redis_server",
]

ROOT = Path(__file__).resolve().parents[2]


def need(binary: str) -> str:
    """The binary's path, or skip the test saying which Debian package to install."""
    found = shutil.which(binary) or next(
        (str(p) for p in (Path("/usr/sbin", binary), Path("/usr/bin", binary)) if p.exists()),
        None,
    )
    if found is None:
        package = "redis-server" if binary.startswith("redis") else binary
        pytest.skip(f"{binary} is not installed (Debian package: apt-get install {package})")
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _wait_for_port(port: int, process: subprocess.Popen[bytes], what: str, limit: float) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.02)
    raise RuntimeError(f"{what} did not listen on {port} within {limit} s")


def _stop(process: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


@dataclass
class RedisServer:
    port: int
    process: subprocess.Popen[bytes]
    binary: str

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(5)

    def restart(self, *extra: str) -> None:
        """A fresh, empty server on the same port (what a restarted Redis without disk is)."""
        self.process = _start_redis(self.binary, self.port, *extra)


def _start_redis(binary: str, port: int, *extra: str) -> subprocess.Popen[bytes]:
    command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly"]
    process = subprocess.Popen(
        [*command, "no", *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _wait_for_port(port, process, "redis-server", 10.0)
    return process


@contextlib.contextmanager
def redis_server(*extra: str) -> Iterator[RedisServer]:
    """``redis-server`` on a free loopback port, without disk; ``extra``: more of its flags."""
    binary = need("redis-server")
    server = RedisServer(free_port(), subprocess.Popen(["true"]), binary)
    server.process.wait()
    server.restart(*extra)
    try:
        yield server
    finally:
        _stop(server.process)


@dataclass
class ProxyProcess:
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.root_url + "/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def terminate(self) -> None:
        self.process.send_signal(signal.SIGTERM)


@contextlib.contextmanager
def proxy_process(
    upstream: str, *args: str, port: int | None = None, env: dict[str, str] | None = None
) -> Iterator[ProxyProcess]:
    """``python -m repairproxy serve --upstream URL ARGS...`` until ``/healthz`` answers."""
    port = port or free_port()
    with tempfile.NamedTemporaryFile(prefix="repairproxy-", suffix=".log", delete=False) as f:
        log_path = Path(f.name)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("REPAIRPROXY_")}
    environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
    environ.update(env or {})
    command = [sys.executable, "-m", "repairproxy", "serve", "--upstream", upstream]
    command.extend(["--port", str(port), *args])
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=environ,
        )
    running = ProxyProcess(port, process, log_path)
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the proxy exited with {process.returncode}:\n{running.log()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(running.root_url + "/healthz", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the proxy did not start:\n{running.log()}")
            time.sleep(0.05)
        yield running
    finally:
        _stop(process)
        log_path.unlink(missing_ok=True)


_NGINX_CONF = """
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
worker_processes 1;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
{body}
}}
"""


@contextlib.contextmanager
def nginx(http_block: str, port: int) -> Iterator[Path]:
    """Debian's nginx in the foreground with ``http_block`` (the server and upstream blocks)."""
    binary = need("nginx")
    with tempfile.TemporaryDirectory(prefix="nginx-") as directory:
        conf = Path(directory, "nginx.conf")
        conf.write_text(_NGINX_CONF.format(dir=directory, body=http_block))
        process = subprocess.Popen(
            [binary, "-e", f"{directory}/error.log", "-c", str(conf), "-p", directory],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait_for_port(port, process, "nginx", 10.0)
            yield Path(directory)
        finally:
            _stop(process)
