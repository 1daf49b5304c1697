"""Run by smolagents' own venv: a ToolCallingAgent against ``argv[1]`` (an OpenAI-compatible base
URL), one task that calls a working tool and one whose tool fails, then prints the answers."""

import json
import sys

import smolagents
from smolagents import OpenAIServerModel, ToolCallingAgent, tool


@tool  # type: ignore[untyped-decorator]
def get_order_details(order_id: str) -> str:
    """Get the status of an order.

    Args:
        order_id: The order id, like #W1.
    """
    if order_id != "#W1":
        raise ValueError(f"Order {order_id} not found")
    return f"Order {order_id}: delivered"


def main() -> None:
    model = OpenAIServerModel(model_id="scripted-model", api_base=sys.argv[1], api_key="x")
    answers = []
    for task in ("Where is my order #W1?", "Where is my order #W2?"):
        agent = ToolCallingAgent(tools=[get_order_details], model=model, max_steps=3)
        answers.append(str(agent.run(task)))
    print(json.dumps({"answers": answers, "version": smolagents.__version__}))


if __name__ == "__main__":
    main()
