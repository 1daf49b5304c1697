"""The scripted user on real τ²-bench tasks: what it says, what it gives, when it stops."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from evals.tau2.domains import load_domain
from evals.tau2.logs import AssistantMessage, Message, ToolMessage, UserMessage
from evals.tau2.participants import OUT_OF_SCOPE, STOP, TRANSFER, EpisodeContext, is_user_stop
from evals.tau2.run import RunConfig, run
from evals.tau2.scripted_user import ScriptedUser, extract_facts, first_person, opening_message
from evals.tau2.tasks import as_task

pytestmark = pytest.mark.anyio

AIRPLANE_TASK = "[mobile_data_issue]airplane_mode_on|data_mode_off[PERSONA:None]"


def _task(data_dir: Path, domain: str, task_id: str) -> dict[str, Any]:
    path = data_dir / "tau2" / "domains" / domain / "tasks.json"
    tasks = json.loads(path.read_text(encoding="utf-8"))
    return next(t for t in tasks if str(t["id"]) == task_id)


def _user(task: dict[str, Any], user_tools: list[dict[str, Any]] | None = None) -> ScriptedUser:
    typed = as_task(task)
    context = EpisodeContext("ep", typed, "policy", [], user_tools or [], trial=0, seed=None)
    return ScriptedUser(context)


async def _say(user: ScriptedUser, *texts: str) -> list[UserMessage]:
    replies = []
    for text in texts:
        incoming: list[Message] = [AssistantMessage(content=text)]
        replies.append(await user.generate(incoming))
    return replies


def test_facts_come_from_the_scenario(tau2_data_dir: Path) -> None:
    yusuf = extract_facts(_task(tau2_data_dir, "retail", "0")["user_scenario"])
    assert (yusuf.name, yusuf.zip_code, yusuf.order_ids) == ("Yusuf Rossi", "19122", ("#W2378156",))
    assert yusuf.emails == () and "email" in yusuf.unknown
    emma = extract_facts(_task(tau2_data_dir, "retail", "69")["user_scenario"])
    assert (emma.user_id, emma.name, emma.zip_code) == ("emma_smith_8564", "Emma Smith", "10192")
    john = extract_facts(_task(tau2_data_dir, "telecom", AIRPLANE_TASK)["user_scenario"])
    assert (john.name, john.phone) == ("John Smith", "555-123-2002")


def test_the_opening_states_the_reason_without_the_conditional_instructions(
    tau2_data_dir: Path,
) -> None:
    opening = opening_message(_task(tau2_data_dir, "retail", "0")["user_scenario"])
    assert opening.startswith("Hi! I received my order #W2378156 and wish to exchange")
    assert "If there is no keyboard" not in opening
    assert first_person("You want to return your item. The agent gives you a refund.") == (
        "I want to return my item. The agent gives me a refund."
    )


async def test_a_retail_conversation(tau2_data_dir: Path) -> None:
    user = _user(_task(tau2_data_dir, "retail", "0"))
    opening = await user.generate([AssistantMessage(content="Hi! How can I help you today?")])
    assert opening.content is not None and "#W2378156" in opening.content
    identity, email, order, confirm, done = await _say(
        user,
        "Sure. Could you give me your name and zip code?",
        "Could you also provide the email on your account?",
        "Which order would you like to exchange items from?",
        "I will exchange the items. Do you confirm (yes/no)?",
        "The exchange is done. Is there anything else I can help you with?",
    )
    assert identity.content == "My name is Yusuf Rossi. My zip code is 19122."
    assert email.content is not None and "I don't remember my email address." in email.content
    assert order.content == "The order id is #W2378156."
    assert confirm.content is not None and confirm.content.lower().startswith("yes")
    assert done.content is not None and STOP in done.content and is_user_stop(done)


async def test_only_requests_count(tau2_data_dir: Path) -> None:
    user = _user(_task(tau2_data_dir, "retail", "0"))
    await user.generate([AssistantMessage(content="Hi!")])
    confirm, payment, both = await _say(
        user,
        "The difference goes to your payment method on file. Do you want me to proceed?",
        "Which payment method would you like to use?",
        "Could you confirm your zip code? Then shall I go ahead?",
    )
    assert confirm.content == "Yes, please go ahead."
    assert payment.content == "The original payment method, please."
    assert both.content is not None and "19122" in both.content
    assert both.content.endswith("Yes, please go ahead.")


async def test_a_transfer_ends_with_the_transfer_token(tau2_data_dir: Path) -> None:
    user = _user(_task(tau2_data_dir, "retail", "0"))
    await user.generate([AssistantMessage(content="Hi!")])
    (reply,) = await _say(user, "YOU ARE BEING TRANSFERRED TO A HUMAN AGENT. PLEASE HOLD ON.")
    assert reply.content == TRANSFER


async def test_questions_it_cannot_answer_end_out_of_scope(tau2_data_dir: Path) -> None:
    user = _user(_task(tau2_data_dir, "retail", "0"))
    await user.generate([AssistantMessage(content="Hi!")])
    replies = await _say(user, *["What colour is the sky on Mars?"] * 3)
    assert [r.content == OUT_OF_SCOPE for r in replies] == [False, False, True]
    assert replies[0].content is not None and "exchange" in replies[0].content


async def test_a_statement_without_a_question_ends_the_conversation(tau2_data_dir: Path) -> None:
    user = _user(_task(tau2_data_dir, "retail", "0"))
    await user.generate([AssistantMessage(content="Hi!")])
    (reply,) = await _say(user, "Your refund goes to the original payment method.")
    assert is_user_stop(reply)  # naming a fact is not asking for it


async def test_it_operates_the_device_tools_the_agent_names(tau2_data_dir: Path) -> None:
    telecom = load_domain("telecom", tau2_data_dir)
    tools = telecom.new_environment().user_tools()
    user = _user(_task(tau2_data_dir, "telecom", AIRPLANE_TASK), tools)
    await user.generate([AssistantMessage(content="Hi!")])
    (calls,) = await _say(user, "Please turn off airplane mode, then check your status bar.")
    assert [c.name for c in calls.tool_calls or []] == ["toggle_airplane_mode", "check_status_bar"]
    results: list[Message] = [
        ToolMessage(id="1", content="Airplane Mode is now OFF.", requestor="user"),
        ToolMessage(id="2", content="Status Bar: 📶 Good", requestor="user"),
    ]
    report = await user.generate(results)
    assert report.content is not None
    assert "Airplane Mode is now OFF." in report.content and "📶 Good" in report.content
    (looked,) = await _say(user, "Is airplane mode on? Please check your status bar.")
    assert [c.name for c in looked.tool_calls or []] == ["check_status_bar"]  # nothing toggled


@pytest.mark.parametrize(
    ("domain", "task_ids"),
    [("retail", ("0", "5", "69")), ("telecom", (AIRPLANE_TASK,))],
)
async def test_gold_agent_with_the_scripted_user_solves_the_task(
    tau2_data_dir: Path, tmp_path: Path, domain: str, task_ids: tuple[str, ...]
) -> None:
    config = RunConfig(
        domain=domain,
        data_dir=tau2_data_dir,
        save_to=tmp_path,
        agent="gold",
        user="scripted",
        num_trials=1,
        task_ids=task_ids,
        progress=False,
    )
    results = await run(config)
    assert results.info.user_info.implementation == "scripted_user"
    assert [s.termination_reason for s in results.simulations] == ["user_stop"] * len(task_ids)
    assert [s.reward_info.reward if s.reward_info else None for s in results.simulations] == [
        1.0
    ] * len(task_ids)
