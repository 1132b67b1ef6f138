"""Probe pretraining: a fresh model learns to read states before it learns to act.

Each sample is the agent's own first-turn prompt for a state (the rollout's tokens:
system, task, legend, ``Turn 1:`` and the state) with a question about that state
appended to the user message (`envs.probes`), and the answer as the response
(``<answer>`` is the generation prefix, so the response is ``<answer text></answer>``).
Only the answer's tokens are in the loss. What transfers to the policy is how the
model attends from the end of the prompt back into the state: the rollout asks for
an action at exactly that place.

`accuracy` is exact match per sample (every answer token the argmax), teacher
forced, per task, on held-out states.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import torch

from envs.probes import probes, reached_states
from stages.agent import prompts
from stages.agent.chat import Chat
from stages.agent.loop import AgentConfig
from stages.training.sft import Sample, sft_batch, sft_loss


def probe_samples(
    name: str,
    options: dict | None,
    seeds: list[int],
    tokenizer: Any,
    agent: AgentConfig,
    per_chat: int = 1,
    balance: bool = False,
) -> list[tuple[str, Sample]]:
    """(task, sample) for the probes of the states reached from `seeds`. With `per_chat`
    k > 1, a state's probes go k to a chat in an order drawn per state: the first asked in
    the prompt, each further one as the next user message after the answer before it,
    every answer in the loss (the task is the chat's tasks joined by "+"). A state's
    prompt is then read once for k answers instead of once for each. With `balance`
    (k > 1), each neighbour answer's tokens weigh in the loss as `answer_balance` would
    draw it asked alone: the inverse of its answer's share (`Sample.weights`)."""
    chat = Chat(tokenizer, agent.think)
    replies: dict[str, list[int]] = {}  # an answer's tokens by its text: a few answers recur
    # (tasks, shot, the first question's user message, the chat's (question, answer)s) of every chat
    chats: list[tuple[str, tuple[str, str] | None, str, list[tuple[str, str]]]] = []
    for env in reached_states(name, options, seeds):
        budget = env.budget
        per_turn = agent.max_actions_per_turn or budget.max_actions_per_turn
        intro = prompts.first_message(env, per_turn)
        left = agent.max_actions_per_traj or budget.max_actions_per_traj
        example = env.example_action if agent.example else ""
        turn = prompts.turn_message(1, env.render(), left, agent.think, agent.max_new_tokens, example)
        shot = (
            prompts.example_exchange(env, per_turn, left, agent.think, agent.max_new_tokens) if agent.example else None
        )
        asked = probes(env)
        if per_chat > 1:
            random.Random(f"probe-order:{env.content()}:{env.render()}").shuffle(asked)
        for start in range(0, len(asked), per_chat):
            part = asked[start : start + per_chat]
            tasks = "+".join(t for t, _, _ in part)
            pairs = [(f"Question: {question}", answer) for _, question, answer in part]
            chats.append((tasks, shot, f"{intro}{turn}\n{pairs[0][0]}", pairs))
    firsts = chat.first_many([user for _, _, user, _ in chats], [shot for _, shot, _, _ in chats])
    # several to a chat: neighbour answers weighed by the inverse of their share, as `answer_balance` draws them
    shares: Counter[str] = Counter()
    if balance and per_chat > 1:
        shares.update(
            a for tasks, _, _, pairs in chats for (_, a), t in zip(pairs, tasks.split("+")) if t == "neighbour"
        )
    total = sum(shares.values())
    out = []
    for opened, (tasks, _, _, pairs) in zip(firsts, chats):
        ids: list[int] = []
        labels: list[int] = []
        weights: list[float] = []
        reply: list[int] = []
        for k, ((message, answer), task) in enumerate(zip(pairs, tasks.split("+"))):
            prompt = opened if k == 0 else chat.next(message, reply)
            text = f"{answer}{prompts.ANSWER_CLOSE}"
            if text not in replies:
                replies[text] = chat.encode(text)
            reply = replies[text]
            ids += prompt + reply
            labels += [-100] * len(prompt) + reply
            if total:
                weights += [total / (len(shares) * shares[answer]) if task == "neighbour" else 1.0] * len(reply)
        out.append((tasks, Sample(ids, labels, weights=tuple(weights))))
    return out


def answer_balance(data: list[tuple[str, Sample]], task: str = "neighbour") -> list[float] | None:
    """A draw weight per sample for `train`: the samples of `task` (asked one to a chat)
    are drawn as often by answer (a neighbour question's `ice`, `edge`, `hole`, `goal`:
    each answer's weight the inverse of its share), the task as often as before; every
    other sample weighs 1. Without it a lake's neighbour answer is `ice` two times in
    three and `hole` one in ten, and a model that answers `ice` from anywhere is right
    where it matters least (docs/method.md#pretraining). A sample whose tokens carry
    weights already (`probe_samples`, several to a chat) is drawn at 1; None where no
    sample is left to balance (a uniform draw)."""

    def answer(sample: Sample) -> tuple[int, ...]:
        return tuple(t for t in sample.labels if t != -100)

    counts = Counter(answer(s) for t, s in data if t == task and not s.weights)
    if not counts:
        return None
    total = sum(counts.values())
    return [total / (len(counts) * counts[answer(s)]) if t == task and not s.weights else 1.0 for t, s in data]


def accuracy(model: Any, data: Iterable[tuple[str, Sample]], pad: int, batch_size: int = 32) -> dict[str, float]:
    """Exact-match accuracy of each task (every answer token the model's argmax)."""
    hits: dict[str, list[bool]] = defaultdict(list)
    items = list(data)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for start in range(0, len(items), batch_size):
            chunk = items[start : start + batch_size]
            ids, attn, labels = sft_batch([s for _, s in chunk], pad)
            predicted = model(input_ids=ids, attention_mask=attn).logits[:, :-1].argmax(-1)
            target = labels[:, 1:]
            ok = ((predicted == target) | (target == -100)).all(-1)
            for (task, _), good in zip(chunk, ok.tolist()):
                hits[task].append(bool(good))
    model.train(was_training)
    return {task: sum(v) / len(v) for task, v in sorted(hits.items())}


def draw(n: int, k: int, generator: torch.Generator, odds: torch.Tensor | None = None) -> list[int]:
    """`k` indices into `n` items, with replacement: uniform, or in proportion to `odds`."""
    if odds is None:
        return torch.randint(n, (k,), generator=generator).tolist()
    return torch.multinomial(odds, k, replacement=True, generator=generator).tolist()


def train(
    model: Any,
    data: list[Sample],
    steps: int,
    batch_size: int,
    opt: Any,
    pad: int,
    generator: torch.Generator,
    action_weight: float = 0.0,
    sched: Any = None,
    on_step: Callable[[int], None] | None = None,
    weights: list[float] | None = None,
) -> list[float]:
    """`steps` optimiser steps on batches drawn with replacement from `data`, uniformly
    or by `weights` (`opt`, `generator` and the learning-rate schedule `sched`, if any,
    are the caller's, so training can go on in parts); the losses. `on_step(n)` is told
    after each step."""
    model.train()
    losses = []
    odds = torch.tensor(weights, dtype=torch.float64) if weights is not None else None
    for _ in range(steps):
        batch = [data[j] for j in draw(len(data), batch_size, generator, odds)]
        loss = sft_loss(model, batch, pad, action_weight)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if sched is not None:
            sched.step()
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(len(losses))
    return losses
