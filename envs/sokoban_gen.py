"""Sokoban rooms from a seed: random-walk topology, then reverse play.

Cells are integers ``row * width + col``; the border is always wall, so a step from
an inner cell never leaves the grid. Generation:

1. Carve floor with a random walk inside the border.
2. Put the boxes on random targets (the solved state).
3. Breadth-first search backwards from *every* solved state at once (one per player
   position) with reverse moves: a plain step, or a step that pulls the box behind
   the player. Each reverse move undoes a legal forward move, so every state found
   is solvable, and its BFS depth is exactly its optimal solution length in moves.
4. Start from a random state whose optimal length lies in
   [min_solution_steps, max_solution_steps]. Bounding the length (default: the
   the reference's 10-action budget) is what lets an agent reach 100% success, which the
   reference's generator (search depth 300, no bound) cannot guarantee.
"""

from __future__ import annotations

import random
from collections import deque

State = tuple[int, tuple[int, ...]]  # (player cell, sorted box cells)
MOVES = ("Up", "Down", "Left", "Right")


def offsets(width: int) -> tuple[int, int, int, int]:
    """Cell offsets of Up, Down, Left, Right."""
    return (-width, width, -1, 1)


def carve(rng: random.Random, height: int, width: int, steps: int) -> frozenset[int]:
    """Floor cells of a random walk inside the border."""
    r, c = rng.randint(1, height - 2), rng.randint(1, width - 2)
    floor = {r * width + c}
    dr, dc = rng.choice(((-1, 0), (1, 0), (0, -1), (0, 1)))
    for _ in range(steps):
        if rng.random() < 0.35:
            dr, dc = rng.choice(((-1, 0), (1, 0), (0, -1), (0, 1)))
        if 1 <= r + dr <= height - 2 and 1 <= c + dc <= width - 2:
            r, c = r + dr, c + dc
            floor.add(r * width + c)
    return frozenset(floor)


def reverse_depths(
    floor: frozenset[int], targets: tuple[int, ...], width: int, max_depth: int | None
) -> dict[State, int]:
    """Optimal solution length of every state that can reach the solved state
    (up to `max_depth` moves), by multi-source BFS over reverse moves."""
    offs = offsets(width)
    dist: dict[State, int] = {(p, targets): 0 for p in floor if p not in targets}
    frontier = list(dist)
    depth = 0
    while frontier and (max_depth is None or depth < max_depth):
        depth += 1
        nxt = []
        for p, boxes in frontier:
            for o in offs:
                q = p + o
                if q not in floor or q in boxes:
                    continue
                s = (q, boxes)
                if s not in dist:
                    dist[s] = depth
                    nxt.append(s)
                b = p - o
                if b in boxes:  # pull the box behind the player onto p
                    pulled = (q, tuple(sorted(p if x == b else x for x in boxes)))
                    if pulled not in dist:
                        dist[pulled] = depth
                        nxt.append(pulled)
        frontier = nxt
    return dist


def generate(
    seed: int,
    height: int,
    width: int,
    num_boxes: int,
    min_steps: int,
    max_steps: int | None,
    walk_steps: int | None = None,
    attempts: int = 200,
) -> tuple[frozenset[int], tuple[int, ...], State, int]:
    """(floor, targets, start state, optimal length) of the room for `seed`."""
    rng = random.Random(seed)
    walk = walk_steps or int(1.7 * (height + width))
    for _ in range(attempts):
        floor = carve(rng, height, width, walk)
        if len(floor) < 2 * num_boxes + 1:
            continue
        targets = tuple(sorted(rng.sample(sorted(floor), num_boxes)))
        dist = reverse_depths(floor, targets, width, max_steps)
        candidates = sorted(s for s, d in dist.items() if d >= max(1, min_steps))
        if candidates:
            start = rng.choice(candidates)
            return floor, targets, start, dist[start]
    raise RuntimeError(
        f"no {height}x{width} room with {num_boxes} boxes and a solution of "
        f"{min_steps}..{max_steps} moves after {attempts} attempts (seed {seed})"
    )


def solve(
    floor: frozenset[int], targets: tuple[int, ...], start: State, width: int, limit: int = 200_000
) -> list[str] | None:
    """A shortest action sequence from `start` to the solved state (forward BFS),
    or None if there is none within `limit` states."""
    goal = tuple(sorted(targets))
    if start[1] == goal:
        return []
    offs = offsets(width)
    parent: dict[State, tuple[State, str] | None] = {start: None}
    queue = deque([start])
    while queue and len(parent) < limit:
        state = queue.popleft()
        p, boxes = state
        for move, o in zip(MOVES, offs):
            q = p + o
            if q not in floor:
                continue
            if q in boxes:
                b2 = q + o
                if b2 not in floor or b2 in boxes:
                    continue
                nxt = (q, tuple(sorted(b2 if x == q else x for x in boxes)))
            else:
                nxt = (q, boxes)
            if nxt in parent:
                continue
            parent[nxt] = (state, move)
            if nxt[1] == goal:
                path = []
                cur: State = nxt
                while parent[cur] is not None:
                    prev, mv = parent[cur]  # type: ignore[misc]
                    path.append(mv)
                    cur = prev
                return path[::-1]
            queue.append(nxt)
    return None
