"""A plain chat loop on FrozenLake, written only against the official `openai` client.

Each turn it shows the lake, asks for one move, reads the first action word of the
answer and acts; the environment's rewards are the episode's score. Run by agent mode
(``agent.program.function: examples.agents.frozenlake_chat:play``), once per episode.
"""

from __future__ import annotations

import re
from typing import Any

import openai

#: one connection pool for every episode: a new HTTP client costs about 50 ms of CPU (its TLS
#: context), more than a call to a small policy
HTTP = openai.DefaultHttpxClient()
SYSTEM = "You walk on a frozen lake. Answer with one move: Left, Down, Right or Up."


def play(task: Any) -> None:
    """One episode: `task.env` is the lake, `task.base_url` the policy."""
    client = openai.OpenAI(base_url=task.base_url, api_key=task.api_key, max_retries=0, http_client=HTTP)
    env = task.env
    words = "|".join(env.action_words)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"{env.instructions}\n\n{env.render()}\nYour move?"},
    ]
    while not env.done:
        try:
            reply = client.chat.completions.create(model=task.model, messages=messages)
        except openai.BadRequestError as exc:  # the episode's call budget or context is spent
            if getattr(exc, "code", None) in ("episode_ended", "context_length_exceeded"):
                return
            raise
        text = reply.choices[0].message.content or ""
        move = re.search(words, text, re.IGNORECASE)
        state, reward, _, _ = env.step(move.group(0) if move else text)
        messages.append({"role": "assistant", "content": text})
        messages.append({"role": "user", "content": f"Reward: {reward:g}\n{state}\nYour move?"})
