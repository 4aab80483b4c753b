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

The MILP is solved through its relaxation first (``relaxation_first=True``,
:func:`_solve_by_prices`): GPU prices that maximize the Lagrangian bound (the
LP relaxation's optimum) come from cutting planes over the ``k`` types, and
Lagrangian fixing against that bound leaves a MILP over the few entries
within the optimality gap, solved to zero gap (or the caller's ``mip_gap``).
The result is the whole MILP's optimum, proven, and ``extras["mip_gap"]`` is
the gap actually proven (0 unless ``mip_gap`` was given). 5,120 jobs x 29
configurations: about 0.1 s against 2-4 s for the whole MILP at HiGHS's
default 1e-4 relative gap, whose answer can be up to that gap worse.

Exact reductions keep the model small without changing its optimum: a pinned
job keeps only its previous entry, and of the other entries only those that
improve the objective and beat every entry of the same job and GPU type with
no more GPUs are built. With ``backend="highs"`` (and ``scipy``) HiGHS
presolve is turned off unless ``solver_options`` sets it: it removes nothing here and its setup grows
superlinearly (about 50 s of a 65 s solve at 5,120 jobs x 29 configurations,
against 3 s without it).
"""

from __future__ import annotations


from dataclasses import replace
from typing import Any

import numpy as np
import scipy.sparse as sp

from allocopt.allocation import Timings
from allocopt.backends import solve_model
from allocopt.errors import InfeasibleError, InvalidOptionError
from allocopt.formulations.base import ModelSolver, Policy, PolicyResult
from allocopt.formulations.cutting_planes import CuttingPlaneModel, box_step_minimize
from allocopt.goodput_problem import ConfigurationAllocation, GoodputProblem
from allocopt.model import Model
from allocopt.solution import Solution, Status

ROUNDOFF = 1e-9  # margin of the fixing tests, relative to the bound (keeps more entries, never fewer)
FIRST_DELTA = 1e-6  # first regret threshold of the fixing, relative to the bound
WHOLE_FRACTION = 0.5  # when fixing leaves more than this fraction of the entries, the whole MILP is solved
MAX_STATE_WORK = 100_000_000  # dynamic programming: states times entries at most (4 bytes each: 400 MB)
PRICE_RTOL = 1e-10  # the price search stops when its cutting planes promise less, relative to the bound
MAX_PRICE_EVALUATIONS = 200


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
    utility_decimals : int, optional
        Round each utility ``U = G ** p`` to this many decimals before it
        enters the objective, as Sia's published code does (2). Off by default:
        rounding creates ties between configurations (and between jobs) that
        are then broken by the solver, so the answer is only optimal for the
        rounded objective. Opt in to reproduce Sia's rounds.
    utility_clip : float, optional
        Cap each utility at this value (Sia's ``sia_goodput_clip_val``, 3000);
        applied after ``utility_decimals``. Off by default.
    prefer_later : bool, default False
        Among configurations of equal utility, prefer the later one in the
        problem's configuration order (more GPUs of a type, a later type), as
        Sia's published code does in effect (its CBC solve returns the later of
        tied columns). Done by a perturbation that totals at most a tenth of a
        rounding step (``10 ** -utility_decimals``, else 1e-6), so it only
        decides ties. Without it, ties go to fewer GPUs of a type.
    relaxation_first : bool, default True
        Price the GPU types first and solve the MILP only over the entries
        Lagrangian fixing leaves free (:func:`_solve_by_prices`), to zero gap
        unless ``mip_gap`` is given; False solves the whole MILP (at the
        backend's default gap unless ``mip_gap`` is given). ``extras["mip_gap"]``
        is the relative gap proven either way.
    """

    name = "sia"
    options = {"p": -0.5, "lambda_n": 1.1, "lambda_a": 0.0, "utility_decimals": None, "utility_clip": None,
               "prefer_later": False, "relaxation_first": True, "dynamic_programming": False}
    problem_type = GoodputProblem

    def allocate(self, problem: GoodputProblem, solver: ModelSolver, *, p: float = -0.5, lambda_n: float = 1.1,
                 lambda_a: float = 0.0, utility_decimals: int | None = None, utility_clip: float | None = None,
                 prefer_later: bool = False, relaxation_first: bool = True,
                 dynamic_programming: bool = False) -> PolicyResult:
        p, lambda_n, lambda_a = _check_options(p, lambda_n, lambda_a)
        utility_decimals, utility_clip = _check_rounding(utility_decimals, utility_clip)
        n, C = problem.num_jobs, problem.num_configurations
        rows, cols = valid_entries(problem)
        coef, offset = utility_coefficients(problem, rows, cols, p, lambda_n, lambda_a, decimals=utility_decimals,
                                            clip=utility_clip, prefer_later=bool(prefer_later))
        _check_not_all_idle(problem, rows, coef, p, lambda_n, lambda_a)
        keep = useful_entries(problem, rows, cols, coef if p < 0 else -coef)
        rows, cols, coef = rows[keep], cols[keep], coef[keep]

        if dynamic_programming:
            if state_space(problem) * rows.size > MAX_STATE_WORK:
                raise InvalidOptionError(f"sia: dynamic programming would keep {state_space(problem):,} counts of "
                                         f"GPUs in use for each of {rows.size:,} entries; leave the technique to "
                                         "'auto' (or use 'relaxation_first') on a cluster this large")
            values, extras = _solve_by_states(problem, rows, cols, coef if p < 0 else -coef)
            status, message = Status.OPTIMAL, "Optimal solution found (dynamic programming over GPUs in use)."
        elif relaxation_first:
            values, solution, extras = _solve_by_prices(problem, rows, cols, coef if p < 0 else -coef, solver)
            extras["lp_bound"] = (extras["lp_bound"] if p < 0 else -extras["lp_bound"]) + offset
            status = Status.OPTIMAL if solution is None else solution.status
            message = "Optimal solution found." if solution is None else solution.message
        else:
            pinned = problem.pinned[rows].astype(np.float64)
            model = _reduced_model(rows, np.zeros(rows.size, dtype=bool), problem.configurations.gpu_type[cols],
                                   problem.configurations.num_gpus[cols].astype(np.float64),
                                   coef if p < 0 else -coef, problem.cluster.capacity.astype(np.float64),
                                   lb=pinned)
            solution = solver.solve(model, "sia", defaults=SOLVER_DEFAULTS)
            values, status, message = np.round(solution.values["x"]), solution.status, solution.message
            extras = {"milp_binaries": int(rows.size), "mip_gap": solution.mip_gap}
        chosen = np.zeros((n, C))
        chosen[rows, cols] = values
        return PolicyResult(chosen, float(coef @ values + offset), status, message=message, extras=extras)

    def to_allocation(self, problem: GoodputProblem, result: PolicyResult, *, backend: str | None,
                      timings: Timings) -> ConfigurationAllocation:
        """Decode ``x`` (values > 0.5 are chosen) into one configuration index per job, -1 for none."""
        return configuration_allocation(problem, result, self.name, backend=backend, timings=timings)


def configuration_allocation(problem: GoodputProblem, result: PolicyResult, policy: str, *, backend: str | None,
                             timings: Timings) -> ConfigurationAllocation:
    """A configuration policy's result (a jobs x configurations matrix, values > 0.5 chosen) as one
    configuration index per job, -1 for none."""
    chosen = result.matrix > 0.5
    configuration = np.where(chosen.any(axis=1), chosen.argmax(axis=1), -1).astype(np.int64)
    configuration.setflags(write=False)
    return ConfigurationAllocation(problem=problem, configuration=configuration, policy=policy, backend=backend,
                                   status=result.status, objective=result.objective, message=result.message,
                                   timings=timings, extras=result.extras)


def valid_entries(problem: GoodputProblem) -> tuple[np.ndarray, np.ndarray]:
    """Job and configuration of each valid pair, sorted by job, then GPU type, then GPU count."""
    configs = problem.configurations
    order = np.lexsort((configs.num_gpus, configs.gpu_type))
    rows, position = np.nonzero(problem.valid[:, order])
    return rows, order[position]


def utility_coefficients(problem: GoodputProblem, rows: np.ndarray, cols: np.ndarray, p: float,
                         lambda_n: float, lambda_a: float, *, decimals: int | None = None,
                         clip: float | None = None, prefer_later: bool = False) -> tuple[np.ndarray, float]:
    """Objective coefficient of each entry ``(rows[e], cols[e])`` of :func:`valid_entries`
    and the objective's constant, in the sense of ``p``.

    ``U = G ** p`` is rounded to ``decimals`` and capped at ``clip`` where they
    are given (Sia's published code: 2 and 3000); ``prefer_later`` moves each entry
    towards the improving side by ``eps * c`` (``c`` its configuration index),
    ``eps = step / (10 * n_jobs * n_configurations)`` with ``step`` the rounding
    step (1e-6 unrounded), so that ties go to later configurations and nothing else
    changes. Returns ``U - lambda_n``, moved by ``-sigma * lambda_a`` at each job's
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
    U = G ** p
    if decimals is not None:
        U = np.round(U, decimals)
    if clip is not None:
        U = np.minimum(U, clip)
    coef = U - lambda_n
    if prefer_later:
        step = 10.0 ** -decimals if decimals is not None else 1e-6
        coef -= sigma * step / (10.0 * max(1, problem.num_jobs) * problem.num_configurations) * cols
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


def _solve_by_prices(problem: GoodputProblem, rows: np.ndarray, cols: np.ndarray, cost: np.ndarray,
                     solver: ModelSolver) -> tuple[np.ndarray, Solution | None, dict[str, Any]]:
    """Solve Sia's MILP exactly by Lagrangian prices on the GPU types and fixing.

    In minimization form (``cost`` per entry, :func:`useful_entries` order),
    prices ``lam >= 0`` on the capacity rows give for every feasible ``x``::

        cost . x = L(lam) + sum_i (r_i(x) - m_i) + lam . (capacity - use(x)),
        r_e = cost_e + lam_t(e) g_e,  m_i = min(0, min_e r_e)  (pinned: its entry's r),
        L(lam) = sum_i m_i - lam . capacity,

    with every term of both sums ``>= 0`` (``r_i(x)`` is the ``r`` of job
    ``i``'s chosen entry, 0 when idle). So ``L(lam)`` is a lower bound for
    any prices, and a solution of value at most ``L + delta`` gives no job a
    regret ``r_e - m_i`` (or, idle, ``-m_i``) above ``delta``. The prices
    maximize ``L`` (the LP relaxation's bound) by box-step cutting planes over
    the ``k`` types (:func:`_maximize_bound`); then, for growing ``delta``, the
    MILP over the entries within ``delta`` (a job whose idle regret exceeds
    ``delta`` must be allocated) is solved to zero gap (or the caller's
    ``mip_gap``). If its optimum ``z`` is within ``L + delta`` it is the optimum
    of the whole MILP: any better point lies in the reduced one. The first
    ``delta`` is tiny (:data:`FIRST_DELTA`; often enough, and its MILP is
    small); after it ``delta`` is the gap of the best known point (that MILP
    or a greedy repair of the best responses, :func:`_greedy_incumbent`),
    which holds that point and so ends the loop: two MILPs at most. When fixing would keep more than :data:`WHOLE_FRACTION`
    of the entries the whole MILP is solved instead. Returns ``x`` (per entry), the last reduced
    MILP's Solution (None when fixing left nothing to solve) and extras.
    """
    k = problem.cluster.num_gpu_types
    configs = problem.configurations
    g = configs.num_gpus[cols].astype(np.float64)
    t = configs.gpu_type[cols]
    capacity = problem.cluster.capacity.astype(np.float64)
    pinned_entry = problem.pinned[rows]  # pinned jobs keep only their previous entry
    starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]]) if rows.size else np.zeros(0, dtype=np.int64)
    jobs = rows[starts]
    can_idle = ~problem.pinned[jobs]
    position = np.arange(rows.size)

    def lowest(lam: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        r = cost + lam[t] * g
        m = np.minimum.reduceat(r, starts) if rows.size else np.zeros(0)
        return r, np.where(can_idle, np.minimum(m, 0.0), m)

    def negative_bound(lam: np.ndarray) -> tuple[float, np.ndarray]:
        """``-L(lam)`` and a subgradient (``capacity - use`` of the best responses)."""
        r, m = lowest(lam)
        per_job = np.cumsum(np.r_[0, np.diff(rows) != 0]) if rows.size else rows
        first = np.minimum.reduceat(np.where(r <= m[per_job], position, rows.size), starts) if rows.size \
            else np.zeros(0, dtype=np.int64)
        chosen = first[(first < rows.size) & ((m < 0) | ~can_idle)]
        use = np.bincount(t[chosen], g[chosen], minlength=k)
        return float(lam @ capacity - m.sum()), capacity - use

    lam, evaluations = _maximize_bound(negative_bound, k, scale=float(np.abs(cost).max(initial=1.0)))
    # the price search is the relaxation's solve; when it settles every job, no backend call follows
    solver.num_solves += 1
    solver.backend_used = solver.backend_used or (solver.backend if solver.backend != "auto" else "highs")
    r, m = lowest(lam)
    bound = float(m.sum() - lam @ capacity)
    per_job = np.repeat(np.arange(starts.size), np.diff(np.r_[starts, rows.size]))
    regret = r - m[per_job]
    idle_regret = np.where(can_idle, -m, np.inf)  # pinned jobs cannot idle
    eps = ROUNDOFF * max(1.0, abs(bound))
    # a feasible point: fixing at its gap keeps it, so a reduced MILP at that threshold proves its optimum
    known_gap = float(cost @ _greedy_incumbent(per_job, t, g, cost, r, m, capacity, pinned_entry)) - bound
    delta = min(known_gap, FIRST_DELTA * max(1.0, abs(bound)))
    options = replace(solver.options, mip_gap=solver.options.mip_gap or 0.0)
    solves = 0
    while True:
        within = regret <= delta + eps
        forced = idle_regret[per_job] > delta + eps  # per entry: its job must be allocated
        if np.count_nonzero(within) > WHOLE_FRACTION * rows.size:  # fixing would not pay: solve it whole
            delta = np.inf
            within, forced = np.ones(rows.size, dtype=bool), np.zeros(rows.size, dtype=bool)
        whole = bool(within.all() and not np.any(idle_regret[can_idle] > delta + eps))
        count = np.bincount(per_job, within, minlength=starts.size)
        one = pinned_entry | (within & forced & (count[per_job] == 1))
        if np.any((count == 0) & (idle_regret > delta + eps)):
            delta = known_gap  # a job that must run has no entry within delta: no point that good
            continue
        free = np.flatnonzero(within & ~one)
        left = capacity - np.bincount(t[one], g[one], minlength=k)
        x = one.astype(np.float64)
        solution = None
        if np.any(left < -eps):
            feasible = False
        elif free.size:
            model = _reduced_model(per_job[free], forced[free], t[free], g[free], cost[free], left).compile()
            defaults = SOLVER_DEFAULTS if free.size > PRESOLVE_MAX_BINARIES else None
            solution = solver.record(solve_model(model, solver.backend, options, defaults))
            solves += 1
            feasible = solution.status not in (Status.INFEASIBLE, Status.INFEASIBLE_OR_UNBOUNDED)
            if feasible:
                solver.check(solution, "sia (the MILP over the entries the GPU prices leave undecided)")
                x[free] = np.round(solution.values["x"])
                if solution.status is not Status.OPTIMAL:  # best_effort: a time-limited incumbent
                    z = float(cost @ x)
                    break
        else:
            feasible = True
        if feasible:
            z = float(cost @ x)
            if whole or z - bound <= delta + eps:
                break
            known_gap = min(known_gap, z - bound)
            delta = known_gap  # a point lies within it, so the next reduced MILP proves its optimum
        elif whole:
            raise InfeasibleError("sia: no configuration assignment satisfies the capacity of every GPU type "
                                  "with the pinned jobs; unpin some of them", status=Status.INFEASIBLE)
        else:
            delta = known_gap
    gap = 0.0 if solution is None or solution.mip_gap is None else float(solution.mip_gap)
    extras = {"relaxation_integral": bool(z - bound <= eps), "lp_bound": bound, "gpu_prices": lam.tolist(),
              "price_evaluations": evaluations, "milp_binaries": int(free.size), "milp_solves": solves,
              "mip_gap": gap}
    return x, solution, extras


def state_space(problem: GoodputProblem) -> int:
    """The states :func:`_solve_by_states` keeps per job: every count of GPUs in use per type."""
    return int(np.prod(problem.cluster.capacity.astype(np.int64) + 1))


def _solve_by_states(problem: GoodputProblem, rows: np.ndarray, cols: np.ndarray, cost: np.ndarray
                     ) -> tuple[np.ndarray, dict[str, Any]]:
    """Sia's MILP exactly by dynamic programming over the GPUs in use of each type (a multiple-choice
    knapsack with one dimension per type): after each job, the least cost of every count of GPUs in use,
    and the entry (or idleness) that reached it. ``cost`` per entry in minimization form
    (:func:`useful_entries` order, grouped by job); a pinned job takes its one entry. Work and memory grow
    with :func:`state_space` times the entries; on Sia's 64-GPU cluster (24, 16 and 24 GPUs) 10,625
    states. Returns ``x`` per entry and extras."""
    capacity = problem.cluster.capacity.astype(np.int64)
    shape = tuple(capacity + 1)
    t = problem.configurations.gpu_type[cols]
    g = problem.configurations.num_gpus[cols].astype(np.int64)
    least = np.full(shape, np.inf)
    least[(0,) * len(shape)] = 0.0
    starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]]) if rows.size else np.zeros(0, dtype=np.int64)
    choices = []
    for start, stop in zip(starts, np.r_[starts[1:], rows.size]):
        best = np.full(shape, np.inf) if problem.pinned[rows[start]] else least.copy()
        chosen = np.full(shape, -1, dtype=np.int32)
        for e in range(start, stop):
            if g[e] > capacity[t[e]]:
                continue
            into = [slice(None)] * len(shape)
            into[t[e]] = slice(g[e], None)
            source = [slice(None)] * len(shape)
            source[t[e]] = slice(0, capacity[t[e]] + 1 - g[e])
            reach = least[tuple(source)] + cost[e]
            held, by = best[tuple(into)], chosen[tuple(into)]  # views: the states the entry leads to
            better = reach < held  # ties keep the earlier choice: idle, then the earlier entry
            np.copyto(held, reach, where=better)
            np.copyto(by, e, where=better)
        least = best
        choices.append(chosen)
    # (some state is reached: GoodputProblem refuses pinned jobs that do not fit together)
    state = list(np.unravel_index(int(np.argmin(least)), shape))
    x = np.zeros(rows.size)
    for chosen in reversed(choices):
        e = int(chosen[tuple(state)])
        if e >= 0:
            x[e] = 1.0
            state[t[e]] -= g[e]
    return x, {"states": int(least.size), "milp_binaries": 0, "mip_gap": 0.0}


def _greedy_incumbent(job: np.ndarray, gpu_type: np.ndarray, gpus: np.ndarray, cost: np.ndarray, r: np.ndarray,
                      m: np.ndarray, capacity: np.ndarray, pinned: np.ndarray) -> np.ndarray:
    """A feasible 0-1 point (per entry) near the prices' best responses: each job takes its
    entry of least ``r`` (idle when ``m >= 0``, pinned jobs their entry); per GPU type over
    capacity, the jobs that lose least per GPU go idle; then idle jobs take their cheapest
    entry that still fits, best per GPU first (one pass per type)."""
    k = capacity.size
    x = np.zeros(job.size)
    best = np.flatnonzero((r <= m[job]) & ((m[job] < 0) | pinned))
    best = best[np.r_[True, job[best][1:] != job[best][:-1]]] if best.size else best  # first of ties
    x[best] = 1.0
    x[pinned] = 1.0
    for j in range(k):
        on = np.flatnonzero((x > 0) & (gpu_type == j) & ~pinned)
        excess = float(gpus[(x > 0) & (gpu_type == j)].sum() - capacity[j])
        if excess > 0 and on.size:
            order = on[np.argsort(-cost[on] / gpus[on], kind="stable")]  # least loss per GPU first
            drop = np.cumsum(gpus[order]) < excess
            drop[np.argmax(~drop)] = True  # through the entry that covers the excess
            x[order[drop]] = 0.0
    busy = np.zeros(int(job.max(initial=-1)) + 1, dtype=bool)
    busy[job[x > 0]] = True
    for j in range(k):
        spare = capacity[j] - gpus[(x > 0) & (gpu_type == j)].sum()
        candidates = np.flatnonzero(~busy[job] & (gpu_type == j) & (cost < 0) & (gpus <= spare))
        if not candidates.size:
            continue
        candidates = candidates[np.argsort(cost[candidates] / gpus[candidates], kind="stable")]
        candidates = candidates[np.unique(job[candidates], return_index=True)[1]]  # one entry per job
        candidates = candidates[np.argsort(cost[candidates] / gpus[candidates], kind="stable")]
        take = candidates[np.cumsum(gpus[candidates]) <= spare]
        x[take] = 1.0
        busy[job[take]] = True
    return x


def _reduced_model(job: np.ndarray, forced: np.ndarray, gpu_type: np.ndarray, gpus: np.ndarray, cost: np.ndarray,
                   capacity: np.ndarray, lb: np.ndarray | float = 0.0) -> Model:
    """The MILP (minimization, binaries with lower bounds ``lb``) over some entries: at
    most one per job (exactly one where ``forced``), GPUs of each type within ``capacity``."""
    m = job.size
    jobs, row = np.unique(job, return_inverse=True)
    entries = np.arange(m)
    model = Model("sia")
    x = model.add_variable("x", m, lb=lb, kind="binary")
    per_job = sp.csr_matrix((np.ones(m), (row, entries)), shape=(jobs.size, m))
    model.add_constraint("one_configuration", per_job @ x <= 1.0)
    must = np.flatnonzero(np.bincount(row, forced, minlength=jobs.size) > 0)
    if must.size:
        model.add_constraint("allocated", per_job[must] @ x >= 1.0)
    used = sp.csr_matrix((gpus, (gpu_type, entries)), shape=(capacity.size, m))
    model.add_constraint("capacity", used @ x <= capacity)
    model.minimize(x.dot(cost))
    return model


def _maximize_bound(negative_bound: Any, k: int, *, scale: float) -> tuple[np.ndarray, int]:
    """Minimize the convex ``negative_bound(lam) -> (value, subgradient)`` over
    ``lam >= 0`` (``k`` prices) by box-step cutting planes; ``scale`` is the first
    box's half-width. Returns the best prices and the number of evaluations."""
    result = box_step_minimize(negative_bound, CuttingPlaneModel(k), np.zeros(k), scale, rtol=PRICE_RTOL,
                               atol=PRICE_RTOL, max_evaluations=MAX_PRICE_EVALUATIONS, grow_when_flat_on_box=True)
    return result.center, result.evaluations


# HiGHS presolve removes nothing from this model and its clique-table setup grows
# superlinearly (about 50 s of a 65 s solve at 5,120 jobs x 29 configurations); for the
# LP relaxation it costs 0.05 s of 0.45 s.
SOLVER_DEFAULTS = {"highs": {"presolve": "off"}, "scipy": {"presolve": False}}
#: Reduced MILPs up to this many binaries keep the solver's presolve (on): it made them 2-3x faster
#: (1,673 binaries of a 640-job round: 0.34 s against 1.1 s).
PRESOLVE_MAX_BINARIES = 20_000


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


def _check_rounding(decimals: Any, clip: Any) -> tuple[int | None, float | None]:
    if decimals is not None and (isinstance(decimals, bool) or not isinstance(decimals, (int, np.integer))
                                 or not 0 <= decimals <= 15):
        raise InvalidOptionError(f"sia: utility_decimals must be a whole number from 0 to 15 (Sia rounds to 2) "
                                 f"or None for exact utilities, got {decimals!r}")
    if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float, np.integer, np.floating))
                             or not np.isfinite(clip) or clip <= 0):
        raise InvalidOptionError(f"sia: utility_clip must be a finite number > 0 (Sia caps utilities at 3000) "
                                 f"or None for no cap, got {clip!r}")
    return (None if decimals is None else int(decimals)), (None if clip is None else float(clip))


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

