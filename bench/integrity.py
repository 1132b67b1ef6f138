"""What checking every byte costs: the SHA-256 of a step's cached inputs (`pipelines.run.steps`)
against writing them, which the stage that made them did anyway.

- the policy folder as the update stage writes it (safetensors weights, tokenizer, the AdamW
  state beside it), for the embedded default model and for SmolLM2-135M-Instruct (packaged):
  hashing every file (`catalog.manifests.file_sha256`, what `Catalog.check(full=True)` does)
  against writing the folder (`save_policy` and `torch.save` of the optimiser state);
- a rollout table of the default's size (128 trajectories of 2,048 tokens, random ids):
  hashing against reading it back (`TableRef.read`, Parquet page checksums verified) and
  against writing it (`ResultWriter.commit`).

A run hashes a result once, and only when it was not written by that run (a resume, or a
result another run made): a run that computes everything hashes nothing. These ratios are
what a resume's first step pays per input.

    python bench/integrity.py          # about 30 s here
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa
import torch

from catalog.datasets import Table
from catalog.manifests import file_sha256
from catalog.store import Catalog
from common.recording import fastest
from stages.models.policy import save_policy

MODEL = "smollm2-135m-instruct"


def hash_folder(folder: Path) -> None:
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            file_sha256(p)


def policy_folder(tmp: Path, name: str) -> tuple[float, float, int]:
    """(hash seconds, write seconds, bytes) of a policy folder with its optimiser state."""
    from stages.agent.corpus import embedded_model
    from stages.models.gguf_file import load_gguf
    from stages.models.packaged import fetch
    from stages.models.policy import EmbeddedModel
    from stages.models.turns import fix_tokenizer
    from stages.training.fit import OPTIMIZER_FILE

    if name == "embedded":
        model, tokenizer = embedded_model(EmbeddedModel(), seed=0)
    else:
        model, tokenizer = load_gguf(fetch(name))
        fix_tokenizer(tokenizer, model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    folder = tmp / name

    def write() -> None:
        save_policy(model, tokenizer, folder, version=1, base=name)
        torch.save(opt.state_dict(), folder / OPTIMIZER_FILE)

    wrote = fastest(write)
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    return fastest(lambda: hash_folder(folder)), wrote, size


def table(tmp: Path) -> tuple[float, float, float, int]:
    """(hash seconds, read seconds, write seconds, bytes) of a rollout-sized table in a catalog."""
    import numpy as np

    rng = np.random.default_rng(0)
    rows, width = 128, 2048
    data = pa.table(
        {
            "token_ids": [rng.integers(0, 50_000, width).tolist() for _ in range(rows)],
            "logprobs": [rng.normal(-1, 1, width).tolist() for _ in range(rows)],
            "loss_mask": [rng.integers(0, 2, width).tolist() for _ in range(rows)],
        }
    )
    catalog = Catalog(str(tmp / "catalog"))
    n = [0]

    def write() -> None:
        n[0] += 1
        catalog.writer(f"bench-{n[0]}", {"t": Table()}).commit({"t": data}, {}, {"stage": "bench", "inputs": {}})

    wrote = fastest(write)
    key = f"bench-{n[0]}"
    ref = catalog.ref(key, "t")
    size = sum(p.stat().st_size for p in Path(catalog.root.path("results", key)).rglob("*") if p.is_file())
    return fastest(lambda: catalog.check(key, full=True)), fastest(ref.read), wrote, size  # type: ignore[union-attr]


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-integrity-") as tmp:
        policies = [(name, *policy_folder(Path(tmp), name)) for name in ("embedded", MODEL)]
        hashed, read, wrote, size = table(Path(tmp))
    print("| what | bytes | hash every byte | write it | hash / write |")
    print("|---|---|---|---|---|")
    for name, h, w, n in policies:
        print(f"| policy + AdamW state, {name} | {n / 2**20:,.1f} MiB | {h:.3f} s | {w:.3f} s | {h / w:.2f}x |")
    print(
        f"| rollout table, 128 x 2,048 tokens | {size / 2**20:,.1f} MiB | {hashed:.3f} s | {wrote:.3f} s "
        f"| {hashed / wrote:.2f}x (read with page checksums: {read:.3f} s) |"
    )


if __name__ == "__main__":
    main()
