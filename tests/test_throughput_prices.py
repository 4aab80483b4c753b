"""Price decomposition for max throughput: the plain LP's optimum on seeded contended and abundant
instances (non-runnable entries, scale factors, costs, a type without GPUs, one GPU type), a
certificate in ``extras``, the warm re-solve from the previous prices, and option errors."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_feasible
from test_price_decomposition import contended_problem

import allocopt
from allocopt import Cluster, Problem, Status
from allocopt.errors import InvalidOptionError


def check_matches_lp(problem: Problem, **options) -> allocopt.Allocation:
    reference = allocopt.solve(problem, "max_throughput", technique="plain", **options)
    alloc = allocopt.solve(problem, "max_throughput", technique="price_decomposition", **options)
    assert alloc.status is Status.OPTIMAL
    assert alloc.extras["technique"] == "price_decomposition", alloc.extras["technique_reason"]
    assert alloc.objective == pytest.approx(reference.objective, rel=1e-9)
    assert_feasible(alloc)
    extras = alloc.extras
    assert extras["certified"] and extras["certified_gap"] <= 1e-9
    assert extras["primal_objective"] <= extras["dual_bound"] * (1 + 1e-12)
    value = problem.throughputs / (problem.costs if options.get("normalize_by_cost") else 1.0)
    assert float((alloc.matrix * value).sum()) == pytest.approx(alloc.objective, rel=1e-12)
    return alloc


@pytest.mark.parametrize("seed,n,k", [(0, 200, 8), (1, 1000, 8), (2, 3000, 3), (3, 500, 2), (4, 300, 1)])
def test_contended_instances_match_the_lp(seed, n, k):
    alloc = check_matches_lp(contended_problem(seed, n, k))
    assert alloc.extras["explicit_jobs"] < n  # the prices decided most jobs


def test_abundant_capacity_and_costs_match_the_lp():
    problem = contended_problem(5, 400, 4)
    roomy = Problem(problem.throughputs, Cluster({t: 10_000 for t in problem.gpu_types}),
                    scale_factors=problem.scale_factors, costs=np.array([3.0, 2.0, 1.5, 1.0]))
    check_matches_lp(roomy)  # every job on its best type: prices 0
    check_matches_lp(roomy, normalize_by_cost=True)
    costly = Problem(problem.throughputs, problem.cluster, scale_factors=problem.scale_factors,
                     costs=np.array([3.0, 2.0, 1.5, 1.0]))
    check_matches_lp(costly, normalize_by_cost=True)


def test_a_type_without_gpus_gets_no_time():
    problem = contended_problem(6, 600, 4)
    gpus = dict(zip(problem.gpu_types, problem.capacity.tolist()))
    gpus[problem.gpu_types[1]] = 0
    empty = Problem(problem.throughputs, Cluster(gpus), scale_factors=problem.scale_factors)
    alloc = check_matches_lp(empty)
    assert np.all(alloc.matrix[:, 1] == 0.0)


@pytest.mark.parametrize("event", ["arrival", "departure", "throughput", "capacity"])
def test_a_warm_resolve_starts_from_the_previous_prices(event):
    """After the re-solve target's changes the warm solve prices the types from the plain solve's capacity
    duals (a cutting-plane step or two, one or two small LPs), at the cold optimum; a chain of warm solves
    carries the prices on."""
    from allocopt.bench.instances import random_problem
    from allocopt.bench.resolve import event_pair

    before, after = event_pair(random_problem(2051, 8, 0), 2048, event, 0)
    previous = allocopt.solve(before, "max_throughput", technique="plain")
    assert len(previous.warm_start.hints["prices"]) == 8
    warm = allocopt.solve(after, "max_throughput", warm_start=previous)
    cold = allocopt.solve(after, "max_throughput", technique="plain")
    assert warm.extras["technique"] == "price_decomposition", warm.extras["technique_reason"]
    assert warm.objective == pytest.approx(cold.objective, rel=1e-9)
    assert_feasible(warm)
    assert warm.extras["price_evaluations"] <= 3 and warm.extras["restricted_lps"] <= 3
    assert warm.extras["explicit_jobs"] < 0.15 * after.num_jobs
    again = allocopt.solve(after, "max_throughput", warm_start=warm)
    assert again.extras["technique"] == "price_decomposition"
    assert again.objective == pytest.approx(cold.objective, rel=1e-9)


def test_options_that_do_not_combine():
    problem = contended_problem(7, 100, 3)
    with pytest.raises(InvalidOptionError, match="space_sharing"):
        allocopt.solve(problem, "max_throughput", price_decomposition=True, aggregate_job_types=True)
    with pytest.raises(InvalidOptionError, match="gavel_program"):
        allocopt.solve(problem, "max_throughput", price_decomposition=True, gavel_program=True, backend="cvxpy")
    deadlines = Problem(problem.throughputs, problem.cluster, scale_factors=problem.scale_factors,
                        num_steps_remaining=np.full(100, 1e3), slos=np.full(100, 1e5))
    with pytest.raises(InvalidOptionError, match="SLOs"):
        allocopt.solve(deadlines, "max_throughput", price_decomposition=True)
    # auto never picks it with deadlines, even from a warm start with prices
    previous = allocopt.solve(contended_problem(7, 1200, 3), "max_throughput", technique="plain")
    with_slos = Problem(previous.problem.throughputs, previous.problem.cluster,
                        scale_factors=previous.problem.scale_factors, num_steps_remaining=np.full(1200, 1.0),
                        slos=np.full(1200, 1e9))
    assert allocopt.solve(with_slos, "max_throughput", warm_start=previous).extras["technique"] != \
        "price_decomposition"


@pytest.mark.parametrize("family", ["random", "oversubscribed", "unequal"])
def test_auto_prices_many_distinct_jobs_and_leaves_small_or_repeated_ones(family):
    from allocopt.bench.instances import FAMILIES

    problem = FAMILIES[family][1](2048, 1)
    auto = allocopt.solve(problem, "max_throughput")
    plain = allocopt.solve(problem, "max_throughput", technique="plain")
    assert auto.extras["technique"] in ("price_decomposition", "closed_form"), auto.extras["technique_reason"]
    assert auto.objective == pytest.approx(plain.objective, rel=1e-9)
    assert_feasible(auto)
    assert allocopt.solve(FAMILIES[family][1](500, 1), "max_throughput").extras["technique"] != \
        "price_decomposition"  # below PRICE_DECOMPOSITION_MIN_JOBS the plain LP is as fast
    assert allocopt.solve(FAMILIES["gavel_table"][1](2048, 1), "max_throughput").extras["technique"] == \
        "aggregate_job_types"
