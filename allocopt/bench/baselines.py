"""Each benchmarked policy written the straightforward way in cvxpy, as the published
implementations (Gavel, Sia) write it: one expression tree per model, solved by
cvxpy with HiGHS (finish-time fairness is a cone program: CLARABEL).

Every function takes the same :class:`~allocopt.Problem` (or
:class:`~allocopt.GoodputProblem`) allocopt solves, the policy options of the
instance, a time limit in seconds and a number of runs, and returns a
:class:`~allocopt.bench.timing.Measurement` whose ``objective`` is in the
policy's own units, so it can be compared with ``Allocation.objective``, and
times that are medians over the runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from allocopt.bench.timing import Measurement, time_cvxpy
from allocopt.formulations.makespan import isolated_throughputs
from allocopt.formulations.max_min_fairness import normalized_coefficients
from allocopt.formulations.sia import (
    useful_entries,
    utility_coefficients,
    valid_entries,
)
from allocopt.goodput_problem import GoodputProblem
from allocopt.problem import Problem


def _gavel_base(cp: Any, problem: Problem, x: Any) -> list[Any]:
    """Gavel's base constraints: time fractions in [0, 1] per job, GPUs per type, 0 where a job cannot run."""
    k = problem.cluster.num_gpu_types
    scale_factors_array = np.repeat(problem.scale_factors.astype(np.float64)[:, None], k, axis=1)
    constraints = [x >= 0, cp.sum(x, axis=1) <= 1,
                   cp.sum(cp.multiply(scale_factors_array, x), axis=0) <= problem.capacity.astype(np.float64)]
    rows, cols = np.nonzero(~problem.runnable)
    if rows.size:
        constraints.append(x[rows, cols] == 0)
    return constraints


def max_min_fairness(problem: Problem, options: dict[str, Any], time_limit_s: float | None,
                     repeat: int = 1) -> Measurement:
    """Gavel's ``max_min_fairness_perf``: ``max min_i sum_j coef_ij x_ij``, ``coef = s_i T_ij / (w_i p_i)``."""
    import cvxpy as cp

    def build() -> tuple[Any, Any]:
        x = cp.Variable(problem.throughputs.shape)
        coef = normalized_coefficients(problem)
        objective = cp.Maximize(cp.min(cp.sum(cp.multiply(coef, x), axis=1)))
        return cp.Problem(objective, _gavel_base(cp, problem, x)), x

    return time_cvxpy(build, time_limit_s=time_limit_s, repeat=repeat)


def max_throughput(problem: Problem, options: dict[str, Any], time_limit_s: float | None,
                   repeat: int = 1) -> Measurement:
    """Gavel's ``max_sum_throughput_perf``: ``max sum_ij T_ij x_ij``."""
    import cvxpy as cp

    def build() -> tuple[Any, Any]:
        x = cp.Variable(problem.throughputs.shape)
        objective = cp.Maximize(cp.sum(cp.multiply(problem.throughputs, x)))
        return cp.Problem(objective, _gavel_base(cp, problem, x)), x

    return time_cvxpy(build, time_limit_s=time_limit_s, repeat=repeat)


def min_makespan(problem: Problem, options: dict[str, Any], time_limit_s: float | None,
                 repeat: int = 1) -> Measurement:
    """Minimum makespan as one LP, ``max theta`` s.t. ``sum_j T_ij x_ij >= (r_i / M_0) theta``; makespan
    ``M_0 / theta``. ``M_0``, the isolated share's makespan, keeps the rows in steps/s as Gavel's bisection
    over ``M`` does (unscaled, ``theta = 1 / M`` is about 1e-6 and below HiGHS's absolute tolerances)."""
    import cvxpy as cp

    steps = problem.num_steps_remaining
    active = steps > 0
    isolated_makespan = float(np.max(steps[active] / isolated_throughputs(problem, None)[active]))

    def build() -> tuple[Any, Any]:
        x, theta = cp.Variable(problem.throughputs.shape), cp.Variable()
        e = cp.sum(cp.multiply(problem.throughputs, x), axis=1)
        constraints = _gavel_base(cp, problem, x) + [e[active] >= steps[active] / isolated_makespan * theta]
        return cp.Problem(cp.Maximize(theta), constraints), x

    return time_cvxpy(build, time_limit_s=time_limit_s, objective=lambda theta: isolated_makespan / float(theta),
                      repeat=repeat)


