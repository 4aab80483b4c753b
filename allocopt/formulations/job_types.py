"""Max-min fairness and max throughput over job TYPES instead of jobs.

Jobs are interchangeable when they have the same throughput row, scale factor
and priority weight and, under space sharing, the same pair throughputs with
every job of every type (a pair missing from ``problem.pairs`` counts as
``(0, 0)``: the two cannot share). Permuting interchangeable jobs maps
allocations to allocations of the same objective, so averaging an optimal
allocation over each type's members is still optimal: some optimum gives every
job of a type the same allocation. The LP over types (``G`` types of ``n_g``
jobs, type pairs ``r = (g, h)``, ``g <= h``; with ``h == g`` when ``n_g >= 2``)::

    X[g, j] >= 0     time of EACH job of type g alone on GPU type j
    Q[r, j] >= 0     time of ALL job pairs of type pair r on GPU type j, summed
    sum_j X[g, j] + sum_{r ∋ g} m_gr sum_j Q[r, j] / n_g <= 1     ("time")
    sum_g n_g s_g X[g, j] + sum_r s_r Q[r, j] <= c_j               ("capacity")
    e_g = T_g . X_g + sum_r sum_j PT_r[j, member g] Q[r, j] / n_g

(``m_gr`` = 2 when ``r = (g, g)``, since both members are of type g, else 1)
has ``(G + |r|) k`` columns and ``G + k`` rows (plus the objective's), whatever the number of jobs.
Its optimum is the pairwise LP's (:func:`~allocopt.formulations.base.base_model`),
and it spreads back to a feasible allocation of the pairwise LP with the same
objective: every job of type g gets ``X[g]`` alone, every concrete pair of
type pair ``r`` gets ``Q[r] / (number of concrete pairs of r)``.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from allocopt.errors import InvalidOptionError
from allocopt.formulations.base import ModelSolver, PolicyResult, clean_matrix
from allocopt.model import LinExpr, Model, Variable
from allocopt.problem import Problem
from allocopt.solution import Solution


def _directed_pairs(problem: Problem) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each pair seen from both members: job row, partner row and the
    ``(own, partner)`` steps/s per GPU type flattened to ``2 k`` values."""
    pairs, PT = problem.pairs, problem.pair_throughput_array
    m = pairs.shape[0]
    job = np.concatenate([pairs[:, 0], pairs[:, 1]])
    partner = np.concatenate([pairs[:, 1], pairs[:, 0]])
    values = np.concatenate([PT.reshape(m, -1), PT[:, :, ::-1].reshape(m, -1)])
    return job, partner, values


