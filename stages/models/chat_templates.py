"""Chat templates supplied for a model whose files carry none (a base checkpoint).

The agent loop speaks to a model through its chat template (`stages.agent.chat`) and
stops a response at the template's end-of-turn token (`stages.models.turns`). A base
model's GGUF (Gemma 3 270M's, `stages.models.packaged`) has no template, though its
vocabulary holds the turn tokens its instruct sibling uses; ``model.chat_template``
names one of `TEMPLATES` or gives a Jinja template's text, and `policy.init` writes it
into version 0's tokenizer, so every later stage reads it from the checkpoint. A
warm start then teaches the format (a base model has not seen it).

Message contents are written as they are (no trimming): the tokens a policy is
trained on are the ones it sampled, and a template that changed the text would make
the rendered history differ from them.
"""

from __future__ import annotations

from typing import Any

#: ChatML (``<|im_start|>role ... <|im_end|>``): Qwen2.5's and SmolLM2's format
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

#: Gemma's turn format: ``<start_of_turn>user|model ... <end_of_turn>``, the system
#: message folded into the first user turn (Gemma has no system role), ``<bos>`` first
GEMMA = (
    "{{ bos_token }}"
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{% set prefix = messages[0]['content'] + '\\n\\n' %}{% set turns = messages[1:] %}"
    "{% else %}{% set prefix = '' %}{% set turns = messages %}{% endif %}"
    "{% for message in turns %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\\n' + (prefix if loop.first else '') + message['content'] + '<end_of_turn>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)

TEMPLATES: dict[str, str] = {"chatml": CHATML, "gemma": GEMMA}


def template_text(name_or_text: str) -> str:
    """The Jinja text `name_or_text` stands for: a built-in's by its name, else itself
    (a text with ``{{`` or ``{%``). ValueError for anything else (a misspelt name)."""
    if name_or_text in TEMPLATES:
        return TEMPLATES[name_or_text]
    if "{{" in name_or_text or "{%" in name_or_text:
        return name_or_text
    raise ValueError(
        f"{name_or_text!r} is neither a built-in template ({', '.join(TEMPLATES)}) nor a Jinja template's text"
    )


def set_template(tokenizer: Any, name_or_text: str | None) -> str | None:
    """Give `tokenizer` the template (None: leave its own). Returns a line for the
    run's log when it changed, else None."""
    if name_or_text is None:
        return None
    text = template_text(name_or_text)
    if getattr(tokenizer, "chat_template", None) == text:
        return None
    had = "replaced its own" if getattr(tokenizer, "chat_template", None) else "it had none"
    tokenizer.chat_template = text
    label = name_or_text if name_or_text in TEMPLATES else "the spec's"
    return f"chat template set to {label} ({had})"
