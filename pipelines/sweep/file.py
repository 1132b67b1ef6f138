"""Sweep files: a base pipeline, fixed overrides and a search space (see
`pipelines.sweep.tune` for the format and how trials run). This module reads and checks
them; every trial's pipeline spec is validated here, before anything runs.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from catalog.keys import canonical_json
from catalog.manifests import is_name
from common.config import param
from common.errors import SpecError
from pipelines.spec import typed
from pipelines.spec.yamlio import Origins, find_spec, load_bounded, load_with_extends, read_yaml, unshare

KINDS = ("grid", "choice", "uniform", "loguniform", "randint")
CATEGORICAL = ("grid", "choice")


@dataclass(frozen=True)
class AshaSection:
    """`sweep.asha:` — stop the worst trials early (Ray Tune's ASHA scheduler)."""

    grace_period: int = param(2, "iterations every trial runs before it may be stopped", ge=1)
    reduction_factor: float = param(2.0, "keep 1/reduction_factor of the trials at each rung", gt=1)


@dataclass(frozen=True)
class SweepSection:
    """`sweep:` — what to run and how to search."""

    name: str | None = param(None, "sweep name (default: the file's stem); trials run as <name>-<trial>")
    base: str = param("starpo.yaml", "the pipeline spec of every trial (beside this file, else under configs/)")
    search: Literal["grid", "optuna"] = param(
        "grid", "grid: every point of the grid dimensions; optuna: num_samples trials chosen by Optuna (TPE)"
    )
    num_samples: int = param(1, "grid: runs of every point (seeds run.seed, +1, ...); optuna: trials", ge=1)
    metric: str = param("eval/success_rate", "the metric trials are ranked by (its value at the last iteration)")
    mode: Literal["max", "min"] = param("max", "whether a larger metric is better")
    max_concurrent_trials: int = param(0, "trials at once; 0: the machine's CPUs / trial_cpus", ge=0)
    trial_cpus: float = param(1.0, "CPUs a trial uses (its torch threads); sets the default concurrency", gt=0)
    seed: int = param(0, "seed of the optuna sampler", ge=0, le=2**32 - 1)
    asha: AshaSection | None = param(None, "early stopping, e.g. {grace_period: 2}; off when absent")


@dataclass(frozen=True)
class Dimension:
    """One searched factor: a dotted key, or a named factor whose values are
    mappings of dotted keys. Categorical values are searched by index."""

    name: str
    kind: str
    values: tuple[Any, ...]

    def tune_domain(self) -> Any:
        """The Ray Tune search domain (categorical values by index) of a searched run."""
        from ray import tune

        if self.kind in CATEGORICAL:
            return tune.choice(list(range(len(self.values))))
        lo, hi = self.values
        return {"uniform": tune.uniform, "loguniform": tune.loguniform, "randint": lambda a, b: tune.randint(a, b + 1)}[
            self.kind
        ](lo, hi)

    def overrides(self, value: Any) -> dict[str, Any]:
        if self.kind in CATEGORICAL:
            value = self.values[int(value)]
        return dict(value) if isinstance(value, dict) else {self.name: value}

    def corners(self) -> list[Any]:
        """Values that together exercise every setting this dimension can make."""
        return list(range(len(self.values))) if self.kind in CATEGORICAL else list(self.values)


@dataclass(frozen=True)
class Sweep:
    """A loaded sweep file (see the module docstring)."""

    file: str
    name: str
    base: str  # the resolved base spec path
    section: SweepSection
    fixed: dict[str, Any]
    space: tuple[Dimension, ...]
    base_seed: int = 0  # the base spec's run.seed: a repeat's seeds count from it

    def overrides_of(self, params: dict[str, Any]) -> dict[str, Any]:
        found = dict(self.fixed)
        for dim in self.space:
            found.update(dim.overrides(params[dim.name]))
        if params.get("_repeat"):
            found["run.seed"] = int(found.get("run.seed", self.base_seed)) + int(params["_repeat"])
        return found

    def trial_id(self, overrides: dict[str, Any]) -> str:
        return hashlib.sha256(canonical_json({"base": self.base, "overrides": overrides}).encode()).hexdigest()[:8]

    def first_point(self) -> dict[str, Any]:
        """The space's first value of every dimension (a representative trial)."""
        return {d.name: d.corners()[0] for d in self.space}

    def grid(self) -> list[dict[str, Any]]:
        """Every grid point with its repeats, as params, seed by seed: every point at the
        first seed, then every point at the next, so that a sweep stopped part way has
        whole seeds (each seed's levels, comparable by pairs) rather than whole levels."""
        dims = [d for d in self.space]
        return [
            {**{d.name: i for d, i in zip(dims, combo)}, "_repeat": r}
            for r in range(self.section.num_samples)
            for combo in itertools.product(*(range(len(d.values)) for d in dims))
        ]


def _dimension(file: str, name: str, raw: Any) -> Dimension:
    path = f"space.{name}"
    if not isinstance(raw, dict) or len(raw) != 1 or next(iter(raw)) not in KINDS:
        raise SpecError(file, path, f"expected one of {{{', '.join(f'{k}: ...' for k in KINDS)}}}, got {raw!r}")
    kind, values = next(iter(raw.items()))
    if not isinstance(values, list) or not values:
        raise SpecError(file, f"{path}.{kind}", f"expected a non-empty list, got {values!r}")
    if kind not in CATEGORICAL:
        if len(values) != 2 or not all(isinstance(v, (int, float)) for v in values) or values[0] >= values[1]:
            raise SpecError(file, f"{path}.{kind}", f"expected [low, high] with low < high, got {values!r}")
        if kind == "loguniform" and values[0] <= 0:
            raise SpecError(file, f"{path}.{kind}", "loguniform needs low > 0")
        if kind == "randint" and not all(isinstance(v, int) for v in values):
            raise SpecError(file, f"{path}.{kind}", "randint needs whole numbers")
    for v in values:
        if isinstance(v, dict) and not v:
            raise SpecError(file, f"{path}.{kind}", "a factor value must set at least one key")
    return Dimension(name, kind, tuple(values))


def load_sweep(name: str, overrides: list[str] | tuple[str, ...] = ()) -> Sweep:
    """Read and check a sweep file; `overrides` (``dotted.key=value``, as `-o` gives
    them) join its fixed overrides. Every trial spec is validated later by `check`."""
    path = find_spec(name)
    file = str(path)
    data = read_yaml(path)
    for key in data:
        if key not in ("sweep", "overrides", "space"):
            raise SpecError(
                file, str(key), f"unknown key{typed.did_you_mean(str(key), ['sweep', 'overrides', 'space'])}"
            )
    section = typed.build(SweepSection, data.get("sweep"), "sweep", lambda _: file)
    fixed = data.get("overrides") or {}
    if not isinstance(fixed, dict):
        raise SpecError(file, "overrides", f"expected a mapping of dotted keys to values, got {fixed!r}")
    fixed = dict(fixed)
    for text in overrides:
        key, sep, raw = text.partition("=")
        if not sep or not key.strip():
            raise SpecError(f"-o {text}", "", "expected -o dotted.key=value, e.g. -o run.iterations=5")
        try:
            fixed[key.strip()] = unshare(load_bounded(raw, f"-o {text[:100]}")) if raw.strip() else ""
        except yaml.YAMLError:
            fixed[key.strip()] = raw
    space_raw = data.get("space") or {}
    if not isinstance(space_raw, dict) or not space_raw:
        raise SpecError(
            file, "space", "expected a mapping of dimensions to search, e.g. {rollout.online_k: {grid: [1, 2]}}"
        )
    space = tuple(_dimension(file, str(k), v) for k, v in space_raw.items())
    if section.search == "grid":
        for d in space:
            if d.kind not in CATEGORICAL:
                raise SpecError(
                    file, f"space.{d.name}", f"'{d.kind}' has no grid: use grid/choice values, or sweep.search: optuna"
                )
    base = str(find_spec(section.base, relative_to=path.parent))
    name = section.name or path.stem
    if not is_name(name):
        raise SpecError(
            file,
            "sweep.name",
            f"a sweep name is letters, digits, '_', '.' or '-' (at most 128, not starting with '.' or '-'): "
            f"{json.dumps(name)[:80]}" + ("" if section.name else " is the file's name; set sweep.name"),
        )
    run = load_with_extends(Path(base), Origins()).get("run")
    seed = run.get("seed", 0) if isinstance(run, dict) else 0
    # a seed that is not an integer is left to the trials' check, which names it
    base_seed = seed if isinstance(seed, int) and not isinstance(seed, bool) else 0
    return Sweep(file, name, base, section, {str(k): v for k, v in fixed.items()}, space, base_seed)


def as_overrides(overrides: dict[str, Any]) -> tuple[str, ...]:
    return tuple(f"{k}={json.dumps(v)}" for k, v in overrides.items())


def trial_spec(sweep: Sweep, params: dict[str, Any], trial: str) -> Any:
    """The validated pipeline spec of one trial (errors name the sweep file)."""
    from pipelines.graph.load import load_spec

    overrides = sweep.overrides_of(params)
    try:
        return load_spec(sweep.base, (*as_overrides(overrides), f"run.name={sweep.name}-{trial}"))
    except SpecError as exc:
        if not exc.source.startswith("-o "):
            raise
        dotted = exc.source[3:].split("=", 1)[0]
        dim = next((d.name for d in sweep.space if dotted in d.overrides(params[d.name])), None)
        at = f"space.{dim}" if dim is not None else f"overrides.{dotted}"
        shown = dim if dim is not None else dotted
        problem = exc.problem if exc.path == shown else f"{exc.path}: {exc.problem}"
        raise SpecError(sweep.file, at, problem) from None


def base_settings(sweep: Sweep) -> dict[str, str]:
    """The settings of the sweep's base spec with its fixed overrides, as a report
    compares them (`pipelines.spec.explain.comparable`)."""
    from pipelines.graph.load import load_spec
    from pipelines.spec.explain import comparable, recorded

    spec = load_spec(sweep.base, (*as_overrides(sweep.fixed), f"run.name={sweep.name}-base"))
    return comparable(json.loads(recorded(spec)))


def check(sweep: Sweep) -> list[dict[str, Any]]:
    """Validate the trial specs (every grid point; for optuna, each categorical value
    and both bounds of each range); return the grid points (empty for optuna)."""
    if sweep.section.search == "grid":
        points = sweep.grid()
        for p in points:
            trial_spec(sweep, p, "check")
        return points
    first = sweep.first_point()
    for d in sweep.space:
        for value in d.corners():
            trial_spec(sweep, {**first, d.name: value}, "check")
    return []


def check_metric(sweep: Sweep, spec: Any) -> None:
    import fnmatch

    patterns = [p for n in spec.nodes for p in n.stage.metrics]
    if not any(fnmatch.fnmatchcase(sweep.section.metric, p) for p in patterns):
        raise SpecError(
            sweep.file,
            "sweep.metric",
            f"no stage of {Path(sweep.base).name} reports '{sweep.section.metric}' (see docs/metrics.md)",
        )


def is_sweep_file(name: str) -> bool:
    """Whether `name` finds a YAML file with a top-level ``sweep:`` or ``space:`` (what
    `pipeline validate` checks as a sweep); False where it finds none or reads none, so
    that the spec's own loading reports that."""
    try:
        data = read_yaml(find_spec(name))
    except SpecError:
        return False
    return isinstance(data, dict) and ("sweep" in data or "space" in data)


def validated(name: str, overrides: list[str] | tuple[str, ...] = ()) -> tuple[Sweep, int]:
    """A sweep file read and checked as `pipeline sweep` checks it before any trial runs:
    every trial spec (`check`) and the ranking metric; (the sweep, its trials: the grid's
    points with their repeats, or optuna's ``num_samples``)."""
    sweep = load_sweep(name, overrides)
    points = check(sweep)
    check_metric(sweep, trial_spec(sweep, points[0] if points else sweep.first_point(), "check"))
    return sweep, len(points) if points else sweep.section.num_samples
