"""From τ²-bench ``results.json`` files to the study's numbers: per arm, per pair of arms.

Episodes and arms are read by ``evals.analysis.episodes`` (any file in τ²-bench v1.0.1's layout;
failed calls counted from the messages, never from a ``num_errors`` field), each pair's numbers come
from ``evals.analysis.pairs`` and recovery from ``evals.analysis.recovery``; their names are
re-exported here. The proxy's view comes from the ``repairproxy`` field the engine records on each
assistant message.
"""

from __future__ import annotations

import fnmatch
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from evals.analysis import effects, stats
from evals.analysis.arm_view import ArmSummary, ProxyView, RepairCost
from evals.analysis.definitions import AnswerFacts, answer_facts
from evals.analysis.episodes import (
    BUDGETS,
    ENV_CHANNELS,
    PROXY_CHANNELS,
    REPAIR_MODES,
    Arm,
    Episode,
    ToolCallRecord,
    classify_error,
    load_arm,
    read_episodes,
    success_at,
    user_side_tools,
)
from evals.analysis.margins import margin_view
from evals.analysis.pairs import (
    COST_MEASURES,
    PairSummary,
    amplification,
    beyond_budget,
    keyed_by_trial,
    scored_episodes,
    summarize_pair,
    summarize_pairs,
)
from evals.analysis.recovery import (
    EVENTUAL_RECOVERY,
    NEXT_CALL_RECOVERY,
    Recovery,
    recoveries,
    recovery_counts,
)
from evals.analysis.stats import NotAvailable

__all__ = [
    "BUDGETS",
    "BUILT_IN_FAMILIES",
    "COST_MEASURES",
    "ENV_CHANNELS",
    "EVENTUAL_RECOVERY",
    "MODES_FAMILY",
    "NEXT_CALL_RECOVERY",
    "OTHER_FAMILY",
    "PRECISION_FAMILY",
    "PROXY_CHANNELS",
    "REPAIR_MODES",
    "Arm",
    "ArmSummary",
    "Episode",
    "PairSummary",
    "ProxyView",
    "Recovery",
    "RepairCost",
    "Summary",
    "ToolCallRecord",
    "amplification",
    "assign_families",
    "build_summary",
    "classify_error",
    "default_pairs",
    "family_of",
    "load_arm",
    "pair_label",
    "read_episodes",
    "recoveries",
    "success_at",
    "summarize_arm",
    "summarize_pair",
    "summarize_pairs",
    "user_side_tools",
]


# ---------------------------------------------------------------------------------------------
# Per arm


@dataclass(frozen=True)
class Rate:
    """A count over a denominator; the rate is n/a when the denominator is 0."""

    count: int
    total: int
    reason_if_empty: str = "no agent tool calls"

    @property
    def value(self) -> float | NotAvailable:
        return self.count / self.total if self.total else NotAvailable(self.reason_if_empty)


def _mean(values: Sequence[float], reason: str) -> float | NotAvailable:
    return sum(values) / len(values) if values else NotAvailable(reason)


def _median(values: Sequence[float], reason: str) -> float | NotAvailable:
    if not values:
        return NotAvailable(reason)
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def _number(value: Any) -> float:
    if value is None:  # most answers carry no repair figures: no exception raised for them
        return 0.0
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def _names(value: Any) -> list[str]:
    if isinstance(value, list):
        return [str(v) for v in value if str(v)]
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return []


def _answer_names(episode: Episode, user_tools: frozenset[str] = frozenset()) -> Counter[str]:
    """Hallucinated names, per answer the larger of the env's and the proxy's count (a name of
    the user's side is not invented, whichever view saw it)."""
    total: Counter[str] = Counter()
    env_by_message: dict[int, Counter[str]] = {}
    for call in episode.agent_calls:
        if call.channel == "hallucinated_name":
            name = classify_error(call.content)[1] or call.name
            env_by_message.setdefault(call.message_index, Counter())[name] += 1
    seen: set[int] = set()
    for index, proxy in episode.answer_proxy:
        seen.add(index)
        invented = _invented(proxy, user_tools)
        if not invented and index not in env_by_message:
            continue  # most answers: nothing invented in either view
        env = env_by_message.get(index, Counter())
        caught = Counter(invented)
        for name in set(env) | set(caught):
            total[name] += max(env[name], caught[name])
    for index, env in env_by_message.items():
        if index not in seen:
            total.update(env)
    return total


