"""Minimum makespan: finish every job as early as possible (Gavel's
``min_total_duration_perf`` and, heterogeneity-agnostic, ``min_total_duration``).

.. math::

    \\min_X \\; \\max_i \\; \\frac{r_i}{e_i}, \\qquad e_i = \\sum_j T_{ij} X_{ij}

over the jobs with ``r_i > 0`` steps remaining, subject to the base
constraints (see :mod:`allocopt.formulations.base`). With ``theta = 1 / M``
this is one exact LP,

.. math::

    \\max_{X, \\theta} \\; \\theta \\quad \\text{s.t.} \\quad e_i \\ge r_i \\, \\theta,

solved here scaled by the makespan ``M_0`` of the isolated share (which is
feasible): ``theta' = M_0 theta`` is the speedup over the isolated share and
every row ``e_i >= (r_i / M_0) theta'`` is in steps/s. Gavel instead bisects
over feasibility LPs in ``M`` and stops within 5%: ``method="bisection"``
runs Gavel's search (``M`` from 100 s to 10^6 s, widened tenfold until
feasible, halving while ``1.05 M_low < M_high``; each step a feasibility LP
``e_i >= r_i / M`` with no objective) and returns the last feasible point, so
an interior-point solver returns Gavel's allocation. With ``gavel_program=True``
(``backend="cvxpy"``, ``method="bisection"``, no space sharing) each feasibility
LP is written as Gavel's cvxpy code writes it
(:mod:`allocopt.formulations.gavel_programs`: only the types with GPUs, no bound
keeping time off a type a job cannot use, ``Maximize(1)``; a step is feasible
when cvxpy says ``"optimal"``), so ECOS stops at Gavel's point to the last bit.
Finished jobs
(``r_i = 0``) impose nothing and get no time; when every job has finished the
makespan is 0 and no solver is called.

With ``heterogeneity_aware=False`` every GPU type runs a job at its
throughput on ``reference_gpu_type`` (``T'_ij = T_{i,ref}`` on the types job
``i`` can run on), as a scheduler unaware of GPU speeds would assume; the
reported makespan is then the one it plans for, under ``T'``. With
``space_sharing=True`` pairs of jobs may share GPUs (see
:func:`allocopt.formulations.base.base_model`).

Narayanan et al., "Heterogeneity-Aware Cluster Scheduling Policies for Deep
Learning Workloads", OSDI 2020 (policy "minimize makespan").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

import numpy as np

from allocopt.csr import CSR
from allocopt.errors import InfeasibleError, InvalidOptionError, InvalidProblemError
from allocopt.formulations.base import AllocationModel, ModelSolver, Policy, PolicyResult, base_model
from allocopt.formulations.gavel_programs import gavel_program, require_cvxpy
from allocopt.formulations.shares import isolated_matrix, type_order
from allocopt.model import CompiledModel, LinExpr
from allocopt.problem import Problem
from allocopt.solution import Solution, Status
from allocopt.warm_start import WarmStart

_Found = TypeVar("_Found")

#: How close (relative) an allocation's value must be to the lower bound for :func:`previous_if_optimal`.
RELATIVE_TOLERANCE = 1e-9
#: :func:`previous_if_optimal` gives time anew to at most this fraction of the jobs (new jobs, and jobs
#: whose new throughputs leave them short of the bound); beyond, the LP is solved.
MAX_REALLOCATED_FRACTION = 0.1


def steps_remaining(problem: Problem, policy: str) -> np.ndarray:
    """``problem.num_steps_remaining``, shape (n_jobs,), or a clear error when it is missing."""
    if problem.num_steps_remaining is None:
        raise InvalidProblemError(f"policy {policy!r} needs Problem(num_steps_remaining=...): the training "
                                  "steps each job has left", field="num_steps_remaining")
    return problem.num_steps_remaining


def policy_throughputs(problem: Problem, active: np.ndarray, *, heterogeneity_aware: bool,
                       reference_gpu_type: str | None, space_sharing: bool) -> np.ndarray | None:
    """The throughputs the policy plans with, shape (n_jobs, n_gpu_types), in steps/s.

    None means ``problem.throughputs`` (heterogeneity-aware). Otherwise
    ``T'_ij = T_{i,ref}`` where job ``i`` can run on type ``j`` (0 elsewhere);
    every ``active`` job needs a positive throughput on the reference type.
    """
    if heterogeneity_aware:
        if reference_gpu_type is not None:
            raise InvalidOptionError("reference_gpu_type only applies with heterogeneity_aware=False; "
                                     "leave it unset")
        return None
    types = problem.gpu_types
    if reference_gpu_type is None:
        raise InvalidOptionError("heterogeneity_aware=False needs reference_gpu_type=...: the GPU type whose "
                                 f"throughput every type is assumed to have (one of {list(types)})")
    if reference_gpu_type not in types:
        raise InvalidOptionError(f"reference_gpu_type {reference_gpu_type!r} is not a GPU type of the cluster; "
                                 f"its types are {list(types)}")
    if space_sharing:
        raise InvalidOptionError("heterogeneity_aware=False cannot be combined with space_sharing=True: pair "
                                 "throughputs are measured per GPU type")
    reference = problem.throughputs[:, types.index(reference_gpu_type)]
    slow = np.flatnonzero(active & (reference <= 0))
    if slow.size:
        names = ", ".join(repr(problem.job_ids[i]) for i in slow[:5])
        raise InvalidOptionError(f"job(s) {names} have zero throughput on reference_gpu_type "
                                 f"{reference_gpu_type!r}; choose a reference type every unfinished job runs on")
    return np.where(problem.runnable, reference[:, None], 0.0)


def evaluate(expr: LinExpr, base: AllocationModel, X: np.ndarray, P: np.ndarray | None) -> np.ndarray:
    """Value of ``expr`` (over ``base``'s variables) at the time fractions ``X`` and ``P``."""
    x = np.zeros(base.model.num_cols)
    x[base.X.columns] = X.ravel()
    if P is not None:
        x[base.P.columns] = P.ravel()
    return (expr.A @ x[:expr.A.shape[1]] + expr.const).reshape(expr.shape)


def planning_model(problem: Problem, active: np.ndarray, *, name: str, throughputs: np.ndarray | None,
                   space_sharing: bool) -> tuple[AllocationModel, LinExpr]:
    """The base model, with no time for the jobs not ``active``, and the
    effective throughput ``e`` (steps/s) under ``throughputs`` when given."""
    base = base_model(problem, name=name, space_sharing=space_sharing)
    e = base.throughput if throughputs is None else (base.X * throughputs).sum(axis=1)
    if not active.all():
        base.model.add_constraint("finished", base.time[~active] <= 0.0)
    return base, e


class SpeedupLP:
    """The LP of :func:`max_speedup` for one set of active jobs, built and compiled once: a new
    ``rate`` only rescales the rows of block ``finish`` (an iterative policy solves it for many
    rates; building the model each time cost as much as solving it)."""

    def __init__(self, problem: Problem, active: np.ndarray, *, name: str, throughputs: np.ndarray | None,
                 space_sharing: bool):
        self.problem, self.active = problem, active
        self.base, self.e = planning_model(problem, active, name=name, throughputs=throughputs,
                                           space_sharing=space_sharing)
        self.T = problem.throughputs if throughputs is None else throughputs
        # per-job speeds, and the time an equal split of every type gives (steps/s): the unit of s
        share = problem.capacity / max(float(problem.capacity.sum()), float(problem.scale_factors.sum()))
        self.equal_split = (self.T * problem.runnable) @ share
        # finish row i holds e_i (uncapped) and -s; each rate divides the former by rate_i * unit
        self.capped = self.base.P is None
        e_row = (self.base.X * np.where(active[:, None], self.T, 0.0)).sum(axis=1) if self.capped else self.e
        speedup = self.base.model.add_variable("speedup", lb=0.0)
        self.base.model.add_constraint("finish", e_row[active] - speedup >= 0.0)
        self.base.model.maximize(speedup)
        self.compiled = self.base.model.compile()
        rows = self.compiled.constraints["finish"][0]
        A = self.compiled.A
        self._span = slice(int(A.indptr[rows.start]), int(A.indptr[rows.stop]))
        entries = A.indices[self._span] != self.compiled.variables["speedup"][0].start
        self._entries = np.flatnonzero(entries)
        self._entry_job = np.repeat(np.flatnonzero(active), np.diff(A.indptr[rows.start:rows.stop + 1]))[entries]
        self._values = A.data[self._span][entries].copy()

    def model(self, rate: np.ndarray) -> tuple[CompiledModel, float]:
        """The compiled LP for ``rate`` (steps/s, > 0 exactly where the jobs are active) and the unit of
        its objective (see :func:`max_speedup`)."""
        unit = float((self.equal_split[self.active] / rate[self.active]).min())
        unit = unit if np.isfinite(unit) and unit > 0 else 1.0
        row = rate * unit
        values = np.minimum(self._values, 1e6 * row[self._entry_job]) if self.capped else self._values
        scaled = values * (1.0 / row[self._entry_job])  # as LinExpr divides: bit for bit the model built anew
        A = self.compiled.matrix
        data = A.data.copy()
        data[self._span.start + self._entries] = scaled
        return dataclasses.replace(self.compiled, matrix=CSR(data, A.indices, A.indptr, A.shape)), unit


def max_speedup(problem: Problem, solver: ModelSolver, rate: np.ndarray, *, name: str,
                throughputs: np.ndarray | None, space_sharing: bool,
                start_from: tuple[WarmStart | None, Sequence[Hashable]] | None = None,
                lp: SpeedupLP | None = None) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, Solution]:
    """Solve ``max s`` s.t. ``e_i >= rate_i s`` for the jobs with ``rate_i > 0``
    (steps/s); jobs with ``rate_i = 0`` get no time. ``start_from`` replaces the
    solver's warm start (see :meth:`ModelSolver.solve_raw`); ``lp``, a :class:`SpeedupLP`
    of the same problem and options, is reused when its active jobs are those of ``rate``.

    Returns the cleaned ``X`` and ``P``, the effective throughput ``e`` they
    attain (steps/s, under ``throughputs`` when given), and the solution
    (``s`` is its objective).
    """
    active = rate > 0
    if lp is None or not np.array_equal(lp.active, active):
        lp = SpeedupLP(problem, active, name=name, throughputs=throughputs, space_sharing=space_sharing)
    # s in units of the speedup of an equal split of every type, and row i divided by its rate in those
    # units: coefficients and optimum near 1 whatever the data. A job whose rate is below 1e-6 of what a
    # type gives it is asked for 1e-6 of its time there at least (its rate, with margin, rather than a
    # requirement below the solver's tolerances: no job is left at 0 steps/s)
    model, unit = lp.model(rate)
    solution = solver.solve(model, name, start_from=start_from)
    if solution.objective is not None:
        solution = dataclasses.replace(solution, objective=solution.objective * unit)
    X, P = lp.base.matrices(solution)
    return X, P, evaluate(lp.e, lp.base, X, P), solution


