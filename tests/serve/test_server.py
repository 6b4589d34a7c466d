"""`graphspec serve` end to end: the real `openai` client against the app served by uvicorn on
127.0.0.1 in this process, over the shipped demo pair (fp32, CPU)."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time

import pytest

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")

import torch  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

import graphspec  # noqa: E402
from graphspec.examples import DEMO_DRAFT, DEMO_TARGET  # noqa: E402
from graphspec.runtime.requests import SamplingParams  # noqa: E402
from graphspec.serve.app import create_app  # noqa: E402
from graphspec.serve.channels import Markers  # noqa: E402
from graphspec.serve.chat import DEFAULT_CHAT_TEMPLATE  # noqa: E402

MODEL = "demo"
PROMPT = "def parse_header(line):\n    "
WAIT_S = 300  # only bounds a hang; nothing asserts on time


@pytest.fixture(scope="module")
def runtime() -> graphspec.Runtime:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is fastest on a shared CPU
    yield graphspec.Runtime.from_pretrained(
        DEMO_TARGET, DEMO_DRAFT, k=3, batch_sizes=(4,), dtype="float32", device="cpu", max_seq_len=320
    )
    torch.set_num_threads(threads)


def run_server(app):
    """Serve `app` with uvicorn on a free port of 127.0.0.1 in a thread; yield its URL, then stop it."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + WAIT_S
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(WAIT_S)


@pytest.fixture(scope="module")
def base_url(runtime) -> str:
    yield from run_server(create_app(runtime, MODEL))


@pytest.fixture(scope="module")
def client(base_url) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=WAIT_S)


def engine_tokens(runtime, prompt, **params) -> list[int]:
    return runtime.engine.submit(prompt, SamplingParams(**params)).result().token_ids


def greedy_completion(client, **options):
    return client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, **options)


# --------------------------------------------------------------------------------------------------
# Completions and chat completions, whole and streamed
# --------------------------------------------------------------------------------------------------


def test_completion_is_the_engines_greedy_output(client, runtime):
    completion = greedy_completion(client, max_tokens=12)
    expected = engine_tokens(runtime, PROMPT, max_tokens=12)
    choice = completion.choices[0]
    assert choice.text == runtime.tokenizer.decode(expected)
    assert completion.usage.completion_tokens == len(expected)
    assert completion.usage.prompt_tokens == len(runtime.tokenizer(PROMPT)["input_ids"])
    assert completion.model == MODEL and completion.object == "text_completion"


def test_max_tokens_ends_a_completion_with_reason_length(client):
    completion = greedy_completion(client, max_tokens=5, extra_body={"stop_token_ids": []})
    assert completion.usage.completion_tokens == 5
    assert completion.choices[0].finish_reason == "length"