def _first_answer_calls(episode: Episode, user_tools: frozenset[str] = frozenset()) -> int:
    """raw_hallucination_rate's denominator for one episode: per answer, the proxy's count of
    the first answer's calls (``first_tool_calls``) where recorded, else the calls that ran plus
    the invented-name calls the proxy removed before they ran (never below the answer's
    numerator)."""
    ran: Counter[int] = Counter(call.message_index for call in episode.agent_calls)
    env: dict[int, Counter[str]] = {}
    for call in episode.agent_calls:
        if call.channel == "hallucinated_name":
            name = classify_error(call.content)[1] or call.name
            env.setdefault(call.message_index, Counter())[name] += 1
    total = 0
    seen: set[int] = set()
    for index, proxy in episode.answer_proxy:
        seen.add(index)
        found = env.get(index, Counter())
        caught = Counter(_invented(proxy, user_tools))
        raw = sum(max(found[n], caught[n]) for n in set(found) | set(caught))
        recorded = proxy.get("first_tool_calls") if proxy else None
        if isinstance(recorded, int | float) and not isinstance(recorded, bool):
            total += max(int(recorded), raw)
        else:
            total += ran[index] + raw - sum(found.values())
    for index, count in ran.items():  # answers without a proxy record: the calls that ran
        if index not in seen:
            total += count
    return total


def _invented(proxy: Mapping[str, Any] | None, user_tools: frozenset[str]) -> list[str]:
    """The undeclared names the proxy caught in one answer, less the user's side's names."""
    if not proxy:
        return []
    return [n for n in _names(proxy.get("unknown_tools")) if n not in user_tools]


def delivered_channels(episode: Episode, message_index: int) -> frozenset[str] | None:
    """The channels the delivered calls of one answer failed with in the environment; None
    when the answer delivered no call (an empty answer and a plain reply look alike there)."""
    calls = [c for c in episode.agent_calls if c.message_index == message_index]
    if not calls:
        return None
    return frozenset(c.channel for c in calls if c.error and c.channel)


def answers_facts(episode: Episode) -> list[tuple[int, AnswerFacts]]:
    """(message index, facts) of every agent answer with a proxy record."""
    by_answer: dict[int, list[ToolCallRecord]] = {}
    for call in episode.agent_calls:  # delivered_channels for every answer, in one pass
        by_answer.setdefault(call.message_index, []).append(call)
    out = []
    for index, proxy in episode.answer_proxy:
        if proxy is None:
            continue
        calls = by_answer.get(index)
        delivered = frozenset(c.channel for c in calls if c.error and c.channel) if calls else None
        facts = answer_facts(proxy, delivered, len(calls) if calls else 0)
        if facts is not None:
            out.append((index, facts))
    return out


def _proxy_view(episodes: Sequence[Episode]) -> ProxyView:
    by_channel = {channel: 0 for channel in PROXY_CHANNELS}
    answers = caught = fixed = repairs = failures = 0
    changed = still_invalid = unchecked = not_separable = declined = withheld = 0
    for episode in episodes:
        for _, facts in answers_facts(episode):
            answers += 1
            repairs += facts.reasks
            failures += facts.repair_failed
            for channel in facts.first_channels:
                by_channel[channel] = by_channel.get(channel, 0) + 1
            if not facts.caught:
                continue
            caught += 1
            not_separable += not facts.separable
            changed += facts.changed
            fixed += facts.fixed
            still_invalid += facts.still_invalid
            declined += facts.declined
            withheld += facts.withheld
            unchecked += facts.changed and facts.valid_on_delivery is None
    return ProxyView(
        answers,
        by_channel,
        caught,
        fixed,
        repairs,
        failures,
        changed_answers=changed,
        still_invalid_answers=still_invalid,
        unchecked_answers=unchecked,
        not_separable=not_separable,
        declined_answers=declined,
        withheld_answers=withheld,
    )


