"""Where the τ²-bench data folder comes from: ``--tau2-data``, ``TAU2_DATA_DIR``, or a cache.

The cache is filled on first use by downloading the pinned τ²-bench release archive, checking its
sha256 and unpacking only its ``data/`` folder. The pinned checksum could not be computed where this
code was written (GitHub unreachable), so ``PINNED_RELEASE.sha256`` is ``None`` until someone
records it; until then a download needs an explicit checksum or an explicit opt-out.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import httpx

__all__ = [
    "DATA_DIR_ENV",
    "PINNED_RELEASE",
    "ChecksumError",
    "DataNotFoundError",
    "ReleaseArchive",
    "default_cache_root",
    "ensure_cached",
    "resolve_data_dir",
]

DATA_DIR_ENV = "TAU2_DATA_DIR"
_MARKER = Path("tau2") / "domains"
_CHUNK = 1 << 16


@dataclass(frozen=True)
class ReleaseArchive:
    """A τ²-bench release archive: where to get it, what it must hash to, where ``data/`` sits."""

    version: str
    url: str
    sha256: str | None
    data_prefix: str


PINNED_RELEASE = ReleaseArchive(
    version="v1.0.1",
    url="https://github.com/sierra-research/tau2-bench/archive/refs/tags/v1.0.1.tar.gz",
    # Unverified: not computable offline. Record the archive's sha256 here once fetched.
    sha256=None,
    data_prefix="tau2-bench-1.0.1/data/",
)


class DataNotFoundError(RuntimeError):
    """No usable τ²-bench data folder."""


class ChecksumError(RuntimeError):
    """The downloaded archive does not hash to the expected sha256."""


def default_cache_root(environ: Mapping[str, str]) -> Path:
    """``$XDG_CACHE_HOME/repairproxy/tau2`` (``~/.cache/...`` when unset)."""
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "repairproxy" / "tau2"


def _looks_like_data_dir(path: Path) -> bool:
    return (path / _MARKER).is_dir()


def _download(url: str, destination: Path, client: httpx.Client) -> str:
    digest = hashlib.sha256()
    with client.stream("GET", url, follow_redirects=True) as response:
        response.raise_for_status()
        with destination.open("wb") as handle:
            for chunk in response.iter_bytes(_CHUNK):
                digest.update(chunk)
                handle.write(chunk)
    return digest.hexdigest()


def _extract_data(archive: Path, prefix: str, target: Path) -> None:
    with tarfile.open(archive, "r:*") as tar:
        for member in tar.getmembers():
            name = PurePosixPath(member.name)
            if not member.name.startswith(prefix) or not (member.isfile() or member.isdir()):
                continue
            relative = PurePosixPath(member.name[len(prefix) :])
            if relative.is_absolute() or ".." in relative.parts or not relative.parts:
                raise DataNotFoundError(f"unsafe path in archive: {name}")
            out = target.joinpath(*relative.parts)
            if member.isdir():
                out.mkdir(parents=True, exist_ok=True)
                continue
            out.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            assert source is not None
            with source, out.open("wb") as handle:
                shutil.copyfileobj(source, handle)


def ensure_cached(
    release: ReleaseArchive,
    cache_root: Path,
    *,
    client: httpx.Client | None = None,
    allow_unverified: bool = False,
) -> Path:
    """The cached data folder for ``release``, downloading and verifying it on first use."""
    final = cache_root / release.version / "data"
    if _looks_like_data_dir(final):
        return final
    if release.sha256 is None and not allow_unverified:
        raise ChecksumError(
            f"no sha256 is pinned for τ²-bench {release.version}; pass --tau2-data DIR, set "
            f"{DATA_DIR_ENV}, or allow an unverified download (--tau2-allow-unverified)"
        )
    cache_root.mkdir(parents=True, exist_ok=True)
    owned = client is None
    http = client or httpx.Client(timeout=120.0)
    with tempfile.TemporaryDirectory(dir=cache_root, prefix=".download-") as scratch:
        archive = Path(scratch) / "release.tar.gz"
        try:
            digest = _download(release.url, archive, http)
        finally:
            if owned:
                http.close()
        if release.sha256 is not None and digest != release.sha256.lower():
            raise ChecksumError(
                f"{release.url}: sha256 {digest} does not match pinned {release.sha256}"
            )
        staging = Path(scratch) / "data"
        _extract_data(archive, release.data_prefix, staging)
        if not _looks_like_data_dir(staging):
            raise DataNotFoundError(f"{release.url} holds no {release.data_prefix}{_MARKER}")
        (staging / ".sha256").write_text(digest + "\n", encoding="utf-8")
        final.parent.mkdir(parents=True, exist_ok=True)
        # Another process may have won the race; its copy is as good as ours.
        try:
            os.replace(staging, final)
        except OSError:
            if not _looks_like_data_dir(final):
                raise
    return final


def resolve_data_dir(
    cli_value: Path | None,
    environ: Mapping[str, str],
    *,
    release: ReleaseArchive = PINNED_RELEASE,
    cache_root: Path | None = None,
    allow_download: bool = True,
    allow_unverified: bool = False,
) -> Path:
    """``--tau2-data`` first, then ``TAU2_DATA_DIR``, then the (possibly downloaded) cache."""
    for source, value in (("--tau2-data", cli_value), (DATA_DIR_ENV, environ.get(DATA_DIR_ENV))):
        if value:
            path = Path(value).expanduser()
            if not _looks_like_data_dir(path):
                raise DataNotFoundError(f"{source}={path} has no {_MARKER} folder")
            return path
    root = cache_root or default_cache_root(environ)
    cached = root / release.version / "data"
    if _looks_like_data_dir(cached) or allow_download:
        return ensure_cached(release, root, allow_unverified=allow_unverified)
    raise DataNotFoundError(f"no τ²-bench data: pass --tau2-data or set {DATA_DIR_ENV}")
