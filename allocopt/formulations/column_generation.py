"""Space-sharing max-min fairness by column generation over the pair columns.

The pairwise LP (:func:`~allocopt.formulations.base.base_model` with
``space_sharing=True`` plus the epigraph of
:mod:`~allocopt.formulations.max_min_fairness`) in maximization form, with
``g_i = s_i / (w_i p_i)`` (``s_i / w_i`` when not heterogeneity aware)::

    max t
    sum_j X[i, j] + sum_{p ∋ i} sum_j P[p, j] <= 1             ("time", dual y_i)
    sum_i s_i X[i, j] + sum_p s_p P[p, j] <= c_j               ("capacity", dual z_j)
    g_i (T_i . X_i + sum_{p ∋ i} sum_j PT[p, j, i] P[p, j]) - t >= 0
                                                  ("normalized_throughput", dual u_i)

(not heterogeneity aware: ``T`` and ``PT`` are 1 on usable entries). The
duals :attr:`~allocopt.solution.Solution.duals` reports are ``d objective /
d delta`` for a shift ``delta`` of a row's bounds, so ``y, z >= 0`` and
``u <= 0``. Raising a column with row coefficients ``a_r`` from 0 by
``eps`` moves row ``r``'s activity by ``a_r eps``, the same as shifting its
bounds by ``-a_r eps`` for ``<=`` and ``>=`` rows alike; the objective
coefficient of ``P`` is 0, so the reduced cost of ``P[p, j]`` for pair
``p = (a, b)`` is::

    rc[p, j] = - sum_r a_r dual_r
             = -u_a g_a PT[p, j, a] - u_b g_b PT[p, j, b] - y_a - y_b - s_p z_j

(``rc > 0``: the column would raise ``t``). Entries a pair cannot use (both
throughputs 0, or ``s_p > c_j``) have an upper bound of 0 and are never priced
in. Column generation solves the LP restricted to the current pairs (all
single-job columns ``X`` are always present), prices every pair with these
duals in one vectorized pass and adds pairs with some ``rc[p, j]`` above
``rtol * max(1, |t|)``; when none is left the restricted duals are feasible for
the full LP, so the restricted optimum is the pairwise optimum.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import replace

import numpy as np

from allocopt.errors import InvalidOptionError, NotOptimalError
from allocopt.formulations.base import ModelSolver, PolicyResult, base_model
from allocopt.formulations.job_types import TypeModel, all_distinct, job_type_groups
from allocopt.problem import PairThroughputs, Problem
from allocopt.solution import Solution, Status
from allocopt.warm_start import WarmStart


def _pair_coefficients(problem: Problem, heterogeneity_aware: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per pair and GPU type, each member's coefficient in its epigraph row
    (shape (n_pairs, k, 2)), and whether the entry is usable (shape (n_pairs, k))."""
    pairs, PT = problem.pairs, problem.pair_throughput_array
    scale = problem.scale_factors / problem.priority_weights
    usable = (PT.sum(axis=2) > 0) & (problem.scale_factors[pairs[:, 0], None] <= problem.capacity[None, :])
    if heterogeneity_aware:
        g = scale / problem.proportional_throughputs
        coef = PT * g[pairs][:, None, :]
    else:
        coef = np.broadcast_to(scale[pairs][:, None, :], PT.shape)
    return np.where(usable[:, :, None], coef, 0.0), usable


