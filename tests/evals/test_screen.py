"""The risk screen against a deterministic scripted upstream whose channel counts per arm are known.

The upstream is a real HTTP server on loopback: it recognises each decision point by the sha256 of
the prompt and answers it with the channel the test scheduled for that arm (built from the gold
call, so valid answers agree with gold). The screen's counts must equal the schedule exactly; a
screen killed with SIGKILL and started again must lose and duplicate nothing; ``--report`` must
re-derive the same ``screen.json`` from the answer log alone.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import pytest

from evals.analysis.stats import Z95, Interval, NotAvailable
from evals.screen import (
    CHANNELS,
    DecisionPoint,
    Judge,
    divergence_margin,
    main,
    paired_rate_ratio,
    replay_domain,
    select_points,
)
from evals.screen.answers import ANSWERS_FILE, Answer, AnswerLog, read_answers
from evals.screen.points import DomainPoints
from evals.screen.report import render_markdown

REPO = Path(__file__).resolve().parents[2]
POINTS, SEED = 12, 3

# Per arm: the channel of each point, in point order (counts are what the screen must find).
SCHEDULE: dict[str, list[str]] = {
    "ref": ["valid"] * 10 + ["unknown_tool", "text"],
    "q": ["valid"] * 4
    + ["unknown_tool"] * 3
    + ["invalid_json"] * 2
    + ["schema_violation", "tool_call_in_content", "empty"],
}


def _call(name: str, arguments: str) -> dict[str, Any]:
    return {"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}


def _wrong_types(point: DecisionPoint, tools: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    schema = next(
        t["function"]["parameters"] for t in tools if t["function"]["name"] == point.gold_name
    )
    required = schema.get("required") or []
    assert required, f"{point.gold_name} has no required parameter to get wrong"
    arguments = dict(point.gold_arguments)
    first = required[0]
    wrong = 12345 if schema["properties"][first].get("type") == "string" else "not this type"
    arguments[first] = wrong
    return arguments


def answer_for(
    channel: str, point: DecisionPoint, tools: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The completion the scripted arm gives at ``point`` for ``channel``."""
    gold = json.dumps(point.gold_arguments)
    content: str | None = None
    calls: list[dict[str, Any]] | None = None
    if channel == "valid":
        calls = [_call(point.gold_name, gold)]
    elif channel == "unknown_tool":
        calls = [_call(point.gold_name + "_v2", gold)]
    elif channel == "invalid_json":
        calls = [_call(point.gold_name, gold[:-1] + ', "')]
    elif channel == "schema_violation":
        calls = [_call(point.gold_name, json.dumps(_wrong_types(point, tools)))]
    elif channel == "tool_call_in_content":
        body = json.dumps({"name": point.gold_name, "arguments": point.gold_arguments})
        content = f"<tool_call>\n{body}\n</tool_call>"
    elif channel == "empty":
        content = ""
    else:
        content = "Could you tell me a little more about what you need?"
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return {
        "id": "chatcmpl-screen",
        "object": "chat.completion",
        "model": "scripted",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}],
    }


class ScreenUpstream:
    """Loopback server: ``/{arm}/v1/chat/completions`` answers each point by its prompt digest."""

    def __init__(self, answers: Mapping[str, Mapping[str, dict[str, Any]]]) -> None:
        self.answers = answers
        self.delay = 0.0
        self.requests: list[tuple[str, str]] = []  # (arm, digest)
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._send(200, {"object": "list", "data": [{"id": "scripted", "object": "model"}]})

            def do_POST(self) -> None:
                body = orjson.loads(self.rfile.read(int(self.headers["content-length"])))
                arm = self.path.strip("/").split("/")[0]
                digest = hashlib.sha256(orjson.dumps(body["messages"])).hexdigest()
                with lock:
                    outer.requests.append((arm, digest))
                time.sleep(outer.delay)
                answer = outer.answers.get(arm, {}).get(digest)
                if answer is None:
                    self._send(404, {"error": {"message": "unknown point", "type": "not_found"}})
                else:
                    self._send(200, answer)

            def _send(self, status: int, value: Any) -> None:
                payload = orjson.dumps(value)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def url(self, arm: str) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/{arm}/v1"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture(scope="module")
def retail(tau2_data_dir: Path) -> DomainPoints:
    return replay_domain("retail", tau2_data_dir)


