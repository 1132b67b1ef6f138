"""Code fingerprints: a change to what a stage's code does changes its result keys;
comments, docstrings and formatting do not."""

from __future__ import annotations

import sys
import textwrap

import pytest

from common import code


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A throwaway package `fp_demo` on sys.path: a stage module importing a helper
    (inside a function) and an unrelated module."""
    root = tmp_path / "fp_demo"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "helper.py").write_text("def scale(x):\n    return 2 * x\n")
    (root / "unrelated.py").write_text("Z = 1\n")
    (root / "stage.py").write_text(
        '"""A stage."""\n\ndef run(x):\n    from fp_demo.helper import scale\n\n    return scale(x)\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield root
    for name in [m for m in sys.modules if m.startswith("fp_demo")]:
        del sys.modules[name]


def _fresh(module: str) -> str:
    code.forget()
    return code.fingerprint(module)


def test_the_closure_follows_imports_inside_functions(package):
    assert code.closure("fp_demo.stage") == ["fp_demo.helper", "fp_demo.stage"]


def test_a_change_in_an_imported_module_changes_the_fingerprint(package):
    before = _fresh("fp_demo.stage")
    (package / "helper.py").write_text("def scale(x):\n    return 3 * x\n")
    assert _fresh("fp_demo.stage") != before


def test_comments_docstrings_and_formatting_do_not(package):
    before = _fresh("fp_demo.stage")
    (package / "stage.py").write_text(
        textwrap.dedent('''\
        """Another docstring."""


        def run(x):  # a comment
            """Now documented."""
            from fp_demo.helper import scale
            return scale(
                x
            )
        ''')
    )
    (package / "unrelated.py").write_text("Z = 2\n")  # not imported by the stage
    assert _fresh("fp_demo.stage") == before


def test_every_registered_stage_has_a_fingerprint_in_its_keys():
    import stages  # noqa: F401
    from catalog.keys import result_key
    from stages.registry import STAGES

    rollout = STAGES["rollout"]
    assert len(rollout.code) == 16 and rollout.code != STAGES["filter"].code
    args = ("rollout", rollout.version, {}, {}, 0, 0)
    assert result_key(*args, code=rollout.code) != result_key(*args, code="0" * 16)


def _choices_of(cls: type) -> list:
    """Every `Choices` registry a config dataclass (and those nested in it) selects from."""
    import dataclasses
    import typing

    found = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("choices") is not None:
            found.append(f.metadata["choices"])
        for t in (hints[f.name], *typing.get_args(hints[f.name])):
            if dataclasses.is_dataclass(t) and isinstance(t, type):
                found += _choices_of(t)
    return found


def test_every_registry_target_is_in_the_closure_of_the_stages_that_can_choose_it():
    import stages  # noqa: F401
    from stages.registry import BUILT_IN

    checked = 0
    for name, st in BUILT_IN.items():
        reach = code.closure(st.fn.__module__)
        for registry in _choices_of(st.config):
            for choice in registry.values():
                module = choice.target.partition(":")[0]
                assert module in reach, f"stage {name}: {registry.kind} '{choice.name}' ({module}) not in its closure"
                checked += 1
    assert checked >= 19  # engines (rollout, eval), estimators and score methods (advantage), strategies (filter)


def test_editing_the_hf_engine_changes_rollout_and_eval_keys_and_a_comment_does_not(tmp_path):
    """In a copy of the packages: the engine is reached only through its registry string."""
    import shutil
    import subprocess
    from pathlib import Path

    repo = Path(code.__file__).resolve().parent.parent
    for package in ("stages", "envs", "common"):
        shutil.copytree(repo / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))

    def keys() -> str:
        probe = (
            "from common.code import fingerprint as f; print(f('stages.rollout'), f('stages.eval'), f('stages.filter'))"
        )
        done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True)
        return done.stdout

    hf = tmp_path / "stages" / "engines" / "hf.py"
    source = hf.read_text()
    assert (
        "import stages.engines.hf" not in source
        and "from stages.engines.hf" not in (tmp_path / "stages" / "rollout.py").read_text()
    )
    before = keys()
    hf.write_text(source + "\n# a comment changes nothing\n")
    assert keys() == before
    line = "scaled = scores.float() / self.scale"
    assert line in source
    hf.write_text(source.replace(line, line + " * 1.5"))
    after = keys().split()
    assert after[0] != before.split()[0] and after[1] != before.split()[1]  # rollout and eval
    assert after[2] == before.split()[2]  # the filter never reaches an engine
