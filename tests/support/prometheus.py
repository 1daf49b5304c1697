"""A real Prometheus server (the Debian ``prometheus`` binary) scraping loopback targets.

with running_prometheus(["127.0.0.1:9100"], tmp_path, rule_files=[alerts]) as prom:
    prom.wait_for("repairproxy_tool_calls_total", lambda v: v == 40)
    prom.query('sum(repairproxy_tool_calls_total)', at=...)
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

__all__ = ["Prometheus", "prometheus_binary", "running_prometheus"]

SCRAPE_SECONDS = 1


def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        pytest.skip("prometheus is not installed (Debian package: apt-get install prometheus)")
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Prometheus:
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    def api(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query; raises (HTTP 400) when ``expr`` does not parse."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self.api("query", **params)
        result: list[dict[str, Any]] = data["result"]
        return result

    def wait_for(
        self, expr: str, done: Callable[[list[dict[str, Any]]], bool], timeout: float = 30.0
    ) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if done(result):
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting on {expr}: {result}\n{self.log_tail()}")
            time.sleep(0.2)

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


@contextmanager
def running_prometheus(
    targets: list[str],
    workdir: Path,
    rule_files: Sequence[Path] = (),
    metrics_path: str = "/metrics",
) -> Iterator[Prometheus]:
    binary = prometheus_binary()
    config = {
        "global": {
            "scrape_interval": f"{SCRAPE_SECONDS}s",
            "evaluation_interval": f"{SCRAPE_SECONDS}s",
        },
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": [
            {
                "job_name": "repairproxy",
                "metrics_path": metrics_path,
                "static_configs": [{"targets": targets}],
            }
        ],
    }
    config_path = workdir / "prometheus.yml"
    config_path.write_text(json.dumps(config))  # JSON is YAML
    port = _free_port()
    log = workdir / "prometheus.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    prom = Prometheus(port, process, log)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"prometheus did not start:\n{prom.log_tail()}")
            time.sleep(0.1)
        yield prom
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
