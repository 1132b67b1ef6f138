"""common/recording.py: a result file names the command that printed it, as it can be typed again."""

from __future__ import annotations

import json
import shlex
import sys

from common.recording import Recorder


def test_the_saved_command_types_back_to_the_same_arguments(tmp_path, monkeypatch, capsys) -> None:
    script = tmp_path / "experiment.py"
    argv = [str(script), "--recipe", "vanilla StarPO (GRPO, KL 0.001)=sweep:x", "--like", "it's-%"]
    monkeypatch.setattr(sys, "argv", argv)
    out = Recorder()
    out.line("| 1 | 2.5% |")
    path = out.save("quoted")
    assert path == tmp_path / "results" / "quoted.json"
    record = json.loads(path.read_text())
    assert record["printed"] == ["| 1 | 2.5% |"]
    typed = shlex.split(record["command"])
    assert typed[0] == "python" and typed[2:] == argv[1:]  # a label with spaces stays one argument
    assert "written:" in capsys.readouterr().out


def test_a_changed_result_file_is_not_dirty_code(tmp_path) -> None:
    """A script that saves several results is still at its code's commit after the first:
    `OUTPUTS` are left out of the dirty check, and a changed script is not."""
    import subprocess

    from common.recording import OUTPUTS

    def git(*args: str) -> int:
        return subprocess.run(["git", "-C", str(tmp_path), *args], capture_output=True).returncode

    for name in ("experiments/results/a.json", "docs/images/a.png", "experiments/seeds.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("0")
    git("init", "-q")
    git("add", "-A")
    assert git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x") == 0
    (tmp_path / "experiments/results/a.json").write_text("1")
    (tmp_path / "docs/images/a.png").write_text("1")
    assert git("diff", "--quiet", "HEAD", "--", ".", *OUTPUTS) == 0
    (tmp_path / "experiments/seeds.py").write_text("1")
    assert git("diff", "--quiet", "HEAD", "--", ".", *OUTPUTS) == 1


def test_fastest_is_the_least_of_its_tries(monkeypatch):
    import types

    from common import recording

    clock = iter([0.0, 3.0, 10.0, 11.5, 20.0, 22.0])  # three calls of 3, 1.5 and 2 seconds
    monkeypatch.setattr(recording, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    calls = []
    assert recording.fastest(lambda: calls.append(1), tries=3) == 1.5 and len(calls) == 3


def test_a_record_is_portable_and_carries_its_provenance(tmp_path, monkeypatch, capsys) -> None:
    """A reader can type the command again on another machine: the catalog is `CATALOG`, a
    scratch plot outside the checkout is left out, a path inside it is relative."""
    from pathlib import Path

    from common.recording import portable

    root = Path(__file__).resolve().parents[2]
    words = shlex.split(
        portable(
            [
                "experiments/seeds.py",
                "--catalog",
                "/work/runs/lake",
                "--out",
                "/tmp/f.png",
                "--title",
                "a b",
                "--out2",
                str(root / "docs" / "images" / "x.png"),
            ]
        )
    )
    assert words == [
        "python",
        "experiments/seeds.py",
        "--catalog",
        "CATALOG",
        "--title",
        "a b",
        "--out2",
        "docs/images/x.png",
    ]
    assert "CATALOG" in portable(["x.py", "--catalog=/srv/cat"])
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "e.py"), "--catalog", str(tmp_path / "cat")])
    out = Recorder()
    out.line("x")
    record = json.loads(out.save("prov").read_text())
    assert record["command"].endswith("--catalog CATALOG") and str(tmp_path) not in record["command"].split(" ", 2)[2]
    assert record["status"] == "current" and record["superseded_by"] is None and record["caveats"] == []
    assert record["machine"].endswith("-core CPU") or "GPU" in record["machine"]
    assert record["wall_s"] >= 0


def test_a_record_names_the_kind_of_cpu_its_floats_repeat_on(tmp_path, monkeypatch, capsys) -> None:
    from common.machine import cpu, kernel_kind

    monkeypatch.setattr(sys, "argv", [str(tmp_path / "e.py")])
    record = json.loads(Recorder().save("kind").read_text())
    name, flags = cpu()
    assert record["cpu"].startswith(f"{name}: ") and all(f in record["cpu"] for f in flags)
    zen4 = "model name\t: AMD EPYC 9R14\nflags\t\t: fpu sse avx2 fma avx512f avx512_bf16 sha_ni\n"
    assert kernel_kind(zen4).startswith("AMD EPYC 9R14: avx2 fma avx512f avx512_bf16")
    assert kernel_kind("model name : Old\nflags : fpu sse\n").startswith("Old: no kernel flags")
