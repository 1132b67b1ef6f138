"""`pipeline export`: stored trajectories as chat data (docs/trajectories.md#export).

Each episode becomes one record: ``messages`` in the OpenAI chat format (system, user,
assistant, and for an agent program's tools the assistant's ``tool_calls`` and ``tool``
results), exactly the text the policy saw and sampled — its token ids decoded with the
tokenizer of the policy that played it and split into messages by that tokenizer's chat
template — and ``metadata``: where it came from (run, iteration, policy version, env and
options, seed, group, sample, split, temperature), its reward and success, whether the
filter kept it for the update, and per turn its reward, the mean advantage of its sampled
tokens (where an advantage stage scored it) and the log-probabilities they were sampled
with. Written as JSON Lines (one episode a line) or as Parquet that Hugging Face
``datasets`` loads as it is; either is what ``warmstart.demonstrations`` reads back.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pyarrow as pa

from catalog.datasets import ArtifactRef, TableRef
from catalog.query import query
from catalog.store import Catalog
from common.errors import UserError
from pipelines.report import formats

#: the JSON Lines shapes written (`pipelines.report.formats`): ours, RAGEN's and ATIF's
SHAPES: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "jsonl": lambda record: record,
    "ragen": formats.ragen,
    "atif": formats.atif,
}
#: the table views whose rows are episodes
VIEWS = ("trajectories", "evals", "demonstrations")
_PROBE = ("\x00S\x00", "\x00U\x00", "\x00A\x00", "\x00V\x00")


@dataclass(frozen=True)
class Filters:
    """Which episodes: of these runs (all when empty), this policy version, success
    (True / False / None: either), split, and a SQL condition of the user's own."""

    runs: tuple[str, ...] = ()
    version: int | None = None
    success: bool | None = None
    split: str | None = None
    where: str | None = None


class Roles:
    """How a chat template writes a message: ``head(role) + content + tail``; learnt
    by rendering a probe chat (the templates of ChatML families: the embedded
    tokenizer's, SmolLM2's and Qwen2.5's)."""

    def __init__(self, tokenizer: Any) -> None:
        roles = ("system", "user", "assistant", "user")
        chat = [{"role": role, "content": mark} for role, mark in zip(roles, _PROBE)]
        pieces, rest = [], tokenizer.apply_chat_template(chat, tokenize=False)
        for mark in _PROBE:  # what the template writes before each message's content
            piece, _, rest = rest.partition(mark)
            pieces.append(piece)
        before, s_u, u_a, a_v = pieces
        self.head = before.replace("system", "{role}") if "system" in before else ""
        user, assistant = self.head.format(role="user"), self.head.format(role="assistant")
        if not self.head or not s_u.endswith(user) or not u_a.endswith(assistant) or a_v != s_u:
            raise UserError(
                "export: the policy's chat template is not one that writes each message as a header, "
                "the content and an end (ChatML and its kin): its chats cannot be split into messages"
            )
        self.tail = s_u[: -len(user)]
        self.heads = {role: self.head.format(role=role) for role in ("system", "user", "assistant", "tool")}

    def split(self, text: str) -> list[dict[str, str]]:
        """The messages of one rendered chat (the last may be an unfinished assistant turn)."""
        out: list[dict[str, str]] = []
        pos = 0
        while True:
            found = [(at, role, h) for role, h in self.heads.items() if (at := text.find(h, pos)) >= 0]
            if not found:
                return out
            at, role, head = min(found)
            start = at + len(head)
            end = text.find(self.tail, start)
            if end < 0:  # the last message, its end not followed by the tail's newline (or cut short)
                end = len(text)
                closing = self.tail.rstrip()
                if closing and text.endswith(closing, start):
                    end -= len(closing)
            out.append({"role": role, "content": text[start:end]})
            pos = end


def _rows(catalog: Catalog, view: str, f: Filters) -> pa.Table:
    if view not in VIEWS:
        raise UserError(f"export: --view {view!r}: expected one of {', '.join(VIEWS)}")
    conditions = []
    if f.runs:
        conditions.append("run in (" + ", ".join("'" + r.replace("'", "''") + "'" for r in f.runs) + ")")
    if f.version is not None:
        conditions.append(f"policy_version = {int(f.version)}")
    if f.success is not None:
        conditions.append(f"success = {'true' if f.success else 'false'}")
    if f.split is not None:
        conditions.append("split = '" + f.split.replace("'", "''") + "'")
    if f.where:
        conditions.append(f"({f.where})")
    sql = f"select * from {view}" + (" where " + " and ".join(conditions) if conditions else "")
    return query(catalog, sql + ' order by run, iteration nulls first, policy_version, seed, "group", sample')


