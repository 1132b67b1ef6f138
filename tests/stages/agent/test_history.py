"""History windows (`agent.history`): one sample per turn, laid end to end in a
trajectory, trained and valued one sample at a time."""

import pyarrow as pa
import pytest
import torch

from catalog.query import query
from stages.agent.loop import run_episodes
from stages.models.batching import per_sample
from stages.models.policy import load_policy
from tests.conftest import run_spec, spec_in
from tests.stages.agent.test_loop import episode, scripted
from tests.stages.conftest import TINY_GRPO, TINY_STARPO

ANSWERS = [" a </think> <answer>Up</answer>", " b </think> <answer>Down || Left</answer>", " junk", " c"]


def samples_of(ep):
    out, start = [], 0
    for n in ep.segments:
        out.append((ep.ids[start : start + n], ep.mask[start : start + n]))
        start += n
    return out


def test_window_zero_gives_one_sample_per_turn_holding_only_the_current_state(tokenizer):
    ep = run_episodes([episode(tokenizer, max_turns=4, history=0)], scripted(tokenizer, ANSWERS))[0]
    parts = samples_of(ep)
    assert len(parts) == len(ep.turns) == 4 and sum(ep.segments) == len(ep.ids)
    for i, ((ids, mask), turn) in enumerate(zip(parts, ep.turns), start=1):
        prompt = tokenizer.decode([t for t, m in zip(ids, mask) if not m])
        assert prompt.startswith("<|im_start|>system\n") and prompt.count("Turn ") == 1 and f"Turn {i}:" in prompt
        assert turn["state"] in prompt and "Sokoban" in prompt  # instructions every turn
        assert "Reward:" not in prompt  # only the current state: no earlier turn, not even its reward
        response = [t for t, m in zip(ids, mask) if m]
        assert mask == [0] * (len(mask) - len(response)) + [1] * len(response)  # the response ends the sample
        assert tokenizer.decode(response, skip_special_tokens=True) == turn["response"]


def test_window_one_keeps_the_previous_turn_as_unmasked_context(tokenizer):
    ep = run_episodes([episode(tokenizer, max_turns=3, history=1)], scripted(tokenizer, ANSWERS))[0]
    full = run_episodes([episode(tokenizer, max_turns=3)], scripted(tokenizer, ANSWERS))[0]
    parts = samples_of(ep)
    assert len(parts) == 3
    # with one turn of history, the second sample is the whole chat's first two turns
    two_turns = full.ids[: len(parts[1][0])]
    assert parts[1][0] == two_turns and sum(parts[1][1]) == full.turns[1]["tokens"]
    text = tokenizer.decode(parts[2][0])
    assert "Turn 1:" not in text and "Turn 2:" in text and "Turn 3:" in text
    assert text.count("Reward:") == 1  # the reward of turn 2, before turn 3's block


def test_whole_chat_is_one_sample_and_unchanged(tokenizer):
    ep = run_episodes([episode(tokenizer, max_turns=4)], scripted(tokenizer, ANSWERS))[0]
    assert ep.segments == [len(ep.ids)] and ep.prompt == ep.ids


def test_the_context_no_longer_grows_with_the_turns(tokenizer):
    long = run_episodes(
        [episode(tokenizer, max_turns=5, max_actions_per_traj=50)],
        scripted(tokenizer, [" x </think> <answer>Up</answer>"] * 5),
    )[0]
    window = run_episodes(
        [episode(tokenizer, max_turns=5, max_actions_per_traj=50, history=0)],
        scripted(tokenizer, [" x </think> <answer>Up</answer>"] * 5),
    )[0]
    assert len(long.ids) > 2.5 * max(window.segments)  # the chat grew by a turn block per turn
    assert max(window.segments) - min(window.segments) <= 2  # "Turn 1" vs "Turn 5", actions left


def test_per_sample_recuts_token_columns_and_repeats_the_rest():
    table = pa.table(
        {
            "token_ids": pa.array([[1, 2, 3, 4, 5], [6, 7]], pa.list_(pa.int32())),
            "advantages": pa.array([[0, 0.1, 0.2, 0.3, 0.4], [0.5, 0.6]], pa.list_(pa.float32())),
            "values": pa.nulls(2, pa.list_(pa.float32())),
            "temperature": [1.0, 0.5],
            "segments": pa.array([[2, 3], None], pa.list_(pa.int32())),
        }
    )
    out = per_sample(table)
    assert out["token_ids"].to_pylist() == [[1, 2], [3, 4, 5], [6, 7]]
    assert [[round(x, 1) for x in r] for r in out["advantages"].to_pylist()] == [[0, 0.1], [0.2, 0.3, 0.4], [0.5, 0.6]]
    assert out["temperature"].to_pylist() == [1.0, 1.0, 0.5] and out["values"].null_count == 3
    whole = table.set_column(4, "segments", pa.array([[5], [2]], pa.list_(pa.int32())))
    assert per_sample(whole) is whole


WINDOW_STARPO = TINY_STARPO.replace("agent: &agent {max_turns: 2,", "agent: &agent {history: 0, max_turns: 2,").replace(
    "agent: {max_turns: 2,", "agent: {history: 0, max_turns: 2,"
)


