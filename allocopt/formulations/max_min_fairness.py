"""Weighted max-min fairness over normalized throughput (Gavel's ``max_min_fairness_perf``).

.. math::

    \\max_X \\; \\min_i \\; \\frac{s_i \\sum_j T_{ij} X_{ij}}{w_i \\, p_i},
    \\qquad p_i = \\frac{\\sum_j T_{ij} c_j}{\\sum_j c_j}

subject to the base constraints (see :mod:`allocopt.formulations.base`).
``p_i`` is job ``i``'s throughput under a cluster-proportional share, so the
objective compares jobs by how much better than an even split they do.
With ``heterogeneity_aware=False`` every ``T_ij`` is 1 (on types where the job
can run) and ``p_i`` is 1: classic least-attained-service fairness,
``max min_i s_i sum_j X_ij / w_i``. With ``space_sharing=True`` pairs of jobs
may share GPUs (see :func:`allocopt.formulations.base.base_model`). With
``aggregate_job_types=True`` interchangeable jobs are solved as one job type
(:mod:`allocopt.formulations.job_types`): same optimum, a model whose size
grows with the number of job types rather than jobs.

Narayanan et al., "Heterogeneity-Aware Cluster Scheduling Policies for Deep
Learning Workloads", OSDI 2020.
"""

from __future__ import annotations

import numpy as np

from allocopt.formulations.base import ModelSolver, Policy, PolicyResult, base_model
from allocopt.formulations.job_types import max_min_fairness_by_job_type
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
    options = {"heterogeneity_aware": True, "space_sharing": False, "aggregate_job_types": False}

    def allocate(self, problem: Problem, solver: ModelSolver, *, heterogeneity_aware: bool = True,
                 space_sharing: bool = False, aggregate_job_types: bool = False) -> PolicyResult:
        if aggregate_job_types:
            return max_min_fairness_by_job_type(problem, solver, heterogeneity_aware=heterogeneity_aware,
                                                space_sharing=space_sharing)
        base = base_model(problem, name=self.name, space_sharing=space_sharing)
        if heterogeneity_aware:
            scale = problem.scale_factors / (problem.priority_weights * problem.proportional_throughputs)
            normalized = base.throughput * scale
        else:
            normalized = base.time * (problem.scale_factors / problem.priority_weights)
        base.model.maximize_minimum(normalized, name="normalized_throughput")
        solution = solver.solve(base.model, "max_min_fairness")
        X, P = base.matrices(solution)
        return PolicyResult(X, solution.objective, solution.status, P, solution.message)
