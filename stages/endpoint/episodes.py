"""Playing a batch of episodes in agent mode: the endpoint up, one program per episode,
rounds of calls answered by the engine, and a trajectory row per episode in the same
schema as our own loop's (`stages.agent.play.play_batch`, whose place this takes when
``agent.program`` is set).

An episode's calls are its turns: each turn's `state` is the last message of its call
(the observation or tool result the program sent), its `response` the text returned,
its `actions` the steps the program took on the environment after that answer, and its
`reward` theirs. Faults (the program raised, ran past its time, made no call, left no
reward from the reward function, sent a malformed request) end the episode with ``end_reason``
``agent_fault: ...``; the stage drops and counts them (`stages.agent.play.drop_faults`).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pyarrow as pa

import envs
from envs.base import EnvFault
from stages.agent import play as our_loop
from stages.agent.loop import AGENT_FAULT, EpisodeSpec, fault_row, spec_columns
from stages.agent.play import _AGENT_SCHEMA, _batch_seed
from stages.endpoint import messages
from stages.endpoint.messages import Refused
from stages.endpoint.programs import ActedEnv, AgentTask, Outcome, load, one_line, run_command, run_function
from stages.endpoint.rendering import Template
from stages.endpoint.server import Endpoint, Gate, Slot
from stages.endpoint.transcript import Transcript
from stages.engines import Engine


def serve_batch(
    engine: Engine, batch: pa.Table, job: Any, on_done: Callable[[int, int], None] | None = None
) -> pa.Table:
    """Play a batch of episode specs with ``job.agent.program`` (a `stages.agent.play.PlayJob`);
    one trajectory row per spec, as `play_batch` writes them."""
    agent, program = job.agent, job.agent.program
    specs = [EpisodeSpec(**row) for row in batch.to_pylist()]
    fn = load(program.function) if program.function else None
    score = load(program.reward) if program.reward else None
    template = Template(engine.tokenizer)
    size = job.max_batch or len(specs) or 1
    rows: list[dict[str, Any]] = []
    for start in range(0, len(specs), size):
        part = specs[start : start + size]
        gate = Gate(program.timeout)
        with Endpoint(gate, program.model, len(part)) as endpoint:
            try:
                played = [_start(spec, k, gate, endpoint, agent, template, fn) for k, spec in enumerate(part)]
                round_ = 0
                while (waiting := gate.next_round()) is not None:
                    round_ += 1
                    if on_done is not None:
                        on_done(start + sum(s.state == "done" for _, s, _ in played if s is not None), len(specs))
                    seeded = replace(job.sampling, seed=_batch_seed(part, job.seed, round_))
                    _answer(engine, gate, waiting, agent, seeded, program.model)
            except BaseException as exc:  # the engine, a signal: every program is stopped, every slot freed
                gate.close(f"the batch failed ({one_line(exc)})")
                _release(gate)
                raise
            _release(gate)
        rows += [
            _row(spec, slot, task, outcome, score, program.success_at)
            for spec, (task, slot, outcome) in zip(part, played)
        ]
        if on_done is not None:
            on_done(start + len(part), len(specs))
    return pa.Table.from_pylist(rows, schema=_AGENT_SCHEMA)


def player(agent: Any) -> Callable[..., pa.Table]:
    """How the episodes of a stage with `agent` (an `AgentConfig`) are played: by its
    program through the endpoint, or by our own loop."""
    return serve_batch if agent.program.active else our_loop.play_batch  # looked up now: a test may replace it


def _start(
    spec: EpisodeSpec, k: int, gate: Gate, endpoint: Endpoint, agent: Any, template: Template, fn: Any
) -> tuple[Any, Slot | None, Outcome | dict[str, Any]]:
    """Make the episode's environment, its slot, and start its program; an environment
    that fails at once gives the episode's fault row instead of a slot."""
    program = agent.program
    try:
        env = envs.make(spec.env, **json.loads(spec.options))
        env.reset(spec.seed, spec.split)
    except EnvFault as exc:
        return None, None, fault_row(spec, exc)
    budget = env.budget
    slot = Slot(k, Transcript(template, agent.max_context), agent.max_turns or budget.max_turns)
    slot.env = ActedEnv(env, agent.max_actions_per_traj or budget.max_actions_per_traj, lambda: len(slot.answers))
    gate.add(slot)
    task = AgentTask(
        base_url=endpoint.base_url(slot),
        api_key=slot.key,
        model=program.model,
        env=slot.env,
        env_name=spec.env,
        options=json.loads(spec.options),
        seed=spec.seed,
        split=spec.split,
        group=spec.group,
        sample=spec.sample,
        env_url=endpoint.env_url(slot),
        record=_record(env),
    )
    outcome = Outcome()
    if fn is not None:
        slot.thread = run_function(fn, task, outcome, lambda: gate.finish(slot))
    else:
        slot.thread, proc = run_command(
            tuple(program.command), task, outcome, lambda: gate.finish(slot), tuple(program.pass_env)
        )
        slot.stop = proc.kill if proc is not None else None
        if proc is None:
            gate.finish(slot)
    return task, slot, outcome


def _release(gate: Gate, wait: float = 5.0) -> None:
    """Wait a moment for the programs' threads to end (every slot is done by now: a
    command was killed or has exited; a function returned, or is refused from here on and
    its thread, which Python cannot stop, ends at its next call). One deadline for all:
    N hung programs cost `wait` seconds, not N times it."""
    deadline = time.monotonic() + wait
    for slot in gate.slots.values():
        if slot.thread is not None:
            slot.thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if slot.env is not None:
            slot.env.freeze()


