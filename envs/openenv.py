"""OpenEnv environments as text environments: ``env: openenv``.

    envs.make("openenv", url="http://127.0.0.1:8000")      # e.g. python -m envs.served --protocol openenv
    envs.make("openenv", url="http://host:8000", text_key="prompt", max_turns=6)

An `OpenEnv <https://github.com/meta-pytorch/OpenEnv>`_ server holds one environment per
WebSocket session at ``<url>/ws`` (messages ``reset``, ``step``, ``state``, ``close``)
and publishes its action and observation schemas at ``GET <url>/schema``. This client
plays one session per episode:

- the answer goes into the action's `action_key` field (``message``, as TextArena's and
  the echo environment's actions have it); the server must need no other field;
- the observation shown to the agent is its `text_key` field; with none given, its
  ``text`` or ``prompt`` field, else every field as ``key: value`` lines;
- the reward is the step's (none counts 0); success is the observation's ``success``
  field where it has one, else a final reward of at least `success_at`;
- an action the server rejects as not valid for its schema is an invalid action (no
  reward, state unchanged), as in every environment here (`envs.base`); so is one the
  observation's ``action_valid`` field calls invalid.

Faults follow the served-environment rules (`envs.served`): a server that cannot be
reached, answers late, drops the connection, fails a step or is at its session limit
costs the episode (`EnvFault`); a reset is tried `retries` more times, a step never; a
server that failed its calls twice in a row is taken for down and fails the next ones
at once. A wrong option (an action field the server does not have) is one line at
spec check. Needs the ``websockets`` package (``pip install -e '.[ecosystem]'``); the
server side needs ``openenv-core`` (``.[openenv]``).
"""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from common.errors import did_you_mean
from envs.base import Budget, EnvError, EnvFault, StepResult, TextEnv
from envs.served import guarded, read_once

#: the observation fields shown as the state when `text_key` is not given, in this order
TEXT_FIELDS = ("text", "prompt")
#: the instructions when neither the options nor the observation give any
DEFAULT_INSTRUCTIONS = "Act in the environment. Answer with one action."


@dataclass(frozen=True)
class OpenEnvOptions:
    url: str = "http://127.0.0.1:8000"  # the server's base URL (http or https)
    action_key: str = "message"  # the action field the answer is sent in
    text_key: str = ""  # the observation field shown ("": `text` or `prompt`, else every field)
    instructions: str = ""  # the task for the first prompt ("": the observation's `instructions` field)
    max_turns: int = 5  # the episode's budget of turns
    max_actions_per_turn: int = 1  # actions one answer may hold (each one step)
    max_actions_per_traj: int | None = None  # actions an episode may take (None: turns x actions per turn)
    reset: dict[str, Any] = field(default_factory=dict)  # more arguments for the server's reset
    splits: bool = False  # the server's reset takes `split` ("train" / "validation"), as ours does
    success_at: float = 1.0  # final reward counted a success where the observation has no `success`
    timeout: float = 30.0  # seconds to wait for any answer
    retries: int = 2  # more tries of a reset after a fault (a step is never repeated)

    def __post_init__(self) -> None:
        if urlsplit(self.url).scheme not in ("http", "https"):
            raise ValueError(f"url must start with http:// or https://, got '{self.url}'")
        if min(self.max_turns, self.max_actions_per_turn, self.max_actions_per_traj or 1) < 1:
            raise ValueError("max_turns, max_actions_per_turn and max_actions_per_traj must be >= 1")
        if not isinstance(self.reset, dict) or {"seed", "split"} & set(self.reset):
            raise ValueError("reset: a mapping of the server's reset arguments other than seed and split")


def _ws_url(url: str) -> str:
    parts = urlsplit(url.rstrip("/"))
    return f"{'wss' if parts.scheme == 'https' else 'ws'}://{parts.netloc}{parts.path}/ws"