def _stored(catalog: Catalog, key: str) -> Path:
    """The folder of a stored policy with its tokenizer: a resident version's base."""
    ref = catalog.ref(key, "policy")
    info = ref.resident() if isinstance(ref, ArtifactRef) else None
    while info is not None:
        ref = catalog.at(info["base"])
        info = ref.resident() if isinstance(ref, ArtifactRef) else None
    if not isinstance(ref, ArtifactRef):
        raise UserError(f"export: policy {key} is not a stored policy")
    return ref.stored_path()


def _played_by(catalog: Catalog, key: str) -> str | None:
    """The key of the step that played the trajectories a step's result was made from:
    its ``trajectories`` input followed back (an advantage reads a filter's kept rows, a
    filter reads a rollout's slice) to a result that reads none."""
    for _ in range(8):
        source = (catalog.manifest(key).get("inputs") or {}).get("trajectories") if catalog.has(key) else None
        if not isinstance(source, str):
            return key
        key = source.split("/")[0]
    return None


def _advantages(catalog: Catalog, wanted: set[tuple[str, int]]) -> dict[tuple[str, int, int, int], list[float]]:
    """(run, iteration, group, sample) -> per-token advantages of the episodes played at
    (run, iteration) in `wanted`, read from every advantage step of those runs that
    scored them: with Online-k a rollout's groups are scored at later iterations too."""
    if not wanted:
        return {}
    quoted = ", ".join("'" + r.replace("'", "''") + "'" for r in {run for run, _ in wanted})
    steps = query(catalog, f"select run, iteration, stage, key from steps where run in ({quoted})").to_pylist()
    played: dict[tuple[str, str], int] = {}  # a rollout's key -> the iteration its rows are under (its first)
    for s in steps:
        if (s["run"], s["iteration"]) in wanted:
            k = (s["run"], s["key"])
            played[k] = min(played.get(k, s["iteration"]), s["iteration"])
    earliest: dict[str, int] = {}  # a run's first iteration exported: no step before it scored its episodes
    for run, i in wanted:
        if i is not None:
            earliest[run] = min(earliest.get(run, i), i)
    out: dict[tuple[str, int, int, int], list[float]] = {}
    for step in steps:
        if step["stage"] != "advantage" or step["iteration"] is None:
            continue
        if step["iteration"] < earliest.get(step["run"], 0) or not catalog.has(step["key"]):
            continue
        source = _played_by(catalog, step["key"])
        iteration = played.get((step["run"], source)) if source is not None else None
        ref = catalog.ref(step["key"], "batch")
        if iteration is None or not isinstance(ref, TableRef):
            continue
        for row in ref.read(columns=["group", "sample", "advantages"]).to_pylist():
            out[(step["run"], iteration, row["group"], row["sample"])] = row["advantages"]
    return out


