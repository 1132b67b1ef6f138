"""Each environment against docs/method.md#environments, on hand-made positions and many seeds."""

from __future__ import annotations

import random
from collections import Counter

import pytest

import envs
from envs.countdown import NotAnExpression, evaluate
from envs.countdown import solve as solve_countdown
from envs.frozenlake import reachable
from envs.policies import expert
from envs.sokoban import SokobanOptions
from envs.sokoban_gen import solve as solve_sokoban

# -- bandit ---------------------------------------------------------------------------


def test_bandit_payoffs_and_success():
    env = envs.make("bandit")
    low = [env.reset(s) and env.step("phoenix")[1] for s in range(200)]
    assert set(low) == {0.1}
    high = []
    for s in range(4000):
        env.reset(s)
        _, r, done, info = env.step("Dragon")
        assert done and info["success"]
        high.append(r)
    assert set(high) == {0.0, 1.0} and abs(sum(high) / len(high) - 0.25) < 0.02


def test_bandit_variants_and_shuffle():
    assert set(envs.make("bandit_heldout").action_words) == {"Trader", "Librarian"}
    rev = envs.make("bandit_reversed")
    rev.reset(0)
    assert rev.step("Phoenix")[3]["success"]
    env = envs.make("bandit")
    firsts = Counter(env.reset(s) and env.action_words[0] for s in range(200))
    assert set(firsts) == {"Phoenix", "Dragon"} and min(firsts.values()) > 60


def test_the_bandits_reasoning_rule_pays_for_right_expectations_and_an_answer_that_follows_them():
    env = envs.make("bandit", payoffs=True, names=["Dragon", "Phoenix", "Tiger"])
    env.reset(3)
    high, low = env.high, env.low
    right = f" {high} pays 1 x 0.25 = 0.25 on average. {low} pays 0.1 on average. "
    assert env.reasoning() is not None and env.reasoning_holds(env.reasoning(), high) is True
    assert env.reasoning_holds(right, high.upper()) is True  # an action word in any case
    assert env.reasoning_holds(right.lower(), high) is True  # names in the thought in any case
    assert env.reasoning_holds(right, low) is False  # right, not followed
    flipped = f" {high} pays 0.1 on average. {low} pays 1 x 0.25 = 0.25 on average. "
    assert env.reasoning_holds(flipped, low) is False  # followed, not right: no bonus for a story that suits the answer
    assert env.reasoning_holds(f" {high} pays 0.25 on average. ", high) is False  # one arm stated
    both_ways = right + f"{high} pays 0.1 on average. "
    assert env.reasoning_holds(both_ways, high) is False  # an arm stated twice, differently
    assert env.reasoning_holds(f" {high} pays 1.2.5 on average. {low} pays 0.1 on average. ", high) is False
    other = next(n for n in ("Dragon", "Phoenix", "Tiger") if n not in (high, low))
    assert env.reasoning_holds("", high) is False and env.reasoning_holds(right, other) is False
    state = env.render()
    env.step(high)
    assert state != env.render()
    plain = envs.make("bandit")
    plain.reset(0)
    assert plain.reasoning_holds(right, "Dragon") is None  # no payoffs in the prompt: no rule


def test_bandit_odds_from_a_pool_make_the_gamble_sometimes_the_worse_arm():
    env = envs.make("bandit", payoffs=True, odds=[0.05, 0.25])
    seen = set()
    for seed in range(64):
        env.reset(seed)
        seen.add(env.p)
        worse = env.p * 1.0 < 0.1
        assert env.best == (env.low if worse else env.high)
        assert f"{env.high} pays 1 with probability {env.p:g}, otherwise 0" in env.instructions
        assert f"{env.high} pays 1 x {env.p:g} = {env.p:g} on average." in env.reasoning()
        assert env.reasoning_holds(env.reasoning(), env.best) is True
        assert env.reasoning_holds(env.reasoning(), env.low if env.best == env.high else env.high) is False
        assert env.step(env.best)[3]["success"] and expert(0)(env.reset(seed) and env) == env.best
    assert seen == {0.05, 0.25}
    gamble = envs.make("bandit_heldout", payoffs=True, high_p=0.05)
    gamble.reset(1)
    assert not gamble.step("Librarian")[3]["success"]  # the gamble pays 0.05 on average, the sure arm 0.1
    with pytest.raises(envs.EnvError, match="odds are probabilities"):
        envs.make("bandit", odds=[1.5])
    plain = envs.make("bandit")  # no pool: the same states, draws and payoffs as before
    assert [plain.reset(s) and plain.action_words[0] for s in range(5)] == ["Phoenix", *["Dragon"] * 4]
    assert [plain.reset(s) and plain.step("Dragon")[1] for s in range(20)] == [
        1.0 if s in (2, 15, 18) else 0.0 for s in range(20)
    ]


