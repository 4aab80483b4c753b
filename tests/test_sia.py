"""Sia: configuration sets, GoodputProblem validation, restart factors, and the
MILP against exhaustive enumeration on every backend."""

from __future__ import annotations

import copy
import itertools
import pickle

import numpy as np
import pytest
from conftest import ALL_BACKENDS

import allocopt
from allocopt import Cluster, Configurations, GoodputProblem, Status, restart_factor, sia_configurations
from allocopt.errors import InvalidOptionError, InvalidProblemError
from allocopt.formulations.sia import useful_entries, utility_coefficients, valid_entries

# Sia's published CONFIGS_4GPU / CONFIGS_8GPU (nodes, GPUs), siasosp23/artifacts sia-simulator/sia.py.
PUBLISHED_4GPU = ([1, 1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16],
                  [1, 2, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60, 64])
PUBLISHED_8GPU = ([1, 1, 1, 1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64])


def solve_options(backend: str) -> dict:
    return {"solver_options": {"solver": "HIGHS"}} if backend == "cvxpy" else {}


# ----------------------------------------------------------------------------------------------
# Configurations
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("per_node, nodes, gpus, spans", [
    (4, 3, [1, 2, 4, 8, 12], [1, 1, 1, 2, 3]),
    (8, 2, [1, 2, 4, 8, 16], [1, 1, 1, 1, 2]),
])
def test_published_configurations(per_node, nodes, gpus, spans):
    configs = sia_configurations(Cluster({"t": per_node * nodes}, gpus_per_node=per_node))
    assert configs.num_gpus.tolist() == gpus and configs.num_nodes.tolist() == spans
    assert configs.gpu_type.tolist() == [0] * len(gpus) and len(configs) == len(gpus)


@pytest.mark.parametrize("per_node, published", [(4, PUBLISHED_4GPU), (8, PUBLISHED_8GPU)])
def test_configurations_equal_published_tables(per_node, published):
    configs = sia_configurations(Cluster({"t": 64}, gpus_per_node=per_node))
    assert (configs.num_nodes.tolist(), configs.num_gpus.tolist()) == published


def test_heterogeneous_cluster_order_caps_and_empty_types():
    cluster = Cluster({"aws": 24, "empty": 0, "rtx": 24, "odd": 10},
                      gpus_per_node={"aws": 4, "empty": 8, "rtx": 8, "odd": 8})
    configs = sia_configurations(cluster)
    assert configs.gpu_type_names == ("aws",) * 8 + ("rtx",) * 6 + ("odd",) * 4
    assert configs.num_gpus.tolist() == [1, 2, 4, 8, 12, 16, 20, 24, 1, 2, 4, 8, 16, 24, 1, 2, 4, 8]
    assert configs.cluster is cluster and configs.label(9) == "#9 (rtx, 1 node, 2 GPUs)"
    capped = sia_configurations(cluster, max_nodes=2)
    assert capped.num_gpus.tolist() == [1, 2, 4, 8, 1, 2, 4, 8, 16, 1, 2, 4, 8]
    per_type = sia_configurations(cluster, max_nodes={"aws": 3})
    assert per_type.num_gpus[per_type.gpu_type == 0].tolist() == [1, 2, 4, 8, 12]
    assert per_type.num_gpus[per_type.gpu_type == 2].tolist() == [1, 2, 4, 8, 16, 24]


def test_all_gpu_counts():
    cluster = Cluster({"a": 10, "b": 3}, gpus_per_node={"a": 4, "b": 8})
    configs = sia_configurations(cluster, all_gpu_counts=True)
    assert configs.num_gpus.tolist() == list(range(1, 11)) + [1, 2, 3]
    assert configs.num_nodes.tolist() == [1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 1, 1, 1]
    capped = sia_configurations(cluster, all_gpu_counts=True, max_nodes={"a": 2})
    assert capped.num_gpus[capped.gpu_type == 0].tolist() == list(range(1, 9))


