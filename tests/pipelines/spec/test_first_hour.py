"""The mistakes a newcomer makes in the first hour, on the real presets: each is refused
at load time in one line that blames the user's own file or `-o` (never the preset it
extends), and `extends:` drops what a switched environment or stage leaves behind."""

from __future__ import annotations

from pathlib import Path

import pytest

import stages  # noqa: F401  (registers the stages)
from common.errors import SpecError, did_you_mean
from pipelines.cli.main import invoke
from pipelines.graph.load import load_spec
from pipelines.spec.typed import type_name

PRESET = str(Path(__file__).resolve().parents[3] / "configs" / "starpo.yaml")


def _mine(tmp_path: Path, text: str) -> str:
    path = tmp_path / "mine.yaml"
    path.write_text("extends: starpo.yaml\n" + text)
    return str(path)


def _refused(spec: str, overrides: tuple[str, ...] = ()) -> SpecError:
    with pytest.raises(SpecError) as info:
        load_spec(spec, overrides)
    message = str(info.value)
    assert "\n" not in message and len(message) < 400, message
    return info.value


# (id, the user's file over starpo.yaml, overrides, the key named, the text expected)
REFUSED = [
    ("negative seed", "run: {seed: -1}\n", (), "run.seed", "expected an integer >= 0"),
    ("seed past 32 bits", "", ("run.seed=4294967296",), "run.seed", "<= 4294967295"),
    ("a size no machine holds", "", ("rollout.n_groups=1000000000000",), "rollout.n_groups", "<= 2147483647"),
    ("a rollout too large", "rollout: {n_groups: 100000, group_size: 16}\n", (), "rollout.n_groups", "1,048,576"),
    ("an eval too large", "", ("eval.episodes=1000000",), "eval.episodes", "1,048,576"),
    ("an embedded giant", "model: {embedded: {hidden_size: 65536}}\n", (), "model.embedded.hidden_size", "10B"),
    ("an infinite rate", "", ("update.optim.lr=.inf",), "update.optim.lr", "expected a finite number"),
    ("an overflowing number", "update: {clip_ratio_high: 1e400}\n", (), "update.clip_ratio_high", "finite"),
    ("a typo removes nothing", "pipeline: {evl: null}\n", (), "pipeline.evl", "did you mean 'eval'"),
    ("a typo in -o removes nothing", "", ("pipeline.mutual_inf=null",), "pipeline.mutual_inf", "mutual_info"),
    (
        "a critic the estimator ignores",
        "pipeline: {critic_init: {stage: critic.init, once: true}, critic: {stage: critic.update}}\n",
        (),
        "pipeline.critic",
        "gigpo",
    ),
    ("a cycle", "pipeline: {filter: {inputs: {trajectories: batch}}}\n", (), "pipeline.filter", "filter"),
]


