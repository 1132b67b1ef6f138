"""What a real tokenizer must say for the agent loop to work: a chat template, and an
end-of-turn token that is its EOS.

The agent loop ends a response at ``tokenizer.eos_token`` and lets the template
close the turn after a response cut short (`stages.agent.chat.Chat.next`). Many
checkpoints name another token as EOS than the one their template ends an
assistant turn with (``<|endoftext|>`` where the template writes ``<|im_end|>``;
SmolLM2's GGUF names ``<|im_start|>`` in some transformers versions). A policy
trained with the wrong one writes past its turn. So `check_tokenizer` refuses a
tokenizer without a template (the spec check, `stages.policy`), and `fix_tokenizer`
makes the template's end-of-turn token the EOS (and the pad, where there is none),
saying what it changed (a line in the run's log).
"""

from __future__ import annotations

from typing import Any

from stages.models.chat_templates import set_template

_MARK = "\x00RESPONSE\x00"


class TemplateProblem(ValueError):
    """A tokenizer the agent loop cannot use (no template, no end-of-turn token)."""


def end_of_turn(tokenizer: Any) -> str:
    """The special token the chat template writes right after an assistant message."""
    if not getattr(tokenizer, "chat_template", None):
        raise TemplateProblem("the tokenizer has no chat template (an instruct / chat checkpoint has one)")
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": _MARK},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    if _MARK not in text:
        raise TemplateProblem("the chat template does not write the assistant's message")
    after = text.split(_MARK, 1)[1]
    special = sorted({*tokenizer.all_special_tokens, *map(str, tokenizer.added_tokens_decoder.values())}, key=len)
    found = [s for s in reversed(special) if s and after.startswith(s)]
    if not found:
        raise TemplateProblem(
            f"the chat template ends an assistant turn with {after[:20]!r}, not with a special token to stop at"
        )
    return found[0]


def check_tokenizer(tokenizer: Any) -> str:
    """The end-of-turn token, or TemplateProblem saying why the tokenizer cannot be used."""
    eot = end_of_turn(tokenizer)
    if len(tokenizer.encode(eot, add_special_tokens=False)) != 1:
        raise TemplateProblem(f"the end-of-turn token {eot!r} is not one token of the vocabulary")
    return eot


def fix_tokenizer(tokenizer: Any, model: Any | None = None, template: str | None = None) -> list[str]:
    """Give the tokenizer `template` first where one is named (``model.chat_template``,
    `stages.models.chat_templates.set_template`), then make the template's end-of-turn
    token the tokenizer's EOS (and the model's ``eos_token_id`` in its config and
    generation config), and the pad token where there is none. Returns one line per change."""
    changed = set_template(tokenizer, template)
    notes = [changed] if changed else []
    eot = check_tokenizer(tokenizer)
    eot_id = tokenizer.convert_tokens_to_ids(eot)
    if tokenizer.eos_token != eot:
        notes.append(f"EOS was {tokenizer.eos_token!r}; set to the template's end-of-turn token {eot!r} (id {eot_id})")
        tokenizer.eos_token = eot
    if tokenizer.pad_token is None:
        notes.append(f"no pad token; set to {eot!r}")
        tokenizer.pad_token = eot
    if model is not None:
        for config in (model.config, getattr(model, "generation_config", None)):
            if config is not None and getattr(config, "eos_token_id", None) != eot_id:
                notes.append(f"{type(config).__name__}.eos_token_id was {config.eos_token_id}; set to {eot_id}")
                config.eos_token_id = eot_id
        for config in (model.config, getattr(model, "generation_config", None)):
            if config is not None and getattr(config, "pad_token_id", None) is None:
                config.pad_token_id = tokenizer.pad_token_id
    return notes
