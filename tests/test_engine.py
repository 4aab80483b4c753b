"""allocopt.Engine: incremental state, caching, persistence and thread safety, with the real HiGHS backend."""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import allocopt
from allocopt.errors import DataFileError, DuplicateJobError, UnknownJobError
from allocopt.errors import InvalidOptionError, InvalidProblemError, UnknownBackendError, UnknownPolicyError
from allocopt.mechanism.placement import GpuLayout
from allocopt.runtime.executor import JobRoundResult, RoundOutcome, RoundPlan
from allocopt.throughput import ThroughputTable

TOL = 1e-6


def gavel_engine(num_jobs: int = 12, seed: int = 3, **kwargs) -> tuple[allocopt.Engine, allocopt.Problem]:
    cluster = allocopt.Cluster({"v100": 4, "p100": 4, "k80": 4})
    problem = ThroughputTable.gavel().sample_problem(cluster, num_jobs, seed=seed)
    engine = allocopt.Engine(cluster, **kwargs)
    for job in problem.to_json()["jobs"]:
        engine.add_job(job.pop("id"), **job)
    return engine, problem


def assert_same_allocation(a: allocopt.Allocation, b: allocopt.Allocation) -> None:
    assert a.job_ids == b.job_ids and a.gpu_types == b.gpu_types
    assert a.objective == pytest.approx(b.objective, rel=1e-7, abs=1e-9)
    np.testing.assert_allclose(a.effective_throughput, b.effective_throughput, rtol=1e-6, atol=1e-7)


def test_allocation_equals_solving_from_scratch():
    engine, problem = gavel_engine()
    assert_same_allocation(engine.allocate(), allocopt.solve(problem, "max_min_fairness"))


def test_incremental_updates_equal_solving_from_scratch():
    engine, problem = gavel_engine(num_jobs=10)
    engine.allocate()
    doc = problem.to_json()
    engine.remove_job(doc["jobs"][3]["id"])
    engine.update_job(doc["jobs"][0]["id"], priority_weight=3.0, throughputs={"k80": 0.5})
    engine.set_capacity("v100", 2)
    engine.add_job("late", throughputs={"v100": 5.0, "p100": 3.0, "k80": 1.0}, scale_factor=2)
    del doc["jobs"][3]
    doc["jobs"][0]["priority_weight"] = 3.0
    doc["jobs"][0]["throughputs"]["k80"] = 0.5
    doc["cluster"]["gpus"]["v100"] = 2
    doc["jobs"].append({"id": "late", "throughputs": {"v100": 5.0, "p100": 3.0, "k80": 1.0}, "scale_factor": 2})
    expected = allocopt.solve(allocopt.Problem.from_json(doc), "max_min_fairness")
    assert_same_allocation(engine.allocate(), expected)


@pytest.mark.parametrize("seed", [0, 1])
def test_problem_kept_in_columns_equals_one_built_from_the_job_records(seed):
    """Hundreds of adds, updates, measurements and removals (the columns grow and are squeezed):
    the engine's problem is the one a problem document of its jobs gives, waiting jobs left out."""
    rng = random.Random(seed)
    engine = allocopt.Engine({"v100": 4, "k80": 2})
    next_id = 0
    for step in range(600):
        ids = engine.job_ids
        action = rng.choice(["add", "add", "update", "measure", "remove"] if ids else ["add"])
        if action == "add":
            fields = {"scale_factor": rng.choice([1, 2, 4, 8]), "priority_weight": rng.choice([1.0, 2.5]),
                      "num_steps_remaining": rng.randint(1, 1000)}
            for name in ("slo_s", "time_since_start_s", "time_isolated_s"):
                if rng.random() < 0.5:
                    fields[name] = rng.uniform(10, 100)
            if rng.random() < 0.5:
                fields["entity"] = rng.choice(["x", "y", 7])
            engine.add_job(next_id if rng.random() < 0.5 else f"job{next_id}",
                           {"v100": rng.uniform(0, 10), "k80": rng.choice([0.0, rng.uniform(1, 5)])}, **fields)
            next_id += 1
        elif action == "update":
            engine.update_job(rng.choice(ids), priority_weight=rng.choice([None, 3.0]),
                              slo_s=rng.choice([None, 50.0]), throughputs={"k80": rng.uniform(0, 3)})
        elif action == "measure":
            engine.observe_throughput(rng.choice(ids), "v100", rng.uniform(1, 10))
        else:
            engine.remove_job(rng.choice(ids))
        if step == 300:
            engine.set_capacity("a100", 8)
            engine.add_job("on_a100", {"a100": 2.0}, scale_factor=8, num_steps_remaining=10)
        if step % 50 == 49:
            assert_problem_of_the_records(engine)
    assert len(engine) > 50  # enough jobs to grow the columns past their first size
    for job in engine.job_ids[3:]:  # most rows dead: the columns are squeezed
        engine.remove_job(job)
    assert_problem_of_the_records(engine)
    engine.add_job("last", {"v100": 1.0}, num_steps_remaining=5)
    assert_problem_of_the_records(engine)