# -- sokoban --------------------------------------------------------------------------


def _room(rows: list[str], render: str = "grid") -> envs.Sokoban:
    env = envs.make("sokoban", dim_room=(len(rows), len(rows[0])), render=render)
    w = len(rows[0])
    cells = {(r * w + c): ch for r, row in enumerate(rows) for c, ch in enumerate(row)}
    env.floor = frozenset(i for i, ch in cells.items() if ch != "#")
    env.targets = tuple(sorted(i for i, ch in cells.items() if ch in "O√S"))
    env.boxes = {i for i, ch in cells.items() if ch in "X√"}
    env.player = next(i for i, ch in cells.items() if ch in "PS")
    return env


def test_sokoban_rewards_on_a_hand_made_room():
    env = _room(["######", "#PX_O#", "#____#", "######"])
    assert env.render() == "######\n#PX_O#\n#____#\n######"
    text, r, done, info = env.step("Up")  # bump into the wall: a valid, ineffective move
    assert r == pytest.approx(-0.1) and not info["action_effective"] and info["action_valid"]
    _, r, done, _ = env.step("right")
    assert r == pytest.approx(-0.1) and not done
    text, r, done, info = env.step("Right")
    assert r == pytest.approx(-0.1 + 1 + 10) and done and info["success"]
    assert text == "######\n#__P√#\n#____#\n######"


def test_sokoban_box_off_target_costs_one():
    env = _room(["#######", "#P√___#", "#_O___#", "#######"])
    _, r, done, _ = env.step("Right")
    assert r == pytest.approx(-0.1 - 1) and not done


def test_sokoban_push_blocked_by_wall_or_box():
    env = _room(["######", "#_PXX#", "#O_O_#", "######"])
    before = env.render()
    _, r, _, info = env.step("Right")
    assert env.render() == before and not info["action_effective"] and r == pytest.approx(-0.1)


def test_sokoban_bump_penalty_costs_only_moves_that_change_nothing():
    rows = ["######", "#_PXX#", "#O_O_#", "######"]
    env = _room(rows)
    env.opts = SokobanOptions(dim_room=(4, 6), bump_penalty=-0.5)
    _, r, _, info = env.step("Right")  # a box that cannot move
    assert r == pytest.approx(-0.6) and not info["action_effective"]
    _, r, _, _ = env.step("Up")  # a wall
    assert r == pytest.approx(-0.6)
    _, r, _, info = env.step("Left")  # floor: a plain step
    assert r == pytest.approx(-0.1) and info["action_effective"]
    with pytest.raises(envs.EnvError, match="bump_penalty must be <= 0"):
        envs.make("sokoban", bump_penalty=0.5)


@pytest.mark.parametrize("name,seeds", [("sokoban", 400), ("sokoban_larger", 150)])
def test_every_generated_room_is_solvable_within_the_bound(name, seeds):
    for seed in range(seeds):
        env = envs.make(name)
        env.reset(seed)
        plan = solve_sokoban(env.floor, env.targets, env.state, env.width)
        assert plan is not None and len(plan) == env.optimal_steps <= 10
        assert env.optimal_steps >= 3
        for move in plan:
            _, _, done, info = env.step(move)
        assert done and info["success"]


