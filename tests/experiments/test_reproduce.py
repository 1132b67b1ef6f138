"""experiments/reproduce.py: a mistake is one line, and no scratch catalog is left behind
(issue 93: `-o run.seed=x` and `-o k=@v` gave tracebacks; four catalogs stayed in /tmp)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "reproduce.py"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--spec", "starpo.yaml", "-o", "run.seed=x"], "-o run.seed=x: expected an integer"),
        (["--spec", "starpo.yaml", "-o", "k=@v"], "is not a YAML value"),
        (["--spec", "no-such-spec.yaml"], "no-such-spec"),
    ],
)
def test_a_mistake_is_one_line_and_leaves_no_scratch(tmp_path, args, said):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-1500:]
    assert said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not list(tmp_path.glob("reproduce-*"))
    assert tempfile.gettempdir() != str(tmp_path)
