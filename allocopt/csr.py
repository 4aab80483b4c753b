"""Compressed-row matrices of a model's linear expressions, in numpy alone.

:class:`CSR` holds the three arrays of a compressed sparse row matrix (``data``,
``indices``, ``indptr``) and the few operations :mod:`allocopt.model` builds
expressions with: taking rows, weighted sums of groups of rows (``sum`` and
``M @ expr``), addition, row scaling and stacking. Importing ``scipy.sparse``
costs a fresh process about 0.1 s, more than building and solving a small
model, so small matrices are combined here in numpy; above
:data:`SCIPY_FROM_NNZ` entries, where scipy's compiled loops win, the same
operations go through ``scipy.sparse``. Both paths give identical matrices,
bit for bit and entry for entry: each output entry is the sum of the same
products taken in the same order (scipy's ``csr_matmat`` and ``csr_binop_csr``
accumulate sequentially, as :func:`numpy.bincount` does), entries that sum to
zero are dropped by both, and the entries of a row come in scipy's order
(sorted columns for the sum of two sorted matrices, else the reverse of the
order in which columns first appear). Solvers changed coefficient by
coefficient (HiGHS's ``changeCoeff``) depend on that order.

:meth:`CSR.to_scipy` gives the same matrix as a ``scipy.sparse.csr_matrix``
without copying.
"""

from __future__ import annotations

from typing import Any

import numpy as np

SCIPY_FROM_NNZ = 50_000
"""Operations whose operands hold more stored entries than this use scipy.sparse."""


class CSR:
    """A compressed sparse row matrix: row ``i`` holds ``data[indptr[i]:indptr[i+1]]`` in columns
    ``indices[indptr[i]:indptr[i+1]]``, without duplicate columns in a row."""

    __slots__ = ("data", "indices", "indptr", "shape")

    def __init__(self, data: np.ndarray, indices: np.ndarray, indptr: np.ndarray, shape: tuple[int, int]):
        self.shape = (int(shape[0]), int(shape[1]))
        self.data = np.asarray(data, dtype=np.float64)
        # the index type scipy.sparse picks, so that to_scipy() shares all three arrays: a change scipy makes
        # in place (sort_indices) then reaches this matrix whole
        index = np.int32 if max(*self.shape, self.data.size) < np.iinfo(np.int32).max else np.int64
        self.indices = np.asarray(indices, dtype=index)
        self.indptr = np.asarray(indptr, dtype=index)

    # ----- construction -------------------------------------------------------
    @classmethod
    def identity_block(cls, size: int, start: int) -> CSR:
        """Rows ``k`` = unit vector of column ``start + k``, of shape (size, start + size)."""
        return cls(np.ones(size), np.arange(start, start + size), np.arange(size + 1), (size, start + size))

    @classmethod
    def empty(cls, n_rows: int, n_cols: int) -> CSR:
        """An all-zero matrix."""
        return cls(np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(n_rows + 1, dtype=np.int64), (n_rows, n_cols))

    @classmethod
    def from_any(cls, matrix: Any) -> CSR:
        """A :class:`CSR`, a scipy.sparse matrix or array, or a dense 2-D array as a :class:`CSR`."""
        if isinstance(matrix, CSR):
            return matrix
        if hasattr(matrix, "tocsr"):  # scipy.sparse, without importing it here
            m = matrix.tocsr()
            return cls(m.data, m.indices, m.indptr, m.shape)
        dense = np.asarray(matrix, dtype=np.float64)
        if dense.ndim != 2:
            raise TypeError(f"expected a 2-D matrix, got an array of shape {dense.shape}")
        rows, cols = np.nonzero(dense)
        indptr = np.zeros(dense.shape[0] + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=dense.shape[0]), out=indptr[1:])
        return cls(dense[rows, cols], cols, indptr, dense.shape)

    def to_scipy(self):
        """The same matrix as a ``scipy.sparse.csr_matrix``, sharing the arrays (changes in place show in both)."""
        import scipy.sparse as sp

        return sp.csr_matrix((self.data, self.indices, self.indptr), shape=self.shape)

    # ----- properties ---------------------------------------------------------
    @property
    def nnz(self) -> int:
        """Number of stored entries."""
        return int(self.indptr[-1])

    def row_lengths(self) -> np.ndarray:
        """Stored entries of each row."""
        return np.diff(self.indptr)

    def __repr__(self) -> str:
        return f"CSR(shape={self.shape}, nnz={self.nnz})"

    def has_sorted_rows(self) -> bool:
        """Whether the columns of every row are strictly increasing (scipy's canonical format)."""
        if self.nnz < 2:
            return True
        step = np.diff(self.indices)
        starts = self.indptr[1:-1]
        crossing = np.zeros(step.size, dtype=bool)
        crossing[starts[(starts > 0) & (starts < self.nnz)] - 1] = True  # a step from one row into the next
        return bool(np.all((step > 0) | crossing))

    def to_dense(self) -> np.ndarray:
        """The matrix as a dense array."""
        out = np.zeros(self.shape)
        out[np.repeat(np.arange(self.shape[0]), self.row_lengths()), self.indices] = self.data
        return out

    # ----- operations ---------------------------------------------------------
    def with_columns(self, n_cols: int) -> CSR:
        """The matrix widened to ``n_cols`` columns (the new ones empty)."""
        if n_cols == self.shape[1]:
            return self
        return CSR(self.data, self.indices, self.indptr, (self.shape[0], n_cols))

    def take_rows(self, rows: np.ndarray) -> CSR:
        """The matrix of rows ``rows`` (an integer array; repeats allowed)."""
        rows = np.asarray(rows, dtype=np.int64).ravel()
        lengths = self.row_lengths()[rows]
        indptr = np.zeros(rows.size + 1, dtype=np.int64)
        np.cumsum(lengths, out=indptr[1:])
        positions = np.repeat(self.indptr[rows] - indptr[:-1], lengths) + np.arange(indptr[-1])
        return CSR(self.data[positions], self.indices[positions], indptr, (rows.size, self.shape[1]))

    def scale_rows(self, factor: np.ndarray) -> CSR:
        """Row ``i`` times ``factor[i]``; rows scaled by zero lose their entries."""
        data = self.data * np.repeat(factor, self.row_lengths())
        if factor.all():
            return CSR(data, self.indices, self.indptr, self.shape)
        return _from_entries(np.repeat(np.arange(self.shape[0]), self.row_lengths()), self.indices, data,
                             self.shape, merge=False)

    def __neg__(self) -> CSR:
        return CSR(-self.data, self.indices, self.indptr, self.shape)

    def __add__(self, other: CSR) -> CSR:
        if self.shape != other.shape:
            raise ValueError(f"cannot add matrices of shapes {self.shape} and {other.shape}")
        if self.nnz + other.nnz > SCIPY_FROM_NNZ:
            return CSR.from_any(self.to_scipy() + other.to_scipy())
        rows = np.concatenate([np.repeat(np.arange(self.shape[0]), self.row_lengths()),
                               np.repeat(np.arange(other.shape[0]), other.row_lengths())])
        # scipy's csr_binop_csr adds self's entries, then other's, in this concatenation's order; it merges
        # sorted rows in column order, others through a list of columns newest first
        return _from_entries(rows, np.concatenate([self.indices, other.indices]),
                             np.concatenate([self.data, other.data]), self.shape,
                             newest_first=not (self.has_sorted_rows() and other.has_sorted_rows()))

    def combine_rows(self, weights: CSR) -> CSR:
        """``weights @ self``: output row ``g`` is the weighted sum of the rows ``weights`` row ``g`` names."""
        if weights.shape[1] != self.shape[0]:
            raise ValueError(f"cannot multiply matrices of shapes {weights.shape} and {self.shape}")
        lengths = self.row_lengths()[weights.indices]
        if weights.nnz + int(lengths.sum()) > SCIPY_FROM_NNZ:
            return CSR.from_any(weights.to_scipy() @ self.to_scipy())
        # entries in csr_matmat's order: for each output row, its weights in order, each row's entries in order
        expanded = self.take_rows(weights.indices)
        out_row = np.repeat(np.repeat(np.arange(weights.shape[0]), weights.row_lengths()), lengths)
        data = expanded.data * np.repeat(weights.data, lengths)
        return _from_entries(out_row, expanded.indices, data, (weights.shape[0], self.shape[1]), newest_first=True)

    def __matmul__(self, vector: np.ndarray) -> np.ndarray:
        """``self @ vector`` for a 1-D array."""
        vector = np.asarray(vector, dtype=np.float64)
        if vector.ndim != 1 or vector.size != self.shape[1]:
            raise ValueError(f"cannot multiply a matrix of shape {self.shape} by a vector of shape {vector.shape}")
        rows = np.repeat(np.arange(self.shape[0]), self.row_lengths())
        return np.bincount(rows, weights=self.data * vector[self.indices], minlength=self.shape[0])


