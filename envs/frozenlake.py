"""FrozenLake (docs/method.md#environments): walk from the start to the goal over a 4x4 lake with holes.

A random solvable map per seed (each tile frozen with p=0.8, random start and
goal). Slippery: the intended move happens with p=1/3, each perpendicular move with
p=1/3; a move into the edge stays put. +1 on reaching the goal (success); the
episode also ends in a hole.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from envs.base import Budget, TextEnv

MOVES = ("Left", "Down", "Right", "Up")
DELTAS = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}
PERPENDICULAR = {"Left": ("Up", "Down"), "Right": ("Up", "Down"), "Up": ("Left", "Right"), "Down": ("Left", "Right")}
RENDERINGS = ("grid", "positions", "local", "relative")
SYMBOLS = {"player": "P", "frozen": "_", "hole": "O", "goal": "G", "player_in_hole": "X", "player_on_goal": "√"}


@dataclass(frozen=True)
class FrozenLakeOptions:
    size: int = 4  # the lake is size x size
    p_frozen: float = 0.8  # probability that a tile is frozen (not a hole)
    slippery: bool = True  # 1/3 intended, 1/3 each perpendicular; False: deterministic
    render: str = "grid"  # grid: rows of symbols; positions: where you, the goal and the holes are;
    #                           local: what each move leads to, and how many moves the goal is away in each direction
    #                           (the offset in action words: a text-only rule copies them, docs/method.md);
    #                           relative: what each move leads to, and the goal's offset as signed row and column
    #                           numbers (no action word says where the goal is)

    def __post_init__(self) -> None:
        if self.size < 2:
            raise ValueError(f"size must be >= 2, got {self.size}")
        if not 0.0 < self.p_frozen <= 1.0:
            raise ValueError(f"p_frozen must be in (0, 1], got {self.p_frozen}")
        if self.render not in RENDERINGS:
            raise ValueError(f"render must be one of {', '.join(RENDERINGS)}, got '{self.render}'")


def reachable(holes: frozenset[tuple[int, int]], size: int, start: tuple[int, int], goal: tuple[int, int]) -> bool:
    """Whether the goal can be reached from the start without entering a hole."""
    seen, queue = {start}, deque([start])
    while queue:
        r, c = queue.popleft()
        if (r, c) == goal:
            return True
        for dr, dc in DELTAS.values():
            n = (r + dr, c + dc)
            if 0 <= n[0] < size and 0 <= n[1] < size and n not in holes and n not in seen:
                seen.add(n)
                queue.append(n)
    return False


def move(pos: tuple[int, int], action: str, size: int) -> tuple[int, int]:
    dr, dc = DELTAS[action]
    return min(max(pos[0] + dr, 0), size - 1), min(max(pos[1] + dc, 0), size - 1)


class FrozenLake(TextEnv):
    budget = Budget(max_turns=5, max_actions_per_traj=10, max_actions_per_turn=5)

    def __init__(self, opts: FrozenLakeOptions) -> None:
        super().__init__()
        self.opts = opts
        self.size = opts.size
        self.holes: frozenset[tuple[int, int]] = frozenset()
        self.start = self.goal = self.pos = (0, 0)

    @property
    def action_words(self) -> tuple[str, ...]:
        return MOVES

    @property
    def instructions(self) -> str:
        s = SYMBOLS
        if self.opts.render != "grid":
            slip = " The ice is slippery: you may move sideways instead." if self.opts.slippery else ""
            what = {
                "positions": "where you, the goal and the holes are (row 1 is the top, column 1 the left)",
                "local": "how far the goal is in each direction and what each move leads to: ice, a hole, the "
                "goal, or the edge (you stay)",
                "relative": "the goal's offset from you in rows (+ is towards the bottom) and columns (+ is "
                "towards the right), and what each move leads to: ice, a hole, the goal, or the edge (you stay)",
            }[self.opts.render]
            return (
                f"You are walking on a frozen lake of {self.size} rows and {self.size} columns. Reach the goal "
                f"without falling into a hole.{slip} The state says {what}. Actions: {', '.join(MOVES)}."
            )
        slip = (
            " The ice is slippery: you may move perpendicular to the direction you intended."
            if self.opts.slippery
            else ""
        )
        return (
            f"You are walking on a frozen lake. Reach the goal without falling into a hole.{slip} "
            f"Symbols: {s['player']} is you, {s['frozen']} is frozen ice, {s['hole']} is a hole, "
            f"{s['goal']} is the goal, {s['player_in_hole']} is you in a hole, "
            f"{s['player_on_goal']} is you on the goal. Actions: {', '.join(MOVES)}."
        )

    def _reset(self, seed: int) -> None:
        n = self.size
        cells = [(r, c) for r in range(n) for c in range(n)]
        while True:
            start, goal = self.rng.sample(cells, 2)
            holes = frozenset(x for x in cells if x not in (start, goal) and self.rng.random() > self.opts.p_frozen)
            if reachable(holes, n, start, goal):
                break
        self.holes, self.start, self.goal, self.pos = holes, start, goal, start

    def content(self) -> str:
        return f"{self.size}|{self.start}|{self.goal}|{sorted(self.holes)}"

    def transitions(self, pos: tuple[int, int], action: str) -> list[tuple[float, tuple[int, int]]]:
        """(probability, next position) of taking `action` at `pos`."""
        if not self.opts.slippery:
            return [(1.0, move(pos, action, self.size))]
        return [(1 / 3, move(pos, a, self.size)) for a in (action, *PERPENDICULAR[action])]

    def render(self) -> str:
        if self.opts.render == "positions":
            return self._positions()
        if self.opts.render in ("local", "relative"):
            return self._local()
        s, rows = SYMBOLS, []
        for r in range(self.size):
            row = []
            for c in range(self.size):
                x = (r, c)
                if x == self.pos:
                    row.append(
                        s["player_in_hole"]
                        if x in self.holes
                        else s["player_on_goal"]
                        if x == self.goal
                        else s["player"]
                    )
                else:
                    row.append(s["hole"] if x in self.holes else s["goal"] if x == self.goal else s["frozen"])
            rows.append("".join(row))
        return "\n".join(rows)

    def _positions(self) -> str:
        def at(x: tuple[int, int]) -> str:
            return f"row {x[0] + 1}, column {x[1] + 1}"

        where = " (in a hole)" if self.pos in self.holes else " (on the goal)" if self.pos == self.goal else ""
        holes = "; ".join(at(h) for h in sorted(self.holes)) or "none"
        return f"You: {at(self.pos)}{where}.\nGoal: {at(self.goal)}.\nHoles: {holes}."

    def _local(self) -> str:
        (r, c), (gr, gc) = self.pos, self.goal
        if self.pos in self.holes or self.pos == self.goal:
            return "You are in a hole." if self.pos in self.holes else "You are on the goal."
        if self.opts.render == "relative":
            goal = f"Goal: rows {gr - r:+d}, columns {gc - c:+d}."
        else:
            away = [
                f"{abs(d)} {word}"
                for d, word in ((gr - r, "Down" if gr > r else "Up"), (gc - c, "Right" if gc > c else "Left"))
                if d
            ]
            goal = f"Goal: {', '.join(away)}."
        return f"{goal}\n{'. '.join(f'{a}: {self._leads_to(a)}' for a in MOVES)}."

    def safe_moves(self) -> list[str]:
        """The moves that neither enter a hole nor hit the edge (what the `local` and
        `relative` views label `hole` and `edge`), in `MOVES` order."""
        return [a for a in MOVES if self._leads_to(a) not in ("hole", "edge")]

    def _leads_to(self, action: str) -> str:
        x = move(self.pos, action, self.size)
        return "edge" if x == self.pos else "hole" if x in self.holes else "goal" if x == self.goal else "ice"

    def _step(self, action: str) -> tuple[float, dict[str, Any]]:
        actual = action
        if self.opts.slippery:
            actual = self.rng.choice((action, *PERPENDICULAR[action]))
        self.pos = move(self.pos, actual, self.size)
        reward = 0.0
        if self.pos == self.goal:
            reward, self.done, self.success = 1.0, True, True
        elif self.pos in self.holes:
            self.done = True
        return reward, {"actual_move": actual, "action_effective": True}
