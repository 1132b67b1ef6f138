"""The `mutual_info` stage: does the policy's answer still depend on the state?
(docs/method.md#template-collapse-or-sharpening)

On a sample of the rollout's (prompt, response) pairs with distinct prompts, the
policy that sampled them scores every response under every prompt; the
``template/`` metrics (`stages.rl.mutual_info`) say whether falling entropy is
sharpening (high mutual information, retrieval above chance) or template collapse
(both at their floor), and the early warnings read them (`pipelines.run.watch`). The
cross-score matrix is kept as the `cross_scores` view: one row per (prompt,
response) pair.

Wire it beside the rollout (``diagnose: {stage: mutual_info}``); ``every: N`` runs
it every N iterations.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from catalog.datasets import ArtifactRef, Table, TableRef
from catalog.schemas import CROSS_SCORES
from common.config import param
from stages.agent.explore import read_explored, unexplored
from stages.engines.hosts import Weights, engine_policy
from stages.registry import StageContext, StageResult, stage
from stages.rl.mutual_info import TEMPLATE_METRICS, cross_score_metrics, distinct_prompt_rows, prompt_response


@dataclass(frozen=True)
class MutualInfoConfig:
    """`mutual_info:` — the template-collapse diagnostic."""

    pairs: int = param(
        16, "(prompt, response) pairs with distinct prompts to cross-score: N^2 forward passes", ge=2, le=128
    )
    micro_batch_size: int = param(
        64, "sequences per forward pass at most; fewer where their logits would pass 512 MiB", ge=1
    )


@stage(
    "mutual_info",
    config=MutualInfoConfig,
    outputs={"cross_scores": Table(view="cross_scores")},
    wiring={"policy": "policy@prev"},
    in_memory=("policy",),
    metrics=TEMPLATE_METRICS,
)
def mutual_info(ctx: StageContext, cfg: MutualInfoConfig, trajectories: TableRef, policy: ArtifactRef) -> StageResult:
    """Cross-score a sample of the rollout's first turns under the policy that sampled them."""
    import torch

    from stages.models.batching import per_sample
    from stages.models.forward import cross_logprobs
    from stages.models.policy import load_model, training_device

    columns = ["token_ids", "loss_mask", "temperature", "segments", "policy_version"]
    # the policy's own responses only: a forced answer depends on no state (`stages.agent.explore`)
    read = unexplored(read_explored(trajectories, columns)).select(columns)
    table = per_sample(read.append_column("row", pa.array(np.arange(read.num_rows))))
    ids, masks = table.column("token_ids").to_pylist(), table.column("loss_mask").to_pylist()
    split = [prompt_response(i, m) for i, m in zip(ids, masks)]
    usable = [r for r, pr in enumerate(split) if pr is not None and pr[1]]
    prompts = [split[r][0] for r in usable]  # type: ignore[index]
    rows = [usable[k] for k in distinct_prompt_rows(prompts, cfg.pairs, ctx.step_seed)]
    if len(rows) < 2:
        ctx.log(f"mutual_info: {len(rows)} distinct prompt(s) in the rollout; nothing to compare")
        return StageResult(tables={"cross_scores": CROSS_SCORES.empty_table()}, metrics={"template/pairs": len(rows)})
    p = [split[r][0] for r in rows]  # type: ignore[index]
    z = [split[r][1] for r in rows]  # type: ignore[index]
    temps = [float(table.column("temperature")[r].as_py() or 1.0) for r in rows]
    held = engine_policy(policy, True)  # the weights from the trainer's memory where it holds them
    dev = training_device()  # N^2 forward passes of the policy: on a GPU where there is one
    if isinstance(held, Weights):
        model = load_model(held.base.local_path(), device=dev, dtype="float32")
        model.load_state_dict(held.tensors())
    else:
        model = load_model(policy.local_path(), device=dev, dtype="float32")
    model.eval()
    with torch.no_grad():
        ll = cross_logprobs(model, p, z, temps, cfg.micro_batch_size)
    n = len(rows)
    tokens = np.array([len(r) for r in z])
    version = table.column("policy_version")[0].as_py()
    traj = [table.column("row")[r].as_py() for r in rows]
    scores = pa.table(
        {
            "run": [ctx.run] * n * n,
            "iteration": [ctx.iteration] * n * n,
            "policy_version": [version] * n * n,
            "prompt": [i for i in range(n) for _ in range(n)],
            "response": [j for _ in range(n) for j in range(n)],
            "prompt_row": [traj[i] for i in range(n) for _ in range(n)],
            "response_row": [traj[j] for _ in range(n) for j in range(n)],
            "matched": [i == j for i in range(n) for j in range(n)],
            "logprob": ll.reshape(-1).tolist(),
            "response_tokens": [int(tokens[j]) for _ in range(n) for j in range(n)],
        },
        schema=CROSS_SCORES,
    )
    metrics = cross_score_metrics(ll, tokens)
    ctx.log(
        f"mutual_info: MI {metrics['template/mi']:.3f} of {metrics['template/mi_max']:.3f} nats, "
        f"retrieval {metrics['template/retrieval']:.2f} (chance {1 / n:.2f})"
    )
    return StageResult(tables={"cross_scores": scores}, metrics=metrics)
