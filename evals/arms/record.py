"""``arm.json``: what one made precision arm is, how it was made, and how to serve it.

Every back-end writes the same record, so the grid can launch an arm from its folder and the report
can name exactly which weights produced a figure: method, library and version, source model and
revision or hash, the exact settings, the calibration text, size on disk, wall time, date and the
project's git commit.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from evals.arms.serving import EmbeddedLaunch, Launch, VllmLaunch

__all__ = [
    "ARM_FILE",
    "SCHEMA_VERSION",
    "ArmDirEmbeddedLaunch",
    "ArmError",
    "ArmRecord",
    "BackendUnavailableError",
    "Method",
    "git_state",
    "load_arm",
    "package_versions",
    "sha256_of",
    "size_on_disk",
    "tree_digest",
]

ARM_FILE = "arm.json"
SCHEMA_VERSION = 1
Method = Literal["awq", "fp8", "w8a8", "gguf-requant"]
METHODS: tuple[Method, ...] = ("awq", "fp8", "w8a8", "gguf-requant")
# What the arm is: a quantized checkpoint folder, a GGUF file, or a flag a server applies on load.
Form = Literal["checkpoint", "gguf", "serving-flag"]


class ArmError(RuntimeError):
    """An arm cannot be made, read or served as asked; the message says what to do."""


class BackendUnavailableError(ArmError):
    """A back-end's package (or the GPU it needs) is missing; the message names the extra."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def tree_digest(root: Path) -> dict[str, Any]:
    """Each file's sha256 under ``root`` and one digest over the list (a checkpoint's identity)."""
    if root.is_file():
        return {"sha256": sha256_of(root)}
    files = {str(p.relative_to(root)): sha256_of(p) for p in _files(root)}
    listing = "".join(f"{name}\0{digest}\n" for name, digest in sorted(files.items()))
    return {"sha256": hashlib.sha256(listing.encode()).hexdigest(), "files": files}


def size_on_disk(path: Path) -> int:
    """Bytes of the file, or of every regular file under the folder (symlinks not followed)."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in _files(path))


def package_versions(names: Iterable[str]) -> dict[str, str]:
    """Installed versions of the named distributions; missing ones are left out."""
    found: dict[str, str] = {}
    for name in names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def git_state() -> dict[str, Any]:
    """The project's commit and whether the work tree had changes (empty outside a checkout)."""
    here = Path(__file__).resolve().parent

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", *args], cwd=here, capture_output=True, text=True, timeout=10, check=True
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip()

    commit = git("rev-parse", "HEAD")
    if not commit:
        return {"commit": None, "dirty": None}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def host_info(device: str) -> dict[str, str]:
    return {
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "machine": platform.machine(),
        "device": device,
        "argv": " ".join(sys.argv),
    }


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class ArmDirEmbeddedLaunch(EmbeddedLaunch):
    """The embedded llama.cpp server reading the arm's GGUF from the arm folder (its cache dir)."""

    cache_dir: Path | None = None

    def command(self, port: int) -> list[str]:
        args = super().command(port)
        return [*args, "--cache-dir", str(self.cache_dir)] if self.cache_dir else args


