"""Sia-style rounds: restart factors and pinning in the MILP, Sia's placement rules, leases, workloads."""

from __future__ import annotations

import numpy as np
import pytest

import allocopt
from allocopt.goodput_problem import ConfigurationAllocation, GoodputProblem, restart_factor
from allocopt.mechanism.sia_rounds import (MIN_RESTART_FACTOR, SiaJobState, advance, commit_plan,
                                           place_configurations, place_packed, plan_round, restart_delay_s,
                                           sia_round)
from allocopt.mechanism.sia_workloads import WorkloadFormatError, read_sia_workload, shipped_workloads_dir
from allocopt.runtime.executor import RoundPlan
from allocopt.solution import Status
from allocopt.throughput.goodput import goodput_matrix
from allocopt.throughput.profiles import load_profiles, shipped_profiles_dir

HETERO = allocopt.Cluster({"aws": 24, "rtx": 24, "dgx-ext": 16}, gpus_per_node={"aws": 4, "rtx": 8, "dgx-ext": 8})


def allocation_of(cluster, configurations, chosen, *, pinned=None, previous=None) -> ConfigurationAllocation:
    """A ConfigurationAllocation that gives job i configuration ``chosen[i]`` (-1: none)."""
    n = len(chosen)
    problem = GoodputProblem(np.ones((n, len(configurations))), configurations, cluster, previous=previous,
                             pinned=pinned)
    return ConfigurationAllocation(problem, np.array(chosen), "sia", None, Status.OPTIMAL, None, "")


def config_index(configurations, gpu_type, gpus) -> int:
    t = configurations.cluster.index(gpu_type)
    return int(np.flatnonzero((configurations.gpu_type == t) & (configurations.num_gpus == gpus))[0])


