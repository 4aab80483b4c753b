"""The scheduler loop: job files, and `allocopt run` end to end, killed and restarted."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from allocopt.cluster import Cluster
from allocopt.errors import InvalidProblemError
from allocopt.runtime.loop import load_jobs, parse_cluster
from tests.runtime.helpers import assert_no_device_overlap, count_steps_command, steps_written


def test_load_jobs_yaml_and_json(tmp_path: Path) -> None:
    (tmp_path / "j.yaml").write_text("jobs:\n  - {name: a, command: [echo, hi], total_steps: 5, "
                                     "throughputs: {cpu: 2.0}}\n  - name: b\n    command: echo b\n"
                                     "    total_steps: 3\n    scale_factor: 2\n    priority_weight: 2\n")
    a, b = load_jobs(tmp_path / "j.yaml")
    assert (a.name, a.command, a.total_steps, a.throughputs) == ("a", ["echo", "hi"], 5, {"cpu": 2.0})
    assert (b.scale_factor, b.priority_weight, b.command) == (2, 2.0, "echo b")
    (tmp_path / "j.json").write_text(json.dumps({"jobs": [{"name": "x", "command": "true", "total_steps": 1,
                                                           "bogus": 1}]}))
    with pytest.raises(InvalidProblemError, match="bogus"):
        load_jobs(tmp_path / "j.json")
    assert parse_cluster("a100=4, v100=2") == {"a100": 4, "v100": 2}
    with pytest.raises(InvalidProblemError):
        parse_cluster("cpu")


def _run_command(tmp_path: Path, jobs_file: Path) -> list[str]:
    return [sys.executable, "-m", "allocopt", "run", str(jobs_file), "--cluster", "cpu=2", "--round-seconds", "1.5",
            "--state", str(tmp_path / "state.db"), "--grace-s", "1"]


def _rounds(db: Path) -> int:
    try:
        with sqlite3.connect(db) as con:
            return int(con.execute("SELECT COUNT(*) FROM rounds").fetchone()[0])
    except sqlite3.Error:
        return 0


def test_scheduler_killed_and_restarted_finishes_every_job_exactly(tmp_path: Path) -> None:
    totals = {"a": 500, "b": 400, "c": 450}
    jobs = [{"name": n, "command": count_steps_command(tmp_path / f"{n}.txt"), "total_steps": t,
             "throughputs": {"cpu": 150.0}} for n, t in totals.items()]
    jobs_file = tmp_path / "jobs.json"
    jobs_file.write_text(json.dumps({"jobs": jobs}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                       os.environ.get("PYTHONPATH", "")])}
    first = subprocess.Popen(_run_command(tmp_path, jobs_file), env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    limit = time.time() + 20
    while _rounds(tmp_path / "state.db") < 1 and time.time() < limit and first.poll() is None:
        time.sleep(0.05)
    assert first.poll() is None, first.communicate()[1].decode()
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert any(len(steps_written(tmp_path / f"{n}.txt")) < t for n, t in totals.items())  # killed mid-way
    second = subprocess.run(_run_command(tmp_path, jobs_file), env=env, capture_output=True, text=True, timeout=60)
    assert second.returncode == 0, second.stderr
    report = json.loads(second.stdout)
    for name, total in totals.items():
        assert steps_written(tmp_path / f"{name}.txt") == list(range(total)), name
        job = report["jobs"][name]
        assert job["status"] == "done" and job["steps_done"] == total and job["jct_s"] > 0
    assert "round" in second.stderr and "utilization" in second.stderr
    assert_no_device_overlap(tmp_path / "state.db.d")


def test_crashing_job_is_marked_failed_and_the_others_finish(tmp_path: Path) -> None:
    from allocopt.runtime.devices import cpu_devices
    from allocopt.runtime.local import LocalExecutor
    from allocopt.runtime.loop import JobConfig, Scheduler, StateStore

    jobs = [JobConfig("ok", count_steps_command(tmp_path / "ok.txt"), 50),
            JobConfig("bad", count_steps_command(tmp_path / "bad.txt", "--crash-at", "5"), 50)]
    executor = LocalExecutor({}, cpu_devices(2), tmp_path / "rt", max_retries=1, retry_backoff_s=0.05)
    state = StateStore(tmp_path / "state.db")
    report = Scheduler(jobs, Cluster({"cpu": 2}), executor, state, round_seconds=5.0, out=None).run(max_rounds=4)
    assert report["jobs"]["ok"]["status"] == "done" and report["jobs"]["ok"]["steps_done"] == 50
    bad = report["jobs"]["bad"]
    assert bad["status"] == "failed" and "failed 2 times" in bad["message"] and bad["steps_done"] == 5
    state.close()  # the journal is held exclusively while open
    assert StateStore(tmp_path / "state.db").load()["bad"].status == "failed"  # journaled


def test_scheduler_rounds_come_from_the_engine(tmp_path: Path) -> None:
    from allocopt.runtime.devices import cpu_devices
    from allocopt.runtime.local import LocalExecutor
    from allocopt.runtime.loop import JobConfig, Scheduler, StateStore

    totals = {"a": 120, "b": 90, "c": 60}
    jobs = [JobConfig(n, count_steps_command(tmp_path / f"{n}.txt"), t, throughputs={"cpu": 100.0})
            for n, t in totals.items()]
    state = StateStore(tmp_path / "state.db")
    scheduler = Scheduler(jobs, Cluster({"cpu": 2}), LocalExecutor({}, cpu_devices(2), tmp_path / "rt"), state,
                          round_seconds=0.5, out=None)
    report = scheduler.run(max_rounds=40)
    assert all(report["jobs"][n]["status"] == "done" for n in totals) and len(scheduler.engine) == 0
    for name, total in totals.items():
        assert steps_written(tmp_path / f"{name}.txt") == list(range(total)), name
    leases = [json.loads(row[0]) for row in state.db.execute("SELECT leases FROM rounds ORDER BY idx")]
    assert {lease[0] for lease in leases[0]} < set(totals)  # three jobs, two devices: one waits in round 0
    assert all(len({g for lease in r for g in lease[2]}) == sum(len(lease[2]) for lease in r) for r in leases)
    assert_no_device_overlap(tmp_path / "rt")
    # a job too big for the cluster fails with a message; the others run (it used to stop the whole run)
    report = Scheduler([JobConfig("big", ["true"], 1, scale_factor=3),
                        JobConfig("ok", count_steps_command(tmp_path / "ok.txt"), 20)], Cluster({"cpu": 2}),
                       LocalExecutor({}, cpu_devices(2), tmp_path / "rt2"), StateStore(tmp_path / "s2.db"),
                       out=None).run(max_rounds=5)
    assert report["jobs"]["big"]["status"] == "failed" and "can run on none" in report["jobs"]["big"]["message"]
    assert report["jobs"]["ok"]["status"] == "done" and steps_written(tmp_path / "ok.txt") == list(range(20))


def test_restarted_scheduler_keeps_the_engines_round_state(tmp_path: Path) -> None:
    from allocopt.runtime.devices import cpu_devices
    from allocopt.runtime.local import LocalExecutor
    from allocopt.runtime.loop import JobConfig, Scheduler, StateStore

    jobs = [JobConfig(n, count_steps_command(tmp_path / f"{n}.txt"), 10_000, throughputs={"cpu": 100.0})
            for n in ("a", "b", "c")]

    def scheduler(policy: str = "max_min_fairness") -> Scheduler:
        return Scheduler(jobs, Cluster({"cpu": 2}), LocalExecutor({}, cpu_devices(2), tmp_path / "rt"),
                         StateStore(tmp_path / "state.db"), policy=policy, round_seconds=0.3, out=None)

    first = scheduler()
    first.run(max_rounds=3)
    first.state.close()  # the journal is held exclusively while open
    before = first.engine.to_json()["rounds"]
    assert before["round_index"] == 3
    second = scheduler()
    again = second.engine.to_json()["rounds"]
    second.state.close()
    second.executor.close()  # the work directory is held exclusively too
    assert again["round_index"] == 3 and again["jobs"] == before["jobs"] and again["pending"] == []
    assert scheduler("max_throughput").engine.to_json()["rounds"]["round_index"] == 0  # another policy: fresh
