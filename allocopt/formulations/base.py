"""What every policy shares: the policy interface, the solver handle policies
drive, and the base allocation constraints.

Base model (``X[i, j]`` = time fraction of job ``i`` on GPU type ``j``)::

    X[i, j] >= 0, and X[i, j] = 0 where job i cannot run on type j
    sum_j X[i, j] <= 1                   (constraint block "time")
    sum_i s_i X[i, j] <= c_j             (constraint block "capacity")
    e_i = sum_j T[i, j] X[i, j]          (effective throughput, steps/s)

Policies are written over ``e_i`` and the job's total time, so the same
policy also runs with space sharing, where pairs of jobs get variables too.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from allocopt.allocation import Allocation, Timings
from allocopt.backends import SolveOptions, solve_model
from allocopt.errors import (InfeasibleError, InvalidOptionError, NotOptimalError, SolverError,
                             TimeLimitError, UnboundedError)
from allocopt.model import CompiledModel, LinExpr, Model, Variable
from allocopt.problem import Problem
from allocopt.solution import Solution, Status
from allocopt.warm_start import WarmStart, model_key


@dataclass
class PolicyResult:
    """What a policy returns to :func:`allocopt.solve`."""

    matrix: np.ndarray
    objective: float | None
    status: Status = Status.OPTIMAL
    pair_matrix: np.ndarray | None = None
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
    options, adding up the time spent; policies that iterate call it repeatedly.

    With ``warm_start`` (and the problem's ``job_ids``), each model starts from
    the basis of the same-named model of an earlier solve; :meth:`warm_start_out`
    collects this solver's final solves for the next one.
    """

    def __init__(self, backend: str, options: SolveOptions, *, best_effort: bool = False,
                 warm_start: WarmStart | None = None, job_ids: tuple[Hashable, ...] = ()):
        self.backend = backend
        self.options = options
        self.best_effort = best_effort
        self.warm_start = warm_start
        self.job_ids = job_ids
        self._solves: dict[str, tuple[Any, Any, Solution]] = {}
        self.hints: dict[str, float] = {}  # what a policy passes to its next solve (WarmStart.hints)
        self.reused_warm_start = False  # the answer is the warm start's allocation (no LP): pass it on
        self.model_build_s = 0.0
        self.solver_build_s = 0.0
        self.solve_s = 0.0
        self.num_solves = 0
        self.backend_used: str | None = None

    def solve_raw(self, model: Model | CompiledModel, *, defaults: Mapping[str, Mapping[str, Any]] | None = None,
                  start_from: tuple[WarmStart | None, Sequence[Hashable]] | None = None) -> Solution:
        """Solve ``model`` (or its compiled arrays) and return the Solution whatever its status;
        ``defaults`` are per-backend solver options the caller's ``solver_options`` override;
        ``start_from`` (a warm start, or None for a cold solve, and the ids of the
        model's leading axis) replaces the solver's own warm start for this solve."""
        t0 = time.perf_counter()
        compiled = model if isinstance(model, CompiledModel) else model.compile()
        warm, ids = start_from or (self.warm_start, self.job_ids)
        start = warm.basis_for(compiled, ids) if warm is not None else None
        self.model_build_s += time.perf_counter() - t0
        solution = self.record(solve_model(compiled, self.backend, self.options, defaults, warm_start=start))
        if solution.basis_reader is not None:
            self._solves[model_key(compiled)] = (compiled.variables, compiled.constraints, solution)
        return solution

    def warm_start_out(self, matrix: np.ndarray | None = None) -> WarmStart | None:
        """The last optimal LP solve of each model, for a later solve to start from, with ``matrix``
        (the allocation's time fractions) as ``previous``; when this solver solved no LP, the warm
        start it was given, carried on (its bases are keyed by its own jobs)."""
        previous = None if matrix is None else (self.job_ids, matrix)
        if self._solves:
            return WarmStart(self.job_ids, dict(self._solves), dict(self.hints), previous)
        if self.warm_start is not None and self.reused_warm_start:  # its allocation, certified without an LP
            return WarmStart(self.warm_start.job_ids, self.warm_start.solves, dict(self.hints), previous)
        return None

    def record(self, solution: Solution, *, model_build_s: float = 0.0) -> Solution:
        """Add a solve's times to the totals (policies that call a solver directly use this)."""
        self.model_build_s += model_build_s
        self.solver_build_s += solution.build_seconds
        self.solve_s += solution.solve_seconds
        self.num_solves += 1
        self.backend_used = solution.backend
        return solution

    def solve(self, model: Model | CompiledModel, what: str = "the model", *,
              defaults: Mapping[str, Mapping[str, Any]] | None = None,
              start_from: tuple[WarmStart | None, Sequence[Hashable]] | None = None) -> Solution:
        """Solve; raise a typed error unless the result is optimal, or
        ``best_effort`` was asked for and the solver returned a point."""
        return self.check(self.solve_raw(model, defaults=defaults, start_from=start_from), what)

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
    problem_type: ClassVar[type] = Problem
    # whether its LPs start from an earlier allocation's bases (allocopt.solve(warm_start=...))
    warm_starts: ClassVar[bool] = True

    @abstractmethod
    def allocate(self, problem: Any, solver: ModelSolver, **options: Any) -> PolicyResult:
        """Compute the allocation of ``problem`` (options already validated)."""

    def to_allocation(self, problem: Any, result: PolicyResult, *, backend: str | None,
                      timings: Timings) -> Any:
        """Wrap a result for the caller; policies over other problem types return their own type."""
        return Allocation(problem=problem, matrix=result.matrix, policy=self.name, backend=backend,
                          status=result.status, objective=result.objective, message=result.message,
                          timings=timings, pair_matrix=result.pair_matrix, extras=result.extras)


