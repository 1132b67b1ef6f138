"""Stage declarations are checked when they are registered."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from catalog.datasets import Table, TableRef
from stages.registry import StageResult, stage
from tests.conftest import NoConfig


def test_inputs_must_be_annotated_refs():
    with pytest.raises(TypeError, match=r"stage input bad\(x\) must be annotated TableRef or ArtifactRef"):

        @stage("t.bad1", config=NoConfig, outputs={"o": Table()})
        def bad(ctx, cfg, x: int) -> StageResult: ...


def test_signature_must_start_with_ctx_cfg():
    with pytest.raises(TypeError, match=r"must start with \(ctx, cfg, \.\.\.\)"):

        @stage("t.bad2", config=NoConfig, outputs={"o": Table()})
        def bad(cfg, ctx) -> StageResult: ...


def test_metrics_must_use_a_namespace():
    with pytest.raises(TypeError, match=r"metric 'loss' is outside the namespaces"):
        stage("t.bad3", config=NoConfig, outputs={"o": Table()}, metrics={"loss": "x"})


def test_config_must_be_a_dataclass():
    with pytest.raises(TypeError, match="config must be a dataclass"):
        stage("t.bad4", config=dict, outputs={"o": Table()})


def test_wiring_must_name_inputs():
    with pytest.raises(TypeError, match=r"wiring names unknown inputs \['y'\]"):

        @stage("t.bad5", config=NoConfig, outputs={"o": Table()}, wiring={"y": "y@prev"})
        def bad(ctx, cfg, x: TableRef) -> StageResult: ...


def test_undeclared_metric_is_rejected():
    @dataclass(frozen=True)
    class C:
        pass

    @stage("t.metrics", config=C, outputs={"o": Table()}, metrics={"eval/success/*": "per env"})
    def ok(ctx, cfg) -> StageResult: ...

    from stages.registry import STAGES

    STAGES["t.metrics"].check_metrics({"eval/success/sokoban": 1.0, "perf/seconds": 0.1})
    with pytest.raises(ValueError, match="undeclared metric 'eval/other'"):
        STAGES["t.metrics"].check_metrics({"eval/other": 1.0})


def test_a_second_stage_under_a_taken_name_is_refused():
    import stages  # noqa: F401  (registers the built-in stages)
    from stages.registry import STAGES

    before = STAGES["rollout"]
    with pytest.raises(TypeError, match=r"stage 'rollout' is already registered by stages.rollout.rollout"):

        @stage("rollout", config=NoConfig, outputs={"o": Table()})
        def rollout(ctx, cfg) -> StageResult: ...

    assert STAGES["rollout"] is before


def test_stages_of_other_modules_are_kept_apart_from_the_built_in_ones():
    import stages  # noqa: F401
    from stages.registry import BUILT_IN, IMPORTED, STAGES

    assert "t.source" in IMPORTED and "t.source" not in BUILT_IN  # a test stage (tests/conftest.py)
    assert "rollout" in BUILT_IN and all(s.fn.__module__.startswith("stages.") for s in BUILT_IN.values())
    assert STAGES["t.source"] is IMPORTED["t.source"] and STAGES["rollout"] is BUILT_IN["rollout"]
