"""Headless Chromium (the Debian ``chromium`` binary): a page's rendered DOM and a screenshot.

Also writes the dashboard screenshot of docs/metrics.md from a scripted workload:
    .venv/bin/python -m tests.support.chromium docs/dashboard.png
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

__all__ = ["chromium_binary", "dump_dom", "screenshot", "serving"]


def chromium_binary() -> str | None:
    return next((p for n in ("chromium", "chromium-browser") if (p := shutil.which(n))), None)


def _run(args: list[str], workdir: Path) -> str:
    binary = chromium_binary()
    assert binary is not None, "chromium is not installed"
    flags = [
        "--headless",
        "--no-sandbox",  # CI runs as root
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
        f"--user-data-dir={workdir / 'profile'}",
    ]
    done = subprocess.run(
        [binary, *flags, *args], capture_output=True, text=True, timeout=120, cwd=workdir
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def dump_dom(url: str) -> str:
    """The DOM after the page loaded, serialized."""
    with tempfile.TemporaryDirectory() as workdir:
        return _run(["--dump-dom", url], Path(workdir))


def screenshot(url: str, path: Path, width: int = 1280, height: int = 1000) -> None:
    with tempfile.TemporaryDirectory() as workdir:
        _run(
            [f"--window-size={width},{height}", f"--screenshot={path.resolve()}", url],
            Path(workdir),
        )


@contextmanager
def serving(render: Callable[[], bytes], path: str = "/dashboard") -> Iterator[str]:
    """A loopback server answering ``GET path`` with ``render()``; yields the page's URL."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return None

        def do_GET(self) -> None:
            status, body = (200, render()) if self.path == path else (404, b"not found")
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}{path}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _readme_screenshot(path: Path) -> None:
    from repairproxy.observe.dashboard import render_dashboard
    from repairproxy.observe.metrics import Metrics
    from repairproxy.settings import Settings
    from tests.support.metrics_workload import scripted_workload

    metrics = Metrics(Settings())
    metrics.bind_active_episodes(lambda: 8)
    for record in scripted_workload("Qwen2.5-7B-Instruct-AWQ"):
        metrics.request_finished(record)
    # A full-precision twin that invents fewer names.
    right = frozenset({(0, 1), (0, 2), (0, 3), (1, 0), (1, 2), (2, 1), (4, 0)})
    for record in scripted_workload("Qwen2.5-7B-Instruct", answered_right=right):
        metrics.request_finished(record)
    with serving(lambda: render_dashboard(metrics)) as url:
        screenshot(url, path, height=1100)


if __name__ == "__main__":
    _readme_screenshot(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/dashboard.png"))
