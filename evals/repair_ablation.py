"""``python -m evals.repair_ablation GRID.toml --out runs/NAME``: the repair ablation grid.

For each arm it reaches (or starts) the model server and starts one proxy in front of it; every
cell x repair mode then runs through ``evals.tau2.run`` in this process, with the mode chosen per
request (``X-Repairproxy-Repair``) and the proxy's budget set to the cell's ``max_errors``. Each
run writes ``<out>/<cell>/<mode>/results.json`` (τ²-bench's layout) and ``provenance.json`` beside
it. A killed grid resumes where it stopped: finished runs are skipped, partial ones resume episode
by episode. It ends by handing every results file and the pairs to compare to ``evals.analyze``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from evals.grid.launch import ArmEndpoint, LaunchError, proxy_command
from evals.grid.provenance import PROVENANCE_FILE, cell_provenance, code_identity, code_of
from evals.grid.spec import (
    CellSpec,
    Grid,
    GridError,
    cell_name,
    load_grid,
    resume_conflicts,
)
from evals.grid.upstream_pool import UpstreamPool
from evals.tau2.agents import ModelConfig
from evals.tau2.data import ChecksumError, DataNotFoundError, resolve_data_dir
from evals.tau2.domains import load_domain
from evals.tau2.domains.base import Domain
from evals.tau2.logs import SimulationRun, load_results, save_results
from evals.tau2.run import RESULTS_FILE, RunConfig, run
from evals.tau2.tasks import as_task
from repairproxy.local.progress import progress_bar

__all__ = [
    "BUDGET_HEADER",
    "PROVENANCE_FILE",
    "REPAIR_HEADER",
    "PlannedRun",
    "analysis_pairs",
    "drop_agent_errors",
    "main",
    "plan_runs",
    "request_headers",
    "run_grid",
]

WATCH_INTERVAL_S = 1.0
REPAIR_HEADER = "X-Repairproxy-Repair"
BUDGET_HEADER = "X-Repairproxy-Budget"


def request_headers(mode: str, max_errors: int) -> dict[str, str]:
    """What the agent sends with every request: the repair mode and the cell's error budget."""
    return {REPAIR_HEADER: mode, BUDGET_HEADER: str(max_errors)}


@dataclass(frozen=True)
class PlannedRun:
    """One cell in one repair mode: its folder, its episodes and how many are already saved."""

    cell: CellSpec
    mode: str
    out_dir: Path
    task_ids: tuple[str, ...]
    done: int

    @property
    def episodes(self) -> int:
        return len(self.task_ids) * self.cell.trials

    @property
    def results_path(self) -> Path:
        return self.out_dir / RESULTS_FILE


def _cell_task_ids(cell: CellSpec, domain: Domain) -> tuple[str, ...]:
    if cell.task_ids is not None:
        known = {as_task(t).id for t in domain.tasks(None)}
        missing = [i for i in cell.task_ids if i not in known]
        if missing:
            raise GridError(f"cell {cell.name}: unknown task ids {missing}")
        return cell.task_ids
    ids = tuple(as_task(t).id for t in domain.tasks(cell.split))
    return ids if cell.task_count is None else ids[: cell.task_count]


def _saved_episodes(path: Path, task_ids: Sequence[str], trials: int) -> int:
    """Episodes of this run already in its results file (read as plain JSON: it may be large)."""
    if not path.exists():
        return 0
    wanted = set(task_ids)
    simulations = json.loads(path.read_text(encoding="utf-8")).get("simulations") or []
    saved = {
        (str(s.get("task_id")), s.get("trial"))
        for s in simulations
        if str(s.get("task_id")) in wanted
        and isinstance(s.get("trial"), int)
        and s["trial"] < trials
    }
    return len(saved)


