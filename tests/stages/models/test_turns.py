import pytest

from stages.models.turns import TemplateProblem, check_tokenizer, end_of_turn, fix_tokenizer
from tests.fixtures.real_models import qwen25_tokenizer


def test_the_end_of_turn_token_is_read_from_the_template(tokenizer):
    assert end_of_turn(qwen25_tokenizer()) == "<|im_end|>"
    assert end_of_turn(tokenizer) == "<|im_end|>"  # the embedded one


def test_an_eos_that_is_not_the_end_of_turn_token_is_fixed_and_said():
    """Qwen2.5 base names <|endoftext|> as EOS while its template ends turns with <|im_end|>:
    a policy that stops at the EOS would write past every turn."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = _copy(qwen25_tokenizer())
    tok.eos_token = "<|endoftext|>"
    tok.pad_token = None
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=1,
            num_key_value_heads=1,
            eos_token_id=tok.eos_token_id,
        )
    )
    notes = fix_tokenizer(tok, model)
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 151645 and tok.pad_token == "<|im_end|>"
    assert model.config.eos_token_id == 151645 and model.generation_config.eos_token_id == 151645
    assert any("EOS was '<|endoftext|>'" in n for n in notes) and any("no pad token" in n for n in notes)
    assert fix_tokenizer(tok, model) == []  # fixed once, nothing to say the second time


def _copy(tok):
    import copy

    return copy.deepcopy(tok)


def test_a_tokenizer_without_a_template_is_refused():
    tok = _copy(qwen25_tokenizer())
    tok.chat_template = None
    with pytest.raises(TemplateProblem, match="no chat template"):
        check_tokenizer(tok)


def test_a_template_that_ends_turns_with_plain_text_is_refused():
    tok = _copy(qwen25_tokenizer())
    tok.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n\n{% endfor %}"
    with pytest.raises(TemplateProblem, match="not with a special token"):
        check_tokenizer(tok)
