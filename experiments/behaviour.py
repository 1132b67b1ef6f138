"""What a run's policy does at eval, early and late: every eval turn checked by rule
against the state it saw, and a few episodes quoted.

For each policy version that was evaluated (or those of `--versions`), at the lowest
eval temperature, per environment, it prints:

- the `eval_behaviour` view's shares (moves into a hole or the edge, toward the goal);
- a rule check of every turn, from the state's text alone:
  FrozenLake's `relative` view states the goal's offset and what each move leads to, so
  a move is *toward* the goal when it shortens that offset and *safe* when its label is
  neither `hole` nor `edge`; the bandit's state names the two arms in an order, so an
  answer either names the arm listed first or not (a policy that reads only the order
  answers first always, or never); Sokoban's `grid` view is read cell by cell, and a move
  is on a *shortest path* when the BFS solver's shortest solution from the room as shown
  is one move shorter after it, *blocked* when it changes nothing (a wall, or a box that
  cannot move) and a *dead push* when it sends a box off target into a corner; a failed
  episode is *stuck* when its last three turns are one blocked move again and again.

  Where the response has a thought (`<think>`), the words of it that are action words
  of the state (moves; arm names) are checked too: does the thought name the move or
  arm it then answers (`thought = answer`), and does it name anything the state does not
  offer (`thought names no action`)? A thought that is a template reads the same
  whatever the state: `distinct thoughts` counts them;
- `--episodes` episodes (the lowest validation seeds, sample 0) with, turn by turn, the
  state, the response and the rule's verdict.

    python experiments/behaviour.py --catalog cat --run smollm2-lake
    python experiments/behaviour.py --catalog cat --run starpo-smollm2-bandit --episodes 2 --env bandit
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from catalog.query import query
from catalog.store import existing_catalog
from common.errors import UserError
from common.recording import Recorder
from envs.bandit import arms_of
from envs.sokoban import BLOCKED, CORNERED, VOCABS, Sokoban, SokobanOptions
from envs.sokoban_gen import solve

MOVES = ("Left", "Down", "Right", "Up")
_OFFSET = re.compile(r"Goal: rows ([+-]?\d+), columns ([+-]?\d+)")
_LABEL = re.compile(r"\b(Left|Down|Right|Up): (\w+)")

TURNS = """
select policy_version as version, env, seed, sample, u.turn as turn, u.state as state, u.response as response,
       u.think as think, u.actions[1] as action, success
from (select *, unnest(turns) as u from evals
      where run = '{run}' and temperature = (select min(temperature) from evals where run = '{run}'))
order by version, env, seed, sample, turn
"""

BEHAVIOUR = """
select policy_version as version, env, temperature, turns, round(into_hole, 3) as into_hole,
       round(into_edge, 3) as into_edge, round(toward_goal, 3) as toward_goal