class OpenEnv(TextEnv):
    """A client of one OpenEnv server (see the module docstring)."""

    def __init__(self, opts: OpenEnvOptions) -> None:
        super().__init__()
        self.opts = opts
        per_traj = opts.max_actions_per_traj or opts.max_turns * opts.max_actions_per_turn
        self.budget = Budget(opts.max_turns, per_traj, opts.max_actions_per_turn)
        self._ws: Any = None
        self._held = contextlib.ExitStack()  # the open connection, if any
        self._text = ""
        self._observed: dict[str, Any] = {}
        self._check_action(self._schema())

    # -- the calls --------------------------------------------------------------------------

    def _schema(self) -> dict[str, Any]:
        """The server's schemas, read once a run (a rollout makes an environment an episode)."""
        url = self.opts.url.rstrip("/") + "/schema"

        def once() -> dict[str, Any]:
            try:
                with urllib.request.urlopen(url, timeout=self.opts.timeout) as response:
                    reply = json.loads(response.read())
            except urllib.error.HTTPError as exc:
                raise EnvError(f"openenv {url}: not an OpenEnv server (HTTP {exc.code})") from None
            except (urllib.error.URLError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                raise EnvFault(f"openenv {url}: cannot reach the server ({reason})") from None
            except ValueError:
                raise EnvError(f"openenv {url}: not an OpenEnv server (the schema is not JSON)") from None
            if not isinstance(reply, dict) or not isinstance(reply.get("action"), dict):
                raise EnvError(f"openenv {url}: not an OpenEnv server (no action schema)")
            return reply

        tries = 1 + max(0, self.opts.retries)
        return read_once(self.opts.url, "schema", lambda: guarded(self.opts.url, f"openenv {url}", tries, once))

    def _check_action(self, schema: dict[str, Any]) -> None:
        action = schema["action"]
        fields = sorted(action.get("properties") or {})
        key = self.opts.action_key
        if key not in fields:
            raise EnvError(f"openenv {self.opts.url}: the action has no field '{key}'{did_you_mean(key, fields)}")
        others = sorted(set(action.get("required") or ()) - {key})
        if others:
            raise EnvError(f"openenv {self.opts.url}: the action also needs {', '.join(others)}; only {key} is sent")
        shown = self.opts.text_key
        observed = sorted((schema.get("observation") or {}).get("properties") or {})
        if shown and observed and shown not in observed:
            raise EnvError(
                f"openenv {self.opts.url}: the observation has no field '{shown}'{did_you_mean(shown, observed)}"
            )

    def _connect(self) -> Any:
        if self._ws is None:
            try:
                from websockets.sync.client import connect
            except ImportError:
                raise EnvError("openenv: needs the websockets package: pip install -e '.[ecosystem]'") from None
            where = _ws_url(self.opts.url)
            host = urlsplit(where).hostname or ""
            proxy: Literal[True] | None = None if host in ("127.0.0.1", "localhost", "::1") else True
            try:
                self._ws = self._held.enter_context(
                    connect(where, open_timeout=self.opts.timeout, max_size=None, proxy=proxy)
                )
            except Exception as exc:  # refused, timed out, a handshake not WebSocket
                raise EnvFault(f"openenv {where}: cannot open a session ({type(exc).__name__}: {exc})") from None
        return self._ws

    def _drop(self) -> None:
        self._ws = None
        with contextlib.suppress(Exception):  # it is gone either way
            self._held.close()  # the connection, closed

    def _exchange(self, kind: str, data: dict[str, Any]) -> dict[str, Any]:
        """The server's answer to one message; a fault drops the session (a reset opens another)."""
        where = f"openenv {self.opts.url} {kind}"
        try:
            ws = self._connect()
            try:
                ws.send(json.dumps({"type": kind, "data": data}))
            except Exception:  # closed: what the server said before it closed is still read
                raw = ws.recv(timeout=0)
            else:
                raw = ws.recv(timeout=self.opts.timeout)
            reply = json.loads(raw)
        except EnvFault:
            raise
        except TimeoutError:
            self._drop()
            raise EnvFault(f"{where}: no answer within {self.opts.timeout:g} s") from None
        except ValueError:
            self._drop()
            raise EnvFault(f"{where}: the reply is not JSON") from None
        except Exception as exc:  # a closed or broken connection
            self._drop()
            raise EnvFault(f"{where}: the connection broke ({type(exc).__name__}: {exc})") from None
        if not isinstance(reply, dict) or not isinstance(reply.get("data"), dict):
            self._drop()
            raise EnvFault(f"{where}: a reply of the wrong form")
        if reply.get("type") == "error":
            return {"error": reply["data"]}
        observation, done = reply["data"].get("observation"), reply["data"].get("done", False)
        if not isinstance(observation, dict) or not isinstance(done, bool):
            self._drop()
            raise EnvFault(f"{where}: a reply of the wrong form (no observation, or done not true/false)")
        return reply["data"]

    def _fault(self, kind: str, error: dict[str, Any]) -> EnvFault:
        """The fault a server's error answer is; the session is dropped (the next reset opens another)."""
        self._drop()
        code, message = error.get("code", "UNKNOWN"), str(error.get("message", "")).strip()
        where = f"openenv {self.opts.url} {kind}"
        if code == "CAPACITY_REACHED":
            return EnvFault(
                f"{where}: the server is at its limit of sessions ({message}); it needs one per episode played at "
                "once: raise its limit (max_concurrent_envs) or lower the rollout's max_batch"
            )
        return EnvFault(f"{where}: the server failed ({code}: {message})")

    # -- the protocol -----------------------------------------------------------------------

    def reset(self, seed: int, split: str | None = None) -> str:
        """A new episode from `seed` (and `split`, where the server takes one: `splits`)."""
        self.seed, self.done, self.success = seed, False, False
        data = {"seed": int(seed), **self.opts.reset, **({"split": split} if self.opts.splits and split else {})}

        def once() -> dict[str, Any]:
            reply = self._exchange("reset", data)
            if "error" in reply:
                raise self._fault("reset", reply["error"])
            return reply

        reply = guarded(self.opts.url, f"openenv {self.opts.url} reset", 1 + max(0, self.opts.retries), once)
        self._seen(reply["observation"])
        return self._text

    def step(self, action: str) -> StepResult:
        if self.done or not isinstance(action, str):
            return self._text, 0.0, self.done, {"success": self.success, "action_valid": False}
        reply = guarded(
            self.opts.url,
            f"openenv {self.opts.url} step",
            1,
            lambda: self._exchange("step", {self.opts.action_key: action}),
        )
        if "error" in reply:
            if reply["error"].get("code") == "VALIDATION_ERROR":  # the answer does not fit the action
                return self._text, 0.0, self.done, {"success": self.success, "action_valid": False}
            raise self._fault("step", reply["error"])
        observation = reply["observation"]
        reward = reply.get("reward")
        try:
            reward = 0.0 if reward is None else float(reward)
        except (TypeError, ValueError):
            raise EnvFault(f"openenv {self.opts.url} step: a reward that is not a number ({reward!r})") from None
        self._seen(observation)
        self.done = reply["done"]
        said = observation.get("success")
        self.success = said if isinstance(said, bool) else self.done and reward >= self.opts.success_at
        valid, extra = observation.get("action_valid"), observation.get("info")
        info = {
            **(extra if isinstance(extra, dict) else {}),
            "success": self.success,
            "action_valid": valid is not False,
        }
        return self._text, reward, self.done, info

    def _seen(self, observation: dict[str, Any]) -> None:
        self._observed = observation
        key = self.opts.text_key or next((k for k in TEXT_FIELDS if isinstance(observation.get(k), str)), "")
        if key:
            if key not in observation:  # its schema said it would be there
                raise EnvFault(f"openenv {self.opts.url}: an observation without its field '{key}'")
            value = observation[key]
            self._text = value if isinstance(value, str) else json.dumps(value)
        else:
            self._text = "\n".join(f"{k}: {v if isinstance(v, str) else json.dumps(v)}" for k, v in observation.items())

    @property
    def action_words(self) -> tuple[str, ...]:
        return ()  # the server parses the answer

    def parse_action(self, action: str) -> str | None:
        """Any non-empty answer goes to the server, which judges it (an answer it rejects
        comes back ``action_valid: false``, and the agent loop counts it invalid)."""
        answer = action.strip()
        return answer or None

    @property
    def instructions(self) -> str:
        said = self._observed.get("instructions")
        return self.opts.instructions or (said if isinstance(said, str) and said else DEFAULT_INSTRUCTIONS)

    def render(self) -> str:
        return self._text

    def _reset(self, seed: int) -> None:  # pragma: no cover - reset is overridden
        raise NotImplementedError

    def _step(self, action: str) -> tuple[float, dict[str, Any]]:  # pragma: no cover - step is overridden
        raise NotImplementedError

    def close(self) -> None:
        """End the session: the server frees its environment."""
        if self._ws is not None:
            with contextlib.suppress(Exception):  # closed already
                self._ws.send(json.dumps({"type": "close", "data": {}}))
        self._drop()
