"""Pollux: PolluxProblem validation, the restart factor, and the exact MILP against exhaustive
enumeration of every allocation matrix on every MILP backend."""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
from conftest import ALL_BACKENDS

import allocopt
from allocopt import Cluster, Status
from allocopt.backends import get_backend
from allocopt.errors import InvalidOptionError, InvalidProblemError
from allocopt.formulations.pollux import fitness
from allocopt.pollux_problem import PolluxAllocation, PolluxProblem, pollux_restart_factor

# nodes: a0, a1 (2 GPUs each), b0 (2 GPUs)
CLUSTER = Cluster({"a": 4, "b": 2}, gpus_per_node=2)


def random_problem(seed: int, aware: bool) -> PolluxProblem:
    """2-3 jobs on 3 nodes of 2 GPUs, speedups concave in replicas and lower across nodes, some
    shapes missing, random previous allocations, restart factors and node limits."""
    rng = np.random.default_rng(seed)
    n, R = int(rng.integers(2, 4)), 4
    r = np.arange(R + 1)
    S = (r[None, None, None, :] ** rng.uniform(0.4, 1.0, (n, 1, 1, 1))
         * rng.uniform(0.7, 1.3, (n, 2 if aware else 1, 2, R + 1)) * np.array([1.0, 0.8])[None, None, :, None])
    S[rng.random(S.shape) < 0.1] = 0.0
    previous = np.zeros((n, 3), dtype=int)
    for i in range(n):
        if rng.random() < 0.6:
            previous[i, int(rng.integers(0, 3))] = 1
    return PolluxProblem(S, CLUSTER, previous=previous, restart_factor=rng.uniform(0.3, 1.0, n),
                         max_nodes=int(rng.integers(1, 4)))


CASES = [(seed, aware, p) for seed, aware, p in zip(range(6), itertools.cycle([False, True]),
                                                    itertools.cycle([-1.0, -1.0, -2.0]))]


@functools.lru_cache(maxsize=None)
def case(index: int) -> tuple[PolluxProblem, float]:
    """A random problem and its optimum by enumeration (computed once for every backend)."""
    seed, aware, p = CASES[index]
    problem = random_problem(seed, aware)
    return problem, enumerate_optimum(problem, p)


def enumerate_optimum(problem: PolluxProblem, p: float) -> float:
    """Best fitness over every matrix of replicas per job and node, checked from scratch."""
    n, m = problem.num_jobs, problem.num_nodes
    best = -np.inf
    for combo in itertools.product(itertools.product(range(3), repeat=m), repeat=n):
        a = np.array(combo)
        if np.any(a.sum(axis=0) > problem.node_gpus):
            continue
        nodes = np.count_nonzero(a, axis=1)
        if np.any(nodes > problem.max_nodes) or np.any((a > 0)[nodes > 1].sum(axis=0) > 1):
            continue  # too many nodes, or two jobs spanning several nodes share one
        if problem.heterogeneity_aware and np.any([len(set(problem.node_type[a[i] > 0])) > 1 for i in range(n)]):
            continue
        if np.any((problem.speedup_of(a) == 0) & (a.sum(axis=1) > 0)):
            continue  # a shape the job cannot take
        best = max(best, fitness(problem, a, p))
    return best


def solve_options(backend: str) -> dict:
    return {"solver_options": {"solver": "HIGHS"}} if backend == "cvxpy" else {}