from eval_behaviour where run = '{run}' order by version, env, temperature
"""


@dataclass(frozen=True)
class Verdict:
    """A turn's action read against its state: `kind` is `lake`, `bandit` or `sokoban`
    (else nothing is checked)."""

    kind: str
    toward: bool | None = None  # lake: shortens the goal's offset; sokoban: on a shortest path
    safe: bool | None = None  # lake: leads to neither a hole nor the edge; sokoban: not blocked
    label: str | None = None  # lake, sokoban: what the move leads to
    first: bool | None = None  # bandit: the arm listed first
    offered: tuple[str, ...] = ()  # the state's action words

    def words(self) -> str:
        if self.kind == "lake":
            return f"{self.label or '?'}, {'toward' if self.toward else 'away from'} the goal"
        if self.kind == "bandit":
            return "the arm listed first" if self.first else "the arm listed second"
        if self.kind == "sokoban":
            return f"{self.label or '?'}, {'on' if self.toward else 'off'} a shortest path"
        return ""


def room(state: str) -> Sokoban | None:
    """The Sokoban room a `grid` state shows (either symbol set), or None if it is not one."""
    rows = (state or "").split("\n")
    for vocab, symbols in VOCABS.items():
        if len(rows) < 3 or len({len(r) for r in rows}) != 1 or set("".join(rows)) - set(symbols.values()):
            continue
        if {*rows[0], *rows[-1], *(r[0] + r[-1] for r in rows)} - {symbols["wall"], symbols["wall"] * 2}:
            continue  # a room is walled in (a FrozenLake grid is not)
        env = Sokoban(SokobanOptions(dim_room=(len(rows), len(rows[0])), vocab=vocab))
        cells = {k: {i for i, ch in enumerate("".join(rows)) if ch == symbols[k]} for k in symbols}
        players = cells["player"] | cells["player_on_target"]
        if len(players) != 1:
            continue
        env.floor = frozenset(range(env.height * env.width)) - cells["wall"]
        env.targets = tuple(sorted(cells["target"] | cells["box_on_target"] | cells["player_on_target"]))
        env.player, env.boxes = players.pop(), cells["box"] | cells["box_on_target"]
        return env
    return None


def _moves_left(env: Sokoban) -> int | None:
    path = solve(env.floor, env.targets, env.state, env.width)
    return None if path is None else len(path)


def _episodes(judged: list[tuple[dict, Verdict]]) -> list[list[tuple[dict, Verdict]]]:
    """Turns grouped into their episodes, in turn order (`TURNS` is sorted so)."""
    by: dict[tuple, list[tuple[dict, Verdict]]] = {}
    for t, v in judged:
        by.setdefault((t["seed"], t["sample"]), []).append((t, v))
    return list(by.values())


def _stuck(episode: list[tuple[dict, Verdict]], last: int = 3) -> bool:
    """An episode whose last `last` turns are one blocked move, again and again: the room
    did not change, so a policy that sees only the room as it is answers it again."""
    tail = episode[-last:]
    return len(tail) == last and len({t["action"] for t, _ in tail}) == 1 and all(v.safe is False for _, v in tail)


def verdict(state: str, action: str | None) -> Verdict:
    """Check `action` against what `state` shows (by rule, nothing else read)."""
    arms = arms_of(state or "")
    if arms:
        return Verdict("bandit", first=action == arms[0], offered=arms)
    env = room(state) if action in MOVES else None
    if env is not None:
        before, label = _moves_left(env), env._leads_to(action)
        env._step(action)  # type: ignore[arg-type]
        after = _moves_left(env)
        on_path = before is not None and after is not None and after == before - 1
        return Verdict("sokoban", toward=on_path, safe=label not in BLOCKED, label=label, offered=MOVES)
    offset = _OFFSET.search(state or "")
    if offset:
        dr, dc = int(offset.group(1)), int(offset.group(2))
        labels = dict(_LABEL.findall(state))
        toward = (action == "Down" and dr > 0) or (action == "Up" and dr < 0)
        toward = toward or (action == "Right" and dc > 0) or (action == "Left" and dc < 0)
        label = labels.get(action or "")
        return Verdict("lake", toward=toward, safe=label not in (None, "hole", "edge"), label=label, offered=MOVES)
    return Verdict("")


def named(thought: str, offered: tuple[str, ...]) -> list[str]:
    """The state's action words that `thought` names, in order of first mention."""
    found = [(m.start(), w) for w in offered for m in [re.search(rf"\b{re.escape(w)}\b", thought)] if m]
    return [w for _, w in sorted(found)]


def share(flags: list[bool]) -> str:
    return f"{100 * sum(flags) / len(flags):.1f}%" if flags else "-"


