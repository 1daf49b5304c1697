"""How well promotion reads tool calls written as text: native formats and hostile answers.

Two corpora under ``tests/data/textcalls/`` (see its README):

* ``native/<family>.jsonl``: model outputs re-authored from vLLM's tool-parser tests, one file per
  format family (hermes, pythonic, Gemma 4, harmony, DeepSeek, Kimi K2, GLM, MiniMax, ...), each
  with the calls vLLM extracts and the prose that should stay. Per family this prints the cases
  with a call, how many were promoted exactly (every name and argument object equal as JSON, in
  order), with wrong arguments, missed, and with part of the wrapper left in ``content``; and
  the false promotions among the negatives (cases where vLLM extracts no call).
* ``hostile.jsonl``: answers that hold a call shape but are not a call (quotes, declines,
  conditionals, examples, injections, reasoning), request constraints, and positive controls.
  Per category this prints each outcome (promoted, ambiguous, not a call) against the expected.

Everything goes through ``promote_answer`` below, the one adapter to the proxy's promotion code:
when that API changes, only it changes. Both corpora run buffered, then streamed (8 content
deltas through the stream gate, ``stream_answer`` / ``stream_hostile``), with the count of
streamed decisions that differ from the buffered one and of streamed answers whose text differs
(a call's text sent before the verdict, or prose lost). ``--corpus real`` reads every real
model answer stored under ``docs/`` (the risk screen, the demo sweep, the CPU grid's cells with
repair off) and prints what promotion makes of them.

    python -m benchmarks.textcalls [--verbose] [--family NAME]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.support.results import run_recorded
from repairproxy.asgi.gate import SSEEvent, ToolCallGate
from repairproxy.native import opening_markers
from repairproxy.repair import promote
from repairproxy.validation import CallRules, Channel, ToolsCache, text_calls_allowed
from repairproxy.wire.openai import message_text

__all__ = ["Promotion", "main", "promote_answer", "stream_answer"]

QUESTION = "How many calls written as text does promotion read exactly, per family; how many false?"

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "textcalls"
# The format corpora, each a folder of ``<family>.jsonl`` in the same fields: vLLM's parser tests
# (``native``), what each family's chat template writes (``templates``), and cases from other
# parsers' test suites (``outside``: llama.cpp's test-chat.cpp, SGLang's function-call tests).
FORMAT_CORPORA = ("native", "templates", "outside")


@dataclass(frozen=True, slots=True)
class Promotion:
    """What the proxy makes of one answer's text.

    ``calls`` are the promoted calls as (name, decoded arguments); ``content`` what stays as
    text; ``flagged`` that a call shape was seen but not promoted (counted as
    ``tool_call_in_content`` and re-asked in ``reflexive``): the *ambiguous* outcome.
    """

    calls: tuple[tuple[str, Any], ...]
    content: str | None
    flagged: bool

    @property
    def outcome(self) -> str:
        if self.calls:
            return "promoted"
        return "ambiguous" if self.flagged else "not_a_call"


def promote_answer(
    request: Mapping[str, Any], content: str, messages: Sequence[Mapping[str, Any]] = ()
) -> Promotion:
    """The proxy's buffered promotion of ``content`` for ``request`` (its tools and constraints).

    Mirrors the pipeline's step: ``tool_choice: none`` leaves text as text; otherwise the
    message is validated against the declared tools under the request's rules
    (``validation.CallRules``: the conversation ``messages``, a named ``tool_choice``,
    ``required``, ``parallel_tool_calls``) and promoted by ``repairproxy.repair.promote``.
    """
    if not text_calls_allowed(request):
        return Promotion((), content, False)
    tools = ToolsCache().compile(request)
    if tools is None:
        return Promotion((), content, False)
    message = {"role": "assistant", "content": content}
    rules = CallRules.of_request({**request, "messages": list(messages)})
    verdict = tools.check_message(message, rules=rules)
    flagged = any(call.channel is not Channel.VALID for call in verdict.calls)
    promoted, count = promote(message, verdict)
    if not count:
        return Promotion((), content, flagged)
    calls = tuple(
        (entry["function"]["name"], _decoded(entry["function"]["arguments"]))
        for entry in promoted.get("tool_calls") or ()
    )
    rest = message_text(promoted) if promoted.get("content") is not None else None
    left = tools.check_message(promoted, rules=rules)
    return Promotion(calls, rest, not left.ok)


def _decoded(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _load(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _normalised(text: str | None) -> str:
    return " ".join((text or "").split())


# --- native formats ------------------------------------------------------------------------------


@dataclass(slots=True)
class FamilyScore:
    cases: int = 0
    exact: int = 0
    wrong_arguments: int = 0
    missed: int = 0
    wrapper_left: int = 0
    content_ok: int = 0
    negatives: int = 0
    false_promotions: int = 0
    stripped: int = 0  # cases whose special-token markers were dropped from the text
    stripped_exact: int = 0


def _native_request(case: Mapping[str, Any]) -> dict[str, Any]:
    return {"tools": case["tools"], "tool_choice": "auto"}


def _score_native(
    case: Mapping[str, Any],
    score: FamilyScore,
    failures: list[str],
    answer: Callable[[Mapping[str, Any], str], Promotion] = promote_answer,
) -> None:
    result = answer(_native_request(case), case["text"])
    expected = [(call["name"], call["arguments"]) for call in case["expected_calls"]]
    if not expected:
        score.negatives += 1
        if result.calls:
            score.false_promotions += 1
            failures.append(f"{case['id']}: false promotion {result.calls}")
        return
    score.cases += 1
    score.stripped += bool(case.get("marker_stripped"))
    got_names = [name for name, _ in result.calls]
    if [_canonical(call) for call in result.calls] == [_canonical(call) for call in expected]:
        score.exact += 1
        score.stripped_exact += bool(case.get("marker_stripped"))
        if _normalised(result.content) == _normalised(case["expected_content"]):
            score.content_ok += 1
        else:
            failures.append(
                f"{case['id']}: content {result.content!r} != {case['expected_content']!r}"
            )
    elif got_names == [name for name, _ in expected]:
        score.wrong_arguments += 1
        failures.append(f"{case['id']}: arguments {result.calls} != {expected}")
    else:
        score.missed += 1
        failures.append(f"{case['id']}: got {got_names or 'nothing'}, expected {expected}")
    if result.calls:
        expected_text = case["expected_content"] or ""
        left = [
            marker
            for marker in case.get("wrapper_markers", ())
            if marker in (result.content or "") and marker not in expected_text
        ]
        if left:
            score.wrapper_left += 1
            failures.append(f"{case['id']}: wrapper left {left} in {result.content!r}")


def run_native(family: str | None, verbose: bool, folder: str = "native") -> None:
    files = sorted((DATA / folder).glob("*.jsonl"))
    rows: list[tuple[str, FamilyScore]] = []
    failures: list[str] = []
    for path in files:
        if family is not None and path.stem != family:
            continue
        score = FamilyScore()
        for case in _load(path):
            _score_native(case, score, failures)
        rows.append((path.stem, score))
    total = FamilyScore()
    header = (
        f"{'family':<16} {'cases':>5} {'exact':>6} {'%':>5} {'wrong args':>10} {'missed':>6} "
        f"{'wrapper':>7} {'content':>7} {'stripped':>8} {'negatives':>9} {'false +':>7}"
    )
    print(f"\n{folder} formats (buffered)")
    print(header)
    for name, score in rows:
        _print_family(name, score)
        for field in FamilyScore.__slots__:
            setattr(total, field, getattr(total, field) + getattr(score, field))
    _print_family("ALL", total)
    families_at_goal = sum(1 for _, s in rows if s.cases and s.exact / s.cases >= 0.9)
    print(f"families with >= 90% exact: {families_at_goal}/{len(rows)}")
    below = [name for name, s in rows if s.cases >= 5 and s.exact / s.cases < 0.9]
    print(f"families with >= 5 calls below 90% exact: {len(below)} {' '.join(below)}".rstrip())
    if verbose:
        print("\n".join(failures))


def _print_family(name: str, score: FamilyScore) -> None:
    share = 100 * score.exact / score.cases if score.cases else 0.0
    stripped = f"{score.stripped_exact}/{score.stripped}" if score.stripped else "-"
    print(
        f"{name:<16} {score.cases:>5} {score.exact:>6} {share:>5.0f} {score.wrong_arguments:>10} "
        f"{score.missed:>6} {score.wrapper_left:>7} {score.content_ok:>7} {stripped:>8} "
        f"{score.negatives:>9} {score.false_promotions:>7}"
    )


# --- native formats, streamed ------------------------------------------------------------------


def _chunk_events(content: str, pieces: int) -> list[bytes]:
    """``content`` as the chat-completion chunk stream a server sends (role, pieces, finish)."""
    base = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0, "model": "m"}

    def event(delta: Mapping[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return b"data: " + json.dumps({**base, "choices": [choice]}).encode() + b"\n\n"

    size = max(1, -(-len(content) // pieces))
    events = [event({"role": "assistant", "content": ""})]
    events += [event({"content": content[i : i + size]}) for i in range(0, len(content), size)]
    return [*events, event({}, "stop")]


def _released_content(raw_events: Sequence[bytes]) -> str:
    text = []
    for raw in raw_events:
        payload = raw.removeprefix(b"data: ").strip()
        if not payload.startswith(b"{"):
            continue
        for choice in json.loads(payload).get("choices") or ():
            text.append((choice.get("delta") or {}).get("content") or "")
    return "".join(text)


def _gate(request: Mapping[str, Any]) -> ToolCallGate:
    """The stream gate the proxy puts on a chat stream for ``request`` (its declared tools'
    names, as ``asgi.chat`` passes them)."""
    tools = ToolsCache().compile(request)
    return ToolCallGate(
        hold_text=text_calls_allowed(request), tool_names=tools.names if tools else ()
    )


def stream_answer(request: Mapping[str, Any], content: str, pieces: int = 8) -> Promotion:
    """The proxy's streamed promotion of ``content``: the answer arrives in ``pieces`` content
    deltas through the stream gate (``asgi.gate.ToolCallGate``), which lets prose out at once and
    holds what may open a call; the assembled message is promoted as buffered, and the client
    ends up with the prose already sent plus what the gate sends after the verdict."""
    gate = _gate(request)
    sent: list[bytes] = []
    for raw in _chunk_events(content, pieces):
        sent.extend(gate.feed(SSEEvent(raw, raw.removeprefix(b"data: ").strip())))
    buffered = promote_answer(request, gate.assembler.content or "")
    released = _released_content(sent)
    after = buffered.content
    unsent = getattr(gate, "unsent", None)  # what the gate sends after the verdict
    if unsent is not None:
        message: dict[str, Any] = {"role": "assistant", "content": buffered.content}
        rest = unsent({"choices": [{"index": 0, "message": message}]})
        after = rest["choices"][0]["message"]["content"]
    elif released:
        sent_prose = released.rstrip()
        final = buffered.content or ""
        after = final[len(sent_prose) :].strip() if final.startswith(sent_prose) else None
    streamed = released + (after or "") or None  # the client's deltas, joined
    return Promotion(buffered.calls, streamed, buffered.flagged)


def run_native_streamed(family: str | None, verbose: bool, folder: str = "native") -> None:
    """The native table again, each answer streamed through the gate (``stream_answer``)."""
    rows: list[tuple[str, FamilyScore]] = []
    failures: list[str] = []
    differ: list[str] = []
    content_differ: list[str] = []
    for path in sorted((DATA / folder).glob("*.jsonl")):
        if family is not None and path.stem != family:
            continue
        score = FamilyScore()
        for case in _load(path):
            _score_native(case, score, failures, answer=stream_answer)
            request = _native_request(case)
            streamed = stream_answer(request, case["text"])
            buffered = promote_answer(request, case["text"])
            if streamed.calls != buffered.calls:
                differ.append(f"{case['id']}: streamed {streamed.calls}, buffered {buffered.calls}")
            elif _normalised(streamed.content) != _normalised(buffered.content):
                content_differ.append(
                    f"{case['id']}: streamed content {streamed.content!r}, "
                    f"buffered {buffered.content!r}"
                )
        rows.append((path.stem, score))
    print(f"\n{folder} formats (streamed: 8 content deltas through the stream gate)")
    print(
        f"{'family':<16} {'cases':>5} {'exact':>6} {'%':>5} {'wrong args':>10} {'missed':>6} "
        f"{'wrapper':>7} {'content':>7} {'stripped':>8} {'negatives':>9} {'false +':>7}"
    )
    total = FamilyScore()
    for name, score in rows:
        _print_family(name, score)
        for field in FamilyScore.__slots__:
            setattr(total, field, getattr(total, field) + getattr(score, field))
    _print_family("ALL", total)
    families_at_goal = sum(1 for _, s in rows if s.cases and s.exact / s.cases >= 0.9)
    print(f"families with >= 90% exact: {families_at_goal}/{len(rows)}")
    below = [name for name, s in rows if s.cases >= 5 and s.exact / s.cases < 0.9]
    print(f"families with >= 5 calls below 90% exact: {len(below)} {' '.join(below)}".rstrip())
    print(f"streamed decision differs from the buffered one: {len(differ)}")
    print(
        "same calls, but the client's text differs from the buffered content (part of a call's "
        f"text streamed before the verdict, or prose lost): {len(content_differ)}"
    )
    if verbose:
        print("\n".join([*failures, *differ, *content_differ]))


# --- hostile answers -----------------------------------------------------------------------------

OUTCOMES = ("promoted", "ambiguous", "not_a_call")


def run_hostile(verbose: bool) -> None:
    cases = _load(DATA / "hostile.jsonl")
    by_category: dict[str, Counter[tuple[str, str]]] = {}
    failures: list[str] = []
    wrong_calls = 0
    for case in cases:
        result = promote_answer(case["request"], case["content"], case.get("messages") or ())
        got = result.outcome
        by_category.setdefault(case["category"], Counter())[(case["expected"], got)] += 1
        if got != case["expected"]:
            failures.append(f"{case['id']}: expected {case['expected']}, got {got}")
        elif got == "promoted":
            expected = [(call["name"], call["arguments"]) for call in case["expected_calls"]]
            if [_canonical(c) for c in result.calls] != [_canonical(c) for c in expected]:
                wrong_calls += 1
                failures.append(f"{case['id']}: promoted {result.calls}, expected {expected}")
    print("\nhostile corpus (buffered): outcome got per expected outcome")
    print(f"{'category':<28} {'cases':>5} {'expected':<26} {'got':<40} {'match':>5}")
    totals: Counter[tuple[str, str]] = Counter()
    for category, counts in sorted(by_category.items()):
        totals.update(counts)
        _print_category(category, counts)
    _print_category("ALL", totals)
    unsafe = sum(n for (expected, got), n in totals.items() if got == "promoted" != expected)
    print(f"promoted when not expected (executed calls the model did not ask for): {unsafe}")
    print(f"promoted as expected but with other calls/arguments: {wrong_calls}")
    if verbose:
        print("\n".join(failures))


def stream_hostile(case: Mapping[str, Any], pieces: int) -> tuple[Promotion, bool]:
    """One hostile answer streamed in ``pieces`` content deltas through the stream gate, then
    judged as buffered on what the gate assembled (with the conversation). Also whether any of
    a call's text reached the client before the verdict (it must not: a decline written after
    it would come too late)."""
    request, content = case["request"], case["content"]
    gate = _gate(request)
    sent: list[bytes] = []
    for raw in _chunk_events(content, pieces):
        sent.extend(gate.feed(SSEEvent(raw, raw.removeprefix(b"data: ").strip())))
    result = promote_answer(request, gate.assembler.content or "", case.get("messages") or ())
    released = _released_content(sent)
    markers = ('{"name"', "<tool_call>", "<function=", "call:", *opening_markers())
    early = bool(result.calls) and any(marker in released for marker in markers)
    return result, early


def run_hostile_streamed(verbose: bool, pieces: int = 8) -> None:
    """The hostile table again, each answer streamed (``stream_hostile``): the outcome per
    category, whether it equals the buffered outcome, and calls whose text left early."""
    by_category: dict[str, Counter[tuple[str, str]]] = {}
    failures: list[str] = []
    differ = early_total = 0
    for case in _load(DATA / "hostile.jsonl"):
        streamed, early = stream_hostile(case, pieces)
        buffered = promote_answer(case["request"], case["content"], case.get("messages") or ())
        got = streamed.outcome
        by_category.setdefault(case["category"], Counter())[(case["expected"], got)] += 1
        if got != case["expected"]:
            failures.append(f"{case['id']}: expected {case['expected']}, got {got} (streamed)")
        if (got, streamed.calls) != (buffered.outcome, buffered.calls):
            differ += 1
            failures.append(f"{case['id']}: streamed {got}, buffered {buffered.outcome}")
        if early:
            early_total += 1
            failures.append(f"{case['id']}: the call's text left before the verdict")
    print(f"\nhostile corpus (streamed: {pieces} content deltas through the stream gate)")
    print(f"{'category':<28} {'cases':>5} {'expected':<26} {'got':<40} {'match':>5}")
    totals: Counter[tuple[str, str]] = Counter()
    for category, counts in sorted(by_category.items()):
        totals.update(counts)
        _print_category(category, counts)
    _print_category("ALL", totals)
    unsafe = sum(n for (expected, got), n in totals.items() if got == "promoted" != expected)
    print(f"promoted when not expected (executed calls the model did not ask for): {unsafe}")
    print(f"streamed decision differs from the buffered one: {differ}")
    print(f"promoted calls whose text reached the client before the verdict: {early_total}")
    if verbose:
        print("\n".join(failures))


def _print_category(category: str, counts: Counter[tuple[str, str]]) -> None:
    expected = Counter[str]()
    got = Counter[str]()
    for (want, have), n in counts.items():
        expected[want] += n
        got[have] += n
    match = sum(n for (want, have), n in counts.items() if want == have)

    def shown(counter: Counter[str]) -> str:
        return " ".join(f"{o}={counter[o]}" for o in OUTCOMES if counter[o])

    total = sum(counts.values())
    print(f"{category:<28} {total:>5} {shown(expected):<26} {shown(got):<40} {match:>5}")


# --- repeats in tau2-bench's gold trajectories ----------------------------------------------------


def run_gold_repeats(data_dir: Path) -> None:
    """How the promotion rule treats agents' repeated calls, on τ²-bench's gold actions.

    For every task (``<data>/tau2/domains/<domain>/tasks.json``), the agent's gold actions in
    order; each one is written as text after a conversation holding every earlier gold action as
    an assistant tool call with its result, and promoted as the proxy would. Printed: the actions
    identical (name and arguments) to an earlier one in the same task, how many of those the rule
    promotes, and how many gold actions any rule that refuses repeats would have refused.
    """
    print("\nrepeats in tau2-bench gold trajectories (each gold action written as text)")
    header = ("domain", "tasks", "actions", "repeats", "promoted", "all ok")
    print(f"{header[0]:<10} " + " ".join(f"{name:>8}" for name in header[1:]))
    for domain in ("retail", "telecom", "airline"):
        path = data_dir / "tau2" / "domains" / domain / "tasks.json"
        if not path.exists():
            continue
        tasks = json.loads(path.read_text(encoding="utf-8"))
        actions = repeats = repeats_promoted = promoted_all = 0
        for task in tasks:
            gold = [
                action
                for action in ((task.get("evaluation_criteria") or {}).get("actions") or ())
                if action.get("requestor", "assistant") == "assistant"
            ]
            names = sorted({action["name"] for action in gold})
            tools = [
                {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
                for name in names
            ]
            seen: set[str] = set()
            messages: list[dict[str, Any]] = [{"role": "user", "content": "Help me, please."}]
            for position, action in enumerate(gold):
                call = {"name": action["name"], "arguments": action["arguments"]}
                key = _canonical(call)
                repeated = key in seen
                result = promote_answer({"tools": tools}, json.dumps(call), messages)
                ok = [_canonical({"name": n, "arguments": a}) for n, a in result.calls] == [key]
                actions += 1
                promoted_all += ok
                repeats += repeated
                repeats_promoted += repeated and ok
                seen.add(key)
                call_id = f"call_{position}"
                arguments = json.dumps(action["arguments"])
                function = {"name": action["name"], "arguments": arguments}
                messages += [
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [{"id": call_id, "type": "function", "function": function}],
                    },
                    {"role": "tool", "tool_call_id": call_id, "content": '{"status": "ok"}'},
                ]
        print(
            f"{domain:<10} {len(tasks):>8} {actions:>8} {repeats:>8} {repeats_promoted:>8} "
            f"{promoted_all:>8}"
        )
    print(
        "repeats: gold actions identical to an earlier one of the same task; a rule refusing "
        "repeats would refuse exactly those (this one promotes them: 'promoted')"
    )


# --- real answers stored in docs/ -----------------------------------------------------------------


def _real_answers(docs: Path) -> list[tuple[str, str, str]]:
    """(source, domain, text) of every stored model answer with text: the risk screen's raw
    answers, the demo sweep's model answers, and the assistant turns of the CPU grid's cells with
    repair off (with repair on, the stored turn is already the proxy's)."""
    answers: list[tuple[str, str, str]] = []
    screen = docs / "screen" / "answers.jsonl"
    if screen.exists():
        for row in _load(screen):
            message = row["completion"]["choices"][0]["message"]
            domain = row["point"].split("/", 1)[0]
            answers.append(("screen", domain, message.get("content") or ""))
    for path in sorted(docs.glob("demo-sweep/*/model-answers.jsonl")):
        answers += [("demo-sweep", "retail", row.get("text") or "") for row in _load(path)]
    for path in sorted(docs.glob("cpu-grid/*/off/results.json")):
        domain = path.parent.parent.name.split("-", 1)[0]
        for simulation in json.loads(path.read_text(encoding="utf-8")).get("simulations") or ():
            for message in simulation.get("messages") or ():
                if message.get("role") == "assistant" and message.get("content"):
                    answers.append(("cpu-grid off", domain, message["content"]))
    return [answer for answer in answers if answer[2]]


def run_real_answers(docs: Path, verbose: bool) -> None:
    """What promotion makes of every real model answer stored under ``docs/`` (the domain's
    agent tools declared): per source, the answers, those holding a call shape, and the
    outcome; for the ones that are not a call, the reasons (``textcalls.NotACall``)."""
    from evals.tau2.domains.retail.tools import RetailTools
    from evals.tau2.domains.telecom.agent_tools import TelecomTools
    from repairproxy.textcalls import read_text_calls

    tools = {"retail": RetailTools.openai_tools(), "telecom": TelecomTools.openai_tools()}
    rows: dict[str, Counter[str]] = {}
    listed: list[str] = []
    for source, domain, text in _real_answers(docs):
        declared = tools.get(domain, tools["retail"])
        schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in declared}
        reading = read_text_calls(text, tools=schemas)
        counts = rows.setdefault(source, Counter())
        counts["answers"] += 1
        if not (reading.calls or reading.prose):
            continue
        counts["call shapes"] += 1
        outcome = promote_answer({"tools": declared}, text).outcome
        counts[outcome] += 1
        reasons = sorted({reason.value for _, reason in reading.prose})
        for reason in reasons if outcome == "not_a_call" else ():
            counts[reason] += 1
        listed.append(f"{source} {domain}: {outcome} {reasons} {text[:100]!r}")
    print("\nreal answers stored in docs/ (each with its domain's agent tools declared)")
    for source, counts in rows.items():
        shown = ", ".join(f"{key} {value}" for key, value in counts.items())
        print(f"{source:<14} {shown}")
    if verbose:
        print("\n".join(listed))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=QUESTION)
    parser.add_argument("--verbose", action="store_true", help="list every case that misses")
    parser.add_argument("--family", help="only this native family (file stem)")
    parser.add_argument(
        "--corpus", choices=("native", *FORMAT_CORPORA[1:], "hostile", "real", "all"), default="all"
    )
    parser.add_argument(
        "--tau2-data",
        type=Path,
        help="also measure repeats in τ²-bench's gold trajectories (the data folder)",
    )
    args = parser.parse_args(argv)
    if args.tau2_data is not None:
        run_gold_repeats(args.tau2_data)
        return
    for folder in FORMAT_CORPORA:
        if args.corpus in (folder, "all"):
            run_native(args.family, args.verbose, folder)
            run_native_streamed(args.family, args.verbose, folder)
    if args.corpus in ("hostile", "all"):
        run_hostile(args.verbose)
        run_hostile_streamed(args.verbose)
    if args.corpus in ("real", "all"):
        run_real_answers(DATA.parent.parent.parent / "studies", args.verbose)


if __name__ == "__main__":
    raise SystemExit(run_recorded("textcalls", main))