def gavel_bisection(problem: Problem, solver: ModelSolver, steps: np.ndarray, *, name: str,
                    throughputs: np.ndarray | None, space_sharing: bool
                    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, Solution]:
    """Gavel's ``MinTotalDuration`` search: the last feasible point of the feasibility LPs
    ``e_i >= r_i / M`` over a bisection in ``M`` (seconds) that stops within 5% (module docstring).
    Returns ``X``, ``P``, the effective throughputs ``e`` (steps/s) and the last feasible solve."""
    def attempt(makespan: float) -> tuple[AllocationModel, LinExpr, Solution] | None:
        base = base_model(problem, name=name, space_sharing=space_sharing)
        e = base.throughput if throughputs is None else (base.X * throughputs).sum(axis=1)
        base.model.add_constraint("finish", e >= steps / makespan)
        solution = solver.solve_raw(base.model)
        return (base, e, solution) if solution.status is Status.OPTIMAL else None

    base, e, solution = _gavel_search(attempt, name)
    X, P = base.matrices(solution)
    return X, P, evaluate(e, base, X, P), solution


def gavel_bisection_program(problem: Problem, solver: ModelSolver, steps: np.ndarray, throughputs: np.ndarray, *,
                            name: str) -> tuple[np.ndarray, Solution]:
    """:func:`gavel_bisection` with each feasibility LP written as Gavel's cvxpy code writes it
    (``gavel_program=True``, module docstring). Returns ``X`` and the last feasible solve."""
    cp = require_cvxpy(solver, f"{name} (gavel_program)")
    rows = np.arange(problem.num_jobs)

    def finish_by(makespan: float) -> Callable[[Any, np.ndarray], list]:
        return lambda x, columns: [cp.sum(cp.multiply(throughputs[:, columns], x), axis=1) >= steps / makespan]

    def attempt(makespan: float) -> tuple[np.ndarray, Solution] | None:
        X, solution, native = gavel_program(problem, solver, rows, throughputs, lambda x, c: cp.Maximize(1),
                                            f"{name} (gavel_program)", finish_by(makespan))
        return (X, solution) if native == "optimal" else None  # Gavel's test: "optimal_inaccurate" is infeasible

    return _gavel_search(attempt, name)