def _check_resume(
    grid: Grid,
    cell: CellSpec,
    mode: str,
    out_dir: Path,
    task_ids: Sequence[str],
    done: int,
    data_dir: Path,
) -> None:
    """Refuse to add episodes to a run started with another model, user, judge, seed, repair
    template or domain options (its provenance.json says what it started with)."""
    path = out_dir / PROVENANCE_FILE
    if not path.is_file():
        return
    previous = json.loads(path.read_text(encoding="utf-8"))
    current = cell_provenance(
        grid,
        cell,
        mode,
        task_ids=task_ids,
        episodes_saved=done,
        proxy={},
        data_dir=data_dir,
        concurrency=grid.concurrency,
    )
    conflicts = resume_conflicts(previous, current)
    if conflicts:
        raise GridError(
            f"{out_dir} holds {done} episode(s) of a run that differs from this grid ("
            + "; ".join(conflicts)
            + "): resuming would mix two runs in one results file; use another --out"
        )


def check_one_code(
    planned: Sequence[PlannedRun], current: Mapping[str, Any], *, allow_mixed: bool = False
) -> None:
    """Refuse a run whose cells would come from different code: a saved cell's provenance names
    another commit (or source hash) than this checkout's, or two saved cells differ. A report
    that pairs arms of two commits compares the code as well as the arms. ``allow_mixed``
    (``--allow-mixed-commits``) lets it through; each cell's provenance still says its code."""
    if allow_mixed:
        return
    now = code_of(current)
    seen: dict[str, list[str]] = {}
    for item in planned:
        path = item.out_dir / PROVENANCE_FILE
        if not item.done or not path.is_file():
            continue
        previous = json.loads(path.read_text(encoding="utf-8"))
        seen.setdefault(code_of(previous), []).append(f"{item.cell.name}/{item.mode}")
    others = {code: runs for code, runs in seen.items() if code != now}
    if others:
        listed = "; ".join(f"{', '.join(runs)} at {code}" for code, runs in others.items())
        raise GridError(
            f"this checkout is at {now}, but saved runs were made at other code ({listed}): "
            "resuming would mix code in one grid; check out that commit, use another --out, or "
            "pass --allow-mixed-commits"
        )


def plan_runs(grid: Grid, cells: Sequence[CellSpec], out: Path, data_dir: Path) -> list[PlannedRun]:
    """Every (cell, mode) to run, in grid order, with what is already on disk."""
    domains: dict[str, Domain] = {}
    planned = []
    for cell in cells:
        domain = domains.get(cell.domain) or load_domain(cell.domain, data_dir)
        domains[cell.domain] = domain
        task_ids = _cell_task_ids(cell, domain)
        for mode in cell.modes:
            out_dir = out / cell.name / mode
            done = _saved_episodes(out_dir / RESULTS_FILE, task_ids, cell.trials)
            if done:
                _check_resume(grid, cell, mode, out_dir, task_ids, done, data_dir)
            planned.append(PlannedRun(cell, mode, out_dir, task_ids, done))
    return planned


def analysis_pairs(grid: Grid, planned: Sequence[PlannedRun]) -> list[tuple[Path, Path]]:
    """What the analysis compares: each repair mode against ``off`` in the same cell, and each
    arm against its ``reference`` arm in the same domain, user, budget and mode."""
    by_key = {(p.cell.name, p.mode): p.results_path for p in planned}
    pairs: list[tuple[Path, Path]] = []
    for p in planned:
        if p.mode != "off" and (p.cell.name, "off") in by_key:
            pairs.append((by_key[(p.cell.name, "off")], p.results_path))
    for p in planned:
        reference = grid.arms[p.cell.arm].reference
        if reference is None:
            continue
        ref_name = cell_name(p.cell.domain, reference, p.cell.user, p.cell.max_errors)
        if (ref_name, p.mode) in by_key:
            pairs.append((by_key[(ref_name, p.mode)], p.results_path))
    return list(dict.fromkeys(pairs))


# --- running ------------------------------------------------------------------------------------


def _api_key(env_name: str | None, environ: Mapping[str, str]) -> str:
    return environ.get(env_name, "EMPTY") if env_name else "EMPTY"


