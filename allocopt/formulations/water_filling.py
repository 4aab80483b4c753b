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
    n_i \\ge b_i(t) = \\sigma_i (W_e t - F_e) \\;\\; \\text{active } i \\text{ of entity } e, \\qquad
    n_i \\ge \\lfloor (1 - \\delta) L_i \\rfloor \\;\\; \\text{frozen } i,

and the base constraints (:mod:`allocopt.formulations.base`). ``W_e`` is the
entity's weight, ``F_e`` the sum of the frozen levels ``L_i`` of its jobs, and
the share ``\\sigma_i`` is ``w_i / \\sum_{\\text{active } j \\in e} w_j`` under the
entity policy ``"fairness"`` and, under ``"fifo"``, 1 for the entity's oldest
active job (largest ``time_since_start``, ties in job order) and 0 for its
other active jobs. Without entities every job is an entity of weight ``w_i``,
so the constraint reads ``n_i >= w_i t``: plain weighted water-filling, whose
first level is :mod:`max_min_fairness <allocopt.formulations.max_min_fairness>`'s
objective. The result is the lexicographic max-min vector ``n``: for runs whose
LPs are solved exactly (small runs, Exact levels below) to the rounding of each
LP's answer to doubles, for the others but for the give ``delta`` of the frozen
levels and the bottleneck test's ``RISE`` (below).

