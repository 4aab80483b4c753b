"""End-to-end simulation: traces, generated workloads, metrics, outputs, errors and the CLI."""

from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest

import allocopt
from allocopt.errors import InvalidOptionError
from allocopt.mechanism import TraceError, generate_workload, read_gavel_trace, shipped_trace, simulate
from allocopt.mechanism.fidelity import FIDELITY_PROFILES
from allocopt.mechanism.simulator import resolve_policy
from allocopt.throughput import ThroughputTable

TABLE = ThroughputTable.gavel()
ARTIFACT_CLUSTER = {"v100": 2, "p100": 0, "k80": 4}


@pytest.fixture(scope="module")
def small_result():
    return simulate(shipped_trace("small_test"), {"v100": 4, "p100": 4, "k80": 4}, "max_min_fairness_perf")


def test_small_trace_end_to_end(small_result):
    wl = read_gavel_trace(shipped_trace("small_test"), TABLE)
    m, jobs = small_result.metrics, small_result.jobs
    assert np.isfinite(jobs["finish_s"]).all()
    # no job can finish faster than alone on its fastest type
    T = wl.throughputs(TABLE, ["v100", "p100", "k80"])
    lower = wl.total_steps / T.max(axis=1)
    assert (jobs["jct_s"] >= lower * (1 - 1e-9)).all()
    assert m["makespan_s"] >= jobs["jct_s"].max() - 1e-9
    assert m["average_jct_s"] == pytest.approx(jobs["jct_s"].mean())
    assert m["median_jct_s"] <= m["p99_jct_s"] <= jobs["jct_s"].max() + 1e-9
    assert 0 < m["utilization"] <= 1
    # GPU-hours: at least the scale factor times the isolated lower bound
    assert (jobs["gpu_hours"] * 3600 >= wl.scale_factors * lower * (1 - 1e-9)).all()
    assert m["num_solves"] >= 1 and m["num_rounds"] >= 1


def test_gavel_exact_round_timing():
    result = simulate(shipped_trace("artifact_evaluation"), ARTIFACT_CLUSTER, "max_min_fairness_perf")
    rounds = result.rounds
    # each round lasts at most round_seconds; the next starts when the last job of the round stops
    assert (rounds["end_s"] - rounds["start_s"] <= 360 + 1e-9).all()
    np.testing.assert_allclose(rounds["start_s"][1:], rounds["end_s"][:-1])
    assert (rounds["busy_gpus"] <= 6).all()
    assert result.metrics["makespan_s"] == pytest.approx(rounds["end_s"][-1])


def test_ideal_mode_close_to_mechanism():
    mech = simulate(shipped_trace("artifact_evaluation"), ARTIFACT_CLUSTER, "max_min_fairness_perf")
    ideal = simulate(shipped_trace("artifact_evaluation"), ARTIFACT_CLUSTER, "max_min_fairness_perf", mode="ideal")
    gap = mech.metrics["average_jct_s"] / ideal.metrics["average_jct_s"]
    assert 0.9 < gap < 1.15
    assert ideal.metrics["makespan_s"] <= mech.metrics["makespan_s"] * 1.05


def test_heterogeneity_aware_beats_agnostic_on_generated_workload():
    wl = generate_workload(TABLE, 40, jobs_per_hour=1.0, seed=0)
    cluster = {"v100": 8, "p100": 8, "k80": 8}
    aware = simulate(wl, cluster, "max_min_fairness_perf")
    agnostic = simulate(wl, cluster, "gavel:max_min_fairness")
    assert aware.config["type_order"] == "fastest_first" and agnostic.config["type_order"] == "random"
    assert aware.metrics["average_jct_s"] < agnostic.metrics["average_jct_s"]


def test_generator_is_seeded_and_follows_the_distributions():
    a = generate_workload(TABLE, 400, jobs_per_hour=6.0, seed=3)
    b = generate_workload(TABLE, 400, jobs_per_hour=6.0, seed=3)
    np.testing.assert_array_equal(a.total_steps, b.total_steps)
    assert a.models == b.models
    assert a.arrival_s[0] == 0 and (np.diff(a.arrival_s) >= 0).all()
    assert 3600 / np.diff(a.arrival_s).mean() == pytest.approx(6.0, rel=0.15)
    # models measured at every scale factor follow 0.7/0.1/0.15/0.05; the others run on 1 GPU (as in Gavel)
    multi = np.array([len(TABLE.scale_factors(m)) == 4 for m in a.models])
    assert np.mean(a.scale_factors[multi] == 1) == pytest.approx(0.7, abs=0.08)
    assert (a.scale_factors[~multi] == 1).all()
    ref = np.array([TABLE.throughput(m, s, "v100") for m, s in a.jobs()])
    minutes = a.total_steps / ref / 60
    assert minutes.min() >= 10 ** 1.5 * 0.99 and minutes.max() <= 10 ** 4 * 1.01
    assert np.mean(minutes < 1000) == pytest.approx(0.8, abs=0.06)


