"""Space sharing: per-job time over every combination <= 1 with mixed scale factors
(an instance that breaks Gavel's vectorized grouping of the time rows),
cross-backend agreement, the gain from co-location, pair round trips, and the
LP over job types."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from conftest import ALL_BACKENDS, assert_feasible, backend_param
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import allocopt
from allocopt import Cluster, Problem
from allocopt.backends import solve_model
from allocopt.errors import InvalidOptionError
from allocopt.formulations.job_types import job_type_groups
from allocopt.model import Model

POLICIES = ["max_min_fairness", "max_throughput"]
TOL = 1e-6


def pair_dict(problem_T: np.ndarray, pairs: list[tuple[int, int]], factor: np.ndarray | float,
              k: int) -> dict:
    """``{(a, b): {"t<j>": (factor * T[a, j], factor * T[b, j])}}``."""
    factor = np.broadcast_to(np.asarray(factor, dtype=float), (len(pairs), k, 2))
    return {(a, b): {f"t{j}": (factor[p, j, 0] * problem_T[a, j], factor[p, j, 1] * problem_T[b, j])
                     for j in range(k)} for p, (a, b) in enumerate(pairs)}


def cluster(capacity) -> Cluster:
    return Cluster({f"t{j}": int(c) for j, c in enumerate(capacity)})


# ----------------------------------------------------------------------------------------------
# Mixed scale factors: every job's time over all its combinations is at most 1
# ----------------------------------------------------------------------------------------------
def mixed_scale_problem() -> Problem:
    """Four 1-GPU jobs with all six pairs, two 2-GPU jobs with their one pair, on
    3 types of 2 GPUs; each member of a pair keeps 95% of its isolated speed, so
    co-location nearly doubles throughput and the optimizer wants as much pair
    time as the time rows allow."""
    T = np.array([[10.0, 6, 3], [10, 6, 3], [8, 5, 2], [8, 5, 2], [20, 12, 6], [20, 12, 6]])
    pairs = list(itertools.combinations(range(4), 2)) + [(4, 5)]
    return Problem(T, cluster([2, 2, 2]), scale_factors=[1, 1, 1, 1, 2, 2],
                   pair_throughputs=pair_dict(T, pairs, 0.95, 3))


def times_and_gpus(problem: Problem, X: np.ndarray, P: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each job's time over every combination containing it, and GPUs used per
    type with each pair counted once, recomputed with explicit loops."""
    n, k = X.shape
    time, gpus = np.zeros(n), np.zeros(k)
    for i in range(n):
        for j in range(k):
            time[i] += X[i, j]
            gpus[j] += problem.scale_factors[i] * X[i, j]
    for p, (a, b) in enumerate(problem.pairs.tolist()):
        assert problem.scale_factors[a] == problem.scale_factors[b]
        for j in range(k):
            time[a] += P[p, j]
            time[b] += P[p, j]
            gpus[j] += problem.scale_factors[a] * P[p, j]
    return time, gpus


