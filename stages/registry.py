"""Stages: plain typed functions, registered by name.

A stage is declared like this:

    @stage("filter", config=FilterConfig, outputs={"kept": Table(view=None)},
           metrics={"filter/kept_groups": "groups kept after filtering"})
    def filter_groups(ctx: StageContext, cfg: FilterConfig, trajectories: TableRef) -> StageResult:
        ...

The parameters after ``ctx`` and ``cfg`` are the stage's inputs; their annotations
(`TableRef` / `ArtifactRef`) are checked against the producing stage's outputs when a
pipeline is built. An input annotated ``ArtifactRef | None = None`` is optional: when
no stage produces its dataset it is left unwired and the stage gets None (e.g. the
advantage stage without a critic). `wiring` gives the default dataset each input reads (e.g.
``{"policy": "policy@prev"}``: the previous iteration's policy); a spec may rewire.
The stage's code is part of every result key: a change to its module, or to any
module of ours it imports, gives new keys (`common.code`). `version` is part of
them too: bump it when the output changes for the same inputs and the same code
(a library upgrade, a storage format), so stale cached results are not reused. `check` is a cross-node
check run when the spec is loaded: ``check(cfg, pipeline)`` raises `ConfigProblem`
for a combination that cannot work (e.g. a variance filter on groups of one);
`pipeline` is a `Neighbours` view of the other nodes; a check reads no file (`validate`
takes well under a second). `preflight` is a check that must read files (a model's
tokenizer): ``preflight(cfg)`` runs when a run starts, before any step, for every node
with a step to compute, and raises `ConfigProblem` the same way. `period` makes one execution
serve several iterations: with ``period(cfg) == k`` the step of iteration i *is* the
step of iteration k*floor(i/k) (planned with the same key, so it is run once), and
each of those k iterations reads its own 1/k slice of the stage's tables (Online-k
rollouts: the stage must write its rows in k equal, ordered blocks). `sources`
names stored datasets a stage reads beyond its wired inputs (offline replay):
``sources(cfg, catalog)`` returns their addresses when the run is planned, raising
`ConfigProblem` when they are missing or empty; they are part of the result key
(stored results never change, so the key still fixes the content) and reach the
stage as ``ctx.sources``. `host` says where a step computes, for a runner that runs
steps at once (``run.concurrency``): ``host(cfg)`` returns "engine" for a stage played
on the engine actors (a rollout or eval with ``actors >= 1``) and "driver" (the
default) for one that computes in the runner's process; two steps on one host never
overlap. `claims` says what a step holds of the cluster: ``claims(cfg)`` returns `Claim`s
(GPUs and reserved CPUs, held for the run or for the step), which the run's resource plan
adds up and checks against the cluster before anything runs (`pipelines.graph.resources`).

State kept between steps: an output declared ``Artifact(resident=True)`` may be
committed without its large files, which stay in the memory of the process that made
it (the policy between checkpoints: `stages.training.resident`). `store` says when it
must be stored whole: ``store(cfg, iteration)``; the runner also stores it at the last
step of its node and wherever a step reads it through an input not named in
`in_memory` (the inputs that are fed from memory, e.g. the rollout's policy; a tuple,
or ``in_memory(cfg)`` where it depends on the config). Its
key does not depend on whether it is stored, and the stage learns the runner's
decision from ``ctx.store``.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import inspect
import types
import typing
from collections import ChainMap
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import pyarrow as pa

from catalog.datasets import REF_TYPES, ArtifactRef, OutputDecl, Selection, Table, TableRef
from catalog.schemas import TABLE_VIEWS
from common.code import fingerprint

#: Metric namespaces (docs/metrics.md); every metric a stage reports starts with one.
NAMESPACES = (
    "rollout",
    "filter",
    "adv",
    "actor",
    "critic",
    "eval",
    "collapse",
    "template",
    "offpolicy",
    "perf",
    "pretrain",
)


@dataclass
class StageContext:
    """What a running stage may know about where it runs.

    Attributes:
        run: run name; node: the stage's name in the pipeline.
        iteration: 0-based iteration, or None for a once-stage.
        seed: the run seed (derive per-iteration seeds from it and `iteration`).
        key: this result's catalog key.
    """

    run: str
    node: str
    iteration: int | None
    seed: int
    key: str
    _output_dir: Callable[[str], Path]
    _ray: Callable[[], None]
    _log: Callable[[str], None]
    sources: tuple[TableRef, ...] = ()  # the datasets named by the stage's `sources` hook
    _ref: Callable[[str], TableRef | ArtifactRef] | None = None
    _shared: Callable[[], tuple[str, Any] | None] | None = None
    _warn: Callable[[str, str, float], None] | None = None
    _progress: Callable[[int, int, str], None] | None = None
    _place: Callable[[dict[str, Any]], None] | None = None
    store: bool = True  # commit a resident output whole (module docstring); False: its files stay in memory

    def shared_storage(self) -> tuple[str, Any] | None:
        """(path, pyarrow filesystem) of a scratch folder every node of the cluster can
        reach (inside a remote catalog), or None when the catalog is a local folder:
        where Ray Train workers on other machines put their checkpoints."""
        return self._shared() if self._shared is not None else None

    def ref(self, address: str) -> TableRef | ArtifactRef:
        """A committed dataset of the run's catalog by address (``<key>/<output>``)."""
        if self._ref is None:
            raise RuntimeError("this stage context has no catalog")
        return self._ref(address)

    def output_dir(self, name: str) -> Path:
        """A private local folder to write output `name` into (committed on success)."""
        return self._output_dir(name)

    @property
    def step_seed(self) -> int:
        """This step's seed, from the run seed and the iteration (-1 for a once-stage):
        what sampling and shuffling in a stage derive their randomness from."""
        return self.seed * 1_000_003 + (self.iteration if self.iteration is not None else -1)

    def ray(self) -> None:
        """Make sure Ray is initialised (local, or the run's cluster address)."""
        self._ray()

    def log(self, message: str) -> None:
        """A line in the run's live display."""
        self._log(message)

    def progress(self, done: int, total: int, unit: str) -> None:
        """How far a long stage has got (`done` of `total` `unit`, e.g. 300 of 1,500
        "steps"): shown in the run's display with its rate and the time left, and kept
        in the run's record. Call it as often as is natural; the runner throttles it."""
        if self._progress is not None:
            self._progress(done, total, unit)

    def place(self, role: str, index: int, where: Mapping[str, Any], rows: int | None = None) -> None:
        """Say that part of this step ran elsewhere: engine actor or Ray Train worker
        (`role`) number `index`, at `where` (`common.placement.here` in that process),
        having handled `rows` rows. The run's record keeps it with the step (the
        `placement` view); the driver's own place is recorded by the runner."""
        if self._place is not None:
            self._place({"role": role, "index": index, **where, "rows": rows})

    def warn(self, message: str, metric: str = "", value: float = float("nan")) -> None:
        """A warning: a line in the run's display and a row of the run's `events` view
        (`metric`, `value`: what it is about)."""
        if self._warn is not None:
            self._warn(message, metric, value)
        else:
            self._log(message)