def assert_problem_of_the_records(engine: allocopt.Engine) -> None:
    problem, waiting = engine.problem()
    cluster = engine.cluster
    jobs = [engine.get_job(job) for job in engine.job_ids]
    fits = [any(cluster.capacity[cluster.index(t)] >= job.get("scale_factor", 1) and v > 0
                for t, v in job["throughputs"].items()) for job in jobs]
    kept = [j for j, ok in zip(jobs, fits) if ok]
    expected = allocopt.Problem.from_json({"cluster": cluster.to_dict(), "jobs": kept})
    assert problem.to_json() == expected.to_json()
    assert waiting == tuple(j["id"] for j, ok in zip(jobs, fits) if not ok)


def test_mixed_optional_fields_report_the_job_missing_one():
    engine = allocopt.Engine({"v100": 2})
    engine.add_job("a", {"v100": 1.0}, num_steps_remaining=100)
    engine.add_job("b", {"v100": 2.0})
    with pytest.raises(InvalidProblemError) as err:
        engine.allocate()
    assert err.value.field == "num_steps_remaining" and err.value.job == "b"


def test_policy_and_options_are_passed_to_solve():
    engine, problem = gavel_engine(policy="max_min_fairness", policy_options={"heterogeneity_aware": False},
                                   solve_options={"threads": 1})
    expected = allocopt.solve(problem, "max_min_fairness", heterogeneity_aware=False, threads=1)
    assert_same_allocation(engine.allocate(), expected)


def test_allocate_is_cached_until_something_changes():
    engine, _ = gavel_engine(num_jobs=5)
    first = engine.allocate()
    version = engine.version
    assert engine.allocate() is first and engine.version == version
    engine.update_job(engine.job_ids[0], priority_weight=2.0)
    assert engine.version == version + 1
    second = engine.allocate()
    assert second is not first and engine.allocate() is second


def test_engine_state_accessors():
    engine = allocopt.Engine({"v100": 2, "k80": 2})
    engine.add_job("a", throughputs={"v100": 4.0}, num_steps_remaining=100)
    assert "a" in engine and len(engine) == 1 and engine.job_ids == ("a",)
    assert engine.get_job("a") == {"id": "a", "throughputs": {"v100": 4.0, "k80": 0.0}, "scale_factor": 1,
                                   "priority_weight": 1.0, "num_steps_remaining": 100}
    assert engine.cluster == allocopt.Cluster({"v100": 2, "k80": 2})
    assert "n_jobs=1" in repr(engine)


def test_observe_throughput_replaces_then_smooths():
    engine = allocopt.Engine({"v100": 1, "k80": 1}, throughput_smoothing=0.5)
    engine.add_job("a", throughputs={"v100": 10.0, "k80": 2.0})
    assert engine.observe_throughput("a", "v100", 20.0) == 20.0  # first measurement replaces the prior
    assert engine.observe_throughput("a", "v100", 10.0) == 15.0  # later ones: EMA with weight 0.5
    assert engine.get_job("a")["throughputs"] == {"v100": 15.0, "k80": 2.0}
    default = allocopt.Engine({"v100": 1})
    default.add_job("a", throughputs={"v100": 10.0})
    default.observe_throughput("a", "v100", 3.0)
    assert default.observe_throughput("a", "v100", 7.0) == 7.0  # default smoothing 1: keep the latest