def _repair_cost(episodes: Sequence[Episode]) -> RepairCost:
    extra: list[float] = []
    prompt: list[float] = []
    completion: list[float] = []
    seconds: list[float] = []
    overhead: list[float] = []
    for episode in episodes:
        if not episode.proxy_answers:
            continue
        extra.append(
            sum(max(_number(p.get("upstream_calls", 1)) - 1, 0) for p in episode.proxy_answers)
        )
        prompt.append(sum(_number(p.get("repair_prompt_tokens")) for p in episode.proxy_answers))
        completion.append(
            sum(_number(p.get("repair_completion_tokens")) for p in episode.proxy_answers)
        )
        seconds.append(sum(_number(p.get("repair_seconds")) for p in episode.proxy_answers))
        overhead.extend(
            _number(p["overhead_ms"]) for p in episode.proxy_answers if "overhead_ms" in p
        )
    why = "no proxy headers recorded: run without the proxy"
    return RepairCost(
        episodes_with_headers=len(extra),
        extra_upstream_calls=_mean(extra, why),
        prompt_tokens=_mean(prompt, why),
        completion_tokens=_mean(completion, why),
        seconds=_mean(seconds, why),
        overhead_ms_per_answer=_mean(overhead, "no overhead header recorded"),
    )


def _run_info(info: Mapping[str, Any]) -> dict[str, Any]:
    """What the results file itself says about how the run was made (provenance.json adds more)."""
    agent = info.get("agent_info") or {}
    user = info.get("user_info") or {}
    environment = info.get("environment_info") or {}
    picked = {
        "git_commit": info.get("git_commit"),
        "seed": info.get("seed"),
        "domain": environment.get("domain_name"),
        "agent": agent.get("implementation"),
        "agent_model": agent.get("llm"),
        "agent_llm_args": agent.get("llm_args"),
        "user_simulator": user.get("implementation"),
        "user_model": user.get("llm"),
        "max_steps": info.get("max_steps"),
        "max_errors": info.get("max_errors"),
        "num_trials": info.get("num_trials"),
        "nl_assertions_scored": info.get("nl_assertions_scored"),
    }
    return {key: value for key, value in picked.items() if value is not None}


