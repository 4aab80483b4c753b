"""Placement and admission plug-ins in the executors' driver: the Engine's rounds and `allocopt run`."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from allocopt.cluster import Cluster
from allocopt.engine import Engine
from allocopt.errors import InvalidOptionError, InvalidProblemError
from tests.runtime.helpers import REPO, assert_no_device_overlap, count_steps_command, steps_written


def _servers(gpu_ids: tuple[int, ...] | list[int], per_node: int = 2) -> set[int]:
    return {g // per_node for g in gpu_ids}


def _lease(placement: str, job: str = "j", size: int = 2) -> tuple[int, ...]:
    engine = Engine(Cluster({"cpu": 4}, 2), placement=placement, round_seconds=10, recompute_min_seconds=0)
    engine.add_job(job, {"cpu": 1.0}, scale_factor=size)
    (lease,) = engine.next_round().leases
    return tuple(lease.gpu_ids)


def test_engine_rounds_follow_the_placement_policy() -> None:
    # two servers of two devices: best fit and packing keep a 2-GPU job on one server, scattered spreads it
    assert len(_servers(_lease("best_fit"))) == 1 and len(_servers(_lease("packing"))) == 1
    assert _servers(_lease("scattered")) == {0, 1}
    # consolidated: a skewed model (by the job id's prefix) takes whole servers, 3 GPUs on 2 servers
    assert _servers(_lease("consolidated", "vgg16-a", 3)) == {0, 1}
    with pytest.raises(InvalidOptionError, match="unknown placement policy 'nope'"):
        Engine({"cpu": 4}, placement="nope")


def test_consolidated_defers_a_skewed_job_without_whole_servers() -> None:
    engine = Engine(Cluster({"cpu": 4}, 2), placement="consolidated", round_seconds=10, recompute_min_seconds=0)
    engine.add_job("small", {"cpu": 1.0})
    (first,) = engine.next_round().leases
    engine.add_job("vgg16-big", {"cpu": 1.0}, scale_factor=3)
    leases = {lease.job_id: lease for lease in engine.next_round().leases}
    # small keeps its GPU, so no two whole servers are free: the skewed job waits (placed as best fit it would run)
    assert set(leases) == {"small"} and leases["small"].extended and leases["small"].gpu_ids == first.gpu_ids
    engine.remove_job("small")
    (lease,) = engine.next_round().leases
    assert lease.job_id == "vgg16-big" and _servers(lease.gpu_ids) == {0, 1}


def test_engine_state_keeps_the_placement_name() -> None:
    engine = Engine(Cluster({"cpu": 4}, 2), placement="scattered")
    document = engine.to_json()
    assert document["placement"] == "scattered"
    assert Engine.from_json(document).placement.name == "scattered"
    with pytest.raises(InvalidProblemError, match="placement"):
        Engine.from_json({**document, "placement": "nope"})


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])}


def _run(tmp_path: Path, tag: str, jobs: list[dict], *flags: str) -> tuple[subprocess.CompletedProcess, Path]:
    jobs_file = tmp_path / f"{tag}.json"
    jobs_file.write_text(json.dumps({"jobs": jobs}))
    state = tmp_path / f"{tag}.db"
    done = subprocess.run([sys.executable, "-m", "allocopt", "run", str(jobs_file), "--round-seconds", "1",
                           "--state", str(state), "--grace-s", "1", *flags], check=False, env=_env(), capture_output=True,
                          text=True, timeout=120)
    return done, state


def _leases(state: Path) -> list[dict[str, list[int]]]:
    with sqlite3.connect(state) as con:
        return [{lease[0]: lease[2] for lease in json.loads(row[0])}
                for row in con.execute("SELECT leases FROM rounds ORDER BY idx")]


def test_allocopt_run_places_by_the_named_policy(tmp_path: Path) -> None:
    """Two servers of two CPU pseudo-devices: a 2-device job runs on one server (best fit) or on both (scattered)."""
    servers = {}
    for placement in ("best_fit", "scattered"):
        out = tmp_path / f"{placement}.txt"
        job = {"name": "wide", "command": count_steps_command(out), "total_steps": 40, "scale_factor": 2,
               "throughputs": {"cpu": 100.0}}
        done, state = _run(tmp_path, placement, [job], "--cluster", "cpu=4", "--gpus-per-node", "cpu=2",
                           "--placement", placement)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["jobs"]["wide"]["status"] == "done"
        assert steps_written(out) == list(range(40))
        intervals = assert_no_device_overlap(Path(f"{state}.d"))  # the devices the processes were given
        servers[placement] = {frozenset(_servers(iv["gpu_ids"])) for iv in intervals}
        assert {frozenset(_servers(ids)) for r in _leases(state) for ids in r.values()} == servers[placement]
    assert all(len(s) == 1 for s in servers["best_fit"]), servers
    assert servers["scattered"] == {frozenset({0, 1})}, servers


def test_allocopt_run_load_based_admission_holds_jobs_back(tmp_path: Path) -> None:
    """load_based (threshold 1.2) on 2 devices admits three 1-device jobs (demand 0, 1, 2 <= 2.4 before each);
    the fourth waits, with a message, until one of them finishes."""
    jobs = [{"name": n, "command": count_steps_command(tmp_path / f"{n}.txt", "--sleep-s", "0.05"), "total_steps": t,
             "throughputs": {"cpu": 20.0}} for n, t in (("a", 30), ("b", 30), ("c", 30), ("d", 20))]
    done, state = _run(tmp_path, "admit", jobs, "--cluster", "cpu=2", "--admission", "load_based")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert all(report["jobs"][n]["status"] == "done" for n in "abcd"), report
    assert "job d waiting for admission (load_based): the admitted jobs ask for 3 of the cluster's 2 GPUs" \
        in done.stderr
    round0 = next(line for line in done.stderr.splitlines() if line.startswith("round 0 "))
    assert "d 0/20 pending waiting for admission" in round0, round0  # the round lines show it too
    rounds = _leases(state)
    first_d = next(k for k, r in enumerate(rounds) if "d" in r)
    with sqlite3.connect(state) as con:
        results = [json.loads(row[0]) for row in con.execute("SELECT results FROM rounds ORDER BY idx")]
    first_done = next(k for k, r in enumerate(results) if any(x[1] == "completed" for x in r))
    assert first_d > first_done, (first_d, first_done)
    assert steps_written(tmp_path / "d.txt") == list(range(20))
    # accept_all: d is scheduled from the start, the rounds rotate four jobs over two devices
    done, state = _run(tmp_path, "all", [{**j, "command": count_steps_command(tmp_path / f"all-{j['name']}.txt",
                                                                              "--sleep-s", "0.05")}
                                         for j in jobs], "--cluster", "cpu=2")
    assert done.returncode == 0, done.stderr
    assert "waiting for admission" not in done.stderr
    rounds = _leases(state)
    with sqlite3.connect(state) as con:
        results = [json.loads(row[0]) for row in con.execute("SELECT results FROM rounds ORDER BY idx")]
    first_done = next(k for k, r in enumerate(results) if any(x[1] == "completed" for x in r))
    assert next(k for k, r in enumerate(rounds) if "d" in r) <= first_done


def test_allocopt_run_rejects_unknown_policy_names(tmp_path: Path) -> None:
    jobs_file = tmp_path / "j.json"
    jobs_file.write_text(json.dumps({"jobs": [{"name": "a", "command": ["true"], "total_steps": 1}]}))
    for flag, name in (("--placement", "nope"), ("--admission", "maybe")):
        done = subprocess.run([sys.executable, "-m", "allocopt", "run", str(jobs_file), "--cluster", "cpu=1",
                               "--state", str(tmp_path / "s.db"), flag, name], check=False, env=_env(), capture_output=True,
                              text=True, timeout=60)
        assert done.returncode != 0 and name in done.stderr and "Traceback" not in done.stderr
        assert not (tmp_path / "s.db").exists()