def vstack(blocks: list[CSR], n_cols: int) -> CSR:
    """The blocks one above the other, each widened to ``n_cols`` columns."""
    if not blocks:
        return CSR.empty(0, n_cols)
    offsets = np.cumsum([0] + [b.nnz for b in blocks[:-1]])
    indptr = np.concatenate([np.zeros(1, dtype=np.int64)] + [b.indptr[1:] + off for b, off in zip(blocks, offsets)])
    return CSR(np.concatenate([b.data for b in blocks]), np.concatenate([b.indices for b in blocks]), indptr,
               (sum(b.shape[0] for b in blocks), n_cols))


def _from_entries(rows: np.ndarray, cols: np.ndarray, values: np.ndarray, shape: tuple[int, int], *,
                  merge: bool = True, newest_first: bool = False) -> CSR:
    """A CSR matrix from (row, column, value) entries. With ``merge``, rows in any order and duplicates
    summed in the order given, each row's columns sorted or (``newest_first``) in the reverse of the order
    they first appear; without, entries already in row order and without duplicates. Zeros are dropped."""
    n_rows, n_cols = shape
    if merge:
        keys = rows * max(n_cols, 1) + cols
        unique, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        values = np.bincount(inverse.ravel(), weights=values, minlength=unique.size)  # sequential, in order
        rows, cols = unique // max(n_cols, 1), unique % max(n_cols, 1)
        if newest_first:
            order = np.lexsort((-first, rows))
            rows, cols, values = rows[order], cols[order], values[order]
    keep = values != 0
    rows, cols, values = rows[keep], cols[keep], values[keep]
    indptr = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n_rows), out=indptr[1:])
    return CSR(values, cols, indptr, shape)
