"""Weighted max-min fairness over normalized throughput (Gavel's ``max_min_fairness_perf``).

.. math::

    \\max_X \\; \\min_i \\; \\frac{s_i \\sum_j T_{ij} X_{ij}}{w_i \\, p_i},
    \\qquad p_i = \\frac{\\sum_j T_{ij} c_j}{\\sum_j c_j}

subject to the base constraints (see :mod:`allocopt.formulations.base`).
``p_i`` is job ``i``'s throughput under a cluster-proportional share, so the
objective compares jobs by how much better than an even split they do.
With ``heterogeneity_aware=False`` every ``T_ij`` is 1 (on types where the job
can run) and ``p_i`` is 1: classic least-attained-service fairness,
``max min_i s_i sum_j X_ij / w_i``.

Narayanan et al., "Heterogeneity-Aware Cluster Scheduling Policies for Deep
Learning Workloads", OSDI 2020.
"""

from __future__ import annotations

import numpy as np

from allocopt.formulations.base import ModelSolver, Policy, PolicyResult, base_model, clean_matrix
from allocopt.problem import Problem


def normalized_coefficients(problem: Problem, heterogeneity_aware: bool = True) -> np.ndarray:
    """``s_i T_ij / (w_i p_i)``, shape (n_jobs, n_gpu_types): the coefficient of
    ``X_ij`` in job ``i``'s normalized throughput."""
    scale = problem.scale_factors / problem.priority_weights
    if heterogeneity_aware:
        return problem.throughputs * (scale / problem.proportional_throughputs)[:, None]
    return problem.runnable * scale[:, None]


class MaxMinFairness(Policy):
    name = "max_min_fairness"
    options = {"heterogeneity_aware": True}

    def allocate(self, problem: Problem, solver: ModelSolver, *,
                 heterogeneity_aware: bool = True) -> PolicyResult:
        model, X = base_model(problem, name=self.name)
        coef = normalized_coefficients(problem, heterogeneity_aware)
        model.maximize_minimum((X * coef).sum(axis=1), name="normalized_throughput")
        solution = solver.solve(model, "max_min_fairness")
        return PolicyResult(clean_matrix(solution.values["X"]), solution.objective,
                            solution.status, solution.message)
