"""Chat messages to a prompt: the checkpoint tokenizer's chat template, or a documented default for
tokenizers without one (the demo pair's has none):

    system: You are terse.
    user: Hello
    assistant:

(one `role: content` line per message, then `assistant:` for the model to continue)."""

from __future__ import annotations

from typing import Any

from graphspec.serve.protocol import ApiError

DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def render(tokenizer: Any, template: str | None, messages: list[dict[str, str]], tools: list | None) -> list[int]:
    """Token ids of the chat prompt. `template` overrides the tokenizer's; the default applies when
    neither exists."""
    if tokenizer is None:
        raise ApiError(400, "this model has no tokenizer, so it cannot render chat; use /v1/completions with ids")
    template = template or getattr(tokenizer, "chat_template", None) or DEFAULT_CHAT_TEMPLATE
    try:
        text = tokenizer.apply_chat_template(
            messages, chat_template=template, tools=tools, add_generation_prompt=True, tokenize=False
        )
    except Exception as error:  # a template error is the request's (its messages), not the server's
        raise ApiError(400, f"the chat template could not render these messages: {error}", "messages") from error
    bos = getattr(tokenizer, "bos_token", None)
    # Templates that write the BOS token themselves must not get a second one from the tokenizer.
    return tokenizer(text, add_special_tokens=not (bos and text.startswith(bos)))["input_ids"]