def _record(env: Any) -> dict[str, Any] | None:
    """The episode's task record, where its environment has one (`envs.records`)."""
    record = getattr(env, "record", None)
    return dict(record) if isinstance(record, dict) else None


def _answer(engine: Engine, gate: Gate, waiting: list[Slot], agent: Any, sampling: Any, model: str) -> None:
    """One round: every waiting call's prompt, one generate call, every answer."""
    asked, prompts, limits = [], [], []
    for slot in waiting:
        assert slot.request is not None
        limit = min(agent.max_new_tokens, slot.request.max_tokens or agent.max_new_tokens)
        try:
            prompts.append(slot.transcript.prompt(slot.request, limit))
        except Refused as exc:  # the context is full: the episode ends here, not a fault
            slot.end = "context"
            gate.answer(slot, (exc.status, exc.body()))
            continue
        except Exception as exc:  # the chat template or the tokenizer refused this chat: its episode, not the batch
            refused = Refused(f"messages: the chat cannot be rendered ({one_line(exc)})", "messages")
            slot.fault = f"a malformed request: {refused.message}"
            gate.answer(slot, (refused.status, refused.body()))
            continue
        asked.append(slot)
        limits.append(limit)
    if not asked:
        return
    # one generate call per set of stop strings asked (most rounds: one), in a fixed order; each
    # with the longest limit asked in it, every response cut to its own
    by_stop: dict[tuple[str, ...], list[int]] = {}
    for k, slot in enumerate(asked):
        by_stop.setdefault(tuple(sorted(set(slot.request.stop))), []).append(k)  # type: ignore[union-attr]
    completions: list[Any] = [None] * len(asked)
    for j, (stops, ks) in enumerate(sorted(by_stop.items())):
        params = replace(
            sampling,
            seed=sampling.seed + j,
            max_new_tokens=max(limits[k] for k in ks),
            stop=tuple(sampling.stop) + stops,
        )
        for k, completion in zip(ks, engine.generate([prompts[k] for k in ks], params), strict=True):
            completions[k] = completion
    for slot, completion, limit in zip(asked, completions, limits, strict=True):
        if len(completion.token_ids) > limit:  # asked for fewer than the call's longest
            completion = replace(
                completion, token_ids=completion.token_ids[:limit], logprobs=completion.logprobs[:limit], finished=False
            )
        answer = slot.transcript.take(completion)
        slot.answers.append(answer)
        content = answer.content if (answer.content or not answer.calls) else None
        n = len(slot.answers)
        body = messages.completion(model, content, answer.calls, answer.finish, answer.prompt, answer.tokens, n)
        gate.answer(slot, (200, body))


def _row(
    spec: EpisodeSpec, slot: Slot | None, task: AgentTask | None, outcome: Any, score: Any, success_at: float | None
) -> dict[str, Any]:
    """The episode's trajectory row (the fault row of one that failed); with a reward function
    and `success_at`, its success is a score at or above it."""
    if slot is None:
        return outcome  # the environment failed at once: its fault row
    assert task is not None and slot.env is not None
    env = slot.env
    try:
        # what a program does after its episode ended (calls refused: context, turns) costs nothing
        fault = slot.fault or (None if slot.end else outcome.fault)
        if fault is None and not slot.answers:
            fault = "the program made no call to the endpoint"
        total = sum(s.reward for s in env.steps)  # the environment's (0 where the program never acted)
        if fault is None and score is not None:
            try:
                given = score(task, outcome.result)
            except Exception as exc:  # the user's reward function: one line, the episode
                fault = f"the reward function raised {one_line(exc)}"
            else:
                if isinstance(given, bool) or not isinstance(given, (int, float)) or not math.isfinite(given):
                    fault = f"no reward: the reward function returned {given!r}, not a finite number"
                else:
                    total = float(given)
        if fault is not None:
            return {**fault_row(spec, RuntimeError(fault)), "end_reason": f"{AGENT_FAULT}: " + " ".join(fault.split())}
        success = env.success if success_at is None or score is None else total >= success_at
        return _played(spec, slot, total, success)
    finally:
        env.close()


def _played(spec: EpisodeSpec, slot: Slot, total: float, success: bool) -> dict[str, Any]:
    env = slot.env
    assert env is not None
    turns: list[dict[str, Any]] = []
    for k, answer in enumerate(slot.answers):
        steps = [s for s in env.steps if s.call == k]
        turns.append(
            {
                "turn": k + 1,
                "state": answer.asked,
                "response": answer.text,
                "think": "",
                "answer": answer.content or "",
                "actions": [s.action for s in steps],
                "valid": [s.valid for s in steps],
                "executed": sum(s.valid for s in steps),
                "reward": sum(s.reward for s in steps),
                "format_ok": answer.parsed,
                "finished": answer.finish != "length",
                "tokens": answer.tokens,
            }
        )
    end = slot.end or ("success" if success else "done" if env.done else "program")
    return {
        **spec_columns(spec),
        **slot.transcript.row(),
        "turns": turns,
        "score": total,
        "success": success,
        "num_turns": len(turns),
        "num_actions": sum(s.valid for s in env.steps),
        "format_valid_rate": sum(t["format_ok"] for t in turns) / len(turns) if turns else 0.0,
        "end_reason": end,
        "explored_turns": [],
        "truncated_context": slot.end == "context",
        "truncated_response": any(not t["finished"] for t in turns),
        "drift": sum(a.drift for a in slot.answers),
    }
