"""Data-folder resolution and the per-file verified download (served by a loopback HTTP server)."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from evals.tau2.data import (
    DATA_DIR_ENV,
    DATA_URL_ENV,
    DEFAULT_DATA_URL,
    PINNED_FILES,
    ChecksumError,
    DataFile,
    DataNotFoundError,
    ensure_cached,
    resolve_data_dir,
)

# A local copy of the same τ²-bench files, where this machine has one (TAU2_DATA_DIR, else the
# folder beside the checkout).
SHARED = Path(
    os.environ.get("TAU2_DATA_DIR") or Path(__file__).resolve().parents[3] / "shared" / "tau2-data"
)
needs_shared = pytest.mark.skipif(
    not (SHARED / "tau2").is_dir(),
    reason="no local τ²-bench copy to compare with (set TAU2_DATA_DIR)",
)


@dataclass
class FileServer:
    """Serves ``files`` (URL path -> bytes); anything else is a 404."""

    files: dict[str, bytes]
    hits: list[str] = field(default_factory=list)
    url: str = ""


@pytest.fixture
def file_server() -> Iterator[FileServer]:
    state = FileServer(files={})

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            state.hits.append(self.path)
            if self.path.startswith("/moved/"):
                self.send_response(302)
                self.send_header("Location", self.path.removeprefix("/moved"))
                self.end_headers()
                return
            body = state.files.get(self.path)
            if body is None:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

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


def pinned(path: str, data: bytes, tag: str = "v1.0.1", source: str | None = None) -> DataFile:
    return DataFile(path, tag, hashlib.sha256(data).hexdigest(), len(data), source)


SMALL = {
    "tau2/domains/retail/tasks.json": b'[{"id": "0"}]',
    "tau2/user_simulator/simulation_guidelines.md": b"# guidelines",
}
SMALL_FILES = (
    pinned("tau2/domains/retail/tasks.json", SMALL["tau2/domains/retail/tasks.json"]),
    pinned(
        "tau2/domains/retail/tasks_v0.2.0.json",
        b"[]",
        tag="v0.2.0",
        source="tau2/domains/retail/tasks.json",
    ),
    pinned(
        "tau2/user_simulator/simulation_guidelines.md",
        SMALL["tau2/user_simulator/simulation_guidelines.md"],
    ),
)


def serve_small(server: FileServer) -> None:
    for path, body in SMALL.items():
        server.files[f"/v1.0.1/data/{path}"] = body
    server.files["/v0.2.0/data/tau2/domains/retail/tasks.json"] = b"[]"


def test_each_file_comes_from_its_tag_and_lands_at_its_path(
    file_server: FileServer, tmp_path: Path
) -> None:
    serve_small(file_server)
    data = ensure_cached(tmp_path, base_url=file_server.url, files=SMALL_FILES, progress=False)
    assert data == tmp_path / "data"
    assert (data / "tau2/domains/retail/tasks.json").read_bytes() == b'[{"id": "0"}]'
    assert (data / "tau2/domains/retail/tasks_v0.2.0.json").read_bytes() == b"[]"
    assert sorted(file_server.hits) == sorted(
        [
            "/v0.2.0/data/tau2/domains/retail/tasks.json",
            "/v1.0.1/data/tau2/domains/retail/tasks.json",
            "/v1.0.1/data/tau2/user_simulator/simulation_guidelines.md",
        ]
    )
    # Second use: nothing downloaded; no scratch files left behind.
    assert ensure_cached(tmp_path, base_url=file_server.url, files=SMALL_FILES) == data
    assert len(file_server.hits) == 3
    leftovers = [p.name for p in data.rglob(".part-*")]
    assert leftovers == []


def test_a_corrupted_file_is_refused_and_not_kept(file_server: FileServer, tmp_path: Path) -> None:
    serve_small(file_server)
    file_server.files["/v1.0.1/data/tau2/domains/retail/tasks.json"] = b'[{"id": "evil"}]'
    with pytest.raises(ChecksumError) as caught:
        ensure_cached(tmp_path, base_url=file_server.url, files=SMALL_FILES, progress=False)
    message = str(caught.value)
    assert "/v1.0.1/data/tau2/domains/retail/tasks.json does not match its pinned checksum" in (
        message
    )
    assert "it was not saved" in message and DATA_URL_ENV in message
    assert not (tmp_path / "data/tau2/domains/retail/tasks.json").exists()
    assert not (tmp_path / "data/.complete").exists()
    # Once the mirror serves the right file, only what is missing is fetched.
    serve_small(file_server)
    file_server.hits.clear()
    ensure_cached(tmp_path, base_url=file_server.url, files=SMALL_FILES, progress=False)
    assert "/v1.0.1/data/tau2/domains/retail/tasks.json" in file_server.hits


def test_a_missing_file_names_its_url(file_server: FileServer, tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError, match=r"/v1\.0\.1/data/tau2/domains/retail/tasks\.json"):
        ensure_cached(tmp_path, base_url=file_server.url, files=SMALL_FILES[:1], progress=False)


def test_redirects_are_followed_and_progress_is_shown(
    file_server: FileServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    serve_small(file_server)
    ensure_cached(tmp_path, base_url=file_server.url + "/moved", files=SMALL_FILES)
    assert file_server.hits[0].startswith("/moved/")
    assert "τ²-bench data" in capsys.readouterr().err


def test_urls_follow_the_raw_file_layout() -> None:
    retail_db = next(f for f in PINNED_FILES if f.path.endswith("retail/db.json"))
    assert retail_db.url(DEFAULT_DATA_URL) == (
        "https://raw.githubusercontent.com/sierra-research/tau2-bench/v1.0.1/data/"
        "tau2/domains/retail/db.json"
    )
    old_retail = next(f for f in PINNED_FILES if f.path.endswith("tasks_v0.2.0.json"))
    assert old_retail.url("http://m/") == "http://m/v0.2.0/data/tau2/domains/retail/tasks.json"
    telecom = next(f for f in PINNED_FILES if f.path == "tau2/domains/telecom/tasks.json")
    assert telecom.tag == "v0.2.0"


def make_data_dir(path: Path) -> Path:
    (path / "tau2" / "domains").mkdir(parents=True)
    return path


def test_resolution_order(tmp_path: Path) -> None:
    cli, env = make_data_dir(tmp_path / "cli"), make_data_dir(tmp_path / "env")
    cache = tmp_path / "cache"
    environ = {DATA_DIR_ENV: str(env)}
    assert resolve_data_dir(cli, environ, cache_root=cache) == cli
    assert resolve_data_dir(None, environ, cache_root=cache) == env
    with pytest.raises(DataNotFoundError, match="has no"):
        resolve_data_dir(tmp_path / "missing", environ, cache_root=cache)
    with pytest.raises(DataNotFoundError, match="no τ²-bench data"):
        resolve_data_dir(None, {}, cache_root=cache, allow_download=False)


@needs_shared
def test_the_pins_match_the_shared_copy() -> None:
    for item in PINNED_FILES:
        body = (SHARED / item.path).read_bytes()
        assert (hashlib.sha256(body).hexdigest(), len(body)) == (item.sha256, item.size), item.path


@needs_shared
def test_the_whole_pinned_set_into_an_empty_cache(file_server: FileServer, tmp_path: Path) -> None:
    for item in PINNED_FILES:
        file_server.files[f"/{item.tag}/data/{item.source or item.path}"] = (
            SHARED / item.path
        ).read_bytes()
    environ = {DATA_URL_ENV: file_server.url, "XDG_CACHE_HOME": str(tmp_path)}
    data = resolve_data_dir(None, environ, progress=False)
    assert data == tmp_path / "repairproxy" / "tau2" / "data"
    assert len(file_server.hits) == len(PINNED_FILES)
    from evals.tau2.domains import load_domain  # the suite reads what it fetched

    for domain in ("retail", "telecom"):
        assert load_domain(domain, data) is not None
    assert resolve_data_dir(None, environ, allow_download=False) == data