def gavel_vectorized_times(problem: Problem, policy: str) -> np.ndarray:
    """Solve with the time rows grouped the way Gavel's vectorized
    ``PolicyWithPacking.get_base_constraints`` does (the concatenated index lists
    of every job's combinations reshaped to one row per job, which assumes every
    job is in equally many combinations) and return each job's true time."""
    n, k = problem.num_jobs, problem.cluster.num_gpu_types
    pairs = problem.pairs.tolist()
    combos = []  # Gavel's sorted order: job a, then its pairs (a, b > a)
    for a in range(n):
        combos.append((a,))
        combos += [tuple(p) for p in pairs if p[0] == a]
    flat = [c * k + j for a in range(n) for c, combo in enumerate(combos) if a in combo for j in range(k)]
    assert len(flat) % n == 0, "the instance must reshape evenly, as Gavel's reshape needs"
    width = len(flat) // n
    rows = np.zeros((n, len(combos) * k))
    for r in range(n):
        for col in flat[r * width:(r + 1) * width]:
            rows[r, col] += 1
    steps = np.zeros((n, len(combos) * k))
    scale, ub = np.zeros(len(combos)), np.zeros((len(combos), k))
    for c, combo in enumerate(combos):
        scale[c] = problem.scale_factors[combo[0]]
        for j in range(k):
            if len(combo) == 1:
                steps[combo[0], c * k + j] = problem.throughputs[combo[0], j]
                ub[c, j] = problem.runnable[combo[0], j]
            else:
                tput = problem.pair_throughput_array[pairs.index(list(combo)), j]
                steps[combo[0], c * k + j], steps[combo[1], c * k + j] = tput
                ub[c, j] = 1.0
    model = Model("gavel_vectorized")
    x = model.add_variable("x", (len(combos), k), ub=ub)
    model.add_constraint("time", rows @ x.ravel() <= 1.0)
    model.add_constraint("capacity", (x * scale[:, None]).sum(axis=0) <= problem.capacity)
    throughput = steps @ x.ravel()
    if policy == "max_min_fairness":
        model.maximize_minimum(throughput * (problem.scale_factors / problem.proportional_throughputs))
    else:
        model.maximize(throughput.sum())
    x_value = solve_model(model.compile(), "highs").values["x"]
    time = np.zeros(n)
    for c, combo in enumerate(combos):
        for a in combo:
            time[a] += x_value[c].sum()
    return time


@pytest.mark.parametrize("policy", POLICIES)
def test_instance_breaks_gavel_vectorized_grouping(policy):
    """The mixed-scale instance is one where mis-grouped time rows give a job more than 100%."""
    assert gavel_vectorized_times(mixed_scale_problem(), policy).max() > 1.2


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_mixed_scale_factors_time_at_most_one(backend, policy):
    problem = mixed_scale_problem()
    alloc = allocopt.solve(problem, policy, backend=backend, space_sharing=True)
    time, gpus = times_and_gpus(problem, alloc.matrix, alloc.pair_matrix)
    assert time.max() <= 1 + TOL
    assert np.all(gpus <= problem.capacity + TOL)
    assert alloc.pair_matrix.min() >= 0 and alloc.pair_matrix.sum() > 0.5  # pairs are used
    reference = allocopt.solve(problem, policy, space_sharing=True)
    assert alloc.objective == pytest.approx(reference.objective, rel=1e-6)


# ----------------------------------------------------------------------------------------------
# Random instances: backends agree, and sharing never hurts
# ----------------------------------------------------------------------------------------------
def random_shared_problem(seed: int, n: int, k: int) -> Problem:
    """Scale factors 1 or 2, pair (0, 1) and other pairs of same-scale jobs
    with probability 0.6, each member keeping 30-100% of its speed, and about
    20% of (pair, type) entries (0, 0): the pair cannot share that type."""
    rng = np.random.default_rng(seed)
    T = rng.uniform(0.5, 50.0, size=(n, k))
    T[rng.random((n, k)) < 0.25] = 0.0
    T[:, 0] = np.maximum(T[:, 0], 0.5)
    scale = rng.choice([1, 2], size=n)
    scale[1] = scale[0]
    capacity = rng.integers(1, 5, size=k)
    capacity[0] = max(capacity[0], 2)
    pairs = [(a, b) for a, b in itertools.combinations(range(n), 2)
             if (a, b) == (0, 1) or (scale[a] == scale[b] and rng.random() < 0.6)]
    factor = rng.uniform(0.3, 1.0, size=(len(pairs), k, 2))
    factor[rng.random((len(pairs), k)) < 0.2] = 0.0
    return Problem(T, cluster(capacity), scale_factors=scale, priority_weights=rng.choice([1.0, 2.0], size=n),
                   pair_throughputs=pair_dict(T, pairs, factor, k))


