"""The priority mechanism, placement and the simulated executor."""

from __future__ import annotations

import numpy as np
import pytest

import allocopt
from allocopt.errors import InvalidOptionError, InvalidProblemError
from allocopt.mechanism.placement import GpuLayout, place
from allocopt.mechanism.priority import (UNSERVED_PRIORITY_SCALE, MechanismOptions, PriorityMechanism, greedy_fill,
                                         priorities, select_jobs)
from allocopt.runtime.executor import Lease, RoundOutcome, RoundPlan
from allocopt.runtime.simulated import SimulatedExecutor


# ----- priorities ------------------------------------------------------------------------
def test_priorities_hand_case():
    X = np.array([[0.5, 0.5], [1.0, 0.0], [0.2, 0.3]])
    received = np.array([[10.0, 30.0], [30.0, 0.0], [0.0, 0.0]])
    T = np.array([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    prio = priorities(X, received, T)
    # totals per type: 40 and 30; shares [[.25, 1], [.75, 0], [0, 0]]
    np.testing.assert_allclose(prio[0], [2.0, 0.5])
    assert prio[1, 0] == pytest.approx(1.0 / 0.75)
    assert prio[1, 1] == 0.0  # no allocation on the type
    assert prio[2, 0] == pytest.approx(0.2 * UNSERVED_PRIORITY_SCALE)  # nothing received: above all, by X
    assert prio[2, 1] == 0.0  # zero throughput


@pytest.mark.parametrize("seed", range(20))
def test_greedy_fill_matches_sequential_walk(seed):
    rng = np.random.default_rng(seed)
    sizes = rng.choice([1, 2, 4, 8], size=rng.integers(0, 40))
    capacity = int(rng.integers(0, 30))
    expected, free = [], capacity
    for s in sizes:
        expected.append(bool(s <= free))
        free -= s if s <= free else 0
    np.testing.assert_array_equal(greedy_fill(sizes, capacity), expected)


def _selection_case(seed: int, n: int = 60):
    rng = np.random.default_rng(seed)
    T = rng.uniform(0.5, 5.0, size=(n, 3)) * (rng.random((n, 3)) > 0.1)
    X = rng.dirichlet(np.ones(3), size=n) * 0.3
    received = rng.uniform(0, 100, size=(n, 3))
    sf = rng.choice([1, 2, 4, 8], size=n, p=[0.7, 0.1, 0.15, 0.05])
    return T, X, received, sf


@pytest.mark.parametrize("seed", range(5))
def test_select_respects_capacity_scale_factors_and_one_type(seed):
    T, X, received, sf = _selection_case(seed)
    capacity = np.array([8, 6, 5])
    chosen = select_jobs(priorities(X, received, T), np.zeros_like(X), X, T, sf, capacity, [0, 1, 2])
    used = np.bincount(chosen[chosen >= 0], weights=sf[chosen >= 0], minlength=3)
    assert (used <= capacity).all()
    assert (T[np.flatnonzero(chosen >= 0), chosen[chosen >= 0]] > 0).all()  # never on a zero-throughput type
    # work-conserving: every idle GPU could not hold any unscheduled job that runs there
    for j in range(3):
        waiting = (chosen < 0) & (T[:, j] > 0)
        assert not (sf[waiting] <= capacity[j] - used[j]).any()


def test_select_walks_by_priority_then_deficit_then_allocation():
    T = np.ones((4, 1))
    X = np.array([[0.1], [0.5], [0.5], [0.3]])
    received = np.array([[100.0], [100.0], [100.0], [100.0]])
    deficit = np.array([[0.0], [0.0], [5.0], [0.0]])
    sf = np.array([1, 1, 1, 1])
    chosen = select_jobs(priorities(X, received, T), deficit, X, T, sf, np.array([2]), [0])
    np.testing.assert_array_equal(chosen, [-1, 0, 0, -1])  # the two of priority 0.5/0.25 win
    chosen = select_jobs(priorities(X, received, T), deficit, X, T, sf, np.array([1]), [0])
    np.testing.assert_array_equal(chosen, [-1, -1, 0, -1])  # tie broken by the deficit


def test_select_skips_jobs_too_large_for_what_is_left():
    T = np.ones((3, 1))
    X = np.array([[0.9], [0.5], [0.1]])
    received = np.ones((3, 1))
    chosen = select_jobs(priorities(X, received, T), np.zeros((3, 1)), X, T, np.array([2, 4, 1]),
                         np.array([4]), [0])
    np.testing.assert_array_equal(chosen, [0, -1, 0])


def test_jobs_without_allocation_fill_idle_gpus():
    mech = PriorityMechanism(np.ones((5, 2)), np.ones(5, dtype=int), np.array([2, 2]), ["a", "b"],
                             MechanismOptions(run_unallocated=True))
    mech.add_jobs(np.arange(5))
    mech.reset(0.0, np.arange(2), np.array([[1.0, 0.0], [0.0, 1.0]]))
    chosen = mech.select(np.arange(5))
    assert (chosen[:2] >= 0).all()  # allocated jobs first
    assert (chosen >= 0).sum() == 4  # and two newcomers (priority 0) fill the idle GPUs


def test_jobs_without_allocation_hold_their_gpus_idle_as_in_gavel():
    # Type a (visited first): job 0 (priority > 0), then the priority-0 entries in job order: job 1
    # (allocated on b only) takes a's second GPU. Type b: newcomers 2 and 3 take its GPUs in the
    # walk but have no allocation yet: they do not run, and b stays idle this round.
    mech = PriorityMechanism(np.ones((5, 2)), np.ones(5, dtype=int), np.array([2, 2]), ["a", "b"])
    mech.add_jobs(np.arange(5))
    mech.reset(0.0, np.arange(2), np.array([[1.0, 0.0], [0.0, 1.0]]))
    np.testing.assert_array_equal(mech.select(np.arange(5)), [0, 0, -1, -1, -1])
    mech.reset(10.0, np.arange(5), np.full((5, 2), 0.4))  # a recompute gives every job an allocation
    assert (mech.select(np.arange(5)) >= 0).sum() == 4


def test_recompute_throttle_starts_after_time_zero():
    mech = PriorityMechanism(np.ones((2, 1)), np.ones(2, dtype=int), np.array([1]), ["a"])
    assert mech.recompute_due(0.0)
    mech.reset(0.0, np.arange(2), np.full((2, 1), 0.5))
    assert mech.recompute_due(5.0)  # Gavel: a recompute at time 0 does not start the 1,920 s throttle
    mech.reset(5.0, np.arange(2), np.full((2, 1), 0.5))
    assert not mech.recompute_due(1924.0) and mech.recompute_due(1925.0)


def test_random_type_order_is_seeded():
    T = np.ones((3, 3))
    def draws(seed):
        mech = PriorityMechanism(T, np.ones(3, dtype=int), np.ones(3, dtype=int), "xyz",
                                 MechanismOptions(type_order="random", seed=seed))
        return [mech.type_order().tolist() for _ in range(10)]

    assert draws(3) == draws(3)
    assert len({tuple(order) for order in draws(3)}) > 1  # a new order every round
    fastest = PriorityMechanism(np.array([[1.0, 3.0, 2.0]]), np.ones(1, dtype=int), np.ones(3, dtype=int), "xyz")
    assert fastest.type_order().tolist() == [1, 2, 0]
    with pytest.raises(InvalidOptionError):
        PriorityMechanism(T, np.ones(3, dtype=int), np.ones(3, dtype=int), "xyz", MechanismOptions(type_order=["q"]))


def test_random_type_order_is_gavels_shuffle():
    # Gavel shuffles ["v100", "p100", "k80"] (types with GPUs only) each round with random.Random(seed + 5)
    import random

    T = np.array([[3.0, 2.0, 1.0]])
    mech = PriorityMechanism(T, np.ones(1, dtype=int), np.array([2, 0, 4]), ["v100", "p100", "k80"],
                             MechanismOptions(type_order="random", seed=7))
    shuffler = random.Random(12)
    for _ in range(5):
        expected = ["v100", "k80"]
        shuffler.shuffle(expected)
        assert [["v100", "p100", "k80"][j] for j in mech.type_order()] == expected


def test_deficit_carried_over_at_reset():
    mech = PriorityMechanism(np.ones((1, 1)), np.ones(1, dtype=int), np.array([1]), ["a"],
                             MechanismOptions(round_seconds=100.0))
    mech.add_jobs(np.array([0]))
    mech.reset(0.0, np.array([0]), np.array([[0.5]]))
    assert mech.received_s[0, 0] == 50.0  # counters start at half a round
    mech.record(np.array([0]), np.array([0]), np.array([100.0]))
    mech.reset(400.0, np.array([0]), np.array([[0.5]]))
    assert mech.deficit_s[0, 0] == pytest.approx(0.5 * 400 - 100)
    assert not mech.recompute_due(1000.0) and mech.recompute_due(2320.0)


def _run_rounds(problem, X, rounds, **options):
    rows = np.arange(problem.num_jobs)
    mech = PriorityMechanism(problem.throughputs, problem.scale_factors, problem.cluster.capacity,
                             problem.cluster.gpu_types, MechanismOptions(round_seconds=360.0, **options))
    mech.add_jobs(rows)
    mech.reset(0.0, rows, X)
    got = np.zeros_like(X)
    for _ in range(rounds):
        chosen = mech.select(rows)
        run = np.flatnonzero(chosen >= 0)
        mech.record(run, chosen[run], np.full(run.size, 360.0))
        got[run, chosen[run]] += 1
    return got / rounds


def test_mechanism_converges_to_the_allocation_on_one_type():
    cluster = allocopt.Cluster({"v100": 4})
    rng = np.random.default_rng(0)
    problem = allocopt.Problem(rng.uniform(1, 10, size=(10, 1)), cluster, scale_factors=[1] * 8 + [2] * 2,
                               priority_weights=rng.choice([1.0, 2.0], size=10))
    X = allocopt.solve(problem, "max_min_fairness").matrix
    share = _run_rounds(problem, X, 1000)
    assert np.abs(share - X).max() < 0.01


@pytest.mark.parametrize("seed", [0, 1])
def test_mechanism_approaches_the_allocation_across_types(seed):
    # Per-type greedy rounds cannot always realize a perfectly packed heterogeneous allocation
    # (a job placed on a faster type leaves a slower type's GPU idle), so received shares come
    # within a few percent of the allocated ones, and idle GPUs are filled.
    table = allocopt.throughput.ThroughputTable.gavel()
    cluster = allocopt.Cluster({"v100": 3, "p100": 2, "k80": 4})
    problem = table.sample_problem(cluster, 12, seed=seed, scale_factor_probs={1: 1.0})
    X = allocopt.solve(problem, "max_min_fairness").matrix
    T = problem.throughputs
    for work_conserving in (False, True):
        share = _run_rounds(problem, X, 1000, work_conserving=work_conserving)
        assert (share.sum(axis=1) - X.sum(axis=1)).min() > -0.07
        assert ((share * T).sum(axis=1) / (X * T).sum(axis=1)).min() > 0.9
        if not work_conserving:
            assert (share[X == 0] == 0).all()


# ----- placement -------------------------------------------------------------------------
def test_layout_numbers_type_by_type_node_by_node():
    layout = GpuLayout(allocopt.Cluster({"v100": 6, "k80": 4}, gpus_per_node={"v100": 4, "k80": 2}))
    np.testing.assert_array_equal(layout.gpu_type, [0] * 6 + [1] * 4)
    np.testing.assert_array_equal(layout.node, [0, 0, 0, 0, 1, 1, 2, 2, 3, 3])
    np.testing.assert_array_equal(layout.local_index, [0, 1, 2, 3, 0, 1, 0, 1, 0, 1])
    np.testing.assert_array_equal(layout.node_start, [0, 4, 6, 8, 10])
    assert layout.describe(7) == "k80 node 2 gpu 1"


def test_placement_keeps_previous_gpus_and_consolidates():
    layout = GpuLayout(allocopt.Cluster({"v100": 16}, gpus_per_node=8))
    # last round: job "a" held GPUs 1 and 2 (node 0), job "b" held 9
    previous = {"a": (1, 2), "b": (9,), "c": (3,)}
    out = place(layout, ["a", "b", "c", "d", "e"], np.zeros(5, dtype=int), np.array([2, 1, 2, 4, 1]), previous)
    assert out[0].gpu_ids == (1, 2) and out[0].extended
    assert out[1].gpu_ids == (9,) and out[1].extended
    assert not out[2].extended  # "c" needs 2 GPUs now: a new placement
    for p in out:
        assert len({int(layout.node[g]) for g in p.gpu_ids}) == 1  # every job within one server
    ids = [g for p in out for g in p.gpu_ids]
    assert len(ids) == len(set(ids)) == 10
    # a 16-GPU job takes two whole servers
    assert sorted(place(layout, ["z"], np.zeros(1, dtype=int), np.array([16]))[0].gpu_ids) == list(range(16))


def test_placement_best_fit_and_capacity_error():
    layout = GpuLayout(allocopt.Cluster({"v100": 16}, gpus_per_node=8))
    previous = {"a": tuple(range(5))}  # node 0 keeps 3 free GPUs after "a"
    out = place(layout, ["a", "b"], np.zeros(2, dtype=int), np.array([5, 3]), previous)
    assert set(out[1].gpu_ids) == {5, 6, 7}  # the fuller server that fits, leaving node 1 whole
    with pytest.raises(InvalidProblemError):
        place(layout, ["a", "b"], np.zeros(2, dtype=int), np.array([16, 1]))


def sequential_placement(layout, job_ids, gpu_types, num_gpus, previous):
    """The placement rules one job at a time (largest first): keep last round's GPUs when all are free
    and of the type and count; else best fit on one server, else the emptiest servers."""
    free = np.ones(layout.num_gpus, dtype=bool)
    node_free = np.diff(layout.node_start).copy()
    out = [None] * len(job_ids)
    order = np.argsort(-np.asarray(num_gpus), kind="stable").tolist()
    for i in order:
        ids = previous.get(job_ids[i])
        if ids is not None and len(ids) == num_gpus[i] and all(layout.gpu_type[g] == gpu_types[i] for g in ids) \
                and all(free[g] for g in ids) and len(set(ids)) == len(ids):
            free[list(ids)] = False
            for g in ids:
                node_free[layout.node[g]] -= 1
            out[i] = (tuple(ids), True)
    for i in order:
        if out[i] is not None:
            continue
        j, n = int(gpu_types[i]), int(num_gpus[i])
        nodes = layout.type_nodes[j].tolist()
        fitting = [v for v in nodes if node_free[v] >= n]
        if n <= layout.cluster.gpus_per_node[j] and fitting:
            chosen = [min(fitting, key=lambda v: node_free[v])]
        else:
            chosen = sorted(nodes, key=lambda v: -node_free[v])
        ids = []
        for v in chosen:
            for g in range(layout.node_start[v], layout.node_start[v + 1]):
                if free[g] and len(ids) < n:
                    free[g] = False
                    node_free[v] -= 1
                    ids.append(g)
        out[i] = (tuple(ids), False)
    return out


@pytest.mark.parametrize("seed", range(3))
def test_vectorized_placement_equals_the_sequential_rules(seed):
    rng = np.random.default_rng(seed)
    for _ in range(150):
        k = int(rng.integers(1, 4))
        cluster = allocopt.Cluster({f"t{j}": int(rng.integers(1, 40)) for j in range(k)},
                                   gpus_per_node={f"t{j}": int(rng.choice([4, 8])) for j in range(k)})
        layout = GpuLayout(cluster)

        def draw():
            types, sizes, left = [], [], cluster.capacity.copy()
            for _ in range(int(rng.integers(0, 30))):
                j, size = int(rng.integers(k)), int(rng.choice([1, 1, 2, 4, 8, 16]))
                if size <= left[j]:
                    types.append(j), sizes.append(size)
                    left[j] -= size
            ids = rng.permutation(40)[:len(types)].tolist()
            return ids, np.array(types, dtype=np.int64), np.array(sizes, dtype=np.int64)

        ids, types, sizes = draw()
        previous = {job: p.gpu_ids for job, p in zip(ids, place(layout, ids, types, sizes))}
        if previous and rng.random() < 0.3:  # two jobs name the same GPUs: the larger keeps them
            first, last = list(previous)[0], list(previous)[-1]
            previous[last] = previous[first]
        ids, types, sizes = draw()
        got = place(layout, ids, types, sizes, previous)
        assert [(p.gpu_ids, p.extended) for p in got] == sequential_placement(layout, ids, types, sizes, previous)


# ----- simulated executor ------------------------------------------------------------------
def test_simulated_executor_runs_steps_and_finishes_early():
    executor = SimulatedExecutor({"a": {"v100": 2.5}, "b": {"v100": 1.0}}, restart_overhead_s=10.0)
    plan = RoundPlan(0, 100.0, 360.0, (Lease("a", "v100", (0,), 360.0, max_steps=10_000, extended=True),
                                       Lease("b", "v100", (1,), 360.0, max_steps=50)))
    a, b = executor.run_round(plan)
    assert a.steps == 900 and a.outcome is RoundOutcome.PREEMPTED and not a.restarted
    assert a.run_seconds == pytest.approx(360.0) and a.measured_steps_per_s == 2.5
    assert b.steps == 50 and b.outcome is RoundOutcome.COMPLETED and b.restarted
    assert b.run_seconds == pytest.approx(60.0)  # 10 s restart + 50 steps at 1 step/s
    assert executor.now() == pytest.approx(460.0)


def test_simulated_executor_runs_array_rounds_as_lease_rounds():
    T = np.array([[2.5, 0.0], [1.0, 0.3], [0.7, 4.0]])
    leases = [Lease(0, "v100", (0,), 360.0, max_steps=10_000, extended=True),
              Lease(1, "k80", (4,), 360.0, max_steps=50),
              Lease(2, "k80", (5, 6), 360.0, max_steps=7, extended=True), Lease(0, "k80", (7,), 360.0, max_steps=5)]
    by_objects = SimulatedExecutor(T, gpu_types=["v100", "k80"], restart_overhead_s=10.0)
    results = by_objects.run_round(RoundPlan(0, 100.0, 360.0, tuple(leases)))
    by_arrays = SimulatedExecutor(T, gpu_types=["v100", "k80"], restart_overhead_s=10.0)
    steps, seconds, completed, failed = by_arrays.run_arrays(
        100.0, 360.0, np.array([0, 1, 2, 0]), np.array([0, 1, 1, 1]), np.array([10_000, 50, 7, 5]),
        np.array([True, False, True, False]), np.full(4, -1), ["v100", "k80"])
    assert steps.tolist() == [r.steps for r in results]
    assert seconds.tolist() == [r.run_seconds for r in results]
    assert completed.tolist() == [r.outcome is RoundOutcome.COMPLETED for r in results]
    assert failed.tolist() == [r.outcome is RoundOutcome.FAILED for r in results] == [False, False, False, True]
    assert by_arrays.now() == by_objects.now()
    with pytest.raises(InvalidOptionError):
        SimulatedExecutor(T, gpu_types=["v100"])
    with pytest.raises(InvalidOptionError):
        SimulatedExecutor({0: {"v100": 1.0}}).run_arrays(0.0, 360.0, np.array([0]), np.array([0]), np.array([1]),
                                                         np.array([True]), np.array([-1]), ["v100"])
