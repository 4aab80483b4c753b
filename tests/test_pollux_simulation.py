"""End-to-end simulations of Sia workloads with Pollux's policy (``PolluxPlanner``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest

from allocopt import Cluster
from allocopt.errors import InvalidOptionError
from allocopt.mechanism import pollux_rounds
from allocopt.mechanism.fidelity import Fidelity
from allocopt.mechanism.pollux_rounds import PolluxPlanner
from allocopt.mechanism.sia_rounds import SiaExecutor, SiaRoundPlan, sia_workload
from allocopt.mechanism.sia_workloads import (
    SiaWorkloadJob,
    read_sia_workload,
    shipped_workloads_dir,
)
from allocopt.mechanism.simulator import simulate
from allocopt.mechanism.state import SimulationState
from allocopt.runtime.executor import JobRoundResult, RoundPlan
from allocopt.throughput.goodput import fit_perf_params
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


# ----- Sia's heterogeneity-unaware jobs (fidelity field sia_unaware_job_model) -------------------------

def planner_and_state(profiles, jobs, **options) -> tuple[PolluxPlanner, SimulationState]:
    workload = sia_workload(jobs, profiles)
    state = SimulationState(workload, CLUSTER, np.ones((workload.num_jobs, CLUSTER.num_gpu_types)))
    state.active[:] = True  # every job arrived
    return PolluxPlanner(state, profiles, batch_sizes=[j.batch_size for j in jobs], **options), state


def unaware_planner(profiles, jobs, **options) -> PolluxPlanner:
    return planner_and_state(profiles, jobs, **options)[0]


def test_sia_fidelity_turns_on_the_unaware_job_model(profiles):
    jobs = small_workload(2)
    assert Fidelity.preset("sia").sia_unaware_job_model and not Fidelity.preset("allocopt").sia_unaware_job_model
    assert unaware_planner(profiles, jobs, fidelity=Fidelity.preset("sia")).one_model_per_job
    assert unaware_planner(profiles, jobs, faithful_to_sia=True).one_model_per_job
    assert not unaware_planner(profiles, jobs).one_model_per_job
    assert not unaware_planner(profiles, jobs, fidelity=Fidelity.preset("sia"), unaware_job_model=False).one_model_per_job
    assert not unaware_planner(profiles, jobs, fidelity=Fidelity.preset("sia", sia_unaware_job_model=False)
                               ).one_model_per_job


@pytest.mark.parametrize("unaware", [True, False])
def test_unaware_job_model_fits_one_model_across_gpu_types(profiles, unaware):
    """One model per job fitted to the points it measured on every type (a point measured again on
    another type is not recorded again); without the field one model per (job, type)."""
    planner = unaware_planner(profiles, small_workload(1), fidelity=Fidelity.preset("sia"),
                              unaware_job_model=unaware)
    aws, rtx = CLUSTER.index("aws"), CLUSTER.index("rtx")
    planner._measure(0, aws, (1, 1, 64), 0.20, 0.001)
    planner._measure(0, rtx, (1, 2, 64), 0.30, 0.020)
    planner._measure(0, rtx, (1, 1, 64), 0.50, 0.001)
    if unaware:
        assert set(planner._learned) == {(0, None)}
        assert planner._seen[0, None] == {(1, 1, 64): (0.20, 0.001), (1, 2, 64): (0.30, 0.020)}
        expected = fit_perf_params(np.array([1.0, 1.0]), np.array([1.0, 2.0]), np.array([64.0, 64.0]),
                                   np.array([0.20 - 0.001, 0.30 - 0.020]), np.array([0.20, 0.30]), loss="rmse", optimizer="pollux")
        assert planner._learned[0, None] == expected
    else:
        assert set(planner._learned) == {(0, aws), (0, rtx)}
        assert len(planner._seen[0, rtx]) == 2 and planner._seen[0, aws] == {(1, 1, 64): (0.20, 0.001)}


def test_unaware_job_model_plans_with_the_aws_limits(profiles):
    """The policy's model of a job that measured only on rtx: with the field, its one model with the aws
    application's batch-size limits up to the application's largest batch; without it, its rtx model
    capped at the requested batch size (cap_policy_batch)."""
    jobs = [replace(small_workload(1)[0], time_s=0.0)]
    aws, rtx = CLUSTER.index("aws"), CLUSTER.index("rtx")
    app = jobs[0].application
    for unaware in (True, False):
        planner, state = planner_and_state(profiles, jobs, fidelity=Fidelity.preset("sia"),
                                           unaware_job_model=unaware)
        planner.plan(state, 0.0, 0)  # registers the job (its first round: one GPU, nothing measured)
        planner._seen.clear()
        planner._learned.clear()
        planner._measure(0, rtx, (1, 1, 64), 0.20, 0.001)
        job = planner._jobs[0]
        t = planner._reference_type(job)
        model = planner._goodput_model(job, t, [None] * CLUSTER.num_gpu_types, {0: 0})
        assert model is not None
        if unaware:
            assert t == aws and model.max_batch_size == profiles[app, "aws"].max_batch_size
            assert model.max_local_bsz == profiles[app, "aws"].max_local_bsz
        else:
            assert t == rtx and model.max_batch_size == max(jobs[0].batch_size, profiles[app, "rtx"].init_batch_size)
            assert model.max_local_bsz == profiles[app, "rtx"].max_local_bsz


def test_pollux_planner_orders_jobs_by_attained_service(profiles, monkeypatch):
    """Each round's problem lists jobs as Pollux does: least GPU-seconds held first, then by arrival."""
    seen = []

    class Capture(PolluxPlanner):
        def _problem(self, jobs, models, epochs):
            keys = [(self._attained.get(j.job_id, 0.0), j.arrival_s) for j in jobs]
            seen.append(keys)
            return super()._problem(jobs, models, epochs)

    monkeypatch.setattr(pollux_rounds, "PolluxPlanner", Capture)
    simulate(small_workload(4), CLUSTER, "pollux", profiles=profiles, round_seconds=60.0)
    assert len(seen) > 3 and all(keys == sorted(keys) for keys in seen)
    assert any(len({k[0] for k in keys}) > 1 for keys in seen)  # attained service does order some rounds


class _Decided(Exception):
    pass


@pytest.mark.parametrize("run, expected", [({"fidelity": "sia"}, True),
                                           ({"policy_options": {"faithful_to_sia": True}}, True),
                                           ({"fidelity": {"profile": "sia", "sia_unaware_job_model": False}}, False),
                                           ({}, False)])
def test_simulate_passes_the_unaware_job_model_to_pollux(profiles, monkeypatch, run, expected):
    """simulate(..., "pollux") builds its planner with the fidelity's sia_unaware_job_model."""
    seen = []

    class Capture(PolluxPlanner):
        def _decide(self, jobs, models, epochs, now_s, round_index):
            seen.append(self.one_model_per_job)
            raise _Decided

    monkeypatch.setattr(pollux_rounds, "PolluxPlanner", Capture)
    with pytest.raises(_Decided):
        simulate(small_workload(2), CLUSTER, "pollux", profiles=profiles, round_seconds=60.0, **run)
    assert seen == [expected]