def _partner_ranges(labels: np.ndarray, job: np.ndarray, partner: np.ndarray,
                    values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For every (job, partner type) with at least one pair: the job row, the
    type, and the elementwise min and max of its pair throughputs with members
    of that type, a missing pair counting as zeros."""
    n_types = int(labels.max()) + 1
    key = job * n_types + labels[partner]
    order = np.argsort(key, kind="stable")
    key, values = key[order], values[order]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    low = np.minimum.reduceat(values, starts, axis=0)
    high = np.maximum.reduceat(values, starts, axis=0)
    count = np.diff(np.r_[starts, key.size])
    rows, types = key[starts] // n_types, key[starts] % n_types
    partners = np.bincount(labels, minlength=n_types)[types] - (labels[rows] == types)
    missing = count < partners
    low[missing] = np.minimum(low[missing], 0.0)
    high[missing] = np.maximum(high[missing], 0.0)
    return rows, types, low, high


def _relabel(rows: np.ndarray) -> np.ndarray:
    """Group index of each row of ``rows``, groups numbered by first appearance.

    Rows are grouped by a hash of their bits (elementwise integer arithmetic,
    so equal rows always hash alike; one sort of n integers) and the grouping
    is checked exactly (every row equals its group's first); on a collision
    the rows are sorted whole (``np.unique(axis=0)``, several times slower)."""
    rows = np.ascontiguousarray(rows, dtype=np.float64) + 0.0  # -0.0 and 0.0 hash alike
    bits = rows.view(np.uint64)
    key = np.zeros(rows.shape[0], dtype=np.uint64)
    for column in bits.T:
        key = (key ^ column) * np.uint64(0x100000001B3)  # FNV-style mixing, wrapping modulo 2**64
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    if not np.array_equal(rows[first[inverse]], rows):
        _, first, inverse = np.unique(rows, axis=0, return_index=True, return_inverse=True)
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first)] = np.arange(first.size)
    return rank[inverse.reshape(-1)]


def group_rows(columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Groups of equal rows of ``columns`` (shape (n, m)): the group of each row (numbered by first
    appearance) and the first row of each group (increasing)."""
    labels = _relabel(columns)
    running = np.maximum.accumulate(labels)
    return labels, np.flatnonzero(np.r_[True, running[1:] > running[:-1]])


#: Per space_sharing flag, the last problem grouped (a weak reference) and its groups.
_LAST_GROUPS: dict[bool, tuple[weakref.ref, tuple[np.ndarray, np.ndarray]]] = {}


def job_type_groups(problem: Problem, *, space_sharing: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Group interchangeable jobs into job types.

    Jobs start grouped by (throughput row, scale factor, priority weight);
    with ``space_sharing`` and ``problem.pairs`` the groups are refined until
    every job of a type sees the same pair throughputs with every member of
    each type (partition refinement on the range of pair throughputs per
    partner type; a type whose members a job cannot tell apart by range but
    whose pair throughputs still differ is split into single jobs).

    Parameters
    ----------
    problem : Problem
    space_sharing : bool, default True
        Also require identical pair throughputs (ignored without ``problem.pairs``).

    Returns
    -------
    type_of_job : int ndarray of shape (n_jobs,)
        Type index of each job; types numbered by their first job.
    representative_rows : int ndarray of shape (n_types,)
        Row of the first job of each type (increasing).
    """
    last = _LAST_GROUPS.get(space_sharing)
    if last is not None and last[0]() is problem:
        return last[1]  # the same problem again (auto technique selection, then the solve)
    base = np.column_stack([problem.throughputs, problem.scale_factors, problem.priority_weights])
    labels = _relabel(base)
    if space_sharing and problem.pairs is not None and problem.pairs.shape[0]:
        job, partner, values = _directed_pairs(problem)
        n, width = problem.num_jobs, values.shape[1]
        while True:
            n_types = int(labels.max()) + 1
            rows, types, low, high = _partner_ranges(labels, job, partner, values)
            signature = np.zeros((n, n_types, 2 * width))
            signature[rows, types] = np.hstack([low, high])
            refined = _relabel(np.column_stack([labels, signature.reshape(n, -1)]))
            if refined.max() > labels.max():
                labels = refined
                continue
            mixed = (low != high).any(axis=1)
            if not mixed.any():
                break
            split = np.isin(labels, types[mixed])
            labels = labels.copy()
            labels[split] = n_types + np.arange(int(split.sum()))
            labels = _relabel(labels[:, None])
    # labels are numbered by first appearance: a label is new where it exceeds every earlier one
    running = np.maximum.accumulate(labels)
    representative_rows = np.flatnonzero(np.r_[True, running[1:] > running[:-1]])
    _LAST_GROUPS[space_sharing] = (weakref.ref(problem), (labels, representative_rows))
    return labels, representative_rows


def all_distinct(problem: Problem) -> bool:
    """Whether every job is its own type without space sharing (the type LP is then the per-job LP)."""
    return int(job_type_groups(problem, space_sharing=False)[1].size) == problem.num_jobs


#: The last problem whose type pairs were indexed (a weak reference), its labels and that index.
_LAST_TYPE_PAIRS: list = []


def _type_pairs(problem: Problem, type_of_job: np.ndarray, n_types: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The type pairs ``(g, h)``, ``g <= h``, of ``problem.pairs`` (n_type_pairs, 2), each one's pair
    throughputs (of its first pair, members in type order), the type pair of each pair and the number
    of pairs of each (the last problem's again from a cache: column generation builds its LP over
    types once per round)."""
    if _LAST_TYPE_PAIRS and _LAST_TYPE_PAIRS[0]() is problem and _LAST_TYPE_PAIRS[1] is type_of_job:
        return _LAST_TYPE_PAIRS[2]
    a, b = type_of_job[problem.pairs[:, 0]], type_of_job[problem.pairs[:, 1]]
    key = np.minimum(a, b) * n_types + np.maximum(a, b)
    keys, first, pair_key, per_key = np.unique(key, return_index=True, return_inverse=True, return_counts=True)
    PT = problem.pair_throughput_array[first]
    PT = np.where((a[first] > b[first])[:, None, None], PT[:, :, ::-1], PT)
    index = (np.column_stack([keys // n_types, keys % n_types]), PT, pair_key.reshape(-1), per_key)
    _LAST_TYPE_PAIRS[:] = [weakref.ref(problem), type_of_job, index]
    return index


class TypeModel:
    """The LP over job types (see the module docstring) and how to spread its
    solution back to jobs and pairs."""

    def __init__(self, problem: Problem, name: str, space_sharing: bool, type_pairs: np.ndarray | None = None):
        """``type_pairs``: the indices (into the attribute ``type_pairs``) of the type pairs that get
        columns (default all; column generation)."""
        if space_sharing and problem.pairs is None:
            raise InvalidOptionError("space_sharing=True needs Problem(pair_throughputs=...): the throughput "
                                     "of each pair of jobs that may share GPUs")
        self.problem = problem
        self.type_of_job, self.rows = job_type_groups(problem, space_sharing=space_sharing)
        n_types, k = self.rows.size, problem.cluster.num_gpu_types
        self.count = np.bincount(self.type_of_job, minlength=n_types).astype(np.float64)
        self.scale = problem.scale_factors[self.rows].astype(np.float64)
        self.T = problem.throughputs[self.rows]
        self.model = Model(name)
        # no upper bound of 1 (the time rows imply it), as in the per-job LP: redundant bounds slow HiGHS down
        self.X = self.model.add_variable("X", (n_types, k), lb=0.0,
                                         ub=np.where(problem.runnable[self.rows], np.inf, 0.0))
        self.time = self.X.sum(axis=1)
        gpus = (self.X * (self.count * self.scale)[:, None]).sum(axis=0)
        self.throughput: LinExpr = (self.X * self.T).sum(axis=1)
        self.Q: Variable | None = None
        if space_sharing:
            self._add_type_pairs(type_pairs)
            gpus = gpus + (self.Q * self.scale[self.type_pairs[self.chosen, 0], None]).sum(axis=0)
        self.model.add_constraint("time", self.time <= 1.0)
        self.model.add_constraint("capacity", gpus <= problem.capacity)

    def _add_type_pairs(self, chosen: np.ndarray | None) -> None:
        problem, n_types = self.problem, self.rows.size
        # type_PT: (n_type_pairs, k, 2), steps/s of the member of each type
        self.type_pairs, self.type_PT, self.pair_key, self.pairs_per_key = _type_pairs(problem, self.type_of_job,
                                                                                       n_types)
        self.usable = (self.type_PT.sum(axis=2) > 0) & (self.scale[self.type_pairs[:, 0], None] <= problem.capacity)
        self.chosen = np.arange(self.type_pairs.shape[0]) if chosen is None else np.asarray(chosen, dtype=np.int64)
        pairs, PT, m = self.type_pairs[self.chosen], self.type_PT[self.chosen], self.chosen.size
        self.Q = self.model.add_variable("Q", (m, problem.cluster.num_gpu_types), lb=0.0,
                                         ub=np.where(self.usable[self.chosen], np.inf, 0.0))
        cols = np.arange(m)
        import scipy.sparse as sp  # only with pairs: scipy costs a fresh process 0.1 s to import

        first_member = sp.csr_matrix((1.0 / self.count[pairs[:, 0]], (pairs[:, 0], cols)), shape=(n_types, m))
        second_member = sp.csr_matrix((1.0 / self.count[pairs[:, 1]], (pairs[:, 1], cols)), shape=(n_types, m))
        self.time = self.time + (first_member + second_member) @ self.Q.sum(axis=1)
        self.throughput = (self.throughput + first_member @ (self.Q * PT[:, :, 0]).sum(axis=1)
                           + second_member @ (self.Q * PT[:, :, 1]).sum(axis=1))

    def result(self, solver: ModelSolver, what: str, extras: dict[str, Any] | None = None) -> PolicyResult:
        """Solve and spread the type-level solution back to jobs and pairs."""
        return self.spread(solver.solve(self.model, what), extras)

    def spread(self, solution: Solution, extras: dict[str, Any] | None = None) -> PolicyResult:
        """The type-level ``solution`` spread back to jobs and pairs."""
        X = clean_matrix(solution.values["X"])
        out = {"type_of_job": self.type_of_job, "type_rows": self.rows, "type_matrix": X, **(extras or {})}
        pair_matrix = None
        if self.Q is not None:
            Q = np.zeros((self.type_pairs.shape[0], self.problem.cluster.num_gpu_types))
            Q[self.chosen] = np.maximum(solution.values["Q"], 0.0)
            pair_matrix = clean_matrix(Q[self.pair_key] / self.pairs_per_key[self.pair_key, None])
            out.update(type_pairs=self.type_pairs, type_pair_matrix=Q)
        return PolicyResult(X[self.type_of_job], solution.objective, solution.status, pair_matrix,
                            solution.message, out)


def max_min_fairness_by_job_type(problem: Problem, solver: ModelSolver, *, heterogeneity_aware: bool = True,
                                 space_sharing: bool = True) -> PolicyResult:
    """Weighted max-min fairness (see :mod:`allocopt.formulations.max_min_fairness`)
    solved over job types and spread back to jobs.

    ``extras`` of the result: ``type_of_job`` (n_jobs,), ``type_rows``
    (n_types,), ``type_matrix`` (n_types, n_gpu_types; per-job time alone),
    and under space sharing ``type_pairs`` (n_type_pairs, 2) and
    ``type_pair_matrix`` (n_type_pairs, n_gpu_types; summed over the pairs of
    each type pair).
    """
    types = TypeModel(problem, "max_min_fairness_by_job_type", space_sharing)
    weight = problem.scale_factors[types.rows] / problem.priority_weights[types.rows]
    if heterogeneity_aware:
        normalized = types.throughput * (weight / problem.proportional_throughputs[types.rows])
    else:
        normalized = types.time * weight
    types.model.maximize_minimum(normalized, name="normalized_throughput")
    return types.result(solver, "max_min_fairness (by job type)")


def max_throughput_by_job_type(problem: Problem, solver: ModelSolver, *, normalize_by_cost: bool = False,
                               space_sharing: bool = True) -> PolicyResult:
    """Maximum total throughput (steps/s, or steps per unit cost with
    ``normalize_by_cost``) solved over job types; ``extras`` as for
    :func:`max_min_fairness_by_job_type`. Deadlines are not supported."""
    if problem.slos is not None and np.isfinite(problem.slos).any():
        raise InvalidOptionError("max_throughput by job type does not support deadlines (Problem.slos); "
                                 "solve it per job")
    if normalize_by_cost and problem.costs is None:
        raise InvalidOptionError("normalize_by_cost=True needs Problem(costs=...) with a price per GPU type")
    types = TypeModel(problem, "max_throughput_by_job_type", space_sharing)
    if normalize_by_cost:
        total = (types.X * (types.count[:, None] * types.T / problem.costs)).sum()
        if types.Q is not None:
            total = total + (types.Q * (types.type_PT.sum(axis=2) / problem.costs)).sum()
    else:
        total = types.throughput.dot(types.count)
    types.model.maximize(total)
    return types.result(solver, "max_throughput (by job type)",
                        {"deadline_met": np.ones(problem.num_jobs, dtype=bool)})
