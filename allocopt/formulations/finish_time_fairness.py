"""Finish-time fairness (Themis; Gavel's ``finish_time_fairness_perf`` and,
heterogeneity-agnostic, ``finish_time_fairness``).

.. math::

    \\min_X \\; \\max_i \\; \\rho_i, \\qquad
    \\rho_i = \\frac{t_i + r_i / e_i}{D_i}, \\qquad
    D_i = t^{iso}_i + \\frac{r_i}{e^{iso}_i}

over the jobs with ``r_i > 0`` steps remaining, subject to the base
constraints (see :mod:`allocopt.formulations.base`): ``t_i`` is the time since
the job started (``Problem.time_since_start``, default 0), ``t^iso_i`` the time
it would have needed so far under its isolated share (``Problem.time_isolated``,
default 0) and ``e^iso_i`` its throughput under the isolated share
(:func:`allocopt.formulations.shares.isolated_matrix`). ``rho_i < 1`` means the
job finishes earlier than on its own 1/n of the cluster.

``rho_i <= rho`` is ``e_i >= rate_i(rho) = r_i / (rho D_i - t_i)`` (for
``rho > t_i / D_i``), linear in ``X`` for fixed ``rho``, and ``rho`` is
optimal where ``theta(rho) = max_X min_i e_i / rate_i(rho)`` reaches 1; theta
increases with rho. ``method="bisection"`` (every LP backend) finds that root
with Brent's method to a relative tolerance of 1e-9, one LP per step,
bracketed by ``max_i t_i / D_i`` (where theta is 0) and the ``rho`` of the
isolated share (feasible), and returns the allocation of least attained
``rho`` among all LPs solved. It stops as soon as that ``rho`` is within the
tolerance of a proven lower bound: an LP where theta < 1, or the bound every
LP's optimal duals give at every other ``rho`` (:func:`dual_lower_bound`; when
one job's own speed decides the optimum, the first LP certifies it). With a
warm start the previous allocation is kept, with no LP, when it still attains
the bound every job's fastest GPU type sets
(:func:`~allocopt.formulations.makespan.previous_if_optimal`); otherwise the
search begins where the previous basis was optimal (a Newton step with the
slope of theta the LP's duals give, then secant steps, kept inside the proven
range), each LP from the basis of the nearest earlier one (within 1% in
``rho`` where a cold solve would use the interior point, which beats a far
basis there; any, else): 1-3 LPs of a few pivots
where a cold solve takes 1-3, the first ones by interior point. The first LP
starts from the previous solve's basis only while most jobs keep the rate
that basis had (:func:`previous_basis_near`); once time has passed every
rate has moved, and it starts cold. Every LP of a
solve shares its rows (:class:`~allocopt.formulations.makespan.SpeedupLP`):
built once, rescaled per ``rho``. When every ``t_i`` is 0, ``rho = 1 / theta``
with constant rates ``r_i / D_i``: a single LP. ``method="conic"``
(``backend="cvxpy"`` only) solves the second-order-cone program
``min rho s.t. (r_i / D_i) / e_i + t_i / D_i <= rho`` directly (CLARABEL
unless ``solver_options["solver"]`` names another cvxpy solver).
``method="conic_gavel"`` (``backend="cvxpy"``, no space sharing) solves the
same program written as Gavel's cvxpy code writes it, the objective the
maximum of the unfinished jobs' ``rho_i``
(:mod:`allocopt.formulations.gavel_programs`): ECOS then stops at Gavel's point
to the last bit, which Gavel's mechanism needs where jobs are entitled to equal
shares.

With ``heterogeneity_aware=False`` every GPU type runs a job at its
throughput on ``reference_gpu_type``, for ``e_i`` and ``e^iso_i`` alike (see
:mod:`allocopt.formulations.makespan`). With ``space_sharing=True`` pairs of
jobs may share GPUs. Finished jobs impose nothing and get no time.

Mahajan et al., "Themis: Fair and Efficient GPU Cluster Scheduling", NSDI 2020;
Narayanan et al., "Heterogeneity-Aware Cluster Scheduling Policies for Deep
Learning Workloads", OSDI 2020.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from allocopt.backends.cvxpy import CvxpyBackend, require_solver, solve_program
from allocopt.backends.highs import IPM_MIN_COLUMNS
from allocopt.errors import InvalidOptionError
from allocopt.formulations.base import ModelSolver, Policy, PolicyResult
from allocopt.formulations.gavel_programs import solve_gavel_program
from allocopt.formulations.makespan import (SpeedupLP, evaluate, isolated_throughputs, max_speedup,
                                            planning_model, policy_throughputs, previous_if_optimal,
                                            steps_remaining)
from allocopt.problem import Problem
from allocopt.solution import Solution, Status
from allocopt.warm_start import WarmStart, old_positions

RHO_RTOL = 1e-9
#: an LP starts from the basis of an earlier one at a rho this close (relative); farther, a cold solve is
#: faster when it is by interior point (HiGHS, IPM_MIN_COLUMNS columns or more). Below that the cold solve
#: is a simplex from the slack basis, and any earlier basis is the better start (a simulation of 5,000
#: jobs on 540 GPUs: 39% less time in the solver, the same LPs)
CHAIN_RTOL = 1e-2
#: LPs a warm search near the previous rho may take before Brent's method over the whole range
SEARCH_STEPS = 6
#: The first LP of a warm search starts from the previous solve's basis only when at most this fraction of
#: the active jobs are new or need a rate that moved by more than RATE_RTOL against the others' at the rho
#: where that basis was optimal. Time passing moves rates unevenly (jobs that ran are ahead, the others
#: behind), and the jobs tight at the optimum change with it: in a simulation re-solving every 1,920 s
#: (20,000 jobs on 2,160 GPUs; 80% of the rates moved by over 1% against the median) the first LP took
#: 2,500-3,300 pivots from the previous basis against 1,000-1,700 cold (with presolve): 0.34-0.57 s against
#: 0.02-0.18 s. After an arrival or new throughputs of a few jobs the previous basis is a few pivots away.
MAX_CHANGED_FRACTION = 0.25
RATE_RTOL = 1e-2
METHODS = ("bisection", "conic", "conic_gavel")
DEFAULT_CONIC_SOLVER = "CLARABEL"


def dual_lower_bound(weights: np.ndarray, rho: float, theta: float, isolated_finish: np.ndarray,
                     started: np.ndarray) -> float | None:
    """The least ``rho'`` the optimal duals of the LP at ``rho`` leave possible: ``rho* >= rho'``.

    ``weights`` are the LP's duals of its finish rows, negated (>= 0; summing to 1 when
    ``theta > 0``), ``theta`` its optimum (``max_X min_i e_i / rate_i(rho)``). The duals,
    scaled by ``1 / sum_i w_i rate_i(rho') / rate_i(rho)``, are feasible for the LP at any
    ``rho'`` (only the speedup column's row of the dual changes), so
    ``theta(rho') <= theta / g(rho')`` with ``g(rho') = sum_i w_i (rho D_i - t_i) / (rho' D_i - t_i)``,
    which decreases in ``rho'``: below the root of ``g = theta``, theta < 1 and no allocation
    reaches ``rho'``. None when no weight is positive or ``theta <= 0``."""
    keep = weights > 0
    if not keep.any() or not theta > 0:
        return None
    w, D, t = weights[keep], isolated_finish[keep], started[keep]
    numerator = w * (rho * D - t)
    floor = float(np.max(t / D))  # g is +inf there

    def g_minus_theta(r: float) -> float:
        with np.errstate(divide="ignore"):  # +inf at the floor
            return float((numerator / np.maximum(r * D - t, 0.0)).sum()) - theta

    high = rho
    while g_minus_theta(high) > 0.0:  # the root is above rho: theta at rho is below 1
        high = floor + 2.0 * (high - floor)
        if not np.isfinite(high):
            return None
    for fraction in (1e-12, 1e-9, 1e-6, 1e-3):  # a left end where g is finite
        low = floor + fraction * (high - floor)
        if np.isfinite(g_minus_theta(low)):
            break
    else:
        return None
    if g_minus_theta(low) <= 0.0:  # the root is within a hair of the floor: nothing proven beyond it
        return None
    root = _brentq(g_minus_theta, low, high, xtol=1e-15 * high, rtol=4 * np.finfo(float).eps)
    return float(root) * (1.0 - 1e-12)  # below the root: the bound stays a proof despite rounding


