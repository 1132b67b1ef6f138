"""The embedded tokenizer: a byte-level BPE trained in code on the environments'
own text (`stages.agent.corpus`), with a ChatML chat template. No download; the same inputs give the same
vocabulary (a test checks it), and it is saved with every checkpoint, so a policy
never depends on rebuilding it.

Pre-tokenisation keeps what the agent must read one symbol at a time: grid cells
and digits are single tokens (``#__PO#`` is six tokens), words are merged by BPE,
and the markup tags ``<think>``/``<answer>`` are single added tokens.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

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


def build_tokenizer(
    corpus: Iterable[str], vocab_size: int = 1024, added: Sequence[str] = ()
) -> PreTrainedTokenizerFast:
    """Train the BPE on `corpus` and wrap it as a transformers tokenizer, with `added`
    as single tokens (the embedded one: `stages.agent.corpus.embedded_tokenizer`)."""
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
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, pad_token=PAD, bos_token=None, unk_token=None, padding_side="left"
    )
    fast.add_tokens(list(added))
    fast.chat_template = CHAT_TEMPLATE
    return fast
