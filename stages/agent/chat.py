"""The chat in token space: template texts as token ids for one tokenizer."""

from __future__ import annotations

from typing import Any

from stages.agent import prompts


class Chat:
    """Template texts as token ids for one tokenizer (works with any chat template:
    each continuation is what the template adds after an assistant message)."""

    #: texts whose `first` encoding is kept (then the memo starts again)
    KEEP = 4096

    def __init__(self, tokenizer: Any, think: bool) -> None:
        self.tokenizer, self.think = tokenizer, think
        self.prefix = prompts.generation_prefix(think)
        mark = "\x00RESPONSE\x00"
        history = [
            {"role": "system", "content": prompts.SYSTEM},
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": mark},
        ]
        text = self._render([*history, {"role": "user", "content": "\x00USER\x00"}])
        self._between = text.split(mark, 1)[1].split("\x00USER\x00")  # [before user text, after it]
        self.eos_text = tokenizer.eos_token or ""
        self._opened: dict[str, tuple[int, ...]] = {}  # `first` by its text: states recur, turn after turn

    def _render(self, messages: list[dict[str, str]]) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _opening(self, user: str, shot: tuple[str, str] | None) -> str:
        """The template's text of a chat opened with `user`'s message (after `shot`'s
        worked exchange, if any), up to the response."""
        messages = [{"role": "system", "content": prompts.SYSTEM}]
        if shot is not None:
            messages += [{"role": "user", "content": shot[0]}, {"role": "assistant", "content": shot[1]}]
        messages.append({"role": "user", "content": user})
        return self._render(messages) + self.prefix

    def first(self, user: str, shot: tuple[str, str] | None = None) -> list[int]:
        """The chat opened with `user`'s message, up to the response (a new list); with
        `shot`, a worked exchange (a user message and its answer,
        `stages.agent.prompts.example_exchange`) comes before it."""
        key = user if shot is None else "\x00".join((*shot, user))
        kept = self._opened.get(key)
        if kept is None:
            if len(self._opened) >= self.KEEP:
                self._opened.clear()
            kept = self._opened[key] = tuple(self.encode(self._opening(user, shot)))
        return list(kept)

    def first_many(self, users: list[str], shots: list[tuple[str, str] | None] | None = None) -> list[list[int]]:
        """`first` of each of `users` (the same ids; `shots`: each one's worked exchange, or
        none), rendered one by one and encoded in one call: a data set of prompts is
        tokenized on every core, not one text at a time."""
        texts = [self._opening(user, shot) for user, shot in zip(users, shots or [None] * len(users), strict=True)]
        if not texts:
            return []
        return [list(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]

    def next(self, user: str, response: list[int]) -> list[int]:
        """What follows the sampled `response` up to the next one, with `user`'s message
        between: the template's end of the assistant turn (less its end-of-turn token
        where the response sampled it; a response cut at a stop string or the length
        limit did not), the message, and the next generation prefix."""
        before, after = self._between
        if response[-1:] == [self.tokenizer.eos_token_id] and before.startswith(self.eos_text):
            before = before[len(self.eos_text) :]  # the end-of-turn token was sampled
        return self.encode(before + user + after + self.prefix)
