"""The demo's first minute: short scenes on the embedded model, each sent twice through the proxy.

Each scene (``evals/demo/scenes.toml``) is one chat request, sent with repair off and then with the
proxy's default (``X-Repairproxy-Repair`` per request, one proxy). What the agent receives is shown
side by side, with the proxy's headers in words and the proxy's counts after the scene; every
scene says whether it reproduced what it is meant to show on this machine. The outcome is read
from the delivered answer itself (declared names, the schema), not from the proxy's own headers.
"""

from __future__ import annotations

import json
import textwrap
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "SCENES_PATH",
    "Reply",
    "Scene",
    "SceneBook",
    "SceneResult",
    "counts_line",
    "header_words",
    "load_scenes",
    "outcome",
    "render_scene",
    "request_body",
    "run_scenes",
]

SCENES_PATH = Path(__file__).with_name("scenes.toml")
DEFAULT_MODE = "default"  # the scenes' second send: no X-Repairproxy-Repair header
OUTCOME_WORDS = {
    "tool_call": "a valid call to a declared tool: the agent runs it",
    "text_call": "a tool call written as text: nothing runs",
    "declined": "re-asked, the model answered in prose instead of calling",
    "prose": "a text answer, nothing to fix",
    "invalid_call": "a call the proxy found invalid",
    "valid_json": "JSON that matches the schema",
    "invalid_json": "JSON that breaks the schema (or no JSON)",
}
_COLUMN = 50


@dataclass(frozen=True, slots=True)
class Scene:
    id: str
    title: str
    system: str
    user: str
    tools: tuple[dict[str, Any], ...]
    response_format: dict[str, Any] | None
    want: Mapping[str, str]  # mode ("off", "default") -> outcome the scene is meant to show
    observed: Mapping[str, str]  # mode -> outcome on the reference machine (the model test)
    # mode -> other outcomes seen on other machines for a scene at the edge (llama.cpp's CPU
    # kernels differ by processor, so a near tie at temperature 0 can fall either way)
    also_observed: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def observed_outcomes(self, mode: str) -> frozenset[str]:
        """Every outcome this scene has shown in ``mode`` on the machines it was run on."""
        return frozenset((self.observed[mode], *self.also_observed.get(mode, ())))

    @property
    def declared(self) -> frozenset[str]:
        return frozenset(t["function"]["name"] for t in self.tools)


@dataclass(frozen=True, slots=True)
class SceneBook:
    sampling: Mapping[str, Any]
    scenes: tuple[Scene, ...]

    @property
    def threads(self) -> int | None:
        threads = self.sampling.get("threads")
        return int(threads) if threads is not None else None


def load_scenes(path: Path = SCENES_PATH) -> SceneBook:
    raw = tomllib.loads(path.read_text(encoding="utf-8"))
    tools = {
        name: {"type": "function", "function": {"name": name, **spec}}
        for name, spec in raw.get("tools", {}).items()
    }
    scenes = tuple(
        Scene(
            id=s["id"],
            title=s["title"],
            system=s["system"],
            user=s["user"],
            tools=tuple(tools[name] for name in s.get("tools", ())),
            response_format=s.get("response_format"),
            want=dict(s["want"]),
            observed=dict(s["observed"]),
            also_observed={m: tuple(o) for m, o in s.get("also_observed", {}).items()},
        )
        for s in raw["scene"]
    )
    return SceneBook(dict(raw.get("sampling", {})), scenes)


def request_body(book: SceneBook, scene: Scene, model: str) -> dict[str, Any]:
    sampling = {k: v for k, v in book.sampling.items() if k != "threads"}
    body: dict[str, Any] = {
        "model": model,
        "messages": [
            {"role": "system", "content": scene.system},
            {"role": "user", "content": scene.user},
        ],
        **sampling,
    }
    if scene.tools:
        body["tools"] = list(scene.tools)
    if scene.response_format is not None:
        body["response_format"] = scene.response_format
    return body


@dataclass(frozen=True, slots=True)
class Reply:
    """What the agent received for one send: the message, the proxy's headers, the time."""

    mode: str
    message: Mapping[str, Any]
    headers: Mapping[str, str]  # the x-repairproxy-* headers, names without the prefix
    seconds: float


