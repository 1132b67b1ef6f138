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
    code._source.cache_clear()
    code._parsed.cache_clear()
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