@pytest.fixture(scope="module")
def points(retail: DomainPoints) -> list[DecisionPoint]:
    chosen = select_points([retail], POINTS, SEED)
    assert len(chosen) == POINTS
    return chosen


def _schedule(
    points: Sequence[DecisionPoint], tools: Sequence[Mapping[str, Any]]
) -> dict[str, dict[str, str]]:
    """Arm -> point key -> channel; the schema violation where the gold tool requires a value."""

    def requires(point: DecisionPoint) -> bool:
        schema = next(
            t["function"]["parameters"] for t in tools if t["function"]["name"] == point.gold_name
        )
        return bool(schema.get("required"))

    schedule: dict[str, dict[str, str]] = {}
    for arm, channels in SCHEDULE.items():
        order = sorted(points, key=lambda p: not requires(p))  # eligible points first
        by_key: dict[str, str] = {}
        rest = list(channels)
        if "schema_violation" in rest:
            rest.remove("schema_violation")
            by_key[order[0].key] = "schema_violation"
        remaining = [p for p in points if p.key not in by_key]
        by_key.update({p.key: ch for p, ch in zip(remaining, rest, strict=True)})
        schedule[arm] = by_key
    return schedule


@pytest.fixture()
def upstream(
    points: list[DecisionPoint], retail: DomainPoints
) -> Iterator[tuple[ScreenUpstream, dict[str, dict[str, str]]]]:
    schedule = _schedule(points, retail.tools)
    answers = {
        arm: {p.digest: answer_for(by_key[p.key], p, retail.tools) for p in points}
        for arm, by_key in schedule.items()
    }
    server = ScreenUpstream(answers)
    try:
        yield server, schedule
    finally:
        server.close()


def _args(server: ScreenUpstream, out: Path, data: Path) -> list[str]:
    return [
        "--arm", f"ref={server.url('ref')}",
        "--arm", f"q={server.url('q')}",
        "--reference", "ref",
        "--domain", "retail",
        "--points", str(POINTS),
        "--seed", str(SEED),
        "--out", str(out),
        "--tau2-data", str(data),
    ]  # fmt: skip


def _expected(schedule: Mapping[str, str]) -> Counter[str]:
    return Counter(schedule.values())


def test_counts_equal_the_scripted_channels_exactly(
    upstream: tuple[ScreenUpstream, dict[str, dict[str, str]]], tmp_path: Path, tau2_data_dir: Path
) -> None:
    server, schedule = upstream
    out = tmp_path / "screen"
    assert main(_args(server, out, tau2_data_dir)) == 0
    screen = json.loads((out / "screen.json").read_text())
    for arm, by_key in schedule.items():
        expected = _expected(by_key)
        summary = screen["arms"][arm]
        assert summary["n"] == POINTS
        for channel in CHANNELS:
            want = expected[channel] if channel != "valid" else expected["valid"] + expected["text"]
            assert summary["channels"][channel]["count"] == want, (arm, channel)
        assert summary["text_only"]["count"] == expected["text"]
        assert summary["next_action"]["gold_call"]["count"] == expected["valid"]
        gold_named = expected["valid"] + expected["invalid_json"] + expected["schema_violation"]
        assert summary["next_action"]["gold_tool"]["count"] == gold_named
        assert sum(summary["invented_names"].values()) == expected["unknown_tool"]
        assert summary["margin"]["n"] == 0  # the scripted upstream sends no logprobs
    # Each arm was asked every point once, the same points, per task in prefix-extending order.
    asked = Counter(server.requests)
    assert set(asked.values()) == {1}
    digests = {arm: [d for a, d in server.requests if a == arm] for arm in schedule}
    assert digests["ref"] == digests["q"]
    comparison = screen["comparisons"]["q"]
    assert comparison["paired_n"] == POINTS
    assert comparison["channels"]["unknown_tool"]["count"] == 3
    assert comparison["channels"]["unknown_tool"]["reference_count"] == 1
    novel = comparison["novel_names"]
    assert novel["total"] == 3 and novel["novel"] <= 3
    assert "report.md" in os.listdir(out) and (out / "screen.png").stat().st_size > 0
    assert "| `q` |" in (out / "report.md").read_text()