def test_new_gpu_type_and_nodes_leaving():
    engine = allocopt.Engine({"v100": 4})
    engine.add_job("a", throughputs={"v100": 10.0})
    engine.add_job("big", throughputs={"v100": 30.0}, scale_factor=4)
    engine.set_capacity("a100", 8, gpus_per_node=4)
    assert engine.cluster.gpu_types == ("v100", "a100")
    assert engine.get_job("a")["throughputs"] == {"v100": 10.0, "a100": 0.0}
    engine.update_job("a", throughputs={"a100": 25.0})
    engine.set_capacity("v100", 2)  # nodes leave: "big" no longer fits anywhere
    alloc = engine.allocate()
    assert alloc.job_ids == ("a",) and alloc.extras["waiting_jobs"] == ["big"]
    assert alloc.matrix[0, 1] == pytest.approx(1.0)
    engine.set_capacity("v100", 4)  # they come back
    assert engine.allocate().job_ids == ("a", "big")
    engine.set_capacity("v100", 0)
    engine.set_capacity("a100", 0)
    empty = engine.allocate()
    assert empty.job_ids == () and empty.extras["waiting_jobs"] == ["a", "big"]


@pytest.mark.parametrize("call, error, field", [
    (lambda e: e.add_job("a", throughputs={"v100": 1.0}), DuplicateJobError, "job_id"),
    (lambda e: e.update_job("zz", priority_weight=2.0), UnknownJobError, "job_id"),
    (lambda e: e.remove_job("zz"), UnknownJobError, "job_id"),
    (lambda e: e.observe_throughput("zz", "v100", 1.0), UnknownJobError, "job_id"),
    (lambda e: e.add_job("b", throughputs={"tpu": 1.0}), InvalidProblemError, "gpu_type"),
    (lambda e: e.observe_throughput("a", "tpu", 1.0), InvalidProblemError, "gpu_type"),
    (lambda e: e.add_job("b", throughputs={"v100": -1.0}), InvalidProblemError, "throughputs.v100"),
    (lambda e: e.add_job("b", throughputs={"v100": float("nan")}), InvalidProblemError, "throughputs.v100"),
    (lambda e: e.add_job("b", throughputs={"v100": "fast"}), InvalidProblemError, "throughputs.v100"),
    (lambda e: e.add_job("b", throughputs=[1.0, 2.0]), InvalidProblemError, "throughputs"),
    (lambda e: e.add_job("b", throughputs={"v100": 0.0}), InvalidProblemError, "throughputs"),
    (lambda e: e.add_job("b", throughputs={"v100": 1.0}, scale_factor=0), InvalidProblemError, "scale_factor"),
    (lambda e: e.add_job("b", throughputs={"v100": 1.0}, scale_factor=1.5), InvalidProblemError,
     "scale_factor"),
    (lambda e: e.add_job("b", throughputs={"v100": 1.0}, priority_weight=-2), InvalidProblemError,
     "priority_weight"),
    (lambda e: e.add_job("b", throughputs={"v100": 1.0}, slo_s=100.0), InvalidProblemError,
     "num_steps_remaining"),
    (lambda e: e.add_job(["b"], throughputs={"v100": 1.0}), InvalidProblemError, "job_id"),
    (lambda e: e.update_job("a", color="red"), InvalidProblemError, "color"),
    (lambda e: e.observe_throughput("a", "v100", -3.0), InvalidProblemError, "steps_per_s"),
    (lambda e: e.set_capacity("v100", -1), InvalidProblemError, "gpus"),
    (lambda e: e.set_capacity("", 1), InvalidProblemError, "gpu_type"),
])
def test_bad_calls_raise_typed_errors_and_change_nothing(call, error, field):
    engine = allocopt.Engine({"v100": 2})
    engine.add_job("a", throughputs={"v100": 1.0})
    before, version = engine.to_json(), engine.version
    with pytest.raises(error) as info:
        call(engine)
    assert info.value.field == field
    assert engine.to_json() == before and engine.version == version


@pytest.mark.parametrize("kwargs, error", [
    ({"policy": "nope"}, UnknownPolicyError),
    ({"policy": "sia"}, InvalidOptionError),
    ({"backend": "nope"}, UnknownBackendError),
    ({"policy_options": {"nope": 1}}, InvalidOptionError),
    ({"solve_options": {"heterogeneity_aware": False}}, InvalidOptionError),
    ({"solve_options": {"solver_options": {"x": object()}}}, InvalidOptionError),
    ({"throughput_smoothing": 0.0}, InvalidOptionError),
])
def test_bad_construction_raises(kwargs, error):
    with pytest.raises(error):
        allocopt.Engine({"v100": 1}, **kwargs)


