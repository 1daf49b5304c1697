"""The documentation pages that the code defines, written from the code: the configuration
reference (``repairproxy.settings``), the metric names (``repairproxy.observe.metrics`` and every
other metric the package registers), the study's definitions (``evals.analysis.definitions``), the
performance page (the latest figure each benchmark recorded under ``benchmarks/results/``) and the
index of the data runs under ``studies/``.

The pages are committed under ``docs/`` (so they read on the forge too) and
``tests/test_docs.py`` checks that they are what this module writes today;
``scripts/docs_hooks.py`` writes them afresh into every MkDocs build, so the site is never stale.
Neither runs a benchmark: the performance page reads what the benchmarks last wrote.

    python scripts/docs_pages.py          # rewrite the committed pages in docs/
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import enum
import json
import re
import sys
import typing
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere: the checkout's packages
    sys.path.insert(0, str(ROOT))

__all__ = ["PAGES", "generated_pages", "repository_url", "serve_flags"]

# Wide tables: the reference pages give the table of contents' column to the table.
WIDE = "---\nhide:\n  - toc\n---\n\n"
GENERATED_NOTE = (
    "<!-- Written by scripts/docs_pages.py from the code (python scripts/docs_pages.py); "
    "edit the code it reads, not this page. -->\n\n"
)


def repository_url() -> str:
    """``repo_url`` of mkdocs.yml: where links to source files point."""
    for line in (ROOT / "mkdocs.yml").read_text().splitlines():
        if line.startswith("repo_url:"):
            return line.split(":", 1)[1].strip().rstrip("/")
    raise RuntimeError("mkdocs.yml has no repo_url")


def source_link(path: str) -> str:
    return f"[`{path}`]({repository_url()}/blob/main/{path})"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# ---------------------------------------------------------------------------------------------
# Configuration


@dataclasses.dataclass(frozen=True)
class Flag:
    """One ``repairproxy serve`` flag as argparse declares it from ``Settings``."""

    flag: str
    env: str
    field: str
    kind: str
    default: str
    help: str


def _default_text(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, tuple):
        return ",".join(str(v.value if isinstance(v, enum.Enum) else v) for v in value) or "—"
    if isinstance(value, int) and value >= 1024 * 1024 and value % (1024 * 1024) == 0:
        return f"{value} ({value // (1024 * 1024)} MiB)"
    if isinstance(value, int) and value >= 1024 and value % 1024 == 0:
        return f"{value} ({value // 1024} KiB)"
    return str(value)


def _kind_text(hint: Any) -> str:
    text = str(hint).replace("typing.", "")
    text = re.sub(r"<class '([\w.]+)'>", r"\1", text)
    return re.sub(r"\b[\w.]+\.(\w+)", r"\1", text)


def serve_flags() -> list[Flag]:
    """Every flag of ``repairproxy serve``, read from the parser built from ``Settings``."""
    from repairproxy.settings import Settings, add_serve_arguments

    parser = argparse.ArgumentParser(add_help=False)
    add_serve_arguments(parser, {})
    fields = {f.name: f for f in dataclasses.fields(Settings)}
    hints = typing.get_type_hints(Settings)
    defaults = Settings()
    flags = []
    for action in parser._actions:
        if not action.option_strings or action.dest not in fields:
            continue
        flag = max(action.option_strings, key=len)
        env = "REPAIRPROXY_" + flag.lstrip("-").upper().replace("-", "_")
        flags.append(
            Flag(
                flag=flag,
                env=env,
                field=action.dest,
                kind="switch" if action.nargs == 0 else _kind_text(hints[action.dest]),
                default=_default_text(getattr(defaults, action.dest)),
                help=action.help or "",
            )
        )
    return flags


def configuration_page() -> str:
    flags = serve_flags()
    lines = [
        WIDE + "# Configuration reference",
        "",
        GENERATED_NOTE.rstrip(),
        "",
        f"Every setting of `repairproxy serve`, {len(flags)} in all, as declared once in "
        f"{source_link('repairproxy/settings.py')} (flag, environment variable, type, default, "
        "help). Each flag has an environment-variable twin: `--upstream-timeout` is "
        "`REPAIRPROXY_UPSTREAM_TIMEOUT`. A flag given on the command line wins over its "
        "variable; a switch's variable takes `1`, `true`, `yes` or `on`. `--api-key` repeats; "
        "its variable takes a comma-separated list.",
        "",
        "| flag | environment variable | type | default | what |",
        "| --- | --- | --- | --- | --- |",
    ]
    for f in flags:
        lines.append(
            f"| `{f.flag}` | `{f.env}` | {_cell(f.kind)} | {_cell(f.default)} | {_cell(f.help)} |"
        )
    lines += [
        "",
        "Per-request headers that override a setting for one request: `X-Repairproxy-Repair` "
        "(a repair mode), `X-Repairproxy-Budget` (lowers `--budget`; raising it needs "
        "`--allow-client-budget`) and the episode header (`--episode-header`, default "
        "`X-Episode-ID`).",
        "",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Metrics


@dataclasses.dataclass(frozen=True)
class Metric:
    name: str
    kind: str
    labels: tuple[str, ...]
    doc: str
    where: str


def _registry_metrics() -> list[Metric]:
    from repairproxy.observe.metrics import Metrics
    from repairproxy.settings import Settings

    registry = Metrics(Settings()).registry
    found = []
    for collector in list(registry._collector_to_names):
        name = getattr(collector, "_name", None)
        if not name:
            continue
        kind = str(getattr(collector, "_type", ""))
        exposed = f"{name}_total" if kind == "counter" else name
        found.append(
            Metric(
                name=exposed,
                kind=kind,
                labels=tuple(getattr(collector, "_labelnames", ())),
                doc=str(getattr(collector, "_documentation", "")),
                where="repairproxy/observe/metrics.py",
            )
        )
    return found


_KINDS = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram", "Summary": "summary"}


def _source_metrics() -> list[Metric]:
    """Metrics registered elsewhere in the package: ``Counter("repairproxy_x", doc, labels)``."""
    found = []
    for path in sorted((ROOT / "repairproxy").rglob("*.py")):
        if path.name == "metrics.py" and path.parent.name == "observe":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if name not in _KINDS:
                continue
            first = node.args[0]
            if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
                continue
            if not first.value.startswith("repairproxy_"):
                continue
            doc = node.args[1] if len(node.args) > 1 else None
            labels = node.args[2] if len(node.args) > 2 else None
            kind = _KINDS[name]
            found.append(
                Metric(
                    name=first.value + ("_total" if kind == "counter" else ""),
                    kind=kind,
                    labels=tuple(ast.literal_eval(labels)) if labels is not None else (),
                    doc=ast.literal_eval(doc) if doc is not None else "",
                    where=str(path.relative_to(ROOT)),
                )
            )
    return found


def metrics() -> list[Metric]:
    """Every metric the proxy can expose, by name."""
    seen: dict[str, Metric] = {}
    for metric in [*_registry_metrics(), *_source_metrics()]:
        seen.setdefault(metric.name, metric)
    return sorted(seen.values(), key=lambda m: m.name)


def metrics_page() -> str:
    found = metrics()
    lines = [
        WIDE + "# Metric reference",
        "",
        GENERATED_NOTE.rstrip(),
        "",
        f"Every Prometheus metric the proxy can expose, {len(found)} in all, read from the "
        "registry the proxy builds and from every other metric the package registers. Counters "
        "carry `_total`; histograms add `_bucket`, `_sum` and `_count`. Label values are "
        "bounded (see [metrics and dashboards](../metrics.md)). Some exist only with a setting: "
        "`repairproxy_store_errors_total` with a Redis episode store, "
        "`repairproxy_episode_evictions_total` with the in-process one, "
        "`repairproxy_tool_name_margin` is observed only with `--margin-probe`.",
        "",
        "| metric | type | labels | what | declared in |",
        "| --- | --- | --- | --- | --- |",
    ]
    for m in found:
        labels = ", ".join(f"`{label}`" for label in m.labels) or "—"
        lines.append(
            f"| `{m.name}` | {m.kind} | {labels} | {_cell(m.doc)} | {source_link(m.where)} |"
        )
    lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The study's definitions


def definitions_page() -> str:
    from evals.analysis.definitions import definitions_markdown

    lines = [
        "# Definitions",
        "",
        GENERATED_NOTE.rstrip(),
        "",
        "What the study's words mean, written once in "
        f"{source_link('evals/analysis/definitions.py')}: the report prints the same text and "
        "every count the analysis, the screen and the demo's transcript make follows it.",
        "",
    ]
    lines += [definitions_markdown(), ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Performance: one current table per benchmark, from benchmarks/results/


def _question(path: Path) -> str:
    """The benchmark's ``QUESTION`` (what its --help prints), else its docstring's first lines."""
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "QUESTION" for t in node.targets
        ):
            value = ast.literal_eval(node.value)
            if isinstance(value, str):
                return value
    doc = ast.get_docstring(tree) or ""
    first = " ".join(doc.split("\n\n")[0].split())
    return first.replace("``", "`")


def _value(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(_value(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return _cell(value if isinstance(value, str) else json.dumps(value))


def _flat(prefix: str, value: Any) -> dict[str, Any]:
    """Nested figures as dotted keys: ``{"memory": {"cases": 200}}`` -> ``memory.cases``."""
    if not isinstance(value, dict):
        return {prefix: value}
    out: dict[str, Any] = {}
    for key, inner in value.items():
        out.update(_flat(f"{prefix}.{key}" if prefix else str(key), inner))
    return out


def _figures_table(figures: Any) -> list[str]:
    """Rows of like dicts (variants, stores, arms) as one wide table; the rest as figure/value."""
    if isinstance(figures, list) and all(isinstance(r, dict) for r in figures):
        rows = {str(i + 1): _flat("", r) for i, r in enumerate(figures)}
        scalars: dict[str, Any] = {}
    elif isinstance(figures, dict):
        rows = {k: _flat("", v) for k, v in figures.items() if isinstance(v, dict)}
        scalars = {k: v for k, v in figures.items() if not isinstance(v, dict)}
        if len(rows) < 2:  # nothing to lay side by side
            scalars, rows = _flat("", figures), {}
    else:
        return [f"Figure: {_value(figures)}", ""]
    lines: list[str] = []
    if scalars:
        lines += ["| figure | value |", "| --- | --- |"]
        lines += [f"| {_cell(k)} | {_value(v)} |" for k, v in scalars.items()]
        lines.append("")
    if rows:
        keys: list[str] = []
        for row in rows.values():
            keys += [k for k in row if k not in keys]
        lines.append("| | " + " | ".join(_cell(k) for k in keys) + " |")
        lines.append("| --- | " + " | ".join("---" for _ in keys) + " |")
        for label, row in rows.items():
            cells = [_value(row[k]) if k in row else "" for k in keys]
            lines.append(f"| **{_cell(label)}** | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


# A recorded figure keeps the paths of the machine that measured it; the page shows them as any
# checkout has them, so every checkout writes the same page and no reader sees another's folders:
# a path into a checkout from its top folder on (`/srv/x/.venv/bin/python` -> `.venv/bin/python`;
# the checkout's own folder may bear a top folder's name, as in `/srv/repairproxy/.venv`), then a
# home folder as `~` (`/root/.cache/x` -> `~/.cache/x`: a path through a hidden folder such as a
# cache is no checkout). URLs are left alone.
_CHECKOUT_TOPS = r"\.venv|benchmarks|docs|evals|repairproxy|scripts|studies|tests"
_INTO_CHECKOUT = re.compile(
    rf"(?<![\w.~/:-])/(?:[\w@+-][\w.@+-]*/)*?(?=(?:{_CHECKOUT_TOPS})/(?!(?:{_CHECKOUT_TOPS})/))"
)
_HOME = re.compile(r"(?<![\w.~/:-])(?:/root|/home/[\w.-]+)(?=/)")


def _portable(text: str) -> str:
    """``text`` with absolute checkout paths made relative and home folders written ``~``."""
    return _HOME.sub("~", _INTO_CHECKOUT.sub("", text))


def _json_figure(record: dict[str, Any]) -> list[str]:
    lines = [
        f"Measured {record.get('measured_at', 'at an unrecorded time')} at commit "
        f"`{record.get('commit', 'unknown')}` with `{record.get('command', '?')}`.",
        "",
    ]
    machine = record.get("machine") or {}
    if machine:
        described = ", ".join(f"{k} {v}" for k, v in machine.items() if v is not None)
        lines += [f"Machine: {described}.", ""]
    return lines + _figures_table(record.get("figures") or {})


def _text_figure(text: str) -> list[str]:
    lines = text.rstrip("\n").splitlines()
    command = ""
    if lines and lines[0].startswith("$ "):
        command = lines[0][2:]
        lines = lines[2:] if len(lines) > 1 and not lines[1].strip() else lines[1:]
    method = f"As printed by `{command}`." if command else "As printed (no command recorded)."
    head = [method + " Machine: not recorded (a text figure records only its command).", ""]
    return [*head, "```text", *lines, "```", ""]


def _slug(heading: str) -> str:
    """The anchor Python-Markdown's toc extension gives a heading (its default slugify)."""
    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _archived(name: str) -> tuple[str, str] | None:
    """The latest dated archive entry that ran ``benchmarks.<name>``: (heading, anchor)."""
    archive = ROOT / "docs" / "measurements.md"
    if not archive.is_file():
        return None
    sections = re.split(r"^## ", archive.read_text(), flags=re.M)[1:]
    mention = re.compile(rf"\bbenchmarks\.{re.escape(name)}\b")
    found = [s.splitlines()[0] for s in sections if mention.search(s)]
    if not found:
        return None
    latest = max(found, key=lambda heading: heading[:10])  # headings start with the date
    return latest, _slug(latest)


