"""The policy's trainer for the run: the model and its optimiser state stay in memory
between updates, and only the versions something reads from storage are stored.

An update with ``optim.workers: 0`` and a full fine-tune (no LoRA) trains the run's
*resident trainer*: the first update loads the policy it starts from and its AdamW
state, and every later one continues from what the trainer holds. The update then
commits its result under its usual key in one of two forms:

- **stored whole** (``ctx.store``, the runner's decision: every
  ``update.checkpoint_every`` versions, the last update of a run or a selection, and
  wherever a stage reads the policy from storage, such as eval or mutual_info): the
  checkpoint and its optimiser state, as before;
- **resident**: ``policy.json`` and ``resident.json`` only (a few hundred bytes): the
  digest of the weights (`weights_digest`) and the recipe that made them (the policy it
  started from, the batch, the reference, the update's settings and seed).

New weights reach the engines from memory (`engine_policy`: the same process reads
them, engine actors get them through Ray's object store), never through the catalog.
A resident version that the trainer no longer holds (after a crash, a SIGKILL, or in
another process) is rebuilt: the nearest stored ancestor is loaded with its optimiser
state and the updates since it are applied again from their batches, which the catalog
keeps under their keys; the rebuilt weights must have the recorded digest, so a
rebuild is exact or fails in one line. `ArtifactRef.local_path()` of a resident policy
(`pipeline score`, mutual_info, anything that reads files) writes the rebuilt
checkpoint into the artifact cache and returns it.

The trainer of either kind (in this process, or a worker group) is `stages.training.trainers`;
this module keeps the run's one trainer, commits, publishes and rebuilds its versions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from catalog.datasets import RESIDENT_FILE, RESOLVERS, ArtifactRef, TableRef, cache_folder
from catalog.fs import shared
from catalog.keys import canonical, from_canonical
from common import live, machine
from stages.engines.hosts import MEMORY, Weights
from stages.training import rebuild
from stages.training.fit import WORKER_RESTARTS, check_state_kept
from stages.training.loops import ActorSettings
from stages.training.trainers import GroupTrainer, Resident, Trainer

#: `RESIDENT_FILE`'s kind for a policy
KIND = "policy"
#: the columns an update reads of its batch
COLUMNS = ["token_ids", "loss_mask", "logprobs", "advantages", "temperature", "segments"]
#: policy versions whose weights are kept for the engines: the newest and the one before (a rollout
#: wired policy@prev:2 reads it while the next update trains; an older one is rebuilt)
PUBLISHED = 2

_LOCK = threading.RLock()
_CONFIG: list[type] = []  # the update's config class, to rebuild a recipe's settings (`register`)


def register(config: type) -> None:
    """Called by the update stage's module: its config class (to read a recipe's
    settings back) and the resolver of resident policies (`catalog.datasets.RESOLVERS`)."""
    _CONFIG[:] = [config]
    RESOLVERS[KIND] = materialize
    MEMORY[KIND] = engine_policy


def supports(cfg: ActorSettings, policy: ArtifactRef) -> bool:
    """Whether an update with `cfg` from `policy` trains the resident trainer: replicas
    of the whole model (``strategy: ddp``, no LoRA adapter), in this process or on a
    worker group kept for the run. The others (FSDP, LoRA) run a Ray Train fit from the
    stored policy and store every version."""
    from stages.models.lora import settings_of

    if cfg.optim.strategy != "ddp":
        return False
    held = _held_now().trainer
    if held is not None and held.held.address == policy.address:  # held already: nothing to read
        return True
    return policy.resident() is not None or settings_of(policy.stored_path()) is None


def _stub(trainer: Resident, out: Path, recipe: dict[str, Any]) -> None:
    """The resident form of the held version into `out` (module docstring)."""
    from stages.models.policy import POLICY_FILE

    held = trainer.held
    out.mkdir(parents=True, exist_ok=True)
    (out / POLICY_FILE).write_text(
        json.dumps({"version": held.version, "parent": held.parent}, indent=1, sort_keys=True)
    )
    info = {"kind": KIND, "weights": trainer.digest(), "base": held.base.address, "rebuild": recipe}
    (out / RESIDENT_FILE).write_text(json.dumps(info, indent=1, sort_keys=True))


@dataclass
class _Held:
    """The run's slot (`common.live`): its trainer, and the versions it published for
    the engines, by root URI and address."""

    trainer: Resident | None = None
    weights: OrderedDict[str, Weights] = dataclasses.field(default_factory=OrderedDict)

    def close(self) -> None:
        trainer, self.trainer = self.trainer, None
        if trainer is not None:
            trainer.close()
        self.weights.clear()


def _held_now() -> _Held:
    return live.slot("resident trainer", _Held)


def release() -> None:
    """Forget the trainer (a worker group is shut down) and the published weights (a
    run ended: every version it needs later is stored or can be rebuilt)."""
    with _LOCK:
        _held_now().close()


def _config(recipe: dict[str, Any]) -> Any:
    if not _CONFIG:  # `register` is called when the update stage is imported (with every stage: `import stages`)
        raise RuntimeError("the update stage is not imported: import stages first")
    return from_canonical(_CONFIG[0], recipe["config"])


def _shape(cfg: ActorSettings) -> tuple[int, bool]:
    return cfg.optim.workers, cfg.optim.use_gpu


def bring(policy: ArtifactRef, cfg: ActorSettings) -> Resident:
    """The run's trainer holding `policy`, of the kind `cfg` asks for (in this process,
    or a worker group of its size): the live one if it does; else the stored policy
    loaded, or a resident one rebuilt from its nearest stored ancestor (module
    docstring). It becomes the live trainer."""
    with _LOCK:
        held = _held_now().trainer
        if held is not None:
            same_root = held.held.base.root.uri == policy.root.uri
            if held.held.address == policy.address and same_root and held.shape == _shape(cfg):
                return held
        info = policy.resident()
        if info is None:
            check_state_kept(policy, cfg.optim)
            release()
            trainer: Resident = (GroupTrainer if cfg.optim.workers else Trainer).load(policy, cfg)
        else:
            trainer = _rebuild(policy, info, cfg)
        _held_now().trainer = trainer
        return trainer


def _rebuild(policy: ArtifactRef, info: dict[str, Any], cfg: ActorSettings) -> Resident:
    """Apply the recipe of the resident `policy` again on its parent (rebuilt first if
    it is resident too), on a trainer of the kind `cfg` asks for, and check the weights
    against the recorded digest."""
    from catalog.store import Catalog

    recipe = info["rebuild"]
    catalog = Catalog(policy.root)
    made = _config(recipe)
    parent = catalog.at(recipe["policy"])
    reference = catalog.at(recipe["reference"])
    batch = catalog.at(recipe["batch"])
    assert isinstance(parent, ArtifactRef) and isinstance(reference, ArtifactRef) and isinstance(batch, TableRef)
    trainer = bring(parent, cfg)
    machine.pin_threads()  # as the run that made it computed (outside a run too: `pipeline score`)
    table = read_batch(batch, made)
    if table.num_rows:
        trainer.apply(made, table, reference, int(recipe["seed"]), policy.key, None)
    trainer.held.moved(policy.key)
    got = trainer.digest()
    if got != info["weights"]:
        release()
        rebuild.refuse(catalog, policy, recipe, got, info["weights"], cfg)
    return trainer


def read_batch(batch: TableRef, cfg: ActorSettings) -> Any:
    """The per-sample rows an update trains on."""
    from stages.models.batching import per_sample

    stale = cfg.correction == "decoupled"
    return per_sample(batch.read(columns=COLUMNS + (["staleness"] if stale else [])))


def update(
    ctx: Any,
    cfg: ActorSettings,
    policy: ArtifactRef,
    reference: ArtifactRef,
    batch: TableRef,
    out: Path,
) -> dict[str, float]:
    """The `update` stage on the resident trainer: train, then commit the next version
    into `out`, whole when ``ctx.store``, else in its resident form; publish its
    weights. A worker group that loses a member is started again and brought back to
    `policy` (`WORKER_RESTARTS` times at most): the same result."""
    from stages.training.group import GroupLost

    table = read_batch(batch, cfg)
    restarts, state = 0, 0.0  # state: seconds loading, rebuilding, storing and publishing the policy
    if cfg.optim.workers:
        ctx.ray()  # the run's Ray session (its cluster), before a worker group starts in it
    with _LOCK:
        while True:
            try:
                t0 = time.perf_counter()
                trainer = bring(policy, cfg)
                state += time.perf_counter() - t0
                metrics = trainer.apply(cfg, table, reference, ctx.step_seed, ctx.key, ctx) if table.num_rows else {}
                # storing and publishing inside the restart too: a member lost while it saves or hands over its
                # weights loses the group as one lost while training does
                t0 = time.perf_counter()
                trainer.held.moved(ctx.key)
                _commit(trainer, ctx, cfg, policy, reference, batch, out)
                _publish(trainer, policy.root.uri)
                state += time.perf_counter() - t0
                break
            except GroupLost as lost:
                release()
                shutil.rmtree(out, ignore_errors=True)  # what a lost save left: the update is run again
                out.mkdir(parents=True, exist_ok=True)
                if restarts == WORKER_RESTARTS:
                    raise
                restarts += 1
                ctx.warn(
                    f"{lost}; the worker group was restarted on the nodes left, brought back to the update's "
                    "starting policy, and the update ran again from the same policy, batch and seed",
                    "perf/worker_restarts",
                    float(restarts),
                )
            except BaseException:
                release()  # half an update: the held weights are of no version
                raise
        for rank, where in enumerate(trainer.places()):
            ctx.place("worker", rank, where, None)
    return {"actor/tokens": 0.0, **metrics, "perf/worker_restarts": float(restarts), "perf/state_seconds": state}


def _commit(
    trainer: Resident,
    ctx: Any,
    cfg: ActorSettings,
    policy: ArtifactRef,
    reference: ArtifactRef,
    batch: TableRef,
    out: Path,
) -> None:
    """Write the new version into `out`: whole when ``ctx.store`` or where a replay of
    the update would not be exact (`rebuild.replay_exact`), else its resident form."""
    if ctx.store or not rebuild.replay_exact(cfg):
        trainer.save(out, cfg.optim.keep_optimizer)
        return
    recipe = {
        "policy": policy.address,
        "reference": reference.address,
        "batch": batch.address,
        "config": canonical(cfg),
        "seed": ctx.step_seed,
        "code": rebuild.update_code(),
        "device": rebuild.device_kind(cfg),
        "run": ctx.run,  # the one run whose failed replay may mark the version damaged (`rebuild.refuse`)
        "machine": machine.recorded(),  # what a reader elsewhere is told differs
    }
    _stub(trainer, out, recipe)


def _publish(trainer: Resident, root: str) -> Weights:
    """A copy of the trainer's weights for the engines (the last `PUBLISHED` versions)."""
    name = f"{root}/{trainer.held.address}"
    published = _held_now().weights
    if name not in published:
        published[name] = Weights(
            name=name, version=trainer.held.version, base=trainer.held.base, state=trainer.state()
        )
        while len(published) > PUBLISHED:
            published.popitem(last=False)
    return published[name]