def _runs_of(mask: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of 1s in `mask`: the sampled responses, in order."""
    out, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out


def _with_tools(messages: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Assistant messages' ``<tool_call>`` blocks as ``tool_calls``; a user message made
    of ``<tool_response>`` blocks as the ``tool`` messages answering them."""
    import re

    from stages.endpoint.rendering import read_calls

    out: list[dict[str, Any]] = []
    open_calls: list[str] = []
    for k, m in enumerate(messages):
        if m["role"] == "assistant" and "<tool_call>" in m["content"]:
            content, calls, parsed = read_calls(m["content"])
            if parsed and calls:
                ids = [f"call_{k}_{j}" for j in range(len(calls))]
                out.append(
                    {
                        "role": "assistant",
                        "content": content,
                        "tool_calls": [
                            {
                                "id": i,
                                "type": "function",
                                "function": {
                                    "name": c["function"]["name"],
                                    "arguments": json.dumps(c["function"]["arguments"]),
                                },
                            }
                            for i, c in zip(ids, calls)
                        ],
                    }
                )
                open_calls = ids
                continue
        results = re.findall(r"<tool_response>\s*(.*?)\s*</tool_response>", m["content"], re.DOTALL)
        if (
            m["role"] == "user"
            and results
            and open_calls
            and not re.sub(r"<tool_response>.*?</tool_response>", "", m["content"], flags=re.DOTALL).strip()
        ):
            for ident, result in zip(open_calls, results):
                out.append({"role": "tool", "tool_call_id": ident, "content": result})
            open_calls = []
            continue
        out.append(dict(m))
        open_calls = []
    return out


def episodes(catalog: Catalog, view: str = "trajectories", filters: Filters = Filters()) -> Iterator[dict[str, Any]]:
    """The chat records of the episodes `filters` selects (module docstring)."""
    from stages.models.policy import load_tokenizer

    table = _rows(catalog, view, filters)
    wanted = set(zip(table.column("run").to_pylist(), table.column("iteration").to_pylist()))
    scored = _advantages(catalog, wanted) if view == "trajectories" else {}

    @cache
    def tokenizer_of(key: str) -> tuple[Any, Roles]:
        tok = load_tokenizer(_stored(catalog, key))
        return tok, Roles(tok)

    for row in table.to_pylist():
        if row.get("token_ids") is None or not row.get("policy_key"):
            continue
        tok, roles = tokenizer_of(row["policy_key"])
        ids, mask, lps = row["token_ids"], row["loss_mask"], row["logprobs"]
        messages: list[dict[str, str]] = []
        start = 0
        for n, length in enumerate(row.get("segments") or [len(ids)]):
            said = roles.split(tok.decode(ids[start : start + length], skip_special_tokens=False))
            # a history window: each later sample repeats the chat's opening; its own turn is its last two
            messages += said if n == 0 else said[-2:]
            start += length
        advantages = scored.get((row["run"], row.get("iteration"), row["group"], row["sample"]))
        sampled = _runs_of(mask)
        turns = []
        for k, t in enumerate(row.get("turns") or []):
            a, b = sampled[k] if k < len(sampled) else (0, 0)
            adv = advantages[a:b] if advantages is not None and b > a else None
            turns.append(
                {
                    "turn": t["turn"],
                    "reward": t["reward"],
                    "format_ok": t["format_ok"],
                    "advantage": sum(adv) / len(adv) if adv else None,
                    "logprobs": [float(x) for x in lps[a:b]],
                }
            )
        yield {
            "messages": _with_tools(messages),
            "metadata": {
                "run": row["run"],
                "view": view,
                "iteration": row.get("iteration"),
                "policy_version": row.get("policy_version"),
                "env": row["env"],
                "env_options": row.get("env_options") or "{}",
                "seed": row["seed"],
                "group": row["group"],
                "sample": row["sample"],
                "split": row["split"],
                "temperature": row.get("temperature"),
                "reward": row["score"],
                "success": row["success"],
                "end_reason": row.get("end_reason"),
                "kept": None if view != "trajectories" else advantages is not None,
                "turns": turns,
            },
        }


def write(records: Iterator[dict[str, Any]], out: Path, kind: str) -> int:
    """Write `records` to `out` as ``jsonl`` or ``parquet``, atomically; how many."""
    import os

    if out.name in ("", ".", "..") or out.is_dir():
        raise UserError(f"export: OUT '{out}' is a folder; expected a file to write, e.g. {out / 'episodes.jsonl'}")
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(f".{out.name}.part")
    n = 0
    try:
        if kind in SHAPES:
            shape = SHAPES[kind]
            with part.open("w", encoding="utf-8") as f:
                for record in records:
                    f.write(json.dumps(shape(record), ensure_ascii=False) + "\n")
                    n += 1
        elif kind == "parquet":
            import pyarrow.parquet as pq

            rows = [{**r, "messages": [_uniform(m) for m in r["messages"]]} for r in records]
            n = len(rows)
            pq.write_table(pa.Table.from_pylist(rows, schema=_schema()), part)
        else:
            raise UserError(f"export: --format {kind!r}: expected {', '.join([*SHAPES, 'parquet'])}")
        os.replace(part, out)
    finally:
        part.unlink(missing_ok=True)
    return n


def _uniform(message: dict[str, Any]) -> dict[str, Any]:
    """A message with every field of the Parquet schema (None where it has none)."""
    return {
        "role": message["role"],
        "content": message.get("content"),
        "tool_calls": message.get("tool_calls"),
        "tool_call_id": message.get("tool_call_id"),
    }


def _schema() -> pa.Schema:
    call = pa.struct(
        [
            ("id", pa.string()),
            ("type", pa.string()),
            ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())])),
        ]
    )
    message = pa.struct(
        [("role", pa.string()), ("content", pa.string()), ("tool_calls", pa.list_(call)), ("tool_call_id", pa.string())]
    )
    turn = pa.struct(
        [
            ("turn", pa.int64()),
            ("reward", pa.float64()),
            ("format_ok", pa.bool_()),
            ("advantage", pa.float64()),
            ("logprobs", pa.list_(pa.float64())),
        ]
    )
    metadata = pa.struct(
        [
            ("run", pa.string()),
            ("view", pa.string()),
            ("iteration", pa.int64()),
            ("policy_version", pa.int64()),
            ("env", pa.string()),
            ("env_options", pa.string()),
            ("seed", pa.int64()),
            ("group", pa.int64()),
            ("sample", pa.int64()),
            ("split", pa.string()),
            ("temperature", pa.float64()),
            ("reward", pa.float64()),
            ("success", pa.bool_()),
            ("end_reason", pa.string()),
            ("kept", pa.bool_()),
            ("turns", pa.list_(turn)),
        ]
    )
    return pa.schema([("messages", pa.list_(message)), ("metadata", metadata)])
