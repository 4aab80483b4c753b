"""Closed-form shares used as baselines and normalizers (no solver involved).

``proportional``: every job gets ``X[i, j] = c_j / sum_k c_k`` of each type,
the share behind the normalization of max-min fairness. It ignores capacity
(it is a per-job reference point, not a feasible schedule of all jobs).

``isolated``: the cluster split evenly among the ``n`` jobs,
``X[i, j] = c_j / (n s_i)`` on the types job ``i`` can run on, each row scaled
down to sum to at most 1. (Gavel instead divides every row by the largest row
sum, which over-allocates the cluster when there are fewer jobs than GPUs.)
"""

from __future__ import annotations

import numpy as np

from allocopt.formulations.base import ModelSolver, Policy, PolicyResult
from allocopt.problem import Problem


def isolated_matrix(problem: Problem) -> np.ndarray:
    """The isolated share, shape (n_jobs, n_gpu_types); its sums run over the GPU types in name order
    (:func:`type_order`), so the result does not depend on the order the cluster lists them, to the bit."""
    columns = type_order(problem)
    X = np.empty(problem.throughputs.shape)
    X[:, columns] = isolated_shares(problem.capacity[columns], problem.scale_factors, problem.runnable[:, columns])
    return X


def type_order(problem: Problem) -> np.ndarray:
    """The problem's GPU types in name order (column indices): the order sums over types run in where
    their last bits matter (Gavel sums in this order)."""
    return np.argsort(np.array(problem.gpu_types, dtype=object), kind="stable")


def isolated_shares(capacity: np.ndarray, scale_factors: np.ndarray, runnable: np.ndarray) -> np.ndarray:
    """The isolated share of jobs given as arrays: GPUs per type (n_gpu_types,), scale factors
    (n_jobs,) and where each job can run (n_jobs, n_gpu_types); shape (n_jobs, n_gpu_types)."""
    n = scale_factors.size
    X = capacity[None, :] / (max(n, 1) * scale_factors[:, None].astype(np.float64))
    X = np.where(runnable, X, 0.0)
    rows = X.sum(axis=1, keepdims=True)
    return np.where(rows > 1.0, X / np.maximum(rows, 1e-300), X)


def proportional_matrix(problem: Problem) -> np.ndarray:
    """The cluster-proportional share, shape (n_jobs, n_gpu_types)."""
    share = problem.capacity / problem.capacity.sum()
    return np.broadcast_to(share, (problem.num_jobs, share.size)).copy()


class Isolated(Policy):
    """The cluster split evenly among jobs (closed form)."""
    name = "isolated"

    def allocate(self, problem: Problem, solver: ModelSolver) -> PolicyResult:
        return PolicyResult(isolated_matrix(problem), None, message="Closed-form isolated share.")


class Proportional(Policy):
    """Each job's cluster-proportional share (closed form)."""
    name = "proportional"

    def allocate(self, problem: Problem, solver: ModelSolver) -> PolicyResult:
        return PolicyResult(proportional_matrix(problem), None, message="Closed-form proportional share.")
