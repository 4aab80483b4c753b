"""Exact max-min fairness for many distinct jobs and few GPU types, by pricing the GPU types.

The LP (no space sharing), with ``a_ij = s_i T_ij / (w_i p_i)`` the normalized
coefficient (:func:`~allocopt.formulations.max_min_fairness.normalized_coefficients`)
and ``X_ij = 0`` where job ``i`` cannot run on type ``j``::

    t* = max t   s.t.   sum_j a_ij X_ij >= t     (mu_i)
                        sum_j X_ij <= 1          (y_i)
                        sum_i s_i X_ij <= c_j    (prices p_j)

has as dual, after minimizing out ``mu`` and ``y`` for fixed prices ``p >= 0``,
the convex piecewise-linear function of ``k`` variables

.. math::

    \\Phi(p) = p \\cdot c + \\max_{0 \\le t \\le T} \\Big(t - \\sum_i g_i(t; p)\\Big),
    \\qquad g_i(t; p) = \\min\\{ s_i\\, p \\cdot X_i : a_i \\cdot X_i \\ge t,\\ 1 \\cdot X_i \\le 1,\\ X_i \\ge 0 \\},

the cheapest way for job ``i`` to reach ``t`` at prices ``p``: ``g_i`` is the
lower convex hull of ``(0, 0)`` and the points ``(a_ij, s_i p_j)``, linear
with slope ``min_j s_i p_j / a_ij`` up to ``a_ij`` of its cheapest type.
``Phi(p) >= t*`` for every ``p >= 0`` and ``min_p Phi = t*`` (LP duality);
capping ``t`` at any upper bound ``T >= t*`` keeps both (the extra row
``t <= T`` is redundant), so ``T`` is lowered to the best bound found, which
keeps the hulls short. ``Phi(p)`` and the subgradient ``c - U`` (``U_j`` the
GPUs of type ``j`` the best responses use) take a few vectorized passes over
the ``n x k`` coefficients.

1. Prices: a trust-region cutting-plane (box-step bundle) method minimizes
   ``Phi`` over ``{p >= 0, p . c <= T}``, one LP in ``k + 1`` variables per
   step, to a relative gap ``price_rtol``.
2. Allocation: jobs whose cheapest type is cheaper than the runner-up by a
   relative margin, and whose time constraint cannot bind (``a_ij >= T``),
   are fixed to ``X_ij = t / a_ij`` on it: their GPU use is ``t B_j`` with
   ``B_j = sum s_i / a_ij``. The other jobs ("explicit") keep all their
   columns in the restricted LP ``max t`` over the explicit rows plus
   ``sum_explicit s_i X_ij + t B_j <= c_j``. Its optimum is feasible for the
   full LP (a lower bound), and its capacity duals ``p'`` give the upper bound
   ``Phi(p')``. When the two agree within ``rtol`` the allocation is
   certified optimal; otherwise the fixed jobs whose cheapest type at ``p'``
   differs become explicit (or, when the LP fell below the cutting planes'
   lower bound or ``p'`` is degenerate, the margin widens) and the LP is
   solved again; when nothing is left to free, the last LP is the full one.
   When the fixed jobs are all best responses at ``p'``, the restricted LP's
   duals extended by ``mu_i = min_j s_i p'_j / a_ij`` are dual feasible for the
   full LP with the same objective, so the loop ends certified.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from allocopt.formulations.cutting_planes import CuttingPlaneModel, box_step_minimize
from allocopt.formulations.base import ModelSolver, PolicyResult, clean_matrix
from allocopt.model import Model
from allocopt.solution import Status


#: The cap on t is this factor above the best dual bound: at exactly the bound, Phi is flat
#: along the ray of the optimal prices and the cutting planes stall.
HEADROOM = 1.25
#: HiGHS options of the restricted LPs: simplex (vertex duals) with tight tolerances, since
#: the certificate compares its objective with the dual bound to 1e-7.
LP_OPTIONS = {"highs": {"solver": "simplex", "primal_feasibility_tolerance": 1e-10,
                        "dual_feasibility_tolerance": 1e-10}}
#: Largest violation of a time or (relative) capacity row a certified allocation may have.
FEASIBILITY_TOL = 1e-7
#: Give up (the caller solves the plain LP) once more than this fraction of the jobs need rows:
#: e.g. when the per-job time limit, not capacity, decides the optimum, the prices are 0, no job
#: is fixed, and the restricted LP (solved by dual simplex) took 5-10x the plain LP.
MAX_EXPLICIT_FRACTION = 0.25
MIN_JOBS_TO_GIVE_UP = 512  # below this the whole restricted LP is fast anyway
#: Half-width of the first box around warm-start prices, relative to the largest (scaled) price.
WARM_BOX = 0.02
#: The margin from warm-start prices: about 5% of the jobs get rows and one restricted LP
#: certifies (at 1e-3, 2-3 rounds of restricted LPs: 2,048 jobs x 8 types after one change).
WARM_MARGIN = 1e-2


@dataclass
class Response:
    """Best responses to prices ``p`` at the maximizing ``t``: ``Phi(p)`` and its subgradient."""

    value: float
    subgradient: np.ndarray  # c - U (k,), U_j the GPUs of type j the best responses use


class PricedJobs:
    """The LP's data in (type, job) layout and the dual function ``Phi`` (see the module docstring)."""

    def __init__(self, coefficients: np.ndarray, scale: np.ndarray, capacity: np.ndarray):
        self.n, self.k = coefficients.shape
        self.a = np.ascontiguousarray(coefficients.T)  # (k, n), 0 where not runnable
        self.runnable = self.a > 0
        self.scale = scale.astype(np.float64)
        self.capacity = capacity.astype(np.float64)
        # GPUs per unit of normalized throughput, 0 where not runnable (masked by `penalty`)
        self.gpus_per_unit = np.divide(self.scale, self.a, out=np.zeros_like(self.a), where=self.runnable)
        self.penalty = np.where(self.runnable, 0.0, np.inf)
        self.cols = np.arange(self.n)
        self.a_max = np.max(self.a, axis=0)  # job i reaches at most a_max[i]
        # t* <= every job's best type, and t* <= total GPUs / GPUs needed per unit of t
        min_use = np.min(self.gpus_per_unit + self.penalty, axis=0)
        self.upper_bound = float(min(self.a_max.min(), self.capacity.sum() / min_use.sum()))

    def ratios(self, p: np.ndarray) -> np.ndarray:
        """``s_i p_j / a_ij`` (k, n): price per unit of normalized throughput, inf where not runnable."""
        ratio = np.multiply(self.gpus_per_unit, p[:, None])
        ratio += self.penalty
        return ratio

    def cheapest(self, ratio: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per job the least ratio and its type (the first of ties)."""
        least = np.min(ratio, axis=0)
        kind = np.zeros(self.n, dtype=np.intp)
        for j in range(self.k - 1, -1, -1):  # a loop over types, vectorized over jobs
            kind[ratio[j] == least] = j
        return least, kind

    def respond(self, p: np.ndarray, cap: float) -> Response:
        """``Phi(p)`` with ``t <= cap`` and its subgradient."""
        slope, cheapest = self.cheapest(self.ratios(p))
        flat = cheapest * self.n + self.cols
        first = self.a.ravel()[flat]  # the first hull vertex of every job
        cap = min(cap, float(self.a_max.min()))
        long = np.flatnonzero(first < cap)  # jobs whose hull bends below the cap
        total = float(slope.sum())
        t = cap
        if total >= 1.0:
            t = 0.0
        elif long.size:  # G' jumps at the long jobs' later vertices by the change of slope there
            hull_x, hull_j, hull_s = self._hulls(long, p, cheapest[long], slope[long], cap)
            at = hull_x[:, 1:].ravel()
            with np.errstate(invalid="ignore"):  # inf - inf past the walked vertices, dropped by `keep`
                inc = np.diff(hull_s, axis=1).ravel()
            keep = at < cap
            order = np.argsort(at[keep], kind="stable")
            crossed = np.flatnonzero(total + np.cumsum(inc[keep][order]) >= 1.0)
            if crossed.size:
                t = float(at[keep][order][crossed[0]])
        short = np.ones(self.n, dtype=bool)
        short[long] = False
        use = t * np.bincount(cheapest[short], weights=self.gpus_per_unit.ravel()[flat[short]], minlength=self.k)
        if long.size and t > 0:
            use += self.hull_point(long, hull_x, hull_j, t) @ self.scale[long]
        value = t + float(p @ (self.capacity - use))
        return Response(value, self.capacity - use)

    def _hulls(self, jobs: np.ndarray, p: np.ndarray, cheapest: np.ndarray, slope: np.ndarray,
               cap: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Lower convex hulls of ``(0, 0)`` and ``(a_ij, s_i p_j)`` for ``jobs``, walked until ``cap``.

        Returns vertex abscissae ``x`` (m, r + 1; column 0 the origin, inf past
        the last vertex walked), types ``j`` (-1 at the origin and past the end)
        and the slope of the segment leaving each vertex ``s`` (inf past the end)."""
        m = jobs.size
        a = self.a[:, jobs]
        q = np.where(self.runnable[:, jobs], self.scale[jobs] * p[:, None], np.inf)
        xs, js, ss = [np.zeros(m)], [np.full(m, -1)], [slope]
        x, y, j = a[cheapest, np.arange(m)], q[cheapest, np.arange(m)], cheapest
        while True:
            xs.append(x)
            js.append(j)
            going = np.isfinite(x) & (x < cap)
            if not going.any():
                ss.append(np.full(m, np.inf))
                break
            dx = a - x
            with np.errstate(divide="ignore", invalid="ignore"):
                step = np.where((dx > 0) & going, (q - y) / dx, np.inf)
            nxt = np.argmin(step, axis=0)
            s = step[nxt, np.arange(m)]
            ss.append(s)
            ok = np.isfinite(s)
            x = np.where(ok, a[nxt, np.arange(m)], np.inf)
            y = np.where(ok, q[nxt, np.arange(m)], np.inf)
            j = np.where(ok, nxt, -1)
        return np.column_stack(xs), np.column_stack(js), np.column_stack(ss)

    def hull_point(self, jobs: np.ndarray, hx: np.ndarray, hj: np.ndarray, t: float) -> np.ndarray:
        """``X`` (k, len(jobs)) of ``jobs`` at the point of their hulls (from :meth:`_hulls`) at ``t``."""
        m = jobs.size
        X = np.zeros((self.k, m))
        r = np.sum(hx <= t, axis=1) - 1  # segment [hx[r], hx[r + 1]] holds t
        rows, last = np.arange(m), hx.shape[1] - 1
        x0, x1 = hx[rows, r], hx[rows, np.minimum(r + 1, last)]
        with np.errstate(invalid="ignore", divide="ignore"):
            lam = np.where(np.isfinite(x1) & (x1 > x0), (t - x0) / (x1 - x0), 0.0)
        j0, j1 = hj[rows, r], hj[rows, np.minimum(r + 1, last)]
        has0 = j0 >= 0
        X[j0[has0], rows[has0]] += 1.0 - lam[has0]
        has1 = (j1 >= 0) & (lam > 0)
        X[j1[has1], rows[has1]] += lam[has1]
        return X

def minimize_prices(jobs: PricedJobs, *, rtol: float, max_iterations: int, start: np.ndarray | None = None
                    ) -> tuple[np.ndarray, float, float, float, int]:
    """Box-step cutting planes (:mod:`~allocopt.formulations.cutting_planes`) on ``Phi`` over
    ``{p >= 0, p . c <= T}``.

    Prices are scaled as ``pi_j = p_j c_j / T0`` (``T0`` the initial upper
    bound). Stops when the model predicts a decrease below ``rtol`` relative
    inside the box. When the box is not active the model's minimum is a lower
    bound on ``t*``. ``start`` (a similar problem's optimal prices: a warm start)
    is the first center, with a box of :data:`WARM_BOX` of its largest scaled price
    (it doubles while the steps hit it). Returns the best prices, ``Phi`` there
    (an upper bound on ``t*``), the lower bound (0 if none), the final cap ``T``
    and the number of evaluations of ``Phi``.
    """
    k = jobs.k
    cap = jobs.upper_bound
    unit = cap / jobs.capacity  # p = pi * unit
    model = CuttingPlaneModel(k, upper=np.ones(k))
    budget = model.add_row(-np.inf, 1.0, np.ones(k))  # sum pi <= cap / T0

    def evaluate(pi: np.ndarray) -> tuple[float, np.ndarray]:
        nonlocal cap
        response = jobs.respond(pi * unit, cap)
        cap = min(cap, HEADROOM * response.value)
        model.set_row_bounds(budget, -np.inf, cap / jobs.upper_bound)
        return response.value, response.subgradient * unit

    center, delta = np.full(k, 0.5 / k), 0.25
    if start is not None and start.shape == (k,) and np.all(np.isfinite(start)) and np.any(start > 0):
        center = np.clip(np.maximum(start, 0.0) / unit, 0.0, 1.0)
        delta = WARM_BOX * float(center.max())
    result = box_step_minimize(evaluate, model, center, delta, rtol=rtol, max_evaluations=max_iterations)
    return result.center * unit, result.best, max(result.lower, 0.0), cap, result.evaluations


@dataclass
class Certified:
    """An allocation of the full LP with its objective and the dual bound certifying it."""

    matrix: np.ndarray  # (n, k)
    objective: float  # min_i a_i . X_i, the allocation's own value
    dual_bound: float  # min of Phi over the prices tried: t* <= dual_bound
    gap: float  # (dual_bound - objective) / |dual_bound|
    violation: float  # largest violation of a time or capacity row, or of X >= 0
    rounds: int  # restricted LPs solved
    explicit_jobs: int  # jobs with their own rows in the last restricted LP


def _relative_gaps(jobs: PricedJobs, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cheapest type per job at prices ``p`` and how much dearer, relatively, its runner-up is."""
    ratio = jobs.ratios(p)
    least, cheapest = jobs.cheapest(ratio)
    runner_up = np.partition(ratio, 1, axis=0)[1] if jobs.k > 1 else np.full(jobs.n, np.inf)
    floor = 1e-12 * max(float(least.max()), 1e-300)
    with np.errstate(invalid="ignore", over="ignore"):
        gap = np.where(np.isfinite(runner_up), (runner_up - least) / np.maximum(least, floor), np.inf)
    return cheapest, np.nan_to_num(gap, nan=0.0)


def _restricted_lp(jobs: PricedJobs, explicit: np.ndarray, fixed_use: np.ndarray, t_max: float,
                   solver: ModelSolver) -> tuple[float, np.ndarray, np.ndarray]:
    """``max t <= t_max`` over the explicit jobs' rows, the fixed jobs using ``t * fixed_use`` GPUs
    (``t_max``: where the fixed jobs' ``X_ij = t / a_ij`` reaches 1).

    Capacity rows are divided by ``c_j`` (``fixed_use`` grows with the number of
    fixed jobs; unscaled, HiGHS stopped 1e-6 short of the optimum). Returns
    ``t``, the explicit jobs' ``X`` (m, k) and the capacity duals (prices)."""
    a = jobs.a[:, explicit].T
    model = Model("max_min_fairness_price_decomposition")
    X = model.add_variable("X", a.shape, ub=np.where(a > 0, np.inf, 0.0))
    t = model.add_variable("t", ub=t_max)
    model.add_constraint("normalized_throughput", (X * a).sum(axis=1) - t >= 0.0)
    model.add_constraint("time", X.sum(axis=1) <= 1.0)
    share = jobs.scale[explicit, None] / jobs.capacity
    model.add_constraint("capacity", (X * share).sum(axis=0) + t * (fixed_use / jobs.capacity) <= 1.0)
    model.maximize(t)
    # cold: a warm start's bases are of the whole LP or of another restricted LP (other explicit jobs)
    solution = solver.solve(model, "max_min_fairness (price decomposition, restricted LP)", defaults=LP_OPTIONS,
                            start_from=(None, ()))
    prices = np.maximum(solution.duals["capacity"], 0.0) / jobs.capacity
    return float(solution.values["t"]), clean_matrix(solution.values["X"]), prices


def certified_allocation(jobs: PricedJobs, p: np.ndarray, upper: float, lower: float, cap: float,
                         solver: ModelSolver, *, margin: float, rtol: float, max_rounds: int) -> Certified | None:
    """Phase 2 (see the module docstring): restricted LPs until their objective
    meets the dual bound within ``rtol``; None after ``max_rounds`` LPs.

    After a round that does not certify, the fixed jobs whose cheapest type
    differs at the LP's prices ``p'`` get rows; when the LP fell below the
    cutting planes' lower bound, or ``p'`` moves more jobs than have rows
    (degenerate duals, e.g. a zero price), the margin around ``p`` triples
    instead; when that frees no job either, every job gets rows.
    """
    cheapest, gap = _relative_gaps(jobs, p)
    fits = jobs.a[cheapest, jobs.cols] >= upper  # X_ij = t / a_ij <= 1 for every t <= t*
    fixed = (gap > margin) & fits
    if fixed.all():  # keep the LP's rows non-empty
        fixed[np.argmin(gap)] = False
    for rounds in range(1, max_rounds + 1):
        explicit, rows = np.flatnonzero(~fixed), np.flatnonzero(fixed)
        if explicit.size > MAX_EXPLICIT_FRACTION * jobs.n and jobs.n >= MIN_JOBS_TO_GIVE_UP:
            return None  # the restricted LP is nearly the whole LP, which the plain LP solves faster
        kind = cheapest[rows]
        fixed_use = np.bincount(kind, jobs.gpus_per_unit[kind, rows], jobs.k)
        t_max = float(jobs.a[kind, rows].min()) if rows.size else np.inf
        t, X_explicit, prices = _restricted_lp(jobs, explicit, fixed_use, t_max, solver)
        upper = min(upper, jobs.respond(prices, cap).value)
        X = np.zeros((jobs.n, jobs.k))
        X[explicit] = X_explicit
        X[rows, kind] = t / jobs.a[kind, rows]
        achieved = float(np.min(np.einsum("ij,ji->i", X, jobs.a)))
        violation = max(float(np.max(X.sum(axis=1) - 1.0)),
                        float(np.max((jobs.scale @ X - jobs.capacity) / np.maximum(jobs.capacity, 1.0))), 0.0)
        if upper - achieved <= rtol * abs(upper) and violation <= FEASIBILITY_TOL:
            return Certified(X, achieved, upper, (upper - achieved) / abs(upper), violation, rounds,
                             int(explicit.size))
        now, _ = _relative_gaps(jobs, prices)
        moved = fixed & (now != cheapest)
        if t < lower * (1.0 - rtol) or not moved.any() or moved.sum() > explicit.size:
            margin *= 3.0
            moved = fixed & (gap <= margin)
        if not moved.any():  # nothing left to widen: the next LP is the full one
            moved = fixed
        fixed &= ~moved
    return None


def max_min_fairness_price_decomposition(coefficients: np.ndarray, scale: np.ndarray, capacity: np.ndarray,
                                         solver: ModelSolver, *, rtol: float = 1e-7, price_rtol: float = 1e-5,
                                         margin: float = 1e-3, max_evaluations: int = 200,
                                         max_rounds: int = 10, prices: np.ndarray | None = None
                                         ) -> tuple[PolicyResult | None, dict[str, Any]]:
    """Weighted max-min fairness by price decomposition (see the module docstring).

    Parameters
    ----------
    coefficients : ndarray (n, k)
        ``a_ij`` (0 where job ``i`` cannot run on type ``j``).
    scale, capacity : ndarray
        ``s_i`` (n,) and ``c_j`` (k,).
    rtol : float
        Certification tolerance: ``(dual bound - objective) / dual bound``.
    price_rtol : float
        Relative gap at which the cutting planes stop.
    margin : float
        Jobs whose runner-up type is within this relative margin of the cheapest get LP rows.
    prices : ndarray (k,), optional
        A similar problem's optimal prices (a warm start): where the cutting planes start;
        ``margin`` is then at least :data:`WARM_MARGIN`.
        The final prices go to ``solver.hints["prices"]`` for the next solve.

    Returns
    -------
    The certified result (status OPTIMAL) or None when ``max_rounds``
    restricted LPs did not certify or more than :data:`MAX_EXPLICIT_FRACTION` of the jobs
    needed rows, and the diagnostics (also the result's ``extras``).
    """
    usable = np.asarray(capacity) > 0
    if not usable.all():  # a type with no GPUs has no price to find: solve without it, then put it back
        result, extras = max_min_fairness_price_decomposition(
            coefficients[:, usable], scale, np.asarray(capacity)[usable], solver, rtol=rtol, price_rtol=price_rtol,
            margin=margin, max_evaluations=max_evaluations, max_rounds=max_rounds,
            prices=None if prices is None or len(prices) != usable.size else np.asarray(prices)[usable])
        if result is not None:
            matrix = np.zeros(coefficients.shape)
            matrix[:, usable] = result.matrix
            result.matrix = matrix
        full = np.zeros(usable.size)
        full[usable] = solver.hints["prices"]
        solver.hints["prices"] = tuple(full.tolist())
        return result, extras
    t0 = time.perf_counter()
    if prices is not None:
        margin = max(margin, WARM_MARGIN)
    jobs = PricedJobs(coefficients, scale, capacity)
    p, upper, lower, cap, evaluations = minimize_prices(jobs, rtol=price_rtol, max_iterations=max_evaluations,
                                                        start=None if prices is None else np.asarray(prices, float))
    t1 = time.perf_counter()
    solver.hints["prices"] = tuple(p.tolist())
    found = certified_allocation(jobs, p, upper, lower, cap, solver, margin=margin, rtol=rtol,
                                 max_rounds=max_rounds)
    extras: dict[str, Any] = {"price_evaluations": evaluations, "price_upper_bound": upper,
                              "price_lower_bound": lower, "prices_s": t1 - t0,
                              "allocation_s": time.perf_counter() - t1, "certified": found is not None}
    if found is None:
        return None, extras
    extras.update(dual_bound=found.dual_bound, primal_objective=found.objective, certified_gap=found.gap,
                  max_violation=found.violation, restricted_lps=found.rounds, explicit_jobs=found.explicit_jobs)
    return PolicyResult(found.matrix, found.objective, Status.OPTIMAL, extras=extras), extras
