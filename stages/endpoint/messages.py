"""The chat-completions requests the endpoint serves, and its answers
(docs/agents.md#the-endpoints-contract).

`parse` turns a request body into a `Request` of normalised messages (plain dicts a chat
template renders: role, content, and an assistant's tool calls with their arguments as
objects), or raises `Refused` with one line naming the field. What changes how the
policy samples is refused or ignored, never honoured: the distribution trained on must
be the one sampled from.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Any

#: roles a message may have (``developer`` is read as ``system``)
ROLES = ("system", "developer", "user", "assistant", "tool")
#: request fields accepted and ignored: the stage's own sampling settings apply
IGNORED = (
    "temperature",
    "top_p",
    "seed",
    "frequency_penalty",
    "presence_penalty",
    "logprobs",
    "top_logprobs",
    "user",
    "metadata",
    "store",
    "parallel_tool_calls",
    "service_tier",
    "reasoning_effort",
    "stream_options",
)


class Refused(Exception):
    """A request the endpoint does not serve: an HTTP status and one line, naming the
    request field (`param`) where there is one."""

    def __init__(
        self, message: str, param: str | None = None, status: int = 400, code: str = "invalid_request"
    ) -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.code = message, param, status, code

    def body(self) -> dict[str, Any]:
        """The error as the OpenAI API writes it."""
        return {
            "error": {"message": self.message, "type": "invalid_request_error", "param": self.param, "code": self.code}
        }


Message = dict[str, Any]

#: a function's name as the OpenAI API accepts it
#: stop strings a request may add (OpenAI's API takes 4), and their longest
MAX_STOPS, MAX_STOP_CHARS = 4, 64
FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")


def _bad_unicode(value: Any, where: str) -> str | None:
    """The first field of `value` holding a string that is not valid Unicode (a lone
    surrogate, which JSON's ``\\ud800`` escapes can carry and no tokenizer encodes)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where or "the body"
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            bad = _bad_unicode(key, where) or _bad_unicode(item, f"{where}.{key}" if where else str(key))
            if bad:
                return bad
    if isinstance(value, list):
        for k, item in enumerate(value):
            bad = _bad_unicode(item, f"{where}[{k}]")
            if bad:
                return bad
    return None


@dataclass(frozen=True)
class Request:
    """One call: the normalised chat, its tools (function schemas; empty: none), the
    longest response asked for (None: the stage's) and extra stop strings."""

    messages: tuple[Message, ...]
    tools: tuple[Message, ...] = ()
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()


def _text(content: Any, where: str) -> str:
    """A message's content as one string: a string, null, or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for k, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise Refused(f"{where}.content[{k}]: only text parts are served, not {kind!r}", f"{where}.content")
            texts.append(part["text"])
        return "".join(texts)
    raise Refused(f"{where}.content: expected a string or a list of text parts", f"{where}.content")


def _arguments(value: Any, where: str) -> dict[str, Any]:
    """A tool call's arguments as an object (the API sends a JSON string)."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError:
            raise Refused(f"{where}: the arguments are not JSON", where) from None
    if not isinstance(value, dict):
        raise Refused(f"{where}: the arguments must be a JSON object", where)
    return value


def tool_call(name: str, arguments: dict[str, Any]) -> Message:
    """A tool call as a normalised message holds it (and as chat templates read it)."""
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def normalise(message: Any, k: int) -> Message:
    """One message as templates render it and as the endpoint compares it: its role,
    its content as text, an assistant's tool calls (name and arguments as an object)
    and a tool result's content; ids and every other field are left out."""
    where = f"messages[{k}]"
    if not isinstance(message, dict):
        raise Refused(f"{where}: expected an object", where)
    role = message.get("role")
    if role not in ROLES:
        raise Refused(f"{where}.role: expected one of {', '.join(ROLES)}, got {role!r}", f"{where}.role")
    out: Message = {"role": "system" if role == "developer" else role, "content": _text(message.get("content"), where)}
    if role == "assistant" and message.get("tool_calls"):
        calls = message["tool_calls"]
        if not isinstance(calls, list):
            raise Refused(f"{where}.tool_calls: expected a list", f"{where}.tool_calls")
        out["tool_calls"] = []
        for j, call in enumerate(calls):
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise Refused(f"{where}.tool_calls[{j}]: expected a function with a name", f"{where}.tool_calls")
            out["tool_calls"].append(tool_call(fn["name"], _arguments(fn.get("arguments"), f"{where}.tool_calls[{j}]")))
    return out


def _call_ids(messages: list[Any]) -> None:
    """Refuse a tool result that answers no call, as the OpenAI API does: each ``tool``
    message's ``tool_call_id`` is the id of a call of the assistant message before it
    (the ids are checked, then left out of the normalised chat)."""
    open_ids: set[str] = set()
    for k, message in enumerate(messages):
        where = f"messages[{k}]"
        role = message.get("role")
        if role == "assistant":
            open_ids = set()
            for j, call in enumerate(message.get("tool_calls") or []):
                ident = call.get("id")
                if ident is not None and not isinstance(ident, str):
                    raise Refused(f"{where}.tool_calls[{j}].id: expected a string", f"{where}.tool_calls")
                if isinstance(ident, str):
                    open_ids.add(ident)
        elif role == "tool":
            ident = message.get("tool_call_id")
            if not isinstance(ident, str):
                raise Refused(f"{where}.tool_call_id: expected a string", f"{where}.tool_call_id")
            if ident not in open_ids:
                raise Refused(
                    f"{where}.tool_call_id: {ident!r} answers no tool call of the assistant message before it",
                    f"{where}.tool_call_id",
                )
            open_ids.discard(ident)
        else:
            open_ids = set()


def _tools(body: dict[str, Any]) -> tuple[Message, ...]:
    tools = body.get("tools") or []
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise Refused(
            "tool_choice: only 'auto' and 'none' are served: the policy decides whether to call", "tool_choice"
        )
    if not isinstance(tools, list):
        raise Refused("tools: expected a list", "tools")
    out = []
    for k, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise Refused(f"tools[{k}]: expected {{type: function, function: {{name, ...}}}}", "tools")
        if not FUNCTION_NAME.match(fn["name"]):
            raise Refused(f"tools[{k}].function.name: letters, digits, _ and - only, 1 to 64 of them", "tools")
        if "parameters" in fn and not isinstance(fn["parameters"], dict):
            raise Refused(f"tools[{k}].function.parameters: expected a JSON Schema object", "tools")
        if not isinstance(fn.get("description", ""), str):
            raise Refused(f"tools[{k}].function.description: expected a string", "tools")
        out.append({"type": "function", "function": fn})
    return () if choice == "none" else tuple(out)


def parse(body: Any) -> Request:
    """The request `body` (parsed JSON) as a `Request`; `Refused` names what is not served."""
    if not isinstance(body, dict):
        raise Refused("the request body must be a JSON object")
    bad = _bad_unicode(body, "")
    if bad is not None:
        raise Refused(f"{bad}: not valid Unicode (a lone surrogate)", bad.split(".")[0].split("[")[0] or None)
    if body.get("stream"):
        raise Refused("stream: streaming is not served; leave stream unset or false", "stream")
    if body.get("n", 1) != 1:
        raise Refused("n: one choice per call is served", "n")
    fmt = body.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise Refused(
            "response_format: only text is served (constrained decoding would change the policy)", "response_format"
        )
    if body.get("logit_bias"):
        raise Refused("logit_bias: not served (it would change the distribution trained on)", "logit_bias")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise Refused("messages: expected a non-empty list", "messages")
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise Refused("max_tokens: expected a positive integer", "max_tokens")
    stop = body.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else stop
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
        raise Refused("stop: expected a string or a list of strings", "stop")
    if len(stop) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in stop):
        # each new set of stop strings costs a vocabulary-wide table and a generate call of its own
        raise Refused(f"stop: at most {MAX_STOPS} strings of at most {MAX_STOP_CHARS} characters each", "stop")
    normalised = tuple(normalise(m, k) for k, m in enumerate(messages))
    _call_ids(messages)
    return Request(normalised, _tools(body), limit, tuple(stop))


def completion(
    model: str, content: str | None, calls: list[Message], finish: str, prompt_tokens: int, sampled: int, n: int
) -> dict[str, Any]:
    """A chat completion as the OpenAI API writes it (`n`: the call's number in its episode)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {
                "id": f"call_{n}_{j}",
                "type": "function",
                "function": {"name": c["function"]["name"], "arguments": json.dumps(c["function"]["arguments"])},
            }
            for j, c in enumerate(calls)
        ]
    return {
        "id": f"chatcmpl-{n}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": sampled,
            "total_tokens": prompt_tokens + sampled,
        },
    }