@dataclass
class AllocationModel:
    """The base model of a problem and the expressions policies are written in.

    Attributes
    ----------
    model : Model
    X : Variable of shape (n_jobs, n_gpu_types)
        Time fraction of each job alone on each type.
    P : Variable of shape (n_pairs, n_gpu_types) or None
        Time fraction of each pair sharing GPUs (space sharing only).
    throughput : LinExpr of shape (n_jobs,)
        Effective throughput ``e_i`` in steps/s (alone plus in pairs).
    time : LinExpr of shape (n_jobs,)
        Total time fraction of each job (alone plus in pairs).
    """

    model: Model
    X: Variable
    P: Variable | None
    throughput: LinExpr
    time: LinExpr

    def matrices(self, solution: Solution) -> tuple[np.ndarray, np.ndarray | None]:
        """Cleaned ``X`` and ``P`` values of a solution."""
        pairs = clean_matrix(solution.values["P"]) if self.P is not None else None
        return clean_matrix(solution.values["X"]), pairs


def base_model(problem: Problem, *, name: str, space_sharing: bool = False,
               multiplicity: np.ndarray | None = None) -> AllocationModel:
    """The model with ``X`` (and pair variables ``P`` under space sharing) and
    the base constraints; with ``multiplicity`` (n_jobs,), row ``i`` stands for
    that many identical jobs of the same allocation (its GPUs count that often).

    Under space sharing every pair ``(a, b)`` of ``problem.pairs`` gets a
    variable per GPU type; a job's time over all combinations containing it is
    at most 1 (block "time"), and a pair occupies its common scale factor's
    GPUs once (block "capacity"). Pairs that cannot share a type (both
    throughputs 0) have an upper bound of 0 there.
    """
    model = Model(name)
    n, k = problem.num_jobs, problem.cluster.num_gpu_types
    # no upper bound of 1: the time rows imply it, and the redundant bounds slow HiGHS down
    # (interior point 42 s -> 26 s on 512 jobs with all 130k pairs)
    X = model.add_variable("X", (n, k), lb=0.0, ub=np.where(problem.runnable, np.inf, 0.0))
    scale = problem.scale_factors.astype(np.float64)
    time = X.sum(axis=1)
    gpus = (X * (scale if multiplicity is None else scale * multiplicity)[:, None]).sum(axis=0)
    throughput = (X * problem.throughputs).sum(axis=1)
    P = None
    if space_sharing:
        if problem.pairs is None:
            raise InvalidOptionError("space_sharing=True needs Problem(pair_throughputs=...): the throughput "
                                     "of each pair of jobs that may share GPUs")
        pairs, PT = problem.pairs, problem.pair_throughput_array
        m = pairs.shape[0]
        pair_scale = scale[pairs[:, 0]]
        usable = (PT.sum(axis=2) > 0) & (pair_scale[:, None] <= problem.capacity[None, :])
        P = model.add_variable("P", (m, k), lb=0.0, ub=np.where(usable, np.inf, 0.0))
        cols = np.arange(m)
        import scipy.sparse as sp  # only with pairs: scipy costs a fresh process 0.1 s to import

        first = sp.csr_matrix((np.ones(m), (pairs[:, 0], cols)), shape=(n, m))
        second = sp.csr_matrix((np.ones(m), (pairs[:, 1], cols)), shape=(n, m))
        pair_time = P.sum(axis=1)
        time = time + (first + second) @ pair_time
        gpus = gpus + (P * pair_scale[:, None]).sum(axis=0)
        throughput = (throughput + first @ (P * PT[:, :, 0]).sum(axis=1)
                      + second @ (P * PT[:, :, 1]).sum(axis=1))
    model.add_constraint("time", time <= 1.0)
    model.add_constraint("capacity", gpus <= problem.capacity)
    return AllocationModel(model, X, P, throughput, time)


def objective_unit(scale: float, low: float = 1e-3, high: float = 1e3) -> float:
    """The unit to express an objective in, given the size ``scale`` of its coefficients:
    ``scale`` when it is outside ``[low, high]`` (solver tolerances are set for data near 1),
    else 1, so data already near 1 reaches the solver as written. An interior-point solver's
    point on a degenerate optimal face depends on that scaling: unscaled, ECOS returns the point
    it returns for the same model written directly in cvxpy (Gavel's policies)."""
    return scale if np.isfinite(scale) and scale > 0 and not low <= scale <= high else 1.0


def clean_matrix(values: np.ndarray) -> np.ndarray:
    """Clip solver round-off so fractions lie in [0, 1]."""
    return np.clip(values, 0.0, 1.0) + 0.0  # + 0.0 turns -0.0 into 0.0