def test_configurations_are_immutable():
    configs = sia_configurations(Cluster({"a": 8}))
    with pytest.raises(AttributeError, match="immutable"):
        configs.num_gpus = np.ones(3)
    with pytest.raises(ValueError):
        configs.num_gpus[0] = 5
    assert configs == sia_configurations(Cluster({"a": 8})) and configs != sia_configurations(Cluster({"a": 16}))


def test_configurations_and_goodput_problems_pickle_and_copy():
    cluster = Cluster({"a": 16, "b": 8}, gpus_per_node={"a": 4, "b": 8})
    configs = sia_configurations(cluster)
    for copied in (pickle.loads(pickle.dumps(configs)), copy.deepcopy(configs), copy.copy(configs)):
        assert copied == configs and copied is not configs
        with pytest.raises(AttributeError, match="immutable"):
            copied.num_gpus = np.ones(3)
        assert not copied.num_gpus.flags.writeable
    problem = contended_problem(0, n=20)
    again = pickle.loads(pickle.dumps(problem))
    assert again.configurations == problem.configurations
    assert allocopt.solve(again, "sia").objective == pytest.approx(allocopt.solve(problem, "sia").objective,
                                                                  rel=1e-12)


def test_configuration_validation():
    cluster = Cluster({"a": 8, "b": 0})
    with pytest.raises(InvalidProblemError, match="no GPUs"):
        sia_configurations(Cluster({"a": 0}))
    with pytest.raises(InvalidProblemError, match=r"unknown GPU type\(s\) \['z'\]"):
        sia_configurations(cluster, max_nodes={"z": 1})
    with pytest.raises(InvalidProblemError, match="max_nodes must be a positive integer"):
        sia_configurations(cluster, max_nodes=0)
    with pytest.raises(InvalidProblemError, match="holds more GPUs than its type has"):
        Configurations(cluster, [0], [2], [16])
    with pytest.raises(InvalidProblemError, match="holds more GPUs than its nodes do"):
        Configurations(Cluster({"a": 16}), [0], [1], [16])
    with pytest.raises(InvalidProblemError, match="must be distinct"):
        Configurations(cluster, ["a", "a"], [1, 1], [2, 2])
    with pytest.raises(InvalidProblemError, match="one entry per configuration"):
        Configurations(cluster, [0, 0], [1], [1])
    with pytest.raises(InvalidProblemError, match="not an index"):
        Configurations(cluster, [3], [1], [1])


# ----------------------------------------------------------------------------------------------
# restart_factor
# ----------------------------------------------------------------------------------------------
def test_restart_factor_values():
    r = restart_factor([10.0, 100.0, 100.0, 100.0, 30.0], [0, 0, 2, 5, 3], 30.0)
    np.testing.assert_allclose(r, [1.0, 100 / 130, 40 / 130, 0.0, 0.0])
    assert restart_factor(1000.0, 1, 50.0) == pytest.approx(950 / 1050)
    assert restart_factor(np.zeros((2, 3)), 0, 1.0).shape == (2, 3)
    with pytest.raises(InvalidProblemError, match="delay_s must be finite and > 0"):
        restart_factor(10.0, 1, 0.0)
    with pytest.raises(InvalidProblemError, match="restarts must be whole numbers >= 0"):
        restart_factor(10.0, 1.5, 1.0)


# ----------------------------------------------------------------------------------------------
# GoodputProblem validation
# ----------------------------------------------------------------------------------------------
CLUSTER = Cluster({"slow": 4, "fast": 4}, gpus_per_node=4)
CONFIGS = sia_configurations(CLUSTER)  # slow 1, 2, 4; fast 1, 2, 4
GOODPUT = np.array([[1.0, 1.8, 3.0, 2.0, 3.5, 6.0],
                    [1.0, 1.5, np.nan, 3.0, 4.0, 0.0]])