@dataclass
class StageResult:
    """What a stage returns: tables for its table outputs (or nothing if it wrote
    the files itself into `ctx.output_dir`) and its metrics."""

    tables: Mapping[str, pa.Table | Selection] = field(default_factory=dict)
    metrics: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Claim:
    """What a step holds of the cluster: `gpus` and reserved `cpus` (Ray's logical
    resources), held for the whole run (`span` "run": an engine pool, a worker group) or
    while the step runs ("step": a Ray Train fit). Claims with the same `pool` are one
    holder, shared, never doubled (an engine pool: the rollout and the eval of the same
    engine settings play on it), so the plan counts it once."""

    holder: str
    gpus: float = 0.0
    cpus: float = 0.0
    span: Literal["run", "step"] = "step"
    pool: str = ""


def engine_claims(settings: Any) -> list[Claim]:
    """The claim of a stage that plays on engine actors (`stages.engines.EngineSettings`):
    the actors' GPUs and reserved CPUs, held for the session by the pool of these settings
    (`stages.engines.hosts.ray_pool`: stages of the same settings share it, others keep
    their own beside it)."""
    if not settings.actors:
        return []
    gpus, cpus = settings.actors * settings.actor_gpus, settings.actors * (settings.actor_cpus or 0.0)
    pool = f"engines:{settings.engine}:{settings.actors}:{settings.actor_cpus}:{settings.actor_gpus}"
    return [Claim(f"{settings.actors} engine actor(s) ({settings.engine})", gpus, cpus, "run", pool)]


