"""Demonstrations of your own: chat transcripts in the OpenAI messages format, one
episode a record, as JSON Lines (``{"messages": [...], ...}`` a line) or as the Parquet
`pipeline export` writes (`pipelines.report.export`), for `warmstart.demonstrations`.

Each record's ``messages`` is a list of ``{"role", "content"}`` objects (roles
``system``, ``developer``, ``user``, ``assistant``, ``tool``; an assistant's
``tool_calls`` are kept as the endpoint reads them) with at least one assistant
message; anything else in a record (``metadata``) is ignored. A transcript is rendered
through the policy's chat template and trained on exactly its assistant messages and the
end-of-turn token that closes each (`chat_sample`), as the rollout's sampled tokens are.
A record that is not one is one error naming the file and the line (or row).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from common import datafile, jsonl
from stages.endpoint.messages import Refused, normalise
from stages.endpoint.rendering import Template

#: transcripts read from one file at most
MAX_TRANSCRIPTS = 1_000_000


def read(path: str, expect: str | None = None) -> tuple[str, list[list[dict[str, Any]]]]:
    """(the file's content hash, every transcript of `path`, normalised), both from one
    read (`common.datafile`); ValueError naming the file and the line. With `expect`
    (the hash the run planned with), a file edited since fails."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"path '{path}': no such file")
    return datafile.load(file, functools.partial(_read, path=path), expect, variant=path)


def _read(data: bytes, path: str) -> list[list[dict[str, Any]]]:
    file = Path(path)
    if file.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            records = pq.read_table(pa.BufferReader(data), columns=["messages"]).to_pylist()
        except Exception as exc:  # the user's file: whatever pyarrow says, one line
            raise ValueError(
                f"path '{path}': not a Parquet file with a messages column ({type(exc).__name__})"
            ) from None
        lines = [(f"row {n}", r) for n, r in enumerate(records, 1)]
    else:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"path '{path}': cannot be read ({type(exc).__name__})") from None
        lines = []
        for n, line in enumerate(jsonl.lines(text), 1):
            if not line.strip():
                continue
            try:
                lines.append((f"line {n}", json.loads(line)))
            except json.JSONDecodeError as exc:
                raise ValueError(f"path '{path}' line {n}: not JSON ({exc.msg})") from None
    if not lines:
        raise ValueError(f"path '{path}': no transcript in it")
    if len(lines) > MAX_TRANSCRIPTS:
        raise ValueError(f"path '{path}': more than {MAX_TRANSCRIPTS:,} transcripts")
    return [_transcript(record, f"path '{path}' {where}") for where, record in lines]


def _transcript(record: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(record, dict) and str(record.get("schema_version", "")).startswith("ATIF-"):
        record = {"messages": atif_messages(record)}  # an ATIF trajectory: its steps as messages
    messages = record.get("messages") if isinstance(record, dict) else None
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: expected an object with a non-empty list 'messages'")
    out = []
    for k, message in enumerate(messages):
        if isinstance(message, dict):  # Parquet's unused fields come back as nulls
            message = {key: value for key, value in message.items() if value is not None}
        try:
            normal = normalise(message, k)
        except Refused as exc:
            raise ValueError(f"{where}: {exc.message}") from None
        if normal["role"] == "assistant" and not normal["content"] and not normal.get("tool_calls"):
            raise ValueError(f"{where}: messages[{k}]: an assistant message with nothing in it")
        out.append(normal)
    if not any(m["role"] == "assistant" for m in out):
        raise ValueError(f"{where}: no assistant message to learn from")
    return out


def chat_sample(
    messages: list[dict[str, Any]], template: Template, prefix: str = ""
) -> tuple[list[int], list[int], int]:
    """The transcript's token ids through the chat template (`Template`, made once for
    the policy's tokenizer), and its loss mask: 1 on each assistant message's tokens and
    the end-of-turn token after it. An assistant message that starts with `prefix` (the
    agent loop's generation prefix, ``<answer>`` or ``<think>``, which the loop writes into
    the prompt) has it outside the mask, so the tokens trained are laid out as the
    rollout's sampled ones. The third value counts the assistant turns left unlearnt:
    where the template does not extend token-wise, a turn's tokens are not the model's."""
    tokenizer = template.tokenizer
    eos = tokenizer.eos_token_id
    ids = tokenizer.encode(template.render(messages, (), False), add_special_tokens=False)
    mask = [0] * len(ids)
    skipped = 0
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        opening = template.render(messages[:k], (), True)
        if prefix and message["content"].startswith(prefix):
            opening += prefix
        before = tokenizer.encode(opening, add_special_tokens=False)
        if ids[: len(before)] != before:  # the template does not extend token-wise here: that turn is not learnt
            skipped += 1
            continue
        end = next((i for i in range(len(before), len(ids)) if ids[i] == eos), len(ids) - 1)
        for i in range(len(before), end + 1):
            mask[i] = 1
    return ids, mask, skipped


def atif_messages(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The OpenAI messages an ATIF trajectory holds (the inverse of `pipelines.report.formats.atif` on messages):
    system and user steps as they are, an agent step as the assistant's message with its
    tool calls, and its observation's results as the tool messages answering them."""
    out: list[dict[str, Any]] = []
    for step in document.get("steps") or []:
        text = step.get("message")
        text = text if isinstance(text, str) else " ".join(p.get("text", "") for p in text or [] if isinstance(p, dict))
        if step.get("source") != "agent":
            out.append({"role": step.get("source"), "content": text})
            continue
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if step.get("tool_calls"):
            message["tool_calls"] = [
                {
                    "id": c.get("tool_call_id"),
                    "type": "function",
                    "function": {"name": c.get("function_name"), "arguments": json.dumps(c.get("arguments") or {})},
                }
                for c in step["tool_calls"]
            ]
        out.append(message)
        for result in (step.get("observation") or {}).get("results") or []:
            content = result.get("content")
            content = content if isinstance(content, str) else json.dumps(content)
            if result.get("source_call_id"):
                out.append({"role": "tool", "tool_call_id": result["source_call_id"], "content": content})
            else:
                out.append({"role": "user", "content": content})
    return out
