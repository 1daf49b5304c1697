"""The demo's scenes: their file, how a reply is judged, the data check, and (marker ``model``)
each scene re-run on the embedded model against what it did on the reference machine."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from evals.demo.scenes import (
    DEFAULT_MODE,
    Reply,
    counts_line,
    header_words,
    load_scenes,
    outcome,
    render_scene,
    run_scenes,
)
from evals.tau2 import data as tau2_data
from tests.local.model_fixtures import requires_model

ROOT = Path(__file__).resolve().parents[2]
BOOK = load_scenes()
SCENES = {scene.id: scene for scene in BOOK.scenes}


def _check_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "check_demo_data", ROOT / "scripts/check_demo_data.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_scene_file_pins_sampling_and_covers_the_four_cases() -> None:
    assert BOOK.sampling["temperature"] == 0.0 and isinstance(BOOK.sampling["seed"], int)
    assert BOOK.threads is not None
    wanted = {s.want[DEFAULT_MODE] for s in BOOK.scenes}
    assert {"tool_call", "prose", "valid_json"} <= wanted
    assert BOOK.scenes[0].want == {"off": "text_call", DEFAULT_MODE: "tool_call"}
    for scene in BOOK.scenes:
        assert set(scene.want) == set(scene.observed) == {"off", DEFAULT_MODE}
        assert len(scene.user) < 120  # short prompts: the scenes come within the first minute


def _reply(mode: str, message: dict[str, object], **headers: str) -> Reply:
    return Reply(mode, message, headers, 1.0)


def test_outcomes_are_read_from_the_delivered_answer() -> None:
    text = SCENES["text-call"]
    call = {"function": {"name": "find_user_id_by_email", "arguments": '{"email": "a@b.c"}'}}
    invented = {"function": {"name": "lookup_user", "arguments": "{}"}}
    assert (
        outcome(text, _reply("off", {"content": "x"}, **{"tool-errors": "tool_call_in_content"}))
        == "text_call"
    )
    assert outcome(text, _reply("default", {"content": None, "tool_calls": [call]})) == "tool_call"
    assert outcome(text, _reply("default", {"tool_calls": [invented]})) == "invalid_call"
    declined = _reply(
        "default",
        {"content": "I cannot"},
        **{"tool-errors": "tool_call_in_content", "repairs": "1"},
    )
    assert outcome(text, declined) == "declined"
    assert outcome(text, _reply("off", {"content": "Bye!"})) == "prose"
    structured = SCENES["structured-output"]
    assert (
        outcome(structured, _reply("off", {"content": '{"price_per_item": 14.285714285714286}'}))
        == "invalid_json"
    )
    assert (
        outcome(structured, _reply("off", {"content": '{"price_per_item": 14.29}'})) == "valid_json"
    )
    assert outcome(structured, _reply("off", {"content": "about 14.29 each"})) == "invalid_json"


def test_headers_in_words_name_each_channel_once() -> None:
    words = header_words(
        {
            "tool-errors": "tool_call_in_content,tool_call_in_content",
            "first-tool-errors": "tool_call_in_content",
            "repairs": "1",
            "unknown-tools": "get_order_status",
            "upstream-calls": "2",
        }
    )
    assert words == [
        "saw a call written as text",
        "undeclared name get_order_status",
        "re-asked 1x",
        "2 model call(s)",
    ]


def test_a_scene_that_does_not_reproduce_says_so() -> None:
    scene = SCENES["invented-name"]
    off = _reply("off", {"content": "{...}"}, **{"tool-errors": "tool_call_in_content"})
    declined = _reply(
        "default",
        {"content": "I cannot do that."},
        **{"tool-errors": "tool_call_in_content", "repairs": "1"},
    )
    lines = render_scene(3, 4, scene, off, declined)
    assert any(
        line.strip().startswith("NOT reproduced") and "got declined" in line for line in lines
    )
    call = {"function": {"name": "get_order_details", "arguments": '{"order_id": "#W1"}'}}
    fixed = _reply(
        "default", {"tool_calls": [call]}, **{"tool-errors": "tool_call_in_content", "repairs": "1"}
    )
    assert "   reproduced here" in render_scene(3, 4, scene, off, fixed)


def test_the_data_check_agrees_with_the_data_module() -> None:
    check = _check_module()
    assert check.DATA_DIR_ENV == tau2_data.DATA_DIR_ENV
    assert check.DATA_URL_ENV == tau2_data.DATA_URL_ENV
    assert check.DEFAULT_DATA_URL == tau2_data.DEFAULT_DATA_URL
    first = tau2_data.PINNED_FILES[0]
    assert first.url("").lstrip("/") == check.PROBE


def test_the_data_check_names_the_remedy(tmp_path: Path) -> None:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "XDG_CACHE_HOME": str(tmp_path),
        "HOME": str(tmp_path),
    }
    env["TAU2_DATA_URL"] = "http://127.0.0.1:9"  # discard port: nothing listens
    done = subprocess.run(
        [sys.executable, "-I", str(ROOT / "scripts/check_demo_data.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "TAU2_DATA_DIR=" in done.stderr and "TAU2_DATA_URL=" in done.stderr
    assert "v1.0.1/data/tau2/domains/retail/db.json" in done.stderr
    (tmp_path / "d" / "tau2" / "domains").mkdir(parents=True)
    env["TAU2_DATA_DIR"] = str(tmp_path / "d")
    done = subprocess.run(
        [sys.executable, "-I", str(ROOT / "scripts/check_demo_data.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def scene_proxy() -> Iterator[tuple[str, str]]:
    from evals.grid.launch import ManagedProcess, free_port, proxy_command
    from repairproxy.local import start_embedded_upstream

    with start_embedded_upstream(
        "q4_k_m", n_ctx=4096, n_threads=BOOK.threads, prompt_cache=False
    ) as up:
        port = free_port()
        log = Path(up.log_path).with_suffix(".proxy.log")
        with ManagedProcess(
            "proxy", proxy_command(up.base_url, port, []), f"http://127.0.0.1:{port}/healthz", log
        ):
            import httpx

            model = httpx.get(f"{up.base_url}/models", trust_env=False).json()["data"][0]["id"]
            yield f"http://127.0.0.1:{port}/v1", str(model)
        log.unlink(missing_ok=True)


@pytest.mark.model
@requires_model
def test_every_scene_does_on_the_real_model_what_it_did_on_the_reference_machine(
    scene_proxy: tuple[str, str],
) -> None:
    url, model = scene_proxy
    results = run_scenes(url, model, BOOK, lambda line: None)
    # Each mode's outcome is the reference machine's, or one the scene file records from another
    # machine (a scene at the edge names it, with the machine, in also_observed).
    assert [r.scene.id for r in results] == [s.id for s in BOOK.scenes]
    unexpected = {
        (r.scene.id, mode): outcome
        for r in results
        for mode, outcome in r.outcomes.items()
        if outcome not in r.scene.observed_outcomes(mode)
    }
    assert unexpected == {}
    assert all(set(r.outcomes) == set(r.scene.observed) for r in results)
    first = results[0]
    assert first.default.headers.get("promoted") == "1"  # the call written as text, promoted


def test_the_counts_line_reads_the_proxys_metrics_in_the_dashboards_words() -> None:
    from repairproxy.observe.metrics import Metrics
    from repairproxy.observe.record import CaughtCall, RepairResult, RepairResultKind, RequestRecord
    from repairproxy.settings import Settings

    metrics = Metrics(Settings())
    text_call = [CaughtCall("tool_call_in_content", form="text", tool="get_order_status")]
    declined = [RepairResult("tool_call_in_content", RepairResultKind.DECLINED)]
    metrics.request_finished(
        RequestRecord(model="m", tool_calls=1, caught_calls=text_call, repair_results=declined)
    )
    body, _ = metrics.exposition(None)
    line = counts_line(body.decode())
    assert "requests 1; tool calls 1" in line
    assert "errors caught: tool_call_in_content 1; invented tool names 1" in line
    assert "repair results: declined 1;" in line