def finish_time_fairness(problem: Problem, options: dict[str, Any], time_limit_s: float | None,
                         repeat: int = 1) -> Measurement:
    """Gavel's ``finish_time_fairness_perf``: ``min max_i (t_i + r_i / e_i) / D_i`` with ``inv_pos``, a
    second-order-cone program (Gavel: ECOS; here CLARABEL, cvxpy's default conic solver)."""
    import cvxpy as cp

    steps = problem.num_steps_remaining
    active = steps > 0
    started = problem.time_since_start if problem.time_since_start is not None else np.zeros(problem.num_jobs)
    done = problem.time_isolated if problem.time_isolated is not None else np.zeros(problem.num_jobs)
    isolated_finish = done + steps / isolated_throughputs(problem, None)  # D_i in seconds

    def build() -> tuple[Any, Any]:
        x = cp.Variable(problem.throughputs.shape)
        e = cp.sum(cp.multiply(problem.throughputs[active], x[active]), axis=1)
        rho = cp.multiply(1.0 / isolated_finish[active], started[active] + cp.multiply(steps[active], cp.inv_pos(e)))
        return cp.Problem(cp.Minimize(cp.max(rho)), _gavel_base(cp, problem, x)), x

    return time_cvxpy(build, solver="CLARABEL", time_limit_s=time_limit_s, repeat=repeat)


def max_min_fairness_space_sharing(problem: Problem, options: dict[str, Any],
                                   time_limit_s: float | None, repeat: int = 1) -> Measurement:
    """Gavel's ``MaxMinFairnessPolicyWithPacking``: a variable over every combination (each job alone,
    then each pair) and GPU type, one objective term per job over the combinations that contain it
    (Gavel's per-job loop), normalized by ``s_i / (w_i p_i)`` as allocopt does."""
    import cvxpy as cp

    n, k = problem.num_jobs, problem.cluster.num_gpu_types
    pairs, PT = problem.pairs, problem.pair_throughput_array
    scale = problem.scale_factors / (problem.priority_weights * problem.proportional_throughputs)

    def build() -> tuple[Any, Any]:
        relevant: list[list[int]] = [[i] for i in range(n)]
        steps: list[list[np.ndarray]] = [[problem.throughputs[i]] for i in range(n)]
        for p, (a, b) in enumerate(pairs.tolist()):  # Gavel's per-combination bookkeeping
            relevant[a].append(n + p)
            relevant[b].append(n + p)
            steps[a].append(PT[p, :, 0])
            steps[b].append(PT[p, :, 1])
        sf = np.concatenate([problem.scale_factors, problem.scale_factors[pairs[:, 0]]]).astype(np.float64)
        x = cp.Variable((n + pairs.shape[0], k))
        terms = [cp.sum(cp.multiply(np.array(steps[i]) * scale[i], x[relevant[i]])) for i in range(n)]
        constraints = [x >= 0, cp.sum(cp.multiply(np.repeat(sf[:, None], k, axis=1), x), axis=0)
                       <= problem.capacity.astype(np.float64),
                       cp.vstack([cp.sum(x[relevant[i]]) for i in range(n)]) <= 1]
        rows, cols = np.nonzero(~np.concatenate([problem.runnable, PT.sum(axis=2) > 0]))
        if rows.size:
            constraints.append(x[rows, cols] == 0)
        return cp.Problem(cp.Maximize(cp.minimum(*terms)), constraints), x

    return time_cvxpy(build, time_limit_s=time_limit_s, repeat=repeat)


def sia(problem: GoodputProblem, options: dict[str, Any], time_limit_s: float | None, repeat: int = 1,
        *, highs_defaults: bool = False) -> Measurement:
    """Sia's configuration MILP (one binary per useful job x configuration, the same entries and
    coefficients as :mod:`allocopt.formulations.sia`) as a cvxpy expression tree, solved by HiGHS with
    the options allocopt's sia passes (presolve off), or HiGHS's defaults with ``highs_defaults``."""
    import cvxpy as cp
    import scipy.sparse as sp

    p, lambda_n, lambda_a = options.get("p", -0.5), options.get("lambda_n", 1.1), options.get("lambda_a", 0.0)

    def build() -> tuple[Any, Any]:
        rows, cols = valid_entries(problem)
        coef, offset = utility_coefficients(problem, rows, cols, p, lambda_n, lambda_a)
        keep = useful_entries(problem, rows, cols, coef if p < 0 else -coef)
        rows, cols, coef = rows[keep], cols[keep], coef[keep]
        m, configs = rows.size, problem.configurations
        per_job = sp.csr_matrix((np.ones(m), (rows, np.arange(m))), shape=(problem.num_jobs, m))
        gpus = sp.csr_matrix((configs.num_gpus[cols].astype(np.float64), (configs.gpu_type[cols], np.arange(m))),
                             shape=(problem.cluster.num_gpu_types, m))
        x = cp.Variable(m, boolean=True)
        constraints = [per_job @ x <= 1, gpus @ x <= problem.cluster.capacity.astype(np.float64)]
        pinned = np.flatnonzero(problem.pinned[rows] & (cols == problem.previous[rows]))
        if pinned.size:
            constraints.append(x[pinned] == 1)
        objective = coef @ x + offset
        return cp.Problem(cp.Minimize(objective) if p < 0 else cp.Maximize(objective), constraints), x

    return time_cvxpy(build, solver_opts={} if highs_defaults else {"presolve": "off"}, time_limit_s=time_limit_s,
                      repeat=repeat)


