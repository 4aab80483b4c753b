"""Column generation for space-sharing max-min fairness: the pairwise LP's optimum
on random and Gavel-like instances, feasible allocations, and far fewer pair
columns than pairs where most pairs are useless."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import assert_feasible, backend_param
from test_space_sharing import cluster, mixed_scale_problem, random_shared_problem

import allocopt
from allocopt import Cluster, Problem
from allocopt.errors import InvalidOptionError, NotOptimalError
from allocopt.problem import PairThroughputs

BACKENDS = [backend_param("highs"), backend_param("scipy")]


def gavel_like_problem(seed: int, n: int, n_types: int = 6) -> Problem:
    """Jobs drawn from a few model types on 3 GPU types, every pair allowed:
    members keep 30-100% of their speed, 15% of (type pair, GPU type) do not fit,
    scale factors 1 and 2 (pairs only between equal scale factors)."""
    rng = np.random.default_rng(seed)
    base = np.exp(rng.uniform(0.0, np.log(100.0), n_types))
    isolated = base[:, None] * np.array([1.0, 2.5, 3.5]) * np.exp(rng.normal(0.0, 0.2, (n_types, 3)))
    keep = rng.uniform(0.3, 1.0, (n_types, n_types, 3))
    fits = rng.random((n_types, n_types, 3)) >= 0.15
    kind = rng.integers(0, n_types, n)
    scale = rng.choice([1, 2], size=n, p=[0.7, 0.3])
    pairs = np.array([(a, b) for a, b in itertools.combinations(range(n), 2) if scale[a] == scale[b]])
    ka, kb = kind[pairs[:, 0]], kind[pairs[:, 1]]
    values = np.stack([keep[ka, kb] * isolated[ka], keep[kb, ka] * isolated[kb]], axis=-1)
    values[~(fits[ka, kb] & fits[kb, ka])] = 0.0
    return Problem(isolated[kind], cluster([n // 4, n // 4, n // 4]), scale_factors=scale,
                   priority_weights=rng.choice([1.0, 2.0], size=n),
                   pair_throughputs=PairThroughputs([tuple(p) for p in pairs.tolist()], values))


def column_generation(problem: Problem, *, backend: str = "highs", heterogeneity_aware: bool = True,
                      best_effort: bool = False, **settings):
    return allocopt.solve(problem, "max_min_fairness", backend=backend, best_effort=best_effort, space_sharing=True,
                          heterogeneity_aware=heterogeneity_aware, column_generation=settings or True)


def check_matches_pairwise(problem: Problem, backend: str, heterogeneity_aware: bool = True, **options):
    reference = allocopt.solve(problem, "max_min_fairness", space_sharing=True,
                               heterogeneity_aware=heterogeneity_aware)
    alloc = column_generation(problem, backend=backend, heterogeneity_aware=heterogeneity_aware, **options)
    assert alloc.objective == pytest.approx(reference.objective, rel=1e-6, abs=1e-9)
    assert_feasible(alloc)
    assert alloc.pair_matrix.shape == problem.pair_throughput_array.shape[:2]
    assert np.all(alloc.pair_matrix[problem.pair_throughput_array.sum(axis=2) == 0] <= 1e-9)
    extras = alloc.extras
    assert extras["pairs_considered"] == problem.pairs.shape[0]
    assert extras["pairs_generated"] <= problem.pairs.shape[0]
    assert np.count_nonzero(alloc.pair_matrix.any(axis=1)) <= extras["pairs_generated"]
    return alloc


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("heterogeneity_aware", [True, False])
@pytest.mark.parametrize("seed,n,k", [(0, 7, 3), (1, 12, 2), (2, 20, 3), (3, 16, 1)])
def test_random_instances_match_pairwise_lp(backend, heterogeneity_aware, seed, n, k):
    check_matches_pairwise(random_shared_problem(seed, n, k), backend, heterogeneity_aware)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed,n", [(0, 24), (1, 40), (2, 64)])
def test_gavel_like_instances_match_pairwise_lp(backend, seed, n):
    alloc = check_matches_pairwise(gavel_like_problem(seed, n), backend)
    assert alloc.extras["iterations"] >= 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_mixed_scale_factors(backend):
    check_matches_pairwise(mixed_scale_problem(), backend)


@pytest.mark.parametrize("initial_pairs,pairs_per_job", [(0, 1), (3, 4)])
def test_start_and_batch_sizes_reach_the_same_optimum(initial_pairs, pairs_per_job):
    check_matches_pairwise(gavel_like_problem(5, 32), "highs", initial_pairs=initial_pairs,
                           pairs_per_job=pairs_per_job)


def test_useless_pairs_are_never_generated():
    """60 jobs, 1770 pairs: all but a handful of pairs lose most of their speed
    when sharing, so only a few pair columns are ever built."""
    rng = np.random.default_rng(7)
    n = 60
    T = rng.uniform(1.0, 20.0, (n, 2))
    pairs = np.array(list(itertools.combinations(range(n), 2)))
    keep = np.full((len(pairs), 2, 2), 0.1)
    good = rng.choice(len(pairs), 10, replace=False)
    keep[good] = 0.9
    values = keep * T[pairs].transpose(0, 2, 1)
    problem = Problem(T, cluster([10, 10]), pair_throughputs=PairThroughputs([tuple(p) for p in pairs.tolist()],
                                                                                 values))
    alloc = check_matches_pairwise(problem, "highs")
    assert alloc.extras["pairs_generated"] < len(pairs) // 10
    assert alloc.extras["columns_added"] <= alloc.extras["pairs_generated"]


def test_errors():
    plain = Problem(np.ones((2, 1)), cluster([1]))
    with pytest.raises(InvalidOptionError, match="pair_throughputs"):
        column_generation(plain)
    problem = gavel_like_problem(0, 24)
    with pytest.raises(InvalidOptionError, match="max_iterations"):
        column_generation(problem, max_iterations=0)
    with pytest.raises(InvalidOptionError, match="True or a dict of its settings"):
        column_generation(problem, max_iterationz=3)
    with pytest.raises(NotOptimalError, match="did not converge"):
        column_generation(problem, initial_pairs=0, max_iterations=1)
    alloc = column_generation(problem, initial_pairs=0, max_iterations=1, best_effort=True)
    assert str(alloc.status) == "time_limit"
    assert_feasible(alloc)


def test_policy_option_matches_the_pairwise_lp():
    rng = np.random.default_rng(7)
    n = 24
    jobs = [(a, b) for a in range(n) for b in range(a + 1, n)]
    problem = Problem(rng.uniform(1, 10, (n, 2)), Cluster({"a": 6, "b": 6}),
                      pair_throughputs=PairThroughputs(jobs, rng.uniform(0, 6, (len(jobs), 2, 2))))
    full = allocopt.solve(problem, space_sharing=True)
    generated = allocopt.solve(problem, space_sharing=True, column_generation=True)
    assert generated.objective == pytest.approx(full.objective, rel=1e-6)
    with pytest.raises(InvalidOptionError, match="needs space_sharing=True"):
        allocopt.solve(problem, column_generation=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("heterogeneity_aware", [True, False])
def test_repeated_jobs_generate_type_pairs(backend, heterogeneity_aware):
    """Jobs of a few kinds: the columns are job-type pairs of the LP over types, and the optimum is still
    the pairwise LP's over every job pair."""
    problem = gavel_like_problem(3, 48)
    alloc = check_matches_pairwise(problem, backend, heterogeneity_aware)
    extras = alloc.extras
    assert extras["type_pairs_considered"] < extras["pairs_considered"] // 5
    assert extras["type_pairs_generated"] <= extras["type_pairs_considered"]
    assert extras["pairs_generated"] >= extras["type_pairs_generated"]


def test_pop_figure2_instance_by_type_pairs():
    """POP's figure-2 generator (jobs of Gavel's 26 models, every pair may share) at 128 jobs: column
    generation over type pairs reaches the pairwise LP's optimum over all 8,128 pairs."""
    from allocopt.bench.instances import pop_figure2_problem

    problem = pop_figure2_problem(128, 0)
    alloc = check_matches_pairwise(problem, "highs")
    assert alloc.extras["type_pairs_generated"] < alloc.extras["type_pairs_considered"]