def test_report_rederives_the_same_screen_json(
    upstream: tuple[ScreenUpstream, dict[str, dict[str, str]]], tmp_path: Path, tau2_data_dir: Path
) -> None:
    server, _ = upstream
    out = tmp_path / "screen"
    assert main(_args(server, out, tau2_data_dir)) == 0
    first = (out / "screen.json").read_bytes()
    for name in ("screen.json", "report.md", "screen.png"):
        (out / name).unlink()
    server.close()  # no model from here on
    assert main(["--report", str(out)]) == 0
    assert (out / "screen.json").read_bytes() == first
    assert (out / "report.md").is_file() and (out / "screen.png").is_file()


def test_resume_after_sigkill_loses_and_duplicates_nothing(
    upstream: tuple[ScreenUpstream, dict[str, dict[str, str]]], tmp_path: Path, tau2_data_dir: Path
) -> None:
    server, schedule = upstream
    out = tmp_path / "screen"
    log = out / ANSWERS_FILE
    server.delay = 0.3
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    command = [sys.executable, "-m", "evals.screen", *_args(server, out, tau2_data_dir)]
    child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and child.poll() is None:
        if log.is_file() and log.read_bytes().count(b"\n") >= 5:
            break
        time.sleep(0.05)
    assert child.poll() is None, child.stderr.read().decode() if child.stderr else ""
    child.send_signal(signal.SIGKILL)
    child.wait()
    if child.stderr is not None:
        child.stderr.close()
    before = read_answers(log)
    assert 5 <= len(before) < 2 * POINTS
    requests_before = len(server.requests)
    server.delay = 0.0
    assert main(_args(server, out, tau2_data_dir)) == 0
    after = read_answers(log)
    keys = [(a.arm, a.point) for a in after]
    assert len(keys) == len(set(keys)) == 2 * POINTS
    assert log.read_bytes().count(b"\n") == 2 * POINTS  # no line written twice
    assert [(a.arm, a.point) for a in after[: len(before)]] == [(a.arm, a.point) for a in before]
    # Only the unanswered points were asked again (plus at most the one in flight at the kill).
    asked_again = len(server.requests) - requests_before
    assert 2 * POINTS - len(before) <= asked_again <= 2 * POINTS - len(before) + 1
    screen = json.loads((out / "screen.json").read_text())
    for arm, by_key in schedule.items():
        assert (
            screen["arms"][arm]["channels"]["unknown_tool"]["count"]
            == _expected(by_key)["unknown_tool"]
        )


def test_a_torn_last_line_is_cut_and_asked_again(tmp_path: Path) -> None:
    path = tmp_path / ANSWERS_FILE
    whole = Answer("a", "p1", {"choices": []}, 0.5, True).to_json()
    path.write_bytes(whole + Answer("a", "p2", {"choices": []}, 0.5, True).to_json()[:20])
    with AnswerLog(path) as log:
        assert log.done == {("a", "p1")}
        assert log.append(Answer("a", "p2", {"choices": []}, 0.1, True))
        assert not log.append(Answer("a", "p1", {"choices": []}, 0.1, True))
    assert [a.point for a in read_answers(path)] == ["p1", "p2"]
    assert path.read_bytes().count(b"\n") == 2


def test_another_seed_in_the_same_folder_is_refused(
    upstream: tuple[ScreenUpstream, dict[str, dict[str, str]]], tmp_path: Path, tau2_data_dir: Path
) -> None:
    server, _ = upstream
    out = tmp_path / "screen"
    assert main(_args(server, out, tau2_data_dir)) == 0
    args = _args(server, out, tau2_data_dir)
    args[args.index("--seed") + 1] = str(SEED + 1)
    assert main(args) == 2


def test_points_are_fixed_by_seed_and_extend_each_other_per_task(retail: DomainPoints) -> None:
    first = select_points([retail], 40, 11)
    assert [p.key for p in first] == [p.key for p in select_points([retail], 40, 11)]
    assert [p.key for p in first] != [p.key for p in select_points([retail], 40, 12)]
    for earlier, later in itertools.pairwise(first):
        if earlier.task_id == later.task_id:
            assert later.turn > earlier.turn
            assert later.messages[: len(earlier.messages)] == earlier.messages
    # Every point's prompt ends where the gold agent answered with a call, after the user spoke.
    assert all(p.messages[0]["role"] == "system" and p.messages[2]["role"] == "user" for p in first)


# --- the judge and the statistics -------------------------------------------------------------

DECLARED = ["get_order_details", "get_user_details", "get_product_details"]
TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
    for n in DECLARED
]