def _valid_call(call: Mapping[str, Any], declared: frozenset[str]) -> bool:
    function = call.get("function") or {}
    if function.get("name") not in declared:
        return False
    try:
        return isinstance(json.loads(function.get("arguments") or ""), dict)
    except ValueError:
        return False


def _json_verdict(content: str | None, schema: Mapping[str, Any]) -> bool:
    import jsonschema_rs

    try:
        value = json.loads(content or "")
    except ValueError:
        return False
    return bool(jsonschema_rs.validator_for(dict(schema)).is_valid(value))


def outcome(scene: Scene, reply: Reply) -> str:
    """What the agent got, judged from the answer (declared names, the schema) and, for
    ``declined`` and ``text_call``, from what the proxy said it saw."""
    message = reply.message
    if scene.response_format is not None:
        schema = (scene.response_format.get("json_schema") or {}).get("schema") or {}
        return "valid_json" if _json_verdict(message.get("content"), schema) else "invalid_json"
    calls = message.get("tool_calls") or []
    if calls:
        ok = all(_valid_call(c, scene.declared) for c in calls)
        return "tool_call" if ok else "invalid_call"
    seen = [c for c in reply.headers.get("tool-errors", "").split(",") if c]
    if seen and int(reply.headers.get("repairs", "0") or 0) > 0:
        return "declined"
    if seen:
        return "text_call" if "tool_call_in_content" in seen else "invalid_call"
    return "prose"


_CHANNEL_WORDS = {
    "tool_call_in_content": "a call written as text",
    "unknown_tool": "an invented tool name",
    "schema_violation": "bad arguments",
    "invalid_json": "broken JSON arguments",
    "empty_output": "an empty answer",
    "output_schema_violation": "output breaks the schema",
    "output_not_json": "output is not JSON",
}


def _words(channels: str) -> str:
    names = list(dict.fromkeys(c for c in channels.split(",") if c))
    return ", ".join(_CHANNEL_WORDS.get(c, c) for c in names)


def header_words(headers: Mapping[str, str]) -> list[str]:
    """The proxy's ``X-Repairproxy-*`` headers in words, one clause each."""
    out = []
    first = headers.get("first-tool-errors", headers.get("tool-errors", ""))
    if first:
        out.append(f"saw {_words(first)}")
    if headers.get("unknown-tools"):
        out.append(f"undeclared name {headers['unknown-tools']}")
    if headers.get("promoted"):
        fmt = headers.get("promoted-format", "")
        out.append(f"promoted {headers['promoted']} text call(s) ({fmt})")
    repairs = int(headers.get("repairs", "0") or 0)
    if repairs:
        out.append(f"re-asked {repairs}x")
    if headers.get("output-errors"):
        out.append(f"saw {_words(headers['output-errors'])}")
    output_repairs = int(headers.get("output-repairs", "0") or 0)
    if output_repairs:
        out.append(f"re-asked the output {output_repairs}x")
    if headers.get("repair-failed"):
        out.append(f"repair failed ({headers['repair-failed']})")
    delivered = headers.get("delivered-tool-errors")
    if delivered is not None:
        out.append(f"delivered: {_words(delivered) or 'valid'}")
    if not out:
        out.append("nothing caught")
    out.append(f"{headers.get('upstream-calls', '?')} model call(s)")
    return out


def _shown(message: Mapping[str, Any]) -> str:
    calls = message.get("tool_calls") or []
    if calls:
        shown = []
        for call in calls:
            function = call.get("function") or {}
            shown.append(f"{function.get('name')}({function.get('arguments')})")
        return "tool_calls: " + "; ".join(shown)
    return f"content: {json.dumps(message.get('content'), ensure_ascii=False)}"


def _column(lines: Sequence[str]) -> list[str]:
    out: list[str] = []
    for line in lines:
        out.extend(textwrap.wrap(line, _COLUMN, subsequent_indent="  ") or [""])
    return out


