"""The multi-turn agent loop (docs/method.md#the-agent-loop), batched over many episodes.

Each episode's chat is built in token space: the template's text is tokenised and
appended with loss mask 0, the sampled response is appended exactly as sampled with
loss mask 1 and its sampling log-probabilities. The response is decoded only to be
parsed; it is never re-tokenised, so training sees exactly the sampled tokens (the fix in
docs/method.md#where-we-differ-from-the-reference-and-why).

History (`AgentConfig.history`):

- ``None`` (the reference): the whole chat is one sequence, one *sample*; each turn's
  prompt extends the previous turn's prompt and response.
- ``k >= 0``: each turn is its own sample: a fresh prompt holding the instructions,
  the last k turns (their user blocks and sampled responses, as context with loss
  mask 0) and the current state, followed by the turn's response (mask 1). The
  context no longer grows with the number of turns, and a small model reads the
  current state without searching earlier ones (verl-agent's memory window,
  Verlog's turn-level samples).

Either way a trajectory's ``token_ids`` / ``loss_mask`` / ``logprobs`` are its
samples laid end to end and ``segments`` holds each sample's length, so the
trajectory stays the unit of scoring, grouping, filtering and replay, while
training and value passes run one forward pass per sample (`stages.models.batching.per_sample`).

    episodes = [Episode(env, spec, agent_cfg, chat) for ...]
    run_episodes(episodes, respond)   # respond(active episodes) -> Completions
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from common.config import ConfigProblem, param
from envs.base import EnvFault, TextEnv
from stages.agent import prompts
from stages.agent.chat import Chat
from stages.agent.history import Block, replay, window
from stages.agent.program_config import ProgramConfig
from stages.engines import Completion, SamplingParams


@dataclass(frozen=True)
class AgentConfig:
    """`agent:` — the interaction budget and format of the agent loop. Budget fields
    left at None take the environment's own budget (docs/method.md#environments)."""

    max_turns: int | None = param(None, "turns per episode; None: the env's (5; 1 for bandit/countdown)", ge=1)
    max_actions_per_turn: int | None = param(None, "actions parsed from one answer; None: the env's (5)", ge=1)
    max_actions_per_traj: int | None = param(None, "actions per episode; None: the env's (10)", ge=1)
    format_penalty: float = param(
        -0.1, "added to a turn's reward when its answer does not parse or holds an invalid action", le=0
    )
    reasoning_bonus: float = param(
        0.0,
        "added to a turn's reward when the environment's rule finds its thought right about the state and its "
        "first action following from it (a reasoning-aware reward, beyond the paper: the bandit with payoffs "
        "stated checks the expected payoffs a thought states and the arm it answers; envs.base.TextEnv."
        "reasoning_holds); 0: off",
        ge=0,
    )
    think: bool = param(True, "ask for <think>..</think> before <answer> (off: the prompt ends with <answer>)")
    max_new_tokens: int = param(48, "longest response of one turn (tokens; paper: 200 words)", ge=1)
    stop_at_answer: bool = param(
        False,
        "end each response at the answer's closing tag (</answer>): nothing after it is sampled, kept or trained "
        "on (off: a response ends at the end-of-turn token or max_new_tokens, and a policy can learn to run on "
        "after its answer)",
    )
    max_context: int = param(
        2048,
        "longest sample (tokens): an episode whose next turn would not fit ends cleanly, flagged truncated_context",
        ge=16,
    )
    example: bool = param(
        False,
        "show the format by example: every turn's format line ends with a response written out (e.g. "
        "<answer>Left</answer>), and the chat opens with one worked exchange (the first turn's message "
        "without its state, and that response): what a small instruct model needs to answer in the format "
        "at all (off: the paper's prompt, with which the embedded default's numbers were measured)",
    )
    history: int | None = param(
        None,
        "turns of earlier history in each prompt. None: the whole chat is one "
        "sequence (the reference; the context grows every turn); k >= 0: each "
        "turn is its own prompt and training sample holding the last k turns "
        "(0: only the current state). A small model learns with 0; a "
        "pretrained one with partially observed state wants k >= 1",
        ge=0,
    )
    program: ProgramConfig = param(
        ProgramConfig(),
        "an agent program of your own that plays each episode through an OpenAI-compatible endpoint in front of "
        "the policy (docs/agents.md); unset: our own loop. With one, max_turns caps its calls, max_new_tokens "
        "and max_context its answers, and think, example, history and stop_at_answer do not apply",
    )

    def stop(self) -> tuple[str, ...]:
        """The stop strings of every response sampled under this config (in agent mode
        only the program's own: `stop_at_answer` does not apply there)."""
        return (prompts.ANSWER_CLOSE,) if self.stop_at_answer and not self.program.active else ()

    def sampling(self, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0) -> SamplingParams:
        """How every stage that plays this loop samples a response: its length limit and
        stop strings come from here, the temperature and truncation from the stage."""
        return SamplingParams(
            temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=self.max_new_tokens, stop=self.stop()
        )


