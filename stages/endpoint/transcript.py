"""One episode's calls as token samples, with exactly the sampled tokens under the mask.

A call's prompt is its chat rendered through the template and tokenised, unless it
*extends* the previous call: its messages begin with that call's messages and the
answer exactly as the endpoint returned it, and its text begins with theirs. Then the
prompt is the previous prompt, the previous response's sampled tokens as they were
sampled, and the tokens of what the template writes after them (the end of the
assistant's turn, less the end-of-turn token where it was sampled, and the new
messages): the same sample grows, and the program's text is never re-tokenised. A call
that does not extend the previous one (the program dropped, summarised or reordered its
history, or changed its tools) starts a new sample, as ``agent.history`` does in our own
loop; a trajectory's `segments` hold each sample's length.

Drift: each answer, re-rendered through the template as the program would send it
back, is tokenised and compared with the tokens that were sampled (`drift`). It is
recorded, never trained on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stages.endpoint.messages import Message, Refused, Request
from stages.endpoint.rendering import Template, read_calls
from stages.engines import Completion


def drift(rendered: list[int], sampled: list[int]) -> int:
    """Tokens from the first position where `rendered` and `sampled` differ to the end
    of the longer (0: the re-rendered answer is the sampled one)."""
    same = 0
    for a, b in zip(rendered, sampled):
        if a != b:
            break
        same += 1
    return max(len(rendered), len(sampled)) - same


@dataclass
class Answer:
    """What one call returned: the content, the tool calls, whether every ``<tool_call>``
    block parsed, the finish reason, and its drift in tokens."""

    content: str | None
    calls: list[Message]
    parsed: bool
    finish: str
    drift: int
    text: str
    tokens: int
    prompt: int  # the prompt's tokens
    asked: str  # the content of the call's last message (what the program last said)


@dataclass
class Transcript:
    """An episode's samples (`ids`, `mask`, `logprobs`, `starts`) built call by call:
    `prompt` for a request, then `take` for its completion."""

    template: Template
    max_context: int
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    extended: int = 0  # calls that extended the previous one
    # the previous call: its chat with the answer, its prompt's text, the sampled ids, its tools, and
    # that chat rendered as history (what `take` rendered: the next call's `_extension` needs it too)
    _last: tuple[tuple[Message, ...], str, list[int], tuple[Message, ...], str] | None = None
    _asked: tuple[Request, str] | None = None

    @property
    def segments(self) -> list[int]:
        ends = [*self.starts[1:], len(self.ids)]
        return [e - s for s, e in zip(self.starts, ends)]

    def encode(self, text: str) -> list[int]:
        return list(self.template.tokenizer.encode(text, add_special_tokens=False))

    def prompt(self, request: Request, max_new_tokens: int) -> list[int]:
        """The token ids the policy continues for `request` (recorded with mask 0);
        `Refused` (code ``context_length_exceeded``) when they and `max_new_tokens` do not
        fit ``agent.max_context``, recording nothing."""
        text = self.template.render(request.messages, request.tools, True)
        more = self._extension(request, text)
        if more is not None:
            new, sample = more, self.ids[self.starts[-1] :] + more
        else:
            new = sample = self.encode(text)
        if len(sample) + max_new_tokens > self.max_context:
            raise Refused(
                f"messages: the prompt is {len(sample)} tokens; with max_tokens {max_new_tokens} it exceeds the "
                f"context of {self.max_context} (agent.max_context)",
                "messages",
                code="context_length_exceeded",
            )
        if more is None:
            self.starts.append(len(self.ids))
        else:
            self.extended += 1
        self.ids += new
        self.mask += [0] * len(new)
        self.logprobs += [0.0] * len(new)
        self._asked = (request, text)
        return sample

    def _extension(self, request: Request, text: str) -> list[int] | None:
        """The tokens that extend the previous sample to `request`'s prompt, or None
        when `request` does not extend the previous call."""
        if self._last is None:
            return None
        then, then_text, sampled, tools, whole = self._last
        n = len(then)
        if request.tools != tools or len(request.messages) <= n or request.messages[:n] != then:
            return None
        if not whole.startswith(then_text) or not text.startswith(whole) or not whole.endswith(self.template.close):
            return None
        after = self.template.close
        eos = self.template.tokenizer.eos_token_id
        if sampled[-1:] == [eos] and after.startswith(self.template.eos_text):
            after = after[len(self.template.eos_text) :]  # the end-of-turn token was sampled
        return self.encode(after + text[len(whole) :])

    def take(self, completion: Completion) -> Answer:
        """Record the sampled response to the last `prompt` (mask 1, its log-probs) and
        say what the call returns."""
        assert self._asked is not None, "take() before prompt()"
        request, text = self._asked
        sampled = list(completion.token_ids)
        self.ids += sampled
        self.mask += [1] * len(sampled)
        self.logprobs += list(completion.logprobs)
        tok = self.template.tokenizer
        said = tok.decode(sampled, skip_special_tokens=True)
        content, calls, parsed = read_calls(said) if request.tools else (said, [], True)
        reply: Message = {"role": "assistant", "content": content or ""}
        if calls:
            reply["tool_calls"] = calls
        chat = (*request.messages, reply)
        whole = self.template.render(chat, request.tools, False)
        self._last, self._asked = (chat, text, sampled, request.tools, whole), None
        again = whole[len(text) :] if whole.startswith(text) else whole
        if again.endswith(self.template.close):
            again = again[: -len(self.template.close)]
        bare = sampled[:-1] if sampled[-1:] == [tok.eos_token_id] else sampled
        finish = "tool_calls" if calls else ("stop" if completion.finished else "length")
        prompt = len(self.ids) - len(sampled) - self.starts[-1]
        asked = request.messages[-1]["content"]
        return Answer(
            content, calls, parsed, finish, drift(self.encode(again), bare), said, len(sampled), prompt, asked
        )

    def row(self) -> dict[str, Any]:
        """The trajectory columns the transcript holds."""
        return {
            "token_ids": self.ids,
            "loss_mask": self.mask,
            "logprobs": self.logprobs,
            "segments": self.segments,
            "response_tokens": sum(self.mask),
        }