def test_streamed_completion_joins_to_the_whole_one(client):
    whole = greedy_completion(client, max_tokens=20).choices[0]
    chunks = list(greedy_completion(client, max_tokens=20, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole.text
    assert len([c for c in chunks if c.choices[0].text]) > 1  # it did arrive in pieces
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason


def test_stop_string_cuts_the_text_before_it_whole_and_streamed(client):
    full = greedy_completion(client, max_tokens=24, extra_body={"stop_token_ids": []}).choices[0].text
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert stop.strip(), full  # a visible stop string
    expected = full[: full.index(stop)]
    cut = greedy_completion(client, max_tokens=24, stop=[stop], extra_body={"stop_token_ids": []}).choices[0]
    assert (cut.text, cut.finish_reason) == (expected, "stop")
    chunks = list(greedy_completion(client, max_tokens=24, stop=stop, stream=True, extra_body={"stop_token_ids": []}))
    assert "".join(c.choices[0].text for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_seeded_sampling_is_reproducible_and_equals_the_engine(client, runtime):
    options = dict(model=MODEL, prompt=PROMPT, temperature=1.0, top_p=0.95, seed=1234, max_tokens=16)
    first, second = (client.completions.create(**options).choices[0].text for _ in range(2))
    assert first == second
    expected = engine_tokens(runtime, PROMPT, max_tokens=16, temperature=1.0, top_p=0.95, seed=1234)
    assert first == runtime.tokenizer.decode(expected)


def test_tokenize_counts_what_a_request_starts_from_and_detokenize_inverts_it(client, base_url):
    counted = httpx.post(f"{base_url}/tokenize", json={"model": MODEL, "prompt": PROMPT}).json()
    completion = greedy_completion(client, max_tokens=2)
    assert counted["count"] == len(counted["tokens"]) == completion.usage.prompt_tokens
    assert counted["max_model_len"] == 320
    messages = [{"role": "user", "content": "import os"}]
    chat = httpx.post(f"{base_url}/tokenize", json={"model": MODEL, "messages": messages}).json()
    reply = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=2)
    assert chat["count"] == reply.usage.prompt_tokens
    back = httpx.post(f"{base_url}/detokenize", json={"model": MODEL, "tokens": counted["tokens"]}).json()
    assert back["prompt"].endswith(PROMPT)
    for path, body in [
        ("/tokenize", {"model": MODEL}),
        ("/tokenize", {"model": MODEL, "prompt": PROMPT, "messages": messages}),
        ("/detokenize", {"model": MODEL, "tokens": [5, 10**9]}),
    ]:
        response = httpx.post(f"{base_url}{path}", json=body)
        assert response.status_code == 400 and response.json()["error"]["message"]
    assert httpx.post(f"{base_url}/tokenize", json={"model": "gpt-4", "prompt": "x"}).status_code == 404


def test_n_choices_of_several_prompts_whole_and_streamed(client, runtime):
    """Choice i * n + j is prompt i's j-th; with a seed, choice j samples with seed + j, so each equals the
    single-choice request with that seed; usage counts each prompt once and every choice's tokens."""
    prompts = [PROMPT, "class Queue:\n    def "]
    options = dict(model=MODEL, temperature=1.0, top_p=0.95, max_tokens=10, extra_body={"stop_token_ids": []})
    singles = [
        [client.completions.create(prompt=p, seed=40 + j, **options).choices[0] for j in range(3)] for p in prompts
    ]
    whole = client.completions.create(prompt=prompts, n=3, seed=40, **options)
    assert [c.index for c in whole.choices] == list(range(6))
    assert [c.text for c in whole.choices] == [c.text for row in singles for c in row]
    prompt_tokens = sum(len(runtime.tokenizer(p)["input_ids"]) for p in prompts)
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (prompt_tokens, 60)
    texts, reasons, usage = [""] * 6, [None] * 6, None
    stream = client.completions.create(
        prompt=prompts, n=3, seed=40, stream=True, stream_options={"include_usage": True}, **options
    )
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            reasons[choice.index] = choice.finish_reason or reasons[choice.index]
        usage = chunk.usage or usage
    assert texts == [c.text for c in whole.choices] and reasons == ["length"] * 6
    assert usage.completion_tokens == 60 and usage.prompt_tokens == prompt_tokens


def test_chat_without_max_tokens_runs_to_the_end_of_the_context(client, runtime):
    """OpenAI's chat default is not completions' 16 tokens: as many as the cache leaves room for."""
    messages = [{"role": "user", "content": "import os"}]
    chat = client.chat.completions.create(
        model=MODEL, messages=messages, temperature=0, extra_body={"stop_token_ids": []}
    )  # fmt: skip
    room = runtime.max_seq_len - chat.usage.prompt_tokens - runtime.k - 1
    assert (chat.usage.completion_tokens, chat.choices[0].finish_reason) == (room, "length")


def test_n_greedy_chat_choices_are_the_single_choice(client):
    messages = [{"role": "user", "content": "import os"}]
    options = dict(model=MODEL, messages=messages, temperature=0, max_tokens=8)
    single = client.chat.completions.create(**options).choices[0].message.content
    whole = client.chat.completions.create(n=2, **options)
    assert [(c.index, c.message.content) for c in whole.choices] == [(0, single), (1, single)]
    texts = ["", ""]
    for chunk in client.chat.completions.create(n=2, stream=True, **options):
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts == [single, single]


def test_chat_completion_uses_the_default_template_and_streams_the_same_text(client, runtime):
    messages = [{"role": "system", "content": "Python only."}, {"role": "user", "content": "import os"}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=16)
    rendered = runtime.tokenizer.apply_chat_template(
        messages, chat_template=DEFAULT_CHAT_TEMPLATE, add_generation_prompt=True, tokenize=False
    )
    assert rendered == "system: Python only.\nuser: import os\nassistant:"
    expected = engine_tokens(runtime, rendered, max_tokens=16)
    assert whole.choices[0].message.content == runtime.tokenizer.decode(expected)
    assert whole.choices[0].message.role == "assistant"
    chunks = list(
        client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=16, stream=True)
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_chat_channels_streamed_join_to_the_whole_message(runtime):
    # The demo model writes Python (here ` return`, then `from . import ...` lines), so pieces of that stand
    # in for think and tool-call tags: the real server path (detokenizer, parser, SSE) must give the same
    # channels streamed as whole.
    markers = Markers(think_start="return", think_end="from", tool_start="import", tool_end="\n")
    for url in run_server(create_app(runtime, MODEL, markers=markers)):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=WAIT_S)
        options = dict(model=MODEL, messages=[{"role": "user", "content": "def f(x, y):"}], temperature=0)
        options["max_tokens"] = 48
        whole = client.chat.completions.create(**options).choices[0].message
        reasoning = getattr(whole, "reasoning_content", None) or ""
        assert reasoning and whole.content  # the output had bracketed and plain text
        chunks = list(client.chat.completions.create(stream=True, **options))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        assert "".join(d.content or "" for d in deltas) == whole.content
        assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == reasoning


def test_chat_logprobs_are_the_engines(client, runtime):
    messages = [{"role": "user", "content": "class A:"}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=6, logprobs=True)
    rendered = runtime.tokenizer.apply_chat_template(
        messages, chat_template=DEFAULT_CHAT_TEMPLATE, add_generation_prompt=True, tokenize=False
    )
    result = runtime.engine.submit(rendered, SamplingParams(max_tokens=6, logprobs=True)).result()
    assert [entry.logprob for entry in chat.choices[0].logprobs.content] == pytest.approx(result.logprobs, abs=1e-5)
    assert all(entry.logprob <= 0 for entry in chat.choices[0].logprobs.content)


def test_models_health_and_metrics(client, base_url, runtime):
    assert [model.id for model in client.models.list()] == [MODEL]
    greedy_completion(client, max_tokens=12)
    assert httpx.get(f"{base_url}/health").json()["status"] == "ok"
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(f"{base_url}/metrics").text)}
    value = {name: sum(s.value for s in f.samples if s.name.endswith("_total")) for name, f in families.items()}
    drafts, accepted = (
        value["graphspec:spec_decode_num_draft_tokens"],
        value["graphspec:spec_decode_num_accepted_tokens"],
    )
    assert drafts > 0 and 0 < accepted <= drafts
    assert value["graphspec:spec_decode_num_accepted_tokens_per_pos"] == accepted
    positions = {s.labels["position"] for s in families["graphspec:spec_decode_num_accepted_tokens_per_pos"].samples}
    assert positions == {"0", "1", "2"}
    for histogram in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "spec_decode_tokens_per_step"):
        count = [s for s in families[f"graphspec:{histogram}"].samples if s.name.endswith("_count")]
        assert count and count[0].value > 0, histogram
    assert late_work(base_url) == {"triton_compiles": 0, "cpu_compiles": 0, "captures": 0}
    runtime.stats.cpu_compiles_during_requests += 2  # the gauge reads the runtime's own count
    try:
        assert late_work(base_url)["cpu_compiles"] == 2
    finally:
        runtime.stats.cpu_compiles_during_requests -= 2


