"""`pipeline export` and `warmstart.demonstrations`: a run's episodes leave as chat data
(OpenAI messages, JSON Lines or Parquet that `datasets` loads as it is) and come back in
as a warm start of their own that reaches the exported policy's format rate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from catalog.query import query
from catalog.store import Catalog
from pipelines.cli.main import app
from tests.conftest import run_spec
from tests.stages.conftest import TINY_GRPO, TINY_MODEL_YAML

#: a warm start on random valid bandit answers: a policy that answers in the format
TAUGHT = (
    """
run: {name: taught, seed: 0}
pipeline:
  model: {stage: policy.init, once: true}
  warmstart: {stage: warmstart, once: true}
  eval: {stage: eval, once: true}
eval: {envs: [bandit], episodes: 48, temperature: 1.0}
agent: {think: false, max_new_tokens: 8}
"""
    + TINY_MODEL_YAML.replace("  demonstrator: none\n  episodes: 2\n", "")
    + """  envs: [bandit]
  demonstrator: random_valid
  episodes: 64
  epochs: 4
  batch_size: 4
"""
)


def cli(*args: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "100"}, prog_name="pipeline")


def _format(catalog: Catalog, run: str) -> float:
    return query(catalog, f"select avg(format_valid_rate) f from evals where run = '{run}'").column(0)[0].as_py()


def test_a_run_leaves_as_chat_data_and_comes_back_as_a_warm_start(tmp_path: Path):
    import datasets

    catalog = Catalog(str(tmp_path / "catalog"))
    (tmp_path / "taught.yaml").write_text(TAUGHT)
    run_spec(str(tmp_path / "taught.yaml"), catalog)
    taught = _format(catalog, "taught")
    assert taught > 0.5, "the exported policy answers in the format"

    out = tmp_path / "taught.jsonl"
    # its eval episodes in the format, as a user keeps the good ones (rejection sampling)
    where = ("--where", "format_valid_rate = 1")
    got = cli("export", str(out), "--catalog", str(catalog.root.path()), "--run", "taught", "--view", "evals", *where)
    valid = round(48 * taught)
    assert got.exit_code == 0 and f"{valid} episodes" in got.output, got.output
    first = json.loads(out.read_text().splitlines()[0])
    roles = [m["role"] for m in first["messages"]]
    assert roles == ["system", "user", "assistant"]
    assert first["messages"][-1]["content"] in ("<answer>Phoenix</answer>", "<answer>Dragon</answer>")
    assert "Phoenix" in first["messages"][1]["content"]
    meta = first["metadata"]
    assert meta["run"] == "taught" and meta["split"] == "validation" and meta["policy_version"] == 0
    assert len(meta["turns"]) == 1 and meta["turns"][0]["logprobs"] and meta["kept"] is None

    parquet = tmp_path / "taught.parquet"
    assert cli("export", str(parquet), "--catalog", str(catalog.root.path()), "--view", "evals", *where).exit_code == 0
    loaded = datasets.load_dataset("parquet", data_files=str(parquet), split="train")
    assert len(loaded) == valid and loaded[0]["messages"][0]["role"] == "system"
    from_json = datasets.load_dataset("json", data_files=str(out), split="train")
    assert from_json[0]["messages"] == [{k: m.get(k) for k in from_json[0]["messages"][0]} for m in first["messages"]]

    # a fresh model warm-started on the exported transcripts, nothing else, for as many optimiser steps
    epochs = 4 * 64 // valid
    back = (
        TAUGHT.replace("name: taught", "name: back")
        .replace("demonstrator: random_valid", f"demonstrator: none\n  demonstrations: {out}")
        .replace("epochs: 4", f"epochs: {epochs}")
    )
    (tmp_path / "back.yaml").write_text(back)
    run_spec(str(tmp_path / "back.yaml"), catalog)
    assert _format(catalog, "back") >= taught - 0.1
    # and the Parquet holds the same transcripts, as the warm start reads them
    from stages.endpoint import chats

    assert chats.read(str(parquet))[1] == chats.read(str(out))[1]


@pytest.mark.parametrize("online_k", [1, 2])
def test_rollouts_carry_their_advantages_and_the_filters_decision(tmp_path: Path, online_k: int):
    """Issue 93: with Online-k, the groups trained at a later iteration than the one that
    played them were exported as not kept, with no advantage."""
    spec = TINY_GRPO.replace(
        "  advantage: {stage: advantage, inputs: {trajectories: trajectories}}\n",
        "  filter: {stage: filter}\n  advantage: {stage: advantage}\n",
    )
    spec += "filter: {strategy: top_k, ratio: 0.5}\n"
    if online_k > 1:  # 2 iterations from one rollout of 4 groups: each iteration keeps 1 of its 2
        spec = spec.replace("n_groups: 2,", "n_groups: 2, online_k: 2,")
    (tmp_path / "s.yaml").write_text(spec)
    catalog = Catalog(str(tmp_path / "catalog"))
    run_spec(str(tmp_path / "s.yaml"), catalog)
    out = tmp_path / "r.jsonl"
    assert cli("export", str(out), "--catalog", str(catalog.root.path())).exit_code == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 8
    kept = [r for r in records if r["metadata"]["kept"]]
    assert 0 < len(kept) < len(records), "the filter kept some groups, not all"
    if online_k > 1:
        assert {r["metadata"]["group"] for r in kept} & {2, 3}, "groups trained at iteration 1 were kept"
        assert len(kept) == 4
    for r in records:
        advantage = r["metadata"]["turns"][0]["advantage"]
        assert (advantage is not None) == r["metadata"]["kept"]


def test_a_malformed_transcript_is_one_line_naming_the_file_and_the_line(tmp_path: Path):
    bad = tmp_path / "mine.jsonl"
    good = {
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<answer>Dragon</answer>"}]
    }
    for content, words in [
        (json.dumps(good) + "\n{not json\n", "line 2: not JSON"),
        (
            json.dumps(good) + "\n" + json.dumps({"messages": [{"role": "robot", "content": "x"}]}) + "\n",
            "line 2: messages[0].role",
        ),
        (
            json.dumps({"messages": [{"role": "user", "content": "only a question"}]}) + "\n",
            "line 1: no assistant message",
        ),
    ]:
        bad.write_text(content)
        spec = tmp_path / "s.yaml"
        spec.write_text(TAUGHT.replace("demonstrator: random_valid", f"demonstrator: none\n  demonstrations: {bad}"))
        got = cli("validate", str(spec))
        assert got.exit_code == 2, got.output
        assert f"warmstart.demonstrations: path '{bad}' {words}" in got.output, got.output
        assert len(got.output.strip().splitlines()) == 1


def test_the_transcripts_content_is_in_the_key_and_their_path_is_not(tmp_path: Path):
    from pipelines.graph.load import load_spec

    def key(path: Path) -> str:
        from catalog.keys import canonical_json

        spec = load_spec(str(tmp_path / "s.yaml"))
        node = next(n for n in spec.nodes if n.name == "warmstart")
        return canonical_json(node.config)

    good = {
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<answer>Dragon</answer>"}]
    }
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(json.dumps(good) + "\n")
    b.write_text(json.dumps(good) + "\n")
    keys = []
    for path in (a, b):
        (tmp_path / "s.yaml").write_text(TAUGHT.replace("demonstrator: random_valid", f"demonstrations: {path}"))
        keys.append(key(path))
    assert keys[0] == keys[1]
    b.write_text(json.dumps(good).replace("Dragon", "Phoenix") + "\n")
    assert key(b) != keys[0]


@pytest.mark.parametrize("view", ["nonsense"])
def test_an_unknown_view_is_one_line(tmp_path: Path, view: str):
    Catalog(str(tmp_path / "catalog")).root.fs.create_dir(str(tmp_path / "catalog" / "runs"), recursive=True)
    got = cli("export", str(tmp_path / "x.jsonl"), "--catalog", str(tmp_path / "catalog"), "--view", view)
    assert got.exit_code != 0 and "expected one of trajectories, evals, demonstrations" in got.output


@pytest.mark.parametrize("name", [".", "..", "existing"])
def test_export_to_a_folder_is_one_line_not_a_traceback(tmp_path, monkeypatch, name):
    """Issue 93: `pipeline export .` and `pipeline export EXISTING_DIR` raised tracebacks."""
    from common.errors import UserError
    from pipelines.report.export import write

    (tmp_path / "existing").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="is a folder; expected a file"):
        write(iter([]), Path(name), "jsonl")
    assert (tmp_path / "existing").is_dir() and not list((tmp_path / "existing").iterdir())


def test_ragen_and_atif_exports_hold_their_fields_validate_and_read_back(tmp_path: Path):
    """Issue 94: RAGEN's rollout JSONL field for field, ATIF documents the `atif`
    package's models accept, and both read back by the warm start as our own export."""
    atif = pytest.importorskip("atif")
    from pipelines.report import formats
    from stages.endpoint import chats

    (tmp_path / "s.yaml").write_text(TINY_GRPO)
    catalog = Catalog(str(tmp_path / "catalog"))
    run_spec(str(tmp_path / "s.yaml"), catalog)
    files = {}
    for kind in ("jsonl", "ragen", "atif"):
        files[kind] = tmp_path / f"out.{kind}.jsonl"
        got = cli("export", str(files[kind]), "--catalog", str(catalog.root.path()), "--format", kind)
        assert got.exit_code == 0 and "8 episodes" in got.output, got.output
    ours = [json.loads(line) for line in files["jsonl"].read_text().splitlines()]
    ragen = [json.loads(line) for line in files["ragen"].read_text().splitlines()]
    assert all(set(r) == {"custom_id", "messages", "metadata"} for r in ragen)
    assert all(tuple(r["metadata"]) == formats.RAGEN_METADATA for r in ragen)
    assert len({r["custom_id"] for r in ragen}) == len(ragen) and [r["messages"] for r in ragen] == [
        r["messages"] for r in ours
    ]
    for r, o in zip(ragen, ours):
        lps = [x for t in o["metadata"]["turns"] for x in t["logprobs"]]
        assert r["metadata"]["n_tokens"] == len(lps) and r["metadata"]["total_reward"] == o["metadata"]["reward"]
        assert r["metadata"]["entropy"] == pytest.approx(-sum(lps) / len(lps))
    docs = [json.loads(line) for line in files["atif"].read_text().splitlines()]
    for doc in docs:
        atif.Trajectory.model_validate(doc)
        agent = [s for s in doc["steps"] if s["source"] == "agent"]
        assert agent and all(s["metrics"]["logprobs"] for s in agent)
    _, back = chats.read(str(files["jsonl"]))
    assert chats.read(str(files["ragen"]))[1] == back and chats.read(str(files["atif"]))[1] == back


