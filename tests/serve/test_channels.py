"""The streaming reasoning/tool-call parser: however a token stream is cut into deltas of 1..K+1 tokens
(the sizes speculative steps commit), the channels are those of parsing the text whole; a marker split
at any character never leaks into another channel; end of stream flushes what was held back."""

from __future__ import annotations

import pytest

hypothesis = pytest.importorskip("hypothesis")  # in the dev extra; GPU images may lack it

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

from graphspec.serve.channels import ChannelDelta, ChannelParser, Markers  # noqa: E402
from graphspec.serve.text import TextStream  # noqa: E402

K = 4
MARKERS = Markers()
CALL = '{"name": "get_weather", "arguments": {"city": "Zürich"}}'
TEXTS = {
    "think_then_tool": f"<think>Les données: 日本語 ünï </think>Answer ✓ <tool_call>{CALL}</tool_call> done.",
    # DeepSeek-V4 style (seed 003): the template opened <think>; a tool call ends reasoning implicitly.
    "implicit_end": f"reasoning ≈ 3 steps <tool_call>{CALL}</tool_call>then text </think> stays text",
    "near_misses": "a </thin k> <tool_cal <think>x</think>< /think> <tool_call>{bad json</tool_call> end <",
}
STARTS_IN_REASONING = {"think_then_tool": False, "implicit_end": True, "near_misses": False}


