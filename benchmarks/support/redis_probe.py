"""A ``redis-server`` for a benchmark, and the commands its clients send, counted with MONITOR.

A command a Lua script runs shows in MONITOR's stream as coming from ``lua``; the rest are what
clients sent. The proxy sends a command alone (one round trip) or several at once as one
``MULTI`` ... ``EXEC`` block (one round trip: ``episodes.redis_store.ScriptBatch``).
``CommandMonitor`` counts the commands per name and the round trips (a command outside a block,
or a block), so a figure can say how many round trips a request cost.

    with redis_process() as port, CommandMonitor(port) as monitor:
        ...  # requests
        sent = monitor.settle()  # Counter of client commands, e.g. {"evalsha": 1000}
"""

from __future__ import annotations

import contextlib
import re
import shutil
import socket
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from types import TracebackType

from benchmarks.support.load import free_port, wait_port

__all__ = ["CommandMonitor", "redis_process"]

# +1701700000.123456 [0 127.0.0.1:51234] "EVALSHA" "..."   (or [0 lua] from inside a script)
_LINE = re.compile(rb'^\+\d+\.\d+ \[\d+ ([^\]]+)\] "([^"]+)"')


@contextlib.contextmanager
def redis_process() -> Iterator[int]:
    """``redis-server`` on a free loopback port, without disk; yields the port."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (apt-get install redis-server)")
    port = free_port()
    command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    process = subprocess.Popen(
        [*command, "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_port(port, 10.0)
        yield port
    finally:
        process.terminate()
        process.wait(10)


def _command(port: int, *words: bytes) -> bytes:
    """One command on a fresh connection (RESP), its first reply line."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        parts = [b"*%d\r\n" % len(words)]
        parts += [b"$%d\r\n%s\r\n" % (len(word), word) for word in words]
        sock.sendall(b"".join(parts))
        return sock.recv(65536).split(b"\r\n", 1)[0]


class CommandMonitor:
    """MONITOR on its own connection, read by a thread; ``settle()`` waits until every command
    sent so far has been seen and returns the client commands counted since the last reset."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sent: Counter[str] = Counter()  # client commands, lower-case names
        self.scripted: Counter[str] = Counter()  # commands run inside scripts
        self.round_trips = 0  # commands sent alone, and MULTI ... EXEC blocks
        self._in_block: set[bytes] = set()  # the connections inside MULTI now
        self._marks: set[bytes] = set()
        self._lock = threading.Lock()
        self._sock = socket.create_connection(("127.0.0.1", port), timeout=None)
        self._sock.sendall(b"*1\r\n$7\r\nMONITOR\r\n")
        self._file = self._sock.makefile("rb")
        if self._file.readline().strip() != b"+OK":
            raise RuntimeError("MONITOR was refused")
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self._file:
            match = _LINE.match(line)
            if match is None:
                continue
            source, name = match.group(1), match.group(2).lower().decode()
            with self._lock:
                if name == "echo" and b'"probe-mark-' in line:
                    self._marks.add(line.rsplit(b'"', 2)[1])
                elif source == b"lua":
                    self.scripted[name] += 1
                else:
                    self.sent[name] += 1
                    if name == "multi":
                        self._in_block.add(source)
                        self.round_trips += 1
                    elif name in ("exec", "discard"):
                        self._in_block.discard(source)
                    elif source not in self._in_block:
                        self.round_trips += 1

    def settle(self, timeout: float = 10.0) -> Counter[str]:
        """The client commands seen since the last ``reset``, once MONITOR has caught up."""
        mark = b"probe-mark-%d" % time.monotonic_ns()
        _command(self.port, b"ECHO", mark)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if mark in self._marks:
                    return Counter(self.sent)
            time.sleep(0.01)
        raise TimeoutError("MONITOR did not catch up")

    def reset(self) -> None:
        self.settle()
        with self._lock:
            self.sent.clear()
            self.scripted.clear()
            self.round_trips = 0

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(5)

    def __enter__(self) -> CommandMonitor:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
