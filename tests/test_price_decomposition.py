"""Price decomposition for max-min fairness: the plain LP's optimum on seeded random
instances (non-runnable entries, scale factors, weights, abundant capacity, one GPU
type), feasible allocations, a certificate in ``extras``, and option errors."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_feasible
from test_formulations import random_problem

import allocopt
from allocopt import Cluster, Problem, Status
from allocopt.backends import SolveOptions
from allocopt.errors import InvalidOptionError, InvalidProblemError
from allocopt.formulations.base import ModelSolver
from allocopt.formulations.max_min_fairness import normalized_coefficients
from allocopt.formulations.price_decomposition import max_min_fairness_price_decomposition


def contended_problem(seed: int, n: int, k: int) -> Problem:
    """Distinct random throughputs (10% zeros), scale factors 1-8, weights 1-2, about n / 4 GPUs."""
    rng = np.random.default_rng(seed)
    T = np.exp(rng.uniform(np.log(0.1), np.log(10.0), n))[:, None] * np.exp(rng.normal(0.0, 0.3, (n, k)))
    T *= np.sort(rng.uniform(1.0, 6.0, k))
    zero = rng.random((n, k)) < 0.1
    zero[np.arange(n), rng.integers(0, k, n)] = False
    T[zero] = 0.0
    capacity = np.maximum(8, np.round(rng.dirichlet(np.full(k, 4.0)) * max(8 * k, n // 4))).astype(int)
    return Problem(T, Cluster({f"g{j}": int(c) for j, c in enumerate(capacity)}),
                   scale_factors=rng.choice([1, 2, 4, 8], n, p=[0.7, 0.1, 0.15, 0.05]),
                   priority_weights=rng.choice([1.0, 2.0], n, p=[0.8, 0.2]))


def check_matches_lp(problem: Problem, **options) -> allocopt.Allocation:
    reference = allocopt.solve(problem, "max_min_fairness", technique="plain", **options)
    alloc = allocopt.solve(problem, "max_min_fairness", price_decomposition=True, **options)
    assert alloc.status is Status.OPTIMAL
    assert alloc.objective == pytest.approx(reference.objective, rel=1e-6, abs=1e-9)
    assert_feasible(alloc)
    extras = alloc.extras
    assert extras["certified"] and extras["certified_gap"] <= 1e-6
    assert extras["primal_objective"] <= extras["dual_bound"] * (1 + 1e-9)
    normalized = (alloc.matrix * normalized_coefficients(problem, options.get("heterogeneity_aware", True))).sum(1)
    assert normalized.min() == pytest.approx(alloc.objective, rel=1e-9)
    return alloc


@pytest.mark.parametrize("seed,n,k", [(0, 200, 8), (1, 1000, 8), (2, 3000, 3), (3, 500, 2), (4, 2000, 5),
                                      (5, 300, 1)])
def test_contended_instances_match_the_lp(seed, n, k):
    alloc = check_matches_lp(contended_problem(seed, n, k))
    assert alloc.extras.get("explicit_jobs", 0) <= n  # one type (k = 1): the certified water level answers


@pytest.mark.parametrize("seed,n,k", [(0, 6, 2), (1, 9, 3), (2, 40, 4), (3, 25, 1), (4, 60, 3)])
def test_small_mixed_instances_match_the_lp(seed, n, k):
    """Non-runnable entries, scale factors up to 8 on types of 1-8 GPUs, weights 1-3."""
    check_matches_lp(random_problem(seed, n, k))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_abundant_capacity_where_time_binds(seed):
    """More GPUs than jobs: every job's time row binds, and t* is set by the slowest jobs."""
    rng = np.random.default_rng(seed)
    n, k = 200, 4
    T = rng.uniform(0.5, 20.0, (n, k))
    T[rng.random((n, k)) < 0.3] = 0.0
    T[np.arange(n), rng.integers(0, k, n)] = rng.uniform(0.5, 20.0, n)
    problem = Problem(T, Cluster({f"g{j}": 100 for j in range(k)}), scale_factors=rng.choice([1, 2], n),
                      priority_weights=rng.choice([1.0, 2.0, 3.0], n))
    alloc = check_matches_lp(problem)
    assert alloc.time_fraction.max() == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("seed,n,k", [(0, 30, 3), (1, 300, 4)])
def test_heterogeneity_agnostic_matches_the_lp(seed, n, k):
    check_matches_lp(random_problem(seed, n, k), heterogeneity_aware=False)


def test_classic_example():
    problem = Problem([[40.0, 10.0], [12.0, 4.0], [100.0, 50.0]], Cluster({"v100": 1, "k80": 1}))
    alloc = allocopt.solve(problem, price_decomposition=True)
    assert alloc.objective == pytest.approx(8 / 11, rel=1e-9)
    np.testing.assert_allclose(alloc.matrix, np.array([[5, 0], [5, 1], [1, 10]]) / 11, atol=1e-7)


def test_jobs_that_cannot_run_anywhere_are_rejected_as_for_the_plain_lp():
    """Problem validation rejects them before any policy runs (zero throughput, or only on too small types)."""
    cluster = Cluster({"a": 4, "b": 2})
    with pytest.raises(InvalidProblemError, match="zero throughput on every GPU type"):
        Problem([[1.0, 2.0], [0.0, 0.0]], cluster)
    with pytest.raises(InvalidProblemError, match="zero throughput on every GPU type"):
        Problem([[1.0, 2.0], [0.0, 3.0]], cluster, scale_factors=[1, 4])


def test_options_that_do_not_combine():
    problem = random_problem(0, 6, 2)
    for option in ("space_sharing", "column_generation", "aggregate_job_types"):
        with pytest.raises(InvalidOptionError, match="price_decomposition=True"):
            allocopt.solve(problem, price_decomposition=True, **{option: True})


def test_uncertified_runs_return_nothing_and_the_policy_falls_back():
    problem = contended_problem(7, 400, 4)
    solver = ModelSolver("highs", SolveOptions())
    result, extras = max_min_fairness_price_decomposition(
        normalized_coefficients(problem) * problem.runnable, problem.scale_factors, problem.capacity, solver,
        max_rounds=0)
    assert result is None and extras["certified"] is False
    assert extras["price_upper_bound"] >= allocopt.solve(problem).objective * (1 - 1e-9)


def test_gpu_types_without_gpus_get_no_time():
    rng = np.random.default_rng(3)
    cluster = allocopt.Cluster({"v100": 6, "p100": 0, "k80": 9})
    problem = allocopt.Problem(rng.uniform(0.5, 5.0, (40, 3)), cluster, scale_factors=rng.choice([1, 2], 40))
    plain = allocopt.solve(problem, "max_min_fairness")
    fast = allocopt.solve(problem, "max_min_fairness", price_decomposition=True)
    assert fast.extras["certified"]
    assert fast.objective == pytest.approx(plain.objective, rel=1e-6)
    assert np.all(fast.matrix[:, 1] == 0)
