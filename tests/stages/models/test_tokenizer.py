import envs
from stages.models.tokenizer import build_tokenizer


def test_same_inputs_same_vocabulary():
    assert build_tokenizer(600).get_vocab() == build_tokenizer(600).get_vocab()


def test_grid_cells_digits_and_markup_are_single_tokens():
    tok = build_tokenizer()
    pieces = tok.convert_ids_to_tokens(tok.encode("#__PO#\n10", add_special_tokens=False))
    assert pieces == ["#", "_", "_", "P", "O", "#", "Ċ", "1", "0"]
    for tag in ("<think>", "</think>", "<answer>", "</answer>", "<|im_end|>"):
        assert len(tok.encode(tag, add_special_tokens=False)) == 1


def test_decode_inverts_encode_on_environment_text():
    tok = build_tokenizer()
    for name in ("sokoban_new_vocab", "frozenlake", "countdown", "bandit_reversed"):
        env = envs.make(name)
        text = env.instructions + "\n" + env.reset(3) + " √ ünïcode"
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_chatml_template():
    tok = build_tokenizer()
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id != tok.eos_token_id


def test_registering_another_environment_leaves_the_embedded_tokenizer_unchanged(monkeypatch):
    from envs import registry
    from envs.bandit import Bandit, BanditOptions

    before = build_tokenizer(600).get_vocab()
    monkeypatch.setitem(
        registry._REGISTRY, "zz_plugin", (Bandit, {"low_arm": "Xylophone", "high_arm": "Quokka"}, BanditOptions)
    )
    assert "zz_plugin" in envs.names()
    assert build_tokenizer(600).get_vocab() == before
