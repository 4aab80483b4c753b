"""Heuristic baselines that published comparisons use: FIFO, Gandiva and AlloX.

They take the same :class:`~allocopt.Problem` as the optimization policies and
return whole-GPU-type assignments (fractions 0 or 1, or an even time split for
Gandiva). Unlike Gavel's implementations they keep no state between calls:
arrival order comes from ``Problem.time_since_start`` (oldest first; job order
when absent) and randomness from an explicit ``seed``.

``fifo``
    Jobs in arrival order each take ``scale_factor`` GPUs of one type while
    some type has room; the first job that fits nowhere stops the queue (no
    job jumps ahead). The type is drawn at random among those with room, or
    with ``heterogeneity_aware=True`` the job's fastest type with room. With
    ``space_sharing=True`` (Gavel's ``fifo_packed``) each job left in the
    queue is then paired with the running job of equal scale factor whose
    pair has the largest normalized throughput ``sum_k T_pair_k / T_k`` above
    ``packing_threshold`` (1.5), replacing that job's solo time.
``gandiva``
    Time is split evenly over the cluster (the isolated share). When the jobs
    ask for more GPUs than the cluster has, jobs of equal scale factor are
    first paired at random (seeded) among pairs that gain from sharing
    (normalized pair throughput >= 1 on every type), and the time is split
    evenly over the resulting combinations. Xiao et al., OSDI 2018.
``allox``
    Single-GPU jobs are matched to individual GPUs by a min-cost assignment
    (``scipy.optimize.linear_sum_assignment``): placing job ``i`` ``k``-th
    from last on GPU ``g`` costs ``k * r_i / T[i, type(g)] + t_i``, i.e. the
    total completion time including waiting time. Only the oldest
    ``max(#GPUs, alpha * n)`` jobs are considered; the job first in line on
    each GPU runs. Le et al., "AlloX", EuroSys 2020.
"""

from __future__ import annotations

import numpy as np

from allocopt.errors import InvalidOptionError, InvalidProblemError
from allocopt.formulations.base import ModelSolver, Policy, PolicyResult
from allocopt.formulations.shares import isolated_matrix
from allocopt.problem import Problem


def arrival_order(problem: Problem) -> np.ndarray:
    """Job rows from oldest to newest (stable: job order breaks ties)."""
    if problem.time_since_start is None:
        return np.arange(problem.num_jobs)
    return np.argsort(-problem.time_since_start, kind="stable")


def _pair_gain(problem: Problem) -> np.ndarray:
    """Normalized throughput of each pair on each type, ``sum_k T_pair_k / T_k``; 0 where
    either member cannot run; shape (n_pairs, n_gpu_types)."""
    T = problem.throughputs
    alone = np.stack([T[problem.pairs[:, 0]], T[problem.pairs[:, 1]]], axis=2)
    with np.errstate(divide="ignore", invalid="ignore"):
        gain = np.where(alone > 0, problem.pair_throughput_array / alone, 0.0).sum(axis=2)
    both = (problem.pair_throughput_array > 0).all(axis=2)
    return np.where(both, gain, 0.0)


def _require_pairs(problem: Problem, policy: str) -> None:
    if problem.pairs is None:
        raise InvalidOptionError(f"{policy} with space sharing needs Problem(pair_throughputs=...)")


class Fifo(Policy):
    """First in, first out over whole GPU types."""
    name = "fifo"
    options = {"heterogeneity_aware": False, "space_sharing": False, "seed": 0, "packing_threshold": 1.5}

    def allocate(self, problem: Problem, solver: ModelSolver, *, heterogeneity_aware: bool = False,
                 space_sharing: bool = False, seed: int = 0, packing_threshold: float = 1.5) -> PolicyResult:
        rng = np.random.default_rng(seed)
        free = problem.capacity.astype(np.int64).copy()
        X = np.zeros(problem.throughputs.shape)
        queue = list(arrival_order(problem))
        while queue:
            i = queue[0]
            room = (free >= problem.scale_factors[i]) & problem.runnable[i]
            if not room.any():
                break
            queue.pop(0)
            choices = np.flatnonzero(room)
            j = (choices[np.argmax(problem.throughputs[i, choices])] if heterogeneity_aware
                 else rng.choice(choices))
            X[i, j] = 1.0
            free[j] -= problem.scale_factors[i]
        P = None
        if space_sharing:
            _require_pairs(problem, "fifo")
            P = self._pack(problem, X, queue, packing_threshold)
        return PolicyResult(X, None, pair_matrix=P, message="FIFO assignment.")

    @staticmethod
    def _pack(problem: Problem, X: np.ndarray, queue: list[int], threshold: float) -> np.ndarray:
        """Pair queued jobs with running ones (see the module docstring)."""
        gain = _pair_gain(problem)
        P = np.zeros(gain.shape)
        a, b = problem.pairs[:, 0], problem.pairs[:, 1]
        for i in queue:
            running = X.sum(axis=1) > 0
            candidates = np.flatnonzero(((a == i) & running[b]) | ((b == i) & running[a]))
            if candidates.size == 0:
                break
            partner = np.where(a[candidates] == i, b[candidates], a[candidates])
            types = X[partner].argmax(axis=1)
            values = gain[candidates, types]
            best = int(np.argmax(values))
            if values[best] <= threshold:
                break  # FIFO: nobody jumps ahead of a job that found no partner
            p, j = candidates[best], types[best]
            X[partner[best], j] = 0.0
            P[p, j] = 1.0
        return P


