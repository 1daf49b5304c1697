"""Run by dspy's own venv against ``argv[1]``: a Predict with an int output through the
JSONAdapter (native ``response_format``), dspy's own retries off; prints the answer and version."""

import json
import sys

import dspy


class Age(dspy.Signature):  # type: ignore[misc]
    """Answer with the person's age."""

    question: str = dspy.InputField()
    age: int = dspy.OutputField()


def main() -> None:
    lm = dspy.LM(
        sys.argv[2] if len(sys.argv) > 2 else "openai/scripted-model",
        api_base=sys.argv[1],
        api_key="x",
        cache=False,
        num_retries=0,
    )
    dspy.configure(lm=lm, adapter=dspy.JSONAdapter())
    result = dspy.Predict(Age)(question="How old is Ann?")
    print("\nRESULT " + json.dumps({"age": result.age, "version": dspy.__version__}))


if __name__ == "__main__":
    main()
