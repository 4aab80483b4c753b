"""Placement plug-ins: best fit, packing, scattered and Tiresias's consolidated placement."""

from __future__ import annotations

import numpy as np
import pytest

from allocopt import simulate
from allocopt.cluster import Cluster
from allocopt.errors import InvalidOptionError
from allocopt.mechanism.placement import GpuLayout
from allocopt.mechanism.placement_policies import (
    TIRESIAS_MODEL_SKEW,
    BestFit,
    Consolidated,
    Packing,
    Scattered,
    placement_policy,
)
from allocopt.mechanism.workload import Workload
from allocopt.throughput.table import ThroughputTable

LAYOUT = GpuLayout(Cluster({"gpu": 16}, gpus_per_node=4))  # servers 0-3: GPUs 0-3, 4-7, 8-11, 12-15


def place(policy, sizes, previous, models):
    counts = np.array([len(p) for p in previous])
    ids = np.array([g for p in previous for g in p], dtype=np.int64)
    result = policy.place(LAYOUT, np.zeros(len(sizes), dtype=np.int64), np.array(sizes), ids, counts, models)
    bounds = result.start.tolist()
    return [result.gpu_ids[a:b].tolist() for a, b in zip(bounds[:-1], bounds[1:])], result


@pytest.mark.parametrize("policy, expected", [
    (BestFit(), [4, 5, 6, 7, 8, 9]),  # emptiest servers first
    (Packing(), [2, 3, 4, 5, 6, 7]),  # fullest servers first: server 0's two free GPUs, then server 1
    (Scattered(), [4, 8, 12, 5, 9, 13]),  # one GPU at a time to the servers with the most free
    (Consolidated(), [4, 5, 6, 7, 8, 9]),  # vgg19 is skewed: two whole servers
])
def test_where_a_six_gpu_job_goes_next_to_a_kept_two_gpu_job(policy, expected):
    held, result = place(policy, [2, 6], [[0, 1], []], ["resnet50", "vgg19"])
    assert held[0] == [0, 1] and result.extended.tolist() == [True, False]
    assert sorted(held[1]) == sorted(expected) and held[1] == expected
    assert result.placed.all()


def test_consolidated_defers_a_skewed_job_and_places_the_others():
    previous = [[0, 1], [4, 5], [8, 9], []]
    held, result = place(Consolidated(), [2, 2, 2, 6], previous, ["resnet50", "resnet50", "resnet50", "VGG16"])
    assert result.placed.tolist() == [True, True, True, False] and held[3] == []
    held, result = place(Consolidated(), [2, 2, 2, 6], previous, ["resnet50"] * 4)
    assert result.placed.all() and len(set(held[3])) == 6
    assert Consolidated().skewed("vgg16 (batch size 32)") and not Consolidated().skewed("ResNet-50")
    assert min(TIRESIAS_MODEL_SKEW[m] for m in ("vgg19", "vgg16", "vgg11", "alexnet")) > 0.5


def fragmenting_jobs(last_model):
    """8 GPUs on 2 servers of 4: jobs of 1 and 3 GPUs leave 3 + 1 free GPUs at 10 s when a 4-GPU job waits."""
    models = ("resnet50", "resnet50", "resnet50", last_model)
    gpus = np.array([1, 3, 3, 4])
    workload = Workload(models, gpus, np.array([100, 10, 100, 10]), np.array([0.0, 0.0, 0.0, 5.0]), np.ones(4), "t")
    entries = sorted(set(zip(models, gpus.tolist())))
    return workload, ThroughputTable(entries, ["gpu"], np.ones((len(entries), 1)))


def test_consolidated_placement_in_simulate_waits_for_a_whole_server():
    cluster = Cluster({"gpu": 8}, gpus_per_node=4)
    workload, table = fragmenting_jobs("vgg19")
    spread = simulate(workload, cluster, "order:fifo", throughputs=table, ftf=False)
    whole = simulate(workload, cluster, "order:fifo", throughputs=table, ftf=False, placement="consolidated")
    assert spread.jobs["finish_s"][3] == pytest.approx(20)  # on 3 + 1 GPUs of two servers at 10 s
    assert whole.jobs["finish_s"][3] == pytest.approx(110)  # waits until server 0 is free at 100 s
    assert whole.config["placement"] == "consolidated"
    workload, table = fragmenting_jobs("resnet50")  # not skewed: spread as best fit does
    assert simulate(workload, cluster, "order:fifo", throughputs=table, ftf=False,
                    placement="consolidated").jobs["finish_s"][3] == pytest.approx(20)


def test_placements_with_an_allocation_policy():
    cluster = Cluster({"gpu": 8}, gpus_per_node=4)
    workload, table = fragmenting_jobs("vgg19")
    for name in ("best_fit", "packing", "scattered"):
        result = simulate(workload, cluster, "max_min_fairness", throughputs=table, ftf=False, placement=name)
        assert np.isfinite(result.jobs["finish_s"]).all()
    with pytest.raises(InvalidOptionError, match="order-based"):
        simulate(workload, cluster, "max_min_fairness", throughputs=table, ftf=False, placement="consolidated")
    with pytest.raises(InvalidOptionError, match="unknown placement"):
        placement_policy("bogus")
    with pytest.raises(InvalidOptionError, match="mode"):
        simulate(workload, cluster, "max_min_fairness", throughputs=table, ftf=False, placement="packing",
                 mode="ideal")
