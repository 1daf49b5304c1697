"""``screen.json`` as a short markdown report and one plot (channel rates per arm, 95% CIs)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from evals.screen.judge import CHANNELS, THIN_MARGIN_NATS

__all__ = ["render_markdown", "render_plot"]


def _pct(stat: Any) -> str:
    if not isinstance(stat, dict) or "estimate" not in stat:
        return "n/a"
    return f"{100 * stat['estimate']:.1f}% [{100 * stat['low']:.1f}, {100 * stat['high']:.1f}]"


def _ratio(stat: Any) -> str:
    if not isinstance(stat, dict) or "estimate" not in stat:
        reason = stat.get("not_available", "") if isinstance(stat, dict) else ""
        return f"n/a ({reason})" if reason else "n/a"
    return f"{stat['estimate']:.2f} [{stat['low']:.2f}, {stat['high']:.2f}]"


def _plain(stat: Any) -> str:
    if isinstance(stat, dict):
        return f"n/a ({stat.get('not_available', '')})"
    return f"{stat:.2f}"


def _comparison_table(rows: Iterable[tuple[str, dict[str, Any]]]) -> list[str]:
    lines = [
        "| arm | paired | "
        + " | ".join(CHANNELS[1:])
        + " | Spearman invented | novel names | flagged |",
        "|---|---|" + "---|" * (len(CHANNELS) + 2),
    ]
    for arm, comparison in rows:
        novel = comparison["novel_names"]
        novel_text = (
            f"{novel['novel']}/{novel['total']}"
            if "novel" in novel
            else f"n/a ({novel['not_available']})"
        )
        cells = [_ratio(comparison["channels"][ch]["ratio"]) for ch in CHANNELS[1:]]
        lines.append(
            f"| `{arm}` | {comparison['paired_n']} | "
            + " | ".join(cells)
            + f" | {_plain(comparison['spearman_invented'])} | {novel_text}"
            + f" | {', '.join(comparison['flagged']) or 'no'} |"
        )
    return lines


def _margin_table(arms: dict[str, Any]) -> list[str]:
    """Do thin margins go with the errors: the margin where answers erred and where they did not."""
    if not any(summary["margin"]["n"] for summary in arms.values()):
        return []
    lines = [
        "",
        f"## Tool-name margins, answers with an error vs without (nats; thin < {THIN_MARGIN_NATS})",
        "",
        "| arm | error: n | median | thin | no error: n | median | thin |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm, summary in arms.items():
        cells = []
        for outcome in ("error", "no_error"):
            margin = summary.get("margin_by_outcome", {}).get(outcome, {"n": 0})
            if margin["n"]:
                cells += [str(margin["n"]), f"{margin['median']:.2f}", _pct(margin["thin"]["rate"])]
            else:
                cells += ["0", "n/a", "n/a"]
        lines.append(f"| `{arm}` | " + " | ".join(cells) + " |")
    return lines


def render_markdown(screen: dict[str, Any]) -> str:
    config = screen["config"]
    lines = [
        "# Risk screen",
        "",
        f"{screen['points']} decision points from τ²-bench's gold replay "
        f"({', '.join(config['domains'])}, seed {config['seed']}); reference arm "
        f"`{screen['reference']}`. Answers judged with the proxy's validation, repair off.",
        "",
        "## Channels per arm (answers with at least one call in the channel; 95% Wilson)",
        "",
        "| arm | n | "
        + " | ".join(CHANNELS)
        + " | text only | gold tool | gold call | thin margin |",
        "|---|---|" + "---|" * (len(CHANNELS) + 4),
    ]
    for arm, summary in screen["arms"].items():
        cells = [_pct(summary["channels"][ch]["rate"]) for ch in CHANNELS]
        margin = summary["margin"]
        thin = (
            f"{_pct(margin['thin']['rate'])} of {margin['n']}"
            if margin["n"]
            else "n/a (no logprobs)"
        )
        lines.append(
            f"| `{arm}` | {summary['n']} | "
            + " | ".join(cells)
            + f" | {_pct(summary['text_only']['rate'])}"
            + f" | {_pct(summary['next_action']['gold_tool']['rate'])}"
            + f" | {_pct(summary['next_action']['gold_call']['rate'])} | {thin} |"
        )
    lines += ["", f"## Against `{screen['reference']}` (paired rate ratios, 95%)", ""]
    if not screen["comparisons"]:
        lines.append("Only the reference arm was screened.")
    else:
        lines += _comparison_table(screen["comparisons"].items())
    for pair in screen.get("pairs", []):
        lines += [
            "",
            f"## `{pair['arm']}` against its own reference `{pair['reference']}` "
            "(paired rate ratios, 95%)",
            "",
            *_comparison_table([(pair["arm"], pair)]),
        ]
    lines += _margin_table(screen["arms"])
    lines += [
        "",
        "Arms: "
        + "; ".join(f"`{arm['name']}` = {arm['spec']}" for arm in config.get("arms", []))
        + ".",
    ]
    seconds = "; ".join(f"`{a}` {s['answer_seconds']:.0f} s" for a, s in screen["arms"].items())
    lines.append(f"Time answering (sum over points): {seconds}.")
    lines += ["", f"Rule: {screen['rule']['flag']}."]
    flagged = screen["flagged"]
    lines.append(
        "Flagged: "
        + ("; ".join(f"`{arm}` ({', '.join(chs)})" for arm, chs in flagged.items()) or "none")
        + "."
    )
    lines += ["", "![channel rates](screen.png)", ""]
    return "\n".join(lines)


def render_plot(screen: dict[str, Any], path: Path) -> None:
    """What the screen decides, drawn: left, each error channel's rate per arm with its Wilson
    interval and n (the reference arm named); right, each compared arm's paired rate ratio
    against the reference per channel with its 95% interval, on a log scale, and the flag line
    (a channel is flagged when the interval's lower end is above it); n/a is written, not drawn
    as 0. The novel-name share of each compared arm is printed with its Wilson interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from evals.analysis.stats import Interval, wilson

    reference = screen["reference"]
    flag = float(screen["rule"]["flag_ratio"])
    errors = [ch for ch in CHANNELS if ch != "valid"]
    arms = list(screen["arms"])
    compared = [arm for arm in screen.get("comparisons", {}) if arm != reference]
    figure, (rates_axis, ratio_axis) = plt.subplots(1, 2, figsize=(10, 4.4))
    width = 0.8 / max(1, len(arms))
    for position, arm in enumerate(arms):
        rates = [screen["arms"][arm]["channels"][ch]["rate"] for ch in errors]
        estimates = [r.get("estimate", 0.0) for r in rates]
        spread = [
            [r.get("estimate", 0.0) - r.get("low", 0.0) for r in rates],
            [r.get("high", 0.0) - r.get("estimate", 0.0) for r in rates],
        ]
        offsets = [i + (position - (len(arms) - 1) / 2) * width for i in range(len(errors))]
        label = f"{arm} (reference)" if arm == reference else arm
        rates_axis.bar(offsets, estimates, width, yerr=spread, capsize=2, label=label)
    rates_axis.set_xticks(range(len(errors)), [c.replace("_", " ") for c in errors], rotation=20)
    rates_axis.tick_params(labelsize=7)
    rates_axis.set_ylabel("share of decision points", fontsize=8)
    rates_axis.set_ylim(0, 1)
    rates_axis.set_title(f"Rates, n = {screen['points']} decision points per arm", fontsize=9)
    rates_axis.legend(fontsize=7)
    ratio_axis.axhline(flag, color="tab:red", linestyle="--", linewidth=1)
    ratio_axis.axhline(1.0, color="grey", linewidth=0.8)
    ratio_axis.text(
        len(errors) - 0.5,
        flag,
        f" flag: lower end > {flag:g}",
        fontsize=7,
        color="tab:red",
        va="bottom",
        ha="right",
    )
    ratio_width = 0.8 / max(1, len(compared))
    notes = []
    for position, arm in enumerate(compared):
        comparison = screen["comparisons"][arm]
        colour = f"C{arms.index(arm) if arm in arms else position}"
        for i, channel in enumerate(errors):
            ratio = comparison["channels"][channel]["ratio"]
            x = i + (position - (len(compared) - 1) / 2) * ratio_width
            if "estimate" not in ratio:
                ratio_axis.text(
                    x, 1.0, "n/a", fontsize=6, ha="center", va="bottom", rotation=90, color=colour
                )
                continue
            ratio_axis.errorbar(
                [x],
                [ratio["estimate"]],
                yerr=[[ratio["estimate"] - ratio["low"]], [ratio["high"] - ratio["estimate"]]],
                fmt="o",
                color=colour,
                markersize=3,
                capsize=2,
            )
        novel = comparison.get("novel_names", {})
        if "novel" in novel and novel.get("total"):
            share = wilson(int(novel["novel"]), int(novel["total"]))
            text = f"{novel['novel']}/{novel['total']}"
            if isinstance(share, Interval):
                low, high = 100 * share.low, 100 * share.high
                text += f" = {100 * share.estimate:.0f}% [{low:.0f}, {high:.0f}]"
            notes.append(f"{arm}: novel names {text}")
        else:
            notes.append(f"{arm}: novel names n/a")
        ratio_axis.plot(
            [], [], "o", color=colour, label=f"{arm} (n = {comparison['paired_n']} pairs)"
        )
    ratio_axis.set_yscale("log")
    ratio_axis.set_xticks(range(len(errors)), [c.replace("_", " ") for c in errors], rotation=20)
    ratio_axis.tick_params(labelsize=7)
    ratio_axis.set_xlim(-0.6, len(errors) - 0.4)
    ratio_axis.set_ylabel(f"paired rate ratio against {reference} (95%)", fontsize=8)
    ratio_axis.set_title("What the screen decides", fontsize=9)
    if compared:
        ratio_axis.legend(fontsize=7, loc="upper left")
    figure.text(0.01, 0.01, "; ".join(notes) + " (Wilson 95%)", fontsize=7)
    figure.tight_layout(rect=(0, 0.05, 1, 1))
    figure.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(figure)
