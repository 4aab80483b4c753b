"""Sia's own program (allocopt.formulations.sia_programs) and the stand-in's ``sia_program`` mode."""

from __future__ import annotations

import numpy as np
import pytest

from allocopt.errors import InvalidOptionError
from allocopt.formulations.sia_programs import sia_goodput, sia_utilities, solve_sia_program
from test_sia_adapter import Job, Speedup, sia_nodes, sia_policy

cp = pytest.importorskip("cvxpy")
MILP = next((s for s in ("CBC", "HIGHS", "SCIPY") if s in cp.installed_solvers()), None)


def test_utilities_are_sias_float32_rounded_and_clipped():
    goodput = np.array([[1.0, 2.0, 1e-4], [1.0, 4.0, 0.0]], dtype=np.float32)
    utility = sia_utilities(goodput, previous=np.array([1, -1]), realloc_factor=np.array([0.25, 0.5]), p=-0.5)
    assert utility.dtype == np.float32
    # job 0: every configuration but its previous one scaled by 0.25 before the power
    np.testing.assert_array_equal(utility[0], np.float32([2.0, round(2.0 ** -0.5, 2), 200.0]))
    # job 1 has no previous configuration: nothing scaled; a zero goodput is clipped at 3000
    np.testing.assert_array_equal(utility[1], np.float32([1.0, 0.5, 3000.0]))


@pytest.mark.skipif(MILP is None, reason="cvxpy has no MILP solver here (CBC needs cylp)")
@pytest.mark.parametrize("seed", range(3))
def test_sias_program_reaches_allocopts_optimum(seed):
    """The program built as Sia writes it and allocopt's own Sia MILP (HiGHS, exact) reach the same
    optimum of Sia's rounded objective on the same round."""
    rng = np.random.default_rng(seed)
    jobs = {f"cifar10-{k}": Job({"aws": Speedup(rng.uniform(0.5, 2)), "rtx": Speedup(rng.uniform(1, 3))},
                                max_replicas=int(rng.choice([2, 4, 8, 16]))) for k in range(12)}
    own, program = sia_policy(mip_gap=0.0), sia_policy(mip_gap=0.0, sia_program=MILP)
    first, second = own.optimize(jobs, sia_nodes(), {}), program.optimize(jobs, sia_nodes(), {})
    assert program.last_status["exact"] and program.last_status["program"] == "sia"
    assert own.last_allocation is not None and own.last_allocation.status.value == "optimal"
    names = list(jobs)
    goodput = np.vstack([program._sia_goodput_row(n, jobs[n])[0] for n in names])
    utility = sia_utilities(goodput, np.full(len(names), -1), np.ones(len(names)), -0.5)

    def value(configuration: dict) -> float:
        return sum(float(utility[i, configuration[n]]) if n in configuration else 1.1 for i, n in enumerate(names))

    assert value(own.prev_configuration) == pytest.approx(program.last_status["objective"], abs=1e-5)
    assert value(program.prev_configuration) == pytest.approx(program.last_status["objective"], abs=1e-5)
    used = {t: 0 for t in ("aws", "dgx-ext", "rtx")}
    for cluster, gpus in second.values():
        if cluster is not None:
            used[cluster] += len(gpus)
    assert used["aws"] <= 24 and used["dgx-ext"] <= 16 and used["rtx"] <= 24
    assert set(first) == set(second) == set(jobs)


@pytest.mark.skipif(MILP is None, reason="cvxpy has no MILP solver here (CBC needs cylp)")
def test_sias_program_keeps_jobs_in_checkpoint_restore():
    policy = sia_policy(mip_gap=0.0, sia_program=MILP)
    jobs = {"cifar10-0": Job({"aws": Speedup(1.0), "rtx": Speedup(2.0)})}
    first = policy.optimize(jobs, sia_nodes(), {})
    before = policy.prev_configuration["cifar10-0"]
    jobs = {"cifar10-0": Job({"aws": Speedup(1.0), "rtx": Speedup(2.0)}, age=600, restarts=1,
                             scaling_underway=True)}
    jobs.update({f"bert-{k}": Job({"rtx": Speedup(5.0), "aws": Speedup(1.0)}) for k in range(12)})
    second = policy.optimize(jobs, sia_nodes(), first)
    assert policy.prev_configuration["cifar10-0"] == before and second["cifar10-0"] == first["cifar10-0"]


def test_sias_program_needs_an_installed_solver_and_sias_rounding():
    with pytest.raises(InvalidOptionError, match="not installed"):
        solve_sia_program(np.ones((1, 1), dtype=np.float32), np.ones((1, 1), dtype=np.uint32),
                          np.ones(1, dtype=np.uint32), [], 1.1, True, solver="NO_SUCH_SOLVER")
    with pytest.raises(InvalidOptionError, match="utility_decimals"):
        sia_policy(sia_program="CBC", utility_decimals=None)


# -- SiaPlanner (allocopt's own simulator) with ``sia_program`` ------------------------------------------------

