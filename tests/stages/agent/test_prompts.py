from hypothesis import given
from hypothesis import strategies as st

from stages.agent import prompts


def test_parse_think_and_answer():
    p = prompts.parse_response(" I go up. </think> <answer>Up || Left||  Down </answer>", True, 5)
    assert p.ok and p.think == "I go up." and p.actions == ("Up", "Left", "Down")


def test_parse_cuts_to_max_actions_and_drops_empty_pieces():
    p = prompts.parse_response("x</think><answer>Up ||  || Left || Down</answer>", True, 2)
    assert p.actions == ("Up", "Left")


def test_parse_first_match_wins_across_newlines():
    text = "a\nb</think>\n<answer>Up</answer> <think>c</think><answer>Down</answer>"
    assert prompts.parse_response(text, True, 5).actions == ("Up",)


def test_parse_without_think():
    assert prompts.parse_response("Right</answer>", False, 5).actions == ("Right",)
    assert not prompts.parse_response("Right", False, 5).ok


def test_malformed_responses_do_not_parse():
    for text in ["", "</think>", "x </think> Up", "x</think><answer>Up", "<answer>Up</answer>"]:
        assert not prompts.parse_response(text, True, 5).ok, text


@given(st.text(), st.booleans(), st.integers(1, 7))
def test_parse_never_raises(text, think, k):
    p = prompts.parse_response(text, think, k)
    assert len(p.actions) <= k


def test_render_response_round_trips():
    text = prompts.render_response(["Up", "Left"], True, " hm ")
    assert prompts.parse_response(text, True, 5).actions == ("Up", "Left")
    assert prompts.parse_response(prompts.render_response(["Up"], False), False, 5).actions == ("Up",)