SETTINGS = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("backend", ALL_BACKENDS)
@SETTINGS
@given(seed=st.integers(0, 2**31), n=st.integers(2, 7), k=st.integers(1, 3))
def test_backends_agree_with_space_sharing(backend, policy, seed, n, k):
    problem = random_shared_problem(seed, n, k)
    reference = allocopt.solve(problem, policy, space_sharing=True)
    alloc = allocopt.solve(problem, policy, backend=backend, space_sharing=True)
    assert alloc.objective == pytest.approx(reference.objective, rel=1e-6, abs=1e-9)
    assert_feasible(alloc)
    alone = allocopt.solve(problem, policy, backend=backend)
    assert alloc.objective >= alone.objective - 1e-6 * max(1.0, abs(alone.objective))
    unusable = problem.pair_throughput_array.sum(axis=2) == 0
    assert np.all(alloc.pair_matrix[unusable] <= TOL)


def resnet18_pair() -> Problem:
    """Two ResNet-18-like jobs on one GPU: 125 steps/s alone, 95% of that each
    when co-located (1.9x combined, as measured on an H100)."""
    return Problem([[125.0], [125.0]], Cluster({"h100": 1}), job_ids=["r1", "r2"],
                   pair_throughputs={("r1", "r2"): {"h100": (118.75, 118.75)}})


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_colocation_strictly_better(backend):
    problem = resnet18_pair()
    alone = allocopt.solve(problem, "max_min_fairness", backend=backend)
    shared = allocopt.solve(problem, "max_min_fairness", backend=backend, space_sharing=True)
    assert alone.objective == pytest.approx(0.5, rel=1e-6)
    assert shared.objective == pytest.approx(0.95, rel=1e-6)
    assert shared.pair_matrix[0, 0] == pytest.approx(1.0, rel=1e-6)
    most = allocopt.solve(problem, "max_throughput", backend=backend, space_sharing=True)
    assert most.objective == pytest.approx(237.5, rel=1e-6)
    assert allocopt.solve(problem, "max_throughput", backend=backend).objective == pytest.approx(125.0, rel=1e-6)


# ----------------------------------------------------------------------------------------------
# Round trip of pair allocations
# ----------------------------------------------------------------------------------------------
def test_pair_allocations_round_trip():
    problem = mixed_scale_problem()
    problem = Problem(problem.throughputs, problem.cluster, job_ids=[f"job{i}" for i in range(6)],
                      scale_factors=problem.scale_factors,
                      pair_throughputs={(f"job{a}", f"job{b}"): dict(zip(problem.gpu_types, tput.tolist()))
                                        for (a, b), tput in zip(problem.pairs.tolist(), problem.pair_throughput_array)})
    alloc = allocopt.solve(problem, "max_min_fairness", space_sharing=True)
    ids, types = problem.job_ids, problem.gpu_types
    as_dict = alloc.to_dict()
    assert len(as_dict) == problem.num_jobs + problem.pairs.shape[0]
    X = np.array([[as_dict[job][t] for t in types] for job in ids])
    P = np.array([[as_dict[(ids[a], ids[b])][t] for t in types] for a, b in problem.pairs.tolist()])
    np.testing.assert_array_equal(X, alloc.matrix)
    np.testing.assert_array_equal(P, alloc.pair_matrix)
    doc = json.loads(json.dumps(alloc.to_json()))
    pairs = {tuple(entry["jobs"]): entry["fractions"] for entry in doc["pairs"]}
    P_json = np.array([[pairs[(ids[a], ids[b])][t] for t in types] for a, b in problem.pairs.tolist()])
    np.testing.assert_array_equal(P_json, alloc.pair_matrix)
    steps = [entry["effective_throughput"] for entry in doc["allocation"]]
    np.testing.assert_allclose(steps, alloc.effective_throughput)
    again = Problem.from_json(json.loads(json.dumps(problem.to_json())))
    np.testing.assert_array_equal(again.pairs, problem.pairs)
    assert allocopt.solve(again, "max_min_fairness", space_sharing=True).objective == pytest.approx(alloc.objective)