def test_generator_respects_the_cluster():
    unbounded = generate_workload(TABLE, 200, jobs_per_hour=4.0, seed=0)
    assert unbounded.scale_factors.max() == 8  # Gavel's distribution draws 8-GPU jobs
    for cluster in ({"v100": 4, "p100": 4, "k80": 4}, {"v100": 1, "k80": 2}):
        wl = generate_workload(TABLE, 200, jobs_per_hour=4.0, seed=0, cluster=cluster)
        T = wl.throughputs(TABLE, list(cluster))
        wl.check_fits(T, allocopt.Cluster(cluster))  # raises for a job no type can run
        assert wl.scale_factors.max() == max(cluster.values())
        assert (np.array([TABLE.throughput(m, s, "v100") for m, s in wl.jobs()]) > 0).all()
    with pytest.raises(allocopt.errors.InvalidProblemError, match="reference_gpu_type 'h100'"):
        generate_workload(TABLE, 5, jobs_per_hour=4.0, cluster={"v100": 1}, reference_gpu_type="h100")


def test_window_restarts_and_overhead():
    wl = generate_workload(TABLE, 20, jobs_per_hour=4.0, seed=1, scale_factor_probs={1: 1.0})
    base = simulate(wl, {"v100": 2, "k80": 2}, "max_min_fairness_perf", window=(5, 15))
    assert base.metrics["average_jct_s"] == pytest.approx(base.jobs["jct_s"][5:15].mean())
    assert base.metrics["window"] == [5, 15]
    slow = simulate(wl, {"v100": 2, "k80": 2}, "max_min_fairness_perf", restart_overhead_s=60.0)
    assert slow.metrics["average_jct_s"] > base.metrics["average_jct_s"]
    assert base.metrics["restarts_per_job"] >= 0
    with pytest.raises(InvalidOptionError):
        simulate(wl, {"v100": 2, "k80": 2}, "max_min_fairness_perf", window=(5, 50))


def test_policy_names():
    assert resolve_policy("max_min_fairness_perf") == ("max_min_fairness", {}, False)
    assert resolve_policy("gavel:max_min_fairness") == ("max_min_fairness", {"heterogeneity_aware": False}, True)
    assert resolve_policy("max_min_fairness")[2] is False  # allocopt's name: heterogeneity-aware
    assert resolve_policy("isolated")[0] == "isolated"
    assert resolve_policy("finish_time_fairness_perf")[0] == "finish_time_fairness"
    assert resolve_policy("max_min_fairness_packed") == ("max_min_fairness", {"space_sharing": True}, False)
    # Gavel shuffles the worker types unless its class name says Perf or Packing (Gandiva_Packing, AlloX_Perf)
    assert resolve_policy("gavel:gandiva") == ("gandiva", {"space_sharing": True}, False)
    assert resolve_policy("allox")[2] is False and resolve_policy("gavel:fifo")[2] is True
    with pytest.raises(InvalidOptionError, match="unknown policy"):
        resolve_policy("nope")
    # the "gavel" fidelity: with HiGHS, Gavel's LP policies under Gavel's names get HiGHS's interior point
    # without crossover; Gavel's min total duration bisects to 5% as Gavel's code (the adapter's
    # faithful_bisection); with cvxpy, Gavel's programs as Gavel writes them
    gavel, own = FIDELITY_PROFILES["gavel"], FIDELITY_PROFILES["allocopt"]
    ipm = {"solver": "ipm", "run_crossover": "off"}
    assert resolve_policy("max_min_fairness_perf", None, "highs", gavel)[1] == {"solver_options": ipm}
    assert resolve_policy("gavel:min_total_duration_perf", None, "highs", gavel)[1] == {"method": "bisection",
                                                                                        "solver_options": ipm}
    assert resolve_policy("min_total_duration", {"method": "lp"}, None, gavel)[1] == {
        "method": "lp", "heterogeneity_aware": False, "reference_gpu_type": "v100"}
    assert resolve_policy("min_makespan", None, "highs", gavel)[1] == {}  # allocopt's name: the exact LP
    assert resolve_policy("max_min_fairness_perf", None, "cvxpy", gavel)[1] == {"gavel_program": True}
    assert resolve_policy("gavel:finish_time_fairness", None, "cvxpy", gavel)[1]["method"] == "conic_gavel"
    # allocopt's fidelity (the default) solves allocopt's own programs under Gavel's names too
    for name, backend in (("max_min_fairness_perf", "cvxpy"), ("gavel:min_total_duration_perf", "highs"),
                          ("max_min_fairness_perf", "highs")):
        assert resolve_policy(name, None, backend)[1] == resolve_policy(name, None, backend, own)[1] == {}
    assert resolve_policy("max_min_fairness", None, "highs")[1] == {}  # allocopt's name
    assert "solver_options" not in resolve_policy("gavel:allox", None, "highs")[1]
    simplex = {"solver_options": {"solver": "simplex"}}
    assert resolve_policy("gavel:max_sum_throughput_perf", simplex, "highs")[1] == simplex


