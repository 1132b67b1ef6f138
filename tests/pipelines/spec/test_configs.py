"""Every shipped spec loads and passes every check (types, wiring, cross-node)."""

from pathlib import Path

import pytest

from pipelines.graph.load import load_spec

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
SPECS = sorted(p.relative_to(CONFIGS).as_posix() for p in CONFIGS.rglob("*.yaml") if p.parent.name != "sweeps")
SWEEPS = sorted(p.relative_to(CONFIGS).as_posix() for p in CONFIGS.rglob("sweeps/*.yaml"))


#: specs whose check reaches a server they name: validated beside one (tests/envs/test_openenv.py)
SERVED = {"experiments/starpo-openenv-frozenlake.yaml"}


@pytest.mark.parametrize("name", SPECS)
def test_shipped_spec_validates(name):
    if name in SERVED:
        pytest.skip("its check reaches its server: tests/envs/test_openenv.py validates it beside one")
    spec = load_spec(str(CONFIGS / name))
    assert spec.nodes


@pytest.mark.parametrize("name", SWEEPS)
def test_shipped_sweep_validates_every_trial(name):
    from pipelines.sweep.tune import check, load_sweep

    sweep = load_sweep(str(CONFIGS / name))
    points = check(sweep)
    assert points or sweep.section.search == "optuna"


def test_presets_keep_the_stabilised_settings_apart():
    s, vanilla = load_spec("starpo-s.yaml"), load_spec("starpo-vanilla.yaml")
    cfg = {n.name: n.config for n in s.nodes}
    van = {n.name: n.config for n in vanilla.nodes}
    assert (cfg["filter"].strategy, cfg["filter"].ratio) == ("top_k", 0.25)
    assert (cfg["update"].clip_ratio_high, cfg["update"].kl_coef) == (0.28, 0.0)
    assert van["filter"].strategy == "none"
    assert (van["update"].clip_ratio_high, van["update"].kl_coef) == (0.2, 0.001)


def _warmstart(spec):
    return {n.name: n.config for n in spec.nodes}["warmstart"]


def test_the_real_model_presets_warm_start_where_their_results_were_measured():
    """The bandit presets extend the FrozenLake one and inherit its warmstart keys one by one:
    the lake's warm-start noise must not reach the bandit's format warm start, and the expert
    sweep must undo it (each published table re-uses its steps only with these values)."""
    lake = _warmstart(load_spec("starpo-smollm2.yaml"))
    assert (lake.demonstrator, lake.noise, lake.random_share) == ("expert", "random_safe", 0.25)
    for name in ("starpo-smollm2-bandit.yaml", "starpo-smollm2-bandit-vanilla.yaml"):
        bandit = _warmstart(load_spec(name))
        assert (bandit.demonstrator, bandit.noise, bandit.random_share) == ("random_valid", "random_valid", 0.0), name
    from pipelines.sweep.file import load_sweep, trial_spec

    expert = load_sweep("sweeps/seeds-smollm2.yaml")
    for point in expert.grid():
        ws = _warmstart(trial_spec(expert, point, "t"))
        assert (ws.demonstrator, ws.noise, ws.random_share) == ("expert", "random_valid", 0.0)


def test_presets_and_experiment_recipes_are_apart_and_found_by_name():
    """configs/ holds the presets a user starts from; configs/experiments/ the recipes behind
    single results. A name is in one place only, and `pipeline run NAME` finds both."""
    from pipelines.spec.yamlio import find_spec

    top = {p.name for p in CONFIGS.glob("*.yaml")} | {f"sweeps/{p.name}" for p in CONFIGS.glob("sweeps/*.yaml")}
    recipes = {p.relative_to(CONFIGS / "experiments").as_posix() for p in (CONFIGS / "experiments").rglob("*.yaml")}
    assert top and recipes and not top & recipes, sorted(top & recipes)
    assert len(top - {n for n in top if n.startswith("sweeps/")}) <= 10, (
        "configs/ is for the few presets a user starts from"
    )
    for name in sorted(recipes):
        assert find_spec(name) == (CONFIGS / "experiments" / name).resolve()
    index = (CONFIGS / "experiments" / "README.md").read_text()
    missing = [n for n in sorted(recipes) if f"`{n}`" not in index]
    assert not missing, f"add to configs/experiments/README.md: {missing}"
