"""The text the embedded tokenizer is trained on: the agent's prompts and the
environments' states, in the shape the agent sees them (deterministic).

    tokenizer = embedded_tokenizer(1024)      # what policy.init saves with the model
    model, tokenizer = embedded_model(EmbeddedModel(), seed=0)
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import envs
from stages.agent import prompts
from stages.models.policy import EmbeddedModel, build_embedded

#: the environments whose text trains the tokenizer: our own, a fixed list, so that
#: registering another environment (a plugin, `gym:<id>`) never changes the embedded model
CORPUS_ENVS = (
    "bandit",
    "bandit_heldout",
    "bandit_reversed",
    "countdown",
    "frozenlake",
    "sokoban",
    "sokoban_larger",
    "sokoban_new_vocab",
)


def corpus(seeds: int = 40) -> Iterator[str]:
    """Environment text in the shape the agent sees it (deterministic)."""
    rng = random.Random("tokenizer-corpus")
    for _ in range(2):
        yield prompts.SYSTEM
        yield "\n".join(["system", "user", "assistant"])
    for name in CORPUS_ENVS:
        env = envs.make(name)
        words = list(env.action_words) or ["(1 + 2) * 3", "4 - 5 / 6", "7 * 8 + 9"]
        for seed in range(seeds):
            state = env.reset(seed)
            yield prompts.first_message(env, rng.randint(1, 5))
            for think in (True, False):
                yield prompts.turn_message(rng.randint(1, 5), state, rng.randint(0, 10), think, 64)
            yield prompts.reward_message(rng.choice([-1.1, -0.1, 0.0, 0.1, 0.9, 1.0, 10.0]))
            actions = [rng.choice(words) for _ in range(rng.randint(1, 3))]
            yield prompts.render_response(actions, True, f"I will go {', '.join(actions)}.")


def embedded_tokenizer(vocab_size: int = 1024) -> Any:
    """The embedded model's tokenizer: the BPE trained on `corpus`, with the answer
    markup (``<think>``, ``<answer>``, ...) as single tokens."""
    from stages.models.tokenizer import build_tokenizer  # imports transformers: only when one is built

    return build_tokenizer(corpus(), vocab_size, prompts.MARKUP)


def embedded_model(cfg: EmbeddedModel, seed: int) -> tuple[Any, Any]:
    """A freshly initialised embedded model and its tokenizer (`embedded_tokenizer`)."""
    return build_embedded(cfg, seed, embedded_tokenizer(cfg.vocab_size))
