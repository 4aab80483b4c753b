"""The Blox-style policy in a small Blox-like round loop (real Engine, real solver)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from allocopt.adapters.blox import BloxPolicy
from allocopt.errors import InvalidProblemError


def make_cluster(nodes: dict[str, str], gpus_per_node: int = 2) -> dict[int, dict]:
    return {f"{node}/{k}": {"gpu_type": gpu_type, "node": node, "running_job": None}
            for node, gpu_type in nodes.items() for k in range(gpus_per_node)}


def apply(cluster: dict, to_suspend: list, to_launch: dict) -> None:
    """What a Blox round loop does with the decision: free suspended jobs' GPUs, then launch."""
    for gpu in cluster.values():
        if gpu["running_job"] in to_suspend:
            gpu["running_job"] = None
    for job, gpu_ids in to_launch.items():
        for gpu_id in gpu_ids:
            assert cluster[gpu_id]["running_job"] is None, "launch on a busy GPU"
            cluster[gpu_id]["running_job"] = job


def running(cluster: dict) -> dict:
    out: dict = {}
    for gpu_id, gpu in cluster.items():
        if gpu["running_job"] is not None:
            out.setdefault(gpu["running_job"], []).append(gpu_id)
    return out


def test_round_loop_with_arrivals_departures_and_node_loss():
    cluster = make_cluster({"n0": "v100", "n1": "v100", "n2": "k80", "n3": "k80"})
    jobs = {k: {"num_GPUs": 1 + k % 2, "throughputs": {"v100": 10.0 + k, "k80": 3.0 + k}, "priority": 1.0}
            for k in range(5)}
    policy = BloxPolicy(round_seconds=60.0, recompute_min_seconds=0.0)
    served = dict.fromkeys(range(7), 0)
    for round_index in range(40):
        if round_index == 10:
            jobs[5] = {"num_GPUs": 2, "throughputs": {"v100": 40.0, "k80": 8.0}}
            jobs[6] = {"scale_factor": 1, "throughputs": {"k80": 5.0}, "priority_weight": 2.0}
        if round_index == 20:
            del jobs[0]
            for gpu_id in [g for g in cluster if g.startswith("n1/")]:
                cluster.pop(gpu_id)
        to_suspend, to_launch = policy.schedule(jobs, cluster)
        before = running(cluster)
        assert set(to_suspend) <= set(before)
        apply(cluster, to_suspend, to_launch)
        now = running(cluster)
        assert set(now) <= set(jobs)
        for job, gpu_ids in now.items():
            needed = jobs[job].get("num_GPUs", jobs[job].get("scale_factor", 1))
            assert len(gpu_ids) == needed
            assert len({cluster[g]["gpu_type"] for g in gpu_ids}) == 1
            served[job] += 1
    assert all(served[job] > 0 for job in range(1, 7))
    assert policy.engine is not None and policy.engine.cluster.capacity.tolist() == [2, 4]


def test_kept_jobs_are_neither_suspended_nor_relaunched():
    cluster = make_cluster({"n0": "v100"}, gpus_per_node=4)
    jobs = {"a": {"num_GPUs": 2, "throughputs": {"v100": 5.0}}, "b": {"num_GPUs": 2, "throughputs": {"v100": 6.0}}}
    policy = BloxPolicy(round_seconds=60.0)
    to_suspend, to_launch = policy.schedule(jobs, cluster)
    assert to_suspend == [] and set(to_launch) == {"a", "b"}
    apply(cluster, to_suspend, to_launch)
    assert policy.schedule(jobs, cluster) == ([], {})


def test_malformed_input_names_the_field():
    with pytest.raises(InvalidProblemError) as err:
        BloxPolicy().schedule({"a": {"num_GPUs": 1}}, make_cluster({"n0": "v100"}))
    assert err.value.field == "throughputs"
    with pytest.raises(InvalidProblemError):
        BloxPolicy().schedule({}, {0: {"node": "n0"}})


def test_blox_round_loop_example_runs():
    example = Path(__file__).resolve().parents[1] / "examples" / "blox_round_loop.py"
    out = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, timeout=60, check=True)
    assert "round 4:" in out.stdout
