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


# --- The stand-in for Sia's simulator policy object (allocopt.adapters.sia_simulator) ---

from allocopt.adapters.sia_simulator import SiaSimulatorPolicy, _place_fast  # noqa: E402
from allocopt.errors import InvalidOptionError  # noqa: E402

SIA_NODES = {"aws": 6, "dgx-ext": 2, "rtx": 3}
SIA_GPUS_PER_NODE = {"aws": 4, "dgx-ext": 8, "rtx": 8}
SIA_MAX_NODES = {"azure": 5, "aws": 16, "dgx": 2, "dgx-ext": 2, "quad": 1, "rtx": 3}


class Speedup:
    """The interface of Sia's goodput functions: ``get_goodput(num_nodes, num_replicas)``."""

    def __init__(self, base: float):
        self.base = base

    def get_goodput(self, num_nodes: np.ndarray, num_replicas: np.ndarray) -> np.ndarray:
        return self.base * num_replicas ** 0.8 / num_nodes ** 0.05


class Job:
    """The attributes of Sia's ``JobInfo`` that its policy reads (see Sia's ``cluster.py``)."""

    def __init__(self, fns: dict, *, max_replicas: int = 16, age: float = 0.0, restarts: int = 0,
                 scaling_underway: bool = False, category: str | None = None):
        self.speedup_fn = {t: fns.get(t) for t in SIA_NODES}
        self.min_replicas = dict.fromkeys(SIA_NODES, 0)
        self.max_replicas = dict.fromkeys(SIA_NODES, max_replicas)
        self.scale_unit = dict.fromkeys(SIA_NODES, 1)
        self.age, self.num_restarts, self.scaling_underway, self.category = age, restarts, scaling_underway, category
        self.cluster_throughput_ratios = {t: {u: 0.5 for u in SIA_NODES if u != t} for t in SIA_NODES}
        self.cluster_throughputs = dict.fromkeys(SIA_NODES, 1.0)


class Node:
    def __init__(self, gpus: int):
        self.resources = {"nvidia.com/gpu": gpus}


def sia_policy(**kwargs) -> SiaSimulatorPolicy:
    policy = SiaSimulatorPolicy(p_fairness=-0.5, restart_penalty=30, lambda_a=0.01, lambda_n=1.1,
                                project_throughputs=True, share_max_replicas=True, **kwargs)
    policy.populate_valid_configs(SIA_NODES, SIA_GPUS_PER_NODE, SIA_MAX_NODES)
    return policy


def sia_nodes() -> dict:
    return {t: {i: Node(SIA_GPUS_PER_NODE[t]) for i in range(n)} for t, n in SIA_NODES.items()}


def test_stand_in_configurations_are_sias():
    """Sia's populate_valid_configs on its default cluster (measured: 19 configurations in this order)."""
    configs = sia_policy().configurations
    got = list(zip(configs.gpu_type_names, configs.num_nodes.tolist(), configs.num_gpus.tolist()))
    assert got == [("aws", 1, 1), ("aws", 1, 2), ("aws", 1, 4), ("aws", 2, 8), ("aws", 3, 12), ("aws", 4, 16),
                   ("aws", 5, 20), ("aws", 6, 24), ("dgx-ext", 1, 1), ("dgx-ext", 1, 2), ("dgx-ext", 1, 4),
                   ("dgx-ext", 1, 8), ("dgx-ext", 2, 16), ("rtx", 1, 1), ("rtx", 1, 2), ("rtx", 1, 4),
                   ("rtx", 1, 8), ("rtx", 2, 16), ("rtx", 3, 24)]


def test_stand_in_placement_is_sias():
    """Sia's alloc_to_placement_fast on these inputs (measured from Sia's code)."""
    free = np.full(6, 4)
    assert _place_fast([("a", 2), ("b", 8), ("c", 1), ("d", 4), ("e", 4)], free) == {
        "b": [0, 0, 0, 0, 1, 1, 1, 1], "d": [2, 2, 2, 2], "e": [3, 3, 3, 3], "a": [4, 4], "c": [5]}
    assert _place_fast([("a", 12), ("b", 2), ("c", 2), ("d", 1)], np.full(6, 4)) == {
        "a": [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2], "b": [3, 3], "c": [4, 4], "d": [5]}


def test_stand_in_optimize_answers_in_sias_shape():
    policy = sia_policy(mip_gap=0.0)
    jobs = {f"cifar10-{k}": Job({"aws": Speedup(1.0 + k), "rtx": Speedup(2.0)}) for k in range(6)}
    jobs["bert-0"] = Job({})  # no model anywhere yet: its smallest configuration only
    answer = policy.optimize(jobs, sia_nodes(), {})
    assert set(answer) == set(jobs)
    used = {t: 0 for t in SIA_NODES}
    for name, (cluster, gpus) in answer.items():
        if cluster is None:
            assert gpus == ()
            continue
        used[cluster] += len(gpus)
        per_node = SIA_GPUS_PER_NODE[cluster]
        assert all(0 <= node < SIA_NODES[cluster] for node in gpus)
        assert all(gpus.count(node) <= per_node for node in set(gpus))
    assert all(used[t] <= SIA_NODES[t] * SIA_GPUS_PER_NODE[t] for t in SIA_NODES)
    assert len(answer["bert-0"][1]) == 1  # its only configuration: one GPU
    assert policy.last_status["exact"] and policy.last_status["status"] == "optimal"
    assert policy.last_status["mip_gap"] == 0.0


