"""End-to-end simulations of Sia workloads with Pollux's policy (``PolluxPlanner``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest

from allocopt import Cluster
from allocopt.errors import InvalidOptionError
from allocopt.mechanism.pollux_rounds import PolluxPlanner
from allocopt.mechanism.sia_rounds import SiaExecutor, SiaRoundPlan
from allocopt.mechanism.sia_workloads import SiaWorkloadJob, read_sia_workload, shipped_workloads_dir
from allocopt.mechanism.simulator import simulate
from allocopt.runtime.executor import JobRoundResult, RoundPlan
from allocopt.throughput.profiles import load_profiles, shipped_profiles_dir

SATURN = shipped_workloads_dir() / "saturn" / "workload-1.csv"
CLUSTER = Cluster({"aws": 24, "rtx": 24, "dgx-ext": 16}, {"aws": 4, "rtx": 8, "dgx-ext": 8})


def small_workload(n: int) -> list[SiaWorkloadJob]:
    jobs = [j for j in read_sia_workload(SATURN) if j.application in ("bert", "cifar10", "imagenet")][:n]
    return [replace(j, time_s=j.time_s / 10.0) for j in jobs]


class RecordingExecutor(SiaExecutor):
    def __init__(self) -> None:
        super().__init__()
        self.plans: list[SiaRoundPlan] = []

    def run_round(self, plan: RoundPlan) -> Sequence[JobRoundResult]:
        self.plans.append(plan)
        return super().run_round(plan)


@pytest.fixture(scope="module")
def profiles():
    return load_profiles(shipped_profiles_dir())


@pytest.mark.parametrize("options", [{}, {"heterogeneity_aware": True}, {"explore_replicas": True, "p": -2.0},
                                     {"virtual_node_gpus": 4},
                                     {"technique": "genetic", "generations": 3, "population": 20}])
def test_pollux_simulation_end_to_end(profiles, options):
    """Every job finishes; GPUs are never shared; at most one job spanning nodes per node; a job pays
    its restore time exactly when its GPUs change; every job on one GPU type."""
    if options.get("technique") == "genetic":
        pytest.importorskip("pymoo", reason="technique='genetic' needs pymoo (allocopt[pollux])")
    jobs = small_workload(6)
    executor = RecordingExecutor()
    result = simulate(jobs, CLUSTER, "pollux", profiles=profiles, round_seconds=60.0, executor=executor,
                      policy_options=options)
    assert result.metrics["num_jobs"] == len(jobs) and np.all(np.isfinite(result.jobs["finish_s"]))
    assert result.metrics["average_jct_s"] > 0 and executor.plans
    per_node = np.repeat(CLUSTER.gpus_per_node, CLUSTER.capacity // CLUSTER.gpus_per_node)
    node_of = np.repeat(np.arange(per_node.size), per_node)
    if "virtual_node_gpus" in options:  # the policy's nodes: every node split into nodes of 4 GPUs
        node_of = np.arange(int(CLUSTER.capacity.sum())) // options["virtual_node_gpus"]
    for plan in executor.plans:
        ids = [g for lease in plan.leases for g in lease.gpu_ids]
        assert len(ids) == len(set(ids))
        assert {lease.job_id for lease in plan.leases if not lease.extended} == set(plan.restore_delay_s)
        spread = [set(node_of[list(lease.gpu_ids)].tolist()) for lease in plan.leases]
        multi = [nodes for nodes in spread if len(nodes) > 1]
        assert sum(len(nodes) for nodes in multi) == len(set().union(*multi)) if multi else True
        start = {"aws": 0, "rtx": 24, "dgx-ext": 48}
        for lease in plan.leases:
            size = CLUSTER.capacity[CLUSTER.index(lease.gpu_type)]
            assert all(start[lease.gpu_type] <= g < start[lease.gpu_type] + size for g in lease.gpu_ids)


def test_pollux_planner_rejects_unknown_options(profiles):
    with pytest.raises(InvalidOptionError, match="no option"):
        simulate(small_workload(2), CLUSTER, "pollux", profiles=profiles, policy_options={"lambda_n": 1.1})
    assert PolluxPlanner.__doc__