@pytest.mark.parametrize("kwargs, field, match", [
    ({"goodput": -GOODPUT}, "goodput", r"goodput of job 0 in configuration #0 \(slow, 1 node, 1 GPU\) is -1.0"),
    ({"goodput": np.where(GOODPUT == 3.0, np.inf, GOODPUT)}, "goodput", "is inf; give a finite positive value"),
    ({"goodput": GOODPUT[:, :4]}, "goodput", r"expected \(n_jobs, n_configurations\)"),
    ({"goodput": np.array([[1.0, 0, 0, 0, 0, 0], [0.0] * 6])}, "goodput",
     "job 1 has no positive goodput in any configuration"),
    ({"job_ids": ["a", "a"]}, "job_ids", "job id 'a' appears more than once"),
    ({"job_ids": ["a"]}, "job_ids", "job_ids has 1 entries but goodput has 2 rows"),
    ({"previous": [0, 6]}, "previous", r"previous of job 1 is 6; give a configuration index in 0..5"),
    ({"previous": [0]}, "previous", r"previous has shape \(1,\)"),
    ({"restart_factor": [0.0, 1.0]}, "restart_factor", r"restart_factor of job 0 is 0; it must be in \(0, 1\]"),
    ({"restart_factor": [1.0, 1.5]}, "restart_factor", r"restart_factor of job 1 is 1.5"),
    ({"pinned": [True, False]}, "pinned", "pinned job 0 has no previous configuration"),
    ({"pinned": [False, True], "previous": [-1, 2]}, "pinned",
     r"pinned job 1 cannot use its previous configuration #2 \(slow, 1 node, 4 GPUs\)"),
    ({"pinned": [True, True], "previous": [5, 4]}, "pinned", "pinned jobs hold 6 fast GPUs but the cluster has 4"),
    ({"rigid_gpus": [3, 0]}, "goodput", "rigid job 0 needs 3 GPUs but no configuration has exactly 3"),
    ({"rigid_gpus": [0, 4]}, "goodput", "rigid job 1 has no positive goodput in any configuration with 4 GPUs"),
    ({"rigid_gpus": [-1, 0]}, "rigid_gpus", "rigid_gpus of job 0 is -1"),
])
def test_problem_validation(kwargs, field, match):
    args = {"goodput": GOODPUT, **kwargs}
    goodput = args.pop("goodput")
    with pytest.raises(InvalidProblemError, match=match) as info:
        GoodputProblem(goodput, CONFIGS, CLUSTER, **args)
    assert info.value.field == field


def test_problem_inputs_and_other_cluster():
    problem = GoodputProblem(GOODPUT, CONFIGS, CLUSTER, job_ids=["a", "b"], previous=[None, 4],
                             rigid_gpus=[None, 2], pinned=[0, 1])
    assert problem.num_jobs == 2 and problem.num_configurations == 6
    assert problem.previous.tolist() == [-1, 4] and problem.rigid_gpus.tolist() == [0, 2]
    assert problem.valid.tolist() == [[True] * 6, [False, True, False, False, True, False]]
    assert not problem.valid.flags.writeable and problem.pinned.tolist() == [False, True]
    with pytest.raises(InvalidProblemError, match="configurations were built for"):
        GoodputProblem(GOODPUT, CONFIGS, Cluster({"slow": 4, "fast": 8}, gpus_per_node=4))


