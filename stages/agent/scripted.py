"""Scripted answers: a `Respond` that plays a scripted policy (`envs.policies`)
through the agent loop, in the answer format (the warm start's demonstrations)."""

from __future__ import annotations

import copy
import random
from typing import Any

from envs.policies import Policy, make_policy
from stages.agent import prompts
from stages.agent.loop import Episode, Respond
from stages.engines import Completion


def scripted(
    name: str, tokenizer: Any, think: bool, seed: int, random_share: float = 0.0, noise: str = "random_valid"
) -> Respond:
    """A `Respond` that answers with a scripted policy's actions, as token ids, each
    replaced with probability `random_share` by the action of the `noise` policy
    (`envs.policies`). It plans a turn's actions on a copy of the environment."""
    rng = random.Random(f"demo:{seed}")
    policies: dict[int, Policy] = {}
    noisy = make_policy(noise, seed=seed)

    def respond(active: list[Episode]) -> list[Completion]:
        out = []
        for e in active:
            if id(e) not in policies:
                policies[id(e)] = make_policy(name, seed=rng.randrange(2**31))
            policy = policies[id(e)]
            budget = min(e.per_turn, e.per_traj - e.actions_taken)
            k = rng.randint(1, budget) if name == "random_valid" else budget
            sim, actions = copy.deepcopy(e.env), list[str]()
            while len(actions) < k and not sim.done:
                planned = policy(sim)
                actions.append(noisy(sim) if random_share and rng.random() < random_share else planned)
                sim.step(actions[-1])
            thought = e.env.reasoning() or f" My moves: {', '.join(actions)}. "
            text = prompts.render_response(actions, think, thought)
            ids = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
            out.append(Completion(ids, [0.0] * len(ids), True))
        return out

    return respond