def test_sokoban_unbounded_and_new_vocab_legend():
    env = envs.make("sokoban", max_solution_steps=None)
    env.reset(1)
    assert solve_sokoban(env.floor, env.targets, env.state, env.width) is not None
    new, old = envs.make("sokoban_new_vocab"), envs.make("sokoban")
    a, b = new.reset(4), old.reset(4)
    trans = str.maketrans("-.*$@+", "_O√XPS")
    assert a.translate(trans) == b
    assert "$ is box" in new.instructions and "@ is you" in new.instructions
    assert "X is box" in old.instructions and "X is box" not in new.instructions


def test_sokoban_relative_view_says_where_things_are_and_what_each_push_does():
    env = _room(["#######", "#_X_O_#", "#_PX_X#", "#___X_#", "#######"], render="relative")
    assert env.render() == (
        "Box: rows -1, columns +0.\nBox: rows +0, columns +1.\nBox: rows +0, columns +3.\n"
        "Box: rows +1, columns +2.\nTarget: rows -1, columns +2.\n"
        "Up: a box that cannot move. Down: floor. Left: floor. Right: a box, pushed onto floor."
    )
    env = _room(["######", "#PX_O#", "#____#", "######"], render="relative")
    env.step("Right")
    assert env.render().endswith("Right: a box, pushed onto a target.")
    assert "rows (+ is towards the bottom)" in env.instructions and "X is box" not in env.instructions
    text, _, done, info = env.step("Right")
    assert done and info["success"] and text.startswith("Box on a target: rows +0, columns +1.\n")
    env = _room(["#####", "#PX_#", "#___#", "#O__#", "#####"], render="relative")
    assert env.render().endswith("Right: a box, pushed into a corner.")  # a wall above and one to the right
    env = _room(["######", "#PX__#", "#____#", "#O___#", "######"], render="relative")
    assert env.render().endswith("Right: a box, pushed onto floor.")  # along a wall, not into a corner
    env = _room(["#####", "#PXO#", "#___#", "#####"], render="relative")
    assert env.render().endswith("Right: a box, pushed onto a target.")  # a corner that is a target
    env = _room(["#####", "#S_X#", "#_O_#", "#####"], render="relative")
    assert "You stand on a target." in env.render() and env.render().count("Target:") == 1
    with pytest.raises(envs.EnvError, match="render must be one of grid, relative"):
        envs.make("sokoban", render="local")


# -- frozenlake -----------------------------------------------------------------------


def test_frozenlake_maps_are_solvable():
    env = envs.make("frozenlake")
    for seed in range(300):
        env.reset(seed)
        assert reachable(env.holes, 4, env.start, env.goal) and env.start != env.goal
        assert env.render().count("P") == 1 and env.render().count("G") == 1


def test_frozenlake_slip_frequencies():
    env = envs.make("frozenlake")
    counts: Counter[str] = Counter()
    for seed in range(3000):
        env.reset(seed)
        counts[env.step("Down")[3]["actual_move"]] += 1
    for move in ("Down", "Left", "Right"):
        assert abs(counts[move] / 3000 - 1 / 3) < 0.03
    assert counts["Up"] == 0


def test_frozenlake_goal_and_hole():
    env = envs.make("frozenlake", slippery=False)
    env.reset(0)
    env.holes, env.goal, env.pos = frozenset({(0, 1)}), (1, 0), (0, 0)
    text, r, done, info = env.step("Right")
    assert done and r == 0.0 and not info["success"] and "X" in text
    env.reset(0)
    env.holes, env.goal, env.pos = frozenset({(0, 1)}), (1, 0), (0, 0)
    text, r, done, info = env.step("Down")
    assert done and r == 1.0 and info["success"] and "√" in text


