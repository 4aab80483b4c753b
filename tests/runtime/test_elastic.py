"""Elastic jobs run for real by `allocopt run --policy sia`: resized between rounds, every step once, the
goodput model's batch in each launch, no restart where the configuration stays, throughputs learned online."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from allocopt.cluster import Cluster
from allocopt.errors import InvalidProblemError
from allocopt.runtime.devices import Device
from allocopt.runtime.client import checkpoint_step
from allocopt.runtime.elastic import GoodputEngine, ElasticSpec, model_from_json
from allocopt.runtime.local import LocalExecutor
from allocopt.runtime.loop import Scheduler, StateStore, load_jobs
from tests.runtime.helpers import JOBS_DIR, assert_no_device_overlap, elastic_launches, repo_env

ELASTIC_STEPS = str(JOBS_DIR / "elastic_steps.py")


def _journal(db: Path) -> list[tuple[int, list]]:
    with sqlite3.connect(db) as con:
        return [(idx, json.loads(leases)) for idx, leases in con.execute("SELECT idx, leases FROM rounds ORDER BY idx")]


def test_elastic_jobs_resize_run_every_step_once_with_the_models_batch(tmp_path: Path) -> None:
    outs = {n: tmp_path / n for n in ("grow", "fixed")}
    for out in outs.values():
        out.mkdir()
    jobs = [  # grow: reports a gradient noise scale that makes larger batches worth it; fixed: one replica at most
        {"name": "grow", "command": [sys.executable, ELASTIC_STEPS, str(outs["grow"]), "--grad-sqr", "1",
                                     "--grad-var", "20"],
         "total_steps": 10 ** 6, "batch_size": 16, "max_batch_size": 256, "max_local_bsz": 64},
        {"name": "fixed", "command": [sys.executable, ELASTIC_STEPS, str(outs["fixed"])], "total_steps": 10 ** 6,
         "batch_size": 16, "max_replicas": 1}]
    (tmp_path / "jobs.json").write_text(json.dumps({"jobs": jobs}))
    run = subprocess.run([sys.executable, "-m", "allocopt", "run", str(tmp_path / "jobs.json"), "--cluster", "cpu=5",
                          "--policy", "sia", "--round-seconds", "1", "--max-rounds", "5", "--grace-s", "1",
                          "--state", str(tmp_path / "state.db")], env=repo_env(), capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    rounds = _journal(tmp_path / "state.db")
    assert len(rounds) == 5
    for name, out in outs.items():
        leases = [next(l for l in leases if l[0] == name) for _, leases in rounds]  # every job runs every round
        launches = elastic_launches(out)
        # a job is (re)started exactly at its leases that are not extended: the others kept running
        started = [l for l in leases if not l[3]]
        assert len(launches) == len(started) < len(leases)
        for lease, launch in zip(started, launches):
            decision = lease[4]
            assert sorted(launch) == list(range(len(lease[2])))  # one rank per device of the lease
            for doc in launch.values():
                assert doc["world_size"] == len(lease[2]) and doc["gpu_type"] == "cpu"
                got = {k: doc[k] for k in ("batch_size", "local_bsz", "accum_steps", "lr_scale")}
                assert got == doc["lease_file"] == decision["batch"]  # environment, lease file, journal
            # the batch of a launch is the model's optimum for the allocation (the initial batch before any model)
            assert decision["batch"] == decision["optimal"]
            if decision["model"] is None:
                assert decision["batch"]["batch_size"] == 16
            else:
                model = model_from_json(decision["model"])
                _, local, accum = model.optimize(decision["num_nodes"], len(lease[2]))
                assert (int(local), int(accum)) == (decision["batch"]["local_bsz"], decision["batch"]["accum_steps"])
                assert decision["batch"]["batch_size"] == len(lease[2]) * int(local) * (int(accum) + 1)
        # every step exactly once across the launches, and every rank of a launch ran the same steps
        ran = [s for launch in launches for s in launch[0]["steps"]]
        assert ran == list(range(report["jobs"][name]["steps_done"])) and ran
        for launch in launches:
            for doc in launch.values():
                assert doc["steps"] == launch[0]["steps"]
    grow = [len(next(l for l in leases if l[0] == "grow")[2]) for _, leases in rounds]
    assert sum(a != b for a, b in zip(grow, grow[1:])) >= 2, grow  # resized at least twice: 1 -> 2 -> 4
    assert grow[0] == 1 and max(grow) == 4
    batches = [launch[0]["batch_size"] for launch in elastic_launches(outs["grow"])]
    assert batches[0] == 16 and max(batches) > 16  # the reported noise scale made larger batches worth it
    fixed = [next(l for l in leases if l[0] == "fixed") for _, leases in rounds]
    assert all(len(l[2]) == 1 for l in fixed) and sum(l[3] for l in fixed) >= 3
    assert_no_device_overlap(tmp_path / "state.db.d")


def _two_type_devices() -> list[Device]:
    return [Device(i, "fast" if i < 2 else "slow", "cpu pseudo-device") for i in range(4)]


def test_throughputs_are_learned_online_and_jobs_go_to_their_faster_type(tmp_path: Path) -> None:
    # "x" runs 3x slower on "slow" GPUs, "y" 3x slower on "fast" ones; nothing tells the scheduler
    commands = {"x": "--slow=slow=3", "y": "--slow=fast=3"}
    jobs = []
    for name, slow in commands.items():
        (tmp_path / name).mkdir()
        jobs.append({"name": name, "command": [sys.executable, ELASTIC_STEPS, str(tmp_path / name), slow,
                                               "--alpha", "0.02", "--grad-sqr", "1", "--grad-var", "10",
                                               "--checkpoint-every", "10"],
                     "total_steps": 10 ** 6, "batch_size": 16, "max_batch_size": 64, "max_replicas": 1})
    (tmp_path / "jobs.json").write_text(json.dumps({"jobs": jobs}))
    cluster = Cluster({"fast": 2, "slow": 2})
    executor = LocalExecutor({}, _two_type_devices(), tmp_path / "work", grace_s=1.0)
    state = StateStore(tmp_path / "state.db")
    try:
        scheduler = Scheduler(load_jobs(tmp_path / "jobs.json"), cluster, executor, state, policy="sia",
                              round_seconds=1.0)
        scheduler.run(max_rounds=6)
        engine = scheduler.engine
        assert isinstance(engine, GoodputEngine)
        rounds = _journal(tmp_path / "state.db")
        for name, faster in (("x", "fast"), ("y", "slow")):
            measured = engine.measurements(name)
            assert set(measured) == {"fast", "slow"}  # it ran on both types
            for gpu_type, points in measured.items():
                for (nodes, replicas, local), (_, iter_s, _) in points.items():
                    predicted = engine.predicted_iter_time(name, gpu_type, nodes, replicas, local)
                    assert abs(predicted / iter_s - 1) <= 0.10, (name, gpu_type, predicted, iter_s)
            slower = "slow" if faster == "fast" else "fast"
            # learned: the slower type is slower (its sleep is 3x, plus the client's own time per step)
            assert engine.predicted_iter_time(name, slower, 1, 1, 16) > 1.5 * engine.predicted_iter_time(
                name, faster, 1, 1, 16), measured
            placed = [next(l for l in leases if l[0] == name)[1] for _, leases in rounds]
            assert placed[-2:] == [faster, faster], placed  # the last plans put it on its faster type
    finally:
        state.close()


def test_job_file_elastic_fields_are_validated(tmp_path: Path) -> None:
    def load(**fields) -> list:
        (tmp_path / "j.json").write_text(json.dumps({"jobs": [{"name": "e", "command": "true", "total_steps": 5,
                                                                **fields}]}))
        return load_jobs(tmp_path / "j.json")

    (job,) = load(batch_size=32, max_batch_size=512, application="cifar10", min_replicas=1, max_replicas=4)
    assert job.elastic == ElasticSpec(32, "cifar10", 512, min_replicas=1, max_replicas=4)
    for fields, field in (({"application": "cifar10"}, "batch_size"), ({"batch_size": 0}, "batch_size"),
                          ({"batch_size": 64, "max_batch_size": 32}, "max_batch_size"),
                          ({"batch_size": 8, "min_replicas": 4, "max_replicas": 2}, "max_replicas"),
                          ({"batch_size": 8, "lr_scaling": "cubic"}, "lr_scaling"),
                          ({"batch_size": 8, "seed_profile": "missing.csv"}, "seed_profile"),
                          ({"batch_size": 8, "scale_factor": 2}, "scale_factor")):
        with pytest.raises(InvalidProblemError, match=f"job 'e': {field}") as err:
            load(**fields)
        assert err.value.field == field


def test_a_rigid_job_under_sia_and_an_unknown_application_fail_with_a_message(tmp_path: Path) -> None:
    (tmp_path / "j.json").write_text(json.dumps({"jobs": [
        {"name": "rigid", "command": "true", "total_steps": 5},
        {"name": "unknown", "command": "true", "total_steps": 5, "batch_size": 8, "application": "nosuchapp"},
        {"name": "huge", "command": "true", "total_steps": 5, "batch_size": 8, "min_replicas": 3,
         "gpu_types": ["fast"]}]}))
    executor = LocalExecutor({}, _two_type_devices(), tmp_path / "work")
    state = StateStore(tmp_path / "state.db")
    try:
        scheduler = Scheduler(load_jobs(tmp_path / "j.json"), Cluster({"fast": 2, "slow": 2}), executor, state,
                              policy="sia", round_seconds=1.0)
        report = scheduler.run()
    finally:
        state.close()
    assert report["jobs"]["rigid"]["status"] == "failed" and "batch_size" in report["jobs"]["rigid"]["message"]
    assert report["jobs"]["unknown"]["status"] == "failed"
    assert "nosuchapp" in report["jobs"]["unknown"]["message"]
    assert report["jobs"]["huge"]["status"] == "failed" and "min_replicas 3" in report["jobs"]["huge"]["message"]


def test_goodput_engine_state_round_trips_with_what_it_learned() -> None:
    engine = GoodputEngine(Cluster({"fast": 2, "slow": 2}), "sia", round_seconds=1.0)
    engine.add_job("j", ElasticSpec(16, max_batch_size=128), gpu_types=["fast", "slow"])
    for local, t in ((16, 0.01), (32, 0.018)):
        engine.observe_step_time("j", "fast", 1, 1, local, t, t)
    engine.observe_gradient("j", 1.0, 5.0)
    restored = GoodputEngine.from_json(json.loads(json.dumps(engine.to_json())))
    assert restored.measurements("j") == engine.measurements("j")
    for gpu_type in ("fast", "slow"):
        assert restored.predicted_iter_time("j", gpu_type, 1, 2, 24) == pytest.approx(
            engine.predicted_iter_time("j", gpu_type, 1, 2, 24))
    with pytest.raises(InvalidProblemError, match="step times"):
        engine.observe_step_time("j", "fast", 1, 1, 16, 0.02, 0.01)


def test_optimize_models_matches_each_models_optimize() -> None:
    from allocopt.throughput.goodput import GoodputModel, GradParams, PerfParams, optimize_models

    models = [GoodputModel(PerfParams(0.01 * k, 0.001, 0.05, 0.01, 0.02, 0.005, 1.5), GradParams(1.0, 3.0 * k),
                           32, 32 * 2 ** k, 64 * k) for k in range(1, 5)]
    nodes, replicas = [1, 1, 2, 1], [1, 4, 8, 2]
    g, m, s = optimize_models(models, nodes, replicas)
    for k, model in enumerate(models):
        assert (g[k], m[k], s[k]) == tuple(float(a) for a in model.optimize(nodes[k], replicas[k]))


def test_a_job_measured_in_samples_ends_at_the_step_that_reaches_them(tmp_path: Path) -> None:
    total = 6000
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "jobs.json").write_text(json.dumps({"jobs": [
        {"name": "s", "command": [sys.executable, ELASTIC_STEPS, str(out), "--grad-sqr", "1", "--grad-var", "20"],
         "total_samples": total, "batch_size": 16, "max_batch_size": 128, "max_local_bsz": 64}]}))
    (job,) = load_jobs(tmp_path / "jobs.json")
    assert job.total_steps == total // 16  # the most steps it can take
    executor = LocalExecutor({}, [Device(i, "cpu", "cpu pseudo-device") for i in range(2)], tmp_path / "work",
                             grace_s=1.0)
    state = StateStore(tmp_path / "state.db")
    try:
        report = Scheduler([job], Cluster({"cpu": 2}), executor, state, policy="sia", round_seconds=1.0).run(
            max_rounds=30)
    finally:
        state.close()
    assert report["jobs"]["s"]["status"] == "done"
    samples, step = 0, 0
    launches = elastic_launches(out)
    for launch in launches:
        doc = launch[0]
        assert doc["steps"] == list(range(step, step + len(doc["steps"])))  # resumed where the last one ended
        assert doc["total_steps"] == step + -(-(total - samples) // doc["batch_size"])  # its steps reach the samples
        step += len(doc["steps"])
        samples += len(doc["steps"]) * doc["batch_size"]
    assert samples - launches[-1][0]["batch_size"] < total <= samples  # ended at the first step that reached them
    assert report["jobs"]["s"]["samples_done"] == samples and report["jobs"]["s"]["steps_done"] == step
    assert len({launch[0]["batch_size"] for launch in launches}) > 1  # the batch grew on the way


def test_a_restarted_scheduler_resumes_elastic_jobs_with_what_it_learned(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "jobs.json").write_text(json.dumps({"jobs": [
        {"name": "r", "command": [sys.executable, ELASTIC_STEPS, str(out), "--grad-sqr", "1", "--grad-var", "20"],
         "total_steps": 10 ** 6, "batch_size": 16, "max_batch_size": 128, "max_local_bsz": 64}]}))

    def scheduler() -> tuple[Scheduler, StateStore]:
        executor = LocalExecutor({}, [Device(i, "cpu", "cpu pseudo-device") for i in range(2)], tmp_path / "work",
                                 grace_s=1.0)
        state = StateStore(tmp_path / "state.db")
        return Scheduler(load_jobs(tmp_path / "jobs.json"), Cluster({"cpu": 2}), executor, state, policy="sia",
                         round_seconds=1.0), state

    first, state = scheduler()
    first.run(max_rounds=2)
    learned = first.engine.measurements("r")
    state.close()
    second, state = scheduler()
    try:
        assert isinstance(second.engine, GoodputEngine) and second.engine.measurements("r") == learned != {}
        report = second.run(max_rounds=2)
    finally:
        state.close()
    ran = [s for launch in elastic_launches(out) for s in launch[0]["steps"]]
    assert ran == list(range(report["jobs"]["r"]["steps_done"]))  # every step once across both schedulers
    rounds = _journal(tmp_path / "state.db")
    assert len(rounds) == 4 and not rounds[2][1][0][3]  # the restarted scheduler held no process: a new launch


def test_a_seed_profile_gives_the_model_before_any_run(tmp_path: Path) -> None:
    # the job's own 1-GPU step times on both types: no profiling round, and the first plan uses its faster type
    rows = [f"{t},{m},1,{(0.004 + 0.0002 * m) * f:.6f},0.0001" for t, f in (("fast", 1), ("slow", 3))
            for m in (8, 16, 32)]
    (tmp_path / "seed.csv").write_text("gpu_type,local_bsz,placement,step_time,sync_time\n" + "\n".join(rows) + "\n")
    (tmp_path / "j.json").write_text(json.dumps({"jobs": [
        {"name": "s", "command": "true", "total_steps": 5, "batch_size": 16, "max_replicas": 1,
         "seed_profile": "seed.csv"}]}))
    (job,) = load_jobs(tmp_path / "j.json")
    assert job.elastic.seed_profile == str(tmp_path / "seed.csv")
    engine = GoodputEngine(Cluster({"fast": 2, "slow": 2}), "sia", round_seconds=1.0)
    engine.add_job("s", job.elastic)
    for t, f in (("fast", 1), ("slow", 3)):
        for m in (8, 16, 32):
            assert engine.predicted_iter_time("s", t, 1, 1, m) == pytest.approx((0.004 + 0.0002 * m) * f, rel=0.1)
    plan = engine.next_round()
    assert [(l.gpu_type, len(l.gpu_ids)) for l in plan.leases] == [("fast", 1)]
    assert plan.leases[0].batch.batch_size >= 16


def test_an_application_profile_is_the_prior_of_a_new_job() -> None:
    from allocopt.runtime.elastic import GoodputOptions, load_job_profiles

    profiles = load_job_profiles(None, ["cifar10"])  # Sia's shipped profiles
    engine = GoodputEngine(Cluster({"rtx": 8, "aws": 8}, gpus_per_node={"rtx": 8, "aws": 4}), "sia",
                           round_seconds=60.0, profiles=profiles,
                           options=GoodputOptions(explore_types=False, explore_replicas=False))
    engine.add_job("c", ElasticSpec(128, "cifar10"))
    rtx = profiles["cifar10", "rtx"]
    model = engine.model("c", "rtx")
    assert model.perf_params == rtx.fit() and model.max_batch_size == rtx.max_batch_size
    plan = engine.next_round()
    (lease,) = plan.leases
    decision = engine.decisions["c"]
    _, local, accum = engine.model("c", lease.gpu_type).optimize(decision.num_nodes, len(lease.gpu_ids))
    assert lease.batch.local_bsz == int(local) and lease.batch.accum_steps == int(accum)
    assert len(lease.gpu_ids) > 1  # the profile's scaling makes several GPUs worth it


def test_a_job_that_must_move_to_profile_a_type_is_not_left_idle() -> None:
    """A young job measured on one type only must move to profile the other: the move is not its choice, so no
    restart penalty makes idling look better (the policy would refuse a round leaving every job idle)."""
    engine = GoodputEngine(Cluster({"fast": 1, "slow": 1}), "sia", round_seconds=1.0)
    # a restart costs 0.05 s: at 0.2 s old, Pollux's factor for a move is 0.2 / 0.25 = 0.8, a utility
    # 0.8 ** -0.5 = 1.118 above Sia's lambda_n = 1.1 for every configuration the job may take
    engine.add_job("j", ElasticSpec(16, max_batch_size=64, max_replicas=1, restart_delay_s=0.05),
                   gpu_types=["fast", "slow"])
    first = engine.next_round()  # no model yet: a 1-GPU configuration of either type
    (lease,) = first.leases
    for local, t in ((16, 0.01), (16, 0.011)):
        engine.observe_step_time("j", lease.gpu_type, 1, 1, local, t, t)
    time.sleep(0.2)
    second = engine.next_round()
    (moved,) = second.leases
    assert moved.gpu_type != lease.gpu_type and not moved.extended
    assert set(engine.measurements("j")) == {lease.gpu_type}


def test_a_pytorch_ddp_job_resizes_and_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    """examples/pytorch_elastic.py (DistributedDataParallel, gloo on CPU) under `allocopt run --policy sia`: its
    replicas change between rounds, each launch resumes at the step the last one checkpointed, every step runs
    once, and each launch trains at the batch the engine chose for its allocation."""
    pytest.importorskip("torch", reason="the PyTorch example needs torch")
    example = Path(__file__).resolve().parents[2] / "examples" / "pytorch_elastic.py"
    log = tmp_path / "steps.log"
    jobs = [{"name": "ddp", "command": [sys.executable, str(example), "--log", str(log), "--noise", "3"],
             "total_steps": 10 ** 6, "batch_size": 16, "max_batch_size": 256, "max_local_bsz": 64,
             "env": {"OMP_NUM_THREADS": "1"}}]
    (tmp_path / "jobs.json").write_text(json.dumps({"jobs": jobs}))
    run = subprocess.run([sys.executable, "-m", "allocopt", "run", str(tmp_path / "jobs.json"), "--cluster", "cpu=4",
                          "--policy", "sia", "--round-seconds", "6", "--max-rounds", "5", "--grace-s", "5",
                          "--state", str(tmp_path / "state.db")], env=repo_env(), capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    rounds = _journal(tmp_path / "state.db")
    leases = [leases[0] for _, leases in rounds]
    started = [lease for lease in leases if not lease[3]]
    launches, steps = [], {}
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            launches.append(json.loads(line))
        else:
            launch, world, step, _ = line.split()
            steps.setdefault(launch, []).append(int(step))
    assert len({len(lease[2]) for lease in leases}) >= 2, [len(lease[2]) for lease in leases]  # resized
    assert len(launches) == len(started)
    done = 0
    for lease, launch in zip(started, launches):
        assert launch["world_size"] == len(lease[2])
        assert {k: launch[k] for k in ("batch_size", "local_bsz", "accum_steps", "lr_scale")} == lease[4]["batch"]
        assert launch["start"] == done  # resumed from the checkpoint the previous launch wrote when stopped
        ran = steps.get(launch["launch"], [])
        assert ran == list(range(done, done + len(ran)))
        done += len(ran)
    # the last launch checkpointed every step it ran when the scheduler stopped it at its exit
    newest = max(checkpoint_step(str(p)) for p in (tmp_path / "state.db.d" / "jobs" / "ddp" / "checkpoints").iterdir())
    assert newest == done >= report["jobs"]["ddp"]["steps_done"] > 0