def test_sia_goodput_normalizes_as_sia():
    raw = np.array([[0.0, 2.0, 4.0], [0.0, 0.0, 0.0], [5e-5, 0.5, 0.0]])
    out = sia_goodput(raw)
    assert out.dtype == np.float32
    # row 0: smallest 2 -> 1; the unusable configuration starts at 1e-4, scaled by 1/2, then raised to 1e-4
    np.testing.assert_array_equal(out[0], np.float32([1e-4, 1.0, 2.0]))
    np.testing.assert_array_equal(out[1], np.float32([1e-4, 1e-4, 1e-4]))  # nothing usable: scale 1
    # row 2: 5e-5 does not count for the smallest (0.5 does), so it is scaled by 2: 1e-4
    np.testing.assert_allclose(out[2], np.float32([1e-4, 1.0, 2e-4]), rtol=1e-6)


@pytest.mark.skipif(MILP is None, reason="cvxpy has no MILP solver here (CBC needs cylp)")
def test_planner_sia_program_routes_each_round_to_sias_program():
    """``policy_options={"faithful_to_sia": True, "sia_program": ...}``: every round of allocopt's simulator
    is solved by Sia's cvxpy program with that solver, its answer is feasible and its objective is Sia's
    rounded objective at the chosen configurations; jobs in checkpoint-restore keep theirs."""
    from test_sia_simulation import CLUSTER, RecordingExecutor, small_workload

    from allocopt.mechanism.simulator import simulate
    from allocopt.throughput.profiles import load_profiles, shipped_profiles_dir

    profiles = load_profiles(shipped_profiles_dir())
    jobs = small_workload(4)
    executor = RecordingExecutor()
    result = simulate(jobs, CLUSTER, "sia", profiles=profiles, round_seconds=60.0, executor=executor,
                      policy_options={"faithful_to_sia": True, "sia_program": MILP})
    assert result.metrics["num_jobs"] == 4 and all(np.isfinite(result.jobs["jct_s"]))
    plans = [plan for plan in executor.plans if plan.allocation is not None]
    moved = 0  # rounds where a job left its previous configuration
    for plan in plans:
        allocation = plan.allocation
        assert allocation.backend == f"cvxpy-{MILP}" and allocation.extras["program"] == "sia"
        problem, chosen = allocation.problem, allocation.configuration
        configs = problem.configurations
        used = np.bincount(configs.gpu_type[chosen[chosen >= 0]], weights=configs.num_gpus[chosen[chosen >= 0]],
                           minlength=len(CLUSTER.capacity))
        assert np.all(used <= np.asarray(CLUSTER.capacity))
        assert np.all(chosen[problem.pinned] == problem.previous[problem.pinned])
        # Sia's objective: rounded utility of each chosen configuration, lambda_n for each job without one
        # (a pinned job keeps its previous configuration, whose utility no re-allocation factor scales)
        utility = sia_utilities(sia_goodput(problem.goodput), problem.previous, problem.restart_factor, -0.5)
        rows = np.flatnonzero(chosen >= 0)
        value = float(utility[rows, chosen[rows]].sum()) + 1.1 * (chosen.size - rows.size)
        assert value == pytest.approx(allocation.objective, abs=1e-4)
        moved += int(np.any((problem.previous >= 0) & (chosen != problem.previous)))
    assert len(plans) >= 5 and moved >= 1
    # without the option the same run goes to allocopt's own sia policy (HiGHS)
    plain = RecordingExecutor()
    simulate(jobs, CLUSTER, "sia", profiles=profiles, round_seconds=60.0, executor=plain,
             policy_options={"faithful_to_sia": True})
    # allocopt's own MILP (on this small cluster by dynamic programming), not Sia's program
    assert all(p.allocation.extras.get("program") != "sia" and p.allocation.backend in ("highs", None)
               for p in plain.plans if p.allocation is not None)


def test_planner_sia_program_rejects_rigid_jobs_unrounded_utilities_and_unknown_solvers():
    from allocopt.cluster import Cluster
    from allocopt.configurations import sia_configurations
    from allocopt.mechanism.sia_rounds import SiaJobState, sia_round

    cluster = Cluster({"aws": 8}, {"aws": 4})
    configs = sia_configurations(cluster)
    goodput = np.tile(np.arange(1, len(configs) + 1, dtype=float), (2, 1))
    jobs = [SiaJobState(0, "cifar10", 0.0), SiaJobState(1, "bert", 0.0, rigid_gpus=1)]
    with pytest.raises(InvalidOptionError, match="job 1 is rigid"):
        sia_round(jobs, cluster, configs, goodput, sia_program="HIGHS")
    with pytest.raises(InvalidOptionError, match="utility_decimals"):
        sia_round(jobs[:1], cluster, configs, goodput[:1], sia_program="HIGHS", utility_decimals=None)
    with pytest.raises(InvalidOptionError, match="takes no time_limit_s"):
        sia_round(jobs[:1], cluster, configs, goodput[:1], sia_program="HIGHS", time_limit_s=5.0)
    with pytest.raises(InvalidOptionError, match="not installed"):
        sia_round(jobs[:1], cluster, configs, goodput[:1], sia_program="NO_SUCH_SOLVER")
