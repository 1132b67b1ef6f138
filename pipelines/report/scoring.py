"""`pipeline score RUN --policy V --on W`: policy version V of a run, scored off-policy
(`stages.rl.offpolicy`) on the eval trajectories of version W (of the same run, or of
``--on-run``), beside V's real eval on the same seeds where there is one.

    $ pipeline score starpo --policy 60 --on 0
    policy v60 of starpo on 256 eval episodes of starpo v0 (T = 0.5):
      success 61.2% [52.0%, 69.8%]   score 0.41 [0.27, 0.55]   ESS 48 of 256
      its real eval on the same seeds: 59.4% [53.3%, 65.3%] (256 episodes)
"""

from __future__ import annotations

from dataclasses import dataclass

from catalog.datasets import ArtifactRef
from catalog.query import query
from catalog.store import Catalog
from common.errors import UserError
from stages.rl.offpolicy import MIN_ESS, Estimate


@dataclass(frozen=True)
class Scored:
    policy: tuple[str, int, str]  # run, version, result key
    on: tuple[str, int]  # run, version whose eval trajectories were scored on
    temperature: float
    estimate: Estimate
    real: tuple[float, int] | None  # (success, episodes) of the policy's own eval on the same seeds


def _q(text: str) -> str:
    return text.replace("'", "''")


def policy_key(catalog: Catalog, run: str, version: int) -> str:
    """The result key of a run's policy version (from its stored trajectories or evals)."""
    known = set(query(catalog, "select run from runs").column(0).to_pylist())
    if run not in known:
        raise UserError(f"score: no run '{run}' in {catalog.root.uri} (pipeline runs lists them)")
    keys: dict[int, str] = {}
    for view in ("evals", "trajectories"):
        try:
            rows = query(catalog, f"select distinct policy_version v, policy_key k from {view} where run = '{_q(run)}'")
        except UserError:  # a catalog without that view
            continue
        keys |= {r["v"]: r["k"] for r in rows.to_pylist() if r["k"]}
    if version not in keys:
        raise UserError(
            f"score: run '{run}' has no stored policy version {version} "
            f"(versions that played: {', '.join(map(str, sorted(keys))) or 'none'})"
        )
    return keys[version]


def score(catalog: Catalog, run: str, version: int, on: int, on_run: str | None = None, boot: int = 1000) -> Scored:
    """Policy `version` of `run` scored on the eval trajectories of version `on` of `on_run`."""
    from stages.models.policy import load_model
    from stages.score import COLUMNS, score_policy

    source = on_run or run
    key = policy_key(catalog, run, version)
    on_sql = f"from evals where run = '{_q(source)}' and policy_version = {int(on)} and temperature > 0"
    rows = query(catalog, f"select {', '.join(COLUMNS)}, seed, sample {on_sql} order by seed, sample")
    if rows.num_rows == 0:
        raise UserError(f"score: run '{source}' has no eval trajectories of policy version {on} sampled at T > 0")
    temps = set(rows.column("temperature").to_pylist())
    if len(temps) > 1:
        raise UserError(f"score: the evals of '{source}' v{on} mix temperatures {sorted(temps)}")
    temperature = temps.pop()
    ref = catalog.ref(key, "policy")
    assert isinstance(ref, ArtifactRef)
    damaged = catalog.check(key, full=True)  # every byte of the policy it loads, as a run's step does
    if damaged:
        raise UserError(f"score: result {key}: {damaged[0]} (pipeline verify moves it aside, a run computes it again)")
    model = load_model(ref.local_path(), dtype="float32").eval()
    est = score_policy(model, rows, boot=boot)
    seeds = ", ".join(str(int(s)) for s in set(rows.column("seed").to_pylist()))
    real = query(
        catalog,
        f"select avg(success::int) s, count(*)::bigint n from evals where run = '{_q(run)}' "
        f"and policy_version = {int(version)} and temperature = {float(temperature)} and seed in ({seeds})",
    ).to_pylist()[0]
    return Scored((run, version, key), (source, on), temperature, est, (real["s"], real["n"]) if real["n"] else None)


def render(s: Scored) -> list[str]:
    """The lines `pipeline score` prints (and a warning line when the ESS is small)."""
    e = s.estimate
    lines = [
        f"policy v{s.policy[1]} of {s.policy[0]} on {e.episodes} eval episodes of {s.on[0]} v{s.on[1]} "
        f"(T = {s.temperature:g}):",
        f"  success {e.success:.1%} [{e.success_ci[0]:.1%}, {e.success_ci[1]:.1%}]   "
        f"score {e.score:.3g} [{e.score_ci[0]:.3g}, {e.score_ci[1]:.3g}]   ESS {e.ess:.0f} of {e.episodes}",
    ]
    if s.real is not None:
        from pipelines.report.intervals import wilson

        lo, hi = wilson(round(s.real[0] * s.real[1]), s.real[1])
        lines.append(f"  its real eval on the same seeds: {s.real[0]:.1%} [{lo:.1%}, {hi:.1%}] ({s.real[1]} episodes)")
    if not e.trusted:
        lines.append(f"warning: effective sample size {e.ess:.0f} < {MIN_ESS:.0f}: the estimate is not to be trusted")
    return lines
