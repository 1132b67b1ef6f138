import json

import torch
from transformers import AutoModelForCausalLM

from catalog.query import query
from tests.conftest import run_spec
from tests.stages.conftest import TINY_MODEL_YAML

WARMSTART = (
    """
run: {seed: 0}
pipeline:
  model: {stage: policy.init, once: true}
  warmstart: {stage: warmstart, once: true}
"""
    + TINY_MODEL_YAML
    + """
  envs: [sokoban, bandit]
  demonstrator: random_valid
  episodes: 6
  epochs: 3
  batch_size: 4
  check_episodes: 2
  agent: {max_turns: 2}
"""
)


def test_warm_start_trains_on_demonstrations_in_the_rollout_format(spec_file, catalog):
    run_spec(spec_file(WARMSTART.replace("demonstrator: none\n  episodes: 2\n  check_episodes: 0\n", "")), catalog)
    demos = query(catalog, "select * from demonstrations").to_pylist()
    assert len(demos) == 12 and {d["env"] for d in demos} == {"sokoban", "bandit"}
    assert all(d["format_valid_rate"] == 1.0 for d in demos)  # demonstrations always follow the format
    key = next(k for k in catalog.result_keys() if k.startswith("warmstart-"))
    m = catalog.manifest(key)["metrics"]
    assert m["actor/sft_loss"] < m["actor/sft_loss_first"]
    assert 0 <= m["eval/format_valid_rate"] <= 1 and "eval/success_rate" in m
    path = catalog.ref(key, "policy").local_path()
    assert json.loads((path / "policy.json").read_text())["version"] == 0
    model = AutoModelForCausalLM.from_pretrained(str(path))  # plain transformers, no project code
    assert model.config.model_type == "qwen2" and model.config.hidden_size == 64


def test_transcript_loss_covers_every_token_and_options_reach_the_demos(tokenizer):
    from stages.training.sft import samples, sft_batch
    from stages.warmstart import WarmstartConfig, demonstrations

    cfg = WarmstartConfig(envs=("frozenlake",), env_options={"frozenlake": {"slippery": False}}, episodes=3)
    demos = demonstrations(cfg, tokenizer, seed=0)
    assert all(not d.env.opts.slippery for d in demos)
    _ids, attn, responses = sft_batch([samples(d, tokenizer)[0] for d in demos], tokenizer.pad_token_id)
    _, _, transcript = sft_batch([samples(d, tokenizer, all_tokens=True)[0] for d in demos], tokenizer.pad_token_id)
    assert ((responses != -100).sum(1) == torch.tensor([sum(d.mask) for d in demos])).all()
    assert ((transcript != -100) == attn.bool()).all()


def test_action_tokens_are_found_in_the_answer_only(tokenizer):
    from stages.agent.loop import AgentConfig
    from stages.training.sft import samples
    from stages.warmstart import WarmstartConfig, demonstrations

    for think in (False, True):
        agent = AgentConfig(think=think, history=0, max_turns=3, max_actions_per_turn=2)
        cfg = WarmstartConfig(
            envs=("frozenlake",),
            env_options={"frozenlake": {"slippery": False}},
            demonstrator="expert",
            episodes=4,
            agent=agent,
        )
        for demo in demonstrations(cfg, tokenizer, seed=0):
            parts = samples(demo, tokenizer, actions=True)
            assert len(parts) == len(demo.turns)  # one sample per turn with a window
            for part, turn in zip(parts, demo.turns):
                words = [demo.env.action_words[target] for _, _, target in part.actions]
                assert words == turn["actions"]  # the thought's "My moves: ..." is not counted
                for p, firsts, target in part.actions:
                    assert part.ids[p] == firsts[target] and part.labels[p] == part.ids[p]


