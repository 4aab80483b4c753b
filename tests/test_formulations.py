"""Policies: known optima, cross-backend agreement on random instances, feasibility, errors."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ALL_BACKENDS, assert_feasible
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import allocopt
from allocopt import Cluster, Problem, Status
from allocopt.errors import InfeasibleError, InvalidOptionError, UnknownBackendError, UnknownPolicyError

CLASSIC = Problem([[40.0, 10.0], [12.0, 4.0], [100.0, 50.0]], Cluster({"v100": 1, "k80": 1}))


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_classic_two_type_example(backend):
    alloc = allocopt.solve(CLASSIC, "max_min_fairness", backend=backend)
    assert alloc.status is Status.OPTIMAL and alloc.backend == backend
    assert alloc.objective == pytest.approx(8 / 11, rel=1e-6)
    np.testing.assert_allclose(alloc.normalized_throughput, 8 / 11, rtol=1e-6)
    np.testing.assert_allclose(alloc.matrix, np.array([[5, 0], [5, 1], [1, 10]]) / 11, atol=1e-6)
    assert_feasible(alloc)
    equal_time = allocopt.solve(CLASSIC, "isolated")
    assert equal_time.normalized_throughput.min() < 8 / 11 - 0.05


def test_allocation_accessors():
    pd = pytest.importorskip("pandas")
    alloc = allocopt.solve(CLASSIC)
    d = alloc.to_dict()
    assert set(d) == {0, 1, 2} and set(d[0]) == {"v100", "k80"}
    assert d[2]["k80"] == pytest.approx(10 / 11)
    frame = alloc.to_frame()
    assert isinstance(frame, pd.DataFrame) and list(frame.columns) == ["v100", "k80"]
    np.testing.assert_allclose(alloc.effective_throughput, [200 / 11, 64 / 11, 600 / 11])
    np.testing.assert_allclose(alloc.gpus_used, [1.0, 1.0])
    t = alloc.timings
    assert t.num_solves == 1 and 0 <= t.model_build_s <= t.total_s and t.solve_s <= t.total_s
    assert alloc.to_json()["allocation"][0]["fractions"]["v100"] == pytest.approx(5 / 11)


def random_problem(draw_seed: int, n: int, k: int, *, mixed_scale: bool = True, zeros: bool = True) -> Problem:
    rng = np.random.default_rng(draw_seed)
    capacity = rng.integers(1, 9, size=k)
    capacity[0] = max(capacity[0], 8)
    T = rng.uniform(0.5, 50.0, size=(n, k))
    if zeros:
        T[rng.random((n, k)) < 0.25] = 0.0
        T[:, 0] = np.maximum(T[:, 0], 0.5)  # type 0 fits every job
    scale = rng.choice([1, 2, 4, 8], size=n) if mixed_scale else np.ones(n, dtype=int)
    weights = rng.choice([1.0, 2.0, 3.0], size=n)
    steps = rng.uniform(100, 10_000, size=n)
    cluster = Cluster({f"type{j}": int(c) for j, c in enumerate(capacity)})
    return Problem(T, cluster, scale_factors=scale, priority_weights=weights, num_steps_remaining=steps,
                   costs=rng.uniform(0.5, 3.0, size=k))


SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("policy, options", [
    ("max_min_fairness", {}),
    ("max_min_fairness", {"heterogeneity_aware": False}),
    ("max_throughput", {}),
    ("max_throughput", {"normalize_by_cost": True}),
])
@pytest.mark.parametrize("backend", ALL_BACKENDS)
@SETTINGS
@given(seed=st.integers(0, 2**31), n=st.integers(1, 9), k=st.integers(1, 4))
def test_backends_agree_with_highs(backend, policy, options, seed, n, k):
    problem = random_problem(seed, n, k)
    reference = allocopt.solve(problem, policy, **options)
    alloc = allocopt.solve(problem, policy, backend=backend, **options)
    assert alloc.objective == pytest.approx(reference.objective, rel=1e-6, abs=1e-9)
    assert_feasible(alloc)
    assert_feasible(reference)


@SETTINGS
@given(seed=st.integers(0, 2**31), n=st.integers(2, 12))
def test_agnostic_fairness_closed_form(seed, n):
    """Single-GPU jobs that run everywhere, fewer GPUs than jobs: time shares are proportional to weights."""
    rng = np.random.default_rng(seed)
    k = 3
    capacity = rng.integers(0, 3, size=k)
    capacity[0] += 1
    weights = rng.choice([1.0, 2.0, 4.0], size=n)
    problem = Problem(rng.uniform(1, 10, size=(n, k)), Cluster({f"t{j}": int(c) for j, c in enumerate(capacity)}),
                      priority_weights=weights)
    alloc = allocopt.solve(problem, "max_min_fairness", heterogeneity_aware=False)
    # max t s.t. sum_j X_ij >= t w_i, sum_i X_ij <= c_j, sum_j X_ij <= 1: t = min(C / sum(w), 1 / max(w))
    expected = min(capacity.sum() / weights.sum(), 1 / weights.max())
    assert alloc.objective == pytest.approx(expected, rel=1e-6)
    assert np.all(alloc.matrix.sum(axis=1) >= expected * weights - 1e-6)


@SETTINGS
@given(seed=st.integers(0, 2**31), n=st.integers(1, 10), k=st.integers(1, 4))
def test_max_min_fairness_is_at_least_as_fair_as_isolated(seed, n, k):
    problem = random_problem(seed, n, k)
    fair = allocopt.solve(problem, "max_min_fairness")
    iso = allocopt.solve(problem, "isolated")
    assert_feasible(iso)
    norm_iso = iso.effective_throughput * problem.scale_factors / (problem.priority_weights *
                                                                   problem.proportional_throughputs)
    assert fair.objective >= norm_iso.min() - 1e-7
    thr = allocopt.solve(problem, "max_throughput")
    assert thr.effective_throughput.sum() >= fair.effective_throughput.sum() - 1e-6 * max(1, thr.objective)


def test_proportional_share():
    alloc = allocopt.solve(CLASSIC, "proportional")
    np.testing.assert_allclose(alloc.matrix, 0.5)
    np.testing.assert_allclose(alloc.effective_throughput, CLASSIC.proportional_throughputs)
    assert alloc.backend is None and alloc.objective is None


def deadline_problem(slos):
    return Problem([[10.0, 5.0], [10.0, 5.0]], Cluster({"v100": 1, "k80": 1}), job_ids=["a", "b"],
                   num_steps_remaining=[3600.0, 3600.0], slos=slos)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_deadlines_met(backend):
    # "b" needs 3600 steps in 600 s = 6 steps/s: more than the k80 gives, so it must get some v100 time
    alloc = allocopt.solve(deadline_problem([np.inf, 600.0]), "max_throughput", backend=backend)
    assert alloc.effective_throughput[1] >= 6.0 - 1e-6
    assert alloc.extras["deadline_met"].all()
    assert alloc.objective == pytest.approx(15.0)


def test_unmeetable_deadlines_are_reported_not_dropped():
    problem = deadline_problem([200.0, 300.0])  # 18 and 12 steps/s needed, 15 available in total
    with pytest.raises(InfeasibleError, match=r"cannot be met: .*'a' \(needs 18 steps/s\)") as info:
        allocopt.solve(problem, "max_throughput")
    assert info.value.status is Status.INFEASIBLE
    relaxed = allocopt.solve(problem, "max_throughput", best_effort=True)
    assert relaxed.status is Status.INFEASIBLE and not relaxed.success
    assert "minimizes the total relative shortfall" in relaxed.message
    assert not relaxed.extras["deadline_met"].all()
    assert_feasible(relaxed)
    assert relaxed.effective_throughput.sum() == pytest.approx(15.0)


def test_cost_normalization_prefers_cheap_gpus():
    problem = Problem([[10.0, 6.0]], Cluster({"v100": 1, "k80": 1}), costs={"v100": 3.0, "k80": 1.0})
    assert allocopt.solve(problem, "max_throughput").matrix[0, 0] == pytest.approx(1.0)
    assert allocopt.solve(problem, "max_throughput", normalize_by_cost=True).matrix[0, 1] == pytest.approx(1.0)
    with pytest.raises(InvalidOptionError, match="costs"):
        allocopt.solve(CLASSIC, "max_throughput", normalize_by_cost=True)


def test_option_and_name_errors():
    with pytest.raises(UnknownPolicyError, match=r"unknown policy 'max_fun'; choose one of .*max_min_fairness"):
        allocopt.solve(CLASSIC, "max_fun")
    with pytest.raises(UnknownBackendError, match=r"unknown backend 'cplex'"):
        allocopt.solve(CLASSIC, backend="cplex")
    with pytest.raises(InvalidOptionError, match=r"has no option\(s\) \['heterogenity_aware'\]; its options: "
                       r"aggregate_job_types, column_generation, gavel_program, heterogeneity_aware"):
        allocopt.solve(CLASSIC, heterogenity_aware=False)
    with pytest.raises(InvalidOptionError, match="time_limit_s must be a positive"):
        allocopt.solve(CLASSIC, time_limit_s=0)
    with pytest.raises(InvalidOptionError, match=r"HiGHS rejected option no_such_option"):
        allocopt.solve(CLASSIC, solver_options={"no_such_option": 1})


def test_no_jobs():
    problem = Problem(np.zeros((0, 2)), Cluster({"v100": 1, "k80": 1}))
    alloc = allocopt.solve(problem)
    assert alloc.matrix.shape == (0, 2) and alloc.success and alloc.to_dict() == {}


def test_auto_backend_solves():
    alloc = allocopt.solve(CLASSIC, backend="auto")
    assert alloc.objective == pytest.approx(8 / 11) and alloc.backend in ("gurobi", "highs")


def test_a_failed_solve_raises_solver_error_with_its_status():
    from allocopt.backends import SolveOptions
    from allocopt.errors import SolverError
    from allocopt.formulations.base import ModelSolver
    from allocopt.solution import Solution, Status

    failed = Solution(status=Status.ERROR, message="HiGHS failed", objective=None, x=None, backend="highs",
                      raw_status="kSolveError", build_seconds=0.0, solve_seconds=0.0)
    with pytest.raises(SolverError, match="the model: HiGHS failed Try another backend") as info:
        ModelSolver("highs", SolveOptions()).check(failed)
    assert info.value.status is Status.ERROR and info.value.solution is failed


def test_objective_unit_rescales_only_data_far_from_one():
    """Coefficients within 1e-3..1e3 reach the solver as written (an interior-point solver then
    returns the point of the same model written directly); far from 1 they are rescaled, so a
    throughput of 1e-8 steps/s still decides the optimum (HiGHS's tolerances are near 1e-7)."""
    from allocopt.formulations.base import objective_unit

    assert objective_unit(700.0) == 1.0 and objective_unit(2e-3) == 1.0
    assert objective_unit(1e-8) == 1e-8 and objective_unit(5e4) == 5e4
    assert objective_unit(0.0) == 1.0 and objective_unit(float("nan")) == 1.0
    tiny = Problem(np.array([[1e-8, 2e-8], [3e-8, 1e-8]]), Cluster({"a": 1, "b": 1}))
    assert allocopt.solve(tiny, "max_throughput").matrix == pytest.approx(np.array([[0.0, 1.0], [1.0, 0.0]]),
                                                                          abs=1e-6)


@SETTINGS
@given(seed=st.integers(0, 2**31), n=st.integers(1, 9), k=st.integers(1, 4), aware=st.booleans())
def test_max_min_fairness_gavel_program_reaches_the_same_optimum(seed, n, k, aware):
    """``gavel_program=True`` is Gavel's LP as Gavel's cvxpy code writes it; single-GPU jobs (every
    scale factor fits every type), heterogeneity-aware with zero throughputs or agnostic on types every
    job runs on: the same optimum as the LP, no time where a job cannot run."""
    pytest.importorskip("cvxpy")
    problem = random_problem(seed, n, k, mixed_scale=False, zeros=aware)
    options = {"heterogeneity_aware": aware}
    gavel = allocopt.solve(problem, "max_min_fairness", backend="cvxpy", gavel_program=True, **options)
    assert gavel.objective == pytest.approx(allocopt.solve(problem, "max_min_fairness", **options).objective,
                                            rel=1e-6)
    assert_feasible(gavel)
    assert not gavel.matrix[~problem.runnable].any()
    assert gavel.extras["technique"] == "explicit"


def test_max_min_fairness_gavel_program_options():
    pytest.importorskip("cvxpy")
    problem = Problem([[40.0, 10.0, 0.0], [12.0, 4.0, 2.0]], Cluster({"v100": 1, "k80": 1, "p100": 0}))
    gavel = allocopt.solve(problem, "max_min_fairness", backend="cvxpy", gavel_program=True)
    assert gavel.objective == pytest.approx(allocopt.solve(problem, "max_min_fairness").objective, rel=1e-6)
    assert not gavel.matrix[:, 2].any()
    with pytest.raises(InvalidOptionError, match="needs backend='cvxpy'"):
        allocopt.solve(problem, "max_min_fairness", gavel_program=True)
    with pytest.raises(InvalidOptionError, match="cannot be combined with space_sharing"):
        allocopt.solve(problem, "max_min_fairness", backend="cvxpy", gavel_program=True, price_decomposition=True)


def test_isolated_share_does_not_depend_on_the_order_of_the_types():
    """Sums over GPU types run in name order (Gavel's): listing the cluster's types in another order gives
    the same isolated throughputs to the bit (finish-time fairness' isolated finish times build on them)."""
    from allocopt.formulations.makespan import isolated_throughputs
    from allocopt.formulations.shares import isolated_matrix

    rng = np.random.default_rng(11)
    T = rng.uniform(0.1, 300.0, size=(5, 3))
    names, capacity = ["v100", "p100", "k80"], [4, 3, 5]
    problem = Problem(T, Cluster(dict(zip(names, capacity))), scale_factors=[1, 2, 4, 1, 2])
    order = [2, 1, 0]
    swapped = Problem(T[:, order], Cluster({names[j]: capacity[j] for j in order}), scale_factors=[1, 2, 4, 1, 2])
    np.testing.assert_array_equal(isolated_matrix(swapped), isolated_matrix(problem)[:, order])
    np.testing.assert_array_equal(isolated_throughputs(swapped, None), isolated_throughputs(problem, None))
    assert (isolated_matrix(problem).sum(axis=1) <= 1 + 1e-12).all()


def test_max_throughput_gavel_program():
    """``gavel_program=True``: Gavel's LP as Gavel writes it; same optimum as the LP (single-GPU jobs),
    per unit cost too; no deadlines."""
    pytest.importorskip("cvxpy")
    for seed in range(3):
        problem = random_problem(seed, 6, 3, mixed_scale=False)
        for normalize in (False, True):
            gavel = allocopt.solve(problem, "max_throughput", backend="cvxpy", gavel_program=True,
                                   normalize_by_cost=normalize)
            plain = allocopt.solve(problem, "max_throughput", normalize_by_cost=normalize)
            assert gavel.objective == pytest.approx(plain.objective, rel=1e-6)
            assert_feasible(gavel)
    deadlines = Problem([[4.0, 1.0]], CLASSIC.cluster, num_steps_remaining=[100.0], slos=[50.0])
    with pytest.raises(InvalidOptionError, match="without deadlines"):
        allocopt.solve(deadlines, "max_throughput", backend="cvxpy", gavel_program=True)
