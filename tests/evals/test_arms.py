"""evals.arms: arm.json round trip and launch, the back-ends' guards, calibration text, the check
against a scripted server, and the GGUF re-quantization end to end on the embedded model."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from evals.arms import ArmError, ArmRecord, MakeOptions, check_upstream, load_arm, make_arm
from evals.arms.__main__ import main
from evals.arms.backend import check_call, checked_call
from evals.arms.calibration import load_calibration
from evals.arms.record import ArmDirEmbeddedLaunch, sha256_of
from evals.grid.launch import ArmEndpoint, LaunchError
from evals.grid.spec import ArmSpec, VllmLaunch
from tests.local.model_fixtures import requires_model
from tests.support.scripted_upstream import ScriptedUpstream, completion, tool_call

HAS_COMPRESSOR = importlib.util.find_spec("llmcompressor") is not None


def _record(**changes: Any) -> ArmRecord:
    fields: dict[str, Any] = {
        "name": "int4",
        "method": "awq",
        "form": "checkpoint",
        "library": {"name": "llmcompressor", "version": "0.14.0.1"},
        "source": {"model": "/models/qwen", "sha256": "ab" * 32},
        "settings": {"bits": 4, "group_size": 128, "zero_point": True},
        "serve": {"engine": "vllm", "model": "checkpoint", "quantization": None},
        "artifact": {"path": "checkpoint", "size_bytes": 1234},
    }
    return ArmRecord(**(fields | changes))


def test_arm_json_round_trips_and_launches_the_checkpoint_from_its_folder(tmp_path: Path) -> None:
    _record().write(tmp_path)
    record = load_arm(tmp_path)
    assert record == _record()
    assert record.folder == tmp_path.resolve()
    assert record.artifact_path() == tmp_path.resolve() / "checkpoint"
    launch = record.launch(served_model_name="qwen", extra_args=("--max-model-len", "4096"))
    assert isinstance(launch, VllmLaunch)
    command = launch.command(8000)
    assert command[:3] == ["vllm", "serve", str(tmp_path.resolve() / "checkpoint")]
    assert "--quantization" not in command  # vLLM reads compressed-tensors from config.json
    assert command[-2:] == ["--max-model-len", "4096"]
    assert command[7:9] == ["--served-model-name", "qwen"]


def test_the_report_row_names_the_weights() -> None:
    row = _record(
        artifact={"path": "checkpoint", "size_bytes": 2_500_000, "sha256": "cd" * 32},
        settings={"scheme": "W4A16, group size 128, asymmetric with zero point"},
        calibration={"samples": 128, "source": "τ²-bench policies and task instructions"},
        git={"commit": "f" * 40},
    ).table_row()
    assert row["source"] == "/models/qwen @ " + "ab" * 6
    assert row["settings"].startswith("W4A16, group size 128")
    assert row["size"] == "2.5 MB" and row["weights sha256"] == "cd" * 6
    assert row["calibration"].startswith("128 samples")
    assert _record(artifact=None).table_row()["size"] == "n/a (serving flag)"


def test_the_grid_launcher_reads_the_arm_folder(tmp_path: Path) -> None:
    spec = ArmSpec(name="int4", model="m", arm_dir=tmp_path / "missing")
    with pytest.raises(LaunchError, match=r"arms\.int4: .*missing/arm\.json does not exist"):
        ArmEndpoint(spec, tmp_path).open()


def test_an_on_the_fly_fp8_arm_is_a_serving_flag_on_the_source() -> None:
    record = _record(
        method="fp8",
        form="serving-flag",
        serve={"engine": "vllm", "model": "org/model", "quantization": "fp8"},
        artifact=None,
    )
    launch = record.launch()
    assert isinstance(launch, VllmLaunch)
    assert launch.model == "org/model" and launch.quantization == "fp8"


def test_a_gguf_arm_is_served_by_the_embedded_server_from_its_folder(tmp_path: Path) -> None:
    serve = {"engine": "embedded", "embedded_arm": "q2_k-requant", "cache_dir": "."}
    _record(method="gguf-requant", form="gguf", serve=serve).write(tmp_path)
    launch = load_arm(tmp_path).launch(port=9)
    assert isinstance(launch, ArmDirEmbeddedLaunch)
    command = launch.command(9)
    assert command[command.index("--arm") + 1] == "q2_k-requant"
    assert command[-2:] == ["--cache-dir", str(tmp_path.resolve())]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "does not exist; make it with `python -m evals.arms make`"),
        ("{", "is not JSON"),
        ('{"schema": 2}', "schema 2"),
        ('{"schema": 1, "method": "int3"}', "method 'int3'"),
        ('{"schema": 1, "method": "awq"}', "lacks"),
    ],
)
def test_load_arm_says_what_is_wrong(tmp_path: Path, content: str | None, message: str) -> None:
    if content is not None:
        (tmp_path / "arm.json").write_text(content)
    with pytest.raises(ArmError) as caught:
        load_arm(tmp_path)
    assert message in str(caught.value)


def test_make_on_the_fly_fp8_records_the_source_and_provenance(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "fp8"
    argv = ["make", "org/model", "--method", "fp8", "--on-the-fly", "--out", str(out)]
    assert main([*argv, "--revision", "0123abc"]) == 0
    data = json.loads((out / "arm.json").read_text())
    assert data["form"] == "serving-flag" and data["method"] == "fp8"
    assert data["source"] == {"model": "org/model", "revision": "0123abc"}
    assert data["serve"] == {"engine": "vllm", "model": "org/model", "quantization": "fp8"}
    assert len(data["git"]["commit"]) == 40
    assert data["created_at"].endswith("+00:00") and data["wall_seconds"] >= 0
    assert "made fp8: fp8 (serving-flag" in capsys.readouterr().out
    # Again into the same folder: refused unless --force.
    assert main([*argv, "--revision", "0123abc"]) == 2
    assert "not empty; pass --force" in capsys.readouterr().err
    assert main([*argv, "--revision", "0123abc", "--force"]) == 0


def test_a_hub_id_without_a_revision_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["make", "org/model", "--method", "fp8", "--on-the-fly", "--out", str(tmp_path / "a")]
    assert main(argv) == 2
    assert "give --revision" in capsys.readouterr().err


def test_a_local_source_folder_is_identified_by_its_file_hashes(tmp_path: Path) -> None:
    source = tmp_path / "model"
    source.mkdir()
    (source / "config.json").write_text("{}")
    (source / "model.safetensors").write_bytes(b"weights")
    options = MakeOptions(str(source), "fp8", tmp_path / "arm", on_the_fly=True)
    record = make_arm(options)
    assert record.source["files"] == {
        "config.json": sha256_of(source / "config.json"),
        "model.safetensors": sha256_of(source / "model.safetensors"),
    }
    (source / "model.safetensors").write_bytes(b"other weights")
    again = make_arm(options, force=True)
    assert again.source["sha256"] != record.source["sha256"]


@pytest.mark.skipif(HAS_COMPRESSOR, reason="llm-compressor is installed here")
@pytest.mark.parametrize(
    ("extra_args", "extra"),
    [
        (["--method", "awq"], "repairproxy[quantize]"),
        (["--method", "fp8"], "repairproxy[quantize]"),
        (["--method", "w8a8"], "repairproxy[quantize]"),
        (["--method", "awq", "--awq-library", "autoawq"], "repairproxy[quantize-autoawq]"),
    ],
)
def test_a_missing_back_end_stops_at_once_naming_its_extra(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra_args: list[str], extra: str
) -> None:
    if extra.endswith("autoawq]") and importlib.util.find_spec("awq") is not None:
        pytest.skip("autoawq is installed here")
    started = time.perf_counter()
    assert main(["make", str(tmp_path), "--out", str(tmp_path / "arm"), *extra_args]) == 2
    err = capsys.readouterr().err
    assert extra in err and "Traceback" not in err
    assert not (tmp_path / "arm").exists()
    assert time.perf_counter() - started < 5


def test_check_call_refuses_keywords_the_installed_function_does_not_declare() -> None:
    def oneshot(model: Any, recipe: Any = None, **kwargs: Any) -> str:
        return "ran"

    assert checked_call(oneshot, model=1, recipe=2) == "ran"
    with pytest.raises(ArmError, match="oneshot"):
        check_call(oneshot, {"model": 1, "recipie": 2})  # **kwargs would have swallowed it
    with pytest.raises(ArmError, match="missing a required argument: 'model'"):
        check_call(oneshot, {"recipe": 2})


@pytest.mark.skipif(not HAS_COMPRESSOR, reason="needs the quantize extra (llm-compressor)")
def test_llm_compressor_calls_bind_to_the_installed_signatures() -> None:
    from llmcompressor import oneshot

    from evals.arms.compressor import awq_recipe, fp8_recipe, oneshot_arguments, w8a8_recipe

    options = MakeOptions("x", "awq", Path("x"))
    for recipe in (awq_recipe(options), fp8_recipe(options), w8a8_recipe(options)):
        check_call(oneshot, oneshot_arguments(object(), object(), recipe, None, 256))
    scheme = awq_recipe(options)[1].config_groups["group_0"].weights
    assert (scheme.num_bits, scheme.group_size, scheme.symmetric) == (4, 128, False)
    assert w8a8_recipe(options)[0].scheme == "W8A8"


class _FakeQuantizationModifier:
    """llm-compressor's ``QuantizationModifier`` as far as the recipes use it (its keywords)."""

    def __init__(
        self,
        *,
        targets: Any = None,
        scheme: Any = None,
        ignore: Any = None,
        config_groups: Any = None,
    ) -> None:
        self.targets, self.scheme, self.ignore = targets, scheme, ignore


