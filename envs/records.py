"""Task records: the tasks of an episode read from a JSON Lines file of your own.

Each line is one task, a JSON object; `reset(seed)` picks one by the seed, the same
one for the same seed and file. The prompt is the record's `prompt` field and an answer
is scored against its `answer` field (equal after trimming, case and spacing: reward 1
and success; otherwise 0), in one turn. An answer that does not have the form
`answer_pattern` gives (a number, by default) is an invalid action: it costs nothing
and the episode goes on. One record in eight, by the hash of its content, is held out
for validation, as every environment's states are (`envs.base`).

    envs.make("records", path="tasks.jsonl")        # {"prompt": "...", "answer": "..."} a line
    envs.make("records")                            # the packaged example: 160 sums

In agent mode (docs/agents.md) the record goes to the program whole, as the task's
`record`: a program and a reward function (`agent.program.reward`) may use any field,
and a record need not have an `answer` when the reward function scores it. The file's
content is part of every result key that plays it: an edited file is played again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import datafile, jsonl
from envs.base import HOLD_OUT_EVERY, EnvError, OneAnswer

#: the packaged example: arithmetic questions with integer answers
EXAMPLE = Path(__file__).parent / "data" / "sums.jsonl"
#: records read from one file at most (a larger set is a data set to sample from first)
MAX_RECORDS = 1_000_000


@dataclass(frozen=True)
class RecordsOptions:
    path: str = ""  # the JSON Lines file (relative: to the working directory); empty: the packaged example
    prompt: str = "prompt"  # the field holding the task's text
    answer: str = "answer"  # the field holding the reference answer (optional with a reward function)
    answer_pattern: str = r"-?\d+(?:\.\d+)?"  # the form of a valid answer (a full match, after trimming)
    instructions: str = "Answer with the number only."  # what the first prompt says to do

    def __post_init__(self) -> None:
        try:
            re.compile(self.answer_pattern)
        except re.error as exc:
            raise ValueError(f"answer_pattern {self.answer_pattern!r} is not a regular expression ({exc})") from None
        _records(self.file, self.prompt)  # a missing or malformed file fails here

    @property
    def file(self) -> Path:
        return Path(self.path) if self.path else EXAMPLE

    def data_digest(self) -> str:
        """The file's content hash, for the result keys (`envs.registry.data_digest`)."""
        return datafile.digest(self.file)


def _records(file: Path, prompt: str) -> tuple[tuple[dict[str, Any], ...], int]:
    """The records of `file`, each checked to be an object with a text `prompt` field,
    and how many are held out for validation (read and hashed once a run:
    `common.datafile`)."""
    return datafile.load(file, functools.partial(_parse, file=file, prompt=prompt), variant=prompt)[1]


def _parse(data: bytes, file: Path, prompt: str) -> tuple[tuple[dict[str, Any], ...], int]:
    out = []
    try:
        lines = jsonl.lines(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"path '{file}': cannot be read ({type(exc).__name__})") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"path '{file}' line {n}: not JSON ({exc.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get(prompt), str):
            raise ValueError(f"path '{file}' line {n}: expected a JSON object with a text field '{prompt}'")
        out.append(record)
        if len(out) > MAX_RECORDS:
            raise ValueError(f"path '{file}': more than {MAX_RECORDS:,} records")
    if len(out) < 2:
        raise ValueError(f"path '{file}': {len(out)} record(s); episodes need at least 2 to differ by seed")
    return tuple(out), sum(_held(r) for r in out)


def _held(record: dict[str, Any]) -> bool:
    """Whether `record` is held out for validation (`TextEnv.held_out` on its content)."""
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).digest()[0] % HOLD_OUT_EVERY == 0


def _norm(text: str) -> str:
    return " ".join(text.split()).casefold()


class Records(OneAnswer):
    """One task record an episode (see the module docstring)."""

    def __init__(self, opts: RecordsOptions) -> None:
        super().__init__()
        self.opts = opts
        self.records, self.held_out_count = _records(opts.file, opts.prompt)
        self.pattern = re.compile(opts.answer_pattern)
        self.record: dict[str, Any] = {}

    def split_problem(self, split: str) -> str | None:
        held = self.held_out_count
        mine = held if split == "validation" else len(self.records) - held
        if mine:
            return None
        n, file = len(self.records), self.opts.file
        if split == "validation":
            return (
                f"path '{file}': none of its {n} records is held out for validation (one record in {HOLD_OUT_EVERY}, "
                "chosen by the hash of its content, is); add records, or leave records out of eval.envs"
            )
        return f"path '{file}': all of its {n} records are held out for validation; add records to train on"

    def reset(self, seed: int, split: str | None = None) -> str:
        problem = self.split_problem(split) if split is not None else None
        if problem is not None:
            raise EnvError(f"records: {problem}")
        return super().reset(seed, split)

    def _reset(self, seed: int) -> None:
        self.record = self.records[self.rng.randrange(len(self.records))]
        self.given = None

    def content(self) -> str:
        return json.dumps(self.record, sort_keys=True)  # `_held` hashes the same text

    def question(self) -> str:
        return str(self.record[self.opts.prompt])

    def reference(self) -> str | None:
        expected = self.record.get(self.opts.answer)
        return None if expected is None else str(expected)

    def other_answer(self, rng: random.Random) -> str | None:
        expected = self.records[rng.randrange(len(self.records))].get(self.opts.answer)
        return None if expected is None else str(expected)

    def parse_action(self, action: str) -> str | None:
        answer = action.strip()
        return answer if self.pattern.fullmatch(answer) else None

    def _step(self, action: str) -> tuple[float, dict[str, Any]]:
        self.answered(action)
        expected = self.record.get(self.opts.answer)
        self.success = expected is not None and _norm(action) == _norm(str(expected))
        return (1.0 if self.success else 0.0), {}