def _entry(token: str, logprob: float, rivals: Mapping[str, float]) -> dict[str, Any]:
    top = [{"token": token, "logprob": logprob}] + [
        {"token": t, "logprob": lp} for t, lp in rivals.items()
    ]
    return {"token": token, "logprob": logprob, "top_logprobs": top}


def _with_logprobs(name: str, tokens: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "choices": [
            {
                "message": {"role": "assistant", "tool_calls": [_call(name, "{}")]},
                "logprobs": {"content": tokens},
            }
        ]
    }


def test_margin_is_read_where_the_name_leaves_the_declared_names() -> None:
    head = [_entry('<tool_call>\n{"name": "', -0.01, {"Sure": -5.0})]
    tail = [_entry('", "arguments": {}}', -0.01, {"}": -6.0})]
    # "get_order_details" shares "get_" with both rivals: the decision is the "_order" token.
    valid = [
        *head,
        _entry("get", -0.01, {"list": -4.0}),
        _entry("_order", -0.2, {"_user": -0.9, "_product": -2.0}),
        _entry("_details", -0.01, {"_info": -5.0}),
        *tail,
    ]
    margin = divergence_margin(
        _with_logprobs("get_order_details", valid), "get_order_details", DECLARED
    )
    assert margin == pytest.approx(-0.2 - -0.9)
    # An invented "get_order_info" leaves the declared names after "get_order_": at "_info".
    invented = [
        *head,
        _entry("get", -0.01, {"list": -4.0}),
        _entry("_order", -0.05, {"_user": -3.0}),
        _entry("_info", -1.1, {"_details": -1.3}),
        *tail,
    ]
    completion = _with_logprobs("get_order_info", invented)
    assert divergence_margin(completion, "get_order_info", DECLARED) == pytest.approx(0.2)
    verdict = Judge(TOOLS).judge(completion, "get_order_details", {})
    assert verdict.channels == {"unknown_tool"}
    assert verdict.invented == ("get_order_info",)
    assert verdict.margin == pytest.approx(0.2)
    assert not verdict.gold_name
    assert divergence_margin({"choices": [{"message": {}}]}, "x", DECLARED) is None


def test_paired_rate_ratio() -> None:
    # reference 3/20, compared 12/20, both on 3: ratio 4, SE(log) 0.5, interval above 1.
    ratio = paired_rate_ratio([(True, True)] * 3 + [(False, True)] * 9 + [(False, False)] * 8)
    assert isinstance(ratio, Interval)
    assert ratio.estimate == pytest.approx(4.0)
    assert ratio.low == pytest.approx(4.0 * math.exp(-Z95 * 0.5))
    same = paired_rate_ratio([(True, True)] * 3 + [(False, False)] * 7)
    assert isinstance(same, Interval)
    assert same.estimate == pytest.approx(1.0)
    assert same.low == pytest.approx(1.0)  # the same answers on both arms: no spread
    assert isinstance(paired_rate_ratio([(False, False)] * 5), NotAvailable)
    amplified = paired_rate_ratio([(False, True)] * 8 + [(False, False)] * 2)
    assert isinstance(amplified, Interval)  # finite with the 0.5 correction
    assert amplified.estimate == pytest.approx((0.5 + 8.5) / (0.5 + 0.5))


def test_flag_rule_flags_a_clear_amplification(tmp_path: Path) -> None:
    from evals.screen import summarize
    from evals.screen.summary import PointLabel

    labels = [PointLabel(f"p{i}", "d", "get_order_details", {}) for i in range(40)]
    good = {
        "choices": [
            {"message": {"role": "assistant", "tool_calls": [_call("get_order_details", "{}")]}}
        ]
    }
    bad = {
        "choices": [{"message": {"role": "assistant", "tool_calls": [_call("get_order", "{}")]}}]
    }
    answers = [Answer("ref", p.key, good, 0.1, False) for p in labels]
    answers += [
        Answer("q", p.key, bad if i < 20 else good, 0.1, False) for i, p in enumerate(labels)
    ]
    screen = summarize(
        points=labels,
        tools={"d": TOOLS},
        answers=answers,
        arms=["ref", "q"],
        reference="ref",
        config={},
    )
    assert screen["flagged"] == {"q": ["unknown_tool"]}
    assert screen["arms"]["q"]["channels"]["unknown_tool"]["count"] == 20


