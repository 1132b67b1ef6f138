"""Room by room: did RL change which eval episodes succeed? For each run, the episodes
evaluated at two policy versions on the same env, options, seed and sample are paired:
solved at both, gained (failed at the first, solved at the second), lost, and solved at
neither; McNemar's exact test (a two-sided binomial test on the gained and lost pairs)
says how likely so lopsided a split is if RL changed nothing. The last line pools the
runs' counts, with no p: runs evaluated on the same rooms are not independent pairs, and
McNemar's test over their pooled discordant pairs would claim more than they show.

A change in the success rate of a few points over 128 rooms is within noise; this says
whether the rooms moved one way (RL learned something) or both ways (it reshuffled).

    python experiments/paired.py --catalog ROOT --like 'seeds-smollm2-sokoban-%' --from 0 --to 20
    python experiments/paired.py --catalog ROOT --runs RUN1,RUN2 --from 0 --to 10 --env sokoban --save NAME
    python experiments/paired.py --catalog ROOT --runs RUN2 --from 0 --to 20 --also NAME   # and a saved table's runs
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Collection
from dataclasses import dataclass
from math import comb
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from catalog.query import query
from catalog.store import existing_catalog
from common.recording import Recorder, run_script, same_measure

RESULTS = Path(__file__).resolve().parent / "results"

PAIRS = """
with e as (
  select run, policy_version v, env, env_options, seed, sample, bool_or(success) ok, count(*) n from evals
  where {which} and temperature = {temperature} {env} and policy_version in ({a}, {b}) group by all
)
select x.run, r.seed run_seed, x.ok a, y.ok b, x.n + y.n - 2 extra
from e x join e y using (run, env, env_options, seed, sample) left join runs r using (run)
where x.v = {a} and y.v = {b}
"""


@dataclass
class Split:
    """The paired episodes of one run (or of all): solved at both, gained, lost, neither."""

    both: int = 0
    gained: int = 0
    lost: int = 0
    neither: int = 0

    @property
    def pairs(self) -> int:
        return self.both + self.gained + self.lost + self.neither

    def add(self, a: bool, b: bool) -> None:
        if a and b:
            self.both += 1
        elif b:
            self.gained += 1
        elif a:
            self.lost += 1
        else:
            self.neither += 1


def mcnemar_exact(gained: int, lost: int) -> float:
    """Two-sided exact McNemar p: the chance, with each discordant pair gained or lost at
    1/2, of a split at least as lopsided as this one (1.0 when there is none)."""
    n, k = gained + lost, min(gained, lost)
    if n == 0:
        return 1.0
    tail = sum(comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def summed(splits: Collection[Split]) -> Split:
    """Several runs' splits as one."""
    return Split(*(sum(getattr(s, f) for s in splits) for f in ("both", "gained", "lost", "neither")))


def tally(rows: list[dict]) -> tuple[dict[tuple[int, str], Split], Split]:
    """`PAIRS`' rows as a split per (run seed, run), -1 where the run has no seed, and in all."""
    runs: dict[tuple[int, str], Split] = {}
    for r in rows:
        seed = r["run_seed"] if r["run_seed"] is not None else -1
        runs.setdefault((seed, r["run"]), Split()).add(r["a"], r["b"])
    return runs, summed(runs.values())


def joined(
    runs: dict[tuple[int, str], Split], head: str, names: str, results: Path = RESULTS
) -> dict[tuple[int, str], Split]:
    """`runs` and those of tables this script saved (`--also`: runs whose catalog is gone). A
    table must pair the same versions at the same temperature and env (its first line is `head`);
    a run or seed in two places is an error."""
    out = dict(runs)
    for name in (n.strip() for n in names.split(",") if n.strip()):
        path = results / f"{name}.json"
        try:
            record = json.loads(path.read_text())
            theirs = {
                (int(d["seed"]), run): Split(d["both"], d["gained"], d["lost"], d["neither"])
                for run, d in record["data"].items()
            }
            their_head = record["printed"][0]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            sys.exit(f"error: --also {name}: {path} is not a table this script saved ({type(exc).__name__}: {exc})")
        same_measure(f"--also {name}", their_head, head)
        seeds, names_in = {s for s, _ in out if s >= 0}, {r for _, r in out}
        twice = sorted(f"{run} (seed {seed})" for seed, run in theirs if run in names_in or seed in seeds)
        if twice:
            sys.exit(f"error: --also {name}: {', '.join(twice)} already counted; keep one of the two")
        out |= theirs
    return out


