"""Probes answer what the environment itself says about its state."""

from __future__ import annotations

import re

import envs
from envs.frozenlake import MOVES as LAKE_MOVES
from envs.probes import TASKS, probes, reached_states
from envs.sokoban_gen import MOVES as BOX_MOVES


def test_lake_neighbours_are_what_a_step_leads_to():
    for env in reached_states("frozenlake", {"slippery": False}, list(range(60))):
        answers = {q: a for task, q, a in probes(env) if task == "neighbour"}
        for m in LAKE_MOVES:
            probe = envs.make("frozenlake", slippery=False)
            probe.reset(0)
            probe.holes, probe.goal, probe.pos = env.holes, env.goal, env.pos
            before = probe.pos
            probe.step(m)
            said = answers[f"What is one step {m} of you?"]
            if probe.pos == before:
                assert said == "edge"
            elif probe.pos in probe.holes:
                assert said == "hole"
            elif probe.pos == probe.goal:
                assert said == "goal"
            else:
                assert said == "ice"


def test_lake_position_and_goal_offset_match_the_grid():
    for env in reached_states("frozenlake", {"slippery": False, "render": "grid"}, list(range(40))):
        grid = env.render().splitlines()
        row = next(i for i, line in enumerate(grid) if "P" in line)
        col = grid[row].index("P")
        found = {task: a for task, _, a in probes(env)}
        assert found["position"] == f"row {row + 1}, column {col + 1}"
        goal_row = next(i for i, line in enumerate(grid) if "G" in line)
        dr, dc = (int(x) for x in re.findall(r"[+-]?\d+", found["goal_offset"]))
        assert (dr, dc) == (goal_row - row, grid[goal_row].index("G") - col)


def test_sokoban_neighbours_follow_the_room():
    for env in reached_states("sokoban", None, list(range(30))):
        rows = env.render().splitlines()
        w = env.width
        r, c = env.player // w, env.player % w
        answers = {q: a for task, q, a in probes(env) if task == "neighbour"}
        for m, (dr, dc) in zip(BOX_MOVES, ((-1, 0), (1, 0), (0, -1), (0, 1))):
            symbol = rows[r + dr][c + dc]
            said = answers[f"What is one step {m} of you?"]
            assert (symbol == "#") == (said == "wall"), (symbol, said)
            assert (symbol in "X√") == said.startswith("box"), (symbol, said)


def test_every_env_with_probes_gives_every_task_and_no_probe_names_a_move_to_make():
    for name, tasks in TASKS.items():
        env = next(reached_states(name, None, [7]))
        found = probes(env)
        assert {t for t, _, _ in found} == set(tasks)
        assert not any(a in (*LAKE_MOVES, *BOX_MOVES) for _, _, a in found)
