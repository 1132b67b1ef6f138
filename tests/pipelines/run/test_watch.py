"""Early warnings on synthetic metric series whose answer is known."""

from dataclasses import dataclass

import pyarrow as pa
import pytest

from catalog.datasets import Table
from catalog.query import query
from common.config import param
from pipelines.run.watch import Watcher
from pipelines.spec.rules import WarningsSection
from stages.registry import StageContext, StageResult, stage
from tests.conftest import run_spec


def fired(series: dict[str, list[float]], **cfg) -> list[tuple[int, str]]:
    watcher = Watcher(WarningsSection(**cfg))
    n = len(next(iter(series.values())))
    return [(e.iteration, e.rule) for i in range(n) for e in watcher.observe(i, {k: v[i] for k, v in series.items()})]


def test_an_echo_trap_fires_std_and_entropy_before_the_reward_falls_and_the_spike_at_collapse():
    # reward std and entropy fall at 5-6, the reward holds until 8, the gradient norm spikes at 9
    series = {
        "rollout/in_group_std": [0.4, 0.42, 0.38, 0.41, 0.4, 0.15, 0.1, 0.05, 0.02, 0.0],
        "actor/entropy": [1.2, 1.15, 1.2, 1.1, 1.15, 1.0, 0.45, 0.3, 0.2, 0.1],
        "rollout/score_mean": [0.3, 0.35, 0.4, 0.45, 0.5, 0.5, 0.52, 0.5, 0.1, 0.0],
        "actor/grad_norm": [1.0, 1.2, 0.9, 1.1, 1.0, 0.8, 0.9, 1.0, 1.2, 9.0],
    }
    assert fired(series) == [(5, "reward_std_drop"), (6, "entropy_drop"), (9, "grad_norm_spike")]


def test_a_runaway_entropy_fires_the_length_spike_before_the_format_breaks():
    # the entropy-bonus collapse measured on the default (README): answers grow from ~10 tokens,
    # then the format-valid rate falls three iterations later; the entropy rises, so no drop rule fires
    series = {
        "rollout/response_tokens_mean": [10.3, 9.5, 11.1, 10.7, 9.4, 11.4, 13.0, 15.5, 18.8, 29.5, 36.5, 45.9, 88.2],
        "rollout/format_valid_rate": [0.86, 0.83, 0.73, 0.83, 0.88, 0.89, 0.87, 0.89, 0.86, 0.86, 0.89, 0.82, 0.48],
        "actor/entropy": [0.78, 1.1, 1.26, 1.03, 1.21, 1.22, 1.92, 2.48, 3.33, 3.98, 4.63, 5.08, 5.65],
    }
    assert fired(series) == [(9, "length_spike"), (12, "format_drop")]
    # a format that wobbles by less than the threshold (0.2 of its trailing mean) stays quiet
    assert fired({"rollout/format_valid_rate": [1.0, 0.99, 0.97, 0.9, 0.95, 0.85, 0.97]}) == []
    assert fired(series, length_spike=None, format_drop=None) == []


def test_rules_fire_on_the_edge_only_and_need_history():
    flat_then_low = {"actor/entropy": [1.0, 1.0, 1.0, 0.2, 0.2, 0.2, 1.0, 1.0, 0.1]}
    # fires when it falls, not again while low; re-arms when it recovers
    assert fired(flat_then_low) == [(3, "entropy_drop"), (8, "entropy_drop")]
    assert fired({"actor/entropy": [1.0, 0.1]}) == []  # min_history 3


def test_duplicates_and_diversity():
    series = {
        "collapse/duplicate_rate_batch": [0.1, 0.2, 0.1, 0.3, 0.6, 0.9],
        "collapse/distinct2_batch": [0.8, 0.82, 0.79, 0.8, 0.5, 0.3],
    }
    assert fired(series) == [(4, "diversity_drop"), (4, "duplicate_rise")]


