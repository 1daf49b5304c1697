"""The contract every back-end meets: ``MakeOptions`` in, ``Made`` out (what it wrote and how).

Two helpers keep the heavy libraries honest: ``require`` turns a missing package into one clear
``BackendUnavailableError`` naming the extra to install, and ``checked_call`` binds the keyword
arguments against the installed function's signature before calling it, so an argument the
installed version does not accept fails at once with the version named, never silently.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, Protocol

from evals.arms.record import ArmError, BackendUnavailableError, Form, Method, package_versions

__all__ = [
    "Backend",
    "Made",
    "MakeOptions",
    "check_call",
    "checked_call",
    "require",
]

AwqLibrary = Literal["llmcompressor", "autoawq"]
Fp8Activations = Literal["dynamic", "static"]


@dataclass(frozen=True)
class MakeOptions:
    """Everything ``python -m evals.arms make`` was asked; each back-end reads its own part."""

    source: str
    method: Method
    out: Path
    name: str | None = None
    revision: str | None = None  # the source's revision when it is a hub id (recorded only)
    device: str = "auto"  # "auto", "cpu", "cuda" (llm-compressor, autoawq)
    # awq
    awq_library: AwqLibrary = "llmcompressor"
    bits: int = 4
    group_size: int = 128
    zero_point: bool = True
    # fp8
    fp8_activations: Fp8Activations = "dynamic"
    on_the_fly: bool = False
    # calibration (awq, static fp8)
    tau2_data: Path | None = None
    calibration_samples: int = 128
    calibration_seed: int = 0
    max_seq_length: int = 512
    # gguf-requant
    ftype: str = "q3_k_m-requant"
    cache_dir: Path | None = None
    threads: int | None = None
    ignore: tuple[str, ...] = ("lm_head",)


@dataclass(frozen=True)
class Made:
    """What a back-end did; ``make_arm`` adds the common provenance and writes ``arm.json``."""

    form: Form
    library: Mapping[str, Any]
    source: Mapping[str, Any]
    settings: Mapping[str, Any]
    serve: Mapping[str, Any]
    artifact: str | None = None  # path of the weights relative to the arm folder
    calibration: Mapping[str, Any] | None = None
    device: str = "cpu"
    extra: Mapping[str, Any] = field(default_factory=dict)


class Backend(Protocol):
    def __call__(self, options: MakeOptions, folder: Path) -> Made: ...


def require(module: str, *, extra: str, method: str) -> ModuleType:
    """Import ``module`` or stop with the extra that provides it."""
    if importlib.util.find_spec(module.split(".")[0]) is None:
        raise BackendUnavailableError(
            f"--method {method} needs the {module.split('.')[0]!r} package: "
            f"pip install 'repairproxy[{extra}]' (a separate environment from the test suite's)"
        )
    return importlib.import_module(module)


def library_info(name: str, *others: str) -> dict[str, Any]:
    versions = package_versions((name, *others))
    return {"name": name, "version": versions.get(name), "packages": versions}


def check_call(function: Callable[..., Any], kwargs: Mapping[str, Any]) -> None:
    """Raise ArmError unless ``function`` (as installed) declares every keyword in ``kwargs``.

    ``**kwargs`` catch-alls do not count: oneshot forwards them to an argument parser that
    rejects unknown names only later, after the model has been loaded.
    """
    signature = inspect.signature(function)
    named = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    try:
        signature.replace(parameters=named).bind(**kwargs)
    except TypeError as exc:
        module = getattr(function, "__module__", "") or ""
        versions = package_versions([module.split(".")[0]])
        where = f"{getattr(function, '__qualname__', function)} ({module} {versions or ''})"
        raise ArmError(f"{where} does not take these arguments: {exc}") from exc


def checked_call(function: Callable[..., Any], /, **kwargs: Any) -> Any:
    check_call(function, kwargs)
    return function(**kwargs)


def resolve_device(requested: str, method: str) -> str:
    """ "auto" → cuda when torch sees one, else cpu; "cuda" without one stops with a message."""
    torch = require("torch", extra="quantize", method=method)
    has_cuda = bool(torch.cuda.is_available())
    if requested == "cuda" and not has_cuda:
        raise BackendUnavailableError(
            f"--method {method} --device cuda: torch {torch.__version__} sees no CUDA GPU"
        )
    if requested == "auto":
        return "cuda" if has_cuda else "cpu"
    return requested


def source_identity(source: str, revision: str | None) -> dict[str, Any]:
    """A local checkpoint folder's file hashes, or a hub id with the revision asked for."""
    from evals.arms.record import tree_digest

    path = Path(source).expanduser()
    if path.is_dir():
        identity: dict[str, Any] = {"model": str(path.resolve()), **tree_digest(path)}
        # A hub cache snapshot folder is named after its commit.
        parent = path.resolve()
        if parent.parent.name == "snapshots" and len(parent.name) == 40:
            identity["revision"] = parent.name
        return identity
    if not revision:
        raise ArmError(
            f"{source!r} is not a local folder; give --revision COMMIT so the arm names its weights"
        )
    return {"model": source, "revision": revision}
