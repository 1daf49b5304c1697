"""Raw HTTP on loopback for the front-door tests: the real server (uvicorn + ``LimitedProtocol``)
instrumented to count what it holds, a client that speaks bytes, and an upstream that answers
whatever bytes a test scripts.

    with serving(settings) as server:
        with connect(server.port) as client:
            send_all(client, b"GET /healthz HTTP/1.1\\r\\nhost: x\\r\\n\\r\\n")
            data, closed = read_until_close(client)
        server.most_queued  # the longest pipeline any connection held
"""

from __future__ import annotations

import io
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import uvicorn

from repairproxy.app import RepairProxyApp, create_app
from repairproxy.server import LimitedProtocol, server_options
from repairproxy.settings import Settings

__all__ = [
    "RawUpstream",
    "Served",
    "connect",
    "read_until_close",
    "send_all",
    "serving",
    "statuses",
]


@dataclass
class Served:
    port: int
    app: RepairProxyApp
    fed: list[int] = field(default_factory=list)  # every feed_data call's size
    most_queued: int = 0  # the longest pipeline a connection held after a read
    most_stashed: int = 0  # the most bytes read but not fed

    def refused(self, reason: str) -> float:
        value = self.app.metrics.registry.get_sample_value(
            "repairproxy_connections_refused_total", {"reason": reason}
        )
        return float(value or 0.0)


class _CountingParser:
    def __init__(self, parser: Any, served: Served) -> None:
        self._parser = parser
        self._served = served

    def feed_data(self, data: bytes) -> None:
        self._served.fed.append(len(data))
        self._parser.feed_data(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._parser, name)


@contextmanager
def serving(
    settings: Settings, protocol: type[LimitedProtocol] = LimitedProtocol
) -> Iterator[Served]:
    """The proxy app behind the production server options, on a free port, in a thread."""
    app = create_app(settings, log_stream=io.BytesIO())
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    served = Served(sock.getsockname()[1], app)

    class Counting(protocol):  # type: ignore[valid-type,misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.parser = _CountingParser(self.parser, served)  # type: ignore[has-type]

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            served.most_queued = max(served.most_queued, len(self.pipeline))
            stashed = len(getattr(self, "_stash", b"")) - getattr(self, "_stash_at", 0)
            served.most_stashed = max(served.most_stashed, stashed)

    options = {k: v for k, v in server_options(settings).items() if k not in ("host", "port")}
    options["http"] = Counting
    server = uvicorn.Server(uvicorn.Config(app, **options))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield served
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def connect(port: int, timeout: float = 15.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout)


def send_all(client: socket.socket, data: bytes) -> None:
    """Send what the server takes; it may answer and close half way (that is the point)."""
    with suppress(BrokenPipeError, ConnectionResetError):
        client.sendall(data)


def read_until_close(client: socket.socket) -> tuple[bytes, bool]:
    """What the server sends, and whether it closed (False: the read bound ran out first)."""
    chunks = []
    closed = False
    try:
        while chunk := client.recv(65536):
            chunks.append(chunk)
        closed = True
    except ConnectionResetError:
        closed = True
    except TimeoutError:
        pass
    return b"".join(chunks), closed


def statuses(data: bytes) -> list[int]:
    """The status codes of the answers in ``data``, in order (bodies are JSON: no false hits)."""
    found = []
    for part in data.split(b"HTTP/1.1 ")[1:]:
        head = part[:3]
        if head.isdigit():
            found.append(int(head))
    return found


class RawUpstream:
    """An upstream whose every connection runs ``script(connection, request_number)`` for each
    request head it reads (the script writes what it likes: stray bytes, bad status lines)."""

    def __init__(self, script: Callable[[socket.socket, int], None]) -> None:
        self._script = script
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port: int = self._sock.getsockname()[1]
        self.requests: list[bytes] = []
        self._lock = threading.Lock()
        self._closing = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _accept(self) -> None:
        while not self._closing:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buffer = b""
        with conn, suppress(OSError):
            while True:
                data = conn.recv(65536)
                if not data:
                    return
                buffer += data
                while b"\r\n\r\n" in buffer:
                    head, _, buffer = buffer.partition(b"\r\n\r\n")
                    length = 0
                    for line in head.split(b"\r\n")[1:]:
                        name, _, value = line.partition(b":")
                        if name.strip().lower() == b"content-length":
                            length = int(value)
                    while len(buffer) < length:
                        more = conn.recv(65536)
                        if not more:
                            return
                        buffer += more
                    body, buffer = buffer[:length], buffer[length:]
                    with self._lock:
                        self.requests.append(head + b"\r\n\r\n" + body)
                        number = len(self.requests)
                    self._script(conn, number)

    def close(self) -> None:
        self._closing = True
        self._sock.close()

    def __enter__(self) -> RawUpstream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
