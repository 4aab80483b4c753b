"""The published (Gavel) mechanism, reproduced on small traces by hand, packed rounds and finish-time fairness."""

from __future__ import annotations

import math

import numpy as np
import pytest

from allocopt import Cluster
from allocopt.mechanism import simulate
from allocopt.mechanism.fidelity import FIDELITY_PROFILES
from allocopt.mechanism.priority import MechanismOptions
from allocopt.mechanism.simulator import PriorityPlanner, SimulationState
from allocopt.mechanism.workload import Workload, read_gavel_trace, shipped_trace
from allocopt.runtime.simulated import SimulatedExecutor
from allocopt.throughput import ThroughputTable

TABLE = ThroughputTable.gavel()
MODEL = "ResNet-18 (batch size 128)"


def _two_job_trace(second_arrival_s: float) -> Workload:
    """Job 0 at t=10 with 10 rounds of work, job 1 (two rounds of work) at ``second_arrival_s``."""
    per_round = math.floor(TABLE.throughput(MODEL, 1, "v100") * 360)
    return Workload((MODEL, MODEL), np.array([1, 1]), np.array([10 * per_round, 2 * per_round]),
                    np.array([10.0, second_arrival_s]), np.ones(2), "hand-made")


@pytest.mark.parametrize("run_unallocated", [False, True])
def test_newcomer_waits_for_the_recompute_throttle(run_unallocated):
    # Two V100s. Job 0 arrives at t=10: the first recompute (at 10, after time 0, so it starts the 1,920 s
    # throttle) gives it X = 1. Every round lasts d = floor(T * 360) / T (each job runs floor(T * 360) steps).
    # Job 1 arrives at t=20, inside the first round: no allocation until the first round start at or after
    # 10 + 1920 s; Gavel walks it at priority 0 and holds the second GPU idle meanwhile (run_unallocated=False);
    # with run_unallocated=True it runs from the next round start, 10 + d.
    tput = TABLE.throughput(MODEL, 1, "v100")
    d = math.floor(tput * 360) / tput
    wl = _two_job_trace(20.0)
    result = simulate(wl, {"v100": 2}, "max_min_fairness_perf", run_unallocated=run_unallocated, ftf=False)
    starts = 10.0 + d * np.arange(40)
    job1_start = starts[1] if run_unallocated else starts[np.argmax(starts >= 10.0 + 1920.0)]
    np.testing.assert_allclose(result.jobs["finish_s"], [10.0 + 10 * d, job1_start + 2 * d])
    np.testing.assert_allclose(result.jobs["jct_s"], [10 * d, job1_start + 2 * d - 20.0])
    # at 10, and at the first round start after the throttle (job 1 arrived, or already left, meanwhile); job 1's
    # departure needs another 1,920 s, after job 0 is done
    assert result.metrics["num_solves"] == 2
    assert result.metrics["makespan_s"] == pytest.approx(10.0 + 10 * d)


def test_recomputes_at_time_zero_do_not_start_the_throttle():
    # Same jobs, job 0 at t=0: the recompute at 0 does not start the throttle (Gavel tests last_reset_time == 0),
    # so job 1 (t=20) gets its allocation at the next round start, d, and runs from there.
    tput = TABLE.throughput(MODEL, 1, "v100")
    d = math.floor(tput * 360) / tput
    per_round = math.floor(tput * 360)
    wl = Workload((MODEL, MODEL), np.array([1, 1]), np.array([10 * per_round, 2 * per_round]),
                  np.array([0.0, 20.0]), np.ones(2), "hand-made")
    result = simulate(wl, {"v100": 2}, "max_min_fairness_perf", ftf=False)
    np.testing.assert_allclose(result.jobs["finish_s"], [10 * d, 3 * d])


