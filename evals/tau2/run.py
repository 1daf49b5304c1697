"""``python -m evals.run``: run a domain's tasks x trials and write ``<save-to>/results.json``.

Episodes run concurrently (``--concurrency``); each one is scored and written to the results file
as soon as it finishes, atomically, so a killed run resumes where it stopped: episodes already in
the file (keyed by task id and trial) are skipped, none is lost or run twice.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from evals.tau2.agents import GoldAgent, LLMAgent, ModelConfig
from evals.tau2.data import ChecksumError, DataNotFoundError, resolve_data_dir
from evals.tau2.domains import DOMAIN_OPTIONS, DOMAINS, load_domain
from evals.tau2.domains.base import Domain
from evals.tau2.logs import (
    AgentInfo,
    EnvironmentInfo,
    Info,
    Results,
    ResultsWriter,
    RewardInfo,
    SimulationRun,
    UserInfo,
    load_results,
    resume_differences,
)
from evals.tau2.orchestrator import (
    DEFAULT_MAX_ERRORS,
    DEFAULT_MAX_STEPS,
    Episode,
    OrchestratorConfig,
    run_episode,
)
from evals.tau2.participants import Agent, AgentFactory, EpisodeContext, User, UserFactory
from evals.tau2.reward import evaluate_episode, is_successful, pass_hat_ks
from evals.tau2.scoring import Judge, OpenAIJudge
from evals.tau2.scripted_user import ScriptedUser
from evals.tau2.source import git
from evals.tau2.tasks import Task
from evals.tau2.users import GoldUser, LLMUserSimulator, load_guidelines
from repairproxy.local.progress import progress_bar

__all__ = ["RESULTS_FILE", "RunConfig", "main", "parse_args", "run", "summarize"]

RESULTS_FILE = "results.json"
DEFAULT_SEED = 300


@dataclass(frozen=True)
class RunConfig:
    """Everything one run needs, built once from the command line."""

    domain: str
    data_dir: Path
    save_to: Path
    agent: Literal["llm", "gold"] = "llm"
    user: Literal["llm", "gold", "scripted"] = "llm"
    agent_model: ModelConfig | None = None
    user_model: ModelConfig | None = None
    judge_model: ModelConfig | None = None
    num_trials: int = 4
    max_errors: int = DEFAULT_MAX_ERRORS
    max_steps: int = DEFAULT_MAX_STEPS
    task_ids: tuple[str, ...] | None = None
    split: str | None = "base"
    concurrency: int = 1
    seed: int = DEFAULT_SEED
    progress: bool = True
    # Named deviations from τ²-bench v1.0.1 (``evals.tau2.domains.DOMAIN_OPTIONS``) turned on.
    domain_options: tuple[str, ...] = ()

    def domain_option_values(self) -> dict[str, bool]:
        """Every option of this run's domain, on or off, as ``info.domain_options`` records."""
        return {
            name: name in self.domain_options
            for name, (owner, _) in DOMAIN_OPTIONS.items()
            if owner == self.domain
        }

    @property
    def results_path(self) -> Path:
        return self.save_to / RESULTS_FILE


@dataclass
class _Participants:
    make_agent: AgentFactory
    make_user: UserFactory
    judge: Judge | None
    info: tuple[AgentInfo, UserInfo]
    clients: list[Any] = field(default_factory=list)


def _model_args(model: ModelConfig) -> dict[str, Any]:
    return {"temperature": model.temperature, "seed": model.seed, "base_url": model.base_url}


def _participants(config: RunConfig, domain: Domain) -> _Participants:
    clients: list[Any] = []
    make_agent: Callable[[EpisodeContext], Agent]
    make_user: Callable[[EpisodeContext], User]
    if config.agent == "gold":
        make_agent = GoldAgent
        agent_info = AgentInfo(implementation="gold_agent")
    else:
        if config.agent_model is None:
            raise ValueError("--agent llm needs --agent-model and --agent-base-url")
        agent_model, agent_client = config.agent_model, config.agent_model.client()
        clients.append(agent_client)

        def make_agent(context: EpisodeContext) -> Agent:
            return LLMAgent(agent_client, agent_model, context)

        agent_info = AgentInfo(
            implementation="llm_agent", llm=agent_model.model, llm_args=_model_args(agent_model)
        )
    if config.user == "gold":
        make_user = GoldUser
        user_info = UserInfo(implementation="gold_user")
    elif config.user == "scripted":
        make_user = ScriptedUser
        user_info = UserInfo(implementation="scripted_user")
    else:
        if config.user_model is None:
            raise ValueError("--user llm needs --user-model and --user-base-url")
        user_model, user_client = config.user_model, config.user_model.client()
        clients.append(user_client)
        texts = {
            tools: load_guidelines(config.data_dir, with_tools=tools) for tools in (False, True)
        }
        guidelines = texts[bool(domain.new_environment().user_tools())]

        def make_user(context: EpisodeContext) -> User:
            text = texts[bool(context.user_tools)]
            return LLMUserSimulator(user_client, user_model, text, context)

        user_info = UserInfo(
            implementation="user_simulator",
            llm=user_model.model,
            llm_args=_model_args(user_model),
            global_simulation_guidelines=guidelines,
        )
    judge: Judge | None = None
    if config.judge_model is not None:
        judge_client = config.judge_model.client()
        clients.append(judge_client)
        judge = OpenAIJudge(judge_client, config.judge_model.model, config.judge_model.temperature)
    return _Participants(make_agent, make_user, judge, (agent_info, user_info), clients)