def _pair_gain(PT: np.ndarray, alone: np.ndarray, usable: np.ndarray) -> np.ndarray:
    """Per pair ``max_j (PT_a / T_aj + PT_b / T_bj)`` over usable types (``PT`` (m, k, 2), ``alone`` the
    members' throughputs (m, 2, k)): the pair's combined speed relative to its members running alone
    (-inf if none)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = PT / alone.transpose(0, 2, 1)
    return np.where(usable, np.nan_to_num(rel, nan=0.0, posinf=0.0).sum(axis=2), -np.inf).max(axis=1)


def _top_per_job(pairs: np.ndarray, score: np.ndarray, per_job: int) -> np.ndarray:
    """Indices of the pairs among each job's ``per_job`` pairs of highest finite ``score``."""
    m = pairs.shape[0]
    job = np.concatenate([pairs[:, 0], pairs[:, 1]])
    pair = np.tile(np.arange(m), 2)
    both = np.tile(score, 2)
    order = np.lexsort((-both, job))
    job, pair, both = job[order], pair[order], both[order]
    rank = np.arange(job.size) - np.searchsorted(job, job)
    return np.unique(pair[(rank < per_job) & np.isfinite(both)])


def _restricted(problem: Problem, chosen: np.ndarray) -> Problem:
    """``problem`` with only the pairs ``chosen`` (indices into ``problem.pairs``)."""
    ids = problem.job_ids
    jobs = [(ids[a], ids[b]) for a, b in problem.pairs[chosen].tolist()]
    return Problem(problem.throughputs, problem.cluster, job_ids=ids, scale_factors=problem.scale_factors,
                   priority_weights=problem.priority_weights,
                   pair_throughputs=PairThroughputs(jobs, problem.pair_throughput_array[chosen]))


#: Tuning settings of :func:`max_min_fairness_column_generation`, given as
#: ``allocopt.solve(..., column_generation={"max_iterations": 50, ...})``.
COLUMN_GENERATION_SETTINGS = ("initial_pairs", "pairs_per_job", "max_iterations", "rtol")


