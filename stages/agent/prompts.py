"""The agent's side of the conversation (docs/method.md#the-agent-loop): what the environment's turns say,
and how a response is read back into actions.

The whole multi-turn chat is one token sequence built in token space by
`stages.agent.loop`; this module only writes the texts and parses responses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from envs.base import TextEnv

SYSTEM = "You're a helpful assistant. You think step by step, then answer."
SEPARATOR = " || "
THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE = "<think>", "</think>", "<answer>", "</answer>"
#: markup words the embedded tokenizer keeps whole
MARKUP = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)

_PATTERN = re.compile(r"<think>(.*?)</think>\s*<answer>(.*?)</answer>", re.DOTALL)
_ANSWER_ONLY = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


#: the thought of the format's example (`format_line`): a sentence, not a placeholder
EXAMPLE_THOUGHT = "I read the state and choose my next action."


def format_line(think: bool, max_new_tokens: int, example: str = "") -> str:
    """The required output format, repeated every turn; with `example` (an action),
    followed by one response written out in that format (a small instruct model copies
    the placeholders ``[your answer]`` otherwise, as RAGEN's prompts found)."""
    shape = (
        f"{THINK_OPEN} [your thoughts] {THINK_CLOSE} {ANSWER_OPEN} [your answer] {ANSWER_CLOSE}"
        if think
        else f"{ANSWER_OPEN} [your answer] {ANSWER_CLOSE}"
    )
    shown = ""
    if example:
        shown = f", e.g. {_written(think, example)}"
    return f"Always output: {shape} with no extra text{shown}. Max response length: {max_new_tokens} tokens."


def first_message(env: TextEnv, max_actions_per_turn: int) -> str:
    """The opening of the first user message: task, legend, action words, budget."""
    return (
        f"{env.instructions}\nYou can make up to {max_actions_per_turn} actions per turn, "
        f'separated by the action separator "{SEPARATOR.strip()}".\n'
    )


def turn_message(turn: int, state: str, actions_left: int, think: bool, max_new_tokens: int, example: str = "") -> str:
    """One turn's block: `Turn i:`, the state, the actions left and the format (with
    `example`, an answer written out: `format_line`)."""
    line = format_line(think, max_new_tokens, example)
    return f"Turn {turn}:\nState:\n{state}\nYou have {actions_left} actions left. {line}"


def example_exchange(
    env: TextEnv, max_actions_per_turn: int, actions_left: int, think: bool, max_new_tokens: int
) -> tuple[str, str]:
    """A worked first exchange (`agent.example`): a user message as the first turn's,
    with its state left out, and a response to it written out in the format."""
    example = env.example_action
    user = first_message(env, max_actions_per_turn) + turn_message(
        1, "...", actions_left, think, max_new_tokens, example
    )
    return user, _written(think, example)


def _written(think: bool, action: str) -> str:
    """A whole response in the format, with the example's thought."""
    thought = f"{THINK_OPEN}{EXAMPLE_THOUGHT}{THINK_CLOSE} " if think else ""
    return f"{thought}{ANSWER_OPEN}{action}{ANSWER_CLOSE}"


def reward_message(reward: float) -> str:
    """How the next user message starts: the previous turn's reward."""
    return f"Reward:\n{reward:g}\n\n"


def generation_prefix(think: bool) -> str:
    """What the template writes after the assistant header (reference: the prompt ends
    with the opening tag); the response continues from it."""
    return THINK_OPEN if think else ANSWER_OPEN


@dataclass(frozen=True)
class Parsed:
    """A response read back: `ok` is False when there is no parseable answer."""

    ok: bool
    think: str
    answer: str
    actions: tuple[str, ...]


def parse_response(text: str, think: bool, max_actions_per_turn: int) -> Parsed:
    """Parse ``prefix + response`` (docs/method.md#the-agent-loop): the first ``<think>..</think> <answer>..
    </answer>`` match (only ``<answer>`` when thinking is off); the answer split on
    ``||``, stripped, empty pieces dropped, cut to `max_actions_per_turn`."""
    full = generation_prefix(think) + text
    if think:
        m = _PATTERN.search(full)
        if m is None:
            return Parsed(False, "", "", ())
        thought, answer = m.group(1).strip(), m.group(2).strip()
    else:
        m = _ANSWER_ONLY.search(full)
        if m is None:
            return Parsed(False, "", "", ())
        thought, answer = "", m.group(1).strip()
    pieces = tuple(p.strip() for p in answer.split("||") if p.strip())
    return Parsed(True, thought, answer, pieces[:max_actions_per_turn])


def render_response(actions: list[str], think: bool, thought: str = "") -> str:
    """The response text for a list of actions, as a demonstration writes it (the
    part after the generation prefix)."""
    answer = f"{ANSWER_OPEN}{SEPARATOR.join(actions)}{ANSWER_CLOSE}"
    if not think:
        return answer[len(ANSWER_OPEN) :]
    return f"{thought}{THINK_CLOSE} {answer}"