def _select_tasks(domain: Domain, config: RunConfig) -> list[Task]:
    tasks = domain.tasks(config.split)
    if config.task_ids is not None:
        by_id = {t.id: t for t in domain.tasks(None)}
        missing = [i for i in config.task_ids if i not in by_id]
        if missing:
            raise ValueError(f"unknown task ids: {missing}")
        tasks = [by_id[i] for i in config.task_ids]
    return tasks


def _info(config: RunConfig, domain: Domain, participants: _Participants) -> Info:
    agent_info, user_info = participants.info
    judge = config.judge_model
    return Info(
        git_commit=git("rev-parse", "HEAD"),  # τ²-bench records the commit too
        num_trials=config.num_trials,
        max_steps=config.max_steps,
        max_errors=config.max_errors,
        user_info=user_info,
        agent_info=agent_info,
        environment_info=EnvironmentInfo(domain_name=domain.name, policy=domain.policy),
        seed=config.seed,
        nl_assertions_scored=judge is not None,
        judge_info=None if judge is None else {"llm": judge.model, **_model_args(judge)},
        domain_options=config.domain_option_values(),
    )


def _check_resumable(previous: Info, current: Info) -> None:
    differences = resume_differences(previous, current)
    if differences:
        raise ValueError(
            "results file was written by a different run ("
            + "; ".join(differences)
            + "): resuming would mix two runs in one file; use another --save-to"
        )


async def run(
    config: RunConfig,
    *,
    domain: Domain | None = None,
    make_agent: AgentFactory | None = None,
    on_episode: Callable[[SimulationRun], None] | None = None,
) -> Results:
    """Run (or resume) every pending episode and return the complete results.

    ``domain`` and ``make_agent`` replace what ``config`` names (tests use a small fake domain);
    ``on_episode`` is called with each episode once it is saved (the grid's progress bar).
    """
    domain = domain or load_domain(
        config.domain, config.data_dir, dict.fromkeys(config.domain_options, True)
    )
    tasks = _select_tasks(domain, config)
    participants = _participants(config, domain)
    if make_agent is not None:
        participants.make_agent = make_agent
    info = _info(config, domain, participants)
    if config.results_path.exists():
        results = load_results(config.results_path)
        _check_resumable(results.info, info)
        known = {str(t["id"]) for t in results.tasks}
        results.tasks += [t.model_dump(mode="json") for t in tasks if t.id not in known]
    else:
        results = Results(
            info=info, tasks=[t.model_dump(mode="json") for t in tasks], simulations=[]
        )
    writer = ResultsWriter(config.results_path, results)
    writer.flush()
    done = {(s.task_id, s.trial) for s in results.simulations}
    if len(done) != len(results.simulations):
        raise ValueError(f"{config.results_path} holds duplicate episodes")

    rng = random.Random(config.seed)
    trial_seeds = [rng.randint(0, 1_000_000) for _ in range(config.num_trials)]
    pending = [
        (task, trial)
        for trial in range(config.num_trials)
        for task in tasks
        if (task.id, trial) not in done
    ]
    orchestrator = OrchestratorConfig(max_steps=config.max_steps, max_errors=config.max_errors)
    gate = asyncio.Semaphore(max(1, config.concurrency))
    write_lock = asyncio.Lock()
    bar = progress_bar(
        total=len(tasks) * config.num_trials,
        initial=len(tasks) * config.num_trials - len(pending),
        desc=f"{config.domain}",
        disable=not config.progress,
    )

    async def one(task: Task, trial: int) -> None:
        async with gate:
            episode = await run_episode(
                domain=domain,
                task=task,
                make_agent=participants.make_agent,
                make_user=participants.make_user,
                config=orchestrator,
                trial=trial,
                seed=trial_seeds[trial],
            )
            episode.run.reward_info = await _score(domain, task, episode, participants.judge)
        async with write_lock:
            writer.append(episode.run)
            bar.update(1)
            if on_episode is not None:
                on_episode(episode.run)

    try:
        await asyncio.gather(*(one(task, trial) for task, trial in pending))
    finally:
        bar.close()
        for client in participants.clients:
            await client.close()
    return results


async def _score(domain: Domain, task: Task, episode: Episode, judge: Judge | None) -> RewardInfo:
    try:
        return await evaluate_episode(
            domain=domain,
            task=task,
            termination_reason=episode.run.termination_reason,
            messages=episode.run.messages,
            final_env=episode.environment,
            judge=judge,
        )
    except Exception as exc:  # one bad evaluation must not abort the run (τ²-bench does the same)
        return RewardInfo(reward=0.0, info={"error": f"{type(exc).__name__}: {exc}"})


