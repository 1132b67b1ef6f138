"""One agent section: the top-level `agent:` sets every stage's agent loop; a stage's
own keys override it; the stages that must agree are checked; `pipeline explain`
says where each value came from."""

from __future__ import annotations

import pytest

import stages  # noqa: F401  (registers the stages)
from common.errors import SpecError
from pipelines.graph.load import load_spec
from pipelines.spec.explain import explain


def _agents(spec) -> dict[str, object]:
    return {n.name: n.config.agent for n in spec.nodes if hasattr(n.config, "agent")}


def test_the_top_level_agent_section_sets_every_stage():
    spec = load_spec("starpo.yaml", ["agent.max_turns=3"])
    agents = _agents(spec)
    assert set(agents) == {"pretrain", "warmstart", "eval_start", "rollout", "eval"}  # the probes: the same prompt
    assert {a.max_turns for a in agents.values()} == {3}
    assert {a.history for a in agents.values()} == {0}  # the rest of the section kept


def test_a_stage_key_overrides_the_section_and_the_stages_that_must_agree_are_checked():
    with pytest.raises(SpecError, match=r"warmstart.agent: differs from rollout.agent \(max_turns 5 vs 4\)"):
        load_spec("starpo.yaml", ["rollout.agent.max_turns=4"])
    with pytest.raises(SpecError, match=r"eval.agent: differs from rollout.agent"):
        load_spec("starpo.yaml", ["rollout.agent.max_turns=4", "warmstart.agent.max_turns=4"])
    same = [f"{n}.agent.max_turns=4" for n in ("pretrain", "rollout", "warmstart", "eval")]
    assert {a.max_turns for a in _agents(load_spec("starpo.yaml", same)).values()} == {4}


def test_a_mistake_in_the_section_is_named_at_its_own_key():
    with pytest.raises(SpecError, match=r"agent.max_turnz: unknown key \(did you mean 'max_turns'\?\)"):
        load_spec("starpo.yaml", ["agent.max_turnz=3"])
    with pytest.raises(SpecError, match=r"^-o agent.max_turns=0: agent.max_turns: expected an integer >= 1"):
        load_spec("starpo.yaml", ["agent.max_turns=0"])


def test_a_section_no_stage_reads_is_refused(spec_file):
    from tests.conftest import TEST_PIPELINE

    with pytest.raises(SpecError, match=r"agent: no stage of this pipeline has an? 'agent' setting"):
        load_spec(spec_file(TEST_PIPELINE + "agent: {max_turns: 2}\n"))


def test_explain_names_the_source_of_each_value():
    text = explain(load_spec("envs/frozenlake.yaml", ["update.optim.lr=3e-4"]))
    lines = text.splitlines()

    def line(key: str) -> str:
        return next(x for x in lines if x.startswith(key + " = "))

    assert line("rollout.agent.max_actions_per_turn").endswith("[agent: " + str(_config("envs/frozenlake.yaml")) + "]")
    assert line("rollout.agent.max_turns").endswith("[agent: " + str(_config("starpo-relative.yaml")) + "]")
    assert line("update.optim.lr") == "update.optim.lr = 0.0003    [-o update.optim.lr=3e-4]"
    assert line("rollout.top_p").endswith("[default]")
    doc = lines[lines.index(line("rollout.n_groups")) + 1]
    assert "groups per batch" in doc and ">= 1" in doc
    with pytest.raises(Exception, match=r"explain rollout.n_group: no such setting .*did you mean 'rollout.n_groups'"):
        explain(load_spec("starpo.yaml"), "rollout.n_group")


def _config(name: str):
    from pathlib import Path

    return (Path(__file__).resolve().parents[3] / "configs" / name).resolve()


def test_explain_of_the_section_shows_it_as_written_and_the_stages_that_differ():
    """Issue 93: `explain SPEC agent` listed `pretrain.agent.*`, the first node's copy;
    a user who wrote a top-level `agent:` expects `agent.*`, and where a stage reads
    another value, that stage's own line."""
    lines = explain(load_spec("starpo.yaml"), "agent").splitlines()
    shown = [x.split(" = ")[0] for x in lines if " = " in x]
    assert shown and all(p.startswith("agent.") for p in shown) and len(shown) == len(set(shown))
    assert lines[0].startswith("agent.max_turns = 5    [") and lines[0].endswith("configs/starpo.yaml]")
    lines = explain(load_spec("starpo.yaml", ["pretrain.agent.max_turns=2"]), "agent.max_turns").splitlines()
    assert lines[0].startswith("agent.max_turns = 5    [")
    assert lines[2] == "pretrain.agent.max_turns = 2    [-o pretrain.agent.max_turns=2]"
    assert len([x for x in lines if " = " in x]) == 2
