"""Run by smolagents' own venv for the framework matrix: ``argv[1]`` the base URL, ``--stream``,
``--runs N``; one ToolCallingAgent run per task, printing the order ids its tool was called with."""

import argparse
import json

from smolagents import OpenAIServerModel, ToolCallingAgent, tool

RAN: list[str] = []


@tool  # type: ignore[untyped-decorator]
def get_order_details(order_id: str) -> str:
    """Get the status of an order.

    Args:
        order_id: The order id, like #W1.
    """
    RAN.append(order_id)
    if order_id != "#W1":
        raise ValueError(f"Order {order_id} not found")
    return f"Order {order_id}: delivered"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("base_url")
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    model = OpenAIServerModel(model_id="scripted-model", api_base=args.base_url, api_key="x")
    for _ in range(args.runs):
        agent = ToolCallingAgent(
            tools=[get_order_details],
            model=model,
            max_steps=3,
            stream_outputs=args.stream,
            verbosity_level=0,
        )
        agent.run("Where is my order #W1?")
    print("\nRAN " + json.dumps(RAN))


if __name__ == "__main__":
    main()
