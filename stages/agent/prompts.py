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


def format_line(think: bool, max_new_tokens: int) -> str:
    """The required output format, repeated every turn."""
    shape = (
        f"{THINK_OPEN} [your thoughts] {THINK_CLOSE} {ANSWER_OPEN} [your answer] {ANSWER_CLOSE}"
        if think
        else f"{ANSWER_OPEN} [your answer] {ANSWER_CLOSE}"
    )
    return f"Always output: {shape} with no extra text. Max response length: {max_new_tokens} tokens."


def first_message(env: TextEnv, max_actions_per_turn: int) -> str:
    """The opening of the first user message: task, legend, action words, budget."""
    return (
        f"{env.instructions}\nYou can make up to {max_actions_per_turn} actions per turn, "
        f'separated by the action separator "{SEPARATOR.strip()}".\n'
    )


def turn_message(turn: int, state: str, actions_left: int, think: bool, max_new_tokens: int) -> str:
    """One turn's block: `Turn i:`, the state, the actions left and the format."""
    return f"Turn {turn}:\nState:\n{state}\nYou have {actions_left} actions left. {format_line(think, max_new_tokens)}"


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
