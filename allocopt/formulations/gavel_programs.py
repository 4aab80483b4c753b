"""Gavel's cvxpy programs, written as Gavel's policy code writes them.

Where several jobs are entitled to equal shares, Gavel's round mechanism
orders them by the solver's digits beyond 1e-8, so reproducing a Gavel run
needs Gavel's solver point to the last bit. cvxpy hands a solver the same
matrices only for the same expression tree: a (jobs x types) matrix variable
over the jobs in job order and the GPU types with GPUs in name order (Gavel's
``cluster_spec``), Gavel's objective, and its base constraints in its order
(``X >= 0``; the GPUs of each type; each job's time). :func:`solve_gavel_program`
builds those constraints around an objective, solves, and maps the answer back
to the problem's rows and types. Nothing keeps time off a type a job cannot use
(zero planned throughput) or that has fewer GPUs than its scale factor, as in
Gavel; such time is set to 0 afterwards (Gavel's mechanism never runs a job
there either). The answer is clipped to [0, 1], as Gavel's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from allocopt.backends.cvxpy import CvxpyBackend, require_solver, solve_program
from allocopt.errors import InvalidOptionError
from allocopt.formulations.base import ModelSolver
from allocopt.formulations.shares import type_order
from allocopt.problem import Problem
from allocopt.solution import Solution, Status


def gavel_columns(problem: Problem) -> np.ndarray:
    """The GPU types of Gavel's program: those with GPUs, in name order (column indices)."""
    columns = type_order(problem)
    return columns[problem.capacity[columns] > 0]


def require_cvxpy(solver: ModelSolver, what: str) -> Any:
    """The ``cvxpy`` module, or a typed error unless ``solver`` is the installed cvxpy backend."""
    if solver.backend != "cvxpy":
        raise InvalidOptionError(f"{what} writes Gavel's cvxpy program and needs backend='cvxpy', "
                                 f"got backend={solver.backend!r}")
    CvxpyBackend.check_installed()
    import cvxpy

    return cvxpy


def gavel_program(problem: Problem, solver: ModelSolver, rows: np.ndarray, planned: np.ndarray,
                  objective: Callable[[Any, np.ndarray], Any], what: str,
                  constraints: Callable[[Any, np.ndarray], list] | None = None) -> tuple[np.ndarray, Solution, str]:
    """Solve ``objective(x, columns)`` (a cvxpy ``Minimize``/``Maximize`` over the matrix variable ``x`` of
    ``rows`` x :func:`gavel_columns`) under Gavel's base constraints, then ``constraints(x, columns)``,
    with ``backend="cvxpy"``'s solver (``solver_options["solver"]``; default ECOS, Gavel's, when cvxpy has
    it, else CLARABEL), whatever the outcome.

    Returns the time fractions, shape (n_jobs, n_gpu_types) (0 outside ``rows``, where ``planned``
    throughputs are 0, and where a job's scale factor exceeds the type's GPUs), the recorded
    :class:`Solution` and cvxpy's own status (``"optimal"``, ``"infeasible"``, ...).
    """
    cp = require_cvxpy(solver, what)
    options = dict(solver.options.solver_options)
    name = options.pop("solver", "ECOS" if "ECOS" in cp.installed_solvers() else "CLARABEL")
    require_solver(name)
    t0 = time.perf_counter()
    columns = gavel_columns(problem)
    x = cp.Variable((rows.size, columns.size))
    scale = np.repeat(problem.scale_factors[rows].astype(np.float64)[:, None], columns.size, axis=1)
    program = cp.Problem(objective(x, columns),
                         [x >= 0, cp.sum(cp.multiply(scale, x), axis=0) <= problem.capacity[columns],
                          cp.sum(x, axis=1) <= 1] + (constraints(x, columns) if constraints else []))
    solver_opts = CvxpyBackend.solver_options_for(name, solver.options, options)
    t1 = time.perf_counter()
    native, status, message = solve_program(program, name, solver.options.verbose, solver_opts)
    t2 = time.perf_counter()
    X = np.zeros(problem.throughputs.shape)
    if x.value is not None:
        X[np.ix_(rows, columns)] = np.clip(x.value, 0.0, 1.0)
    X[(planned <= 0) | (problem.scale_factors[:, None] > problem.capacity[None, :])] = 0.0
    solution = solver.record(Solution(
        status=status, message=message, objective=None if program.value is None else float(program.value),
        x=None if x.value is None else X.ravel(), backend="cvxpy", raw_status=f"{native} ({name})",
        build_seconds=t1 - t0, solve_seconds=t2 - t1), model_build_s=t1 - t0)
    return X, solution, native


def solve_gavel_program(problem: Problem, solver: ModelSolver, rows: np.ndarray, planned: np.ndarray,
                        objective: Callable[[Any, np.ndarray], Any], what: str) -> tuple[np.ndarray, Status, str]:
    """:func:`gavel_program`, raising the solver's typed error unless it is optimal (or ``best_effort``
    with a point); returns the time fractions, the status and the message."""
    X, solution, _ = gavel_program(problem, solver, rows, planned, objective, what)
    solver.check(solution, what)
    return X, solution.status, solution.message


__all__ = ["gavel_columns", "gavel_program", "require_cvxpy", "solve_gavel_program"]
