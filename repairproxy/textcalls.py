"""Tool calls written as text: every shape the proxy recognises, found, parsed, judged and promoted.

Small and quantized open models often write their call in the answer's text instead of the
structured ``tool_calls`` field, and the upstream's parser misses it: bare JSON
(``{"name": ..., "arguments": ...}`` or a list of them), ``<tool_call>`` blocks, fenced JSON,
``<function=NAME><parameter=K>v</parameter></function>`` XML, the legacy ``function_call`` shape,
and each model family's native format (``repairproxy/native/``, consulted when present).
``find_text_calls`` (``repairproxy.textcall_shapes``) is the one entry point that finds them
all, with their spans; this module judges them and promotes.

Promotion makes the agent *execute* what the text says, so a shape is not enough: the text around
it must say the answer *is* the call. ``read_text_calls`` sorts every call shape found by any
recogniser into one of three outcomes:

* **promoted** (a candidate, kept in ``TextCallReading.calls``): the call stands alone, or ends the
  answer, in a call shape; prose before it ("Let me look that up.") and a reasoning block before it
  do not change that, nor does a closing remark that asks about nothing the call does ("Would you
  like to know more?"). A call opened by a family's special token (``[TOOL_CALLS]``,
  ``<|tool_call>``, ``<｜tool▁calls▁begin｜>``, ``<tool_call>``) is an act, not a quotation, and
  so is bare JSON that opens the answer (Llama 3's format answers with the call object): prose
  glued to it on its line ("Hello[TOOL_CALLS]add{...}", "{...}<|tools_suffix|> After tools.") is
  text of its own, unless it carries a sentence on through the call ("... and the refund went
  through"); the sentences each side are still read as below. Validation then promotes it when it
  names a declared tool with valid arguments and does not conflict with the request.
* **not a call** (``TextCallReading.prose``, with the reason): prose follows it (it is narrated,
  quoted, declined or conditioned: "I called {...} and ...", "I will not run {...} unless ..."),
  it sits inside a sentence, the sentence leading into it declines, conditions, narrates or
  exemplifies ("If you confirm, I'll call: {...}"), the sentence after it makes it wait for the
  user ("Shall I proceed?", "... requires your confirmation"), it sits inside a reasoning block
  (``<think>``, ``<seed:think>``, ``<mm:think>``, ...) or a code fence whose language is not JSON
  or a tool-call tag (```` ```python ````), or it appears verbatim in a tool result or user
  message of the request (an injection). An answer that *presents* calls is not making them:
  after a lead-in such as "Here is an example of how you can call these functions:" (read over
  any fences between) every later call shape is part of the presentation; several values listed
  in one fence are a listing; an answer cut off by the token limit (``finish_reason:
  "length"``, or one that ends inside an unclosed fence or an unclosed value after its calls)
  promotes nothing; an answer calling ``TOOLKIT_RUN`` or more declared tools one after another
  in declared order recites the toolkit. Delivered as text: no re-ask, not a failure.
* **ambiguous**: a candidate that conflicts with the request (``tool_choice`` names another
  function; ``parallel_tool_calls: false`` and more than one call; ``tool_choice: "required"``
  and no valid call). Validation marks these (``CallVerdict.conflict``); they are counted as
  ``tool_call_in_content``, re-asked in ``reflexive``, and never promoted.

A call identical to one made earlier in the conversation is still a call (agents repeat look-ups);
only JSON copied from a tool result or a user message is not. ``promote_calls`` turns chosen calls
into real ``tool_calls`` entries and cuts their text out of the content, keeping the prose.
What is a *valid* call is validation's business: this module knows shapes and text, not tools.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from repairproxy.textcall_shapes import (
    JSON_FENCE_LANGUAGES,
    MAX_JSON_SCANS,
    Shape,
    TextCall,
    _without_spans,
    calls_in_value,
    find_text_calls,
    fresh_call_id,
    json_value_end,
)
from repairproxy.textcall_taint import QuotedCalls
from repairproxy.wire.openai import message_text

__all__ = [
    "JSON_FENCE_LANGUAGES",
    "MAX_JSON_SCANS",
    "TOOLKIT_RUN",
    "NotACall",
    "Shape",
    "TextCall",
    "TextCallReading",
    "calls_in_value",
    "encode_arguments",
    "find_call_in_text",
    "find_text_calls",
    "fresh_call_id",
    "json_value_end",
    "promote_calls",
    "quoted_calls",
    "quoted_texts",
    "read_text_calls",
    "reasoning_spans",
    "stopped_by_length",
]

# --- which call shapes are calls -----------------------------------------------------------------

# Reasoning blocks: whatever they hold is the model thinking, never an action.
_REASONING_TAGS = r"think|thinking|thought|reasoning|seed:think|mm:think"
_REASONING = re.compile(rf"<({_REASONING_TAGS})>.*?(?:</\1>|\Z)", re.DOTALL | re.IGNORECASE)
_REASONING_OPEN = re.compile(rf"<(?:{_REASONING_TAGS})>", re.IGNORECASE)
_REASONING_CLOSE = re.compile(rf"</(?:{_REASONING_TAGS})>", re.IGNORECASE)
# Any fence, with its language; an unterminated one runs to the end of the text.
_ANY_FENCE = re.compile(r"```[ \t]*([^\s`]*)[^\n`]*(?:\n.*?)?(?:```|\Z)", re.DOTALL)
# Words that make the sentence leading into a call (or the one after it) say it is not being made
# now: it is declined, conditioned, narrated (already done) or an example. Any word ending in
# "n't" counts too. Checked on those two sentences only, word by word (one case-insensitive
# regex alternation of them all measured twice as slow).
_CUE_WORDS = frozenset(
    [
        "not",
        "never",
        "cannot",
        "unable",
        "without",
        "unless",
        "if",
        "once",
        "should",
        "would",
        "could",
        "were",
        "whether",
        "might",
        "called",
        "ran",
        "executed",
        "did",
        "was",
        "already",
        "earlier",
        "yesterday",
        "maybe",
        "perhaps",
        "ago",
        "last",
        "example",
        "format",
        "syntax",
        "template",
        "pasted",
        "says",
        "said",
    ]
)
_CUE_PREFIXES = ("refus", "previous", "quot")
_CUE_PHRASES = ("in case", "looks like", "look like")
# Words that present what follows as an example, a listing or an instruction to the reader: once
# an answer does that, every call shape after it in the answer belongs to the presentation.
_EXAMPLE_WORDS = frozenset(
    ["example", "examples", "sample", "format", "syntax", "template", "illustration"]
)
_EXAMPLE_PHRASES = (
    "for instance",
    "such as",
    "e.g",
    "how you",
    "how to call",
    "you can call",
    "you could call",
    "you can use",
)
# A sentence opening with one of these, capitalised, tells the reader what to do.
_INSTRUCTING = frozenset(["use", "call", "run", "invoke", "execute", "try"])
_WORD = re.compile(r"[a-z_]+(?:'[a-z]+)?")  # "last_name" is one word, not "last"
# Each phrase list as one search; and where no word can end in "n't" or start with a prefix.
_EXAMPLE_PHRASE = re.compile("|".join(map(re.escape, _EXAMPLE_PHRASES)))
_CUE_PHRASE = re.compile("|".join(map(re.escape, _CUE_PHRASES)))
_AFFIX_HINT = re.compile("n't|" + "|".join(_CUE_PREFIXES))


class _Cue(enum.Enum):
    NOT_NOW = enum.auto()  # declined, conditioned, narrated
    EXAMPLE = enum.auto()  # presented as an example


def _cue(sentence: str) -> _Cue | None:
    """Whether ``sentence`` declines, conditions, narrates (NOT_NOW) or exemplifies (EXAMPLE)
    what follows it; None when it does neither."""
    lowered = sentence.lower().replace("\u2019", "'")
    found = None
    words = _WORD.findall(lowered)
    if (
        words
        and words[0] in _INSTRUCTING
        and sentence.lstrip("#*-> \t").startswith(words[0].capitalize())
    ):
        return _Cue.EXAMPLE  # "Use the `check_apn_settings()` function to ...": tells the reader
    if not _EXAMPLE_WORDS.isdisjoint(words):
        return _Cue.EXAMPLE
    if not _CUE_WORDS.isdisjoint(words):
        found = _Cue.NOT_NOW
    elif _AFFIX_HINT.search(lowered) is not None:  # then read word by word, to be sure
        for word in words:
            if word.endswith("n't") or word.startswith(_CUE_PREFIXES):
                found = _Cue.NOT_NOW
                break
    if _EXAMPLE_PHRASE.search(lowered) is not None:
        return _Cue.EXAMPLE
    if found is None and _CUE_PHRASE.search(lowered) is not None:
        found = _Cue.NOT_NOW
    return found


# After a call only: words that make it wait for the user ("... Shall I proceed?", "...
# requires your confirmation"). Before a call they are how an agent acts on a confirmation.
_WAITING_PREFIXES = ("confirm", "approv", "permission", "proceed", "shall")


def _not_now(sentence: str, *, after: bool = False) -> bool:
    """Whether ``sentence`` declines, conditions, narrates or exemplifies what follows it; with
    ``after``, the sentence after a call, also whether it makes the call wait for the user."""
    if _cue(sentence) is not None:
        return True
    if not after:
        return False
    lowered = sentence.lower()
    return "go ahead" in lowered or any(
        word.startswith(_WAITING_PREFIXES) for word in _WORD.findall(lowered)
    )


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n")
_SENTENCE_BREAK = re.compile(r"[.!?]\s")  # where _SENTENCE_END splits, other than at a newline
_PROSE_START = re.compile(r"\S")
_SENTENCE_CHARS = 400


class NotACall(enum.StrEnum):
    """Why a call shape in the text is prose, not a call (delivered as text, never re-asked)."""

    REASONING = "inside_reasoning"  # inside <think>...</think> and the like
    CODE = "inside_code_fence"  # inside a fence whose language is not JSON or a tool-call tag
    QUOTED = "quoted_from_conversation"  # verbatim in a tool result or a user message
    IN_SENTENCE = "inside_sentence"  # prose before it on its line ("I would send {...}")
    FOLLOWED = "followed_by_prose"  # prose after it on its line, or a next sentence that declines
    LEAD_IN = "lead_in_not_now"  # the sentence before it declines, conditions, narrates
    EXAMPLE = "presented_as_example"  # after "for example", "e.g.", "how you can call", ...; or
    # one of several values listed in one fence that is not one call
    CUT_OFF = "answer_cut_off"  # cut off by the token limit, or ends inside an unclosed fence
    # or value
    TOOLKIT = "lists_the_declared_tools"  # one call to each of a run of the declared tools


@dataclass(frozen=True, slots=True)
class TextCallReading:
    """The call shapes of one answer's text: the candidate calls, and the ones that are prose."""

    calls: tuple[TextCall, ...]
    prose: tuple[tuple[TextCall, NotACall], ...] = ()