def max_min_fairness_column_generation(problem: Problem, solver: ModelSolver, *, heterogeneity_aware: bool = True,
                                       initial_pairs: int = 1, pairs_per_job: int = 1, max_iterations: int = 100,
                                       rtol: float = 1e-7) -> PolicyResult:
    """Space-sharing max-min fairness by column generation (see the module docstring).

    Starts from the single-job columns plus each job's ``initial_pairs`` pairs
    of highest gain (see :func:`_pair_gain`); each round adds, per job, the
    ``pairs_per_job`` priced-in pairs of highest reduced cost (partial pricing:
    max-min duals are degenerate, and most priced-in pairs never enter an
    optimal basis). Stops with the pairwise optimum when no pair has reduced
    cost above ``rtol * max(1, |objective|)``; after ``max_iterations`` LPs
    without converging raises :class:`~allocopt.errors.NotOptimalError`, or
    with ``best_effort`` returns the restricted optimum with status
    ``TIME_LIMIT``. ``extras``: ``iterations``, ``columns_added`` (pairs added by
    pricing), ``pairs_generated`` (pairs in the final LP) and ``pairs_considered``.

    Where jobs repeat (:func:`~allocopt.formulations.job_types.job_type_groups`), the columns are those of
    job-type pairs in the LP over job types (:mod:`~allocopt.formulations.job_types`; a type pair's column
    stands for all its pairs, and ``initial_pairs`` / ``pairs_per_job`` count per type): its time, capacity
    and epigraph rows are the per-job rows summed over each type, so the same pricing applies with each
    member's coefficients divided by its type's size. ``extras`` then adds those of the type LP and
    ``type_pairs_generated`` / ``type_pairs_considered``; ``pairs_generated`` counts the pairs of the
    generated type pairs. (POP's figure-2 instance: 2,048 jobs of 26 kinds, 2,096,128 pairs, 351 type pairs.)
    """
    if problem.pairs is None:
        raise InvalidOptionError("column generation needs Problem(pair_throughputs=...): the throughput "
                                 "of each pair of jobs that may share GPUs")
    if max_iterations < 1 or pairs_per_job < 1 or initial_pairs < 0:
        raise InvalidOptionError(f"need max_iterations >= 1, pairs_per_job >= 1 and initial_pairs >= 0, got "
                                 f"{max_iterations}, {pairs_per_job} and {initial_pairs}")
    weight = problem.scale_factors / problem.priority_weights
    if heterogeneity_aware:
        weight = weight / problem.proportional_throughputs
    if not all_distinct(problem) and job_type_groups(problem)[1].size < problem.num_jobs:
        space: _Columns = _TypePairs(problem, heterogeneity_aware, weight)
    else:
        space = _JobPairs(problem, heterogeneity_aware, weight)
    pairs, m = space.pairs, space.pairs.shape[0]
    in_lp = np.zeros(m, dtype=bool)
    if initial_pairs:
        in_lp[_top_per_job(pairs, space.gain, initial_pairs)] = True
    added, converged = 0, False
    for iteration in range(1, max_iterations + 1):
        chosen = np.flatnonzero(in_lp)
        solution = space.solve(chosen, solver)
        if not solution.success:  # best_effort accepted a non-optimal restricted LP: no duals to price with
            break
        if not {"time", "capacity", "normalized_throughput"} <= solution.duals.keys():
            raise InvalidOptionError(f"column generation needs row duals, and backend {solution.backend!r} "
                                     "reported none; use highs, gurobi, scipy, cvxpy or pulp")
        y, z = solution.duals["time"], solution.duals["capacity"]
        u = solution.duals["normalized_throughput"]
        rc = (-(space.coef * u[pairs][:, None, :]).sum(axis=2) - (y[pairs] * space.share).sum(axis=1)[:, None]
              - space.pair_scale[:, None] * z[None, :])
        # what the column can add to the objective at most, to first order: its reduced cost times the most
        # its variable can be (a job pair's time 1; a type pair's up to its smaller type's size)
        best = np.where(space.usable, rc, -np.inf).max(axis=1) * space.most
        priced = (best > rtol * max(1.0, abs(solution.objective))) & ~in_lp
        if not priced.any():
            converged = True
            break
        new = _top_per_job(pairs, np.where(priced, best, -np.inf), pairs_per_job)
        in_lp[new] = True
        added += new.size
    result = space.result(solution, chosen, {"iterations": iteration, "columns_added": added})
    if converged or not solution.success:
        return result
    message = (f"column generation did not converge in max_iterations={max_iterations} LPs "
               f"({int(priced.sum())} pairs still priced in); raise max_iterations")
    if not solver.best_effort:
        raise NotOptimalError(message, status=Status.TIME_LIMIT, solution=solution)
    return replace(result, status=Status.TIME_LIMIT, message=message)


class _Columns(ABC):
    """The pair columns column generation prices: ``pairs`` (m, 2) of the LP's units (jobs or job types),
    each member's epigraph-row coefficient per GPU type ``coef`` (m, k, 2) and time-row coefficient ``share``
    (m, 2), the most its variable can be ``most`` (m,; its time rows bound it), the GPUs a pair occupies
    ``pair_scale`` (m,), ``usable`` (m, k) and ``gain`` (m,)."""

    pairs: np.ndarray
    coef: np.ndarray
    share: np.ndarray
    most: np.ndarray
    pair_scale: np.ndarray
    usable: np.ndarray
    gain: np.ndarray

    @abstractmethod
    def solve(self, chosen: np.ndarray, solver: ModelSolver) -> Solution:
        """The LP restricted to the pairs ``chosen`` (indices into ``pairs``)."""

    @abstractmethod
    def result(self, solution: Solution, chosen: np.ndarray, extras: dict) -> PolicyResult:
        """The allocation of the restricted LP's ``solution``."""