def table(rows: list[dict[str, object]], out: Recorder) -> None:
    if not rows:
        return
    names = [c for c in rows[0] if any(row[c] not in (None, "-") for row in rows)]  # not a column of another env's
    out.line("| " + " | ".join(names) + " |")
    out.line("|" + "---|" * len(names))
    for row in rows:
        out.line("| " + " | ".join("" if row[c] is None else str(row[c]) for c in names) + " |")
    out.line()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--catalog", default=None, help="catalog root (default: $PIPELINE_CATALOG or ./pipeline-data)")
    parser.add_argument("--run", required=True)
    parser.add_argument("--env", default=None, help="only this eval environment")
    parser.add_argument("--versions", type=int, nargs="*", default=None, help="default: the first and the last")
    parser.add_argument("--episodes", type=int, default=3, help="episodes quoted per version")
    parser.add_argument("--save", default=None, help="also write what it prints to experiments/results/<SAVE>.json")
    args = parser.parse_args()
    catalog = existing_catalog(args.catalog)
    run = args.run.replace("'", "''")
    try:
        turns = query(catalog, TURNS.format(run=run)).to_pylist()
        behaviour = query(catalog, BEHAVIOUR.format(run=run)).to_pylist()
    except UserError as exc:
        raise SystemExit(f"{catalog.root.uri}: {exc}") from None
    if args.env:
        turns = [t for t in turns if t["env"] == args.env]
        behaviour = [b for b in behaviour if b["env"] == args.env]
    if not turns:
        raise SystemExit(
            f"{catalog.root.uri}: run '{args.run}' has no eval turns" + (f" on {args.env}" if args.env else "")
        )
    evaluated = sorted({t["version"] for t in turns})
    versions = args.versions if args.versions is not None else sorted({evaluated[0], evaluated[-1]})
    out = Recorder()
    table([b for b in behaviour if b["version"] in versions], out)

    checks = []
    for version in versions:
        for env in sorted({t["env"] for t in turns if t["version"] == version}):
            these = [t for t in turns if t["version"] == version and t["env"] == env]
            judged = [(t, verdict(t["state"], t["action"])) for t in these]
            thoughts = [(t, v) for t, v in judged if (t["think"] or "").strip()]
            names = [(named(t["think"], v.offered), t["action"]) for t, v in thoughts]
            lake = [v for _, v in judged if v.kind == "lake"]
            bandit = [v for _, v in judged if v.kind == "bandit"]
            rooms = [v for _, v in judged if v.kind == "sokoban"]
            failed = _episodes([(t, v) for t, v in judged if v.kind == "sokoban" and not t["success"]])
            checks.append(
                {
                    "version": version,
                    "env": env,
                    "turns": len(these),
                    "toward the goal": share([bool(v.toward) for v in lake]),
                    "safe": share([bool(v.safe) for v in lake]),
                    "toward and safe": share([bool(v.toward and v.safe) for v in lake]),
                    "arm listed first": share([bool(v.first) for v in bandit]),
                    "on a shortest path": share([bool(v.toward) for v in rooms]),
                    "blocked": share([not v.safe for v in rooms]),
                    "dead push": share([v.label == CORNERED for v in rooms]),
                    "failures stuck": share([_stuck(e) for e in failed]),
                    "with a thought": share([bool((t["think"] or "").strip()) for t in these]),
                    "distinct thoughts": len({t["think"].strip() for t, _ in thoughts}) if thoughts else "-",
                    "thought = answer": share([bool(n) and n[-1] == a for n, a in names]),
                    "thought names no action": share([not n for n, _ in names]),
                }
            )
    table(checks, out)

    for version in versions:
        seeds = sorted({(t["env"], t["seed"]) for t in turns if t["version"] == version and t["sample"] == 0})
        for env, seed in seeds[: args.episodes]:
            episode = [
                t
                for t in turns
                if t["version"] == version and t["env"] == env and t["seed"] == seed and t["sample"] == 0
            ]
            out.line(
                f"version {version}, {env}, validation seed {seed}: {'success' if episode[0]['success'] else 'failure'}"
            )
            for t in episode:
                state = " / ".join(line for line in (t["state"] or "").splitlines() if line)
                said = verdict(t["state"], t["action"]).words()
                out.line(f"  turn {t['turn']}: {state}")
                out.line(f"    -> {t['response']!r}" + (f"  ({said})" if said else ""))
            out.line()
    if args.save:
        out.save(args.save)


if __name__ == "__main__":
    main()