def test_stand_in_reports_its_mip_gap():
    policy = sia_policy()  # Sia's CBC gap, 1e-4
    jobs = {f"cifar10-{k}": Job({"aws": Speedup(1.0 + k / 3), "rtx": Speedup(2.0 + k / 7)}) for k in range(40)}
    policy.optimize(jobs, sia_nodes(), {})
    status = policy.last_status
    assert status["mip_gap_limit"] == 1e-4 and 0.0 <= status["mip_gap"] <= 1e-4
    # proven optimal only when the solve proved it (a zero gap, or an integral LP relaxation)
    assert status["exact"] == (status["mip_gap"] <= 1e-9 or bool(status.get("relaxation_integral")))
    assert status["status"] == ("optimal" if status["exact"] else "within_gap")
    if not status["exact"]:
        assert "MIP gap of 0.0001" in status["message"]


def test_stand_in_goodputs_are_projected_and_normalized_as_sia_does():
    policy = sia_policy()
    row = policy._goodput_row("cifar10-0", Job({"rtx": Speedup(2.0)}))
    configs = policy.configurations
    gpus, nodes = configs.num_gpus.astype(float), configs.num_nodes.astype(float)
    rtx = configs.gpu_type == configs.cluster.index("rtx")
    aws = configs.gpu_type == configs.cluster.index("aws")
    raw = np.where(rtx, 2.0 * gpus ** 0.8 / nodes ** 0.05, 0.0)
    # aws from the rtx model: replicas on ceil(replicas / 8) rtx nodes, times the ratio 0.5
    raw[aws] = 0.5 * 2.0 * gpus[aws] ** 0.8 / np.ceil(gpus[aws] / 8) ** 0.05
    raw[~(rtx | aws)] = 0.5 * 2.0 * gpus[~(rtx | aws)] ** 0.8 / np.ceil(gpus[~(rtx | aws)] / 8) ** 0.05
    raw[gpus > 16] = 0.0  # beyond max_replicas (16 replicas of 1 GPU)
    expected = raw / raw[raw > 0].min()
    np.testing.assert_allclose(row, expected, rtol=1e-5)
    assert row[row > 0].min() == pytest.approx(1.0)


def test_stand_in_keeps_pinned_and_restart_heavy_jobs_in_place():
    policy = sia_policy(mip_gap=0.0)
    jobs = {"cifar10-0": Job({"aws": Speedup(1.0), "rtx": Speedup(2.0)}),
            "cifar10-1": Job({"aws": Speedup(1.0), "rtx": Speedup(2.0)})}
    first = policy.optimize(jobs, sia_nodes(), {})
    before = dict(policy.prev_configuration)
    # many more jobs arrive; job 0 is in checkpoint-restore, job 1 has lost its whole age to restarts
    jobs = {"cifar10-0": Job({"aws": Speedup(1.0), "rtx": Speedup(2.0)}, age=600, restarts=1, scaling_underway=True),
            "cifar10-1": Job({"aws": Speedup(1.0), "rtx": Speedup(2.0)}, age=600, restarts=20)}
    jobs.update({f"bert-{k}": Job({"rtx": Speedup(5.0), "aws": Speedup(1.0)}) for k in range(12)})
    second = policy.optimize(jobs, sia_nodes(), first)
    assert policy.prev_configuration["cifar10-0"] == before["cifar10-0"]
    assert second["cifar10-0"][0] == first["cifar10-0"][0]
    # moving costs job 1 everything: it keeps its configuration or yields its GPUs, never moves
    assert policy.prev_configuration.get("cifar10-1", before["cifar10-1"]) == before["cifar10-1"]


def test_stand_in_rejects_rigid_jobs_and_unpopulated_use():
    with pytest.raises(InvalidOptionError, match="populate_valid_configs"):
        SiaSimulatorPolicy().optimize({}, {}, {})
    with pytest.raises(InvalidProblemError, match="rigid"):
        sia_policy().optimize({"ncf-0": Job({}, category="rigid")}, sia_nodes(), {})


def test_stand_in_breaks_ties_as_sias_solve_does():
    """Measured in Sia's simulator (saturn workload-1): a job without a throughput model anywhere starts
    on one GPU of the last type (rtx), and of two GPU counts whose rounded utilities tie, Sia takes the
    larger; exact utilities (``utility_decimals=None``) see no tie."""
    policy = sia_policy(mip_gap=0.0)
    answer = policy.optimize({"cifar10-0": Job({})}, sia_nodes(), {})
    assert answer["cifar10-0"][0] == "rtx" and len(answer["cifar10-0"][1]) == 1

    class Flat(Speedup):  # 8 GPUs a little worse than 4, within the rounding of Sia's utilities
        def get_goodput(self, num_nodes, num_replicas):
            return np.where(num_replicas >= 4, 1.9 - 0.001 * (num_replicas == 8), num_replicas ** 0.5)

    jobs = {"cifar10-0": Job({"dgx-ext": Flat(1.0)}, max_replicas=8)}
    jobs["cifar10-0"].speedup_fn = {"aws": None, "dgx-ext": Flat(1.0), "rtx": None}
    policy.project_throughputs = False  # keep the other types out (their smallest configuration only)
    rounded = policy.optimize(jobs, sia_nodes(), {})
    assert rounded["cifar10-0"][0] == "dgx-ext" and len(rounded["cifar10-0"][1]) == 8
    exact = sia_policy(mip_gap=0.0, utility_decimals=None)
    exact.project_throughputs = False
    assert len(exact.optimize(jobs, sia_nodes(), {})["cifar10-0"][1]) == 4  # 1.9 > 1.899 without rounding
