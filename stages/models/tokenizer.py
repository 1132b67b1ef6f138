"""The embedded tokenizer: a byte-level BPE trained in code on the environments'
own text, with a ChatML chat template. No download; the same inputs give the same
vocabulary (a test checks it), and it is saved with every checkpoint, so a policy
never depends on rebuilding it.

Pre-tokenisation keeps what the agent must read one symbol at a time: grid cells
and digits are single tokens (``#__PO#`` is six tokens), words are merged by BPE,
and the markup tags ``<think>``/``<answer>`` are single added tokens.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

import envs
from stages.agent import prompts

BOS, EOS, PAD = "<|im_start|>", "<|im_end|>", "<|endoftext|>"

#: ChatML, as Qwen2 models use it
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# words (an optional leading space, an optional capital, lower-case letters), then
# single digits, single capitals, single other symbols, runs of spaces / newlines
_SPLIT = Regex(r" ?[A-Z]?[a-z]+| ?\d| ?[A-Z]| ?[^\sA-Za-z\d]|\s+")


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


def _corpus(seeds: int = 40) -> Iterator[str]:
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


def build_tokenizer(vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """Train the embedded BPE and wrap it as a transformers tokenizer."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(_SPLIT, behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[PAD, BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, pad_token=PAD, bos_token=None, unk_token=None, padding_side="left"
    )
    fast.add_tokens(list(prompts.MARKUP))
    fast.chat_template = CHAT_TEMPLATE
    return fast
