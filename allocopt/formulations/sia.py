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

Exact reductions keep the model small without changing its optimum: a pinned
job keeps only its previous entry, and of the other entries only those that
improve the objective and beat every entry of the same job and GPU type with
no more GPUs are built. With ``backend="highs"`` (and ``scipy``) HiGHS
presolve is turned off unless ``solver_options`` sets it: it removes nothing here and its setup grows
superlinearly (about 50 s of a 65 s solve at 5,120 jobs x 29 configurations,
against 3 s without it).
"""

from __future__ import annotations


import numpy as np
import scipy.sparse as sp

from allocopt.allocation import Timings
from allocopt.errors import InvalidOptionError
from allocopt.formulations.base import ModelSolver, Policy, PolicyResult
from allocopt.goodput_problem import ConfigurationAllocation, GoodputProblem
from allocopt.model import Model


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
    """

    name = "sia"
    options = {"p": -0.5, "lambda_n": 1.1, "lambda_a": 0.0}
    problem_type = GoodputProblem

    def allocate(self, problem: GoodputProblem, solver: ModelSolver, *, p: float = -0.5, lambda_n: float = 1.1,
                 lambda_a: float = 0.0) -> PolicyResult:
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
        solution = solver.solve(model, "sia", defaults=SOLVER_DEFAULTS)
        chosen = np.zeros((n, C))
        chosen[rows, cols] = solution.values["x"]
        return PolicyResult(chosen, solution.objective, solution.status, message=solution.message)

    def to_allocation(self, problem: GoodputProblem, result: PolicyResult, *, backend: str | None,
                      timings: Timings) -> ConfigurationAllocation:
        """Decode ``x`` (values > 0.5 are chosen) into one configuration index per job, -1 for none."""
        chosen = result.matrix > 0.5
        configuration = np.where(chosen.any(axis=1), chosen.argmax(axis=1), -1).astype(np.int64)
        configuration.setflags(write=False)
        return ConfigurationAllocation(problem=problem, configuration=configuration, policy=self.name,
                                       backend=backend, status=result.status, objective=result.objective,
                                       message=result.message, timings=timings)


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


# HiGHS presolve removes nothing from this model and its clique-table setup grows
# superlinearly (about 50 s of a 65 s solve at 5,120 jobs x 29 configurations).
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