def test_tool_calls_and_their_results_survive_the_atif_round_trip():
    atif = pytest.importorskip("atif")
    from pipelines.report import formats
    from stages.endpoint import chats
    from stages.endpoint.messages import normalise

    call = {"id": "call_1_0", "type": "function", "function": {"name": "look", "arguments": '{"at": "box"}'}}
    messages = [
        {"role": "system", "content": "You play."},
        {"role": "user", "content": "Where is the box?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1_0", "content": "left of you"},
        {"role": "assistant", "content": "<answer>Left</answer>"},
    ]
    turns = [
        {"turn": k, "reward": 0.0, "format_ok": True, "advantage": None, "logprobs": [-0.5, -0.25]} for k in range(2)
    ]
    meta = {"run": "r", "view": "trajectories", "iteration": 0, "policy_version": 0, "group": 0, "sample": 0}
    meta |= {"env": "sokoban", "reward": 1.0, "success": True, "turns": turns}
    doc = formats.atif({"messages": messages, "metadata": meta})
    atif.Trajectory.model_validate(doc)
    assert [s["source"] for s in doc["steps"]] == ["system", "user", "agent", "agent"]
    assert doc["steps"][2]["observation"]["results"] == [{"source_call_id": "call_1_0", "content": "left of you"}]
    assert chats.atif_messages(doc) == messages
    assert [normalise(m, k) for k, m in enumerate(messages)] == chats._transcript(doc, "doc")