# ----------------------------------------------------------------------------------------------
# The MILP against exhaustive enumeration
# ----------------------------------------------------------------------------------------------
def enumerate_optimum(problem: GoodputProblem, p: float, lambda_n: float, lambda_a: float):
    """Best objective over every assignment (a configuration or none per job), stated from scratch."""
    cfg, n = problem.configurations, problem.num_jobs
    G = np.full(problem.goodput.shape, np.nan)
    for i in range(n):
        valid = np.flatnonzero(problem.valid[i])
        scale = problem.rigid_gpus[i] or 1
        for c in valid:
            G[i, c] = scale * problem.goodput[i, c] / problem.goodput[i, valid].min()
            if problem.previous[i] >= 0 and c != problem.previous[i]:
                G[i, c] *= problem.restart_factor[i]
    sigma = 1.0 if p < 0 else -1.0

    def value(assignment) -> float:
        total = 0.0
        for i, c in enumerate(assignment):
            if c >= 0:
                total += G[i, c] ** p - lambda_n
            if problem.previous[i] >= 0 and c != problem.previous[i]:
                total += sigma * lambda_a
        return total

    choices = [[-1] + np.flatnonzero(problem.valid[i]).tolist() if not problem.pinned[i]
               else [int(problem.previous[i])] for i in range(n)]
    best = None
    for assignment in itertools.product(*choices):
        used = np.zeros(problem.cluster.num_gpu_types)
        for c in assignment:
            if c >= 0:
                used[cfg.gpu_type[c]] += cfg.num_gpus[c]
        if np.any(used > problem.cluster.capacity):
            continue
        v = value(assignment)
        if best is None or (v < best if p < 0 else v > best):
            best = v
    return best, value


def random_problem(seed: int) -> GoodputProblem:
    rng = np.random.default_rng(seed)
    cluster = Cluster({"slow": 4, "fast": 2 + 2 * int(rng.integers(0, 2))}, gpus_per_node={"slow": 4, "fast": 2})
    configs = sia_configurations(cluster)  # slow 1, 2, 4; fast 1, 2 (, 4 on 2 nodes)
    n = int(rng.integers(3, 5))
    speed = np.where(configs.gpu_type == 1, 2.0, 1.0)
    goodput = speed * configs.num_gpus ** rng.uniform(0.3, 1.0, (n, 1)) * rng.uniform(0.6, 1.4, (n, len(configs)))
    goodput[rng.random(goodput.shape) < 0.2] = np.nan
    goodput[:, 0] = np.where(np.isnan(goodput[:, 0]), 1.0, goodput[:, 0])  # every job can run somewhere
    previous = np.where(rng.random(n) < 0.6, rng.integers(0, len(configs), n), -1)
    previous[0] = 0
    rigid = np.zeros(n, dtype=int)
    rigid[n - 1] = 2 if seed % 2 else 0
    goodput[n - 1, 1] = 1.7  # slow, 2 GPUs: the rigid job can run
    if rigid[n - 1] and previous[n - 1] >= 0 and configs.num_gpus[previous[n - 1]] != 2:
        previous[n - 1] = -1
    return GoodputProblem(goodput, configs, cluster, previous=previous, rigid_gpus=rigid,
                          restart_factor=rng.uniform(0.3, 1.0, n), pinned=np.arange(n) == 0 if seed % 3 == 0 else None)


OPTION_SETS = [dict(p=-0.5, lambda_n=1.1, lambda_a=0.0), dict(p=-1.0, lambda_n=1.5, lambda_a=0.2),
               dict(p=0.5, lambda_n=-1.1, lambda_a=0.1), dict(p=1.0, lambda_n=0.5, lambda_a=0.0)]


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_optimum_equals_enumeration(backend):
    for seed, options in zip(range(6), itertools.cycle(OPTION_SETS)):
        problem = random_problem(seed)
        best, value = enumerate_optimum(problem, **options)
        # the MILP on this backend (on a cluster this small auto takes dynamic programming, no backend)
        alloc = allocopt.solve(problem, "sia", backend=backend, technique="relaxation_first", **solve_options(backend),
                               **options)
        assert alloc.status is Status.OPTIMAL and alloc.backend == backend
        assert alloc.objective == pytest.approx(best, abs=1e-6), (seed, options)
        assert value(alloc.configuration.tolist()) == pytest.approx(best, abs=1e-6), (seed, options)
        assert np.all(alloc.gpus_used <= problem.cluster.capacity)
        chosen = alloc.configuration[alloc.allocated]
        assert problem.valid[np.flatnonzero(alloc.allocated), chosen].all()
        pinned = np.flatnonzero(problem.pinned)
        assert (alloc.configuration[pinned] == problem.previous[pinned]).all()