def _totals(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    total: Counter[str] = Counter()
    for count in counts:
        total.update(count)
    return dict(total)


def summarize(results: Results) -> dict[str, Any]:
    """Average reward, pass^k, success count and termination reasons of a results file."""
    rewards: dict[str, list[float]] = defaultdict(list)
    for sim in results.simulations:
        rewards[sim.task_id].append(sim.reward_info.reward if sim.reward_info else 0.0)
    flat = [r for task_rewards in rewards.values() for r in task_rewards]
    # Episodes whose basis holds NL_ASSERTION but no judge scored it: their reward leaves that
    # component out, so they are counted apart (τ²-bench would end them as infra errors).
    unscored = [
        s.reward_info.reward
        for s in results.simulations
        if s.reward_info is not None and s.reward_info.nl_assertions_scored is False
    ]
    return {
        "episodes": len(flat),
        "successes": sum(is_successful(r) for r in flat),
        "avg_reward": sum(flat) / len(flat) if flat else 0.0,
        "pass_hat_k": pass_hat_ks(rewards, results.info.num_trials),
        "termination": dict(Counter(s.termination_reason for s in results.simulations)),
        "tool_errors": _totals(s.errors_by_requestor for s in results.simulations),
        "malformed_tool_calls": _totals(s.malformed_tool_calls for s in results.simulations),
        "empty_turns": _totals(s.empty_turns for s in results.simulations),
        "nl_assertions_scored": results.info.nl_assertions_scored,
        "nl_unscored": {
            "episodes": len(unscored),
            "successes": sum(is_successful(r) for r in unscored),
        },
    }


def _model(args: argparse.Namespace, prefix: str, environ: Mapping[str, str]) -> ModelConfig | None:
    model = getattr(args, f"{prefix}_model")
    if model is None:
        return None
    base_url = getattr(args, f"{prefix}_base_url")
    if base_url is None:
        raise SystemExit(f"--{prefix}-model needs --{prefix}-base-url")
    return ModelConfig(
        model=model,
        base_url=base_url,
        api_key=environ.get("OPENAI_API_KEY", "EMPTY"),
        temperature=getattr(args, f"{prefix}_temperature"),
        seed=args.llm_seed,
    )


def parse_args(argv: Sequence[str], environ: Mapping[str, str]) -> RunConfig:
    parser = argparse.ArgumentParser(prog="python -m evals.run", description=__doc__)
    parser.add_argument("--domain", required=True, choices=DOMAINS)
    parser.add_argument("--tau2-data", type=Path, default=None, help="τ²-bench data/ folder")
    parser.add_argument(
        "--tau2-allow-unverified",
        action="store_true",
        help="allow downloading the pinned release without a pinned sha256",
    )
    parser.add_argument("--save-to", type=Path, required=True, help="folder for results.json")
    parser.add_argument("--agent", choices=("llm", "gold"), default="llm")
    parser.add_argument("--user", choices=("llm", "gold", "scripted"), default="llm")
    for who, default_temperature in (("agent", 0.0), ("user", 0.0), ("judge", 0.0)):
        parser.add_argument(f"--{who}-model")
        parser.add_argument(f"--{who}-base-url")
        parser.add_argument(f"--{who}-temperature", type=float, default=default_temperature)
    parser.add_argument("--llm-seed", type=int, default=None, help="fixed sampling seed")
    parser.add_argument("--num-trials", type=int, default=4)
    parser.add_argument("--max-errors", type=int, default=DEFAULT_MAX_ERRORS)
    parser.add_argument("--max-steps", type=int, default=DEFAULT_MAX_STEPS)
    parser.add_argument("--task-ids", nargs="+", default=None)
    parser.add_argument("--split", default="base", help="task split ('none' for all tasks)")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument(
        "--domain-option",
        action="append",
        default=[],
        choices=sorted(DOMAIN_OPTIONS),
        help="turn on a named deviation from τ²-bench v1.0.1 (recorded in the results' info); "
        "retail_modify_items_fix: modify_pending_order_items gives each item its own variant",
    )
    args = parser.parse_args(argv)
    try:
        data_dir = resolve_data_dir(
            args.tau2_data, environ, allow_unverified=args.tau2_allow_unverified
        )
    except (ChecksumError, DataNotFoundError) as exc:
        parser.error(str(exc))
    return RunConfig(
        domain=args.domain,
        data_dir=data_dir,
        save_to=args.save_to,
        agent=args.agent,
        user=args.user,
        agent_model=_model(args, "agent", environ),
        user_model=_model(args, "user", environ),
        judge_model=_model(args, "judge", environ),
        num_trials=args.num_trials,
        max_errors=args.max_errors,
        max_steps=args.max_steps,
        task_ids=tuple(args.task_ids) if args.task_ids else None,
        split=None if args.split == "none" else args.split,
        concurrency=args.concurrency,
        seed=args.seed,
        progress=not args.no_progress,
        domain_options=tuple(args.domain_option),
    )


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(sys.argv[1:] if argv is None else argv, os.environ)
    results = asyncio.run(run(config))
    summary = summarize(results)
    print(f"results: {config.results_path}")
    for key, value in summary.items():
        print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
