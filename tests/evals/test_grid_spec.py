"""The grid spec: expansion of cells, the commands arms launch, and the grids we ship."""

from __future__ import annotations

import dataclasses
import json
import sys
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from evals.analysis.summary import family_of
from evals.grid.provenance import PROVENANCE_FILE, cell_provenance
from evals.grid.spec import (
    REPAIR_MODES,
    EmbeddedLaunch,
    GridError,
    VllmLaunch,
    load_grid,
    parse_grid,
    resume_conflicts,
)
from evals.repair_ablation import analysis_pairs, plan_runs
from evals.tau2.logs import AgentInfo, EnvironmentInfo, Info, UserInfo, resume_differences
from tests.evals.conftest import REPO_ROOT

GRIDS = REPO_ROOT / "evals" / "grids"

BASE = """
[arms.a]
upstream = "http://127.0.0.1:8000/v1"
model = "m"
[arms.b]
upstream = "http://127.0.0.1:8001/v1"
model = "m"
reference = "a"
"""


def _grid(text: str) -> Any:
    return parse_grid(tomllib.loads(text), base=Path("/grids"))


def test_a_cell_entry_expands_to_the_product_of_its_lists() -> None:
    grid = _grid(
        BASE
        + """
[[cell]]
domain = ["retail", "telecom"]
arm = ["a", "b"]
modes = ["off", "reflexive"]
tasks = 3
trials = 2
max_errors = [2, 10]
"""
    )
    names = [c.name for c in grid.cells]
    assert names == [
        f"{d}-{a}-scripted-k{k}" for d in ("retail", "telecom") for a in "ab" for k in (2, 10)
    ]
    cell = grid.cells[0]
    assert (cell.modes, cell.task_count, cell.task_ids, cell.trials) == (
        ("off", "reflexive"),
        3,
        None,
        2,
    )
    assert grid.arms["b"].reference == "a" and grid.arms["a"].upstreams == (
        "http://127.0.0.1:8000/v1",
    )


def test_defaults_ids_and_the_only_filter() -> None:
    grid = _grid(BASE + '[[cell]]\ndomain = "retail"\ntasks = ["0", 5]\n')
    assert [c.name for c in grid.cells] == ["retail-a-scripted-k10", "retail-b-scripted-k10"]
    assert grid.cells[0].task_ids == ("0", "5") and grid.cells[0].modes == ("off", "reflexive")
    assert [c.name for c in grid.select(["*-b-*"])] == ["retail-b-scripted-k10"]
    with pytest.raises(GridError, match="matches no cell"):
        grid.select(["nothing"])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (BASE + '[[cell]]\ndomain = "retail"\nmode = ["off"]\n', "unknown key"),
        (BASE + '[[cell]]\ndomain = "retail"\nmodes = ["of"]\n', "modes"),
        (BASE + '[[cell]]\ndomain = "airline"\n', "domain"),
        (BASE + '[[cell]]\ndomain = "retail"\narm = "c"\n', "no arm named 'c'"),
        (BASE + '[[cell]]\ndomain = "retail"\nuser = "gpt"\n', "no user named 'gpt'"),
        (BASE + '[[cell]]\ndomain = "retail"\nmax_errors = 0\n', "max_errors"),
        (BASE + '[[cell]]\ndomain = "retail"\ntasks = "some"\n', "tasks"),
        (BASE + '[[cell]]\ndomain = "retail"\n[[cell]]\ndomain = "retail"\n', "listed twice"),
        ('[arms.x]\nupstream = "u"\nlaunch = "vllm"\nmodel = "m"\n', "exactly one of"),
        ('[arms.x]\nlaunch = "vllm"\n', "needs model"),
        ('[arms.x]\nlaunch = "embedded"\n', "embedded_arm"),
        ('[arms.x]\nlaunch = "docker"\nmodel = "m"\n', "launch"),
        ('[arms.x]\nupstream = "u"\nmodel = "m"\nreference = "y"\n', "reference"),
        ('[arms.x]\nupstream = "u"\nmodel = "m"\nport = "80"\n', "port"),
        (BASE + '[users.u]\nmodel = "gpt"\n[[cell]]\ndomain = "retail"\n', "needs model and"),
        (BASE, r"\[\[cell\]\]"),
    ],
)
def test_mistakes_are_errors_that_name_the_key(text: str, message: str) -> None:
    if "[[cell]]" not in text and "arms.x" in text:
        text += '[[cell]]\ndomain = "retail"\n'
    with pytest.raises(GridError, match=message):
        _grid(text)


