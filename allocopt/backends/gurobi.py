"""Gurobi through gurobipy's matrix API.

One ``addMVar`` for all columns and one ``addMConstr`` per row sense group,
straight from the CSR matrix; every solve runs in its own private ``gp.Env``
(no banner unless ``verbose``), disposed afterwards.
https://docs.gurobi.com/projects/optimizer/en/current/reference/python.html

Gurobi has no two-sided rows in its matrix API, so a ranged row
``lb < A_i x < ub`` becomes a ``<=`` row plus an extra ``>=`` row; its dual
is the sum of the two (at most one is nonzero). Gurobi's ``Pi`` is
``d objective / d rhs`` of the minimization, our convention as is.

Warm starts set ``VBasis`` / ``CBasis``: a ranged row is nonbasic at its upper
bound when its ``<=`` row is, and at its lower bound when its ``>=`` row is.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from allocopt.backends.base import Backend, RawResult, SolveOptions
from allocopt.errors import InvalidOptionError, LicenseError, LicenseLimitError, SolverError
from allocopt.model import CompiledModel
from allocopt.solution import Basis, BasisStatus, Status

STATUS_MAP = {
    1: Status.ERROR,  # LOADED: optimize() did not run
    2: Status.OPTIMAL,  # OPTIMAL
    3: Status.INFEASIBLE,  # INFEASIBLE
    4: Status.INFEASIBLE_OR_UNBOUNDED,  # INF_OR_UNBD
    5: Status.UNBOUNDED,  # UNBOUNDED
    6: Status.TIME_LIMIT,  # CUTOFF
    7: Status.TIME_LIMIT,  # ITERATION_LIMIT
    8: Status.TIME_LIMIT,  # NODE_LIMIT
    9: Status.TIME_LIMIT,  # TIME_LIMIT
    10: Status.TIME_LIMIT,  # SOLUTION_LIMIT
    11: Status.TIME_LIMIT,  # INTERRUPTED
    12: Status.ERROR,  # NUMERIC
    13: Status.OPTIMAL,  # SUBOPTIMAL (reported with a note, like cvxpy's optimal_inaccurate)
    14: Status.ERROR,  # INPROGRESS
    15: Status.TIME_LIMIT,  # USER_OBJ_LIMIT
    16: Status.TIME_LIMIT,  # WORK_LIMIT
    17: Status.TIME_LIMIT,  # MEM_LIMIT
}
_SUBOPTIMAL = 13
_INF_OR_UNBD = 4

# GRB.Error codes that mean "no usable license" (errno of GurobiError).
_NO_LICENSE = 10009  # NO_LICENSE: missing, expired or wrong-host license
_SIZE_LIMIT_EXCEEDED = 10010  # SIZE_LIMIT_EXCEEDED: size-limited (pip) license
_LICENSE_SERVER_ERRORS = (10022, 10023, 10028, 10032)  # NETWORK, JOB_REJECTED, CLOUD, SECURITY
SIZE_LIMIT = 2000  # variables and linear constraints allowed by the pip wheel's license
_VBASIS = np.array([-1, 0, -2, -3])  # Gurobi's VBasis per BasisStatus code (LOWER, BASIC, UPPER, ZERO)


def license_error(err: Exception, num_vars: int, num_constrs: int) -> LicenseError | None:
    """The allocopt error for a licensing ``GurobiError``, or None for any other error.

    Shared with the cvxpy backend, whose default solver may be Gurobi.
    """
    errno = getattr(err, "errno", None)
    if errno == _SIZE_LIMIT_EXCEEDED:
        return LicenseLimitError(
            f"the model has {num_vars} variables and {num_constrs} linear constraints, more than "
            f"Gurobi's size-limited license allows (about {SIZE_LIMIT} of each); use backend='highs', "
            "or backend='auto' to fall back to HiGHS automatically, or install a full Gurobi license")
    if errno == _NO_LICENSE or errno in _LICENSE_SERVER_ERRORS:
        return LicenseError(f"Gurobi has no usable license ({err}); install or renew one "
                            "(grbgetkey), or use backend='highs'")
    return None


@functools.lru_cache(maxsize=1)
def _license_problem() -> str | None:
    """The message of the licensing error an empty environment raises, or None (cached per process)."""
    import gurobipy as gp

    try:
        env = gp.Env(empty=True)
        env.setParam("OutputFlag", 0)
        env.start()
        env.dispose()
    except gp.GurobiError as err:
        error = license_error(err, 0, 0)
        return str(error) if error is not None else None
    return None


@dataclass
class _Handle:
    env: Any  # gurobipy.Env
    model: Any  # gurobipy.Model
    x: Any  # gurobipy.MVar of all columns
    main: Any  # gurobipy.MConstr: one row per original row with a finite bound, or None
    main_rows: np.ndarray  # original row index of each row of `main`
    extra: Any  # gurobipy.MConstr: the `>=` halves of ranged rows, or None
    ranged_rows: np.ndarray  # original row index of each row of `extra`

    @property
    def num_constrs(self) -> int:
        return self.main_rows.size + self.ranged_rows.size

    def dispose(self) -> None:
        self.model.dispose()
        self.env.dispose()

    def main_at_upper(self, model: CompiledModel) -> np.ndarray:
        """Whether each row of ``main`` is a ``<=`` row (nonbasic means at the upper bound)."""
        return np.isfinite(model.row_ub[self.main_rows]) & (model.row_lb[self.main_rows] != model.row_ub[self.main_rows])


class GurobiBackend(Backend):
    """Gurobi through gurobipy's matrix API (see the module docstring)."""
    name = "gurobi"
    required_modules = ("gurobipy",)
    install_hint = "pip install 'allocopt[gurobi]'"
    supports_warm_start = True

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """As the base class, and also a reason when Gurobi has no usable license (for
        example the size-limited license bundled with an old gurobipy wheel has expired)."""
        return super().unavailable_reason() or _license_problem()

    def build(self, model: CompiledModel, options: SolveOptions) -> _Handle:
        import gurobipy as gp

        with contextlib.ExitStack() as cleanup:
            try:
                env = gp.Env(empty=True)
                cleanup.callback(env.dispose)
                env.setParam("OutputFlag", int(options.verbose))
                env.start()
            except gp.GurobiError as err:
                raise license_error(err, model.num_cols, model.num_rows) or SolverError(
                    f"Gurobi could not start an environment: {err}") from err
            m = gp.Model("allocopt", env=env)
            cleanup.callback(m.dispose)
            handle = self._fill(m, env, model)
            self._set_params(m, options)
            cleanup.pop_all()  # built: from here on `run` disposes them
        return handle

    @staticmethod
    def _fill(m: Any, env: Any, model: CompiledModel) -> _Handle:
        lb, ub = model.row_lb, model.row_ub
        has_lb, has_ub = np.isfinite(lb), np.isfinite(ub)
        equal = has_lb & has_ub & (lb == ub)
        main_rows = np.flatnonzero(has_lb | has_ub)  # rows free on both sides are left out
        ranged_rows = np.flatnonzero(has_lb & has_ub & ~equal)
        x = m.addMVar(model.num_cols, lb=model.col_lb, ub=model.col_ub, obj=model.c,
                      vtype=np.where(model.integrality, "I", "C"))
        main = extra = None
        if main_rows.size:
            sense = np.where(equal, "=", np.where(has_ub, "<", ">"))[main_rows]
            rhs = np.where(has_ub, ub, lb)[main_rows]
            main = m.addMConstr(model.A[main_rows], x, sense, rhs)
        if ranged_rows.size:
            extra = m.addMConstr(model.A[ranged_rows], x, ">", lb[ranged_rows])
        return _Handle(env, m, x, main, main_rows, extra, ranged_rows)

    def set_basis(self, handle: _Handle, model: CompiledModel, basis: Basis, options: SolveOptions) -> None:
        handle.model.update()  # attributes set on columns still pending an update are dropped
        handle.x.VBasis = _VBASIS[basis.col_status]
        if handle.main is not None:
            status = basis.row_status[handle.main_rows]
            at_upper = handle.main_at_upper(model)
            handle.main.CBasis = np.where((status == BasisStatus.BASIC)
                                          | (at_upper & (status == BasisStatus.LOWER)), 0, -1)
        if handle.extra is not None:
            handle.extra.CBasis = np.where(basis.row_status[handle.ranged_rows] == BasisStatus.LOWER, -1, 0)

    @staticmethod
    def _set_params(m: Any, options: SolveOptions) -> None:
        import gurobipy as gp

        params: dict[str, Any] = {}
        if options.time_limit_s is not None:
            params["TimeLimit"] = float(options.time_limit_s)
        if options.mip_gap is not None:
            params["MIPGap"] = float(options.mip_gap)
        if options.threads is not None:
            params["Threads"] = int(options.threads)
        params.update(options.solver_options)
        for key, value in params.items():
            try:
                m.setParam(key, value)
            except gp.GurobiError as err:
                raise InvalidOptionError(
                    f"Gurobi rejected parameter {key}={value!r}: {err}; see "
                    "https://docs.gurobi.com/projects/optimizer/en/current/reference/parameters.html"
                ) from err

    def run(self, handle: _Handle, model: CompiledModel, options: SolveOptions) -> RawResult:
        import gurobipy as gp

        m = handle.model
        try:
            m.optimize()
            if m.Status == _INF_OR_UNBD:
                # Presolve's dual reductions cannot tell the two apart; without them Gurobi can.
                m.setParam("DualReductions", 0)
                m.optimize()
            return self._read(handle, model)
        except gp.GurobiError as err:
            raise license_error(err, model.num_cols, handle.num_constrs) or SolverError(
                f"Gurobi failed: {err}") from err
        finally:
            handle.dispose()

    @staticmethod
    def _read(handle: _Handle, model: CompiledModel) -> RawResult:
        from gurobipy import GRB

        m = handle.model
        code = int(m.Status)
        names = {getattr(GRB.Status, k): k for k in dir(GRB.Status) if not k.startswith("_")}
        result = RawResult(status=STATUS_MAP.get(code, Status.ERROR),
                           raw_status=f"{names.get(code, 'UNKNOWN')} ({code})")
        if code == _SUBOPTIMAL:
            result.detail = "Gurobi could not meet its optimality tolerances; the point is sub-optimal."
        if m.SolCount > 0:
            result.x = np.asarray(handle.x.X, dtype=np.float64)
            if model.is_mip:
                result.mip_gap = float(m.MIPGap)
        if not model.is_mip:
            result.simplex_iterations = int(m.IterCount)
        if code == GRB.OPTIMAL and not model.is_mip:
            basis = GurobiBackend._basis(handle, model)
            result.basis = lambda: basis
            duals = np.zeros(model.num_rows)
            if handle.main is not None:
                duals[handle.main_rows] = handle.main.Pi
            if handle.extra is not None:
                duals[handle.ranged_rows] += handle.extra.Pi
            result.row_duals = duals
        return result

    @staticmethod
    def _basis(handle: _Handle, model: CompiledModel) -> Basis:
        """Read the basis now: the handle is disposed after the solve."""
        vbasis = np.asarray(handle.x.VBasis)
        cols = np.select([vbasis == 0, vbasis == -2, vbasis == -3], [BasisStatus.BASIC, BasisStatus.UPPER,
                                                                      BasisStatus.ZERO], BasisStatus.LOWER)
        rows = np.full(model.num_rows, BasisStatus.BASIC, dtype=np.int8)
        if handle.main is not None:
            nonbasic = np.asarray(handle.main.CBasis) == -1
            rows[handle.main_rows[nonbasic]] = np.where(handle.main_at_upper(model)[nonbasic],
                                                        BasisStatus.UPPER, BasisStatus.LOWER)
        if handle.extra is not None:
            rows[handle.ranged_rows[np.asarray(handle.extra.CBasis) == -1]] = BasisStatus.LOWER
        return Basis(cols.astype(np.int8), rows)