def _run_config(
    grid: Grid,
    planned: PlannedRun,
    endpoint: ArmEndpoint,
    data_dir: Path,
    concurrency: int,
    environ: Mapping[str, str],
) -> RunConfig:
    cell, arm = planned.cell, grid.arms[planned.cell.arm]
    user = grid.users[cell.user]
    agent_model = ModelConfig(
        model=arm.model,
        base_url=endpoint.proxy_url,
        temperature=arm.temperature,
        seed=grid.llm_seed,
        max_tokens=arm.max_tokens,
        extra_headers=request_headers(planned.mode, cell.max_errors),
    )
    user_model = None
    if user.kind == "llm":
        assert user.model is not None and user.base_url is not None
        user_model = ModelConfig(
            model=user.model,
            base_url=user.base_url,
            api_key=_api_key(user.api_key_env, environ),
            temperature=user.temperature,
            seed=grid.llm_seed,
        )
    judge_model = None
    if grid.judge is not None:
        assert grid.judge.model is not None and grid.judge.base_url is not None
        judge_model = ModelConfig(
            model=grid.judge.model,
            base_url=grid.judge.base_url,
            api_key=_api_key(grid.judge.api_key_env, environ),
            temperature=grid.judge.temperature,
            seed=grid.llm_seed,
        )
    return RunConfig(
        domain=cell.domain,
        data_dir=data_dir,
        save_to=planned.out_dir,
        agent="llm",
        user=user.kind,
        agent_model=agent_model,
        user_model=user_model,
        judge_model=judge_model,
        num_trials=cell.trials,
        max_errors=cell.max_errors,
        max_steps=cell.max_steps,
        task_ids=planned.task_ids,
        split=cell.split,
        concurrency=concurrency,
        seed=cell.seed,
        progress=False,
        domain_options=cell.domain_options,
    )


@contextmanager
def _grid_bar(planned: Sequence[PlannedRun], enabled: bool) -> Iterator[tqdm[Any]]:
    total = sum(p.episodes for p in planned)
    done = sum(p.done for p in planned)
    bar = progress_bar(total=total, initial=done, desc="grid", unit="episode", disable=not enabled)
    try:
        yield bar
    finally:
        bar.close()


async def run_grid(
    grid: Grid,
    planned: Sequence[PlannedRun],
    *,
    out: Path,
    data_dir: Path,
    concurrency: int,
    progress: bool = True,
    environ: Mapping[str, str] | None = None,
    allow_mixed_commits: bool = False,
) -> None:
    """Run every pending episode of ``planned``, one arm endpoint at a time. The code identity
    is taken once at the start; a checkout that changes under a running grid stops it before
    the next cell (unless ``allow_mixed_commits``)."""
    environ = os.environ if environ is None else environ
    code = code_identity()
    check_one_code(planned, code, allow_mixed=allow_mixed_commits)
    arm_order = list(dict.fromkeys(p.cell.arm for p in planned))
    with _grid_bar(planned, progress) as bar:

        def saved(simulation: SimulationRun) -> None:
            bar.set_postfix_str(f"last: task {simulation.task_id}", refresh=False)
            bar.update(1)

        for arm_name in arm_order:
            pending = [p for p in planned if p.cell.arm == arm_name and p.done < p.episodes]
            if not pending:
                continue
            arm = grid.arms[arm_name]
            with ArmEndpoint(arm, out / "logs", grid.proxy_args) as endpoint:
                for item in pending:
                    now = code_identity()
                    if code_of(now) != code_of(code) and not allow_mixed_commits:
                        raise GridError(
                            f"the checkout changed under the running grid ({code_of(code)} -> "
                            f"{code_of(now)}) before {item.cell.name}/{item.mode}: its cells would "
                            "come from two versions of the code; pass --allow-mixed-commits to "
                            "let that through"
                        )
                    item.out_dir.mkdir(parents=True, exist_ok=True)
                    proxy = {
                        **endpoint.describe(),
                        "request_headers": request_headers(item.mode, item.cell.max_errors),
                    }
                    provenance = cell_provenance(
                        grid,
                        item.cell,
                        item.mode,
                        task_ids=item.task_ids,
                        episodes_saved=item.done,
                        proxy=proxy,
                        data_dir=data_dir,
                        concurrency=concurrency,
                        code=now,
                    )
                    (item.out_dir / PROVENANCE_FILE).write_text(
                        json.dumps(provenance, indent=2) + "\n", encoding="utf-8"
                    )
                    bar.set_description(f"{item.cell.name}/{item.mode}")
                    config = _run_config(grid, item, endpoint, data_dir, concurrency, environ)
                    pool = None
                    if len(endpoint.proxy_urls) > 1 and config.agent_model is not None:
                        # One queue per arm, `concurrency` episodes per upstream at a time.
                        pool = UpstreamPool(config.agent_model, endpoint.proxy_urls, concurrency)
                        config = dataclasses.replace(config, concurrency=pool.concurrency)
                    await _run_watched(config, endpoint, saved, pool)


