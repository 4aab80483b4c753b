"""Any LP/MILP solver cvxpy drives, through cvxpy's public solving-chain API.

``build`` states the model as three sparse blocks (``A_eq x == b``,
``A_ub x <= ub``, ``A_lb x >= lb``; a ranged row sits in the last two) and
compiles it with ``Problem.get_problem_data``; ``run`` calls
``SolvingChain.solve_via_data`` and ``Problem.unpack_results``. The cvxpy
solver is ``solver_options["solver"]`` (default: HIGHS when cvxpy has it, else
cvxpy's own choice); the
other keys go to that solver verbatim. https://www.cvxpy.org/

cvxpy's ``dual_value`` is the Lagrange multiplier of the constraint as
written (``>= 0`` for inequalities), so ``d objective / d rhs`` is
``-dual_value`` for ``==`` and ``<=`` rows and ``+dual_value`` for ``>=`` rows.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from allocopt.backends.base import Backend, RawResult, SolveOptions
from allocopt.backends.gurobi import SIZE_LIMIT, license_error
from allocopt.errors import InvalidOptionError
from allocopt.model import CompiledModel
from allocopt.solution import STATUS_MESSAGES, Status

STATUS_MAP = {  # cvxpy.settings status strings
    "optimal": Status.OPTIMAL,
    "optimal_inaccurate": Status.OPTIMAL,
    "infeasible": Status.INFEASIBLE,
    "infeasible_inaccurate": Status.INFEASIBLE,
    "unbounded": Status.UNBOUNDED,
    "unbounded_inaccurate": Status.UNBOUNDED,
    "infeasible_or_unbounded": Status.INFEASIBLE_OR_UNBOUNDED,
    "user_limit": Status.TIME_LIMIT,
    "solver_error": Status.ERROR,
}
# cvxpy's own default prefers a commercial solver when one is installed, even under a
# size-limited license; HiGHS solves every LP and MILP we build.
DEFAULT_SOLVER = "HIGHS"
# allocopt's generic options under each cvxpy solver's own keyword names.
OPTION_NAMES = {
    "HIGHS": {"time_limit_s": "time_limit", "mip_gap": "mip_rel_gap", "threads": "threads"},
    "GUROBI": {"time_limit_s": "TimeLimit", "mip_gap": "MIPGap", "threads": "Threads"},
    "CLARABEL": {"time_limit_s": "time_limit", "threads": "max_threads"},
    "SCIPY": {"time_limit_s": "time_limit", "mip_gap": "mip_rel_gap"},  # inside scipy_options
    "SCS": {"time_limit_s": "time_limit_secs"},
}


@dataclass
class _Handle:
    problem: Any  # cvxpy.Problem
    x: Any  # cvxpy.Variable of all columns
    # (constraint, its original rows, d objective / d rhs per unit of dual_value)
    blocks: list[tuple[Any, np.ndarray, float]]
    chain: Any  # cvxpy SolvingChain, ending in the chosen solver
    data: dict[str, Any]
    inverse_data: Any
    solver: str  # the chosen cvxpy solver's name
    solver_opts: dict[str, Any]


def require_solver(name: str, hint: str = "") -> None:
    """InvalidOptionError unless cvxpy has the solver ``name`` installed (``hint``: how to install it)."""
    import cvxpy as cp

    if name not in cp.installed_solvers():
        raise InvalidOptionError(f"cvxpy solver {name!r} is not installed{hint}; installed: "
                                 f"{', '.join(cp.installed_solvers())}")


@contextlib.contextmanager
def _inaccurate_unwarned():
    """cvxpy's UserWarning for an inaccurate solution silenced: the status (``*_inaccurate``) and the
    message say it, and a library call writes nothing to stderr."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Solution may be inaccurate", category=UserWarning)
        yield


def solve_program(program: Any, name: str, verbose: bool, solver_opts: dict[str, Any]) -> tuple[str, Status, str]:
    """Solve a cvxpy ``program`` written outside a :class:`CompiledModel` (conic programs, the programs
    of other systems' code) with solver ``name``: cvxpy's status (``solver_error: ...`` when the solver
    raised), allocopt's :class:`Status` and the message for the :class:`Solution`."""
    import cvxpy as cp

    try:
        with _inaccurate_unwarned():
            program.solve(solver=name, verbose=verbose, **solver_opts)
        native = program.status
    except cp.error.SolverError as err:
        native = f"solver_error: {err}"
    status = STATUS_MAP.get(native, Status.ERROR)
    detail = f" {name} did not reach its accuracy tolerances." if native.endswith("_inaccurate") else ""
    return native, status, f"{STATUS_MESSAGES[status]} (cvxpy: {native} ({name})){detail}"