def _row(name: str, s: Split, pooled: bool = False) -> str:
    """A table row; a pooled row (runs on the same rooms) gets no McNemar p (module docstring)."""
    gain = 100 * (s.gained - s.lost) / s.pairs
    p = "- (rooms shared)" if pooled else f"{mcnemar_exact(s.gained, s.lost):.3f}"
    return f"| {name} | {s.pairs} | {s.both} | {s.gained} | {s.lost} | {s.neither} | {gain:+.1f} | {p} |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--catalog", default=None)
    ap.add_argument("--like", default=None, help="the runs, as a SQL LIKE on the run name")
    ap.add_argument("--runs", default=None, help="instead of --like: the runs, comma-separated names")
    ap.add_argument("--from", dest="a", type=int, required=True, help="the first policy version")
    ap.add_argument("--to", dest="b", type=int, required=True, help="the second policy version")
    ap.add_argument("--temperature", type=float, default=0.5)
    ap.add_argument(
        "--env", default=None, help="only this eval env (default: every env both versions were evaluated on)"
    )
    ap.add_argument("--save", default=None, help="also write what it prints to experiments/results/<SAVE>.json")
    ap.add_argument(
        "--also", default=None, help="add the runs of saved tables experiments/results/<NAME>.json (comma-separated)"
    )
    args = ap.parse_args()
    if bool(args.like) == bool(args.runs):
        sys.exit("error: name the runs with one of --like PATTERN or --runs NAME,NAME")
    if args.a == args.b:
        sys.exit(f"error: --from {args.a} --to {args.b}: expected two different policy versions")
    names = [r.strip().replace("'", "") for r in (args.runs or "").split(",") if r.strip()]
    which = (
        "run in (" + ", ".join(f"'{n}'" for n in names) + ")"
        if names
        else f"run like '{args.like.replace(chr(39), '')}'"
    )
    env = f"and env = '{args.env.replace(chr(39), '')}'" if args.env else ""
    sql = PAIRS.format(which=which, temperature=float(args.temperature), env=env, a=args.a, b=args.b)
    rows = query(existing_catalog(args.catalog), sql).to_pylist()
    if not rows:
        sys.exit(
            f"error: no episode of {args.runs or args.like} was evaluated at both v{args.a} and v{args.b} "
            f"at T={args.temperature:g}{' on ' + args.env if args.env else ''}"
        )
    if any(r["extra"] for r in rows):  # an episode evaluated twice at one version: the pairing is not one to one
        sys.exit("error: some episodes were evaluated more than once at one version; name the runs one eval at a time")
    runs, total = tally(rows)
    head = f"eval episodes paired v{args.a} -> v{args.b} (T={args.temperature:g}{', ' + args.env if args.env else ''})"
    if args.also:
        runs = joined(runs, head, args.also)
        total = summed(runs.values())
    out = Recorder()
    out.line(head)
    out.line("| run | pairs | solved both | gained | lost | neither | net points | McNemar p |")
    out.line("|---|---|---|---|---|---|---|---|")
    for seed, run in sorted(runs):
        out.line(_row(run + (f" (seed {seed})" if seed >= 0 else ""), runs[seed, run]))
    if len(runs) > 1:
        out.line(_row("all", total, pooled=True))
    if args.save:
        out.save(args.save, {run: {"seed": seed, **vars(s)} for (seed, run), s in runs.items()})


if __name__ == "__main__":
    run_script(main)
