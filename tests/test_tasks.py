"""Task suite: hand-computed traces, verifier/matcher on random inputs, corruptions, bad text."""

from __future__ import annotations

import random

import numpy as np
import pytest

from latentstrat.tasks import TASKS
from latentstrat.tasks.base import final_answer, normalize

N_RANDOM = 1000

# hand-computed traces (x, strategy) -> y
EXPECTED = [
    ("sorting_algorithms", "sort 5 3 8 1 4", "bubble", "3 5 1 4 8 ; 3 1 4 5 8 ; 1 3 4 5 8 ; answer 1 3 4 5 8"),
    ("sorting_algorithms", "sort 5 3 8 1 4", "insertion", "3 5 ; 3 5 8 ; 1 3 5 8 ; 1 3 4 5 8 ; answer 1 3 4 5 8"),
    (
        "sorting_algorithms",
        "sort 5 3 8 1 4",
        "selection",
        "1 3 8 5 4 ; 1 3 8 5 4 ; 1 3 4 5 8 ; 1 3 4 5 8 ; answer 1 3 4 5 8",
    ),
    ("grid_pathfinding", "path 2 5 to 4 1", "horizontal_first", "left 4 3 2 1 down 3 4 answer 6"),
    ("grid_pathfinding", "path 2 5 to 4 1", "vertical_first", "down 3 4 left 4 3 2 1 answer 6"),
    ("grid_pathfinding", "path 3 0 to 1 1", "vertical_first", "up 2 1 right 1 answer 3"),
    (
        "multidigit_addition",
        "add 4 7 2 + 3 8 9",
        "right_to_left",
        "2 + 9 = 1 1 ; 7 + 8 + 1 = 1 6 ; 4 + 3 + 1 = 8 ; answer 8 6 1",
    ),
    (
        "multidigit_addition",
        "add 4 7 2 + 3 8 9",
        "left_to_right",
        "+ 3 0 0 = 7 7 2 ; + 8 0 = 8 5 2 ; + 9 = 8 6 1 ; answer 8 6 1",
    ),
    ("multidigit_addition", "add 9 5 + 7", "right_to_left", "5 + 7 = 1 2 ; 9 + 1 = 1 0 ; answer 1 0 2"),
    (
        "linear_equations",
        "solve 5 x + 3 = 2 x + 1 2",
        "x_terms_first",
        "5 x - 2 x = 3 x ; 3 x + 3 = 1 2 ; 1 2 - 3 = 9 ; 3 x = 9 ; x = 9 / 3 ; answer 3",
    ),
    (
        "linear_equations",
        "solve 5 x + 3 = 2 x + 1 2",
        "constants_first",
        "1 2 - 3 = 9 ; 5 x = 2 x + 9 ; 5 x - 2 x = 3 x ; 3 x = 9 ; x = 9 / 3 ; answer 3",
    ),
    (
        "base_conversion",
        "convert 1 0 1 1 0 1 1 to base 8",
        "group_from_right",
        "0 1 1 = 3 ; 0 1 1 = 3 ; 1 = 1 ; answer 1 3 3",
    ),
    (
        "base_conversion",
        "convert 1 0 1 1 0 1 1 to base 8",
        "pad_left",
        "= 0 0 1 0 1 1 0 1 1 ; 0 0 1 = 1 ; 0 1 1 = 3 ; 0 1 1 = 3 ; answer 1 3 3",
    ),
    (
        "base_conversion",
        "convert 1 1 1 0 0 1 0 to base 4",
        "group_from_right",
        "1 0 = 2 ; 0 0 = 0 ; 1 1 = 3 ; 1 = 1 ; answer 1 3 0 2",
    ),
    (
        "base_conversion",
        "convert 1 1 1 0 0 1 0 to base 4",
        "pad_left",
        "= 0 1 1 1 0 0 1 0 ; 0 1 = 1 ; 1 1 = 3 ; 0 0 = 0 ; 1 0 = 2 ; answer 1 3 0 2",
    ),
    ("list_reversal", "reverse 3 8 1 9 4", "swap_ends", "4 8 1 9 3 ; 4 9 1 8 3 ; answer 4 9 1 8 3"),
    ("list_reversal", "reverse 3 8 1 9 4", "take_last", "4 ; 4 9 ; 4 9 1 ; 4 9 1 8 ; 4 9 1 8 3 ; answer 4 9 1 8 3"),
    ("list_reversal", "reverse 2 0 0 2", "swap_ends", "2 0 0 2 ; 2 0 0 2 ; answer 2 0 0 2"),
    (
        "gcd_computation",
        "gcd 4 8 , 1 8",
        "euclid_remainder",
        "4 8 mod 1 8 = 1 2 ; 1 8 mod 1 2 = 6 ; 1 2 mod 6 = 0 ; answer 6",
    ),
    (
        "gcd_computation",
        "gcd 4 8 , 1 8",
        "prime_factors",
        "4 8 = 2 x 2 x 2 x 2 x 3 ; 1 8 = 2 x 3 x 3 ; common 2 x 3 ; answer 6",
    ),
    ("gcd_computation", "gcd 1 7 , 3 0", "prime_factors", "1 7 = 1 7 ; 3 0 = 2 x 3 x 5 ; common 1 ; answer 1"),
]


