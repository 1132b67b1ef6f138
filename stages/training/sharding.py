"""`optim.strategy: fsdp` (docs/cluster.md): the model sharded over the Ray Train workers
with FSDP2, what that changes in a fit (collective forward passes, the gradients'
scale in `stages.training.fit.step`), and saving a sharded model and its optimiser state
in the form an unsharded one has, so that checkpoints stay plain Hugging Face folders and
resume under either strategy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class OptimConfig(Protocol):
    """What sharding reads of `stages.training.fit.OptimConfig`."""

    @property
    def strategy(self) -> str: ...
    @property
    def keep_optimizer(self) -> bool: ...


def world() -> tuple[int, int]:
    """(this worker's rank, the workers): (0, 1) outside a process group."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def collective_device() -> Any:
    """Where a collective's tensors must live: the GPU under NCCL (which has no CPU
    backend: a CPU tensor raises "No backend type associated with device type cpu"),
    the CPU under gloo."""
    import torch
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and "nccl" in str(dist.get_backend()).lower():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def as_many_as_the_others(micros: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A sharded model's forward and backward are collective: every worker must run as
    many micro-batches as the others. A worker with fewer repeats its last one with no
    sampled token (no loss, no gradient, no weight in the metrics)."""
    import torch
    import torch.distributed as dist

    most = torch.tensor([len(micros)], device=collective_device())  # NCCL takes no CPU tensor
    dist.all_reduce(most, op=dist.ReduceOp.MAX)
    most = most.cpu()
    if not micros and int(most):
        raise RuntimeError("strategy fsdp: a worker got no rows of a mini-batch; use a larger batch or fewer workers")
    empty = [{**micros[-1], "loss_mask": torch.zeros_like(micros[-1]["loss_mask"])}] if micros else []
    return micros + empty * (int(most) - len(micros))


def gather(model: Any, opt: Any, optim: OptimConfig) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(the full weights, the optimiser state) to save, on rank 0 (None elsewhere, and
    for the weights of a model that is not sharded: it saves itself). Collective for a
    sharded model: every worker calls it. The optimiser state has the form
    `opt.state_dict()` gives an unsharded model, whatever the strategy, so a checkpoint
    resumes under either."""
    rank = world()[0]
    if not sharded(model):
        return None, (opt.state_dict() if optim.keep_optimizer and rank == 0 else None)
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = get_model_state_dict(model, options=full)
    by_name: Any = get_optimizer_state_dict(model, opt, options=full) if optim.keep_optimizer else None
    if rank != 0:
        return None, None
    if by_name is None:
        return weights, None
    index = {name: i for i, name in enumerate(_trained_names(model))}
    return weights, {
        "state": {index[name]: s for name, s in by_name["state"].items()},
        "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in by_name["param_groups"]],
    }


def unsharded(build: Callable[[], Any], weights: dict[str, Any]) -> Any:
    """A fresh unsharded model (`build`) holding `weights` (`gather`'s), to save."""
    model = build()
    model.load_state_dict(weights)
    return model


def _trained_names(model: Any) -> list[str]:
    """The names of the parameters `optimizer` optimises, in its order."""
    return [n for n, p in model.named_parameters() if p.requires_grad]


def sharded(model: Any) -> bool:
    """Whether `model` was sharded by `distribute`."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def distribute(model: Any, optim: OptimConfig) -> Any:
    """With ``strategy: fsdp`` on several workers, shard `model` with FSDP2: each module
    that holds parameters of its own becomes a unit (a decoder layer with all it holds;
    modules that share a parameter, such as tied input and output embeddings, one unit
    together), then the decoder around its layers, then the whole model. Every unit
    gathers its parameters when its own forward runs, so the prefix-sharing forward
    (`stages.models.forward`), which calls the decoder and the output head separately,
    works unchanged. Otherwise `model`."""
    if optim.strategy != "fsdp" or world()[1] < 2:
        return model
    from torch.distributed.fsdp import fully_shard

    names = {id(m): n for n, m in model.named_modules()}
    units: list[list[Any]] = []
    taken: set[str] = set()  # names of the modules already inside a unit

    def inside(name: str) -> bool:
        return any(name == t or name.startswith(t + ".") for t in taken)

    decoders = []
    for name, module in model.named_modules():
        if name.endswith(".layers") and hasattr(module, "__len__"):
            for i, layer in enumerate(module):
                units.append([layer])
                taken.add(f"{name}.{i}")
            decoders.append(name.rsplit(".", 1)[0])
    owners: dict[int, list[Any]] = {}  # parameter -> the other modules that hold it directly
    for name, module in model.named_modules():
        if inside(name) or not any(True for _ in module.parameters(recurse=False)):
            continue
        group = next((owners[id(p)] for p in module.parameters(recurse=False) if id(p) in owners), None)
        if group is None:
            group = []
            units.append(group)
        group.append(module)
        for p in module.parameters(recurse=False):
            owners[id(p)] = group
    for unit in units:
        if unit and names.get(id(unit[0]), "") != "":  # the root is sharded last, over what is left
            fully_shard(unit if len(unit) > 1 else unit[0])
    modules = dict(model.named_modules())
    for name in decoders:  # the decoder a forward pass calls first: FSDP's root for that pass
        fully_shard(modules[name])
    fully_shard(model)
    return model


def load_optimizer_state(model: Any, opt: Any, saved: dict[str, Any]) -> None:
    """Load an optimiser state saved by `gather` (indexed as an unsharded AdamW's) into
    the optimiser of a sharded `model`: by parameter name, each worker taking its shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = _trained_names(model)
    by_name: Any = {
        "state": {names[int(i)]: s for i, s in saved["state"].items()},
        "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]} for g in saved["param_groups"]],
    }
    set_optimizer_state_dict(model, opt, by_name, options=StateDictOptions(full_state_dict=True))