Frozen levels give way. In later LPs a frozen job holds ``(1 - delta) L_i``
(``delta = GIVE_WAY = 5e-7``) rounded down to 24 significant bits, not ``L_i``,
and a job counts as a bottleneck when it cannot rise by ``RISE = 10^{-4}`` of
its target (at least ``10^{-6} u_i``; ``u_i`` at a share of 0) while the other
active jobs give way by ``delta`` shared among them (each by ``delta / (m - 1)`` of
its target, ``m`` active jobs: however many they are, together they free no
more than one frozen level's give). Without the give the lexicographic vector is
ill-conditioned on valid data: where a job reaches its level only with a
sliver of a type on which it runs up to ``10^6`` times slower, the last
digits of that level decide much of a later job's share. Solved in exact
rational arithmetic, one problem of the property suite's wide family gives a
job 0 where HiGHS's allocation, whose other levels are within a relative
``4 \\cdot 10^{-10}`` of the exact ones (its first ``2 \\cdot 10^{-10}`` lower),
gives it 60% of its ``u_i``; HiGHS, scipy and CBC, each within its ``10^{-9}`` tolerances,
ended up to ``u_i`` apart (and apart from the exact vector) on 11 of 5,000
such problems. With the give, the later levels use what the last
``5 \\cdot 10^{-7}`` of the frozen levels would cost, the rounding makes
frozen levels that differ in their last digits (``10^{-14}`` between the
backends) one number, and the bottleneck tests no longer turn on a rise of
``10^{-12}``. What it costs: each frozen job may end up to a relative
``5 \\cdot 10^{-7}`` below its level where a later job uses the room (measured:
later jobs then up to ``1.3 \\cdot 10^{-5} u_i`` above the give-free vector on a
moderate problem); the objective is the first level the allocation attains,
``t^*_1`` less at most that give. A last LP raises every job toward its level
by a common fraction ``lambda <= 1`` (``n_i >= lambda L_i``) where the room is
free, so the answer does not depend on where in the give a solver's point lay.

Bottlenecks. A job is a bottleneck when it cannot rise above its target
``b_i(t^*_k)`` (by ``RISE``) while every other job keeps its target (less the
give: the frozen ones their floors, the active ones their shares of ``delta``);
it is then frozen there. Freezing only bottlenecks is exact whenever it happens: later
iterations only raise the other targets, so a bottleneck can never rise
later, and a job left active loses nothing (at the next level it starts from
the same target). Two certificates, neither an equality test on levels:

* *Duals* (the level LP's own): a row with a positive dual ``y_i`` is tight in
  every optimum (complementary slackness), and raising its right-hand side
  lowers ``t*`` (weak duality), so the job cannot rise, whatever its current
  point shows within the solver's tolerances, where the others keep their
  targets exactly. Where they give way, the LP's optimum is concave in its
  right-hand sides, so the duals bound it: ``tau* - y_i rise_i + sum_j y_j
  give_j`` (row units); a positive dual certifies the job when that bound
  (with the others' give doubled, a margin for the duals' own noise) is below
  ``tau*``. Otherwise its job goes to the improvement LP: on an
  ill-conditioned level LP a dual of ``10^{-3}`` on one backend's vertex and 0
  on another's marked a job stuck that the others' give of ``5 \\cdot 10^{-7}``
  lets rise by 18% of its level (checked in exact rational arithmetic).
  Positive means above ``10^{-6}``
  in the LP's own units (its rows scaled by ``r_i``, ``t`` by ``t_unit``), well
  above the solvers' dual tolerance; not its share of ``t``'s weight, which
  for a job of level ``10^{-8} u_i`` beside jobs near ``u_j`` is far smaller
  and left it active, to be frozen later at a level the solver no longer
  resolved. The duals of the rows
  with a positive share weigh ``t``'s column to 1 (``sum_i y_i sigma_i W_e = 1``),
  so where neither certificate freezes a job, the one of largest dual weight is
  frozen: every level freezes one.
* *Improvement LP*, for the rows at their targets that the duals do not
  certify (degenerate rows, e.g. a ``fifo`` entity's jobs of share 0, and the
  rows above): it maximizes
  ``sum_i d_i`` subject to ``n_i >= b_i + epsilon r_i d_i``, ``0 <= d_i <= 1``, for
  those jobs, and the targets less the give and the floors of all others.
  Jobs it raises by more than ``RISE`` stay active; where it raises none, they
  are frozen too; it is re-solved on the rest a few times at most.

Before either, the level LP's own point proves some jobs able to rise by more
than ``RISE`` (idle time of theirs on a type with idle GPUs): they stay active
untested. Every
level freezes at least one job, so there are at most ``n_jobs`` levels; in
practice one LP per level, and an improvement LP where degenerate rows are
left.

Jobs at their own caps. Where a job's target reaches ``u_i`` (all its time on its
best type) that cap, not the cluster, sets its level, and on uncontended clusters
that is most jobs, one level each. Without entities, when a level freezes a job
at its cap, :meth:`_WaterFill.fill_caps` freezes the run of the next ones together
in about ``2 log2`` of its length LPs (probes of the lowest caps: 2, 4, 8, ...
jobs, then bisection), each job at ``u_i`` where the level of its cap is
feasible (levels one at a time froze such a job within ``RISE`` of it). On 2,048
distinct jobs of ``allocopt.bench.instances.uniform_problem``: 26 levels and 40
probes, where one level per job took about 2,000 LPs.

All LPs of a run share one template (same sparsity, other
coefficients, bounds and objective); on ``highs`` one HiGHS instance is
changed in place, so each LP goes on from the previous one's basis and
factorization (primal simplex: the previous point stays feasible), usually in
a few pivots; in runs of at least ``PRIMAL_FIRST`` columns without perturbing
its bounds (HiGHS's cleanup of the perturbation took a quarter of its time).


How the LPs are solved (scaling, refinement, retries, exact arithmetic for small runs, and the
limits of floating point): :mod:`allocopt.formulations.water_filling_lps`.

Narayanan et al., "Heterogeneity-Aware Cluster Scheduling Policies for Deep
Learning Workloads", OSDI 2020 (Sec. 4.1, hierarchical policies).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from allocopt.errors import InvalidOptionError
from allocopt.formulations.base import AllocationModel, ModelSolver, Policy, PolicyResult, clean_matrix
from allocopt.formulations.job_types import group_rows
from allocopt.formulations.water_filling_lps import (  # noqa: F401 (EXACT_MAX_COLUMNS, PRIMAL_FIRST: re-exported)
    EXACT_GIVE_WAY, EXACT_MAX_COLUMNS, EXACT_RISE, IMPROVEMENT, PRIMAL_FIRST, _Level, _Lps, _trouble)
from allocopt.model import LinExpr
from allocopt.problem import Problem
from allocopt.solution import Solution, Status

logger = logging.getLogger(__name__)

ENTITY_POLICIES = ("fairness", "fifo")
MIN_ROW_SCALE = 1e-6  # a job's row is divided by its level, or by at least this fraction of u_i
RESCALE = 4.0  # ... kept while within this factor of that (and so is the unit of t)
# a job rises (is no bottleneck) when it can rise by more than this fraction of its target (at least
# MIN_ROW_SCALE u_i; u_i at a share of 0); the give of the other jobs' levels, pooled, stays below it
# on ordinary problems (see Frozen levels in the module docstring)
RISE = 1e-4
DUAL_TOL = 1e-6  # a row certifies its job stuck when its dual (in the LP's units) exceeds this
GIVE_WAY = 5e-7  # frozen levels L_i hold in later LPs as n_i >= (1 - GIVE_WAY) L_i (see Frozen levels)
WIDER_GIVE_WAY = 1e-5  # ... and as n_i >= (1 - WIDER_GIVE_WAY) L_i where no solver finishes a level LP otherwise
RESTORE_TOL = 1e-9  # levels a point falls short of by more than this (relative) are restored
MAX_IMPROVEMENT_LPS = 3  # per level; the jobs still undecided then stay active (exact, only slower)
CAP_REACHED = 1e-8  # a cap probe succeeds when its level is within this (relative) of the probed cap

@dataclass(frozen=True)
class _Hierarchy:
    """Per-job entity data, with each job its own entity when the problem has none."""

    entity: np.ndarray  # (n_jobs,) int: entity index of each job
    entity_weights: np.ndarray  # (n_entities,) W_e
    job_weights: np.ndarray  # (n_jobs,) w_i
    fifo: np.ndarray  # (n_jobs,) bool: the job's entity uses "fifo"
    age_rank: np.ndarray  # (n_jobs,) int: 0 for the oldest job
    count: np.ndarray | None = None  # (n_jobs,): identical jobs each row stands for (job classes), None: 1

    @property
    def num_entities(self) -> int:
        return self.entity_weights.size

    def shares(self, active: np.ndarray) -> np.ndarray:
        """``sigma_i`` of every job (0 for frozen jobs), shape (n_jobs,)."""
        e = self.entity
        weights = self.job_weights if self.count is None else self.job_weights * self.count
        active_weight = np.bincount(e[active], weights[active], minlength=self.num_entities)
        fair = np.where(active, self.job_weights / np.where(active_weight > 0, active_weight, 1.0)[e], 0.0)
        oldest = np.full(self.num_entities, e.size)
        np.minimum.at(oldest, e[active], self.age_rank[active])
        first = active & (self.age_rank == oldest[e])
        return np.where(self.fifo, first.astype(np.float64), fair)

    def open_entities(self, jobs: np.ndarray) -> np.ndarray:
        """Bool per job: its entity has a job in the mask ``jobs``."""
        return (np.bincount(self.entity[jobs], minlength=self.num_entities) > 0)[self.entity]


def _hierarchy(problem: Problem, entity_policies: Mapping[Any, str] | None,
               count: np.ndarray | None = None) -> _Hierarchy:
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
        # each job its own entity: a row of ``count`` jobs stands for as many entities, each as the row
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
                      fifo_entities[problem.entities], age_rank, count)


def first_level(problem: Problem, normalized: np.ndarray, entity_policies: Mapping[Any, str] | None = None
                ) -> float:
    """The first water level that the normalized throughputs ``n`` (shape (n_jobs,)) reach: the
    largest ``t`` with ``n_i >= sigma_i W_e t`` for every job (every job active); water-filling's
    objective, for checking an answer."""
    tree = _hierarchy(problem, entity_policies)
    slope = tree.shares(np.ones(problem.num_jobs, dtype=bool)) * tree.entity_weights[tree.entity]
    return float((normalized[slope > 0] / slope[slope > 0]).min())


def _most_rate(problem: Problem, heterogeneity_aware: bool, space_sharing: bool) -> np.ndarray:
    """Most ``n_i / s_i`` per GPU-second over the ways job ``i`` can run (alone on each
    type, and in each pair under space sharing), shape (n_jobs,)."""
    if not heterogeneity_aware:  # n_i = s_i * time_i: one unit of n per GPU-second, however the job runs
        return np.ones(problem.num_jobs)
    p = problem.proportional_throughputs
    most = np.where(problem.runnable, problem.throughputs / p[:, None], -np.inf).max(axis=1)
    if space_sharing:
        for member in (0, 1):
            job = problem.pairs[:, member]
            np.maximum.at(most, job, (problem.pair_throughput_array[:, :, member] / p[job][:, None]).max(axis=1))
    return most


def _round_down(values: np.ndarray) -> np.ndarray:
    """``values`` rounded down to 24 significant bits (float32's), a relative step of at most 1.2e-7:
    the frozen levels of two solvers that differ in their last digits become the same number."""
    single = values.astype(np.float32)
    single = np.where(single.astype(np.float64) > values, np.nextafter(single, np.float32(-np.inf)), single)
    return single.astype(np.float64)


def _value(expr: LinExpr, x: np.ndarray) -> np.ndarray:
    """Numeric value of ``expr`` at the column values ``x``."""
    return expr.A @ x[:expr.A.shape[1]] + expr.const


def _feasible_point(problem: Problem, base: AllocationModel, solution: Solution, use: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The solution's columns with ``X`` (and ``P``) clipped to their bounds and
    scaled down just enough to meet the time and capacity rows exactly, and the
    GPUs of each type it leaves idle."""
    x = solution.x.copy()
    blocks = [(base.X, problem.runnable.astype(np.float64), use)]  # use: GPUs per unit of each row's time
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
    return x, np.maximum(capacity - gpus / used, 0.0)


class WaterFilling(Policy):
    """Hierarchical water-filling max-min fairness (see the module docstring)."""
    name = "water_filling"
    options = {"heterogeneity_aware": True, "space_sharing": False, "entity_policies": None,
               "aggregate_job_types": False, "exact": None}
    # The LPs start from the bases of this solve's own previous LPs; a basis from an earlier
    # allocation's last LPs (most jobs frozen) is a poor start for the first ones.
    warm_starts = False

    def allocate(self, problem: Problem, solver: ModelSolver, *, heterogeneity_aware: bool = True,
                 space_sharing: bool = False, entity_policies: Mapping[Any, str] | None = None,
                 aggregate_job_types: bool = False, exact: bool | None = None) -> PolicyResult:
        """Water-fill; ``entity_policies`` maps entity ids to ``"fairness"`` (default) or ``"fifo"``;
        ``aggregate_job_types`` solves by job class (:func:`water_filling_by_job_class`); ``exact``:
        the LPs in exact rational arithmetic (None: where they have at most ``EXACT_MAX_COLUMNS``
        columns and ``swiglpk`` is importable, with a warning where not; False: never, True: always;
        see Exact levels in the module docstring)."""
        if exact not in (None, True, False):
            raise InvalidOptionError(f"water_filling: exact must be None, True or False, got {exact!r}")
        if entity_policies is not None and not isinstance(entity_policies, Mapping):
            raise InvalidOptionError("entity_policies must be a dict {entity: 'fairness' | 'fifo'}, got "
                                     f"{type(entity_policies).__name__}")
        if space_sharing and problem.pairs is None:
            raise InvalidOptionError("space_sharing=True needs Problem(pair_throughputs=...): the throughput "
                                     "of each pair of jobs that may share GPUs")
        if aggregate_job_types:
            if space_sharing:
                raise InvalidOptionError("water_filling: aggregate_job_types does not support space_sharing; "
                                         "solve per job (aggregate_job_types=False)")
            return water_filling_by_job_class(problem, solver, heterogeneity_aware, entity_policies, exact)
        return _WaterFill(problem, solver, _hierarchy(problem, entity_policies), heterogeneity_aware,
                          space_sharing, exact=exact).run()


def job_classes(problem: Problem, entity_policies: Mapping[Any, str] | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """Interchangeable jobs for water-filling without space sharing: the same throughput row, scale
    factor, priority weight and entity (a ``fifo`` entity's jobs, ranked by age, are each their own
    class). Returns the class of each job (n_jobs,) and the first job of each class (increasing)."""
    tree = _hierarchy(problem, entity_policies)
    entity = tree.entity if problem.entities is not None else np.zeros(problem.num_jobs)
    age = np.where(tree.fifo, tree.age_rank, -1)
    return group_rows(np.column_stack([problem.throughputs, problem.scale_factors, problem.priority_weights,
                                       entity, age]))


def water_filling_by_job_class(problem: Problem, solver: ModelSolver, heterogeneity_aware: bool = True,
                               entity_policies: Mapping[Any, str] | None = None, exact: bool | None = None
                               ) -> PolicyResult:
    """Water-filling over job classes (:func:`job_classes`), each class's row copied to its jobs.

    Permuting interchangeable jobs maps the problem onto itself, and its level vector is unique,
    so it is symmetric: averaging an optimal allocation over each class gives every job of the
    class the same row and the same levels. The class model is the per-job one on one job per class
    (its normalization ``p_i`` and levels per job, as they depend on the job's row and the capacity
    only) with each class's GPUs and entity shares counted once per member. ``extras`` adds
    ``type_of_job`` (n_jobs,) and ``num_job_types``.
    """
    of_job, rows = job_classes(problem, entity_policies)
    count = np.bincount(of_job, minlength=rows.size).astype(np.float64)
    classes = problem.subset(rows)
    result = _WaterFill(classes, solver, _hierarchy(classes, entity_policies, count), heterogeneity_aware,
                        False, count, exact).run()
    extras = {**result.extras, "levels": result.extras["levels"][of_job], "type_of_job": of_job,
              "num_job_types": int(rows.size)}
    return PolicyResult(result.matrix[of_job], result.objective, result.status, None,
                        f"{result.message} ({rows.size} job classes)", extras)


class _WaterFill:
    """The state of one water-filling run: frozen jobs, their levels, and the last exactly feasible point."""

    def __init__(self, problem: Problem, solver: ModelSolver, tree: _Hierarchy, heterogeneity_aware: bool,
                 space_sharing: bool, count: np.ndarray | None = None, exact: bool | None = None):
        self.problem, self.solver, self.tree = problem, solver, tree
        self.heterogeneity_aware = heterogeneity_aware
        n_jobs, s = problem.num_jobs, problem.scale_factors.astype(np.float64)
        self.scale = s / problem.proportional_throughputs if heterogeneity_aware else s
        self.alone = self.scale[:, None] * (problem.throughputs if heterogeneity_aware else problem.runnable)
        self.most = s * _most_rate(problem, heterogeneity_aware, space_sharing)  # u_i
        self.frozen = np.zeros(n_jobs, dtype=bool)
        self.level = np.zeros(n_jobs)  # L_i of frozen jobs, in units of n
        self.floor = np.zeros(n_jobs)  # what frozen jobs hold in later LPs: (1 - give_way) L_i, or less
        self.iterations = 0
        self.cap_probes = 0  # level LPs of fill_caps
        self.cap_misses = self.cap_skips = 0  # fill_caps runs ended at their first probe in a row; chances to skip
        self.solves_before = solver.num_solves
        # an exactly feasible start: every job gets the same fraction of every type
        self.use = s if count is None else s * count  # GPUs per unit of a row's time (its jobs together)
        fraction = problem.capacity / max(float(problem.capacity.sum()), float(self.use.sum()))
        self.achieved = (self.alone * problem.runnable) @ fraction
        self.lps = _Lps(problem, solver, self._n_of, space_sharing, count, exact)
        # EXACT_GIVE_WAY while the LPs are exact, else GIVE_WAY (WIDER_GIVE_WAY after numerical trouble)
        self.give_way = EXACT_GIVE_WAY if self.lps.exact else GIVE_WAY
        self.rows: np.ndarray | None = None  # r_i
        self.plain_rows = False  # r_i = u_i (after numerical trouble)
        self.t_unit = np.inf
        self.last: tuple[Solution, np.ndarray] | None = None

    @property
    def rise(self) -> float:
        """What a job must be able to rise by (relative to its scale) to stay active."""
        return EXACT_RISE if self.lps.exact else RISE

    @property
    def dual_tol(self) -> float:
        """A row's dual above this certifies its job stuck."""
        return 0.0 if self.lps.exact else DUAL_TOL

    @property
    def cap_reached(self) -> float:
        """A cap probe succeeds when its level is within this (relative) of the probed cap."""
        return EXACT_RISE if self.lps.exact else CAP_REACHED

    def _n_of(self, base: AllocationModel) -> LinExpr:
        return (base.throughput if self.heterogeneity_aware else base.time) * self.scale

    def _point(self, solution: Solution) -> np.ndarray:
        """The solution's exactly feasible point; records it, what it achieves and what it leaves idle."""
        base = self.lps.base
        x, self.idle_gpus = _feasible_point(self.problem, base, solution, self.use)
        self.achieved = _value(self.lps.n, x)
        self.idle_time = np.maximum(1.0 - _value(base.time, x), 0.0)
        self.last = solution, x
        return x

    def rising(self, scale: np.ndarray) -> np.ndarray:
        """Jobs the current point proves able to rise by more than :attr:`rise` of their ``scale``
        with nothing else changed: idle time of theirs on a type with idle GPUs."""
        problem = self.problem
        room = np.minimum(self.idle_gpus[None, :] / self.use[:, None], self.idle_time[:, None])
        gain = (self.alone * np.where(problem.runnable, room, 0.0)).max(axis=1)
        return gain > self.rise * scale

    # ----- one level ------------------------------------------------------------------
    def level_lp(self, slope: np.ndarray, offset: np.ndarray, positive: np.ndarray, refine: bool = True
                 ) -> _Level | None:
        """Solve the level LP (None if it stopped short of optimal under ``best_effort``), with ``refine``
        as :meth:`_Lps.solve`."""
        # t = t_low + tau t_unit, where the current point reaches t_low: row i reads
        # n_i / r_i - (slope_i t_unit / r_i) tau >= b_i(t_low) / r_i. The unit of t and the row scales
        # follow the level within a factor RESCALE, so few coefficients change from one LP to the next.
        t_low = float(((self.achieved + offset)[positive] / slope[positive]).min())
        low_target = np.where(positive, slope * t_low - offset, 0.0)
        # a job's scale: its target, or what the level itself is worth to it (a target starting at 0)
        wanted = np.where(self.frozen, self.level,
                          np.where(positive, np.maximum(low_target, slope * t_low), self.most))
        wanted = np.clip(wanted, (1.0 if self.plain_rows else MIN_ROW_SCALE) * self.most, self.most)
        if self.rows is None:
            self.rows = wanted
        self.rows = np.where((wanted > RESCALE * self.rows) | (self.rows > RESCALE * wanted), wanted, self.rows)
        rows = self.rows
        # t's unit: the rise that lifts the most sensitive job by its row scale (tau's coefficients <= 1)
        unit = float((rows[positive] / slope[positive]).min())
        if not 1 / RESCALE <= unit / self.t_unit <= RESCALE:
            self.t_unit = unit
        weight = np.where(positive, slope * self.t_unit / rows, 0.0)
        rhs = np.where(self.frozen, self.floor, low_target) / rows
        model = self.lps.model(rows, weight, rhs, None, None)
        solution = self.lps.solve(model, refine=refine)
        if solution.status is Status.INFEASIBLE and self.frozen.any():
            # the floors are at most what the last point achieved, but that float sum can exceed what
            # is achievable by a few units in the last place (an LP infeasible by 6e-17 in exact
            # arithmetic, which scipy's HiGHS reported so): once more with them 8 units lower
            floor = self.floor * (1.0 - 8 * np.finfo(float).eps)
            model = self.lps.model(rows, weight, np.where(self.frozen, floor, low_target) / rows, None, None)
            solution = self.lps.solve(model, refine=refine)
            if not _trouble(solution, self.solver):
                self.floor = floor
        if _trouble(solution, self.solver) and not self.plain_rows:
            # rows scaled by their targets can be too badly conditioned (targets far below u_i):
            # rows scaled by u_i instead, coefficients at most 1, for the rest of the run
            self.plain_rows = True
            return self.level_lp(slope, offset, positive, refine)
        if _trouble(solution, self.solver) and self.give_way < WIDER_GIVE_WAY and self.frozen.any():
            # still no answer (the frozen levels can leave a sliver of room only): they give way more,
            # for the rest of the run
            self.give_way = WIDER_GIVE_WAY
            self.floor = np.minimum(self.floor, (1.0 - WIDER_GIVE_WAY) * self.level)
            return self.level_lp(slope, offset, positive, refine)
        solution = self.solver.check(solution, f"water_filling level LP of iteration {self.iterations}")
        self._point(solution)
        if solution.status is not Status.OPTIMAL:  # best_effort: stop here
            return None
        tau = float(solution.values["water_level"])
        t = t_low + tau * self.t_unit
        dual = -solution.duals["level"]
        dual_share = dual * weight
        target = np.where(positive, np.minimum(np.maximum(low_target + slope * self.t_unit * tau, 0.0),
                                               self.achieved), 0.0)
        return _Level(t, tau, target, dual_share, dual, weight, rhs)

    def active_give(self, active: np.ndarray) -> float:
        """What each active job gives way by (relative to its target) while another is tested for a rise:
        ``give_way`` shared among the other active jobs, so that however many they are, together they
        free no more than one frozen level's give (rows of job classes count each of their jobs)."""
        jobs = float(active.sum() if self.tree.count is None else self.tree.count[active].sum())
        return self.give_way / max(jobs - 1.0, 1.0)

    def stuck(self, level: _Level, jobs: np.ndarray, scale: np.ndarray) -> np.ndarray:
        """The jobs of the mask ``jobs`` unable to rise above their targets by :attr:`rise` of their ``scale``
        while every other active job keeps its target and every frozen one its floor, less the give
        (improvement LPs, see the module docstring)."""
        candidates = jobs.copy()
        for _ in range(MAX_IMPROVEMENT_LPS):
            # the other active jobs give way (active_give)
            others = ~self.frozen & ~candidates
            rhs = level.rhs - np.where(others, self.active_give(~self.frozen) * level.target / self.rows, 0.0)
            model = self.lps.model(self.rows, level.weight, rhs, level.tau, candidates.astype(np.float64), scale)
            solution = self.lps.solve(model)
            if solution.status is not Status.OPTIMAL:  # no conclusion: the jobs stay active
                break
            raised = solution.values["improvement"] * IMPROVEMENT > self.rise
            if not (candidates & raised).any():
                return candidates
            candidates &= ~raised
            if not candidates.any():
                break
        return np.zeros_like(jobs)

    # ----- the whole run ---------------------------------------------------------------
    def run(self) -> PolicyResult:
        tree, first_level = self.tree, None
        while not self.frozen.all():
            self.iterations += 1
            if self.give_way < GIVE_WAY and not self.lps.exact:  # the exact LPs stopped at their time limit
                self.give_way = GIVE_WAY
                self.floor = np.minimum(self.floor, _round_down((1.0 - GIVE_WAY) * self.level))
            active = ~self.frozen
            share = tree.shares(active)
            positive = active & (share > 0)
            frozen_levels = self.level if tree.count is None else self.level * tree.count
            held = np.bincount(tree.entity[self.frozen], frozen_levels[self.frozen], minlength=tree.num_entities)
            slope, offset = share * tree.entity_weights[tree.entity], share * held[tree.entity]
            if first_level is None:
                self.first_slope = np.where(positive, slope, 0.0)
            level = self.level_lp(slope, offset, positive)
            if level is None:
                return self.result(first_level, "stopped")
            first_level = level.t if first_level is None else first_level
            target = level.target
            # what a rise is measured against: the target (at least MIN_ROW_SCALE u_i), u_i at a share of 0
            scale = np.clip(np.where(positive, target, self.most), MIN_ROW_SCALE * self.most, self.most)
            # a row with a positive dual is tight in every optimum, and its job cannot rise by `rise` even
            # where the other active jobs give way when the duals say so: the LP's optimum is concave in
            # its right-hand sides, so it is at most tau* - dual_i rise_i + sum_{j != i} dual_j give_j
            rise = self.rise * scale / self.rows
            give = np.where(active, self.active_give(active) * target / self.rows * level.dual, 0.0)
            certain = active & (level.dual > self.dual_tol) & (level.dual * rise > 2.0 * (give.sum() - give))
            tight = active & (self.achieved <= target + self.rise * scale) & ~self.rising(scale)
            undecided = (tight | (active & (level.dual > self.dual_tol))) & ~certain
            if undecided.any():
                certain |= self.stuck(level, undecided, scale)
            if not certain.any():  # the row of largest dual weight holds t up: tight in every optimum
                certain[np.flatnonzero(positive)[np.argmax(level.dual_share[positive])]] = True
            self._freeze(certain, target)
            capped = certain & (target >= (1.0 - self.cap_reached) * self.most)
            if self.problem.entities is None and capped.any():
                if self.cap_skips:
                    self.cap_skips -= 1
                else:
                    self.fill_caps()
        self.restore()
        return self.result(first_level, "done")

    def _freeze(self, jobs: np.ndarray, target: np.ndarray) -> None:
        """Freeze the jobs of the mask ``jobs`` at their ``target``."""
        self.level[jobs] = target[jobs]
        given = (1.0 - self.give_way) * target[jobs]
        self.floor[jobs] = given if self.lps.exact else _round_down(given)
        self.frozen |= jobs
        # the floors the current point holds (all but solver noise), so every LP has a feasible point
        self.floor[self.frozen] = np.minimum(self.floor[self.frozen], self.achieved[self.frozen])

    def fill_caps(self) -> None:
        """Freeze, in a few LPs, the run of active jobs whose own caps ``u_i`` set the next levels (without
        entities: each job's target is ``w_i t``, so its cap is the level ``c_i = u_i / w_i``).

        Where the level ``c`` is feasible with every active job at ``min(w_i t, u_i)``, each job of cap at most
        ``c`` holds ``u_i`` in the lexicographic max-min vector (were one below, the feasible vector
        ``min(w_i c, u_i)`` would raise it at the cost only of jobs above level ``c``), so it is frozen there.
        A probe of the ``m`` lowest caps tests that level for ``c_m``:
        a level LP from the current level ``t_0`` in which those jobs' targets follow the chord of
        ``min(w_i t, u_i)`` from ``t_0`` to ``c_m`` (below it in between, ``u_i`` at ``c_m``), so it reaches ``c_m``
        exactly when the level is feasible, and where it stops short its level bounds the run: no cap above
        it is feasible. Probes of ``m`` = 2, 4, 8, ... jobs, then of every job up to the last failed probe's
        bound (halving the interval where the bound does not). A failed probe leaves the run as it was."""
        weight = self.tree.entity_weights[self.tree.entity]
        jobs = np.flatnonzero(~self.frozen)
        order = jobs[np.argsort(self.most[jobs] / weight[jobs], kind="stable")]
        caps = self.most[order] / weight[order]
        n = order.size
        done, step, failed = 0, 2, n + 1  # order[:done] frozen at their caps; the probe of order[:failed] fails
        halve = False  # the last failed probe's bound did not halve its interval
        while done < n:
            if failed > n:
                m = min(done + step, n)
            else:
                m = (done + failed) // 2 if halve else failed - 1
            if m <= done:
                break
            level = self._cap_probe(order[done:m], float(caps[m - 1]))
            if level is None:
                done, step = m, 2 * step
                continue
            reached = int(np.searchsorted(caps[done:m], level * (1.0 + self.cap_reached), side="right"))
            bound = min(m, done + reached + 1)
            halve = 2 * (bound - done) > m - done
            failed = bound
        # a run that ended at its first probe: the next runs are likely short too, so skip as many
        # chances as such runs have ended in a row (1, 2, 3, ...), and start again after a success
        self.cap_misses = self.cap_misses + 1 if done == 0 else 0
        self.cap_skips = self.cap_misses

    def _cap_probe(self, candidates: np.ndarray, cap: float) -> float | None:
        """One probe of :meth:`fill_caps`: freezes ``candidates`` at their caps where the level ``cap`` is feasible
        (returns None), else returns the probe's level."""
        self.cap_probes += 1
        active = ~self.frozen
        mask = np.zeros_like(active)
        mask[candidates] = True
        weight = self.tree.entity_weights[self.tree.entity]
        start = float((self.achieved[active] / weight[active]).min())  # t_0: the level the point reaches
        held = mask & (self.most / weight <= start)  # the point holds them at their caps already (as cap)
        if held.any():
            self._freeze(held, np.minimum(self.most, self.achieved))
            mask &= ~held
            candidates = np.flatnonzero(mask)
            active = ~self.frozen
            if not mask.any():
                return None
        slope = np.where(active, weight, 0.0)
        slope[candidates] = (self.most[candidates] - weight[candidates] * start) / (cap - start)
        offset = np.where(mask, (slope - weight) * start, 0.0)
        saved = self.last, self.achieved, self.idle_gpus, self.idle_time
        basis = self.lps.basis()
        # unrefined: the probe decides at CAP_REACHED, far above the solver's tolerances, and a job it
        # freezes holds its cap, known exactly, less the give
        level = self.level_lp(slope, offset, active, refine=False)
        if level is not None and level.t >= (1.0 - self.cap_reached) * cap:
            self._freeze(mask, level.target)
            return None
        self.last, self.achieved, self.idle_gpus, self.idle_time = saved
        self.lps.set_basis(basis)  # the next LP starts from the basis before the probe
        return -np.inf if level is None else level.t

    def restore(self) -> None:
        """Where the point holds jobs below their levels (within the give) and the room is free, one more
        LP raises them all by a common fraction: max lambda <= 1 with ``n_i >= lambda L_i`` for every job, so
        the answer does not depend on where in the give a solver's point lies."""
        if not (self.achieved < self.level * (1.0 - RESTORE_TOL)).any():
            return
        model = self.lps.model(self.rows, self.level / self.rows, np.zeros_like(self.rows), None, None)
        col_ub = model.col_ub.copy()
        col_ub[self.lps.tau_col] = 1.0
        # dual simplex: from the last level LP's basis it took a fifth of primal simplex's time (2,048 jobs)
        solution = self.lps.solve(replace(model, col_ub=col_ub), refine=True, dual=True)
        if solution.status is Status.OPTIMAL:  # otherwise the last level LP's point stands
            self._point(solution)

    def result(self, first_level: float | None, how: str) -> PolicyResult:
        solution, x = self.last
        base = self.lps.base
        X = x[base.X.columns].reshape(base.X.shape)
        if how == "done":  # trim each job's time alone down to its level
            excess, own = self.achieved - self.level, (self.alone * X).sum(axis=1)
            X = X * (1.0 - np.clip(np.divide(excess, own, out=np.zeros_like(own), where=own > 0), 0.0, 1.0)
                     )[:, None]
            status, message = Status.OPTIMAL, f"Optimal water-filling allocation: {self.iterations} levels."
        else:
            status = solution.status
            message = f"{solution.message} (water-filling stopped at iteration {self.iterations})"
        P = None if base.P is None else clean_matrix(x[base.P.columns].reshape(base.P.shape))
        levels = np.minimum(self.level, self.achieved) if how == "done" else self.level  # what X attains
        if how == "done":  # the first level X attains: t*_1, less the give of its jobs' levels
            first = self.first_slope > 0
            first_level = min(first_level, float((levels[first] / self.first_slope[first]).min()))
        extras = {"levels": levels / self.problem.priority_weights, "num_iterations": self.iterations,
                  "num_cap_probes": self.cap_probes, "num_refinements": self.lps.refinements,
                  "num_lp_solves": self.solver.num_solves - self.solves_before,
                  "num_exact_lp_solves": self.lps.exact_solves}
        return PolicyResult(clean_matrix(X), first_level, status, P, message, extras)
