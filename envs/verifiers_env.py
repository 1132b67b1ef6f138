"""verifiers environments by their id: ``env: verifiers``.

    rollout:
      env: verifiers
      env_options: {id: vf-sums, args: {digits: 1}}
    agent:
      program: {function: envs.verifiers_env:play, reward: envs.verifiers_env:reward, success_at: 1.0}

`verifiers <https://github.com/PrimeIntellect-ai/verifiers>`_ environments are Python
packages with a ``load_environment(**args)`` that returns an environment: a data set of
prompts (chat messages, with an ``answer`` and ``info``), a rollout (one turn, or many with
the environment's own replies and tools) and a rubric that scores it. ``id`` is what
``verifiers.load_environment`` takes (an installed module's name; ``owner/name`` and dashes
as the Environments Hub writes them), ``args`` its arguments.

An episode is one row of the environment's training data set: the seed picks it (row
``seed`` modulo its length), and one row in eight, by the hash of its prompt, is held out
for validation, as every environment's states are (`envs.base`). The environment plays its
own rollout, as its authors wrote it: the program `play` runs it against the episode's
OpenAI-compatible endpoint (agent mode, docs/agents.md), so that every turn trains on the
tokens the policy sampled. `reward` gives the rubric's score as the episode's, and
``agent.program.success_at`` says which score is a success. A spec that plays the
environment any other way fails before it runs (`TextEnv.program`, checked by
`stages.agent.play.check_env`).

Needs the classic verifiers API (``load_environment``, ``Environment.run_rollout``): the
``verifiers`` package 0.3.1 (0.4.0 keeps only its v1 stack). Its pins clash with
openenv-core's, so it lives in an environment of its own: ``bash .ci/verifiers``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from dataclasses import dataclass, field
from typing import Any

from envs.base import Budget, EnvError, TextEnv

#: the program that plays these episodes (`stages.agent.play.check_env` asks for it)
PROGRAM = "envs.verifiers_env:play"
#: the version whose API this module speaks
VERSION = "0.3.1"
_INSTALL = f"needs the verifiers package {VERSION}: bash .ci/verifiers (or pip install verifiers=={VERSION})"


@dataclass(frozen=True)
class VerifiersOptions:
    id: str = ""  # the environment's id, as verifiers.load_environment takes it
    args: dict[str, Any] = field(default_factory=dict)  # load_environment's arguments
    max_turns: int = 10  # calls an episode may make (the endpoint refuses more)

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("id: expected the verifiers environment's id (what verifiers.load_environment takes)")
        if not isinstance(self.args, dict):
            raise ValueError(f"args: expected load_environment's arguments as a mapping, got {self.args!r}")
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        rows(self)  # a missing package, an unknown id or a bad argument fails here, in its words

    def data_digest(self) -> str:
        """A digest of the environment's rows and its module's code (with the modules of its
        own package it imports: `common.code`), for the result keys (`envs.registry.data_digest`):
        other data or an edited environment plays again."""
        from common.code import fingerprint

        return loaded(self)[2] + fingerprint(module_name(self.id), ())


def module_name(env_id: str) -> str:
    """The module an id names, as verifiers finds it (``owner/vf-sums`` -> ``vf_sums``)."""
    return env_id.replace("-", "_").split("/")[-1]


_LOADED: dict[str, tuple[Any, list[dict[str, Any]], str]] = {}
_LOCK = threading.Lock()


def _key(opts: VerifiersOptions) -> str:
    return json.dumps([opts.id, opts.args], sort_keys=True, default=str)


def loaded(opts: VerifiersOptions) -> tuple[Any, list[dict[str, Any]], str]:
    """The environment `load_environment` returns, its training rows and their digest, loaded
    (and hashed) once a process: a stage's keys ask for the digest every iteration."""
    key = _key(opts)
    with _LOCK:
        if key not in _LOADED:
            try:
                import verifiers as vf
            except ImportError:
                raise ValueError(_INSTALL) from None
            if not hasattr(vf, "load_environment") or not hasattr(vf, "OpenAIChatCompletionsClient"):
                raise ValueError(f"verifiers {getattr(vf, '__version__', '?')} has no classic API: {_INSTALL}")
            try:
                env = vf.load_environment(opts.id, **opts.args)
                data = env.get_dataset()
            except ModuleNotFoundError as exc:
                raise ValueError(
                    f"id '{opts.id}': no installed module '{exc.name}' (pip install the environment)"
                ) from None
            except Exception as exc:  # the environment's own code: its words, on one line
                raise ValueError(f"id '{opts.id}': {' '.join(f'{type(exc).__name__}: {exc}'.split())}") from None
            listed = [dict(row) for row in data]
            if not listed:
                raise ValueError(f"id '{opts.id}': its data set is empty")
            digest = hashlib.sha256()
            for row in listed:
                digest.update(json.dumps(row, sort_keys=True, default=str).encode())
            _LOADED[key] = (env, listed, digest.hexdigest()[:16])
        return _LOADED[key]


