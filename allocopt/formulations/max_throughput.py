"""Maximum total throughput, optionally per unit cost and with deadlines
(Gavel's ``max_sum_throughput_perf`` and ``max_sum_throughput_normalized_by_cost_perf``).

.. math::

    \\max_X \\; \\sum_i \\sum_j T_{ij} X_{ij} / \\kappa_j
    \\quad \\text{s.t.} \\quad e_i = \\sum_j T_{ij} X_{ij} \\ge r_i / d_i \\;\\; (\\text{jobs with a deadline})

and the base constraints (with ``space_sharing=True``, pairs count too);
``kappa_j`` is the price of type ``j`` when ``normalize_by_cost=True`` (else 1), ``r_i`` the steps remaining and ``d_i``
the deadline (``Problem.slos``, seconds from now).

When the deadlines cannot all be met this is reported, never dropped: by
default an :class:`~allocopt.errors.InfeasibleError` names the jobs whose
deadline is out of reach. With ``best_effort=True`` the allocation first
minimizes the total relative shortfall ``sum_i u_i`` (``e_i >= (1 - u_i) r_i / d_i``),
then maximizes throughput at that shortfall; its status is ``infeasible`` and
``extras["deadline_met"]`` marks which jobs make their deadline.

With ``price_decomposition=True`` (no deadlines, no space sharing) the LP is
solved by pricing the GPU types (:mod:`allocopt.formulations.throughput_prices`):
cutting planes on the ``k``-dimensional dual, from the previous solve's
prices with a warm start, then a small LP over the jobs the prices leave
undecided, certified against the dual bound; the plain LP is solved when
certification fails. A plain solve leaves its capacity duals in the warm start
(``hints["prices"]``, objective per GPU), where a warm price decomposition
starts.

With ``gavel_program=True`` (``backend="cvxpy"``, no deadlines, no space
sharing) the LP is written as Gavel's cvxpy code writes it
(:mod:`allocopt.formulations.gavel_programs`), so ECOS stops at Gavel's point
of this many-optima LP to the last bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from allocopt.backends.cvxpy import CvxpyBackend
from allocopt.errors import InfeasibleError, InvalidOptionError
from allocopt.formulations.base import (AllocationModel, ModelSolver, Policy, PolicyResult, base_model,
                                       objective_unit)
from allocopt.formulations.gavel_programs import solve_gavel_program
from allocopt.formulations.job_types import max_throughput_by_job_type
from allocopt.formulations.throughput_prices import max_throughput_price_decomposition
from allocopt.problem import Problem
from allocopt.solution import Status

_SHORTFALL_TOL = 1e-7
# Throughputs of one problem may span 1e15: with HiGHS's default dual tolerance (1e-7 of the largest)
# a vertex 5e-5 below the optimum passed for optimal.
_TIGHT = {"dual_feasibility_tolerance": 1e-10}
# CBC's own name for it: at its default 1e-7 CBC left a job of 9e-4 steps/s idle beside jobs of
# 3e3 steps/s, 1.3e-4 of the optimum (its reduced cost, in units of the largest, is 3e-7)
_TIGHT_CBC = {"options": ["dualTolerance 1e-10"]}


def _solver_defaults(solver: ModelSolver) -> dict:
    """The tighter tolerance wherever HiGHS solves the LP (highs, scipy, cvxpy's default HIGHS), and CBC's."""
    defaults = {"highs": _TIGHT, "scipy": _TIGHT, "pulp": _TIGHT_CBC}
    if str(solver.options.solver_options.get("solver", "HIGHS")).upper() == "HIGHS":
        defaults["cvxpy"] = _TIGHT
    return defaults


class MaxThroughput(Policy):
    """Gavel's ``max_sum_throughput_perf`` (see the module docstring)."""
    name = "max_throughput"
    options = {"normalize_by_cost": False, "space_sharing": False, "aggregate_job_types": False,
               "price_decomposition": False, "gavel_program": False}

    def allocate(self, problem: Problem, solver: ModelSolver, *, normalize_by_cost: bool = False,
                 space_sharing: bool = False, aggregate_job_types: bool = False,
                 price_decomposition: bool = False, gavel_program: bool = False) -> PolicyResult:
        if gavel_program:
            if space_sharing or aggregate_job_types or price_decomposition:
                raise InvalidOptionError("gavel_program=True writes Gavel's LP over single jobs: it cannot be "
                                         "combined with space_sharing, aggregate_job_types or price_decomposition")
            return self._gavel_program(problem, solver, normalize_by_cost)
        if price_decomposition and (space_sharing or aggregate_job_types):
            raise InvalidOptionError("price_decomposition=True solves the LP without space sharing over single "
                                     "jobs: it cannot be combined with space_sharing or aggregate_job_types")
        if aggregate_job_types:
            return max_throughput_by_job_type(problem, solver, normalize_by_cost=normalize_by_cost,
                                              space_sharing=space_sharing)
        if normalize_by_cost and problem.costs is None:
            raise InvalidOptionError("normalize_by_cost=True needs Problem(costs=...) with a price per GPU type")
        has_deadline = (np.isfinite(problem.slos) if problem.slos is not None
                        else np.zeros(problem.num_jobs, dtype=bool))
        required = np.zeros(problem.num_jobs)
        if has_deadline.any():
            required[has_deadline] = (problem.num_steps_remaining[has_deadline]
                                      / problem.slos[has_deadline])

        # the objective in units of its largest coefficient when that is far from 1: solver tolerances
        # relative to it (objective_unit)
        rates = problem.throughputs / problem.costs if normalize_by_cost else problem.throughputs
        unit = objective_unit(float(rates.max()))
        fallback: dict[str, Any] = {}
        if price_decomposition and has_deadline.any():
            raise InvalidOptionError("price_decomposition=True prices the GPU types of the LP without deadlines; "
                                     "this problem has SLOs: leave price_decomposition unset")
        if price_decomposition:
            hints = solver.warm_start.hints if solver.warm_start is not None else {}
            warm = np.asarray(hints["prices"]) / unit if len(hints.get("prices", ())) == problem.cluster.num_gpu_types \
                else None
            result, fallback = max_throughput_price_decomposition(rates * problem.runnable / unit,
                                                                 problem.scale_factors, problem.capacity, solver,
                                                                 prices=warm)
            solver.hints["prices"] = tuple((np.asarray(solver.hints["prices"]) * unit).tolist())
            if result is not None:
                result.objective *= unit
                result.extras["deadline_met"] = np.ones(problem.num_jobs, dtype=bool)
                return result

        def throughput_model(shortfall: np.ndarray | None) -> AllocationModel:
            base = base_model(problem, name=self.name, space_sharing=space_sharing)
            if has_deadline.any():
                floor = required[has_deadline]
                if shortfall is not None:
                    floor = floor * (1.0 - shortfall) * (1.0 - _SHORTFALL_TOL)
                base.model.add_constraint("deadline", base.throughput[has_deadline] >= floor)
            if normalize_by_cost:
                steps_per_cost = (base.X * (problem.throughputs / problem.costs)).sum()
                if base.P is not None:
                    pair_steps = problem.pair_throughput_array.sum(axis=2)
                    steps_per_cost = steps_per_cost + (base.P * (pair_steps / problem.costs)).sum()
                base.model.maximize(steps_per_cost / unit)
            else:
                base.model.maximize(base.throughput.sum() / unit)
            return base

        base = throughput_model(None)
        solution = solver.solve_raw(base.model, defaults=_solver_defaults(solver))
        deadline_met = np.ones(problem.num_jobs, dtype=bool)
        if solution.status in (Status.INFEASIBLE, Status.INFEASIBLE_OR_UNBOUNDED) and has_deadline.any():
            shortfall = self._min_shortfall(problem, solver, has_deadline, required, space_sharing)
            missed = np.flatnonzero(has_deadline)[shortfall > _SHORTFALL_TOL]
            deadline_met[missed] = False
            names = ", ".join(f"{problem.job_ids[i]!r} (needs {required[i]:.4g} steps/s)" for i in missed[:10])
            more = f" and {missed.size - 10} more" if missed.size > 10 else ""
            text = (f"the deadlines of {missed.size} job(s) cannot be met: {names}{more}")
            if not solver.best_effort:
                raise InfeasibleError(f"max_throughput: {text}. Relax their slos, add GPUs, or pass "
                                      "best_effort=True to minimize the shortfall instead.",
                                      status=Status.INFEASIBLE, solution=solution)
            base = throughput_model(shortfall)
            solution = solver.solve(base.model, "max_throughput (deadlines relaxed)",
                                    defaults=_solver_defaults(solver))
            X, P = base.matrices(solution)
            return PolicyResult(X, solution.objective * unit, Status.INFEASIBLE, P,
                                f"{text}; returned the allocation that minimizes the total relative "
                                "shortfall, then maximizes throughput.",
                                {"deadline_met": deadline_met})
        solution = solver.check(solution, "max_throughput")
        if not space_sharing and "capacity" in solution.duals:
            # objective per GPU of each type: the prices a warm-started price decomposition starts from
            solver.hints["prices"] = tuple((np.maximum(solution.duals["capacity"], 0.0) * unit).tolist())
        X, P = base.matrices(solution)
        extras: dict[str, Any] = {"deadline_met": deadline_met}
        if fallback:
            extras["price_decomposition"] = fallback
        return PolicyResult(X, solution.objective * unit, solution.status, P, solution.message, extras)

    @staticmethod
    def _min_shortfall(problem: Problem, solver: ModelSolver, has_deadline: np.ndarray,
                       required: np.ndarray, space_sharing: bool) -> np.ndarray:
        """Smallest total relative shortfall of the deadline jobs, per job."""
        base = base_model(problem, name="deadline_shortfall", space_sharing=space_sharing)
        jobs = np.flatnonzero(has_deadline)
        u = base.model.add_variable("shortfall", jobs.size, lb=0.0, ub=1.0)
        base.model.add_constraint("deadline", base.throughput[jobs] + u * required[jobs] >= required[jobs])
        base.model.minimize(u.sum())
        return solver.solve(base.model, "max_throughput deadline shortfall").values["shortfall"]

    def _gavel_program(self, problem: Problem, solver: ModelSolver, normalize_by_cost: bool) -> PolicyResult:
        """``gavel_program=True``: the LP as Gavel's cvxpy code writes it (module docstring)."""
        if problem.slos is not None and np.isfinite(problem.slos).any():
            raise InvalidOptionError("gavel_program=True writes Gavel's LP without deadlines; this problem has "
                                     "SLOs: leave gavel_program unset")
        if normalize_by_cost and problem.costs is None:
            raise InvalidOptionError("normalize_by_cost=True needs Problem(costs=...) with a price per GPU type")
        CvxpyBackend.check_installed()
        import cvxpy as cp

        def objective(x: Any, columns: np.ndarray) -> Any:
            costs = np.ones((1, columns.size))
            if normalize_by_cost:
                costs[0, :] = problem.costs[columns]
            return cp.Maximize(cp.sum(cp.sum(cp.multiply(problem.throughputs[:, columns] / costs, x), axis=1)))

        X, status, message = solve_gavel_program(problem, solver, np.arange(problem.num_jobs), problem.throughputs,
                                                 objective, f"{self.name} (gavel_program)")
        rates = problem.throughputs / problem.costs if normalize_by_cost else problem.throughputs
        return PolicyResult(X, float((rates * X).sum()), status, None, message)