def late_work(base_url: str) -> dict[str, float]:
    """graphspec:startup_work_during_requests by its `work` label."""
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(f"{base_url}/metrics").text)}
    return {s.labels["work"]: s.value for s in families["graphspec:startup_work_during_requests"].samples}


# --------------------------------------------------------------------------------------------------
# Bad requests: an OpenAI error with a 4xx status; the server keeps serving, outputs unchanged
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        ({"model": "gpt-4"}, "NotFoundError", "does not exist"),
        ({"prompt": ""}, "BadRequestError", "empty"),
        ({"max_tokens": -3}, "BadRequestError", "max_new_tokens"),
        ({"prompt": [5, 99999]}, "BadRequestError", "outside"),
        ({"prompt": [5] * 400}, "BadRequestError", "exceeds max_seq_len"),
        ({"n": 0}, "BadRequestError", "n must be in 1..128"),
        ({"n": 129}, "BadRequestError", "n must be in 1..128"),
        ({"prompt": ["a", "b", "c"], "n": 50}, "BadRequestError", "more than 128"),
        ({"n": 3, "seed": 2**63 - 2}, "BadRequestError", "seed + n - 1 must be below 2**63"),
        ({"prompt": [[5, 6], [5] * 400]}, "BadRequestError", "exceeds max_seq_len"),  # one bad prompt of two
        ({"presence_penalty": 1.5}, "BadRequestError", "presence_penalty is not supported"),
        ({"frequency_penalty": 0.5}, "BadRequestError", "frequency_penalty is not supported"),
        ({"logit_bias": {"5": 100}}, "BadRequestError", "logit_bias is not supported"),
        ({"best_of": 3}, "BadRequestError", "best_of is not supported"),
        ({"suffix": "x"}, "BadRequestError", "suffix is not supported"),
        ({"extra_body": {"repetition_penalty": 1.2}}, "BadRequestError", "repetition_penalty is not supported"),
        ({"extra_body": {"ignore_eos": True}}, "BadRequestError", "ignore_eos is not supported"),
    ],
)
def test_bad_requests_get_an_openai_error_and_change_nothing(client, options, error, words):
    before = greedy_completion(client, max_tokens=10).choices[0].text
    request = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, **options}
    with pytest.raises(getattr(openai, error)) as raised:
        client.completions.create(**request)
    assert 400 <= raised.value.status_code < 500
    assert words in raised.value.body["message"] if isinstance(raised.value.body, dict) else raised.value.message
    assert greedy_completion(client, max_tokens=10).choices[0].text == before


