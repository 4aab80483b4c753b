"""Exact maximum throughput for many distinct jobs and few GPU types, by pricing the GPU types.

The LP (no space sharing, no deadlines), with ``v_ij >= 0`` what a unit of job
``i``'s time on type ``j`` is worth (its throughput, or throughput per cost; 0
where it cannot run)::

    max sum_ij v_ij X_ij   s.t.   sum_j X_ij <= 1          (y_i)
                                  sum_i s_i X_ij <= c_j    (prices p_j)

has as dual, after minimizing out ``y`` for fixed prices ``p >= 0``, the convex
piecewise-linear function of ``k`` variables

.. math::

    D(p) = p \\cdot c + \\sum_i \\max\\big(0, \\max_j (v_{ij} - s_i p_j)\\big),

each job's best use of its time at those prices (a type, or none). ``D(p)`` is
an upper bound on the optimum for every ``p >= 0`` and ``min_p D`` equals it;
its subgradient is ``c - U`` (``U_j`` the GPUs of type ``j`` the best responses
use).

1. Prices: box-step cutting planes (:mod:`~allocopt.formulations.cutting_planes`)
   minimize ``D`` to a relative gap ``price_rtol`` (from a similar problem's
   prices, a warm start, :data:`WARM_PRICE_RTOL`).
2. Allocation: jobs whose best use beats their runner-up (another type, or
   none) by a relative margin are fixed to it; the jobs fixed on type ``j``
   move together, by one variable ``z_j`` in ``[0, 1]`` (``X_ij = z_j``), so
   the restricted LP over the other ("explicit") jobs' rows and the ``z_j`` is
   always feasible. Its optimum is feasible for the full LP (a lower bound) and
   its capacity duals ``p'`` give the upper bound ``D(p')``; when they agree
   within ``rtol`` the allocation is certified optimal. Otherwise the fixed
   jobs whose best use differs at ``p'`` get rows (or, when none does or
   they are too many, the margin around ``p`` triples) and the LP is solved again; at most ``max_rounds`` LPs,
   and no more than :data:`~allocopt.formulations.price_decomposition.MAX_EXPLICIT_FRACTION`
   of the jobs with rows (the caller then solves the plain LP).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from allocopt.csr import CSR
from allocopt.formulations.base import ModelSolver, PolicyResult, clean_matrix
from allocopt.formulations.cutting_planes import CuttingPlaneModel, box_step_minimize
from allocopt.formulations.price_decomposition import (LP_OPTIONS, MAX_EXPLICIT_FRACTION, MIN_JOBS_TO_GIVE_UP,
                                                       WARM_BOX, WARM_MARGIN)
from allocopt.model import CompiledModel
from allocopt.solution import Status

#: Largest violation of a time or (relative) capacity row a certified allocation may have.
FEASIBILITY_TOL = 1e-7
#: From a warm start's prices the cutting planes stop at this relative gap: the restricted LPs' duals
#: refine the prices (2,048 jobs x 8 types after one change: 1 evaluation and 1-2 small LPs, 5-20 ms,
#: against 6-32 evaluations and 8-33 ms at 1e-6)
WARM_PRICE_RTOL = 1e-3


class ThroughputPrices:
    """The LP's data and the dual function ``D`` (see the module docstring)."""

    def __init__(self, value: np.ndarray, scale: np.ndarray, capacity: np.ndarray):
        self.n, self.k = value.shape
        self.scale = scale.astype(np.float64)
        self.capacity = capacity.astype(np.float64)
        self.runnable = (value > 0) & (self.capacity > 0)
        self.value = np.where(self.runnable, value, 0.0)
        self.penalty = np.where(self.runnable, 0.0, -np.inf)
        # no job pays more per GPU for a type than its best value there: D only grows past these prices
        self.price_cap = np.max(self.value / self.scale[:, None], axis=0, initial=0.0)
        self.rows = np.arange(self.n)

    def surplus(self, p: np.ndarray) -> np.ndarray:
        """``v_ij - s_i p_j`` (n, k), -inf where job ``i`` cannot run on type ``j``."""
        out = self.value - np.multiply.outer(self.scale, p)
        out += self.penalty
        return out

    def respond(self, p: np.ndarray) -> tuple[float, np.ndarray]:
        """``D(p)`` and its subgradient ``c - U``."""
        surplus = self.surplus(p)
        best = np.argmax(surplus, axis=1)
        top = surplus[self.rows, best]
        runs = top > 0
        use = np.bincount(best[runs], weights=self.scale[runs], minlength=self.k)
        return float(p @ self.capacity + top[runs].sum()), self.capacity - use

    def best_uses(self, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each job's best use at ``p`` (a type, or -1 for none) and by how much, relative to its best
        value, it beats the runner-up (another type, or none)."""
        surplus = self.surplus(p)
        best = np.argmax(surplus, axis=1)
        top = surplus[self.rows, best]
        if self.k > 1:
            second = np.partition(surplus, self.k - 2, axis=1)[:, self.k - 2]
        else:
            second = np.full(self.n, -np.inf)
        size = np.maximum(self.value[self.rows, best], 1e-300)
        with np.errstate(invalid="ignore"):
            gap = np.where(top > 0, (top - np.maximum(second, 0.0)) / size, -top / size)
        choice = np.where(top > 0, best, -1)
        return choice, np.nan_to_num(gap, nan=np.inf, posinf=np.inf)


def minimize_prices(jobs: ThroughputPrices, *, rtol: float, max_evaluations: int, start: np.ndarray | None
                    ) -> tuple[np.ndarray, float, int]:
    """Box-step cutting planes on ``D`` over ``0 <= p <= price_cap`` (scaled to ``[0, 1]``); ``start``
    (a similar problem's prices) is the first center, with a box of :data:`WARM_BOX` of its largest
    scaled price. Returns the best prices, ``D`` there and the number of evaluations."""
    unit = np.where(jobs.price_cap > 0, jobs.price_cap, 1.0)
    model = CuttingPlaneModel(jobs.k, upper=np.where(jobs.price_cap > 0, 1.0, 0.0))

    def evaluate(pi: np.ndarray) -> tuple[float, np.ndarray]:
        value, subgradient = jobs.respond(pi * unit)
        return value, subgradient * unit

    center, delta = np.full(jobs.k, 0.5), 0.25
    if start is not None and start.shape == (jobs.k,) and np.all(np.isfinite(start)):
        center = np.clip(np.maximum(start, 0.0) / unit, 0.0, 1.0)
        delta = max(WARM_BOX * float(center.max()), 1e-6)
    result = box_step_minimize(evaluate, model, center, delta, rtol=rtol, max_evaluations=max_evaluations)
    return result.center * unit, result.best, result.evaluations


def _restricted_lp(jobs: ThroughputPrices, explicit: np.ndarray, fixed: np.ndarray, solver: ModelSolver
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``max`` over the explicit jobs' ``X`` and one ``z_j`` per type for the jobs fixed on it (``fixed``:
    each job's type, -1 for none or not fixed). Capacity rows are divided by ``c_j``; the arrays are
    written directly (the LP is small: building it through :class:`~allocopt.model.Model` cost as much
    as solving it). Returns the explicit jobs' ``X`` (m, k), ``z`` (k,) and the capacity duals (prices
    per GPU)."""
    m, k = explicit.size, jobs.k
    on = fixed >= 0
    worth = np.bincount(fixed[on], weights=jobs.value[on, fixed[on]], minlength=k)
    use = np.bincount(fixed[on], weights=jobs.scale[on], minlength=k)
    capacity = np.where(jobs.capacity > 0, jobs.capacity, 1.0)
    cells = np.arange(m * k)  # column i * k + j: X of the i-th explicit job on type j; then z
    share = np.repeat(jobs.scale[explicit], k) / np.tile(capacity, m)
    import scipy.sparse as sp  # at scale only: scipy costs a fresh process 0.1 s to import

    time_rows = sp.csr_matrix((np.ones(m * k), cells, np.arange(0, m * k + 1, k)), shape=(m, m * k + k))
    capacity_rows = sp.csr_matrix((np.r_[share, use / capacity], (np.r_[np.tile(np.arange(k), m), np.arange(k)],
                                                                  np.r_[cells, m * k + np.arange(k)])),
                                  shape=(k, m * k + k))
    model = CompiledModel(
        c=np.r_[jobs.value[explicit].ravel(), worth], offset=0.0,
        matrix=CSR.from_any(sp.vstack([time_rows, capacity_rows], format="csr")),
        row_lb=np.full(m + k, -np.inf), row_ub=np.r_[np.ones(m), jobs.capacity / capacity],
        col_lb=np.zeros(m * k + k), col_ub=np.r_[np.where(jobs.runnable[explicit], np.inf, 0.0).ravel(),
                                                 np.where(use > 0, 1.0, 0.0)],
        integrality=np.zeros(m * k + k, dtype=bool), sense="max",
        variables={"X": (slice(0, m * k), (m, k)), "z": (slice(m * k, m * k + k), (k,))},
        constraints={"time": (slice(0, m), (m,)), "capacity": (slice(m, m + k), (k,))},
        name="max_throughput_price_decomposition")
    # cold: a warm start's bases are of the whole LP or of another restricted LP (other explicit jobs)
    solution = solver.solve(model, "max_throughput (price decomposition, restricted LP)", defaults=LP_OPTIONS,
                            start_from=(None, ()))
    prices = np.maximum(solution.duals["capacity"], 0.0) / capacity
    return clean_matrix(solution.values["X"]), clean_matrix(solution.values["z"]), prices


def max_throughput_price_decomposition(value: np.ndarray, scale: np.ndarray, capacity: np.ndarray,
                                       solver: ModelSolver, *, rtol: float = 1e-9, price_rtol: float = 1e-6,
                                       margin: float = 1e-3, max_evaluations: int = 200, max_rounds: int = 6,
                                       prices: np.ndarray | None = None
                                       ) -> tuple[PolicyResult | None, dict[str, Any]]:
    """Maximum total value by price decomposition (see the module docstring).

    Parameters
    ----------
    value : ndarray (n, k)
        ``v_ij`` (0 where job ``i`` cannot run on type ``j``), best near 1 (the caller's objective unit).
    scale, capacity : ndarray
        ``s_i`` (n,) and ``c_j`` (k,).
    rtol : float
        Certification tolerance: ``(dual bound - objective) / dual bound``.
    prices : ndarray (k,), optional
        A similar problem's optimal prices, in the units of ``value`` per GPU (a warm start); ``margin``
        is then at least :data:`~allocopt.formulations.price_decomposition.WARM_MARGIN`. The final
        prices go to ``solver.hints["prices"]`` for the next solve.

    Returns
    -------
    The certified result (status OPTIMAL; objective in the units of ``value``) or None when
    ``max_rounds`` restricted LPs did not certify or too many jobs needed rows, and the diagnostics
    (also the result's ``extras``).
    """
    t0 = time.perf_counter()
    if prices is not None:
        margin, price_rtol = max(margin, WARM_MARGIN), max(price_rtol, WARM_PRICE_RTOL)
    jobs = ThroughputPrices(value, scale, capacity)
    p, upper, evaluations = minimize_prices(jobs, rtol=price_rtol, max_evaluations=max_evaluations,
                                            start=None if prices is None else np.asarray(prices, dtype=np.float64))
    t1 = time.perf_counter()
    solver.hints["prices"] = tuple(p.tolist())
    extras: dict[str, Any] = {"price_evaluations": evaluations, "prices_s": t1 - t0, "certified": False}
    choice, gap = jobs.best_uses(p)
    fixed = gap > margin
    for rounds in range(1, max_rounds + 1):
        explicit = np.flatnonzero(~fixed)
        if explicit.size > MAX_EXPLICIT_FRACTION * jobs.n and jobs.n >= MIN_JOBS_TO_GIVE_UP:
            break  # the restricted LP is nearly the whole LP, which the plain LP solves faster
        kind = np.where(fixed, choice, -1)
        X_explicit, z, duals = _restricted_lp(jobs, explicit, kind, solver)
        X = np.zeros((jobs.n, jobs.k))
        X[explicit] = X_explicit
        on = np.flatnonzero(kind >= 0)
        X[on, kind[on]] = z[kind[on]]
        achieved = float((jobs.value * X).sum())
        upper = min(upper, jobs.respond(duals)[0])
        violation = max(float(np.max(X.sum(axis=1) - 1.0, initial=0.0)),
                        float(np.max((jobs.scale @ X - jobs.capacity) / np.maximum(jobs.capacity, 1.0))), 0.0)
        extras.update(restricted_lps=rounds, explicit_jobs=int(explicit.size), dual_bound=upper,
                      primal_objective=achieved)
        if upper - achieved <= rtol * abs(upper) and violation <= FEASIBILITY_TOL:
            extras.update(certified=True, certified_gap=(upper - achieved) / max(abs(upper), 1e-300),
                          max_violation=violation, allocation_s=time.perf_counter() - t1)
            return PolicyResult(X, achieved, Status.OPTIMAL, extras=extras), extras
        now, _ = jobs.best_uses(duals)
        moved = fixed & (now != choice)
        if not moved.any() or (explicit.size + moved.sum() > MAX_EXPLICIT_FRACTION * jobs.n
                               and jobs.n >= MIN_JOBS_TO_GIVE_UP):
            # nothing moved, or too many to give rows (the LP's duals are degenerate: a z_j between its
            # bounds prices type j at its fixed jobs' average): widen the margin around p instead
            margin *= 3.0
            moved = fixed & (gap <= margin)
        if not moved.any():  # nothing left to widen: the next LP is the full one
            moved = fixed
        fixed &= ~moved
    extras["allocation_s"] = time.perf_counter() - t1
    return None, extras