def rows(opts: VerifiersOptions) -> list[dict[str, Any]]:
    """The environment's training rows (each with ``prompt``, and ``answer``, ``info`` where it has them)."""
    return loaded(opts)[1]


def _text(prompt: Any) -> str:
    """A prompt's messages as text: each ``role: content``, one a line (a plain string as it is)."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(f"{m.get('role', '?')}: {m.get('content', '')}" for m in prompt if isinstance(m, dict))


class Verifiers(TextEnv):
    """One row of a verifiers environment's data set an episode (see the module docstring)."""

    #: the agent program that must play it (`stages.agent.play.check_env`)
    program = PROGRAM

    def __init__(self, opts: VerifiersOptions) -> None:
        super().__init__()
        self.opts = opts
        self.data = rows(opts)
        self.budget = Budget(opts.max_turns, opts.max_turns, 1)
        self.row: dict[str, Any] = {}

    @property
    def action_words(self) -> tuple[str, ...]:
        return ()

    @property
    def instructions(self) -> str:
        return f"verifiers environment {self.opts.id}"

    @property
    def record(self) -> dict[str, Any]:
        """The episode's row, whole: what `play` hands to the environment's rollout."""
        return self.row

    def _reset(self, seed: int) -> None:
        self.row = self.data[seed % len(self.data)]

    def content(self) -> str:
        return json.dumps(self.row.get("prompt"), sort_keys=True, default=str)

    def render(self) -> str:
        return _text(self.row.get("prompt"))

    def parse_action(self, action: str) -> str | None:
        return None  # nothing is played on it: its own rollout plays the episode

    def _step(self, action: str) -> tuple[float, dict[str, Any]]:
        raise EnvError(f"verifiers environment '{self.opts.id}' is played by its own rollout ({PROGRAM})")


def rollout_input(row: dict[str, Any], seed: int) -> dict[str, Any]:
    """The row as verifiers' ``RolloutInput`` (its ``example_id`` the row's own, else the seed)."""
    given: dict[str, Any] = {k: row[k] for k in ("prompt", "answer", "info", "task") if row.get(k) is not None}
    return {**given, "example_id": row.get("example_id", seed)}


def play(task: Any) -> dict[str, Any]:
    """The agent program: the environment's own rollout of the episode's row against the
    episode's endpoint, scored by its rubric. Its result is the rollout's ``reward``,
    ``metrics`` and how it ended (what `reward` and the catalog keep)."""
    import openai
    import verifiers as vf

    opts = VerifiersOptions(**task.options)
    env = loaded(opts)[0]
    row = task.record
    if not isinstance(row, dict) or "prompt" not in row:
        raise EnvError("the episode has no verifiers row to play (task.record)")

    async def run() -> Any:
        client = openai.AsyncOpenAI(base_url=task.base_url, api_key=task.api_key, max_retries=0)
        try:
            return await env.run_rollout(
                rollout_input(row, task.seed), vf.OpenAIChatCompletionsClient(client), task.model, {}
            )
        finally:
            await client.close()

    out = asyncio.run(run())
    if out.get("error"):
        raise EnvError(f"the rollout failed: {' '.join(str(out['error']).split())[:300]}")
    return {
        "reward": float(out["reward"]),
        "metrics": {k: float(v) for k, v in (out.get("metrics") or {}).items()},
        "is_completed": bool(out.get("is_completed")),
        "is_truncated": bool(out.get("is_truncated")),
        "stop_condition": out.get("stop_condition"),
        "example_id": out.get("example_id"),
    }


def reward(task: Any, result: dict[str, Any] | None) -> float:
    """The rubric's score of the rollout `play` ran (its weighted sum of reward functions);
    0 for an episode the endpoint ended first (its turns or its context ran out: the
    rollout then fails, and has no score)."""
    return 0.0 if result is None else float(result["reward"])
