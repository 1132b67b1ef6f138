"""Exported episodes in the shapes other tools read (`pipeline export --format`).

- ``ragen``: RAGEN's rollout JSONL (its docs/eval.md), one episode a line:
  ``{custom_id, messages, metadata: {env_id, group_id, success, total_reward, num_turns,
  entropy, n_tokens}}``. ``entropy`` is the mean negative log-probability of the sampled
  tokens (the sampled-token estimate of the policy's entropy); ``n_tokens`` counts them.
- ``atif``: the Agent Trajectory Interchange Format (Harbor's ATIF v1.8), one trajectory
  document a line: a step per message (``system``, ``user``, ``agent``), an agent step's
  tool calls and the tool results answering them as its observation, and per agent turn
  its sampled-token count and log-probabilities (``metrics``). Our metadata (run, seed,
  reward, the filter's decision, per turn the reward and advantage) goes in ``extra``.

Both keep the messages as `pipelines.report.export` writes them, so the warm start
(``warmstart.demonstrations``) reads either back (`stages.endpoint.chats`, which reads
ATIF's steps as messages).
"""

from __future__ import annotations

import json
from importlib.metadata import PackageNotFoundError, version
from typing import Any

#: the ATIF version written
ATIF_VERSION = "ATIF-v1.8"
#: the field list RAGEN's export has (its docs/eval.md)
RAGEN_METADATA = ("env_id", "group_id", "success", "total_reward", "num_turns", "entropy", "n_tokens")


def episode_id(meta: dict[str, Any]) -> str:
    """One exported episode's id: its run, view, iteration, policy version, group and sample."""
    it = "-" if meta.get("iteration") is None else meta["iteration"]
    return f"{meta['run']}/{meta['view']}/{it}/v{meta.get('policy_version')}/{meta['group']}/{meta['sample']}"


def ragen(record: dict[str, Any]) -> dict[str, Any]:
    """A RAGEN rollout record (module docstring)."""
    meta = record["metadata"]
    logprobs = [x for t in meta["turns"] for x in t["logprobs"]]
    return {
        "custom_id": episode_id(meta),
        "messages": record["messages"],
        "metadata": {
            "env_id": meta["env"],
            "group_id": meta["group"],
            "success": bool(meta["success"]),
            "total_reward": meta["reward"],
            "num_turns": len(meta["turns"]),
            "entropy": -sum(logprobs) / len(logprobs) if logprobs else None,
            "n_tokens": len(logprobs),
        },
    }


def _package_version() -> str:
    try:
        return version("starpo-pipeline")
    except PackageNotFoundError:
        return "unknown"


def atif(record: dict[str, Any]) -> dict[str, Any]:
    """An ATIF trajectory document (module docstring)."""
    meta = record["metadata"]
    turns = list(meta["turns"])
    agent_turns = sum(m["role"] == "assistant" for m in record["messages"])
    steps: list[dict[str, Any]] = []
    k = 0  # the agent turn
    for message in record["messages"]:
        role = message["role"]
        if role == "tool" and steps and steps[-1]["source"] == "agent":
            observation = steps[-1].setdefault("observation", {"results": []})
            observation["results"].append(
                {"source_call_id": message.get("tool_call_id"), "content": message["content"]}
            )
            continue
        if role == "tool":  # a tool result with no agent step before it: said as the user's
            role = "user"
        step: dict[str, Any] = {"step_id": len(steps) + 1, "source": "agent" if role == "assistant" else role}
        step["message"] = message.get("content") or ""
        if role == "assistant":
            if message.get("tool_calls"):
                step["tool_calls"] = [
                    {
                        "tool_call_id": c["id"],
                        "function_name": c["function"]["name"],
                        "arguments": json.loads(c["function"]["arguments"] or "{}"),
                    }
                    for c in message["tool_calls"]
                ]
            if agent_turns == len(turns) and k < len(turns):  # a turn a message: its sampled tokens
                turn = turns[k]
                step["metrics"] = {"completion_tokens": len(turn["logprobs"]), "logprobs": turn["logprobs"]}
                step["extra"] = {"turn": turn["turn"], "reward": turn["reward"], "advantage": turn["advantage"]}
            k += 1
        steps.append(step)
    extra = {key: value for key, value in meta.items() if key != "turns"}
    return {
        "schema_version": ATIF_VERSION,
        "session_id": meta["run"],
        "trajectory_id": episode_id(meta),
        "agent": {"name": "starpo-pipeline", "version": _package_version(), "model_name": meta.get("policy_key")},
        "steps": steps,
        "final_metrics": {
            "total_completion_tokens": sum(len(t["logprobs"]) for t in turns),
            "total_steps": len(steps),
        },
        "extra": extra,
    }