def previous_basis_near(problem: Problem, warm: WarmStart | None, steps: np.ndarray, started: np.ndarray,
                        isolated_finish: np.ndarray) -> bool:
    """Whether a warm search's first LP should start from ``warm``'s basis: at most
    :data:`MAX_CHANGED_FRACTION` of the active jobs are new or need a rate that moved, against the
    median job's, by more than :data:`RATE_RTOL` at the rho where that basis was optimal
    (``warm.hints["basis_rho"]`` and ``["basis_rates"]``; True when the warm start does not say which
    rates its basis had). ``steps``, ``started`` and ``isolated_finish`` are ``r_i``, ``t_i`` and ``D_i``
    of ``problem``'s jobs (module docstring)."""
    if warm is None:
        return False
    hints = warm.hints
    old = np.asarray(hints.get("basis_rates", ()), dtype=np.float64)
    if "basis_rho" not in hints or old.size != len(warm.job_ids):
        return True
    active = steps > 0
    index = old_positions(tuple(warm.job_ids), tuple(problem.job_ids))
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = steps / (float(hints["basis_rho"]) * isolated_finish - started)
        ratio = rate / np.where(index >= 0, old[np.maximum(index, 0)], np.nan)
    known = active & (index >= 0) & np.isfinite(ratio) & (ratio > 0)
    if not known.any():
        return False
    # every rate scaled alike (an arrival changes every job's isolated share by the same factor) keeps the
    # LP's optimal basis: what counts is how far each job's rate moved from the common factor
    same = known & (np.abs(ratio / np.median(ratio[known]) - 1.0) <= RATE_RTOL)
    return np.count_nonzero(active & ~same) <= MAX_CHANGED_FRACTION * np.count_nonzero(active)


