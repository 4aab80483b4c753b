"""Heuristic baselines: FIFO, Gandiva and AlloX produce feasible, rule-following assignments."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import assert_feasible
from hypothesis import given, settings
from hypothesis import strategies as st

import allocopt
from allocopt import Cluster, Problem
from allocopt.errors import InvalidProblemError

CLUSTER = Cluster({"v100": 2, "k80": 2})


def test_fifo_takes_jobs_in_arrival_order():
    # the oldest jobs (largest time_since_start) run; the 2-GPU job blocks the queue behind it
    problem = Problem([[10, 2]] * 5, CLUSTER, job_ids="abcde", scale_factors=[1, 1, 2, 1, 1],
                      time_since_start=[50, 40, 30, 20, 10])
    aware = allocopt.solve(problem, "fifo", heterogeneity_aware=True)
    np.testing.assert_array_equal(aware.matrix, [[1, 0], [1, 0], [0, 1], [0, 0], [0, 0]])
    assert aware.backend is None and aware.objective is None
    random = allocopt.solve(problem, "fifo", seed=3)
    assert_feasible(random)
    assert random.matrix[:2].sum() == 2  # the two oldest always fit


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 12))
def test_fifo_is_feasible_and_work_conserving(seed, n):
    rng = np.random.default_rng(seed)
    problem = Problem(rng.uniform(1, 10, size=(n, 2)), CLUSTER, scale_factors=rng.choice([1, 2], size=n),
                      time_since_start=rng.uniform(0, 100, size=n))
    alloc = allocopt.solve(problem, "fifo", heterogeneity_aware=bool(seed % 2), seed=seed)
    assert_feasible(alloc)
    assert set(np.unique(alloc.matrix)) <= {0.0, 1.0}
    order = np.argsort(-problem.time_since_start, kind="stable")
    running = alloc.matrix.sum(axis=1)[order] > 0
    assert not np.any(~running[:-1] & running[1:]), "a younger job ran while an older one waited"


def pair_problem(n: int, gain: float) -> Problem:
    """n single-GPU jobs on 1 GPU, every pair sharing at `gain` times the solo throughput in total."""
    pairs = {(a, b): {"v100": (5.0 * gain / 2, 5.0 * gain / 2)} for a, b in itertools.combinations(range(n), 2)}
    return Problem([[5.0]] * n, Cluster({"v100": 1}), time_since_start=np.arange(n, 0, -1.0),
                   pair_throughputs=pairs)


def test_fifo_packed_pairs_queued_jobs_when_sharing_pays():
    packed = allocopt.solve(pair_problem(3, 1.9), "fifo", space_sharing=True)
    assert_feasible(packed)
    assert packed.pair_matrix.sum() == 1.0 and packed.matrix.sum() == 0.0  # job 0 now shares with job 1
    assert packed.effective_throughput.tolist() == pytest.approx([4.75, 4.75, 0.0])
    lonely = allocopt.solve(pair_problem(3, 1.2), "fifo", space_sharing=True)  # below the 1.5 threshold
    assert lonely.pair_matrix.sum() == 0.0 and lonely.matrix[0, 0] == 1.0


def test_gandiva_pairs_at_random_only_when_oversubscribed():
    busy = allocopt.solve(pair_problem(4, 1.9), "gandiva", seed=1)
    assert_feasible(busy)
    assert busy.pair_matrix.astype(bool).sum() == 2  # 4 jobs -> 2 random pairs, time split evenly
    np.testing.assert_allclose(busy.time_fraction, 0.5)
    assert busy.pair_matrix.tolist() == allocopt.solve(pair_problem(4, 1.9), "gandiva", seed=1).pair_matrix.tolist()
    idle = allocopt.solve(Problem([[5.0]] * 2, Cluster({"v100": 4})), "gandiva")
    np.testing.assert_allclose(idle.matrix, 1.0)


def test_allox_matches_brute_force_on_one_gpu_per_type():
    """Two GPUs (one per type), two jobs: the assignment minimizing total completion time."""
    T = np.array([[10.0, 1.0], [4.0, 2.0]])
    steps = np.array([100.0, 40.0])
    problem = Problem(T, Cluster({"v100": 1, "k80": 1}), num_steps_remaining=steps, time_since_start=[0.0, 0.0])
    alloc = allocopt.solve(problem, "allox", alpha=1.0)
    best = min(itertools.permutations(range(2)), key=lambda perm: sum(steps[i] / T[i, j] for i, j in enumerate(perm)))
    expected = np.zeros((2, 2))
    expected[[0, 1], list(best)] = 1.0
    np.testing.assert_array_equal(alloc.matrix, expected)


def test_allox_runs_one_job_per_gpu():
    rng = np.random.default_rng(0)
    problem = Problem(rng.uniform(1, 10, size=(9, 2)), CLUSTER, num_steps_remaining=rng.uniform(100, 1000, 9),
                      time_since_start=rng.uniform(0, 100, 9))
    alloc = allocopt.solve(problem, "allox")
    assert_feasible(alloc)
    assert alloc.matrix.sum() == 4  # every GPU busy
    with pytest.raises(InvalidProblemError, match="allox assigns single GPUs"):
        allocopt.solve(Problem([[1.0, 1.0]], CLUSTER, scale_factors=[2], num_steps_remaining=[1]), "allox")
