"""Closed-form optima, each certified by a dual bound before it is returned.

Both apply without space sharing, where a job's throughput is at most its
best type's (its time fractions sum to at most 1):

``max_min_fairness``: with ``a_ij`` the normalized coefficient
(:func:`~allocopt.formulations.max_min_fairness.normalized_coefficients`),
``t* <= t_cap = min_i max_j a_ij`` for every allocation. If every job ``i``
can get ``t_cap`` on one type ``j_i`` (``X_ij = t_cap / a_ij <= 1``) within
every type's capacity, that allocation is optimal: each job starts on its best
type, and jobs of a type over capacity move greedily to types with spare
GPUs (:func:`_rebalance`); if no fitting assignment is found, None. When every job can run
on one type only (one GPU type, or disjoint types), the jobs ``J_j`` of type
``j`` need ``t sum_{J_j} s_i / a_ij`` of its ``c_j`` GPUs, so
``t* <= c_j / sum_{J_j} s_i / a_ij`` too: a single water level with per-job
caps, attained by the same allocation at the lower bound. Each type's jobs then get
their time scaled up by the type's spare capacity (capped at 1), which keeps
the optimum and leaves fewer GPUs idle.

``max_throughput`` (no deadlines): ``sum_i max_j T_ij / kappa_j`` bounds the
objective; if every job fits on its best type (``X_ib = 1``) that allocation
is optimal.

Each function returns None when its certificate does not hold; the caller
then solves the LP.
"""

from __future__ import annotations

import numpy as np

from allocopt.formulations.base import PolicyResult
from allocopt.problem import Problem

#: Relative slack allowed on a capacity row of a closed-form allocation (round-off of the division).
CAPACITY_RTOL = 1e-12
#: Passes of the greedy search for a type per job that reaches the time-limit level (:func:`_rebalance`).
REBALANCE_PASSES = 4


def _best_types(value: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per job the type of its largest ``value`` (first of ties) and that value."""
    best = np.argmax(value, axis=1)
    return best, value[np.arange(value.shape[0]), best]


def max_min_fairness_closed_form(problem: Problem, coefficients: np.ndarray) -> PolicyResult | None:
    """The time-limit optimum of max-min fairness (see the module docstring), or None.

    ``coefficients`` is ``a`` (n, k), 0 where a job cannot run.
    """
    n, k = coefficients.shape
    best, top = _best_types(coefficients)
    if n == 0 or not np.all(top > 0):
        return None
    t_cap = float(top.min())
    scale = problem.scale_factors.astype(np.float64)
    capacity = problem.capacity.astype(np.float64)
    per_unit = np.bincount(best, weights=scale / top, minlength=k)  # GPUs per unit of level, per type
    if np.all(np.count_nonzero(coefficients, axis=1) == 1):
        # every job has one type: per type, the level is capped by its jobs' time limit and its GPUs
        level = np.divide(capacity, per_unit, out=np.full(k, np.inf), where=per_unit > 0)
        t_cap = min(t_cap, float(level.min()))
    rows = np.arange(n)
    assign = _rebalance(coefficients, best, t_cap, scale, capacity)
    if assign is None:
        return None
    on = coefficients[rows, assign]
    need = t_cap / on  # time on the assigned type
    use = np.bincount(assign, weights=scale * need, minlength=k)
    spare = np.divide(capacity, use, out=np.full(k, np.inf), where=use > 0)
    X = np.zeros((n, k))
    X[rows, assign] = np.minimum(1.0, need * np.maximum(spare[assign], 1.0))
    achieved = float(np.min(X[rows, assign] * on))
    return PolicyResult(X, achieved, message="Optimal solution found (closed form: every job reaches the "
                        "level of the job with the lowest best-type throughput; certified by that bound).",
                        extras={"certified": True, "dual_bound": t_cap, "primal_objective": achieved,
                                "certified_gap": (t_cap - achieved) / t_cap})


def _rebalance(a: np.ndarray, best: np.ndarray, t: float, scale: np.ndarray, capacity: np.ndarray
               ) -> np.ndarray | None:
    """One type per job on which it reaches level ``t`` (``a_ij >= t``, time ``t / a_ij``) within every
    type's capacity, or None if the greedy search finds none.

    Starts from each job's best type; while a type is over capacity, its jobs
    move to another type with spare GPUs, those that use the fewest GPUs there
    per GPU freed first (a few vectorized passes, one per pair of types)."""
    n, k = a.shape
    rows = np.arange(n)
    assign = best.copy()
    with np.errstate(divide="ignore"):
        gpus = np.where(a >= t * (1.0 - CAPACITY_RTOL), scale[:, None] * t / a, np.inf)  # GPUs at level t
    if gpus.min(axis=1).sum() > capacity.sum() * (1.0 + CAPACITY_RTOL):
        return None  # every job on its thriftiest type needs more GPUs than there are: no assignment fits
    for _ in range(REBALANCE_PASSES):
        use = np.bincount(assign, weights=gpus[rows, assign], minlength=k)
        over = use - capacity * (1.0 + CAPACITY_RTOL)
        if np.all(over <= 0):
            return assign
        for j in np.argsort(-over):
            if over[j] <= 0:
                break
            spare = np.maximum(capacity - np.bincount(assign, weights=gpus[rows, assign], minlength=k), 0.0)
            jobs = np.flatnonzero(assign == j)
            for target in np.argsort(-spare):
                if target == j or spare[target] <= 0 or over[j] <= 0:
                    continue
                cost = gpus[jobs, target]
                movable = np.isfinite(cost)
                candidates = jobs[movable]
                order = np.argsort(cost[movable] / gpus[candidates, j], kind="stable")
                candidates = candidates[order]
                fits = np.cumsum(gpus[candidates, target]) <= spare[target]
                freed = np.cumsum(gpus[candidates, j])
                take = candidates[fits & (np.r_[0.0, freed[:-1]] < over[j])]
                assign[take] = target
                over[j] -= gpus[take, j].sum()
                jobs = np.flatnonzero(assign == j)
    use = np.bincount(assign, weights=gpus[rows, assign], minlength=k)
    return assign if np.all(use <= capacity * (1.0 + CAPACITY_RTOL)) else None


def max_throughput_closed_form(problem: Problem, value: np.ndarray) -> PolicyResult | None:
    """Every job alone on its best type, if that fits (see the module docstring), or None.

    ``value`` is each job's objective per unit time on each type (n, k), 0 where it cannot run.
    """
    n, k = value.shape
    best, top = _best_types(value)
    runs = top > 0
    use = np.bincount(best[runs], weights=problem.scale_factors[runs].astype(np.float64), minlength=k)
    if np.any(use > problem.capacity):
        return None
    X = np.zeros((n, k))
    X[np.flatnonzero(runs), best[runs]] = 1.0
    bound = float(top.sum())
    return PolicyResult(X, bound, message="Optimal solution found (closed form: every job fits on its best "
                        "type; certified by the sum of the jobs' best throughputs).",
                        extras={"certified": True, "dual_bound": bound, "primal_objective": bound,
                                "certified_gap": 0.0})
