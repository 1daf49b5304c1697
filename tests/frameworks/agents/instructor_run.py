"""Run by instructor's own venv against ``argv[1]``: TOOLS mode, one retry, so instructor's own
re-ask (its retry text) reaches the server; prints the object and the version."""

import json
import sys

import instructor
import openai
from pydantic import BaseModel


class Person(BaseModel):
    name: str
    age: int


def main() -> None:
    client = instructor.from_openai(
        openai.OpenAI(base_url=sys.argv[1], api_key="x", max_retries=0), mode=instructor.Mode.TOOLS
    )
    person = client.chat.completions.create(
        model="scripted-model",
        response_model=Person,
        max_retries=1,
        messages=[{"role": "user", "content": "Who is Ann?"}],
    )
    print(json.dumps({"person": person.model_dump(), "version": instructor.__version__}))


if __name__ == "__main__":
    main()