@dataclass(frozen=True)
class EpisodeSpec:
    """What one trajectory is: the environment, its initial-state seed, its group
    (trajectories of a group share the seed) and its index in the group."""

    env: str
    options: str  # JSON object of environment options
    seed: int
    group: int
    sample: int
    split: str = "train"


@dataclass
class Episode:
    """One trajectory in progress; `row()` is its trajectory record."""

    env: TextEnv
    spec: EpisodeSpec
    cfg: AgentConfig
    chat: Chat
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)
    explored: list[int] = field(default_factory=list)  # turns whose answer was forced (`stages.agent.explore`)
    starts: list[int] = field(default_factory=lambda: [0])  # where each sample begins in `ids`
    blocks: list[Block] = field(default_factory=list)  # one per turn, for history windows
    actions_taken: int = 0
    done: bool = False
    end: str = ""
    state: str = ""

    def __post_init__(self) -> None:
        budget = self.env.budget
        self.max_turns = self.cfg.max_turns or budget.max_turns
        self.per_turn = self.cfg.max_actions_per_turn or budget.max_actions_per_turn
        self.per_traj = self.cfg.max_actions_per_traj or budget.max_actions_per_traj
        try:
            self.state = self.env.reset(self.spec.seed, self.spec.split)
        except EnvFault as exc:
            self.fail(exc)
            return
        self._intro = prompts.first_message(self.env, self.per_turn)
        self._shot = (
            prompts.example_exchange(self.env, self.per_turn, self.per_traj, self.cfg.think, self.cfg.max_new_tokens)
            if self.cfg.example
            else None
        )
        self._next_prompt("")

    @property
    def prompt(self) -> list[int]:
        """What the engine continues this turn: the current sample so far."""
        return self.ids[self.starts[-1] :]

    @property
    def segments(self) -> list[int]:
        """The length of each sample in `ids` (one with the whole chat as history)."""
        ends = [*self.starts[1:], len(self.ids)]
        return [e - s for s, e in zip(self.starts, ends)]

    def _next_prompt(self, reward: str) -> None:
        """Write the next turn's prompt (`reward`: the previous turn's reward text): extend
        the chat, or start a new sample replaying the history window."""
        block = Block(reward, self._turn_text())
        self.blocks.append(block)
        if self.turns and self.cfg.history is None:
            self._append(self.chat.next(block.reward + block.text, self.blocks[-2].response), sampled=False)
            return
        ids = replay(self.chat, self._intro, window(self.blocks, self.cfg.history or 0), self._shot)
        if self.turns:  # a history window: every turn after the first starts a new sample
            self.starts.append(len(self.ids))
            if not self._fits(len(ids)):
                self.starts.pop()
                return
        self._append(ids, sampled=False)

    def _fits(self, n: int) -> bool:
        """Whether `n` more prompt tokens and a response fit the current sample; if not,
        the episode ends cleanly (`context`)."""
        if len(self.prompt) + n + self.cfg.max_new_tokens > self.cfg.max_context:
            self.done, self.end = True, "context"
            return False
        return True

    def _turn_text(self) -> str:
        return prompts.turn_message(
            len(self.turns) + 1,
            self.state,
            self.per_traj - self.actions_taken,
            self.cfg.think,
            self.cfg.max_new_tokens,
            self.env.example_action if self.cfg.example else "",
        )

    def _append(self, ids: list[int], sampled: bool, logprobs: list[float] | None = None) -> None:
        if not sampled and not self._fits(len(ids)):
            return
        self.ids += ids
        self.mask += [int(sampled)] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)

    def apply(self, c: Completion) -> None:
        """Take one sampled response: parse, act, record the turn, write the next prompt."""
        self._append(c.token_ids, sampled=True, logprobs=c.logprobs)
        if c.forced:
            self.explored.append(len(self.turns) + 1)
        self.blocks[-1].response = list(c.token_ids)
        text = self.chat.tokenizer.decode(c.token_ids, skip_special_tokens=True)
        parsed = prompts.parse_response(text, self.cfg.think, self.per_turn)
        valid = [self.env.parse_action(a) is not None for a in parsed.actions]
        reasoned = (
            bool(self.env.reasoning_holds(parsed.think, parsed.actions[0]))
            if self.cfg.reasoning_bonus and parsed.ok and parsed.actions
            else False
        )  # judged on the state the thought was about, before any action changes it
        reward, executed = 0.0, 0
        for k, (action, ok) in enumerate(zip(parsed.actions, valid)):
            if not ok or self.env.done or self.actions_taken >= self.per_traj:
                continue
            try:
                _, r, _, info = self.env.step(action)
            except EnvFault as exc:
                self.fail(exc)
                return
            if info.get("action_valid") is False:  # a free-text answer the environment itself rejected
                valid[k] = False
                continue
            reward, executed, self.actions_taken = reward + r, executed + 1, self.actions_taken + 1
        format_ok = parsed.ok and all(valid) and bool(parsed.actions)
        if not format_ok:
            reward += self.cfg.format_penalty
        elif reasoned:
            reward += self.cfg.reasoning_bonus
        self.turns.append(
            {
                "turn": len(self.turns) + 1,
                "state": self.state,
                "response": text,
                "think": parsed.think,
                "answer": parsed.answer,
                "actions": list(parsed.actions),
                "valid": valid,
                "executed": executed,
                "reward": reward,
                "format_ok": format_ok,
                "finished": c.finished,
                "tokens": len(c.token_ids),
            }
        )
        self.state = self.env.render()
        if self.env.done:
            self.done, self.end = True, "success" if self.env.success else "done"
        elif self.actions_taken >= self.per_traj:
            self.done, self.end = True, "actions"
        elif len(self.turns) >= self.max_turns:
            self.done, self.end = True, "turns"
        else:
            self._next_prompt(prompts.reward_message(reward))

    def fail(self, fault: EnvFault) -> None:
        """End the episode because its environment failed (`envs.base.EnvFault`): its row
        says so (`FAULT`), and the stage that played it drops it (`stages.agent.play`)."""
        self.done, self.end = True, fault_reason(fault)

    def row(self) -> dict[str, Any]:
        """The trajectory's columns that the agent loop knows (catalog.schemas)."""
        turns = self.turns
        return {
            **spec_columns(self.spec),
            "token_ids": self.ids,
            "loss_mask": self.mask,
            "logprobs": self.logprobs,
            "turns": turns,
            "score": sum(t["reward"] for t in turns),
            "success": bool(self.env.success),
            "num_turns": len(turns),
            "num_actions": self.actions_taken,
            "format_valid_rate": sum(t["format_ok"] for t in turns) / len(turns) if turns else 0.0,
            "response_tokens": sum(self.mask),
            "end_reason": self.end,
            "segments": self.segments,
            "explored_turns": self.explored,
            "drift": None,
            "truncated_context": self.end == "context",
            "truncated_response": any(not t["finished"] for t in turns),
        }