def test_sharpening_quiets_duplicates_and_diversity_template_collapse_does_not():
    dup = {
        "collapse/duplicate_rate_batch": [0.1, 0.2, 0.1, 0.3, 0.6, 0.9, 0.9, 0.9],
        "collapse/distinct2_batch": [0.8, 0.82, 0.79, 0.8, 0.5, 0.3, 0.3, 0.3],
    }
    # sharpening: the answers still depend on the state (MI steady around 0.4 nats, noisy)
    sharp = dup | {"template/mi": [0.5, 0.3, 0.45, 0.2, 0.6, 0.35, 0.4, 0.3]}
    assert fired(sharp) == []
    # template collapse: MI falls to nothing with the duplicates (a mean of 3 below half the trailing mean)
    template = dup | {"template/mi": [0.5, 0.3, 0.45, 0.4, 0.02, 0.0, 0.01, 0.0]}
    # (the duplicate and diversity rules speak once the mean of 3 has fallen: two iterations later)
    assert fired(template) == [(6, "diversity_drop"), (6, "duplicate_rise"), (6, "template_collapse")]
    # turned off: duplicates warn whatever the diagnostic says
    assert fired(sharp, sharpening_mi=None) == [(4, "diversity_drop"), (4, "duplicate_rise")]


# the default run's seed 2 (relative view, 3-seed sweep, no stop at </answer>), iterations 0-12: the policy sharpens, its
# duplicates pass 0.5 at iteration 4 and its groups score alike; the diagnostic (every 5th) first
# reads -0.087 nats, one 16-pair estimate that scatters by about 0.17, then 0.355 and 0.721
SEED2 = {
    "collapse/duplicate_rate_batch": [
        0.375,
        0.438,
        0.422,
        0.438,
        0.703,
        0.57,
        0.68,
        0.625,
        0.727,
        0.695,
        0.711,
        0.68,
        0.68,
    ],
    "rollout/in_group_std": [0.358, 0.349, 0.308, 0.284, 0.219, 0.251, 0.145, 0.18, 0.063, 0.131, 0.178, 0.147, 0.133],
}
SEED2_MI = {0: -0.087, 5: 0.355, 10: 0.721}


def replay(series: dict[str, list[float]], every: dict[int, float], **cfg) -> list[tuple[int, str]]:
    """`fired`, with the diagnostic reporting only on the iterations of `every`."""
    watcher = Watcher(WarningsSection(**cfg))
    n = len(next(iter(series.values())))
    return [
        (e.iteration, e.rule)
        for i in range(n)
        for e in watcher.observe(
            i, {k: v[i] for k, v in series.items()} | ({"template/mi": every[i]} if i in every else {})
        )
    ]


def test_a_sharpening_policy_is_not_warned_of_before_the_diagnostic_can_tell():
    # one low first estimate is not evidence: the quieted rules wait for 3 reports, then the mean says sharp
    assert replay(SEED2, SEED2_MI) == []
    # without the diagnostic the same run warns twice: what the default did before it had one
    assert fired(SEED2) == [(4, "duplicate_rise"), (8, "reward_std_drop")]
    # and with the quieting turned off
    assert replay(SEED2, SEED2_MI, sharpening_mi=None) == [(4, "duplicate_rise"), (8, "reward_std_drop")]


def test_a_collapse_from_the_start_is_warned_of_once_the_diagnostic_has_reported_three_times():
    # the same duplicates and std, but the responses never depended on the state
    flat = {0: 0.01, 5: -0.02, 10: 0.0}
    assert replay(SEED2, flat) == [(10, "duplicate_rise")]  # (its std is not falling at 10)


def test_entropy_falling_while_the_answers_depend_on_the_state_is_sharpening():
    entropy = {"actor/entropy": [1.2, 1.18, 1.21, 1.19, 1.2, 0.5, 0.3, 0.2]}
    assert fired(entropy) == [(5, "entropy_drop")]  # no diagnostic: the rule speaks as before
    sharp = entropy | {"template/mi": [0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2]}
    assert fired(sharp) == []
    # the same entropy fall while the answers stop depending on the state: warned of, with the collapse
    template = entropy | {"template/mi": [0.5, 0.6, 0.7, 0.8, 0.9, 0.02, 0.01, 0.0]}
    assert (7, "entropy_drop") in fired(template) and any(r == "template_collapse" for _, r in fired(template))


