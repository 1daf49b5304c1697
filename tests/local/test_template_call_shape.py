"""The call shape the embedded model's own chat template teaches is read as that call.

The Qwen2.5-Coder GGUF carries a chat template whose tool instruction shows the call between
Jinja-escaped braces, so the rendered system prompt reads ``{{"name": <function-name>,
"arguments": <args-json-object>}}`` and the model copies the doubled pair (vLLM serving the
converted model wrote ``{{"name": "weather_lookup", "arguments": {"city": "Paris"}}}``). The
example is taken from the template as the GGUF ships it, rendered by jinja2, filled with a
declared tool, and read by the proxy: bare, inside the ``<tool_call>`` tags the template puts
around it, and in the stream's opening.
"""

from __future__ import annotations

import json
import re

import jinja2
import pytest

from repairproxy.asgi.gate import could_open_call
from repairproxy.local import ARMS, resolve_cache_dir
from repairproxy.validation import Channel, ToolsCache
from tests.local.model_fixtures import requires_model
from tests.local.test_vllm_proxy import WEATHER

pytestmark = [pytest.mark.model, requires_model]

TOOL = WEATHER  # get_weather(city), as the vLLM tests declare it


def _gguf_template() -> str:
    from llama_cpp import Llama

    path = resolve_cache_dir() / "models" / ARMS["q4_k_m"].filename
    model = Llama(str(path), vocab_only=True, verbose=False)
    template = model.metadata["tokenizer.chat_template"]
    assert isinstance(template, str)
    return template


def _taught_example() -> str:
    """The tool-call example in the system turn the GGUF's template renders."""
    environment = jinja2.Environment(autoescape=False)
    environment.filters["tojson"] = json.dumps
    rendered = environment.from_string(_gguf_template()).render(
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[TOOL],
        add_generation_prompt=True,
    )
    example = re.search(r"<tool_call>\n(.*?)\n</tool_call>", rendered)
    assert example is not None, rendered
    return example.group(1)


def test_the_template_teaches_a_doubled_brace_pair() -> None:
    # If the GGUF is ever shipped with single braces this test says so: the reading below
    # still holds, but the reason for it is gone.
    assert _taught_example() == '{{"name": <function-name>, "arguments": <args-json-object>}}'


@pytest.mark.parametrize("wrap", ["{}", "<tool_call>\n{}\n</tool_call>"])
def test_a_call_in_the_taught_shape_is_read_as_that_call(wrap: str) -> None:
    call = (
        _taught_example()
        .replace("<function-name>", '"get_weather"')
        .replace("<args-json-object>", '{"city": "Paris"}')
    )
    content = wrap.format(call)
    request = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [TOOL]}
    compiled = ToolsCache().compile(request)
    assert compiled is not None
    verdicts = compiled.check_message({"role": "assistant", "content": content}).calls
    assert [(v.channel, v.name, v.inner) for v in verdicts] == [
        (Channel.TOOL_CALL_IN_CONTENT, "get_weather", Channel.VALID)
    ]
    assert all(could_open_call(content[:n]) for n in range(1, len(content) + 1))
