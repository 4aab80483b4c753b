"""The solver-neutral LP/MILP model.

A :class:`Model` holds variable blocks (an n-dimensional array of columns each,
with bounds and integrality), constraint blocks (``row_lb <= A x <= row_ub``
with ``A`` a compressed-row matrix, :class:`allocopt.csr.CSR`), and a linear objective. Formulations are
written with array-shaped linear expressions so they read like their math::

    m = Model()
    X = m.add_variable("X", shape=(n_jobs, n_types), lb=0.0, ub=1.0)
    m.add_constraint("time", X.sum(axis=1) <= 1.0)
    m.add_constraint("capacity", (X * scale[:, None]).sum(axis=0) <= capacity)
    m.maximize((X * T).sum())

Every operation is a sparse-matrix operation over all entries at once, so a
model is built in time proportional to its nonzeros. :meth:`Model.compile`
flattens everything into the arrays every backend reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal, Union

import numpy as np

from allocopt.csr import CSR, vstack
from allocopt.errors import InvalidOptionError

VarKind = Literal["continuous", "integer", "binary"]
ArrayLike = Union[float, int, np.ndarray]
Operand = Union["LinExpr", ArrayLike]


class LinExpr:
    """An array of affine expressions ``A @ x + const`` with a numpy-like shape.

    Entry ``k`` of the flattened (C-order) array is row ``k`` of ``A``.
    Supports ``+ - *`` (elementwise, with numpy broadcasting) with arrays,
    scalars and other expressions of the same model, division by arrays,
    ``sum(axis)``, indexing, ``.T`` and comparisons that produce
    :class:`Constraint` objects.
    """

    __array_ufunc__ = None  # make `ndarray <= expr` defer to LinExpr
    __hash__ = None  # type: ignore[assignment]  # == builds a constraint

    def __init__(self, A: CSR, const: np.ndarray, shape: tuple[int, ...]):
        self._A = A
        self.const = const
        self.shape = tuple(shape)

    @property
    def A(self) -> CSR:
        """Coefficient matrix of shape (size, n_columns_at_creation); ``.to_scipy()`` gives it as scipy.sparse."""
        return self._A

    @property
    def size(self) -> int:
        """Number of elements."""
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    def __repr__(self) -> str:
        return f"LinExpr(shape={self.shape}, nnz={self.A.nnz})"

    # ----- shape manipulation -------------------------------------------------
    def _take(self, flat_index: np.ndarray, shape: tuple[int, ...]) -> LinExpr:
        flat_index = np.asarray(flat_index, dtype=np.int64).ravel()
        return LinExpr(self.A.take_rows(flat_index), self.const[flat_index], shape)

    def broadcast_to(self, shape: tuple[int, ...]) -> LinExpr:
        """The expression broadcast to ``shape`` (numpy rules)."""
        shape = tuple(shape)
        if shape == self.shape:
            return self
        index = np.broadcast_to(np.arange(self.size).reshape(self.shape), shape)
        return self._take(index, shape)

    def reshape(self, *shape: int) -> LinExpr:
        """The expression with a new shape (same elements, C order)."""
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], tuple) else shape
        new_shape = np.empty(self.shape, dtype=np.int8).reshape(shape).shape
        return LinExpr(self.A, self.const, new_shape)

    def ravel(self) -> LinExpr:
        """The expression flattened to one dimension (C order)."""
        return LinExpr(self.A, self.const, (self.size,))

    def __getitem__(self, key) -> LinExpr:
        index = np.arange(self.size).reshape(self.shape)[key]
        index = np.asarray(index)
        return self._take(index, index.shape)

    @property
    def T(self) -> LinExpr:
        """The transpose of a 2-D expression."""
        index = np.arange(self.size).reshape(self.shape).T
        return self._take(index, index.shape)

    def sum(self, axis: int | None = None) -> LinExpr:
        """Sum over ``axis`` (all entries when None), like ``ndarray.sum``."""
        entries = np.arange(self.size).reshape(self.shape)
        if axis is None:
            out_shape: tuple[int, ...] = ()
            order = entries.ravel()
        else:
            axis = axis % self.ndim
            out_shape = self.shape[:axis] + self.shape[axis + 1:]
            order = np.moveaxis(entries, axis, -1).ravel()  # the entries of each output, outputs in C order
        n_out = int(np.prod(out_shape, dtype=np.int64))
        # summing matrix straight in CSR: row r sums the self.size / n_out entries listed for output r
        per_row = self.size // n_out if n_out else 0
        indptr = np.arange(n_out + 1, dtype=np.int64) * per_row
        S = CSR(np.ones(self.size), order, indptr, (n_out, self.size))
        return LinExpr(self.A.combine_rows(S), S @ self.const, out_shape)

    def __rmatmul__(self, matrix: Any) -> LinExpr:
        """``M @ expr`` for a (sparse or dense) matrix ``M`` and a 1-D expression."""
        if self.ndim != 1:
            raise TypeError("M @ expr needs a 1-D expression; use .ravel() first")
        M = CSR.from_any(matrix)
        return LinExpr(self.A.combine_rows(M), M @ self.const, (M.shape[0],))

    def dot(self, coefficients: ArrayLike) -> LinExpr:
        """``sum(self * coefficients)`` as a scalar expression."""
        return (self * coefficients).sum()

    # ----- arithmetic ---------------------------------------------------------
    def __add__(self, other: Operand) -> LinExpr:
        if not isinstance(other, LinExpr):  # a constant only shifts const
            arr = np.asarray(other, dtype=np.float64)
            shape = np.broadcast_shapes(self.shape, arr.shape)
            e = self.broadcast_to(shape)
            return LinExpr(e.A, e.const + np.broadcast_to(arr, shape).ravel(), shape)
        shape = np.broadcast_shapes(self.shape, other.shape)
        a, b = self.broadcast_to(shape), other.broadcast_to(shape)
        n_cols = max(a.A.shape[1], b.A.shape[1])
        return LinExpr(a.A.with_columns(n_cols) + b.A.with_columns(n_cols), a.const + b.const, shape)

    __radd__ = __add__

    def __neg__(self) -> LinExpr:
        return LinExpr(-self.A, -self.const, self.shape)

    def __sub__(self, other: Operand) -> LinExpr:
        return self + (-other if isinstance(other, LinExpr) else -np.asarray(other, float))

    def __rsub__(self, other: Operand) -> LinExpr:
        return (-self) + other

    def __mul__(self, other: ArrayLike) -> LinExpr:
        if isinstance(other, LinExpr):
            raise TypeError("LinExpr * LinExpr is not linear; multiply by an array or scalar")
        coef = np.asarray(other, dtype=np.float64)
        shape = np.broadcast_shapes(self.shape, coef.shape)
        e = self.broadcast_to(shape)
        coef = np.broadcast_to(coef, shape).ravel()
        return LinExpr(e.A.scale_rows(coef), e.const * coef, shape)

    __rmul__ = __mul__

    def __truediv__(self, other: ArrayLike) -> LinExpr:
        return self * (1.0 / np.asarray(other, dtype=np.float64))

    # ----- constraints --------------------------------------------------------
    def _compare(self, other: Operand) -> tuple[LinExpr, np.ndarray]:
        """``(expr, rhs)`` with ``self - other == expr - rhs``: constants go to the bounds."""
        if isinstance(other, LinExpr):
            diff = self - other
            return diff, np.zeros(diff.size)
        arr = np.asarray(other, dtype=np.float64)
        shape = np.broadcast_shapes(self.shape, arr.shape)
        return self.broadcast_to(shape), np.broadcast_to(arr, shape).ravel().copy()

    def __le__(self, other: Operand) -> Constraint:
        expr, rhs = self._compare(other)
        return Constraint(expr, lb=np.full(expr.size, -np.inf), ub=rhs)

    def __ge__(self, other: Operand) -> Constraint:
        expr, rhs = self._compare(other)
        return Constraint(expr, lb=rhs, ub=np.full(expr.size, np.inf))

    def __eq__(self, other: Operand) -> Constraint:  # type: ignore[override]
        expr, rhs = self._compare(other)
        return Constraint(expr, lb=rhs, ub=rhs.copy())


class Variable(LinExpr):
    """A block of decision variables: one column per entry of ``shape``."""

    def __init__(self, name: str, shape: tuple[int, ...], start: int, kind: VarKind):
        size = int(np.prod(shape, dtype=np.int64))
        super().__init__(CSR.identity_block(size, start), np.zeros(size), shape)
        self.name = name
        self.start = start
        self.kind = kind

    @property
    def columns(self) -> slice:
        """The contiguous column range of this block in the compiled model."""
        return slice(self.start, self.start + self.size)

    def __repr__(self) -> str:
        return f"Variable({self.name!r}, shape={self.shape}, kind={self.kind!r})"


@dataclass
class Constraint:
    """``lb <= expr <= ub`` elementwise; built by comparing expressions."""

    expr: LinExpr
    lb: np.ndarray
    ub: np.ndarray


@dataclass(frozen=True)
class CompiledModel:
    """The flat arrays a backend reads: ``min/max c @ x + offset`` subject to
    ``row_lb <= A x <= row_ub`` and ``col_lb <= x <= col_ub``, with
    ``integrality[k]`` true for integer columns. ``matrix`` holds ``A`` as numpy arrays (what HiGHS
    reads); :attr:`A` gives it as a scipy.sparse CSR matrix."""

    c: np.ndarray
    offset: float
    matrix: CSR
    row_lb: np.ndarray
    row_ub: np.ndarray
    col_lb: np.ndarray
    col_ub: np.ndarray
    integrality: np.ndarray
    sense: Literal["min", "max"]
    variables: dict[str, tuple[slice, tuple[int, ...]]]
    constraints: dict[str, tuple[slice, tuple[int, ...]]]
    name: str = "allocopt"

    @cached_property
    def A(self):
        """The constraint matrix as a ``scipy.sparse.csr_matrix`` (scipy imported on first use)."""
        return self.matrix.to_scipy()

    @property
    def num_cols(self) -> int:
        """Number of columns (variables)."""
        return self.c.size

    @property
    def num_rows(self) -> int:
        """Number of rows (constraints)."""
        return self.matrix.shape[0]

    @property
    def is_mip(self) -> bool:
        """Whether any column is integer."""
        return bool(self.integrality.any())

    def row_groups(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Row indices of equality rows, of other rows with a finite upper bound,
        and of other rows with a finite lower bound (a ranged row is in both),
        for solvers that take ``A_eq x == b``, ``A_ub x <= ub``, ``A_lb x >= lb``."""
        has_lb, has_ub = np.isfinite(self.row_lb), np.isfinite(self.row_ub)
        equal = has_lb & has_ub & (self.row_lb == self.row_ub)
        return np.flatnonzero(equal), np.flatnonzero(has_ub & ~equal), np.flatnonzero(has_lb & ~equal)


