"""The StarPO stages end to end on the tiny policy, and the update's invariants."""

import fnmatch
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from catalog.query import query
from catalog.store import Catalog
from common.errors import SpecError
from pipelines.graph.load import load_spec
from stages.registry import STAGES
from tests.conftest import run_spec
from tests.stages.conftest import TINY_STARPO, artifact


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "model.safetensors"))


@pytest.fixture(scope="module")
def starpo_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("starpo")
    (folder / "spec.yaml").write_text(TINY_STARPO)
    catalog = Catalog(str(folder / "catalog"))
    summary, _display = run_spec(str(folder / "spec.yaml"), catalog)
    return catalog, summary


def test_tiny_starpo_trains_and_reports_every_metric(starpo_run):
    catalog, summary = starpo_run
    assert summary.ran == 4 + 2 * 6
    base = _weights(artifact(catalog, "warmstart-", None, "policy"))
    after = _weights(artifact(catalog, "update-", 1, "policy"))
    assert any(not torch.equal(base[k], after[k]) for k in base), "the update left the policy unchanged"
    critic0 = _weights(artifact(catalog, "critic_init-", None, "critic"))
    critic2 = _weights(artifact(catalog, "critic_update-", 1, "critic"))
    assert any(not torch.equal(critic0[k], critic2[k]) for k in critic0)
    metrics = {r["name"]: r["value"] for r in query(catalog, "select name, value from metrics").to_pylist()}
    assert all(math.isfinite(v) for v in metrics.values())
    for stage in ("rollout", "filter", "advantage", "update", "critic.update", "eval"):
        # actor/is_weight: with update.correction (test_staleness); agent mode's: tests/stages/endpoint
        agent_mode = {"rollout/agent_faults", "rollout/drift_tokens", "eval/agent_faults", "eval/drift_tokens"}
        for pattern in set(STAGES[stage].metrics) - {"actor/is_weight"} - agent_mode:
            assert any(fnmatch.fnmatchcase(m, pattern) for m in metrics), f"{stage}: no {pattern}"


def test_versions_and_evals_view(starpo_run):
    catalog, _ = starpo_run
    evals = query(
        catalog,
        "select policy_version, env, temperature, count(*) as n from evals group by all order by all",
    ).to_pylist()
    # once on the warm start (v0), then after the updates of iterations 0 and 1 (v1, v2);
    # 2 seeds x 2 samples at T = 0.5, and each seed once greedily
    assert [(r["policy_version"], r["env"], r["temperature"], r["n"]) for r in evals] == [
        (v, env, t, n) for v in (0, 1, 2) for env in ("sokoban", "sokoban_new_vocab") for t, n in ((0.0, 2), (0.5, 4))
    ]
    versions = query(catalog, "select distinct iteration, policy_version from trajectories order by 1").to_pylist()
    assert versions == [{"iteration": 0, "policy_version": 0}, {"iteration": 1, "policy_version": 1}]
    batch = catalog.ref(next(k for k in catalog.result_keys() if k.startswith("advantage-")), "batch").read()
    for ids, mask, adv in zip(
        batch["token_ids"].to_pylist(), batch["loss_mask"].to_pylist(), batch["advantages"].to_pylist()
    ):
        assert len(ids) == len(adv) and all(a == 0 for a, m in zip(adv, mask) if not m)


def test_rerun_is_cached_and_lr_change_reruns_from_the_update(starpo_run, tmp_path):
    catalog, _ = starpo_run
    spec = tmp_path / "spec.yaml"
    spec.write_text(TINY_STARPO)
    summary, _ = run_spec(str(spec), catalog)
    assert summary.ran == 0
    summary, _ = run_spec(str(spec), catalog, ("critic.optim.lr=2e-3",))
    # iteration 0: critic; iteration 1: advantage (reads the new critic), update, critic, eval, and the
    # rollout is unchanged (the policy did not change)
    ran = {
        s
        for s in query(catalog, "select node, iteration from steps where status = 'ran' and run = 'spec'").to_pylist()
        for s in [(s["node"], s["iteration"])]
    }
    assert ("rollout", 1) not in ran and ("update", 0) not in ran and ("critic", 0) in ran


