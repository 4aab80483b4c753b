"""allocopt.csr: the numpy path gives the matrices scipy.sparse gives, bit for bit, and a first solve
in a fresh process does not import scipy."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

import allocopt.csr
from allocopt.csr import CSR
from allocopt.model import Model


def _entries(matrix) -> list[tuple[int, int, float]]:
    """The (row, column, value) triples of a CSR or scipy matrix in storage order; values bit for bit."""
    m = CSR.from_any(matrix)
    rows = np.repeat(np.arange(m.shape[0]), m.row_lengths())
    return list(zip(rows.tolist(), m.indices.tolist(), m.data.tolist()))


def _build(seed: int):
    """A model whose rows need summation in a set order (values of very different sizes), cancellations
    (entries that sum to zero), broadcasting, indexing, transposes and ``M @ expr`` with repeated rows."""
    rng = np.random.default_rng(seed)
    n, k = rng.integers(2, 9), rng.integers(1, 5)
    values = rng.choice([1e16, 1.0, 0.1, 0.3, -1e16, 3.0], size=(n, k)) * rng.integers(0, 2, size=(n, k))
    other = rng.choice([1e-8, 0.7, 1e16, -0.1], size=(n, k))
    m = Model()
    X = m.add_variable("X", (n, k))
    y = m.add_variable("y", k, lb=-np.inf)
    rows = X * values + X * other - X * other  # cancels where values are zero
    m.add_constraint("types", (rows.sum(axis=0) + y * 0.1 - y * values[0]) <= 1.0)
    m.add_constraint("jobs", (X.T * values.T).sum(axis=0) + X[:, 0] * 1e16 >= -1.0)
    weights = sp.random(n + 3, n * k, density=0.5, random_state=seed, format="coo")
    weights = sp.coo_matrix((np.round(weights.data * 10) / 3, (weights.row, weights.col)), shape=weights.shape)
    m.add_constraint("mixed", weights @ (X * other).ravel() - (y.sum() * 0.3) == 0.0)
    m.add_constraint("picked", X[rng.integers(0, n, size=2 * n)].sum(axis=1) <= 2.0)
    m.maximize((X * values).sum() + y.sum() * 1e-3)
    return m.compile()


@pytest.mark.parametrize("seed", range(40))
def test_numpy_and_scipy_paths_give_the_same_matrices_bit_for_bit(monkeypatch, seed: int) -> None:
    monkeypatch.setattr(allocopt.csr, "SCIPY_FROM_NNZ", 10**9)
    by_numpy = _build(seed)
    monkeypatch.setattr(allocopt.csr, "SCIPY_FROM_NNZ", -1)
    by_scipy = _build(seed)
    assert _entries(by_numpy.matrix) == _entries(by_scipy.matrix)
    assert by_numpy.c.tobytes() == by_scipy.c.tobytes()
    assert by_numpy.row_lb.tobytes() == by_scipy.row_lb.tobytes()
    assert by_numpy.row_ub.tobytes() == by_scipy.row_ub.tobytes()
    assert (abs(by_numpy.matrix.data) > 0).all()  # entries that cancel are not stored


def test_rows_hold_no_duplicate_columns(monkeypatch) -> None:
    monkeypatch.setattr(allocopt.csr, "SCIPY_FROM_NNZ", 10**9)
    matrix = _build(3).matrix
    rows = np.repeat(np.arange(matrix.shape[0]), matrix.row_lengths())
    assert np.unique(rows * matrix.shape[1] + matrix.indices).size == matrix.nnz


def test_operations_against_scipy() -> None:
    rng = np.random.default_rng(0)
    a = sp.random(6, 5, density=0.4, random_state=1, format="csr")
    b = sp.random(6, 5, density=0.4, random_state=2, format="csr")
    w = sp.random(6, 6, density=0.5, random_state=3, format="csr")
    A, B, W = CSR.from_any(a), CSR.from_any(b), CSR.from_any(w)
    assert _entries(A + B) == _entries(a + b)
    assert _entries(A.combine_rows(W)) == _entries(w @ a)  # scipy's entry order too
    unsorted = A.combine_rows(W)
    assert not unsorted.has_sorted_rows() and A.has_sorted_rows()
    assert _entries(unsorted + B) == _entries(w @ a + b)
    rows = rng.integers(0, 6, size=9)
    assert np.array_equal(A.take_rows(rows).to_dense(), a[rows].toarray())
    x = rng.normal(size=5)
    assert np.array_equal(A @ x, a @ x)
    factor = np.array([0.0, 2.0, -1.0, 0.0, 3.0, 1.0])
    scaled = A.scale_rows(factor)
    assert np.array_equal(scaled.to_dense(), (sp.diags(factor) @ a).toarray())
    assert scaled.nnz == (sp.diags(factor) @ a).count_nonzero()
    dense = rng.normal(size=(3, 4)) * (rng.random((3, 4)) > 0.5)
    assert np.array_equal(CSR.from_any(dense).to_dense(), dense)
    assert np.array_equal(allocopt.csr.vstack([A, B], 7).to_dense(), np.pad(np.vstack([a.toarray(), b.toarray()]),
                                                                             ((0, 0), (0, 2))))
    with pytest.raises(ValueError, match="shapes"):
        A + CSR.empty(6, 4)
    with pytest.raises(ValueError, match="vector"):
        A @ np.ones(4)


def test_a_first_solve_does_not_import_scipy() -> None:
    code = ("import sys, allocopt\n"
            "cluster = allocopt.Cluster({'v100': 1, 'k80': 1})\n"
            "problem = allocopt.Problem([[40, 10], [12, 4], [100, 50]], cluster)\n"
            "allocopt.solve(problem, 'max_min_fairness'); allocopt.solve(problem, 'max_throughput')\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'scipy'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