class Model:
    """A linear or mixed-integer model built from array-shaped blocks."""

    def __init__(self, name: str = "allocopt"):
        self.name = name
        self.variables: dict[str, Variable] = {}
        self._bounds: list[tuple[np.ndarray, np.ndarray]] = []
        self.constraints: dict[str, Constraint] = {}
        self.objective: LinExpr | None = None
        self.sense: Literal["min", "max"] = "min"
        self.num_cols = 0

    def add_variable(self, name: str, shape: int | tuple[int, ...] = (), *,
                     lb: ArrayLike = 0.0, ub: ArrayLike = np.inf,
                     kind: VarKind = "continuous") -> Variable:
        """Add a block of variables; ``lb``/``ub`` broadcast to ``shape``."""
        if name in self.variables:
            raise InvalidOptionError(f"variable block {name!r} already exists in model {self.name!r}")
        if kind not in ("continuous", "integer", "binary"):
            raise InvalidOptionError(f"variable kind must be continuous, integer or binary, got {kind!r}")
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        var = Variable(name, shape, self.num_cols, kind)
        if kind == "binary":
            lb, ub = np.maximum(lb, 0.0), np.minimum(ub, 1.0)
        lb_arr = np.broadcast_to(np.asarray(lb, dtype=np.float64), shape).ravel().copy()
        ub_arr = np.broadcast_to(np.asarray(ub, dtype=np.float64), shape).ravel().copy()
        self.variables[name] = var
        self._bounds.append((lb_arr, ub_arr))
        self.num_cols += var.size
        return var

    def add_constraint(self, name: str, constraint: Constraint) -> None:
        """Add a named block of rows; its duals are reported under ``name``."""
        if not isinstance(constraint, Constraint):
            raise TypeError(f"constraint {name!r}: expected a comparison of expressions, "
                            f"got {type(constraint).__name__}")
        if name in self.constraints:
            raise InvalidOptionError(f"constraint block {name!r} already exists in model {self.name!r}")
        self.constraints[name] = constraint

    def maximize(self, expr: LinExpr) -> None:
        """Set the objective: maximize ``expr`` (a scalar expression)."""
        self._set_objective(expr, "max")

    def minimize(self, expr: LinExpr) -> None:
        """Set the objective: minimize ``expr`` (a scalar expression)."""
        self._set_objective(expr, "min")

    def _set_objective(self, expr: LinExpr, sense: Literal["min", "max"]) -> None:
        if not isinstance(expr, LinExpr) or expr.size != 1:
            raise TypeError("the objective must be a scalar expression; use .sum() to reduce it")
        self.objective, self.sense = expr, sense

    def maximize_minimum(self, exprs: LinExpr, name: str = "min_value") -> Variable:
        """Maximize ``min(exprs)`` through its epigraph: a free variable ``t``
        with ``exprs >= t`` (constraint block ``name``). Returns ``t``."""
        t = self.add_variable(name, lb=-np.inf)
        self.add_constraint(name, exprs - t >= 0.0)
        self.maximize(t)
        return t

    def minimize_maximum(self, exprs: LinExpr, name: str = "max_value") -> Variable:
        """Minimize ``max(exprs)`` through its epigraph (see :meth:`maximize_minimum`)."""
        t = self.add_variable(name, lb=-np.inf)
        self.add_constraint(name, exprs - t <= 0.0)
        self.minimize(t)
        return t

    def compile(self) -> CompiledModel:
        """Flatten all blocks into the arrays of a :class:`CompiledModel`."""
        n = self.num_cols
        col_lb = np.concatenate([b[0] for b in self._bounds]) if self._bounds else np.zeros(0)
        col_ub = np.concatenate([b[1] for b in self._bounds]) if self._bounds else np.zeros(0)
        integrality = np.zeros(n, dtype=bool)
        variables = {}
        for var in self.variables.values():
            variables[var.name] = (var.columns, var.shape)
            if var.kind != "continuous":
                integrality[var.columns] = True
        blocks, row_lb, row_ub, constraints, row = [], [], [], {}, 0
        for name, con in self.constraints.items():
            blocks.append(con.expr.A.with_columns(n))
            row_lb.append(con.lb - con.expr.const)
            row_ub.append(con.ub - con.expr.const)
            constraints[name] = (slice(row, row + con.expr.size), con.expr.shape)
            row += con.expr.size
        if self.objective is None:
            c, offset = np.zeros(n), 0.0
        else:
            c = self.objective.A.with_columns(n).to_dense().ravel()
            offset = float(self.objective.const[0])
        return CompiledModel(
            c=c, offset=offset, matrix=vstack(blocks, n),
            row_lb=np.concatenate(row_lb) if row_lb else np.zeros(0),
            row_ub=np.concatenate(row_ub) if row_ub else np.zeros(0),
            col_lb=col_lb, col_ub=col_ub, integrality=integrality, sense=self.sense,
            variables=variables, constraints=constraints, name=self.name)