def trainer_claims(holder: str, optim: Any, held: bool) -> list[Claim]:
    """The claim of a stage that trains on Ray workers (`stages.training.fit.OptimConfig`):
    `optim.workers` x `optim.gpus` GPUs with `use_gpu`, held for the run by a worker group
    (`held`) or for the step by a Ray Train fit (which also reserves a CPU a worker). In
    this process (0 workers) nothing is reserved."""
    if not optim.workers:
        return []
    gpus = optim.workers * optim.gpus if optim.use_gpu else 0.0
    return [
        Claim(
            f"{holder}: {optim.workers} worker(s)",
            gpus,
            0.0 if held else float(optim.workers),
            "run" if held else "step",
        )
    ]


@dataclass(frozen=True)
class StageDef:
    """A registered stage (see the module docstring)."""

    name: str
    fn: Callable[..., StageResult]
    config: type
    inputs: Mapping[str, type]
    outputs: Mapping[str, OutputDecl]
    metrics: Mapping[str, str]
    wiring: Mapping[str, str]
    version: int
    doc: str
    optional: frozenset[str] = frozenset()
    check: Check | None = None
    period: Callable[[Any], int] | None = None
    sources: Callable[[Any, Any], list[str]] | None = None
    host: Callable[[Any], str] | None = None
    store: Callable[[Any, int | None], bool] | None = None
    in_memory: tuple[str, ...] | Callable[[Any], tuple[str, ...]] = ()
    preflight: Callable[[Any], None] | None = None
    claims: Callable[[Any], list[Claim]] | None = None

    def claims_of(self, cfg: Any) -> list[Claim]:
        """What a step of this stage with config `cfg` holds of the cluster (`claims`)."""
        return list(self.claims(cfg)) if self.claims is not None else []

    def memory_inputs(self, cfg: Any) -> tuple[str, ...]:
        """The inputs a step of this stage with config `cfg` takes from memory (`in_memory`)."""
        return self.in_memory(cfg) if callable(self.in_memory) else self.in_memory

    def host_of(self, cfg: Any) -> str:
        """Where a step of this stage computes: "driver" unless `host` says otherwise."""
        return self.host(cfg) if self.host is not None else "driver"

    @property
    def code(self) -> str:
        """The fingerprint of the stage's code, part of its result keys (`common.code`)."""
        return fingerprint(self.fn.__module__)

    def check_metrics(self, reported: Mapping[str, float]) -> None:
        """Reject metrics the stage did not declare (patterns may use ``*``)."""
        for name in reported:
            if not any(fnmatch.fnmatchcase(name, pat) for pat in self.metrics):
                raise ValueError(f"stage '{self.name}' reported undeclared metric '{name}'")


class Neighbours(Protocol):
    """What a stage's `check` may ask of the pipeline around its node."""

    def upstream(self, stage: str) -> Any | None:
        """Config of the nearest node running `stage` that this node reads from
        (directly or through other nodes), or None."""

    def configs(self, stage: str) -> list[Any]:
        """Configs of every node running `stage`."""

    def wired(self, param: str) -> bool:
        """Whether this node's input `param` is connected."""


Check = Callable[[Any, Neighbours], None]

#: the stages of this package (`stages.*` modules)
BUILT_IN: dict[str, StageDef] = {}
#: stages registered by any other module: a user's (imported before the spec is
#: loaded), the tests'
IMPORTED: dict[str, StageDef] = {}
#: every stage by name, what a spec's ``stage:`` is looked up in
STAGES: ChainMap[str, StageDef] = ChainMap(BUILT_IN, IMPORTED)


