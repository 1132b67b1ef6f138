"""`pipeline validate`'s check of every preset under configs/ (the spec loaded, its
`extends` chain merged, every stage's config and wiring checked) against reading and
parsing the same YAML file: seconds a preset (best of `--repeat`, the process's imports
aside) and the ratio; the slowest presets first. The check reads no model file (a real
model's tokenizer is checked when a run starts), so it stays well under a second.

    python bench/validate.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

import stages  # noqa: E402, F401  (registers the stages the specs name)
from common.recording import fastest  # noqa: E402
from pipelines.graph.load import load_spec  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    os.chdir(ROOT / "configs")
    presets = sorted(p.name for p in Path(".").glob("*.yaml"))
    load_spec(presets[0])  # the first call's lazy imports are not a preset's
    rows = []
    for name in presets:
        checked = fastest(lambda: load_spec(name), args.repeat)
        parsed = fastest(lambda: yaml.safe_load(Path(name).read_text()), args.repeat)
        rows.append((checked, parsed, name))
    rows.sort(reverse=True)
    print(f"{'preset':<44}{'validate s':>11}{'YAML s':>9}{'ratio':>8}")
    for checked, parsed, name in rows:
        print(f"{name:<44}{checked:>11.3f}{parsed:>9.4f}{checked / parsed:>7.0f}x")
    print(f"{len(rows)} presets: slowest {rows[0][0]:.3f} s ({rows[0][2]}), all {sum(r[0] for r in rows):.2f} s")


if __name__ == "__main__":
    main()
