"""End-to-end simulations of Sia workloads with Sia-style rounds (``SiaPlanner``)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from allocopt import Cluster
from allocopt.errors import InvalidOptionError
from allocopt.mechanism.sia_job_steps import (batch_split, epoch_ends, placement_max_local_bsz, sia_epoch_ends,
                                              sia_optimize, step_round)
from allocopt.mechanism.sia_rounds import (SIA_SIMULATOR_RESTORE_S, SIA_SIMULATOR_SLOWDOWNS, SiaExecutor, SiaPlanner,
                                          SiaRoundPlan, restart_delay_s, rigid_throughputs, sia_workload, total_progress)
from allocopt.mechanism.sia_workloads import SiaWorkloadJob, read_sia_workload, shipped_workloads_dir
from allocopt.mechanism.simulator import simulate
from allocopt.mechanism.state import SimulationState
from allocopt.runtime.executor import JobRoundResult, RoundPlan
from allocopt.throughput.goodput import GoodputModel, GradParams, PerfParams
from allocopt.throughput.profiles import load_profiles, shipped_profiles_dir

SATURN = shipped_workloads_dir() / "saturn" / "workload-1.csv"
CLUSTER = Cluster({"aws": 24, "rtx": 24, "dgx-ext": 16}, {"aws": 4, "rtx": 8, "dgx-ext": 8})
SHIPPED_APPS = ("bert", "cifar10", "imagenet")


def small_workload(n: int = 20, compress: float = 10.0) -> list[SiaWorkloadJob]:
    """The first ``n`` saturn jobs of the shipped applications, arrivals ``compress`` times closer."""
    jobs = [j for j in read_sia_workload(SATURN) if j.application in SHIPPED_APPS][:n]
    return [replace(j, time_s=j.time_s / compress) for j in jobs]


class RecordingExecutor(SiaExecutor):
    """A SiaExecutor that keeps every plan it ran."""

    def __init__(self) -> None:
        super().__init__()
        self.plans: list[SiaRoundPlan] = []

    def run_round(self, plan: RoundPlan) -> Sequence[JobRoundResult]:
        assert isinstance(plan, SiaRoundPlan)
        self.plans.append(plan)
        return super().run_round(plan)


@pytest.fixture(scope="module")
def profiles():
    return load_profiles(shipped_profiles_dir())


def test_total_progress_is_sia_epochs_times_initial_batch(profiles):
    cifar = profiles["cifar10", "aws"]
    # 100 epochs of CIFAR-10 (50,000 samples each), counted at the initial batch size
    assert total_progress(cifar) == pytest.approx(100 * 50_000, rel=0.01)
    workload = sia_workload(small_workload(5), profiles)
    assert workload.num_jobs == 5 and np.all(workload.total_steps > 0)


def test_sia_simulation_end_to_end(profiles):
    jobs = small_workload()
    executor = RecordingExecutor()
    result = simulate(jobs, CLUSTER, "sia", profiles=profiles, round_seconds=60.0, executor=executor)
    jct = result.jobs["jct_s"]
    assert result.metrics["num_jobs"] == len(jobs)
    assert np.all(np.isfinite(result.jobs["finish_s"])) and np.all(jct > 0)
    assert np.all(result.jobs["gpu_hours"] > 0) and result.metrics["gpu_hours_per_job"] > 0
    for key in ("average_jct_s", "median_jct_s", "p99_jct_s", "makespan_s", "utilization"):
        assert result.metrics[key] > 0
    assert 0 < result.metrics["utilization"] <= 1
    assert result.metrics["p99_jct_s"] >= result.metrics["median_jct_s"]
    assert executor.plans and result.metrics["num_rounds"] == len(executor.plans)
    capacity = int(CLUSTER.capacity.sum())
    for plan in executor.plans:
        ids = [g for lease in plan.leases for g in lease.gpu_ids]
        assert len(ids) == len(set(ids)) and all(0 <= g < capacity for g in ids)
        # a job pays its checkpoint-restore delay exactly when its GPUs changed
        assert {lease.job_id for lease in plan.leases if not lease.extended} == set(plan.restore_delay_s)
        assert all(0 <= plan.train_s[j] <= plan.round_seconds for j in plan.train_s)
    # every job starts once: restarts count later changes only
    assert np.all(result.jobs["restarts"] >= 0)


def test_sia_replica_exploration_and_node_cap(profiles):
    """Sia's simulator's max_replicas: a job's GPUs at most double from round to round (1 at its
    first start), and no configuration spans more nodes than the cap."""
    executor = RecordingExecutor()
    simulate(small_workload(8), CLUSTER, "sia", profiles=profiles, round_seconds=60.0, executor=executor,
             policy_options={"explore_replicas": True, "max_nodes": {"aws": 2, "rtx": 1, "dgx-ext": 1}})
    most: dict = {}
    for plan in executor.plans:
        for lease in plan.leases:
            assert len(lease.gpu_ids) <= max(2 * most.get(lease.job_id, 0), 1)
            per_node = 4 if lease.gpu_type == "aws" else 8
            start = {"aws": 0, "rtx": 24, "dgx-ext": 48}[lease.gpu_type]
            assert len({(g - start) // per_node for g in lease.gpu_ids}) <= {"aws": 2, "rtx": 1, "dgx-ext": 1}[
                lease.gpu_type]
        for lease in plan.leases:
            most[lease.job_id] = max(most.get(lease.job_id, 0), len(lease.gpu_ids))
    assert max(most.values()) > 1  # jobs did scale up, step by step


def test_gavel_rounds_on_a_sia_workload_keep_requested_gpus(profiles):
    jobs = small_workload()
    result = simulate(jobs, CLUSTER, "max_sum_throughput_perf", profiles=profiles, round_seconds=360.0)
    assert np.all(np.isfinite(result.jobs["finish_s"])) and np.all(result.jobs["jct_s"] > 0)
    assert result.jobs["scale_factor"].tolist() == [j.num_replicas for j in jobs]
    assert result.metrics["gpu_hours_per_job"] > 0


def test_rigid_throughputs_are_positive_where_the_job_fits(profiles):
    jobs = small_workload(10)
    T = rigid_throughputs(sia_workload(jobs, profiles), [j.batch_size for j in jobs], profiles, CLUSTER)
    assert T.shape == (10, 3) and np.all(T >= 0) and np.all(T.max(axis=1) > 0)


def test_sia_policy_runs_rounds_only(profiles):
    with pytest.raises(InvalidOptionError, match="mechanism"):
        simulate(small_workload(3), CLUSTER, "sia", profiles=profiles, mode="ideal")


def test_cli_simulates_a_sia_workload(tmp_path: Path):
    rows = list(csv.reader(SATURN.open(newline="")))
    kept = [r for r in rows[1:] if r[2] in SHIPPED_APPS][:12]
    workload = tmp_path / "workload.csv"
    with workload.open("w", newline="") as f:
        csv.writer(f).writerows([rows[0], *kept])
    out = tmp_path / "out.json"
    done = subprocess.run([sys.executable, "-m", "allocopt", "simulate", "--workload", str(workload),
                           "--profiles", str(shipped_profiles_dir()), "--cluster", "aws=24,rtx=24,dgx-ext=16",
                           "--gpus-per-node", "aws=4,rtx=8,dgx-ext=8", "--policy", "sia", "--round-seconds", "60",
                           "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "average_jct_s" in done.stdout and "p99_jct_s" in done.stdout
    result = json.loads(out.read_text())
    assert result["metrics"]["num_jobs"] == 12
    assert all(j > 0 for j in result["jobs"]["jct_s"]) and result["metrics"]["gpu_hours_per_job"] > 0


def test_faithful_to_sia_charges_sias_restore_times_and_slowdowns(profiles):
    """Sia's simulator charges its own checkpoint-restore times (cifar10: 50 s, while its policy prices
    30 s) and divides each job's true goodput by its application's calibration slowdown (cifar10: 1.8);
    ``faithful_to_sia`` turns on both, Sia's node cap, replica exploration and its MILP's rounding."""
    jobs = small_workload(4)
    plain, faithful = RecordingExecutor(), RecordingExecutor()
    base = simulate(jobs, CLUSTER, "sia", profiles=profiles, round_seconds=60.0, executor=plain,
                    policy_options={"explore_replicas": True, "round_grid": True})  # same round starts
    sia = simulate(jobs, CLUSTER, "sia", profiles=profiles, round_seconds=60.0, executor=faithful,
                   policy_options={"faithful_to_sia": True})
    first = faithful.plans[0]
    cifar = [lease.job_id for lease in first.leases if jobs[lease.job_id].application == "cifar10"]
    assert cifar and all(first.restore_delay_s[j] == SIA_SIMULATOR_RESTORE_S["cifar10"] == 50.0 for j in cifar)
    assert all(plain.plans[0].restore_delay_s[j] == restart_delay_s("cifar10") == 30.0 for j in cifar)
    # the first round is the same decision (one GPU each, no model difference yet): rates differ by 1.8
    for j in cifar:
        assert first.samples_per_s[j] * SIA_SIMULATOR_SLOWDOWNS["cifar10"] == pytest.approx(
            plain.plans[0].samples_per_s[j], rel=1e-9)
    # Sia's MILP rounds utilities to 2 decimals: every round's objective is on that grid (up to the tie-break)
    for plan in faithful.plans:
        assert abs(plan.allocation.objective * 100 - round(plan.allocation.objective * 100)) < 0.1
    assert sia.metrics["average_jct_s"] > base.metrics["average_jct_s"]
    # explicit values win over the preset; bad ones are named
    custom = RecordingExecutor()
    simulate(jobs[:1], CLUSTER, "sia", profiles=profiles, round_seconds=60.0, executor=custom,
             policy_options={"faithful_to_sia": True, "restore_s": {"cifar10": 10.0}, "slowdowns": {},
                             "sia_stepping": False})  # one rate per round, comparable to plain's
    lease = custom.plans[0].leases[0]
    assert custom.plans[0].restore_delay_s[lease.job_id] == 10.0
    assert custom.plans[0].samples_per_s[lease.job_id] == pytest.approx(plain.plans[0].samples_per_s[lease.job_id])
    with pytest.raises(InvalidOptionError, match=r"slowdowns\['cifar10'\] is 0.0"):
        simulate(jobs[:1], CLUSTER, "sia", profiles=profiles, policy_options={"slowdowns": {"cifar10": 0}})
    with pytest.raises(InvalidOptionError, match="restore_s must map application names to numbers"):
        simulate(jobs[:1], CLUSTER, "sia", profiles=profiles, policy_options={"restore_s": {"cifar10": "x"}})


def test_learned_throughputs_start_jobs_on_one_gpu_and_learn_from_their_runs(profiles):
    """Sia's simulator: a job has no throughput model before it runs, so its first round offers one GPU
    of any type, all alike (Sia's solve takes the last type, as measured on saturn workload-1); its first
    run uses the initial batch size; later rounds plan with a model fitted to what it measured."""
    jobs = small_workload(4)
    executor = RecordingExecutor()
    simulate(jobs, CLUSTER, "sia", profiles=profiles, round_seconds=60.0, executor=executor,
             policy_options={"faithful_to_sia": True})
    first = executor.plans[0]
    assert first.leases and all(len(lease.gpu_ids) == 1 and lease.gpu_type == "dgx-ext" for lease in first.leases)
    # the first run's rate is the initial batch size's: one GPU, M0 = 128 samples for cifar10, on the true times
    lease = next(lease for lease in first.leases if jobs[lease.job_id].application == "cifar10")
    cifar = profiles["cifar10", "dgx-ext"]
    step, _ = cifar.true_times((1,), cifar.init_batch_size)
    efficiency = cifar.goodput_model(epoch=0).efficiency(cifar.init_batch_size)
    assert first.samples_per_s[lease.job_id] == pytest.approx(
        cifar.init_batch_size / float(step) * float(efficiency) / SIA_SIMULATOR_SLOWDOWNS["cifar10"], rel=1e-6)
    # later rounds offer more than one GPU once a model exists (and at most twice what a job held)
    assert any(len(lease.gpu_ids) == 2 for plan in executor.plans[1:3] for lease in plan.leases)
    # with the whole-profile model instead, the first round already gives jobs several GPUs
    whole = RecordingExecutor()
    simulate(jobs, CLUSTER, "sia", profiles=profiles, round_seconds=60.0, executor=whole,
             policy_options={"faithful_to_sia": True, "learn_throughputs": False, "explore_replicas": False})
    assert whole.plans[0].leases[0].gpu_ids and max(len(lease.gpu_ids) for lease in whole.plans[0].leases) > 1


def test_round_grid_starts_every_round_on_a_multiple_of_the_round(profiles):
    """Sia's simulator schedules at 0, 60, 120, ... s: a job arriving at an idle cluster waits for the next
    multiple (faithful_to_sia turns the grid on); without it a round starts at such an arrival."""
    jobs = [replace(j, time_s=t) for j, t in zip(small_workload(3), (7.0, 5000.0, 9000.0))]  # idle in between
    grid = simulate(jobs, CLUSTER, "sia", profiles=profiles, round_seconds=60.0, ftf=False,
                    policy_options={"round_grid": True})
    free = simulate(jobs, CLUSTER, "sia", profiles=profiles, round_seconds=60.0, ftf=False)
    starts = grid.rounds["start_s"]
    np.testing.assert_allclose(starts % 60.0, 0.0, atol=1e-6)
    assert starts[0] == 60.0 and free.rounds["start_s"][0] == 7.0
    assert np.any(free.rounds["start_s"] % 60.0 > 1e-6)
    state = SimulationState(sia_workload(jobs, profiles), CLUSTER, np.ones((3, CLUSTER.num_gpu_types)))
    with_faithful = SiaPlanner(state, profiles, faithful_to_sia=True)
    assert with_faithful.round_grid_s == 60.0


def test_sia_stepping_rechooses_the_batch_at_every_epoch_boundary(profiles):
    """Sia's job steps through a round epoch by epoch: after each stretch it measures the step time
    (its model learns it) and re-chooses its batch split; a stretch that ends an epoch takes whole
    seconds, and the job completes at the (whole-second) end of its last epoch."""
    cifar = profiles["cifar10", "dgx-ext"]
    ends = sia_epoch_ends(cifar)  # step_round counts progress in Sia's units: samples / M0
    assert ends.size == 100 and ends[-1] * cifar.init_batch_size == pytest.approx(total_progress(cifar))
    np.testing.assert_array_equal(epoch_ends(cifar), ends * cifar.init_batch_size)
    splits, measured = [], []

    def split() -> tuple[int, int]:  # grow the micro-batch each stretch, as a learning job does
        splits.append((64 * (len(splits) + 1), 0))
        return splits[-1]

    def measure(key, step, sync, grad) -> None:
        measured.append((key, step, sync, grad))

    steps = step_round(cifar, (8,), 0.0, 0, 60.0, split, measure, slowdown=1.8)
    crossed = steps.epoch
    assert crossed >= 2 and steps.done_s is None
    assert len(splits) == crossed + 2 and len(measured) == crossed + 1  # one split after the last stretch
    assert [m[0] for m in measured] == [(1, 8, micro) for micro, _ in splits[:-1]]
    # the gradient statistics of each stretch are those of its epoch at its batch size
    assert measured[1][3] == cifar.grad_params(8 * splits[1][0], 1)
    assert ends[crossed - 1] <= steps.progress < ends[crossed] and steps.batch_size == 8 * splits[-2][0]
    # the last epoch: completion after a whole number of seconds
    splits.clear()
    last = step_round(cifar, (8,), float(ends[-2]) + 0.01, 99, 60.0, lambda: (256, 0), measure, slowdown=1.8)
    assert last.epoch == 100 and last.done_s is not None and last.done_s == round(last.done_s) < 60
    assert last.progress == ends[-1]
    # memory limits of Sia's update_local_bsz: the placement's largest profiled micro-batch, then the
    # largest at that many GPUs and max_batch_size / (GPUs x steps)
    assert placement_max_local_bsz(cifar, (8,)) < cifar.max_local_bsz
    micro, accum = batch_split(cifar, (8,), None, None)  # no model yet: the initial batch size
    assert 8 * micro * (accum + 1) >= cifar.init_batch_size and micro <= placement_max_local_bsz(cifar, (8,))


def test_faithful_to_sia_reproduces_sias_simulator_on_a_two_job_workload(profiles):
    """Sia's simulator (siasosp23/artifacts aaf7a0d, run_experiment.sh's settings) on saturn's 64 GPUs with
    bert-0 (6 GPUs, batch 384) at 70 s and deepspeech2-1 (8 GPUs, batch 320) at 75 s: JCTs 900 s and
    1,936 s. allocopt's simulator with ``faithful_to_sia`` steps the jobs as Sia does and finishes bert at
    the same second; without Sia's job stepping, placement and policy batch cap it was 1.2% and 2.6% off."""
    jobs = [SiaWorkloadJob("bert-0", 70.0, "bert", 6, 384, 2),
            SiaWorkloadJob("deepspeech2-1", 75.0, "deepspeech2", 8, 320, 3)]
    cluster = Cluster({"aws": 24, "dgx-ext": 16, "rtx": 24}, {"aws": 4, "dgx-ext": 8, "rtx": 8})
    result = simulate(jobs, cluster, "sia", profiles=profiles, round_seconds=60.0, ftf=False,
                      policy_options={"faithful_to_sia": True})
    assert result.jobs["jct_s"][0] == pytest.approx(900.0, abs=0.5)
    assert result.jobs["jct_s"][1] == pytest.approx(1936.0, rel=0.01)
    older = simulate(jobs, cluster, "sia", profiles=profiles, round_seconds=60.0, ftf=False,
                     policy_options={"faithful_to_sia": True, "sia_stepping": False, "packed_placement": False,
                                     "cap_policy_batch": False})
    assert abs(older.jobs["jct_s"][1] / 1936.0 - 1) > 0.01


