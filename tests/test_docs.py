"""The documentation against the code: the pages written from the code are current, every flag,
environment variable, make target and metric name the README and the docs write exists, the
framework table is in the matrix writer's format, and user docs carry no development-machine
wording. (Dotted module paths: ``tests/test_imports.py::test_every_written_module_path_imports``,
which reads the same pages.)"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import docs_hooks  # noqa: E402
import docs_pages  # noqa: E402


def _user_docs() -> dict[str, str]:
    """README and every page of docs/, with the blocks marked as pending a merge left out (a
    feature another branch brings: checked once the marker is removed)."""
    pages = {"README.md": (ROOT / "README.md").read_text()}
    for path in sorted((ROOT / "docs").rglob("*.md")):
        pages[str(path.relative_to(ROOT))] = path.read_text()
    return {name: _without_pending(text) for name, text in pages.items()}


_PENDING = re.compile(r'^!!! \w+ "Pending merge[^\n]*\n(?:(?:    [^\n]*|)\n)*', re.M)


def _without_pending(text: str) -> str:
    return _PENDING.sub("", text)


def test_pending_blocks_are_left_out_and_nothing_else() -> None:
    text = 'a\n\n!!! note "Pending merge (issue 56)"\n    `make vllm`\n\n    more\nb `make x`\n'
    assert _without_pending(text) == "a\n\nb `make x`\n"


# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("page", sorted(docs_pages.PAGES))
def test_the_pages_written_from_the_code_are_current(page: str) -> None:
    committed = ROOT / "docs" / page
    assert committed.is_file(), f"{committed} missing: python scripts/docs_pages.py"
    assert committed.read_text() == docs_pages.PAGES[page](), (
        f"docs/{page} is stale: python scripts/docs_pages.py"
    )


def test_the_configuration_reference_names_every_setting() -> None:
    import dataclasses

    from repairproxy.settings import Settings

    page = (ROOT / "docs" / "reference" / "configuration.md").read_text()
    fields = {f.name for f in dataclasses.fields(Settings)}
    flags = {f.field: f for f in docs_pages.serve_flags()}
    assert set(flags) == fields, f"settings without a flag: {sorted(fields - set(flags))}"
    for flag in flags.values():
        assert f"| `{flag.flag}` | `{flag.env}` |" in page


def test_the_metric_reference_names_what_a_scrape_shows() -> None:
    """Every family a live registry exposes is on the page (the source scan adds the rest)."""
    from repairproxy.observe.metrics import Metrics
    from repairproxy.settings import Settings

    metrics = Metrics(Settings())
    exposed = {family.name for family in metrics.registry.collect() if family.name}
    names = {m.name for m in docs_pages.metrics()}
    for family in exposed:
        assert family in names or f"{family}_total" in names, family
    assert "repairproxy_store_errors_total" in names  # registered in app.py, not metrics.py


# ---------------------------------------------------------------------------------------------
# Flags, environment variables, make targets, metric names written in the docs


@functools.cache
def _serve_flags() -> frozenset[str]:
    return frozenset(f.flag for f in docs_pages.serve_flags()) | {"--help"}


def _help(*argv: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", *argv, "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    return done.stdout


@functools.cache
def _module_flags(module: str) -> frozenset[str]:
    """The flags ``python -m MODULE [SUBCOMMAND] --help`` prints (none when it cannot run)."""
    text = _help(module)
    choices = re.search(r"\{([a-z][\w,-]*)\}", text)
    for sub in choices.group(1).split(",") if choices else ():
        text += _help(module, sub)
    return frozenset(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text))


_FLAG = re.compile(r"(?<![\w/=.-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*(?![\w-])")
_MODULE = re.compile(r"python -m ((?:repairproxy|evals|benchmarks|tests)(?:\.\w+)*)")
_SERVE = re.compile(r"repairproxy serve\b")


def _commands(text: str) -> list[str]:
    """Shell lines of the fenced bash blocks, continuation lines joined."""
    found = []
    for block in re.findall(r"```(?:bash|sh|shell)\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            found.append(line.split(" #")[0])
    return found


def test_every_flag_on_a_serve_command_is_a_setting() -> None:
    wrong = []
    checked = 0
    for name, text in _user_docs().items():
        for line in _commands(text):
            for serve in _SERVE.finditer(line):
                rest = re.split(r"&&|;|\|", line[serve.end() :])[0]
                for flag in _FLAG.findall(rest):
                    checked += 1
                    if flag not in _serve_flags():
                        wrong.append(f"{name}: {flag} in {line.strip()!r}")
    assert checked > 10
    assert not wrong, "flags that `repairproxy serve` does not have:\n" + "\n".join(wrong)


# Flags of other programs the pages name (mkdocs and kubernetes-validate, CPython's configure).
_OTHER_PROGRAMS = frozenset({"--strict", "--enable-optimizations", "--with-lto", "--dev-addr"})
# History: the archive keeps the commands as they were run then, flags since renamed included.
_HISTORY = frozenset({"docs/measurements.md"})


def _vllm_server_flags() -> set[str]:
    """The flags of the vLLM server command the CPU launcher writes (``server_command``)."""
    from repairproxy.local.vllm_cpu import server_command

    return {word for word in server_command("python", "model", "host", 1) if word.startswith("--")}


def test_every_flag_in_prose_is_a_setting_or_its_commands() -> None:
    """A flag written on a page is a ``repairproxy serve`` setting, or a flag of a command the
    same page runs (``python -m evals.screen ... --points``: that module's --help)."""
    wrong = []
    for name, text in _user_docs().items():
        if name in _HISTORY:
            continue
        # Printed output, not commands: a text fence ends at a fence of its own length, alone
        # on its line (an answer quoted inside it may hold ``` of its own).
        text = re.sub(r"^(`{3,})text\n.*?^\1[ \t]*$", "", text, flags=re.S | re.M)
        flags = set(_FLAG.findall(text)) - _serve_flags() - _OTHER_PROGRAMS
        if not flags:
            continue
        modules = set(_MODULE.findall(text))
        allowed: set[str] = set()
        if "vllm.entrypoints.openai.api_server" in text:  # a recorded vLLM server command
            allowed |= _vllm_server_flags()
        for module in sorted(modules):
            allowed |= _module_flags(module)
        for flag in sorted(flags - allowed):
            wrong.append(f"{name}: {flag} (commands on the page: {sorted(modules) or 'none'})")
    assert not wrong, "flags that neither Settings nor the page's commands have:\n" + (
        "\n".join(wrong)
    )


def _environment_read_by_code() -> set[str]:
    """``REPAIRPROXY_*`` names the repository's code reads besides the settings (test and
    benchmark switches such as ``REPAIRPROXY_FW_VENVS``)."""
    found: set[str] = set()
    for top in ("repairproxy", "evals", "benchmarks", "tests"):
        for path in (ROOT / top).rglob("*.py"):
            found.update(re.findall(r"[\"'](REPAIRPROXY_[A-Z0-9_]+)[\"']", path.read_text()))
    return found


def test_every_written_environment_variable_is_a_setting() -> None:
    known = {f.env for f in docs_pages.serve_flags()} | _environment_read_by_code()
    sources = dict(_user_docs())
    for folder in ("docker",):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file():
                sources[str(path.relative_to(ROOT))] = path.read_text(errors="replace")
    wrong = [
        f"{name}: {env}"
        for name, text in sources.items()
        for env in sorted(set(re.findall(r"\bREPAIRPROXY_[A-Z0-9_]*[A-Z0-9]\b", text)))
        if env not in known and name not in _HISTORY
    ]
    assert not wrong, wrong


@functools.cache
def _make_targets() -> frozenset[str]:
    targets: set[str] = set()
    for line in (ROOT / "Makefile").read_text().splitlines():
        rule = re.match(r"^([A-Za-z][\w%.-]*(?:[ \t]+[A-Za-z][\w%.-]*)*)[ \t]*:(?![=:])", line)
        if rule and not line.startswith(("export", "ifeq", "ifneq")):
            targets.update(t for t in rule.group(1).split() if "%" not in t)
    return frozenset(targets)


def test_every_written_make_target_exists() -> None:
    wrong = []
    checked = 0
    for name, text in _user_docs().items():
        written = re.findall(r"`make ([a-z][a-z0-9-]*)", text)
        for line in _commands(text):
            written += re.findall(r"(?:^|&&|;)\s*make ([a-z][a-z0-9-]*)", line)
        for target in written:
            checked += 1
            if target not in _make_targets():
                wrong.append(f"{name}: make {target}")
    assert {"demo", "test", "docs", "serve"} <= _make_targets()
    assert checked > 10
    assert not wrong, "make targets the Makefile does not have: " + ", ".join(wrong)


def test_every_written_metric_name_exists() -> None:
    names = {m.name for m in docs_pages.metrics()}
    suffixes = ("_bucket", "_sum", "_count", "_created")
    wrong = []
    for name, text in _user_docs().items():
        for metric in sorted(set(re.findall(r"\brepairproxy_[a-z0-9_]*[a-z0-9]", text))):
            base = next((metric[: -len(s)] for s in suffixes if metric.endswith(s)), metric)
            if metric not in names and base not in names:
                wrong.append(f"{name}: {metric}")
    assert not wrong, wrong


# ---------------------------------------------------------------------------------------------
# Wording

# What a reader of the user docs cannot act on: the development machine, its speed markers,
# hour-by-hour windows, the sibling data folder of the development checkout, the CI entry,
# the absolute paths of a checkout or a home folder (write them relative, or with `~`).
_DEVELOPMENT_WORDING = {
    "this machine / this VM": re.compile(r"\bthis (?:\d+-core )?(?:machine|VM|box|host)\b", re.I),
    "the 2-core machine": re.compile(r"\b\d+-core machine\b", re.I),
    "development VMs": re.compile(r"\bdevelopment (?:VM|machine)s?\b", re.I),
    "sum(range(…)) speed marker": re.compile(r"sum\(range\("),
    "a dated UTC window": re.compile(r"\d{1,2}:\d{2}\s*[-–]\s*\d{1,2}:\d{2}\s*UTC"),
    "the sibling data folder": re.compile(r"\.\./shared"),
    "the CI entry script": re.compile(r"\.ci/run"),
    "a development checkout's path": re.compile(r"(?<![\w.~/:-])/work/"),
    "a home folder's path": re.compile(r"(?<![\w.~/:-])(?:/root|/home/[\w.-]+)/"),
}


@pytest.mark.parametrize("kind", sorted(_DEVELOPMENT_WORDING))
def test_user_docs_hold_no_development_machine_wording(kind: str) -> None:
    pattern = _DEVELOPMENT_WORDING[kind]
    found = [
        f"{name}:{text.count(chr(10), 0, match.start()) + 1}: {match.group(0)!r}"
        for name, text in _user_docs().items()
        for match in pattern.finditer(text)
    ]
    assert not found, found


def test_the_wording_check_catches_what_it_names() -> None:
    samples = {
        "this machine / this VM": "measured on this 2-core machine",
        "the 2-core machine": "on the 2-core machine",
        "development VMs": "as on the project's development VMs",
        "sum(range(…)) speed marker": "`sum(range(1000))` 12.4 µs",
        "a dated UTC window": "2026-12-02 (17:24-17:48 UTC, at 3f3f4f0)",
        "the sibling data folder": "no `../shared`",
        "the CI entry script": "CI runs `.ci/run`",
        "a development checkout's path": "interpreter /work/main/.venv/bin/python",
        "a home folder's path": "no virtualenv at /home/dev/.cache/x",
    }
    assert set(samples) == set(_DEVELOPMENT_WORDING)
    for kind, sample in samples.items():
        assert _DEVELOPMENT_WORDING[kind].search(sample), kind


def test_the_readme_is_short() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def test_the_readme_cites_the_paper_and_states_its_own_evidence() -> None:
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "Flat Score, Amplified Failures" in readme
    assert "Jiwon Jang, Kisu Yang, Heuiseok Lim, Hyunwoo Park" in readme
    assert "the paper's" in readme
    assert "No run on a real model here has yet shown repair changing a reward" in readme


# ---------------------------------------------------------------------------------------------
# The framework table and the links


def test_the_framework_table_is_in_the_matrix_writers_format() -> None:
    """docs/frameworks.md's table is what ``matrix_table`` writes for the cells it shows, so
    ``python -m tests.frameworks.matrix --write-docs`` replaces it in place."""
    from tests.frameworks.matrix import CHECKS, END, START, Cell, matrix_table

    text = (ROOT / "docs" / "frameworks.md").read_text()
    block = text[text.index(START) : text.index(END) + len(END)]
    rows = [line for line in block.splitlines() if line.startswith("| ") and "---" not in line]
    cells = []
    for row in rows[1:]:
        framework, version, api, *marks = [c.strip() for c in row.strip("|").split("|")]
        for check, mark in zip(CHECKS, marks, strict=False):
            cells.append(Cell(framework, version, api, check, mark == "PASS", ""))
    when = re.search(r"Last run: ([^,]+),", block)
    assert when and len(cells) == len(CHECKS) * (len(rows) - 1)
    absent_line = re.search(r"Not installed at that run, so not in the table: (.*)\.", block)
    absent = absent_line.group(1).split(", ") if absent_line else []
    assert matrix_table(cells, absent, when.group(1)) == block


def test_links_that_leave_docs_become_repository_urls() -> None:
    url = "https://example.org/r"
    assert docs_hooks.outside_link("apis.md", "../repairproxy/settings.py", url) == (
        f"{url}/blob/main/repairproxy/settings.py"
    )
    assert docs_hooks.outside_link("reference/x.md", "../../studies/", url) == (
        f"{url}/tree/main/studies"
    )
    assert docs_hooks.outside_link("a.md", "../docker/compose.yaml#L3", url) == (
        f"{url}/blob/main/docker/compose.yaml#L3"
    )
    assert docs_hooks.outside_link("reference/x.md", "../apis.md", url) is None
    with pytest.raises(ValueError):
        docs_hooks.outside_link("a.md", "../../elsewhere.md", url)


def test_every_relative_link_of_the_readme_exists() -> None:
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\((?!https?:)([^)#\s]+)(?:#[^)]*)?\)", readme)
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert len(targets) > 10
    assert not missing, missing


def test_the_readme_picture_names_every_package() -> None:
    """The README's layout picture stays true when the code moves: every package of the proxy,
    the study and the benchmarks is in it (``asgi/``, ``tau2/``, ``support/`` ...)."""
    readme = (ROOT / "README.md").read_text()
    picture = readme[readme.index("## How it fits together") :]
    picture = picture[: picture.index("\n## ")]
    missing = [
        f"{top}/{package.name}/"
        for top in ("repairproxy", "evals", "benchmarks")
        for package in sorted((ROOT / top).iterdir())
        if (package / "__init__.py").is_file() and f"{package.name}/" not in picture
    ]
    assert not missing, missing


def test_the_performance_page_reads_each_benchmarks_record(tmp_path: Path) -> None:
    """A JSON record's figures, command, commit and machine reach the page (variants side by
    side); a text record is shown as printed; the page never runs a benchmark."""
    import json

    from benchmarks.support.results import write_json, write_text

    figures = {"note": "n", "memory": {"cases": 200, "x": {"a": 1}}, "redis": {"cases": 100}}
    write_json("fuzz", figures, command="python -m benchmarks.fuzz --cases 200", directory=tmp_path)
    write_text(
        "fuzz", "[memory] 200 cases", command="python -m benchmarks.fuzz", directory=tmp_path
    )
    write_text("soak", "soaked 1 minute", command="python -m benchmarks.soak", directory=tmp_path)
    record = json.loads((tmp_path / "fuzz.json").read_text())
    page = docs_pages.performance_page(tmp_path)
    fuzz = page[page.index("## `fuzz`") : page.index("## `limits`")]
    assert f"at commit `{record['commit']}` with `python -m benchmarks.fuzz --cases 200`" in fuzz
    assert f"cpus {record['machine']['cpus']}" in fuzz
    assert "| | cases | x.a |" in fuzz and "| **memory** | 200 | 1 |" in fuzz
    assert "| **redis** | 100 |  |" in fuzz and "| note | n |" in fuzz
    assert "    [memory] 200 cases" in fuzz  # the printed figure, folded under the table
    soak = page[page.index("## `soak`") : page.index("## `textcalls`")]
    assert "As printed by `python -m benchmarks.soak`" in soak and "soaked 1 minute" in soak
    assert "No figure recorded yet: `python -m benchmarks.overhead`" in page


def test_the_performance_page_shows_recorded_paths_as_a_checkout_has_them(tmp_path: Path) -> None:
    """The machine that measured wrote its own folders; the page writes them relative to the
    checkout, or under `~`, and leaves URLs and other absolute paths alone."""
    from benchmarks.support.results import write_text

    printed = (
        "interpreter /work/main/.venv/bin/python: CPython\n"
        "missing: litellm (no virtualenv at /root/.cache/repairproxy/bench-venvs/litellm)\n"
        "relay: /srv/repairproxy/.venv/bin/python --upstream http://127.0.0.1:8/v1 --out /tmp/x\n"
        "(figures written to /home/dev/src/rp/benchmarks/results/fuzz.json)"
    )
    write_text("fuzz", printed, command="python -m benchmarks.fuzz", directory=tmp_path)
    page = docs_pages.performance_page(tmp_path)
    fuzz = page[page.index("## `fuzz`") : page.index("## `limits`")]
    assert "interpreter .venv/bin/python: CPython" in fuzz
    assert "no virtualenv at ~/.cache/repairproxy/bench-venvs/litellm" in fuzz
    assert "relay: .venv/bin/python --upstream http://127.0.0.1:8/v1 --out /tmp/x" in fuzz
    assert "(figures written to benchmarks/results/fuzz.json)" in fuzz