@pytest.mark.parametrize("policy", ["min_total_duration_perf", "finish_time_fairness_perf", "isolated"])
def test_other_policies_run(policy):
    result = simulate(shipped_trace("artifact_evaluation"), {"v100": 4, "p100": 4, "k80": 4}, policy)
    assert np.isfinite(result.jobs["finish_s"]).all()


def test_outputs(tmp_path, small_result):
    small_result.to_json(tmp_path / "r.json")
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["metrics"]["average_jct_s"] == pytest.approx(small_result.metrics["average_jct_s"])
    assert len(doc["jobs"]["jct_s"]) == 20
    small_result.to_csv(tmp_path / "r.csv")
    rows = list(csv.DictReader(open(tmp_path / "r.csv")))
    assert len(rows) == 20 and float(rows[0]["jct_s"]) == pytest.approx(small_result.jobs["jct_s"][0])
    if importlib.util.find_spec("matplotlib") is None:
        with pytest.raises(ImportError, match="matplotlib"):
            small_result.plot(tmp_path / "r.png")
    else:
        fig = small_result.plot(tmp_path / "r.png")
        assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert [ax.get_title() for ax in fig.axes] == ["JCT CDF", "utilization"]


def test_json_round_trip_and_frame(tmp_path, small_result):
    doc = small_result.to_json()
    assert doc == small_result.to_dict()
    small_result.to_json(tmp_path / "r.json")
    for source in (tmp_path / "r.json", str(tmp_path / "r.json"), json.loads(json.dumps(doc))):
        again = allocopt.mechanism.SimulationResult.from_json(source)
        assert again.metrics == small_result.metrics
        np.testing.assert_array_equal(again.jobs["jct_s"], small_result.jobs["jct_s"])
        np.testing.assert_array_equal(again.rounds["busy_gpus"], small_result.rounds["busy_gpus"])
    with pytest.raises(allocopt.errors.InvalidProblemError, match="'metrics', 'jobs' and 'rounds'"):
        allocopt.mechanism.SimulationResult.from_json({"metrics": {}})
    pd = pytest.importorskip("pandas")
    frame = small_result.to_frame()
    assert isinstance(frame, pd.DataFrame) and len(frame) == 20 and frame.index.name == "job"
    assert list(frame.columns) == list(small_result.jobs)
    np.testing.assert_array_equal(frame["jct_s"].to_numpy(), small_result.jobs["jct_s"])