#: Pollux's GoodputFunction.optimize in Sia's simulator (siasosp23/artifacts aaf7a0d; numpy 1.23.5) for a CIFAR-10
#: job's fit on A100s (M0 128, max batch 4096): the policy's float32 configurations (micro-batch 32..512) and the
#: job's own integer calls (32..256): goodput, micro-batch, accumulation steps.
SIA_POLICY_SEARCH = ([1, 1, 1, 1, 2, 2, 3], [1, 2, 4, 8, 12, 16, 24],
                     [3314.0750190628, 3482.0694121156034, 4265.057529342855, 4984.061411398332, 5157.6511799950695,
                      5384.912730480259, 5673.896518584912], [128, 106, 75, 57, 48, 42, 34])
SIA_JOB_SEARCH = [(1, 1, 3314.0750190628, 128, 0), (1, 2, 3482.0694121156034, 106, 0), (2, 8, 4805.997512030229, 57, 0)]


def test_sia_optimize_is_sias_goodput_search():
    perf = PerfParams(0.019106398486473213, 0.00015247458204808978, 0.0207919563963084, 1.1e-08,
                      0.018901778542098544, 1e-08, 1.4273736765111165)
    grad = GradParams(1.8952278056392731, 1.5924912096114732)
    nodes, replicas, goodput, micro = SIA_POLICY_SEARCH
    g, m, s = sia_optimize(GoodputModel(perf, grad, 128, 4096, 512, min_local_bsz=32), nodes, replicas, float32=True)
    np.testing.assert_allclose(g, goodput, rtol=1e-12)
    assert m.tolist() == micro and s.tolist() == [0] * len(micro)
    model = GoodputModel(perf, grad, 128, 4096, 256, min_local_bsz=32)
    for n, r, goodput, micro, accum in SIA_JOB_SEARCH:
        g, m, s = sia_optimize(model, n, r)
        assert (m.tolist(), s.tolist()) == ([micro], [accum])
        np.testing.assert_allclose(g, [goodput], rtol=1e-12)
    # allocopt's own search keeps the batch within max_batch_size and lands within 1% of Sia's
    np.testing.assert_allclose(model.optimize(2, 8)[0], SIA_JOB_SEARCH[2][2], rtol=1e-2)
