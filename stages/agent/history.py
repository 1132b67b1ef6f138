"""History windows (`AgentConfig.history`, docs/method.md#the-agent-loop): each turn
as a block the next samples can replay, and a sample's opening tokens from the last
k blocks."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from stages.agent.chat import Chat


@dataclass
class Block:
    """One turn as a history window replays it: the previous turn's reward text ('' on
    turn 1), the turn's own text, and the response sampled for it."""

    reward: str
    text: str
    response: list[int] = field(default_factory=list)


def window(blocks: list[Block], k: int) -> list[Block]:
    """The current turn's block and the k before it."""
    return blocks[-k - 1 :]


def replay(chat: Chat, intro: str, blocks: list[Block], shot: tuple[str, str] | None = None) -> list[int]:
    """Blocks as a sample's opening tokens: the first opens the chat (with the
    instructions `intro`, after the worked exchange `shot` where there is one), the
    others continue it, each followed by its response."""
    ids = chat.first(intro + blocks[0].text, shot) + blocks[0].response
    for prev, b in itertools.pairwise(blocks):
        ids += chat.next(b.reward + b.text, prev.response) + b.response
    return ids
