"""What the endpoint serves of a chat-completions request, and what it refuses in one line."""

from __future__ import annotations

import pytest

from stages.endpoint.messages import Refused, parse
from stages.endpoint.rendering import read_calls

OK = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_a_plain_request_and_what_is_ignored():
    request = parse({**OK, "temperature": 0.2, "top_p": 0.5, "seed": 3, "logprobs": True, "whatever": 1})
    assert request.messages == ({"role": "user", "content": "hi"},)
    assert request.tools == () and request.max_tokens is None and request.stop == ()
    request = parse({**OK, "max_completion_tokens": 5, "stop": "</a>"})
    assert request.max_tokens == 5 and request.stop == ("</a>",)


def test_messages_are_normalised_as_templates_read_them():
    body = {
        "model": "m",
        "messages": [
            {"role": "developer", "content": [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}]},
            {"role": "user", "content": "go", "name": "me"},
            {
                "role": "assistant",
                "content": None,
                "refusal": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "move", "arguments": '{"d": 1}'}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ],
    }
    got = parse(body).messages
    assert got[0] == {"role": "system", "content": "be brief"}
    assert got[1] == {"role": "user", "content": "go"}
    assert got[2] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "move", "arguments": {"d": 1}}}],
    }
    assert got[3] == {"role": "tool", "content": "ok"}


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"stream": True}, "stream", "streaming is not served"),
        ({"n": 2}, "n", "one choice"),
        ({"response_format": {"type": "json_object"}}, "response_format", "only text"),
        ({"logit_bias": {"1": 5}}, "logit_bias", "not served"),
        ({"tool_choice": "required"}, "tool_choice", "only 'auto' and 'none'"),
        ({"messages": []}, "messages", "non-empty list"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "expected one of"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content", "only text"),
        ({"max_tokens": 0}, "max_tokens", "positive integer"),
        ({"stop": [1]}, "stop", "strings"),
        ({"tools": [{"type": "retrieval"}]}, "tools", "expected {type: function"),
        (
            {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}]},
            "messages[0].tool_calls[0]",
            "JSON object",
        ),
    ],
)
def test_what_is_refused_names_its_field_in_one_line(change, field, words):
    with pytest.raises(Refused) as caught:
        parse({**OK, **change})
    assert caught.value.param == field and words in caught.value.message and "\n" not in caught.value.message
    assert caught.value.body()["error"]["param"] == field


def test_tool_calls_are_read_from_their_blocks():
    text = 'Going.\n<tool_call>\n{"name": "move", "arguments": {"direction": "Up"}}\n</tool_call>'
    assert read_calls(text) == (
        "Going.",
        [{"type": "function", "function": {"name": "move", "arguments": {"direction": "Up"}}}],
        True,
    )
    as_string = '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>'
    assert read_calls(as_string) == (
        None,
        [{"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}],
        True,
    )
    for broken in (
        '<tool_call>{"name": "f", "arguments": {',
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"x": 1}</tool_call>',
    ):
        assert read_calls(broken) == (broken, [], False)
    assert read_calls("just text") == ("just text", [], True)


def test_stop_strings_are_bounded_as_openais_api_bounds_them():
    """Issue 93: each new set of stop strings built a vocabulary-wide table; a body with
    10^5 of them, or one of a megabyte, is refused with the field named."""
    base = {"messages": [{"role": "user", "content": "hi"}]}
    assert parse({**base, "stop": ["</answer>", "\n\n", "END", "x"]}).stop == ("</answer>", "\n\n", "END", "x")
    for stop in (["a"] * 5, ["a" * 65], [str(i) for i in range(100_000)]):
        with pytest.raises(Refused, match="at most 4 strings") as refused:
            parse({**base, "stop": stop})
        assert refused.value.param == "stop"
