"""Optimus: the greedy marginal-gain allocation, its speed model, and its runs in the simulator."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

import allocopt
from allocopt import Cluster, GoodputProblem, sia_configurations, solve
from allocopt.cli import main
from allocopt.errors import InvalidOptionError, InvalidProblemError
from allocopt.formulations.optimus import remaining_times
from allocopt.mechanism import simulate
from allocopt.mechanism.order_policies import Optimus, Srtf, order_policy
from allocopt.mechanism.sia_workloads import shipped_workloads_dir
from allocopt.mechanism.traces import unit_throughputs
from allocopt.mechanism.workload import Workload
from allocopt.throughput.optimus_speed import OptimusSpeedModel, fit_optimus_speed
from allocopt.throughput.profiles import shipped_profiles_dir

ONE_NODE = Cluster({"g": 4}, gpus_per_node=4)  # Sia's configurations: 1, 2, 4 GPUs


def test_hand_checked_two_jobs_on_four_gpus():
    # each job first gets 1 GPU (100 / 10 = 10 s each), 2 GPUs left;
    # a -> 2 GPUs cuts 10 - 100/18 = 4.44 s per GPU, b -> 2 GPUs 10 - 100/12 = 1.67 s; a -> 4 needs 3 more (no room)
    # a moves first, then b (the last GPU): both on 2 GPUs
    problem = GoodputProblem([[10.0, 18.0, 30.0], [10.0, 12.0, 13.0]], sia_configurations(ONE_NODE), ONE_NODE)
    alloc = solve(problem, "optimus", remaining=[100.0, 100.0])
    assert alloc.num_gpus.tolist() == [2, 2]
    assert alloc.extras["moves"] == 2
    assert alloc.extras["estimated_remaining_s"] == pytest.approx(100 / 18 + 100 / 12)
    # with b holding a lot more work, its cut per GPU (500 * (1/10 - 1/12) = 8.3 s) beats a's: b moves first,
    # then b -> 4 GPUs needs 2 more with only 1 free, so a takes the last GPU
    alloc = solve(problem, "optimus", remaining=[100.0, 500.0])
    assert alloc.num_gpus.tolist() == [2, 2]
    # a job whose goodput does not grow gets no more GPUs: the rest stays idle
    flat = GoodputProblem([[10.0, 10.0, 10.0]], sia_configurations(ONE_NODE), ONE_NODE)
    assert solve(flat, "optimus").num_gpus.tolist() == [1]


def test_first_pass_shortest_remaining_time_first():
    cluster = Cluster({"g": 2}, gpus_per_node=2)
    configs = sia_configurations(cluster)  # 1, 2 GPUs
    problem = GoodputProblem(np.full((3, 2), 10.0), configs, cluster)
    alloc = solve(problem, "optimus", remaining=[300.0, 100.0, 200.0])
    assert alloc.num_gpus.tolist() == [0, 1, 1]  # one GPU each to the two shortest; no room to grow


def test_fastest_type_first_and_growth_within_it():
    cluster = Cluster({"slow": 4, "fast": 4}, gpus_per_node=4)
    configs = sia_configurations(cluster)  # slow 1, 2, 4; fast 1, 2, 4
    goodput = [[5.0, 9.0, 16.0, 10.0, 19.0, 36.0]]
    alloc = solve(GoodputProblem(goodput, configs, cluster), "optimus")
    assert alloc.gpu_type == ("fast",) and alloc.num_gpus.tolist() == [4]


def test_pinned_rigid_and_restart_factor():
    configs = sia_configurations(ONE_NODE)
    goodput = [[10.0, 18.0, 30.0], [10.0, 18.0, 30.0], [10.0, 18.0, 30.0]]
    # job 0 pinned to 4 GPUs holds the node: the others get nothing
    pinned = GoodputProblem(goodput, configs, ONE_NODE, previous=[2, -1, -1], pinned=[True, False, False])
    assert solve(pinned, "optimus").num_gpus.tolist() == [4, 0, 0]
    # a rigid job of 1 GPU is never grown; the adaptive one takes what is left that helps
    rigid = GoodputProblem(goodput[:2], configs, ONE_NODE, rigid_gpus=[1, 0])
    assert solve(rigid, "optimus").num_gpus.tolist() == [1, 2]
    # a job on 1 GPU whose restarts cost half its goodput: 2 or 4 GPUs (9, 9.5 < 10) would slow it down
    costly = GoodputProblem([[10.0, 18.0, 19.0]], configs, ONE_NODE, previous=[0], restart_factor=[0.5])
    assert solve(costly, "optimus").num_gpus.tolist() == [1]
    # without the restart cost: 2 GPUs first (a cut of 0.044 s per GPU against 0.016 for 4), then 4 (still faster)
    free = solve(GoodputProblem([[10.0, 18.0, 19.0]], configs, ONE_NODE), "optimus")
    assert free.num_gpus.tolist() == [4] and free.extras["moves"] == 2


def _brute_force_total(times: np.ndarray, gpus: np.ndarray, capacity: int) -> float:
    """Least total remaining time with every job on >= 1 GPU, by enumeration."""
    best = np.inf
    for pick in itertools.product(range(gpus.size), repeat=times.shape[0]):
        if gpus[list(pick)].sum() <= capacity:
            best = min(best, float(times[np.arange(times.shape[0]), pick].sum()))
    return best


@pytest.mark.parametrize("seed", range(6))
def test_greedy_reaches_the_least_total_remaining_time_on_convex_times(seed):
    # every GPU count a configuration, speeds from Optimus's model: remaining times are convex in the GPU count,
    # so the greedy is the optimum of separable convex allocation (checked by enumeration)
    rng = np.random.default_rng(seed)
    cluster = Cluster({"g": 7}, gpus_per_node=8)
    configs = sia_configurations(cluster, all_gpu_counts=True)
    gpus = configs.num_gpus
    n = 3
    models = [OptimusSpeedModel(*rng.uniform([0.5, 0.0, 0.0], [4.0, 0.5, 0.3])) for _ in range(n)]
    goodput = np.array([m.speed(gpus) for m in models])
    work = rng.uniform(50, 500, n)
    problem = GoodputProblem(goodput, configs, cluster)
    alloc = solve(problem, "optimus", remaining=work)
    times = remaining_times(problem, work)
    assert (alloc.num_gpus >= 1).all() and alloc.num_gpus.sum() <= 7
    assert alloc.extras["estimated_remaining_s"] == pytest.approx(_brute_force_total(times, gpus, 7), rel=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_no_improving_move_is_left(seed):
    # on any instance the greedy stops only when no move to a larger configuration of the same type fits and helps
    rng = np.random.default_rng(seed)
    cluster = Cluster({"a": 16, "b": 8}, gpus_per_node={"a": 4, "b": 8})
    configs = sia_configurations(cluster)
    n = 6
    goodput = rng.uniform(1, 10, (n, len(configs))) * configs.num_gpus ** rng.uniform(0.2, 0.9, (n, 1))
    work = rng.uniform(10, 100, n)
    problem = GoodputProblem(goodput, configs, cluster)
    alloc = solve(problem, "optimus", remaining=work)
    used = alloc.gpus_used
    assert (used <= cluster.capacity).all()
    times = remaining_times(problem, work)
    free = cluster.capacity - used
    for i, c in enumerate(alloc.configuration.tolist()):
        if c < 0:  # left idle only when its smallest configuration fits nowhere
            fewest = configs.num_gpus == configs.num_gpus[problem.valid[i]].min()
            assert not (problem.valid[i] & fewest & (configs.num_gpus <= free[configs.gpu_type])).any()
            continue
        t = configs.gpu_type[c]
        bigger = (configs.gpu_type == t) & (configs.num_gpus > configs.num_gpus[c]) \
            & (configs.num_gpus - configs.num_gpus[c] <= free[t])
        assert not (times[i, bigger] < times[i, c]).any(), (i, c)


@pytest.mark.parametrize("remaining, words", [
    ([1.0], "shape (1,), expected (n_jobs,) = (2,)"),
    ([1.0, -2.0], "remaining of job 1 is -2.0"),
    ([np.nan, 1.0], "remaining of job 0 is nan"),
    (["a", 1.0], "must be numbers"),
])
def test_bad_remaining_is_a_typed_error(remaining, words):
    problem = GoodputProblem([[1.0, 2.0, 3.0]] * 2, sia_configurations(ONE_NODE), ONE_NODE)
    with pytest.raises(InvalidOptionError) as err:
        solve(problem, "optimus", remaining=remaining)
    assert words in str(err.value)


def test_unknown_option_is_a_typed_error():
    problem = GoodputProblem([[1.0, 2.0, 3.0]], sia_configurations(ONE_NODE), ONE_NODE)
    with pytest.raises(InvalidOptionError, match="policy 'optimus' has no option"):
        solve(problem, "optimus", p=-1.0)


def test_speed_model_fit():
    truth = OptimusSpeedModel(2.0, 0.1, 0.05)
    w = np.array([1, 2, 3, 4, 8])
    fitted = fit_optimus_speed(w, truth.speed(w))
    assert (fitted.theta0, fitted.theta1, fitted.theta2) == pytest.approx((2.0, 0.1, 0.05), rel=1e-9)
    # noisy or non-convex measurements still give non-negative parameters
    noisy = fit_optimus_speed(w, [1.0, 3.0, 2.0, 2.5, 2.0])
    assert min(noisy.theta0, noisy.theta1, noisy.theta2) >= 0
    for workers, speed, field in (([0, 1], [1.0, 1.0], "workers"), ([1, 2], [1.0, 0.0], "speed"),
                                  ([1, 2], [1.0], "speed"), ([], [], "speed")):
        with pytest.raises(InvalidProblemError) as err:
            fit_optimus_speed(workers, speed)
        assert err.value.field == field


# ----- in the simulator ----------------------------------------------------------------------------------------
SIA_CLUSTER = Cluster({"aws": 24, "rtx": 24, "dgx-ext": 16}, gpus_per_node={"aws": 4, "rtx": 8, "dgx-ext": 8})


@pytest.mark.parametrize("speed_model", ["goodput", "optimus"])
def test_simulate_a_sia_workload(speed_model):
    result = simulate(shipped_workloads_dir() / "phoebe_workload.csv", SIA_CLUSTER, "optimus",
                      profiles=shipped_profiles_dir(), round_seconds=60, ftf=False,
                      policy_options={"speed_model": speed_model})
    assert np.isfinite(result.jobs["finish_s"]).all() and len(result.jobs["finish_s"]) == 30
    assert (result.rounds["busy_gpus"] <= 64).all()
    # elastic: alone in the cluster until 332 s, the first job (4 GPUs requested) runs on more
    assert result.rounds["start_s"][0] < 300 and result.rounds["busy_gpus"][0] > 4


@pytest.mark.parametrize("options, words", [({"speed_model": "linear"}, "speed_model must be"),
                                            ({"p": -1.0}, "options of Sia's policy")])
def test_simulate_bad_options(options, words):
    with pytest.raises(InvalidOptionError, match=words):
        simulate(shipped_workloads_dir() / "phoebe_workload.csv", SIA_CLUSTER, "optimus",
                 profiles=shipped_profiles_dir(), round_seconds=60, ftf=False, policy_options=options)


def test_rigid_optimus_is_srtfs_order():
    assert isinstance(order_policy("optimus"), Optimus) and isinstance(order_policy("order:optimus"), Optimus)
    rng = np.random.default_rng(3)
    n = 24
    wl = Workload(("philly",) * n, rng.choice([1, 2, 4], n), rng.integers(600, 20_000, n),
                  np.sort(rng.uniform(0, 20_000, n)), np.ones(n), "test")
    cluster = Cluster({"gpu": 8}, gpus_per_node=4)
    runs = {name: simulate(wl, cluster, name, throughputs=unit_throughputs(wl, ["gpu"]), ftf=False,
                           round_seconds=300) for name in ("optimus", "srtf")}
    assert np.array_equal(runs["optimus"].jobs["finish_s"], runs["srtf"].jobs["finish_s"])
    assert issubclass(Optimus, Srtf) and Optimus.name == "optimus"


def test_cli_simulate_optimus(capsys):
    code = main(["simulate", "--workload", str(shipped_workloads_dir() / "phoebe_workload.csv"),
                 "--cluster", "aws=24,rtx=24,dgx-ext=16", "--gpus-per-node", "aws=4,rtx=8,dgx-ext=8",
                 "--policy", "optimus", "--round-seconds", "60", "--no-ftf"])
    assert code == 0
    assert "average_jct_s:" in capsys.readouterr().out
    code = main(["simulate", "--workload", str(shipped_workloads_dir() / "phoebe_workload.csv"),
                 "--cluster", "aws=24", "--gpus-per-node", "aws=4", "--policy", "optimus",
                 "--option", "speed_model=fast", "--no-ftf"])
    assert code != 0
    assert "speed_model must be" in capsys.readouterr().err


def test_sweep_runs_optimus_by_name(tmp_path):
    # a Sia workload (elastic Optimus) and a public trace (rigid Optimus) in one sweep, each row as simulate's
    from allocopt.experiments import parse_spec, run_sweep
    from allocopt.mechanism.traces import read_tiresias_trace

    phoebe = shipped_workloads_dir() / "phoebe_workload.csv"
    tiresias = Path(allocopt.__file__).parent / "data" / "tiresias" / "60_job.csv"
    spec = parse_spec({"policies": ["optimus"], "clusters": [{"aws": 24, "rtx": 24, "dgx-ext": 16}],
                       "gpus_per_node": {"aws": 4, "rtx": 8, "dgx-ext": 8}, "round_seconds": 60, "ftf": False,
                       "workloads": [{"sia": str(phoebe)}, {"trace": str(tiresias), "format": "tiresias"}],
                       "output": str(tmp_path)})
    result = run_sweep(spec)
    assert result.ran == 2 and not result.failed
    trace = read_tiresias_trace(tiresias, list(SIA_CLUSTER.gpu_types))
    want = {"sia": simulate(phoebe, SIA_CLUSTER, "optimus", profiles=shipped_profiles_dir(), round_seconds=60,
                            ftf=False),
            "trace": simulate(trace.workload, SIA_CLUSTER, "optimus", throughputs=trace.throughputs,
                              round_seconds=60, ftf=False)}
    assert sorted(row["workload_kind"] for row in result.rows) == ["sia", "trace"]
    for row in result.rows:
        kind = row["workload_kind"]
        assert row["average_jct_s"] == pytest.approx(want[kind].metrics["average_jct_s"], rel=1e-12)