@dataclass(frozen=True)
class ArmRecord:
    """One made arm, as ``arm.json`` holds it. ``folder`` is where it was read from."""

    name: str
    method: Method
    form: Form
    library: Mapping[str, Any]
    source: Mapping[str, Any]
    settings: Mapping[str, Any]
    serve: Mapping[str, Any]
    calibration: Mapping[str, Any] | None = None
    artifact: Mapping[str, Any] | None = None  # path (relative to the folder), size, digest
    wall_seconds: float = 0.0
    created_at: str = ""
    git: Mapping[str, Any] = field(default_factory=dict)
    host: Mapping[str, Any] = field(default_factory=dict)
    schema: int = SCHEMA_VERSION
    folder: Path | None = field(default=None, compare=False)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        del data["folder"]
        return data

    def write(self, folder: Path) -> Path:
        path = folder / ARM_FILE
        partial = path.with_name(path.name + ".partial")
        partial.write_text(json.dumps(self.to_json(), indent=2) + "\n", encoding="utf-8")
        partial.replace(path)
        return path

    def artifact_path(self) -> Path | None:
        """Where the weights are: the artifact inside the arm folder (None for a serving flag)."""
        if not self.artifact:
            return None
        relative = Path(str(self.artifact["path"]))
        return relative if self.folder is None else self.folder / relative

    def summary(self) -> str:
        """One line for a table: method, form, settings that matter, size."""
        size = (self.artifact or {}).get("size_bytes")
        where = f", {size / 1e6:.1f} MB" if isinstance(size, int) else ""
        lib = f"{self.library.get('name')} {self.library.get('version')}"
        return f"{self.name}: {self.method} ({self.form}, {lib}){where}"

    def table_row(self) -> dict[str, str]:
        """The report's arm table: one row naming exactly which weights an arm's figures used."""
        source = self.source
        identity = source.get("revision") or str(source.get("sha256") or "")[:12]
        calibration = self.calibration or {}
        size = (self.artifact or {}).get("size_bytes")
        digest = str((self.artifact or {}).get("sha256") or "")[:12]
        return {
            "arm": self.name,
            "method": self.method,
            "form": self.form,
            "library": f"{self.library.get('name')} {self.library.get('version') or ''}".strip(),
            "source": f"{source.get('model')} @ {identity}"
            if identity
            else str(source.get("model")),
            "settings": str(self.settings.get("scheme") or self.settings.get("ftype") or ""),
            "calibration": (
                f"{calibration.get('samples')} samples, {calibration.get('source')}"
                if calibration
                else "none"
            ),
            "size": f"{size / 1e6:.1f} MB" if isinstance(size, int) else "n/a (serving flag)",
            "weights sha256": digest or "n/a",
            "made": f"{self.created_at} in {self.wall_seconds:.0f} s",
            "commit": str(self.git.get("commit") or "")[:12],
        }

    def launch(
        self,
        *,
        served_model_name: str | None = None,
        tool_call_parser: str = "hermes",
        extra_args: tuple[str, ...] = (),
        port: int | None = None,
        vllm: VllmLaunch | None = None,
    ) -> Launch:
        """How the grid starts a server for this arm (vLLM for checkpoints, llama.cpp for GGUF).

        ``vllm``: the grid's own vLLM launch (device, context length, timeouts) to serve a vLLM
        arm with; the record still decides the weights, their quantization and its extra args.
        """
        engine = self.serve.get("engine")
        if engine == "embedded":
            cache = self.serve.get("cache_dir")
            cache_dir = None
            if cache is not None:
                cache_dir = Path(str(cache))
                if not cache_dir.is_absolute() and self.folder is not None:
                    cache_dir = self.folder / cache_dir
            return ArmDirEmbeddedLaunch(
                arm=str(self.serve["embedded_arm"]), port=port, cache_dir=cache_dir
            )
        if engine == "vllm":
            model = str(self.serve["model"])
            if self.form == "checkpoint" and self.folder is not None:
                model = str((self.folder / model).resolve())
            quantization = self.serve.get("quantization")
            base = vllm or VllmLaunch(model=model, tool_call_parser=tool_call_parser, port=port)
            return dataclasses.replace(
                base,
                model=model,
                quantization=str(quantization) if quantization else None,
                dtype=self.serve.get("dtype") or base.dtype,
                served_model_name=served_model_name or base.served_model_name,
                port=port if port is not None else base.port,
                extra_args=tuple(self.serve.get("extra_args", ()))
                + tuple(extra_args)
                + base.extra_args,
            )
        raise ArmError(f"{self.folder}/{ARM_FILE}: serve.engine {engine!r} is not vllm or embedded")

    @classmethod
    def from_json(cls, data: Mapping[str, Any], folder: Path | None = None) -> ArmRecord:
        if data.get("schema") != SCHEMA_VERSION:
            raise ArmError(
                f"arm.json schema {data.get('schema')!r}; this code reads {SCHEMA_VERSION}"
            )
        if data.get("method") not in METHODS:
            raise ArmError(f"arm.json method {data.get('method')!r}; expected one of {METHODS}")
        names = {f for f in cls.__dataclass_fields__ if f != "folder"}
        missing = sorted(
            n
            for n in ("name", "method", "form", "library", "source", "settings", "serve")
            if n not in data
        )
        if missing:
            raise ArmError(f"arm.json lacks {missing}")
        return cls(**{k: v for k, v in data.items() if k in names}, folder=folder)


def load_arm(folder: str | os.PathLike[str]) -> ArmRecord:
    """Read ``folder/arm.json`` (what ``python -m evals.arms make`` wrote)."""
    path = Path(folder)
    target = path / ARM_FILE if path.is_dir() or not path.name.endswith(".json") else path
    try:
        data = json.loads(target.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ArmError(
            f"{target} does not exist; make it with `python -m evals.arms make`"
        ) from exc
    except json.JSONDecodeError as exc:
        raise ArmError(f"{target} is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ArmError(f"{target}: expected a JSON object")
    return ArmRecord.from_json(data, folder=target.parent.resolve())
