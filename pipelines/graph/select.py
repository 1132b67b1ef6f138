"""Running part of a pipeline: ``--to``, ``--only`` and ``--from`` (`pipeline run`, `pipeline show`).

    pipeline run starpo.yaml --to warmstart          # the warm start and what it needs
    pipeline run starpo.yaml --only eval -o eval.temperature=0   # every eval again, nothing else
    pipeline run starpo.yaml --from update           # the updates and what follows them

Each flag takes node names (comma-separated or repeated) and selects steps of the plan:

- ``--to N``: N's steps and every step they read from, directly or through others.
- ``--only N``: N's steps alone. Every step they read from must be in the catalog;
  otherwise one line names the first missing one and nothing runs.
- ``--from N``: N's steps and every step that reads from them, directly or through
  others. The steps they read from that are not selected must be in the catalog, as
  for ``--only``.

A selected step whose result is in the catalog is still taken from it, as in a full
run: a key names its result, so running the step again would compute the same
thing (to compute one again, remove it: `pipeline gc --apply` after the run no
longer uses it). Steps that are not selected are recorded in the run's steps when
their result is in the catalog (status ``cached``), so the run's views keep showing
them; the others are left out of the record.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from catalog.keys import parse_address
from common.errors import UserError, did_you_mean
from pipelines.graph.plan import Step


@dataclass(frozen=True)
class Selection:
    """The nodes of each flag (empty: the flag was not given)."""

    to: tuple[str, ...] = ()
    only: tuple[str, ...] = ()
    start: tuple[str, ...] = ()  # --from

    @staticmethod
    def of(to: Iterable[str] = (), only: Iterable[str] = (), start: Iterable[str] = ()) -> Selection:
        """From the command line's values (each may hold comma-separated names)."""

        def names(values: Iterable[str]) -> tuple[str, ...]:
            return tuple(n.strip() for v in values for n in v.split(",") if n.strip())

        return Selection(names(to), names(only), names(start))

    def __bool__(self) -> bool:
        return bool(self.to or self.only or self.start)


def _producers(steps: list[Step]) -> list[list[int]]:
    """For each step, the indices of the steps whose results it reads."""
    made: dict[str, int] = {}
    for i, s in enumerate(steps):
        made.setdefault(s.key, i)
    return [
        sorted({made[parse_address(a)[0]] for a in s.inputs.values() if parse_address(a)[0] in made}) for s in steps
    ]


def select(steps: list[Step], selection: Selection, in_catalog: Callable[[str], bool]) -> list[bool]:
    """Which steps of the plan `selection` runs (module docstring); raises `UserError`
    for an unknown node, a selection of nothing, or a missing input of ``--only`` /
    ``--from``."""
    if not selection:
        return [True] * len(steps)
    nodes = list(dict.fromkeys(s.node.name for s in steps))
    flags = (("--to", selection.to), ("--only", selection.only), ("--from", selection.start))
    for flag, names in flags:
        for name in names:
            if name not in nodes:
                raise UserError(f"{flag} {name}: no such node in this pipeline{did_you_mean(name, nodes)}")
    reads = _producers(steps)
    readers: list[list[int]] = [[] for _ in steps]
    for i, ins in enumerate(reads):
        for j in ins:
            readers[j].append(i)

    def closure(seeds: set[int], edges: list[list[int]]) -> set[int]:
        todo, seen = list(seeds), set(seeds)
        while todo:
            for j in edges[todo.pop()]:
                if j not in seen:
                    seen.add(j)
                    todo.append(j)
        return seen

    def of(names: tuple[str, ...]) -> set[int]:
        return {i for i, s in enumerate(steps) if s.node.name in names}

    wanted = closure(of(selection.to), reads) | of(selection.only) | closure(of(selection.start), readers)
    if not wanted:
        raise UserError("the selection has no step to run (an every-N node with fewer iterations?)")
    for flag, names in flags[1:]:
        for i in sorted(of(names) if flag == "--only" else closure(of(names), readers)):
            for j in reads[i]:
                if j not in wanted and not in_catalog(steps[j].key):
                    raise UserError(
                        f"{flag} {','.join(names)}: step {steps[i].label} reads from {steps[j].label} "
                        f"({steps[j].key}), which is not in the catalog; run it first (e.g. --to {steps[j].node.name})"
                    )
    return [i in wanted for i in range(len(steps))]