def test_save_load_round_trip(tmp_path):
    engine, _ = gavel_engine(num_jobs=8, throughput_smoothing=0.25,
                             policy_options={"heterogeneity_aware": False})
    engine.observe_throughput(engine.job_ids[1], "k80", 0.7)
    engine.set_capacity("a100", 2)
    path = tmp_path / "engine.json"
    engine.save(path)
    restored = allocopt.Engine.load(path)
    assert restored.to_json() == engine.to_json()
    assert restored.version == engine.version
    assert_same_allocation(restored.allocate(), engine.allocate())
    # the measured cell keeps smoothing after the restore
    assert restored.observe_throughput(engine.job_ids[1], "k80", 1.7) == pytest.approx(0.75 * 0.7 + 0.25 * 1.7)
    # the state file's cluster and jobs are a problem document
    assert allocopt.Problem.from_json(json.loads(path.read_text())).num_jobs == 8
    assert [p.name for p in tmp_path.iterdir()] == ["engine.json"]


@pytest.mark.parametrize("document, field", [
    ({"format": "other"}, "format"),
    ({"format": "allocopt-engine", "format_version": 99}, "format_version"),
    ({"format": "allocopt-engine", "format_version": 1, "version": 0, "policy": "max_min_fairness",
      "backend": "highs", "cluster": {"gpus": {"v100": 1}},
      "jobs": [{"id": "a", "throughputs": {"v100": 1.0}, "colour": 1}]}, "jobs[0]"),
    ({"format": "allocopt-engine", "format_version": 1, "version": 0, "policy": "max_min_fairness",
      "backend": "highs", "cluster": {"gpus": {"v100": 1}},
      "jobs": [{"id": "a", "throughputs": {"v100": 1.0}}], "measured": [["b", "v100"]]}, "measured"),
    ({"format": "allocopt-engine", "format_version": 1, "cluster": {"gpus": {"v100": 1}}, "jobs": []}, "version"),
])
def test_load_rejects_bad_documents(document, field):
    with pytest.raises(InvalidProblemError) as info:
        allocopt.Engine.from_json(document)
    assert info.value.field == field


def test_load_rejects_invalid_json(tmp_path):
    path = tmp_path / "engine.json"
    path.write_text("{not json")
    with pytest.raises(DataFileError, match=r"engine.json, line 1: invalid JSON"):
        allocopt.Engine.load(path)
    with pytest.raises(DataFileError, match="cannot read the engine state file"):
        allocopt.Engine.from_json(tmp_path / "missing.json")