def test_the_learning_rate_decays_linearly_then_stays():
    from stages.update import UpdateConfig, scheduled

    cfg = UpdateConfig(lr_decay_to=0.1, lr_decay_over=90)
    lr = cfg.optim.lr
    got = [scheduled(cfg, i).optim.lr for i in (None, 0, 45, 90, 200)]
    assert got == pytest.approx([lr, lr, 0.55 * lr, 0.1 * lr, 0.1 * lr])
    assert scheduled(cfg, 45).optim.mini_batch_size == cfg.optim.mini_batch_size  # only the rate moves
    constant = UpdateConfig()
    assert scheduled(constant, 50) is constant


def test_a_decaying_rate_reaches_the_update_and_its_metric(starpo_run, tmp_path):
    catalog, _ = starpo_run
    spec = tmp_path / "spec.yaml"
    spec.write_text(TINY_STARPO)
    run_spec(str(spec), catalog, ("update.lr_decay_to=0.5", "update.lr_decay_over=1", "run.name=decay"))

    def lrs(run: str) -> list[float]:
        sql = f"select value from metrics where run = '{run}' and name = 'actor/lr' order by iteration"
        return [r["value"] for r in query(catalog, sql).to_pylist()]

    lr = lrs("spec")[0]
    assert lrs("spec") == pytest.approx([lr, lr]) and lrs("decay") == pytest.approx([lr, 0.5 * lr])
    keys = {
        r["run"]: r["key"]
        for r in query(catalog, "select run, key from steps where node = 'update' and iteration = 1").to_pylist()
    }
    first, second = (_weights(catalog.ref(keys[r], "policy").local_path()) for r in ("spec", "decay"))
    assert any(not torch.equal(first[k], second[k]) for k in first)  # the second update took the decayed rate


STARPO_ERRORS = [
    (
        "filter on groups of one",
        ("rollout.group_size=1",),
        r"filter\.strategy: 'top_k' ranks groups by the std of their scores, but rollout\.group_size is 1",
    ),
    (
        "grpo on groups of one",
        (
            "rollout.group_size=1",
            "filter.strategy=none",
            "advantage.estimator=grpo",
            "pipeline.critic=null",
            "pipeline.critic_init=null",
        ),
        r"advantage\.estimator: 'grpo' compares the trajectories of a group, but rollout\.group_size is 1",
    ),
    (
        "gae without a critic",
        ("pipeline.critic=null", "pipeline.critic_init=null"),
        r"advantage\.estimator: 'gae' needs a critic: add the nodes",
    ),
    (
        "critic on a critic-free batch",
        ("advantage.estimator=rloo",),
        r"critic: the batch comes from advantage\.estimator 'rloo', which uses no critic",
    ),
    (
        "eval agent differs",
        ("eval.agent.think=false",),
        r"-o eval\.agent\.think=false: eval\.agent: differs from rollout\.agent \(think False vs True\)",
    ),
    ("unknown estimator", ("advantage.estimator=ppo",), r"advantage\.estimator: unknown estimator 'ppo'"),
    ("unknown filter", ("filter.strategy=topk",), r"filter\.strategy: unknown strategy 'topk'"),
    (
        "eval options for an env not evaluated",
        ("eval.env_options={frozenlake: {}}",),
        r"eval\.env_options: options for 'frozenlake', which is not in eval\.envs",
    ),
    ("clip ratio c", ("update.clip_ratio_c=0.5",), r"update\.clip_ratio_c: expected a number > 1"),
    (
        "lr decay without its length",
        ("update.lr_decay_to=0.5",),
        r"update\.lr_decay_over: a decaying learning rate needs the updates it takes",
    ),
]


@pytest.mark.parametrize("overrides,pattern", [c[1:] for c in STARPO_ERRORS], ids=[c[0] for c in STARPO_ERRORS])
def test_starpo_spec_errors(spec_file, overrides, pattern):
    with pytest.raises(SpecError, match=pattern) as info:
        load_spec(spec_file(TINY_STARPO), overrides)
    assert "\n" not in str(info.value)


