"""`policy.init` on a real tokenizer: the template's end-of-turn token becomes the EOS of
the saved policy, said in the run's log; a tokenizer without a template stops the spec."""

import json

import pytest

from catalog.store import Catalog
from common.errors import SpecError
from pipelines.graph.load import load_spec
from tests.conftest import run_spec
from tests.fixtures.real_models import qwen25_tokenizer, tiny_model
from tests.stages.conftest import artifact

SPEC = """
run: {iterations: 1}
pipeline:
  model: {stage: policy.init, once: true}
model:
  path: PATH
"""


@pytest.fixture(scope="module")
def base_like(tmp_path_factory):
    """A Qwen2.5 whose tokenizer names <|endoftext|> as EOS and has no pad, as a base
    checkpoint's does, while its template ends turns with <|im_end|>."""
    import copy

    tok = copy.deepcopy(qwen25_tokenizer())
    tok.eos_token, tok.pad_token = "<|endoftext|>", None
    return tiny_model("qwen2", tok, tmp_path_factory.mktemp("base") / "model")


def test_the_saved_policy_stops_at_the_end_of_turn_token(spec_file, tmp_path, base_like):
    catalog = Catalog(str(tmp_path / "catalog"))
    _, display = run_spec(spec_file(SPEC.replace("PATH", str(base_like))), catalog)
    saved = artifact(catalog, "policy_init", None, "base")
    assert json.loads((saved / "tokenizer_config.json").read_text())["eos_token"] == "<|im_end|>"
    assert json.loads((saved / "config.json").read_text())["eos_token_id"] == 151645
    assert json.loads((saved / "generation_config.json").read_text())["eos_token_id"] == 151645
    assert any(
        "EOS was '<|endoftext|>'; set to the template's end-of-turn token '<|im_end|>'" in m for m in display.messages
    )


def test_a_tokenizer_without_a_template_stops_the_run_before_any_step(spec_file, base_like, tmp_path):
    """`validate` reads no model file; the run checks the tokenizer before it computes anything."""

    from pipelines.run.runner import Runner

    broken = _without_template(base_like, tmp_path / "no-template")
    spec = load_spec(spec_file(SPEC.replace("PATH", str(broken))), [])
    catalog = Catalog(str(tmp_path / "catalog"))
    with pytest.raises(SpecError, match=r"model\.path: .* the tokenizer has no chat template"):
        Runner(spec, catalog)
    assert not catalog.result_keys()


def _without_template(model, where):
    import shutil

    shutil.copytree(model, where)
    (where / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((where / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (where / "tokenizer_config.json").write_text(json.dumps(config))
    return where


def test_a_base_model_runs_with_the_template_the_spec_supplies(spec_file, base_like, tmp_path):
    """model.chat_template (a base checkpoint such as gemma3-270m, whose files have none):
    checked before the run, written into version 0, said in the log."""
    from stages.models.chat_templates import CHATML
    from stages.models.policy import load_tokenizer

    bare = _without_template(base_like, tmp_path / "bare")
    spec = SPEC.replace("PATH", str(bare)) + "  chat_template: chatml\n"
    catalog = Catalog(str(tmp_path / "catalog"))
    _, display = run_spec(spec_file(spec), catalog)
    saved = load_tokenizer(artifact(catalog, "policy_init", None, "base"))
    assert saved.chat_template == CHATML and saved.eos_token == "<|im_end|>"
    assert any("chat template set to chatml (it had none)" in m for m in display.messages)