def test_concurrent_mutations_and_allocations_are_consistent():
    engine = allocopt.Engine({"v100": 4, "k80": 4})
    num_threads, per_thread = 8, 12
    errors: list[BaseException] = []
    allocations: list[allocopt.Allocation] = []
    barrier = threading.Barrier(num_threads)

    def worker(t: int) -> None:
        rng = random.Random(t)
        try:
            barrier.wait()
            for k in range(per_thread):
                job = f"t{t}-{k}"
                engine.add_job(job, throughputs={"v100": rng.uniform(1, 10), "k80": rng.uniform(0.5, 3)})
                if k % 3 == 0:
                    engine.remove_job(job)
                elif k % 3 == 1:
                    engine.update_job(job, priority_weight=2.0)
                    engine.observe_throughput(job, "k80", 1.0)
                allocations.append(engine.allocate())
        except BaseException as err:  # reported in the main thread
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(num_threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    expected = {f"t{t}-{k}" for t in range(num_threads) for k in range(per_thread) if k % 3}
    assert set(engine.job_ids) == expected
    # adds + removes + (update + observe) of each thread: every mutation counted exactly once
    assert engine.version == num_threads * (per_thread + per_thread // 3 + 2 * (per_thread // 3))
    for alloc in allocations:  # every allocation is of one consistent state
        assert len(set(alloc.job_ids)) == len(alloc.job_ids)
        assert np.all(alloc.problem.scale_factors @ alloc.matrix <= alloc.problem.capacity + TOL)
    final = engine.allocate()
    assert set(final.job_ids) == expected
    weights = dict(zip(final.job_ids, final.problem.priority_weights))
    assert weights == {j: 2.0 if int(j.split("-")[1]) % 3 == 1 else 1.0 for j in expected}


# ----- rounds (next_round / record_round) ----------------------------------------------------------

def round_engine(**kwargs) -> allocopt.Engine:
    engine = allocopt.Engine(allocopt.Cluster({"v100": 4, "k80": 4}, {"v100": 2, "k80": 4}), round_seconds=60.0,
                             recompute_min_seconds=0.0, **kwargs)
    for k in range(6):
        engine.add_job(f"j{k}", throughputs={"v100": 10.0 + 5 * k, "k80": 4.0 + k}, scale_factor=1 + k % 2)
    return engine


def full_results(plan: RoundPlan) -> list[JobRoundResult]:
    return [JobRoundResult(lease.job_id, RoundOutcome.PREEMPTED, 0, lease.max_seconds) for lease in plan.leases]


def assert_valid_plan(engine: allocopt.Engine, plan: RoundPlan) -> None:
    ids = [g for lease in plan.leases for g in lease.gpu_ids]
    assert len(ids) == len(set(ids)), "a GPU id in two leases"
    layout = GpuLayout(engine.cluster)
    for lease in plan.leases:
        assert len(lease.gpu_ids) == engine.get_job(lease.job_id)["scale_factor"]
        assert {engine.cluster.gpu_types[layout.gpu_type[g]] for g in lease.gpu_ids} == {lease.gpu_type}


def test_received_share_approaches_allocation():
    engine = round_engine()
    allocation = engine.allocate().to_dict()
    received = {job: dict.fromkeys(engine.cluster.gpu_types, 0.0) for job in engine.job_ids}
    rounds = 300
    for _ in range(rounds):
        plan = engine.next_round()
        assert_valid_plan(engine, plan)
        for lease in plan.leases:
            received[lease.job_id][lease.gpu_type] += 1
        engine.record_round(full_results(plan))
    # The allocation packs every GPU; one type per job per round and whole-job gangs leave ~10% idle.
    for job, shares in allocation.items():
        for gpu_type, share in shares.items():
            assert received[job][gpu_type] / rounds == pytest.approx(share, rel=0.15, abs=0.01)


def test_leases_are_extended_and_stopped_jobs_listed():
    engine = round_engine()
    previous = engine.next_round()
    for _ in range(20):
        plan = engine.next_round()  # no record_round: every lease ran its full round
        assert_valid_plan(engine, plan)
        before = {lease.job_id: lease.gpu_ids for lease in previous.leases}
        for lease in plan.leases:
            assert lease.extended == (before.get(lease.job_id) == lease.gpu_ids)
        assert set(plan.stop) == set(before) - {lease.job_id for lease in plan.leases}
        previous = plan
    assert plan.round_index == 20 and plan.start_s == 20 * 60.0


def test_capacity_change_and_job_changes_mid_way():
    engine = round_engine()
    for _ in range(5):
        engine.record_round(full_results(engine.next_round()))
    engine.set_capacity("v100", 1)
    engine.remove_job("j0")
    engine.add_job("late", throughputs={"v100": 30.0, "k80": 9.0}, scale_factor=2)
    seen = set()
    for _ in range(30):
        plan = engine.next_round()
        assert_valid_plan(engine, plan)
        assert "j0" not in plan.stop
        assert sum(len(lease.gpu_ids) for lease in plan.leases if lease.gpu_type == "v100") <= 1
        seen |= {lease.job_id for lease in plan.leases}
        engine.record_round(full_results(plan))
    assert "late" in seen and "j0" not in seen
    engine.set_capacity("k80", 0)
    plan = engine.next_round()
    assert_valid_plan(engine, plan)
    assert {lease.gpu_type for lease in plan.leases} == {"v100"}


def test_save_load_mid_way_gives_the_same_next_plan(tmp_path):
    engine = round_engine()
    for _ in range(7):
        engine.record_round(full_results(engine.next_round()))
    engine.next_round()  # saved with a round awaiting results
    engine.save(tmp_path / "state.json")
    restored = allocopt.Engine.load(tmp_path / "state.json")
    for _ in range(5):
        a, b = engine.next_round(), restored.next_round()
        assert a == b
        engine.record_round(full_results(a))
        restored.record_round(full_results(b))


def test_record_round_rejects_bad_results():
    engine = round_engine()
    with pytest.raises(InvalidProblemError):
        engine.record_round([JobRoundResult("j0", RoundOutcome.COMPLETED, 1, 1.0)])
    plan = engine.next_round()
    idle = next(job for job in engine.job_ids if job not in {lease.job_id for lease in plan.leases})
    with pytest.raises(InvalidProblemError):
        engine.record_round([JobRoundResult(idle, RoundOutcome.COMPLETED, 1, 1.0)])
    with pytest.raises(InvalidProblemError):
        engine.record_round([JobRoundResult(plan.leases[0].job_id, RoundOutcome.COMPLETED, 1, -1.0)])
    with pytest.raises(InvalidOptionError):
        engine.next_round(round_seconds=0)
    engine.record_round(full_results(plan))


def test_concurrent_rounds_never_share_gpus():
    engine = round_engine()
    plans: list[RoundPlan] = []

    def loop() -> None:
        for _ in range(10):
            plans.append(engine.next_round())

    threads = [threading.Thread(target=loop) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(plan.round_index for plan in plans) == list(range(40))
    for plan in plans:
        assert_valid_plan(engine, plan)


def test_embed_engine_example_runs():
    example = Path(__file__).resolve().parents[1] / "examples" / "embed_engine.py"
    out = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, timeout=60, check=True)
    assert "round 5:" in out.stdout


def test_rounds_between_recomputes_keep_the_cluster_busy():
    engine = allocopt.Engine({"v100": 2, "k80": 2}, round_seconds=60.0, recompute_min_seconds=600.0)
    for k in range(3):
        engine.add_job(k, {"v100": 10.0 + k, "k80": 3.0 + k})
    busy = [sum(len(lease.gpu_ids) for lease in engine.next_round().leases) for _ in range(5)]
    engine.add_job("late", {"v100": 4.0, "k80": 2.0})  # arrives between recomputes: may fill idle GPUs
    plan = engine.next_round()
    assert busy == [3] * 5
    assert sum(len(lease.gpu_ids) for lease in plan.leases) == 4
    rounds = engine.to_json()["rounds"]
    assert rounds["installed_version"] < engine.version  # installed at time 0: not again before 600 s
    for _ in range(5):
        engine.next_round()
    assert engine.to_json()["rounds"]["installed_version"] == engine.version


def test_shares_follow_the_allocation_when_it_is_recomputed_every_round():
    # identical jobs: the LP's vertex gives them unequal time fractions; recomputed every round (counters reset
    # each time), the deficit carried over must still count, or the job with the smallest fraction never runs
    engine = allocopt.Engine({"v100": 2, "k80": 1}, round_seconds=60.0, recompute_min_seconds=0.0)
    speed = {"v100": 6.0, "k80": 2.0}
    for k in range(5):
        engine.add_job(k, speed)
    progress = dict.fromkeys(range(5), 0.0)
    for r in range(50):
        for k in range(5):
            engine.update_job(k, num_steps_remaining=1000 - r)  # a change: solved again every round
        for lease in engine.next_round().leases:
            progress[lease.job_id] += speed[lease.gpu_type]
    assert min(progress.values()) >= 0.85 * max(progress.values())


# ----- state documents are checked at load; record_round is all or nothing ---------------------

def mid_round_state() -> dict:
    """The state of an engine that planned a round whose results are not recorded yet."""
    engine = round_engine()
    engine.record_round(full_results(engine.next_round()))
    engine.next_round()
    return engine.to_json()


def _set(document: dict, path: str, value) -> dict:
    node = document
    *parents, last = path.split(".")
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[int(last) if isinstance(node, list) else last] = value
    return document


@pytest.mark.parametrize("path, value, field", [
    ("rounds.round_index", -1, "rounds.round_index"),
    ("rounds.clock_s", float("nan"), "rounds.clock_s"),
    ("rounds.clock_s", float("inf"), "rounds.clock_s"),
    ("rounds.pending_seconds", -5.0, "rounds.pending_seconds"),
    ("rounds.installed_version", 10**6, "rounds.installed_version"),
    ("rounds.last_reset_s", 1e12, "rounds.last_reset_s"),
    ("rounds.pending.0.1", "a100", "rounds.pending[0]"),
    ("rounds.jobs.0.1.gpu_type", "a100", "rounds.jobs[0].gpu_type"),
    ("rounds.jobs.0.1.received_s", {"a100": 3.0}, "rounds.jobs[0].received_s.a100"),
    ("rounds.jobs.0.1.received_s", {"v100": -3.0}, "rounds.jobs[0].received_s.v100"),
    ("rounds.jobs.0.1.gpu_slots", [-1], "rounds.jobs[0].gpu_slots"),
    ("rounds.jobs.0.0", ["j0"], "rounds.jobs[0]"),
    ("rounds.extra", 1, "rounds.extra"),
    ("measured", [[["j0"], "v100"]], "measured"),
    ("solve_options", {"time_limit_s": "x"}, "options"),
    ("solve_options", {"threads": True}, "options"),
    ("policy_options", {"heterogeneity_aware": "maybe"}, "options"),
    ("recompute_min_seconds", float("nan"), "options"),
    ("cluster", {"gpus": {"v100": 4, "k80": 1e300}}, "cluster.gpus.k80"),
    ("cluster", {"gpus": {"v100": 4, "k80": 4}, "extra": 1}, "cluster"),
    ("jobs.0.scale_factor", "2", "jobs[0].scale_factor"),
    ("jobs.0.id", None, "jobs[0].id"),
    ("colour", "blue", "colour"),
])
def test_state_documents_are_checked_at_load(path, value, field):
    document = _set(mid_round_state(), path, value)
    with pytest.raises(InvalidProblemError) as info:
        allocopt.Engine.from_json(document)
    assert info.value.field == field, str(info.value)
    assert field.split(".")[-1].split("[")[0] in str(info.value)


def test_a_state_that_loads_can_allocate_and_plan():
    restored = allocopt.Engine.from_json(mid_round_state())
    restored.record_round([])
    assert_valid_plan(restored, restored.next_round())


def test_state_files_name_the_path_and_line(tmp_path):
    path = tmp_path / "state.json"
    path.write_bytes(b'{"format": "allocopt-engine",\n "x": "\xff"}')
    with pytest.raises(DataFileError, match=r"state.json, line 2: not UTF-8"):
        allocopt.Engine.load(path)
    path.write_text(json.dumps(_set(mid_round_state(), "rounds.clock_s", -1.0)))
    with pytest.raises(DataFileError, match=r"state.json: invalid engine state: rounds.clock_s"):
        allocopt.Engine.load(path)


@pytest.mark.parametrize("bad", [
    {"measured_steps_per_s": float("nan")},
    {"measured_steps_per_s": -1.0},
    {"measured_steps_per_s": 0.0, "only_type": True},  # no GPU type left on which the job runs
    {"run_seconds": float("nan")},
])
def test_record_round_is_all_or_nothing(bad):
    engine = allocopt.Engine({"v100": 4, "k80": 4}, round_seconds=60.0, recompute_min_seconds=0.0)
    for k in range(4):
        tput = {"v100": 10.0 + k} if k == 3 and bad.get("only_type") else {"v100": 10.0 + k, "k80": 3.0}
        engine.add_job(f"j{k}", throughputs=tput)
    plan = engine.next_round()
    leases = sorted(plan.leases, key=lambda lease: lease.job_id != "j3")  # the bad result last
    assert leases[0].job_id == "j3"
    results = [JobRoundResult(lease.job_id, RoundOutcome.PREEMPTED, 5, 60.0, measured_steps_per_s=7.0)
               for lease in leases[::-1]]
    results[-1] = dataclasses.replace(results[-1], **{k: v for k, v in bad.items() if k != "only_type"})
    before, version = engine.to_json(), engine.version
    with pytest.raises(InvalidProblemError):
        engine.record_round(results)
    assert engine.to_json() == before and engine.version == version
    results[-1] = dataclasses.replace(results[-1], run_seconds=60.0, measured_steps_per_s=9.0)
    engine.record_round(results)  # the round is still pending: the corrected results are recorded
    assert engine.get_job("j3")["throughputs"]["v100"] == 9.0