def render_scene(index: int, total: int, scene: Scene, off: Reply, default: Reply) -> list[str]:
    """The scene's lines: prompt, the two replies side by side, and whether it reproduced."""
    got = {"off": outcome(scene, off), DEFAULT_MODE: outcome(scene, default)}
    lines = [f"-- scene {index}/{total}: {scene.title}"]
    lines.append(f"   user: {scene.user}")
    if scene.tools:
        lines.append(f"   declared tools: {', '.join(sorted(scene.declared))}")
    if scene.response_format is not None:
        schema = scene.response_format["json_schema"]["schema"]
        lines.append(f"   response_format schema: {json.dumps(schema, separators=(',', ':'))}")
    columns = []
    for reply in (off, default):
        label = "repair off" if reply.mode == "off" else "the default (reflexive)"
        head = f"{label}, {reply.seconds:.1f} s:"
        body = [_shown(reply.message), "proxy: " + "; ".join(header_words(reply.headers))]
        body.append(f"=> {OUTCOME_WORDS[got[reply.mode]]}")
        columns.append(_column([head, *body]))
    left, right = columns
    for row in range(max(len(left), len(right))):
        a = left[row] if row < len(left) else ""
        b = right[row] if row < len(right) else ""
        lines.append(f"   {a:<{_COLUMN}} | {b}".rstrip())
    if dict(got) == dict(scene.want):
        lines.append("   reproduced here")
    else:
        lines.append(
            f"   NOT reproduced here: meant to show {scene.want['default']}, "
            f"got {got[DEFAULT_MODE]} (repair off: {got['off']}, meant {scene.want['off']})"
        )
    return lines


@dataclass(frozen=True, slots=True)
class SceneResult:
    scene: Scene
    off: Reply
    default: Reply

    @property
    def outcomes(self) -> dict[str, str]:
        return {
            "off": outcome(self.scene, self.off),
            DEFAULT_MODE: outcome(self.scene, self.default),
        }


def _send(client: Any, url: str, body: Mapping[str, Any], mode: str) -> Reply:
    headers = {} if mode == DEFAULT_MODE else {"X-Repairproxy-Repair": mode}
    started = time.monotonic()
    response = client.post(f"{url}/chat/completions", json=body, headers=headers)
    seconds = time.monotonic() - started
    response.raise_for_status()
    own = {
        name.lower()[len("x-repairproxy-") :]: value
        for name, value in response.headers.items()
        if name.lower().startswith("x-repairproxy-")
    }
    return Reply(mode, response.json()["choices"][0]["message"], own, seconds)


def counts_line(metrics_text: str) -> str:
    """The proxy's counts since it started (the /dashboard's tiles), from /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            key = sample.labels.get("channel") or sample.labels.get("result") or ""
            if sample.name.endswith("_repairs_total") and "result" in sample.labels:
                key = sample.labels["result"]
            slot = (sample.name.removeprefix("repairproxy_").removesuffix("_total"), key)
            totals[slot] = totals.get(slot, 0.0) + sample.value

    def total(name: str) -> int:
        return int(sum(v for (n, _), v in totals.items() if n == name))

    errors = ", ".join(
        f"{k} {int(v)}" for (n, k), v in sorted(totals.items()) if n == "tool_call_errors" and v
    )
    repairs = ", ".join(
        f"{k} {int(v)}" for (n, k), v in sorted(totals.items()) if n == "repairs" and v
    )
    return (
        f"   proxy counts so far: requests {total('requests')}; tool calls {total('tool_calls')}; "
        f"errors caught: {errors or 'none'}; invented tool names "
        f"{total('hallucinated_tool_calls')}; promoted {total('promoted_tool_calls')}; "
        f"repair results: {repairs or 'none'}; broken structured outputs (every attempt) "
        f"{total('structured_output_errors')}"
    )


def run_scenes(
    proxy_url: str,
    model: str,
    book: SceneBook,
    say: Callable[[str], None],
    *,
    metrics_url: str | None = None,
) -> list[SceneResult]:
    """Send every scene twice (repair off, then the default) and print it as it completes."""
    import httpx

    results = []
    started = time.monotonic()
    with httpx.Client(timeout=600.0, trust_env=False) as client:
        for index, scene in enumerate(book.scenes, start=1):
            body = request_body(book, scene, model)
            off = _send(client, proxy_url, body, "off")
            default = _send(client, proxy_url, body, DEFAULT_MODE)
            for line in render_scene(index, len(book.scenes), scene, off, default):
                say(line)
            if metrics_url is not None:
                say(counts_line(client.get(metrics_url).text))
            say(f"   (scene done {time.monotonic() - started:.0f} s after set-up)")
            say("")
            results.append(SceneResult(scene, off, default))
    return results
