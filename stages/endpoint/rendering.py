"""Chats as text through a tokenizer's chat template, with tools.

A template that renders tools itself (Qwen2.5's) is given them and the assistant's tool
calls as they are. One that does not (SmolLM2's) gets the same convention written into
the chat: the tools' schemas in the system message, each call as a ``<tool_call>`` block
of JSON in the assistant's text, each result as a ``<tool_response>`` block in a user
message. Either way the policy's calls are read back from ``<tool_call>`` blocks
(`read_calls`).
"""

from __future__ import annotations

import json
import re
from typing import Any

from stages.endpoint.messages import Message, tool_call

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_PROBE = "zz_probe_tool"


def tools_text(tools: tuple[Message, ...]) -> str:
    """What a template without tools is told of them, after its system message."""
    schemas = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\nYou may call the functions below. Their signatures, one JSON object a line, within "
        f"<tools></tools>:\n<tools>\n{schemas}\n</tools>\n\nTo call one, write a JSON object with its name and "
        'arguments within <tool_call></tool_call>:\n<tool_call>\n{"name": <function-name>, "arguments": '
        "<args-json-object>}\n</tool_call>"
    )


def call_text(call: Message) -> str:
    """One tool call as the policy writes it."""
    fn = call["function"]
    return f"{CALL_OPEN}\n{json.dumps({'name': fn['name'], 'arguments': fn['arguments']}, ensure_ascii=False)}\n{CALL_CLOSE}"


def read_calls(text: str) -> tuple[str | None, list[Message], bool]:
    """The content and tool calls of a sampled response: the text outside the
    ``<tool_call>`` blocks (None when empty), each block's call, and whether every
    block parsed (a block that does not leaves the whole text as content, no calls)."""
    blocks = _CALL.findall(text)
    if len(blocks) != text.count(CALL_OPEN):  # a block left open (cut at the length limit) or one without a start
        return text, [], False
    if not blocks:
        return text, [], True
    calls = []
    for block in blocks:
        try:
            data = json.loads(block)
        except json.JSONDecodeError:
            return text, [], False
        args = data.get("arguments", {}) if isinstance(data, dict) else None
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                args = None
        if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not isinstance(args, dict):
            return text, [], False
        calls.append(tool_call(data["name"], args))
    rest = _CALL.sub("", text).strip()
    return rest or None, calls, True


class Template:
    """A tokenizer's chat template as the endpoint renders chats: `render`, and `close`,
    the text the template writes after an assistant's message (its end of turn)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.eos_text: str = tokenizer.eos_token or ""
        probe = [{"role": "user", "content": "u"}]
        tool = {"type": "function", "function": {"name": _PROBE, "parameters": {"type": "object", "properties": {}}}}
        self.native_tools = _PROBE in self._apply(probe, (tool,), True)
        mark = "\x00END\x00"
        text = self._apply([*probe, {"role": "assistant", "content": mark}], (), False)
        self.close = text.split(mark, 1)[1]

    def _apply(self, messages: list[Message], tools: tuple[Message, ...], generation: bool) -> str:
        kwargs: dict[str, Any] = {"tools": list(tools)} if tools else {}
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation, **kwargs)

    def render(
        self, messages: tuple[Message, ...] | list[Message], tools: tuple[Message, ...], generation: bool
    ) -> str:
        """The chat as text, with the generation prompt if `generation`."""
        if self.native_tools or not tools:
            if not tools:  # no tools: calls and results in the text convention, as without tool support
                messages = [self._plain(m) for m in messages]
            return self._apply(list(messages), tools, generation)
        plain = [self._plain(m) for m in messages]
        block = tools_text(tools)
        if plain and plain[0]["role"] == "system":
            plain[0] = {"role": "system", "content": f"{plain[0]['content']}\n\n{block}"}
        else:
            plain.insert(0, {"role": "system", "content": block})
        return self._apply(plain, (), generation)

    @staticmethod
    def _plain(message: Message) -> Message:
        """A message with its tool calls, or a tool result, as text."""
        if message["role"] == "tool":
            return {"role": "user", "content": f"<tool_response>\n{message['content']}\n</tool_response>"}
        if message.get("tool_calls"):
            texts = [message["content"]] if message["content"] else []
            return {"role": "assistant", "content": "\n".join(texts + [call_text(c) for c in message["tool_calls"]])}
        return message