def summarize_arm(arm: Arm) -> ArmSummary:
    episodes = list(arm.episodes)
    user_tools = arm.user_tools
    scored = scored_episodes(arm)
    successes = sum(e.success for e in scored)
    agent_calls = [c for e in episodes for c in e.agent_calls]
    failed_agent = [c for c in agent_calls if c.error]
    channel_counts = {ch: sum(1 for c in failed_agent if c.channel == ch) for ch in ENV_CHANNELS}
    channel_counts["any"] = len(failed_agent)
    channel_rates = {ch: Rate(n, len(agent_calls)).value for ch, n in channel_counts.items()}
    names_env: Counter[str] = Counter()
    names_proxy: Counter[str] = Counter()
    names: Counter[str] = Counter()
    for episode in episodes:
        for call in episode.agent_calls:
            if call.channel == "hallucinated_name":
                names_env[classify_error(call.content)[1] or call.name] += 1
        for proxy in episode.proxy_answers:
            names_proxy.update(_invented(proxy, user_tools))
        names.update(_answer_names(episode, user_tools))
    raw = sum(names.values())
    recovered, followed, failed = recovery_counts(episodes)
    why_len = "no episodes"
    cell_mode = arm.cell_and_mode
    return ArmSummary(
        label=arm.label,
        path=str(arm.path),
        agent_model=arm.agent_model,
        max_errors=arm.max_errors,
        episodes=len(episodes),
        scored=len(scored),
        nl_unjudged=len(episodes) - len(scored),
        no_reward=sum(1 for e in episodes if e.reward is None),
        success=stats.wilson(successes, len(scored)),
        sweep={
            k: beyond_budget(k, arm.max_errors)
            or stats.wilson(sum(success_at(e, k) for e in scored), len(scored))
            for k in BUDGETS
        },
        messages_mean=_mean([e.num_messages for e in episodes], why_len),
        messages_median=_median([e.num_messages for e in episodes], why_len),
        failed_calls_mean=_mean([e.failed_calls for e in episodes], why_len),
        termination=dict(Counter(e.termination_reason for e in episodes).most_common()),
        agent_tool_calls=len(agent_calls),
        user_failed_calls=sum(
            1 for e in episodes for c in e.calls if c.requestor == "user" and c.error
        ),
        channel_counts=channel_counts,
        channel_rates=channel_rates,
        raw_hallucinated_calls=raw,
        # Denominator: the first answers' calls (see _first_answer_calls and the definitions).
        raw_hallucination_rate=Rate(
            raw, sum(_first_answer_calls(e, user_tools) for e in episodes)
        ).value,
        names_env=dict(names_env.most_common()),
        names_proxy=dict(names_proxy.most_common()),
        names=dict(names.most_common()),
        recovery=Rate(recovered, followed, "no failed agent call was followed by another").value,
        recovery_counts=(recovered, followed, failed),
        proxy=_proxy_view(episodes),
        repair_cost=_repair_cost(episodes),
        provenance=arm.provenance,
        cell=cell_mode[0] if cell_mode else None,
        mode=cell_mode[1] if cell_mode else None,
        run_info=_run_info(arm.info),
        recovery_readings=recoveries(episodes),
        pass_hat_k=effects.pass_hat_ks(
            [(e.task_id, e.reward) for e in episodes], _int_or_none(arm.info.get("num_trials"))
        ),
        failed_calls_histogram=dict(sorted(Counter(e.failed_calls for e in episodes).items())),
        margins=margin_view(episodes),
    )


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# ---------------------------------------------------------------------------------------------
# Which pairs, and their Holm families


def default_pairs(arms: Sequence[Arm]) -> list[tuple[str, str]]:
    """Within each grid cell, repair mode ``off`` against every other mode."""
    by_cell: dict[str, dict[str, str]] = {}
    for arm in arms:
        cell_mode = arm.cell_and_mode
        if cell_mode:
            by_cell.setdefault(cell_mode[0], {})[cell_mode[1]] = arm.label
    pairs: list[tuple[str, str]] = []
    for modes in by_cell.values():
        if "off" in modes:
            pairs.extend(
                (modes["off"], modes[m]) for m in REPAIR_MODES if m in modes and m != "off"
            )
    return pairs


PRECISION_FAMILY = "precision cells at mode off"
MODES_FAMILY = "repair-mode comparisons"
OTHER_FAMILY = "other comparisons"
BUILT_IN_FAMILIES = {
    PRECISION_FAMILY: "both arms at repair mode off, in different cells (e.g. precisions)",
    MODES_FAMILY: "one cell, repair mode off against another mode",
    OTHER_FAMILY: "every other pair",
}


def pair_label(reference: str, compared: str) -> str:
    """How a family's patterns see a pair: ``REFERENCE vs COMPARED``."""
    return f"{reference} vs {compared}"


def _built_in_family(reference: ArmSummary, compared: ArmSummary) -> str:
    if reference.mode == "off" and compared.mode == "off" and reference.cell != compared.cell:
        return PRECISION_FAMILY
    same_cell = reference.cell is not None and reference.cell == compared.cell
    if same_cell and reference.mode != compared.mode:
        return MODES_FAMILY
    return OTHER_FAMILY


