"""Malformed specs and overrides: each fails at load time with one clear message
that names the file (or override), the key path and what was expected."""

from __future__ import annotations

import json
import re
import time

import pytest

from common.errors import SpecError
from pipelines.graph.load import load_spec
from tests.conftest import TEST_PIPELINE

BASE = TEST_PIPELINE

CASES = [
    # (id, spec text, overrides, expected message pattern)
    ("unknown top-level key", BASE + "scal: {factor: 2}\n", (), r"spec\.yaml: scal: unknown key.*did you mean 'scale'"),
    (
        "unknown config key",
        BASE.replace("factor: 3", "factr: 3"),
        (),
        r"scale\.factr: unknown key \(did you mean 'factor'\?\)",
    ),
    ("wrong type", BASE.replace("n: 4", "n: four"), (), r"source\.n: expected an integer, got 'four'"),
    ("float for int", BASE.replace("n: 4", "n: 4.5"), (), r"source\.n: expected an integer, got 4\.5"),
    ("bool for int", BASE.replace("n: 4", "n: true"), (), r"source\.n: expected an integer, got True"),
    ("out of range", BASE.replace("n: 4", "n: -1"), (), r"source\.n: expected an integer >= 0, got -1"),
    ("exclusive bound", BASE.replace("factor: 3", "factor: 0"), (), r"scale\.factor: expected a number > 0"),
    (
        "negative iterations",
        BASE.replace("iterations: 3", "iterations: -2"),
        (),
        r"run\.iterations: expected an integer >= 0",
    ),
    ("unknown run key", BASE.replace("seed: 1", "sed: 1"), (), r"run\.sed: unknown key \(did you mean 'seed'\?\)"),
    (
        "unknown stage",
        BASE.replace("stage: t.scale", "stage: t.scal"),
        (),
        r"pipeline\.scale\.stage: unknown stage 't\.scal' \(did you mean 't\.scale'\?\)",
    ),
    (
        "unknown node key",
        BASE.replace("{stage: t.init, once: true}", "{stage: t.init, onc: true}"),
        (),
        r"pipeline\.init\.onc: unknown key \(did you mean 'once'\?\)",
    ),
    (
        "unknown input",
        BASE.replace("inputs: {numbers: numbers}", "inputs: {numbrs: numbers}"),
        (),
        r"pipeline\.scale\.inputs\.numbrs: stage 't\.scale' has no input 'numbrs' \(did you mean 'numbers'\?\)",
    ),
    (
        "missing dataset",
        BASE.replace("inputs: {numbers: numbers}", "inputs: {numbers: nums}"),
        (),
        r"pipeline\.scale\.inputs\.numbers: no stage produces dataset 'nums'",
    ),
    (
        "bad prev syntax",
        BASE.replace("inputs: {numbers: numbers}", "inputs: {numbers: numbers@last}"),
        (),
        r"'numbers@last': expected 'dataset', 'dataset@prev', 'dataset@prev:k' \(1 <= k <= 64\) or 'dataset@once'",
    ),
    (
        "prev without initial value",
        BASE.replace("inputs: {numbers: numbers}", "inputs: {numbers: numbers@prev}"),
        (),
        r"'numbers@prev' has no value at iteration 0: add a once-stage that outputs 'numbers'",
    ),
    (
        "kind mismatch",
        BASE.replace(
            "  state: {stage: t.state}\n",
            "  state: {stage: t.state}\n  extra: {stage: t.scale, inputs: {numbers: state}, outputs: {scaled: s2}}\n",
        ),
        (),
        r"pipeline\.extra\.inputs\.numbers: 'state' is artifact from 'state', but 't\.scale' expects table",
    ),
    (
        "duplicate output",
        BASE.replace("  state: {stage: t.state}", "  state: {stage: t.state}\n  source2: {stage: t.source}"),
        (),
        r"pipeline\.source2\.outputs: dataset 'numbers' is already produced by 'source'",
    ),
    (
        "unknown output",
        BASE.replace("{stage: t.source}", "{stage: t.source, outputs: {nums: x}}"),
        (),
        r"pipeline\.source\.outputs\.nums: stage 't\.source' has no output 'nums'",
    ),
    (
        "cycle",
        """
        pipeline:
          a: {stage: t.scale, inputs: {numbers: scaled2}}
          b: {stage: t.scale, inputs: {numbers: scaled}, outputs: {scaled: scaled2}}
        """,
        (),
        r"spec\.yaml: pipeline\.b: the stages form a cycle \(b -> a -> b\)",
    ),
    (
        "once reads iteration",
        BASE.replace(
            "init: {stage: t.init, once: true}",
            "init: {stage: t.init, once: true}\n  early: {stage: t.scale, once: true}",
        ),
        (),
        r"pipeline\.early\.inputs\.numbers: no stage produces dataset 'numbers'",
    ),
    (
        "consumer of every-N sink",
        BASE.replace("{stage: t.source}", "{stage: t.source, every: 2}"),
        (),
        r"'source' runs only every 2 iterations \(pipeline\.source\.every\); nothing may consume its outputs",
    ),
    (
        "reserved node name",
        "pipeline:\n  run: {stage: t.init, once: true}\n",
        (),
        r"pipeline\.run: 'run' is a reserved section name",
    ),
    ("empty pipeline", "run: {iterations: 1}\n", (), r"pipeline: expected a mapping of stage nodes"),
    ("yaml syntax", "pipeline: {a: [1, 2\n", (), r"spec\.yaml: line \d+: invalid YAML"),
    ("duplicate yaml key", BASE + "scale: {factor: 4}\n", (), r"key 'scale' is given twice"),
    ("top-level list", "- a\n- b\n", (), r"expected a mapping at the top level, got list"),
    (
        "config not a mapping",
        BASE.replace("scale: {factor: 3}", "scale: 3"),
        (),
        r"scale: expected a mapping of settings, got 3",
    ),
    ("override without =", BASE, ("scale.factor",), r"-o scale\.factor: expected -o dotted\.key=value"),
    (
        "override unknown key",
        BASE,
        ("scale.facter=2",),
        r"-o scale\.facter=2: scale\.facter: unknown key \(did you mean 'factor'\?\)",
    ),
    ("override wrong type", BASE, ("source.n=abc",), r"-o source\.n=abc: source\.n: expected an integer, got 'abc'"),
    (
        "override through a scalar",
        BASE,
        ("run.seed.x=1",),
        r"-o run\.seed\.x=1: run\.seed: is an integer, not a section",
    ),
    (
        "override removes every node",
        "pipeline:\n  init: {stage: t.init, once: true}\n",
        ("pipeline.init=null",),
        r"every node was removed",
    ),
    (
        "once with every",
        BASE.replace("{stage: t.init, once: true}", "{stage: t.init, once: true, every: 2}"),
        (),
        r"pipeline\.init\.every: a once-stage cannot also run every N iterations",
    ),
    ("missing extends", "extends: nowhere.yaml\n" + BASE, (), r"extends: preset 'nowhere\.yaml' not found"),
    (
        "own section beside config:",
        BASE.replace("inputs: {numbers: numbers}}", "inputs: {numbers: numbers}, config: other}"),
        (),
        r"scale: node 'scale' takes its config from section 'other'",
    ),
    (
        "@once without a once producer",
        BASE.replace("inputs: {numbers: numbers}", "inputs: {numbers: numbers@once}"),
        (),
        r"pipeline\.scale\.inputs\.numbers: 'numbers@once': no once-stage produces 'numbers'",
    ),
    (
        "demo arms cross-field",
        "pipeline:\n  init: {stage: demo.init, once: true}\ninit: {arms: [A]}\n",
        (),
        r"init\.arms: expected at least two distinct arm names",
    ),
]


