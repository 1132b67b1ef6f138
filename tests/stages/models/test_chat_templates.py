"""Chat templates supplied for a base model (`stages.models.chat_templates`) and the spec key
that names one (``model.chat_template``)."""

import copy

import pytest

from common.config import ConfigProblem
from stages.agent.chat import Chat
from stages.models.chat_templates import GEMMA, set_template, template_text
from stages.models.policy import ModelConfig
from stages.models.turns import TemplateProblem, check_tokenizer, fix_tokenizer
from tests.fixtures.real_models import qwen25_tokenizer


def _gemma_like():
    """A real vocabulary with Gemma's turn tokens and <bos> added as special tokens, and no
    template (as Gemma 3 270M base's GGUF)."""
    tok = copy.deepcopy(qwen25_tokenizer())
    tok.add_special_tokens({"bos_token": "<bos>", "additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"]})
    tok.chat_template = None
    return tok


def test_a_base_model_without_a_template_is_refused_until_one_is_given():
    tok = _gemma_like()
    with pytest.raises(TemplateProblem, match="no chat template"):
        check_tokenizer(tok)
    assert set_template(tok, "gemma") == "chat template set to gemma (it had none)"
    assert set_template(tok, "gemma") is None  # nothing changed the second time
    assert check_tokenizer(tok) == "<end_of_turn>"
    assert any("'<end_of_turn>'" in note for note in fix_tokenizer(tok))
    assert tok.eos_token == "<end_of_turn>"


def test_gemmas_format_folds_the_system_message_into_the_first_user_turn_and_keeps_text_as_sampled():
    tok = _gemma_like()
    set_template(tok, "gemma")
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": " two spaces  "},  # not trimmed: the sampled tokens stay as they were
        {"role": "user", "content": "Again"},
    ]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\n two spaces  <end_of_turn>\n"
        "<start_of_turn>user\nAgain<end_of_turn>\n<start_of_turn>model\n"
    )
    fix_tokenizer(tok)
    chat = Chat(tok, think=True)
    first = tok.decode(chat.first("State"))
    assert first.startswith("<bos><start_of_turn>user\n") and first.endswith("<start_of_turn>model\n<think>")
    after = tok.decode(chat.next("Next", [5, tok.eos_token_id]))  # the end-of-turn token was sampled
    assert after == "\n<start_of_turn>user\nNext<end_of_turn>\n<start_of_turn>model\n<think>"


def test_a_template_is_a_built_in_name_or_jinja_text():
    assert template_text("gemma") == GEMMA
    assert template_text("{{ messages }}") == "{{ messages }}"
    with pytest.raises(ValueError, match="neither a built-in template"):
        template_text("gemma3")


def test_the_spec_key_is_checked_and_a_packaged_base_model_brings_its_own():
    assert ModelConfig(path="gemma3-270m").template() == "gemma"  # its GGUF has none
    assert ModelConfig(path="smollm2-135m-instruct").template() is None  # its own
    assert ModelConfig(path="gemma3-270m", chat_template="chatml").template() == "chatml"
    with pytest.raises(ConfigProblem, match="neither a built-in template"):
        ModelConfig(path="gemma3-270m", chat_template="gema")
    with pytest.raises(ConfigProblem, match="the embedded model has its own template"):
        ModelConfig(chat_template="chatml")
