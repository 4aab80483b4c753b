"""Sia: goodput-optimized configurations for heterogeneous clusters, a MILP
(Jayaram Subramanya et al., "Sia: Heterogeneity-aware, goodput-optimized
ML-cluster scheduling", SOSP 2023; published code: siasosp23/artifacts).

For job ``i`` and configuration ``c`` it can use (``GoodputProblem.valid``)::

    G[i, c] = s_i * goodput[i, c] / min_{c' valid} goodput[i, c']
    G[i, c] = r_i * G[i, c]          for c != previous_i (jobs with a previous configuration)
    U[i, c] = G[i, c] ** p

``s_i`` is 1 for adaptive jobs and ``rigid_gpus_i`` for rigid ones (as in the
published code, so a rigid job's smallest entry counts as many GPUs as it
holds) and ``r_i`` the restart factor. One binary ``x[i, c]`` per valid pair
only (invalid pairs are not in the model)::

    sum_c x[i, c] <= 1                                    (constraint block "one_configuration")
    sum_{i, c of type j} gpus_c x[i, c] <= capacity_j     (constraint block "capacity")
    x[i, previous_i] = 1                                  for pinned jobs (a bound)

    minimize (p < 0) or maximize (p > 0)
        sum_{i, c} x[i, c] (U[i, c] - lambda_n)  +  sigma * lambda_a * changed

``changed`` counts the jobs with a previous configuration that are not in it
afterwards (moved or stopped) and ``sigma`` is +1 when minimizing, -1 when
maximizing, so ``lambda_a >= 0`` always discourages changes (in the model: the
coefficient of ``x[i, previous_i]`` moves by ``-sigma * lambda_a``, plus a
constant). The published code states ``lambda_a`` but leaves it out of its
MILP; its default here is 0. Up to the constant ``lambda_n * n_jobs`` the
objective is the published ``sum x U + lambda_n (n_jobs - sum x)``, so
``lambda_n`` prices an idle job: the published convention is ``lambda_n > 1``
for ``p < 0`` and ``lambda_n < -1`` for ``p > 0``, which makes even a job's
smallest configuration (``U = 1``) worth allocating.

Leaving every job idle is optimal exactly when no entry of an unpinned job has
a coefficient of the improving sign (``< 0`` when minimizing, ``> 0`` when
maximizing). Because ``U > 0``, that holds for every input when ``p < 0`` and
``lambda_n <= 0``: this option combination is rejected up front, and any other
input where it happens is rejected once the coefficients are known, both with
an :class:`~allocopt.errors.InvalidOptionError` that says why.

The MILP is solved through its LP relaxation first (``relaxation_first=True``,
:func:`_solve_relaxation_first`): an integral LP optimum is the MILP optimum,
and otherwise reduced-cost fixing leaves a MILP over a few thousand of the
binaries (5,120 jobs x 29 configurations: 0.5 s against 1.9 s for the whole
MILP, same optimum).

Exact reductions keep the model small without changing its optimum: a pinned
job keeps only its previous entry, and of the other entries only those that
improve the objective and beat every entry of the same job and GPU type with
no more GPUs are built. With ``backend="highs"`` (and ``scipy``) HiGHS
presolve is turned off unless ``solver_options`` sets it: it removes nothing here and its setup grows
superlinearly (about 50 s of a 65 s solve at 5,120 jobs x 29 configurations,
against 3 s without it).
"""

from __future__ import annotations


import logging
from dataclasses import replace
from typing import Any

import numpy as np
import scipy.sparse as sp

from allocopt.allocation import Timings
from allocopt.backends import solve_model
from allocopt.errors import InvalidOptionError
from allocopt.formulations.base import ModelSolver, Policy, PolicyResult
from allocopt.goodput_problem import ConfigurationAllocation, GoodputProblem
from allocopt.model import CompiledModel, Model
from allocopt.solution import Solution

logger = logging.getLogger(__name__)

INTEGRALITY_TOL = 1e-9  # an LP value this close to 0 or 1 counts as integral
FIXING_TOL = 1e-7  # margin of reduced-cost fixing, relative to the LP bound (LP duals carry round-off)
MAX_REPAIRS = 100  # binaries the incumbent repair raises at most
DUAL_TOL = 1e-7  # optimality-condition tolerance of LP duals, relative to the largest cost
FIXING_GUESS = 1e-6  # first guess of the optimality gap, relative to the LP bound