@pytest.mark.parametrize("task,x,strategy,y", EXPECTED)
def test_hand_computed_traces(task, x, strategy, y):
    t = TASKS[task]
    assert t.render(x, strategy) == y
    assert t.final_answer_correct(x, y)
    assert strategy in t.matching_strategies(x, y)


def test_registry_covers_the_default_tasks():
    names = {
        "sorting_algorithms",
        "grid_pathfinding",
        "multidigit_addition",
        "linear_equations",
        "base_conversion",
        "list_reversal",
        "gcd_computation",
    }
    assert names <= set(TASKS)
    for name, t in TASKS.items():
        assert t.name == name and 2 <= len(t.strategies) <= 4
    assert TASKS["sorting_algorithms"].strategies == ("bubble", "insertion", "selection")


def _samples(task, n=N_RANDOM, seed=0):
    rng = random.Random(f"test:{seed}:{task.name}")
    return [task.sample_input(rng) for _ in range(n)]


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_trace_verifies_and_matches(name):
    t = TASKS[name]
    ambiguous = 0
    for x in _samples(t):
        answers = set()
        for s in t.strategies:
            y = t.render(x, s)
            assert t.final_answer_correct(x, y), (x, s, y)
            m = t.matching_strategies(x, y)
            assert s in m, (x, s, y, m)
            ambiguous += len(m) > 1
            answers.add(final_answer(y))
            assert all(w.isdigit() and len(w) == 1 for w in t.answer(x).split()), "digits are separate tokens"
        assert answers == {t.answer(x)}, "all strategies reach the same answer"
    assert ambiguous / (N_RANDOM * len(t.strategies)) <= 0.05


@pytest.mark.parametrize("name", sorted(TASKS))
def test_strategies_differ_early(name):
    """Where two strategies' traces differ, the first differing token comes early (<= 3rd
    token) for at least 95% of inputs: one early token decides the strategy."""
    t = TASKS[name]
    late = total = 0
    for x in _samples(t, 300, seed=1):
        ys = [t.render(x, s).split() for s in t.strategies]
        for i in range(len(ys)):
            for j in range(i + 1, len(ys)):
                if ys[i] == ys[j]:  # ambiguous input
                    continue
                first = next((k for k, (a, b) in enumerate(zip(ys[i], ys[j])) if a != b), min(len(ys[i]), len(ys[j])))
                late += first > 2
                total += 1
    assert late / total <= 0.05


