"""The model layer: expressions evaluate like their numpy counterparts, and compile to the right arrays."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocopt.errors import InvalidOptionError
from allocopt.model import LinExpr, Model


def evaluate(expr: LinExpr, x: np.ndarray) -> np.ndarray:
    A = expr.A
    return (A @ x[: A.shape[1]] + expr.const).reshape(expr.shape)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 6), k=st.integers(1, 5), seed=st.integers(0, 2**32 - 1))
def test_expressions_match_numpy(n, k, seed):
    rng = np.random.default_rng(seed)
    m = Model()
    X = m.add_variable("X", (n, k))
    y = m.add_variable("y", k)
    t = m.add_variable("t")
    x = rng.normal(size=m.num_cols)
    Xv, yv, tv = x[X.columns].reshape(n, k), x[y.columns], x[t.columns][0]
    C = rng.normal(size=(n, k))
    v = rng.normal(size=k)
    cases = [
        (X * C, Xv * C),
        ((X * C).sum(axis=1), (Xv * C).sum(axis=1)),
        ((X * C).sum(axis=0), (Xv * C).sum(axis=0)),
        (X.sum(), Xv.sum()),
        (X + y, Xv + yv),                      # broadcasting (n,k) + (k,)
        (X - t * 2.0, Xv - 2.0 * tv),          # scalar variable broadcast
        (3.0 - X, 3.0 - Xv),
        (C - X, C - Xv),                       # ndarray on the left defers to LinExpr
        (-X / 2.0, -Xv / 2.0),
        (X.T, Xv.T),
        (X[:, 0], Xv[:, 0]),
        (X[np.arange(n) % 2 == 0], Xv[np.arange(n) % 2 == 0]),
        (y.dot(v), yv @ v),
        ((X * C + 1.5).sum(axis=1) - y[0], (Xv * C + 1.5).sum(axis=1) - yv[0]),
        (X.reshape(n * k), Xv.reshape(n * k)),
    ]
    for expr, expected in cases:
        assert expr.shape == np.shape(expected)
        np.testing.assert_allclose(evaluate(expr, x), expected, atol=1e-12)


def test_constraint_bounds_and_compile():
    m = Model()
    X = m.add_variable("X", (2, 3), lb=0.0, ub=[[1, 1, 0], [1, 1, 1]])
    t = m.add_variable("t", lb=-np.inf, kind="continuous")
    z = m.add_variable("z", 2, kind="binary")
    m.add_constraint("rows", X.sum(axis=1) + 1.0 <= 2.0)
    m.add_constraint("eq", z.sum() == 1)
    m.add_constraint("ge", 0.5 <= X.sum(axis=0))  # reflected comparison
    m.maximize(t * 2.0 + 4.0)
    c = m.compile()
    assert c.num_cols == 9 and c.num_rows == 2 + 1 + 3
    np.testing.assert_array_equal(c.row_ub[:2], [1.0, 1.0])
    assert np.all(np.isneginf(c.row_lb[:2]))
    assert c.row_lb[2] == c.row_ub[2] == 1.0
    np.testing.assert_array_equal(c.row_lb[3:], [0.5] * 3)
    np.testing.assert_array_equal(c.col_ub[:6], [1, 1, 0, 1, 1, 1])
    assert c.col_lb[6] == -np.inf
    np.testing.assert_array_equal(c.integrality, [False] * 7 + [True] * 2)
    np.testing.assert_array_equal(c.col_ub[7:], [1.0, 1.0])
    assert c.sense == "max" and c.offset == 4.0 and c.c[6] == 2.0
    assert c.variables["z"][1] == (2,) and c.constraints["ge"][0] == slice(3, 6)


def test_model_errors():
    m = Model()
    X = m.add_variable("X", (2, 2))
    with pytest.raises(InvalidOptionError, match="already exists"):
        m.add_variable("X", 3)
    with pytest.raises(InvalidOptionError, match="kind"):
        m.add_variable("Y", 3, kind="real")
    with pytest.raises(TypeError, match="not linear"):
        X * X
    with pytest.raises(TypeError, match="scalar"):
        m.maximize(X)
    with pytest.raises(TypeError, match="comparison"):
        m.add_constraint("bad", X.sum())


def test_build_is_linear_in_nonzeros():
    """Building must not loop in Python per entry: nonzeros of the compiled matrix equal the math's."""
    n, k = 5000, 8
    m = Model()
    X = m.add_variable("X", (n, k))
    m.add_constraint("time", X.sum(axis=1) <= 1)
    m.add_constraint("cap", (X * np.arange(1, n + 1)[:, None]).sum(axis=0) <= 10)
    m.maximize_minimum((X * 2.0).sum(axis=1))
    c = m.compile()
    assert c.A.nnz == n * k + n * k + (n * k + n)


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5), (0, 3), (3, 0), (5,), (1, 1, 1)])
def test_sum_matches_numpy_on_every_axis(shape):
    rng = np.random.default_rng(0)
    model = Model()
    X = model.add_variable("X", shape)
    x, coefficients = rng.random(X.size), rng.random(shape)
    for axis in [None, *range(len(shape)), -1]:
        total = (X * coefficients).sum(axis=axis)
        want = (x.reshape(shape) * coefficients).sum(axis=axis)
        assert total.shape == np.shape(want)
        assert np.allclose((total.A @ x + total.const).reshape(total.shape), want)