def check_feasible(alloc: PolluxAllocation) -> None:
    problem, a = alloc.problem, alloc.replicas
    assert np.all(a >= 0) and np.all(a.sum(axis=0) <= problem.node_gpus)
    spread = np.count_nonzero(a, axis=1) > 1
    assert np.all((a > 0)[spread].sum(axis=0) <= 1)
    assert np.all(np.count_nonzero(a, axis=1) <= problem.max_nodes)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_exact_optimum_equals_enumeration(backend):
    if not get_backend(backend).supports_integer:
        pytest.skip(f"{backend} solves LPs only")
    for index, (seed, aware, p) in enumerate(CASES):
        problem, best = case(index)
        alloc = allocopt.solve(problem, "pollux", backend=backend, p=p, **solve_options(backend))
        assert alloc.status is Status.OPTIMAL and alloc.extras["technique"] == "milp"
        assert alloc.extras["mip_gap"] <= 1e-9
        assert alloc.objective == pytest.approx(best, rel=1e-6), (seed, aware)
        assert fitness(problem, alloc.replicas, p) == pytest.approx(best, rel=1e-6)
        check_feasible(alloc)
        whole = allocopt.solve(problem, "pollux", backend=backend, p=p, relaxation_first=False,
                               **solve_options(backend))
        assert whole.objective == pytest.approx(best, rel=1e-6), (seed, aware)
        check_feasible(whole)


def test_keeping_an_allocation_avoids_the_restart_factor():
    """One job on one 2-GPU node, speedup 1 at 1 replica and 1.5 at 2: with a restart factor of 0.5
    growing to 2 replicas is worth 0.75 < 1, so it keeps its replica; with 0.9 it grows (1.35)."""
    S = np.zeros((1, 1, 2, 3))
    S[0, 0, 0, 1:] = [1.0, 1.5]
    cluster = Cluster({"g": 2}, gpus_per_node=2)
    for factor, replicas in ((0.5, 1), (0.9, 2)):
        problem = PolluxProblem(S, cluster, previous=[[1]], restart_factor=[factor])
        alloc = allocopt.solve(problem, "pollux", speedup_scale=1.0)
        assert alloc.replicas.tolist() == [[replicas]]
        assert alloc.restarted.tolist() == [replicas != 1]


def test_interference_avoidance_keeps_two_distributed_jobs_apart():
    """Two jobs that each want 2 replicas over 2 nodes (and cannot run on one node) on 2 nodes of
    2 GPUs: they cannot both span both nodes, so one runs and the other idles."""
    S = np.zeros((2, 1, 2, 3))
    S[:, 0, 1, 2] = 1.0
    problem = PolluxProblem(S, Cluster({"g": 4}, gpus_per_node=2))
    alloc = allocopt.solve(problem, "pollux")
    assert sorted(alloc.num_replicas.tolist()) == [0, 2]
    check_feasible(alloc)


def test_aware_jobs_stay_on_one_type_and_unaware_ones_may_span():
    """A job worth most at 4 replicas over several nodes, on 2 GPUs of each of two types: unaware it
    spans both types, aware (the same speedups per type) it cannot reach 4 replicas."""
    S = np.zeros((1, 1, 2, 5))
    S[0, 0, 0, 1:3] = [1.0, 1.8]
    S[0, 0, 1, 2:5] = [1.7, 2.4, 3.2]
    cluster = Cluster({"a": 2, "b": 2}, gpus_per_node=2)
    unaware = allocopt.solve(PolluxProblem(S, cluster), "pollux")
    aware = allocopt.solve(PolluxProblem(np.repeat(S, 2, axis=1), cluster), "pollux")
    assert unaware.num_replicas.tolist() == [4] and aware.num_replicas.tolist() == [2]


def test_new_job_of_age_zero_waits_a_round():
    """Pollux's restart factor counts for new jobs too: at age 0 it is 0, so the job stays idle."""
    assert pollux_restart_factor([0.0, 30.0, 300.0], [0, 0, 1]).tolist() == pytest.approx([0.0, 0.5, 270 / 330])
    S = np.zeros((1, 1, 2, 3))
    S[0, 0, 0, 1:] = [1.0, 1.5]
    problem = PolluxProblem(S, Cluster({"g": 2}, gpus_per_node=2), restart_factor=pollux_restart_factor([0.0], [0]))
    assert allocopt.solve(problem, "pollux").replicas.tolist() == [[0]]


