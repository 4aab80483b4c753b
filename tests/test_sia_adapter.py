"""The Sia-style policy in a small Sia-like round loop (real solver)."""

from __future__ import annotations

import numpy as np
import pytest

import allocopt
from allocopt.adapters.sia import SiaAssignment, SiaPolicy
from allocopt.errors import InvalidProblemError
from allocopt.mechanism.sia_rounds import SiaJobState, plan_round
from allocopt.throughput.goodput import GoodputModel, GradParams, PerfParams, goodput_matrix

CLUSTER = allocopt.Cluster({"aws": 8, "rtx": 8}, gpus_per_node={"aws": 4, "rtx": 8})


def scaling_goodput(configurations: allocopt.Configurations, speed: dict[str, float]) -> dict[tuple, float]:
    """Sub-linear scaling: ``speed[type] * gpus ** 0.8``, a penalty for spanning nodes."""
    return {(t, int(n), int(g)): speed[t] * g ** 0.8 / n ** 0.1
            for t, n, g in zip(configurations.gpu_type_names, configurations.num_nodes, configurations.num_gpus)
            if t in speed}


def model(compute_s: float) -> GoodputModel:
    return GoodputModel(PerfParams(compute_s, compute_s / 50, 0.05, 0.01, 0.02, 0.005, 1.5), GradParams(0.5, 2.0),
                        init_batch_size=64, max_batch_size=1024, max_local_bsz=128)


def check(assignments: dict, jobs: dict) -> None:
    """Counts and types match the configuration, nodes are respected, every GPU id is used at most once."""
    used = [g for a in assignments.values() for g in a.gpu_ids]
    assert len(used) == len(set(used))
    start = {"aws": 0, "rtx": 8}
    for job, a in assignments.items():
        assert job in jobs and isinstance(a, SiaAssignment)
        assert len(a.gpu_ids) == a.num_gpus and all(start[a.gpu_type] <= g < start[a.gpu_type] + 8 for g in a.gpu_ids)
        per_node = CLUSTER.gpus_per_node[CLUSTER.index(a.gpu_type)]
        assert len({(g - start[a.gpu_type]) // per_node for g in a.gpu_ids}) == a.num_nodes


def test_round_loop_with_arrivals_departures_and_restarts():
    policy = SiaPolicy(CLUSTER, round_seconds=60.0)
    configs = policy.configurations
    jobs = {k: {"goodput": scaling_goodput(configs, {"aws": 1.0 + k, "rtx": 2.0 + k / 2}),
                "application": "cifar10"} for k in range(4)}
    held: dict = {}
    rounds = []
    for round_index in range(8):
        if round_index == 3:
            jobs["late"] = {"models": {"aws": model(0.02), "rtx": model(0.01)}, "restart_delay_s": 10.0}
        if round_index == 5:
            del jobs[0]
        assignments = policy.optimize(jobs, held)
        check(assignments, jobs)
        for job, a in assignments.items():
            assert a.extended == (tuple(held.get(job, ())) == a.gpu_ids)
            assert a.restore_delay_s == (0.0 if a.extended else jobs[job].get("restart_delay_s", 30.0))
        assert set(policy.last_plan.stop) == {j for j in held if j in jobs and j not in assignments}
        held = {job: list(a.gpu_ids) for job, a in assignments.items()}
        rounds.append(assignments)
    assert set(rounds[0]) == {0, 1, 2, 3} and "late" in rounds[3] and 0 not in rounds[5]
    assert sum(a.extended for a in rounds[-1].values()) >= len(rounds[-1]) - 1  # steady state keeps GPUs


def test_first_round_is_plan_round_of_the_same_inputs():
    policy = SiaPolicy({"aws": 8}, gpus_per_node=4, lambda_n=1.2)
    models = [{"aws": model(0.02)}, {"aws": model(0.05)}, {"aws": model(0.01)}]
    goodput = goodput_matrix(models, policy.configurations)
    jobs = {"a": {"models": models[0]}, "b": {"goodput": goodput[1].tolist()}, "c": {"models": models[2]}}
    assignments = policy.optimize(jobs, {})
    states = [SiaJobState(job, "", 0.0) for job in "abc"]
    plan = plan_round(states, policy.cluster, policy.configurations, goodput, {}, round_index=0, start_s=0.0,
                      lambda_n=1.2)
    assert {job: a.gpu_ids for job, a in assignments.items()} == plan.gpu_ids
    np.testing.assert_array_equal(policy.last_plan.allocation.configuration, plan.allocation.configuration)


def test_previous_allocations_from_the_caller_win():
    policy = SiaPolicy(CLUSTER)
    jobs = {"a": {"goodput": scaling_goodput(policy.configurations, {"aws": 1.0, "rtx": 1.0})}}
    first = policy.optimize(jobs, {})["a"]
    assert not first.extended
    assert policy.optimize(jobs, {"a": first.gpu_ids})["a"].extended
    moved = policy.optimize(jobs, {})["a"]  # the caller says it lost its GPUs: a restart
    assert not moved.extended and moved.restore_delay_s == 30.0


@pytest.mark.parametrize("jobs, held, field", [
    ({"a": {"goodput": {("tpu", 1, 1): 1.0}}}, {}, "goodput"),
    ({"a": {"goodput": [1.0, 2.0]}}, {}, "goodput"),
    ({"a": {"goodput": [1.0], "models": {}}}, {}, "jobs"),
    ({"a": {}}, {}, "jobs"),
    ({"a": {"goodput": {("aws", 1, 1): 1.0}}}, {"a": [99]}, "prev_allocations"),
])
def test_malformed_input_names_the_field(jobs, held, field):
    with pytest.raises(InvalidProblemError) as err:
        SiaPolicy(CLUSTER).optimize(jobs, held)
    assert err.value.field == field