@pytest.mark.parametrize("name", sorted(TASKS))
def test_single_token_corruptions_are_caught(name):
    """>= 95% of single-token corruptions fail the verifier or match no strategy."""
    t = TASKS[name]
    xs = _samples(t, 200, seed=2)
    vocab = sorted({w for x in xs[:50] for s in t.strategies for w in t.render(x, s).split()})
    rng = random.Random(3)
    caught = total = 0
    for x in xs:
        for s in t.strategies:
            words = t.render(x, s).split()
            for k in range(len(words)):
                bad = list(words)
                bad[k] = rng.choice([w for w in vocab if w != words[k]])
                y = " ".join(bad)
                caught += (not t.final_answer_correct(x, y)) or not t.matching_strategies(x, y)
                total += 1
    assert total > 1000
    assert caught / total >= 0.95


def test_ambiguous_inputs_match_every_strategy():
    t = TASKS["grid_pathfinding"]
    y = t.render("path 3 1 to 3 5", "horizontal_first")
    assert y == "right 2 3 4 5 answer 4" == t.render("path 3 1 to 3 5", "vertical_first")
    assert t.matching_strategies("path 3 1 to 3 5", y) == {"horizontal_first", "vertical_first"}
    rate = np.mean([len(t.matching_strategies(x, t.render(x, "vertical_first"))) > 1 for x in _samples(t, 3000, 7)])
    assert 0.005 < rate < 0.04  # STRAIGHT_RATE = 0.02


def test_corruption_control_uncorrupted_is_not_caught():
    # positive control for the corruption check: the clean trace passes both
    t = TASKS["multidigit_addition"]
    x, y = "add 4 7 2 + 3 8 9", t.render("add 4 7 2 + 3 8 9", "right_to_left")
    assert t.final_answer_correct(x, y) and t.matching_strategies(x, y) == {"right_to_left"}
    # changing only a trace token keeps the answer but matches nothing
    bad = y.replace("7 + 8 + 1", "7 + 8 + 2")
    assert t.final_answer_correct(x, bad) and t.matching_strategies(x, bad) == set()
    # changing the answer fails the verifier
    assert not t.final_answer_correct(x, y[:-1] + "2")


@pytest.mark.parametrize("name", sorted(TASKS))
@pytest.mark.parametrize(
    "junk",
    [
        None,
        17,
        "",
        "   ",
        "answer",
        "answer answer",
        "<unk> <unk>",
        "; ; ;",
        "x = = / r mod",
        "answer 9 9 9 9 9 9 9 9 9 9",
        "</y> answer 1",
    ],
)
def test_verifier_and_matcher_never_raise_on_junk(name, junk):
    t = TASKS[name]
    x = _samples(t, 1)[0]
    assert t.final_answer_correct(x, junk) is False
    assert t.matching_strategies(x, junk) == set()


@pytest.mark.parametrize("name", sorted(TASKS))
def test_truncated_and_padded_generations(name):
    t = TASKS[name]
    for x in _samples(t, 20, seed=4):
        for s in t.strategies:
            words = t.render(x, s).split()
            for cut in range(len(words)):  # every truncation loses at least the last answer token
                y = " ".join(words[:cut])
                assert not t.matching_strategies(x, y)
                assert not t.final_answer_correct(x, y)
            full = " ".join(words)
            # a decoded generation may carry the end tokens and padding after them
            assert t.final_answer_correct(x, full + " </y> <eos> <pad> <pad>")
            assert t.matching_strategies(x, "  " + full.replace(" ", "   ") + " </y> junk") == {s}
            assert not t.final_answer_correct(x, full + " 7")  # trailing junk before the end


def test_normalize_and_final_answer():
    assert normalize("a  b\tc </y> d") == "a b c"
    assert normalize(None) is None
    assert final_answer("answer 1 ; answer 2 3") == "2 3"
    assert final_answer("1 2 3") is None
    assert final_answer("answer") == ""


@pytest.mark.parametrize("name", sorted(TASKS))
def test_sampling_is_seeded(name):
    t = TASKS[name]
    assert _samples(t, 30, seed=5) == _samples(t, 30, seed=5)
    assert _samples(t, 30, seed=5) != _samples(t, 30, seed=6)


def test_unknown_strategy_is_an_error():
    with pytest.raises(ValueError, match="unknown strategy 'quick'"):
        TASKS["sorting_algorithms"].render("sort 3 1 2 4", "quick")