def test_invalid_problems_name_the_field_and_job():
    S = np.ones((2, 1, 2, 3))
    with pytest.raises(InvalidProblemError, match="shape") as err:
        PolluxProblem(np.ones((2, 3, 2, 3)), CLUSTER)
    assert err.value.field == "speedup"
    bad = S.copy()
    bad[1, 0, 0, 2] = -1.0
    with pytest.raises(InvalidProblemError, match="job 'y'") as err:
        PolluxProblem(bad, CLUSTER, job_ids=["x", "y"])
    assert err.value.job == "y"
    with pytest.raises(InvalidProblemError, match="node 0") as err:
        PolluxProblem(S, CLUSTER, previous=[[2, 0, 0], [1, 0, 0]])
    assert err.value.field == "previous"
    with pytest.raises(InvalidProblemError, match="whole numbers") as err:
        PolluxProblem(S, CLUSTER, job_ids=["x", "y"], previous=[[0, 0, 0], [0.5, 0, 0]])
    assert err.value.job == "y"
    with pytest.raises(InvalidProblemError, match="restart_factor"):
        PolluxProblem(S, CLUSTER, restart_factor=[1.0, 1.5])
    with pytest.raises(InvalidProblemError, match="max_nodes"):
        PolluxProblem(S, CLUSTER, max_nodes=0)
    with pytest.raises(InvalidProblemError, match="appears more than once"):
        PolluxProblem(S, CLUSTER, job_ids=["x", "x"])
    with pytest.raises(InvalidProblemError, match="delay_s"):
        pollux_restart_factor(10.0, 0, 0.0)


def test_invalid_options_say_why():
    problem = PolluxProblem(np.ones((1, 1, 2, 3)), CLUSTER)
    with pytest.raises(InvalidOptionError, match="p < 0"):
        allocopt.solve(problem, "pollux", p=1.0)
    with pytest.raises(InvalidOptionError, match="epsilon"):
        allocopt.solve(problem, "pollux", epsilon=0.0)
    with pytest.raises(InvalidOptionError, match="speedup_scale"):
        allocopt.solve(problem, "pollux", speedup_scale=-1.0)
    with pytest.raises(InvalidOptionError, match="finite"):
        allocopt.solve(problem, "pollux", p=float("nan"))
    with pytest.raises(InvalidOptionError, match="applies to sia"):
        allocopt.solve(problem, "pollux", technique="relaxation_first")


def test_no_jobs_and_no_gain():
    empty = PolluxProblem(np.ones((0, 1, 2, 3)), CLUSTER)
    assert allocopt.solve(empty, "pollux").replicas.shape == (0, 3)
    zero = PolluxProblem(np.zeros((2, 1, 2, 3)), CLUSTER)
    alloc = allocopt.solve(zero, "pollux")
    assert alloc.status is Status.OPTIMAL and alloc.replicas.sum() == 0


@pytest.mark.parametrize("backend", ["highs", "gurobi"])
def test_relaxation_first_equals_the_whole_milp(backend):
    """The default path (the MILP over groups of nodes) reaches the whole MILP's optimum,
    on 8 jobs on 4 nodes of 4 GPUs where jobs spanning nodes compete for whole nodes."""
    if get_backend(backend).unavailable_reason():
        pytest.skip(get_backend(backend).unavailable_reason())
    rng = np.random.default_rng(3)
    for trial in range(4):
        n, R = 8, 12
        r = np.arange(R + 1)
        S = (r[None, None, None, :] / 2.0) ** rng.uniform(0.5, 0.95, (n, 1, 1, 1)) \
            * np.array([1.0, 0.8])[None, None, :, None]
        previous = np.zeros((n, 4), dtype=int)
        previous[0, 0], previous[1, 1], previous[2, 2:] = 3, 2, 1
        problem = PolluxProblem(S, Cluster({"g": 16}, gpus_per_node=4), previous=previous,
                                restart_factor=rng.uniform(0.5, 1.0, n))
        fast = allocopt.solve(problem, "pollux", backend=backend)
        whole = allocopt.solve(problem, "pollux", backend=backend, relaxation_first=False)
        assert fast.status is Status.OPTIMAL and fast.extras["mip_gap"] == 0.0
        assert fast.objective == pytest.approx(whole.objective, rel=1e-7), trial
        check_feasible(fast)


