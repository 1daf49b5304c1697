"""A deterministic user simulator built from a task's scenario: no model, same turns every run.

It is the cheap user for CPU grids and demos. It opens with the task's reason for calling (in the
first person, up to the first conditional instruction), answers the agent's requests for facts the
scenario states (name, zip, email, user id, order ids, phone) and says which it does not know,
answers confirmation questions with "yes", performs the user-device tools the agent names (Telecom)
and reports what they returned, ends with ``###TRANSFER###`` when the agent hands it to a human and
with ``###STOP###`` when the agent asks nothing more, as τ²-bench's simulation guidelines ask.
A question it cannot answer twice in a row ends the episode with ``###OUT-OF-SCOPE###``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from evals.tau2.logs import AssistantMessage, Message, ToolCall, ToolMessage, UserMessage
from evals.tau2.participants import OUT_OF_SCOPE, STOP, TRANSFER, EpisodeContext
from evals.tau2.tasks import Task

__all__ = [
    "ScriptedUser",
    "UserFacts",
    "extract_facts",
    "first_person",
    "opening_message",
]

MAX_TURNS = 30  # a conversation that goes nowhere ends as a stop, never as max_steps
MAX_UNANSWERED = 2

_NAME = re.compile(
    r"\b(?i:you are|your name is|you name is|you're|name is|called)\s+"
    r"([A-Z][a-z'\-]+(?:\s+[A-Z][a-z'\-]+)*)"
)
_ZIP = re.compile(r"\b(\d{5})\b")
_EMAIL = re.compile(r"[A-Za-z0-9._+\-]+@[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)+")
_USER_ID = re.compile(r"\b([a-z]+_[a-z]+_\d{3,5})\b")
_ORDER_ID = re.compile(r"#W\d+")
_PHONE = re.compile(r"\b\d{3}-\d{3}-\d{4}\b")
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
# Sentences that steer how the user reacts later ("If the agent ...") are not said up front.
_CONDITIONAL = re.compile(
    r"^(if|when|whenever|but|make sure|unless|in case|only|should|ask|finally|lastly|"
    r"at the end|don't|do not|never|once|after|before|then)\b",
    re.IGNORECASE,
)
# Notes to the simulator about the agent ("do not reveal it to the agent") are never said.
_ASIDE = re.compile(r"\bagent\b|\breveal|\bmention|^\(", re.IGNORECASE)
_PAYMENT = re.compile(r"\b(paypal|gift card|credit card|visa|mastercard)\b", re.IGNORECASE)


@dataclass(frozen=True)
class UserFacts:
    """What the scenario says the user knows about themselves."""

    name: str | None = None
    zip_code: str | None = None
    emails: tuple[str, ...] = ()
    user_id: str | None = None
    order_ids: tuple[str, ...] = ()
    phone: str | None = None
    payment: str | None = None
    unknown: str = ""  # the scenario's ``unknown_info``, lower-cased


def _instructions(scenario: Mapping[str, Any]) -> dict[str, str]:
    instructions = scenario.get("instructions")
    if isinstance(instructions, Mapping):
        return {str(k): str(v) for k, v in instructions.items() if v is not None}
    return {"reason_for_call": str(instructions or "")}


def extract_facts(scenario: Mapping[str, Any]) -> UserFacts:
    """The facts stated in a task's ``user_scenario`` (``known_info`` first, then the reason)."""
    parts = _instructions(scenario)
    known = parts.get("known_info", "")
    everything = " ".join(
        parts.get(key, "") for key in ("known_info", "reason_for_call", "task_instructions")
    )
    name = _NAME.search(known)
    zip_code = _ZIP.search(known)
    user_id = _USER_ID.search(known) or _USER_ID.search(everything)
    phone = _PHONE.search(known) or _PHONE.search(everything)
    payment = _PAYMENT.search(parts.get("reason_for_call", ""))
    emails = tuple(dict.fromkeys(e.rstrip(".") for e in _EMAIL.findall(everything)))
    spoken: str | None = name.group(1) if name else None
    if spoken is None and user_id is not None:  # "You are emma_smith_8564": Emma Smith
        first, last, _ = user_id.group(1).split("_")
        spoken = f"{first.title()} {last.title()}"
    return UserFacts(
        name=spoken,
        zip_code=zip_code.group(1) if zip_code else None,
        emails=emails,
        user_id=user_id.group(1) if user_id else None,
        order_ids=tuple(dict.fromkeys(_ORDER_ID.findall(everything))),
        phone=phone.group(0) if phone else None,
        payment=payment.group(1) if payment else None,
        unknown=parts.get("unknown_info", "").lower(),
    )