def test_reward_std_falling_because_every_answer_is_right_is_not_an_echo_trap():
    series = {"rollout/in_group_std": [0.4, 0.42, 0.38, 0.41, 0.4, 0.15, 0.1, 0.05]}
    assert fired(series) == [(5, "reward_std_drop")]
    assert fired(series | {"template/mi": [0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2]}) == []


def test_template_collapse_needs_some_dependence_to_lose():
    # a fresh policy's MI wobbles around 0.001 nats: halving that is noise, not a collapse
    assert fired({"template/mi": [0.001, 0.002, 0.001, 0.0005, -0.003, -0.002, 0.0]}) == []
    # one low estimate among steady ones is noise too (the rule reads a mean of 3)
    assert fired({"template/mi": [0.4, 0.35, 0.4, 0.45, 0.02, 0.4, 0.38]}) == []


def test_a_diagnostic_every_few_iterations_keeps_its_last_values():
    watcher = Watcher(WarningsSection())
    watcher.observe(0, {"template/mi": 0.4})
    events = [
        e.rule
        for i, d in enumerate([0.1, 0.1, 0.1, 0.9], start=1)
        for e in watcher.observe(i, {"collapse/duplicate_rate_batch": d})
    ]
    assert events == [] and watcher.sharpening()


@pytest.mark.parametrize("cfg", [{"enabled": False}, {"entropy_drop": None}])
def test_rules_can_be_turned_off(cfg):
    assert fired({"actor/entropy": [1.0, 1.0, 1.0, 0.1]}, **cfg) == []


def test_thresholds_are_configurable():
    series = {"actor/grad_norm": [1.0, 1.0, 1.0, 3.0]}
    assert fired(series) == [] and fired(series, grad_spike=2.5) == [(3, "grad_norm_spike")]


ENTROPY = [1.0, 1.1, 0.9, 1.0, 0.2, 0.1]


@dataclass(frozen=True)
class SignalConfig:
    scale: float = param(1.0, "multiplies the series", gt=0)


@stage("t.signal", config=SignalConfig, outputs={"signal": Table()}, metrics={"actor/entropy": "synthetic"})
def signal(ctx: StageContext, cfg: SignalConfig) -> StageResult:
    value = ENTROPY[ctx.iteration] * cfg.scale
    return StageResult(tables={"signal": pa.table({"v": [value]})}, metrics={"actor/entropy": value})


def test_a_run_prints_its_warnings_and_keeps_them_in_the_events_view(spec_file, catalog):
    path = spec_file("run: {iterations: 6}\npipeline:\n  s: {stage: t.signal}\n")
    _, display = run_spec(path, catalog)
    assert display.warnings == ["warning at iteration 4: policy entropy fell: actor/entropy = 0.2 vs 1"]
    rows = query(catalog, "select run, iteration, rule, value, reference from events").to_pylist()
    assert rows == [{"run": "spec", "iteration": 4, "rule": "entropy_drop", "value": 0.2, "reference": 1.0}]
    _, quiet = run_spec(path, catalog, ("warnings.enabled=false",))
    assert quiet.warnings == [] and query(catalog, "select count(*) from events").column(0)[0].as_py() == 0


def test_one_gradient_spike_while_the_answers_depend_on_the_state_is_quiet_a_norm_that_stays_up_is_not():
    mi = {"template/mi": [0.8] * 12}
    # the default's seed 1 rising to 77%: single spikes (5-9x) among ordinary updates
    single = {"actor/grad_norm": [1.0, 1.1, 0.9, 1.0, 1.2, 6.0, 1.0, 0.9, 8.6, 1.1, 1.0, 0.9]}
    assert fired(single) == [(5, "grad_norm_spike"), (8, "grad_norm_spike")]  # without the diagnostic, as before
    assert fired(single | mi) == []
    # the default's seed 2 falling from 46% to 28%: the norm stays up for several updates
    surge = {"actor/grad_norm": [1.0, 1.1, 0.9, 1.0, 1.2, 5.5, 9.0, 20.9, 8.7, 40.5, 4.0, 34.3]}
    assert fired(surge | mi) == [(6, "grad_norm_surge")]  # the mean of 1.2, 5.5 and 9.0 passes 5x the median


