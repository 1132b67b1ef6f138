"""A tiny, dependency-light policy-gradient pipeline: a softmax policy over the two
arms of the SPEC's bi-arm bandit, improved by REINFORCE. It exercises every part of
the runner (a once-stage, table and artifact outputs, ``policy@prev`` wiring,
metrics) in well under a second; tests and the quick demo use it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from catalog.datasets import Artifact, ArtifactRef, Table, TableRef
from stages.config import ConfigProblem, param
from stages.registry import StageContext, StageResult, stage


@dataclass(frozen=True)
class DemoInitConfig:
    arms: tuple[str, ...] = param(("Phoenix", "Dragon"), "arm names; the last one is the high-risk arm")
    init_logit: float = param(0.0, "initial logit of the high-risk arm (the others start at 0)")

    def __post_init__(self) -> None:
        if len(self.arms) < 2 or len(set(self.arms)) != len(self.arms):
            raise ConfigProblem("arms", f"expected at least two distinct arm names, got {list(self.arms)}")


@dataclass(frozen=True)
class DemoPullConfig:
    pulls: int = param(256, "arm pulls per iteration", ge=1)
    low_reward: float = param(0.1, "reward of every low-risk arm (SPEC: 0.1)")
    high_reward: float = param(1.0, "reward of the high-risk arm when it pays (SPEC: 1.0)")
    high_p: float = param(0.25, "probability that the high-risk arm pays (SPEC: 0.25)", ge=0, le=1)


@dataclass(frozen=True)
class DemoUpdateConfig:
    lr: float = param(5.0, "step size on the logits", gt=0)


def _read_policy(ref: ArtifactRef) -> dict:
    return json.loads((ref.local_path() / "policy.json").read_text())


def _write_policy(ctx: StageContext, policy: dict) -> None:
    (ctx.output_dir("policy") / "policy.json").write_text(json.dumps(policy, indent=1))


def _probs(logits: list[float]) -> np.ndarray:
    z = np.exp(np.asarray(logits) - max(logits))
    return z / z.sum()


@stage("demo.init", config=DemoInitConfig, outputs={"policy": Artifact("softmax policy over arms")})
def init_policy(ctx: StageContext, cfg: DemoInitConfig) -> StageResult:
    """A fresh softmax policy over the arms."""
    _write_policy(ctx, {"arms": list(cfg.arms), "logits": [0.0] * (len(cfg.arms) - 1) + [cfg.init_logit]})
    return StageResult()


@stage("demo.pull", config=DemoPullConfig, outputs={"pulls": Table(view="demo_pulls")},
       wiring={"policy": "policy@prev"},
       metrics={"rollout/reward_mean": "mean reward of the pulls",
                "rollout/high_arm_rate": "fraction of pulls of the high-risk arm"})
def pull(ctx: StageContext, cfg: DemoPullConfig, policy: ArtifactRef) -> StageResult:
    """Sample arm pulls from the policy and pay them out."""
    pol = _read_policy(policy)
    rng = np.random.default_rng([ctx.seed, ctx.iteration or 0])
    arms = rng.choice(len(pol["arms"]), size=cfg.pulls, p=_probs(pol["logits"]))
    high = arms == len(pol["arms"]) - 1
    rewards = np.where(high, cfg.high_reward * (rng.random(cfg.pulls) < cfg.high_p), cfg.low_reward)
    table = pa.table({
        "run": [ctx.run] * cfg.pulls, "iteration": [ctx.iteration] * cfg.pulls,
        "arm": [pol["arms"][a] for a in arms], "arm_index": arms.astype("int64"), "reward": rewards,
    })
    return StageResult(tables={"pulls": table},
                       metrics={"rollout/reward_mean": float(rewards.mean()),
                                "rollout/high_arm_rate": float(high.mean())})


@stage("demo.reinforce", config=DemoUpdateConfig, outputs={"policy": Artifact("the updated policy")},
       wiring={"policy": "policy@prev"},
       metrics={"actor/p_high": "probability of the high-risk arm after the update",
                "actor/grad_norm": "norm of the policy gradient on the logits"})
def reinforce(ctx: StageContext, cfg: DemoUpdateConfig, pulls: TableRef, policy: ArtifactRef) -> StageResult:
    """One REINFORCE step with a mean-reward baseline."""
    pol = _read_policy(policy)
    batch = pulls.read(columns=["arm_index", "reward"])
    arms = batch["arm_index"].to_numpy()
    adv = batch["reward"].to_numpy() - batch["reward"].to_numpy().mean()
    probs = _probs(pol["logits"])
    onehot = np.eye(len(probs))[arms]
    grad = ((onehot - probs) * adv[:, None]).mean(axis=0)
    logits = (np.asarray(pol["logits"]) + cfg.lr * grad).tolist()
    _write_policy(ctx, {**pol, "logits": logits})
    return StageResult(metrics={"actor/p_high": float(_probs(logits)[-1]),
                                "actor/grad_norm": float(math.sqrt((grad ** 2).sum()))})
