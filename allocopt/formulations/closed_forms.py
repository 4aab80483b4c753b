"""Closed-form optima, each certified by a dual bound before it is returned.

Both apply without space sharing, where a job's throughput is at most its
best type's (its time fractions sum to at most 1):

``max_min_fairness``: with ``a_ij`` the normalized coefficient
(:func:`~allocopt.formulations.max_min_fairness.normalized_coefficients`),
``t* <= t_cap = min_i max_j a_ij`` for every allocation. If every job ``i``
can get ``t_cap`` on its best type ``b_i`` (``X_ib = t_cap / a_ib``) within
every type's capacity, that allocation is optimal. When every job can run
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
    need = t_cap / top  # time on the best type
    use = t_cap * per_unit
    if np.any(use > capacity * (1.0 + CAPACITY_RTOL)):
        return None
    spare = np.divide(capacity, use, out=np.full(k, np.inf), where=use > 0)
    X = np.zeros((n, k))
    X[np.arange(n), best] = np.minimum(1.0, need * np.maximum(spare[best], 1.0))
    achieved = float(np.min(X[np.arange(n), best] * top))
    return PolicyResult(X, achieved, message="Optimal solution found (closed form: every job reaches the "
                        "level of the job with the lowest best-type throughput; certified by that bound).",
                        extras={"certified": True, "dual_bound": t_cap, "primal_objective": achieved,
                                "certified_gap": (t_cap - achieved) / t_cap})


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