@pytest.mark.parametrize(
    ("text", "overrides", "key", "expected"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_a_mistake_is_refused_at_load_time_and_blamed_on_its_source(tmp_path, text, overrides, key, expected):
    error = _refused(_mine(tmp_path, text), overrides)
    assert error.path == key and expected in error.problem, str(error)
    source = f"-o {overrides[0]}" if overrides else str(tmp_path / "mine.yaml")
    assert error.source == source, f"blamed {error.source}, not the user's {source}"


def test_a_cycle_names_only_its_own_nodes(tmp_path):
    error = _refused(_mine(tmp_path, "pipeline: {filter: {inputs: {trajectories: batch}}}\n"))
    assert "(advantage -> filter -> advantage)" in error.problem, error.problem
    assert "update" not in error.problem and "eval" not in error.problem


@pytest.mark.parametrize(
    ("text", "overrides"),
    [
        ("rollout: {env: sokoban}\n", ()),  # the preset's FrozenLake options would not fit Sokoban
        ("", ("rollout.env=sokoban",)),
        ("eval: {envs: [sokoban]}\n", ()),  # the preset's frozenlake options for an env no longer listed
        ("rollout: {env: sokoban, env_options: {dim_room: [6, 6]}}\n", ()),  # only the new options
    ],
)
def test_switching_the_environment_drops_the_old_ones_options(tmp_path, text, overrides):
    spec = load_spec(_mine(tmp_path, text), overrides)
    node = {n.name: n for n in spec.nodes}
    if "eval" in text:
        assert node["eval"].config.env_options in (None, {}), node["eval"].config.env_options
        return
    assert node["rollout"].config.env == "sokoban"
    options = dict(node["rollout"].config.env_options or {})
    assert "slippery" not in options and "render" not in options, options
    source = spec.origins.where("rollout.env_options")
    assert source != PRESET, "the dropped options are still blamed on the preset"


def test_the_same_environment_keeps_its_options(tmp_path):
    spec = load_spec(_mine(tmp_path, "rollout: {env: frozenlake}\n"))
    rollout = next(n for n in spec.nodes if n.name == "rollout")
    assert rollout.config.env_options["render"] == "grid"


def test_switching_a_nodes_stage_drops_the_old_stages_settings(tmp_path):
    spec = load_spec(PRESET, ("pipeline.eval.stage=rollout", "pipeline.eval.outputs={trajectories: more}"))
    eval_node = next(n for n in spec.nodes if n.name == "eval")
    assert eval_node.stage.name == "rollout" and not hasattr(eval_node.config, "envs")


def test_the_readme_spec_validates():
    """The spec under "Writing a spec", as printed (tests/test_examples.py checks every block)."""
    text = (Path(PRESET).parents[1] / "README.md").read_text()
    block = text.split("## Writing a spec", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    path = Path(PRESET).parent / ".readme-example.yaml"
    try:
        path.write_text(block)
        spec = load_spec(str(path))
    finally:
        path.unlink(missing_ok=True)
    assert {"critic", "critic_init", "pretrain"} <= {n.name for n in spec.nodes}


def test_messages_are_short():
    assert type_name(dict[str, int | float | bool | str | tuple[int, ...] | None]) == "a mapping"
    assert type_name(int | None) == "an integer or null"
    assert type_name(tuple[str, ...]) == "a list of strings"
    many = [f"section_{i}.key_{j}" for i in range(20) for j in range(10)]
    hint = did_you_mean("zzz", many)
    assert len(hint) < 200 and "the nearest of 200" in hint, hint


def test_validate_and_explain_read_no_model_file(tmp_path, monkeypatch):
    """A real model's tokenizer is checked when a run starts, not by validate."""
    import stages.policy as policy_stage

    def refuse(*args, **kwargs):
        raise AssertionError("validate read a model file")

    monkeypatch.setattr(policy_stage, "load_tokenizer", refuse)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    load_spec(PRESET, (f"model.path={model}",))


@pytest.mark.parametrize("name", sorted(p.name for p in (Path(PRESET).parent).glob("*.yaml")))
def test_every_preset_validates(name):
    """Its seconds are a bench's (`python bench/validate.py`: well under one a preset)."""
    assert load_spec(name).nodes


@pytest.mark.parametrize(
    ("argv", "code", "expected"),
    [
        (["--version"], 0, "pipeline "),
        (["validate"], 2, "error: pipeline validate: Missing argument"),
        (["validate", "starpo", "--nope"], 2, "error: pipeline validate: No such option: --nope"),
        (["bogus"], 2, "error: pipeline: No such command 'bogus'"),
        (["score", "x", "--policy", "v3x"], 2, "expected a policy version such as 20 or v20"),
        (["validate", "starpo", "-o", "x"], 2, "e.g. -o update.optim.lr=1e-5"),
    ],
)
def test_the_command_line_answers_in_one_line(capsys, argv, code, expected):
    assert invoke(argv) == code
    out = capsys.readouterr()
    text = out.out if code == 0 else out.err
    assert expected in text and text.count("\n") == 1, text


def test_a_version_is_written_either_way(tmp_path, capsys):
    from pipelines.cli.app import policy_version

    assert policy_version("v20") == policy_version("20") == 20
    # `score` takes it: an unknown run in an empty folder fails past the parsing, on the catalog
    assert invoke(["score", "nope", "--policy", "v3", "--catalog", str(tmp_path)]) == 2
    assert "no catalog there" in capsys.readouterr().err


def test_the_malformed_override_hint_is_itself_valid():
    load_spec(PRESET, ("update.optim.lr=1e-5",))