class _JobPairs(_Columns):
    """The pairs of jobs (:func:`~allocopt.formulations.base.base_model` with ``space_sharing``)."""

    def __init__(self, problem: Problem, heterogeneity_aware: bool, weight: np.ndarray):
        self.problem, self.heterogeneity_aware, self.weight = problem, heterogeneity_aware, weight
        self.pairs = problem.pairs
        self.coef, self.usable = _pair_coefficients(problem, heterogeneity_aware)
        self.share = np.ones(self.pairs.shape, dtype=np.float64)
        self.most = np.ones(self.pairs.shape[0])
        self.pair_scale = problem.scale_factors[self.pairs[:, 0]].astype(np.float64)
        self.gain = _pair_gain(problem.pair_throughput_array, problem.throughputs[self.pairs], self.usable)
        self.start_from: WarmStart | None = None

    def solve(self, chosen: np.ndarray, solver: ModelSolver) -> Solution:
        self.base = base_model(_restricted(self.problem, chosen), name="max_min_fairness_column_generation",
                               space_sharing=True)
        normalized = (self.base.throughput if self.heterogeneity_aware else self.base.time) * self.weight
        self.base.model.maximize_minimum(normalized, name="normalized_throughput")
        start = self.start_from
        solution = solver.solve(self.base.model, "max_min_fairness (column generation)",
                                start_from=(start, chosen.tolist()) if start else None)
        # the next LP starts from this basis, its pair columns matched by pair index (new ones at zero)
        start = solver.warm_start_out()
        self.start_from = start and WarmStart(tuple(chosen.tolist()), start.solves)
        return solution

    def result(self, solution: Solution, chosen: np.ndarray, extras: dict) -> PolicyResult:
        X, P_chosen = self.base.matrices(solution)
        P = np.zeros((self.pairs.shape[0], self.problem.cluster.num_gpu_types))
        P[chosen] = P_chosen
        extras = {**extras, "pairs_generated": int(chosen.size), "pairs_considered": self.pairs.shape[0]}
        return PolicyResult(X, solution.objective, solution.status, P, solution.message, extras)


class _TypePairs(_Columns):
    """The pairs of job types (the LP over job types of :mod:`~allocopt.formulations.job_types`)."""

    def __init__(self, problem: Problem, heterogeneity_aware: bool, weight: np.ndarray):
        self.problem, self.heterogeneity_aware = problem, heterogeneity_aware
        whole = TypeModel(problem, "max_min_fairness_column_generation", True, np.zeros(0, dtype=np.int64))
        self.pairs, count, rows = whole.type_pairs, whole.count, whole.rows
        self.weight = weight[rows]
        self.share = 1.0 / count[self.pairs]
        same = self.pairs[:, 0] == self.pairs[:, 1]  # both members in one time row
        self.most = 1.0 / np.where(same, self.share.sum(axis=1), self.share.max(axis=1))
        PT = whole.type_PT
        values = PT if heterogeneity_aware else np.ones_like(PT)
        self.coef = np.where(whole.usable[:, :, None], values * (self.weight[self.pairs] * self.share)[:, None, :],
                             0.0)
        self.usable = whole.usable
        self.pair_scale = whole.scale[self.pairs[:, 0]]
        self.gain = _pair_gain(PT, whole.T[self.pairs], self.usable)
        self.pairs_per_type_pair = whole.pairs_per_key

    def solve(self, chosen: np.ndarray, solver: ModelSolver) -> Solution:
        self.types = TypeModel(self.problem, "max_min_fairness_column_generation", True, chosen)
        normalized = (self.types.throughput if self.heterogeneity_aware else self.types.time) * self.weight
        self.types.model.maximize_minimum(normalized, name="normalized_throughput")
        return solver.solve(self.types.model, "max_min_fairness (column generation by job type)")

    def result(self, solution: Solution, chosen: np.ndarray, extras: dict) -> PolicyResult:
        extras = {**extras, "pairs_generated": int(self.pairs_per_type_pair[chosen].sum()),
                  "pairs_considered": self.problem.pairs.shape[0], "type_pairs_generated": int(chosen.size),
                  "type_pairs_considered": self.pairs.shape[0]}
        return self.types.spread(solution, extras)