class Sia(Policy):
    """Sia's configuration MILP (see the module docstring).

    Options
    -------
    p : float, default -0.5
        Fairness power, nonzero: ``p < 0`` minimizes ``sum G ** p`` (more
        negative is fairer), ``p > 0`` maximizes it (``p = 1``: total normalized goodput).
    lambda_n : float, default 1.1
        Price of an idle job, in utility units (each allocated job adds
        ``U - lambda_n``). Published convention: ``lambda_n > 1`` with ``p < 0``,
        ``lambda_n < -1`` with ``p > 0``; ``p < 0`` with ``lambda_n <= 0`` is
        rejected, as it leaves every job idle.
    lambda_a : float >= 0, default 0.0
        Cost of moving or stopping a job that has a previous configuration, in utility units.
    relaxation_first : bool, default True
        Solve the LP relaxation first and the MILP only over the binaries that
        reduced-cost fixing leaves free (:func:`_solve_relaxation_first`);
        False solves the whole MILP. Same optimum.
    """

    name = "sia"
    options = {"p": -0.5, "lambda_n": 1.1, "lambda_a": 0.0, "relaxation_first": True}
    problem_type = GoodputProblem

    def allocate(self, problem: GoodputProblem, solver: ModelSolver, *, p: float = -0.5, lambda_n: float = 1.1,
                 lambda_a: float = 0.0, relaxation_first: bool = True) -> PolicyResult:
        p, lambda_n, lambda_a = _check_options(p, lambda_n, lambda_a)
        n, C = problem.num_jobs, problem.num_configurations
        rows, cols = valid_entries(problem)
        coef, offset = utility_coefficients(problem, rows, cols, p, lambda_n, lambda_a)
        _check_not_all_idle(problem, rows, coef, p, lambda_n, lambda_a)
        keep = useful_entries(problem, rows, cols, coef if p < 0 else -coef)
        rows, cols, coef = rows[keep], cols[keep], coef[keep]

        k = rows.size
        entries = np.arange(k)
        configs = problem.configurations
        pinned = problem.pinned[rows] & (cols == problem.previous[rows])
        model = Model(self.name)
        x = model.add_variable("x", k, lb=pinned.astype(np.float64), ub=1.0, kind="binary")
        per_job = sp.csr_matrix((np.ones(k), (rows, entries)), shape=(n, k))
        model.add_constraint("one_configuration", per_job @ x <= 1.0)
        gpus = sp.csr_matrix((configs.num_gpus[cols].astype(np.float64), (configs.gpu_type[cols], entries)),
                             shape=(problem.cluster.num_gpu_types, k))
        model.add_constraint("capacity", gpus @ x <= problem.cluster.capacity.astype(np.float64))
        objective = x.dot(coef) + offset
        if p < 0:
            model.minimize(objective)
        else:
            model.maximize(objective)
        if relaxation_first:
            values, objective_value, extras, solution = _solve_relaxation_first(model.compile(), solver)
        else:
            solution = solver.solve(model, "sia", defaults=SOLVER_DEFAULTS)
            values, objective_value, extras = solution.values["x"], solution.objective, {}
        chosen = np.zeros((n, C))
        chosen[rows, cols] = values
        return PolicyResult(chosen, objective_value, solution.status, message=solution.message, extras=extras)

    def to_allocation(self, problem: GoodputProblem, result: PolicyResult, *, backend: str | None,
                      timings: Timings) -> ConfigurationAllocation:
        """Decode ``x`` (values > 0.5 are chosen) into one configuration index per job, -1 for none."""
        chosen = result.matrix > 0.5
        configuration = np.where(chosen.any(axis=1), chosen.argmax(axis=1), -1).astype(np.int64)
        configuration.setflags(write=False)
        return ConfigurationAllocation(problem=problem, configuration=configuration, policy=self.name,
                                       backend=backend, status=result.status, objective=result.objective,
                                       message=result.message, timings=timings, extras=result.extras)


def valid_entries(problem: GoodputProblem) -> tuple[np.ndarray, np.ndarray]:
    """Job and configuration of each valid pair, sorted by job, then GPU type, then GPU count."""
    configs = problem.configurations
    order = np.lexsort((configs.num_gpus, configs.gpu_type))
    rows, position = np.nonzero(problem.valid[:, order])
    return rows, order[position]


