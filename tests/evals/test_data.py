"""Data-folder resolution and the verified download of a release archive (served on loopback)."""

from __future__ import annotations

import hashlib
import io
import tarfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from evals.data import (
    DATA_DIR_ENV,
    PINNED_RELEASE,
    ChecksumError,
    DataNotFoundError,
    ReleaseArchive,
    ensure_cached,
    resolve_data_dir,
)

TASKS = b'[{"id": "0"}]'


def build_archive(extra: dict[str, bytes] | None = None) -> bytes:
    files = {
        "tau2-bench-1.0.1/README.md": b"readme",
        "tau2-bench-1.0.1/src/tau2/x.py": b"code",
        "tau2-bench-1.0.1/data/tau2/domains/retail/tasks.json": TASKS,
        "tau2-bench-1.0.1/data/tau2/user_simulator/simulation_guidelines.md": b"# g",
        **(extra or {}),
    }
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@dataclass
class ArchiveServer:
    payload: bytes
    hits: list[str] = field(default_factory=list)
    url: str = ""


@pytest.fixture
def archive_server() -> Iterator[ArchiveServer]:
    state = ArchiveServer(payload=build_archive())

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            state.hits.append(self.path)
            if self.path == "/redirect":
                self.send_response(302)
                self.send_header("Location", "/v1.0.1.tar.gz")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(state.payload)))
            self.end_headers()
            self.wfile.write(state.payload)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def release(
    server: ArchiveServer, sha256: str | None, path: str = "/v1.0.1.tar.gz"
) -> ReleaseArchive:
    return ReleaseArchive(
        version="v1.0.1", url=server.url + path, sha256=sha256, data_prefix="tau2-bench-1.0.1/data/"
    )


def test_download_verifies_checksum_extracts_data_only_and_caches(
    archive_server: ArchiveServer, tmp_path: Path
) -> None:
    digest = hashlib.sha256(archive_server.payload).hexdigest()
    spec = release(archive_server, digest, "/redirect")
    data = ensure_cached(spec, tmp_path)
    assert data == tmp_path / "v1.0.1" / "data"
    assert (data / "tau2/domains/retail/tasks.json").read_bytes() == TASKS
    assert not (data / "src").exists() and not (data / "README.md").exists()
    assert (data / ".sha256").read_text().strip() == digest
    assert archive_server.hits == ["/redirect", "/v1.0.1.tar.gz"]
    assert ensure_cached(spec, tmp_path) == data
    assert len(archive_server.hits) == 2  # second use: no download
    assert [p.name for p in tmp_path.iterdir()] == ["v1.0.1"]  # no scratch left behind


def test_checksum_mismatch_leaves_no_cache(archive_server: ArchiveServer, tmp_path: Path) -> None:
    with pytest.raises(ChecksumError, match="does not match"):
        ensure_cached(release(archive_server, "0" * 64), tmp_path)
    assert not (tmp_path / "v1.0.1").exists()


def test_unpinned_checksum_needs_explicit_opt_in(
    archive_server: ArchiveServer, tmp_path: Path
) -> None:
    with pytest.raises(ChecksumError, match="no sha256 is pinned"):
        ensure_cached(release(archive_server, None), tmp_path)
    assert archive_server.hits == []
    data = ensure_cached(release(archive_server, None), tmp_path, allow_unverified=True)
    recorded = (data / ".sha256").read_text().strip()
    assert recorded == hashlib.sha256(archive_server.payload).hexdigest()


def test_archive_path_traversal_is_refused(archive_server: ArchiveServer, tmp_path: Path) -> None:
    archive_server.payload = build_archive({"tau2-bench-1.0.1/data/../../evil.txt": b"x"})
    digest = hashlib.sha256(archive_server.payload).hexdigest()
    with pytest.raises(DataNotFoundError, match="unsafe"):
        ensure_cached(release(archive_server, digest), tmp_path / "cache")
    assert not (tmp_path / "evil.txt").exists()


def test_pinned_release_is_the_v1_0_1_tag() -> None:
    assert PINNED_RELEASE.url.endswith("/tau2-bench/archive/refs/tags/v1.0.1.tar.gz")
    assert PINNED_RELEASE.data_prefix == "tau2-bench-1.0.1/data/"


def make_data_dir(path: Path) -> Path:
    (path / "tau2" / "domains").mkdir(parents=True)
    return path


def test_resolution_order(tmp_path: Path, archive_server: ArchiveServer) -> None:
    cli, env = make_data_dir(tmp_path / "cli"), make_data_dir(tmp_path / "env")
    cache = tmp_path / "cache"
    environ = {DATA_DIR_ENV: str(env)}
    assert resolve_data_dir(cli, environ, cache_root=cache) == cli
    assert resolve_data_dir(None, environ, cache_root=cache) == env
    with pytest.raises(DataNotFoundError):
        resolve_data_dir(tmp_path / "missing", environ, cache_root=cache)
    with pytest.raises(DataNotFoundError):
        resolve_data_dir(None, {}, cache_root=cache, allow_download=False)
    digest = hashlib.sha256(archive_server.payload).hexdigest()
    cached = resolve_data_dir(None, {}, cache_root=cache, release=release(archive_server, digest))
    assert cached == cache / "v1.0.1" / "data"
    # Once cached, it is found without downloading.
    assert resolve_data_dir(None, {}, cache_root=cache, allow_download=False) == cached