def test_a_pair_compares_a_smaller_model_with_its_own_reference_and_margins_split_by_error() -> (
    None
):
    from evals.screen import summarize
    from evals.screen.summary import PointLabel

    labels = [PointLabel(f"p{i}", "d", "get_order_details", {}) for i in range(20)]
    head = [_entry('<tool_call>\n{"name": "', -0.01, {"Sure": -5.0})]
    # A valid call decided by 0.7 nats at "_order"; an invented one by 0.2 nats at "_info".
    valid = _with_logprobs(
        "get_order_details",
        [
            *head,
            _entry("get", -0.01, {}),
            _entry("_order", -0.2, {"_user": -0.9}),
            _entry("_details", -0.01, {"_info": -5.0}),
        ],
    )
    invented = _with_logprobs(
        "get_order_info",
        [
            *head,
            _entry("get", -0.01, {}),
            _entry("_order", -0.05, {"_user": -3.0}),
            _entry("_info", -1.1, {"_details": -1.3}),
        ],
    )
    schedule = {"ref": 0, "small": 4, "smallq2": 16}  # points (of 20) with the invented name
    answers = [
        Answer(arm, p.key, invented if i < bad else valid, 0.1, True)
        for arm, bad in schedule.items()
        for i, p in enumerate(labels)
    ]
    screen = summarize(
        points=labels,
        tools={"d": TOOLS},
        answers=answers,
        arms=list(schedule),
        reference="ref",
        config={"domains": ["d"], "seed": 0},
        pairs=[("smallq2", "small")],
    )
    (pair,) = screen["pairs"]
    assert (pair["arm"], pair["reference"], pair["paired_n"]) == ("smallq2", "small", 20)
    ratio = pair["channels"]["unknown_tool"]["ratio"]
    assert ratio["estimate"] == pytest.approx(16 / 4)  # vs its own Q4, not vs the reference's 0
    assert screen["comparisons"]["smallq2"]["channels"]["unknown_tool"]["reference_count"] == 0
    split = screen["arms"]["small"]["margin_by_outcome"]
    assert (split["error"]["n"], split["no_error"]["n"]) == (4, 16)
    assert split["error"]["median"] == pytest.approx(0.2)
    assert split["no_error"]["median"] == pytest.approx(0.7)
    assert split["error"]["thin"]["count"] == 4 and split["no_error"]["thin"]["count"] == 0
    with pytest.raises(ValueError, match="pair"):
        summarize(
            points=labels,
            tools={"d": TOOLS},
            answers=answers,
            arms=list(schedule),
            reference="ref",
            config={},
            pairs=[("smallq2", "absent")],
        )
    markdown = render_markdown(screen)
    assert "`smallq2` against its own reference `small`" in markdown
    assert "| `small` | 4 | 0.20 |" in markdown


def test_report_with_a_pair_records_it_and_rederives(
    upstream: tuple[ScreenUpstream, dict[str, dict[str, str]]], tmp_path: Path, tau2_data_dir: Path
) -> None:
    server, _ = upstream
    out = tmp_path / "screen"
    assert main(_args(server, out, tau2_data_dir)) == 0
    server.close()
    assert main(["--report", str(out), "--pair", "q=nope"]) == 2  # not an arm: refused
    assert main(["--report", str(out), "--pair", "ref=q"]) == 0
    assert json.loads((out / "run.json").read_text())["pairs"] == [["ref", "q"]]
    (pair,) = json.loads((out / "screen.json").read_text())["pairs"]
    assert (pair["arm"], pair["reference"]) == ("ref", "q")
    assert main(["--report", str(out)]) == 0  # the recorded pair stays
    assert len(json.loads((out / "screen.json").read_text())["pairs"]) == 1


# --- screen cells in a grid ---------------------------------------------------------------------


def _grid(server: ScreenUpstream, screen: dict[str, Any]) -> dict[str, Any]:
    arms = {
        name: {"model": "scripted", "upstream": server.url(name), "proxy": server.url(name)}
        for name in ("ref", "q")
    }
    arms["q"]["reference"] = "ref"
    cell = {"domain": "retail", "arm": ["ref", "q"], "user": "scripted", "modes": ["off"]}
    return {"name": "g", "arms": arms, "cell": [cell], "screen": screen}


