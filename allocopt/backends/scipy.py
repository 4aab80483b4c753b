"""SciPy: ``scipy.optimize.linprog(method="highs")`` for LPs, ``scipy.optimize.milp`` for MILPs.

``linprog`` takes ``A_ub x <= b_ub`` and ``A_eq x == b_eq``, so a row with a
finite upper bound goes to ``A_ub`` as is, one with a finite lower bound as
its negation, and an equality row to ``A_eq``. The HiGHS marginals are
``d fun / d b`` of the minimization, so a row's dual is its ``A_ub`` marginal
minus its negated-row marginal plus its ``A_eq`` marginal. ``milp`` takes the
two-sided rows directly and reports no duals.
https://docs.scipy.org/doc/scipy/reference/optimize.linprog-highs.html
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from allocopt.backends.base import Backend, RawResult, SolveOptions
from allocopt.errors import InvalidOptionError
from allocopt.model import CompiledModel
from allocopt.solution import Status

STATUS_MAP = {  # linprog and milp share these codes
    0: Status.OPTIMAL,  # optimal solution found
    1: Status.TIME_LIMIT,  # iteration or time limit reached
    2: Status.INFEASIBLE,  # problem is infeasible
    3: Status.UNBOUNDED,  # problem is unbounded
    4: Status.ERROR,  # numerical difficulties or another HiGHS status (see the message)
}
# Status 4 also covers HiGHS's kUnboundedOrInfeasible, told apart only by scipy's message.
_INF_OR_UNBD_MESSAGE = "unbounded or infeasible"
# HiGHS options linprog hands to HiGHS as they are (with a warning, silenced here for these)
PASSED_TO_HIGHS = frozenset({"simplex_strategy"})
# The options each function documents; scipy only warns about others.
LINPROG_OPTIONS = frozenset({
    "maxiter", "disp", "presolve", "time_limit", "dual_feasibility_tolerance",
    "primal_feasibility_tolerance", "ipm_optimality_tolerance",
    "simplex_dual_edge_weight_strategy", "mip_rel_gap",
    "method",  # linprog's own argument: "highs" (default), "highs-ds" or "highs-ipm"
    *PASSED_TO_HIGHS})
MILP_OPTIONS = frozenset({"disp", "presolve", "time_limit", "node_limit", "mip_rel_gap"})


@dataclass
class _LinprogArgs:
    kwargs: dict[str, Any]  # keyword arguments of linprog
    eq_rows: np.ndarray  # original row of each A_eq row
    ub_rows: np.ndarray  # original row of each leading A_ub row (upper bounds)
    lb_rows: np.ndarray  # original row of each trailing A_ub row (negated lower bounds)


@dataclass
class _MilpArgs:
    kwargs: dict[str, Any]  # keyword arguments of milp


class ScipyBackend(Backend):
    """``scipy.optimize.linprog`` / ``milp`` (see the module docstring)."""
    name = "scipy"
    required_modules = ("scipy",)
    install_hint = "pip install scipy"

    def build(self, model: CompiledModel, options: SolveOptions) -> _LinprogArgs | _MilpArgs:
        from scipy.optimize import Bounds, LinearConstraint

        settings = self._settings(model, options)
        if model.is_mip:
            return _MilpArgs({
                "c": model.c, "integrality": model.integrality.astype(np.int64),
                "bounds": Bounds(model.col_lb, model.col_ub), "options": settings,
                "constraints": LinearConstraint(model.A, model.row_lb, model.row_ub)
                if model.num_rows else None})
        lb, ub = model.row_lb, model.row_ub
        eq_rows, ub_rows, lb_rows = model.row_groups()
        kwargs: dict[str, Any] = {
            "c": model.c, "bounds": np.column_stack([model.col_lb, model.col_ub]),
            "method": settings.pop("method", "highs"), "options": settings}
        if ub_rows.size or lb_rows.size:
            kwargs["A_ub"] = sp.vstack([model.A[ub_rows], -model.A[lb_rows]], format="csr")
            kwargs["b_ub"] = np.concatenate([ub[ub_rows], -lb[lb_rows]])
        if eq_rows.size:
            kwargs["A_eq"] = model.A[eq_rows]
            kwargs["b_eq"] = ub[eq_rows]
        return _LinprogArgs(kwargs, eq_rows, ub_rows, lb_rows)

    @staticmethod
    def _settings(model: CompiledModel, options: SolveOptions) -> dict[str, Any]:
        if options.threads is not None:
            raise InvalidOptionError("backend 'scipy' does not support the threads option "
                                     "(scipy.optimize has no thread setting); leave threads=None "
                                     "or use backend='highs'")
        settings: dict[str, Any] = {"disp": bool(options.verbose)}
        if options.time_limit_s is not None:
            settings["time_limit"] = float(options.time_limit_s)
        if options.mip_gap is not None:
            settings["mip_rel_gap"] = float(options.mip_gap)
        settings.update(options.solver_options)
        known, function = (MILP_OPTIONS, "milp") if model.is_mip else (LINPROG_OPTIONS, "linprog")
        unknown = sorted(set(settings) - known)
        if unknown:
            raise InvalidOptionError(
                f"scipy.optimize.{function} does not take the option(s) {', '.join(unknown)}; "
                f"it takes {', '.join(sorted(known))}")
        return settings

    def run(self, handle: _LinprogArgs | _MilpArgs, model: CompiledModel,
            options: SolveOptions) -> RawResult:
        from scipy.optimize import OptimizeWarning, linprog, milp

        if isinstance(handle, _MilpArgs):
            res = milp(**handle.kwargs)
        else:
            with warnings.catch_warnings():
                if PASSED_TO_HIGHS & set(handle.kwargs["options"]):
                    warnings.filterwarnings("ignore", "Unrecognized options detected", OptimizeWarning)
                res = linprog(**handle.kwargs)
        status = STATUS_MAP.get(res.status, Status.ERROR)
        if res.status == 4 and _INF_OR_UNBD_MESSAGE in res.message:
            status = Status.INFEASIBLE_OR_UNBOUNDED
        result = RawResult(status=status, raw_status=f"{res.status}: {res.message}")
        if res.x is not None and result.status in (Status.OPTIMAL, Status.TIME_LIMIT):
            result.x = np.asarray(res.x, dtype=np.float64)
        if isinstance(handle, _MilpArgs):
            if result.x is not None and res.get("mip_gap") is not None:
                result.mip_gap = float(res.mip_gap)
        elif result.status is Status.OPTIMAL:
            duals = np.zeros(model.num_rows)
            k = handle.ub_rows.size
            duals[handle.ub_rows] += res.ineqlin.marginals[:k]
            duals[handle.lb_rows] -= res.ineqlin.marginals[k:]
            duals[handle.eq_rows] += res.eqlin.marginals
            result.row_duals = duals
        return result
