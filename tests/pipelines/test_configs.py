"""Every shipped spec loads and passes every check (types, wiring, cross-node)."""

from pathlib import Path

import pytest

from pipelines.load import load_spec

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
SPECS = sorted(p.relative_to(CONFIGS).as_posix() for p in CONFIGS.rglob("*.yaml") if p.parent.name != "sweeps")
SWEEPS = sorted(p.name for p in (CONFIGS / "sweeps").glob("*.yaml"))


@pytest.mark.parametrize("name", SPECS)
def test_shipped_spec_validates(name):
    spec = load_spec(str(CONFIGS / name))
    assert spec.nodes


@pytest.mark.parametrize("name", SWEEPS)
def test_shipped_sweep_validates_every_trial(name):
    from pipelines.sweep import check, load_sweep

    sweep = load_sweep(str(CONFIGS / "sweeps" / name))
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
