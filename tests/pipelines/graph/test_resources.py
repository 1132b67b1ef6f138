"""The resource plan (pipelines/graph/resources.py): what a run holds at once, checked
against the cluster before anything runs. Ray accepts logical GPUs on a CPU machine
(``ray.init(num_gpus=1)``), so the plans are tried on a one-GPU Ray session here."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from catalog.store import Catalog
from common.config import param
from common.errors import UserError
from pipelines.graph import resources
from pipelines.graph.load import load_spec
from pipelines.run.progress import Quiet
from pipelines.run.runner import Runner
from stages.registry import Claim, StageContext, StageResult, Table, stage


@dataclass(frozen=True)
class HoldConfig:
    gpus: float = param(0.5, "GPUs an actor of the step holds", ge=0)


@stage(
    "t.gpu_holder",
    config=HoldConfig,
    outputs={"numbers": Table()},
    claims=lambda cfg: [Claim("t.gpu_holder", cfg.gpus, 0.0, "run")],
)
def hold(ctx: StageContext, cfg: HoldConfig) -> StageResult:
    """Starts an actor holding `gpus` and waits for it: a request Ray cannot meet would hang here."""
    import pyarrow as pa
    import ray

    ctx.ray()
    actor = ray.remote(_Probe).options(num_cpus=0, num_gpus=cfg.gpus).remote()
    ids = ray.get(actor.gpus.remote(), timeout=60)
    ray.kill(actor)
    return StageResult(tables={"numbers": pa.table({"gpu_ids": [len(ids)]})})


class _Probe:
    def gpus(self) -> list[int]:
        import ray

        return list(ray.get_gpu_ids())


SPEC = """
run: {{iterations: 1, seed: 0}}
pipeline:
  engines: {{stage: t.gpu_holder}}
  trainer: {{stage: t.gpu_holder, outputs: {{numbers: held}}}}
engines: {{gpus: {a}}}
trainer: {{gpus: {b}}}
"""


@pytest.fixture(scope="module")
def one_gpu() -> Iterator[None]:
    """A Ray session of its own with 2 CPUs and one logical GPU."""
    import ray

    from pipelines.run.session import start_ray
    from stages.engines.hosts import drop_pool

    drop_pool()
    if ray.is_initialized():
        ray.shutdown()
    start_ray(None, num_cpus=2, num_gpus=1)
    yield
    ray.shutdown()


def _plan(name: str, *overrides: str) -> resources.Plan:
    return resources.of_spec(load_spec(name, overrides))


def test_the_papers_preset_plans_one_gpu_and_says_so():
    plan = _plan("starpo-qwen0.5b.yaml")
    assert plan.gpus == 1.0
    resources.check(plan, {"GPU": 1, "CPU": 2}, "a one-GPU machine")
    assert "1 GPU" in plan.describe() and "engine actor" in plan.describe()
    # a rollout on vLLM beside an eval on hf: two pools, each holding its half
    assert _plan("starpo-qwen0.5b.yaml", "rollout.engine=vllm").gpus == 1.5


def test_a_plan_that_does_not_fit_is_one_line_naming_its_holders_and_levers():
    """The adversary: the preset as it was (a critic fit asking for a GPU of its own
    beside the update's group and the engine) on one GPU."""
    plan = _plan("starpo-qwen0.5b.yaml", "critic.optim.workers=1", "update.optim.gpus=1")
    assert plan.gpus == 2.5
    with pytest.raises(UserError) as err:
        resources.check(plan, {"GPU": 1, "CPU": 16}, "a one-GPU machine")
    message = str(err.value)
    assert "\n" not in message
    assert "2.5 GPU at once and a one-GPU machine has 1" in message
    assert "critic.update" in message and "critic.optim.workers" in message


def test_an_engine_pool_is_counted_once_and_steps_by_concurrency():
    pool = [Claim("rollout", 0.5, 1, "run", "engines:hf"), Claim("eval", 0.5, 1, "run", "engines:hf")]
    fits = [Claim("a", 1, 1, "step"), Claim("b", 2, 2, "step"), Claim("group", 1, 0, "run")]
    assert resources.plan(pool + fits).gpus == 0.5 + 1 + 2
    assert resources.plan(pool + fits, concurrency=2).gpus == 0.5 + 1 + 2 + 1
    other = Claim("eval on vllm", 0.25, 0, "run", "engines:vllm")  # a pool of its own, kept beside
    assert resources.plan([*pool, other]).gpus == 0.75
    assert resources.plan([]).describe().startswith("resources: no GPU")


def test_a_cpu_preset_holds_nothing_and_a_gpu_free_plan_starts_no_ray(tmp_path: Path, no_ray: None):
    import ray

    assert _plan("starpo.yaml").gpus == 0
    spec = load_spec("starpo.yaml", ["run.iterations=1"])
    Runner(spec, Catalog(str(tmp_path)), Quiet())._check_resources()
    assert not ray.is_initialized()


def test_on_one_logical_gpu_a_plan_that_fits_runs_and_one_that_does_not_stops_before_any_step(
    tmp_path: Path, one_gpu: None
):
    fits, catalog = tmp_path / "fits.yaml", Catalog(str(tmp_path / "catalog"))
    fits.write_text(SPEC.format(a=0.5, b=0.4))
    summary = Runner(load_spec(str(fits)), catalog, Quiet()).run()
    assert summary.ran == 2
    too_much = tmp_path / "too-much.yaml"
    too_much.write_text(SPEC.format(a=0.5, b=1.0))
    other = Catalog(str(tmp_path / "other"))
    with pytest.raises(UserError, match=r"1.5 GPU at once and this machine's Ray session has 1"):
        Runner(load_spec(str(too_much)), other, Quiet()).run()
    assert not list((tmp_path / "other").rglob("*.parquet")), "a refused run computes nothing"


def test_the_papers_preset_claims_are_met_at_once_on_one_logical_gpu(one_gpu: None):
    """What Ray is asked for, asked for at once: every holder of the preset's plan starts."""
    import ray

    plan = _plan("starpo-qwen0.5b.yaml")
    actors = [ray.remote(_Probe).options(num_cpus=0, num_gpus=c.gpus).remote() for c in plan.held + plan.stepwise]
    assert len(actors) == 2
    assert all(len(ids) == 1 for ids in ray.get([a.gpus.remote() for a in actors], timeout=60))
    for actor in actors:
        ray.kill(actor)
