"""What every policy shares: the policy interface, the solver handle policies
drive, and the base allocation constraints.

Base model (``X[i, j]`` = time fraction of job ``i`` on GPU type ``j``)::

    0 <= X[i, j] <= 1, and X[i, j] = 0 where job i cannot run on type j
    sum_j X[i, j] <= 1                   (constraint block "time")
    sum_i s_i X[i, j] <= c_j             (constraint block "capacity")
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from allocopt.backends import SolveOptions, solve_model
from allocopt.errors import (InfeasibleError, NotOptimalError, SolverError, TimeLimitError,
                             UnboundedError)
from allocopt.model import Model, Variable
from allocopt.problem import Problem
from allocopt.solution import Solution, Status


@dataclass
class PolicyResult:
    """What a policy returns to :func:`allocopt.solve`."""

    matrix: np.ndarray
    objective: float | None
    status: Status = Status.OPTIMAL
    message: str = "Optimal solution found."
    extras: dict[str, Any] = field(default_factory=dict)


_ERRORS = {
    Status.INFEASIBLE: InfeasibleError,
    Status.INFEASIBLE_OR_UNBOUNDED: InfeasibleError,
    Status.UNBOUNDED: UnboundedError,
    Status.TIME_LIMIT: TimeLimitError,
    Status.ERROR: SolverError,
}


class ModelSolver:
    """Compiles and solves models for a policy with one backend and one set of
    options, adding up the time spent; policies that iterate call it repeatedly."""

    def __init__(self, backend: str, options: SolveOptions, *, best_effort: bool = False):
        self.backend = backend
        self.options = options
        self.best_effort = best_effort
        self.model_build_s = 0.0
        self.solver_build_s = 0.0
        self.solve_s = 0.0
        self.num_solves = 0
        self.backend_used: str | None = None

    def solve_raw(self, model: Model) -> Solution:
        """Solve and return the Solution whatever its status."""
        t0 = time.perf_counter()
        compiled = model.compile()
        self.model_build_s += time.perf_counter() - t0
        solution = solve_model(compiled, self.backend, self.options)
        self.solver_build_s += solution.build_seconds
        self.solve_s += solution.solve_seconds
        self.num_solves += 1
        self.backend_used = solution.backend
        return solution

    def solve(self, model: Model, what: str = "the model") -> Solution:
        """Solve; raise a typed error unless the result is optimal, or
        ``best_effort`` was asked for and the solver returned a point."""
        return self.check(self.solve_raw(model), what)

    def check(self, solution: Solution, what: str = "the model") -> Solution:
        """Return ``solution`` if usable (see :meth:`solve`), else raise its typed error."""
        if solution.status is Status.OPTIMAL or (self.best_effort and solution.has_values):
            return solution
        error = _ERRORS.get(solution.status, NotOptimalError)
        hint = {
            Status.TIME_LIMIT: " Raise time_limit_s, or pass best_effort=True to accept the incumbent.",
            Status.ERROR: " Try another backend.",
        }.get(solution.status, "")
        raise error(f"{what}: {solution.message}{hint}", status=solution.status, solution=solution)


class Policy(ABC):
    """A scheduling policy: turns a Problem into time fractions.

    Subclasses set ``name``, ``options`` (option name to default) and
    implement :meth:`allocate`.
    """

    name: ClassVar[str]
    options: ClassVar[dict[str, Any]] = {}
    solves_models: ClassVar[bool] = True

    @abstractmethod
    def allocate(self, problem: Problem, solver: ModelSolver, **options: Any) -> PolicyResult:
        """Compute the allocation of ``problem`` (options already validated)."""


def base_model(problem: Problem, *, name: str) -> tuple[Model, Variable]:
    """The model with ``X`` and the base constraints (see the module docstring)."""
    model = Model(name)
    X = model.add_variable("X", (problem.num_jobs, problem.cluster.num_gpu_types),
                           lb=0.0, ub=problem.runnable.astype(np.float64))
    model.add_constraint("time", X.sum(axis=1) <= 1.0)
    scale = problem.scale_factors.astype(np.float64)
    model.add_constraint("capacity", (X * scale[:, None]).sum(axis=0) <= problem.capacity)
    return model, X


def clean_matrix(values: np.ndarray) -> np.ndarray:
    """Clip solver round-off so fractions lie in [0, 1]."""
    return np.clip(values, 0.0, 1.0) + 0.0  # + 0.0 turns -0.0 into 0.0