# ----- water-filling ------------------------------------------------------------------------
GAVEL_SLACK = 1.0001  # Gavel's _get_bottleneck_jobs(slack=1.0001)
GAVEL_EPSILON = 1e-5  # Gavel's epsilon, here relative to each job's level


class GavelWaterFilling:
    """Gavel's ``WaterFillingAlgorithm`` (a max-min LP, then a bottleneck MILP per iteration, with priority
    reweighting per entity), vectorized in cvxpy; both models built once with Parameters, as Gavel does.

    Units as in Gavel: ``g_i = e_i / p_i``; job ``i`` of current weight ``w_i`` rises by ``w_i c / s_i``
    per iteration, ``c`` the LP's max-min value (the first one is the first water level, which
    water_filling reports as its objective). Two departures, both needed for a like-for-like run: FIFO
    order within an entity is by ``time_since_start`` (Gavel sorts job ids), and the MILP's epsilon is
    relative (``1e-5 * level``): Gavel's absolute ``1e-5`` makes the MILP infeasible whenever a level is
    below 0.1, and the published code then freezes every active job at once.
    """

    def __init__(self, problem: Problem, policies: dict[str, str], solver: str = "HIGHS"):
        import cvxpy as cp

        self.cp, self.solver = cp, solver
        self.problem = problem
        m, k = problem.throughputs.shape
        self.s = problem.scale_factors.astype(np.float64)
        rate = problem.throughputs / problem.proportional_throughputs[:, None]
        self.M = float(np.max(rate * self.s[:, None]))  # Gavel's self._M
        if problem.entities is None:  # as allocopt: each job its own entity, of the job's weight
            self.entity, self.entity_weights = np.arange(m), problem.priority_weights
            self.fifo = np.zeros(m, dtype=bool)
        else:
            self.entity, self.entity_weights = problem.entities, problem.entity_weights
            self.fifo = np.array([policies.get(e, "fairness") == "fifo" for e in problem.entity_ids])[self.entity]
        self.age_rank = np.empty(m, dtype=np.int64)
        since = np.zeros(m) if problem.time_since_start is None else problem.time_since_start
        self.age_rank[np.lexsort((np.arange(m), -since))] = np.arange(m)

        def base(x: Any) -> list[Any]:
            return [x >= 0, cp.sum(x, axis=1) <= 1, self.s @ x <= problem.capacity]

        x, c = cp.Variable((m, k)), cp.Variable()
        g = cp.sum(cp.multiply(rate, x), axis=1)
        self.mult, self.mult_so_far, self.add = cp.Parameter(m, nonneg=True), cp.Parameter(m), cp.Parameter(m)
        self.lb = cp.Parameter(m)
        self.lp = cp.Problem(cp.Maximize(c), base(x) + [g >= self.lb, c <= cp.multiply(self.mult, g)
                                                        - self.mult_so_far + self.add])
        self.x, self.c = x, c
        x2, z = cp.Variable((m, k)), cp.Variable(m, boolean=True)
        g2 = cp.sum(cp.multiply(rate, x2), axis=1)
        self.slack_so_far, self.eps, self.lb2 = cp.Parameter(m), cp.Parameter(m), cp.Parameter(m)
        self.mask = cp.Parameter(m, nonneg=True)
        self.milp = cp.Problem(cp.Maximize(cp.sum(z)), base(x2) + [
            self.M * z >= g2 - self.slack_so_far + self.eps, self.M * (1 - z) >= self.slack_so_far - g2,
            g2 >= self.lb2, cp.multiply(self.mask, z) == 0])
        self.z = z

    def weights(self, frozen: np.ndarray) -> np.ndarray:
        """Gavel's _compute_priority_weights: fairness splits the entity weight by job weight over
        unfrozen jobs; fifo gives it all to the oldest unfrozen job."""
        p, e, active, n_entities = self.problem, self.entity, ~frozen, self.entity_weights.size
        total = np.bincount(e[active], p.priority_weights[active], minlength=n_entities)
        fair = np.where(active, self.entity_weights[e] * p.priority_weights / np.where(total > 0, total, 1)[e], 0)
        oldest = np.full(n_entities, e.size)
        np.minimum.at(oldest, e[active], self.age_rank[active])
        first = active & (self.age_rank == oldest[e])
        return np.where(self.fifo, np.where(first, self.entity_weights[e], 0.0), fair)

    def _solve(self, problem: Any, remaining_s: float) -> bool:
        try:
            problem.solve(solver=self.solver, time_limit=max(remaining_s, 1.0))
        except self.cp.error.SolverError:
            return False
        return problem.status == "optimal"

    def run(self, time_limit_s: float | None = None) -> Measurement:
        """Water-fill until every job is frozen or ``time_limit_s`` passes (then ``status`` is
        ``timeout`` and ``total_s`` a lower bound). ``values``: (allocation, iterations, LPs, MILPs)."""
        limit = np.inf if time_limit_s is None else time_limit_s
        t0 = time.perf_counter()
        m = self.problem.num_jobs
        frozen, final, so_far = np.zeros(m, dtype=bool), np.zeros(m), np.zeros(m)
        iterations, lps, milps, finished, x, first = 0, 0, 0, False, None, None
        while time.perf_counter() - t0 < limit:
            w = self.weights(frozen)
            positive = ~frozen & (w > 0)
            mult = np.where(positive, self.s / np.where(positive, w, 1.0), 0.0)
            self.mult.value, self.mult_so_far.value = mult, mult * so_far
            self.add.value = np.where(positive, 0.0, self.M)
            self.lb.value = np.where(frozen, final, so_far)
            lps += 1
            if not self._solve(self.lp, limit - (time.perf_counter() - t0)):
                break  # Gavel: except -> keep the old x and stop
            x, c = self.x.value, float(self.c.value)
            first = c if first is None else first
            so_far = so_far + np.where(positive, c / mult.clip(min=1e-300), 0.0)
            self.slack_so_far.value, self.eps.value = GAVEL_SLACK * so_far, GAVEL_EPSILON * so_far
            self.lb2.value = np.where(frozen, final, so_far)
            self.mask.value = (frozen | ~positive).astype(np.float64)
            milps += 1
            solved = self._solve(self.milp, limit - (time.perf_counter() - t0))
            if time.perf_counter() - t0 >= limit:
                break
            z = self.z.value if solved else np.zeros(m)  # Gavel: except -> no job can rise
            iterations += 1
            newly = positive & (z < 0.5)
            final[newly] = so_far[newly]
            frozen |= newly
            if not newly.any() or frozen.all():
                finished = True
                break
        seconds = time.perf_counter() - t0
        X = np.zeros_like(self.problem.throughputs) if x is None else np.clip(x, 0.0, 1.0)
        status = "ok" if finished else f"timeout: over {time_limit_s:g} s ({iterations} iterations done)"
        return Measurement(status=status, total_s=seconds, objective=first, num_solves=lps + milps,
                           runs=[seconds], values=(X, iterations, lps, milps))


def water_filling(problem: Problem, options: dict[str, Any], time_limit_s: float | None,
                  repeat: int = 1) -> Measurement:
    """Gavel's LP + MILP water-filling (:class:`GavelWaterFilling`) with HiGHS; the median of ``repeat`` runs."""
    algorithm = GavelWaterFilling(problem, dict(options.get("entity_policies") or {}))
    runs = [algorithm.run(time_limit_s)]
    while runs[-1].ok and len(runs) < repeat:
        runs.append(algorithm.run(time_limit_s))
    if not runs[-1].ok:
        return runs[-1]
    median = sorted(runs, key=lambda m: m.total_s)[len(runs) // 2]
    median.runs = [m.total_s for m in runs]
    return median


#: The baseline of each benchmarked policy, by the suite's policy name.
BASELINES: dict[str, Callable[[Any, dict[str, Any], float | None, int], Measurement]] = {
    "max_min_fairness": max_min_fairness, "max_throughput": max_throughput, "min_makespan": min_makespan,
    "finish_time_fairness": finish_time_fairness, "water_filling": water_filling,
    "mmf_space_sharing": max_min_fairness_space_sharing, "sia": sia}