def test_bad_requests_sent_while_a_stream_runs_leave_it_intact(client, base_url, runtime):
    solo = runtime.tokenizer.decode(engine_tokens(runtime, PROMPT, max_tokens=40, stop_token_ids=()))
    stream = greedy_completion(client, max_tokens=40, stream=True, extra_body={"stop_token_ids": []})
    chunks = iter(stream)
    text = next(chunks).choices[0].text
    for body in ({"model": MODEL, "prompt": [5, 99999]}, {"model": "nope", "prompt": "x"}, {"model": MODEL}):
        assert httpx.post(f"{base_url}/v1/completions", json=body).status_code in (400, 404)
    text += "".join(chunk.choices[0].text for chunk in chunks)
    assert text == solo


def test_malformed_json_gets_a_400_openai_error(base_url):
    response = httpx.post(
        f"{base_url}/v1/completions",
        content=b'{"model": "demo", "prompt": ',
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_temperature_nan_gets_a_400_naming_it(base_url):
    # JSON has no NaN, but Python's json (and so many clients) write one; the openai client refuses to.
    body = b'{"model": "demo", "prompt": "x", "max_tokens": 2, "temperature": NaN}'
    response = httpx.post(f"{base_url}/v1/completions", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400 and "temperature" in response.json()["error"]["message"]


def test_a_missing_field_names_it(base_url):
    response = httpx.post(f"{base_url}/v1/chat/completions", json={"model": MODEL})
    assert response.status_code == 400 and "messages" in response.json()["error"]["message"]


# --------------------------------------------------------------------------------------------------
# Cancellation: a client that goes away frees its slot; the others are untouched
# --------------------------------------------------------------------------------------------------


def cancelled_count(base_url) -> float:
    for family in text_string_to_metric_families(httpx.get(f"{base_url}/metrics").text):
        if family.name == "graphspec:request_success":
            return sum(s.value for s in family.samples if s.labels.get("finished_reason") == "cancelled")
    return 0.0


def test_a_disconnected_stream_frees_its_slot_and_the_others_finish_intact(client, runtime, base_url):
    prompts = [f"def f{i}(x):\n    " for i in range(5)]  # 5 streams, 4 slots: the fifth waits for a slot
    options = dict(model=MODEL, temperature=0, max_tokens=80, extra_body={"stop_token_ids": []})
    solo = [runtime.tokenizer.decode(engine_tokens(runtime, p, max_tokens=80, stop_token_ids=())) for p in prompts]
    before = cancelled_count(base_url)
    streams = [client.completions.create(prompt=p, stream=True, **options) for p in prompts[:4]]
    first = [next(iter(stream)) for stream in streams]  # all four hold a slot now
    streams[1].close()  # the client goes away mid-stream
    waiting = client.completions.create(prompt=prompts[4], stream=True, **options)
    texts = {}
    for index in (0, 2, 3):
        texts[index] = first[index].choices[0].text + "".join(c.choices[0].text for c in streams[index])
    texts[4] = "".join(c.choices[0].text for c in waiting)
    assert texts == {i: solo[i] for i in (0, 2, 3, 4)}
    assert cancelled_count(base_url) == before + 1
    assert runtime.engine.load == (0, 0)


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S  # only bounds a hang
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@pytest.mark.parametrize("route", ["completions", "chat/completions"])
def test_a_client_that_leaves_a_whole_response_cancels_its_request(client, runtime, base_url, route):
    """A non-streaming request whose client disconnects while it waits for a slot leaves as cancelled
    instead of running to its end; the streams holding the slots finish intact."""
    errors = ServerErrors()
    logging.getLogger("uvicorn.error").addHandler(errors)  # where uvicorn reports a handler's exception
    try:
        leave_a_whole_response(client, runtime, base_url, route)
    finally:
        logging.getLogger("uvicorn.error").removeHandler(errors)
    assert errors.messages == []  # the handler ended cleanly (a 499 to nobody), not with an exception


class ServerErrors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def leave_a_whole_response(client, runtime, base_url, route) -> None:
    prompts = [f"def h{i}(x):\n    " for i in range(4)]
    options = dict(model=MODEL, temperature=0, max_tokens=60, extra_body={"stop_token_ids": []})
    solo = [runtime.tokenizer.decode(engine_tokens(runtime, p, max_tokens=60, stop_token_ids=())) for p in prompts]
    before = cancelled_count(base_url)
    streams = [client.completions.create(prompt=p, stream=True, **options) for p in prompts]
    first = [next(iter(stream)) for stream in streams]  # all four slots are held now
    payload = {"model": MODEL, "max_tokens": 60, "temperature": 0}
    if route == "completions":
        payload["prompt"] = "def left(x):\n    "
    else:
        payload["messages"] = [{"role": "user", "content": "hi"}]
    body = json.dumps(payload).encode()
    host, port = base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as raw:
        head = f"POST /v1/{route} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        raw.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        wait_until(lambda: runtime.engine.load[1] == 1, "the request to wait for a slot")
    # The connection is closed: the client went away before its response.
    texts = [first[i].choices[0].text + "".join(c.choices[0].text for c in streams[i]) for i in range(4)]
    assert texts == solo
    wait_until(lambda: runtime.engine.load == (0, 0), "the engine to go idle")
    assert cancelled_count(base_url) == before + 1
    assert greedy_completion(client, max_tokens=4).choices[0].text  # and the server goes on serving


@pytest.fixture(scope="module")
def keyed_url(runtime) -> str:
    yield from run_server(create_app(runtime, MODEL, api_key="s3cret"))


def test_an_api_key_guards_the_v1_routes_and_leaves_probes_open(keyed_url):
    keyed = openai.OpenAI(base_url=f"{keyed_url}/v1", api_key="s3cret", max_retries=0, timeout=WAIT_S)
    text = keyed.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=6).choices[0].text
    streamed = keyed.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=6, stream=True)
    assert "".join(chunk.choices[0].text for chunk in streamed) == text
    for key in ("wrong", "s3cre"):  # a prefix of the key is wrong too
        wrong = openai.OpenAI(base_url=f"{keyed_url}/v1", api_key=key, max_retries=0, timeout=WAIT_S)
        with pytest.raises(openai.AuthenticationError) as raised:
            wrong.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2)
        assert "API key" in raised.value.message and raised.value.code == "invalid_api_key"
    assert httpx.get(f"{keyed_url}/v1/models").status_code == 401  # no Authorization header at all
    assert httpx.post(f"{keyed_url}/tokenize", json={"model": MODEL, "prompt": "x"}).status_code == 401
    assert httpx.get(f"{keyed_url}/health").status_code == 200 and httpx.get(f"{keyed_url}/metrics").status_code == 200


