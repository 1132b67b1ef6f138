"""The plan: every stage execution of a run, with its catalog key, before running.

Keys depend only on stage names, versions, configs, the run seed, the iteration
and the keys of the inputs (catalog.keys), never on what a stage computed, so the
whole run is known up front: the runner walks this list and skips every step whose
key the catalog already holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from catalog.keys import dataset_address, result_key
from pipelines.dag import Graph, Node
from pipelines.spec import Spec


@dataclass(frozen=True)
class Step:
    """One stage execution: `inputs` maps each input to a dataset address."""

    iteration: int | None
    node: Node
    inputs: Mapping[str, str]
    key: str

    @property
    def label(self) -> str:
        return self.node.name if self.iteration is None else f"{self.iteration}:{self.node.name}"


def _step(spec: Spec, node: Node, iteration: int | None, scopes: dict[str, dict[str, str]]) -> Step:
    inputs = {}
    for w in node.wires:
        src = w.initial if (w.source.scope == "prev" and iteration == 0) else w.source
        assert src is not None
        inputs[w.param] = scopes[src.scope][src.node + "/" + src.output]
    key = result_key(node.stage.name, node.stage.version, node.config, inputs, spec.run.seed, iteration)
    return Step(iteration, node, inputs, key)


def _publish(step: Step, scope: dict[str, str]) -> None:
    for out, _ in step.node.outputs:
        scope[f"{step.node.name}/{out}"] = dataset_address(step.key, out)


def plan(spec: Spec, graph: Graph) -> list[Step]:
    """Every step of the run in execution order."""
    scopes: dict[str, dict[str, str]] = {"once": {}, "iteration": {}, "prev": {}}
    steps: list[Step] = []
    for node in graph.once:
        steps.append(_step(spec, node, None, scopes))
        _publish(steps[-1], scopes["once"])
    for i in range(spec.run.iterations):
        scopes["prev"], scopes["iteration"] = scopes["iteration"], {}
        for node in graph.iteration:
            if i % node.every == 0 or i == spec.run.iterations - 1:  # sinks also see the final state
                steps.append(_step(spec, node, i, scopes))
                _publish(steps[-1], scopes["iteration"])
    return steps
