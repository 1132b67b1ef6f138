import envs
from stages.agent.corpus import embedded_tokenizer as build_tokenizer


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


def test_the_tokenizer_that_runs_is_the_one_built(tmp_path):
    """Saved, loaded (as every stage loads a policy) and saved again: the same bytes,
    the same ids as the tokenizer built in code."""
    from stages.agent.corpus import embedded_model
    from stages.models.policy import EmbeddedModel, load_policy, save_policy

    model, built = embedded_model(
        EmbeddedModel(hidden_size=64, layers=1, heads=2, kv_heads=1, intermediate_size=64, vocab_size=600), seed=0
    )
    save_policy(model, built, tmp_path / "a", version=0)
    model, loaded = load_policy(tmp_path / "a")
    save_policy(model, loaded, tmp_path / "b", version=1)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    text = "<|im_start|>user\nGoal: rows +2, columns -1.\nLeft: hole. Down: ice. Café ﬁ 12<|im_end|>\n"
    assert loaded(text)["input_ids"] == built(text)["input_ids"]
    assert (loaded.eos_token, loaded.pad_token, loaded.padding_side) == (built.eos_token, built.pad_token, "left")


def test_text_is_split_at_run_time_as_qwen2_splits_it():
    """The split the default was measured with (see the module docstring): a space
    before a digit is its own piece, a word keeps its leading space."""
    tok = build_tokenizer(600)
    pieces = [p for p, _ in tok.backend_tokenizer.pre_tokenizer.pre_tokenize_str("Goal: 2 Left.")]
    assert pieces == ["Goal", ":", "Ġ", "2", "ĠLeft", "."]
    assert tok.backend_tokenizer.normalizer is not None  # NFC
