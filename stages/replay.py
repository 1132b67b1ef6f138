"""The replay stage: offline training on stored trajectories, generating nothing.

It stands where the rollout stands (``rollout: {stage: replay}``) and outputs the
same `trajectories` table, so filter, advantage and update run unchanged. The
source is picked in the spec and resolved when the run is planned:

- ``run: NAME``: every rollout that run used (cached ones included), in its order;
- ``key: RESULT``: one stored rollout result;
- ``where: CONDITION``: a DuckDB condition over the `trajectories` columns
  (``success``, ``iteration >= 10``, ``env = 'sokoban'`` ...); alone, it selects from
  every stored rollout of the catalog.

The pool is the selected trajectories grouped as they were sampled (source,
iteration, group); iteration i takes the next `n_groups` groups, cycling through
the pool (reshuffled each pass with ``shuffle``) and numbering them 0..n_groups-1.
Every other column is kept as stored: the update's ratio uses the stored sampling
log-probabilities, so the replayed data is trained on off-policy, exactly as
sampled. Token ids only mean something under the tokenizer that produced them, so
a source sampled with another tokenizer than the policy being trained is refused.
Stored results never change, so the source list is part of the result key; a run
that later adds rollouts changes the list, and the replay re-runs.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from catalog.datasets import ArtifactRef, Table, TableRef
from catalog.query import run_outputs, select_where
from catalog.runs import read_steps
from catalog.schemas import conform
from catalog.store import Catalog
from common.config import ConfigProblem, param
from common.errors import CatalogError, UserError, did_you_mean
from stages.agent.play import TRAJECTORY_METRICS, trajectory_metrics
from stages.registry import StageContext, StageResult, stage

VIEW = "trajectories"
UNIT = ("_source", "iteration", "group")  # one sampled group of the pool


@dataclass(frozen=True)
class ReplayConfig:
    """`rollout:` of a replay node — which stored trajectories to train on."""

    run: str | None = param(None, "replay the rollouts this run used")
    key: str | None = param(None, "replay one stored rollout result, e.g. rollout-1a2b3c4d5e6f7a8b")
    where: str | None = param(
        None,
        "DuckDB condition over the trajectories columns, e.g. 'success and "
        "iteration >= 10'; alone it selects from every stored rollout",
    )
    n_groups: int = param(8, "groups per iteration, taken in stored order and cycling through the pool", ge=1)
    shuffle: bool = param(False, "visit the pool's groups in a seeded random order, reshuffled each pass")

    def __post_init__(self) -> None:
        if self.run is None and self.key is None and not self.where:
            raise ConfigProblem("run", "give the trajectories to replay: run, key and/or where")
        if self.run is not None and self.key is not None:
            raise ConfigProblem("key", "give run or key, not both")


def _holds_trajectories(catalog: Catalog, key: str) -> list[str]:
    outputs = catalog.manifest(key)["outputs"]
    return [f"{key}/{name}" for name, out in outputs.items() if out["kind"] == "table" and out.get("view") == VIEW]


def _run_sources(catalog: Catalog, run: str) -> list[str]:
    if read_steps(catalog.root, run) is None:
        runs = catalog.root.list_dirs("runs")
        raise ConfigProblem("run", f"no run '{run}' in catalog {catalog.root.uri}{did_you_mean(run, runs)}")
    found = run_outputs(catalog, run, VIEW)
    if not found:
        raise ConfigProblem("run", f"run '{run}' stored no trajectories (no rollout step committed)")
    return found


def _key_sources(catalog: Catalog, key: str) -> list[str]:
    key = key.split("/", 1)[0]
    if not catalog.has(key):
        raise ConfigProblem("key", f"no stored result '{key}' in catalog {catalog.root.uri}")
    found = _holds_trajectories(catalog, key)
    if not found:
        raise ConfigProblem("key", f"result '{key}' holds no trajectories (it is not a rollout)")
    return found


def _all_sources(catalog: Catalog) -> list[str]:
    keyed = []
    for key in catalog.result_keys():
        m = catalog.manifest(key)
        keyed += [((m.get("run") or "", m.get("iteration") or 0, key), a) for a in _holds_trajectories(catalog, key)]
    return [a for _, a in sorted(keyed)]


def pool(refs: list[TableRef], where: str | None) -> pa.Table:
    """The selected trajectories of `refs` in stored order, with `_source` (the
    index of the ref each came from) for telling their groups apart."""
    tables = [r.read() for r in refs]
    table = pa.concat_tables(
        [t.append_column("_source", pa.array([i] * t.num_rows, pa.int64())) for i, t in enumerate(tables)],
        promote_options="default",
    )
    return select_where(table, VIEW, where, '_source, iteration, "group", sample')


def resolve(cfg: ReplayConfig, catalog: Catalog) -> list[str]:
    """The stored tables to replay, checked to hold at least one selected trajectory."""
    field = "key" if cfg.key is not None else "run" if cfg.run is not None else "where"
    addresses = (
        _key_sources(catalog, cfg.key)
        if cfg.key is not None
        else _run_sources(catalog, cfg.run)
        if cfg.run is not None
        else _all_sources(catalog)
    )
    if not addresses:
        raise ConfigProblem("where", f"catalog {catalog.root.uri} stores no trajectories yet")
    refs = [catalog.table(a) for a in addresses]
    try:
        selected = pool(refs, cfg.where).num_rows
    except UserError as exc:
        raise ConfigProblem("where", str(exc)) from None
    if selected == 0:
        stored = sum(r.read(["seed"]).num_rows for r in refs)
        what = f"'{cfg.where}' selects none of the {stored}" if cfg.where else "there are no"
        raise ConfigProblem("where" if cfg.where else field, f"{what} stored trajectories of {len(refs)} rollout(s)")
    return addresses


TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer.model")


def tokenizer_digest(policy_dir: Path) -> str:
    """A fingerprint of a checkpoint's tokenizer (the files that map text to ids)."""
    digest = hashlib.sha256()
    for name in TOKENIZER_FILES:
        if (policy_dir / name).exists():
            digest.update(name.encode() + (policy_dir / name).read_bytes())
    return digest.hexdigest()[:12]