def utility_coefficients(problem: GoodputProblem, rows: np.ndarray, cols: np.ndarray, p: float,
                         lambda_n: float, lambda_a: float) -> tuple[np.ndarray, float]:
    """Objective coefficient of each entry ``(rows[e], cols[e])`` of :func:`valid_entries`
    and the objective's constant, in the sense of ``p``.

    Returns ``U - lambda_n``, moved by ``-sigma * lambda_a`` at each job's
    previous configuration, and ``sigma * lambda_a * (jobs with a previous
    configuration)`` (see the module docstring).
    """
    g = problem.goodput[rows, cols]
    starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
    smallest = np.minimum.reduceat(g, starts)
    scale = np.where(problem.rigid_gpus > 0, problem.rigid_gpus, 1).astype(np.float64)
    G = g / smallest[rows] * scale[rows]
    previous = problem.previous[rows]
    at_previous = cols == previous
    G = np.where((previous >= 0) & ~at_previous, G * problem.restart_factor[rows], G)
    sigma = 1.0 if p < 0 else -1.0
    coef = G ** p - lambda_n
    coef[at_previous] -= sigma * lambda_a
    return coef, sigma * lambda_a * float(np.count_nonzero(problem.previous >= 0))


def useful_entries(problem: GoodputProblem, rows: np.ndarray, cols: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """Entries an optimal solution needs (bool per entry); dropping the others keeps the optimum.

    ``rows``, ``cols`` are :func:`valid_entries` and ``cost`` each entry's
    objective coefficient in minimization form. Kept: for pinned jobs only the previous configuration (the rest are 0
    anyway), for the others each entry that lowers the objective (``cost < 0``;
    leaving the job idle is no worse otherwise) and costs less than every entry
    of the same job and GPU type with no more GPUs (else swapping to that one
    uses fewer GPUs and is no worse).
    """
    t = problem.configurations.gpu_type[cols]
    first = np.r_[True, (rows[1:] != rows[:-1]) | (t[1:] != t[:-1])]
    rank = np.arange(rows.size) - np.flatnonzero(first)[np.cumsum(first) - 1]
    best_before = np.full(rows.size, np.inf)  # lowest cost of the group's entries with no more GPUs
    running = cost.copy()  # lowest cost up to and including each entry
    by_rank = np.argsort(rank, kind="stable")
    bounds = np.searchsorted(rank[by_rank], np.arange(1, rank.max(initial=0) + 2))
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        e = by_rank[lo:hi]
        best_before[e] = running[e - 1]
        running[e] = np.minimum(running[e - 1], cost[e])
    keep = (cost < 0) & (cost < best_before)
    return np.where(problem.pinned[rows], cols == problem.previous[rows], keep)


def _solve_relaxation_first(model: CompiledModel, solver: ModelSolver
                            ) -> tuple[np.ndarray, float | None, dict[str, Any], Solution]:
    """Solve a 0-1 program whose rows are ``A x <= b`` with ``A >= 0`` (Sia's) by
    its LP relaxation and reduced-cost fixing; same optimum as the MILP.

    In minimization form, with an optimal LP point ``x*`` of value ``z*`` and
    duals ``y <= 0``, every feasible ``x`` has ``c x >= z* + sum_j d_j (x_j -
    x*_j)`` for the reduced costs ``d = c - A^T y``, each term ``>= 0``. An
    integral ``x*`` is therefore optimal. Otherwise rounding ``x*`` down is
    feasible (``A >= 0``); raising binaries that still fit, most improving
    first, gives an incumbent of value ``z_inc``, and a binary at 0 with ``z* +
    d_j > z_inc`` (at 1 with ``z* - d_j > z_inc``) takes that value in every
    solution at least as good: it is fixed, and the MILP is solved over the
    rest. Without duals (a backend that reports none) the whole MILP is solved.
    Returns the values, the objective (model's sense), extras and the last solution.
    """
    relaxed = solver.record(solve_model(replace(model, integrality=np.zeros_like(model.integrality)),
                                        solver.backend, solver.options, SOLVER_DEFAULTS))
    sign = 1.0 if model.sense == "min" else -1.0
    d = None
    if relaxed.success:
        x_lp = relaxed.x
        fractional = (x_lp > INTEGRALITY_TOL) & (x_lp < 1 - INTEGRALITY_TOL)
        if not fractional.any():
            x = np.round(x_lp)
            return x, float(model.c @ x + model.offset), {"relaxation_integral": True, "milp_binaries": 0}, relaxed
        if relaxed.duals:
            y = sign * np.concatenate([relaxed.duals[name].ravel() for name in model.constraints])
            d = sign * model.c - model.A.T @ y
    if d is None or not _certifies(model, x_lp, y, d, fractional):
        # no duals, or duals the point does not satisfy the optimality conditions with: solve it whole
        return _whole_milp(model, solver, {"relaxation_integral": None})
    z_lp = sign * (model.c @ x_lp + model.offset)  # objectives below include the offset, as solutions' do
    incumbent = _round_down_and_repair(model, x_lp, sign * model.c)
    margin = FIXING_TOL * max(1.0, abs(z_lp))
    known_gap = sign * (model.c @ incumbent + model.offset) - z_lp  # a feasible point is this far above the bound
    guess = min(known_gap, FIXING_GUESS * max(1.0, abs(z_lp)))
    valid = guess == known_gap  # fixing with a gap some feasible point attains keeps every optimum
    at_zero, at_one = x_lp <= INTEGRALITY_TOL, x_lp >= 1 - INTEGRALITY_TOL
    fixed = model.col_lb == model.col_ub  # pinned: fixed whatever their reduced cost
    solves = 0
    while True:
        fix_zero = at_zero & ((d > guess + margin) | fixed)
        fix_one = at_one & ((-d > guess + margin) | fixed)
        free = np.flatnonzero(~(fix_zero | fix_one))
        reduced = CompiledModel(
            c=model.c[free], offset=model.offset + float(model.c[fix_one].sum()), A=model.A[:, free].tocsr(),
            row_lb=model.row_lb, row_ub=model.row_ub - model.A[:, np.flatnonzero(fix_one)].sum(axis=1).A1,
            col_lb=model.col_lb[free], col_ub=model.col_ub[free], integrality=model.integrality[free],
            sense=model.sense, variables={"x": (slice(0, free.size), (free.size,))},
            constraints=model.constraints, name=model.name)
        solution = solver.check(solver.record(solve_model(reduced, solver.backend, solver.options,
                                                          SOLVER_DEFAULTS)),
                                "sia (the MILP over the binaries reduced-cost fixing left free)")
        solves += 1
        if not solution.has_values:
            break
        found_gap = sign * solution.objective - z_lp
        if found_gap <= guess + margin:
            break  # the point found is within the gap the fixing assumed, so the fixing was valid for it
        if valid:  # a point within the gap satisfies the fixing; not finding it means round-off: solve it whole
            logger.info("sia: the reduced MILP missed a point within its assumed gap (round-off); "
                        "solving the whole MILP over %d binaries", model.num_cols)
            return _whole_milp(model, solver, {"relaxation_integral": False, "fallback": "round-off",
                                               "milp_binaries": model.num_cols})
        guess, valid = min(found_gap, known_gap), True
    x = fix_one.astype(np.float64)
    if solution.has_values:
        x[free] = solution.values["x"]
    objective = solution.objective if solution.has_values else None
    return x, objective, {"relaxation_integral": False, "milp_binaries": int(free.size), "milp_solves": solves}, \
        solution


def _whole_milp(model: CompiledModel, solver: ModelSolver, extras: dict[str, Any]
                ) -> tuple[np.ndarray, float | None, dict[str, Any], Solution]:
    """Solve ``model`` as it is (the relaxation-first path's fallback)."""
    solution = solver.check(solver.record(solve_model(model, solver.backend, solver.options, SOLVER_DEFAULTS)),
                            "sia")
    return solution.values["x"], solution.objective, extras, solution


def _certifies(model: CompiledModel, x: np.ndarray, y: np.ndarray, d: np.ndarray, fractional: np.ndarray) -> bool:
    """Whether ``x`` and the minimization-form duals ``y`` (reduced costs ``d``)
    satisfy the optimality conditions reduced-cost fixing relies on: ``y <= 0``
    on the ``<=`` rows and 0 on slack ones, ``d >= 0`` at 0, ``d <= 0`` at 1,
    ``d = 0`` in between (tolerance relative to the largest cost)."""
    tol = DUAL_TOL * max(1.0, float(np.abs(model.c).max(initial=0.0)))
    slack = model.row_ub - model.A @ x
    free = model.col_lb < model.col_ub  # a fixed binary (pinned) may have any reduced cost
    return bool(np.all(y <= tol) and np.all(np.abs(y) * np.maximum(slack, 0.0) <= tol)
                and np.all(d[free & (x <= INTEGRALITY_TOL)] >= -tol)
                and np.all(d[free & (x >= 1 - INTEGRALITY_TOL)] <= tol)
                and np.all(np.abs(d[fractional]) <= tol))


def _round_down_and_repair(model: CompiledModel, x_lp: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """``x_lp`` rounded down, then, while some binary at 0 with a negative
    ``cost`` still fits the rows, the cheapest of them raised to 1 (one
    vectorized pass over the nonzeros per binary raised; a vertex has few
    fractional binaries, so few are)."""
    x = np.floor(x_lp + INTEGRALITY_TOL)
    residual = model.row_ub - model.A @ x
    A = model.A.tocsc()
    column = np.repeat(np.arange(A.shape[1]), np.diff(A.indptr))
    for _ in range(MAX_REPAIRS):
        too_big = np.zeros(A.shape[1], dtype=bool)
        too_big[column[A.data > residual[A.indices] + INTEGRALITY_TOL]] = True
        score = np.where(~too_big & (x == 0) & (cost < 0), cost, np.inf)
        j = int(np.argmin(score))
        if not np.isfinite(score[j]):
            break
        x[j] = 1.0
        residual[A.indices[A.indptr[j]:A.indptr[j + 1]]] -= A.data[A.indptr[j]:A.indptr[j + 1]]
    return x


# HiGHS presolve removes nothing from this model and its clique-table setup grows
# superlinearly (about 50 s of a 65 s solve at 5,120 jobs x 29 configurations); for the
# LP relaxation it costs 0.05 s of 0.45 s.
SOLVER_DEFAULTS = {"highs": {"presolve": "off"}, "scipy": {"presolve": False}}


def _check_options(p: float, lambda_n: float, lambda_a: float) -> tuple[float, float, float]:
    for name, value in (("p", p), ("lambda_n", lambda_n), ("lambda_a", lambda_a)):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
                or not np.isfinite(value):
            raise InvalidOptionError(f"sia: {name} must be a finite number, got {value!r}")
    if p == 0:
        raise InvalidOptionError("sia: p must be nonzero (p < 0 minimizes sum G**p, p > 0 maximizes it); "
                                 "the published default is p=-0.5")
    if lambda_a < 0:
        raise InvalidOptionError(f"sia: lambda_a is the cost of changing a job's configuration and must be >= 0, "
                                 f"got {lambda_a}")
    if p < 0 and lambda_n <= 0:
        raise InvalidOptionError(
            f"sia: p={p} < 0 with lambda_n={lambda_n} <= 0 leaves every job idle: with p < 0 the objective "
            "sum x (G**p - lambda_n) is minimized and every utility G**p is positive, so every term is positive "
            "and allocating nothing is optimal (only pinned jobs, and with lambda_a > 0 perhaps jobs that keep "
            "their configuration, would run). lambda_n is the cost of an idle job: with p < 0 give lambda_n > 1 "
            "(published default 1.1) so that even a job's smallest configuration (G**p = 1) is worth allocating")
    return float(p), float(lambda_n), float(lambda_a)


def _check_not_all_idle(problem: GoodputProblem, rows: np.ndarray, coef: np.ndarray, p: float,
                        lambda_n: float, lambda_a: float) -> None:
    """Raise when no entry of an unpinned job improves the objective, i.e. idling them all is optimal."""
    free = ~problem.pinned[rows]
    if not free.any():
        return
    improving = coef[free] < 0 if p < 0 else coef[free] > 0
    if improving.any():
        return
    utility = coef[free] + lambda_n  # U, shifted by lambda_a where a job keeps its configuration
    sign, cmp = ("< lambda_n", "p < 0 minimizes") if p < 0 else ("> lambda_n", "p > 0 maximizes")
    hint = ("give lambda_n > 1 (published default 1.1)" if p < 0
            else "give lambda_n < 0 (the published convention for p > 0) or below the smallest utility")
    raise InvalidOptionError(
        f"sia: with p={p}, lambda_n={lambda_n}, lambda_a={lambda_a} every job would be left idle: {cmp} "
        f"sum x (U - lambda_n), so a configuration is only worth allocating where U {sign}, but the "
        f"utilities U = G**p of the unpinned jobs (with the lambda_a term where a job keeps its "
        f"configuration) lie in [{utility.min():.4g}, {utility.max():.4g}]; {hint}")