def test_the_w8a8_recipe_is_one_data_free_int8_scheme_keeping_lm_head(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At the seam, without llm-compressor: the recipe's modifier and what ``oneshot`` gets."""
    import types

    from evals.arms.compressor import oneshot_arguments, w8a8_recipe

    quantization = types.ModuleType("llmcompressor.modifiers.quantization")
    monkeypatch.setattr(
        quantization, "QuantizationModifier", _FakeQuantizationModifier, raising=False
    )
    for name in ("llmcompressor", "llmcompressor.modifiers"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, quantization.__name__, quantization)
    (modifier,) = w8a8_recipe(MakeOptions("x", "w8a8", Path("x")))
    assert isinstance(modifier, _FakeQuantizationModifier)
    assert (modifier.targets, modifier.scheme, modifier.ignore) == (["Linear"], "W8A8", ["lm_head"])
    model, tokenizer = object(), object()
    arguments = oneshot_arguments(model, tokenizer, [modifier], None, 512)
    # No calibration text: no dataset, so oneshot rounds the weights to nearest without data.
    assert arguments == {"model": model, "recipe": [modifier], "processor": tokenizer}


def test_make_w8a8_records_a_checkpoint_vllm_for_cpu_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CLI to arm.json with llm-compressor's run replaced (what it saves is faked)."""
    from evals.arms import compressor
    from evals.arms.backend import Made

    calls: list[tuple[str, Any, bool, str]] = []

    def run(
        options: MakeOptions, folder: Path, method: str, recipe_of: Any, calibrate: bool
    ) -> Made:
        calls.append((method, recipe_of, calibrate, options.device))
        (folder / "checkpoint").mkdir()
        (folder / "checkpoint" / "model.safetensors").write_bytes(b"int8 weights")
        return Made(
            form="checkpoint",
            library={"name": "llmcompressor", "version": "0.14.0.1"},
            source={"model": options.source},
            settings={"recipe": [{"modifier": "QuantizationModifier", "scheme": "W8A8"}]},
            serve={"engine": "vllm", "model": "checkpoint", "quantization": None},
            artifact="checkpoint",
        )

    monkeypatch.setattr(compressor, "_run", run)
    out = tmp_path / "w8a8"
    argv = ["make", str(tmp_path), "--method", "w8a8", "--device", "cpu", "--out", str(out)]
    assert main(argv) == 0
    assert calls == [("w8a8", compressor.w8a8_recipe, False, "cpu")]
    assert "made w8a8: w8a8 (checkpoint, llmcompressor 0.14.0.1)" in capsys.readouterr().out
    record = load_arm(out)
    assert record.method == "w8a8" and record.calibration is None
    assert record.settings["scheme"] == "W8A8"
    assert record.settings["weights"].startswith("int8, per-channel symmetric")
    assert record.settings["activations"] == "int8, dynamic per-token symmetric scales"
    assert record.settings["recipe"] == [{"modifier": "QuantizationModifier", "scheme": "W8A8"}]
    assert record.artifact is not None
    assert record.artifact["sha256"] and record.artifact["size_bytes"] == len(b"int8 weights")
    # The grid's vLLM-for-CPU launch serves the arm's checkpoint, as is (no --quantization).
    grid_launch = VllmLaunch(model=str(out), device="cpu", max_model_len=16384, port=5)
    launch = record.launch(served_model_name="w8a8", vllm=grid_launch)
    assert isinstance(launch, VllmLaunch) and launch.device == "cpu"
    assert launch.model == str(out.resolve() / "checkpoint") and launch.quantization is None
    command = launch.command(5)
    assert command[command.index("--max-model-len") + 1] == "16384"
    assert command[command.index("--served-model-name") + 1] == "w8a8"
    assert "--quantization" not in command


def test_calibration_text_is_local_seeded_and_recorded(tau2_data_dir: Path) -> None:
    first = load_calibration(tau2_data_dir, 32, seed=3)
    assert first == load_calibration(tau2_data_dir, 32, seed=3)
    assert first.texts != load_calibration(tau2_data_dir, 32, seed=4).texts
    described = first.describe()
    assert described["samples"] == 32 and described["available"] > 200
    assert set(described["files"]) >= {
        "tau2/domains/retail/policy.md",
        "tau2/domains/retail/tasks.json",
        "tau2/domains/telecom/main_policy.md",
    }
    everything = load_calibration(tau2_data_dir, 100_000).texts
    assert len(everything) == described["available"]
    assert any(t.startswith("Reason for call:") for t in everything)  # task instructions
    assert any("# Retail agent policy" in t for t in everything)  # a policy section


def test_calibration_without_data_is_an_arm_error(tmp_path: Path) -> None:
    with pytest.raises(ArmError, match="no τ²-bench policies"):
        load_calibration(tmp_path, 8)


def _order_call() -> dict[str, Any]:
    return tool_call("get_order_details", {"order_id": "#W2378156"})


def test_check_passes_loads_answers_and_tool_call(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _record().write(tmp_path)
    with ScriptedUpstream() as upstream:
        upstream.push(completion(content="Hello there."))
        upstream.push(completion(tool_calls=[_order_call()]))
        assert main(["check", str(tmp_path), "--upstream", upstream.base_url]) == 0
        sent = upstream.chat_requests
    out = capsys.readouterr().out
    assert "loads      ok" in out and "answers    ok" in out and "tool call  ok" in out
    assert 'get_order_details({"order_id": "#W2378156"})' in out
    assert "check passed" in out
    assert sent[1]["tools"][0]["function"]["name"] == "get_order_details"
    assert "tools" not in sent[0]


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (completion(content="Your order is on its way."), "no tool call; the model wrote"),
        (completion(content='{"name": "get_order_details"}'), "no tool call (a call written as"),
        (completion(tool_calls=[tool_call("find_order", {"order_id": "1"})]), "find_order"),
        (completion(tool_calls=[tool_call("get_order_details", "{bad")]), "not JSON"),
        (completion(tool_calls=[tool_call("get_order_details", {"id": 1})]), "order_id"),
    ],
)
def test_check_fails_on_a_missing_or_malformed_tool_call(answer: Any, why: str) -> None:
    with ScriptedUpstream() as upstream:
        upstream.push(completion(content="Hi."))
        upstream.push(answer)
        result = check_upstream(upstream.base_url, timeout=10)
    assert not result.ok
    assert [s.ok for s in result.steps] == [True, True, False]
    assert why in result.steps[-1].detail