async def _run_watched(
    config: RunConfig,
    endpoint: ArmEndpoint,
    on_episode: Callable[[SimulationRun], None],
    pool: UpstreamPool | None = None,
) -> None:
    """``evals.tau2.run.run``, stopped as soon as a server of the arm dies: every episode after that
    would end as an ``agent_error`` that a resume would not run again. With a ``pool`` the
    episodes are spread over the arm's upstreams."""
    make_agent = None
    if pool is not None:
        make_agent, on_episode = pool.make_agent, _both(pool.episode_saved, on_episode)
    try:
        running = asyncio.ensure_future(run(config, on_episode=on_episode, make_agent=make_agent))
        while not running.done():
            await asyncio.wait({running}, timeout=WATCH_INTERVAL_S)
            if not running.done():
                try:
                    endpoint.check()
                except LaunchError:
                    running.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await running
                    raise
        running.result()
        endpoint.check()  # a server that died with the last episodes fails the run too
    finally:
        if pool is not None:
            await pool.aclose()


def _both(
    first: Callable[[SimulationRun], None], then: Callable[[SimulationRun], None]
) -> Callable[[SimulationRun], None]:
    def saved(simulation: SimulationRun) -> None:
        first(simulation)
        then(simulation)

    return saved


def drop_agent_errors(path: Path) -> int:
    """Remove the episodes that ended ``agent_error`` (a dead or refusing server, usually) from a
    results file so that the next run plays them again; how many were removed."""
    if not path.exists():
        return 0
    results = load_results(path)
    kept = [s for s in results.simulations if s.termination_reason != "agent_error"]
    dropped = len(results.simulations) - len(kept)
    if dropped:
        results.simulations = kept
        save_results(path, results)
    return dropped


def _print_plan(grid: Grid, planned: Sequence[PlannedRun], out: Path) -> None:
    print(f"grid {grid.name}: {len(planned)} runs into {out}")
    print(
        f"{'cell':40} {'mode':12} {'user':10} {'tasks':>5} {'trials':>6} {'K':>3} "
        f"{'episodes':>8} {'saved':>6}"
    )
    for p in planned:
        c = p.cell
        print(
            f"{c.name:40} {p.mode:12} {c.user:10} {len(p.task_ids):>5} {c.trials:>6} "
            f"{c.max_errors:>3} {p.episodes:>8} {p.done:>6}"
        )
    total = sum(p.episodes for p in planned)
    print(f"episodes: {total} planned, {sum(p.done for p in planned)} already saved")
    for arm_name in dict.fromkeys(p.cell.arm for p in planned):
        arm = grid.arms[arm_name]
        if arm.launch is not None:
            port = arm.launch.port or 0
            command = " ".join(arm.launch.command(port))
            print(f"arm {arm_name}: start {command}  (port 0: a free one)")
        else:
            print(f"arm {arm_name}: upstream {', '.join(arm.upstreams) or arm.arm_dir}")
        if arm.proxy:
            print(f"  proxy: {arm.proxy} (already running)")
        else:
            args = [*grid.proxy_args, *arm.proxy_args]
            print(f"  proxy: {' '.join(proxy_command('<upstream>', 0, args))}")


