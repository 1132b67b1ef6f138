"""Token batches between the catalog's flat Arrow lists and padded tensors.

A trajectory's token columns are Arrow lists; the forward passes (critic values in
the advantage stage, the actor and critic updates) want right-padded tensors.
`padded` / `unpadded` convert from and to the flat values without Python lists;
`per_sample` cuts trajectories made of several samples (history windows) into one
row per sample.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def lengths(table: pa.Table) -> np.ndarray:
    """Tokens per trajectory, without materialising the token lists."""
    return pc.list_value_length(table.column("token_ids")).to_numpy(zero_copy_only=False)


#: list columns with one entry per token of a trajectory (split by `per_sample`)
TOKEN_COLUMNS = ("token_ids", "loss_mask", "logprobs", "advantages", "values", "returns")


def sample_lengths(table: pa.Table) -> list[list[int]]:
    """Each trajectory's sample lengths (`segments`; one sample of the whole sequence
    where it is null, as in trajectories stored before the column and replayed)."""
    sizes = lengths(table).tolist()
    return [s if s else [n] for s, n in zip(table.column("segments").to_pylist(), sizes)]


def per_sample(table: pa.Table) -> pa.Table:
    """One row per training sample: a trajectory whose prompts hold a history window
    (`stages.agent.loop`) is several samples laid end to end; each token column is
    re-cut at the sample boundaries (the flat values are shared, not copied) and the
    other columns repeat. A table of whole-chat trajectories comes back as it is."""
    segs = sample_lengths(table)
    counts = np.array([len(s) for s in segs])
    if (counts == 1).all():
        return table
    offsets = pa.array(np.concatenate([[0], np.cumsum([n for s in segs for n in s])]).astype(np.int32))
    rows = pa.array(np.repeat(np.arange(table.num_rows), counts))
    columns = {}
    for name in table.column_names:
        col = table.column(name).combine_chunks()
        if name not in TOKEN_COLUMNS:
            columns[name] = col.take(rows)
        elif col.null_count == len(col):
            columns[name] = pa.nulls(len(rows), col.type)
        else:
            columns[name] = pa.ListArray.from_arrays(offsets, pc.list_flatten(col)).cast(col.type)
    columns["segments"] = pa.array([[n] for s in segs for n in s], table.schema.field("segments").type)
    return pa.table(columns)


def padded(table: pa.Table, rows: np.ndarray, columns: dict[str, Any]) -> dict[str, Any]:
    """Right-padded [len(rows), longest] tensors of list columns (name -> dtype),
    plus 'attention' (1 on real tokens); filled from the flat Arrow values (no
    Python lists)."""
    import torch

    take = pa.array(np.asarray(rows, dtype=np.int64))
    sizes = pc.list_value_length(table.column(next(iter(columns))).take(take)).to_numpy(zero_copy_only=False)
    real = np.arange(int(sizes.max()) if len(sizes) else 0)[None, :] < sizes[:, None]
    out = {}
    for c, dtype in columns.items():
        flat = pc.list_flatten(table.column(c).take(take)).to_numpy(zero_copy_only=False)
        grid = torch.zeros(real.shape, dtype=dtype)
        grid[torch.from_numpy(real)] = torch.tensor(flat, dtype=dtype)
        out[c] = grid
    return {**out, "attention": torch.from_numpy(real.astype(np.int64))}


def unpadded(x: Any, sizes: np.ndarray, type: pa.DataType) -> pa.Array:
    """The list column of a right-padded [rows, width] tensor: row i's first sizes[i]
    values (the inverse of `padded`), built from flat values and offsets."""
    real = np.arange(x.shape[1])[None, :] < np.asarray(sizes)[:, None]
    flat = x.detach().cpu().numpy()[real]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat)).cast(type)
