"""The default run at several run seeds (`pipeline sweep sweeps/seeds.yaml`): eval success
by policy version, per seed and as a mean with its 95% interval over seeds (Student t on the
logit scale, so it stays inside 0-100%; the gain's on the differences:
`pipelines.report.intervals`), printed as a table and drawn with its band.

    python experiments/seeds.py --catalog ROOT [--sweep seeds] [--out docs/images/starpo-seeds.png]
    python experiments/seeds.py --catalog ROOT --sweep seeds-local         # sweeps/seeds-local.yaml
    python experiments/seeds.py --catalog ROOT --runs seeds-5eca15b5,seeds-d22b9215   # these runs only
    python experiments/seeds.py --catalog ROOT --sweep seeds-smollm2-bandit --env bandit_reversed   # one eval env
    python experiments/seeds.py --from-saved seeds-starpo --save seeds-starpo   # again from a saved table
    python experiments/seeds.py --catalog ROOT --sweep seeds-smollm2-sokoban --also smollm2-sokoban-s0   # and a saved seed

A sweep's trials run as <sweep>-<trial id>, so `--sweep seeds` never mixes in the trials of
`seeds-local` kept in the same catalog; `--like` picks runs by any SQL LIKE pattern instead.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from catalog.query import query
from catalog.store import existing_catalog
from common.recording import Recorder, run_script, same_measure
from pipelines.report.intervals import mean_interval, rate_interval, shown


def _measured(args: argparse.Namespace) -> tuple[str, list[int], list[int], dict[tuple[int, int], float], int]:
    """From the catalog: (the table's first line, the seeds, the versions every seed has,
    success by (seed, version), the fewest episodes behind one of those rates)."""
    names = [r.strip().replace("'", "") for r in (args.runs or "").split(",") if r.strip()]
    which = (
        "e.run in (" + ", ".join(f"'{n}'" for n in names) + ")"
        if names
        else f"e.run like '{args.like.replace(chr(39), '')}'"
        if args.like
        else f"regexp_full_match(e.run, '{re.escape(args.sweep).replace(chr(39), '')}-[0-9a-f]+')"
    )
    rows = query(
        existing_catalog(args.catalog),
        "select r.seed, e.policy_version v, avg(e.success::int) s, count(*) n from evals e join runs r using (run) "
        f"where {which} and e.run not like '%-shared' "
        f"and e.temperature = {float(args.temperature)} "
        + (f"and e.env = '{args.env.replace(chr(39), '')}' " if args.env else "")
        + "group by all order by all",
    ).to_pylist()
    if not rows:
        sys.exit(
            f"error: no eval at T={args.temperature:g}{' on ' + args.env if args.env else ''} of the runs of {args.runs or args.like or 'sweep ' + args.sweep} in the catalog"
        )
    seeds = sorted({r["seed"] for r in rows})
    versions = sorted(
        {r["v"] for r in rows if all(any(x["seed"] == s and x["v"] == r["v"] for x in rows) for s in seeds)}
    )
    head = f"eval success (T={args.temperature:g}{', ' + args.env if args.env else ''}) by policy version, run seeds {seeds}"
    at = {(r["seed"], r["v"]): r["s"] for r in rows}
    return head, seeds, versions, at, min(r["n"] for r in rows if r["v"] in versions)


def _saved(
    name: str, episodes: int | None
) -> tuple[str, list[int], list[int], dict[tuple[int, int], float], int, dict]:
    """The same from a result file this script saved (`--from-saved`), and who measured it."""
    path = Path(__file__).resolve().parent / "results" / f"{name}.json"
    try:
        record = json.loads(path.read_text())
        data = record["data"]
        seeds, versions, success = data["seeds"], data["versions"], data["success"]
    except (OSError, ValueError, KeyError) as exc:
        sys.exit(f"error: --from-saved {name}: {path} is not a table this script saved ({type(exc).__name__}: {exc})")
    n = data.get("episodes") or episodes
    if not n:
        sys.exit(f"error: --from-saved {name}: its rates do not say how many episodes each is of; pass --episodes N")
    at = {(s, v): success[i][j] for i, s in enumerate(seeds) for j, v in enumerate(versions)}
    measured = data.get("measured") or {k: record[k] for k in ("command", "commit", "date")}
    return record["printed"][0], seeds, versions, at, int(n), measured


def _joined(
    measured: tuple[str, list[int], list[int], dict[tuple[int, int], float], int], names: str
) -> tuple[str, list[int], list[int], dict[tuple[int, int], float], int]:
    """The catalog's seeds and those of saved tables (`--also`: seeds measured in a catalog
    that is gone), over the versions all of them have; a seed in two places is an error."""
    head, seeds, versions, at, episodes = measured
    for name in (n.strip() for n in names.split(",") if n.strip()):
        their_head, more, their_versions, their_at, their_episodes, _ = _saved(name, None)
        same_measure(f"--also {name}", their_head, head)  # another temperature or environment: not the same rates
        twice = sorted(set(more) & set(seeds))
        if twice:
            sys.exit(f"error: --also {name}: seed(s) {twice} are in the catalog's runs too; keep one of the two")
        seeds, at = sorted(seeds + more), at | their_at
        versions = [v for v in versions if v in their_versions]
        episodes = min(episodes, their_episodes)
    if not versions:
        sys.exit(f"error: --also {names}: no policy version is in every table")
    head = re.sub(r"run seeds \[.*\]$", f"run seeds {seeds}", head)
    return head, seeds, versions, at, episodes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--catalog", default=None)
    ap.add_argument("--sweep", default="seeds", help="the sweep whose trials to read (runs <sweep>-<trial id>)")
    ap.add_argument("--like", default=None, help="instead of --sweep: the runs, as a SQL LIKE on the run name")
    ap.add_argument("--runs", default=None, help="instead of --sweep: the runs, comma-separated names")
    ap.add_argument("--temperature", type=float, default=0.5)
    ap.add_argument("--env", default=None, help="only this eval env (default: every env the runs evaluate on)")
    ap.add_argument("--out", default=None, help="draw the curves and the band into this PNG")
    ap.add_argument("--title", default="The default run", help="the plot's title, before 'at N run seeds'")
    ap.add_argument("--save", default=None, help="also write what it prints to experiments/results/<SAVE>.json")
    ap.add_argument(
        "--from-saved",
        default=None,
        help="instead of a catalog: the success rates of experiments/results/<NAME>.json (intervals computed again)",
    )
    ap.add_argument("--episodes", type=int, default=None, help="with --from-saved: episodes per rate, if not saved")
    ap.add_argument(
        "--also",
        default=None,
        help="with a catalog: add the seeds of saved tables experiments/results/<NAME>.json (comma-separated)",
    )
    args = ap.parse_args()
    out = Recorder()
    measured: dict = {}
    if args.from_saved:
        head, seeds, versions, at, episodes, measured = _saved(args.from_saved, args.episodes)
    else:
        head, seeds, versions, at, episodes = _measured(args)
        if args.also:
            head, seeds, versions, at, episodes = _joined((head, seeds, versions, at, episodes), args.also)
    out.line(head)
    out.line("| version | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | 95% interval over seeds |")
    out.line("|---" * (len(seeds) + 3) + "|")
    band = []
    for v in versions:
        xs = [at[(s, v)] for s in seeds]
        mean, bounds = statistics.fmean(xs), rate_interval(xs, episodes)
        band.append((v, mean, *(bounds or (mean, mean))))
        cells = " | ".join(f"{100 * x:.1f}%" for x in xs)
        out.line(f"| {v} | {cells} | {100 * mean:.1f}% | {shown(bounds)} |")
    if len(versions) > 1:  # one version (a warm start alone) has no gain to show
        gains = [at[(s, versions[-1])] - at[(s, versions[0])] for s in seeds]
        out.line(
            f"gain v{versions[0]} -> v{versions[-1]}: "
            + ", ".join(f"{100 * g:+.1f}" for g in gains)
            + f" points; mean {100 * statistics.fmean(gains):+.1f}, 95% interval over seeds {shown(mean_interval(gains), '+')}"
        )
    if args.save:
        data = {
            "seeds": seeds,
            "versions": versions,
            "success": [[at[(s, v)] for v in versions] for s in seeds],
            "episodes": episodes,
        }
        out.save(args.save, data | ({"measured": measured} if measured else {}))
    if args.out and band:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
        for s in seeds:
            ax.plot(versions, [at[(s, v)] for v in versions], alpha=0.5, linewidth=1, label=f"seed {s}")
        ax.plot(versions, [b[1] for b in band], color="black", linewidth=2, label="mean")
        if len(seeds) > 1:
            ax.fill_between(
                versions, [b[2] for b in band], [b[3] for b in band], color="grey", alpha=0.25, label="95% interval"
            )
        ax.set_ylim(0, 1)
        ax.set_xlabel("policy version (iteration)")
        ax.set_ylabel(f"eval success (T={args.temperature:g})")
        ax.set_title(f"{args.title} at {len(seeds)} run seeds")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(args.out)
        print(f"drawn: {args.out}")


if __name__ == "__main__":
    run_script(main)