def train_tokenizer(marker_tokens: bool) -> Tokenizer:
    """A tiny byte-level BPE trained here (no hub): multi-byte characters span several tokens, and the
    markers are several tokens too unless marker_tokens adds them as single tokens."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = ["the weather in the city of data", "think about tool calls", "réponse données ✓"] * 20
    tokenizer.train_from_iterator(corpus, trainer)
    if marker_tokens:
        tokenizer.add_tokens([MARKERS.think_start, MARKERS.think_end, MARKERS.tool_start, MARKERS.tool_end])
    return tokenizer


TOKENIZERS = {"markers_split": train_tokenizer(False), "markers_whole": train_tokenizer(True)}


def looks_like_json(body: str) -> bool:
    return body.startswith('{"')


def parse_deltas(deltas: list[str], starts_in_reasoning: bool, is_tool_call=None) -> ChannelDelta:
    parser = ChannelParser(Markers(starts_in_reasoning=starts_in_reasoning), is_tool_call)
    joined = ChannelDelta()
    for piece in [parser.feed(delta) for delta in deltas] + [parser.finish()]:
        joined.reasoning += piece.reasoning
        joined.content += piece.content
        joined.tool_calls += piece.tool_calls
    return joined


def whole(name: str) -> ChannelDelta:
    return parse_deltas([TEXTS[name]], STARTS_IN_REASONING[name])


def test_whole_parse_of_the_reference_texts():
    first = whole("think_then_tool")
    assert first.reasoning == "Les données: 日本語 ünï "
    assert first.content == "Answer ✓  done."
    assert first.tool_calls == [CALL]
    implicit = whole("implicit_end")
    assert implicit.reasoning == "reasoning ≈ 3 steps "
    assert implicit.tool_calls == [CALL]
    assert implicit.content == "then text </think> stays text"  # reasoning ended: the tag is text now
    misses = whole("near_misses")
    assert misses.reasoning == "x"
    assert misses.tool_calls == ["{bad json"]
    assert misses.content == "a </thin k> <tool_cal < /think>  end <"


@pytest.mark.parametrize("name", sorted(TEXTS))
@pytest.mark.parametrize("tokenizer_name", sorted(TOKENIZERS))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_split_into_deltas_of_1_to_k_plus_1_tokens_gives_the_whole_parse(name, tokenizer_name, data):
    tokenizer = TOKENIZERS[tokenizer_name]
    ids = tokenizer.encode(TEXTS[name]).ids
    assert tokenizer.decode(ids) == TEXTS[name]
    sizes = data.draw(st.lists(st.integers(1, K + 1), min_size=len(ids), max_size=len(ids)))
    text, deltas, start = TextStream(tokenizer), [], 0
    for size in sizes:
        if start >= len(ids):
            break
        deltas.append(text.add(ids[start : start + size]))
        start += size
    deltas.append(text.finish(TEXTS[name]))
    assert "".join(deltas) == TEXTS[name]  # the detokenizer's deltas join to the text
    assert parse_deltas(deltas, STARTS_IN_REASONING[name]) == whole(name)


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_every_split_position_of_every_marker_gives_the_whole_parse(name):
    text = TEXTS[name]
    markers = (MARKERS.think_start, MARKERS.think_end, MARKERS.tool_start, MARKERS.tool_end)
    starts = sorted({i for m in markers for i in range(len(text)) if text.startswith(m, i)})
    assert starts
    for start in starts:
        for split in range(start, start + max(len(m) for m in markers if text.startswith(m, start)) + 1):
            assert parse_deltas([text[:split], text[split:]], STARTS_IN_REASONING[name]) == whole(name), split
    for size in (1, 2, 3):  # and every marker cut into pieces of a few characters at once
        pieces = [text[i : i + size] for i in range(0, len(text), size)]
        assert parse_deltas(pieces, STARTS_IN_REASONING[name]) == whole(name), size
        # With a tool-call check, a refused body stays in content at its place, however the text is cut.
        checked = parse_deltas([text], STARTS_IN_REASONING[name], looks_like_json)
        assert parse_deltas(pieces, STARTS_IN_REASONING[name], looks_like_json) == checked, size


def test_seed_003_a_split_tool_marker_is_held_back_and_reaches_the_tool_channel_whole():
    parser = ChannelParser(Markers(starts_in_reasoning=True))
    first = parser.feed("thinking hard <tool")
    assert first.reasoning == "thinking hard " and not first.content  # "<tool" is held, not leaked
    second = parser.feed(f"_call>{CALL}</tool_")
    assert not second.reasoning and not second.tool_calls
    third = parser.feed("call>")
    assert third.tool_calls == [CALL]


def test_end_of_stream_flushes_a_prefix_that_never_completed():
    parser = ChannelParser(Markers(starts_in_reasoning=True))
    assert parser.feed("almost </thi").reasoning == "almost "
    assert parser.finish().reasoning == "</thi"


def test_an_unterminated_tool_call_comes_back_as_content():
    parser = ChannelParser()
    assert parser.feed('see <tool_call>{"name": "f"').content == "see "
    flushed = parser.finish()
    assert flushed.content == '<tool_call>{"name": "f"' and flushed.tool_calls == []


def test_markers_must_be_non_empty():
    with pytest.raises(ValueError, match="non-empty"):
        Markers(think_end="")


def test_text_stream_holds_a_partial_stop_string_and_never_shows_the_stop():
    tokenizer = TOKENIZERS["markers_split"]
    ids = tokenizer.encode("the weather STOP here").ids
    stream = TextStream(tokenizer, stops=("STOP",))
    shown = "".join(stream.add([token]) for token in ids)
    assert shown == "the weather "


def test_a_parsed_tool_call_becomes_an_openai_tool_call_and_a_bad_one_stays_text_in_place():
    app = pytest.importorskip("graphspec.serve.app")
    parser = ChannelParser(MARKERS, app.is_tool_call)
    text = f"<think>why</think>a <tool_call>{{not json</tool_call> b <tool_call>{CALL}</tool_call> c"
    parsed = parser.feed(text)
    rest = parser.finish()
    assert (parsed.content + rest.content, parsed.tool_calls) == ("a <tool_call>{not json</tool_call> b  c", [CALL])
    fields = app.channel_fields(parsed, 2)
    assert fields["reasoning_content"] == "why"
    [call] = fields["tool_calls"]
    assert call["index"] == 2 and call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Z\\u00fcrich"}'}
