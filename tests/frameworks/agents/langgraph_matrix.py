"""Run by LangGraph's own venv for the framework matrix: ``argv[1]`` the base URL, ``--stream``,
``--runs N``, ``--responses`` (langchain-openai's ``use_responses_api``); a prebuilt ReAct agent
whose ToolNode turns tool errors into messages, printing the order ids its tool was called with."""

import argparse
import json

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import ToolNode, create_react_agent

RAN: list[str] = []


@tool
def get_order_details(order_id: str) -> str:
    """Get the status of an order."""
    RAN.append(order_id)
    if order_id != "#W1":
        raise ValueError(f"Order {order_id} not found")
    return f"Order {order_id}: delivered"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("base_url")
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--responses", action="store_true")
    args = parser.parse_args()
    model = ChatOpenAI(
        model="scripted-model",
        base_url=args.base_url,
        api_key="x",
        max_retries=0,
        streaming=args.stream,
        use_responses_api=args.responses,
    )
    tools = ToolNode([get_order_details], handle_tool_errors=True)
    for _ in range(args.runs):
        agent = create_react_agent(model, tools)
        task = {"messages": [("user", "Where is my order #W1?")]}
        if args.stream:
            for _ in agent.stream(task, stream_mode="messages"):
                pass
        else:
            agent.invoke(task)
    print("\nRAN " + json.dumps(RAN))


if __name__ == "__main__":
    main()