def test_pinned_job_keeps_its_configuration_at_a_cost():
    goodput = np.array([[1.0, 2.0, 4.0, 1.0, 2.0, 4.0], [1.0, 2.0, 4.0, 3.0, 6.0, 12.0]])
    free = allocopt.solve(GoodputProblem(goodput, CONFIGS, CLUSTER), "sia")
    assert free.configuration.tolist() == [2, 5]
    pinned = allocopt.solve(GoodputProblem(goodput, CONFIGS, CLUSTER, previous=[5, -1], pinned=[True, False]),
                            "sia")
    assert pinned.configuration.tolist() == [5, 2]
    assert pinned.to_dict() == {0: {"gpu_type": "fast", "num_nodes": 1, "num_gpus": 4},
                                1: {"gpu_type": "slow", "num_nodes": 1, "num_gpus": 4}}


def test_rigid_jobs_get_only_their_gpu_count():
    goodput = np.array([[1.0, 2.0, 4.0, 2.0, 4.0, 8.0]] * 3)
    alloc = allocopt.solve(GoodputProblem(goodput, CONFIGS, CLUSTER, job_ids=["r2", "r1", "a"],
                                          rigid_gpus=[2, 1, 0]), "sia")
    # rigid jobs count as many GPUs as they hold: both on fast (U = 0.5, 0.71) beats the adaptive job there
    assert alloc.gpu_type == ("fast", "fast", "slow") and alloc.num_gpus.tolist() == [2, 1, 4]
    assert alloc.num_nodes.tolist() == [1, 1, 1] and alloc.gpus_used.tolist() == [4, 3]


def test_restart_factor_applies_off_previous_only():
    cluster = Cluster({"a": 2}, gpus_per_node=2)
    configs = sia_configurations(cluster)  # 1 GPU, 2 GPUs
    goodput = [[1.0, 1.5]]
    moved = allocopt.solve(GoodputProblem(goodput, configs, cluster, previous=[0]), "sia")
    assert moved.configuration.tolist() == [1]
    stays = allocopt.solve(GoodputProblem(goodput, configs, cluster, previous=[0], restart_factor=[0.5]), "sia")
    assert stays.configuration.tolist() == [0] and stays.objective == pytest.approx(1.0 - 1.1)
    # the factor never touches the previous configuration itself
    moves = allocopt.solve(GoodputProblem(goodput, configs, cluster, previous=[1], restart_factor=[0.5]), "sia")
    assert moves.configuration.tolist() == [1] and moves.objective == pytest.approx(1.5 ** -0.5 - 1.1)


def test_lambda_a_discourages_changes():
    cluster = Cluster({"a": 2}, gpus_per_node=2)
    configs = sia_configurations(cluster)
    problem = GoodputProblem([[1.0, 1.5]], configs, cluster, previous=[0])
    assert allocopt.solve(problem, "sia").configuration.tolist() == [1]
    kept = allocopt.solve(problem, "sia", lambda_a=0.2)  # 1.5**-0.5 = 0.816 gains only 0.184 over staying
    assert kept.configuration.tolist() == [0] and kept.objective == pytest.approx(1.0 - 1.1)