def _fit_actor(catalog: Catalog, tmp: Path, loop=None, seen: dict | None = None, **optim) -> dict[str, torch.Tensor]:
    from stages.training.fit import LocalContext, OptimConfig, fit
    from stages.training.loops import ActorJob, actor_loop
    from stages.update import UpdateConfig

    batch_key = next(k for k in catalog.result_keys() if k.startswith("advantage-"))
    table = catalog.ref(batch_key, "batch").read(
        columns=["token_ids", "loss_mask", "logprobs", "advantages", "temperature"]
    )
    policy_key = next(k for k in catalog.result_keys() if k.startswith("warmstart-"))
    policy = catalog.ref(policy_key, "policy")
    cfg = UpdateConfig(optim=OptimConfig(lr=1e-2, mini_batch_size=4, **optim), kl_coef=0.01)
    out = tmp / "out"
    metrics = fit(
        LocalContext("update-test", num_cpus=2),
        loop or actor_loop,
        ActorJob(key="k", seed=1, cfg=cfg, policy=policy, reference=policy),
        table,
        cfg.optim,
        out,
    )
    assert metrics["actor/grad_norm"] > 0
    if seen is not None:
        seen.update(metrics)
    return _weights(out)


def test_micro_batches_accumulate_to_the_same_update(starpo_run, tmp_path):
    catalog, _ = starpo_run
    one = _fit_actor(catalog, tmp_path / "a", micro_batch_size=1)
    four = _fit_actor(catalog, tmp_path / "b", micro_batch_size=4)
    # float32 sums in another order (and another thread count) differ by ~1e-5; an lr of 1e-2 moves weights ~1e-2.
    # Where a weight's gradient is about Adam's eps its step is nearly sign-like, so that noise can move a few
    # such weights by ~1e-4 (3 of 100k on one 2-core machine); a wrong accumulation moves thousands by ~1e-2
    diffs = torch.cat([(one[k] - four[k]).abs().flatten() for k in one])
    assert int((diffs > 5e-5).sum()) <= 1e-4 * diffs.numel(), int((diffs > 5e-5).sum())
    assert float(diffs.max()) < 1e-3


def test_local_mode_and_one_ray_train_worker_give_the_same_update(starpo_run, tmp_path):
    import ray

    catalog, _ = starpo_run
    try:
        local = _fit_actor(catalog, tmp_path / "local", workers=0)
        worker = _fit_actor(catalog, tmp_path / "worker", workers=1)
    finally:
        ray.shutdown()
    assert all(torch.allclose(local[k], worker[k], atol=5e-5) for k in local)  # as above: summation order
    base = _weights(
        catalog.ref(next(k for k in catalog.result_keys() if k.startswith("warmstart-")), "policy").local_path()
    )
    assert any(not torch.allclose(base[k], local[k]) for k in base)


def test_optimizer_state_travels_with_the_policy(starpo_run):
    from stages.training.fit import OPTIMIZER_FILE

    catalog, _ = starpo_run
    state = torch.load(artifact(catalog, "update-", 1, "policy") / OPTIMIZER_FILE)
    first = torch.load(artifact(catalog, "update-", 0, "policy") / OPTIMIZER_FILE)
    # the second update resumes the first one's AdamW: its step count doubles
    steps = next(int(s["step"]) for s in state["state"].values())
    assert steps == 2 * next(int(s["step"]) for s in first["state"].values())
    assert not (artifact(catalog, "warmstart-", None, "policy") / OPTIMIZER_FILE).exists()