@pytest.mark.parametrize("text,overrides,pattern", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_spec(spec_file, text, overrides, pattern):
    path = spec_file(text)
    with pytest.raises(SpecError, match=pattern) as info:
        load_spec(path, overrides)
    message = str(info.value)
    assert "\n" not in message
    source = info.value.source
    assert source.startswith("-o ") or source.endswith(".yaml"), message


def test_error_names_the_preset_that_set_the_key(spec_file):
    spec_file(BASE.replace("factor: 3", "factor: -3"), name="base.yaml")
    child = spec_file("extends: base.yaml\nsource: {n: 2}\n", name="child.yaml")
    with pytest.raises(SpecError, match=r"base\.yaml: scale\.factor: expected a number > 0") as info:
        load_spec(child)
    assert info.value.source.endswith("base.yaml")


def test_extends_cycle(spec_file):
    spec_file("extends: b.yaml\n", name="a.yaml")
    path = spec_file("extends: a.yaml\n", name="b.yaml")
    with pytest.raises(SpecError, match=re.escape("extends itself in a cycle (b.yaml -> a.yaml -> b.yaml)")):
        load_spec(path)


def test_spec_file_not_found():
    with pytest.raises(SpecError, match=r"no-such-spec\.yaml: spec file not found \(looked in"):
        load_spec("no-such-spec.yaml")


def test_at_least_twenty_cases():
    assert len(CASES) >= 20


#: malformed files: (id, the file's bytes, expected message pattern)
MALFORMED_FILES = [
    ("NUL byte", BASE.encode() + b"note: a\x00b\n", r"line \d+, column \d+: control character U\+0000"),
    ("other control character", BASE.encode() + b"\x01note: 1\n", r"control character U\+0001"),
    ("not UTF-8", BASE.encode() + b"note: \xff\xfe\n", r"not UTF-8 text"),
    ("deep nesting", b"a: " + b"[" * 5000 + b"]" * 5000 + b"\n", r"nested deeper than 32 levels"),
    (
        "deep mappings",
        ("a:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 60)) + "  " * 60 + "v: 1\n").encode(),
        r"nested deeper than 32 levels",
    ),
    ("complex key", BASE.encode() + b"? [a, b]\n: 1\n", r"keys must be text, got a list"),
    ("number key", BASE.encode() + b"1: x\n", r"keys must be text, got '1' \(quote it\)"),
    ("key with a newline", BASE.encode() + b'"sca\\nle": {factor: 2}\n', r'"sca\\nle": unknown key'),
    ("empty file", b"", r"the file is empty"),
    ("blank file", b"  \n\n", r"the file is empty"),
    (
        "too large",
        b"run: {seed: 1}\nwarnings:\n" + b"".join(b"  k%d: %d\n" % (i, i) for i in range(200_000)),
        r"the file is \d\.\d MiB; a spec may be at most 1 MiB",
    ),
]


@pytest.mark.parametrize("content, pattern", [c[1:] for c in MALFORMED_FILES], ids=[c[0] for c in MALFORMED_FILES])
def test_a_malformed_file_is_one_line(tmp_path, content, pattern):
    path = tmp_path / "spec.yaml"
    path.write_bytes(content)
    with pytest.raises(SpecError, match=pattern) as err:
        load_spec(str(path))
    assert "\n" not in str(err.value) and str(err.value).startswith(str(path))


def test_a_directory_is_not_a_spec(tmp_path):
    (tmp_path / "configs.yaml").mkdir()
    with pytest.raises(SpecError, match="is a directory; expected a spec file"):
        load_spec(str(tmp_path / "configs.yaml"))


@pytest.mark.parametrize(
    "override, pattern",
    [
        ("source.n=\x01", r'-o "source\.n=\\u0001": control character U\+0001'),
        ("source.n=" + "[" * 3000 + "]" * 3000, r"nested deeper than 32 levels"),
        ("source.n=" + "1" * 70_000, r"an override may be at most 65536 characters"),
        ("sca\nle.factor=2", r'-o "sca\\nle\.factor=2": control character U\+000A'),
        ("scale.factor=null", r"scale\.factor: expected a number, got None"),
    ],
)
def test_a_malformed_override_is_one_line(spec_file, override, pattern):
    with pytest.raises(SpecError, match=pattern) as err:
        load_spec(spec_file(BASE), (override,))
    assert "\n" not in str(err.value)


def test_a_cross_node_error_names_the_override_that_caused_it(spec_file):
    from pathlib import Path

    starpo = Path(__file__).resolve().parents[3] / "configs" / "starpo.yaml"
    with pytest.raises(SpecError, match=r"^-o rollout\.group_size=1: filter\.strategy: .*rollout\.group_size is 1"):
        load_spec(str(starpo), ("rollout.group_size=1",))


def _laughs(levels: int = 9) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


BOMBS = [
    ("billion laughs", BASE + _laughs(), r"expands to more than 100,000 values through its aliases"),
    ("a value that contains itself", BASE + "x: &x [1, *x]\n", r"an alias refers to the value that contains it"),
    (
        "a wide fan of aliases",
        BASE + "x: &x {a: 1, b: 2, c: 3, d: 4}\ny: [" + ", ".join(["*x"] * 12_000) + "]\n",
        r"expands to",
    ),
]


@pytest.mark.parametrize("content, pattern", [b[1:] for b in BOMBS], ids=[b[0] for b in BOMBS])
def test_yaml_that_would_expand_without_bound_is_refused_quickly(tmp_path, content, pattern):
    path = tmp_path / "spec.yaml"
    path.write_text(content)
    t0 = time.monotonic()
    with pytest.raises(SpecError, match=pattern):
        load_spec(str(path))
    assert time.monotonic() - t0 < 10.0  # unbounded, it runs for minutes and gigabytes; 10 s: a loaded machine


def test_an_override_that_would_expand_without_bound_is_refused_quickly(spec_file):
    flow = "{" + ", ".join(_laughs(7).strip().splitlines()).replace("\n", " ") + "}"
    t0 = time.monotonic()
    with pytest.raises(SpecError, match=r"^-o source\.x=.*expands to more than"):
        load_spec(spec_file(BASE), ("source.x=" + flow,))
    assert time.monotonic() - t0 < 10.0  # unbounded, it runs for minutes and gigabytes; 10 s: a loaded machine


def test_presets_are_read_once_and_included_a_bounded_number_of_times(spec_file):
    spec_file(BASE, name="p40.yaml")
    for i in range(39, -1, -1):
        spec_file(f"extends: [p{i + 1}.yaml, p{i + 1}.yaml]\n", name=f"p{i}.yaml")
    path = spec_file("extends: p0.yaml\n", name="top.yaml")
    t0 = time.monotonic()
    with pytest.raises(SpecError, match=r"extends: (includes presets more than 64 times|presets extend presets)"):
        load_spec(path)
    assert time.monotonic() - t0 < 10.0  # unbounded, it runs for minutes and gigabytes; 10 s: a loaded machine


def test_a_deep_extends_chain_says_so(spec_file):
    spec_file(BASE, name="c20.yaml")
    for i in range(19, -1, -1):
        spec_file(f"extends: c{i + 1}.yaml\n", name=f"c{i}.yaml")
    with pytest.raises(SpecError, match=r"extends: presets extend presets more than 16 levels deep"):
        load_spec(spec_file("extends: c0.yaml\n", name="top.yaml"))


def test_a_diamond_of_presets_still_loads(spec_file):
    spec_file(BASE, name="root.yaml")
    spec_file("extends: root.yaml\nsource: {n: 5}\n", name="left.yaml")
    spec_file("extends: root.yaml\nscale: {factor: 7}\n", name="right.yaml")
    spec = load_spec(spec_file("extends: [left.yaml, right.yaml]\n", name="top.yaml"))
    configs = {n.name: n.config for n in spec.nodes}
    assert configs["source"].n == 4 and configs["scale"].factor == 7  # right re-applies root's n after left's


@pytest.mark.parametrize("target", ["/etc/passwd", "/etc/hostname", "../outside.yaml"])
def test_extends_reads_only_yaml_presets_beside_the_spec_or_under_configs(tmp_path, target):
    (tmp_path / "outside.yaml").write_text("secret: the-first-line\n")
    inner = tmp_path / "inner"
    inner.mkdir()
    spec = inner / "spec.yaml"
    spec.write_text(f"extends: {target}\n" + BASE)
    with pytest.raises(SpecError, match=r"extends: preset .* (not a YAML file beside the spec|not found)") as err:
        load_spec(str(spec))
    assert "the-first-line" not in str(err.value) and "root:" not in str(err.value)


@pytest.mark.parametrize(
    "name", ["../../elsewhere/x", "a/b", "..", ".hidden", "-dash", "x" * 129, "a b", "a\\b", "", "t\u0301"]
)
def test_a_run_name_is_a_name(spec_file, name):  # "t\u0301": a mark no letter composes with; "ü" is a name
    with pytest.raises(SpecError, match=r"run\.name: a run name is letters and digits of any script"):
        load_spec(spec_file(BASE), (f"run.name={json.dumps(name)}",))


def test_a_run_name_is_one_spelling_of_it(spec_file):
    assert load_spec(spec_file(BASE), ("run.name=u\u0308ber",)).name == "\u00fcber"  # NFD written, NFC kept


def test_a_file_whose_name_is_no_run_name_asks_for_run_name(tmp_path):
    path = tmp_path / "my spec!.yaml"
    path.write_text(BASE)
    with pytest.raises(SpecError, match=r"the file's name \"my spec!\" is not one; set run\.name"):
        load_spec(str(path))
    assert load_spec(str(path), ("run.name=ok",)).name == "ok"