_PRONOUNS = (
    (r"\byou are\b", "I am"),
    (r"\byou're\b", "I'm"),
    (r"\byou'd\b", "I'd"),
    (r"\byou've\b", "I've"),
    (r"\byou'll\b", "I'll"),
    (r"\byou were\b", "I was"),
    (r"\byourself\b", "myself"),
    (r"\byours\b", "mine"),
    (r"\byour\b", "my"),
    # "you" after a preposition or a verb that takes a person is "me", otherwise "I".
    (
        r"\b(to|for|with|at|from|about|give|gives|tell|tells|ask|asks|let|lets|help|helps|"
        r"offer|offers|send|sends|show|shows|provide|provides|call|calls|contact|contacts)"
        r"\s+you\b",
        r"\1 me",
    ),
    (r"\byou\b", "I"),
)


def first_person(text: str) -> str:
    """The scenario's second person ("You received your order") as the user says it."""
    for pattern, replacement in _PRONOUNS:
        text = re.sub(pattern, replacement, text, flags=re.IGNORECASE)
    return re.sub(r"(^|[.!?]\s+)([a-z])", lambda m: m.group(1) + m.group(2).upper(), text)


def opening_message(scenario: Mapping[str, Any]) -> str:
    """The first message: the reason for calling, up to its first conditional instruction."""
    reason = _instructions(scenario).get("reason_for_call", "").strip().lstrip(".,; ")
    sentences = [s for s in _SENTENCE.split(reason) if s.strip()]
    said = sentences[:1] + _takewhile_plain(sentences[1:])
    text = " ".join(said) if said else "I need some help with my account."
    return f"Hi! {first_person(text)}"


def _takewhile_plain(sentences: Sequence[str]) -> list[str]:
    taken = []
    for sentence in sentences:
        if _CONDITIONAL.match(sentence.strip()):
            break
        if not _ASIDE.search(sentence):
            taken.append(sentence)
    return taken


# --- reading the agent's turn -------------------------------------------------------------------

_TRANSFER = re.compile(r"\btransferr(?:ed|ing)\b.*\b(human|hold|representative|specialist)\b")
# A turn that asks the user for something: a question, or a request in words.
_REQUEST = re.compile(
    r"\?|\b(please|provide|tell me|let me know|share|could you|can you|would you|i need your)\b"
)
_ANYTHING_ELSE = re.compile(r"\banything else\b|\bother (?:questions|requests)\b")
_CONFIRM = re.compile(
    r"\b(confirm|proceed|shall i|should i|would you like|do you want|go ahead|is that correct|"
    r"is this correct|is that right|yes/no|okay to|ok to|can i go|may i)\b"
)
_ASKS = {
    "name": re.compile(r"\b(full name|first name|last name|your name|name and)\b"),
    "zip": re.compile(r"\b(zip|postal)\b"),
    "email": re.compile(r"\be-?mail\b"),
    "user_id": re.compile(r"\buser ?id\b|\busername\b"),
    "order": re.compile(r"\border (?:id|number)s?\b|\bwhich order\b"),
    "phone": re.compile(r"\bphone number\b"),
    "payment": re.compile(r"\bpayment method\b|\brefund (?:to|method)\b|\blike to pay\b"),
}
_IDENTITY = ("name", "zip", "email", "user_id", "phone")