def test_frozenlake_renderings_say_the_same_state():
    grid, positions, local = (envs.make("frozenlake", slippery=False, render=r) for r in ("grid", "positions", "local"))
    for env in (grid, positions, local):
        env.reset(0)
        env.holes, env.goal, env.pos = frozenset({(0, 1), (2, 2)}), (3, 2), (0, 0)
    assert grid.render() == "PO__\n____\n__O_\n__G_"
    assert positions.render() == (
        "You: row 1, column 1.\nGoal: row 4, column 3.\nHoles: row 1, column 2; row 3, column 3."
    )
    assert local.render() == "Goal: 3 Down, 2 Right.\nLeft: edge. Down: ice. Right: hole. Up: edge."
    local.step("Down")
    local.step("Down")
    local.step("Right")
    assert local.render() == "Goal: 1 Down, 1 Right.\nLeft: ice. Down: ice. Right: hole. Up: ice."
    local.step("Down")
    assert local.render() == "Goal: 1 Right.\nLeft: ice. Down: edge. Right: goal. Up: ice."
    local.step("Right")
    assert local.render() == "You are on the goal." and local.success
    assert "what each move leads to" in local.instructions and "row 1 is the top" in positions.instructions
    with pytest.raises(envs.EnvError, match="render must be one of grid, positions, local"):
        envs.make("frozenlake", render="pixels")


# -- countdown ------------------------------------------------------------------------


def test_countdown_rewards():
    env = envs.make("countdown")
    env.reset(0)
    env.target, env.numbers = 24, (3, 5, 2)
    assert env.step("(3 + 5) * 3")[1] == 0.0 and env.done
    env.done = False
    assert env.step("3 * 5 + 2")[1] == 0.1
    env.done = False
    _, r, _, info = env.step("(5 - 2) * 3 + 15 - 3 * 5 + 0 * 2")
    assert r == 0.0
    env.done = False
    env.numbers = (4, 6, 1)
    _, r, _done, info = env.step("4 * 6 * 1")
    assert r == 1.0 and info["success"]


def test_countdown_safe_evaluation():
    for bad in ["__import__('os')", "2 ** 100", "-3 + 4", "x + 1", "1 / 0", "(" * 300, "1.5 + 2", "lambda: 1"]:
        with pytest.raises(NotAnExpression):
            evaluate(bad)
    assert evaluate("(6 / 4) * 2")[0] == 3


def test_countdown_problems_are_solvable():
    env = envs.make("countdown")
    for seed in range(100):
        env.reset(seed)
        assert 3 <= len(env.numbers) <= 4 and 1 <= env.target <= 200
        expr = solve_countdown(env.numbers, env.target)
        assert expr is not None and env.step(expr)[3]["success"]


def test_countdown_random_numbers_are_spread():
    env = envs.make("countdown")
    sizes = Counter(len(env.reset(s) and env.numbers) for s in range(200))
    assert set(sizes) == {3, 4}


def test_envs_leave_the_global_rng_alone():
    random.seed(123)
    expected = random.random()
    random.seed(123)
    for name in ("bandit", "sokoban", "frozenlake", "countdown"):
        env = envs.make(name)
        env.reset(1)
        env.step((env.action_words or ("1 + 1",))[0])
    assert random.random() == expected


@pytest.mark.parametrize("name", ["frozenlake", "sokoban"])
def test_validation_states_are_never_training_states(name):
    env = envs.make(name)
    held = {}
    for split, seeds in (("validation", range(10**12, 10**12 + 200)), ("train", range(600))):
        contents = set()
        for s in seeds:
            text = env.reset(s, split)
            assert env.held_out() == (split == "validation")
            assert env.render() == text
            contents.add(env.content())
        held[split] = contents
    assert not held["validation"] & held["train"]
    # the same seed and split give the same state; without a split nothing is redrawn
    first = env.reset(10**12 + 3, "validation")
    assert env.reset(10**12 + 3, "validation") == first
    plain = [env.reset(s) for s in range(200)]
    assert {env.held_out() for s in range(200) if env.reset(s) is not None} == {True, False}
    assert plain == [env.reset(s) for s in range(200)]


def test_environments_without_content_hold_nothing_out():
    env = envs.make("bandit")
    assert env.content() is None and env.held_out() is None
    assert env.reset(3, "validation") == env.reset(3, "train") == env.reset(3)


def test_a_verifiers_environment_without_the_package_is_one_line():
    try:
        import verifiers  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("verifiers is installed here: tests/envs/test_verifiers_env.py tests it")
    with pytest.raises(envs.EnvError, match=r"needs the verifiers package 0\.3\.1: bash \.ci/verifiers"):
        envs.make("verifiers", id="vf_sums")