def test_one_gpu_alternates_by_priority_and_finishes_early():
    # One V100, two identical jobs at t=0, X = 0.5 each. Counters start at 180 s: round 1 is a tie
    # (job 0 first), then the job with less received time wins: 0, 1, 0, 1, ... Job 1 needs 1.5 rounds of
    # work: it finishes half-way through its second round, which ends early; job 0 (3 rounds) then gets
    # X = 1 (the recompute after the departure is allowed: the only one before was at time 0) and runs on.
    tput = TABLE.throughput(MODEL, 1, "v100")
    per_round = math.floor(tput * 360)
    d = per_round / tput
    wl = Workload((MODEL, MODEL), np.array([1, 1]), np.array([3 * per_round, per_round + per_round // 2]),
                  np.array([0.0, 0.0]), np.ones(2), "hand-made")
    result = simulate(wl, {"v100": 1}, "max_min_fairness_perf", ftf=False)
    half = (per_round // 2) / tput
    job1 = 3 * d + half  # rounds: job 0, job 1, job 0, job 1 (half a round)
    np.testing.assert_allclose(result.jobs["finish_s"], [job1 + d, job1])
    np.testing.assert_allclose(result.rounds["end_s"] - result.rounds["start_s"], [d, d, d, half, d])


def test_fifo_is_not_work_conserving():
    # Gavel's FIFO walks only allocated entries: a job that arrived after the last recompute never fills an
    # idle GPU, with or without run_unallocated.
    wl = _two_job_trace(20.0)
    tput = TABLE.throughput(MODEL, 1, "v100")
    d = math.floor(tput * 360) / tput
    for run_unallocated in (False, True):
        result = simulate(wl, {"v100": 2}, "fifo_perf", run_unallocated=run_unallocated, ftf=False)
        starts = 10.0 + d * np.arange(40)
        assert result.jobs["finish_s"][1] == pytest.approx(starts[np.argmax(starts >= 1930.0)] + 2 * d)


class _RecordingExecutor(SimulatedExecutor):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rounds = []

    def run_round(self, plan):
        results = super().run_round(plan)
        self.rounds.append((plan, results))
        return results


def test_packed_rounds_share_gpus_between_pairs_only():
    wl = read_gavel_trace(shipped_trace("artifact_evaluation"), TABLE)
    cluster = {"v100": 2, "p100": 2, "k80": 2}
    from allocopt.cluster import Cluster

    c = Cluster(cluster)
    T = wl.throughputs(TABLE, c.gpu_types)
    planner = PriorityPlanner(SimulationState(wl, c, T, TABLE), "max_min_fairness", {"space_sharing": True},
                              MechanismOptions())
    executor = _RecordingExecutor(lambda job, gpu_type, _n: float(T[job, c.index(gpu_type)]),
                                  pair_throughputs=planner.pair_throughput)
    result = simulate(wl, c, "max_min_fairness_packed", planner=planner, executor=executor, ftf=False)
    assert np.isfinite(result.jobs["finish_s"]).all()
    shared_rounds = 0
    for plan, results in executor.rounds:
        jobs = [lease.job_id for lease in plan.leases]
        assert len(jobs) == len(set(jobs))  # a job runs at most once (one type) per round
        holders: dict[int, list] = {}
        for lease in plan.leases:
            assert len(lease.gpu_ids) == wl.scale_factors[lease.job_id]
            assert all(c.gpu_types[c.capacity.cumsum().searchsorted(g, side="right")] == lease.gpu_type
                       for g in lease.gpu_ids)
            for g in lease.gpu_ids:
                holders.setdefault(g, []).append(lease)
        for leases in holders.values():
            assert len(leases) <= 2  # no GPU oversubscribed
            if len(leases) == 2:  # shared only by the two members of a pair, on the same GPUs
                a, b = leases
                assert a.co_located_with == b.job_id and b.co_located_with == a.job_id
                assert a.gpu_ids == b.gpu_ids and a.gpu_type == b.gpu_type
            else:
                assert leases[0].co_located_with is None
        by_job = {lease.job_id: lease for lease in plan.leases}
        for r in results:  # co-located members progress at their measured pair throughput
            lease = by_job[r.job_id]
            if lease.co_located_with is not None:
                shared_rounds += 1
                expected = TABLE.pair_throughput(wl.models[r.job_id], wl.models[lease.co_located_with],
                                                 int(wl.scale_factors[r.job_id]), lease.gpu_type)[0]
                assert r.measured_steps_per_s == pytest.approx(expected)
                assert r.steps == min(math.floor(expected * 360), r.steps) and r.steps > 0
        assert sum(len(set(lease.gpu_ids)) for lease in {lease.gpu_ids: lease for lease in plan.leases}.values()) \
            <= sum(cluster.values())
    assert shared_rounds > 0  # pairs did run
    assert result.metrics["utilization"] <= 1.0 + 1e-9  # shared GPUs counted once


def test_space_sharing_option_on_allocopt_policy():
    wl = read_gavel_trace(shipped_trace("artifact_evaluation"), TABLE)
    packed = simulate(wl, {"v100": 2, "p100": 2, "k80": 2}, "max_min_fairness",
                      policy_options={"space_sharing": True}, ftf=False)
    assert packed.config["policy_options"] == {"space_sharing": True}
    assert np.isfinite(packed.jobs["finish_s"]).all()


def test_finish_time_fairness():
    wl = read_gavel_trace(shipped_trace("artifact_evaluation"), TABLE)
    cluster = {"v100": 2, "p100": 2, "k80": 2}
    result = simulate(wl, cluster, "max_min_fairness_perf")
    isolated = simulate(wl, cluster, "isolated", mode="ideal", ftf=False)
    np.testing.assert_allclose(result.jobs["isolated_jct_s"], isolated.jobs["jct_s"])
    np.testing.assert_allclose(result.jobs["ftf"], result.jobs["jct_s"] / isolated.jobs["jct_s"])
    rho = result.jobs["ftf"]
    assert result.metrics["average_ftf"] == pytest.approx(rho.mean())
    assert result.metrics["max_ftf"] == pytest.approx(rho.max())
    assert result.metrics["unfair_fraction"] == pytest.approx((rho > 1).mean())
    # the isolated share measured against itself is perfectly fair
    itself = simulate(wl, cluster, "isolated", mode="ideal")
    np.testing.assert_allclose(itself.jobs["ftf"], 1.0)
    assert "ftf" not in simulate(wl, cluster, "max_min_fairness_perf", ftf=False).jobs


def test_finish_time_fairness_accumulates_isolated_time_like_gavel():
    """Gavel's finish-time fairness (Themis'): at each allocation a job's isolated time grows by the
    steps it made since the previous allocation over its isolated steps/s at that allocation."""
    wl = Workload((MODEL, MODEL, MODEL), np.array([1, 1, 1]), np.array([10_000, 10_000, 10_000]),
                  np.array([0.0, 0.0, 5.0]), np.ones(3), "hand-made")
    T = TABLE.throughput(MODEL, 1, "v100")
    state = SimulationState(wl, Cluster({"v100": 2}), np.full((3, 1), T))
    state.active[:2] = True
    first = state.problem(np.array([0, 1]), 0.0, "finish_time_fairness")
    np.testing.assert_allclose(first.time_isolated, [0.0, 0.0])
    state.remaining_steps[0] -= 100  # isolated rate at the first call: a whole V100 each (2 GPUs, 2 jobs)
    state.active[2] = True
    second = state.problem(np.array([0, 1, 2]), 400.0, "finish_time_fairness")
    np.testing.assert_allclose(second.time_isolated, [100 / T, 0.0, 0.0])
    np.testing.assert_allclose(second.time_since_start, [400.0, 400.0, 395.0])
    state.remaining_steps[[0, 2]] -= 60  # isolated rate at the second call: 2/3 of a V100 each
    third = state.problem(np.array([0, 1, 2]), 800.0, "finish_time_fairness")
    np.testing.assert_allclose(third.time_isolated, [100 / T + 90 / T, 0.0, 90 / T])
    # heterogeneity-agnostic: isolated rates at the reference type's speed on every type
    agnostic = SimulationState(wl, Cluster({"v100": 1, "k80": 1}), np.array([[T, T / 4]] * 3))
    agnostic.active[:2] = True
    options = {"heterogeneity_aware": False, "reference_gpu_type": "v100"}
    agnostic.problem(np.array([0, 1]), 0.0, "finish_time_fairness", options=options)
    agnostic.remaining_steps[0] -= 100
    later = agnostic.problem(np.array([0, 1]), 400.0, "finish_time_fairness", options=options)
    np.testing.assert_allclose(later.time_isolated, [100 / T, 0.0])


# Average JCT (s) of Gavel's own simulator (github.com/stanford-futuredata/gavel at c4fa400,
# simulate_scheduler_with_trace.py, seed 0, 360 s rounds, ECOS) on the shipped artifact trace, 2:2:2 GPUs
GAVEL_ARTIFACT_2_2_2 = {"max_min_fairness_perf": 3429.279, "fifo_perf": 5350.663, "isolated": 4286.651,
                        "finish_time_fairness_perf": 3610.793, "min_total_duration_perf": 3789.920,
                        "max_sum_throughput_perf": 2985.915, "gandiva": 3545.552}


@pytest.mark.parametrize("policy", sorted(GAVEL_ARTIFACT_2_2_2))
def test_within_five_percent_of_gavels_simulator(policy):
    """allocopt's simulator against Gavel's on the same trace, cluster and policy (docs/how-to/reproduce-gavel.md:
    the first three identical, finish-time fairness with Gavel's cumulative isolated time, Gandiva packing)."""
    wl = read_gavel_trace(shipped_trace("artifact_evaluation"), TABLE)
    result = simulate(wl, {"v100": 2, "p100": 2, "k80": 2}, "gavel:" + policy, seed=0, ftf=False)
    assert result.metrics["average_jct_s"] == pytest.approx(GAVEL_ARTIFACT_2_2_2[policy], rel=0.05)


# (average JCT s, makespan s) of Gavel's own simulator (c4fa400, simulate_scheduler_with_trace.py, seed 0,
# 360 s rounds, one GPU per server, ECOS) with Gavel's stateful policies, on the shipped traces
GAVEL_STATEFUL = {("small_test", "2:2:2", "fifo"): (438.268, 818.677),
                  ("small_test", "2:2:2", "gandiva"): (368.401, 810.411),
                  ("artifact_evaluation", "2:0:4", "fifo"): (7581.699, 11803.002),
                  ("artifact_evaluation", "2:0:4", "gandiva"): (4996.461, 7215.876)}


def _cluster(spec: str) -> dict[str, int]:
    return dict(zip(("v100", "p100", "k80"), map(int, spec.split(":"))))


@pytest.mark.parametrize("trace, spec, policy", sorted(GAVEL_STATEFUL))
def test_stateful_gavel_policies_reproduce_gavels_simulator(trace, spec, policy):
    """With the "gavel" fidelity, ``gavel:fifo`` (jobs keep their type until they complete, Gavel's type
    choice) and ``gavel:gandiva``
    (pairs kept while they gain, drawn by the seeded generator) run the adapter's policy object for the
    whole simulation: Gavel's simulator's JCTs to the millisecond."""
    result = simulate(shipped_trace(trace), _cluster(spec), "gavel:" + policy, seed=0, ftf=False, fidelity="gavel")
    jct, makespan = GAVEL_STATEFUL[(trace, spec, policy)]
    assert result.metrics["average_jct_s"] == pytest.approx(jct, abs=1e-3)
    assert result.metrics["makespan_s"] == pytest.approx(makespan, abs=1e-3)


def test_gavel_names_run_the_adapters_stateful_policy_object():
    from allocopt.adapters.gavel import GavelPolicy
    from allocopt.errors import InvalidOptionError
    from allocopt.mechanism.simulator import gavel_policy_for

    fifo = gavel_policy_for("gavel:fifo", {}, "highs", 3, FIDELITY_PROFILES["gavel"])
    assert isinstance(fifo, GavelPolicy) and fifo.name == "FIFO" and fifo._faithful_type_choice
    assert gavel_policy_for("gavel:fifo", {}, "highs", 3)._faithful_type_choice is False  # allocopt's fidelity
    assert gavel_policy_for("gavel:fifo", {"faithful_type_choice": False}, "highs", 3,
                            FIDELITY_PROFILES["gavel"])._faithful_type_choice is False
    assert gavel_policy_for("gavel:gandiva", {"space_sharing": True}, "highs", 0).name == "Gandiva_Packing"
    assert gavel_policy_for("fifo", {}, "highs", 0) is None  # allocopt's own (stateless) FIFO
    assert gavel_policy_for("gavel:max_min_fairness", {}, "highs", 0) is None  # stateless: allocopt.solve
    with pytest.raises(InvalidOptionError, match="faithful_type_choice"):
        gavel_policy_for("gavel:fifo", {"packing_threshold": 2.0}, "highs", 0)
    # allocopt's fifo (a type drawn among those with room, no over-commit) is not Gavel's here
    ours = simulate(shipped_trace("small_test"), _cluster("2:2:2"), "fifo", seed=0, ftf=False)
    assert ours.metrics["average_jct_s"] != pytest.approx(438.268, abs=1.0)


def test_co_located_jobs_finish_with_their_pair_under_gavels_accounting():
    """Gavel's simulator records a co-located job finished when its pair's lease ends; allocopt's
    own accounting when its steps are done. Same trajectory either way (small_test, Gavel's Gandiva:
    jobs 1 and 8 share a GPU, Gavel reports both finished at 82.818 s)."""
    from allocopt.mechanism.simulator import gavel_policy_for

    wl = read_gavel_trace(shipped_trace("small_test"), TABLE)
    cluster = Cluster(_cluster("2:2:2"))
    finish = {}
    for at_lease_end in (True, False):
        T = wl.throughputs(TABLE, cluster.gpu_types)
        state = SimulationState(wl, cluster, T, TABLE)
        options = MechanismOptions(seed=0, pair_finishes_at_lease_end=at_lease_end)
        planner = PriorityPlanner(state, "gandiva", {"space_sharing": True}, options,
                                  gavel_policy=gavel_policy_for("gavel:gandiva", {}, "highs", 0))
        finish[at_lease_end] = simulate(wl, cluster, "gavel:gandiva", planner=planner, ftf=False,
                                        executor=SimulatedExecutor(T, gpu_types=cluster.gpu_types,
                                                                   pair_throughputs=planner.pair_throughput)
                                        ).jobs["finish_s"]
    assert finish[True][[1, 8]] == pytest.approx([82.818, 82.818], abs=1e-3)
    assert finish[False][1] < finish[False][8] == pytest.approx(82.818, abs=1e-3)
    assert (finish[True] >= finish[False] - 1e-9).all() and (finish[True] > finish[False]).sum() >= 2
    assert finish[True].max() == pytest.approx(finish[False].max())  # the trajectory is the same


# Gavel's finish-time fairness, max-min fairness, max-sum throughput (ECOS), (average JCT s, makespan s)
GAVEL_ECOS = {("small_test", "2:2:2", "finish_time_fairness"): (629.115, 1277.43),
              ("artifact_evaluation", "2:0:4", "finish_time_fairness"): (5545.973, 8479.721),
              ("artifact_evaluation", "2:2:2", "finish_time_fairness"): (4211.201, 5878.173),
              ("artifact_evaluation", "2:0:4", "max_min_fairness"): (6031.711, 10640.667),
              ("artifact_evaluation", "2:2:2", "max_min_fairness"): (4214.9, 5592.388),
              ("small_test", "2:2:2", "max_min_fairness_perf"): (276.897, 769.659),
              ("artifact_evaluation", "2:0:4", "max_sum_throughput_perf"): (4581.217, 8316.816)}
AS_GAVEL_WRITES_IT = {"finish_time_fairness": {"method": "conic_gavel"}, "max_min_fairness": {"gavel_program": True},
                      "max_min_fairness_perf": {"gavel_program": True},
                      "max_sum_throughput_perf": {"gavel_program": True}}


@pytest.mark.parametrize("trace, spec, policy", sorted(GAVEL_ECOS))
def test_programs_as_gavel_writes_them_reproduce_gavel_with_ecos(trace, spec, policy):
    """Several jobs get equal shares here and Gavel's mechanism orders them by ECOS's digits beyond 1e-8
    (the equally optimal ``method="conic"`` gives 0.81-1.06 of Gavel's finish-time fairness JCT): Gavel's
    program as Gavel writes it (``method="conic_gavel"``, ``gavel_program=True``) gives ECOS Gavel's
    matrices, and the received time credited as timestamp differences gives the mechanism Gavel's
    priorities, so the run is Gavel's."""
    cvxpy = pytest.importorskip("cvxpy")
    if "ECOS" not in cvxpy.installed_solvers():
        pytest.skip("cvxpy has no ECOS (pip install ecos)")
    result = simulate(shipped_trace(trace), _cluster(spec), "gavel:" + policy, seed=0, ftf=False, backend="cvxpy",
                      policy_options={**AS_GAVEL_WRITES_IT[policy], "solver_options": {"solver": "ECOS"}})
    jct, makespan = GAVEL_ECOS[(trace, spec, policy)]
    assert result.metrics["average_jct_s"] == pytest.approx(jct, abs=1e-3)
    assert result.metrics["makespan_s"] == pytest.approx(makespan, abs=1e-3)


def test_faithful_agnostic_plans_types_a_job_cannot_run_on_as_gavel():
    """Gavel's agnostic policies plan every type at the job's V100 speed, also one where it cannot run
    (ResNet-50, batch 128, on 2 K80s: 0 steps/s); ``faithful_agnostic=True`` gives the policy those
    throughputs (the adapter's rule, :func:`gavel_agnostic_throughputs`) while jobs run at their own."""
    from allocopt.adapters.gavel import gavel_agnostic_throughputs
    from allocopt.errors import InvalidOptionError
    from allocopt.mechanism.simulator import resolve_policy

    models = ("ResNet-50 (batch size 128)",) * 2 + (MODEL,) * 2
    wl = Workload(models, np.full(4, 2), np.array([30_000, 20_000, 40_000, 30_000]), np.array([0.0, 0.0, 0.0, 900.0]),
                  np.ones(4), "hand-made")
    cluster = Cluster({"v100": 2, "k80": 2})
    T = wl.throughputs(TABLE, cluster.gpu_types)
    assert T[0, 1] == T[1, 1] == 0.0 and T[2, 1] > 0
    planned = gavel_agnostic_throughputs(T, list(cluster.gpu_types))
    np.testing.assert_array_equal(planned, np.where(T > 0, T, T[:, [0]]))
    np.testing.assert_array_equal(gavel_agnostic_throughputs(np.array([[0.0, 0.0, 2.0]]), ["v100", "p100", "k80"]),
                                  [[1.0, 1.0, 2.0]])  # no V100 speed either: 1 step/s, as Gavel's adapter
    for policy in ("gavel:max_min_fairness", "gavel:finish_time_fairness"):
        ours = simulate(wl, cluster, policy, ftf=False, fidelity="allocopt")
        faithful = simulate(wl, cluster, policy, ftf=False, policy_options={"faithful_agnostic": True},
                            fidelity="allocopt")
        assert not np.array_equal(faithful.jobs["finish_s"], ours.jobs["finish_s"])
        assert faithful.config["faithful_agnostic"] is True and "faithful_agnostic" not in ours.config
        # the fidelity field agnostic_on_every_type is the same switch; the "gavel" fidelity (the default
        # under Gavel's names) has it on
        on = simulate(wl, cluster, policy, ftf=False, fidelity={"profile": "allocopt", "agnostic_on_every_type": True})
        np.testing.assert_array_equal(on.jobs["finish_s"], faithful.jobs["finish_s"])
        gavel_off = {"profile": "gavel", "agnostic_on_every_type": False}
        off = simulate(wl, cluster, policy, ftf=False, fidelity=gavel_off)
        assert "faithful_agnostic" not in off.config and off.config["fidelity"]["profile"] == "gavel"
        gavel = simulate(wl, cluster, policy, ftf=False, fidelity=gavel_off, policy_options={"faithful_agnostic": True})
        assert not np.array_equal(gavel.jobs["finish_s"], off.jobs["finish_s"])
        assert "faithful_agnostic" not in simulate(wl, cluster, policy, ftf=False).config  # the default: allocopt's
        for fidelity in ("gavel",):
            np.testing.assert_array_equal(simulate(wl, cluster, policy, ftf=False, fidelity=fidelity).jobs["finish_s"],
                                          gavel.jobs["finish_s"])
        # the policy's problems carry the planned throughputs; the mechanism and the executor T
        name, options, _ = resolve_policy(policy)
        state = SimulationState(wl, cluster, T, TABLE, planned_throughputs=planned)
        problem = state.problem(np.arange(3), 0.0, name, options=options)
        np.testing.assert_array_equal(problem.throughputs, planned[:3])
        assert problem.runnable[:2, 1].all() and state.throughputs[0, 1] == 0.0
        planner = PriorityPlanner(state, name, options, MechanismOptions(type_order="random"))
        np.testing.assert_array_equal(planner.mechanism.throughputs, T)
        with pytest.raises(InvalidOptionError, match="mode='mechanism' only"):
            simulate(wl, cluster, policy, mode="ideal", ftf=False, policy_options={"faithful_agnostic": True})
    for policy in ("gavel:max_min_fairness_perf", "max_min_fairness", "gavel:fifo"):
        with pytest.raises(InvalidOptionError, match="faithful_agnostic only applies"):
            simulate(wl, cluster, policy, ftf=False, policy_options={"faithful_agnostic": True})


def test_gavel_lp_policies_default_to_highs_interior_point():
    """Under Gavel's names with HiGHS, Gavel's LP policies get HiGHS's interior point without crossover
    (the Gavel adapter's HiGHS path: a point inside the optimal face, as Gavel's ECOS returns), recorded
    in the config; explicit solver_options and allocopt's own names keep what they ask for."""
    from allocopt.adapters.gavel import HIGHS_IPM

    wl = read_gavel_trace(shipped_trace("small_test"), TABLE)
    cluster = {"v100": 2, "p100": 2, "k80": 2}
    default = simulate(wl, cluster, "gavel:max_sum_throughput_perf", ftf=False, fidelity="gavel")
    assert default.config["policy_options"]["solver_options"] == HIGHS_IPM
    assert "interior point without crossover" in default.config["solver_path"]
    ipm = simulate(wl, cluster, "gavel:max_sum_throughput_perf", ftf=False, fidelity="gavel",
                   policy_options={"solver_options": HIGHS_IPM})
    simplex = simulate(wl, cluster, "gavel:max_sum_throughput_perf", ftf=False, fidelity="gavel",
                       policy_options={"solver_options": {"solver": "simplex"}})
    assert "solver_path" not in simulate(wl, cluster, "gavel:max_sum_throughput_perf", ftf=False).config
    np.testing.assert_array_equal(default.jobs["finish_s"], ipm.jobs["finish_s"])
    assert not np.array_equal(default.jobs["finish_s"], simplex.jobs["finish_s"])  # another optimum, another run
    assert "solver_path" not in simplex.config and "solver_path" not in ipm.config
    for policy in ("max_throughput", "gavel:fifo"):
        assert "solver_path" not in simulate(wl, cluster, policy, ftf=False).config