def assign_families(
    pairs: Sequence[tuple[ArmSummary, ArmSummary]],
    families: Mapping[str, Sequence[str]] | None,
) -> list[str]:
    """The Holm family of each pair, fixed before any p-value is seen: with ``families`` (name
    -> shell patterns over ``REFERENCE vs COMPARED``), the first family with a matching
    pattern, else ``OTHER_FAMILY``; without, the built-in rule (``BUILT_IN_FAMILIES``)."""
    out = []
    for reference, compared in pairs:
        if families is None:
            out.append(_built_in_family(reference, compared))
            continue
        out.append(family_of(pair_label(reference.label, compared.label), families))
    return out


def family_of(label: str, families: Mapping[str, Sequence[str]]) -> str:
    """The first family with a pattern matching ``label`` (``REFERENCE vs COMPARED``), else
    ``OTHER_FAMILY``."""
    return next(
        (
            name
            for name, patterns in families.items()
            if any(fnmatch.fnmatchcase(label, pattern) for pattern in patterns)
        ),
        OTHER_FAMILY,
    )


@dataclass(frozen=True)
class Summary:
    """Everything one report says: the arms, the pairs (Holm-adjusted per family), the notes."""

    arms: dict[str, ArmSummary]
    pairs: list[PairSummary]
    notes: list[str]
    families: dict[str, str] = field(default_factory=dict)  # name -> what it holds


def build_summary(
    arms: Sequence[Arm],
    pairs: Sequence[tuple[str, str]],
    families: Mapping[str, Sequence[str]] | None = None,
    *,
    summaries: Mapping[str, ArmSummary] | None = None,
) -> Summary:
    """Summarise every arm (unless ``summaries`` has them by label: ``summarize_arm``'s, made
    where the arms were read) and every pair; Holm adjusts the sign-flip test's p (and, as in
    the paper, McNemar's) within each family."""
    by_label = {arm.label: arm for arm in arms}
    if summaries is None:
        summaries = {arm.label: summarize_arm(arm) for arm in arms}
    else:
        summaries = {arm.label: summaries[arm.label] for arm in arms}
    compared = summarize_pairs(
        [(by_label[r], by_label[c], summaries[r], summaries[c]) for r, c in pairs]
    )
    names = assign_families([(summaries[r], summaries[c]) for r, c in pairs], families)
    adjusted: dict[int, float | NotAvailable] = {}
    adjusted_change: dict[int, float | NotAvailable] = {}
    for family in dict.fromkeys(names):
        members = [i for i, name in enumerate(names) if name == family]
        for i, p in zip(members, stats.holm([compared[i].mcnemar_p for i in members]), strict=True):
            adjusted[i] = p
        changes = stats.holm([compared[i].change_p for i in members])
        for i, p in zip(members, changes, strict=True):
            adjusted_change[i] = p
    compared = [
        replace(
            p,
            family=names[i],
            mcnemar_p_holm=adjusted[i],
            change_p_holm=adjusted_change[i],
        )
        for i, p in enumerate(compared)
    ]
    used = dict.fromkeys(names)
    if families is None:
        described = {name: BUILT_IN_FAMILIES[name] for name in used}
    else:
        described = {
            name: ", ".join(families.get(name, ())) or "pairs no family's pattern matched"
            for name in used
        }
    notes = []
    for summary in summaries.values():
        if summary.nl_unjudged:
            notes.append(
                f"{summary.label}: {summary.nl_unjudged} episode(s) with natural-language "
                "assertions scored without a judge are counted apart (not in success rates)."
            )
        if summary.no_reward:
            notes.append(
                f"{summary.label}: {summary.no_reward} episode(s) carry no reward "
                "(counted as failures)."
            )
        if summary.max_errors is not None and summary.max_errors < max(BUDGETS):
            notes.append(
                f"{summary.label}: the run's budget was K={summary.max_errors}; success@K' "
                f"past it is n/a (episodes were stopped at {summary.max_errors} errors)."
            )
    for label in dict.fromkeys(label for pair in pairs for label in pair):
        _, repeated = keyed_by_trial(scored_episodes(by_label[label]))
        if repeated:
            notes.append(
                f"{label}: {repeated} repeated (task, trial) episode(s); pairing used the first "
                "of each and left the rest out."
            )
    return Summary(summaries, compared, notes, described)