def _gavel_search(attempt: Callable[[float], _Found | None], name: str) -> _Found:
    """Gavel's bisection schedule over the makespan ``M`` (seconds): halve ``[100, 1e6]`` until within
    5%, and while nothing was feasible move to the next decade up; returns the last feasible
    ``attempt(M)`` (None: infeasible at ``M``)."""
    high, low, last_high = 1e6, 100.0, 1e6
    feasible: _Found | None = None
    while feasible is None:
        while 1.05 * low < high:
            makespan = (low + high) / 2.0
            found = attempt(makespan)
            if found is not None:
                feasible, high = found, makespan
            else:
                low = makespan
        high, low, last_high = last_high * 10.0, last_high, last_high * 10.0
        if low > 1e15:
            raise InfeasibleError(f"{name}: no makespan up to 1e15 s is feasible with method='bisection'",
                                  status=Status.INFEASIBLE)
    return feasible


def previous_if_optimal(problem: Problem, solver: ModelSolver, throughputs: np.ndarray, steps: np.ndarray,
                        value: Callable[[np.ndarray], np.ndarray], needed: Callable[[float], np.ndarray]
                        ) -> tuple[np.ndarray, float, np.ndarray] | None:
    """A warm start's allocation, certified optimal without an LP, for policies that minimize the
    largest ``value`` (per job, increasing as its throughput falls: makespan, finish-time fairness).

    No job can beat its ``value`` at its fastest type's throughput (all its time there), so the
    largest of those bounds the optimum from below; the previous allocation is optimal when it is
    feasible and attains the bound (relative 1e-9). The jobs it leaves short of the throughput
    ``needed`` at that bound (new jobs, and jobs whose throughputs fell) first hand their time back
    and get GPUs to spare, fastest types first, up to that throughput (at most
    :data:`MAX_REALLOCATED_FRACTION` of the jobs). Returns its time fractions, the value it attains
    and the per-job values, and marks ``solver`` as having reused its warm start; None when there is
    no warm start allocation or the certificate fails."""
    warm = solver.warm_start
    X = warm.previous_matrix(problem.job_ids) if warm is not None else None
    if X is None or X.shape != throughputs.shape:
        return None
    T, sizes = throughputs, problem.scale_factors
    fastest = np.max(np.where(problem.runnable, T, 0.0), axis=1)
    bound = float(np.nanmax(value(fastest)))
    want = needed(bound)
    short = np.flatnonzero((steps > 0) & ~((X * T).sum(axis=1) >= want * (1.0 - RELATIVE_TOLERANCE)))
    if short.size > MAX_REALLOCATED_FRACTION * max(np.count_nonzero(steps > 0), 10):
        return None
    if short.size:
        X[short] = 0.0
        spare = np.maximum(problem.capacity - sizes @ X, 0.0)
        for i in short:  # a loop over the few jobs short of the bound, and their types
            left = 1.0
            for j in np.argsort(-T[i], kind="stable"):
                if not want[i] > 0.0 or T[i, j] <= 0.0 or left <= 0.0:
                    break
                x = min(left, spare[j] / sizes[i], want[i] / T[i, j])
                X[i, j], left, want[i] = x, left - x, want[i] - x * T[i, j]
                spare[j] -= x * sizes[i]
            if want[i] > 1e-12 * fastest[i]:
                return None
    tol = 1e-9
    if not (np.all(X >= 0.0) and np.all(X[steps <= 0] == 0.0) and np.all(X[~problem.runnable] == 0.0)
            and np.all(X.sum(axis=1) <= 1.0 + tol) and np.all(sizes @ X <= problem.capacity * (1.0 + tol))):
        return None
    values = value((X * T).sum(axis=1))
    attained = float(np.nanmax(values))
    if not (np.isfinite(attained) and attained <= bound * (1.0 + RELATIVE_TOLERANCE)):
        return None
    solver.reused_warm_start = True
    return X, attained, values