def test_exact_reductions_drop_dominated_idle_and_unpinned_entries():
    cluster = Cluster({"a": 4}, gpus_per_node=4)  # configurations: 1, 2, 4 GPUs
    configs = sia_configurations(cluster)
    problem = GoodputProblem([[1.0, 1.0, 2.0], [1.0, 1.5, 3.0], [1.0, 1.0, 1.0]], configs, cluster,
                             previous=[-1, 2, 0], restart_factor=[1.0, 1.0, 0.8], pinned=[False, True, False])
    rows, cols = valid_entries(problem)
    coef, offset = utility_coefficients(problem, rows, cols, -0.5, 1.1, 0.0)
    np.testing.assert_allclose(coef[:3], [1.0 - 1.1, 1.0 - 1.1, 2.0 ** -0.5 - 1.1])
    np.testing.assert_allclose(coef[6:], [1.0 - 1.1, 0.8 ** -0.5 - 1.1, 0.8 ** -0.5 - 1.1])
    keep = useful_entries(problem, rows, cols, coef)
    # job 0's 2 GPUs are no better than its 1 GPU; job 1 is pinned; job 2's restart-penalized entries do not improve
    assert list(zip(rows[keep].tolist(), cols[keep].tolist())) == [(0, 0), (0, 2), (1, 2), (2, 0)]
    assert offset == 0.0


def test_sias_utility_rounding_clip_and_tie_break():
    """Sia's published MILP rounds G ** p to 2 decimals and caps it at 3000; its CBC solve then returns the
    later of tied configurations (measured in Sia's simulator: a 2 or 4 GPU choice whose utilities round
    alike went to 4 GPUs, a first 1-GPU start on aws or rtx to rtx)."""
    cluster = Cluster({"a": 4, "b": 4}, gpus_per_node=4)  # configurations: a 1, 2, 4; b 1, 2, 4 GPUs
    configs = sia_configurations(cluster)
    # job 0: 2 and 4 GPUs of "a" round alike (1.9 ** -0.5 = 0.7255, 1.901 ** -0.5 = 0.7253 -> 0.73)
    # job 1: 1 GPU of "a" or of "b" (no model yet, both 1)
    problem = GoodputProblem([[1.0, 1.9, 1.901, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]], configs, cluster)
    rows, cols = valid_entries(problem)
    exact, _ = utility_coefficients(problem, rows, cols, -0.5, 1.1, 0.0)
    rounded, _ = utility_coefficients(problem, rows, cols, -0.5, 1.1, 0.0, decimals=2)
    np.testing.assert_allclose(rounded + 1.1, np.round(exact + 1.1, 2))
    assert rounded[1] == rounded[2] and exact[2] < exact[1]
    clipped, _ = utility_coefficients(problem, rows, cols, -0.5, 1.1, 0.0, decimals=2, clip=0.8)
    np.testing.assert_allclose(clipped + 1.1, np.minimum(np.round(exact + 1.1, 2), 0.8))
    # exact utilities: job 0 takes 4 GPUs (its best); rounded: the tie goes to fewer GPUs unless prefer_later
    assert allocopt.solve(problem, "sia", mip_gap=0).configuration.tolist()[0] == 2
    assert allocopt.solve(problem, "sia", utility_decimals=2).configuration.tolist()[0] == 1
    later = allocopt.solve(problem, "sia", utility_decimals=2, utility_clip=3000, prefer_later=True)
    assert later.configuration.tolist() == [2, 3]
    # the perturbation only decides ties: the rounded objective is the same
    assert later.objective == pytest.approx(float(rounded[[2, 3]].sum()), abs=1e-3)
    # p > 0 maximizes: prefer_later still favours the later tied entry
    assert allocopt.solve(problem, "sia", p=0.5, lambda_n=-1.1, utility_decimals=1,
                          prefer_later=True).configuration.tolist()[1] == 3
    for bad in ({"utility_decimals": -1}, {"utility_decimals": 2.5}, {"utility_decimals": True}):
        with pytest.raises(InvalidOptionError, match="utility_decimals must be a whole number"):
            allocopt.solve(problem, "sia", **bad)
    for bad in (0.0, float("inf"), "3000"):
        with pytest.raises(InvalidOptionError, match="utility_clip must be a finite number > 0"):
            allocopt.solve(problem, "sia", utility_clip=bad)


