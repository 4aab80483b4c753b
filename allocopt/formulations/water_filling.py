"""Hierarchical weighted max-min fairness by water-filling (Gavel's
``max_min_fairness_water_filling``, ``_perf`` and ``_packed``).

Job ``i``'s normalized throughput is

.. math::

    n_i = \\frac{s_i \\, e_i}{p_i}, \\qquad
    e_i = \\sum_j T_{ij} X_{ij}, \\qquad p_i = \\frac{\\sum_j T_{ij} c_j}{\\sum_j c_j}

(with ``heterogeneity_aware=False``, ``n_i = s_i \\sum_j X_{ij}``: every
``T_ij`` is 1). A water level ``t`` rises; every *active* job gets its share
of it, and the jobs that hit a bottleneck are frozen at their level while the
others keep rising. Iteration ``k`` solves the *level LP*

.. math::

    t^*_k = \\max t \\quad \\text{s.t.} \\quad
    n_i \\ge \\sigma_i (W_e t - F_e) \\;\\; \\text{active } i \\text{ of entity } e, \\qquad
    n_i \\ge L_i \\;\\; \\text{frozen } i,

and the base constraints (:mod:`allocopt.formulations.base`). ``W_e`` is the
entity's weight, ``F_e`` the sum of the frozen levels ``L_i`` of its jobs, and
the share ``\\sigma_i`` is ``w_i / \\sum_{\\text{active } j \\in e} w_j`` under the
entity policy ``"fairness"`` and, under ``"fifo"``, 1 for the entity's oldest
active job (largest ``time_since_start``, ties in job order) and 0 for its
other active jobs. Without entities every job is an entity of weight ``w_i``,
so the constraint reads ``n_i >= w_i t``: plain weighted water-filling, whose
first level is :mod:`max_min_fairness <allocopt.formulations.max_min_fairness>`'s
objective. The result is the unique lexicographic max-min vector ``n``.

Bottlenecks are found exactly, with LPs (Gavel solves a MILP with binary
``z_i`` and a 1.0001 slack instead). With every active job at its target
``b_i`` (the right-hand side at ``t^*_k``) and frozen jobs at their levels, a
job is a bottleneck when it cannot rise. Let ``S`` be the active jobs that the
level LP's own optimum left at their targets (the others provably can rise).
The *sum-of-improvements* LP

.. math::

    \\max \\sum_{i \\in S} d_i \\quad \\text{s.t.} \\quad
    n_i \\ge b_i + \\epsilon u_i d_i, \\; 0 \\le d_i \\le 1 \\;\\; (i \\in S), \\qquad
    n_i \\ge b_i \\;\\; (\\text{other active } i), \\qquad n_i \\ge L_i \\;\\; (\\text{frozen } i)

(``u_i`` = the most ``n_i`` can be, and ``epsilon = 10^{-3}``, so that the LP
raises many jobs a little rather than a few by much) removes from ``S`` every
job its optimum raises above ``b_i + 10^{-6} u_i``: that point proves the job
can rise. It is re-solved on the remaining ``S`` until its optimum raises none;
then no job of ``S`` can rise by itself, since a point raising any one of them
would make the sum positive. Each LP removes at least one job, so this ends. A
job that could rise alone could also rise with the others (average the
points), so ``S`` is then exactly the set of jobs that cannot rise. Because
``t^*_k`` is maximal, ``S`` holds a job of positive share; the jobs of ``S``
are frozen at ``b_i``. A job of share 0 (``fifo``) has the target 0 and stays
in ``S`` only while every positive-share job of its entity does: it is frozen
at 0 together with them when it cannot rise either (later iterations only
tighten the constraints, so it never could). Each iteration freezes a job, so
there are at most ``n_jobs`` iterations.

Numerics. Each LP's point is clipped to its bounds and scaled into the
capacity, so it is exactly feasible, and targets are capped at what it
achieves: every LP is feasible. Bottleneck jobs sit exactly at their targets,
though, and a solver's presolve, rounding within its tolerances, can still
call such an LP infeasible; only then is it solved again with every target
row giving way by up to ``10^{-7} u_i`` (one elastic variable ``0 <= m <= 1``
priced at the objective's whole range). A job counts as rising only if it
exceeds its target by ``10^{-6} u_i`` plus what the GPUs given up by jobs
below their targets could lift it. Finally each job's time alone is trimmed
so that ``n_i`` is its level.

Narayanan et al., "Heterogeneity-Aware Cluster Scheduling Policies for Deep
Learning Workloads", OSDI 2020 (Sec. 4.1, hierarchical policies).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from allocopt.errors import InvalidOptionError, SolverError
from allocopt.formulations.base import (AllocationModel, ModelSolver, Policy, PolicyResult, base_model,
                                        clean_matrix)
from allocopt.model import LinExpr, Variable
from allocopt.problem import Problem
from allocopt.solution import Solution, Status

ENTITY_POLICIES = ("fairness", "fifo")
RISE_TOL = 1e-6  # a job rises when n_i exceeds its target by more than RISE_TOL * u_i
IMPROVEMENT_CAP = 1e-3  # epsilon: the most a sum-of-improvements LP raises a job, as a fraction of u_i
MARGIN = 1e-7  # the most a target row gives way, as a fraction of u_i, where the solver needs it

# Each iteration solves small LPs that differ little; HiGHS's dual simplex beats the
# interior point the highs backend picks for large LPs (6.8 s vs 17.4 s at 2,048 jobs),
# and presolve removes little from them (without it: 5.5 s vs 6.9 s at 2,048 jobs, 0.22 s
# vs 0.31 s at 512).
SOLVER_DEFAULTS = {"highs": {"solver": "choose", "presolve": "off"}}


@dataclass(frozen=True)
class _Hierarchy:
    """Per-job entity data, with each job its own entity when the problem has none."""

    entity: np.ndarray  # (n_jobs,) int: entity index of each job
    entity_weights: np.ndarray  # (n_entities,) W_e
    job_weights: np.ndarray  # (n_jobs,) w_i
    fifo: np.ndarray  # (n_jobs,) bool: the job's entity uses "fifo"
    age_rank: np.ndarray  # (n_jobs,) int: 0 for the oldest job

    @property
    def num_entities(self) -> int:
        return self.entity_weights.size

    def shares(self, active: np.ndarray) -> np.ndarray:
        """``sigma_i`` of every job (0 for frozen jobs), shape (n_jobs,)."""
        e = self.entity
        active_weight = np.bincount(e[active], self.job_weights[active], minlength=self.num_entities)
        fair = np.where(active, self.job_weights / np.where(active_weight > 0, active_weight, 1.0)[e], 0.0)
        oldest = np.full(self.num_entities, e.size)
        np.minimum.at(oldest, e[active], self.age_rank[active])
        first = active & (self.age_rank == oldest[e])
        return np.where(self.fifo, first.astype(np.float64), fair)

    def open_entities(self, jobs: np.ndarray) -> np.ndarray:
        """Bool per job: its entity has a job in the mask ``jobs``."""
        return (np.bincount(self.entity[jobs], minlength=self.num_entities) > 0)[self.entity]


def _hierarchy(problem: Problem, entity_policies: Mapping[Any, str] | None) -> _Hierarchy:
    n = problem.num_jobs
    if problem.time_since_start is None:
        order = np.arange(n)
    else:
        order = np.lexsort((np.arange(n), -problem.time_since_start))
    age_rank = np.empty(n, dtype=np.int64)
    age_rank[order] = np.arange(n)
    policies = dict(entity_policies or {})
    if problem.entities is None:
        if policies:
            raise InvalidOptionError(f"entity_policies names entit(ies) {list(policies)[:5]} but the problem has "
                                     "no entities; pass Problem(entities=..., entity_weights=...)")
        return _Hierarchy(np.arange(n), problem.priority_weights, np.ones(n), np.zeros(n, dtype=bool), age_rank)
    ids = {entity: k for k, entity in enumerate(problem.entity_ids)}
    fifo_entities = np.zeros(len(ids), dtype=bool)
    for entity, policy in policies.items():
        if entity not in ids:
            raise InvalidOptionError(f"entity_policies names unknown entity {entity!r}; the problem's entities "
                                     f"are {list(problem.entity_ids)[:10]}")
        if policy not in ENTITY_POLICIES:
            raise InvalidOptionError(f"entity_policies[{entity!r}] is {policy!r}; choose one of "
                                     f"{', '.join(map(repr, ENTITY_POLICIES))}")
        fifo_entities[ids[entity]] = policy == "fifo"
    return _Hierarchy(problem.entities, problem.entity_weights, problem.priority_weights,
                      fifo_entities[problem.entities], age_rank)


def _rates(problem: Problem, heterogeneity_aware: bool, space_sharing: bool) -> tuple[np.ndarray, np.ndarray]:
    """Most and least ``n_i`` per GPU-second over the ways job ``i`` can run
    (alone on each type, and in each pair under space sharing), shape (n_jobs,) each."""
    if not heterogeneity_aware:  # n_i = s_i * time_i: one unit of n per GPU-second, however the job runs
        ones = np.ones(problem.num_jobs)
        return ones, ones
    p = problem.proportional_throughputs
    rate = problem.throughputs / p[:, None]
    most = np.where(problem.runnable, rate, -np.inf).max(axis=1)
    least = np.where(problem.runnable, rate, np.inf).min(axis=1)
    if space_sharing:
        for member in (0, 1):
            job = problem.pairs[:, member]
            rate = problem.pair_throughput_array[:, :, member] / p[job][:, None]
            np.maximum.at(most, job, rate.max(axis=1))
            np.minimum.at(least, job, np.where(rate > 0, rate, np.inf).min(axis=1))
    return most, least


def _value(expr: LinExpr, x: np.ndarray) -> np.ndarray:
    """Numeric value of ``expr`` at the column values ``x``."""
    return expr.A @ x[:expr.A.shape[1]] + expr.const


def _feasible_point(problem: Problem, base: AllocationModel, solution: Solution) -> np.ndarray:
    """The solution's columns with ``X`` (and ``P``) clipped to their bounds and
    scaled down just enough to meet the time and capacity rows exactly."""
    x = solution.x.copy()
    blocks = [(base.X, problem.runnable.astype(np.float64), problem.scale_factors)]
    if base.P is not None:
        blocks.append((base.P, 1.0, problem.scale_factors[problem.pairs[:, 0]]))
    gpus = np.zeros(problem.cluster.num_gpu_types)
    for var, ub, scale in blocks:
        values = np.clip(x[var.columns].reshape(var.shape), 0.0, ub)
        x[var.columns] = values.ravel()
        gpus += scale @ values
    capacity = problem.capacity.astype(np.float64)
    load = np.divide(gpus, capacity, out=np.zeros_like(gpus), where=capacity > 0)
    used = max(1.0, float(_value(base.time, x).max()), float(load.max()))
    for var, _, _ in blocks:
        x[var.columns] /= used
    return x


class WaterFilling(Policy):
    """Hierarchical water-filling max-min fairness (see the module docstring)."""
    name = "water_filling"
    options = {"heterogeneity_aware": True, "space_sharing": False, "entity_policies": None}
    # A basis from the previous allocation's last LPs (most jobs frozen) is a poor start for
    # the first ones: 2.6x slower than a cold solve at 2,048 jobs.
    warm_starts = False

    def allocate(self, problem: Problem, solver: ModelSolver, *, heterogeneity_aware: bool = True,
                 space_sharing: bool = False, entity_policies: Mapping[Any, str] | None = None) -> PolicyResult:
        """Water-fill; ``entity_policies`` maps entity ids to ``"fairness"`` (default) or ``"fifo"``."""
        if entity_policies is not None and not isinstance(entity_policies, Mapping):
            raise InvalidOptionError("entity_policies must be a dict {entity: 'fairness' | 'fifo'}, got "
                                     f"{type(entity_policies).__name__}")
        if space_sharing and problem.pairs is None:
            raise InvalidOptionError("space_sharing=True needs Problem(pair_throughputs=...): the throughput "
                                     "of each pair of jobs that may share GPUs")
        tree = _hierarchy(problem, entity_policies)
        n_jobs, s = problem.num_jobs, problem.scale_factors.astype(np.float64)
        scale = s / problem.proportional_throughputs if heterogeneity_aware else s
        alone = scale[:, None] * (problem.throughputs if heterogeneity_aware else problem.runnable)
        most, least = _rates(problem, heterogeneity_aware, space_sharing)
        max_n = s * most  # u_i
        frozen = np.zeros(n_jobs, dtype=bool)
        level = np.zeros(n_jobs)  # L_i of frozen jobs, in units of n
        first_level: float | None = None
        iterations, solves_before = 0, solver.num_solves

        def build(elastic: bool) -> tuple[AllocationModel, LinExpr, LinExpr | np.ndarray, Variable | None]:
            """The base model, ``n``, and how far each target row gives way: ``MARGIN u_i m`` for an
            elastic ``0 <= m <= 1`` (also returned), or 0."""
            base = base_model(problem, name=self.name, space_sharing=space_sharing)
            n = (base.throughput if heterogeneity_aware else base.time) * scale
            if not elastic:
                return base, n, np.zeros(n_jobs), None
            margin = base.model.add_variable("margin", lb=0.0, ub=1.0)
            return base, n, margin * (MARGIN * max_n), margin

        def improvements(base: AllocationModel, jobs: np.ndarray) -> tuple[Variable, LinExpr]:
            """``d`` for the mask ``jobs`` and ``epsilon u_i d_i`` per job (0 elsewhere)."""
            rows = np.flatnonzero(jobs)
            d = base.model.add_variable("improvement", rows.size, lb=0.0, ub=1.0)
            spread = sp.csr_matrix((IMPROVEMENT_CAP * max_n[rows], (rows, np.arange(rows.size))),
                                   shape=(n_jobs, rows.size))
            return d, spread @ d

        def solve(what: str, make: Callable[[bool], tuple[AllocationModel, LinExpr]]
                  ) -> tuple[AllocationModel, LinExpr, Solution, np.ndarray]:
            """Solve the LP ``make(elastic)`` builds, the elastic one only if the solver calls the exact
            one infeasible; return it, its ``n``, the solution and its exactly feasible point."""
            base, n = make(False)
            solution = solver.solve_raw(base.model, defaults=SOLVER_DEFAULTS)
            if solution.status in (Status.INFEASIBLE, Status.INFEASIBLE_OR_UNBOUNDED):
                base, n = make(True)
                solution = solver.solve_raw(base.model, defaults=SOLVER_DEFAULTS)
            solution = solver.check(solution, f"water_filling {what} LP of iteration {iterations}")
            return base, n, solution, (_feasible_point(problem, base, solution) if solution.has_values else None)

        def result(base: AllocationModel, solution: Solution, x: np.ndarray, message: str) -> PolicyResult:
            X = clean_matrix(x[base.X.columns].reshape(base.X.shape))
            P = None if base.P is None else clean_matrix(x[base.P.columns].reshape(base.P.shape))
            extras = {"levels": level / problem.priority_weights, "num_iterations": iterations,
                      "num_lp_solves": solver.num_solves - solves_before}
            return PolicyResult(X, first_level, solution.status, P, message, extras)

        def stopped(base: AllocationModel, solution: Solution, x: np.ndarray) -> PolicyResult:
            return result(base, solution, x, f"{solution.message} (water-filling stopped at iteration {iterations})")

        def rising(achieved: np.ndarray, target: np.ndarray) -> np.ndarray:
            """Jobs above their targets by more than the tolerance plus what the GPUs given up by
            jobs below their targets could lift them (a job's n per GPU is at most ``u_i / s_i``)."""
            gpus_given_up = (np.maximum(target - achieved, 0.0) / least).sum()
            return achieved - target > (RISE_TOL + gpus_given_up / s) * max_n

        while not frozen.all():
            iterations += 1
            active = ~frozen
            share = tree.shares(active)
            positive = active & (share > 0)
            held = np.bincount(tree.entity[frozen], level[frozen], minlength=tree.num_entities)
            slope, offset = share * tree.entity_weights[tree.entity], share * held[tree.entity]

            def level_lp(elastic: bool) -> tuple[AllocationModel, LinExpr]:
                """max t; giving way costs as much as t can ever be."""
                base, n, give_way, margin = build(elastic)
                t = base.model.add_variable("water_level", lb=-np.inf)
                base.model.add_constraint("share", n[positive] - t * slope[positive] >= -offset[positive])
                if frozen.any():
                    base.model.add_constraint("frozen", n[frozen] + give_way[frozen] >= level[frozen])
                t_most = ((max_n + offset)[positive] / slope[positive]).min()
                base.model.maximize(t if margin is None else t - margin * t_most)
                return base, n

            base, n, solution, x = solve("level", level_lp)
            if solution.status is not Status.OPTIMAL:
                return stopped(base, solution, x)
            final = base, n, solution, x
            t_star = float(solution.values["water_level"])
            first_level = t_star if first_level is None else first_level
            achieved = _value(n, x)
            # targets b_i, capped at what the (exactly feasible) point achieves
            target = np.where(frozen, level, np.minimum(np.maximum(slope * t_star - offset, 0.0), achieved))
            stuck = active & ~rising(achieved, target)

            def bottleneck_lp(elastic: bool) -> tuple[AllocationModel, LinExpr]:
                """max sum(d) over ``stuck``; giving way costs as much as all of ``d``."""
                base, n, give_way, margin = build(elastic)
                d, lift = improvements(base, stuck)
                base.model.add_constraint("target", n - lift + give_way >= target)
                base.model.maximize(d.sum() if margin is None else d.sum() - margin * float(stuck.sum()))
                return base, n

            while True:  # sum-of-improvements LPs: drop every job of `stuck` that can rise
                stuck &= positive | ~tree.open_entities(positive & ~stuck)  # share 0 of open entities: not yet
                if not (stuck & positive).any():
                    raise SolverError(f"water_filling: iteration {iterations} found no bottleneck job although "
                                      "its level is maximal; the solver's answers are inconsistent at tolerance "
                                      f"{RISE_TOL:g}. Try another backend.")
                base, n, solution, x = solve("bottleneck", bottleneck_lp)
                if solution.status is not Status.OPTIMAL:
                    return stopped(base, solution, x)
                rises = stuck & rising(_value(n, x), target)
                if not rises.any():
                    break
                stuck &= ~rises

            level[stuck] = target[stuck]
            frozen |= stuck

        base, n, solution, x = final
        X = x[base.X.columns].reshape(base.X.shape)  # a view: trim each job's time alone down to its level
        excess, own = _value(n, x) - level, (alone * X).sum(axis=1)
        X *= 1.0 - np.clip(np.divide(excess, own, out=np.zeros(n_jobs), where=own > 0), 0.0, 1.0)[:, None]
        return result(base, solution, x, f"Optimal water-filling allocation: {iterations} levels.")