class _Certified(Exception):
    """The search has an allocation within RHO_RTOL of a proven lower bound: stop."""


class FinishTimeFairness(Policy):
    """Themis's finish-time fairness (see the module docstring)."""
    name = "finish_time_fairness"
    options = {"method": "bisection", "heterogeneity_aware": True, "reference_gpu_type": None,
               "space_sharing": False}

    def allocate(self, problem: Problem, solver: ModelSolver, *, method: str = "bisection",
                 heterogeneity_aware: bool = True, reference_gpu_type: str | None = None,
                 space_sharing: bool = False) -> PolicyResult:
        if method not in METHODS:
            raise InvalidOptionError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
        if method != "bisection" and solver.backend != "cvxpy":
            raise InvalidOptionError(f"method={method!r} solves a second-order-cone program and needs "
                                     f"backend='cvxpy', got backend={solver.backend!r}; use "
                                     "method='bisection' with LP backends")
        if method == "conic_gavel" and space_sharing:
            raise InvalidOptionError("method='conic_gavel' writes Gavel's program without pairs; with "
                                     "space_sharing=True use method='conic' or 'bisection'")
        steps = steps_remaining(problem, self.name)
        active = steps > 0
        throughputs = policy_throughputs(problem, active, heterogeneity_aware=heterogeneity_aware,
                                         reference_gpu_type=reference_gpu_type, space_sharing=space_sharing)
        if not active.any():
            return PolicyResult(np.zeros(problem.throughputs.shape), None,
                                message="Every job has finished (num_steps_remaining = 0): nothing to allocate.",
                                extras={"rho": np.full(problem.num_jobs, np.nan), "num_lp_solves": 0})
        zeros = np.zeros(problem.num_jobs)
        started = problem.time_since_start if problem.time_since_start is not None else zeros
        isolated_time = problem.time_isolated if problem.time_isolated is not None else zeros
        with np.errstate(divide="ignore", invalid="ignore"):
            # D_i in seconds (nan for finished jobs, whose isolated throughput may be 0)
            isolated_finish = np.where(active, isolated_time + steps / isolated_throughputs(problem, throughputs),
                                       np.nan)
        if method == "conic_gavel":
            return self._conic_gavel(problem, solver, steps, started, isolated_finish, throughputs)
        if method == "conic":
            return self._conic(problem, solver, steps, started, isolated_finish, throughputs, space_sharing)
        return self._bisection(problem, solver, steps, started, isolated_finish, throughputs, space_sharing)

    @staticmethod
    def _rho(steps: np.ndarray, started: np.ndarray, isolated_finish: np.ndarray, e: np.ndarray) -> np.ndarray:
        """``rho_i`` of each job at effective throughputs ``e`` (nan for finished jobs)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(steps > 0, (started + steps / e) / isolated_finish, np.nan)

    def _bisection(self, problem: Problem, solver: ModelSolver, steps: np.ndarray, started: np.ndarray,
                   isolated_finish: np.ndarray, throughputs: np.ndarray | None,
                   space_sharing: bool) -> PolicyResult:
        active = steps > 0
        seen: list[tuple[float, np.ndarray, np.ndarray | None, np.ndarray]] = []  # (max rho, X, P, e) per LP
        solutions: list[Solution] = []
        hints = solver.warm_start.hints if solver.warm_start is not None else {}
        starts: list[tuple[float, WarmStart | None]] = []  # (rho, the basis an LP there ended with)
        slopes: dict[float, float] = {}  # d theta / d rho at the rho of each LP, from its duals
        proven: list[float] = []  # rho below the optimum, proven by an LP's duals (dual_lower_bound)
        if "rho" in hints and not space_sharing:
            kept = self._previous_if_optimal(problem, solver, steps, started, isolated_finish, throughputs)
            if kept is not None:
                return kept
        # every LP of the search has the same rows: built once, each rho rescales them
        lp = SpeedupLP(problem, active, name=self.name, throughputs=throughputs, space_sharing=space_sharing)
        chain_rtol = CHAIN_RTOL if lp.compiled.num_cols >= IPM_MIN_COLUMNS else np.inf

        def theta(rate: np.ndarray, rho: float | None = None) -> float:
            """``max_X min_i e_i / rate_i`` over the jobs with ``rate_i > 0`` (rates in steps/s); the LP
            starts from the basis of the earlier LP nearest in ``rho`` when within ``chain_rtol``, else cold."""
            start = None
            if rho is not None and starts:
                near, warm = min(starts, key=lambda item: abs(item[0] - rho))
                start = (warm if abs(near - rho) <= chain_rtol * rho else None, problem.job_ids)
            X, P, e, solution = max_speedup(problem, solver, rate, name=self.name, throughputs=throughputs,
                                            space_sharing=space_sharing, start_from=start, lp=lp)
            seen.append((float(np.nanmax(self._rho(steps, started, isolated_finish, e))), X, P, e))
            solutions.append(solution)
            if rho is not None and solution.basis_reader is not None:
                starts.insert(0, (rho, solver.warm_start_out()))  # first: ties go to this problem's LPs
                solver.hints["basis_rho"] = rho  # where the basis the next solve starts from was optimal
                solver.hints["basis_rates"] = tuple(rate.tolist())  # its rates (steps/s), by problem.job_ids
            finish = solution.duals.get("finish")
            if rho is not None and finish is not None and solution.objective is not None:
                # d theta / d rho from the duals: a rate scaled by (1 + eps) moves theta by theta * dual * eps
                # (dual <= 0, d objective / d lower bound of the scaled row), and d ln rate_i / d rho =
                # -D_i / (rho D_i - t_i); exact where theta is linear, which it is near the root
                jobs = np.flatnonzero(rate > 0)
                slopes[rho] = -solution.objective * float(
                    (finish * isolated_finish[jobs] / (rho * isolated_finish[jobs] - started[jobs])).sum())
                if solution.status is Status.OPTIMAL:
                    bound = dual_lower_bound(-finish, rho, solution.objective, isolated_finish[jobs], started[jobs])
                    if bound is not None:
                        proven.append(bound)
            return solution.objective

        if not started[active].any():  # rho = 1 / theta at the constant rates r_i / D_i
            theta(np.where(active, steps / np.where(active, isolated_finish, 1.0), 0.0))
        else:
            lower = float(np.max(started[active] / isolated_finish[active]))
            # the isolated share is feasible: its rho bounds the optimum from above
            upper = float(np.nanmax(self._rho(steps, started, isolated_finish,
                                              isolated_throughputs(problem, throughputs))))
            values = {lower: -1.0}  # theta(lower) = 0: some job would need infinite throughput

            def excess(rho: float) -> float:
                if rho not in values:
                    with np.errstate(divide="ignore"):
                        rate = np.where(active, steps / (rho * isolated_finish - started), 0.0)
                    values[rho] = theta(rate, rho) - 1.0
                    # certified: an LP below 1 proves rho* > rho, and so does an LP's dual bound; an
                    # allocation attains its rho, an upper bound
                    below = max(max(r for r, v in values.items() if v < 0.0), max(proven, default=lower))
                    best = min(item[0] for item in seen)
                    if best - below <= RHO_RTOL * best:
                        raise _Certified
                return values[rho]

            try:
                if "rho" in hints:
                    # the previous optimum, or where it sat between its bounds when these moved past it;
                    # the LP there starts from the previous allocation's last basis (theta near 1 in both)
                    guess = hints["rho"]
                    if not lower < guess < upper:
                        guess = lower + min(max(hints.get("position", 1.0), 0.0), 1.0) * (upper - lower)
                    elif "basis_rho" in hints and lower < hints["basis_rho"] < upper:
                        # where the previous basis was optimal: a few pivots there, and when that LP was
                        # far from the optimum (one LP's bounds certified it), its bounds may certify again
                        guess = hints["basis_rho"]
                    near = previous_basis_near(problem, solver.warm_start, steps, started, isolated_finish)
                    starts.append((guess, solver.warm_start if near else None))

                    def bracket() -> tuple[float, float]:
                        """The optimum's proven range so far: (largest lower bound, least attained rho)."""
                        below = max(max(r for r, v in values.items() if v < 0.0), max(proven, default=lower))
                        return below, min(item[0] for item in seen)

                    self._search_near(excess, values, slopes, guess, lower, upper, hints.get("slope"), bracket)
                low = max(r for r, v in values.items() if v < 0.0)
                high = min((r for r, v in values.items() if v > 0.0), default=upper)
                if excess(high) > 0.0:
                    _brentq(excess, low, high, xtol=1e-15 * high, rtol=RHO_RTOL)
            except _Certified:
                pass
            best = min(item[0] for item in seen)
            near = sorted((r for r in values if r != lower), key=lambda r: abs(r - best))[:2]
            if len(near) == 2 and near[0] != near[1]:
                solver.hints["slope"] = (values[near[0]] - values[near[1]]) / (near[0] - near[1])
            if upper > lower:
                solver.hints["position"] = (best - lower) / (upper - lower)
        rho, X, P, e = min(seen, key=lambda item: item[0])
        solver.hints["rho"] = rho
        failed = [s for s in solutions if s.status is not Status.OPTIMAL]
        status, message = ((failed[0].status, failed[0].message) if failed else
                           (Status.OPTIMAL, f"Optimal solution found ({len(solutions)} LP solve(s), rho to a "
                                            f"relative tolerance of {RHO_RTOL:g})."))
        return PolicyResult(X, rho, status, P, message, {"rho": self._rho(steps, started, isolated_finish, e),
                                                         "num_lp_solves": len(solutions)})

    def _previous_if_optimal(self, problem: Problem, solver: ModelSolver, steps: np.ndarray, started: np.ndarray,
                             isolated_finish: np.ndarray, throughputs: np.ndarray | None) -> PolicyResult | None:
        """The warm start's allocation when it still attains the bound every job's fastest type sets
        (:func:`~allocopt.formulations.makespan.previous_if_optimal`), with no LP; else None."""
        with np.errstate(divide="ignore", invalid="ignore"):
            kept = previous_if_optimal(problem, solver, problem.throughputs if throughputs is None else throughputs,
                                       steps, lambda e: self._rho(steps, started, isolated_finish, e),
                                       lambda rho: steps / (rho * isolated_finish - started))
        if kept is None:
            return None
        X, attained, rho = kept
        solver.hints.update(solver.warm_start.hints)
        solver.hints["rho"] = attained
        return PolicyResult(X, attained, Status.OPTIMAL, None,
                            "Optimal solution found (the previous allocation still attains the bound every job's "
                            "fastest GPU type sets: no LP solved).", {"rho": rho, "num_lp_solves": 0})

    @staticmethod
    def _search_near(excess: Callable[[float], float], values: dict[float, float], slopes: dict[float, float],
                     guess: float, lower: float, upper: float, slope: float | None,
                     bracket: Callable[[], tuple[float, float]]) -> None:
        """Bracket the root of ``excess`` near ``guess`` (a warm start's rho), each LP a few pivots
        from the one before: a Newton step with the slope (d theta / d rho) the LP's duals give, else
        the previous solve's ``slope``, else a probe 0.1% away, then secant steps; at most
        SEARCH_STEPS + 1 LPs. A step that leaves the proven range ``bracket()`` (the LPs' dual
        bounds below, the least rho an allocation attains above) goes to the least attained rho
        instead (Dinkelbach's step: the optimum lies between). The caller's Brent search takes the
        bracket found, else the whole range."""

        def bracketed() -> bool:
            return (any(v < 0.0 for r, v in values.items() if r != lower)
                    and any(v > 0.0 for v in values.values()))

        x0 = guess
        f0 = excess(x0)
        slope = slopes.get(x0, slope)
        if slope is not None and slope > 0.0:
            x1 = x0 - f0 / slope
        else:
            x1 = x0 * (1.0 + 1e-3 if f0 < 0.0 else 1.0 - 1e-3)
        for _ in range(SEARCH_STEPS):
            low, high = bracket()
            if not low < x1 < high:
                x1 = high
            # a hair below the estimate: theta is linear near the root, so the LP there lands just under
            # 1, and its allocation attains a rho within the tolerance of that lower bound (certified)
            x1 = min(max(x1 * (1.0 - 1e-3 * RHO_RTOL), 0.5 * (lower + x0)), upper)
            if x1 == x0:
                return
            f1 = excess(x1)
            if bracketed() or f1 == f0:
                return
            x0, f0, x1 = x1, f1, x1 - f1 * (x1 - x0) / (f1 - f0)

    def _conic_gavel(self, problem: Problem, solver: ModelSolver, steps: np.ndarray, started: np.ndarray,
                     isolated_finish: np.ndarray, throughputs: np.ndarray | None) -> PolicyResult:
        """``method="conic_gavel"``: the program as Gavel's cvxpy code writes it
        (:mod:`allocopt.formulations.gavel_programs`)."""
        CvxpyBackend.check_installed()
        import cvxpy as cp

        rows = np.flatnonzero(steps > 0)
        planned = problem.throughputs if throughputs is None else throughputs

        def objective(x: Any, columns: np.ndarray) -> Any:
            T = planned[np.ix_(rows, columns)]
            ratios = [(float(started[i]) + float(steps[i]) * cp.inv_pos(cp.sum(cp.multiply(T[k], x[k]))))
                      / float(isolated_finish[i]) for k, i in enumerate(rows.tolist())]
            return cp.Minimize(ratios[0] if len(ratios) == 1 else cp.maximum(*ratios))

        X, status, message = solve_gavel_program(problem, solver, rows, planned, objective,
                                                 f"{self.name} (conic_gavel)")
        rhos = self._rho(steps, started, isolated_finish, (planned * X).sum(axis=1))
        return PolicyResult(X, float(np.nanmax(rhos)), status, None, message, {"rho": rhos, "num_lp_solves": 0})

    def _conic(self, problem: Problem, solver: ModelSolver, steps: np.ndarray, started: np.ndarray,
               isolated_finish: np.ndarray, throughputs: np.ndarray | None, space_sharing: bool) -> PolicyResult:
        CvxpyBackend.check_installed()
        import cvxpy as cp

        active = steps > 0
        options = dict(solver.options.solver_options)
        name = options.pop("solver", DEFAULT_CONIC_SOLVER)
        require_solver(name)
        t0 = time.perf_counter()
        base, e = planning_model(problem, active, name=self.name, throughputs=throughputs,
                                 space_sharing=space_sharing)
        model = base.model.compile()
        t1 = time.perf_counter()
        x = cp.Variable(model.num_cols, bounds=[model.col_lb, model.col_ub])
        rho = cp.Variable()
        has_ub, has_lb = np.isfinite(model.row_ub), np.isfinite(model.row_lb)
        E = e.A.take_rows(np.flatnonzero(active)).to_scipy()
        finish = (cp.multiply(steps[active] / isolated_finish[active],
                              cp.inv_pos(E @ x[:E.shape[1]] + e.const[active]))
                  + started[active] / isolated_finish[active])
        rows = [model.A[has_ub] @ x <= model.row_ub[has_ub]] if has_ub.any() else []
        rows += [model.A[has_lb] @ x >= model.row_lb[has_lb]] if has_lb.any() else []
        program = cp.Problem(cp.Minimize(rho), [*rows, finish <= rho])
        solver_opts = CvxpyBackend.solver_options_for(name, solver.options, options)
        t2 = time.perf_counter()
        native, status, message = solve_program(program, name, solver.options.verbose, solver_opts)
        t3 = time.perf_counter()
        values = {}
        if x.value is not None:
            values = {block: x.value[cols].reshape(shape) for block, (cols, shape) in model.variables.items()}
        solution = solver.check(solver.record(Solution(
            status=status, message=message,
            objective=None if rho.value is None else float(rho.value), x=x.value, backend="cvxpy",
            raw_status=f"{native} ({name})", build_seconds=t2 - t1, solve_seconds=t3 - t2, values=values),
            model_build_s=t1 - t0), f"{self.name} (conic)")
        X, P = base.matrices(solution)
        rhos = self._rho(steps, started, isolated_finish, evaluate(e, base, X, P))
        return PolicyResult(X, float(np.nanmax(rhos)), solution.status, P, solution.message,
                            {"rho": rhos, "num_lp_solves": 0})


def _brentq(*args: Any, **kwargs: Any) -> float:
    """:func:`scipy.optimize.brentq`, imported on first use (scipy.optimize costs a cold start 0.1 s)."""
    from scipy.optimize import brentq

    return brentq(*args, **kwargs)
