"""The OpenAI request bodies graphspec serves (pydantic models: FastAPI parses and refuses malformed
JSON with them), their translation to SamplingParams, and OpenAI's error JSON.

Fields beyond OpenAI's, as vLLM spells them: top_k, stop_token_ids. Sampling defaults follow OpenAI
(temperature 1) when the artifact has a sampling step, else greedy (temperature 0).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from graphspec.runtime.requests import SamplingParams

DEFAULT_MAX_TOKENS = 16  # OpenAI's completions default
MAX_CHOICES = 128  # choices per request (n x prompts): each is an engine request of its own


class ApiError(Exception):
    """A request the server refuses: HTTP status, OpenAI error type, message, and the offending field."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def body(self) -> dict[str, Any]:
        code = {404: "model_not_found", 401: "invalid_api_key"}.get(self.status)  # OpenAI's codes for these
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": code}}


# Fields of OpenAI's API (and vLLM's extensions) that change what is generated and that graphspec does not
# implement, with the values that leave the output as graphspec makes it: any other value is refused with a
# 400, so a client never gets output other than it asked for without knowing. Other unknown fields (user,
# metadata, ...) are ignored.
UNSUPPORTED_FIELDS: dict[str, tuple[Any, ...]] = {
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
    "logit_bias": (None, {}),
    "min_p": (None, 0, 0.0),
    "min_tokens": (None, 0),
    "ignore_eos": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "response_format": (None, {"type": "text"}),
    "tool_choice": (None, "auto"),  # tool calls are what the model writes (--channels), never forced or barred
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
}


class SamplingFields(BaseModel):
    model_config = ConfigDict(extra="allow")  # unknown OpenAI fields (user, metadata, ...) are ignored

    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    n: int = 1
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None

    def sampling(self, max_tokens: int | None, logprobs: bool, sample_default: bool) -> list[SamplingParams]:
        """SamplingParams of each of the n choices of a prompt; ApiError for values no engine check covers.
        With a seed, choice j samples with seed + j (choice 0 is what the same request with n = 1 gives),
        so each choice draws on its own and is reproducible."""
        if not 1 <= self.n <= MAX_CHOICES:
            raise ApiError(400, f"n must be in 1..{MAX_CHOICES}, got {self.n}", "n")
        for name, value in (self.model_extra or {}).items():
            if name == "tool_choice" and value == "none" and not getattr(self, "tools", None):
                continue  # OpenAI's own default when a request has no tools, as some clients send it
            # Same type and value as a neutral one (so true is not 1, as it is in Python).
            neutral = UNSUPPORTED_FIELDS.get(name)
            if neutral is not None and not any(type(value) is type(v) and value == v for v in neutral):
                raise ApiError(400, f"{name} is not supported by this server; leave it out", name)
        temperature = self.temperature
        if temperature is None:
            temperature = 1.0 if sample_default else 0.0
        if not math.isfinite(temperature):
            raise ApiError(400, f"temperature must be a finite number >= 0, got {temperature}", "temperature")
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        params = SamplingParams(
            max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
            temperature=temperature,
            top_k=self.top_k or 0,
            top_p=1.0 if self.top_p is None else self.top_p,
            seed=self.seed,
            stop_token_ids=None if self.stop_token_ids is None else tuple(self.stop_token_ids),
            stop=tuple(stop),
            logprobs=logprobs,
        )
        if self.seed is not None and self.n > 1 and self.seed + self.n - 1 >= 2**63:  # the engine's seed range
            raise ApiError(
                400, f"seed + n - 1 must be below 2**63 (choice j samples with seed + j), got {self.seed}", "seed"
            )
        seeds = [None] * self.n if self.seed is None else [self.seed + j for j in range(self.n)]
        return [replace(params, seed=seed) for seed in seeds]


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = None
    echo: bool = False

    def prompts(self) -> list[str | list[int]]:
        """The request's prompts: one, or a list of them (strings or token-id lists)."""
        prompt = self.prompt
        prompts = prompt if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)) else [prompt]
        if len(prompts) * self.n > MAX_CHOICES:
            raise ApiError(400, f"{len(prompts)} prompts x n={self.n} choices is more than {MAX_CHOICES}", "prompt")
        if self.echo:
            raise ApiError(400, "echo is not supported", "echo")
        if self.logprobs not in (None, 0):
            raise ApiError(
                400, "logprobs: only each emitted token's own logprob is available; pass logprobs=0", "logprobs"
            )
        return prompts


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for part in self.content:
            if part.get("type") != "text":
                raise ApiError(400, f"only text message parts are supported, got {part.get('type')!r}", "messages")
            parts.append(str(part.get("text", "")))
        return "".join(parts)


def template_messages(messages: list[ChatMessage]) -> list[dict[str, str]]:
    """The messages as the chat template takes them (role, text content)."""
    return [{"role": m.role, "content": m.text()} for m in messages]


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None

    def checked_logprobs(self) -> bool:
        if self.top_logprobs:
            raise ApiError(400, "top_logprobs is not supported (each emitted token's logprob is)", "top_logprobs")
        return self.logprobs


class TokenizeRequest(BaseModel):
    """vLLM's /tokenize body: a prompt (as /v1/completions takes it) or chat messages (rendered as
    /v1/chat/completions renders them, with the generation prompt)."""

    model: str
    prompt: str | list[int] | None = None
    messages: list[ChatMessage] | None = None
    tools: list[dict[str, Any]] | None = None

    def which(self) -> str | list[dict[str, str]] | list[int]:
        if (self.prompt is None) == (self.messages is None):
            raise ApiError(400, "give exactly one of prompt and messages", "prompt")
        if self.messages is not None:
            return template_messages(self.messages)
        return self.prompt


class DetokenizeRequest(BaseModel):
    model: str
    tokens: list[int]
