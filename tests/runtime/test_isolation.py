"""One job's problems stay that job's: bad fields, bad commands, jobs that stop early or never use
the client, colliding names; and the `allocopt run` conveniences (its Python, thread limits,
--retry-failed, Ctrl-C, the default state location)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocopt.cluster import Cluster
from allocopt.errors import DataFileError, InvalidProblemError
from allocopt.runtime.devices import cpu_devices
from allocopt.runtime.local import JobSpec, LocalExecutor, cpu_threads
from allocopt.runtime.loop import JobConfig, Scheduler, StateStore, load_jobs
from tests.runtime.helpers import (COUNT_STEPS, count_steps_command, interruptible, marked_processes, repo_env,
                                   steps_written)


def _write(tmp_path: Path, jobs: list[dict], name: str = "jobs.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"jobs": jobs}))
    return path


def test_bad_fields_fail_their_job_only(tmp_path: Path) -> None:
    good = {"name": "ok", "command": ["true"], "total_steps": 5}
    bad = {"neg": {"total_steps": -5}, "text": {"total_steps": "abc"}, "huge": {"total_steps": 1e300},
           "frac": {"total_steps": 2.5}, "sf": {"scale_factor": 0}, "w": {"priority_weight": float("nan")},
           "cmd": {"command": []}, "env": {"env": {"A": [1]}}, "tp": {"throughputs": {"cpu": -1}},
           ".": {}, "..": {}}
    path = _write(tmp_path, [good] + [{**good, "name": n, **fields} for n, fields in bad.items()])
    invalid: dict[str, str] = {}
    jobs = load_jobs(path, invalid=invalid)
    assert [j.name for j in jobs] == ["ok"] and set(invalid) == set(bad)
    assert "'neg': total_steps must be an integer" in invalid["neg"] and "-5" in invalid["neg"]
    assert str(path) in invalid["neg"] and "scale_factor" in invalid["sf"] and "cannot name" in invalid[".."]
    with pytest.raises(InvalidProblemError, match="total_steps"):
        load_jobs(path)  # without `invalid`, the first bad job raises


@pytest.mark.parametrize("names", [["team a", "team_a"], ["x/y", "x_y"], ["a", "a"]])
def test_names_sharing_a_job_directory_are_rejected_naming_both(tmp_path: Path, names: list[str]) -> None:
    path = _write(tmp_path, [{"name": n, "command": "true", "total_steps": 1} for n in names])
    with pytest.raises(InvalidProblemError, match=f"'{names[0]}' and '{names[1]}'"):
        load_jobs(path, invalid={})
    ex = LocalExecutor({}, cpu_devices(1), tmp_path / "rt")
    ex.add_job("team a", JobSpec("team a", "true", 1))
    with pytest.raises(InvalidProblemError, match="'team a' and 'team_a'"):
        ex.add_job("team_a", JobSpec("team_a", "true", 1))


def test_unstartable_early_and_clientless_jobs_fail_after_bounded_launches(tmp_path: Path) -> None:
    jobs = [JobConfig("ok", count_steps_command(tmp_path / "ok.txt"), 60),
            JobConfig("typo", ["/usr/bin/pythn3", COUNT_STEPS, str(tmp_path / "t.txt")], 60),
            JobConfig("noclient", ["true"], 60),
            JobConfig("early", count_steps_command(tmp_path / "early.txt", "--return-at", "10"), 1000)]
    executor = LocalExecutor({}, cpu_devices(2), tmp_path / "rt", max_retries=2, retry_backoff_s=0.05)
    state = StateStore(tmp_path / "state.db")
    report = Scheduler(jobs, Cluster({"cpu": 2}), executor, state, round_seconds=2.0, out=None).run(max_rounds=8)
    state.close()
    j = report["jobs"]
    assert j["ok"]["status"] == "done" and steps_written(tmp_path / "ok.txt") == list(range(60))
    assert j["typo"]["status"] == "failed" and "cannot start" in j["typo"]["message"]
    assert "pythn3" in j["typo"]["message"] and "No such file" in j["typo"]["message"]
    assert j["noclient"]["status"] == "failed" and "without reporting any progress" in j["noclient"]["message"]
    assert j["early"]["status"] == "failed" and "at step 10 of 1000" in j["early"]["message"]
    for name in ("typo", "noclient", "early"):
        assert "failed 3 times" in j[name]["message"], j[name]["message"]  # 1 launch + max_retries, then stop
    assert steps_written(tmp_path / "early.txt") == list(range(10))  # resumed from its checkpoint, no repeats


def _run(tmp_path: Path, jobs_file: Path, *extra: str, env: dict | None = None,
         timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "allocopt", "run", str(jobs_file), "--cluster", "cpu=2",
                           "--round-seconds", "1", "--grace-s", "1", "--max-retries", "0", *extra],
                          env=env or repo_env(), capture_output=True, text=True, timeout=timeout)


def test_allocopt_run_reports_bad_jobs_and_retries_failed_ones_on_request(tmp_path: Path) -> None:
    state = ["--state", str(tmp_path / "s.db")]
    first = _write(tmp_path, [
        {"name": "ok", "command": count_steps_command(tmp_path / "ok.txt"), "total_steps": 40},
        {"name": "flaky", "command": count_steps_command(tmp_path / "flaky.txt", "--crash-at", "7"),
         "total_steps": 30},
        {"name": "neg", "command": "true", "total_steps": -5},
        {"name": "typo", "command": ["/usr/bin/pythn3", "job.py"], "total_steps": 10}])
    run = _run(tmp_path, first, *state)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    report = json.loads(run.stdout)["jobs"]
    assert report["ok"]["status"] == "done" and steps_written(tmp_path / "ok.txt") == list(range(40))
    assert {n: report[n]["status"] for n in ("flaky", "neg", "typo")} == dict.fromkeys(("flaky", "neg", "typo"),
                                                                                     "failed")
    assert "total_steps" in report["neg"]["message"] and "--retry-failed" in run.stderr
    fixed = _write(tmp_path, [
        {"name": "ok", "command": count_steps_command(tmp_path / "ok.txt"), "total_steps": 40},
        {"name": "flaky", "command": count_steps_command(tmp_path / "flaky.txt"), "total_steps": 30}], "fixed.json")
    again = _run(tmp_path, fixed, *state)
    assert again.returncode == 1 and "flaky failed in an earlier run" in again.stderr
    assert "--retry-failed" in again.stderr and json.loads(again.stdout)["jobs"]["flaky"]["status"] == "failed"
    retried = _run(tmp_path, fixed, *state, "--retry-failed")
    report = json.loads(retried.stdout)["jobs"]
    assert report["flaky"]["status"] == "done" and report["ok"]["status"] == "done"
    assert report["typo"]["status"] == "failed" and retried.returncode == 1  # journaled, retried, still a typo
    assert steps_written(tmp_path / "flaky.txt") == list(range(30))  # resumed at step 7, nothing repeated


def test_jobs_run_with_the_schedulers_python_and_a_thread_share(tmp_path: Path) -> None:
    envs = tmp_path / "env"
    command = ["python", COUNT_STEPS, str(tmp_path / "a.txt"), "--env-out", str(envs)]
    jobs = {"a": JobSpec("a", command, 3, env={"PATH": "/nonexistent"}),
            "b": JobSpec("b", ["python", COUNT_STEPS, str(tmp_path / "b.txt"), "--env-out", f"{envs}b"], 3,
                         env={"OMP_NUM_THREADS": "7"})}
    from allocopt.runtime import Lease, RoundPlan
    ex = LocalExecutor(jobs, cpu_devices(2), tmp_path / "rt")
    ex.run_round(RoundPlan(0, 0.0, 10.0, (Lease("a", "cpu", (0,), 10.0), Lease("b", "cpu", (1,), 10.0))))
    ex.close()
    a, b = (json.loads(Path(f"{p}.0").read_text()) for p in (envs, f"{envs}b"))
    assert a["executable"] == sys.executable  # bare `python` is the scheduler's, whatever PATH says
    share = str(cpu_threads(2))
    assert a["env"]["OMP_NUM_THREADS"] == a["env"]["MKL_NUM_THREADS"] == a["env"]["ALLOCOPT_NUM_THREADS"] == share
    assert b["env"]["OMP_NUM_THREADS"] == "7"  # the job's own setting wins


def test_ctrl_c_stops_the_jobs_with_one_line_and_the_rerun_resumes(tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    jobs_file = _write(tmp_path, [{"name": n, "command": count_steps_command(tmp_path / f"{n}.txt"),
                                   "total_steps": 400, "env": {"ALLOCOPT_TEST_MARK": mark}} for n in ("a", "b")])
    env = {**repo_env(), "XDG_STATE_HOME": str(tmp_path / "xdg")}  # no --state: the default location
    proc = subprocess.Popen([sys.executable, "-m", "allocopt", "run", str(jobs_file), "--cluster", "cpu=2",
                             "--round-seconds", "1", "--grace-s", "1"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=interruptible)
    limit = time.time() + 30
    while not (steps_written(tmp_path / "a.txt") and steps_written(tmp_path / "b.txt")) and time.time() < limit:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith("allocopt: interrupted")
    assert marked_processes(mark) == []
    journals = list((tmp_path / "xdg" / "allocopt").glob("jobs-*.db"))
    assert len(journals) == 1 and not (tmp_path / "jobs.json.d").exists()
    rerun = subprocess.run([sys.executable, "-m", "allocopt", "run", str(jobs_file), "--cluster", "cpu=2",
                            "--round-seconds", "1"], env=env, capture_output=True, text=True, timeout=90)
    assert rerun.returncode == 0, rerun.stderr
    for n in ("a", "b"):
        assert steps_written(tmp_path / f"{n}.txt") == list(range(400))
    assert os.stat(journals[0]).st_mode & 0o777 == 0o600


@pytest.mark.parametrize("text", ["jobs: [\n\t- a", "jobs: [{name: a, command: x, total_steps: 1}", "[1, 2]",
                                  "jobs: {}", "\x00\x01\x02", "jobs: [" * 5000])
def test_malformed_job_files_are_typed_errors(tmp_path: Path, text: str) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text(text)
    with pytest.raises((InvalidProblemError, DataFileError), match=re.escape(str(path))):
        load_jobs(path, invalid={})


def test_an_entry_that_is_not_a_mapping_is_that_entrys_error(tmp_path: Path) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text("jobs:\n  - 5\n  - {name: ok, command: 'true', total_steps: 1}\n")
    invalid: dict[str, str] = {}
    assert [j.name for j in load_jobs(path, invalid=invalid)] == ["ok"] and "job 0" in invalid["#0"]


def test_binary_job_file_is_a_typed_error(tmp_path: Path) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(DataFileError, match=re.escape(f"{path}, line 1: binary data")):
        load_jobs(path)


scalars = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**30), st.floats(allow_nan=True),
                    st.text(max_size=8))
entries = st.dictionaries(st.sampled_from(["name", "command", "total_steps", "scale_factor", "priority_weight",
                                           "throughputs", "gpu_types", "env", "bogus"]),
                          st.one_of(scalars, st.lists(scalars, max_size=3),
                                    st.dictionaries(st.text(max_size=4), scalars, max_size=3)), max_size=9)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(entries, min_size=1, max_size=4))
def test_any_job_entries_load_or_fail_with_a_typed_error(tmp_path: Path, jobs: list[dict]) -> None:
    path = tmp_path / "jobs.json"
    path.write_text(json.dumps({"jobs": jobs}))
    invalid: dict[str, str] = {}
    try:
        loaded = load_jobs(path, invalid=invalid)
    except (InvalidProblemError, DataFileError):
        return
    assert len(loaded) + len(invalid) == len(jobs)
    for job in loaded:
        assert 1 <= job.total_steps and job.scale_factor >= 1 and job.priority_weight > 0
        assert all(isinstance(v, str) for v in job.env.values())