def test_serve_takes_its_api_key_from_the_environment_and_refuses_an_empty_one(monkeypatch):
    from graphspec.cli import main

    calls = []
    monkeypatch.setattr("graphspec.serve.serve", lambda *args: calls.append(args))
    monkeypatch.setenv("GRAPHSPEC_API_KEY", "from-env")
    assert main(["serve", "some-artifact"]) == 0 and calls[-1][-1] == "from-env"
    assert main(["serve", "some-artifact", "--api-key", "flag"]) == 0 and calls[-1][-1] == "flag"
    monkeypatch.setenv("GRAPHSPEC_API_KEY", " ")
    assert main(["serve", "some-artifact"]) == 2 and len(calls) == 2  # refused before serving
    monkeypatch.delenv("GRAPHSPEC_API_KEY")
    assert main(["serve", "some-artifact"]) == 0 and calls[-1][-1] is None


def test_health_is_503_while_the_engines_steps_fail_and_200_again_after_one_succeeds(
    client, runtime, base_url, monkeypatch
):
    assert httpx.get(f"{base_url}/health").status_code == 200
    real_prefill = runtime.prefill

    def broken(*args, **kwargs):
        raise RuntimeError("injected device failure")

    monkeypatch.setattr(runtime, "prefill", broken)
    with pytest.raises(openai.InternalServerError):
        greedy_completion(client, max_tokens=4)
    health = httpx.get(f"{base_url}/health")
    assert health.status_code == 503 and health.json()["error"] == "RuntimeError: injected device failure"
    monkeypatch.setattr(runtime, "prefill", real_prefill)
    assert greedy_completion(client, max_tokens=4).choices[0].text
    assert httpx.get(f"{base_url}/health").status_code == 200