def isolated_throughputs(problem: Problem, throughputs: np.ndarray | None) -> np.ndarray:
    """Steps/s of each job under the isolated share, shape (n_jobs,), summed over the types in name order."""
    T = problem.throughputs if throughputs is None else throughputs
    columns = type_order(problem)
    return (T[:, columns] * isolated_matrix(problem)[:, columns]).sum(axis=1)


class MinMakespan(Policy):
    """Gavel's ``min_total_duration_perf``: minimize the time the last job finishes (module docstring)."""
    name = "min_makespan"
    options = {"heterogeneity_aware": True, "reference_gpu_type": None, "space_sharing": False, "method": "lp",
               "gavel_program": False}

    def allocate(self, problem: Problem, solver: ModelSolver, *, heterogeneity_aware: bool = True,
                 reference_gpu_type: str | None = None, space_sharing: bool = False,
                 method: str = "lp", gavel_program: bool = False) -> PolicyResult:
        if method not in ("lp", "bisection"):
            raise InvalidOptionError(f"min_makespan method must be 'lp' (one exact LP) or 'bisection' "
                                     f"(Gavel's search, within 5%), got {method!r}")
        if gavel_program and (method != "bisection" or space_sharing):
            raise InvalidOptionError("gavel_program=True writes Gavel's bisection over single jobs: it needs "
                                     f"method='bisection' and no space_sharing (got method={method!r}, "
                                     f"space_sharing={space_sharing})")
        steps = steps_remaining(problem, self.name)
        active = steps > 0
        throughputs = policy_throughputs(problem, active, heterogeneity_aware=heterogeneity_aware,
                                         reference_gpu_type=reference_gpu_type, space_sharing=space_sharing)
        if not active.any():
            return PolicyResult(np.zeros(problem.throughputs.shape), 0.0,
                                message="Every job has finished (num_steps_remaining = 0): makespan 0 s.",
                                extras={"makespan_s": 0.0})
        if method == "lp" and not space_sharing and solver.warm_start is not None:
            with np.errstate(divide="ignore", invalid="ignore"):
                kept = previous_if_optimal(problem, solver, problem.throughputs if throughputs is None else throughputs,
                                           steps, lambda e: np.where(active, steps / e, np.nan), lambda v: steps / v)
            if kept is not None:
                X, makespan, _ = kept
                return PolicyResult(X, makespan, Status.OPTIMAL, None,
                                    "Optimal solution found (the previous allocation still attains the bound every "
                                    "job's fastest GPU type sets: no LP solved).", {"makespan_s": makespan})
        if gavel_program:
            T = problem.throughputs if throughputs is None else throughputs
            X, solution = gavel_bisection_program(problem, solver, steps, T, name=self.name)
            P, e = None, (X * T).sum(axis=1)
        elif method == "bisection":
            X, P, e, solution = gavel_bisection(problem, solver, steps, name=self.name, throughputs=throughputs,
                                                space_sharing=space_sharing)
        else:
            isolated = isolated_throughputs(problem, throughputs)
            isolated_makespan = float(np.max(steps[active] / isolated[active]))
            X, P, e, solution = max_speedup(problem, solver, steps / isolated_makespan, name=self.name,
                                            throughputs=throughputs, space_sharing=space_sharing)
        with np.errstate(divide="ignore"):
            makespan = float(np.max(steps[active] / e[active]))
        return PolicyResult(X, makespan, solution.status, P, solution.message, {"makespan_s": makespan})