def stopped_by_length(completion: Any) -> bool:
    """Whether an answer (a completion, or one choice of it; choice 0 of a completion) was cut
    off by the token limit (``finish_reason: "length"``): its call shapes are text."""
    if isinstance(completion, Mapping) and isinstance(completion.get("choices"), list):
        choices = completion["choices"]
        completion = choices[0] if choices else None
    return isinstance(completion, Mapping) and completion.get("finish_reason") == "length"


def reasoning_spans(text: str) -> list[tuple[int, int]]:
    """Where the text's reasoning blocks are; a closing tag with no opening one (the chat
    template opened the block in the prompt) makes everything before it reasoning."""
    if "<" not in text and "[THINK]" not in text and "[/THINK]" not in text:
        return []
    spans = [match.span() for match in _REASONING.finditer(text)]
    close = _REASONING_CLOSE.search(text)
    if close is not None:
        opening = _REASONING_OPEN.search(text, 0, close.start())
        if opening is None:
            spans = [(0, close.end()), *(s for s in spans if s[0] >= close.end())]
    spans = _section_ends_reasoning(text, spans)
    for opener, closer in _FAMILY_REASONING:
        if closer in text or opener in text:
            spans.extend(_marker_blocks(text, opener, closer))
    return spans


# The reasoning channels families' templates write with their own markers (Command R7B, Apertus,
# Gemma 4, Mistral's Magistral): like ``<think>``, a closer with no opener before it (the
# template opened the block in the prompt) makes everything before it reasoning.
_FAMILY_REASONING = (
    ("<|START_THINKING|>", "<|END_THINKING|>"),
    ("<|inner_prefix|>", "<|inner_suffix|>"),
    ("<|channel>thought", "<channel|>"),
    ("[THINK]", "[/THINK]"),
)
# Kimi K2's call-section token ends an unclosed reasoning block (its template emits it in place
# of ``</think>``).
_SECTION_ENDS_REASONING = "<|tool_calls_section_begin|>"


