"""Sokoban (docs/method.md#environments): push every box onto a target.

Rewards: -0.1 per step, +1 for a box pushed onto a target, -1 for a box pushed off
one, +10 when all boxes are on targets (success); optionally `bump_penalty` more for a
move that changes nothing. Rooms come from
`envs.sokoban_gen` (always solvable, optionally with a bounded solution length).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from envs.base import Budget, TextEnv
from envs.sokoban_gen import MOVES, State, generate, offsets

#: symbol sets: the reference's default, and a "new vocabulary" (the XSB file symbols)
VOCABS: dict[str, dict[str, str]] = {
    "default": {
        "wall": "#",
        "empty": "_",
        "target": "O",
        "box_on_target": "√",
        "box": "X",
        "player": "P",
        "player_on_target": "S",
    },
    "new": {
        "wall": "#",
        "empty": "-",
        "target": ".",
        "box_on_target": "*",
        "box": "$",
        "player": "@",
        "player_on_target": "+",
    },
}
RENDERINGS = ("grid", "relative")
#: the `relative` view's labels of a move that changes nothing, and of a push that leaves a box
#: where it never moves again (`Sokoban.safe_moves` and the text-only rules of `envs.sokoban_rules`)
WALL, STUCK, CORNERED = "wall", "a box that cannot move", "a box, pushed into a corner"
BLOCKED = (WALL, STUCK)
LEGEND_NAMES = {
    "wall": "wall",
    "empty": "empty floor",
    "target": "target",
    "box_on_target": "box on target",
    "box": "box",
    "player": "you",
    "player_on_target": "you on a target",
}


@dataclass(frozen=True)
class SokobanOptions:
    dim_room: tuple[int, int] = (6, 6)  # rows, columns (border walls included)
    num_boxes: int = 1
    max_solution_steps: int | None = 10  # bound on the optimal solution (moves); None: no bound
    min_solution_steps: int = 3  # rooms solvable in 1-2 moves are trivial; excluded by default
    vocab: str = "default"  # "default" or "new"
    walk_steps: int | None = None  # random-walk length; default 1.7 * (rows + cols)
    render: str = "grid"  # grid: rows of symbols (the reference's); relative: where each box and each empty
    #                       target is from you as signed rows and columns, and what each move leads to
    #                       (a wall, floor, a target, or a box and where the push would send it)
    bump_penalty: float = 0.0  # added to a move's reward when it leaves everything where it was (into a wall,
    #                            or a box that cannot move); 0: the reference's rewards (such a move costs a step)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dim_room", tuple(self.dim_room))
        if len(self.dim_room) != 2 or min(self.dim_room) < 4:
            raise ValueError(f"dim_room must be two sizes >= 4, got {self.dim_room}")
        if self.num_boxes < 1:
            raise ValueError(f"num_boxes must be >= 1, got {self.num_boxes}")
        if self.vocab not in VOCABS:
            raise ValueError(f"vocab must be one of {sorted(VOCABS)}, got '{self.vocab}'")
        if self.max_solution_steps is not None and self.max_solution_steps < max(1, self.min_solution_steps):
            raise ValueError("max_solution_steps must be >= min_solution_steps and >= 1")
        if self.render not in RENDERINGS:
            raise ValueError(f"render must be one of {', '.join(RENDERINGS)}, got '{self.render}'")
        if self.bump_penalty > 0:
            raise ValueError(f"bump_penalty must be <= 0, got {self.bump_penalty}")


class Sokoban(TextEnv):
    budget = Budget(max_turns=5, max_actions_per_traj=10, max_actions_per_turn=5)

    def __init__(self, opts: SokobanOptions) -> None:
        super().__init__()
        self.opts = opts
        self.height, self.width = opts.dim_room
        self.symbols = VOCABS[opts.vocab]
        self.floor: frozenset[int] = frozenset()
        self.targets: tuple[int, ...] = ()
        self.player, self.boxes = 0, set[int]()
        self.optimal_steps = 0

    @property
    def action_words(self) -> tuple[str, ...]:
        return MOVES

    @property
    def instructions(self) -> str:
        if self.opts.render == "relative":
            return (
                f"You are solving a Sokoban puzzle in a room of {self.height} rows and {self.width} columns. Push "
                "every box onto a target. You can push a box but not pull it, and you cannot push a box into a "
                "wall or another box. The state says where each box and each empty target is from you in rows "
                "(+ is towards the bottom) and columns (+ is towards the right), and what each move leads to: "
                "a wall (you stay), floor, a target, or a box and where the push sends it (onto floor, onto a "
                "target, or into a corner it can never leave). "
                f"Actions: {', '.join(MOVES)}."
            )
        legend = ", ".join(f"{self.symbols[k]} is {LEGEND_NAMES[k]}" for k in LEGEND_NAMES)
        return (
            "You are solving a Sokoban puzzle. Push every box onto a target. You can push a box "
            "but not pull it, and you cannot push a box into a wall or another box. "
            f"Symbols: {legend}. Actions: {', '.join(MOVES)}."
        )

    def _reset(self, seed: int) -> None:
        o = self.opts
        self.floor, self.targets, start, self.optimal_steps = generate(
            seed, self.height, self.width, o.num_boxes, o.min_solution_steps, o.max_solution_steps, o.walk_steps
        )
        self.player, self.boxes = start[0], set(start[1])

    def content(self) -> str:
        return f"{self.height}x{self.width}|{sorted(self.floor)}|{sorted(self.targets)}|{self.state}"

    @property
    def state(self) -> State:
        return self.player, tuple(sorted(self.boxes))

    def render(self) -> str:
        if self.opts.render == "relative":
            return self._relative()
        s, rows = self.symbols, []
        for r in range(self.height):
            row = []
            for c in range(self.width):
                i = r * self.width + c
                on_target = i in self.targets
                if i not in self.floor:
                    row.append(s["wall"])
                elif i == self.player:
                    row.append(s["player_on_target"] if on_target else s["player"])
                elif i in self.boxes:
                    row.append(s["box_on_target"] if on_target else s["box"])
                else:
                    row.append(s["target"] if on_target else s["empty"])
            rows.append("".join(row))
        return "\n".join(rows)

    def _offset(self, cell: int) -> str:
        (pr, pc), (r, c) = divmod(self.player, self.width), divmod(cell, self.width)
        return f"rows {r - pr:+d}, columns {c - pc:+d}"

    def _relative(self) -> str:
        lines = [f"Box: {self._offset(b)}." for b in sorted(self.boxes) if b not in self.targets]
        lines += [f"Box on a target: {self._offset(b)}." for b in sorted(self.boxes) if b in self.targets]
        lines += [f"Target: {self._offset(t)}." for t in self.targets if t not in self.boxes and t != self.player]
        if self.player in self.targets:
            lines.append("You stand on a target.")
        return "\n".join([*lines, ". ".join(f"{m}: {self._leads_to(m)}" for m in MOVES) + "."])

    def safe_moves(self) -> list[str]:
        """The moves that change the room without ruining it: none into a wall or a box that
        cannot move, and no push into a corner off its target (what the `relative` view labels
        `wall`, `a box that cannot move` and `a box, pushed into a corner`), in `MOVES` order."""
        return [m for m in MOVES if self._leads_to(m) not in (*BLOCKED, CORNERED)]

    def _leads_to(self, move: str) -> str:
        o = offsets(self.width)[MOVES.index(move)]
        q = self.player + o
        if q not in self.floor:
            return WALL
        if q not in self.boxes:
            return "target" if q in self.targets else "floor"
        p = q + o
        if p not in self.floor or p in self.boxes:
            return STUCK
        if p in self.targets:
            return "a box, pushed onto a target"
        return CORNERED if self._corner(p) else "a box, pushed onto floor"

    def _corner(self, cell: int) -> bool:
        """Whether `cell` has a wall above or below and one left or right: a box pushed
        there never moves again, so a room whose target it is not cannot be solved."""
        w = self.width
        return (cell - w not in self.floor or cell + w not in self.floor) and (
            cell - 1 not in self.floor or cell + 1 not in self.floor
        )

    def _step(self, action: str) -> tuple[float, dict[str, Any]]:
        o = offsets(self.width)[MOVES.index(action)]
        q, reward, moved = self.player + o, -0.1, False
        if q in self.floor and q not in self.boxes:
            self.player, moved = q, True
        elif q in self.boxes and q + o in self.floor and q + o not in self.boxes:
            self.boxes.remove(q)
            self.boxes.add(q + o)
            reward += (q + o in self.targets) - (q in self.targets)
            self.player, moved = q, True
        if not moved:
            reward += self.opts.bump_penalty
        on_target = sum(b in self.targets for b in self.boxes)
        if on_target == len(self.targets):
            reward += 10.0
            self.done = self.success = True
        return reward, {"action_effective": moved, "boxes_on_target": on_target}