def test_option_validation_and_sign_combination():
    problem = GoodputProblem(GOODPUT, CONFIGS, CLUSTER)
    with pytest.raises(InvalidOptionError, match=r"p=-0.5 < 0 with lambda_n=0.0 <= 0 leaves every job idle"):
        allocopt.solve(problem, "sia", lambda_n=0.0)
    with pytest.raises(InvalidOptionError, match="p must be nonzero"):
        allocopt.solve(problem, "sia", p=0)
    with pytest.raises(InvalidOptionError, match="lambda_a is the cost of changing"):
        allocopt.solve(problem, "sia", lambda_a=-1.0)
    with pytest.raises(InvalidOptionError, match="lambda_n must be a finite number"):
        allocopt.solve(problem, "sia", lambda_n=float("nan"))
    with pytest.raises(InvalidOptionError, match=r"every job would be left idle: p > 0 maximizes"):
        allocopt.solve(problem, "sia", p=1.0, lambda_n=100.0)
    with pytest.raises(InvalidOptionError, match="every job would be left idle: p < 0 minimizes"):
        allocopt.solve(problem, "sia", p=-1.0, lambda_n=0.01)
    with pytest.raises(InvalidOptionError, match="has no option"):
        allocopt.solve(problem, "sia", beta=1.0)
    with pytest.raises(InvalidOptionError, match="expects an allocopt.GoodputProblem"):
        allocopt.solve(allocopt.Problem([[1.0, 1.0]], CLUSTER), "sia")


def test_no_jobs_crowded_cluster_and_user_presolve():
    empty = allocopt.solve(GoodputProblem(np.zeros((0, len(CONFIGS))), CONFIGS, CLUSTER), "sia")
    assert empty.configuration.shape == (0,) and empty.to_dict() == {} and empty.backend is None
    crowded = allocopt.solve(GoodputProblem(np.ones((12, len(CONFIGS))), CONFIGS, CLUSTER), "sia",
                             technique="relaxation_first", solver_options={"presolve": "on"})
    assert crowded.allocated.sum() == 8 and crowded.gpus_used.tolist() == [4, 4]
    # the price search, then at most one MILP over the tied jobs
    assert crowded.timings.num_solves in (1, 2) and "sia" in repr(crowded)
    idle = crowded.to_dict()
    assert sum(v is None for v in idle.values()) == 4


def contended_problem(seed: int, n: int = 150) -> GoodputProblem:
    """Many jobs on a small two-type cluster, so the LP relaxation is often fractional."""
    rng = np.random.default_rng(seed)
    cluster = Cluster({"slow": 16, "fast": 8}, gpus_per_node={"slow": 4, "fast": 4})
    configs = sia_configurations(cluster)
    speed = np.where(configs.gpu_type == 1, 2.5, 1.0)
    goodput = speed * configs.num_gpus ** rng.uniform(0.3, 0.95, (n, 1)) * rng.uniform(0.7, 1.3, (n, len(configs)))
    previous = np.where(rng.random(n) < 0.3, rng.integers(0, len(configs), n), -1)
    pinned = (previous >= 0) & (configs.num_gpus[previous] <= 2) & (rng.random(n) < 0.1)
    return GoodputProblem(goodput, configs, cluster, previous=previous, restart_factor=rng.uniform(0.5, 1.0, n),
                          pinned=pinned)


def test_relaxation_first_has_the_milp_optimum():
    """By default (no mip_gap) the price path returns the optimum of the whole MILP at zero gap."""
    reduced_milps = 0
    for seed, options in itertools.product(range(6), OPTION_SETS):
        problem = contended_problem(seed)
        fast = allocopt.solve(problem, "sia", technique="relaxation_first", **options)
        whole = allocopt.solve(problem, "sia", mip_gap=0.0, relaxation_first=False, **options)
        assert fast.objective == pytest.approx(whole.objective, rel=1e-9, abs=1e-9), (seed, options)
        assert fast.extras["mip_gap"] == 0.0 and whole.extras["mip_gap"] <= 1e-9
        assert np.all(fast.gpus_used <= problem.cluster.capacity)
        pinned = np.flatnonzero(problem.pinned)
        assert (fast.configuration[pinned] == problem.previous[pinned]).all()
        bound = fast.extras["lp_bound"]  # a valid bound, in the objective's sense
        assert (fast.objective >= bound - 1e-9) if options["p"] < 0 else (fast.objective <= bound + 1e-9)
        if not fast.extras["relaxation_integral"]:  # an integrality gap: a MILP was solved after the prices
            reduced_milps += 1
            assert 0 < fast.extras["milp_binaries"] <= problem.valid.sum() and fast.extras["milp_solves"] <= 6
    assert reduced_milps > 0