def engine_policy(policy: ArtifactRef, tensors: bool) -> Weights | None:
    """The weights of `policy` from memory for an engine that takes `tensors`: a version
    the trainer published, or a resident one rebuilt (no trainer here holds it); None
    for a stored version the trainer did not publish (the engine reads its checkpoint).
    An engine that loads files (vLLM on CPU) gets the rebuilt checkpoint (`materialize`), made
    here, once, before the engine actors ask for it: an actor on this machine finds it
    made (from the trainer this process holds) and does not rebuild the chain itself.
    (An actor on another node, with a remote catalog, still makes its own copy.)"""
    if not tensors:
        info = policy.resident()
        if info is not None and info.get("kind") == KIND:
            materialize(policy, info)
        return None
    name = f"{policy.root.uri}/{policy.address}"
    got = _held_now().weights.get(name)  # without the lock: a stale rollout runs beside the update that holds it
    if got is not None:
        return got
    with _LOCK:
        if name in _held_now().weights:
            return _held_now().weights[name]
        info = policy.resident()
        if info is None:
            return None
        return _publish(bring(policy, _config(info["rebuild"])), policy.root.uri)


def materialize(policy: ArtifactRef, info: dict[str, Any] | None = None) -> Path:
    """The whole checkpoint of the resident `policy` and its optimiser state (rebuilt when
    no trainer here holds it): what `ArtifactRef.local_path()` returns for it. `info` is
    its resident file, where the caller has read it already.
    It is written beside the catalog's staged results for a local catalog (disposable:
    `pipeline gc` removes it once it is old), else into the artifact cache."""
    info = info if info is not None else policy.resident()
    assert info is not None
    # named after the resident file: a result computed again under the same key is rebuilt again
    tag = hashlib.sha256(json.dumps(info, sort_keys=True).encode()).hexdigest()[:16]
    if policy.root.is_local:  # beside the catalog's staged results: `pipeline gc` removes it once it is old
        folder = Path(policy.root.path("_staging", f"{policy.key}.rebuilt-{tag}", policy.output))
    else:
        folder = cache_folder(policy.root.uri, policy.key) / f"{policy.output}.rebuilt-{tag}"
    if folder.is_dir():
        return folder
    with _LOCK:
        trainer = bring(policy, _config(info["rebuild"]))
        folder.parent.mkdir(parents=True, exist_ok=True)
        part = Path(tempfile.mkdtemp(prefix=f".{policy.output}.", dir=folder.parent))
        try:
            trainer.save(part, keep_optimizer=True)  # a Ray Train fit may continue from it
            shared(part)
            try:
                part.rename(folder)
            except OSError:
                if not folder.is_dir():  # another process made it first (the same weights: checked by digest)
                    raise
        finally:
            shutil.rmtree(part, ignore_errors=True)
    return folder


@contextlib.contextmanager
def loaded(policy: ArtifactRef) -> Iterator[Any]:
    """The stored (or rebuilt) `policy` as a model in eval mode, for a Ray Train fit's
    proximal log-probabilities (`proximal_logprobs`)."""
    from stages.models.policy import load_model

    yield load_model(policy.local_path(), dtype="float32").eval()