def test_grid_screen_cells_screen_the_grid_arms(
    upstream: tuple[ScreenUpstream, dict[str, dict[str, str]]], tmp_path: Path, tau2_data_dir: Path
) -> None:
    from evals.grid.spec import GridError, parse_grid
    from evals.screen.grid import run_screen_cells

    server, schedule = upstream
    grid = parse_grid(_grid(server, {"points": POINTS, "seed": SEED}))
    assert grid.screen is not None
    assert (grid.screen.reference, grid.screen.domains) == ("ref", ("retail",))
    screen = run_screen_cells(grid, grid.screen, tmp_path, tau2_data_dir)
    for arm, by_key in schedule.items():
        channels = screen["arms"][arm]["channels"]
        assert channels["unknown_tool"]["count"] == _expected(by_key)["unknown_tool"]
    assert (tmp_path / "screen" / "report.md").is_file()
    with pytest.raises(GridError, match=r"screen\.arms"):
        parse_grid(_grid(server, {"arms": ["nosuch"]}))
    with pytest.raises(GridError, match="unknown keys"):
        parse_grid(_grid(server, {"pointz": 3}))


def test_progress_on_a_pipe_is_plain_lines_with_an_estimate() -> None:
    import io

    from evals.screen.ask import Progress

    stream = io.StringIO()
    progress = Progress(4, 1, "screen q", stream=stream, every_s=0.0)
    for _ in range(3):
        progress.advance()
    progress.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 4 and "\r" not in stream.getvalue()
    assert lines[0] == "screen q: 1/4 points, asking"
    assert lines[-1].startswith("screen q: 4/4 points, ") and lines[-1].endswith("ETA 0m00s")


def test_arm_specs(tmp_path: Path) -> None:
    from evals.screen import ScreenError, parse_arm
    from evals.screen.ask import AskOptions, served

    assert parse_arm("a=http://h:1/v1").kind == "url"
    assert parse_arm(f"d={tmp_path}").kind == "dir"
    assert parse_arm("e=q4_k_m").kind == "embedded"
    with pytest.raises(ScreenError, match="NAME=URL"):
        parse_arm("no-name")
    (tmp_path / "a.gguf").write_bytes(b"x")
    (tmp_path / "b.gguf").write_bytes(b"x")
    with (
        pytest.raises(ScreenError, match="2 GGUF files"),
        served(parse_arm(f"d={tmp_path}"), AskOptions()),
    ):
        pass
    with served(parse_arm("u=http://127.0.0.1:9/v1/"), AskOptions()) as url:
        assert url == "http://127.0.0.1:9/v1"


def test_telecom_points_are_agent_calls_only(tau2_data_dir: Path, retail: DomainPoints) -> None:
    telecom = replay_domain("telecom", tau2_data_dir)
    agent_tools = {t["function"]["name"] for t in telecom.tools}
    assert len(telecom.points) == 123
    assert {p.gold_name for p in telecom.points} <= agent_tools
    # The user's own device calls (toggle_airplane_mode, ...) are never decision points.
    assert all(p.messages[-1]["role"] in {"user", "tool"} for p in telecom.points)
    both = select_points([retail, telecom], 5, 0)
    assert [p.domain for p in both] == ["retail"] * 3 + ["telecom"] * 2  # quotas 3 + 2


def test_the_shipped_screen_is_what_its_answers_rederive(tmp_path: Path) -> None:
    """studies/screen's screen.json and report.md are what ``--report`` makes of its stored answers
    with today's validation: a change to the rules that judge an answer shows up here, and the
    shipped findings are re-derived (and their README re-read) in the same change."""
    shipped = Path(__file__).resolve().parents[2] / "studies" / "screen"
    out = tmp_path / "screen"
    out.mkdir()
    for name in ("points.json", "run.json", ANSWERS_FILE):
        (out / name).write_bytes((shipped / name).read_bytes())
    assert main(["--report", str(out)]) == 0
    for name in ("screen.json", "report.md"):
        assert (out / name).read_bytes() == (shipped / name).read_bytes(), name


def test_an_answer_cut_off_by_the_token_limit_is_judged_as_the_proxy_judges_it() -> None:
    """A text call in an answer stopped by ``max_tokens`` promotes nothing in the proxy
    (``answer_cut_off``): the screen counts it as text, not as a text call."""
    text = 'Let me look.\n{"name": "get_order_details", "arguments": {"order_id": "#W1"}}'
    judge = Judge(TOOLS)
    for finish, channels in (("stop", {"tool_call_in_content"}), ("length", {"valid"})):
        completion = {
            "choices": [
                {"message": {"role": "assistant", "content": text}, "finish_reason": finish}
            ]
        }
        verdict = judge.judge(completion, "get_order_details", {"order_id": "#W1"})
        assert verdict.channels == channels, finish
