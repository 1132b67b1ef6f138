"""The pretrain once-stage: probe answers before the warm start, cached like every stage."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_spec
from tests.stages.conftest import TINY_MODEL_YAML

PRETRAIN = (
    """
run: {seed: 0}
pipeline:
  model: {stage: policy.init, once: true}
  pretrain: {stage: pretrain, once: true}
  warmstart: {stage: warmstart, once: true, inputs: {base: pretrained}}
pretrain:
  envs: [frozenlake, sokoban]
  env_options: {frozenlake: {slippery: false, render: grid}}
  states: 12
  held_out: 6
  steps: 30
  batch_size: 4
  balance: true
  lr: 3.0e-3
"""
    + TINY_MODEL_YAML
)


def test_pretrain_reports_held_out_accuracy_and_feeds_the_warm_start(spec_file, catalog):
    path = spec_file(PRETRAIN)
    summary, _ = run_spec(path, catalog)
    assert summary.ran == 3
    key = next(k for k in catalog.result_keys() if k.startswith("pretrain-"))
    m = catalog.manifest(key)["metrics"]
    for env, tasks in {"frozenlake": ("neighbour", "position", "goal_offset"), "sokoban": ("box_offset",)}.items():
        for task in tasks:
            assert 0.0 <= m[f"pretrain/{env}/{task}"] <= 1.0 and f"pretrain/{env}/{task}_before" in m
    assert m["pretrain/loss"] > 0
    out = catalog.ref(key, "pretrained").local_path()
    assert json.loads((out / "policy.json").read_text())["pretrained"] is True
    warm = next(k for k in catalog.result_keys() if k.startswith("warmstart-"))
    assert catalog.manifest(warm)["inputs"]["base"] == f"{key}/pretrained"
    again, _ = run_spec(path, catalog)
    assert again.ran == 0  # cached: only the first run pays for it


def test_the_linear_schedule_warms_up_then_decays_to_a_tenth():
    import torch

    from stages.training.sft import linear_decay

    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = linear_decay(opt, 100)
    seen = []
    for _ in range(100):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen[0] == 0.2 and seen[4] == 1.0  # 5 warm-up steps
    assert seen == sorted(seen[:5]) + sorted(seen[5:], reverse=True)
    assert abs(seen[-1] - (1.0 - 0.9 * 94 / 95)) < 1e-9 and seen[-1] > 0.1


def test_probes_asked_several_to_a_chat_keep_every_answer_in_the_loss(tokenizer):
    from stages.agent.loop import AgentConfig
    from stages.training.pretrain import probe_samples

    agent = AgentConfig(think=False, history=0)
    seeds, options = [5, 6, 7], {"slippery": False, "render": "grid"}
    single = probe_samples("frozenlake", options, seeds, tokenizer, agent)
    packed = probe_samples("frozenlake", options, seeds, tokenizer, agent, per_chat=4)
    assert all("+" not in task for task, _ in single) and len(single) == 6 * len(seeds)  # six probes a lake state
    assert [len(t.split("+")) for t, _ in packed] == [4, 2] * len(seeds)

    def answers(sample) -> list[str]:  # each labelled run of tokens, decoded
        runs, cur = [], []
        for label in [*sample.labels, -100]:
            if label != -100:
                cur.append(label)
            elif cur:
                runs.append(tokenizer.decode(cur))
                cur = []
        return runs

    for state in range(len(seeds)):
        alone = sorted(a for _, s in single[6 * state : 6 * state + 6] for a in answers(s))
        together = sorted(a for _, s in packed[2 * state : 2 * state + 2] for a in answers(s))
        assert together == alone  # the same answers, each once, every token in the loss
        tasks = sorted(t for task, _ in packed[2 * state : 2 * state + 2] for t in task.split("+"))
        assert tasks == sorted(t for t, _ in single[6 * state : 6 * state + 6])
    first = single[0][1]
    answer_at = next(i for i, label in enumerate(first.labels) if label != -100)
    state_part = tokenizer.decode(first.ids[:answer_at]).split("Question:")[0]
    assert tokenizer.decode(packed[0][1].ids).startswith(state_part)  # the same prompt, then the questions
    assert sum(len(s.ids) for _, s in packed) < 0.5 * sum(len(s.ids) for _, s in single)


def test_balance_draws_each_neighbour_answer_as_often_and_keeps_the_tasks_shares(tokenizer):
    from collections import Counter

    import torch

    from stages.agent.loop import AgentConfig
    from stages.training.pretrain import answer_balance, draw, probe_samples

    agent = AgentConfig(think=False, history=0)
    pairs = probe_samples("frozenlake", {"slippery": False, "render": "grid"}, list(range(300)), tokenizer, agent)
    weights = answer_balance(pairs)
    assert weights is not None

    def answer(sample) -> str:
        return tokenizer.decode([t for t in sample.labels if t != -100]).split("<")[0]

    by_answer: Counter[str] = Counter()
    for (task, sample), w in zip(pairs, weights):
        if task == "neighbour":
            by_answer[answer(sample)] += w
        else:
            assert w == 1.0
    assert set(by_answer) == {"ice", "edge", "hole", "goal"}
    assert max(by_answer.values()) - min(by_answer.values()) < 1e-6  # each answer as often
    asked = sum(task == "neighbour" for task, _ in pairs)
    assert abs(sum(by_answer.values()) - asked) < 1e-6  # the task as often as without balance
    plain = Counter(answer(s) for t, s in pairs if t == "neighbour")
    assert plain["ice"] > 4 * plain["hole"]  # what balance is for

    drawn = Counter(draw(len(pairs), 20000, torch.Generator().manual_seed(0), torch.tensor(weights)))
    got = Counter()
    for j, n in drawn.items():
        if pairs[j][0] == "neighbour":
            got[answer(pairs[j][1])] += n
    assert max(got.values()) < 1.25 * min(got.values())  # the draw follows the weights
    assert draw(3, 50, torch.Generator().manual_seed(0), torch.tensor([0.0, 0.0, 1.0])) == [2] * 50


def test_balance_several_to_a_chat_weighs_each_neighbour_answer_as_often(tokenizer):
    from collections import Counter

    from stages.agent.loop import AgentConfig
    from stages.training.pretrain import answer_balance, probe_samples

    agent = AgentConfig(think=False, history=0)
    options = {"slippery": False, "render": "grid"}
    packed = probe_samples("frozenlake", options, list(range(300)), tokenizer, agent, per_chat=6, balance=True)
    by_answer: Counter[str] = Counter()
    for tasks, sample in packed:
        labelled = [(t, w) for t, w in zip([x for x in sample.labels if x != -100], sample.weights, strict=True)]
        runs, cur, at = [], [], 0  # each answer's tokens, in the order asked
        for label in [*sample.labels, -100]:
            if label != -100:
                cur.append(labelled[at])
                at += 1
            elif cur:
                runs.append(cur)
                cur = []
        for task, run in zip(tasks.split("+"), runs, strict=True):
            weights = {w for _, w in run}
            assert len(weights) == 1  # one weight over an answer's tokens
            if task == "neighbour":
                by_answer[tokenizer.decode([t for t, _ in run]).split("<")[0]] += weights.pop()
            else:
                assert weights == {1.0}
    assert set(by_answer) == {"ice", "edge", "hole", "goal"}
    assert max(by_answer.values()) - min(by_answer.values()) < 1e-6  # each answer weighs as much
    asked = sum(t == "neighbour" for tasks, _ in packed for t in tasks.split("+"))
    assert abs(sum(by_answer.values()) - asked) < 1e-6  # the task as much as unbalanced
    plain = probe_samples("frozenlake", options, list(range(30)), tokenizer, agent, per_chat=6)
    alone = probe_samples("frozenlake", options, list(range(30)), tokenizer, agent, balance=True)
    assert all(s.weights == () for _, s in plain + alone)  # unbalanced, or one to a chat (drawn instead)
    assert answer_balance(packed) is None  # weighed in the loss: drawn uniformly, not weighed twice


def test_token_weights_make_the_loss_their_weighted_mean(tiny_policy):
    import pytest
    import torch
    import torch.nn.functional as F

    from stages.models.policy import load_policy
    from stages.training.sft import Sample, sft_loss

    model, tokenizer = load_policy(tiny_policy, device="cpu", dtype="float32")
    pad = tokenizer.pad_token_id
    ids = [[5, 6, 7, 8, 9, 10], [11, 12, 13, 14]]
    labels = [[-100, -100, 7, 8, -100, 10], [-100, 12, 13, -100]]
    plain = [Sample(i, lab) for i, lab in zip(ids, labels)]
    ones = [Sample(i, lab, weights=(1.0,) * sum(x != -100 for x in lab)) for i, lab in zip(ids, labels)]
    weighted = [Sample(ids[0], labels[0], weights=(3.0, 1.0, 0.5)), Sample(ids[1], labels[1])]
    with torch.no_grad():
        assert torch.allclose(sft_loss(model, plain, pad), sft_loss(model, ones, pad))
        each = []
        for i, lab in zip(ids, labels):
            logits = model(input_ids=torch.tensor([i])).logits[0, :-1]
            target = torch.tensor(lab[1:])
            keep = target != -100
            each += F.cross_entropy(logits[keep], target[keep], reduction="none").tolist()
        w = torch.tensor([3.0, 1.0, 0.5, 1.0, 1.0])
        expected = (torch.tensor(each) * w).sum() / w.sum()
        assert torch.allclose(sft_loss(model, weighted, pad), expected, atol=1e-5)
        assert not torch.allclose(sft_loss(model, weighted, pad), sft_loss(model, plain, pad))
    with pytest.raises(ValueError, match="2 token weights for 3"):
        sft_loss(model, [Sample(ids[0], labels[0], weights=(1.0, 2.0))], pad)


def test_read_to_goes_on_in_blocks_until_it_reads_or_reaches_read_max(spec_file, tmp_path):
    """A bar the 30-step model does not reach (1.0): blocks of 7 up to 44 steps in all, the
    last one cut to fit. A bar it reaches at once (0.0): exactly `steps`, no block, as without
    `read_to`; and a bar above 1 is refused before anything runs."""
    import pytest

    from catalog.store import Catalog

    path = spec_file(PRETRAIN)
    for target, steps in (("1.0", 44.0), ("0.0", 30.0)):
        catalog = Catalog(str(tmp_path / f"c{target}"))
        run_spec(path, catalog, (f"pretrain.read_to={target}", "pretrain.read_block=7", "pretrain.read_max=44"))
        key = next(k for k in catalog.result_keys() if k.startswith("pretrain-"))
        assert catalog.manifest(key)["metrics"]["pretrain/steps"] == steps, target
    with pytest.raises(Exception, match="read_to"):
        run_spec(path, Catalog(str(tmp_path / "c")), ("pretrain.read_to=1.01",))


def test_read_max_below_steps_is_refused_before_anything_runs():
    from common.config import ConfigProblem
    from stages.pretrain import PretrainConfig

    with pytest.raises(ConfigProblem, match="at least `steps` \\(100\\)"):
        PretrainConfig(envs=["frozenlake"], steps=100, read_to=0.5, read_max=50)
    PretrainConfig(envs=["frozenlake"], steps=100, read_max=50)  # read_max unused without read_to