def _bandit_runs() -> list[dict]:
    import json
    from pathlib import Path

    return json.loads((Path(__file__).parents[2] / "fixtures" / "bandit_collapse.json").read_text())["runs"]


def _falls_at(success: list[float]) -> int | None:
    """experiments/collapse.py's "falls at": the first iteration whose mean success over the last 3 is 20
    points under the best such mean before it."""
    best = None
    for i in range(2, len(success)):
        mean = sum(success[i - 2 : i + 1]) / 3
        if best is not None and mean <= best - 0.2:
            return i
        best = mean if best is None else max(best, mean)
    return None


def test_the_real_bandits_collapse_is_warned_of_before_it_falls_and_starpo_s_is_not():
    """SmolLM2-135M-Instruct on the bandit (the stored runs of docs/real-models.md): vanilla StarPO's
    rollouts go to the safe arm at its three seeds, StarPO-S's to the high one. The reward-std rule
    alone fired on both; reward_collapse fires on vanilla before the fall, on StarPO-S never."""
    firsts = {}
    for run in _bandit_runs():
        metrics = ("rollout/success_rate", "rollout/in_group_std", "actor/entropy", "actor/grad_norm")
        series = {m: run[m] for m in metrics}
        # the mutual_info stage reported at iterations 0, 5 and 9 (StarPO-S seed 0: -0.05, 0.41, -0.07 nats)
        mi = {0: -0.05, 5: 0.41, 9: -0.07}
        watcher = Watcher(WarningsSection())
        events = []
        for i in range(len(series["rollout/success_rate"])):
            now = {m: v[i] for m, v in series.items() if v[i] is not None}
            events += watcher.observe(i, now | ({"template/mi": mi[i]} if i in mi else {}))
        firsts[(run["recipe"], run["seed"])] = (
            next((e.iteration for e in events if e.rule == "reward_collapse"), None),
            _falls_at(run["rollout/success_rate"]),
            [e.rule for e in events],
        )
    assert {k: v[:2] for k, v in firsts.items()} == {
        ("vanilla", 0): (3, 4),
        ("vanilla", 1): (4, 6),
        # started low (31%) and slid to 3-6% without a fall of 20 points: compared a mean of 3 iterations
        # at a time (collapse_smooth), its success is never 10 points below its best
        ("vanilla", 2): (None, None),
        ("starpo-s", 0): (None, None),
    }
    assert firsts[("starpo-s", 0)][2] == [], "no warning of any rule while its success climbs to 84-91%"
    for seed in (0, 1):  # the collapse rule is the first warning of every vanilla run that falls
        assert firsts[("vanilla", seed)][2][0] == "reward_collapse"


def test_reward_collapse_on_one_iterations_success_fires_on_the_slide_and_on_noise():
    """collapse_smooth 1 (the rule before it averaged): it also fired on vanilla seed 2's slide, and on a
    run whose success only swings (16 lakes an iteration: about 12 points) it fires while the std dips."""
    firsts = {}
    for run in _bandit_runs():
        watcher = Watcher(WarningsSection(collapse_smooth=1))
        events = []
        for i in range(len(run["rollout/success_rate"])):
            now = {m: run[m][i] for m in ("rollout/success_rate", "rollout/in_group_std") if run[m][i] is not None}
            events += watcher.observe(i, now)
        firsts[(run["recipe"], run["seed"])] = next((e.iteration for e in events if e.rule == "reward_collapse"), None)
    assert firsts == {("vanilla", 0): 3, ("vanilla", 1): 4, ("vanilla", 2): 4, ("starpo-s", 0): None}
    swinging = [0.6, 0.36] * 5  # 24 points apart; a mean of 3 moves by 8
    dipping = [0.3] * 7 + [0.1, 0.3, 0.3]  # the std halves at iteration 7, where success is low
    for smooth, expected in ((1, [7]), (3, [])):
        watcher = Watcher(WarningsSection(collapse_smooth=smooth))
        fired = [
            e.iteration
            for i, (s, d) in enumerate(zip(swinging, dipping))
            for e in watcher.observe(i, {"rollout/success_rate": s, "rollout/in_group_std": d})
            if e.rule == "reward_collapse"
        ]
        assert fired == expected, (smooth, fired)