def check_placement(cluster, configurations, configuration, gpu_ids) -> None:
    """Types, counts, node rules, and every GPU id at most once."""
    type_start = np.concatenate([[0], np.cumsum(cluster.capacity)])
    used = [g for ids in gpu_ids.values() for g in ids]
    assert len(used) == len(set(used)), "a GPU id is used twice"
    for job, ids in gpu_ids.items():
        c = configuration[job]
        t, gpus = configurations.gpu_type[c], configurations.num_gpus[c]
        per = cluster.gpus_per_node[t]
        local = np.asarray(ids) - type_start[t]
        assert len(ids) == gpus and np.all((local >= 0) & (local < cluster.capacity[t]))
        nodes, counts = np.unique(local // per, return_counts=True)
        if gpus < per:
            assert nodes.size == 1, f"partial-node job {job} spans nodes {nodes}"
        else:
            assert np.all(counts == per) and nodes.size == configurations.num_nodes[c], \
                f"whole-node job {job} does not hold whole nodes: {ids}"


# ----- the MILP sees restart factors and pinning ----------------------------------------------------------------
def test_restart_factors_and_pinning_reach_the_milp():
    cluster = allocopt.Cluster({"aws": 8}, gpus_per_node=4)
    configs = allocopt.sia_configurations(cluster)  # 1, 2, 4, 8 GPUs
    goodput = np.array([[1.0, 1.9, 3.6, 6.5]] * 3)
    jobs = [SiaJobState("young", "cifar10", 0.0, 30.0, age_s=10.0, previous=0),
            SiaJobState("restoring", "bert", 0.0, 120.0, age_s=500.0, num_restarts=1, previous=0,
                        restore_remaining_s=40.0),
            SiaJobState("churned", "imagenet", 0.0, 250.0, age_s=1000.0, num_restarts=4, previous=0)]
    allocation = sia_round(jobs, cluster, configs, goodput)
    problem = allocation.problem
    expected = np.clip(restart_factor([10.0, 500.0, 1000.0], [0, 1, 4], [30.0, 120.0, 250.0]), MIN_RESTART_FACTOR, 1)
    expected[1] = 1.0  # pinned jobs are not penalized
    np.testing.assert_allclose(problem.restart_factor, expected)
    assert problem.pinned.tolist() == [False, True, False]
    assert problem.restart_factor[2] == MIN_RESTART_FACTOR  # restarts cost its whole age
    # the pinned and the churned job keep 1 GPU; the young job grows into the rest
    assert allocation.configuration.tolist()[1:] == [0, 0]
    assert allocation.num_gpus[0] > 1
    assert allocation.gpus_used.tolist() == [allocation.num_gpus.sum()]

    unpinned = [SiaJobState("alone", "bert", 0.0, 120.0, age_s=500.0, num_restarts=1, previous=0)]
    assert sia_round(unpinned, cluster, configs, goodput[:1]).configuration.tolist() == [3]
    unpinned[0].restore_remaining_s = 1.0
    assert sia_round(unpinned, cluster, configs, goodput[:1]).configuration.tolist() == [0]


# ----- placement rules ------------------------------------------------------------------------------------------
def test_partial_node_jobs_stay_in_one_node_and_whole_node_jobs_take_free_nodes():
    configs = allocopt.sia_configurations(HETERO)
    rng = np.random.default_rng(0)
    for _ in range(30):
        chosen, free = [], {t: int(c) for t, c in zip(HETERO.gpu_types, HETERO.capacity)}
        for c in rng.permutation(len(configs)).tolist() * 2:
            t = HETERO.gpu_types[configs.gpu_type[c]]
            if configs.num_gpus[c] <= free[t] and rng.random() < 0.5:
                free[t] -= int(configs.num_gpus[c])
                chosen.append(c)
        placement = place_configurations(HETERO, allocation_of(HETERO, configs, chosen), {})
        # powers of two below a node's size, and whole nodes first: a fresh cluster always fits
        assert placement.evicted == ()
        assert set(placement.gpu_ids) == set(range(len(chosen)))
        check_placement(HETERO, configs, dict(enumerate(chosen)), placement.gpu_ids)


def test_unchanged_configurations_keep_their_gpus():
    configs = allocopt.sia_configurations(HETERO)
    chosen = [config_index(configs, "aws", 8), config_index(configs, "rtx", 2), config_index(configs, "dgx-ext", 1),
              config_index(configs, "rtx", 4)]
    first = place_configurations(HETERO, allocation_of(HETERO, configs, chosen), {})
    # job 3 grows to a whole node, a new job 4 arrives; jobs 0-2 keep configuration and GPUs
    chosen2 = chosen[:3] + [config_index(configs, "rtx", 8), config_index(configs, "rtx", 4)]
    second = place_configurations(HETERO, allocation_of(HETERO, configs, chosen2), first.gpu_ids)
    for job in range(3):
        assert second.gpu_ids[job] == first.gpu_ids[job]
    assert second.gpu_ids[3] != first.gpu_ids[3]
    check_placement(HETERO, configs, dict(enumerate(chosen2)), second.gpu_ids)


def test_fragmentation_evicts_and_replaces_kept_jobs():
    cluster = allocopt.Cluster({"aws": 8}, gpus_per_node=4)
    configs = allocopt.sia_configurations(cluster)
    one, whole = config_index(configs, "aws", 1), config_index(configs, "aws", 4)
    previous = {0: (0,), 1: (4,)}  # one 1-GPU job on each node: no whole node is free
    placement = place_configurations(cluster, allocation_of(cluster, configs, [one, one, whole]), previous)
    assert placement.evicted == ()
    assert set(placement.gpu_ids[2]) in ({0, 1, 2, 3}, {4, 5, 6, 7})
    moved = [job for job in (0, 1) if placement.gpu_ids[job] != previous[job]]
    assert len(moved) == 1  # one small job was evicted from the node and placed on the other one
    check_placement(cluster, configs, {0: one, 1: one, 2: whole}, placement.gpu_ids)


def test_partial_node_eviction_and_jobs_that_fit_nowhere():
    cluster = allocopt.Cluster({"rtx": 16}, gpus_per_node=8)
    configs = allocopt.sia_configurations(cluster)
    c1, c4, c8 = (config_index(configs, "rtx", g) for g in (1, 4, 8))
    # node 0: pinned 4-GPU job and a movable 1-GPU job; node 1: pinned 4 + pinned 1. A new 4-GPU job fits
    # nowhere until the movable job leaves node 0 for node 1.
    previous = {0: (0, 1, 2, 3), 1: (4,), 2: (8, 9, 10, 11), 3: (12,)}
    pinned = [True, False, True, True, False]
    chosen = [c4, c1, c4, c1, c4]
    prev_cfg = [c4, c1, c4, c1, -1]
    placement = place_configurations(cluster, allocation_of(cluster, configs, chosen, pinned=pinned,
                                                            previous=prev_cfg), previous)
    assert placement.evicted == ()
    assert placement.gpu_ids[1] != previous[1] and 8 <= placement.gpu_ids[1][0] < 16
    for job in (0, 2, 3):
        assert placement.gpu_ids[job] == previous[job]
    check_placement(cluster, configs, dict(enumerate(chosen)), placement.gpu_ids)

    # all kept jobs pinned: 3 GPUs free on each node, a 4-GPU and an 8-GPU job fit nowhere and are evicted
    pinned = [True, True, True, True, False, False]
    chosen = [c4, c1, c4, c1, c4, c8]
    placement = place_configurations(cluster, allocation_of(cluster, configs, chosen[:5], pinned=pinned[:5],
                                                            previous=prev_cfg), previous)
    assert placement.evicted == (4,)
    assert {j: placement.gpu_ids[j] for j in range(4)} == {j: tuple(v) for j, v in previous.items()}
    small = {0: (0, 1, 2, 3), 1: (8,)}  # an 8-GPU job needs a whole free node: evict the movable 1-GPU job
    placement = place_configurations(cluster, allocation_of(cluster, configs, [c4, c1, c8], pinned=[True, False, False],
                                                            previous=[c4, c1, -1]), small)
    assert placement.evicted == () and set(placement.gpu_ids[2]) == set(range(8, 16))
    assert placement.gpu_ids[1][0] in range(4, 8)


# ----- rounds on the 64-GPU heterogeneous cluster ---------------------------------------------------------------
@pytest.fixture(scope="module")
def models():
    out: dict[str, dict] = {}
    for (app, gpu_type), profile in load_profiles(shipped_profiles_dir()).items():
        out.setdefault(app, {})[gpu_type] = profile.goodput_model()
    return out


def test_plan_round_leases_delays_and_stops(models):
    configs = allocopt.sia_configurations(HETERO)
    apps = ["cifar10", "bert", "imagenet", "cifar10"]
    jobs = [SiaJobState(f"{a}-{i}", a, 0.0, restart_delay_s(a)) for i, a in enumerate(apps)]
    goodput = goodput_matrix([models[a] for a in apps], configs)
    plan = plan_round(jobs, HETERO, configs, goodput, {}, round_index=0, start_s=0.0)
    assert isinstance(plan, RoundPlan)
    assert plan.allocation.success and len(plan.leases) == 4 and plan.stop == ()
    assert not any(lease.extended for lease in plan.leases)
    assert plan.restore_delay_s == {j.job_id: j.restart_delay_s for j in jobs}
    commit_plan(jobs, plan)
    assert all(j.started and j.num_restarts == 0 and j.restore_remaining_s == j.restart_delay_s for j in jobs)
    train = advance(jobs, 60.0)
    np.testing.assert_allclose(train, [30.0, 0.0, 0.0, 30.0])  # cifar10 restores in 30 s, bert 120 s, imagenet 250 s
    assert [j.restore_remaining_s for j in jobs] == [0.0, 60.0, 190.0, 0.0]

    # next round: the restoring jobs are pinned and every job keeps its GPUs; then one job is left without GPUs
    plan2 = plan_round(jobs, HETERO, configs, goodput, plan.gpu_ids, round_index=1, start_s=60.0)
    assert plan2.allocation.problem.pinned.tolist() == [False, True, True, False]
    assert all(lease.extended for lease in plan2.leases) and plan2.restore_delay_s == {}
    previous = dict(plan2.gpu_ids)
    a, b = jobs[0].job_id, jobs[3].job_id  # same application and configuration
    previous[a] = previous[b]  # both claim the same GPUs: one keeps them, the other moves and restores again
    plan3 = plan_round(jobs, HETERO, configs, goodput, previous, round_index=2, start_s=120.0)
    moved = [lease.job_id for lease in plan3.leases if not lease.extended]
    assert len(moved) == 1 and moved[0] in (a, b) and plan3.restore_delay_s == {moved[0]: 30.0}
    commit_plan(jobs, plan3)
    job = next(j for j in jobs if j.job_id == moved[0])
    assert job.num_restarts == 1 and job.restore_remaining_s == 30.0



def test_plan_round_stops_jobs_evicted_by_fragmentation():
    cluster = allocopt.Cluster({"rtx": 16}, gpus_per_node=8)
    configs = allocopt.sia_configurations(cluster)  # 1, 2, 4, 8, 16 GPUs
    c = {g: config_index(configs, "rtx", g) for g in (1, 2, 4)}
    sizes = {"p0": 4, "p1": 1, "p2": 4, "p3": 1}
    previous = {"p0": (0, 1, 2, 3), "p1": (4,), "x": (5, 6), "p2": (8, 9, 10, 11), "p3": (12,)}
    jobs = [SiaJobState(name, "cifar10", 0.0, 30.0, age_s=10.0, started=True, previous=c[g], restore_remaining_s=20.0)
            for name, g in sizes.items()]
    jobs.append(SiaJobState("x", "cifar10", 0.0, 30.0, age_s=10.0, started=True, previous=c[2]))
    goodput = np.tile([1.0, 2.0, 4.0, 8.0, 16.0], (5, 1))
    plan = plan_round(jobs, cluster, configs, goodput, previous, round_index=0, start_s=0.0)
    # the MILP grows x to 4 GPUs (6 are free in all), but 3 are free on each node: x is evicted and stopped
    assert plan.allocation.configuration.tolist()[-1] == c[4]
    assert plan.evicted == ("x",) and plan.stop == ("x",) and plan.configuration["x"] == -1
    assert all(lease.extended for lease in plan.leases) and len(plan.leases) == 4
    commit_plan(jobs, plan)
    assert jobs[-1].previous == -1 and advance(jobs, 60.0)[-1] == 0.0


def test_multi_round_saturn_workload(models):
    """30 saturn jobs (arrivals compressed 10x) over 60-s rounds: every round feasible, few restarts."""
    workload = [j for j in read_sia_workload(shipped_workloads_dir() / "saturn" / "workload-1.csv")
                if j.application in models][:30]
    configs = allocopt.sia_configurations(HETERO)
    round_s = 60.0
    rates = {a: goodput_matrix([models[a]], configs)[0] for a in models}
    pending = list(workload)
    jobs: list[SiaJobState] = []
    gpu_ids: dict = {}
    leases = extended = 0
    finished = []
    for k in range(80):
        now = k * round_s
        while pending and pending[0].time_s / 10 <= now:
            w = pending.pop(0)
            # about 15 minutes on one T4
            total = 900.0 * rates[w.application][config_index(configs, "aws", 1)]
            jobs.append(SiaJobState(w.name, w.application, w.time_s / 10, restart_delay_s(w.application), total=total))
        goodput = np.array([rates[j.application] for j in jobs]).reshape(len(jobs), len(configs))
        plan = plan_round(jobs, HETERO, configs, goodput, gpu_ids, round_index=k, start_s=now, round_seconds=round_s)
        if jobs:
            assert plan.allocation.success
            assert np.all(plan.allocation.gpus_used <= HETERO.capacity)
        check_placement(HETERO, configs, plan.configuration, plan.gpu_ids)
        for lease in plan.leases:
            same = lease.gpu_ids == tuple(sorted(gpu_ids.get(lease.job_id, ())))
            assert lease.extended == same
            assert (lease.job_id in plan.restore_delay_s) == (not same)
        leases += len(plan.leases)
        extended += sum(lease.extended for lease in plan.leases)
        commit_plan(jobs, plan)
        train = advance(jobs, round_s)
        for job, s in zip(jobs, train.tolist()):
            if job.previous >= 0:
                job.progress += rates[job.application][job.previous] * s
        done = [j for j in jobs if j.progress >= j.total]
        finished += done
        jobs = [j for j in jobs if j.progress < j.total]
        gpu_ids = {job: ids for job, ids in plan.gpu_ids.items() if job in {j.job_id for j in jobs}}
    assert len(finished) >= 20
    assert extended / leases > 0.6, f"only {extended} of {leases} leases extended"
    restarts = np.array([j.num_restarts for j in finished + jobs])
    assert restarts.mean() < 3.0, restarts


# ----- workloads ------------------------------------------------------------------------------------------------
def test_shipped_workloads_load():
    saturn = read_sia_workload(shipped_workloads_dir() / "saturn" / "workload-1.csv")
    assert len(saturn) == 160 and saturn[0].name == "cifar10-0" and saturn[0].time_s == 401.0
    assert all(a.time_s <= b.time_s for a, b in zip(saturn, saturn[1:]))
    assert {j.application for j in saturn} == {"bert", "cifar10", "deepspeech2", "imagenet", "yolov3"}
    phoebe = read_sia_workload(shipped_workloads_dir() / "phoebe_workload.csv")
    assert len(phoebe) == 30 and phoebe[0].num_replicas == 4 and phoebe[0].batch_size == 320


@pytest.mark.parametrize("text, line, words", [
    ("name,time,application,batch_size\ncifar10-0,1,cifar10,128\n", 1, "missing column(s) ['num_replicas']"),
    ("name,time,application,num_replicas,batch_size\ncifar10-0,1,cifar10,1,128\nncf-1,2,ncf,1,128\n", 3,
     "unknown application 'ncf'"),
    ("name,time,application,num_replicas,batch_size\ncifar10-0,-5,cifar10,1,128\n", 2, "finite number of seconds"),
    ("name,time,application,num_replicas,batch_size\ncifar10-0,soon,cifar10,1,128\n", 2, "not a number"),
    ("name,time,application,num_replicas,batch_size\nbert-0,1,cifar10,1,128\n", 2, "is not <application>-<n>"),
    ("name,time,application,num_replicas,batch_size\ncifar10-0,1,cifar10,0,128\n", 2, "num_replicas '0'"),
    ("name,time,application,num_replicas,batch_size\ncifar10-0,1,cifar10,1,128\ncifar10-0,2,cifar10,1,128\n", 3,
     "repeats line 2"),
    ("name,time,application,num_replicas,batch_size\n", None, "no jobs"),
])
def test_malformed_workloads_name_file_and_line(tmp_path, text, line, words):
    path = tmp_path / "workload.csv"
    path.write_text(text)
    with pytest.raises(WorkloadFormatError) as err:
        read_sia_workload(path, applications=shipped_profiles_dir())
    assert err.value.line == line and err.value.path == str(path)
    assert str(err.value).startswith(f"{path}, line {line}:" if line else f"{path}:") and words in str(err.value)


def test_missing_workload_file(tmp_path):
    with pytest.raises(WorkloadFormatError, match="cannot read"):
        read_sia_workload(tmp_path / "absent.csv")


def test_packed_placement_is_sias_simulator_round_robin():
    """Sia's simulator places with ``alloc_to_placement_fast`` (its policy's smart placement is off in
    simulation): jobs by GPU count, largest first (ties in job order), each from the node where the
    previous one stopped -- whole free nodes for its whole-node share, then free GPUs node by node."""
    cluster = allocopt.Cluster({"rtx": 24}, gpus_per_node=8)
    configs = allocopt.sia_configurations(cluster)
    c = {g: config_index(configs, "rtx", g) for g in (2, 4, 8)}
    chosen = [c[2], c[8], c[4], c[2], c[4]]
    placed = place_packed(cluster, allocation_of(cluster, configs, chosen), {})
    nodes = {job: sorted({gpu // 8 for gpu in ids}) for job, ids in placed.gpu_ids.items()}
    # order 1 (8), 2 (4), 4 (4), 0 (2), 3 (2): node 0 whole; then 1, 2; then 1 again, 2 again
    assert nodes == {1: [0], 2: [1], 4: [2], 0: [1], 3: [2]} and placed.evicted == ()
    check_placement(cluster, configs, dict(enumerate(chosen)), placed.gpu_ids)
    # next round job 1 leaves: everything is packed afresh (previous GPUs are not consulted) ...
    again = place_packed(cluster, allocation_of(cluster, configs, [c[2], -1, c[4], c[2], c[4]]), placed.gpu_ids)
    nodes = {job: sorted({gpu // 8 for gpu in ids}) for job, ids in again.gpu_ids.items()}
    assert nodes == {2: [0], 4: [1], 0: [2], 3: [0]}
    # ... and a job that lands on the same nodes keeps its GPU ids
    same = place_packed(cluster, allocation_of(cluster, configs, chosen), placed.gpu_ids)
    assert same.gpu_ids == placed.gpu_ids
