"""Water-filling by job class (technique ``aggregate_job_types``) against per-job water-filling."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_feasible

import allocopt
from allocopt import Cluster, Problem
from allocopt.bench.instances import soroush_problem
from allocopt.errors import InvalidOptionError
from allocopt.formulations.water_filling import job_classes


def repeated_problem(seed: int, n_classes: int, n_jobs: int, k: int, n_entities: int):
    """Jobs drawn from ``n_classes`` (throughput row, scale factor, weight) classes, on a contended
    cluster, optionally in entities with mixed fairness / fifo policies."""
    rng = np.random.default_rng(seed)
    T = rng.uniform(0.5, 20.0, size=(n_classes, k))
    T[rng.random((n_classes, k)) < 0.3] = 0.0
    T[:, 0] = np.maximum(T[:, 0], 0.5)
    scale = rng.choice([1, 1, 2, 4], size=n_classes)
    weight = rng.choice([1.0, 2.0, 4.0], size=n_classes)
    pick = rng.integers(0, n_classes, size=n_jobs)
    capacity = {f"t{j}": int(c) for j, c in enumerate(rng.integers(max(4, n_jobs // 8), n_jobs // 2 + 5, size=k))}
    kwargs = {"scale_factors": scale[pick], "priority_weights": weight[pick]}
    if not n_entities:
        return Problem(T[pick], Cluster(capacity), **kwargs), None
    entities = [f"e{v}" for v in rng.integers(0, n_entities, size=n_jobs)]
    names = sorted(set(entities))
    problem = Problem(T[pick], Cluster(capacity), entities=entities,
                      entity_weights={e: float(rng.choice([1, 2, 3])) for e in names},
                      time_since_start=rng.choice([0.0, 10.0, 20.0], size=n_jobs), **kwargs)
    return problem, {e: str(rng.choice(["fairness", "fifo"])) for e in names}


def assert_same_levels(by_class, per_job) -> None:
    a, b = np.sort(by_class.extras["levels"]), np.sort(per_job.extras["levels"])
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9 * b.max())
    assert by_class.objective == pytest.approx(per_job.objective, rel=1e-6)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("heterogeneity_aware", [True, False])
def test_class_solve_matches_per_job(seed, heterogeneity_aware):
    problem, _ = repeated_problem(seed, n_classes=6, n_jobs=60, k=3, n_entities=0)
    by_class = allocopt.solve(problem, "water_filling", heterogeneity_aware=heterogeneity_aware)
    per_job = allocopt.solve(problem, "water_filling", heterogeneity_aware=heterogeneity_aware, technique="plain")
    assert by_class.extras["technique"] == "aggregate_job_types"
    assert "classes" in by_class.extras["technique_reason"]
    assert per_job.extras["technique"] == "plain"
    keys = np.column_stack([problem.throughputs, problem.scale_factors, problem.priority_weights])
    assert by_class.extras["num_job_types"] == np.unique(keys, axis=0).shape[0]
    assert_same_levels(by_class, per_job)
    assert_feasible(by_class)
    # members of a class get the same row
    of_job = by_class.extras["type_of_job"]
    first = np.unique(of_job, return_index=True)[1]
    np.testing.assert_array_equal(by_class.matrix, by_class.matrix[first][of_job])


@pytest.mark.parametrize("seed", range(6))
def test_class_solve_with_entities(seed):
    """Entities with fairness shares count each class's members; fifo entities' jobs stay apart."""
    problem, policies = repeated_problem(seed, n_classes=4, n_jobs=48, k=2, n_entities=3)
    fairness = {e: "fairness" for e in policies}
    for entity_policies in (None, fairness, policies):
        per_job = allocopt.solve(problem, "water_filling", entity_policies=entity_policies, technique="plain")
        by_class = allocopt.solve(problem, "water_filling", entity_policies=entity_policies,
                                  technique="aggregate_job_types")
        assert by_class.extras["technique"] == "aggregate_job_types"
        assert_same_levels(by_class, per_job)
        assert_feasible(by_class)
    of_job, rows = job_classes(problem, policies)
    fifo = np.isin([problem.entity_ids[e] for e in problem.entities],
                   [e for e, p in policies.items() if p == "fifo"])
    assert np.bincount(of_job)[of_job][fifo].max(initial=1) == 1  # each fifo job its own class


def test_auto_picks_per_job_for_distinct_jobs():
    rng = np.random.default_rng(0)
    problem = Problem(rng.uniform(1.0, 10.0, size=(40, 3)), Cluster({"a": 8, "b": 8, "c": 4}))
    allocation = allocopt.solve(problem, "water_filling")
    assert allocation.extras["technique"] == "plain"
    assert "40 classes" in allocation.extras["technique_reason"]


def test_soroush_instance_by_class():
    problem = soroush_problem(512, 1)
    by_class = allocopt.solve(problem, "water_filling")
    per_job = allocopt.solve(problem, "water_filling", technique="plain")
    assert by_class.extras["technique"] == "aggregate_job_types"
    assert by_class.extras["num_job_types"] < problem.num_jobs / 2
    assert_same_levels(by_class, per_job)


def test_space_sharing_is_not_aggregated():
    problem, _ = repeated_problem(1, n_classes=3, n_jobs=12, k=2, n_entities=0)
    with pytest.raises(InvalidOptionError, match="space_sharing"):
        allocopt.solve(problem, "water_filling", aggregate_job_types=True, space_sharing=True)