# ----------------------------------------------------------------------------------------------
# Pollux's genetic search (pymoo)
# ----------------------------------------------------------------------------------------------
def test_genetic_search_is_seeded_feasible_and_never_beats_the_exact_optimum():
    pytest.importorskip("pymoo", reason="technique='genetic' needs pymoo (allocopt[pollux])")
    for index in (0, 2):
        problem, best = case(index)
        p = CASES[index][2]
        runs = [allocopt.solve(problem, "pollux", technique="genetic", p=p, seed=seed, generations=8,
                               population=40) for seed in (1, 1, 2)]
        assert np.array_equal(runs[0].replicas, runs[1].replicas)  # seeded
        for ga in runs:
            assert ga.status is Status.APPROXIMATE and ga.extras["technique"] == "genetic"
            check_feasible(ga)
            assert ga.objective == pytest.approx(fitness(problem, ga.replicas, p))
            assert ga.objective <= best * (1 + 1e-9)
            # elitist: the previous allocation is in the first population
            assert ga.objective >= fitness(problem, problem.previous, p) * (1 - 1e-9)
        assert runs[0].extras["population"].shape[1:] == (problem.num_jobs, problem.num_nodes)


def test_genetic_search_takes_p_of_any_sign_and_a_carried_population():
    pytest.importorskip("pymoo", reason="technique='genetic' needs pymoo (allocopt[pollux])")
    problem, _ = case(0)
    first = allocopt.solve(problem, "pollux", technique="genetic", p=0.0, generations=5)
    again = allocopt.solve(problem, "pollux", technique="genetic", p=1.0, generations=5,
                           seed_population=first.extras["population"])
    check_feasible(again)
    with pytest.raises(InvalidOptionError, match="seed_population"):
        allocopt.solve(problem, "pollux", technique="genetic", seed_population=np.zeros((2, 1, 1)))
    with pytest.raises(InvalidOptionError, match="generations"):
        allocopt.solve(problem, "pollux", technique="genetic", generations=0)


# ----------------------------------------------------------------------------------------------
# The stand-in for Sia's PolluxPolicyUnaware
# ----------------------------------------------------------------------------------------------
def sia_round(n_jobs: int, previous: dict):
    """Sia's unaware simulator's inputs: JobInfo-like jobs whose speedup_fn is Sia's fallback for jobs
    without a goodput model yet (``lambda n, r: r``), 4 virtual nodes of 4 GPUs."""
    from types import SimpleNamespace
    jobs = {f"job-{i}": SimpleNamespace(speedup_fn=lambda n, r: r, max_replicas=8, min_replicas=0, preemptible=True,
                                        attained_service=10.0 * i, creation_timestamp=float(i), age=60.0 * (i + 1),
                                        num_restarts=0, resources={"nvidia.com/gpu": 1})
            for i in range(n_jobs)}
    nodes = {k: SimpleNamespace(resources={"nvidia.com/gpu": 4}, preemptible=False) for k in range(4)}
    return jobs, nodes, previous


def test_stand_in_answers_in_sias_format():
    from allocopt.adapters.sia_simulator import PolluxSimulatorPolicy
    jobs, nodes, previous = sia_round(3, {"job-0": [0, 0, 1, 1]})
    policy = PolluxSimulatorPolicy(-1)
    answer, desired = policy.optimize(jobs, nodes, previous, nodes[0])
    assert desired == 4 and set(answer) == set(jobs)
    used = [node for replicas in answer.values() for node in replicas]
    assert all(used.count(k) <= 4 for k in nodes)
    assert policy.last.status is Status.OPTIMAL and policy.last.extras["mip_gap"] == 0.0
    # speedup r / ceil(16 / 3): every job gets GPUs, the 16 GPUs are all used
    assert all(answer.values()) and len(used) == 16
    assert policy.last.problem.job_ids == ("job-0", "job-1", "job-2")  # by attained service


