"""When a version kept in memory may be rebuilt, and what a rebuild that misses its
digest means (`stages.training.resident` replays; this module judges).

A replay is exact on the machine, device and code that made the version. Elsewhere its
last bits may differ, and that says nothing about the result. So a replay that misses
the recorded digest is one line, and changes nothing, unless the process replaying is
the run that made the version, on the machine it recorded, with the code it recorded:
only that run may mark the version damaged (and every version made from it), so that
its next invocation computes them anew. Readers never write, as in Delta or Iceberg
tables: a read from another machine, another thread count or another program
(`pipeline score`) is told what differs and how to read the version, and the catalog
stays as it was.
"""

from __future__ import annotations

import functools
import os
from typing import Any, NoReturn

from catalog.datasets import ArtifactRef
from common import live, machine
from common.errors import CatalogError


def replay_exact(cfg: Any) -> bool:
    """Whether applying an update again reproduces its weights bit for bit, so that a
    version may be kept in memory and rebuilt from its recipe: on CPUs yes (tested); on
    GPUs only with deterministic kernels (`torch.use_deterministic_algorithms(True)`,
    and ``CUBLAS_WORKSPACE_CONFIG`` set), since CUDA's attention and embedding backward
    passes are not deterministic. Where it is not, every version is stored whole: a
    resume, a lost worker group or another process reads it, never replays it."""
    if not cfg.optim.use_gpu:
        return True
    import torch

    return torch.are_deterministic_algorithms_enabled() and bool(os.environ.get("CUBLAS_WORKSPACE_CONFIG"))


def device_kind(cfg: Any) -> str:
    """What a recipe records of the device that made its version: "cpu" or "cuda"."""
    return "cuda" if cfg.optim.use_gpu else "cpu"


@functools.cache
def update_code() -> str:
    """The fingerprint of the update stage's code (`common.code`), as a recipe records it
    (once a process: the code imported does not change under it)."""
    from common.code import fingerprint

    return fingerprint("stages.update")


def refuse(catalog: Any, policy: ArtifactRef, recipe: dict[str, Any], got: str, want: str, cfg: Any) -> NoReturn:
    """Raise the one-line `CatalogError` of a replay of `policy` that gave weights of
    digest `got` where `want` was recorded (module docstring): what differs, and the
    damage mark only where the run that made it replays it as it made it."""
    head = (
        f"result {policy.address}: the rebuilt weights differ from those the run recorded "
        f"(sha256 {got[:12]}, recorded {want[:12]})"
    )
    made_by, now = recipe.get("code"), update_code()
    if made_by and made_by != now:
        raise CatalogError(
            f"{head}: the update's code has changed since it was made (code {made_by[:12]}, now {now[:12]}); "
            "read it with the code that made it, or run the pipeline again (the current code's updates have "
            "keys of their own)"
        )
    made_on, device = recipe.get("device", "cpu"), device_kind(cfg)
    if made_on != device:
        raise CatalogError(
            f"{head}: it was made on {made_on} and is replayed on {device}, whose kernels compute other floats; "
            f"rebuild it on {made_on} (update.optim.use_gpu as the run had it), or run the pipeline again"
        )
    differs = machine.differences(recipe.get("machine"), machine.recorded())
    if differs:
        shown = "; ".join(f"{k}: {a} there, {b} here" for k, a, b in differs[:4])
        raise CatalogError(
            f"{head}: it was made on another kind of machine ({shown}), whose floats this one does not reproduce; "
            "nothing is marked. Read it where it was made, or store every version of a catalog meant to be read "
            "elsewhere (-o update.checkpoint_every=1)"
        )
    writer, reader = recipe.get("run"), live.current().name
    if writer is None or writer != reader:
        raise CatalogError(
            f"{head}: replayed by {'this process' if reader == 'ambient' else f'run {reader!r}'}, not by the run "
            f"that made it ({writer or 'unrecorded'}); nothing is marked. Run that pipeline again: its own replay "
            "decides, and marks the version damaged if it cannot reproduce it"
        )
    marked = mark_unrebuildable(catalog, policy, "cannot be rebuilt: the replay of its updates is not exact")
    raise CatalogError(
        f"{head}: the replay of its updates is not exact on the machine that made it. It and the "
        f"{len(marked) - 1} version(s) made from it are marked damaged: run the pipeline again and their updates "
        "are computed anew (add -o update.checkpoint_every=1 to store every version whole, so that none needs "
        "a rebuild)"
    )


def mark_unrebuildable(catalog: Any, policy: ArtifactRef, why: str) -> list[str]:
    """Mark `policy` damaged (`pipeline verify`'s mark: readers skip it and the next run
    that needs it computes it again), and every resident version whose recipe descends
    from it, which could only be rebuilt from it; the keys marked."""
    children: dict[str, list[str]] = {}
    for key in catalog.result_keys():
        if not key.startswith("update-"):
            continue
        try:
            ref = catalog.at(f"{key}/{policy.output}")
            info = ref.resident() if isinstance(ref, ArtifactRef) else None
        except (CatalogError, OSError, ValueError):
            continue
        parent = (info or {}).get("rebuild", {}).get("policy")
        if isinstance(parent, str):
            children.setdefault(parent.split("/", 1)[0], []).append(key)
    marked, todo = [], [policy.key]
    while todo:
        key = todo.pop()
        if key in marked:
            continue
        marked.append(key)
        catalog.mark_damaged(key, [why if key == policy.key else f"made from {policy.key}, which {why}"])
        todo += children.get(key, [])
    return marked
