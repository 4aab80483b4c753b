"""RayExecutor on a real local Ray instance, with real subprocesses on cpu pseudo-devices."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="the Ray executor needs Ray: pip install 'allocopt[ray]'")

from allocopt.errors import InvalidProblemError  # noqa: E402
from allocopt.runtime import Lease, RoundOutcome, RoundPlan  # noqa: E402
from allocopt.runtime.executor import BatchSettings  # noqa: E402
from allocopt.runtime.local import JobSpec  # noqa: E402
from allocopt.runtime.ray_executor import RayExecutor  # noqa: E402
from tests.runtime.helpers import (JOBS_DIR, assert_no_device_overlap, count_steps_command, elastic_launches,  # noqa: E402
                                   repo_env, steps_written)

DEVICES = 3  # held by the module's executor (its actors start once: each imports allocopt)
ADVERTISED = DEVICES + 4  # units of accelerator_type:cpu of the test instance: four more for `allocopt run`


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    """A local Ray instance for this module; yields its address."""
    ray.init(num_cpus=2, include_dashboard=False, resources={"accelerator_type:cpu": ADVERTISED},
             log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="module")
def ex(ray_address: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayExecutor]:
    """One executor on DEVICES cpu pseudo-devices; every test adds its own jobs and stops them at its end."""
    executor = RayExecutor({}, {"cpu": DEVICES}, tmp_path_factory.mktemp("ray") / "rt", grace_s=1.0, max_retries=2,
                           retry_backoff_s=0.05)
    yield executor
    executor.close()


def _add(ex: RayExecutor, jobs: dict[str, JobSpec]) -> None:
    for name, spec in jobs.items():
        ex.add_job(name, spec)


def _stop_all(ex: RayExecutor, index: int) -> None:
    """A round without leases stops every job."""
    ex.run_round(RoundPlan(index, 0.0, 0.1, ()))
    assert ex.held_jobs == ()


def _plan(index: int, seconds: float, *leases: Lease) -> RoundPlan:
    return RoundPlan(index, 0.0, seconds, tuple(leases))


def _lease(job: str, ids: tuple[int, ...], seconds: float, *, extended: bool = False,
           max_steps: int | None = None) -> Lease:
    return Lease(job, "cpu", ids, seconds, max_steps=max_steps, extended=extended)


def test_ranks_run_in_ray_actors_with_the_local_environment(tmp_path: Path, ex: RayExecutor) -> None:
    envs = tmp_path / "env"
    _add(ex, {"a": JobSpec("a", count_steps_command(tmp_path / "a.txt", "--env-out", str(envs)), 10_000,
                           env={"EXTRA": "1"}), "b": JobSpec("b", ["true"], 1)})
    launches = ex.stats.launches
    assert ray.available_resources().get("accelerator_type:cpu") == ADVERTISED - DEVICES  # an actor per device
    [result] = ex.run_round(_plan(0, 8.0, _lease("a", (1, 2), 8.0, max_steps=5)))
    seen = [json.loads(Path(f"{envs}.{r}").read_text()) for r in (0, 1)]
    for rank, info in enumerate(seen):
        env = info["env"]
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == (str(rank), str(rank),
                                                                                               "2", "2")
        assert env["CUDA_VISIBLE_DEVICES"] == "" and env["ALLOCOPT_DEVICES"] == "1,2"
        assert env["ALLOCOPT_GPU_TYPE"] == "cpu" and env["ALLOCOPT_MAX_STEPS"] == "5"
        assert env["ALLOCOPT_TOTAL_STEPS"] == "10000" and env["ALLOCOPT_JOB_ID"] == "a" and env["EXTRA"] == "1"
        assert env["ALLOCOPT_CHECKPOINT_DIR"] == str(ex.checkpoint_dir("a"))
        epoch = env["ALLOCOPT_EPOCH"]  # the launch's files are named by its lease epoch
        assert env["ALLOCOPT_LEASE_FILE"] == str(ex.job_dir("a") / f"lease-e{epoch}.json")
        assert env["ALLOCOPT_SYNC_FILE"] == str(ex.job_dir("a") / f"sync-e{epoch}.json")
        assert env["ALLOCOPT_FENCE_DIR"] == str(ex.job_dir("a"))
        assert env["MASTER_ADDR"] == ray.util.get_node_ip_address() and int(env["MASTER_PORT"]) > 0
    assert seen[0]["env"]["MASTER_PORT"] == seen[1]["env"]["MASTER_PORT"] and seen[0]["pid"] != seen[1]["pid"]
    assert result.outcome is RoundOutcome.PREEMPTED and result.steps == 5 and result.restarted
    assert steps_written(tmp_path / "a.txt") == list(range(5)) and ex.checkpointed_steps("a") == 5
    # the next round extends the lease: the same processes run 5 more steps
    [again] = ex.run_round(_plan(1, 8.0, _lease("a", (1, 2), 8.0, max_steps=5, extended=True)))
    assert again.steps == 5 and not again.restarted and ex.stats.launches == launches + 1
    with pytest.raises(InvalidProblemError, match="leased to both"):
        ex.run_round(_plan(2, 1.0, _lease("a", (0,), 1.0), _lease("b", (0,), 1.0)))
    _stop_all(ex, 3)


def test_preempted_job_resumes_from_its_checkpoint_without_lost_or_repeated_steps(tmp_path: Path,
                                                                                   ex: RayExecutor) -> None:
    _add(ex, {n: JobSpec(n, count_steps_command(tmp_path / f"{n}.txt", "--sleep-s", "0.003"), 100_000)
              for n in ("p", "q")})
    launches = ex.stats.launches
    # mid-round preemption: a job that has not finished is stopped at each round's (time-based) end
    # and restarted on the other device, while the other job takes its device; at least 3 rounds, and
    # more (up to 10) until both have checkpointed steps (on a loaded machine a start can take a round)
    rounds = 0
    while rounds < 3 or (rounds < 10 and min(ex.checkpointed_steps(n) for n in ("p", "q")) == 0):
        ex.run_round(_plan(rounds, 3.0, _lease("p", (rounds % 2,), 3.0), _lease("q", (1 - rounds % 2,), 3.0)))
        rounds += 1
    _stop_all(ex, rounds)
    for n in ("p", "q"):
        written = steps_written(tmp_path / f"{n}.txt")
        assert len(written) > 0 and written == list(range(len(written))) == list(range(ex.checkpointed_steps(n)))
    assert ex.stats.launches == launches + 2 * rounds
    assert_no_device_overlap(ex.work_dir)


def test_job_moving_between_devices_finishes_with_exact_steps(tmp_path: Path, ex: RayExecutor) -> None:
    out = tmp_path / "m.txt"
    _add(ex, {"m": JobSpec("m", count_steps_command(out), 150)})
    total, results = 0, []
    for k in range(4):  # leases end after 60 steps; m moves to the other device every round
        [r] = ex.run_round(_plan(k, 8.0, _lease("m", (k % 2,), 8.0, max_steps=60)))
        results.append(r)
        total += r.steps
        if r.outcome is RoundOutcome.COMPLETED:
            break
    assert [r.outcome for r in results] == [RoundOutcome.PREEMPTED] * 2 + [RoundOutcome.COMPLETED]
    assert [r.steps for r in results] == [60, 60, 30] and all(r.restarted for r in results)
    assert steps_written(out) == list(range(150)) and total == 150 and ex.held_jobs == ()


def test_crashing_job_is_retried_then_marked_failed(tmp_path: Path, ex: RayExecutor) -> None:
    _add(ex, {"c": JobSpec("c", count_steps_command(tmp_path / "c.txt", "--crash-at", "3"), 100)})
    launches, retries = ex.stats.launches, ex.stats.retries
    [r] = ex.run_round(_plan(0, 12.0, _lease("c", (2,), 12.0)))
    assert r.outcome is RoundOutcome.FAILED and "failed 3 times" in r.message and "[3]" in r.message
    assert ex.stats.retries == retries + 2 and ex.stats.launches == launches + 3 and ex.failed("c")
    assert steps_written(tmp_path / "c.txt") == [0, 1, 2]  # retries resumed from the checkpoint
    [again] = ex.run_round(_plan(1, 1.0, _lease("c", (2,), 1.0)))
    assert again.outcome is RoundOutcome.FAILED and ex.stats.launches == launches + 3 and ex.held_jobs == ()


def test_job_ignoring_the_stop_request_is_killed(tmp_path: Path, ex: RayExecutor) -> None:
    envs = tmp_path / "env"
    _add(ex, {"x": JobSpec("x", count_steps_command(tmp_path / "x.txt", "--ignore-stop", "--env-out", str(envs)), 10)})
    [r] = ex.run_round(_plan(0, 0.5, _lease("x", (0,), 0.5)))
    pid = json.loads(Path(f"{envs}.0").read_text())["pid"]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert r.outcome is RoundOutcome.PREEMPTED and ex.held_jobs == ()  # SIGKILL ended it: SIGTERM is ignored


def test_job_whose_actor_died_restarts_from_its_checkpoint(tmp_path: Path, ex: RayExecutor) -> None:
    envs, out = tmp_path / "env", tmp_path / "d.txt"
    _add(ex, {"d": JobSpec("d", count_steps_command(out, "--env-out", str(envs)), 40)})
    [first] = ex.run_round(_plan(0, 8.0, _lease("d", (0,), 8.0, max_steps=10)))  # d pauses after 10 steps
    pid = json.loads(Path(f"{envs}.0").read_text())["pid"]
    actor_pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])  # d's parent: the actor
    os.kill(actor_pid, signal.SIGKILL)  # as when its node is lost: d dies with it, and Ray restarts the actor
    # under load Ray's restart of the actor can take most of a round: more rounds until d completes
    later = []
    while len(later) < 5 and (not later or later[-1].outcome is RoundOutcome.PREEMPTED):
        later += ex.run_round(_plan(1 + len(later), 8.0, _lease("d", (0,), 8.0, extended=True)))
    assert first.steps == 10 and later[-1].outcome is RoundOutcome.COMPLETED
    # the lease's process was gone: a new launch, or (when the death is noticed in the round) a loss, not a crash
    assert later[0].restarted or "lost their device" in later[0].message
    assert all(r.outcome is not RoundOutcome.FAILED for r in later) and ex.failed("d") is None
    assert sum(r.steps for r in later) == 30 and steps_written(out) == list(range(40)) and ex.held_jobs == ()


def test_missing_resources_are_named(tmp_path: Path, ray_address: str) -> None:
    with pytest.raises(InvalidProblemError, match="accelerator_type:h100"):
        RayExecutor({}, {"h100": 1}, tmp_path / "rt")
    with pytest.raises(InvalidProblemError, match=f"advertises {ADVERTISED}"):
        RayExecutor({}, {"cpu": ADVERTISED + 1}, tmp_path / "rt")


def test_allocopt_run_with_the_ray_executor_finishes_every_job_exactly(tmp_path: Path, ray_address: str) -> None:
    totals = {"a": 200, "b": 150, "c": 100}
    jobs = [{"name": n, "command": count_steps_command(tmp_path / f"{n}.txt"), "total_steps": t,
             "throughputs": {"cpu": 150.0}} for n, t in totals.items()]
    (tmp_path / "jobs.json").write_text(json.dumps({"jobs": jobs}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                       os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-m", "allocopt", "run", str(tmp_path / "jobs.json"), "--cluster", "cpu=2",
                          "--round-seconds", "1", "--state", str(tmp_path / "state.db"), "--grace-s", "1",
                          "--executor", "ray", "--ray-address", ray_address], env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    for name, total in totals.items():
        assert steps_written(tmp_path / f"{name}.txt") == list(range(total)), name
        assert report["jobs"][name]["status"] == "done" and report["jobs"][name]["steps_done"] == total
    assert report["rounds"] >= 2 and "utilization" in run.stderr
    assert_no_device_overlap(tmp_path / "state.db.d")


def test_elastic_jobs_resize_on_ray_with_every_step_once_and_the_models_batch(tmp_path: Path,
                                                                              ray_address: str) -> None:
    """`allocopt run --policy sia --executor ray`: one actor per rank, the job resized between rounds, every
    step once across the launches, each launch's batch the one the goodput engine chose."""
    out = tmp_path / "grow"
    out.mkdir()
    jobs = [{"name": "grow", "command": [sys.executable, str(JOBS_DIR / "elastic_steps.py"), str(out), "--grad-sqr",
                                         "1", "--grad-var", "20"],
             "total_steps": 10 ** 6, "batch_size": 16, "max_batch_size": 256, "max_local_bsz": 64}]
    (tmp_path / "jobs.json").write_text(json.dumps({"jobs": jobs}))
    run = subprocess.run([sys.executable, "-m", "allocopt", "run", str(tmp_path / "jobs.json"), "--cluster", "cpu=4",
                          "--policy", "sia", "--round-seconds", "1.5", "--max-rounds", "4", "--grace-s", "1",
                          "--state", str(tmp_path / "state.db"), "--executor", "ray", "--ray-address", ray_address],
                         env=repo_env(), capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    with sqlite3.connect(tmp_path / "state.db") as con:
        leases = [json.loads(row[0])[0] for row in con.execute("SELECT leases FROM rounds ORDER BY idx")]
    sizes = [len(lease[2]) for lease in leases]
    assert sizes[0] == 1 and max(sizes) > 1, sizes  # resized
    launches = elastic_launches(out)
    started = [lease for lease in leases if not lease[3]]
    assert len(launches) == len(started)
    pids = set()
    for lease, launch in zip(started, launches):
        assert sorted(launch) == list(range(len(lease[2])))  # one rank per device, each in its own process
        for doc in launch.values():
            assert doc["world_size"] == len(lease[2])
            assert {k: doc[k] for k in ("batch_size", "local_bsz", "accum_steps", "lr_scale")} == lease[4]["batch"]
            assert doc["steps"] == launch[0]["steps"]
            pids.add(doc["pid"])
    ran = [s for launch in launches for s in launch[0]["steps"]]
    assert ran == list(range(report["jobs"]["grow"]["steps_done"])) and ran
    assert len(pids) == sum(len(lease[2]) for lease in started)
    assert_no_device_overlap(tmp_path / "state.db.d")


def _kill_actor_when_running(out: Path, rank: int, killed: list[int]) -> threading.Thread:
    """A thread that, once a launch of the elastic_steps job in ``out`` newer than the thread has logged 3
    steps on ``rank``, SIGKILLs that rank's actor (the Ray worker process, as when its node is lost); appends
    the actor's pid to ``killed``."""
    before = set(out.glob(f"launch-e*-r{rank}.json"))

    def kill() -> None:
        limit = time.time() + 20.0
        while time.time() < limit:
            for doc in set(out.glob(f"launch-e*-r{rank}.json")) - before:
                steps = out / doc.name.replace("launch-", "steps-").replace(".json", ".txt")
                if steps.exists() and len(steps.read_text().split()) >= 3:
                    pid = json.loads(doc.read_text())["pid"]
                    actor = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
                    os.kill(actor, signal.SIGKILL)
                    killed.append(actor)
                    return
            time.sleep(0.02)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


def test_elastic_job_losing_a_ranks_actor_mid_round_resumes_next_round_with_every_step_once(
        tmp_path: Path, ex: RayExecutor) -> None:
    """A rank's Ray worker killed mid-round (as a lost node): the job's other ranks are stopped, the round's
    work after the last checkpoint is lost only, the job resumes next round on the actor Ray restarted, and
    losses do not count against the job's retries (more of them than ``max_retries``)."""
    out = tmp_path / "e"
    out.mkdir()
    _add(ex, {"e": JobSpec("e", [sys.executable, str(JOBS_DIR / "elastic_steps.py"), str(out)], 10 ** 6)})
    batch = BatchSettings(32, 16, 0, 1.0)
    results, killed = [], []
    for k in range(ex.max_retries + 2):
        lost = k <= ex.max_retries  # a rank's actor is killed in each round but the last
        killer = _kill_actor_when_running(out, k % 2, killed) if lost else None
        [r] = ex.run_round(_plan(k, 8.0, Lease("e", "cpu", (0, 1), 8.0, max_steps=None if lost else 20,
                                                        extended=k > 0, batch=batch)))
        if killer is not None:
            killer.join()
        results.append(r)
    _stop_all(ex, len(results))
    assert len(killed) == ex.max_retries + 1
    for r in results[:-1]:  # the loss ends the launch: preempted, not failed
        assert r.outcome is RoundOutcome.PREEMPTED and "lost" in r.message and r.restarted, r
    # its 20 steps, and those the lost launch checkpointed after its progress file last showed (StepLedger)
    assert results[-1].outcome is RoundOutcome.PREEMPTED and results[-1].restarted and results[-1].steps >= 20
    assert ex.failed("e") is None
    launches = elastic_launches(out)
    assert len(launches) == len(results)  # one launch per round: no retry within a round
    committed = [s for launch in launches for s in launch[0]["steps"]]  # rank 0 logs with its checkpoint
    assert committed == list(range(ex.checkpointed_steps("e"))) and len(committed) >= 3 * len(results)
    assert sum(r.steps for r in results) == len(committed)
    last = launches[-1]  # the launch nobody killed: its ranks ran the same steps
    assert last[1]["steps"] == last[0]["steps"]
    assert_no_device_overlap(ex.work_dir)