def checked_tokenizer(policy: ArtifactRef) -> str:
    """`tokenizer_digest` of a stored policy, its files checked against its manifest
    (a sampling policy a replay reads only for this is not among the step's checked inputs)."""
    folder = policy.local_path()
    policy.checked(folder, TOKENIZER_FILES)
    return tokenizer_digest(folder)


def check_tokenizers(ctx: StageContext, table: pa.Table, policy: ArtifactRef) -> None:
    """Refuse trajectories sampled by a policy whose tokenizer differs from `policy`'s."""
    wanted = checked_tokenizer(policy)
    for key in pc.unique(table["policy_key"]).to_pylist():
        try:
            source = ctx.ref(f"{key}/policy")
        except CatalogError:
            raise UserError(
                f"{ctx.node}: the replayed trajectories were sampled by policy '{key}', which is "
                "not in this catalog: their tokenizer cannot be checked"
            ) from None
        got = checked_tokenizer(source)  # type: ignore[arg-type]
        if got != wanted:
            raise UserError(
                f"{ctx.node}: the replayed trajectories were sampled by policy '{key}' with tokenizer "
                f"{got}, but the policy being trained uses tokenizer {wanted}: their token ids "
                "mean other text"
            )


def pick(units: int, n: int, iteration: int, seed: int, shuffle: bool) -> list[int]:
    """The pool groups (by index) that iteration `iteration` trains on."""
    picked = []
    for slot in range(iteration * n, (iteration + 1) * n):
        passes, at = divmod(slot, units)
        order = list(range(units))
        if shuffle:
            random.Random(f"replay:{seed}:{passes}").shuffle(order)
        picked.append(order[at])
    return picked


@stage(
    "replay",
    config=ReplayConfig,
    outputs={"trajectories": Table(view=None)},
    wiring={"policy": "policy@prev"},
    sources=resolve,
    version=2,
    metrics={
        **{f"rollout/{k}": v for k, v in TRAJECTORY_METRICS.items()},
        "rollout/pool_groups": "groups in the replay pool (after `where`)",
        "rollout/pool_pass": "how many times the pool had been gone through before this iteration",
    },
)
def replay(ctx: StageContext, cfg: ReplayConfig, policy: ArtifactRef) -> StageResult:
    """Train on stored trajectories (see the module docstring)."""
    table = pool(list(ctx.sources), cfg.where)
    check_tokenizers(ctx, table, policy)
    ids = np.stack([table[c].to_numpy() for c in UNIT], axis=1)
    units, unit_of = np.unique(ids, axis=0, return_inverse=True)
    unit_of = unit_of.reshape(-1)
    it = ctx.iteration or 0
    chosen = pick(len(units), cfg.n_groups, it, ctx.seed, cfg.shuffle)
    parts = []
    for g, u in enumerate(chosen):
        rows = table.filter(pa.array(unit_of == u))
        parts.append(
            rows.set_column(rows.schema.get_field_index("group"), "group", pa.array([g] * rows.num_rows, pa.int64()))
        )
    out = pa.concat_tables([conform(p) for p in parts])
    metrics = trajectory_metrics(out, "rollout/") | {
        "rollout/pool_groups": len(units),
        "rollout/pool_pass": it * cfg.n_groups // len(units),
    }
    return StageResult(tables={"trajectories": out}, metrics=metrics)