def test_the_vllm_command_line_per_precision() -> None:
    awq = VllmLaunch(model="org/m-AWQ", quantization="awq", tool_call_parser="hermes")
    assert awq.command(8000) == [
        "vllm",
        "serve",
        "org/m-AWQ",
        "--host",
        "127.0.0.1",
        "--port",
        "8000",
        "--quantization",
        "awq",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
    ]
    bf16 = VllmLaunch(model="org/m", dtype="bfloat16", served_model_name="m", extra_args=("-x",))
    command = bf16.command(1)
    assert command[command.index("--dtype") + 1] == "bfloat16"
    assert "--quantization" not in command and command[-1] == "-x"
    assert command[command.index("--served-model-name") + 1] == "m"


def test_a_vllm_cpu_arm_serves_the_converted_embedded_model_through_the_venv() -> None:
    from repairproxy.local.vllm_cpu import SERVED_MODEL_NAME, SERVER_ENV

    grid = _grid(
        '[arms.v]\nlaunch = "vllm-cpu"\nmax_model_len = 16384\n[[cell]]\ndomain = "retail"\n'
    )
    arm = grid.arms["v"]
    assert isinstance(arm.launch, VllmLaunch) and arm.launch.device == "cpu"
    assert arm.model == SERVED_MODEL_NAME  # what the agent sends is what vLLM serves
    command = arm.launch.command(9000)
    assert command[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]  # no `vllm` script
    assert command[command.index("--max-model-len") + 1] == "16384"
    assert command[command.index("--tool-call-parser") + 1] == "hermes"
    assert arm.describe()["launch"] == "vllm-cpu"
    ready = dataclasses.replace(arm.launch, executable="/venv/bin/python", model="/ckpt")
    ready_command = ready.command(9000)
    assert ready_command[0] == "/venv/bin/python"
    assert ready_command[ready_command.index("--model") + 1] == "/ckpt"
    assert SERVER_ENV["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"  # 2 cores: none kept back
    # A GPU vLLM arm still needs its checkpoint named.
    with pytest.raises(GridError, match="needs model"):
        _grid('[arms.g]\nlaunch = "vllm"\n[[cell]]\ndomain = "retail"\n')


def test_an_embedded_arm_serves_the_named_gguf() -> None:
    grid = _grid(
        '[arms.q3]\nlaunch = "embedded"\nembedded_arm = "q3_k_m-requant"\nthreads = 2\n'
        '[[cell]]\ndomain = "retail"\n'
    )
    arm = grid.arms["q3"]
    assert isinstance(arm.launch, EmbeddedLaunch)
    assert arm.model == "qwen2.5-coder-1.5b-instruct-q3_k_m-requant"
    assert arm.launch.command(9) == [
        sys.executable,
        "-m",
        "repairproxy.local",
        "serve",
        "--arm",
        "q3_k_m-requant",
        "--host",
        "127.0.0.1",
        "--port",
        "9",
        "--threads",
        "2",
    ]


def test_a_judge_and_domain_options() -> None:
    grid = _grid(
        BASE
        + '[judge]\nmodel = "j"\nbase_url = "http://127.0.0.1:1/v1"\n'
        + '[[cell]]\ndomain = ["retail", "telecom"]\narm = "a"\n'
        + 'domain_options = ["retail_modify_items_fix"]\n'
    )
    assert grid.judge is not None and (grid.judge.model, grid.judge.kind) == ("j", "llm")
    options = {c.domain: c.domain_options for c in grid.cells}
    assert options == {"retail": ("retail_modify_items_fix",), "telecom": ()}
    with pytest.raises(GridError, match="domain_options"):
        _grid(BASE + '[[cell]]\ndomain = "retail"\ndomain_options = ["faster"]\n')


def test_an_arm_may_name_a_made_arm_folder() -> None:
    grid = _grid('[arms.x]\narm = "arms/int4"\nmodel = "m"\n[[cell]]\ndomain = "retail"\n')
    assert grid.arms["x"].arm_dir == Path("/grids/arms/int4")
    assert grid.arms["x"].launch is None  # arm.json says how to serve it
    assert grid.arms["x"].describe()["arm_dir"] == "/grids/arms/int4"


def test_a_made_arm_served_by_vllm_for_cpu_takes_the_grids_vllm_keys() -> None:
    cell = '[[cell]]\ndomain = "retail"\n'
    grid = _grid(
        '[arms.w]\narm = "~/arms/w8a8"\nlaunch = "vllm-cpu"\nmodel = "w8a8"\n'
        "max_model_len = 16384\nready_timeout_s = 900\n" + cell
    )
    arm = grid.arms["w"]
    assert arm.arm_dir == Path("~/arms/w8a8").expanduser()
    assert isinstance(arm.launch, VllmLaunch) and arm.launch.device == "cpu"
    assert (arm.model, arm.launch.served_model_name) == ("w8a8", "w8a8")
    assert arm.launch.max_model_len == 16384 and arm.launch.ready_timeout_s == 900
    assert arm.launch.model == str(arm.arm_dir)  # until arm.json names the checkpoint
    with pytest.raises(GridError, match="needs model = the model id to send"):
        _grid('[arms.w]\narm = "a"\nlaunch = "vllm-cpu"\n' + cell)
    with pytest.raises(GridError, match="arm = DIR takes launch = 'vllm' or 'vllm-cpu' only"):
        _grid('[arms.w]\narm = "a"\nlaunch = "embedded"\nembedded_arm = "q4_k_m"\n' + cell)


def test_the_paper_grid(tau2_data_dir: Path) -> None:
    grid = load_grid(GRIDS / "paper.toml")
    assert len(grid.arms) == 12
    launches = [a.launch for a in grid.arms.values() if isinstance(a.launch, VllmLaunch)]
    assert len(launches) == len(grid.arms)
    precisions = {(launch.quantization, launch.dtype) for launch in launches}
    assert precisions == {(None, "bfloat16"), ("fp8", None), ("awq", None)}
    for arm in grid.arms.values():
        assert "bf16" in arm.name or arm.reference == arm.name.rsplit("-", 1)[0] + "-bf16"
    assert {c.domain for c in grid.cells} == {"retail", "telecom"}
    assert all(c.modes == REPAIR_MODES and c.user == "gpt41" for c in grid.cells)
    planned = plan_runs(
        grid, grid.select(["retail-qwen36-dense-int4-*"]), Path("/x"), tau2_data_dir
    )
    assert [p.episodes for p in planned] == [456] * 5
    planned = plan_runs(grid, grid.select(["telecom-gemma4-moe-fp8-*"]), Path("/x"), tau2_data_dir)
    assert [p.episodes for p in planned] == [456] * 5
    # The Holm families the paper grid fixes, over all of its 176 comparisons.
    everything = plan_runs(grid, grid.select(None), Path("/x"), tau2_data_dir)
    labels = [
        f"{a.parent.parent.name}/{a.parent.name} vs {b.parent.parent.name}/{b.parent.name}"
        for a, b in analysis_pairs(grid, everything)
    ]
    assert Counter(family_of(label, grid.families) for label in labels) == {
        "precision cells at mode off": 16,
        "repair-mode comparisons": 96,
        "other comparisons": 64,
    }


def test_the_cpu_grid(tau2_data_dir: Path) -> None:
    grid = load_grid(GRIDS / "cpu.toml")
    embedded = {a.launch.arm for a in grid.arms.values() if isinstance(a.launch, EmbeddedLaunch)}
    assert embedded == {"q4_k_m", "q3_k_m-requant"}
    assert all(c.user == "scripted" and c.domain == "retail" for c in grid.cells)
    planned = plan_runs(grid, grid.select(None), Path("/x"), tau2_data_dir)
    assert sum(p.episodes for p in planned) == 8


# --- Holm families and resume checks --------------------------------------------------------

CELL = """
[[cell]]
domain = "retail"
arm = "a"
modes = ["off"]
tasks = 1
trials = 1
"""


def test_families_are_read_from_the_grid_file() -> None:
    grid = _grid(BASE + CELL + '[families]\nprecision = ["*/off vs */off"]\nrest = "* vs *"\n')
    assert grid.families == {"precision": ("*/off vs */off",), "rest": ("* vs *",)}
    assert _grid(BASE + CELL).families == {}
    with pytest.raises(GridError, match=r"families\.none"):
        _grid(BASE + CELL + "[families]\nnone = []\n")


def _provenance(**changes: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "arm": {"model": "m"},
        "user": {"name": "scripted", "simulator": "scripted"},
        "judge": None,
        "seeds": {"run_seed": 300, "llm_seed": None},
        "repair_template": {"file": "repair_v1.txt", "sha256": "ab"},
        "cell": {"domain_options": ()},
        "written_at": "then",
    }
    for key, value in changes.items():
        record[key] = value
    return record


def test_resume_conflicts_name_what_changed() -> None:
    assert resume_conflicts(_provenance(), _provenance(written_at="now")) == []
    changed = _provenance(arm={"model": "other"}, repair_template={"file": "repair_v1.txt"})
    assert resume_conflicts(_provenance(), changed) == [
        "agent model: 'm' -> 'other'",
        "repair template: 'ab' -> None",
    ]


def test_resume_differences_of_results_info_name_the_model() -> None:
    def info(model: str, user: str = "scripted_user") -> Info:
        return Info(
            num_trials=1,
            max_steps=10,
            max_errors=10,
            user_info=UserInfo(implementation=user),
            agent_info=AgentInfo(implementation="llm_agent", llm=model),
            environment_info=EnvironmentInfo(domain_name="retail", policy=""),
            seed=300,
        )

    assert resume_differences(info("m"), info("m")) == []
    assert resume_differences(info("m"), info("n", "gold_user")) == [
        "agent model: 'm' -> 'n'",
        "user: 'scripted_user' -> 'gold_user'",
    ]


def test_plan_refuses_to_resume_a_run_started_with_another_model(
    tmp_path: Path, tau2_data_dir: Path
) -> None:
    grid = _grid(BASE + CELL)
    (planned,) = plan_runs(grid, grid.select(None), tmp_path, tau2_data_dir)
    planned.out_dir.mkdir(parents=True)
    saved = {"simulations": [{"task_id": planned.task_ids[0], "trial": 0}]}
    planned.results_path.write_text(json.dumps(saved), encoding="utf-8")
    started = cell_provenance(
        grid,
        planned.cell,
        "off",
        task_ids=planned.task_ids,
        episodes_saved=0,
        proxy={},
        data_dir=tau2_data_dir,
        concurrency=1,
    )
    (planned.out_dir / PROVENANCE_FILE).write_text(json.dumps(started), encoding="utf-8")
    (again,) = plan_runs(grid, grid.select(None), tmp_path, tau2_data_dir)
    assert again.done == 1  # the same grid resumes
    changed = _grid(BASE.replace('model = "m"', 'model = "m2"', 1) + CELL)
    with pytest.raises(GridError, match=r"agent model: 'm' -> 'm2'"):
        plan_runs(changed, changed.select(None), tmp_path, tau2_data_dir)


def test_a_moved_server_is_not_a_different_run_but_another_model_is() -> None:
    user = {"name": "u", "simulator": "llm", "model": "qwen", "base_url": "http://a:1/v1"}
    moved = {**user, "base_url": "http://b:2/v1"}
    assert resume_conflicts(_provenance(user=user), _provenance(user=moved)) == []
    other = {**user, "model": "llama"}
    assert resume_conflicts(_provenance(user=user), _provenance(user=other)) == [
        "user model: 'qwen' -> 'llama'"
    ]
