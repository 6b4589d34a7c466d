"""The OpenAI-compatible HTTP front door: FastAPI routes over a Runtime's engine.

Each request is checked (pydantic for the JSON, then the engine's own checks) before it is queued, so
a bad request gets a 4xx OpenAI error and never reaches the loop. Tokens come back from the engine's
thread through call_soon_threadsafe into the request's asyncio queue; a client that goes away, streaming or
waiting for a whole response, cancels its request, which frees its cache slot (or its place in the queue) at
the next step boundary.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from graphspec.errors import InputError
from graphspec.inputs import check_prompts
from graphspec.runtime.engine import RequestHandle
from graphspec.runtime.requests import Delta, GenerationResult, SamplingParams
from graphspec.serve.channels import ChannelDelta, ChannelParser, Markers
from graphspec.serve.chat import render
from graphspec.serve.metrics import Metrics
from graphspec.serve.protocol import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    template_messages,
)
from graphspec.serve.text import TextStream


class Sink:
    """Where the engine's loop thread puts a request's items: handed to the event loop's queue."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()

    def put(self, item: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the event loop has closed (server shutting down): nobody is listening
            pass


# The status of the reply to a client that disconnected before its whole response was ready: nobody reads
# it; 499 is nginx's "client closed request", what access logs then show.
CLIENT_GONE = 499


OPEN_PATHS = frozenset({"/health", "/metrics"})  # served without the API key: probes and scrapers


class RequireApiKey:
    """ASGI middleware: every request but OPEN_PATHS must carry `Authorization: Bearer <key>` (else a 401 in
    OpenAI's error JSON); /health and /metrics stay open for probes and scrapers, as in vLLM. Pure ASGI, not
    Starlette's BaseHTTPMiddleware, so streamed responses and the disconnect listener see the raw channel."""

    def __init__(self, app: Any, key: str) -> None:
        self.app, self.expected = app, f"Bearer {key}".encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            sent = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(sent, self.expected):  # constant time: the key does not leak by timing
                error = ApiError(401, "missing or wrong API key: send `Authorization: Bearer <key>`")
                await JSONResponse(error.body(), status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(
    runtime: Any,
    model_name: str,
    chat_template: str | None = None,
    markers: Markers | None = None,
    api_key: str | None = None,
) -> FastAPI:
    """The app serving `runtime` as model `model_name`. markers: split chat output into reasoning,
    content and tool calls with these marker strings (None: all output is content). api_key: require it
    on every /v1/ request (RequireApiKey)."""
    app = FastAPI(title="graphspec", version="0.1.0")
    if api_key is not None:
        if not api_key:
            raise ValueError("api_key is empty: pass None to serve without one")
        app.add_middleware(RequireApiKey, key=api_key)
    config = runtime.compiled.config
    metrics = Metrics(config.k_for, config.k, model_name, lambda: runtime.engine.load, lambda: runtime.stats)
    runtime.engine.listeners.append(metrics)
    app.state.metrics = metrics
    sample_default = "sample" in runtime.engine.modes
    created = int(time.time())

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
        message = f"{where}: {first.get('msg', 'invalid request')}" if where else first.get("msg", "invalid request")
        return JSONResponse(ApiError(400, message, where or None).body(), status_code=400)

    @app.get("/health")
    async def health() -> JSONResponse:
        """200 while the engine serves; 503 with the error while its last step failed (until one succeeds)."""
        running, waiting = runtime.engine.load
        failure = runtime.engine.failure
        if failure is not None:
            return JSONResponse({"status": "error", "error": failure, "running": running, "waiting": waiting}, 503)
        return JSONResponse({"status": "ok", "running": running, "waiting": waiting})

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": model_name, "object": "model", "created": created, "owned_by": "graphspec"}
        return {"object": "list", "data": [{**card, "max_model_len": runtime.max_seq_len}]}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    def check_model(name: str) -> None:
        if name != model_name:
            raise ApiError(404, f"the model {name!r} does not exist; this server serves {model_name!r}", "model")

    def submit(prompts: list[str | list[int]], params: list[SamplingParams]) -> tuple[list[RequestHandle], Sink]:
        """Queue one engine request per choice, tagged with its index, into one sink: all of them or, when
        one is refused, none."""
        if any(prompt == "" or prompt == [] for prompt in prompts):
            raise ApiError(400, "prompt is empty; it needs at least one token", "prompt")
        sink = Sink(asyncio.get_running_loop())
        try:
            choices = [
                (prompt, param, index) for index, (prompt, param) in enumerate(zip(prompts, params, strict=True))
            ]
            handles = runtime.engine.submit_all(choices, out=sink)
        except InputError as error:
            raise ApiError(400, str(error)) from None
        return handles, sink

    async def items(handles: list[RequestHandle], sink: Sink) -> AsyncIterator[tuple[int, Delta | GenerationResult]]:
        """(choice index, item): each choice's deltas then its result, as they come, until every choice has
        its result; timed per choice. Cancels the requests if abandoned."""
        arrival, last = time.perf_counter(), {}  # choice index -> when its last delta came
        pending = len(handles)
        try:
            while pending:
                index, item = await sink.queue.get()
                if isinstance(item, BaseException):
                    raise ApiError(500, f"generation failed: {item}", kind="internal_error")
                now = time.perf_counter()
                if isinstance(item, GenerationResult):
                    metrics.e2e.observe(now - arrival)
                    pending -= 1
                else:
                    (metrics.itl if index in last else metrics.ttft).observe(now - last.get(index, arrival))
                    last[index] = now
                yield index, item
        finally:
            for handle in handles:
                handle.cancel()  # a no-op once finished; frees the slot of a client that went away

    async def final_results(
        request: Request, handles: list[RequestHandle], sink: Sink
    ) -> list[GenerationResult] | None:
        """A whole response's results, by choice index; None when the client disconnects first (its requests
        are cancelled). A streaming response notices a client that left when it next writes; a whole one
        writes once, at the end, so it listens for the disconnect meanwhile (as vLLM's with_cancellation
        does)."""

        async def results() -> list[GenerationResult]:
            done = {index: item async for index, item in items(handles, sink) if isinstance(item, GenerationResult)}
            return [done[index] for index in range(len(handles))]

        async def disconnected() -> None:
            # FastAPI has read the whole body, so the next ASGI message is the client's disconnect.
            while (await request.receive())["type"] != "http.disconnect":
                pass

        waiting, leaving = asyncio.ensure_future(results()), asyncio.ensure_future(disconnected())
        try:
            await asyncio.wait((waiting, leaving), return_when=asyncio.FIRST_COMPLETED)
        finally:
            leaving.cancel()
            if not waiting.done():
                waiting.cancel()  # items() then cancels the engine requests
                await asyncio.gather(waiting, return_exceptions=True)  # until it has
        return None if waiting.cancelled() else waiting.result()

    def usage(results: list[GenerationResult], n: int) -> dict[str, int]:
        """OpenAI's usage: each prompt's tokens once (its n choices share it), every choice's completion."""
        prompt = sum(result.prompt_tokens for result in results[::n])
        done = sum(len(result.token_ids) for result in results)
        return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}

    def sse(payload: dict[str, Any]) -> str:
        return f"data: {json.dumps(payload)}\n\n"

    # ---------------------------------------------------------------------------------------------

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        """The ids a completion or chat request with this prompt or these messages would start from (vLLM's
        endpoint): a client can budget max_tokens against max_model_len before it asks."""
        check_model(body.model)
        which = body.which()
        if isinstance(which, list) and which and isinstance(which[0], dict):
            ids = render(runtime.tokenizer, chat_template, which, body.tools)
        else:
            try:
                [ids] = check_prompts([which], runtime.vocab_size, runtime.tokenizer)
            except InputError as error:
                raise ApiError(400, str(error), "prompt") from None
        return {"count": len(ids), "max_model_len": runtime.max_seq_len, "tokens": ids}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        check_model(body.model)
        if runtime.tokenizer is None:
            raise ApiError(400, "this model has no tokenizer to decode with", "tokens")
        try:
            [ids] = check_prompts([body.tokens], runtime.vocab_size)
        except InputError as error:
            raise ApiError(400, str(error), "tokens") from None
        return {"prompt": runtime.tokenizer.decode(ids)}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Any:
        check_model(body.model)
        params = body.sampling(body.max_tokens, body.logprobs == 0, sample_default)  # checks n first
        prompts = body.prompts()
        # Choice i * n + j: prompt i's j-th choice (OpenAI's order).
        handles, sink = submit([p for p in prompts for _ in params], params * len(prompts))
        ident, tokenizer, n = f"cmpl-{uuid.uuid4().hex}", runtime.tokenizer, body.n

        def choice(
            index: int, text: str, ids: list[int], logprobs: list[float] | None, reason: str | None
        ) -> dict[str, Any]:
            out: dict[str, Any] = {"index": index, "text": text, "finish_reason": reason, "token_ids": ids}
            out["logprobs"] = completion_logprobs(tokenizer, ids, logprobs) if logprobs is not None else None
            return out

        def chunk(choices: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> dict[str, Any]:
            head = {"id": ident, "object": "text_completion", "created": int(time.time()), "model": model_name}
            return {**head, "choices": choices, **(extra or {})}

        if not body.stream:
            results = await final_results(request, handles, sink)
            if results is None:
                return Response(status_code=CLIENT_GONE)
            choices = [choice(i, r.text or "", r.token_ids, r.logprobs, r.finish_reason) for i, r in enumerate(results)]
            return chunk(choices, {"usage": usage(results, n)})

        texts = [
            TextStream(tokenizer, param.stop) if tokenizer is not None else None for param in params * len(prompts)
        ]
        logprobs = params[0].logprobs

        async def events() -> AsyncIterator[str]:
            results: dict[int, GenerationResult] = {}
            async for index, item in items(handles, sink):
                text = texts[index]
                if isinstance(item, Delta):
                    delta = text.add(item.token_ids) if text else ""
                    yield sse(chunk([choice(index, delta, item.token_ids, item.logprobs, None)]))
                else:
                    results[index] = item
                    rest = text.finish(item.text or "") if text else ""
                    yield sse(chunk([choice(index, rest, [], [] if logprobs else None, item.finish_reason)]))
            if (body.stream_options or {}).get("include_usage"):
                yield sse(chunk([], {"usage": usage([results[i] for i in range(len(handles))], n)}))
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
        check_model(body.model)
        messages = template_messages(body.messages)
        prompt = render(runtime.tokenizer, chat_template, messages, body.tools)
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        if max_tokens is None:  # OpenAI's chat default (and vLLM's): as many as the context leaves room for
            max_tokens = max(1, runtime.max_seq_len - len(prompt) - runtime.k - 1)
        params = body.sampling(max_tokens, body.checked_logprobs(), sample_default)
        handles, sink = submit([prompt] * len(params), params)
        ident, tokenizer = f"chatcmpl-{uuid.uuid4().hex}", runtime.tokenizer

        def chunk(choices: list[dict[str, Any]], obj: str = "chat.completion.chunk") -> dict[str, Any]:
            head = {"id": ident, "object": obj, "created": int(time.time()), "model": model_name}
            return {**head, "choices": choices}

        def whole_choice(index: int, result: GenerationResult) -> dict[str, Any]:
            parser = ChannelParser(markers, is_tool_call) if markers else None
            whole = channels(parser, result.text or "", final=True)
            message: dict[str, Any] = {"role": "assistant", **channel_fields(whole, 0)}
            message.setdefault("content", "")
            reason = "tool_calls" if whole.tool_calls else result.finish_reason
            out = {"index": index, "message": message, "finish_reason": reason}
            out["logprobs"] = chat_logprobs(tokenizer, result.token_ids, result.logprobs)
            return out

        if not body.stream:
            results = await final_results(request, handles, sink)
            if results is None:
                return Response(status_code=CLIENT_GONE)
            choices = [whole_choice(index, result) for index, result in enumerate(results)]
            return {**chunk(choices, "chat.completion"), "usage": usage(results, len(params))}

        texts = [TextStream(tokenizer, param.stop) for param in params]
        parsers = [ChannelParser(markers, is_tool_call) if markers else None for _ in params]
        calls = [0] * len(params)  # tool calls streamed so far, per choice

        async def events() -> AsyncIterator[str]:
            for index in range(len(params)):
                yield sse(
                    chunk([{"index": index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
                )
            results: dict[int, GenerationResult] = {}
            async for index, item in items(handles, sink):
                if isinstance(item, Delta):
                    parsed = channels(parsers[index], texts[index].add(item.token_ids), final=False)
                    logprobs = chat_logprobs(tokenizer, item.token_ids, item.logprobs)
                else:
                    parsed = channels(parsers[index], texts[index].finish(item.text or ""), final=True)
                    logprobs = None
                fields = channel_fields(parsed, calls[index])
                calls[index] += len(parsed.tool_calls)
                if fields or logprobs:
                    yield sse(chunk([{"index": index, "delta": fields, "logprobs": logprobs, "finish_reason": None}]))
                if isinstance(item, GenerationResult):
                    results[index] = item
                    reason = "tool_calls" if calls[index] else item.finish_reason
                    yield sse(chunk([{"index": index, "delta": {}, "finish_reason": reason}]))
            if (body.stream_options or {}).get("include_usage"):
                usage_ = usage([results[index] for index in range(len(params))], len(params))
                yield sse({**chunk([]), "usage": usage_})
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def channels(parser: ChannelParser | None, text: str, final: bool) -> ChannelDelta:
    if parser is None:
        return ChannelDelta(content=text)
    delta = parser.feed(text)
    if final:
        rest = parser.finish()
        delta = ChannelDelta(
            delta.reasoning + rest.reasoning, delta.content + rest.content, delta.tool_calls + rest.tool_calls
        )
    return delta


def channel_fields(delta: ChannelDelta, first_index: int) -> dict[str, Any]:
    """OpenAI delta/message fields of parsed text: content, reasoning_content (as vLLM names it), and
    tool_calls (the parser was given is_tool_call, so every body is {"name": ..., "arguments": ...} JSON;
    the others stayed in content where the model wrote them)."""
    fields: dict[str, Any] = {}
    content, calls = delta.content, []
    for body in delta.tool_calls:
        call = parse_tool_call(body)
        assert call is not None, body
        calls.append({"index": first_index + len(calls), "id": f"call_{uuid.uuid4().hex[:24]}", **call})
    if content:
        fields["content"] = content
    if delta.reasoning:
        fields["reasoning_content"] = delta.reasoning
    if calls:
        fields["tool_calls"] = calls
    return fields


def is_tool_call(body: str) -> bool:
    return parse_tool_call(body) is not None


def parse_tool_call(body: str) -> dict[str, Any] | None:
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", {})
    arguments = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"type": "function", "function": {"name": value["name"], "arguments": arguments}}


def completion_logprobs(tokenizer: Any, ids: list[int], logprobs: list[float]) -> dict[str, Any]:
    tokens = [tokenizer.decode([t]) if tokenizer is not None else str(t) for t in ids]
    offsets, offset = [], 0
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": None, "text_offset": offsets}


def chat_logprobs(tokenizer: Any, ids: list[int], logprobs: list[float] | None) -> dict[str, Any] | None:
    if logprobs is None:
        return None
    content = []
    for token_id, logprob in zip(ids, logprobs, strict=True):
        token = tokenizer.decode([token_id])
        content.append({"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": []})
    return {"content": content}