def test_serve_refuses_malformed_channel_markers_before_loading():
    from graphspec.cli import main

    assert main(["serve", "no-such-artifact", "--channels", "<think>,</think>"]) == 2


def test_serve_refuses_a_port_in_use_before_loading(capsys):
    # The port is bound before the artifact is even looked at (here it does not exist): a taken port is
    # refused at once, not after a start-up of seconds to minutes.
    from graphspec.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "no-such-artifact", "--port", str(port)]) == 1
    error = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in error and "no-such-artifact" not in error


def test_output_changing_fields_at_their_neutral_values_are_accepted(client):
    # A client that sends the defaults (penalties 0, best_of 1, an empty logit_bias) gets what it asked for.
    plain = greedy_completion(client, max_tokens=6).choices[0].text
    neutral = {"presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {}, "best_of": 1}
    assert greedy_completion(client, max_tokens=6, **neutral).choices[0].text == plain
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2, temperature=0,
        response_format={"type": "text"},
    )  # fmt: skip
    assert chat.choices[0].message is not None
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
            response_format={"type": "json_object"},
        )  # fmt: skip
    assert "response_format is not supported" in raised.value.message
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2, tool_choice="required",
            tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        )  # fmt: skip
    assert "tool_choice is not supported" in raised.value.message
    no_tools = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2, temperature=0, tool_choice="none"
    )  # OpenAI's default without tools
    assert no_tools.choices[0].message is not None


def test_serve_freezes_the_loaded_graphs_out_of_the_collectors_passes(runtime, monkeypatch):
    # A full collection walks every tracked object: the Runtime's graphs are most of them, kept for the
    # process's life, so serve freezes them (gc.freeze) before it starts answering.
    import gc

    from graphspec.runtime.runtime import Runtime
    from graphspec.serve import serve

    frozen_when_serving = []

    def run(server, sockets=None):
        frozen_when_serving.append(gc.get_freeze_count())

    monkeypatch.setattr(Runtime, "load", classmethod(lambda cls, *args, **kwargs: runtime))
    monkeypatch.setattr(uvicorn.Server, "run", run)
    try:
        serve("an-artifact", port=0)
    finally:
        gc.unfreeze()
    assert frozen_when_serving and frozen_when_serving[0] > 100_000, frozen_when_serving