def test_check_stops_at_the_first_failed_step(tmp_path: Path) -> None:
    with ScriptedUpstream() as upstream:
        result = check_upstream(upstream.base_url, model="not-served", timeout=10)
        assert upstream.chat_requests == []
    assert [s.name for s in result.steps] == ["loads"]
    assert "not served" in result.steps[0].detail
    dead = check_upstream("http://127.0.0.1:9/v1", timeout=2)
    assert not dead.ok and dead.steps[0].name == "loads"


@pytest.mark.model
@pytest.mark.slow
@requires_model
def test_gguf_requant_end_to_end_on_the_embedded_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Re-quantize the shipped Q4_K_M to Q3_K_M into the arm folder, serve it from there through
    the grid's launcher and check it; the user's cache is only read. Q3_K_M, not the smaller Q2_K:
    it costs 32 s of CPU to make here against Q2_K's 83 s (about 20 s on 2 idle cores)."""
    from repairproxy.local import ARMS, resolve_cache_dir
    from repairproxy.local.arms import MODEL_SOURCE

    cache_models = resolve_cache_dir() / "models"
    before = {p.name: p.stat().st_mtime_ns for p in cache_models.iterdir()}
    out = tmp_path / "q3"
    started = time.perf_counter()
    assert (
        main(["make", "q4_k_m", "--method", "gguf-requant", "--ftype", "q3_k_m", "--out", str(out)])
        == 0
    )
    made_in = time.perf_counter() - started
    record = load_arm(out)
    made = out / "models" / ARMS["q3_k_m-requant"].filename
    assert record.form == "gguf" and record.artifact_path() == made.resolve()
    assert record.settings["ftype"] == "Q3_K_M" and record.settings["ftype_id"] == 12
    assert record.source["sha256"] == MODEL_SOURCE.sha256
    assert Path(record.source["file"]) == (cache_models / ARMS["q4_k_m"].filename).resolve()
    assert record.artifact is not None
    assert record.artifact["size_bytes"] == made.stat().st_size
    assert record.artifact["sha256"] == sha256_of(made)
    assert made.stat().st_size < 0.9 * record.source["size_bytes"]
    assert record.library["name"] == "llama-cpp-python" and record.library["version"]
    assert {p.name: p.stat().st_mtime_ns for p in cache_models.iterdir()} == before
    launch = record.launch()
    assert isinstance(launch, ArmDirEmbeddedLaunch) and launch.cache_dir == out.resolve()
    # The grid's own launcher serves it from the arm folder (arm = DIR); no proxy here.
    spec = ArmSpec(name="q3", model="q3", arm_dir=out, proxy="http://127.0.0.1:9/v1")
    with ArmEndpoint(spec, tmp_path) as endpoint:
        argv = ["check", str(out), "--upstream", endpoint.upstream_url, "--max-tokens", "48"]
        code = main(argv)
    printed = capsys.readouterr().out
    print(f"made in {made_in:.1f} s; check:\n{printed}")
    assert "loads      ok" in printed and "answers    ok" in printed
    # A 3-bit 1.5B model may or may not call the tool; the check must say which, with the text.
    assert code == (0 if "tool call  ok" in printed else 1)