# ----------------------------------------------------------------------------------------------
# The LP over job types
# ----------------------------------------------------------------------------------------------
def typed_problem(seed: int, n_types: int, k: int, max_count: int) -> tuple[Problem, np.ndarray]:
    """Jobs drawn from ``n_types`` types (1 to ``max_count`` jobs each, shuffled):
    same throughputs, scale factor (1 or 2) and weight within a type, all pairs
    of same-scale jobs with pair throughputs given per type pair (zero on some
    GPU types). Returns the problem and each job's planted type."""
    rng = np.random.default_rng(seed)
    T = rng.uniform(1.0, 20.0, size=(n_types, k))
    T[rng.random((n_types, k)) < 0.2] = 0.0
    T[:, 0] = np.maximum(T[:, 0], 1.0)
    scale = rng.choice([1, 2], size=n_types)
    weight = rng.choice([1.0, 2.0], size=n_types)
    keep = rng.uniform(0.3, 1.0, size=(n_types, n_types, k))
    keep[rng.random((n_types, n_types, k)) < 0.25] = 0.0
    planted = np.repeat(np.arange(n_types), rng.integers(1, max_count + 1, size=n_types))
    rng.shuffle(planted)
    pairs = [(a, b) for a, b in itertools.combinations(range(planted.size), 2)
             if scale[planted[a]] == scale[planted[b]]]
    # member a keeps keep[type a, type b], member b keeps keep[type b, type a]
    factor = np.array([np.stack([keep[planted[a], planted[b]], keep[planted[b], planted[a]]], axis=-1)
                       for a, b in pairs]).reshape(len(pairs), k, 2)
    capacity = rng.integers(2, 6, size=k)
    problem = Problem(T[planted], cluster(capacity), scale_factors=scale[planted], priority_weights=weight[planted],
                      pair_throughputs=pair_dict(T[planted], pairs, factor, k))
    return problem, planted


def same_partition(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.array_equal(a[:, None] == a[None, :], b[:, None] == b[None, :]))


def check_spread_back(problem: Problem, alloc, reference, policy: str) -> None:
    """Same objective as the pairwise LP, feasible for it, and every job of a type treated alike."""
    assert alloc.objective == pytest.approx(reference.objective, rel=1e-6)
    assert_feasible(alloc)
    if policy == "max_min_fairness":
        normalized = (alloc.effective_throughput * problem.scale_factors
                      / (problem.priority_weights * problem.proportional_throughputs))
        assert normalized.min() == pytest.approx(reference.objective, rel=1e-6)
    else:
        assert alloc.effective_throughput.sum() == pytest.approx(reference.objective, rel=1e-6)
    types = alloc.extras["type_of_job"]
    np.testing.assert_array_equal(alloc.matrix, alloc.extras["type_matrix"][types])


def by_job_type(problem: Problem, policy: str = "max_min_fairness", *, space_sharing: bool = True, **options):
    return allocopt.solve(problem, policy, aggregate_job_types=True, space_sharing=space_sharing, **options)


def by_job_type_max_throughput(problem: Problem, **options):
    return by_job_type(problem, "max_throughput", **options)


