"""How an arm's model server is started: vLLM (any precision it serves) or the embedded
llama.cpp model. A grid's ``launch = ...`` table parses into one of these, an arm's record
(``evals.arms.record``) names one, and ``evals.grid.launch`` runs its ``command``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

__all__ = ["EmbeddedLaunch", "Launch", "VllmLaunch"]


@dataclass(frozen=True)
class VllmLaunch:
    """``vllm serve MODEL ...`` for one precision arm (GPU only)."""

    model: str
    quantization: str | None = None  # "awq", "fp8", ... ; None serves the checkpoint as is
    dtype: str | None = None  # e.g. "bfloat16" for the reference arm
    tool_call_parser: str = "hermes"
    served_model_name: str | None = None
    executable: str = "vllm"
    host: str = "127.0.0.1"
    port: int | None = None  # None: a free port chosen when it starts
    extra_args: tuple[str, ...] = ()
    ready_timeout_s: float = 1800.0

    health_path = "/health"

    def command(self, port: int) -> list[str]:
        args = [self.executable, "serve", self.model, "--host", self.host, "--port", str(port)]
        if self.served_model_name:
            args += ["--served-model-name", self.served_model_name]
        if self.quantization:
            args += ["--quantization", self.quantization]
        if self.dtype:
            args += ["--dtype", self.dtype]
        args += ["--enable-auto-tool-choice", "--tool-call-parser", self.tool_call_parser]
        return args + list(self.extra_args)


@dataclass(frozen=True)
class EmbeddedLaunch:
    """``python -m repairproxy.local serve --arm A`` (the embedded llama.cpp model, CPU)."""

    arm: str
    threads: int | None = None
    n_ctx: int | None = None
    host: str = "127.0.0.1"
    port: int | None = None
    ready_timeout_s: float = 300.0

    health_path = "/health"

    def command(self, port: int) -> list[str]:
        args = [sys.executable, "-m", "repairproxy.local", "serve", "--arm", self.arm]
        args += ["--host", self.host, "--port", str(port)]
        if self.threads is not None:
            args += ["--threads", str(self.threads)]
        if self.n_ctx is not None:
            args += ["--n-ctx", str(self.n_ctx)]
        return args


Launch = VllmLaunch | EmbeddedLaunch