# Device tools are named verb_noun...; the agent names them in words ("turn airplane mode off").
_VERBS = {
    "check": ("check", "look", "see", "what", "show", "tell", "status", "verify"),
    # Not "on"/"off" alone: "is your data on?" asks to look, not to flip a switch.
    "toggle": ("toggle", "turn", "switch", "enable", "disable"),
    "turn": ("turn", "switch", "enable", "disable"),
    "reset": ("reset", "restore", "default"),
    "reseat": ("reseat", "remove", "reinsert", "re-insert", "take out"),
    "run": ("run", "perform", "do", "test"),
    "can": ("can", "able", "try", "send", "make"),
    "reboot": ("reboot", "restart"),
    "connect": ("connect",),
    "disconnect": ("disconnect",),
}


def _tool_words(name: str) -> tuple[str, list[str]]:
    verb, *nouns = name.split("_")
    return verb, [n for n in nouns if n not in {"status", "the", "a", "to"}] or nouns


def _mentions(text: str, word: str) -> int:
    """Position of ``word`` (or its stem) in ``text``, -1 when absent."""
    stem = word[:-1] if len(word) > 4 and word.endswith("s") else word
    match = re.search(rf"\b{re.escape(stem)}", text)
    return match.start() if match else -1


def requested_tools(text: str, tools: Sequence[Mapping[str, Any]]) -> list[str]:
    """The user-device tools (without required arguments) the agent asks for, in spoken order."""
    found: list[tuple[int, int, str]] = []
    for tool in tools:
        function = tool.get("function", tool)
        name = str(function.get("name", ""))
        if (function.get("parameters") or {}).get("required"):
            continue
        verb, nouns = _tool_words(name)
        positions = [_mentions(text, noun) for noun in nouns]
        if not nouns or min(positions) < 0:
            continue
        if not any(_mentions(text, v) >= 0 for v in _VERBS.get(verb, (verb,))):
            continue
        found.append((min(positions), -len(nouns), name))
    chosen: list[str] = []
    taken: set[int] = set()
    for position, _, name in sorted(found):
        if position in taken:  # one phrase names one tool: the most specific match wins
            continue
        taken.add(position)
        chosen.append(name)
    return chosen


@dataclass
class _State:
    opened: bool = False
    turns: int = 0
    unanswered: int = 0
    calls: int = 0


def _raw_task(task: Task | Mapping[str, Any]) -> Mapping[str, Any]:
    """The task as ``tasks.json`` holds it, whether typed or raw."""
    return task.raw() if isinstance(task, Task) else task