def test_the_ready_queries_run_from_pipeline_query_and_plain_duckdb(starpo_run):
    import re
    import shlex

    import duckdb
    from typer.testing import CliRunner

    from pipelines.cli.main import app

    catalog, _ = starpo_run
    page = (Path(__file__).resolve().parents[2] / "docs" / "catalog.md").read_text()
    block = re.search(r"<!-- ready-queries -->(.*?)<!-- /ready-queries -->", page, re.S).group(1)
    queries = [shlex.split(line)[2] for line in block.splitlines() if line.startswith("pipeline query ")]
    assert len(queries) >= 5
    con = duckdb.connect()
    con.execute((Path(catalog.root.base) / "views.sql").read_text())
    for sql in queries:
        plain = con.sql(sql).to_arrow_table()
        ours = query(catalog, sql)
        assert ours.to_pylist() == plain.to_pylist(), sql
        result = CliRunner().invoke(app, ["query", sql, "--catalog", catalog.root.uri, "--format", "json"])
        assert result.exit_code == 0, result.output
        assert len(json.loads(result.output)) == plain.num_rows
    assert query(catalog, queries[0]).num_rows > 0 and query(catalog, queries[1]).num_rows > 0


def test_gigpo_stage_reads_each_turns_state_and_reward(starpo_run):
    from stages.advantage import AdvantageConfig, compute
    from stages.rl.estimators import turn_spans

    catalog, _ = starpo_run
    table = query(catalog, "select * from trajectories where iteration = 0 and split = 'train'")
    grpo_batch, _ = compute(table, AdvantageConfig(estimator="grpo"), None)
    flat, _ = compute(table, AdvantageConfig(estimator="gigpo", step_weight=0.0), None)
    assert flat["advantages"].to_pylist() == grpo_batch["advantages"].to_pylist()
    batch, _ = compute(table, AdvantageConfig(estimator="gigpo", turn_gamma=0.5), None)
    # every trajectory of a group starts from the group's state: the first turn's step
    # advantage normalises, over the group's turns played from that state (first turns,
    # and later ones that came back to it), the discounted returns from those turns
    turns = [t.as_py() for t in table["turns"]]
    groups = table["group"].to_pylist()
    for g in set(groups):
        rows = [i for i, x in enumerate(groups) if x == g]
        start = turns[rows[0]][0]["state"]
        members = [(i, k) for i in rows for k, t in enumerate(turns[i]) if t["state"] == start]
        returns = torch.tensor([sum(t["reward"] * 0.5**j for j, t in enumerate(turns[i][k:])) for i, k in members])
        std = returns.std(unbiased=False)
        step = torch.zeros_like(returns) if std < 1e-6 else (returns - returns.mean()) / (std + 1e-6)
        for (i, k), a in zip(members, step.tolist()):
            if k == 0:
                first = turn_spans(torch.tensor(table["loss_mask"][i].as_py()))[0][0]
                got = batch["advantages"][i].as_py()[first] - grpo_batch["advantages"][i].as_py()[first]
                assert got == pytest.approx(a, abs=1e-4)
        assert len(members) >= len(rows)


def test_an_empty_batch_keeps_the_policy_under_the_next_version(spec_file, catalog):
    """A fresh tiny policy never answers in the format: every bandit trajectory scores the
    format penalty, every group has zero std, and the filter drops them all."""
    from tests.stages.conftest import TINY_GRPO

    spec = (
        TINY_GRPO.replace(
            "advantage: {stage: advantage, inputs: {trajectories: trajectories}}",
            "filter: {stage: filter}\n  advantage: {stage: advantage}",
        )
        + "filter: {strategy: none, drop_zero_std: true}\n"
    )
    run_spec(spec_file(spec), catalog)
    updates = sorted((catalog.manifest(k)["iteration"], k) for k in catalog.result_keys() if k.startswith("update-"))
    assert [catalog.manifest(k)["metrics"]["actor/tokens"] for _, k in updates] == [0.0, 0.0]
    start = next(k for k in catalog.result_keys() if k.startswith("warmstart-"))
    before = load_file(str(catalog.ref(start, "policy").local_path() / "model.safetensors"))
    after_dir = catalog.ref(updates[-1][1], "policy").local_path()
    after = load_file(str(after_dir / "model.safetensors"))
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert json.loads((after_dir / "policy.json").read_text())["version"] == 2