def _marker_blocks(text: str, opener: str, closer: str) -> list[tuple[int, int]]:
    """The blocks ``opener ... closer`` of ``text`` (one unclosed runs to the end; a first closer
    with no opener before it closes a block opened at the start), one pass."""
    blocks: list[tuple[int, int]] = []
    position = 0
    while True:
        start = text.find(opener, position)
        close = text.find(closer, position)
        if close >= 0 and (start < 0 or close < start):
            if not blocks and position == 0:
                blocks.append((0, close + len(closer)))
            position = close + len(closer)
            continue
        if start < 0:
            return blocks
        close = text.find(closer, start + len(opener))
        end = close + len(closer) if close >= 0 else len(text)
        blocks.append((start, end))
        if close < 0:
            return blocks
        position = end


def _section_ends_reasoning(text: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """An unclosed reasoning block that runs to the end stops at Kimi K2's call-section token."""
    if not spans or spans[-1][1] != len(text) or _SECTION_ENDS_REASONING not in text:
        return spans
    start, end = spans[-1]
    section = text.find(_SECTION_ENDS_REASONING, start)
    if section < 0 or _REASONING_CLOSE.search(text, start, end) is not None:
        return spans
    return [*spans[:-1], (start, section)]


@dataclass(frozen=True, slots=True)
class _Fences:
    """The text's fenced blocks, read once: code (a language that is not JSON), listings (a JSON
    fence that is not one call value), every fence, and whether the last one is left open."""

    code: Sequence[tuple[int, int]]
    json: Sequence[tuple[int, int]]
    every: Sequence[tuple[int, int]]
    open_at_end: bool

    @classmethod
    def of(cls, text: str) -> _Fences:
        if "```" not in text:
            return _NO_FENCES
        code: list[tuple[int, int]] = []
        json_fences: list[tuple[int, int]] = []
        every: list[tuple[int, int]] = []
        open_at_end = False
        for match in _ANY_FENCE.finditer(text):
            every.append(match.span())
            is_json = match.group(1).lower() in JSON_FENCE_LANGUAGES
            (json_fences if is_json else code).append(match.span())
            block = match.group()
            open_at_end = len(block) <= 3 or not block.endswith("```")
        return cls(code, json_fences, every, open_at_end)


_NO_FENCES = _Fences((), (), (), open_at_end=False)


def _ends_inside_a_value(text: str, after: int) -> bool:
    """Whether what follows the last call shape is a bracket that never closes: the answer was
    cut off while writing another value (the token limit), so it is unfinished."""
    start = _PROSE_START.search(text, after)
    return (
        start is not None
        and text[start.start()] in "{["
        and json_value_end(text, start.start()) is None
    )


def _unclosed(call: TextCall) -> bool:
    """Whether a function-XML call ran to the end of the text with neither ``</function>`` nor
    its tag's ``</tool_call>``: cut off inside its values (no server strips those as stop
    tokens), so whatever finish reason came with it, its arguments are not known."""
    if call.shape not in (Shape.XML, Shape.TAGGED) or "<function=" not in call.source:
        return False
    return "</function>" not in call.source and "</tool_call>" not in call.source


def _is_a_fence(call: TextCall) -> bool:
    """Whether the call's shape is a whole JSON fence (read built in, or by the native reading
    of Command R+'s ``tool_name`` fence)."""
    return call.shape is Shape.FENCED or call.family == "fenced_json"


def _inside(call: TextCall, spans: Sequence[tuple[int, int]]) -> bool:
    return any(start <= call.start and call.end <= end for start, end in spans)


def quoted_texts(messages: Any) -> tuple[str, ...]:
    """The texts of a conversation's tool results and user messages: JSON copied from them into
    an answer is an injection, not a call."""
    if not isinstance(messages, list):
        return ()
    texts = []
    for message in messages:
        if isinstance(message, Mapping) and message.get("role") in ("tool", "function", "user"):
            text = message_text(message)
            if "{" in text or "<" in text or "[" in text:
                texts.append(text)
    return tuple(texts)


def _call_key(name: str | None, arguments: Any) -> tuple[str, str]:
    try:
        canonical = orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        canonical = repr(arguments)
    if isinstance(arguments, str):
        canonical = arguments
    return str(name), canonical


def quoted_calls(conversation: Any) -> QuotedCalls:
    """The request's non-assistant content indexed for taint (``textcall_taint``): a
    ``QuotedCalls`` already built for the request is used as it is."""
    if isinstance(conversation, QuotedCalls):
        return conversation
    return QuotedCalls(conversation, find_text_calls)


def _quoted(calls: Sequence[TextCall], quoted: QuotedCalls) -> set[int]:
    """Indices of ``calls`` whose name and arguments the request's tool results, user turns or
    system documents already hold (an injection, echoed), or whose text they hold verbatim."""
    if quoted.empty:
        return set()
    return {
        i for i, call in enumerate(calls) if quoted.holds(call.name, call.arguments, _core(call))
    }


def _core(call: TextCall) -> str:
    """The call's own text without a wrapper around it (a tag, a fence), to find it verbatim."""
    source = call.source
    if call.shape in (Shape.TAGGED, Shape.FENCED):
        inner = source.find("{")
        last = source.rfind("}")
        if 0 <= inner < last:
            return source[inner : last + 1]
    return source.strip()


def read_text_calls(
    text: str,
    *,
    conversation: Any = None,
    tools: Mapping[str, Mapping[str, Any]] | None = None,
    cut_off: bool = False,
) -> TextCallReading:
    """Every call shape of ``text``, sorted into candidate calls and prose (see the module doc).

    ``conversation``: the request's messages; JSON copied from their tool results and user
    messages is not a call (read only when the answer holds a candidate). ``cut_off``: the
    answer was cut off by the token limit (``finish_reason: "length"``): it promotes nothing,
    whatever it ends with. Whatever recogniser found a shape, the same rules apply to it.
    """
    found = find_text_calls(text, tools)
    if not found:
        return TextCallReading(())
    prose: list[tuple[TextCall, NotACall]] = []
    reasoning = reasoning_spans(text)
    fences = _Fences.of(text)
    cut_off = (
        cut_off
        or fences.open_at_end
        or _ends_inside_a_value(text, max([call.end for call in found]))
    )
    candidates: list[TextCall] = []
    for call in found:
        if reasoning and _inside(call, reasoning):
            prose.append((call, NotACall.REASONING))
        elif fences.code and _inside(call, fences.code):
            prose.append((call, NotACall.CODE))
        elif fences.json and not _is_a_fence(call) and _inside(call, fences.json):
            # A JSON fence that is not itself one call value lists several (alternatives, a
            # commented sample): a listing, not an act.
            prose.append((call, NotACall.EXAMPLE))
        elif cut_off or _unclosed(call):
            prose.append((call, NotACall.CUT_OFF))
        else:
            candidates.append(call)
    copied = _quoted(candidates, quoted_calls(conversation)) if candidates else None
    if copied:
        prose.extend((call, NotACall.QUOTED) for i, call in enumerate(candidates) if i in copied)
        candidates = [call for i, call in enumerate(candidates) if i not in copied]
    if candidates:
        candidates = _standing(text, candidates, [*reasoning, *fences.every], prose)
    if len(candidates) >= TOOLKIT_RUN and tools and _lists_the_tools(text, candidates, tools):
        prose.extend((call, NotACall.TOOLKIT) for call in candidates)
        candidates = []
    if prose:
        prose.sort(key=lambda item: item[0].start)
    return TextCallReading(tuple(candidates), tuple(prose))


# An answer calling this many declared tools one after another, in the order they are declared
# (get_user_details, list_all_product_types, modify_pending_order_address, ...), is reciting the
# toolkit with made-up arguments, not acting: a small model's degenerate answer, seen in the
# study's screen (Qwen2.5-Coder-0.5B, 4 of 80 answers). Agents act one or two calls at a time.
TOOLKIT_RUN = 4


def _lists_the_tools(text: str, calls: Sequence[TextCall], tools: Mapping[str, Any]) -> bool:
    """Whether ``calls`` name a run of consecutive declared tools, each once, in declared order,
    written as plain text (calls opened by a family's special token are acts: harmony's one
    message per call)."""
    if any(_SPECIAL_OPENER.match(text, call.start) for call in calls):
        return False
    position = {name: index for index, name in enumerate(tools)}
    places = [position.get(call.name) if call.name is not None else None for call in calls]
    if None in places:
        return False
    first = places[0]
    return first is not None and places == list(range(first, first + len(places)))


def _standing(
    text: str,
    calls: Sequence[TextCall],
    blocks: Sequence[tuple[int, int]],
    prose: list[tuple[TextCall, NotACall]],
) -> list[TextCall]:
    """The calls that stand on their own lines, with no sentence around them saying they are not
    made now; every other one goes to ``prose`` with its reason. Once a call is presented as an
    example, every call after it in the answer is part of that presentation."""
    # Neither reasoning, fenced blocks nor calls are prose: blank them out (offsets kept), so the
    # sentence leading into a call is the last sentence of prose before it, whatever blocks sit
    # between ("Here is an example:", then several fences: the lead-in governs them all).
    pieces: list[str] = []
    position = 0
    spans = [(call.start, call.end) for call in calls]
    if blocks:
        spans += blocks
    spans.sort()
    for start, end in spans:
        start = max(start, position)
        if end > start:
            pieces += [text[position:start], " " * (end - start)]
            position = end
    rest = "".join([*pieces, text[position:]])
    kept: list[TextCall] = []
    verdicts: dict[tuple[int, int], NotACall | None] = {}
    presenting = False
    instructed = _instructs_the_reader(rest)
    for call in calls:
        span = (call.start, call.end)
        if span not in verdicts:
            opened = _SPECIAL_OPENER.match(text, call.start) is not None or _opens_the_answer(
                rest, call
            )
            presenting = presenting or call.start > instructed
            verdicts[span] = (
                NotACall.EXAMPLE if presenting else _standing_reason(rest, *span, opened=opened)
            )
            presenting = verdicts[span] is NotACall.EXAMPLE
        reason = verdicts[span]
        if reason is None:
            kept.append(call)
        else:
            prose.append((call, reason))
    return kept


def _opens_the_answer(rest: str, call: TextCall) -> bool:
    """Whether ``call`` is bare JSON with nothing but blanked blocks (reasoning, other calls)
    before it: Llama 3's JSON format, whose template has the model answer with the call object
    itself, so prose after it on its line is a remark of its own, read like a next sentence."""
    bare = call.shape is Shape.JSON or (call.shape is Shape.NATIVE and call.family == "json")
    return bare and not rest[: call.start].strip()


# Prose telling the reader how to use the tools ("You can do this by calling the `X` function",
# "Use the `X` function to ..."): an answer that does so presents the calls after it, wherever
# in the answer it says so. Lowered phrases, and capitalised imperatives before a code span.
_TO_THE_READER = (
    "you can use",
    "you can call",
    "you could use",
    "you could call",
    "you can do this by",
    "you need to call",
    "you need to use",
    "you will need to call",
    "you will need to use",
)
_IMPERATIVE_TOOL = ("Use the `", "Call the `", "Run the `")
_TOOL_NEAR = 60  # characters after "you can use" where the tool it means is named


def _instructs_the_reader(prose: str) -> int:
    """Where the prose first tells the reader how to use the tools (len(prose) when it never
    does). A "you can use" counts when a tool follows it closely (a code span, "function",
    "tool"): "you can use it later" is about something else."""
    first = len(prose)
    lowered = prose.lower()
    # Every phrase starts with "you ", every imperative holds "the `": most prose has neither.
    for phrase in _TO_THE_READER if "you " in lowered else ():
        at = lowered.find(phrase)
        while 0 <= at < first:
            near = lowered[at + len(phrase) : at + len(phrase) + _TOOL_NEAR]
            if "`" in near or "function" in near or "tool" in near:
                first = at
                break
            at = lowered.find(phrase, at + len(phrase))
    for phrase in _IMPERATIVE_TOOL if "the `" in prose else ():
        at = prose.find(phrase)
        if 0 <= at < first:
            first = at
    return first


def _standing_reason(rest: str, start: int, end: int, *, opened: bool) -> NotACall | None:
    """Why the call at ``start:end`` is not a call, read from the prose ``rest`` around it.

    ``opened``: the call opens with a family's special token (``[TOOL_CALLS]``,
    ``<|tool_call>``, ``<｜tool▁calls▁begin｜>``): a token a model emits to act, not to quote,
    so prose glued before it on its line is no sentence it sits in, and prose after it on its
    line is a remark of its own unless it continues a sentence ("... and the refund went
    through"). The sentence each side is still read for what declines, conditions, narrates.
    """
    line_start = rest.rfind("\n", 0, start) + 1
    line_end = rest.find("\n", end)
    before = rest[line_start:start].strip()
    # Glued to a template's markup (``to=NAME<|message|>``, ``</think>``): no sentence.
    markup = before.endswith(">") and _TAG_AT_END.search(before[-_TAG_CHARS:]) is not None
    if (
        before
        and not markup
        and (before[-1] in _QUOTING or (before[-1] not in ".!?:" and not opened))
    ):
        return NotACall.IN_SENTENCE
    after = rest[end : len(rest) if line_end < 0 else line_end].strip()
    if after and not (opened and not _continues(after)) and not _closing_remark(after):
        return NotACall.FOLLOWED
    # One sentence of prose each side is read, over any blanked block between (a sentence
    # longer than _SENTENCE_CHARS is cut).
    prose_end = len(rest[:start].rstrip())
    before = rest[max(0, prose_end - _SENTENCE_CHARS) : prose_end]
    if "\n" in before or _SENTENCE_BREAK.search(before) is not None:
        leading = [s for s in _SENTENCE_END.split(before) if s.strip()]
    else:  # one sentence (what the split would return, for less)
        leading = [before] if before.strip() else []
    cue = _cue(leading[-1]) if leading else None
    if cue is not None:
        return NotACall.EXAMPLE if cue is _Cue.EXAMPLE else NotACall.LEAD_IN
    next_prose = _PROSE_START.search(rest, end)
    if next_prose is None:
        return None  # nothing follows
    prose_start = next_prose.start()
    window = rest[prose_start : prose_start + _SENTENCE_CHARS]
    # The first sentence of it (the window opens on a non-blank character, so no split there).
    split = _SENTENCE_END.search(window)
    following = window if split is None else window[: split.start()]
    if _not_now(following, after=True) and not _closing_remark(following):
        return NotACall.FOLLOWED
    return None


# A family's special token, spelled as the servers write it when they keep it in the text.
# ``<tool_call>`` is one too, an added token in the Qwen and Hermes tokenizers.
_SPECIAL_OPENER = re.compile(
    r"\s*(?:<\|[A-Za-z_]+\|?>|<｜[^｜<>\n]{1,40}｜>|\[TOOL_CALLS\]|<tool_calls?>|<TOOLCALL>"
    r"|<[a-z]+:(?:tool_call|function_calls)>|<start_function_call>|<function_calls>"
    r"|<steptml:invoke|<\|message_sep\|>)"
)
# A tag (or a special token) closing the prose before a call: markup, not a sentence.
_TAG_AT_END = re.compile(r"<[^<>\s]{1,60}(?:\s[^<>]{0,200})?>\Z")
_TAG_CHARS = 263  # the longest tag _TAG_AT_END reads: only that much of the line is searched
# A call right after one of these is quoted, in a parenthesis or a block quote, however it opens.
_QUOTING = frozenset("\"'`\u201c\u2018\u00ab>(")
_QUOTED_END = ('"', "'", "`", "\u201d", "\u2019", "\u00bb", ")")
# Words that, first after a call, carry the sentence on through it: the call is part of it.
_CONTINUING = frozenset(
    [
        *("and", "but", "or", "nor", "so", "then", "which", "that", "who", "whose", "to", "for"),
        *("with", "because", "since", "unless", "until", "if", "when", "while", "after"),
        *("before", "once", "as", "was", "were", "is", "are", "has", "have", "had", "did"),
        *("does", "do", "will", "would", "could", "should", "can", "may", "might", "must"),
        *("went", "worked"),
    ]
)
# Remarks that close an answer without saying anything about the call (asked about nothing it
# does): one of these after a call does not make it prose. Matched whole, on the lowered text.
_CLOSING_REMARK = re.compile(
    r"(?:would you like to know more|do you want to know more|is there anything else[^.!?]*"
    r"|anything else|hope (?:this|that) helps|let me know if you need anything else)[.!?]*"
)


def _continues(after: str) -> bool:
    """Whether the prose right after a call carries its sentence on (a lowercase joining word,
    a comma or dash: "{...}, and the refund went through"), or ends it as a question
    ("[TOOL_CALLS]refund_order{...}?")."""
    if after.startswith(("?", ",", ";", "\u2014", "\u2013", " - ", *_QUOTED_END)):
        return True
    word = _WORD.match(after)
    # A joining word carries the sentence on only when words follow it ("after" alone is a
    # remark of its own: DeepSeek V3.1's template writes content after the call section).
    return (
        word is not None
        and word.group() in _CONTINUING
        and _WORD.search(after.lower(), word.end()) is not None
    )


def _closing_remark(sentence: str) -> bool:
    return _CLOSING_REMARK.fullmatch(sentence.strip().lower()) is not None


def find_call_in_text(text: str) -> tuple[str | None] | None:
    """``(name,)`` of the first call written in ``text`` (name None when unreadable), else None."""
    calls = find_text_calls(text)
    return (calls[0].name,) if calls else None


# --- promotion -----------------------------------------------------------------------------------


def encode_arguments(arguments: Any) -> str | None:
    """Arguments as the JSON string a ``tool_calls`` entry carries; None when not encodable."""
    if isinstance(arguments, str):
        return arguments
    try:
        return orjson.dumps(arguments).decode()
    except TypeError:  # orjson.JSONEncodeError: too deep, or not JSON at all
        return None


_STRAY_CLOSERS = "}] \t\r\n"


def promote_calls(
    message: Mapping[str, Any],
    calls: Sequence[TextCall],
    *,
    new_id: Callable[[], str] = fresh_call_id,
) -> dict[str, Any]:
    """A copy of ``message`` where ``calls`` (found in its text) are real ``tool_calls`` entries.

    Their text is cut out of the content, the prose around them kept (content None when nothing
    is left, or only closing brackets the call left behind); existing structured calls stay
    first. The input is never mutated.
    """
    promoted = dict(message)
    entries = list(message.get("tool_calls") or ())
    cut: list[tuple[int, int]] = []
    # Calls written together (one JSON list, one tag) share their text: all of them or none.
    by_span: dict[tuple[int, int], list[TextCall]] = {}
    for call in calls:
        by_span.setdefault((call.start, call.end), []).append(call)
    for span, group in by_span.items():
        encoded = [encode_arguments(call.arguments) for call in group]
        if any(call.name is None for call in group) or None in encoded:
            continue
        for call, arguments in zip(group, encoded, strict=True):
            entries.append(
                {
                    "id": new_id(),
                    "type": "function",
                    "function": {"name": call.name, "arguments": arguments},
                }
            )
        cut.extend(group[0].cuts or (span,))
    if not cut:
        return promoted
    rest = _without_spans(message_text(message), cut)
    # A bracket the model wrote one too many after its call (``{...}}}``) is not prose.
    promoted["content"] = None if not rest.strip(_STRAY_CLOSERS) else rest
    promoted["tool_calls"] = entries
    return promoted
