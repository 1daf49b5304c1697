"""Run the real proxy (uvicorn, uvloop, httptools) in a background thread on a free loopback port.

with running_proxy(Settings(upstream=upstream.base_url)) as proxy:
    openai.OpenAI(base_url=proxy.base_url, api_key="x")
    proxy.log_lines()  # the JSON lines the proxy logged
"""

from __future__ import annotations

import io
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
import uvicorn

from repairproxy.app import create_app
from repairproxy.server import server_options
from repairproxy.settings import Settings

__all__ = ["RunningProxy", "running_proxy"]


class _LockedBytes(io.BytesIO):
    """A log sink the server thread writes while the test thread reads."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()

    def write(self, data: Any) -> int:
        with self._lock:
            return super().write(data)

    def snapshot(self) -> bytes:
        with self._lock:
            return self.getvalue()


@dataclass
class RunningProxy:
    port: int
    settings: Settings
    _log: _LockedBytes
    _clients: list[Any] = field(default_factory=list)
    server: uvicorn.Server | None = None  # read its ``server_state`` from the test thread only

    def client(self, api_key: str = "x", **options: Any) -> Any:
        """An official ``openai.OpenAI`` client of this proxy, closed when the proxy stops (one
        left open leaks its pooled socket to the garbage collector: a ResourceWarning, an error
        in whichever later test the collection lands in)."""
        import openai

        client = openai.OpenAI(
            base_url=self.base_url, api_key=api_key, **{"max_retries": 0, **options}
        )
        self._clients.append(client)
        return client

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_lines(self, settle: float = 2.0) -> list[dict[str, Any]]:
        """The JSON lines logged so far, once no request is in flight (waiting ``settle``
        seconds at most): a request writes its line just after its answer left (it yields
        once, ``asgi/routes.py``), so a client holding the answer can be a step ahead of the
        line. ``settle=0`` reads at once (from the server's own thread, say)."""
        tasks = self.server.server_state.tasks if self.server is not None else ()
        deadline = time.monotonic() + settle
        while tasks and time.monotonic() < deadline:
            time.sleep(0.005)
        return [orjson.loads(line) for line in self._log.snapshot().splitlines() if line.strip()]


@contextmanager
def running_proxy(settings: Settings) -> Iterator[RunningProxy]:
    log = _LockedBytes()
    app = create_app(settings, log_stream=log)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # The production server options (the limited, write-coalescing httptools protocol).
    options = {
        k: v
        for k, v in server_options(settings).items()
        if k not in ("host", "port", "timeout_graceful_shutdown")
    }
    config = uvicorn.Config(app, **options)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the proxy did not start")
        time.sleep(0.01)
    proxy = RunningProxy(port, settings, log, server=server)
    try:
        yield proxy
    finally:
        for client in proxy._clients:
            client.close()
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
