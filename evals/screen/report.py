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
    """Grouped bars: each channel's rate per arm with its Wilson interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = list(screen["arms"])
    width = 0.8 / max(1, len(arms))
    figure, axis = plt.subplots(figsize=(9, 4))
    for position, arm in enumerate(arms):
        rates = [screen["arms"][arm]["channels"][ch]["rate"] for ch in CHANNELS]
        estimates = [r.get("estimate", 0.0) for r in rates]
        errors = [
            [r.get("estimate", 0.0) - r.get("low", 0.0) for r in rates],
            [r.get("high", 0.0) - r.get("estimate", 0.0) for r in rates],
        ]
        offsets = [i + (position - (len(arms) - 1) / 2) * width for i in range(len(CHANNELS))]
        axis.bar(offsets, estimates, width, yerr=errors, capsize=3, label=arm)
    axis.set_xticks(range(len(CHANNELS)), CHANNELS, rotation=20)
    axis.set_ylabel("share of decision points")
    axis.set_ylim(0, 1)
    axis.set_title(f"Risk screen: {screen['points']} decision points")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(figure)