def test_plot_leaves_the_backend_and_pyplot_alone(tmp_path):
    pytest.importorskip("matplotlib")
    script = f"""
import matplotlib
matplotlib.use("svg")
import matplotlib.pyplot as plt
from allocopt.mechanism import shipped_trace, simulate
result = simulate(shipped_trace("small_test"), {{"v100": 4, "p100": 4, "k80": 4}}, "max_min_fairness_perf", ftf=False)
fig = result.plot({str(tmp_path / "r.pdf")!r})
assert matplotlib.get_backend() == "svg", matplotlib.get_backend()
assert plt.get_fignums() == [], plt.get_fignums()
assert type(fig).__name__ == "Figure" and len(fig.axes) == 2
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
    assert (tmp_path / "r.pdf").read_bytes()[:5] == b"%PDF-"


@pytest.mark.parametrize("flag, module, extra", [(["--plot", "r.png"], "matplotlib", "plot"),
                                                 (["--progress"], "tqdm", "progress")])
def test_cli_missing_extra_fails_before_simulating(tmp_path, flag, module, extra):
    # the module is made unimportable in the child (sys.modules[name] = None), as when it is not installed
    argv = ["simulate", "--generate", "2000", "--cluster", "v100=4", "--json", str(tmp_path / "r.json"), *flag]
    script = (f"import sys; sys.modules[{module!r}] = None\n"
              f"from allocopt.cli import main\nsys.exit(main({argv!r}))")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert f"needs {module}" in proc.stderr and f"pip install 'allocopt[{extra}]'" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == "" and not (tmp_path / "r.json").exists()


def _write(tmp_path, lines):
    path = tmp_path / "bad.trace"
    path.write_text("\n".join(lines) + "\n")
    return path


GOOD = "ResNet-50 (batch size 64)\tcmd\tdir\t--n\t1\t2931\t1\t1\t-1.000000\t0"


@pytest.mark.parametrize("bad, match", [
    ("ResNet-50 (batch size 64)\tcmd\tdir\t--n\t1\t2931\t1", "7 tab-separated columns"),
    ("Nonexistent (batch size 1)\tcmd\tdir\t--n\t1\t100\t1\t1\t-1\t0", "unknown model"),
    ("ResNet-50 (batch size 64)\tcmd\tdir\t--n\t1\t2931\t1\t1\t-1\t-5", "arrival_time"),
    ("ResNet-50 (batch size 64)\tcmd\tdir\t--n\t1\tmany\t1\t1\t-1\t0", "total_steps"),
    ("ResNet-50 (batch size 64)\tcmd\tdir\t--n\t1\t2931\t3\t1\t-1\t0", "scale_factor"),
])
def test_bad_traces_name_the_line(tmp_path, bad, match):
    path = _write(tmp_path, [GOOD, bad])
    with pytest.raises(TraceError, match=match) as info:
        simulate(path, {"v100": 4}, "max_min_fairness_perf")
    assert info.value.line == 2
    assert f"{path}:2:" in str(info.value)


def test_job_larger_than_any_type_names_the_line(tmp_path):
    big = "ResNet-50 (batch size 64)\tcmd\tdir\t--n\t1\t2931\t8\t1\t-1\t0"
    path = _write(tmp_path, [GOOD, GOOD, big])
    with pytest.raises(TraceError, match="fits no GPU type") as info:
        simulate(path, {"v100": 4, "k80": 4}, "max_min_fairness_perf")
    assert info.value.line == 3


def test_cli_simulate(tmp_path):
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, "-m", "allocopt", "simulate",
                           "--trace", shipped_trace("artifact_evaluation"), "--cluster", "v100=2,p100=0,k80=4",
                           "--policy", "max_min_fairness_perf", "--round-seconds", "360", "--seed", "0",
                           "--json", str(out), "--csv", str(tmp_path / "jobs.csv")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for key in ("average_jct_s", "makespan_s", "utilization"):
        assert f"{key}: " in proc.stdout
    doc = json.loads(out.read_text())
    expected = simulate(shipped_trace("artifact_evaluation"), ARTIFACT_CLUSTER, "max_min_fairness_perf")
    assert doc["metrics"]["average_jct_s"] == pytest.approx(expected.metrics["average_jct_s"])
    assert (tmp_path / "jobs.csv").exists()


def test_cli_simulate_bad_trace(tmp_path):
    path = _write(tmp_path, [GOOD, "x\ty"])
    proc = subprocess.run([sys.executable, "-m", "allocopt", "simulate", "--trace", str(path), "--cluster", "v100=2"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert f"{path}:2:" in proc.stderr


def test_top_level_export():
    assert allocopt.simulate is simulate


@pytest.mark.parametrize("policy, options, overhead", [("max_min_fairness_perf", None, 0.0),
                                                       ("finish_time_fairness_perf", None, 60.0),
                                                       ("max_min_fairness", {"space_sharing": True}, 30.0)])
def test_rounds_as_arrays_equal_rounds_of_lease_objects(policy, options, overhead):
    """The default planner and executor exchange arrays; through lease objects (any other executor)
    every job, round and metric comes out the same."""
    from allocopt.mechanism import MechanismOptions, PriorityPlanner, SimulationState
    from allocopt.runtime.simulated import SimulatedExecutor

    cluster = allocopt.Cluster({"v100": 4, "p100": 4, "k80": 4})
    wl = generate_workload(TABLE, 40, jobs_per_hour=12, seed=5, cluster=cluster)
    arrays = simulate(wl, cluster, policy, policy_options=options, restart_overhead_s=overhead, ftf=False)
    name, resolved, _ = resolve_policy(policy, options, "highs")  # as simulate resolves it
    T = wl.throughputs(TABLE, cluster.gpu_types)
    planner = PriorityPlanner(SimulationState(wl, cluster, T, TABLE), name, resolved, MechanismOptions())
    executor = SimulatedExecutor(lambda job, gpu_type, _n: float(T[job, cluster.index(gpu_type)]),
                                 restart_overhead_s=overhead, pair_throughputs=planner.pair_throughput)
    leases = simulate(wl, cluster, policy, policy_options=options, planner=planner, executor=executor, ftf=False)
    for column in ("finish_s", "jct_s", "gpu_hours", "restarts"):
        np.testing.assert_array_equal(arrays.jobs[column], leases.jobs[column])
    for column in ("start_s", "end_s", "busy_gpus"):
        np.testing.assert_array_equal(arrays.rounds[column], leases.rounds[column])
    assert arrays.metrics["utilization"] == pytest.approx(leases.metrics["utilization"], rel=1e-12)
    assert arrays.metrics["num_rounds"] == leases.metrics["num_rounds"] > 10
    if overhead:
        assert arrays.metrics["restarts_per_job"] > 0