def test_action_loss_adds_a_decision_term(tokenizer, tiny_policy):
    from transformers import AutoModelForCausalLM

    from stages.agent.loop import AgentConfig
    from stages.training.sft import samples, sft_loss
    from stages.warmstart import WarmstartConfig, demonstrations

    agent = AgentConfig(think=False, history=0, max_turns=3, max_actions_per_turn=1)
    cfg = WarmstartConfig(envs=("frozenlake",), demonstrator="expert", episodes=3, agent=agent)
    batch = [s for d in demonstrations(cfg, tokenizer, seed=0) for s in samples(d, tokenizer, actions=True)]
    model = AutoModelForCausalLM.from_pretrained(str(tiny_policy))
    with torch.no_grad():
        plain = sft_loss(model, batch, tokenizer.pad_token_id)
        both = sft_loss(model, batch, tokenizer.pad_token_id, action_weight=2.0)
        terms = []
        for sample in batch:
            logits = model(input_ids=torch.tensor([sample.ids])).logits[0]
            terms += [
                -torch.log_softmax(logits[p - 1, list(firsts)], -1)[target] for p, firsts, target in sample.actions
            ]
    assert len(terms) == sum(len(d.turns) for d in demonstrations(cfg, tokenizer, seed=0))
    assert torch.isclose(both - plain, 2.0 * torch.stack(terms).mean(), atol=1e-4)


def test_random_share_replaces_demonstrated_actions(tokenizer):
    from stages.agent.loop import AgentConfig
    from stages.warmstart import WarmstartConfig, demonstrations

    agent = AgentConfig(think=False, history=0, max_turns=5, max_actions_per_turn=1)
    base = dict(
        envs=("frozenlake",),
        env_options={"frozenlake": {"slippery": False}},
        demonstrator="expert",
        episodes=64,
        agent=agent,
    )
    expert = demonstrations(WarmstartConfig(**base), tokenizer, seed=0)
    noisy = demonstrations(WarmstartConfig(**base, random_share=1.0), tokenizer, seed=0)

    def rate(demos):
        return sum(d.env.success for d in demos) / len(demos)

    assert rate(expert) > 0.9 and rate(noisy) < 0.5


def test_transcripts_with_nothing_to_learn_fail_in_one_line_instead_of_training_on_nothing(
    spec_file, catalog, tmp_path, monkeypatch
):
    """Issue 93: where the template never extends token-wise, every assistant turn was
    skipped in silence, the loss was NaN and the stage committed. Now the turns left out
    are counted and no learnt token at all fails the stage, naming the file."""
    import pytest

    from common.errors import PipelineError
    from stages.endpoint import chats

    transcripts = tmp_path / "t.jsonl"
    line = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<answer>Up</answer>"}]}
    transcripts.write_text(json.dumps(line) + "\n")
    real = chats.chat_sample
    monkeypatch.setattr(chats, "chat_sample", lambda m, t, p="": (real(m, t, p)[0], [0] * 3, 1))  # nothing extends
    spec = WARMSTART.replace("demonstrator: none\n  episodes: 2\n  check_episodes: 0\n", "").replace(
        "demonstrator: random_valid", f"demonstrator: none\n  demonstrations: {transcripts}"
    )
    with pytest.raises(PipelineError, match="no token to learn") as failed:
        run_spec(spec_file(spec), catalog)
    assert "t.jsonl" in str(failed.value) and "1 skipped" in str(failed.value)
    assert not any(k.startswith("warmstart-") for k in catalog.result_keys())


def test_transcripts_edited_after_the_plan_are_not_trained_on_under_the_plans_key(spec_file, catalog, tmp_path):
    """Issue 93: the key held the file's hash from a cache keyed on size and time, and
    the stage read the file again: an edit in between trained on other content under
    the key. Now the stage trains on the planned content or fails in one line."""
    import pytest

    from common.errors import PipelineError
    from pipelines.graph.load import load_spec
    from pipelines.run.progress import Quiet
    from pipelines.run.runner import Runner

    transcripts = tmp_path / "t.jsonl"
    line = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<answer>Up</answer>"}]}
    transcripts.write_text(json.dumps(line) + "\n")
    spec = spec_file(
        WARMSTART.replace("demonstrator: none\n  episodes: 2\n  check_episodes: 0\n", "").replace(
            "demonstrator: random_valid", f"demonstrator: none\n  demonstrations: {transcripts}"
        )
    )
    runner = Runner(load_spec(spec), catalog, Quiet())  # planned: keys made
    line["messages"][1]["content"] = "<answer>Down</answer>"
    transcripts.write_text(json.dumps(line) + "\n")  # edited before the stage runs
    with pytest.raises(PipelineError, match=r"t.jsonl': changed since the run was planned"):
        runner.run()
    assert not any(k.startswith("warmstart-") for k in catalog.result_keys())
    run_spec(spec, catalog)  # planned again: trains on the new content
    assert any(k.startswith("warmstart-") for k in catalog.result_keys())
