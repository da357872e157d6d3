"""The acting rules (`distrl.sampling`): as plain data and back, and their greedy actions."""
import numpy as np
import pytest

from distrl.sampling import (BoxScaler, Bounds, Categorical, EpsilonGreedy, FactoredCategorical, Factors, Gaussian,
                             SquashedGaussian, rule_from_wire)

BOX = BoxScaler(Bounds([-2.0, 0.0], [2.0, 1.0], [2], "float32"))
BITS = Factors([2], [0], [1], "int8")  # "out" as one factor of 2 choices
OUT = {"q": np.array([[0.0, 2.0, 1.0]]), "out": np.array([[0.5, -0.5]], np.float32),
       "value": np.array([1.0], np.float32), "log_std": np.zeros((1, 2), np.float32),
       "mean": np.array([[0.5, -0.5]], np.float32)}


@pytest.mark.parametrize("rule", [EpsilonGreedy(0.3), Categorical(), FactoredCategorical(BITS), Gaussian(BOX),
                                  SquashedGaussian(BOX, True)])
def test_a_rule_as_data_acts_as_the_rule(rule):
    back = rule_from_wire(rule.to_wire())
    for explore in (True, False):
        a, extras = rule.act(OUT, np.random.default_rng(0), explore)
        b, extras_back = back.act(OUT, np.random.default_rng(0), explore)
        np.testing.assert_array_equal(a, b)
        assert extras.keys() == extras_back.keys()


def test_greedy_actions():
    assert EpsilonGreedy(1.0).act(OUT, None, False)[0] == [1]
    assert Categorical().act(OUT, None, False)[0] == [0]
    a = FactoredCategorical(BITS).act(OUT, None, False)[0]
    assert a.tolist() == [[0]] and a.dtype == np.int8
    np.testing.assert_allclose(Gaussian(BOX).act(OUT, None, False)[0], [[1.0, 0.25]])
    np.testing.assert_allclose(SquashedGaussian(BOX, True).act(OUT, None, False)[0],
                               [[2 * np.tanh(0.5), (np.tanh(-0.5) + 1) / 2]], rtol=1e-6)


@pytest.mark.parametrize("data", [{"kind": "teleport"}, {"kind": "epsilon_greedy"}, {"kind": "gaussian", "box": {}}, "x",
                                  {"kind": "factored_categorical"}, {"kind": "factored_categorical", "factors": {}}])
def test_what_no_rule_wrote_is_refused(data):
    with pytest.raises(ValueError):
        rule_from_wire(data)