class Gandiva(Policy):
    """Gandiva's even time split with random packing: with ``space_sharing=True`` (the default)
    jobs are paired at random among the problem's pairs whose members both gain; False never packs.
    (``space_sharing`` also tells the simulator to build the pairs, as Gavel's scheduler does for
    Gandiva.)"""
    name = "gandiva"
    options = {"seed": 0, "space_sharing": True}

    def allocate(self, problem: Problem, solver: ModelSolver, *, seed: int = 0,
                 space_sharing: bool = True) -> PolicyResult:
        if problem.scale_factors.sum() <= problem.capacity.sum() or problem.pairs is None or not space_sharing:
            return PolicyResult(isolated_matrix(problem), None, message="Even time split (no packing needed).")
        rng = np.random.default_rng(seed)
        useful = (_pair_gain(problem) >= 1.0).all(axis=1)
        order = rng.permutation(np.flatnonzero(useful))
        paired = np.zeros(problem.num_jobs, dtype=bool)
        chosen = []
        for p in order:
            a, b = problem.pairs[p]
            if not (paired[a] or paired[b]):
                paired[a] = paired[b] = True
                chosen.append(p)
        n_combinations = problem.num_jobs - len(chosen)
        share = problem.capacity[None, :] / (n_combinations * problem.scale_factors[:, None].astype(np.float64))
        X = np.where(problem.runnable & ~paired[:, None], share, 0.0)
        P = np.zeros((problem.pairs.shape[0], problem.cluster.num_gpu_types))
        if chosen:
            chosen_pairs = np.array(chosen)
            members = problem.pairs[chosen_pairs, 0]
            usable = (problem.pair_throughput_array[chosen_pairs] > 0).all(axis=2)
            P[chosen_pairs] = np.where(usable, share[members], 0.0)
        for M in (X, P):
            rows = M.sum(axis=1, keepdims=True)
            np.divide(M, rows, out=M, where=rows > 1.0)
        return PolicyResult(X, None, pair_matrix=P, message=f"Even time split over {n_combinations} "
                                                             f"combinations ({len(chosen)} random pairs).")


class AlloX(Policy):
    """AlloX's min-cost matching of single-GPU jobs to GPUs."""
    name = "allox"
    options = {"alpha": 0.3}

    def allocate(self, problem: Problem, solver: ModelSolver, *, alpha: float = 0.3) -> PolicyResult:
        if not 0 < alpha <= 1:
            raise InvalidOptionError(f"alpha must be in (0, 1], got {alpha!r}")
        multi = np.flatnonzero(problem.scale_factors != 1)
        if multi.size:
            raise InvalidProblemError(f"allox assigns single GPUs; job {problem.job_ids[multi[0]]!r} has "
                                      f"scale_factor={problem.scale_factors[multi[0]]}", field="scale_factors",
                                      job=problem.job_ids[multi[0]])
        if problem.num_steps_remaining is None:
            raise InvalidProblemError("allox needs Problem(num_steps_remaining=...)", field="num_steps_remaining")
        gpu_type = np.repeat(np.arange(problem.cluster.num_gpu_types), problem.capacity)
        n_gpus = gpu_type.size
        jobs = arrival_order(problem)[:min(problem.num_jobs, max(n_gpus, int(alpha * problem.num_jobs)))]
        m = jobs.size
        T = problem.throughputs[jobs][:, gpu_type]
        with np.errstate(divide="ignore"):
            q = np.where(T > 0, problem.num_steps_remaining[jobs, None] / T, np.inf)
        waited = (problem.time_since_start[jobs] if problem.time_since_start is not None else np.zeros(m))
        position = np.arange(1, m + 1)
        cost = (position[None, :, None] * q[:, None, :] + waited[:, None, None]).reshape(m, m * n_gpus)
        cost = np.where(np.isfinite(cost), cost, cost[np.isfinite(cost)].max(initial=0.0) * 10 + 1e12)
        from scipy.optimize import linear_sum_assignment  # on first use: scipy.optimize costs a cold start 0.1 s

        rows, cols = linear_sum_assignment(cost)
        from_last, gpu = np.divmod(cols, n_gpus)
        # the job with the largest from-last position on a GPU runs first
        first = np.lexsort((-from_last, gpu))
        runs = first[np.r_[True, gpu[first][1:] != gpu[first][:-1]]]
        runnable = np.isfinite(q[rows[runs], gpu[runs]])
        X = np.zeros(problem.throughputs.shape)
        X[jobs[rows[runs][runnable]], gpu_type[gpu[runs][runnable]]] = 1.0
        return PolicyResult(X, None, message=f"AlloX assignment over {m} job(s) and {n_gpus} GPU(s).")