Respond = Callable[[list[Episode]], list[Completion]]

#: how the `end_reason` of an episode whose environment failed begins
FAULT = "env_fault"
#: how the `end_reason` of an episode whose agent program failed begins (agent mode, `stages.endpoint`)
AGENT_FAULT = "agent_fault"


def fault_reason(fault: Exception) -> str:
    """The `end_reason` of an episode ended by `fault` (one line)."""
    return f"{FAULT}: " + " ".join(str(fault).split())


def spec_columns(spec: EpisodeSpec) -> dict[str, Any]:
    """The trajectory columns that say which episode a row is."""
    return {
        "env": spec.env,
        "env_options": spec.options,
        "seed": spec.seed,
        "group": spec.group,
        "sample": spec.sample,
        "split": spec.split,
    }


def fault_row(spec: EpisodeSpec, fault: Exception) -> dict[str, Any]:
    """The row of an episode whose environment failed before its first state."""
    return {
        **spec_columns(spec),
        "token_ids": [],
        "loss_mask": [],
        "logprobs": [],
        "turns": [],
        "score": 0.0,
        "success": False,
        "num_turns": 0,
        "num_actions": 0,
        "format_valid_rate": 0.0,
        "response_tokens": 0,
        "end_reason": fault_reason(fault),
        "segments": [],
        "explored_turns": [],
        "drift": None,
        "truncated_context": False,
        "truncated_response": False,
    }


def run_episodes(episodes: list[Episode], respond: Respond) -> list[Episode]:
    """Play every episode to its end, one batched `respond` call per turn."""
    while True:
        active = [e for e in episodes if not e.done]
        if not active:
            return episodes
        completions = respond(active)  # each continues its episode's `prompt`
        for episode, completion in zip(active, completions, strict=True):
            episode.apply(completion)


def options_json(options: dict[str, Any] | None) -> str:
    """Environment options as the canonical JSON stored with each trajectory."""
    return json.dumps(options or {}, sort_keys=True)


def check_same_agent(agent: AgentConfig, pipeline: Any) -> None:
    """Raise ConfigProblem at ``agent`` unless `agent` equals every rollout's: a stage
    that plays or trains in the policy's format (eval, warmstart) uses the rollout's
    (`pipeline` is the check's `stages.registry.Neighbours`)."""
    for rollout in pipeline.configs("rollout"):
        if rollout.agent != agent:
            ours, theirs = asdict(agent), asdict(rollout.agent)
            diff = ", ".join(f"{k} {ours[k]} vs {theirs[k]}" for k in ours if ours[k] != theirs[k])
            raise ConfigProblem(
                "agent",
                f"differs from rollout.agent ({diff}): set the top-level agent section once, or make them equal",
            )
