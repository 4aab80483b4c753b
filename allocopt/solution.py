"""The result of one solver call: status, values and duals, the same for every backend."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np


class Status(str, enum.Enum):
    """Outcome of a solve, shared by every backend."""

    OPTIMAL = "optimal"
    INFEASIBLE = "infeasible"
    UNBOUNDED = "unbounded"
    INFEASIBLE_OR_UNBOUNDED = "infeasible_or_unbounded"
    TIME_LIMIT = "time_limit"
    ERROR = "error"

    def __str__(self) -> str:
        return self.value


STATUS_MESSAGES = {
    Status.OPTIMAL: "Optimal solution found.",
    Status.INFEASIBLE: "The problem is infeasible: no allocation satisfies every constraint.",
    Status.UNBOUNDED: "The problem is unbounded.",
    Status.INFEASIBLE_OR_UNBOUNDED: "The problem is infeasible or unbounded.",
    Status.TIME_LIMIT: "The solver stopped at a limit before proving optimality.",
    Status.ERROR: "The solver failed.",
}


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

    @property
    def success(self) -> bool:
        return self.status is Status.OPTIMAL

    @property
    def has_values(self) -> bool:
        return self.x is not None
