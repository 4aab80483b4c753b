"""The result of one solver call: status, values and duals, the same for every backend."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np


class Status(str, enum.Enum):
    """Outcome of a solve, shared by every backend."""

    OPTIMAL = "optimal"
    INFEASIBLE = "infeasible"
    UNBOUNDED = "unbounded"
    INFEASIBLE_OR_UNBOUNDED = "infeasible_or_unbounded"
    TIME_LIMIT = "time_limit"
    ERROR = "error"
    APPROXIMATE = "approximate"  # feasible, from an approximation (e.g. partitioning), not proven optimal

    def __str__(self) -> str:
        return self.value


STATUS_MESSAGES = {
    Status.OPTIMAL: "Optimal solution found.",
    Status.INFEASIBLE: "The problem is infeasible: no allocation satisfies every constraint.",
    Status.UNBOUNDED: "The problem is unbounded.",
    Status.INFEASIBLE_OR_UNBOUNDED: "The problem is infeasible or unbounded.",
    Status.TIME_LIMIT: "The solver stopped at a limit before proving optimality.",
    Status.ERROR: "The solver failed.",
    Status.APPROXIMATE: "Feasible, from an approximate method; not proven optimal.",
}


class BasisStatus(enum.IntEnum):
    """Simplex status of a column or row (HiGHS's codes); a row's status refers to its activity ``A x``."""

    LOWER = 0  # nonbasic at the lower bound
    BASIC = 1
    UPPER = 2  # nonbasic at the upper bound
    ZERO = 3  # nonbasic free column at zero


@dataclass(frozen=True)
class Basis:
    """A simplex basis: one :class:`BasisStatus` code (int8) per column and per row."""

    col_status: np.ndarray
    row_status: np.ndarray


@dataclass(frozen=True)
class Solution:
    """One solver call's answer.

    Attributes
    ----------
    status : Status
    message : str
        Our sentence for the status plus the solver's native status.
    objective : float or None
        Objective value in the model's own sense (max or min), offset included.
    x : ndarray of shape (n_columns,) or None
        Column values; None when the solver returned no point.
    values : dict of str to ndarray
        ``x`` split per variable block and reshaped to the block's shape.
    duals : dict of str to ndarray
        Per constraint block, ``d objective / d delta`` where the rows read
        ``row_lb + delta <= A x <= row_ub + delta``: the change of the optimal
        objective (in the model's sense) per unit shift of the row's bounds.
        Empty for MILPs and for backends that do not report duals.
    backend : str
    raw_status : str
        The solver's own status string or code.
    build_seconds, solve_seconds : float
        Wall time to hand the model to the solver, and to solve it.
    mip_gap : float or None
        Relative MIP gap reported by the solver (MILPs only).
    simplex_iterations : int or None
        Simplex iterations (HiGHS and Gurobi LPs); 0 when a warm start was already optimal.
    basis : Basis or None
        The final simplex basis (HiGHS and Gurobi LPs solved to optimality),
        read from the solver only when asked for.
    """

    status: Status
    message: str
    objective: float | None
    x: np.ndarray | None
    backend: str
    raw_status: str
    build_seconds: float
    solve_seconds: float
    values: dict[str, np.ndarray] = field(default_factory=dict)
    duals: dict[str, np.ndarray] = field(default_factory=dict)
    mip_gap: float | None = None
    simplex_iterations: int | None = None
    basis_reader: Callable[[], Basis | None] | None = field(default=None, repr=False, compare=False)

    @cached_property
    def basis(self) -> Basis | None:
        """The final simplex basis, read from the solver on first use (None if it kept none)."""
        return self.basis_reader() if self.basis_reader is not None else None

    def __getstate__(self) -> dict:
        # the reader holds solver objects that cannot be pickled or copied: read the basis now
        state = dict(self.__dict__)
        if state.get("basis_reader") is not None:
            state["basis"], state["basis_reader"] = self.basis, None
        return state

    @property
    def success(self) -> bool:
        """Whether the status is ``OPTIMAL``."""
        return self.status is Status.OPTIMAL

    @property
    def has_values(self) -> bool:
        """Whether the solver returned a point (``x`` is not None)."""
        return self.x is not None