class CvxpyBackend(Backend):
    """cvxpy and the solver it picks (see the module docstring)."""
    name = "cvxpy"
    required_modules = ("cvxpy",)
    install_hint = "pip install 'allocopt[cvxpy]'"

    def build(self, model: CompiledModel, options: SolveOptions) -> _Handle:
        import cvxpy as cp

        solver_opts = dict(options.solver_options)
        solver = solver_opts.pop("solver", DEFAULT_SOLVER if DEFAULT_SOLVER in cp.installed_solvers() else None)
        if solver is not None:
            require_solver(solver)
        integer = np.flatnonzero(model.integrality)
        bound_rows = []
        try:
            x = cp.Variable(model.num_cols, bounds=[model.col_lb, model.col_ub],
                            integer=(integer,) if integer.size else False)
        except ValueError:  # cvxpy < 1.7 takes no bounds on an integer variable: bound rows instead
            x = cp.Variable(model.num_cols, integer=(integer,))
            has_lb, has_ub = np.isfinite(model.col_lb), np.isfinite(model.col_ub)
            bound_rows = ([x[has_lb] >= model.col_lb[has_lb]] if has_lb.any() else []) + \
                ([x[has_ub] <= model.col_ub[has_ub]] if has_ub.any() else [])
        lb, ub = model.row_lb, model.row_ub
        eq_rows, ub_rows, lb_rows = model.row_groups()
        blocks = []
        if eq_rows.size:
            blocks.append((model.A[eq_rows] @ x == ub[eq_rows], eq_rows, -1.0))
        if ub_rows.size:
            blocks.append((model.A[ub_rows] @ x <= ub[ub_rows], ub_rows, -1.0))
        if lb_rows.size:
            blocks.append((model.A[lb_rows] @ x >= lb[lb_rows], lb_rows, 1.0))
        problem = cp.Problem(cp.Minimize(model.c @ x), [con for con, _, _ in blocks] + bound_rows)
        try:
            data, chain, inverse_data = problem.get_problem_data(solver=solver, solver_opts=dict(solver_opts))
        except cp.error.SolverError as err:
            which = f"solver {solver}" if solver else "any installed solver"
            raise InvalidOptionError(f"cvxpy cannot solve this model with {which}: {err}") from err
        name = chain.solver.name()
        return _Handle(problem, x, blocks, chain, data, inverse_data, name,
                       self.solver_options_for(name, options, solver_opts))

    @staticmethod
    def solver_options_for(solver: str, options: SolveOptions, solver_opts: dict[str, Any]) -> dict[str, Any]:
        """Keyword arguments for cvxpy solver ``solver``: the generic options under its own
        names, plus ``solver_opts`` verbatim."""
        names = OPTION_NAMES.get(solver, {})
        mapped: dict[str, Any] = {}
        for option, value in (("time_limit_s", options.time_limit_s), ("mip_gap", options.mip_gap),
                              ("threads", options.threads)):
            if value is None:
                continue
            if option not in names:
                supported = [s for s, n in OPTION_NAMES.items() if option in n]
                raise InvalidOptionError(
                    f"option {option} cannot be passed to cvxpy solver {solver}; leave it unset, "
                    f"set {solver}'s own option in solver_options, or choose a solver that takes it "
                    f"with solver_options={{'solver': ...}} (one of {', '.join(supported)})")
            mapped[names[option]] = value
        if solver == "SCIPY":  # cvxpy's SCIPY interface wants its options nested
            solver_opts["scipy_options"] = {**mapped, **solver_opts.get("scipy_options", {})}
            return solver_opts
        if solver == "GUROBI":
            solver_opts.setdefault("reoptimize", True)  # resolve INF_OR_UNBD to a definite status
        if solver == "HIGHS" and not options.verbose:
            solver_opts.setdefault("output_flag", False)  # HiGHS logs unless told otherwise
        return {**mapped, **solver_opts}

    def run(self, handle: _Handle, model: CompiledModel, options: SolveOptions) -> RawResult:
        import cvxpy as cp

        guard = contextlib.nullcontext()
        if handle.solver == "HIGHS":
            from allocopt.backends.highs import highspy_guard
            guard = highspy_guard(int(handle.solver_opts.get("threads", 0)), options.verbose)
        try:
            with guard:
                solution = handle.chain.solve_via_data(handle.problem, handle.data, warm_start=False,
                                                       verbose=options.verbose,
                                                       solver_opts=dict(handle.solver_opts))
            with _inaccurate_unwarned():
                handle.problem.unpack_results(solution, handle.chain, handle.inverse_data)
        except cp.error.SolverError as err:
            detail = str(err)
            if handle.solver == "GUROBI":  # cvxpy swallows Gurobi's errors, the license's size limit too
                detail += (f" A size-limited Gurobi license takes about {SIZE_LIMIT} variables and "
                           "constraints; choose another solver with solver_options={'solver': 'HIGHS'}.")
            return RawResult(Status.ERROR, raw_status=f"solver_error ({handle.solver})", detail=detail)
        except Exception as err:
            self._reraise(err, handle, model, options)
            raise
        native = handle.problem.status
        result = RawResult(status=STATUS_MAP.get(native, Status.ERROR),
                           raw_status=f"{native} ({handle.solver})")
        if native.endswith("_inaccurate"):
            result.detail = f"{handle.solver} did not reach its accuracy tolerances."
        if handle.x.value is not None:
            result.x = np.asarray(handle.x.value, dtype=np.float64).reshape(-1)
        if result.status is Status.OPTIMAL and not model.is_mip:
            duals = np.zeros(model.num_rows)
            for con, rows, sign in handle.blocks:
                duals[rows] += sign * np.asarray(con.dual_value, dtype=np.float64).reshape(-1)
            result.row_duals = duals
        return result

    @staticmethod
    def _reraise(err: Exception, handle: _Handle, model: CompiledModel, options: SolveOptions) -> None:
        """Raise the allocopt error for a solver's exception, if there is one."""
        if handle.solver == "GUROBI":
            error = license_error(err, model.num_cols, model.num_rows)
            if error is not None:
                raise type(error)(f"{error}; with backend='cvxpy', choose another solver with "
                                  "solver_options={'solver': 'HIGHS'}") from err
        verbatim = sorted(set(options.solver_options) - {"solver"})
        if verbatim:
            raise InvalidOptionError(
                f"cvxpy solver {handle.solver} failed with solver_options {verbatim} ({err}); "
                f"check their names and values against {handle.solver}'s documentation") from err
