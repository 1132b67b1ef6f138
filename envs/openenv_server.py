"""Our environments served as OpenEnv environments (``python -m envs.served --protocol openenv``).

    python -m envs.served --protocol openenv --env sokoban --options '{"num_boxes": 1}' --port 8000

One registered environment, with its options, per server, built with the
``openenv-core`` package's own server (``pip install -e '.[openenv]'``): any OpenEnv
client plays it, one session per WebSocket. The action is ``{"message": str}`` (one
action, as our agent loop sends each); the observation holds the state as ``text``, the
environment's ``instructions``, ``success``, ``action_valid`` and the step's other
``info``. The reset takes ``seed`` and, as our environments do, ``split`` ("train" or
"validation"); an ``env: openenv`` client passes it with ``splits: true``.
"""

from __future__ import annotations

import functools
import random
from typing import Any

from openenv.core.env_server import Action, Environment, Observation, State, create_app
from pydantic import Field

from envs.registry import make

SPLITS = ("train", "validation")


class TextAction(Action):
    """One action, as the environment's own text (an action word, an expression, an answer)."""

    message: str = Field(description="the action, as text")


class TextObservation(Observation):
    """The environment's state as text, and what its step said."""

    text: str = Field(default="", description="the state, as the environment renders it")
    instructions: str = Field(default="", description="the task, the symbols and the actions")
    success: bool = Field(default=False, description="whether the episode is solved")
    action_valid: bool = Field(default=True, description="whether the last action was valid (it costs nothing if not)")
    info: dict[str, Any] = Field(default_factory=dict, description="the step's other information")


class TextEnvironment(Environment):
    """A registered text environment (`envs.make`) behind OpenEnv's interface."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # each session makes its own environment

    def __init__(self, name: str, options: dict[str, Any]) -> None:
        super().__init__()
        self.env = make(name, **options)
        self._state = State(episode_id=None, step_count=0)

    def _observed(self, text: str, reward: float | None, info: dict[str, Any]) -> TextObservation:
        rest = {k: v for k, v in info.items() if k not in ("success", "action_valid")}
        return TextObservation(
            text=text,
            instructions=self.env.instructions,
            success=bool(info.get("success", False)),
            action_valid=bool(info.get("action_valid", True)),
            info=rest,
            done=self.env.done,
            reward=reward,
        )

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, split: str | None = None, **kwargs: Any
    ) -> TextObservation:
        if split is not None and split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got '{split}'")
        text = self.env.reset(random.randrange(2**31) if seed is None else int(seed), split)
        self._state = State(episode_id=episode_id, step_count=0)
        return self._observed(text, None, {"success": False, "action_valid": True})

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> TextObservation:
        text, reward, _, info = self.env.step(getattr(action, "message", ""))
        self._state.step_count += 1
        return self._observed(text, reward, info)

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        self.env.close()


def app(name: str, options: dict[str, Any], max_sessions: int) -> Any:
    """The FastAPI application serving `name` with `options` (checked here: `EnvError`)."""
    make(name, **options).close()
    factory = functools.partial(TextEnvironment, name, options)
    return create_app(factory, TextAction, TextObservation, env_name=name, max_concurrent_envs=max_sessions)


def serve(host: str, port: int, name: str, options: dict[str, Any], max_sessions: int) -> None:
    import uvicorn

    application = app(name, options, max_sessions)
    print(f"serving {name} as an OpenEnv environment on http://{host}:{port}", flush=True)
    uvicorn.run(application, host=host, port=port, log_level="warning")