@pytest.mark.parametrize("backend", ["highs", backend_param("pulp")])
@pytest.mark.parametrize("seed", range(4))
def test_job_type_lp_matches_pairwise(backend, seed):
    problem, planted = typed_problem(seed, n_types=4, k=3, max_count=4)
    types, rows = job_type_groups(problem)
    assert same_partition(types, planted)
    assert np.array_equal(rows, np.sort(rows)) and np.array_equal(types[rows], np.arange(rows.size))
    for policy in ("max_min_fairness", "max_throughput"):
        reference = allocopt.solve(problem, policy, backend=backend, space_sharing=True)
        check_spread_back(problem, by_job_type(problem, policy, backend=backend), reference, policy)
    agnostic = allocopt.solve(problem, "max_min_fairness", backend=backend, space_sharing=True,
                              heterogeneity_aware=False)
    by_type = by_job_type(problem, backend=backend, heterogeneity_aware=False)
    assert by_type.objective == pytest.approx(agnostic.objective, rel=1e-6)
    costly = Problem(problem.throughputs, problem.cluster, scale_factors=problem.scale_factors,
                     costs=np.arange(1.0, 4.0))
    assert by_job_type_max_throughput(costly, backend=backend, space_sharing=False,
                                            normalize_by_cost=True).objective == pytest.approx(
        allocopt.solve(costly, "max_throughput", backend=backend, normalize_by_cost=True).objective, rel=1e-6)


def test_job_type_lp_size_does_not_grow_with_jobs():
    small, _ = typed_problem(7, n_types=3, k=2, max_count=2)
    large, planted = typed_problem(7, n_types=3, k=2, max_count=12)
    alloc = by_job_type(large)
    assert alloc.extras["type_matrix"].shape == (3, 2) and alloc.extras["type_pairs"].shape[0] <= 6
    assert alloc.extras["type_pair_matrix"].shape == (alloc.extras["type_pairs"].shape[0], 2)
    check_spread_back(large, alloc, allocopt.solve(large, "max_min_fairness", space_sharing=True),
                      "max_min_fairness")
    assert by_job_type(small).extras["type_matrix"].shape == (3, 2)


def identical_jobs(pairs: dict) -> Problem:
    n = 1 + max(max(key) for key in pairs)
    return Problem(np.full((n, 1), 10.0), Cluster({"t0": 1}),
                   pair_throughputs={key: {"t0": (v, v)} for key, v in pairs.items()})


@pytest.mark.parametrize("pairs, expected", [
    # a missing pair counts as (0, 0): job 0 shares with both others, jobs 1 and 2 cannot share
    ({(0, 1): 9.0, (0, 2): 9.0}, [0, 1, 1]),
    # every job sees {9, 7, 8} from its type, but only the swap of (0, 1) with (2, 3) is a symmetry
    ({(0, 2): 9.0, (1, 3): 9.0, (0, 3): 7.0, (1, 2): 7.0, (0, 1): 8.0, (2, 3): 8.0}, [0, 1, 2, 3]),
    ({(0, 1): 9.0, (0, 2): 9.0, (1, 2): 9.0}, [0, 0, 0]),
])
def test_job_type_groups_split_jobs_told_apart_by_pairs(pairs, expected):
    problem = identical_jobs(pairs)
    types, rows = job_type_groups(problem)
    np.testing.assert_array_equal(types, expected)
    np.testing.assert_array_equal(job_type_groups(problem, space_sharing=False)[0], 0)
    reference = allocopt.solve(problem, "max_min_fairness", space_sharing=True)
    check_spread_back(problem, by_job_type(problem), reference, "max_min_fairness")


def test_job_type_lp_errors_and_edge_cases():
    plain = Problem([[1.0], [1.0]], Cluster({"t0": 1}))
    with pytest.raises(InvalidOptionError, match="pair_throughputs"):
        by_job_type(plain)
    alone = by_job_type(plain, space_sharing=False)
    assert alone.objective == pytest.approx(0.5) and alone.pair_matrix is None
    deadlines = Problem([[1.0]], Cluster({"t0": 1}), num_steps_remaining=[10.0], slos=[100.0])
    with pytest.raises(InvalidOptionError, match="deadlines"):
        by_job_type_max_throughput(deadlines, space_sharing=False)
    empty = by_job_type(Problem(np.zeros((0, 1)), Cluster({"t0": 1})), space_sharing=False)
    assert empty.matrix.shape == (0, 1) and empty.objective is None