def _analyze(grid: Grid, planned: Sequence[PlannedRun], out: Path) -> None:
    paths = [p.results_path for p in planned if p.results_path.exists()]
    pairs = [
        (str(a), str(b)) for a, b in analysis_pairs(grid, planned) if a.exists() and b.exists()
    ]
    try:
        analyze = importlib.import_module("evals.analyze").analyze
    except (ImportError, AttributeError) as exc:
        print(f"analysis unavailable ({exc}); results: {', '.join(map(str, paths))}")
        return
    if not paths:
        print("analysis skipped: no results yet")
        return
    try:
        analyze(
            paths,
            pairs,
            out / "analysis",
            f"repair ablation: {grid.name}",
            families=grid.families or None,
        )
    except Exception as exc:  # the episodes are saved; a failing report must not hide that
        print(f"analysis failed ({type(exc).__name__}: {exc}); rerun: python -m evals.analyze")
        return
    print(f"analysis: {out / 'analysis' / 'report.html'}")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m evals.repair_ablation", description=__doc__)
    parser.add_argument("grid", type=Path, help="grid file (TOML), e.g. evals/grids/cpu.toml")
    parser.add_argument("--out", type=Path, required=True, help="folder of the run, e.g. runs/cpu")
    parser.add_argument("--only", nargs="+", default=None, help="cell names or patterns")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    parser.add_argument("--concurrency", type=int, default=None, help="episodes at once per run")
    parser.add_argument("--tau2-data", type=Path, default=None, help="τ²-bench data/ folder")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--no-analysis", action="store_true")
    parser.add_argument(
        "--rerun-agent-errors",
        action="store_true",
        help="first drop the saved episodes that ended agent_error (e.g. a server was down)",
    )
    parser.add_argument(
        "--allow-mixed-commits",
        action="store_true",
        help="let one grid's cells come from different commits or source trees (each cell's "
        "provenance.json still records its own); without it a resume at other code is refused",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        grid = load_grid(args.grid)
        cells = grid.select(args.only)
        data_dir = resolve_data_dir(args.tau2_data or grid.tau2_data, os.environ)
        if args.rerun_agent_errors and not args.dry_run:
            for cell in cells:
                for mode in cell.modes:
                    path = args.out / cell.name / mode / RESULTS_FILE
                    if dropped := drop_agent_errors(path):
                        print(f"{cell.name}/{mode}: {dropped} agent_error episode(s) to run again")
        planned = plan_runs(grid, cells, args.out, data_dir)
    except (GridError, ChecksumError, DataNotFoundError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        _print_plan(grid, planned, args.out)
        return 0
    concurrency = args.concurrency or grid.concurrency
    try:
        asyncio.run(
            run_grid(
                grid,
                planned,
                out=args.out,
                data_dir=data_dir,
                concurrency=concurrency,
                progress=not args.no_progress,
                allow_mixed_commits=args.allow_mixed_commits,
            )
        )
    except (GridError, LaunchError, ValueError) as exc:  # ValueError: a results file of another run
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if grid.screen is not None:  # the [screen] cells: the risk screen of the grid's arms
        from evals.screen import ScreenError
        from evals.screen.grid import run_screen_cells

        try:
            run_screen_cells(grid, grid.screen, args.out, data_dir)
        except (ScreenError, LaunchError, ValueError) as exc:
            print(f"error: screen: {exc}", file=sys.stderr)
            return 1
    if not args.no_analysis:
        _analyze(grid, plan_runs(grid, cells, args.out, data_dir), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
