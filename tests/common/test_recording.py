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
