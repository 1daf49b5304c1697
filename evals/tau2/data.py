"""Where the τ²-bench data folder comes from: ``--tau2-data``, ``TAU2_DATA_DIR``, or a cache.

The cache is filled on first use with exactly the files this suite reads, each fetched from
``$TAU2_DATA_URL/<tag>/data/<path>`` (default: raw files of sierra-research/tau2-bench on GitHub)
at the tag it was pinned from and checked against a sha256 pinned here, so a mirror or a loopback
server can stand in and nothing unverified is ever kept. τ²-bench data is MIT-licensed, (c) 2025
Sierra Research.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

__all__ = [
    "DATA_DIR_ENV",
    "DATA_URL_ENV",
    "DEFAULT_DATA_URL",
    "PINNED_FILES",
    "ChecksumError",
    "DataFile",
    "DataNotFoundError",
    "default_cache_root",
    "ensure_cached",
    "resolve_data_dir",
]

DATA_DIR_ENV = "TAU2_DATA_DIR"
DATA_URL_ENV = "TAU2_DATA_URL"
DEFAULT_DATA_URL = "https://raw.githubusercontent.com/sierra-research/tau2-bench"
_MARKER = Path("tau2") / "domains"
_COMPLETE = ".complete"
_CHUNK = 1 << 16


@dataclass(frozen=True, slots=True)
class DataFile:
    """One pinned file: where it lands under the data folder, and where it comes from."""

    path: str
    tag: str
    sha256: str
    size: int
    source: str | None = None  # its path under ``<tag>/data/`` when that differs from ``path``

    def url(self, base_url: str) -> str:
        return f"{base_url.rstrip('/')}/{self.tag}/data/{self.source or self.path}"


_RETAIL = "tau2/domains/retail/"
_TELECOM = "tau2/domains/telecom/"
_USER = "tau2/user_simulator/"
_V1 = "v1.0.1"
_V02 = "v0.2.0"

# Computed from the read-only copy that ../shared/tau2-data/README.md describes (same tags).
PINNED_FILES: tuple[DataFile, ...] = (
    DataFile(
        _RETAIL + "db.json",
        _V1,
        "413a65160adbdb5fde0ffc0015c49b6d70250b10c18128de169b597af7766765",
        2811616,
    ),
    DataFile(
        _RETAIL + "policy.md",
        _V1,
        "2c9652afbce57d6e087768d37cda64d31c53d50b3e3225cfdb791bac66466467",
        6699,
    ),
    DataFile(
        _RETAIL + "split_tasks.json",
        _V1,
        "ed0580ec52575b63fbf76568af42490da6ee7783ecb4aa81af46961291358f20",
        3263,
    ),
    DataFile(
        _RETAIL + "tasks.json",
        _V1,
        "8e03ebce7901bd6218e7a7dc3105faa9324091a68058f7fe61c65262868812e8",
        345982,
    ),
    DataFile(
        _RETAIL + "tasks_v0.2.0.json",
        _V02,
        "76e1fa649a359bef2d2fd30eae834b99d261d84e2e5d364856f6632fdf778dfd",
        328166,
        source=_RETAIL + "tasks.json",
    ),
    DataFile(
        _TELECOM + "db.toml",
        _V1,
        "562d647ef9d7df8df91eafd8ee76036e707c8f9e32aaedc4a7fde06975aea2c0",
        9628,
    ),
    DataFile(
        _TELECOM + "user_db.toml",
        _V1,
        "4886107ea0c16f8e16d74bef91cfb557de61822afe9361f5a9b241806aea2e4c",
        933,
    ),
    DataFile(
        _TELECOM + "main_policy.md",
        _V1,
        "95943844a0cf11fdf0e2842b483b81d9f9338aa53235712ed131db075d086ed7",
        5699,
    ),
    DataFile(
        _TELECOM + "tech_support_manual.md",
        _V1,
        "015a3ee49ec8c199c5e1a059c922081937b92cf3a5ea74fedbc4357816f389ba",
        17589,
    ),
    DataFile(
        _TELECOM + "tech_support_workflow.md",
        _V1,
        "64f3ccd13875d14f358b21b9af221dab09e0e7bf5690d0e4322fb91855a43a4d",
        16390,
    ),
    DataFile(
        _TELECOM + "split_tasks.json",
        _V1,
        "605b488bb9a6acb3c7f4505240a855fdc8681d09aadb16a8f38b2efcfc5c3aec",
        356149,
    ),
    DataFile(
        _TELECOM + "tasks_small.json",
        _V1,
        "c8ea6f75adc18a8ad363974292cbd26b6e8b0e348ec87d265a4188e0088a8f24",
        83833,
    ),
    # The 114 `base` tasks; v1.0.1's tasks.json holds 2,285 and is not needed.
    DataFile(
        _TELECOM + "tasks.json",
        _V02,
        "192a2c143b3b512c37c3775fdf6c5040c33717388620c38b140c731dc6153cd7",
        659069,
    ),
    DataFile(
        _USER + "simulation_guidelines.md",
        _V1,
        "740a29dfa64d7bc08eea3bf7493575b914a63f744acbaf7f199ee07eddaf72d3",
        1449,
    ),
    DataFile(
        _USER + "simulation_guidelines_tools.md",
        _V1,
        "cbf3d8a4d8642fd04e559862f1afef55d7dd4e6a7e727ca49e239023c599de0c",
        2747,
    ),
)


class DataNotFoundError(RuntimeError):
    """No usable τ²-bench data folder (or a file could not be downloaded)."""


class ChecksumError(RuntimeError):
    """A downloaded file does not hash to its pinned sha256; it is not kept."""


def default_cache_root(environ: Mapping[str, str]) -> Path:
    """``$XDG_CACHE_HOME/repairproxy/tau2`` (``~/.cache/...`` when unset)."""
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "repairproxy" / "tau2"


def _looks_like_data_dir(path: Path) -> bool:
    return (path / _MARKER).is_dir()


def _manifest(files: Sequence[DataFile]) -> str:
    """One line naming the pinned set, written when the cache is whole; other pins refetch."""
    joined = "\n".join(f"{f.path} {f.tag} {f.sha256}" for f in files)
    return hashlib.sha256(joined.encode()).hexdigest()


def _file_ok(path: Path, pinned: DataFile) -> bool:
    if not path.is_file() or path.stat().st_size != pinned.size:
        return False
    return hashlib.sha256(path.read_bytes()).hexdigest() == pinned.sha256


def _fetch_one(
    pinned: DataFile, base_url: str, target: Path, client: httpx.Client, bar: _Progress
) -> None:
    url = pinned.url(base_url)
    digest = hashlib.sha256()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=target.parent, prefix=".part-", delete=False) as handle:
        scratch = Path(handle.name)
        try:
            with client.stream("GET", url, follow_redirects=True) as response:
                if response.status_code != 200:
                    raise DataNotFoundError(f"{url}: HTTP {response.status_code}")
                for chunk in response.iter_bytes(_CHUNK):
                    digest.update(chunk)
                    handle.write(chunk)
                    bar.update(len(chunk))
        except httpx.HTTPError as exc:
            scratch.unlink(missing_ok=True)
            raise DataNotFoundError(f"{url}: {exc}") from exc
        except BaseException:
            scratch.unlink(missing_ok=True)
            raise
    if digest.hexdigest() != pinned.sha256:
        scratch.unlink(missing_ok=True)
        raise ChecksumError(
            f"{url} does not match its pinned checksum (sha256 {digest.hexdigest()}, expected "
            f"{pinned.sha256}); it was not saved. Check {DATA_URL_ENV} (it must serve "
            f"sierra-research/tau2-bench's files at tag {pinned.tag}) or pass --tau2-data DIR."
        )
    os.replace(scratch, target)


class _Progress:
    """A byte-counting tqdm bar on stderr, or nothing."""

    def __init__(self, total: int, enabled: bool) -> None:
        self._bar = None
        if enabled:
            from repairproxy.local.progress import progress_bar

            self._bar = progress_bar(
                total=total,
                unit="B",
                unit_scale=True,
                desc="τ²-bench data",
                file=sys.stderr,
                leave=True,
            )

    def update(self, amount: int) -> None:
        if self._bar is not None:
            self._bar.update(amount)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def ensure_cached(
    cache_root: Path,
    *,
    base_url: str = DEFAULT_DATA_URL,
    files: Sequence[DataFile] = PINNED_FILES,
    client: httpx.Client | None = None,
    progress: bool = True,
) -> Path:
    """The cached data folder, downloading and verifying what is missing on first use."""
    final = cache_root / "data"
    complete = final / _COMPLETE
    manifest = _manifest(files)
    if complete.is_file() and complete.read_text(encoding="utf-8").strip() == manifest:
        return final
    missing = [f for f in files if not _file_ok(final / f.path, f)]
    if missing:
        owned = client is None
        http = client or httpx.Client(timeout=60.0)
        bar = _Progress(sum(f.size for f in missing), progress)
        try:
            for pinned in missing:
                _fetch_one(pinned, base_url, final / pinned.path, http, bar)
        finally:
            bar.close()
            if owned:
                http.close()
    complete.write_text(manifest + "\n", encoding="utf-8")
    return final


def resolve_data_dir(
    cli_value: Path | None,
    environ: Mapping[str, str],
    *,
    cache_root: Path | None = None,
    allow_download: bool = True,
    allow_unverified: bool = False,
    progress: bool = True,
) -> Path:
    """``--tau2-data`` first, then ``TAU2_DATA_DIR``, then the (possibly downloaded) cache.

    ``allow_unverified`` is accepted for old callers and has no effect: every file is pinned.
    """
    del allow_unverified
    for source, value in (("--tau2-data", cli_value), (DATA_DIR_ENV, environ.get(DATA_DIR_ENV))):
        if value:
            path = Path(value).expanduser()
            if not _looks_like_data_dir(path):
                raise DataNotFoundError(f"{source}={path} has no {_MARKER} folder")
            return path
    root = cache_root or default_cache_root(environ)
    if not allow_download and not (root / "data" / _COMPLETE).is_file():
        raise DataNotFoundError(f"no τ²-bench data: pass --tau2-data or set {DATA_DIR_ENV}")
    base_url = environ.get(DATA_URL_ENV) or DEFAULT_DATA_URL
    return ensure_cached(root, base_url=base_url, progress=progress)
