"""POP-style partitioning: feasible, approximate, combined objectives, errors."""

import numpy as np
import pytest

import allocopt
from allocopt.errors import InvalidOptionError, InvalidProblemError
from allocopt.partitioning import Partitioning, split_capacity
from allocopt.solution import Status

TYPES = ("v100", "p100", "k80")


def make_problem(n=120, seed=0, capacity=(24, 30, 36), pairs=False):
    rng = np.random.default_rng(seed)
    T = rng.uniform(0.5, 10.0, (n, 3)) * np.array([3.0, 2.0, 1.0])
    T[rng.random((n, 3)) < 0.1] = 0.0
    T[T.sum(axis=1) == 0, 0] = 1.0
    pair_throughputs = None
    scale_factors = np.ones(n, dtype=int) if pairs else rng.choice([1, 1, 1, 2], n)
    if pairs:
        a, b = np.triu_indices(n, 1)
        members = np.stack([a, b], axis=1)[rng.choice(a.size, 2 * n, replace=False)]
        pair_throughputs = allocopt.problem.PairThroughputs([(int(a), int(b)) for a, b in members],
                                                            rng.uniform(0.2, 0.7, (len(members), 3, 2))
                                                            * T[members].transpose(0, 2, 1))
    return allocopt.Problem(T, allocopt.Cluster(dict(zip(TYPES, capacity))),
                            scale_factors=scale_factors, priority_weights=rng.choice([1.0, 2.0], n),
                            num_steps_remaining=rng.uniform(1e3, 1e5, n), pair_throughputs=pair_throughputs)


def assert_feasible(problem, allocation):
    X = allocation.matrix
    time_used = X.sum(axis=1)
    gpus = (X * problem.scale_factors[:, None]).sum(axis=0)
    if allocation.pair_matrix is not None:
        P = allocation.pair_matrix
        for member in (0, 1):
            np.add.at(time_used, problem.pairs[:, member], P.sum(axis=1))
        gpus = gpus + (P * problem.scale_factors[problem.pairs[:, 0]][:, None]).sum(axis=0)
    assert np.all(X >= 0) and np.all(time_used <= 1 + 1e-6)
    assert np.all(gpus <= problem.capacity + 1e-6)
    assert np.all(X[~problem.runnable] == 0)


