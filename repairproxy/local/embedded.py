"""Start the embedded model server as a child process and hand back its base URL.

A subprocess, not a thread: decoding holds the CPU for seconds and must never stall the proxy's
event loop. The parent binds the listening socket itself and passes it down, so ``port=0`` needs no
guess-and-retry and the URL is known before the child starts.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

import httpx

from repairproxy.local.arms import arm_named, arm_path, resolve_cache_dir
from repairproxy.local.ensure import ensure_model

__all__ = ["EmbeddedUpstream", "EmbeddedUpstreamError", "start_embedded_upstream"]


class EmbeddedUpstreamError(RuntimeError):
    """The runtime is missing, or the child process did not become ready."""


class EmbeddedUpstream:
    """A running embedded server: ``base_url`` ends in ``/v1``; ``close()`` stops the child."""

    def __init__(self, process: subprocess.Popen[bytes], base_url: str, arm: str, log_path: Path):
        self.process = process
        self.base_url = base_url
        self.arm = arm
        self.log_path = log_path

    def close(self, timeout: float = 10.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> EmbeddedUpstream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"EmbeddedUpstream(arm={self.arm!r}, base_url={self.base_url!r})"


def _wait_ready(process: subprocess.Popen[bytes], url: str, log_path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise EmbeddedUpstreamError(
                    f"the embedded model server exited ({process.returncode}):\n{tail}"
                )
            try:
                if client.get(url).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
    raise EmbeddedUpstreamError(f"the embedded model server was not ready within {timeout:.0f} s")


def start_embedded_upstream(
    arm: str = "q4_k_m",
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    cache_dir: str | Path | None = None,
    n_ctx: int = 16384,
    n_threads: int | None = None,
    ready_timeout: float = 120.0,
    fetch: bool = True,
    progress: bool = True,
    prompt_cache: bool = True,
    answer_log: Path | None = None,
) -> EmbeddedUpstream:
    """Start ``python -m repairproxy.local serve`` for ``arm`` and wait until it answers.

    With ``fetch`` (the default) a missing GGUF is fetched or requantized first
    (``ensure_model``, progress bar on stderr); without it ``ModelNotFetchedError`` names the
    command. ``EmbeddedUpstreamError``: llama-cpp-python is not installed, or the child failed.
    ``prompt_cache`` keeps long system turns' KV on disk (``<cache>/prompt-cache``) across runs;
    ``answer_log`` gets each raw answer as a JSON line (what the model wrote, before any proxy).
    """
    spec = arm_named(arm)
    cache = resolve_cache_dir(cache_dir)
    if not fetch:
        arm_path(spec, cache)  # raises with the fetch command if missing
    if importlib.util.find_spec("llama_cpp") is None:
        raise EmbeddedUpstreamError(
            'llama-cpp-python is not installed; run `pip install -e ".[local]"` '
            "(it compiles llama.cpp, about 5 minutes on 2 cores)"
        )
    if fetch:
        ensure_model(spec.name, progress=progress, cache_dir=cache)
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(128)
    bound_port = listener.getsockname()[1]
    netloc = f"[{host}]:{bound_port}" if ":" in host else f"{host}:{bound_port}"
    command = [sys.executable, "-m", "repairproxy.local", "serve", "--arm", spec.name]
    command += ["--fd", str(listener.fileno()), "--cache-dir", str(cache), "--n-ctx", str(n_ctx)]
    command += ["--parent-pid", str(os.getpid())]
    if not prompt_cache:
        command.append("--no-prompt-cache")
    if answer_log is not None:
        command += ["--answer-log", str(answer_log)]
    if n_threads is not None:
        # One thread per free core: oversubscribed ggml threads spin at barriers and crawl.
        command += ["--threads", str(n_threads)]
    try:
        with tempfile.NamedTemporaryFile(
            prefix="repairproxy-local-", suffix=".log", delete=False
        ) as log:
            process = subprocess.Popen(
                command, pass_fds=[listener.fileno()], stdout=log, stderr=subprocess.STDOUT
            )
    finally:
        listener.close()  # the child holds its own copy
    upstream = EmbeddedUpstream(process, f"http://{netloc}/v1", spec.name, Path(log.name))
    try:
        _wait_ready(process, f"http://{netloc}/health", Path(log.name), ready_timeout)
    except BaseException:
        upstream.close()
        raise
    return upstream