class ScriptedUser:
    """The deterministic user for one episode (the ``User`` protocol of
    ``evals.tau2.participants``)."""

    def __init__(self, context: EpisodeContext) -> None:
        scenario = _raw_task(context.task).get("user_scenario") or {}
        self._opening = opening_message(scenario)
        self._reason = first_person(_instructions(scenario).get("reason_for_call", ""))
        self._facts = extract_facts(scenario)
        self._tools = list(context.user_tools)
        self._state = _State()

    async def generate(self, incoming: Sequence[Message]) -> UserMessage:
        state = self._state
        state.turns += 1
        if not state.opened:
            state.opened = True
            return UserMessage(content=self._opening)
        spoken = [m for m in incoming if isinstance(m, AssistantMessage)]
        if incoming and not spoken:  # the results of this user's own tool calls
            return UserMessage(content=self._report(incoming))
        if state.turns > MAX_TURNS:
            return UserMessage(content=f"Thanks, I have to go. {STOP}")
        text = " ".join(m.content or "" for m in spoken)
        return self._answer(text)

    def _report(self, results: Sequence[Message]) -> str:
        tool_messages: list[ToolMessage] = []
        for message in results:  # single results, or τ²-bench's multi-tool messages
            if isinstance(message, ToolMessage):
                tool_messages.append(message)
            else:
                tool_messages.extend(getattr(message, "tool_messages", None) or [])
        seen = "; ".join((m.content or "").strip() for m in tool_messages)
        return f"I did that. This is what I see: {seen}"

    def _answer(self, text: str) -> UserMessage:
        # Tool names may be spelled out ("toggle_airplane_mode"): underscores read as spaces.
        lowered = " ".join(text.lower().replace("_", " ").split())
        if _TRANSFER.search(lowered):
            return UserMessage(content=TRANSFER)
        # Only what the agent asks counts: "refunded to your payment method." asks for nothing.
        requests = [s for s in _SENTENCE.split(lowered) if _REQUEST.search(s)]
        if not requests:  # statements only: the agent asks nothing more
            return UserMessage(content=f"Thank you! {STOP}")
        asked_text = " ".join(requests)
        tools = requested_tools(asked_text, self._tools)
        if tools:
            self._state.unanswered = 0
            calls = []
            for name in tools:
                self._state.calls += 1
                calls.append(ToolCall(id=f"user_call_{self._state.calls}", name=name, arguments={}))
            return UserMessage(tool_calls=calls)
        asked: list[str] = []
        confirm = False
        for sentence in requests:
            facts = [fact for fact, pattern in _ASKS.items() if pattern.search(sentence)]
            asked += [f for f in facts if f not in asked]
            # "Shall I refund it to your PayPal?" confirms; "which payment method?" asks.
            confirm = confirm or (not facts and bool(_CONFIRM.search(sentence)))
        if asked:
            self._state.unanswered = 0
            answer = self._give(asked)
            return UserMessage(content=f"{answer} Yes, please go ahead." if confirm else answer)
        if _ANYTHING_ELSE.search(asked_text):
            return UserMessage(content=f"No, that's all. Thank you! {STOP}")
        if confirm:
            self._state.unanswered = 0
            return UserMessage(content="Yes, please go ahead.")
        self._state.unanswered += 1
        if self._state.unanswered > MAX_UNANSWERED:
            return UserMessage(content=OUT_OF_SCOPE)
        return UserMessage(content=f"I'm not sure. What I need is this: {self._reason}")

    def _give(self, asked: list[str]) -> str:
        explicit = list(asked)
        if any(a in _IDENTITY for a in asked):
            # Identity questions usually offer alternatives ("email, or name and zip"): give all.
            asked = list(dict.fromkeys([*asked, *_IDENTITY]))
        said = [s for s in map(self._fact_sentence, asked) if s is not None]
        identified = any(self._fact_sentence(item) for item in _IDENTITY)
        for item in explicit:
            if self._fact_sentence(item) is not None:
                continue
            # Having identified itself one way, the user mentions only what the scenario says
            # it forgot (the email, usually), not every other way it could not.
            if item in _IDENTITY and identified and item not in self._facts.unknown:
                continue
            said.append(self._not_known(item))
        return " ".join(said)

    def _not_known(self, item: str) -> str:
        if item == "email" and "email" in self._facts.unknown:
            return "I don't remember my email address."
        if item == "payment":
            return "The original payment method, please."
        return f"I don't know my {_LABELS[item]}."

    def _fact_sentence(self, item: str) -> str | None:
        facts = self._facts
        if item == "name" and facts.name:
            return f"My name is {facts.name}."
        if item == "zip" and facts.zip_code:
            return f"My zip code is {facts.zip_code}."
        if item == "email" and facts.emails:
            return f"My email is {' or '.join(facts.emails)}."
        if item == "user_id" and facts.user_id:
            return f"My user id is {facts.user_id}."
        if item == "order" and facts.order_ids:
            return f"The order id is {', '.join(facts.order_ids)}."
        if item == "phone" and facts.phone:
            return f"My phone number is {facts.phone}."
        if item == "payment" and facts.payment:
            return f"I'd like to use my {facts.payment}."
        return None


_LABELS = {
    "name": "name",
    "zip": "zip code",
    "email": "email address",
    "user_id": "user id",
    "order": "order id",
    "phone": "phone number",
    "payment": "payment method",
}
