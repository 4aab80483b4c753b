"""LocalExecutor with real subprocesses on cpu pseudo-devices."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from allocopt.errors import InvalidProblemError
from allocopt.runtime import Lease, RoundOutcome, RoundPlan
from allocopt.runtime.devices import cpu_devices
from allocopt.runtime.executor import BatchSettings
from allocopt.runtime.local import JobSpec, LocalExecutor
from allocopt.throughput.online import ThroughputEstimator
from tests.runtime.helpers import (JOBS_DIR, assert_no_device_overlap, count_steps_command, elastic_launches,
                                   steps_written)


def _plan(index: int, seconds: float, *leases: Lease) -> RoundPlan:
    return RoundPlan(index, 0.0, seconds, tuple(leases))


def _lease(job: str, ids: tuple[int, ...], seconds: float, *, extended: bool = False,
           max_steps: int | None = None) -> Lease:
    return Lease(job, "cpu", ids, seconds, max_steps=max_steps, extended=extended)


def test_jobs_get_their_environment_and_devices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALLOCOPT_TEST_INHERITED", "yes")
    envs = tmp_path / "env"
    jobs = {"a": JobSpec("a", count_steps_command(tmp_path / "a.txt", "--env-out", str(envs)), 10_000,
                         env={"EXTRA": "1"})}
    ex = LocalExecutor(jobs, cpu_devices(3), tmp_path / "rt")
    [result] = ex.run_round(_plan(0, 8.0, _lease("a", (1, 2), 8.0, max_steps=5)))
    ex.close()
    seen = [json.loads(Path(f"{envs}.{r}").read_text()) for r in (0, 1)]
    for rank, info in enumerate(seen):
        env = info["env"]
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == (str(rank), str(rank), "2")
        assert env["CUDA_VISIBLE_DEVICES"] == "" and env["ALLOCOPT_DEVICES"] == "1,2"
        assert env["ALLOCOPT_GPU_TYPE"] == "cpu" and env["ALLOCOPT_MAX_STEPS"] == "5"
        assert env["ALLOCOPT_TOTAL_STEPS"] == "10000" and env["ALLOCOPT_JOB_ID"] == "a"
        assert env["ALLOCOPT_CHECKPOINT_DIR"] == str(ex.checkpoint_dir("a"))
        assert env["ALLOCOPT_TEST_INHERITED"] == "yes" and env["EXTRA"] == "1"
        assert float(env["ALLOCOPT_LEASE_END"]) > time.time() - 60
        assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0
    assert seen[0]["env"]["MASTER_PORT"] == seen[1]["env"]["MASTER_PORT"]
    assert seen[0]["pid"] != seen[1]["pid"]
    # the step limit of the lease ended the round: exactly 5 steps, paused at step 5, then stopped at close
    assert result.outcome is RoundOutcome.PREEMPTED and result.steps == 5
    assert steps_written(tmp_path / "a.txt") == list(range(5)) and ex.checkpointed_steps("a") == 5
    events = [json.loads(x) for x in ex.progress_file("a", 0).read_text().splitlines()]
    assert [e["step"] for e in events if e["event"] == "paused"] == [5]


def test_preempted_job_resumes_from_its_checkpoint_without_lost_or_repeated_steps(tmp_path: Path) -> None:
    out = tmp_path / "a.txt"
    jobs = {"a": JobSpec("a", count_steps_command(out, "--sleep-s", "0.003"), 200)}
    ex = LocalExecutor(jobs, cpu_devices(2), tmp_path / "rt", estimator=(est := ThroughputEstimator(None, ["cpu"])))
    est.add_job("a")
    total, rounds, device = 0, 0, 0
    while rounds < 8:
        # a moves between devices every round, so it is stopped and restarted; its leases end after 70 steps
        lease = _lease("a", (device,), 8.0, max_steps=70)
        results = {r.job_id: r for r in ex.run_round(_plan(rounds, 8.0, lease))}
        assert results["a"].steps == min(70, 200 - total)
        total += results["a"].steps
        rounds += 1
        device = 1 - device
        if results["a"].outcome is RoundOutcome.COMPLETED:
            break
        assert results["a"].outcome is RoundOutcome.PREEMPTED and results["a"].restarted
    ex.close()
    assert results["a"].outcome is RoundOutcome.COMPLETED and rounds == 3
    assert steps_written(out) == list(range(200)) and total == 200
    assert est.measured_mask(["a"], ["cpu"])[0, 0] and est.estimate("a", "cpu") > 0
    assert_no_device_overlap(tmp_path / "rt")


def test_crashing_job_is_retried_then_marked_failed(tmp_path: Path) -> None:
    jobs = {"c": JobSpec("c", count_steps_command(tmp_path / "c.txt", "--crash-at", "3"), 100)}
    ex = LocalExecutor(jobs, cpu_devices(1), tmp_path / "rt", max_retries=2, retry_backoff_s=0.05)
    [r] = ex.run_round(_plan(0, 12.0, _lease("c", (0,), 12.0)))
    assert r.outcome is RoundOutcome.FAILED and "failed 3 times" in r.message and "[3]" in r.message
    assert ex.stats.retries == 2 and ex.stats.launches == 3 and ex.failed("c")
    assert steps_written(tmp_path / "c.txt") == [0, 1, 2]  # retries resumed from the checkpoint
    [again] = ex.run_round(_plan(1, 1.0, _lease("c", (0,), 1.0)))
    assert again.outcome is RoundOutcome.FAILED and ex.stats.launches == 3
    assert ex.held_jobs == ()


def test_job_ignoring_the_stop_request_is_killed_within_the_grace_period(tmp_path: Path) -> None:
    envs = tmp_path / "env"
    jobs = {"x": JobSpec("x", count_steps_command(tmp_path / "x.txt", "--ignore-stop", "--env-out", str(envs)), 10)}
    grace_s = 1.0
    ex = LocalExecutor(jobs, cpu_devices(1), tmp_path / "rt", grace_s=grace_s)
    [r] = ex.run_round(_plan(0, 0.5, _lease("x", (0,), 0.5)))
    pid = json.loads(Path(f"{envs}.0").read_text())["pid"]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert r.outcome is RoundOutcome.PREEMPTED and ex.held_jobs == ()  # SIGKILL ended it: SIGTERM is ignored


def test_lease_extension_keeps_the_same_process(tmp_path: Path) -> None:
    out = tmp_path / "a.txt"
    jobs = {"a": JobSpec("a", count_steps_command(out), 100_000)}
    ex = LocalExecutor(jobs, cpu_devices(1), tmp_path / "rt")
    results = [ex.run_round(_plan(k, 1.0, _lease("a", (0,), 1.0, extended=k > 0)))[0] for k in range(4)]
    progress = ex.progress_file("a", 0)
    starts = [json.loads(x) for x in progress.read_text().splitlines() if '"start"' in x]
    ex.close()
    assert len(starts) == 1 and [r.restarted for r in results] == [True, False, False, False]
    assert ex.stats.extension_fraction == 0.75 and ex.stats.launches == 1
    assert all(r.steps > 0 and r.measured_steps_per_s for r in results[1:])
    assert steps_written(out) == list(range(sum(r.steps for r in results)))


def test_two_jobs_never_hold_a_device_at_once(tmp_path: Path) -> None:
    jobs = {n: JobSpec(n, count_steps_command(tmp_path / f"{n}.txt"), 100_000) for n in "abc"}
    ex = LocalExecutor(jobs, cpu_devices(2), tmp_path / "rt")
    order = "abc"
    for k in range(4):  # three jobs rotate over two devices
        first, second = order[k % 3], order[(k + 1) % 3]
        ex.run_round(_plan(k, 1.0, _lease(first, (0,), 1.0), _lease(second, (1,), 1.0)))
    ex.close()
    intervals = assert_no_device_overlap(tmp_path / "rt")
    assert len(intervals) >= 6
    for n in "abc":  # stopped at time-based lease ends and restarted on another device: no step lost or repeated
        written = steps_written(tmp_path / f"{n}.txt")
        assert written == list(range(len(written)))
    with pytest.raises(InvalidProblemError, match="leased to both"):
        ex.run_round(_plan(9, 0.4, _lease("a", (0,), 0.4), _lease("b", (0,), 0.4)))


def test_ranks_of_a_job_pause_extend_and_stop_at_the_same_step(tmp_path: Path) -> None:
    out = tmp_path / "a.txt"
    jobs = {"a": JobSpec("a", count_steps_command(out), 100_000)}
    ex = LocalExecutor(jobs, cpu_devices(2), tmp_path / "rt")
    results = []
    for k in range(3):  # time-based lease ends; the second and third rounds extend the lease
        results.append(ex.run_round(_plan(k, 2.0, _lease("a", (0, 1), 2.0, extended=k > 0)))[0])
    ex.close()
    exits = [json.loads(x) for r in (0, 1) for x in ex.progress_file("a", r).read_text()
             .splitlines() if '"exit"' in x]
    pauses = [[json.loads(x)["step"] for x in ex.progress_file("a", r).read_text()
               .splitlines() if '"paused"' in x] for r in (0, 1)]
    assert len(exits) == 2 and exits[0]["step"] == exits[1]["step"] == len(steps_written(out))
    assert pauses[0] == pauses[1] and len(pauses[0]) == 3  # every rank paused at the same step
    assert [r.restarted for r in results] == [True, False, False] and results[2].steps > 0


def test_elastic_rank_killed_mid_round_resumes_from_the_checkpoint_with_every_step_once(tmp_path: Path) -> None:
    """A rank of a two-rank elastic job SIGKILLed mid-round: the job's other rank is stopped, the job is
    restarted from its checkpoint (a retry), and the committed step log holds every step once."""
    out = tmp_path / "e"
    out.mkdir()
    jobs = {"e": JobSpec("e", [sys.executable, str(JOBS_DIR / "elastic_steps.py"), str(out)], 10 ** 6)}
    ex = LocalExecutor(jobs, cpu_devices(2), tmp_path / "rt", grace_s=1.0, retry_backoff_s=0.05)
    killed: list[int] = []

    def kill_rank_1() -> None:  # once rank 1 logged 3 steps
        limit = time.time() + 20.0
        while time.time() < limit and not killed:
            for doc in out.glob("launch-e*-r1.json"):
                steps = out / doc.name.replace("launch-", "steps-").replace(".json", ".txt")
                if steps.exists() and len(steps.read_text().split()) >= 3:
                    killed.append(json.loads(doc.read_text())["pid"])
                    os.kill(killed[0], signal.SIGKILL)
                    break
            time.sleep(0.02)

    batch = BatchSettings(32, 16, 0, 1.0)
    killer = threading.Thread(target=kill_rank_1, daemon=True)
    killer.start()
    try:
        [first] = ex.run_round(_plan(0, 10.0, Lease("e", "cpu", (0, 1), 10.0, max_steps=40, batch=batch)))
        killer.join()
        [second] = ex.run_round(_plan(1, 10.0, Lease("e", "cpu", (0, 1), 10.0, max_steps=40, extended=True,
                                                     batch=batch)))
    finally:
        ex.close()
    assert killed and "crashed" in first.message and first.outcome is RoundOutcome.PREEMPTED
    assert not second.restarted and ex.failed("e") is None and ex.stats.retries == 1
    launches = elastic_launches(out)
    assert len(launches) == 2  # the launch killed and its restart, which the second round extended
    committed = [s for launch in launches for s in launch[0]["steps"]]  # rank 0 logs with its checkpoint
    assert committed == list(range(ex.checkpointed_steps("e"))) and len(committed) >= 3 + 80
    last = [launches[-1][rank]["steps"] for rank in (0, 1)]
    assert last[1] == last[0] and last[0][0] > 0  # the restart resumed from the checkpoint, not from step 0
    assert_no_device_overlap(ex.work_dir)
