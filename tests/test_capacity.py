"""Time-varying capacity in the simulator: servers joining and leaving at round boundaries."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from allocopt.cluster import Cluster
from allocopt.errors import InvalidOptionError
from allocopt.experiments import parse_spec, run_sweep
from allocopt.mechanism.capacity import CapacityEventError, capacity_schedule, read_capacity_events, remap_held
from allocopt.mechanism.placement import GpuLayout
from allocopt.mechanism.simulator import simulate
from allocopt.mechanism.workload import Workload
from allocopt.throughput import ThroughputTable

# "fast" runs on v100 only; "any" on both types (at half speed on k80)
TABLE = ThroughputTable([("fast", 1), ("any", 1)], ["v100", "k80"], np.array([[1.0, 0.0], [1.0, 0.5]]))
CLUSTER = Cluster({"v100": 8, "k80": 8}, gpus_per_node=4)


def _workload(model: str = "fast", jobs: int = 8, steps: int = 36_000) -> Workload:
    return Workload((model,) * jobs, np.ones(jobs, dtype=np.int64), np.full(jobs, steps), np.zeros(jobs),
                    np.ones(jobs), "capacity test")


@pytest.mark.parametrize("policy", ["max_min_fairness_perf", "las", "gavel:fifo"])
def test_removing_every_gpu_of_a_type_stops_its_jobs_until_it_returns(policy):
    outage = (3600.0, 3 * 3600.0)
    events = [{"time_s": outage[0], "gpu_type": "v100", "servers": -2},
              {"time_s": outage[1], "gpu_type": "v100", "gpus": 8}]
    base = simulate(_workload(), CLUSTER, policy, throughputs=TABLE, ftf=False)
    cut = simulate(_workload(), CLUSTER, policy, throughputs=TABLE, ftf=False, capacity_events=events)
    start, v100 = cut.rounds["start_s"], cut.rounds["gpu_s_v100"]
    during = (start >= outage[0]) & (start < outage[1])
    assert not v100[during].any()  # nothing ran on the v100s while they were gone
    assert (cut.rounds["gpus"][during] == 8).all() and (cut.rounds["gpus"][~during] == 16).all()
    assert (start < outage[0]).any() and (start >= outage[1]).any()
    # the jobs ran only on v100s: they finish later by the outage (to a round)
    delay = cut.jobs["finish_s"] - base.jobs["finish_s"]
    assert delay.min() >= (outage[1] - outage[0]) * 0.99
    assert delay.max() <= (outage[1] - outage[0]) + 2 * 360.0
    assert cut.metrics["utilization"] <= 1.0
    assert cut.config["capacity_events"]["changes"][0]["gpus"] == {"v100": 0, "k80": 8}


def test_jobs_on_a_removed_server_are_preempted_and_resume_elsewhere():
    """Four jobs run on the only v100 server; at 1800 s it leaves and a k80 server joins: each job is
    preempted once, keeps the steps it made, pays the restart overhead and finishes at half speed."""
    wl = _workload("any", jobs=4, steps=20_000)
    cluster, overhead = Cluster({"v100": 4, "k80": 0}, gpus_per_node=4), 30.0
    events = [{"time_s": 1800.0, "gpu_type": "v100", "servers": -1}, {"time_s": 1800.0, "gpu_type": "k80", "gpus": 4}]
    base = simulate(wl, cluster, "max_min_fairness_perf", throughputs=TABLE, ftf=False, restart_overhead_s=overhead)
    cut = simulate(wl, cluster, "max_min_fairness_perf", throughputs=TABLE, ftf=False, restart_overhead_s=overhead,
                   capacity_events=events)
    assert base.jobs["restarts"].tolist() == [0] * 4 and cut.jobs["restarts"].tolist() == [1] * 4
    made = 1800.0 - overhead  # steps made on the v100s (1 step/s after the first lease's overhead)
    assert cut.jobs["finish_s"] == pytest.approx(1800.0 + overhead + (20_000 - made) / 0.5, rel=1e-6)
    assert not cut.rounds["gpu_s_v100"][cut.rounds["start_s"] >= 1800.0].any()


def test_gpus_that_join_later_run_the_waiting_jobs():
    cluster = Cluster({"v100": 0, "k80": 4})
    events = [{"time_s": 7200.0, "gpu_type": "v100", "servers": 1}]
    result = simulate(_workload("fast", jobs=4, steps=3600), cluster, "max_min_fairness", throughputs=TABLE,
                      ftf=False, capacity_events=events)
    assert result.jobs["finish_s"].min() == pytest.approx(7200.0 + 3600.0, rel=0.01)
    assert result.metrics["utilization"] <= 1.0


def test_without_events_results_are_those_of_a_fixed_cluster():
    wl = _workload("any", jobs=12, steps=9000)
    plain = simulate(wl, CLUSTER, "max_min_fairness_perf", throughputs=TABLE, ftf=False)
    late = simulate(wl, CLUSTER, "max_min_fairness_perf", throughputs=TABLE, ftf=False,
                    capacity_events=[{"time_s": 1e9, "gpu_type": "k80", "gpus": 1}])  # after the last job
    assert np.array_equal(plain.jobs["finish_s"], late.jobs["finish_s"])


def test_remap_keeps_a_gpus_place_within_its_type():
    old, new = GpuLayout(Cluster({"a": 8, "b": 8}, 4)), GpuLayout(Cluster({"a": 4, "b": 12}, 4))
    ids = np.array([1, 5, 9, 15])  # job 0: a's gpu 1; job 1: a's gpu 5 (leaves); job 2: b's gpus 1 and 7
    remapped, lost = remap_held(old, new, ids, np.array([0, 1, 2]), np.array([1, 1, 2]))
    assert remapped.tolist() == [1, -1, 5, 11]
    assert lost.tolist() == [False, True, False]


def _events(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "events.csv"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, line, field", [
    ("time_s,gpu_type,gpus\n10,v100,-4\nx,v100,2\n", 3, "time_s"),
    ("time_s,gpu_type,gpus\n10,h100,4\n", 2, "gpu_type"),
    ("time_s,gpu_type,gpus\n10,v100,-4\n20,v100,-5\n", 3, "gpus"),
    ("time_s,gpu_type,servers\n10,v100,-3\n", 2, "servers"),
    ("time_s,gpu_type,gpus,servers\n10,v100,4,1\n", 2, "gpus"),
    ("time_s,gpu_type,gpus\n10,v100,1.5\n", 2, "gpus"),
    ("time_s,gpu_type,gpus\n10,v100,0\n", 2, "gpus"),
    ("time_s,gpu_type,gpus\n10,v100\n", 2, "columns"),
    ("time_s,type,gpus\n10,v100,1\n", 1, "gpu_type"),
    ("time_s,gpu_type,gpus\n-1,v100,1\n", 2, "time_s"),
])
def test_a_malformed_event_names_its_line_and_column(tmp_path, text, line, field):
    with pytest.raises(CapacityEventError, match=rf"events.csv:{line}:") as caught:
        read_capacity_events(_events(tmp_path, text), CLUSTER)
    assert caught.value.line == line and caught.value.field == field


def test_events_at_one_time_combine_and_are_ordered_by_time(tmp_path):
    path = _events(tmp_path, "time_s,gpu_type,gpus,servers\n50,k80,,-1\n10,v100,-4,\n10,k80,2,\n")
    schedule = read_capacity_events(path, CLUSTER)
    assert schedule.times_s.tolist() == [10.0, 50.0]
    assert schedule.capacity.tolist() == [[4, 10], [4, 6]]
    assert schedule.peak.capacity.tolist() == [8, 10]
    assert schedule.gpu_seconds(100.0) == pytest.approx(16 * 10 + 14 * 40 + 10 * 50)
    with pytest.raises(CapacityEventError, match="capacity event 2: gpu_type is missing"):
        capacity_schedule([{"time_s": 1, "gpu_type": "v100", "gpus": 1}, {"time_s": 2, "gpus": 1}], CLUSTER)


def test_capacity_events_need_the_round_mechanism():
    with pytest.raises(InvalidOptionError, match="mode='mechanism'"):
        simulate(_workload(), CLUSTER, "max_min_fairness", throughputs=TABLE, mode="ideal", ftf=False,
                 capacity_events=[{"time_s": 10, "gpu_type": "v100", "gpus": -1}])


def test_cli_and_sweep_take_a_capacity_events_file(tmp_path):
    trace = tmp_path / "jobs.trace"
    trace.write_text("".join(f"ResNet-18 (batch size 64)\tcmd\tdir\t--n\t0\t20000\t1\t1\t-1\t{k * 10}\n"
                             for k in range(6)))
    events = _events(tmp_path, "time_s,gpu_type,gpus\n600,v100,-2\n")
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "allocopt", "simulate", "--trace", str(trace), "--cluster",
                           "v100=4,k80=2", "--capacity-events", str(events), "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["config"]["capacity_events"]["changes"][0]["gpus"]["v100"] == 2
    bad = _events(tmp_path, "time_s,gpu_type,gpus\n600,v100,-9\n")
    proc = subprocess.run([sys.executable, "-m", "allocopt", "simulate", "--trace", str(trace), "--cluster",
                           "v100=4,k80=2", "--capacity-events", str(bad)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "events.csv:2:" in proc.stderr and "Traceback" not in proc.stderr
    good = _events(tmp_path, "time_s,gpu_type,gpus\n600,v100,-2\n")
    spec = parse_spec({"policies": ["max_min_fairness_perf"], "workloads": [{"trace": str(trace)}],
                       "clusters": [{"v100": 4, "k80": 2}], "capacity_events": str(good),
                       "output": str(tmp_path / "out"), "ftf": False})
    result = run_sweep(spec)
    assert not result.failed and result.rows[0]["capacity_events"] == str(good.resolve())


def test_mangled_event_files_raise_only_typed_errors(tmp_path):
    """Random edits of a valid file (a character replaced, a field deleted or doubled) either read or raise a
    CapacityEventError naming a line within the file and a column of the format."""
    from allocopt.errors import DataFileError

    valid = "time_s,gpu_type,gpus,servers\n10,v100,-4,\n20,k80,,1\n30,v100,4,\n"
    rng = np.random.default_rng(7)
    alphabet = list("0123456789-.,ex\n ") + ["v100", "k80", "nan", "inf", '"']
    path = tmp_path / "events.csv"
    for _ in range(400):
        text = list(valid)
        for _ in range(int(rng.integers(1, 4))):
            k = int(rng.integers(0, len(text)))
            text[k] = str(rng.choice(alphabet)) if rng.random() < 0.7 else ""
        path.write_text("".join(text))
        try:
            read_capacity_events(path, CLUSTER)
        except CapacityEventError as err:
            assert err.field in ("time_s", "gpu_type", "gpus", "servers", "columns")
            assert err.line is None or 1 <= err.line <= "".join(text).count("\n") + 1
            assert str(err).startswith(f"{path}")
        except DataFileError:
            pass