def test_stand_in_genetic_carries_its_population():
    pytest.importorskip("pymoo", reason="technique='genetic' needs pymoo (allocopt[pollux])")
    from allocopt.adapters.sia_simulator import PolluxSimulatorPolicy
    policy = PolluxSimulatorPolicy(-1, technique="genetic", generations=5)
    jobs, nodes, previous = sia_round(3, {})
    answer, _ = policy.optimize(jobs, nodes, previous, None)
    jobs, nodes, _ = sia_round(4, {})
    carried = policy._carried(["job-3", "job-0", "job-1", "job-2"], list(nodes))
    assert carried.shape[1:] == (4, 4) and not carried[:, 0].any()
    again, _ = policy.optimize(jobs, nodes, answer, None)
    assert policy.rounds == 2 and set(again) == set(jobs)


def test_identical_jobs_are_merged_without_changing_the_optimum():
    """Copies of a few jobs (as in Sia's scale workloads) are solved as classes with counts: the same
    optimum as the whole MILP, and fewer variables than jobs x shapes."""
    rng = np.random.default_rng(5)
    r = np.arange(9)
    kinds = (r[None, None, None, :] / 2.0) ** rng.uniform(0.5, 0.9, (3, 1, 1, 1)) \
        * np.array([1.0, 0.8])[None, None, :, None]
    S = kinds[np.arange(9) % 3]
    previous = np.zeros((9, 4), dtype=int)
    previous[0, 0] = 2  # one job may keep its allocation: it stays a class of its own
    problem = PolluxProblem(S, Cluster({"g": 16}, gpus_per_node=4), previous=previous)
    fast = allocopt.solve(problem, "pollux")
    whole = allocopt.solve(problem, "pollux", relaxation_first=False)
    assert fast.extras["job_classes"] == 4
    assert fast.objective == pytest.approx(whole.objective, rel=1e-7)
    check_feasible(fast)


def grouped_case(seed: int, aware: bool) -> PolluxProblem:
    """Jobs on 5 nodes (of 4 and 3 GPUs per type), some copies of each other, previous allocations
    that share nodes and span nodes, node limits of 2-3."""
    rng = np.random.default_rng(seed)
    n, R = 7, 8
    r = np.arange(R + 1)
    kinds = (r[None, None, None, :] / 2.0) ** rng.uniform(0.4, 0.95, (3, 2 if aware else 1, 1, 1)) \
        * np.array([1.0, 0.85])[None, None, :, None]
    S = kinds[np.r_[rng.integers(0, 3, 4), 0, 0, 1]]  # jobs 4 and 5 are copies
    cluster = Cluster({"a": 11, "b": 7}, gpus_per_node=4)  # a: 4, 4, 3; b: 4, 3
    previous = np.zeros((n, 5), dtype=int)
    previous[0, 0], previous[1, 0] = 2, 1  # two keepers on one node
    previous[2, 1], previous[2, 2] = 2, 1  # a keeper spanning two nodes
    previous[3, 3], previous[3, 4] = 1, 2  # one on the other type
    factor = np.r_[rng.uniform(0.6, 1.0, 4), 0.9, 0.9, 0.9]
    return PolluxProblem(S, cluster, previous=previous, restart_factor=factor, max_nodes=int(rng.integers(2, 4)))


@pytest.mark.parametrize("aware", [False, True])
def test_groups_of_nodes_give_the_per_node_optimum(aware):
    """The MILP over groups of nodes (arc flows, no variable per job and node) reaches the per-node
    MILP's optimum, with shared and spanning previous allocations, copies of jobs and mixed node sizes."""
    for seed in range(4):
        problem = grouped_case(seed, aware)
        fast = allocopt.solve(problem, "pollux")
        whole = allocopt.solve(problem, "pollux", relaxation_first=False)
        assert fast.status is Status.OPTIMAL and fast.extras["mip_gap"] == 0.0
        assert fast.extras["job_classes"] < problem.num_jobs  # copies merge into classes
        assert fast.objective == pytest.approx(whole.objective, rel=1e-9), (seed, aware)
        assert fitness(problem, fast.replicas) == pytest.approx(fast.objective, rel=1e-12)
        check_feasible(fast)
        if aware:
            assert all(len(set(problem.node_type[row > 0])) <= 1 for row in fast.replicas)
