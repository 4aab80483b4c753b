"""Fault injection with real schedulers and real job processes: exactly-once progress.

The scheduler (`allocopt run`) is SIGKILLed right after it forks a job, by a child before the
child arms its death signal, and at random points; the jobs fork (a shell command line, a
launcher running the job as its child, an orphan escaping into its own session). After a restart
on the same state every job's step log holds each step exactly once and no process of any job
is left. The long version (100+ kills) is benchmarks/reliability.py.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from allocopt.runtime import client
from allocopt.runtime.fence import STALE_EXIT_STATUS, StaleLeaseError, issue_epoch
from tests.runtime.helpers import JOBS_DIR, count_steps_command, marked_processes, repo_env, steps_written

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process trees are found in /proc")

TOTALS = {"plain": 240, "shell": 200, "launcher": 220}


def _job_file(tmp_path: Path, mark: str) -> Path:
    """Three jobs on two cpu devices: a plain one, a shell command line that forks the job, and a
    launcher that runs the job as its child and leaves an orphan in a session of its own."""
    cmds = {"plain": count_steps_command(tmp_path / "plain.txt"),
            "shell": shlex.join(count_steps_command(tmp_path / "shell.txt")) + "; true",
            "launcher": [sys.executable, str(JOBS_DIR / "launcher.py"), "--orphan", "--",
                         *count_steps_command(tmp_path / "launcher.txt")]}
    jobs = [{"name": n, "command": cmds[n], "total_steps": t, "throughputs": {"cpu": 150.0},
             "env": {"ALLOCOPT_TEST_MARK": mark}} for n, t in TOTALS.items()]
    path = tmp_path / "jobs.json"
    path.write_text(json.dumps({"jobs": jobs}))
    return path


def _args(tmp_path: Path, jobs_file: Path) -> list[str]:
    return [str(jobs_file), "--cluster", "cpu=2", "--round-seconds", "1", "--state", str(tmp_path / "state.db"),
            "--grace-s", "1"]


def _wait_gone(mark: str, timeout_s: float) -> list[int]:
    limit = time.time() + timeout_s
    while (left := marked_processes(mark)) and time.time() < limit:
        time.sleep(0.05)
    return left


def _finish(tmp_path: Path, jobs_file: Path, mark: str) -> None:
    """Restart on the same state: every job finishes with each step exactly once, nothing left over."""
    run = subprocess.run([sys.executable, "-m", "allocopt", "run", *_args(tmp_path, jobs_file)], env=repo_env(),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    for name, total in TOTALS.items():
        assert steps_written(tmp_path / f"{name}.txt") == list(range(total)), name
    assert _wait_gone(mark, 5.0) == []


def _cleanup(mark: str) -> None:
    for pid in marked_processes(mark):
        os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("nth", [1, 3])
def test_scheduler_killed_right_after_fork(tmp_path: Path, nth: int) -> None:
    mark = uuid.uuid4().hex
    jobs_file = _job_file(tmp_path, mark)
    try:
        killed = subprocess.run([sys.executable, str(JOBS_DIR / "fault_scheduler.py"), "after-fork", str(nth),
                                 *_args(tmp_path, jobs_file)], env=repo_env(), capture_output=True, timeout=60)
        assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()
        _finish(tmp_path, jobs_file, mark)
    finally:
        _cleanup(mark)


def test_child_whose_scheduler_died_before_its_death_signal_exits(tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    jobs_file = _job_file(tmp_path, mark)
    try:
        killed = subprocess.run([sys.executable, str(JOBS_DIR / "fault_scheduler.py"), "before-death-signal", "1",
                                 *_args(tmp_path, jobs_file)], env=repo_env(), capture_output=True, timeout=60)
        assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()
        assert _wait_gone(mark, 3.0) == []
        # the child saw its parent gone after arming the death signal and exited before exec: no job started
        progress = list((tmp_path / "state.db.d" / "jobs").glob("*/progress-e*-rank*.jsonl"))
        assert progress and all(p.read_text() == "" for p in progress)
        _finish(tmp_path, jobs_file, mark)
    finally:
        _cleanup(mark)


def test_scheduler_killed_at_random_points_with_forking_jobs(tmp_path: Path) -> None:
    mark, rng = uuid.uuid4().hex, random.Random(7)
    jobs_file = _job_file(tmp_path, mark)
    try:
        for _ in range(3):
            run = subprocess.Popen([sys.executable, "-m", "allocopt", "run", *_args(tmp_path, jobs_file)],
                                   env=repo_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(rng.uniform(0.3, 2.5))
            run.send_signal(signal.SIGKILL)
            run.wait()
            # no job process outlives its scheduler, not even the orphan that never uses the client: the
            # executor's watchdog kills the journaled trees, and the client stops on its own
            left = _wait_gone(mark, 5.0)
            assert left == [], [_cmdline(p) for p in left]
        _finish(tmp_path, jobs_file, mark)
    finally:
        _cleanup(mark)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_stale_copy_is_refused_at_its_next_commit(tmp_path: Path) -> None:
    """A copy that escaped containment (started by hand here) commits nothing once a new epoch is issued."""
    job_dir, out = tmp_path / "job", tmp_path / "out.txt"
    epoch = issue_epoch(str(job_dir))
    env = {**repo_env(), "ALLOCOPT_CHECKPOINT_DIR": str(job_dir / "checkpoints"), "ALLOCOPT_TOTAL_STEPS": "100000",
           "ALLOCOPT_EPOCH": str(epoch), "ALLOCOPT_FENCE_DIR": str(job_dir)}
    proc = subprocess.Popen(count_steps_command(out, "--sleep-s", "0.01"), env=env)
    limit = time.time() + 20
    while len(steps_written(out)) < 5 and time.time() < limit:
        time.sleep(0.01)
    issue_epoch(str(job_dir))  # the lease moved on
    assert proc.wait(timeout=10) == STALE_EXIT_STATUS
    written = steps_written(out)
    time.sleep(0.2)
    assert steps_written(out) == written == list(range(len(written))) and len(written) >= 5
    env["ALLOCOPT_EPOCH"] = "1"
    monkey = dict(os.environ)
    try:
        os.environ.update({k: env[k] for k in ("ALLOCOPT_CHECKPOINT_DIR", "ALLOCOPT_EPOCH", "ALLOCOPT_FENCE_DIR")})
        assert client.load_checkpoint()["step"] == len(written)  # the last commit is the last line written
        with pytest.raises(StaleLeaseError):
            client.save_checkpoint({"step": 10_000})
        assert client.load_checkpoint()["step"] == len(written)
    finally:
        os.environ.clear()
        os.environ.update(monkey)


def test_process_tree_is_found_and_killed_whole_after_its_leader_died(tmp_path: Path) -> None:
    """A shell whose children stay in its session, one escaping into a session of its own; the leader
    is killed first: the tree (session members, token holders) is still found and killed whole."""
    from allocopt.runtime.local import start_process
    from allocopt.runtime.procs import ProcessTree, start_ticks

    mark = uuid.uuid4().hex
    env = {**os.environ, "ALLOCOPT_TEST_MARK": mark}
    proc, token = start_process("sleep 600 & setsid sleep 601 & wait", env, None, tmp_path / "log")
    tree = ProcessTree(proc.pid, start_ticks(proc.pid), token)
    limit = time.time() + 10
    while len(marked_processes(mark)) < 3 and time.time() < limit:
        time.sleep(0.01)
    assert len(marked_processes(mark)) == 3  # the shell and its two sleeps
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    survivors = marked_processes(mark)
    assert len(survivors) == 2 and {p.pid for p in tree.members()} >= set(survivors)
    assert ProcessTree(None, None, token).alive()  # found by the launch token alone, as after a restart
    tree.kill(timeout_s=10)
    assert marked_processes(mark) == [] and not tree.alive()


def test_orphan_that_never_uses_the_client_dies_with_its_scheduler(tmp_path: Path) -> None:
    """No restart needed: the executor's watchdog kills the journaled trees once the executor is gone."""
    mark = uuid.uuid4().hex
    jobs_file = _job_file(tmp_path, mark)
    run = subprocess.Popen([sys.executable, "-m", "allocopt", "run", str(jobs_file), "--cluster", "cpu=3",
                            "--round-seconds", "30", "--state", str(tmp_path / "state.db")],
                           env=repo_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        limit = time.time() + 30
        while not any("sleep 600" in _cmdline(p) for p in marked_processes(mark)) and time.time() < limit:
            time.sleep(0.05)
        orphans = [p for p in marked_processes(mark) if "sleep 600" in _cmdline(p)]
        assert orphans, "the launcher job did not start its orphan"
        run.send_signal(signal.SIGKILL)
        run.wait()
        left = _wait_gone(mark, 5.0)
        assert left == [], [(p, _cmdline(p), Path(f"/proc/{p}/stat").read_text()) for p in left]
    finally:
        run.kill()
        _cleanup(mark)