@pytest.mark.parametrize("make", [random_problem, contended_problem])
def test_dynamic_programming_has_the_milp_optimum(make):
    """On small clusters auto solves Sia's MILP by dynamic programming over the GPUs in use per type: the
    optimum of an enumeration (random problems: pinned and rigid jobs, every sign of p) and of the whole MILP
    at zero gap (150 jobs contending for 24 GPUs), feasible, pinned jobs kept; no backend is called."""
    for seed, options in itertools.product(range(6), OPTION_SETS):
        problem = make(seed)
        alloc = allocopt.solve(problem, "sia", **options)
        assert alloc.extras["technique"] == "dynamic_programming" and alloc.backend is None
        assert alloc.status is Status.OPTIMAL and alloc.extras["mip_gap"] == 0.0
        if make is random_problem:
            best, value = enumerate_optimum(problem, **options)
            assert alloc.objective == pytest.approx(best, abs=1e-9), (seed, options)
            assert value(alloc.configuration.tolist()) == pytest.approx(best, abs=1e-9)
        else:
            whole = allocopt.solve(problem, "sia", technique="whole_milp", mip_gap=0.0, **options)
            assert alloc.objective == pytest.approx(whole.objective, rel=1e-9, abs=1e-9), (seed, options)
        assert np.all(alloc.gpus_used <= problem.cluster.capacity)
        pinned = np.flatnonzero(problem.pinned)
        assert (alloc.configuration[pinned] == problem.previous[pinned]).all()


def test_dynamic_programming_limits():
    """Asked for on a cluster too large it is a clear error; auto keeps the price path there."""
    from allocopt.bench.instances import sia_rounds

    problem = sia_rounds(640, seed=1)[0]["first"]
    with pytest.raises(InvalidOptionError, match="dynamic programming would keep"):
        allocopt.solve(problem, "sia", technique="dynamic_programming")
    assert allocopt.solve(problem, "sia").extras["technique"] == "relaxation_first"


def test_relaxation_first_is_exact_on_steady_rounds_where_the_default_gap_is_not():
    """A steady-state round (previous configurations, restart factors, pinned jobs) has an
    integrality gap; the price path matches the whole MILP at zero gap, the whole MILP
    at HiGHS's default relative gap reports the gap it stopped at."""
    from allocopt.bench.instances import sia_rounds

    rounds, _ = sia_rounds(640, seed=1)
    for name, problem in rounds.items():
        fast = allocopt.solve(problem, "sia")
        exact = allocopt.solve(problem, "sia", relaxation_first=False, mip_gap=0.0)
        default = allocopt.solve(problem, "sia", relaxation_first=False)
        assert fast.objective == pytest.approx(exact.objective, rel=1e-9), name
        assert fast.objective <= default.objective + 1e-9  # minimizing: never worse than the default gap's answer
        gap = default.extras["mip_gap"]
        assert gap is not None and 0.0 <= gap <= 1e-4
        assert (default.objective - fast.objective) <= gap * abs(default.objective) + 1e-9
        assert fast.extras["mip_gap"] == 0.0 and np.all(fast.gpus_used <= problem.cluster.capacity)
        assert fast.extras["milp_binaries"] < 0.5 * problem.valid.sum()  # fixing left a reduced MILP
