"""A tool-calling agent on FrozenLake, written only against the official `openai`
client: its moves are calls of a ``move`` tool, whose results it sends back as tool
messages. Run by agent mode (``agent.program.function:
examples.agents.frozenlake_tools:play``), once per episode.
"""

from __future__ import annotations

import json
from typing import Any

import openai

#: one connection pool for every episode: a new HTTP client costs about 50 ms of CPU (its TLS
#: context), more than a call to a small policy
HTTP = openai.DefaultHttpxClient()
MOVE = {
    "type": "function",
    "function": {
        "name": "move",
        "description": "Take one step on the lake.",
        "parameters": {
            "type": "object",
            "properties": {"direction": {"type": "string", "enum": ["Left", "Down", "Right", "Up"]}},
            "required": ["direction"],
        },
    },
}


def play(task: Any) -> None:
    """One episode: `task.env` is the lake, `task.base_url` the policy."""
    client = openai.OpenAI(base_url=task.base_url, api_key=task.api_key, max_retries=0, http_client=HTTP)
    env = task.env
    messages: list[Any] = [
        {"role": "system", "content": "You walk on a frozen lake by calling the move tool."},
        {"role": "user", "content": f"{env.instructions}\n\n{env.render()}"},
    ]
    while not env.done:
        try:
            reply = client.chat.completions.create(model=task.model, messages=messages, tools=[MOVE])
        except openai.BadRequestError as exc:  # the episode's call budget or context is spent
            if getattr(exc, "code", None) in ("episode_ended", "context_length_exceeded"):
                return
            raise
        message = reply.choices[0].message
        messages.append(message)  # the answer as it came back, tool calls and all
        if not message.tool_calls:
            messages.append({"role": "user", "content": "Call the move tool."})
            continue
        for call in message.tool_calls:
            try:
                direction = json.loads(call.function.arguments).get("direction", "")
            except (json.JSONDecodeError, AttributeError):
                direction = ""
            state, reward, done, info = env.step(str(direction))
            result = f"reward {reward:g}; valid {info['action_valid']}; done {done}\n{state}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