def performance_page(results: Path | None = None) -> str:
    results = results or ROOT / "benchmarks" / "results"
    modules = sorted(p for p in (ROOT / "benchmarks").glob("*.py") if p.name != "__init__.py")
    lines = [
        "# Performance",
        "",
        GENERATED_NOTE.rstrip(),
        "",
        "One section per benchmark: the question it answers (its `QUESTION`, which its `--help` "
        "prints) and the "
        "latest figure it recorded in `benchmarks/results/` (written by "
        f"{source_link('benchmarks/support/results.py')} when the benchmark runs as a command, "
        "with its command, time, commit and machine). The documentation build only reads those "
        "files; it never runs a benchmark. Figures from before the benchmarks recorded their "
        "results, with the method of each, are in the [measurements archive](measurements.md). "
        "A path the measuring machine printed is shown as a checkout has it: relative to the "
        "checkout (`.venv/bin/python`), or under the home folder (`~/.cache/...`).",
        "",
    ]
    recorded = 0
    for module in modules:
        name = module.stem
        lines += [f"## `{name}`", "", _question(module), ""]
        as_json, as_text = results / f"{name}.json", results / f"{name}.txt"
        if as_json.is_file():
            recorded += 1
            lines += _json_figure(json.loads(_portable(as_json.read_text())))
            if as_text.is_file():
                printed = _text_figure(_portable(as_text.read_text()))
                lines += ['??? note "As printed"', ""] + [f"    {t}" if t else "" for t in printed]
        elif as_text.is_file():
            recorded += 1
            lines += _text_figure(_portable(as_text.read_text()))
        else:
            lines += [
                f"No figure recorded yet: `python -m benchmarks.{name}` writes one "
                f"(`benchmarks/results/{name}.txt`).",
                "",
            ]
        archived = _archived(name)
        if archived is not None:
            heading, anchor = archived
            lines += [
                f"Its latest figure in the archive: [{heading}](measurements.md#{anchor}).",
                "",
            ]
    lines.insert(4, f"{recorded} of {len(modules)} benchmarks have a recorded figure.\n")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The data runs under studies/


def studies_page() -> str:
    base = repository_url() + "/tree/main/studies"
    lines = [
        "# Data runs",
        "",
        GENERATED_NOTE.rstrip(),
        "",
        "Each study run is kept, with its raw results and its README, under "
        f"[`studies/`]({base}) in the repository (the reports re-derive from the files there, "
        "with no model):",
        "",
    ]
    for readme in sorted((ROOT / "studies").glob("*/README.md")):
        folder = readme.parent.name
        text = readme.read_text().splitlines()
        title = next((t.lstrip("# ").strip() for t in text if t.startswith("# ")), folder)
        lines.append(f"- [`studies/{folder}/`]({base}/{folder}): {title}")
    lines.append("")
    return "\n".join(lines)


# The generated pages: path inside docs/ -> the function that writes it.
PAGES: dict[str, Callable[[], str]] = {
    "reference/configuration.md": configuration_page,
    "reference/metrics.md": metrics_page,
    "reference/definitions.md": definitions_page,
    "performance.md": performance_page,
    "studies.md": studies_page,
}


def generated_pages() -> dict[str, str]:
    return {path: write() for path, write in PAGES.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="default: docs/")
    args = parser.parse_args(argv)
    for path, text in generated_pages().items():
        target = args.out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
