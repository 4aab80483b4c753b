"""Order-based policies (LAS, Tiresias, SRTF, SJF, FIFO) on the round mechanism, and a user's own policy."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

import numpy as np
import pytest

from allocopt import simulate
from allocopt.errors import InvalidOptionError
from allocopt.mechanism.order_policies import (
    JobView,
    OrderPolicy,
    Tiresias,
    gittins_index,
    gittins_ranks,
    order_policy,
    tiresias_service_sample,
)
from allocopt.mechanism.workload import Workload
from allocopt.throughput.table import ThroughputTable


def jobs(arrival_s, duration_s, gpus=None, gpu_types=("gpu",), speed=None):
    """A workload whose job ``k`` has ``duration_s[k]`` steps (one step a second on every type, or
    ``speed[k]`` steps/s per type), and the table of those throughputs."""
    n = len(arrival_s)
    gpus = [1] * n if gpus is None else gpus
    models = tuple(f"job{k}" for k in range(n))
    rates = np.ones((n, len(gpu_types))) if speed is None else np.asarray(speed, dtype=float)
    steps = np.asarray(duration_s, dtype=np.int64)
    workload = Workload(models, np.asarray(gpus), steps, np.asarray(arrival_s, dtype=float), np.ones(n), "test")
    return workload, ThroughputTable(list(zip(models, gpus)), list(gpu_types), rates)


def run(policy, workload, table, cluster, **options):
    return simulate(workload, cluster, policy, throughputs=table, ftf=False, round_seconds=options.pop(
        "round_seconds", 1e6), policy_options=options or None)


# three jobs on one GPU: 100 s at 0, 60 s at 10, 20 s at 20
THREE = ([0, 10, 20], [100, 60, 20])


@pytest.mark.parametrize("policy, finish", [
    ("order:fifo", [100, 160, 180]),  # arrival order, no preemption
    ("sjf", [100, 180, 120]),  # shortest waiting job next when the GPU frees up
    ("srtf", [180, 90, 40]),  # each arrival with less remaining time preempts
])
def test_each_policy_runs_the_jobs_in_its_order(policy, finish):
    workload, table = jobs(*THREE)
    result = run(policy, workload, table, {"gpu": 1})
    assert result.jobs["finish_s"].tolist() == pytest.approx(finish)


def test_srtf_preempts_and_sjf_does_not():
    workload, table = jobs(*THREE)
    assert run("srtf", workload, table, {"gpu": 1}).jobs["restarts"].tolist() == [1, 1, 0]
    assert run("sjf", workload, table, {"gpu": 1}).jobs["restarts"].tolist() == [0, 0, 0]


def test_las_shares_one_gpu_round_robin_at_its_quantum():
    workload, table = jobs([0, 0], [10, 10])
    result = run("las", workload, table, {"gpu": 1}, round_seconds=1)
    assert result.jobs["finish_s"].tolist() == pytest.approx([19, 20])
    assert result.metrics["num_rounds"] == 20


def test_tiresias_demotes_at_its_threshold_and_keeps_queue_order():
    # queue 0 up to 5 GPU-seconds: job 0 runs 0-5 and moves to queue 1; job 1 (arrived at 2) runs 5-10 and
    # follows it there; in queue 1 job 0 is ahead: 10-25, then job 1 25-30
    workload, table = jobs([0, 2], [20, 10])
    result = run("tiresias", workload, table, {"gpu": 1}, thresholds_gpu_s=[5])
    assert result.jobs["finish_s"].tolist() == pytest.approx([25, 30])
    # least attained service instead shares the GPU from time 2 on
    las = run("las", workload, table, {"gpu": 1}, round_seconds=1)
    assert las.jobs["finish_s"][1] < 30


def test_tiresias_counts_gpu_time_and_backfills():
    # 4 GPUs: job 0 (4 GPUs, 10 s) crosses 8 GPU-seconds after 2 s; job 1 (2 GPUs) then runs ahead of it
    # (queue 0), and job 2 (1 GPU) fills a third GPU while job 0 waits for four
    workload, table = jobs([0, 1, 1], [10, 10, 10], gpus=[4, 2, 1])
    result = run("tiresias", workload, table, {"gpu": 4}, thresholds_gpu_s=[8])
    finish = result.jobs["finish_s"]
    assert finish[1] < finish[0] and finish[2] < finish[0]
    assert result.jobs["restarts"][0] >= 1


def test_tiresias_starvation_promotion_returns_a_waiting_job_to_the_first_queue():
    # job 0 runs 0-5 and drops to queue 1; short jobs keep queue 0 busy; with starvation_factor 1 job 0
    # returns to queue 0 after waiting 5 s and finishes earlier than without promotion
    arrival = [0] + [5 + 4 * k for k in range(12)]
    workload, table = jobs(arrival, [20] + [4] * 12)
    plain = run("tiresias", workload, table, {"gpu": 1}, thresholds_gpu_s=[5])
    promoted = run("tiresias", workload, table, {"gpu": 1}, thresholds_gpu_s=[5], starvation_factor=1.0)
    assert plain.jobs["finish_s"][0] == pytest.approx(68)  # after every short job
    assert promoted.jobs["finish_s"][0] < 60


def test_heterogeneous_cluster_puts_each_job_on_its_fastest_type_with_room():
    speed = [[1.0, 2.0], [1.0, 2.0]]  # both jobs run twice as fast on "fast"
    workload, table = jobs([0, 0], [100, 100], gpu_types=("slow", "fast"), speed=speed)
    result = run("order:fifo", workload, table, {"slow": 1, "fast": 1})
    # job 0 takes the fast GPU (50 s), job 1 the slow one (100 s)
    assert result.jobs["finish_s"].tolist() == pytest.approx([50, 100])


def test_a_users_policy_in_a_few_lines_runs_in_simulate():
    class FewestGpusFirst:  # a user's policy: smallest GPU demand first, preemptive
        name, preemptive = "fewest_gpus_first", True

        def rank(self, view: JobView) -> np.ndarray:
            return np.vstack([view.num_gpus, view.arrival_s])

    policy = FewestGpusFirst()
    assert isinstance(policy, OrderPolicy)
    workload, table = jobs([0, 1, 2], [10, 10, 10], gpus=[4, 2, 2])
    result = simulate(workload, {"gpu": 4}, policy, throughputs=table, ftf=False)
    # the two 2-GPU jobs preempt the 4-GPU job at 1 and 2 s, and it finishes last
    assert result.jobs["finish_s"].tolist() == pytest.approx([21, 11, 12])
    assert result.config["policy"] == "fewest_gpus_first"


def test_a_view_is_read_only():
    seen = []

    class Peek:
        name, preemptive = "peek", False

        def rank(self, view):
            seen.append(view)
            with pytest.raises(ValueError):
                view.attained_s[:] = 0
            return view.arrival_s

    workload, table = jobs(*THREE)
    simulate(workload, {"gpu": 1}, Peek(), throughputs=table, ftf=False)
    assert seen and seen[-1].num_jobs >= 1


def test_gittins_table_is_tiresias_formula():
    sample = tiresias_service_sample()
    bounds, index = gittins_ranks(sample, 3250)
    data, num, delta = sorted(sample.tolist()), sample.size, 3250

    def tiresias(a):  # run_sim.py's cal_r_gittins_index, in Python 3 with Python 2's integer division
        idx = next(i for i, x in enumerate(data) if x > a)
        nxt = a + delta
        idx_delta = num - 1 if nxt > data[-1] - 1 else next(i for i, x in enumerate(data) if x > nxt)
        p = py2_round((idx_delta - idx) / (num - idx), 5)
        e = (sum(data[idx:idx_delta]) + delta * (num - idx_delta)) // (num - idx)
        return py2_round(p * 1000000 / e, 4)

    def py2_round(x, digits):  # halves away from zero, on the exact binary value
        return float(Decimal(x).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP))

    assert [index[i] for i in range(num)] == [tiresias(data[i] - 1) for i in range(num)]
    # a half that numpy would round to even: p = 0.078125 at the sample above 14158 GPU-seconds
    k = int(np.searchsorted(bounds, 14158, side="right"))
    assert index[k] == 18.6735
    a = np.array([0, data[10], data[-1], data[-1] + 1])
    assert gittins_index(bounds, index, a).tolist()[-2:] == [0.0, 0.0]
    assert gittins_index(bounds, index, a)[0] == index[0]


def test_gittins_variant_runs_and_orders_queues_by_index():
    workload, table = jobs([0, 0, 0], [30, 30, 30])
    result = run("tiresias_gittins", workload, table, {"gpu": 1})
    assert np.isfinite(result.jobs["finish_s"]).all()
    assert sorted(result.jobs["finish_s"].tolist()) == pytest.approx([30, 60, 90])


def test_bad_policies_and_options_are_typed_errors():
    workload, table = jobs(*THREE)

    class WrongShape:
        name, preemptive = "wrong", True

        def rank(self, view):
            return np.zeros(view.num_jobs + 1)

    with pytest.raises(InvalidOptionError, match="rank returned shape"):
        simulate(workload, {"gpu": 1}, WrongShape(), throughputs=table, ftf=False)
    with pytest.raises(InvalidOptionError, match="las"):
        order_policy("las", {"service": "bogus"})
    with pytest.raises(InvalidOptionError, match="tiresias"):
        order_policy("tiresias", {"no_such_option": 1})
    with pytest.raises(InvalidOptionError, match="thresholds_gpu_s"):
        Tiresias(thresholds_gpu_s=[10, 5])
    with pytest.raises(InvalidOptionError, match="policy object"):
        simulate(workload, {"gpu": 1}, Tiresias(), throughputs=table, policy_options={"gittins": True}, ftf=False)
    with pytest.raises(InvalidOptionError, match="mechanism"):
        simulate(workload, {"gpu": 1}, "las", throughputs=table, mode="ideal", ftf=False)
    assert order_policy("fifo") is None  # allocopt's FIFO formulation keeps its name
    assert order_policy("order:fifo").name == "fifo"


def test_estimated_durations_drive_sjf():
    workload, table = jobs(*THREE)
    # estimates that invert the true order of jobs 1 and 2
    result = run("sjf", workload, table, {"gpu": 1}, estimates_s=[100, 10, 90])
    assert result.jobs["finish_s"].tolist() == pytest.approx([100, 160, 180])
    with pytest.raises(InvalidOptionError, match="estimates_s"):
        run("sjf", workload, table, {"gpu": 1}, estimates_s=[1.0])


def test_tiresias_faithful_events_time_crossings_as_tiresias_simulator():
    # an 8-GPU job crosses 3250 GPU-seconds after 406.25 s; a job waiting behind it in queue 0 starts then.
    # Tiresias's simulator checks at floor(3250 / 8) = 406 s (3248 GPU-seconds: no demotion) and next at
    # floor((3250 - 406) / 8) = 355 s later, so the waiting job starts at 761 s
    workload, table = jobs([0, 0], [1000, 100], gpus=[8, 8])
    exact = run("tiresias", workload, table, {"gpu": 8})
    faithful = run("tiresias", workload, table, {"gpu": 8}, faithful_events=True)
    assert exact.jobs["finish_s"].tolist() == pytest.approx([1100, 507])
    assert faithful.jobs["finish_s"].tolist() == pytest.approx([1100, 861])


def test_a_preemptive_policy_moves_a_job_to_a_faster_type_when_one_frees_up():
    # 100 and 20 steps; "fast" runs 2 steps/s, "slow" 1: the short job takes the fast GPU for 10 s, then the
    # long one (10 steps done on the slow GPU) moves there (SRTF) or stays where it runs (SJF, non-preemptive)
    speed = [[1.0, 2.0], [1.0, 2.0]]
    workload, table = jobs([0, 0], [100, 20], gpu_types=("slow", "fast"), speed=speed)
    assert run("srtf", workload, table, {"slow": 1, "fast": 1}).jobs["finish_s"].tolist() == pytest.approx([55, 10])
    assert run("sjf", workload, table, {"slow": 1, "fast": 1}).jobs["finish_s"].tolist() == pytest.approx([100, 10])


def test_every_round_moves_every_job_it_runs():
    # a fast (100 steps/s) and a slow (0.37 steps/s) job crossing thresholds: rounds are at least one step of
    # the slow job, so the fast job's tiny steps do not split the simulation into thousands of rounds
    speed = [[100.0], [0.37]]
    workload, table = jobs([0, 0], [10000, 37], speed=speed)
    result = run("tiresias", workload, table, {"gpu": 2}, thresholds_gpu_s=[5, 50])
    rounds = result.metrics["num_rounds"]
    assert rounds <= 10
    fast, slow = result.jobs["finish_s"].tolist()
    assert fast == pytest.approx(100, abs=1)
    assert 100 <= slow <= 100 + rounds / 0.37  # a round may end within a step of the slow job: at most one a round


def test_fixed_rounds_start_on_the_grid_and_hold_gpus_to_the_round_end():
    from allocopt.cluster import Cluster
    from allocopt.mechanism.order_planner import OrderOptions, OrderPlanner
    from allocopt.mechanism.order_policies import Fifo
    from allocopt.mechanism.state import SimulationState

    # one GPU: job 0 (250 s) at 0, job 1 (100 s) at 10; rounds of 300 s: job 1 waits for the round at 300
    workload, table = jobs([0, 10], [250, 100])
    cluster = Cluster({"gpu": 1})
    state = SimulationState(workload, cluster, np.ones((2, 1)))
    planner = OrderPlanner(state, Fifo(), OrderOptions(round_seconds=300, event_rounds=False))
    fixed = simulate(workload, cluster, "order:fifo", throughputs=table, ftf=False, planner=planner)
    assert fixed.jobs["finish_s"].tolist() == pytest.approx([250, 400])
    assert fixed.rounds["start_s"].tolist() == pytest.approx([0, 300])
    events = run("order:fifo", workload, table, {"gpu": 1})
    assert events.jobs["finish_s"].tolist() == pytest.approx([250, 350])
