"""Wire shapes: the OpenAI chat types the proxy reads, and the Responses and Messages (Anthropic)
adapters that map those APIs' requests and answers onto the chat shape."""

from repairproxy._exports import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "ChatCompletion": "openai",
        "ChatMessage": "openai",
        "ChatRequestBody": "openai",
        "Choice": "openai",
        "FunctionCall": "openai",
        "ToolCall": "openai",
        "content_text": "openai",
        "first_message": "openai",
        "message_text": "openai",
        "messages_request": "messages",
        "to_message": "messages",
        "responses_request": "responses",
        "to_chat_body": "responses",
        "to_response": "responses",
    },
)