@pytest.mark.parametrize("capacity, k", [((24, 30, 36), 4), ((7, 0, 13), 3), ((5, 5, 5), 5), ((1, 2, 3), 2)])
def test_capacity_is_split_evenly(capacity, k):
    shares = split_capacity(np.array(capacity), k)
    assert shares.shape == (k, 3)
    assert np.array_equal(shares.sum(axis=0), capacity)
    assert shares.max(axis=0).tolist() == [-(-c // k) for c in capacity]
    assert shares.sum(axis=1).max() - shares.sum(axis=1).min() <= 1


@pytest.mark.parametrize("parallel", ["none", "process"])
def test_max_min_fairness_partitioned_is_feasible_and_close(parallel):
    problem = make_problem()
    exact = allocopt.solve(problem, "max_min_fairness")
    pop = allocopt.solve(problem, "max_min_fairness", technique="plain",  # one LP per partition
                         partitions=Partitioning(3, seed=1, parallel=parallel, compare_exact=True))
    assert pop.status is Status.APPROXIMATE and not pop.success
    assert_feasible(problem, pop)
    assert pop.objective <= exact.objective * (1 + 1e-9)
    assert pop.extras["exact_objective"] == pytest.approx(exact.objective, rel=1e-9)
    assert 0.5 < pop.extras["objective_ratio"] <= 1 + 1e-9
    normalized = pop.effective_throughput * problem.scale_factors / (
        problem.priority_weights * problem.proportional_throughputs)
    assert normalized.min() == pytest.approx(pop.objective, rel=1e-12)  # the whole problem's objective
    assert pop.extras["num_partitions"] == 3 and pop.timings.num_solves == 3


def test_same_seed_same_split_other_seed_other_split():
    problem = make_problem()
    a = allocopt.solve(problem, partitions=Partitioning(4, seed=3, parallel="none"))
    b = allocopt.solve(problem, partitions=Partitioning(4, seed=3, parallel="none"))
    c = allocopt.solve(problem, partitions=Partitioning(4, seed=4, parallel="none"))
    assert np.array_equal(a.matrix, b.matrix)
    assert not np.array_equal(a.matrix, c.matrix)


@pytest.mark.parametrize("policy, better", [("max_throughput", "max"), ("min_makespan", "min")])
def test_other_policies_report_the_whole_problems_objective(policy, better):
    problem = make_problem(n=60, capacity=(7, 11, 8))  # uneven shares: partitions' own objectives would mislead
    exact = allocopt.solve(problem, policy).objective
    pop = allocopt.solve(problem, policy, partitions=Partitioning(3, parallel="none", compare_exact=True))
    assert_feasible(problem, pop)
    e = pop.effective_throughput
    whole = e.sum() if policy == "max_throughput" else (problem.num_steps_remaining / e).max()
    assert pop.objective == pytest.approx(whole, rel=1e-12)
    assert (pop.objective <= exact * (1 + 1e-7)) if better == "max" else (pop.objective >= exact * (1 - 1e-7))
    assert 0 < pop.extras["objective_ratio"] <= 1 + 1e-9


def test_a_partition_that_is_not_optimal_sets_the_status():
    problem = make_problem(n=30)
    impossible = allocopt.Problem(problem.throughputs, problem.cluster, scale_factors=problem.scale_factors,
                                  num_steps_remaining=np.full(30, 1e9), slos=np.full(30, 1.0))
    with pytest.raises(allocopt.errors.InfeasibleError):
        allocopt.solve(impossible, "max_throughput", partitions=Partitioning(2, parallel="none"))
    pop = allocopt.solve(impossible, "max_throughput", best_effort=True, partitions=Partitioning(2, parallel="none"))
    assert pop.status is Status.INFEASIBLE and pop.objective is None
    assert "partition 0 ended infeasible" in pop.message


def test_space_sharing_keeps_pairs_inside_partitions():
    problem = make_problem(n=40, pairs=True)
    pop = allocopt.solve(problem, "max_min_fairness", space_sharing=True,
                         partitions=Partitioning(2, seed=0, parallel="none"))
    assert_feasible(problem, pop)
    assert pop.pair_matrix.shape == (problem.pairs.shape[0], 3)
    groups = np.array_split(np.random.default_rng(0).permutation(problem.num_jobs), 2)
    side = np.empty(problem.num_jobs, dtype=int)
    for g, rows in enumerate(groups):
        side[rows] = g
    across = side[problem.pairs[:, 0]] != side[problem.pairs[:, 1]]
    assert across.any() and np.all(pop.pair_matrix[across] == 0)
    assert pop.pair_matrix[~across].sum() > 0


def test_subset_carries_every_field():
    problem = allocopt.Problem([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], allocopt.Cluster({"a": 4, "b": 4}),
                               job_ids=["x", "y", "z"], scale_factors=[1, 1, 1], priority_weights=[1, 2, 3],
                               num_steps_remaining=[10, 20, 30], entities=["u", "v", "u"],
                               entity_weights={"u": 2.0, "v": 1.0},
                               pair_throughputs={("x", "y"): {"a": (0.5, 1.0), "b": (1.0, 2.0)},
                                                 ("x", "z"): {"a": (0.1, 0.1), "b": (0.1, 0.1)}})
    sub = problem.subset([1, 0], allocopt.Cluster({"a": 2, "b": 1}))
    assert sub.job_ids == ("y", "x")
    assert sub.priority_weights.tolist() == [2.0, 1.0] and sub.num_steps_remaining.tolist() == [20.0, 10.0]
    assert sub.entity_ids == ("v", "u") and sub.entity_weights.tolist() == [1.0, 2.0]
    assert sub.pairs.tolist() == [[0, 1]]  # stored with the lower row first: (x, y) is rows (1, 0)
    assert sub.pair_throughput_array[0].tolist() == [[1.0, 0.5], [2.0, 1.0]]
    with pytest.raises(InvalidProblemError, match="GPU types"):
        problem.subset([0], allocopt.Cluster({"c": 1, "b": 1}))


def test_errors_name_what_to_change():
    problem = make_problem(n=20, capacity=(3, 3, 3))
    with pytest.raises(InvalidOptionError, match="integer >= 2"):
        allocopt.solve(problem, partitions=0)
    with pytest.raises(InvalidOptionError, match="supports the policies"):
        allocopt.solve(problem, "finish_time_fairness", partitions=2)
    with pytest.raises(InvalidOptionError, match="solve without partitions for"):
        allocopt.solve(problem, "max_min_fairness", aggregate_job_types=True, partitions=2)
    with pytest.raises(InvalidOptionError, match="at least as many jobs"):
        allocopt.solve(problem.subset([0]), partitions=2)
    with pytest.raises(InvalidOptionError, match=r"job \d+ .*fewer partitions"):
        allocopt.solve(problem, partitions=3)  # 1 GPU of each type per partition; some job needs 2
    with pytest.raises(InvalidOptionError, match="exclude each other"):
        allocopt.solve(problem, partitions=2, warm_start=allocopt.solve(problem))
    with pytest.raises(InvalidOptionError, match="parallel must be"):
        Partitioning(2, parallel="threads")


def test_ray_tasks_give_the_same_allocation():
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'allocopt[ray]')")
    problem = make_problem(n=60)
    local = allocopt.solve(problem, partitions=Partitioning(2, parallel="none"))
    started_here = not ray.is_initialized()
    try:
        remote = allocopt.solve(problem, partitions=Partitioning(2, parallel="ray"))
    finally:
        if started_here:
            ray.shutdown()
    assert np.array_equal(local.matrix, remote.matrix)
