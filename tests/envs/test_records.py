"""Task records (`envs.records`): a file of your own picked by seed, answers scored,
held out by content, and every mistake in the file one line naming it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import envs
from envs.base import EnvError


def _write(path: Path, records: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_the_packaged_example_plays_and_scores_answers():
    env = envs.make("records")
    text = env.reset(3)
    a, op, b = re.fullmatch(r"What is (\d+) ([-+*]) (\d+)\?", text).groups()
    right = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
    assert env.step(f" {right} ") == (
        f"{text}\nYour answer: {right}",
        1.0,
        True,
        {"success": True, "action_valid": True},
    )
    env.reset(3)
    assert env.step(str(right + 1))[1:3] == (0.0, True)


def test_a_file_of_your_own_with_its_own_fields(tmp_path):
    path = _write(
        tmp_path / "t.jsonl", [{"q": f"capital of {c}?", "a": a} for c, a in [("France", "Paris"), ("Peru", "Lima")]]
    )
    env = envs.make("records", path=str(path), prompt="q", answer="a", answer_pattern=r"[A-Za-z ]+")
    seen = {env.reset(s) for s in range(40)}
    assert seen == {"capital of France?", "capital of Peru?"}
    peru = next(s for s in range(40) if env.reset(s) == "capital of Peru?")
    env.reset(peru)
    assert env.record == {"q": "capital of Peru?", "a": "Lima"}
    assert env.step("  lima ")[1] == 1.0  # trimmed, any case
    env.reset(peru)
    assert env.step("Lima!")[3]["action_valid"] is False  # not of the answer's form: costs nothing
    assert not env.done


def test_validation_records_are_never_training_records():
    env = envs.make("records")
    train = {env.reset(s, "train") for s in range(300)}
    val = {env.reset(s, "validation") for s in range(100)}
    assert train and val and not train & val
    assert len(val) < len(train)  # one in eight held out


def test_the_digest_follows_the_content(tmp_path):
    path = _write(tmp_path / "t.jsonl", [{"prompt": "1+1?", "answer": "2"}, {"prompt": "2+2?", "answer": "4"}])
    first = envs.data_digest("records", {"path": str(path)})
    assert first and envs.data_digest("records", {"path": str(path)}) == first
    _write(path, [{"prompt": "1+1?", "answer": "2"}, {"prompt": "2+3?", "answer": "5"}])
    assert envs.data_digest("records", {"path": str(path)}) not in (None, first)
    assert envs.data_digest("frozenlake", None) is None


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, r"path '.*missing\.jsonl': no such file"),
        ('{"prompt": "a"}\nnot json\n', r"line 2: not JSON"),
        ('{"prompt": "a"}\n[1, 2]\n', r"line 2: expected a JSON object with a text field 'prompt'"),
        ('{"prompt": "a"}\n{"question": "b"}\n', r"line 2: expected a JSON object with a text field 'prompt'"),
        ('{"prompt": "a"}\n', r"1 record\(s\); episodes need at least 2"),
        (b"\xff\xfe\n", r"cannot be read \(UnicodeDecodeError\)"),
    ],
)
def test_a_bad_file_is_one_line_naming_it(tmp_path, content, message):
    path = tmp_path / "missing.jsonl"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(EnvError, match=r"environment 'records': (path '[^']*':? )?" + message) as caught:
        envs.make("records", path=str(path))
    assert "\n" not in str(caught.value)


def test_a_bad_pattern_is_one_line():
    with pytest.raises(EnvError, match=r"answer_pattern '\(' is not a regular expression"):
        envs.make("records", answer_pattern="(")


def _five_with_none_held_out(tmp_path: Path) -> Path:
    from envs.records import _held

    records, n = [], 0
    while len(records) < 5:
        record = {"prompt": f"{n}+1?", "answer": str(n + 1)}
        n += 1
        if not _held(record):
            records.append(record)
    return _write(tmp_path / "train-only.jsonl", records)


def test_a_file_with_no_held_out_record_is_refused_before_a_run_not_at_its_first_eval(tmp_path):
    from common.config import ConfigProblem
    from stages.agent.play import check_env

    path = _five_with_none_held_out(tmp_path)
    env = envs.make("records", path=str(path))
    assert env.split_problem("train") is None
    assert "none of its 5 records is held out for validation" in str(env.split_problem("validation"))
    with pytest.raises(EnvError, match="none of its 5 records is held out"):
        env.reset(3, "validation")  # at once, not after 1000 draws
    env.reset(3, "train")
    check_env("env", "records", {"path": str(path)}, "env_options", "train")
    with pytest.raises(ConfigProblem, match="none of its 5 records is held out") as caught:
        check_env("envs", "records", {"path": str(path)}, "env_options", "validation")
    assert caught.value.field == "env_options"