@pytest.fixture(scope="module")
def window_run(tmp_path_factory):
    """The tiny StarPO pipeline (GAE with a critic) with one sample per turn."""
    assert WINDOW_STARPO.count("history: 0") == 2
    path, catalog = spec_in(tmp_path_factory.mktemp("window"), WINDOW_STARPO)
    run_spec(path, catalog)
    return catalog


def test_window_rollouts_store_turn_samples_whose_logprobs_a_forward_pass_reproduces(window_run):
    rows = query(window_run, "select * from trajectories where num_turns = 2 order by iteration").to_pylist()
    assert rows, "no two-turn trajectory"
    row = rows[0]
    assert len(row["segments"]) == 2 and sum(row["segments"]) == len(row["token_ids"])
    model, _ = load_policy(window_run.ref(row["policy_key"], "policy").local_path())
    start = 0
    for n in row["segments"]:
        ids = torch.tensor([row["token_ids"][start : start + n]])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0].float() / row["temperature"], -1)
        fresh = logp[:-1].gather(-1, ids[0, 1:, None])[:, 0]
        mask = torch.tensor(row["loss_mask"][start + 1 : start + n], dtype=torch.bool)
        stored = torch.tensor(row["logprobs"][start + 1 : start + n])
        assert mask.sum() > 0 and torch.allclose(fresh[mask], stored[mask], atol=1e-4)
        start += n


def test_window_values_come_from_each_samples_own_forward_pass(window_run):
    from stages.models.critic import load_critic
    from stages.models.forward import values

    key = next(
        k for k in window_run.result_keys() if k.startswith("advantage-") and window_run.manifest(k)["iteration"] == 0
    )  # valued by critic v0
    batch = window_run.ref(key, "batch").read().to_pylist()
    row = next(r for r in batch if len(r["segments"]) == 2)
    critic_key = next(k for k in window_run.result_keys() if k.startswith("critic_init-"))
    critic = load_critic(window_run.ref(critic_key, "critic").local_path()).eval()
    start = 0
    for n in row["segments"]:
        ids = torch.tensor([row["token_ids"][start : start + n]])
        with torch.no_grad():
            v = values(critic, ids, torch.ones_like(ids))[0]
        mask = torch.tensor(row["loss_mask"][start : start + n], dtype=torch.bool)
        assert torch.allclose(v[mask], torch.tensor(row["values"][start : start + n])[mask], atol=1e-5)
        start += n
    assert sum(row["loss_mask"]) > 0 and any(a != 0 for a in row["advantages"])


def test_window_updates_train_on_every_turn_sample(window_run):
    def first(prefix):
        return next(
            k for k in window_run.result_keys() if k.startswith(prefix) and window_run.manifest(k)["iteration"] == 0
        )

    m = window_run.manifest(first("update-"))["metrics"]
    key = first("advantage-")
    sampled = sum(sum(r) for r in window_run.ref(key, "batch").read()["loss_mask"].to_pylist())
    assert m["actor/tokens"] == sampled


ONLINE_WINDOW = TINY_GRPO.replace("run: {iterations: 2", "run: {name: win, iterations: 2").replace(
    "rollout: {env: bandit, n_groups: 2, group_size: 2, actors: 0, agent: {max_new_tokens: 8}}",
    """rollout: {env: sokoban, n_groups: 2, group_size: 2, actors: 0, online_k: 2,
          agent: {history: 0, max_turns: 2, max_new_tokens: 8}}""",
)

REPLAY_WINDOW = (
    ONLINE_WINDOW.replace("name: win", "name: rep")
    .replace("rollout: {stage: rollout}", "rollout: {stage: replay}")
    .replace(
        """rollout: {env: sokoban, n_groups: 2, group_size: 2, actors: 0, online_k: 2,
          agent: {history: 0, max_turns: 2, max_new_tokens: 8}}""",
        "rollout: {run: win, n_groups: 2}",
    )
)


def test_online_k_and_replay_work_on_window_trajectories(spec_file, catalog):
    assert "online_k: 2" in ONLINE_WINDOW and "rollout: {run: win, n_groups: 2}" in REPLAY_WINDOW
    _, display = run_spec(spec_file(ONLINE_WINDOW), catalog)
    assert [e.status for e in display.events if e.node == "rollout"] == ["ran", "reused"]
    assert [e.status for e in display.events if e.node == "update"] == ["ran", "ran"]
    stored = query(catalog, "select segments, num_turns, token_ids from trajectories").to_pylist()
    assert all(len(r["segments"]) == r["num_turns"] and sum(r["segments"]) == len(r["token_ids"]) for r in stored)
    assert any(r["num_turns"] == 2 for r in stored)
    _, display = run_spec(spec_file(REPLAY_WINDOW, "replay.yaml"), catalog)
    assert [e.status for e in display.events if e.node == "update"] == ["ran", "ran"]
    replayed = [k for k in catalog.result_keys() if k.startswith("replay-")]
    table = catalog.ref(replayed[0], "trajectories").read()
    assert table.num_rows == 4 and all(
        len(s) == n for s, n in zip(table["segments"].to_pylist(), table["num_turns"].to_pylist())
    )
