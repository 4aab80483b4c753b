"""Admission control in the simulator: accept all, Blox's load-based threshold, a user's policy."""

from __future__ import annotations

import numpy as np
import pytest

from allocopt import simulate
from allocopt.cluster import Cluster
from allocopt.errors import InvalidOptionError
from allocopt.mechanism.admission import AdmissionQueue, LoadBased, admission_policy
from allocopt.mechanism.state import SimulationState
from allocopt.mechanism.workload import Workload
from allocopt.throughput.table import ThroughputTable


def four_jobs():
    """Four 2-GPU jobs of 10 s (one step a second) arriving at 0."""
    models = tuple(f"j{k}" for k in range(4))
    workload = Workload(models, np.full(4, 2), np.full(4, 10), np.zeros(4), np.ones(4), "test")
    return workload, ThroughputTable([(m, 2) for m in models], ["gpu"], np.ones((4, 1)))


def test_accept_all_is_the_default():
    workload, table = four_jobs()
    plain = simulate(workload, {"gpu": 4}, "las", throughputs=table, ftf=False, round_seconds=1)
    accept = simulate(workload, {"gpu": 4}, "las", throughputs=table, ftf=False, round_seconds=1,
                      admission="accept_all")
    assert plain.jobs["finish_s"].tolist() == accept.jobs["finish_s"].tolist() == [19, 19, 20, 20]
    assert accept.config["admission"] == "accept_all"


def test_load_based_admits_while_the_demand_is_under_its_threshold():
    workload, table = four_jobs()
    # 0.5 x 4 GPUs: the first job (0 before it) and the second (2 before it) are admitted, the others wait
    # until both finish; their JCT counts from arrival
    half = simulate(workload, {"gpu": 4}, "las", throughputs=table, ftf=False, round_seconds=1,
                    admission=LoadBased(0.5))
    assert half.jobs["finish_s"].tolist() == [10, 10, 20, 20]
    assert half.jobs["jct_s"].tolist() == [10, 10, 20, 20]
    # threshold 1.0: Blox tests the limit before adding a job, so the third (4 GPUs before it) gets in too
    state = SimulationState(workload, Cluster({"gpu": 4}), np.ones((4, 1)))
    queue = AdmissionQueue(LoadBased(1.0), 4)
    assert queue.admit(state, 0, 0.0) == 4
    assert state.active.tolist() == [True, True, True, False] and queue.waiting.tolist() == [3]
    # an optimization policy with admission control
    fair = simulate(workload, {"gpu": 4}, "max_min_fairness", throughputs=table, ftf=False, admission=LoadBased(0.5))
    assert fair.jobs["finish_s"].tolist() == [10, 10, 20, 20]


def test_a_users_admission_policy_runs_in_simulate():
    class OneAtATime:  # admit a job only when nothing runs
        name = "one_at_a_time"

        def admit(self, waiting, state, now_s):
            mask = np.zeros(waiting.size, dtype=bool)
            mask[0] = not state.active.any()
            return mask

    workload, table = four_jobs()
    result = simulate(workload, {"gpu": 4}, "order:fifo", throughputs=table, ftf=False, admission=OneAtATime())
    assert result.jobs["finish_s"].tolist() == [10, 20, 30, 40]


def test_bad_admission_is_a_typed_error():
    workload, table = four_jobs()
    with pytest.raises(InvalidOptionError, match="unknown admission policy"):
        simulate(workload, {"gpu": 4}, "las", throughputs=table, ftf=False, admission="bogus")
    with pytest.raises(InvalidOptionError, match="threshold"):
        LoadBased(-1)
    with pytest.raises(InvalidOptionError, match="mechanism"):
        simulate(workload, {"gpu": 4}, "max_min_fairness", throughputs=table, ftf=False, mode="ideal",
                 admission="load_based")
    with pytest.raises(InvalidOptionError, match="admit"):
        admission_policy(42)