def _inputs_of(fn: Callable[..., Any]) -> tuple[dict[str, type], frozenset[str]]:
    """(input -> ref type, the optional inputs) from the function's signature."""
    hints = typing.get_type_hints(fn)
    signature = inspect.signature(fn).parameters
    params = list(signature)
    if params[:2] != ["ctx", "cfg"]:
        raise TypeError(f"stage function {fn.__name__} must start with (ctx, cfg, ...)")
    inputs, optional = {}, set()
    for p in params[2:]:
        hint = hints.get(p)
        args = typing.get_args(hint) if isinstance(hint, types.UnionType) else ()
        if len(args) == 2 and type(None) in args and signature[p].default is None:
            hint = next(a for a in args if a is not type(None))
            optional.add(p)
        if hint not in (TableRef, ArtifactRef):
            raise TypeError(
                f"stage input {fn.__name__}({p}) must be annotated TableRef or ArtifactRef "
                "(or '... | None = None' when optional)"
            )
        inputs[p] = hint
    return inputs, frozenset(optional)


def _origin(fn: Callable[..., Any]) -> tuple[str, str]:
    """Where a function is defined: its source file and qualified name (a module
    imported under two names, e.g. by a spec's ``imports:`` and by a package path,
    defines the same functions)."""
    try:
        source = str(Path(inspect.getsourcefile(fn) or fn.__module__).resolve())
    except TypeError:
        source = fn.__module__
    return source, fn.__qualname__


def stage(
    name: str,
    *,
    config: type,
    outputs: Mapping[str, OutputDecl],
    metrics: Mapping[str, str] | None = None,
    wiring: Mapping[str, str] | None = None,
    version: int = 1,
    check: Check | None = None,
    period: Callable[[Any], int] | None = None,
    sources: Callable[[Any, Any], list[str]] | None = None,
    host: Callable[[Any], str] | None = None,
    store: Callable[[Any, int | None], bool] | None = None,
    in_memory: tuple[str, ...] | Callable[[Any], tuple[str, ...]] = (),
    preflight: Callable[[Any], None] | None = None,
    claims: Callable[[Any], list[Claim]] | None = None,
) -> Callable[[Callable[..., StageResult]], Callable[..., StageResult]]:
    """Register a stage function under `name` (see the module docstring)."""
    if not dataclasses.is_dataclass(config):
        raise TypeError(f"stage '{name}': config must be a dataclass")
    for metric in metrics or {}:
        if metric.split("/", 1)[0] not in NAMESPACES:
            raise TypeError(f"stage '{name}': metric '{metric}' is outside the namespaces {NAMESPACES}")

    def register(fn: Callable[..., StageResult]) -> Callable[..., StageResult]:
        inputs, optional = _inputs_of(fn)
        unknown = set(wiring or {}) - set(inputs)
        if unknown:
            raise TypeError(f"stage '{name}': wiring names unknown inputs {sorted(unknown)}")
        if not callable(in_memory) and set(in_memory) - set(inputs):
            raise TypeError(f"stage '{name}': in_memory names unknown inputs {sorted(set(in_memory) - set(inputs))}")
        taken = STAGES.get(name)
        if taken is not None and _origin(taken.fn) != _origin(fn):  # the same file imported twice is not
            raise TypeError(
                f"stage '{name}' is already registered by {taken.fn.__module__}.{taken.fn.__qualname__}; "
                f"{fn.__module__}.{fn.__qualname__} must use another name"
            )
        registry = BUILT_IN if fn.__module__.split(".")[0] == "stages" else IMPORTED
        for out in outputs.values():  # a declared view exists, empty, until rows arrive
            if isinstance(out, Table) and out.view and out.schema is not None:
                TABLE_VIEWS.setdefault(out.view, out.schema)
        registry[name] = StageDef(
            name=name,
            fn=fn,
            config=config,
            inputs=inputs,
            outputs=dict(outputs),
            metrics={"perf/seconds": "wall time of the stage (s)", **(metrics or {})},
            wiring=dict(wiring or {}),
            version=version,
            doc=inspect.cleandoc(fn.__doc__ or "").split("\n\n")[0],
            optional=optional,
            check=check,
            period=period,
            sources=sources,
            host=host,
            store=store,
            in_memory=in_memory,
            preflight=preflight,
            claims=claims,
        )
        return fn

    return register


def output_ref_type(decl: OutputDecl) -> type:
    """The input annotation that consumes an output of this kind."""
    return REF_TYPES[type(decl)]
