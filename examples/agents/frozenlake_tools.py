"""A tool-calling agent on FrozenLake, written only against the official `openai`
client: its moves are calls of a ``move`` tool, whose results it sends back as tool
messages. Run by agent mode (``agent.program.function:
examples.agents.frozenlake_tools:play``), once per episode; `reward` is a reward
function for it (``agent.program.reward``).
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
#: a worked exchange the chat opens with: a small model imitates a call it has seen
SHOWN = [
    {"role": "user", "content": "Goal: rows +1, columns +0.\nLeft: ice. Down: goal. Right: ice. Up: edge."},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "shown", "type": "function", "function": {"name": "move", "arguments": '{"direction": "Down"}'}}
        ],
    },
]


def play(task: Any) -> dict[str, int]:
    """One episode: `task.env` is the lake, `task.base_url` the policy. Returns how many
    calls it made and how many of them moved (a valid `move` call)."""
    client = openai.OpenAI(base_url=task.base_url, api_key=task.api_key, max_retries=0, http_client=HTTP)
    env = task.env
    messages: list[Any] = [
        {"role": "system", "content": f"You walk on a frozen lake by calling the move tool. {env.instructions}"},
        *SHOWN,
        {"role": "user", "content": env.render()},
    ]
    calls = moves = 0
    while not env.done:
        try:
            reply = client.chat.completions.create(model=task.model, messages=messages, tools=[MOVE])
        except openai.BadRequestError as exc:  # the episode's call budget or context is spent
            if getattr(exc, "code", None) in ("episode_ended", "context_length_exceeded"):
                break
            raise
        calls += 1
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
            moves += bool(info["action_valid"])
            result = f"reward {reward:g}; valid {info['action_valid']}; done {done}\n{state}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return {"calls": calls, "moves": moves}


def reward(task: Any, result: dict[str, int]) -> float:
    """1 for reaching the goal, plus 0.1 times the share of calls that moved: a small
    model that has never called a tool first learns to call it."""
    return float(task.env.success) + 0.1 * result["moves"] / max(1, result["calls"])
