"""`allocopt slurm run --placement/--admission`: the planning step (node lists, scontrol fields, admission),
without Slurm's daemons."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from allocopt.cluster import Cluster
from allocopt.engine import Engine
from allocopt.errors import InvalidOptionError
from allocopt.integrations.slurm import JobRecord, Journal, SlurmController, lease_nodes
from allocopt.integrations.slurm_commands import SlurmJob, SlurmNode

NODES = [SlurmNode("n1", "v100", 2, "idle"), SlurmNode("n2", "v100", 2, "idle")]
SLOTS = {"v100": ["n1", "n1", "n2", "n2"]}  # the node of each free GPU, in the engine's id order


def _job(job_id: str, gpus: int, state: str = "PENDING", reason: str = "JobHeldUser") -> SlurmJob:
    return SlurmJob(job_id, state, reason, f"gres:gpu:{gpus}", (), None, None, "", "p", job_id, "allocopt")


def _pinned(placement: str, job: str = "7", size: int = 2) -> dict:
    engine = Engine(Cluster({"v100": 4}, 2), placement=placement, round_seconds=60, recompute_min_seconds=0)
    engine.add_job(job, {"v100": 1.0}, scale_factor=size)
    return lease_nodes(engine.cluster, engine.next_round().leases, SLOTS)[job]


def test_lease_nodes_follow_the_placement_policy() -> None:
    best = _pinned("best_fit")
    assert len(best["nodes"]) == 1 and best["gpus"] == [2]
    assert _pinned("scattered") == {"nodes": ["n1", "n2"], "gpus": [1, 1], "gpus_per_node": 1}
    assert _pinned("scattered", size=3)["gpus"] in ([2, 1], [1, 2])
    # a scattered 2-GPU job submitted on one node: released on both with one GPU each
    assert SlurmController._pinned_fields("n0", _pinned("scattered"), _job("7", 2)) == (
        "ExcNodeList=n0", "NumNodes=2-2", "Gres=gpu:1")
    assert SlurmController._pinned_fields("n0", best, _job("7", 2)) == ("ExcNodeList=n0",)


@pytest.mark.skipif(shutil.which("scontrol") is None, reason="needs the Slurm client commands (no daemon is used)")
def test_controller_plans_placed_nodes_and_holds_jobs_admission_defers(tmp_path: Path) -> None:
    from allocopt.integrations.slurm_commands import Slurm

    journal = Journal(tmp_path / "c.sqlite")
    with pytest.raises(InvalidOptionError, match="unknown placement policy 'nope'"):
        SlurmController(Slurm(), journal, tmp_path / "spool", placement="nope")
    controller = SlurmController(Slurm(), journal, tmp_path / "spool", placement="scattered",
                                 admission="load_based")
    controller.engine = Engine(Cluster({"v100": 4}, 2), placement="scattered", recompute_min_seconds=0)
    now = time.time()
    # load_based, threshold 1.2 of 4 GPUs: demand before each job 0, 2, 4 <= 4.8 admits three; the fourth waits
    for k in range(4):
        controller.records[str(k)] = JobRecord(str(k), f"j{k}", "resnet50", 2, first_seen=now + k)
    controller._admit(["v100"])
    assert set(controller.engine.job_ids) == {"0", "1", "2"}
    assert controller.records["3"].message == ("waiting for admission (load_based): the admitted jobs ask for 6 of "
                                               "the cluster's 4 GPUs")
    plan = controller.engine.next_round(60)
    jobs = [_job(str(k), 2) for k in range(4)]
    pinned = lease_nodes(controller.engine.cluster, plan.leases, controller._gpu_slots(NODES, jobs)[0])
    leased = {lease.job_id: lease.gpu_type for lease in plan.leases}
    assert len(leased) == 2 and all(pinned[j]["nodes"] == ["n1", "n2"] for j in leased)
    hold, preempt, release, _ = controller._decide(leased, {j.job_id: j for j in jobs}, {"n1": "v100", "n2": "v100"},
                                                   NODES, pinned)
    assert not preempt and set(release) == set(leased) and "3" not in release
    assert all(release[j] == ("ExcNodeList=", "NumNodes=2-2", "Gres=gpu:1") for j in leased)
    # released and pending in Slurm's queue, same lease: not released again; held again when the lease goes
    queued = {j.job_id: (_job(j.job_id, 2, reason="Resources") if j.job_id in leased else j) for j in jobs}
    hold, preempt, release, _ = controller._decide(leased, queued, {"n1": "v100", "n2": "v100"}, NODES, pinned)
    assert not release and not hold and not preempt
    hold, _, release, _ = controller._decide({}, queued, {"n1": "v100", "n2": "v100"}, NODES, {})
    assert set(hold) == set(leased) and not release
    # an uneven split (3 GPUs over two nodes) is not expressible in Slurm's per-node GRES: the type only
    controller.records["9"] = JobRecord("9", "j9", "resnet50", 3, first_seen=now)
    uneven = {"9": {"nodes": ["n1", "n2"], "gpus": [2, 1], "gpus_per_node": 2}}
    three = {"n1": "v100", "n2": "v100", "n3": "v100"}
    nodes3 = [*NODES, SlurmNode("n3", "v100", 2, "idle")]
    _, _, release, _ = controller._decide({"9": "v100"}, {"9": _job("9", 3)}, three, nodes3, uneven)
    assert release == {"9": ""}  # n3 not excluded
    even = {"9": {"nodes": ["n1", "n2"], "gpus": [1, 1], "gpus_per_node": 1}}
    controller.records["9"].scale_factor = 2
    _, _, release, _ = controller._decide({"9": "v100"}, {"9": _job("9", 2)}, three, nodes3, even)
    assert release == {"9": ("ExcNodeList=n3", "NumNodes=2-2", "Gres=gpu:1")}
    del controller.records["9"]
    # a job that finished leaves room: the waiting one is admitted and its message cleared
    controller.records["0"].status = "done"
    controller.engine.remove_job("0")
    controller._admit(["v100"])
    assert "3" in controller.engine and controller.records["3"].message == ""
    journal.close()
